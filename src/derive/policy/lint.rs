//! The warnings of `credbroker policy check`: constructs that load fine but
//! that a reviewer should look at twice. Each lint is one small function over
//! a loaded [`Policy`]; adding one means adding a function to [`lint`].
//!
//! Warnings never change what the broker decides; `--deny-warnings` makes
//! them fail a CI job.

use std::path::Path;

use super::{Policy, Resource, Source, Tool};
use crate::infra::diagnostics::{table_at, top_key_at};

/// A tool usable in more steps than this is reported: every step it is
/// allowed in is one more place where a prompt-injected model can reach it.
pub const MANY_STEPS: usize = 3;

/// Characters that look like glob syntax; names have no wildcards.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}'];

/// One warning, with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// `file:line:column` of the table or key concerned.
    pub at: String,
    /// The key path (`tools."mail.send"`).
    pub key: String,
    /// What is risky.
    pub message: String,
    /// What to do about it.
    pub hint: String,
}

/// All warnings for a policy loaded from `text` (read from `path`).
pub fn lint(path: &Path, text: &str, policy: &Policy) -> Vec<Warning> {
    let mut out = Vec::new();
    frozen(path, text, policy, &mut out);
    for tool in policy.tools.values() {
        let at = table_at(path, text, "tools", &tool.name);
        let key = format!("tools.{:?}", tool.name);
        let mut warn = |message: String, hint: &str| {
            out.push(Warning {
                at: at.clone(),
                key: key.clone(),
                message,
                hint: hint.into(),
            })
        };
        many_steps(tool, &mut warn);
        unreachable(policy, tool, &mut warn);
        glob_names(tool, &mut warn);
        overlapping_routes(policy, tool, &mut warn);
        approval_without_details(tool, &mut warn);
    }
    for resource in policy.resources.values() {
        let at = table_at(path, text, "resources", &resource.id);
        let key = format!("resources.{:?}", resource.id);
        let mut warn = |message: String, hint: &str| {
            out.push(Warning {
                at: at.clone(),
                key: key.clone(),
                message,
                hint: hint.into(),
            })
        };
        unused_resource(policy, resource, &mut warn);
        risky_source(resource, &mut warn);
    }
    out
}

type Warn<'a> = dyn FnMut(String, &str) + 'a;

/// A tool that needs approval but lets the call go without details: the
/// person would approve "use the tool", not a call they can check.
fn approval_without_details(tool: &Tool, warn: &mut Warn<'_>) {
    if tool.approval.is_some() && !tool.require_details {
        warn(
            "needs approval but does not require authorization_details: the person may be asked to approve a call without seeing what it does".into(),
            "declare the fields the person must see under authorization_details and set require_authorization_details = true",
        );
    }
}

fn frozen(path: &Path, text: &str, policy: &Policy, out: &mut Vec<Warning>) {
    if policy.frozen {
        out.push(Warning {
            at: top_key_at(path, text, "frozen"),
            key: "frozen".into(),
            message: "frozen = true: the broker denies every derive while this file is loaded".into(),
            hint: "remove `frozen` once the emergency is over; use `credbroker freeze` for a stop that does not need a policy change".into(),
        });
    }
}

fn many_steps(tool: &Tool, warn: &mut Warn<'_>) {
    if tool.steps.len() > MANY_STEPS {
        warn(
            format!(
                "is allowed in {} steps ({}); each one is another place where a prompt-injected model can reach it",
                tool.steps.len(),
                list(&tool.steps)
            ),
            "list only the steps whose code needs this tool",
        );
    }
}

fn unreachable(policy: &Policy, tool: &Tool, warn: &mut Warn<'_>) {
    let Some(declared) = &policy.declared_steps else {
        return;
    };
    let undeclared: Vec<&String> = tool
        .steps
        .iter()
        .filter(|s| !declared.contains(*s))
        .collect();
    if undeclared.is_empty() {
        return;
    }
    if undeclared.len() == tool.steps.len() {
        let scopes = if tool.scopes.is_empty() {
            "no scope".to_string()
        } else {
            format!("scopes {}", list(&tool.scopes))
        };
        warn(
            format!(
                "is granted {scopes} but no step can reach it: none of its steps ({}) is in the declared `steps`",
                list(&tool.steps)
            ),
            "fix the step names (a typo?) or add the steps to `steps`; until then every request for this tool is denied",
        );
    } else {
        warn(
            format!(
                "lists steps that are not in the declared `steps`: {}; requests in them are denied",
                undeclared
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "fix the step names (a typo?) or add them to `steps`",
        );
    }
}

fn glob_names(tool: &Tool, warn: &mut Warn<'_>) {
    let globby: Vec<&str> = std::iter::once(&tool.name)
        .chain(tool.steps.iter())
        .filter(|n| n.contains(GLOB_CHARS))
        .map(String::as_str)
        .collect();
    if !globby.is_empty() {
        warn(
            format!(
                "names containing wildcard characters: {}; they are matched literally, byte for byte",
                globby.join(", ")
            ),
            "policies have no wildcards: name each tool and step exactly",
        );
    }
}

fn unused_resource(policy: &Policy, resource: &Resource, warn: &mut Warn<'_>) {
    if !policy
        .tools
        .values()
        .any(|t| t.resource == resource.canonical)
    {
        warn(
            "is declared but no tool uses it".into(),
            "remove it, or name it in a tool's `resource`",
        );
    }
}

/// The warning for `delivery = "provider_token"` (see `risky_source`).
pub const PROVIDER_TOKEN_WARNING: &str = "delivery = \"provider_token\" hands the provider's bearer token to the tool: it is not narrowed to this resource, not bound to the tool's key, and lives as long as the provider decides";
/// The hint that goes with [`PROVIDER_TOKEN_WARNING`].
pub const PROVIDER_TOKEN_HINT: &str = "prefer delivery = \"proxy\" (the provider's token stays in the broker and each call is narrowed to the tool's routes, docs/PROXY.md); keep the tools on this resource to the fewest steps and scopes";

/// Warnings that come with a token source. Every source must be matched
/// here, so a new one cannot be added without deciding what to warn about.
fn risky_source(resource: &Resource, warn: &mut Warn<'_>) {
    match &resource.source {
        // Minted here: one audience, DPoP-bound, at most 300 s.
        Source::SelfIssued => {}
        Source::Service {
            delivery: crate::derive::policy::Delivery::ProviderToken,
            ..
        } => warn(PROVIDER_TOKEN_WARNING.into(), PROVIDER_TOKEN_HINT),
        // The token stays in the broker; calls are narrowed to routes.
        Source::Service {
            delivery: crate::derive::policy::Delivery::Proxy,
            ..
        } => {}
        // The upstream's token is checked like one minted here (one
        // audience, the granted scopes, bound, at most 300 s).
        Source::Exchange { .. } => {}
    }
}

/// Two tools whose routes on the same proxy resource can match the same
/// call: each can make the other's call, which the reviewer should know.
/// Reported at the second tool, with a path both match.
fn overlapping_routes(policy: &Policy, tool: &Tool, warn: &mut Warn<'_>) {
    for other in policy.tools.values() {
        if other.name >= tool.name || other.resource != tool.resource {
            continue;
        }
        for a in &tool.routes {
            for b in &other.routes {
                if let Some(path) = a.overlap(b) {
                    warn(
                        format!(
                            "route {:?} overlaps route {:?} of tool {:?}: both allow {} {path}",
                            a.text, b.text, other.name, a.method
                        ),
                        "make the routes disjoint, or accept that each tool can make the other's call",
                    );
                }
            }
        }
    }
}

fn list(set: &std::collections::BTreeSet<String>) -> String {
    set.iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Policy {
        Policy::parse(Path::new("p.toml"), text.as_bytes()).unwrap()
    }

    const BASE: &str = r#"agent = "a"
[resources."https://api.example/"]
source = "self"
"#;

    #[test]
    fn clean_policy_has_no_warning() {
        let p = format!("{BASE}[tools.t]\nresource = \"https://api.example/\"\nscopes = [\"r\"]\nsteps = [\"a\", \"b\", \"c\"]\n");
        assert_eq!(lint(Path::new("p.toml"), &p, &load(&p)), vec![]);
    }

    #[test]
    fn tool_in_four_steps_is_reported_at_its_table() {
        let p = format!("{BASE}[tools.t]\nresource = \"https://api.example/\"\nsteps = [\"a\", \"b\", \"c\", \"d\"]\n");
        let w = lint(Path::new("p.toml"), &p, &load(&p));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].at, "p.toml:4:2");
        assert!(w[0]
            .message
            .starts_with("is allowed in 4 steps (a, b, c, d)"));
    }

    #[test]
    fn unused_resource_and_unreachable_tool() {
        let p = r#"agent = "a"
steps = ["triage"]
[resources."https://api.example/"]
source = "self"
[resources."https://other.example/"]
source = "self"
[tools.t]
resource = "https://api.example/"
scopes = ["w"]
steps = ["traige"]
"#;
        let w = lint(Path::new("p.toml"), p, &load(p));
        let msgs: Vec<(&str, &str)> = w
            .iter()
            .map(|w| (w.at.as_str(), w.message.as_str()))
            .collect();
        assert_eq!(
            msgs,
            vec![
                ("p.toml:7:2", "is granted scopes w but no step can reach it: none of its steps (traige) is in the declared `steps`"),
                ("p.toml:5:2", "is declared but no tool uses it"),
            ]
        );
    }
}
