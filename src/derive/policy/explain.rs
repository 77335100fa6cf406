//! `credbroker policy explain`: which rule decided a request and why, in
//! words a reviewer understands, with the near misses that usually explain a
//! surprising denial ("tool mail.send exists but is allowed only in step
//! send_reply").
//!
//! The decision itself always comes from [`Policy::evaluate`]; this module
//! only describes it, so an explanation can never disagree with the broker.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use super::{
    canonical_resource, Approval, DenyReason, FieldKind, Outcome, Policy, Source, Tool, MAX_TTL,
};
use crate::base::grammar::parse_scope;
use crate::infra::diagnostics::{table_at, top_key_at};

/// A request to explain, with its fields as the orchestrator would send them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'a> {
    /// Step.
    pub step: &'a str,
    /// Tool.
    pub tool: &'a str,
    /// Resource, raw.
    pub resource: &'a str,
    /// Requested scope (space-separated), if any.
    pub scope: Option<&'a str>,
}

/// The explanation of one decision.
#[derive(Debug, Clone)]
pub(crate) struct Explanation {
    /// The decision, from [`Policy::evaluate`].
    pub outcome: Outcome,
    /// The rule(s) that decided, with their places in the file.
    pub rule: Option<String>,
    /// Why, in a sentence or two.
    pub why: String,
    /// What would be issued, for an allow.
    pub grant: Option<String>,
    /// Near misses: close names, the steps a tool has, the tools of a step.
    pub near_misses: Vec<String>,
    /// When the tool needs its person's approval, how (docs/APPROVALS.md).
    pub approval: Option<String>,
    /// The tool's declared `authorization_details`: whether required, then
    /// one line per type with its fields in the policy's order.
    pub details: Vec<String>,
}

impl Explanation {
    /// The text printed by `policy explain`.
    pub(crate) fn render(&self, q: &Query<'_>) -> String {
        let mut s = String::new();
        match &self.outcome {
            Outcome::Allow(_) => s.push_str("decision: allow\n"),
            o => {
                let _ = writeln!(s, "decision: deny ({})", o.reason());
            }
        }
        let scope = match q.scope {
            Some(sc) => format!("scope {}", shown(sc)),
            None => "no scope (asks for the tool's full set)".into(),
        };
        let _ = writeln!(
            s,
            "request:  step {}, tool {}, resource {}, {scope}",
            shown(q.step),
            shown(q.tool),
            shown(q.resource)
        );
        if let Some(rule) = &self.rule {
            let _ = writeln!(s, "rule:     {rule}");
        }
        let _ = writeln!(s, "why:      {}", self.why);
        if let Some(g) = &self.grant {
            let _ = writeln!(s, "grant:    {g}");
        }
        if let Some(a) = &self.approval {
            let _ = writeln!(s, "approval: {a}");
        }
        if let Some((first, types)) = self.details.split_first() {
            let _ = writeln!(s, "details:  {first}");
            for t in types {
                let _ = writeln!(s, "  - {t}");
            }
        }
        if !self.near_misses.is_empty() {
            s.push_str("near misses:\n");
            for n in &self.near_misses {
                let _ = writeln!(s, "  - {n}");
            }
        }
        s
    }
}

/// A name as shown to a reviewer: bare when it is plain printable ASCII,
/// otherwise quoted with escapes, so that a trailing space, a NUL or a
/// look-alike letter is visible.
pub(crate) fn shown(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

fn list<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    items
        .into_iter()
        .map(|s| shown(s))
        .collect::<Vec<_>>()
        .join(", ")
}

fn steps_phrase(steps: &BTreeSet<String>) -> String {
    match steps.len() {
        0 => "in no step".into(),
        1 => format!("only in step {}", list(steps)),
        _ => format!("only in steps {}", list(steps)),
    }
}

/// Describes a token source for a reviewer. Every source must be matched.
pub(crate) fn describe_source(source: &Source) -> String {
    match source {
        Source::SelfIssued => {
            "self (minted by credbroker: ES256, DPoP-bound to the tool's key)".into()
        }
        Source::Service {
            service,
            delivery: crate::derive::policy::Delivery::ProviderToken,
        } => format!(
            "service {service} (the person's connected account; delivery = provider_token: the provider's bearer token is handed to the tool, not narrowed to this resource nor bound to the tool's key)"
        ),
        Source::Service {
            service,
            delivery: crate::derive::policy::Delivery::Proxy,
        } => format!(
            "service {service} (the person's connected account; delivery = proxy: the provider's token stays in the broker; the tool gets a DPoP-bound credbroker token and calls the service through the egress proxy, on its routes only)"
        ),
        Source::Exchange { upstream } => format!(
            "exchange at upstream {upstream} (RFC 8693 token exchange at the organisation's authorization server: its token, checked to be DPoP-bound to the tool's key, for this resource and these scopes, at most 300 s)"
        ),
    }
}

fn secs(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs())
}

/// Where the policy came from, to name the line of a rule.
struct Src<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Src<'_> {
    fn tool_at(&self, name: &str) -> String {
        format!(
            "[tools.{}] at {}",
            quoted(name),
            table_at(self.path, self.text, "tools", name)
        )
    }

    fn res_at(&self, id: &str) -> String {
        format!(
            "[resources.{}] at {}",
            quoted(id),
            table_at(self.path, self.text, "resources", id)
        )
    }

    fn top_key_at(&self, key: &str) -> String {
        top_key_at(self.path, self.text, key)
    }
}

/// Explains how `policy` (loaded from `text` at `path`) decides `q`: the
/// rule, why, and near misses, per outcome.
pub(crate) fn explain(path: &Path, text: &str, policy: &Policy, q: &Query<'_>) -> Explanation {
    let outcome = policy.evaluate(q.step, q.tool, q.resource, q.scope);
    let src = Src { path, text };
    let mut e = Explanation {
        outcome: outcome.clone(),
        rule: None,
        why: String::new(),
        grant: None,
        near_misses: Vec::new(),
        approval: None,
        details: Vec::new(),
    };
    let tool = policy.tools.get(q.tool);
    if let Some(t) = tool {
        e.approval = t.approval.map(describe_approval);
        e.details = describe_details(t);
    }
    match (&outcome, tool) {
        (Outcome::Deny(DenyReason::Frozen), _) => {
            e.rule = Some(format!("frozen = true at {}", src.top_key_at("frozen")));
            e.why = "the policy file is frozen: every derive is denied until `frozen` is removed"
                .into();
        }
        (Outcome::InvalidScope, _) => {
            e.why = "the requested scope is not a space-separated list of scope tokens (RFC 6749 section 3.3); the broker answers invalid_request before the policy is asked".into();
        }
        (Outcome::InvalidTarget(err), _) => {
            e.why = format!(
                "the resource {err}; the broker answers invalid_target before the policy is asked (resources are compared only in canonical form, and path tricks are refused outright)"
            );
        }
        (Outcome::Deny(DenyReason::ToolNotAllowed), _) => tool_not_allowed(policy, q, &mut e),
        // The tool exists for the other outcomes: the loader and decide()
        // guarantee it.
        (Outcome::Deny(DenyReason::StepNotAllowed), Some(t)) => {
            step_not_allowed(&src, policy, q, t, &mut e)
        }
        (Outcome::Deny(DenyReason::ResourceMismatch), Some(t)) => {
            resource_mismatch(&src, policy, q, t, &mut e)
        }
        (Outcome::Deny(DenyReason::ScopeNotAllowed), Some(t)) => {
            scope_not_allowed(&src, policy, q, t, &mut e)
        }
        (Outcome::Allow(g), Some(t)) => allowed(&src, q, t, g, &mut e),
        (_, None) => {}
    }
    e
}

/// No such tool: similar names, and the tools of the step.
fn tool_not_allowed(policy: &Policy, q: &Query<'_>, e: &mut Explanation) {
    e.why = format!(
        "no tool named {} in the policy; tool names are matched byte for byte, there are no wildcards, and what is not written is denied",
        shown(q.tool)
    );
    for name in policy.tools.keys() {
        if let Some(how) = similar(q.tool, name) {
            e.near_misses
                .push(format!("tool {} exists ({how})", shown(name)));
        }
    }
    non_ascii_note(q.tool, "tool", &mut e.near_misses);
    tools_in_step(policy, q, None, &mut e.near_misses);
}

/// The tool is not allowed in the step (or the step is not declared).
fn step_not_allowed(src: &Src<'_>, policy: &Policy, q: &Query<'_>, t: &Tool, e: &mut Explanation) {
    e.rule = Some(src.tool_at(&t.name));
    if t.steps.contains(q.step) {
        // Listed by the tool but not declared in `steps`.
        e.rule = Some(format!(
            "{}, steps = [...] at {}",
            src.tool_at(&t.name),
            src.top_key_at("steps")
        ));
        e.why = format!(
            "tool {} lists step {}, but the policy's declared `steps` does not, so no request can use it there",
            shown(&t.name),
            shown(q.step)
        );
    } else {
        e.why = format!(
            "tool {} exists but is allowed {}, not in step {}",
            shown(&t.name),
            steps_phrase(&t.steps),
            shown(q.step)
        );
    }
    for s in &t.steps {
        if let Some(how) = similar(q.step, s) {
            e.near_misses.push(format!(
                "step {} is allowed for this tool ({how})",
                shown(s)
            ));
        }
    }
    non_ascii_note(q.step, "step", &mut e.near_misses);
    tools_in_step(policy, q, Some(&t.name), &mut e.near_misses);
}

/// The tool is for another resource: the tools of the step for this one.
fn resource_mismatch(src: &Src<'_>, policy: &Policy, q: &Query<'_>, t: &Tool, e: &mut Explanation) {
    e.rule = Some(src.tool_at(&t.name));
    let asked = canonical_resource(q.resource).unwrap_or_default();
    e.why = format!(
        "tool {} is for resource {}, not {}; one tool, one resource, compared in canonical form",
        shown(&t.name),
        t.resource,
        asked
    );
    let others: Vec<&String> = policy
        .tools
        .values()
        .filter(|o| o.resource == asked && policy.reachable_steps(o).contains(q.step))
        .map(|o| &o.name)
        .collect();
    if !others.is_empty() {
        e.near_misses.push(format!(
            "in step {} the tools for {} are: {}",
            shown(q.step),
            asked,
            list(others)
        ));
    }
}

/// More scope than the tool has: denied whole; where the extra scopes are.
fn scope_not_allowed(src: &Src<'_>, policy: &Policy, q: &Query<'_>, t: &Tool, e: &mut Explanation) {
    e.rule = Some(src.tool_at(&t.name));
    let asked = q
        .scope
        .and_then(|s| parse_scope(s).ok())
        .unwrap_or_default();
    let extra: Vec<&String> = asked.iter().filter(|s| !t.scopes.contains(*s)).collect();
    let has = if t.scopes.is_empty() {
        "no scope".to_string()
    } else {
        format!("scopes {}", list(&t.scopes))
    };
    e.why = format!(
        "tool {} has {has}; the request also asks for {}, so it is denied whole (never narrowed)",
        shown(&t.name),
        list(extra.iter().copied())
    );
    for x in extra {
        for s in &t.scopes {
            if let Some(how) = similar(x, s) {
                e.near_misses
                    .push(format!("scope {} is granted ({how})", shown(s)));
            }
        }
        for o in policy.tools.values() {
            if o.name != t.name && o.scopes.contains(x) && o.resource == t.resource {
                e.near_misses.push(format!(
                    "scope {} belongs to tool {}, allowed {}",
                    shown(x),
                    shown(&o.name),
                    steps_phrase(&policy.reachable_steps(o))
                ));
            }
        }
    }
}

/// Allowed: the rule, and what the grant holds with its lifetime caps.
fn allowed(src: &Src<'_>, q: &Query<'_>, t: &Tool, g: &super::Grant, e: &mut Explanation) {
    e.rule = Some(format!(
        "{}, {}",
        src.tool_at(&t.name),
        src.res_at(&g.resource.id)
    ));
    e.why = format!(
        "tool {} is allowed in step {} and its resource is {}{}",
        shown(&t.name),
        shown(q.step),
        g.resource.id,
        match q.scope {
            None => "; no scope was asked for, so the tool's full set is granted".to_string(),
            Some(_) => "; every scope asked for is among the tool's".to_string(),
        }
    );
    let mut caps = Vec::new();
    if let Some(tt) = t.ttl {
        caps.push(format!("tool ttl {}", secs(tt)));
    }
    caps.push(format!("resource ttl {}", secs(g.resource.ttl)));
    caps.push(format!("broker cap {}", secs(MAX_TTL)));
    e.grant = Some(format!(
        "scopes {}; audience {}; source {}; lifetime at most {} ({}), and never past the subject token's expiry",
        if g.scopes.is_empty() { "(none)".into() } else { g.scopes.join(" ") },
        g.resource.id,
        describe_source(&g.resource.source),
        secs(g.ttl),
        caps.join(", ")
    ));
}

/// What an approval mode means for the tool's derives.
fn describe_approval(a: Approval) -> String {
    match a {
        Approval::EachCall => "each_call: every derive waits for the person to approve that exact call (tool, resource, scopes, details, DPoP key) on the approval page; the token lives at most 60s and is single-use".into(),
        Approval::PerStep { ttl, .. } => format!(
            "per_step, approval_ttl {}: one approval by the person covers the same call (tool, resource, scopes, details, DPoP key) in steps of the same name for {} from the grant; tokens never outlive it",
            secs(ttl),
            secs(ttl)
        ),
    }
}

/// The tool's declared `authorization_details`, for a reviewer: empty when
/// it declares none (a request with details is then refused).
fn describe_details(t: &Tool) -> Vec<String> {
    if t.details.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!(
        "authorization_details (RFC 9396) {}; a field not declared here is refused (invalid_authorization_details)",
        if t.require_details {
            "required on every derive"
        } else {
            "optional"
        }
    )];
    for (ty, d) in &t.details {
        let fields: Vec<String> = d
            .ordered()
            .map(|(name, f)| {
                let kind = match f.kind {
                    FieldKind::String => "string",
                    FieldKind::Strings => "list of strings",
                    FieldKind::Integer => "integer",
                };
                let mut attrs = vec![kind.to_string()];
                if f.required {
                    attrs.push("required".into());
                }
                attrs.push(format!("label {:?}", f.label));
                if f.log_in_clear {
                    attrs.push("logged in clear".into());
                }
                format!("{} ({})", shown(name), attrs.join(", "))
            })
            .collect();
        out.push(format!("type {}: {}", shown(ty), fields.join("; ")));
    }
    out
}

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// Lists what the step does allow on the requested resource.
fn tools_in_step(policy: &Policy, q: &Query<'_>, except: Option<&str>, out: &mut Vec<String>) {
    let asked = canonical_resource(q.resource).ok();
    let here: Vec<&String> = policy
        .tools
        .values()
        .filter(|t| Some(t.name.as_str()) != except)
        .filter(|t| asked.as_deref() == Some(t.resource.as_str()))
        .filter(|t| policy.reachable_steps(t).contains(q.step))
        .map(|t| &t.name)
        .collect();
    if !here.is_empty() {
        out.push(format!(
            "in step {} the tools allowed on this resource are: {}",
            shown(q.step),
            list(here)
        ));
    }
}

fn non_ascii_note(name: &str, what: &str, out: &mut Vec<String>) {
    if let Some((i, c)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_graphic())
    {
        out.push(format!(
            "the requested {what} name has {} at character {} (U+{:04X}); a look-alike or invisible character never matches",
            if c.is_whitespace() { "whitespace" } else if c.is_control() { "a control character" } else { "a non-ASCII character" },
            i + 1,
            c as u32
        ));
    }
}

/// Whether `asked` is a near miss of `name`, and how.
fn similar(asked: &str, name: &str) -> Option<&'static str> {
    if asked == name {
        return None;
    }
    if asked.to_lowercase() == name.to_lowercase() {
        return Some("differs only in letter case");
    }
    if asked.trim() == name {
        return Some("differs only in surrounding whitespace");
    }
    let visible: String = asked.chars().filter(|c| c.is_ascii_graphic()).collect();
    if visible == name {
        return Some("differs only in invisible or non-ASCII characters");
    }
    if name.chars().count() >= 4 && distance(asked, name) <= 1 {
        return Some("a similar name");
    }
    None
}

/// Edit distance over characters, counting a swap of two neighbours as one
/// edit (optimal string alignment): typos are mostly one of those.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPROVALS: &str = r#"agent = "a"

[resources."https://mail.example/api"]
source = "self"

[tools."mail.send"]
resource = "https://mail.example/api"
scopes = ["mail.send"]
steps = ["send_reply"]
approval = "each_call"
require_authorization_details = true

[tools."mail.send".authorization_details.mail]
to = { kind = "strings", required = true, label = "Recipients" }
subject = { kind = "string", required = true, label = "Subject", log_in_clear = true }
size = { kind = "integer", label = "Size" }

[tools."deploy.run"]
resource = "https://mail.example/api"
scopes = ["deploy"]
steps = ["release"]
approval = "per_step"
approval_ttl = "10m"

[tools."deploy.run".authorization_details.deploy]
env = { kind = "string", required = true, label = "Environment" }

[tools."mail.read"]
resource = "https://mail.example/api"
scopes = ["mail.read"]
steps = ["send_reply"]
"#;

    fn explained(step: &str, tool: &str) -> String {
        let p = Policy::parse(Path::new("p.toml"), APPROVALS.as_bytes()).unwrap();
        let q = Query {
            step,
            tool,
            resource: "https://mail.example/api",
            scope: None,
        };
        explain(Path::new("p.toml"), APPROVALS, &p, &q).render(&q)
    }

    #[test]
    fn explain_says_when_a_tool_needs_approval_and_what_it_declares() {
        let out = explained("send_reply", "mail.send");
        assert!(out.contains("decision: allow"), "{out}");
        assert!(
            out.contains("approval: each_call: every derive waits"),
            "{out}"
        );
        assert!(
            out.contains("details:  authorization_details (RFC 9396) required on every derive"),
            "{out}"
        );
        assert!(
            out.contains("  - type mail: to ("),
            "in the file's order: {out}"
        );
        let at = |f: &str| out.find(f).unwrap();
        assert!(
            at("to (") < at("subject (") && at("subject (") < at("size ("),
            "{out}"
        );
        for field in [
            "to (list of strings, required, label \"Recipients\")",
            "subject (string, required, label \"Subject\", logged in clear)",
            "size (integer, label \"Size\")",
        ] {
            assert!(out.contains(field), "{field}: {out}");
        }
        let out = explained("release", "deploy.run");
        assert!(
            out.contains("approval: per_step, approval_ttl 600s: one approval"),
            "{out}"
        );
        assert!(
            out.contains("details:  authorization_details (RFC 9396) optional"),
            "{out}"
        );
        assert!(
            out.contains("  - type deploy: env (string, required, label \"Environment\")"),
            "{out}"
        );
        // Said also when the request is denied for another reason.
        assert!(explained("release", "mail.send").contains("approval: each_call"));
        // Positive control: a tool without approval or details says neither.
        let out = explained("send_reply", "mail.read");
        assert!(out.contains("decision: allow"), "{out}");
        assert!(
            !out.contains("approval:") && !out.contains("details:"),
            "{out}"
        );
    }

    #[test]
    fn near_miss_kinds() {
        assert_eq!(
            similar("Mail.Send", "mail.send"),
            Some("differs only in letter case")
        );
        assert_eq!(
            similar("mail.send ", "mail.send"),
            Some("differs only in surrounding whitespace")
        );
        assert_eq!(
            similar("mail.s\u{0435}nd", "mail.send"),
            Some("a similar name")
        );
        assert_eq!(
            similar("mail.send\0", "mail.send"),
            Some("differs only in invisible or non-ASCII characters")
        );
        assert_eq!(similar("repo.write", "mail.send"), None);
        assert_eq!(similar("mail.read", "mail.send"), None);
        assert_eq!(similar("mial.send", "mail.send"), Some("a similar name"));
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("ab", "ba"), 1);
    }

    #[test]
    fn a_step_the_tool_lists_but_the_policy_does_not_declare() {
        let text = "agent = \"a\"\nsteps = [\"triage\"]\n[resources.\"https://api.example/\"]\nsource = \"self\"\n[tools.t]\nresource = \"https://api.example/\"\nsteps = [\"triage\", \"traige\"]\n";
        let p = Policy::parse(Path::new("p.toml"), text.as_bytes()).unwrap();
        let q = Query {
            step: "traige",
            tool: "t",
            resource: "https://api.example/",
            scope: None,
        };
        let e = explain(Path::new("p.toml"), text, &p, &q);
        assert_eq!(e.outcome, Outcome::Deny(DenyReason::StepNotAllowed));
        assert_eq!(
            e.rule.as_deref(),
            Some("[tools.\"t\"] at p.toml:5:2, steps = [...] at p.toml:2:1")
        );
        assert_eq!(
            e.why,
            "tool t lists step traige, but the policy's declared `steps` does not, so no request can use it there"
        );
        // Positive control: the declared step is allowed.
        let q = Query {
            step: "triage",
            ..q
        };
        assert!(matches!(
            explain(Path::new("p.toml"), text, &p, &q).outcome,
            Outcome::Allow(_)
        ));
    }

    #[test]
    fn shown_makes_invisible_characters_visible() {
        assert_eq!(shown("mail.send"), "mail.send");
        assert_eq!(shown("mail.send "), "\"mail.send \"");
        assert_eq!(shown("a\0"), "\"a\\0\"");
    }
}
