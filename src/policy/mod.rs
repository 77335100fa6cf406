//! The policy: which tool of this agent may get a token, in which step, for
//! which resource, with which scopes. Deny by default.
//!
//! Names (tools, steps, scopes) are compared byte for byte; there are no
//! wildcards. Resources are compared after RFC 3986 normalisation, and a
//! request resource with dot segments, encoded dots or slashes, userinfo, a
//! query or a fragment is refused before any comparison. Asking for more
//! scope than the tool has is denied whole, never narrowed.
//!
//! The format is documented in `policy/README.md`.

mod uri;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub use uri::{canonical_resource, ResourceError};

use crate::config::{line_col, parse_duration, parse_toml, Problem};

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
/// Map keys carry no span through serde, so they are found in the text.
fn key_span(text: &str, table: &str, key: &str) -> std::ops::Range<usize> {
    let quoted = format!("{table}.\"{key}\"");
    let bare = format!("{table}.{key}");
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        for cand in [&quoted, &bare] {
            if let Some(rest) = t.strip_prefix('[').and_then(|r| r.strip_prefix(cand.as_str())) {
                if rest.starts_with(']') || rest.starts_with('.') {
                    let start = offset + indent + 1;
                    return start..start + cand.len();
                }
            }
        }
        offset += line.len();
    }
    0..0
}

/// Whether `s` is a valid name: non-empty, printable, no whitespace.
fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && !s.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Whether `s` is a valid scope token (RFC 6749 section 3.3).
pub fn valid_scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// Splits a requested `scope` string. `Err` if it is not a valid
/// space-separated list of scope tokens.
pub fn parse_scope(s: &str) -> Result<Vec<String>, ()> {
    let v: Vec<String> = s.split(' ').map(str::to_owned).collect();
    if v.iter().all(|t| valid_scope_token(t)) {
        Ok(v)
    } else {
        Err(())
    }
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
                at: path.display().to_string(),
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
            bad(raw.agent.span(), "agent".into(), "must be a name without spaces or control characters");
        }

        let parse_ttl = |t: &Option<Spanned<String>>, key: String, bad: &mut dyn FnMut(std::ops::Range<usize>, String, &str)| -> Option<Duration> {
            let t = t.as_ref()?;
            match parse_duration(t.get_ref()) {
                Some(d) if !d.is_zero() && d <= MAX_TTL => Some(d),
                Some(d) if d > MAX_TTL => {
                    bad(t.span(), key, "is longer than the 300s maximum");
                    None
                }
                _ => {
                    bad(t.span(), key, "must be a duration such as \"300s\" or \"2m\"");
                    None
                }
            }
        };

        let mut resources = BTreeMap::new();
        for (id, r) in &raw.resources {
            let id = Spanned::new(key_span(text, "resources", id), id.clone());
            let key = format!("resources.\"{}\"", id.get_ref());
            let canonical = match canonical_resource(id.get_ref()) {
                Ok(c) => c,
                Err(e) => {
                    bad(id.span(), key.clone(), &format!("is not a usable resource URI: {e}"));
                    continue;
                }
            };
            let source = match r.source.get_ref().as_str() {
                "self" => {
                    let mut ok = true;
                    for (field, v) in [("service", &r.service), ("delivery", &r.delivery)] {
                        if let Some(v) = v {
                            bad(v.span(), format!("{key}.{field}"), "only a resource with source = \"service\" takes this key");
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
                    bad(r.source.span(), format!("{key}.source"), "source \"exchange\" is not available yet");
                    continue;
                }
                _ => {
                    bad(r.source.span(), format!("{key}.source"), "must be \"self\" or \"service\"");
                    continue;
                }
            };
            let ttl = parse_ttl(&r.ttl, format!("{key}.ttl"), &mut bad).unwrap_or(MAX_TTL);
            if resources.contains_key(&canonical) {
                bad(id.span(), key, "the same resource is declared twice (after normalisation)");
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
            let key = format!("tools.\"{}\"", name.get_ref());
            if !valid_name(name.get_ref()) {
                bad(name.span(), key.clone(), "tool names must not contain spaces or control characters");
            }
            let resource = match canonical_resource(t.resource.get_ref()) {
                Ok(c) if resources.contains_key(&c) => c,
                Ok(_) => {
                    bad(t.resource.span(), format!("{key}.resource"), "names a resource that is not declared under [resources]");
                    continue;
                }
                Err(e) => {
                    bad(t.resource.span(), format!("{key}.resource"), &format!("is not a usable resource URI: {e}"));
                    continue;
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
                    bad(s.span(), format!("{key}.steps"), "step names must not contain spaces or control characters");
                } else if !steps.insert(s.get_ref().clone()) {
                    bad(s.span(), format!("{key}.steps"), "step listed twice");
                }
            }
            let ttl = parse_ttl(&t.ttl, format!("{key}.ttl"), &mut bad);
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
            resources,
            tools,
        })
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
        let ttl = tool.ttl.map_or(resource.ttl, |t| t.min(resource.ttl)).min(MAX_TTL);
        Decision::Allow(Grant {
            resource: resource.clone(),
            scopes,
            ttl,
        })
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod service_tests;
