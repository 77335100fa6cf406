//! Loading a policy file: the raw TOML shapes and the section checks that
//! turn them into a [`Policy`](super::Policy), reporting every problem at
//! its position and in file order.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{
    canonical_resource, Approval, Delivery, DetailField, DetailType, FieldKind, PolicyError,
    Resource, Source, Tool, MAX_APPROVAL_TTL, MAX_TTL,
};
use crate::base::grammar::valid_scope_token;
use crate::infra::diagnostics::{key_span, line_col, offset_at, Problem};

mod routes;

#[derive(Debug, Deserialize)]
pub(super) struct RawPolicy {
    pub(super) agent: Spanned<String>,
    #[serde(default)]
    pub(super) frozen: bool,
    #[serde(default)]
    pub(super) steps: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub(super) resources: BTreeMap<String, RawResource>,
    #[serde(default)]
    pub(super) tools: BTreeMap<String, RawTool>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawResource {
    source: Spanned<String>,
    #[serde(default)]
    ttl: Option<Spanned<String>>,
    /// For `source = "service"`: the provider's name in the config.
    #[serde(default)]
    service: Option<Spanned<String>>,
    /// For `source = "service"`: how the token reaches the tool.
    #[serde(default)]
    delivery: Option<Spanned<String>>,
    /// For `source = "exchange"`: the upstream's name in the config.
    #[serde(default)]
    upstream: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawTool {
    resource: Spanned<String>,
    #[serde(default)]
    scopes: Vec<Spanned<String>>,
    steps: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    ttl: Option<Spanned<String>>,
    /// `each_call` or `per_step` (`docs/APPROVALS.md`).
    #[serde(default)]
    approval: Option<Spanned<String>>,
    /// For `per_step`: how long one approval covers the step.
    #[serde(default)]
    approval_ttl: Option<Spanned<String>>,
    /// Whether a request must carry `authorization_details`.
    #[serde(default)]
    require_authorization_details: bool,
    /// The RFC 9396 types the tool accepts, each with its fields.
    #[serde(default)]
    authorization_details: BTreeMap<String, BTreeMap<String, RawField>>,
    /// For a tool on a `delivery = "proxy"` resource: its routes, each a
    /// string or a `{ route, steps }` table.
    #[serde(default)]
    routes: Option<Spanned<Vec<toml::Value>>>,
    /// The explicit opt-in for a route that allows every path.
    #[serde(default)]
    allow_every_path_for_this_tool: Option<Spanned<bool>>,
}

/// One declared field of an `authorization_details` type.
#[derive(Debug, Deserialize)]
pub(super) struct RawField {
    kind: Spanned<String>,
    #[serde(default)]
    required: bool,
    label: Spanned<String>,
    #[serde(default)]
    log_in_clear: bool,
}

/// Whether `s` is a valid name: non-empty, at most 256 characters, no
/// whitespace or control characters. (Counted in characters, as JSON Schema's
/// `maxLength` counts, so the loader and the schema agree.)
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= 256
        && !s.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Type and field names of `authorization_details`: short ASCII, so that
/// they sort the same by UTF-8 bytes and by UTF-16 units (RFC 8785 section
/// 3.2.3 sorts by the latter; see `approve::canonical_details`).
fn valid_detail_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Parses a policy lifetime: a whole number of seconds or minutes without a
/// leading zero, from `"1s"` to `"300s"` (`"5m"`). Stricter than the config's
/// durations on purpose: a sub-second ttl would mint tokens that are already
/// expired, and one spelling per value keeps reviews and the schema simple.
pub(crate) fn parse_policy_ttl(s: &str) -> Result<Duration, &'static str> {
    parse_duration_upto(s, MAX_TTL, "is longer than the 300s maximum")
}

/// [`parse_policy_ttl`]'s grammar with another maximum (`approval_ttl`).
fn parse_duration_upto(
    s: &str,
    max: Duration,
    long: &'static str,
) -> Result<Duration, &'static str> {
    const SHAPE: &str = "must be a whole number of seconds or minutes such as \"60s\" or \"5m\"";
    let long_msg = long;
    let Some(i) = s.find(|c: char| !c.is_ascii_digit()) else {
        return Err(SHAPE);
    };
    let (num, unit) = s.split_at(i);
    if num.is_empty() || num.starts_with('0') || !matches!(unit, "s" | "m") {
        return Err(SHAPE);
    }
    // More than four digits is over the maximum in either unit (and would
    // not fit the arithmetic below without care).
    if num.len() > 4 {
        return Err(long_msg);
    }
    let n: u64 = num.parse().map_err(|_| SHAPE)?;
    let d = Duration::from_secs(if unit == "m" { n * 60 } else { n });
    if d > max {
        return Err(long_msg);
    }
    Ok(d)
}

/// Validates the keys of a `source = "service"` resource: a provider name,
/// and `delivery` written out (docs/DESIGN.md section 2: handing the provider's
/// bearer token to a tool is never a default).
fn service_source(
    r: &RawResource,
) -> Result<Source, (std::ops::Range<usize>, &'static str, &'static str)> {
    let service = match &r.service {
        None => {
            return Err((
                r.source.span(),
                "service",
                "a service resource must name its provider: service = \"<name of a [providers.<name>] table in the config>\"",
            ))
        }
        Some(s) if !valid_name(s.get_ref()) => {
            return Err((s.span(), "service", "must be a provider name without spaces or control characters"))
        }
        Some(s) => s.get_ref().clone(),
    };
    let delivery = match &r.delivery {
        None => {
            return Err((
                r.source.span(),
                "delivery",
                "a service resource must say how the token reaches the tool: delivery = \"proxy\" (the provider's token stays in the broker; the tool calls the service through the proxy) or delivery = \"provider_token\" (the provider's bearer token is handed to the tool, unbound and not narrowed to one call)",
            ))
        }
        Some(d) if d.get_ref() == "provider_token" => Delivery::ProviderToken,
        Some(d) if d.get_ref() == "proxy" => Delivery::Proxy,
        Some(d) => return Err((d.span(), "delivery", "must be \"proxy\" or \"provider_token\"")),
    };
    Ok(Source::Service { service, delivery })
}

/// The policy's text: UTF-8 and not empty (an empty file would load as a
/// policy that denies everything, which is never what was meant).
pub(super) fn policy_text<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, PolicyError> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let (l, c) = line_col(
                &String::from_utf8_lossy(&bytes[..e.valid_up_to()]),
                e.valid_up_to(),
            );
            return Err(PolicyError::Invalid(vec![Problem {
                at: format!("{}:{l}:{c}", path.display()),
                key: None,
                message: "the file is not UTF-8".into(),
            }]));
        }
    };
    if text.trim().is_empty() {
        return Err(PolicyError::Invalid(vec![Problem {
            at: format!("{}:1:1", path.display()),
            key: None,
            message: "the policy is empty (an empty policy would deny everything; write `agent = ...` and the tools)".into(),
        }]));
    }
    Ok(text)
}

/// The validation pass over one policy file: every problem found so far,
/// each placed at the span it is about.
pub(super) struct Check<'a> {
    path: &'a Path,
    text: &'a str,
    pub(super) problems: Vec<Problem>,
}

impl<'a> Check<'a> {
    pub(super) fn new(path: &'a Path, text: &'a str) -> Check<'a> {
        Check {
            path,
            text,
            problems: Vec::new(),
        }
    }

    /// `agent`: a name.
    pub(super) fn agent(&mut self, agent: &Spanned<String>) {
        if !valid_name(agent.get_ref()) {
            self.bad(
                agent.span(),
                "agent".into(),
                "must be a name without spaces or control characters",
            );
        }
    }

    /// Reports a problem at `span`; the message names no value.
    fn bad(&mut self, span: Range<usize>, key: String, message: &str) {
        self.problems.push(Problem {
            at: offset_at(self.path, self.text, span.start),
            key: Some(key),
            message: message.to_string(),
        });
    }

    /// A `ttl` key, if present and valid.
    fn ttl(&mut self, t: &Option<Spanned<String>>, key: String) -> Option<Duration> {
        let t = t.as_ref()?;
        match parse_policy_ttl(t.get_ref()) {
            Ok(d) => Some(d),
            Err(message) => {
                self.bad(t.span(), key, message);
                None
            }
        }
    }

    /// A list of step names under `key`: each valid, none twice.
    fn steps(&mut self, list: &[Spanned<String>], key: &str) -> BTreeSet<String> {
        let mut set = BTreeSet::new();
        for s in list {
            if !valid_name(s.get_ref()) {
                self.bad(
                    s.span(),
                    key.to_string(),
                    "step names must not contain spaces or control characters",
                );
            } else if !set.insert(s.get_ref().clone()) {
                self.bad(s.span(), key.to_string(), "step listed twice");
            }
        }
        set
    }

    /// The top-level `steps = [...]` declaration.
    pub(super) fn declared_steps(
        &mut self,
        list: &Spanned<Vec<Spanned<String>>>,
    ) -> BTreeSet<String> {
        if list.get_ref().is_empty() {
            self.bad(list.span(), "steps".into(), "declares no step, so every tool would be unreachable; list the orchestrator's steps or remove `steps`");
        }
        self.steps(list.get_ref(), "steps")
    }

    /// `[resources]`: the valid ones by canonical identifier, and the
    /// canonical identifiers of every key that parses, valid or not (a tool
    /// naming an invalid one is not reported twice).
    pub(super) fn resources(
        &mut self,
        raw: &BTreeMap<String, RawResource>,
    ) -> (BTreeMap<String, Resource>, BTreeSet<String>) {
        let mut resources = BTreeMap::new();
        let mut declared = BTreeSet::new();
        for (id, r) in raw {
            let span = key_span(self.text, "resources", id);
            // Debug quoting escapes control characters, so a key never prints raw.
            let key = format!("resources.{id:?}");
            let canonical = match canonical_resource(id) {
                Ok(c) => c,
                Err(e) => {
                    self.bad(span, key, &format!("is not a usable resource URI: {e}"));
                    continue;
                }
            };
            declared.insert(canonical.clone());
            let Some(source) = self.source(r, &key) else {
                continue;
            };
            // The origin is checked against the issuer where the config is
            // known (`Policy::check_proxy_addresses`); the path is the
            // file's own business.
            if let Source::Service {
                service,
                delivery: Delivery::Proxy,
            } = &source
            {
                let want = super::proxy_path(service);
                if url::Url::parse(&canonical)
                    .map(|u| u.path().to_string())
                    .ok()
                    != Some(want.clone())
                {
                    self.bad(
                        span,
                        key,
                        &format!("a delivery = \"proxy\" resource is the broker's proxy address for the service: its issuer followed by {want}"),
                    );
                    continue;
                }
            }
            let ttl = self.ttl(&r.ttl, format!("{key}.ttl")).unwrap_or(MAX_TTL);
            if resources.contains_key(&canonical) {
                self.bad(
                    span,
                    key,
                    "the same resource is declared twice (after normalisation)",
                );
                continue;
            }
            resources.insert(
                canonical.clone(),
                Resource {
                    id: id.clone(),
                    canonical,
                    source,
                    ttl,
                },
            );
        }
        (resources, declared)
    }

    /// A resource's `source` and the keys that go with it.
    fn source(&mut self, r: &RawResource, key: &str) -> Option<Source> {
        let source = r.source.get_ref().as_str();
        // Each key belongs to one source; any other source refuses it.
        let mut ok = true;
        for (field, owner, v) in [
            ("service", "service", &r.service),
            ("delivery", "service", &r.delivery),
            ("upstream", "exchange", &r.upstream),
        ] {
            if let Some(v) = v {
                if source != owner && matches!(source, "self" | "service" | "exchange") {
                    self.bad(
                        v.span(),
                        format!("{key}.{field}"),
                        &format!("only a resource with source = \"{owner}\" takes this key"),
                    );
                    ok = false;
                }
            }
        }
        match source {
            "self" => ok.then_some(Source::SelfIssued),
            "service" => match service_source(r) {
                Ok(s) => ok.then_some(s),
                Err((span, field, message)) => {
                    self.bad(span, format!("{key}.{field}"), message);
                    None
                }
            },
            "exchange" => match &r.upstream {
                None => {
                    self.bad(
                        r.source.span(),
                        format!("{key}.upstream"),
                        "an exchange resource must name its authorization server: upstream = \"<name of an [upstreams.<name>] table in the config>\"",
                    );
                    None
                }
                Some(u) if !valid_name(u.get_ref()) => {
                    self.bad(
                        u.span(),
                        format!("{key}.upstream"),
                        "must be an upstream name without spaces or control characters",
                    );
                    None
                }
                Some(u) => ok.then(|| Source::Exchange {
                    upstream: u.get_ref().clone(),
                }),
            },
            _ => {
                self.bad(
                    r.source.span(),
                    format!("{key}.source"),
                    "must be \"self\", \"service\" or \"exchange\"",
                );
                None
            }
        }
    }

    /// `[tools]`: the valid ones by name.
    pub(super) fn tools(
        &mut self,
        raw: &BTreeMap<String, RawTool>,
        resources: &BTreeMap<String, Resource>,
        declared: &BTreeSet<String>,
    ) -> BTreeMap<String, Tool> {
        let mut tools = BTreeMap::new();
        for (name, t) in raw {
            if let Some(tool) = self.tool(name, t, resources, declared) {
                tools.insert(name.clone(), tool);
            }
        }
        tools
    }

    /// One `[tools."name"]` table. On a bad resource the other keys are
    /// still checked, so one run reports every problem of the tool.
    fn tool(
        &mut self,
        name: &str,
        t: &RawTool,
        resources: &BTreeMap<String, Resource>,
        declared: &BTreeSet<String>,
    ) -> Option<Tool> {
        let key = format!("tools.{name:?}");
        if !valid_name(name) {
            self.bad(
                key_span(self.text, "tools", name),
                key.clone(),
                "tool names must not contain spaces or control characters",
            );
        }
        let resource = match canonical_resource(t.resource.get_ref()) {
            Ok(c) if resources.contains_key(&c) => Some(c),
            // Declared but invalid: its own error is already reported.
            Ok(c) if declared.contains(&c) => None,
            Ok(_) => {
                self.bad(
                    t.resource.span(),
                    format!("{key}.resource"),
                    "names a resource that is not declared under [resources]",
                );
                None
            }
            Err(e) => {
                self.bad(
                    t.resource.span(),
                    format!("{key}.resource"),
                    &format!("is not a usable resource URI: {e}"),
                );
                None
            }
        };
        let mut scopes = BTreeSet::new();
        for s in &t.scopes {
            if !valid_scope_token(s.get_ref()) {
                self.bad(s.span(), format!("{key}.scopes"), "a scope must be a non-empty token without spaces or quotes (RFC 6749 section 3.3)");
            } else if !scopes.insert(s.get_ref().clone()) {
                self.bad(s.span(), format!("{key}.scopes"), "scope listed twice");
            }
        }
        if t.steps.get_ref().is_empty() {
            self.bad(
                t.steps.span(),
                format!("{key}.steps"),
                "lists no step, so the tool could never be used; remove the tool or name its steps",
            );
        }
        let steps = self.steps(t.steps.get_ref(), &format!("{key}.steps"));
        let ttl = self.ttl(&t.ttl, format!("{key}.ttl"));
        let details = self.detail_types(t, &key);
        let approval = self.approval(t, &key, resource.as_deref().and_then(|r| resources.get(r)));
        let exchange = resource
            .as_ref()
            .and_then(|r| resources.get(r))
            .is_some_and(|r| matches!(r.source, Source::Exchange { .. }));
        if exchange && (!t.authorization_details.is_empty() || t.require_authorization_details) {
            // Nothing checks that the upstream's token carries them.
            self.bad(
                key_span(self.text, "tools", name),
                format!("{key}.authorization_details"),
                "cannot apply to a resource with source = \"exchange\": the upstream authorization server's token is not checked to carry the call's authorization_details",
            );
            return None;
        }
        let proxied = resource.as_ref().and_then(|r| resources.get(r)).map(|r| {
            matches!(
                r.source,
                Source::Service {
                    delivery: Delivery::Proxy,
                    ..
                }
            )
        });
        let routes = self.routes(t, &key, proxied, &steps, details.as_ref());
        if let Some(i) = routes.iter().position(|r| r.bind_request) {
            if !matches!(approval, Some(Some(Approval::EachCall))) {
                // Only the person's approval of one call says which
                // request is the call: without it nothing is bound.
                let span = t.routes.as_ref().map_or(0..0, |l| l.span());
                self.bad(
                    span,
                    format!("{key}.routes[{i}].bind_request"),
                    "binds the request to an approval, so the tool needs approval = \"each_call\"",
                );
            }
        }
        Some(Tool {
            name: name.to_string(),
            resource: resource?,
            scopes,
            steps,
            ttl,
            approval: approval?,
            require_details: t.require_authorization_details,
            details: details?,
            routes,
        })
    }

    /// `approval` and `approval_ttl`; `Some(None)` when the tool needs none,
    /// `None` when the keys are wrong (reported).
    fn approval(
        &mut self,
        t: &RawTool,
        key: &str,
        resource: Option<&Resource>,
    ) -> Option<Option<Approval>> {
        let ttl = match &t.approval_ttl {
            None => None,
            Some(v) => match parse_duration_upto(
                v.get_ref(),
                MAX_APPROVAL_TTL,
                "is longer than the 15m maximum of an approval",
            ) {
                Ok(d) => Some((d, v.span())),
                Err(m) => {
                    self.bad(v.span(), format!("{key}.approval_ttl"), m);
                    return None;
                }
            },
        };
        let Some(a) = &t.approval else {
            if let Some((_, span)) = ttl {
                self.bad(
                    span,
                    format!("{key}.approval_ttl"),
                    "only a tool with approval = \"per_step\" takes an approval_ttl",
                );
                return None;
            }
            return Some(None);
        };
        let approval = match (a.get_ref().as_str(), ttl) {
            ("each_call", None) => Approval::EachCall,
            ("each_call", Some((_, span))) => {
                self.bad(span, format!("{key}.approval_ttl"), "an each_call approval covers one call and has no approval_ttl; use approval = \"per_step\" for a time-boxed approval");
                return None;
            }
            ("per_step", Some((d, _))) => Approval::PerStep {
                ttl: d,
                unit: t
                    .approval_ttl
                    .as_ref()
                    .map(|v| super::TtlUnit::of(v.get_ref()))
                    .unwrap_or_default(),
            },
            ("per_step", None) => {
                self.bad(a.span(), format!("{key}.approval_ttl"), "approval = \"per_step\" needs approval_ttl (how long one approval covers the step, at most \"15m\")");
                return None;
            }
            _ => {
                self.bad(
                    a.span(),
                    format!("{key}.approval"),
                    "must be \"each_call\" or \"per_step\"",
                );
                return None;
            }
        };
        // A provider's bearer token leaves the broker whole: nothing could
        // tie it to the one call the person approved.
        if let Some(Resource {
            source:
                Source::Service {
                    delivery: Delivery::ProviderToken,
                    ..
                },
            ..
        }) = resource
        {
            self.bad(a.span(), format!("{key}.approval"), "cannot apply to a resource with delivery = \"provider_token\": the provider's bearer token is handed over whole and nothing binds it to the approved call");
            return None;
        }
        // The upstream AS's token is neither single-use nor bound to the
        // approved call's details (docs/UPSTREAM.md).
        if let Some(Resource {
            source: Source::Exchange { .. },
            ..
        }) = resource
        {
            self.bad(a.span(), format!("{key}.approval"), "cannot apply to a resource with source = \"exchange\": the upstream authorization server's token is neither single-use nor bound to the approved call");
            return None;
        }
        Some(Some(approval))
    }

    /// `[tools."name".authorization_details."type"]` tables.
    fn detail_types(&mut self, t: &RawTool, key: &str) -> Option<BTreeMap<String, DetailType>> {
        let mut ok = true;
        let mut out = BTreeMap::new();
        for (ty, fields) in &t.authorization_details {
            let tkey = format!("{key}.authorization_details.{ty:?}");
            let span = key_span(self.text, &format!("{key}.authorization_details"), ty);
            if !valid_detail_name(ty) {
                self.bad(
                    span.clone(),
                    tkey.clone(),
                    "a type name must be 1 to 64 ASCII letters, digits, '_', '-', '.' or ':'",
                );
                ok = false;
                continue;
            }
            if fields.is_empty() {
                self.bad(
                    span.clone(),
                    tkey.clone(),
                    "declares no field; declare every field the person must see",
                );
                ok = false;
            }
            let mut declared = BTreeMap::new();
            // The file's order, by the position of each field's `kind`.
            let mut order: Vec<(usize, String)> = Vec::new();
            for (name, f) in fields {
                let fkey = format!("{tkey}.{name:?}");
                if !valid_detail_name(name) || name == "type" {
                    self.bad(f.kind.span(), fkey.clone(), "a field name must be 1 to 64 ASCII letters, digits, '_', '-', '.' or ':', and not \"type\" (RFC 9396 section 2 reserves it)");
                    ok = false;
                    continue;
                }
                let kind = match f.kind.get_ref().as_str() {
                    "string" => FieldKind::String,
                    "strings" => FieldKind::Strings,
                    "integer" => FieldKind::Integer,
                    _ => {
                        self.bad(f.kind.span(), format!("{fkey}.kind"), "must be \"string\", \"strings\" (a list of strings) or \"integer\" (no nested objects in this release)");
                        ok = false;
                        continue;
                    }
                };
                let label = f.label.get_ref().trim();
                if label.is_empty()
                    || label.chars().count() > 128
                    || label.chars().any(char::is_control)
                {
                    self.bad(f.label.span(), format!("{fkey}.label"), "must be 1 to 128 characters without control characters: it is what the person reads");
                    ok = false;
                    continue;
                }
                order.push((f.kind.span().start, name.clone()));
                declared.insert(
                    name.clone(),
                    DetailField {
                        kind,
                        required: f.required,
                        label: label.to_string(),
                        log_in_clear: f.log_in_clear,
                    },
                );
            }
            order.sort();
            out.insert(
                ty.clone(),
                DetailType {
                    fields: declared,
                    order: order.into_iter().map(|(_, n)| n).collect(),
                },
            );
        }
        if t.require_authorization_details && t.authorization_details.is_empty() {
            self.bad(
                t.resource.span(),
                format!("{key}.require_authorization_details"),
                "requires authorization_details but declares no type under authorization_details",
            );
            ok = false;
        }
        ok.then_some(out)
    }
}
