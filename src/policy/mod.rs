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
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub use uri::{canonical_resource, ResourceError};

use crate::diagnostics::{key_span, line_col, offset_at, parse_toml, Problem};
use crate::grammar::{parse_scope, valid_scope_token};

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
    /// The person's connected account at a third-party service (DESIGN
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

/// A request's scope and resource once [`Policy::prelude`] accepted them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The canonical resource.
    pub resource: String,
    /// The requested scopes (`None` = the tool's scopes).
    pub scope: Option<Vec<String>>,
}

impl Checked {
    /// The request to [`Policy::decide`] for `tool` in `step`.
    pub fn request<'a>(&'a self, step: &'a str, tool: &'a str) -> Request<'a> {
        Request {
            step,
            tool,
            resource: &self.resource,
            scope: self.scope.as_deref(),
        }
    }
}

/// Why [`Policy::prelude`] refused a request, before any tool is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The emergency freeze is on (the admin flag or the file's).
    Frozen,
    /// The scope is not a list of scope tokens (`invalid_request`).
    InvalidScope,
    /// The resource is refused (`invalid_target`).
    InvalidTarget(ResourceError),
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

/// Validates the keys of a `source = "service"` resource: a provider name,
/// and `delivery` written out (DESIGN section 2: handing the provider's
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

/// The policy's text: UTF-8 and not empty (an empty file would load as a
/// policy that denies everything, which is never what was meant).
fn policy_text<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, PolicyError> {
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
struct Check<'a> {
    path: &'a Path,
    text: &'a str,
    problems: Vec<Problem>,
}

impl Check<'_> {
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
    fn declared_steps(&mut self, list: &Spanned<Vec<Spanned<String>>>) -> BTreeSet<String> {
        if list.get_ref().is_empty() {
            self.bad(list.span(), "steps".into(), "declares no step, so every tool would be unreachable; list the orchestrator's steps or remove `steps`");
        }
        self.steps(list.get_ref(), "steps")
    }

    /// `[resources]`: the valid ones by canonical identifier, and the
    /// canonical identifiers of every key that parses, valid or not (a tool
    /// naming an invalid one is not reported twice).
    fn resources(
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
        match r.source.get_ref().as_str() {
            "self" => {
                let mut ok = true;
                for (field, v) in [("service", &r.service), ("delivery", &r.delivery)] {
                    if let Some(v) = v {
                        self.bad(
                            v.span(),
                            format!("{key}.{field}"),
                            "only a resource with source = \"service\" takes this key",
                        );
                        ok = false;
                    }
                }
                ok.then_some(Source::SelfIssued)
            }
            "service" => match service_source(r) {
                Ok(s) => Some(s),
                Err((span, field, message)) => {
                    self.bad(span, format!("{key}.{field}"), message);
                    None
                }
            },
            "exchange" => {
                self.bad(
                    r.source.span(),
                    format!("{key}.source"),
                    "source \"exchange\" is not available yet",
                );
                None
            }
            _ => {
                self.bad(
                    r.source.span(),
                    format!("{key}.source"),
                    "must be \"self\" or \"service\"",
                );
                None
            }
        }
    }

    /// `[tools]`: the valid ones by name.
    fn tools(
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
        Some(Tool {
            name: name.to_string(),
            resource: resource?,
            scopes,
            steps,
            ttl,
        })
    }
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

    /// Validates policy bytes; `path` names the file in messages. The
    /// sections are checked in file order (agent, steps, resources, tools),
    /// and their problems are reported in that order.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Policy, PolicyError> {
        let text = policy_text(path, bytes)?;
        let raw: RawPolicy = parse_toml(path, text).map_err(PolicyError::Invalid)?;
        let mut check = Check {
            path,
            text,
            problems: Vec::new(),
        };
        if !valid_name(raw.agent.get_ref()) {
            check.bad(
                raw.agent.span(),
                "agent".into(),
                "must be a name without spaces or control characters",
            );
        }
        let declared_steps = raw.steps.as_ref().map(|s| check.declared_steps(s));
        let (resources, declared) = check.resources(&raw.resources);
        let tools = check.tools(&raw.tools, &resources, &declared);
        if !check.problems.is_empty() {
            return Err(PolicyError::Invalid(check.problems));
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

    /// The checks every request meets first, in this order, both in the
    /// derive pipeline (`exchange::Broker::run`) and in
    /// [`Policy::evaluate`]: the freeze (`admin_frozen` or the file's own
    /// flag), so that every refusal while frozen says so; the scope's
    /// syntax; the resource's canonical form. The pipeline checks the
    /// subject token between this and [`Policy::decide`].
    pub fn prelude(
        &self,
        admin_frozen: bool,
        resource: &str,
        scope: Option<&str>,
    ) -> Result<Checked, Refusal> {
        if admin_frozen || self.frozen {
            return Err(Refusal::Frozen);
        }
        let scope = match scope.map(parse_scope) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => return Err(Refusal::InvalidScope),
        };
        let resource = canonical_resource(resource).map_err(Refusal::InvalidTarget)?;
        Ok(Checked { resource, scope })
    }

    /// Judges a request from its raw fields as the derive pipeline does:
    /// [`Policy::prelude`] (without the admin freeze, which is not the
    /// file's), then [`Policy::decide`].
    pub fn evaluate(&self, step: &str, tool: &str, resource: &str, scope: Option<&str>) -> Outcome {
        let checked = match self.prelude(false, resource, scope) {
            Ok(c) => c,
            Err(Refusal::Frozen) => return Outcome::Deny(DenyReason::Frozen),
            Err(Refusal::InvalidScope) => return Outcome::InvalidScope,
            Err(Refusal::InvalidTarget(e)) => return Outcome::InvalidTarget(e),
        };
        match self.decide(&checked.request(step, tool)) {
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
