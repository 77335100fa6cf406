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
//! Submodules: [`details`] (RFC 9396 `authorization_details` against a
//! tool's declarations), [`lint`] (warnings of `policy check`), [`explain`], [`diff`],
//! [`cases`] (`policy test`) and [`cli`] (the `credbroker policy` commands).
//! Hot reload into a running broker is wiring, so it lives in `app::reload`
//! (it swaps the broker's policy, and `exchange` already imports `policy`).

pub(crate) mod cases;
pub(crate) mod cli;
pub(crate) mod details;
pub(crate) mod diff;
pub(crate) mod explain;
pub mod lint;
mod load;
mod reserved;
pub(crate) mod route;
mod uri;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

pub(crate) use uri::{canonical_resource, ResourceError};

pub(crate) use load::parse_policy_ttl;
use load::{Check, RawPolicy};
pub use reserved::RESERVED_KEYS;

use crate::base::grammar::parse_scope;
use crate::infra::diagnostics::{parse_toml, Problem};
use crate::infra::reserved::reserved_problems;

/// The longest token lifetime, whatever the policy says.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(300);

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
    /// The person's connected account at a third-party service (step 6 of
    /// the derive pipeline, `derive::exchange`): the provider's own token,
    /// handed over as the policy's `delivery` says.
    Service {
        /// The provider's name in the config (`[providers.<name>]`).
        service: String,
        /// How the token reaches the tool.
        delivery: Delivery,
    },
    /// A token from the organisation's authorization server, by RFC 8693
    /// token exchange there (docs/UPSTREAM.md), bound to the tool's key.
    Exchange {
        /// The upstream's name in the config (`[upstreams.<name>]`).
        upstream: String,
    },
}

/// How a `service` resource's token reaches the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The provider's bearer token itself is handed to the tool: it cannot
    /// be narrowed to one call or bound to the tool's key, so the policy
    /// must say so explicitly (`delivery = "provider_token"`).
    ProviderToken,
    /// The egress proxy (docs/PROXY.md): the provider's token stays in the
    /// broker; the tool gets a credbroker token whose audience is the proxy
    /// address `{issuer}/proxy/{service}` and calls the routes its policy
    /// entry lists through it.
    Proxy,
}

impl Delivery {
    /// The value written in the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::ProviderToken => "provider_token",
            Delivery::Proxy => "proxy",
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

/// The longest an approval of `approval = "per_step"` may cover a step.
pub(crate) const MAX_APPROVAL_TTL: Duration = Duration::from_secs(15 * 60);

/// How a tool's calls are approved by the person (docs/APPROVALS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// Every derive needs an approval of its own, redeemed once.
    EachCall,
    /// One approval covers the same call (tool, resource, details, DPoP
    /// key) in steps of the same name, for `ttl` from the grant.
    PerStep {
        /// How long from the grant.
        ttl: Duration,
        /// The unit `approval_ttl` was written in.
        unit: TtlUnit,
    },
}

/// The unit a per-step approval's `approval_ttl` was written in (`"90s"`,
/// `"5m"`): the approval page and the events state its reach in it, so the
/// person reads exactly what the policy says, never a rounded figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TtlUnit {
    /// `"<n>s"`; also what a record written before the unit was kept reads
    /// as (seconds are exact whatever was written).
    #[default]
    Seconds,
    /// `"<n>m"`.
    Minutes,
}

impl TtlUnit {
    /// The unit of a policy duration such as `"90s"` or `"5m"` (one that
    /// parsed: it ends in its unit).
    pub(crate) fn of(spelled: &str) -> TtlUnit {
        if spelled.ends_with('m') {
            TtlUnit::Minutes
        } else {
            TtlUnit::Seconds
        }
    }

    /// `secs` in this unit, as a number and the unit's letter: `"90s"`,
    /// `"5m"` (in seconds when `secs` is not whole minutes).
    pub fn spelled(self, secs: i64) -> String {
        match self.whole(secs) {
            TtlUnit::Minutes => format!("{}m", secs / 60),
            TtlUnit::Seconds => format!("{secs}s"),
        }
    }

    /// `secs` in words in this unit: `"4 seconds"`, `"1 minute"`,
    /// `"5 minutes"` (in seconds when `secs` is not whole minutes).
    pub fn words(self, secs: i64) -> String {
        let (n, one) = match self.whole(secs) {
            TtlUnit::Minutes => (secs / 60, "minute"),
            TtlUnit::Seconds => (secs, "second"),
        };
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    }

    fn whole(self, secs: i64) -> TtlUnit {
        if self == TtlUnit::Minutes && secs % 60 == 0 {
            TtlUnit::Minutes
        } else {
            TtlUnit::Seconds
        }
    }
}

impl Approval {
    /// The value written in the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Approval::EachCall => "each_call",
            Approval::PerStep { .. } => "per_step",
        }
    }
}

/// The value a declared `authorization_details` field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A JSON string.
    String,
    /// A JSON array of strings.
    Strings,
    /// A JSON integer (within ±(2^53 - 1), so that every JSON reader agrees).
    Integer,
}

/// One declared field of an `authorization_details` type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetailField {
    /// Its value's kind.
    pub kind: FieldKind,
    /// Whether every entry of the type must carry it.
    pub required: bool,
    /// What the person reads next to the value on the approval page.
    pub label: String,
    /// Whether audit events may carry the value in clear (otherwise only
    /// the hash of all details is recorded).
    pub log_in_clear: bool,
}

/// One RFC 9396 `authorization_details` type a tool accepts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DetailType {
    /// Every field it may carry, by name (`type` itself is implicit).
    pub fields: BTreeMap<String, DetailField>,
    /// The field names in the order the policy file declares them (by
    /// where each field's `kind` is written): serde hands the loader a
    /// sorted map, so the file's order is recovered from the spans.
    pub order: Vec<String>,
}

impl DetailType {
    /// The fields, in the order the policy file declares them: the order
    /// the person and a reviewer see them in.
    pub fn ordered(&self) -> impl Iterator<Item = (&String, &DetailField)> {
        self.order
            .iter()
            .filter_map(|n| self.fields.get_key_value(n))
    }
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
    /// Whether each call must be approved by the person, and how.
    pub approval: Option<Approval>,
    /// Whether a request must carry `authorization_details`.
    pub require_details: bool,
    /// The `authorization_details` types it accepts, by `type`. Empty: a
    /// request carrying details is refused.
    pub details: BTreeMap<String, DetailType>,
    /// For a tool on a `delivery = "proxy"` resource: the calls it may make
    /// through the proxy (empty for any other tool).
    pub routes: Vec<route::Route>,
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
pub(crate) const DENY_REASONS: &[&str] = &[
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

impl Policy {
    /// The provider names that the policy's `service` resources use.
    pub fn services(&self) -> BTreeSet<&str> {
        self.resources
            .values()
            .filter_map(|r| match &r.source {
                Source::Service { service, .. } => Some(service.as_str()),
                Source::SelfIssued | Source::Exchange { .. } => None,
            })
            .collect()
    }

    /// The upstream names that the policy's `exchange` resources use.
    pub fn upstreams(&self) -> BTreeSet<&str> {
        self.resources
            .values()
            .filter_map(|r| match &r.source {
                Source::Exchange { upstream } => Some(upstream.as_str()),
                Source::SelfIssued | Source::Service { .. } => None,
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
        let text = load::policy_text(path, bytes)?;
        // A key reserved for a feature not built yet is refused as such
        // (not as unknown), before anything else.
        let reserved = reserved_problems(path, text, RESERVED_KEYS);
        if !reserved.is_empty() {
            return Err(PolicyError::Invalid(reserved));
        }
        let raw: RawPolicy = parse_toml(path, text).map_err(PolicyError::Invalid)?;
        let mut check = Check::new(path, text);
        check.agent(&raw.agent);
        let declared_steps = raw.steps.as_ref().map(|s| check.declared_steps(s));
        let (resources, declared) = check.resources(&raw.resources);
        let tools = check.tools(&raw.tools, &resources, &declared);
        if !check.problems.is_empty() {
            return Err(PolicyError::Invalid(check.problems));
        }
        Ok(Policy {
            agent: raw.agent.into_inner(),
            hash: crate::base::jose::sha256_hex(bytes),
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
        let resource = self
            .canonical(resource)
            .map_err(Refusal::InvalidTarget)?
            .into_owned();
        Ok(Checked { resource, scope })
    }

    /// `resource` in canonical form. A resource this policy declares is
    /// taken as it is: the policy keeps its resources in canonical form,
    /// and canonicalising a canonical form changes nothing (the fuzz
    /// targets `request_json` and `request_form` check that), so the URL
    /// parse is skipped for every request that names a declared resource
    /// exactly.
    fn canonical<'r>(&self, resource: &'r str) -> Result<std::borrow::Cow<'r, str>, ResourceError> {
        if self.resources.contains_key(resource) {
            return Ok(std::borrow::Cow::Borrowed(resource));
        }
        canonical_resource(resource).map(std::borrow::Cow::Owned)
    }

    /// Whether `step` is a name this policy declares (in `steps`, or in a
    /// tool's steps): the audit log writes only such names in clear.
    pub fn declares_step(&self, step: &str) -> bool {
        self.declared_steps
            .as_ref()
            .is_some_and(|s| s.contains(step))
            || self.tools.values().any(|t| t.steps.contains(step))
    }

    /// The canonical form of `resource` if it names a declared resource.
    pub fn declared_resource(&self, resource: &str) -> Option<&str> {
        let canonical = self.canonical(resource).ok()?;
        self.resources
            .get_key_value(canonical.as_ref())
            .map(|(k, _)| k.as_str())
    }

    /// Whether every token of `scope` (space-separated) is a scope some
    /// tool declares.
    pub fn declares_scope(&self, scope: &str) -> bool {
        let mut tokens = scope.split(' ').peekable();
        tokens.peek().is_some() && tokens.all(|s| self.tools.values().any(|t| t.scopes.contains(s)))
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

/// Why the current policy refuses a proxied call (the proxy's 403s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteDenial {
    /// The policy (file) is frozen.
    Frozen,
    /// The token's tool is no longer in the policy.
    ToolNotAllowed,
    /// The tool no longer has this resource with `delivery = "proxy"`.
    ResourceMismatch,
    /// No route of the tool matches the method and path.
    RouteNotAllowed,
    /// A route matches, but not in the token's step.
    StepNotAllowed,
    /// The route binds variables to the token's `authorization_details`,
    /// and the path's variables are not the approved ones.
    DetailsMismatch,
}

impl RouteDenial {
    /// The `reason` value on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteDenial::Frozen => "frozen",
            RouteDenial::ToolNotAllowed => "tool_not_allowed",
            RouteDenial::ResourceMismatch => "resource_mismatch",
            RouteDenial::RouteNotAllowed => "route_not_allowed",
            RouteDenial::StepNotAllowed => "step_not_allowed",
            RouteDenial::DetailsMismatch => "details_mismatch",
        }
    }
}

/// The path of the proxy address of `service` under the issuer.
pub(crate) fn proxy_path(service: &str) -> String {
    format!("/proxy/{service}")
}

impl Policy {
    /// Judges one proxied call against this (the current) policy: the
    /// token's `tool` must still use the proxy `resource` (canonical), one
    /// of its routes must match `method` and the raw `path`, and that route
    /// must allow the token's `step` (and the policy the step). Returns the
    /// matching route.
    pub fn proxy_route(
        &self,
        tool: &str,
        step: &str,
        resource: &str,
        method: &str,
        path: &str,
    ) -> Result<&route::Route, RouteDenial> {
        if self.frozen {
            return Err(RouteDenial::Frozen);
        }
        let t = self.tools.get(tool).ok_or(RouteDenial::ToolNotAllowed)?;
        let proxied = self.resources.get(&t.resource).is_some_and(|r| {
            matches!(
                r.source,
                Source::Service {
                    delivery: Delivery::Proxy,
                    ..
                }
            )
        });
        if t.resource != resource || !proxied {
            return Err(RouteDenial::ResourceMismatch);
        }
        let mut matched = t
            .routes
            .iter()
            .filter(|r| r.matches(method, path))
            .peekable();
        if matched.peek().is_none() {
            return Err(RouteDenial::RouteNotAllowed);
        }
        let step_ok = t.steps.contains(step)
            && self
                .declared_steps
                .as_ref()
                .is_none_or(|d| d.contains(step));
        matched
            .find(|r| step_ok && r.allows_step(step))
            .ok_or(RouteDenial::StepNotAllowed)
    }

    /// The proxy address rule, checked where the issuer is known (start-up
    /// and reload): a `delivery = "proxy"` resource is exactly
    /// `{issuer}/proxy/{service}`, and no other resource lies under
    /// `{issuer}/proxy/`. `Err` names the resource and the rule.
    pub fn check_proxy_addresses(&self, issuer: &str) -> Result<(), String> {
        let issuer = canonical_resource(issuer).unwrap_or_else(|_| issuer.to_string());
        let base = format!("{}/proxy/", issuer.trim_end_matches('/'));
        for r in self.resources.values() {
            match &r.source {
                Source::Service {
                    service,
                    delivery: Delivery::Proxy,
                } => {
                    let want = format!("{}{}", issuer.trim_end_matches('/'), proxy_path(service));
                    if r.canonical != want {
                        return Err(format!(
                            "resources.{:?}: a delivery = \"proxy\" resource must be the proxy address {want:?} (the broker's issuer, /proxy/, the service name)",
                            r.id
                        ));
                    }
                }
                _ if r.canonical.starts_with(&base) => {
                    return Err(format!(
                        "resources.{:?}: addresses under {base:?} are the broker's proxy; only a source = \"service\" resource with delivery = \"proxy\" may be there",
                        r.id
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod approval_tests;
#[cfg(test)]
mod exchange_tests;
#[cfg(test)]
mod service_tests;
#[cfg(test)]
mod tests;
