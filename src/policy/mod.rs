//! The policy: which tool of this agent may get a token, in which step, for
//! which resource, with which scopes. Deny by default.
//!
//! Names (tools, steps, scopes) are compared byte for byte; there are no
//! wildcards. Resources are compared after RFC 3986 normalisation, and a
//! request resource with dot segments, encoded dots or slashes, userinfo, a
//! query or a fragment is refused before any comparison. Asking for more
//! scope than the tool has is denied whole, never narrowed.
//!
//! The format is documented in `policy/README.md`; its JSON Schema is
//! `proto/policy.schema.json`.
//!
//! Submodules: [`lint`] (warnings of `policy check`), [`explain`], [`diff`],
//! [`cases`] (`policy test`), [`cli`] (the `credbroker policy` commands) and
//! [`reload`] (hot reload in the running broker).

pub mod cases;
pub mod cli;
pub mod diff;
pub mod explain;
pub mod lint;
pub mod reload;
mod uri;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub use uri::{canonical_resource, ResourceError};

use crate::config::{line_col, parse_toml, Problem};

/// The longest token lifetime, whatever the policy says.
pub const MAX_TTL: Duration = Duration::from_secs(300);

/// Why a request was denied. The wire names are part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// No tool of that name in the policy.
    ToolNotAllowed,
    /// The tool exists but not in this step.
    StepNotAllowed,
    /// More scope than the tool has.
    ScopeNotAllowed,
    /// The resource is not the tool's.
    ResourceMismatch,
    /// The emergency freeze is on.
    Frozen,
}

impl DenyReason {
    /// The `reason` value on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::ToolNotAllowed => "tool_not_allowed",
            DenyReason::StepNotAllowed => "step_not_allowed",
            DenyReason::ScopeNotAllowed => "scope_not_allowed",
            DenyReason::ResourceMismatch => "resource_mismatch",
            DenyReason::Frozen => "frozen",
        }
    }
}

/// Where tokens for a resource come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Minted by credbroker (ES256, DPoP-bound).
    SelfIssued,
    /// The person's connected account at a third-party service (docs/DESIGN.md
    /// section 4, step 6): the provider's own token, handed over as the
    /// policy's `delivery` says.
    Service {
        /// The provider's name in the config (`[providers.<name>]`).
        service: String,
        /// How the token reaches the tool.
        delivery: Delivery,
    },
}

/// How a `service` resource's token reaches the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The provider's bearer token itself is handed to the tool: it cannot
    /// be narrowed to one call or bound to the tool's key, so the policy
    /// must say so explicitly (`delivery = "provider_token"`).
    ProviderToken,
}

impl Delivery {
    /// The value written in the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::ProviderToken => "provider_token",
        }
    }
}

/// A resource as the policy declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The identifier as written (also the `aud` of minted tokens).
    pub id: String,
    /// Its canonical form, for comparison.
    pub canonical: String,
    /// Token source.
    pub source: Source,
    /// Lifetime cap (at most [`MAX_TTL`]).
    pub ttl: Duration,
}

/// A tool as the policy declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// The tool's name.
    pub name: String,
    /// Canonical form of its one resource.
    pub resource: String,
    /// Scopes it may have.
    pub scopes: BTreeSet<String>,
    /// Steps in which it may be used.
    pub steps: BTreeSet<String>,
    /// Its own lifetime cap, if lower than the resource's.
    pub ttl: Option<Duration>,
}

/// A loaded, validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The agent the policy is written for.
    pub agent: String,
    /// SHA-256 (hex) of the file bytes; named by every decision.
    pub hash: String,
    /// The freeze flag written in the file.
    pub frozen: bool,
    /// The orchestrator's steps, when the file declares them (`steps = [...]`).
    /// When present, a request in any other step is denied, whatever the
    /// tools list; when absent, steps are only what the tools name.
    pub declared_steps: Option<BTreeSet<String>>,
    /// Resources by canonical identifier.
    pub resources: BTreeMap<String, Resource>,
    /// Tools by name.
    pub tools: BTreeMap<String, Tool>,
}

/// An allow decision: what to mint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The resource (its `id` is the audience).
    pub resource: Resource,
    /// Granted scopes, sorted.
    pub scopes: Vec<String>,
    /// Lifetime cap from the policy (before the subject-token cap).
    pub ttl: Duration,
}

/// A policy decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed, with what to issue.
    Allow(Grant),
    /// Denied, with the reason.
    Deny(DenyReason),
}

/// A request for a decision.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The orchestrator's step.
    pub step: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// Canonical resource (see [`canonical_resource`]).
    pub resource: &'a str,
    /// Requested scopes (`None` = the tool's scopes).
    pub scope: Option<&'a [String]>,
}

/// What the broker would answer to a request, judged on the request's raw
/// fields by the policy alone (no subject token, proof or admin freeze):
/// what `policy test` and `policy explain` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed, with what would be issued.
    Allow(Grant),
    /// Denied by the policy.
    Deny(DenyReason),
    /// The resource is refused before the policy is asked (`invalid_target`).
    InvalidTarget(ResourceError),
    /// The scope is not a list of scope tokens (`invalid_request`).
    InvalidScope,
}

impl Outcome {
    /// `allow` or `deny`.
    pub fn decision(&self) -> &'static str {
        match self {
            Outcome::Allow(_) => "allow",
            _ => "deny",
        }
    }

    /// The reason as the broker names it on the wire (`none` for an allow).
    pub fn reason(&self) -> &'static str {
        match self {
            Outcome::Allow(_) => "none",
            Outcome::Deny(r) => r.as_str(),
            Outcome::InvalidTarget(_) => "invalid_target",
            Outcome::InvalidScope => "invalid_request",
        }
    }
}

/// Every reason [`Outcome::reason`] can give for a denial.
pub const DENY_REASONS: &[&str] = &[
    "tool_not_allowed",
    "step_not_allowed",
    "scope_not_allowed",
    "resource_mismatch",
    "frozen",
    "invalid_target",
    "invalid_request",
];

/// Loading errors: every problem with its position.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy {path}: {source}")]
    Read {
        /// The path.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is invalid.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

#[derive(Debug, Deserialize)]
struct RawPolicy {
    agent: Spanned<String>,
    #[serde(default)]
    frozen: bool,
    #[serde(default)]
    steps: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    resources: BTreeMap<String, RawResource>,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
}

#[derive(Debug, Deserialize)]
struct RawResource {
    source: Spanned<String>,
    #[serde(default)]
    ttl: Option<Spanned<String>>,
    /// For `source = "service"`: the provider's name in the config.
    #[serde(default)]
    service: Option<Spanned<String>>,
    /// For `source = "service"`: how the token reaches the tool.
    #[serde(default)]
    delivery: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
struct RawTool {
    resource: Spanned<String>,
    #[serde(default)]
    scopes: Vec<Spanned<String>>,
    steps: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    ttl: Option<Spanned<String>>,
}

/// The span of a table key such as `[tools."mail.read"]` (or a dotted key
/// `tools."mail.read".x`) in the text; the start of the file if not found.
/// Map keys carry no span through serde, so they are found in the text: by
/// the usual spellings first, then by parsing each table header, which also
/// finds keys written with escapes or single quotes.
pub(crate) fn key_span(text: &str, table: &str, key: &str) -> std::ops::Range<usize> {
    let quoted = format!("{table}.\"{key}\"");
    let bare = format!("{table}.{key}");
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        for cand in [&quoted, &bare] {
            if let Some(rest) = t
                .strip_prefix('[')
                .and_then(|r| r.strip_prefix(cand.as_str()))
            {
                if rest.starts_with(']') || rest.starts_with('.') {
                    let start = offset + indent + 1;
                    return start..start + cand.len();
                }
            }
        }
        offset += line.len();
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if t.starts_with('[') && !t.starts_with("[[") {
            // A header line alone is a TOML document: `[a."b"]` -> {a: {b: {}}}.
            if let Ok(doc) = toml::from_str::<toml::Table>(t) {
                let found = doc
                    .get(table)
                    .and_then(toml::Value::as_table)
                    .is_some_and(|tbl| tbl.contains_key(key));
                if found {
                    let start = offset + indent + 1;
                    return start..start + 1;
                }
            }
        }
        offset += line.len();
    }
    0..0
}

/// Whether `s` is a valid name: non-empty, at most 256 characters, no
/// whitespace or control characters. (Counted in characters, as JSON Schema's
/// `maxLength` counts, so the loader and the schema agree.)
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= 256
        && !s.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Parses a policy lifetime: a whole number of seconds or minutes without a
/// leading zero, from `"1s"` to `"300s"` (`"5m"`). Stricter than the config's
/// durations on purpose: a sub-second ttl would mint tokens that are already
/// expired, and one spelling per value keeps reviews and the schema simple.
fn parse_policy_ttl(s: &str) -> Result<Duration, &'static str> {
    const SHAPE: &str = "must be a whole number of seconds or minutes such as \"60s\" or \"5m\"";
    const LONG: &str = "is longer than the 300s maximum";
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
        return Err(LONG);
    }
    let n: u64 = num.parse().map_err(|_| SHAPE)?;
    let d = Duration::from_secs(if unit == "m" { n * 60 } else { n });
    if d > MAX_TTL {
        return Err(LONG);
    }
    Ok(d)
}

/// Where `[table."key"]` starts in `text`, as `file:line:column`.
pub(crate) fn table_at(path: &Path, text: &str, table: &str, key: &str) -> String {
    let span = key_span(text, table, key);
    let (l, c) = line_col(text, span.start);
    format!("{}:{l}:{c}", path.display())
}

/// Where the top-level key `key` (before any table header) starts in
/// `text`, as `file:line:column`; the start of the file if not found.
pub(crate) fn top_key_at(path: &Path, text: &str, key: &str) -> String {
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            break;
        }
        let name = t.split(['=', ' ', '\t']).next().unwrap_or("");
        if name == key {
            return format!("{}:{}:{}", path.display(), i + 1, line.len() - t.len() + 1);
        }
    }
    format!("{}:1:1", path.display())
}

/// Whether `s` is a valid scope token (RFC 6749 section 3.3).
pub fn valid_scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// A requested `scope` that is not a space-separated list of scope tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("scope must be scope tokens separated by single spaces")]
pub struct InvalidScope;

/// Splits a requested `scope` string. `Err` if it is not a valid
/// space-separated list of scope tokens.
pub fn parse_scope(s: &str) -> Result<Vec<String>, InvalidScope> {
    let v: Vec<String> = s.split(' ').map(str::to_owned).collect();
    if v.iter().all(|t| valid_scope_token(t)) {
        Ok(v)
    } else {
        Err(InvalidScope)
    }
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
                "a service resource must say how the token reaches the tool; the only choice today is delivery = \"provider_token\" (the provider's bearer token is handed to the tool, unbound and not narrowed to one call)",
            ))
        }
        Some(d) if d.get_ref() == "provider_token" => Delivery::ProviderToken,
        Some(d) => return Err((d.span(), "delivery", "must be \"provider_token\" (the egress proxy comes later)")),
    };
    Ok(Source::Service { service, delivery })
}

impl Policy {
    /// The provider names that the policy's `service` resources use.
    pub fn services(&self) -> BTreeSet<&str> {
        self.resources
            .values()
            .filter_map(|r| match &r.source {
                Source::Service { service, .. } => Some(service.as_str()),
                Source::SelfIssued => None,
            })
            .collect()
    }

    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let bytes = std::fs::read(path).map_err(|source| PolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
        Policy::parse(path, &bytes)
    }

    /// Validates policy bytes; `path` names the file in messages.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Policy, PolicyError> {
        let at = |span: std::ops::Range<usize>, text: &str| {
            let (l, c) = line_col(text, span.start);
            format!("{}:{l}:{c}", path.display())
        };
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
        let raw: RawPolicy = parse_toml(path, text).map_err(PolicyError::Invalid)?;
        let mut problems = Vec::new();
        let mut bad = |span: std::ops::Range<usize>, key: String, message: &str| {
            problems.push(Problem {
                at: at(span, text),
                key: Some(key),
                message: message.to_string(),
            })
        };

        if !valid_name(raw.agent.get_ref()) {
            bad(
                raw.agent.span(),
                "agent".into(),
                "must be a name without spaces or control characters",
            );
        }

        let parse_ttl = |t: &Option<Spanned<String>>,
                         key: String,
                         bad: &mut dyn FnMut(std::ops::Range<usize>, String, &str)|
         -> Option<Duration> {
            let t = t.as_ref()?;
            match parse_policy_ttl(t.get_ref()) {
                Ok(d) => Some(d),
                Err(message) => {
                    bad(t.span(), key, message);
                    None
                }
            }
        };

        let declared_steps = match &raw.steps {
            None => None,
            Some(list) => {
                if list.get_ref().is_empty() {
                    bad(list.span(), "steps".into(), "declares no step, so every tool would be unreachable; list the orchestrator's steps or remove `steps`");
                }
                let mut set = BTreeSet::new();
                for s in list.get_ref() {
                    if !valid_name(s.get_ref()) {
                        bad(
                            s.span(),
                            "steps".into(),
                            "step names must not contain spaces or control characters",
                        );
                    } else if !set.insert(s.get_ref().clone()) {
                        bad(s.span(), "steps".into(), "step listed twice");
                    }
                }
                Some(set)
            }
        };

        let mut resources = BTreeMap::new();
        // Canonical ids of every resource key that parses, valid or not.
        let mut declared = BTreeSet::new();
        for (id, r) in &raw.resources {
            let id = Spanned::new(key_span(text, "resources", id), id.clone());
            // Debug quoting escapes control characters, so a key never prints raw.
            let key = format!("resources.{:?}", id.get_ref());
            let canonical = match canonical_resource(id.get_ref()) {
                Ok(c) => c,
                Err(e) => {
                    bad(
                        id.span(),
                        key.clone(),
                        &format!("is not a usable resource URI: {e}"),
                    );
                    continue;
                }
            };
            declared.insert(canonical.clone());
            let source = match r.source.get_ref().as_str() {
                "self" => {
                    let mut ok = true;
                    for (field, v) in [("service", &r.service), ("delivery", &r.delivery)] {
                        if let Some(v) = v {
                            bad(
                                v.span(),
                                format!("{key}.{field}"),
                                "only a resource with source = \"service\" takes this key",
                            );
                            ok = false;
                        }
                    }
                    if !ok {
                        continue;
                    }
                    Source::SelfIssued
                }
                "service" => match service_source(r) {
                    Ok(s) => s,
                    Err((span, field, message)) => {
                        bad(span, format!("{key}.{field}"), message);
                        continue;
                    }
                },
                "exchange" => {
                    bad(
                        r.source.span(),
                        format!("{key}.source"),
                        "source \"exchange\" is not available yet",
                    );
                    continue;
                }
                _ => {
                    bad(
                        r.source.span(),
                        format!("{key}.source"),
                        "must be \"self\" or \"service\"",
                    );
                    continue;
                }
            };
            let ttl = parse_ttl(&r.ttl, format!("{key}.ttl"), &mut bad).unwrap_or(MAX_TTL);
            if resources.contains_key(&canonical) {
                bad(
                    id.span(),
                    key,
                    "the same resource is declared twice (after normalisation)",
                );
                continue;
            }
            resources.insert(
                canonical.clone(),
                Resource {
                    id: id.get_ref().clone(),
                    canonical,
                    source,
                    ttl,
                },
            );
        }

        let mut tools = BTreeMap::new();
        for (name, t) in &raw.tools {
            let name = Spanned::new(key_span(text, "tools", name), name.clone());
            let key = format!("tools.{:?}", name.get_ref());
            if !valid_name(name.get_ref()) {
                bad(
                    name.span(),
                    key.clone(),
                    "tool names must not contain spaces or control characters",
                );
            }
            // On a bad resource the other keys are still checked, so one
            // run reports every problem of the tool.
            let resource = match canonical_resource(t.resource.get_ref()) {
                Ok(c) if resources.contains_key(&c) => Some(c),
                // Declared but invalid: its own error is already reported.
                Ok(c) if declared.contains(&c) => None,
                Ok(_) => {
                    bad(
                        t.resource.span(),
                        format!("{key}.resource"),
                        "names a resource that is not declared under [resources]",
                    );
                    None
                }
                Err(e) => {
                    bad(
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
                    bad(s.span(), format!("{key}.scopes"), "a scope must be a non-empty token without spaces or quotes (RFC 6749 section 3.3)");
                } else if !scopes.insert(s.get_ref().clone()) {
                    bad(s.span(), format!("{key}.scopes"), "scope listed twice");
                }
            }
            let mut steps = BTreeSet::new();
            if t.steps.get_ref().is_empty() {
                bad(t.steps.span(), format!("{key}.steps"), "lists no step, so the tool could never be used; remove the tool or name its steps");
            }
            for s in t.steps.get_ref() {
                if !valid_name(s.get_ref()) {
                    bad(
                        s.span(),
                        format!("{key}.steps"),
                        "step names must not contain spaces or control characters",
                    );
                } else if !steps.insert(s.get_ref().clone()) {
                    bad(s.span(), format!("{key}.steps"), "step listed twice");
                }
            }
            let ttl = parse_ttl(&t.ttl, format!("{key}.ttl"), &mut bad);
            let Some(resource) = resource else {
                continue;
            };
            tools.insert(
                name.get_ref().clone(),
                Tool {
                    name: name.get_ref().clone(),
                    resource,
                    scopes,
                    steps,
                    ttl,
                },
            );
        }

        if !problems.is_empty() {
            return Err(PolicyError::Invalid(problems));
        }
        Ok(Policy {
            agent: raw.agent.into_inner(),
            hash: crate::jose::sha256_hex(bytes),
            frozen: raw.frozen,
            declared_steps,
            resources,
            tools,
        })
    }

    /// Judges a request from its raw fields in the order the derive pipeline
    /// does (`exchange::Broker::run`): freeze, scope syntax, resource, then
    /// [`Policy::decide`]. Keep the two in step.
    pub fn evaluate(&self, step: &str, tool: &str, resource: &str, scope: Option<&str>) -> Outcome {
        if self.frozen {
            return Outcome::Deny(DenyReason::Frozen);
        }
        let scope = match scope.map(parse_scope) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => return Outcome::InvalidScope,
        };
        let resource = match canonical_resource(resource) {
            Ok(r) => r,
            Err(e) => return Outcome::InvalidTarget(e),
        };
        match self.decide(&Request {
            step,
            tool,
            resource: &resource,
            scope: scope.as_deref(),
        }) {
            Decision::Allow(g) => Outcome::Allow(g),
            Decision::Deny(r) => Outcome::Deny(r),
        }
    }

    /// The steps in which `tool` can really be used: the ones it lists, less
    /// any the policy's `steps` declaration does not have; none while frozen.
    pub fn reachable_steps(&self, tool: &Tool) -> BTreeSet<String> {
        if self.frozen {
            return BTreeSet::new();
        }
        match &self.declared_steps {
            None => tool.steps.clone(),
            Some(d) => tool.steps.intersection(d).cloned().collect(),
        }
    }

    /// The lifetime cap of tokens for `tool`: its own ttl, its resource's,
    /// and [`MAX_TTL`], whichever is shortest.
    pub fn tool_ttl(&self, tool: &Tool) -> Duration {
        let resource = self
            .resources
            .get(&tool.resource)
            .map_or(MAX_TTL, |r| r.ttl);
        tool.ttl.map_or(resource, |t| t.min(resource)).min(MAX_TTL)
    }

    /// Decides one request. Deny unless every check passes.
    pub fn decide(&self, req: &Request<'_>) -> Decision {
        if self.frozen {
            return Decision::Deny(DenyReason::Frozen);
        }
        let Some(tool) = self.tools.get(req.tool) else {
            return Decision::Deny(DenyReason::ToolNotAllowed);
        };
        if !tool.steps.contains(req.step) {
            return Decision::Deny(DenyReason::StepNotAllowed);
        }
        // A declared step list is a closed world: a tool entry naming a step
        // the orchestrator does not have grants nothing (`policy check` warns).
        if self
            .declared_steps
            .as_ref()
            .is_some_and(|d| !d.contains(req.step))
        {
            return Decision::Deny(DenyReason::StepNotAllowed);
        }
        if tool.resource != req.resource {
            return Decision::Deny(DenyReason::ResourceMismatch);
        }
        // The loader guarantees the tool's resource exists.
        let Some(resource) = self.resources.get(&tool.resource) else {
            return Decision::Deny(DenyReason::ResourceMismatch);
        };
        let scopes: Vec<String> = match req.scope {
            None => tool.scopes.iter().cloned().collect(),
            Some(asked) => {
                if !asked.iter().all(|s| tool.scopes.contains(s)) {
                    return Decision::Deny(DenyReason::ScopeNotAllowed);
                }
                let set: BTreeSet<&String> = asked.iter().collect();
                set.into_iter().cloned().collect()
            }
        };
        let ttl = tool
            .ttl
            .map_or(resource.ttl, |t| t.min(resource.ttl))
            .min(MAX_TTL);
        Decision::Allow(Grant {
            resource: resource.clone(),
            scopes,
            ttl,
        })
    }
}

#[cfg(test)]
mod service_tests;
#[cfg(test)]
mod tests;
