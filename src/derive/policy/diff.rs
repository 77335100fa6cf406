//! `credbroker policy diff OLD NEW`: access gained and lost between two
//! versions of a policy, as Markdown fit for a review comment.
//!
//! Access is compared as the broker grants it, not as the files are
//! written: a tool's steps are those it can really be used in (see
//! [`Policy::reachable_steps`]: a declared `steps` list and `frozen` count),
//! its lifetime is the effective cap ([`Policy::tool_ttl`]). So reordering or
//! reformatting a file shows no change, and a change of `frozen` or of the
//! declared steps shows up as the access it opens or closes.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use super::explain::{describe_source, shown};
use super::{Policy, Tool};

/// What changed between two policies, each item one sentence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Access that the new version grants and the old did not.
    pub gained: Vec<String>,
    /// Access that the old version granted and the new does not.
    pub lost: Vec<String>,
    /// Resources added, removed, or whose source or lifetime changed.
    pub resources: Vec<String>,
    /// Everything else a reviewer should see (agent, freeze, declared steps).
    pub other: Vec<String>,
}

impl Report {
    /// Whether the two versions grant exactly the same access.
    pub(crate) fn access_unchanged(&self) -> bool {
        self.gained.is_empty() && self.lost.is_empty()
    }
}

fn list<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    items
        .into_iter()
        .map(|s| format!("`{}`", shown(s)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

fn scopes_phrase(scopes: &BTreeSet<String>) -> String {
    if scopes.is_empty() {
        "no scope".into()
    } else {
        format!("scopes {}", list(scopes))
    }
}

fn steps_word(n: usize) -> &'static str {
    if n == 1 {
        "step"
    } else {
        "steps"
    }
}

fn whole(p: &Policy, t: &Tool, steps: &BTreeSet<String>) -> String {
    format!(
        "in {} {} on `{}` with {}, tokens up to {}",
        steps_word(steps.len()),
        list(steps),
        t.resource,
        scopes_phrase(&t.scopes),
        secs(p.tool_ttl(t))
    )
}

/// Compares two policies.
pub(crate) fn diff(old: &Policy, new: &Policy) -> Report {
    let mut r = Report::default();
    file_changes(old, new, &mut r);
    let names: BTreeSet<&String> = old.tools.keys().chain(new.tools.keys()).collect();
    for name in names {
        let o = old.tools.get(name).map(|t| (t, old.reachable_steps(t)));
        let n = new.tools.get(name).map(|t| (t, new.reachable_steps(t)));
        // A tool that no step can reach grants nothing: treat it as absent.
        let o = o.filter(|(_, s)| !s.is_empty());
        let n = n.filter(|(_, s)| !s.is_empty());
        let tool = format!("tool `{}`", shown(name));
        match (o, n) {
            (None, None) => {}
            (None, Some((t, steps))) => r
                .gained
                .push(format!("{tool} can now be used {}", whole(new, t, &steps))),
            (Some((t, steps)), None) => r.lost.push(format!(
                "{tool} can no longer be used (was: {})",
                whole(old, t, &steps)
            )),
            (Some((ot, os)), Some((nt, ns))) => {
                tool_changes(&tool, (old, ot, &os), (new, nt, &ns), &mut r)
            }
        }
    }
    resource_changes(old, new, &mut r);
    r
}

/// What changed for the whole file: the agent, the freeze, the declared
/// steps.
fn file_changes(old: &Policy, new: &Policy, r: &mut Report) {
    if old.agent != new.agent {
        r.other.push(format!(
            "agent changed from `{}` to `{}`: a broker serving `{}` refuses to load the new file",
            shown(&old.agent),
            shown(&new.agent),
            shown(&old.agent)
        ));
    }
    match (old.frozen, new.frozen) {
        (false, true) => r.other.push(
            "`frozen = true` added: every derive is denied while this version is loaded".into(),
        ),
        (true, false) => r
            .other
            .push("`frozen = true` removed: derives are decided by the tools again".into()),
        _ => {}
    }
    match (&old.declared_steps, &new.declared_steps) {
        (None, Some(n)) => r.other.push(format!(
            "declared `steps` added: {} (requests in any other step are now denied)",
            list(n)
        )),
        (Some(_), None) => r
            .other
            .push("declared `steps` removed: every step a tool lists can now be used".into()),
        (Some(o), Some(n)) if o != n => {
            let added: Vec<&String> = n.difference(o).collect();
            let removed: Vec<&String> = o.difference(n).collect();
            let mut parts = Vec::new();
            if !added.is_empty() {
                parts.push(format!("added {}", list(added)));
            }
            if !removed.is_empty() {
                parts.push(format!("removed {}", list(removed)));
            }
            r.other
                .push(format!("declared `steps`: {}", parts.join("; ")));
        }
        _ => {}
    }
}

/// A tool in both versions, each with the steps that reach it: what it
/// gained and lost.
fn tool_changes(
    tool: &str,
    (old, ot, os): (&Policy, &Tool, &BTreeSet<String>),
    (new, nt, ns): (&Policy, &Tool, &BTreeSet<String>),
    r: &mut Report,
) {
    if ot.resource != nt.resource {
        r.gained.push(format!(
            "{tool} now reaches `{}` (was `{}`)",
            nt.resource, ot.resource
        ));
        r.lost
            .push(format!("{tool} no longer reaches `{}`", ot.resource));
    }
    let added: Vec<&String> = ns.difference(os).collect();
    if !added.is_empty() {
        r.gained.push(format!(
            "{tool} can now be used in {} {} (before: {})",
            steps_word(added.len()),
            list(added),
            list(os)
        ));
    }
    let removed: Vec<&String> = os.difference(ns).collect();
    if !removed.is_empty() {
        r.lost.push(format!(
            "{tool} can no longer be used in {} {} (now: {})",
            steps_word(removed.len()),
            list(removed),
            list(ns)
        ));
    }
    let wider: Vec<&String> = nt.scopes.difference(&ot.scopes).collect();
    if !wider.is_empty() {
        r.gained
            .push(format!("{tool} scopes widened: + {}", list(wider)));
    }
    let narrower: Vec<&String> = ot.scopes.difference(&nt.scopes).collect();
    if !narrower.is_empty() {
        r.lost
            .push(format!("{tool} scopes narrowed: - {}", list(narrower)));
    }
    // Routes (proxy tools), see [`routes`].
    let (or, nr) = (routes(ot), routes(nt));
    let added: Vec<&String> = nr.difference(&or).collect();
    if !added.is_empty() {
        r.gained
            .push(format!("{tool} routes added: + {}", list(added)));
    }
    let removed: Vec<&String> = or.difference(&nr).collect();
    if !removed.is_empty() {
        r.lost
            .push(format!("{tool} routes removed: - {}", list(removed)));
    }
    approval_changes(tool, ot, nt, r);
    let (ol, nl) = (old.tool_ttl(ot), new.tool_ttl(nt));
    if nl > ol {
        r.gained.push(format!(
            "{tool} tokens live longer: {} -> {}",
            secs(ol),
            secs(nl)
        ));
    } else if nl < ol {
        r.lost.push(format!(
            "{tool} tokens live shorter: {} -> {}",
            secs(ol),
            secs(nl)
        ));
    }
}

/// A proxy tool's routes, each with the steps it is limited to and its
/// variables bound to approved details, so that a dropped binding shows as
/// the unbound route gained.
fn routes(t: &Tool) -> BTreeSet<String> {
    t.routes
        .iter()
        .map(|r| {
            let mut d = match &r.steps {
                None => r.text.clone(),
                Some(s) => format!(
                    "{} (in step {})",
                    r.text,
                    s.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            };
            if !r.details.is_empty() {
                let b: Vec<String> = r
                    .details
                    .iter()
                    .map(|b| format!("{} = {}.{}", b.var, b.ty, b.field))
                    .collect();
                d.push_str(&format!(" (bound to details: {})", b.join(", ")));
            }
            d
        })
        .collect()
}

/// Resources added, removed, or with another source or lifetime.
fn resource_changes(old: &Policy, new: &Policy, r: &mut Report) {
    let ids: BTreeSet<&String> = old.resources.keys().chain(new.resources.keys()).collect();
    for id in ids {
        match (old.resources.get(id), new.resources.get(id)) {
            (None, None) => {}
            (None, Some(n)) => r.resources.push(format!(
                "resource `{}` added: source {}, ttl {}",
                n.id,
                describe_source(&n.source),
                secs(n.ttl)
            )),
            (Some(o), None) => r.resources.push(format!("resource `{}` removed", o.id)),
            (Some(o), Some(n)) => {
                if o.source != n.source {
                    r.resources.push(format!(
                        "resource `{}` source changed: {} -> {}",
                        n.id,
                        describe_source(&o.source),
                        describe_source(&n.source)
                    ));
                }
                if o.ttl != n.ttl {
                    r.resources.push(format!(
                        "resource `{}` ttl changed: {} -> {}",
                        n.id,
                        secs(o.ttl),
                        secs(n.ttl)
                    ));
                }
            }
        }
    }
}

fn approval_word(a: Option<super::Approval>) -> String {
    match a {
        None => "no approval".into(),
        Some(super::Approval::EachCall) => "`each_call` approval".into(),
        Some(super::Approval::PerStep { ttl, .. }) => {
            format!("`per_step` approval for {}", secs(ttl))
        }
    }
}

/// Step-up approvals (docs/APPROVALS.md): less approval, or more accepted
/// details, is access gained; the reverse, access lost.
fn approval_changes(tool: &str, ot: &Tool, nt: &Tool, r: &mut Report) {
    use super::Approval::{EachCall, PerStep};
    // How much one approval lets through: none < each_call < per_step by
    // its window < no approval at all.
    let reach = |a: Option<super::Approval>| match a {
        Some(EachCall) => 0,
        Some(PerStep { ttl, .. }) => 1 + ttl.as_secs(),
        None => u64::MAX,
    };
    let (o, n) = (reach(ot.approval), reach(nt.approval));
    let what = format!(
        "{tool} {} -> {}",
        approval_word(ot.approval),
        approval_word(nt.approval)
    );
    if n > o {
        r.gained.push(format!("{what} (each approval covers more)"));
    } else if n < o {
        r.lost.push(format!("{what} (each approval covers less)"));
    }
    for (ty, t) in &nt.details {
        for f in t.fields.keys() {
            if !ot.details.get(ty).is_some_and(|o| o.fields.contains_key(f)) {
                r.gained.push(format!(
                    "{tool} now accepts detail field `{}` of type `{}`",
                    shown(f),
                    shown(ty)
                ));
            }
        }
    }
    for (ty, t) in &ot.details {
        for f in t.fields.keys() {
            if !nt.details.get(ty).is_some_and(|n| n.fields.contains_key(f)) {
                r.lost.push(format!(
                    "{tool} no longer accepts detail field `{}` of type `{}`",
                    shown(f),
                    shown(ty)
                ));
            }
        }
    }
    match (ot.require_details, nt.require_details) {
        (true, false) => r
            .gained
            .push(format!("{tool} no longer requires authorization_details")),
        (false, true) => r
            .lost
            .push(format!("{tool} now requires authorization_details")),
        _ => {}
    }
}

/// The Markdown report printed by `policy diff`.
pub(crate) fn render(
    old_name: &str,
    new_name: &str,
    old: &Policy,
    new: &Policy,
    r: &Report,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### Policy diff: `{old_name}` -> `{new_name}`");
    let _ = writeln!(
        s,
        "\nsha256 {} -> {}",
        old.hash.get(..12).unwrap_or(&old.hash),
        new.hash.get(..12).unwrap_or(&new.hash)
    );
    let sections = [
        ("Access gained (review carefully)", &r.gained),
        ("Access lost", &r.lost),
        ("Resources changed", &r.resources),
        ("Other changes", &r.other),
    ];
    for (title, items) in sections {
        if items.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n**{title}** ({})\n", items.len());
        for i in items {
            let _ = writeln!(s, "- {i}");
        }
    }
    if r.access_unchanged() && r.resources.is_empty() && r.other.is_empty() {
        s.push_str("\nNo change in access.\n");
    } else if r.access_unchanged() {
        s.push_str("\nNo tool gains or loses access.\n");
    }
    s
}
