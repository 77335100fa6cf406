//! `credbroker policy test FILE --cases CASES.toml`: a table of requests with
//! the decision (and reason) each must get. Meant for the CI of a policy
//! repository: a change that opens or closes access a case pins down fails
//! the build. The format is documented in `policy/README.md`.
//!
//! ```toml
//! [[case]]
//! name = "a reply is sent only after the person confirmed"
//! step = "draft_reply"
//! tool = "mail.send"
//! resource = "https://mail.internal.example/"
//! expect = "deny"
//! reason = "step_not_allowed"
//! ```

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::explain::shown;
use super::{parse_policy_ttl, Outcome, Policy, DENY_REASONS};
use crate::base::grammar::parse_scope;
use crate::infra::diagnostics::{offset_at, parse_toml, Problem};

/// One test case, validated.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    /// Its name (or `case N`).
    pub name: String,
    /// Where it starts in the cases file (`file:line:column`).
    pub at: String,
    /// Step.
    pub step: String,
    /// Tool.
    pub tool: String,
    /// Resource, raw.
    pub resource: String,
    /// Requested scope, if any.
    pub scope: Option<String>,
    /// `allow` or `deny`.
    pub expect: Expect,
}

/// The expected result of a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Allowed; optionally with exactly these scopes and this lifetime cap.
    Allow {
        /// Granted scopes (sorted), when the case pins them.
        scopes: Option<Vec<String>>,
        /// Lifetime cap in seconds, when the case pins it.
        ttl: Option<u64>,
    },
    /// Denied for this reason.
    Deny(String),
}

impl Expect {
    fn text(&self) -> String {
        match self {
            Expect::Deny(r) => format!("deny {r}"),
            Expect::Allow { scopes, ttl } => {
                let mut s = "allow".to_string();
                if let Some(sc) = scopes {
                    let _ = write!(s, " [{}]", sc.join(" "));
                }
                if let Some(t) = ttl {
                    let _ = write!(s, " {t}s");
                }
                s
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawCases {
    #[serde(default)]
    case: Vec<Spanned<RawCase>>,
}

#[derive(Debug, Deserialize)]
struct RawCase {
    #[serde(default)]
    name: Option<String>,
    step: String,
    tool: String,
    resource: String,
    #[serde(default)]
    scope: Option<String>,
    expect: Spanned<String>,
    #[serde(default)]
    reason: Option<Spanned<String>>,
    #[serde(default)]
    scopes: Option<Spanned<String>>,
    #[serde(default)]
    ttl: Option<Spanned<String>>,
}

/// Reads and validates a cases file; every problem with its position.
pub(crate) fn load(path: &Path) -> Result<Vec<Case>, Vec<Problem>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![Problem {
            at: path.display().to_string(),
            key: None,
            message: format!("cannot read the cases file: {e}"),
        }]
    })?;
    parse(path, &text)
}

/// Validates cases text; `path` names the file in messages.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Vec<Case>, Vec<Problem>> {
    let raw: RawCases = parse_toml(path, text)?;
    let at = |span: std::ops::Range<usize>| offset_at(path, text, span.start);
    let mut problems = Vec::new();
    let mut bad = |span: std::ops::Range<usize>, key: &str, message: &str| {
        problems.push(Problem {
            at: at(span),
            key: Some(key.to_string()),
            message: message.to_string(),
        })
    };
    if raw.case.is_empty() {
        bad(
            0..0,
            "case",
            "no [[case]] in the file: a test that checks nothing would always pass",
        );
    }
    let mut cases = Vec::new();
    for (i, c) in raw.case.iter().enumerate() {
        let span = c.span();
        let c = c.get_ref();
        let key = format!("case[{}]", i + 1);
        let expect = match c.expect.get_ref().as_str() {
            "allow" => {
                if let Some(r) = &c.reason {
                    bad(
                        r.span(),
                        &format!("{key}.reason"),
                        "a reason goes with expect = \"deny\" only",
                    );
                }
                let scopes = c
                    .scopes
                    .as_ref()
                    .and_then(|s| match parse_scope(s.get_ref()) {
                        Ok(mut v) => {
                            v.sort();
                            v.dedup();
                            Some(v)
                        }
                        Err(_) if s.get_ref().is_empty() => Some(Vec::new()),
                        Err(_) => {
                            bad(
                                s.span(),
                                &format!("{key}.scopes"),
                                "must be space-separated scope tokens",
                            );
                            None
                        }
                    });
                let ttl = c
                    .ttl
                    .as_ref()
                    .and_then(|t| match parse_policy_ttl(t.get_ref()) {
                        Ok(d) => Some(d.as_secs()),
                        Err(m) => {
                            bad(t.span(), &format!("{key}.ttl"), m);
                            None
                        }
                    });
                Expect::Allow { scopes, ttl }
            }
            "deny" => {
                for (k, v) in [("scopes", &c.scopes), ("ttl", &c.ttl)] {
                    if let Some(v) = v {
                        bad(
                            v.span(),
                            &format!("{key}.{k}"),
                            "goes with expect = \"allow\" only",
                        );
                    }
                }
                match &c.reason {
                    None => {
                        bad(c.expect.span(), &format!("{key}.reason"), "a denial must name its reason (a deny for another reason often hides a mistake)");
                        Expect::Deny(String::new())
                    }
                    Some(r) if !DENY_REASONS.contains(&r.get_ref().as_str()) => {
                        bad(
                            r.span(),
                            &format!("{key}.reason"),
                            &format!("must be one of {}", DENY_REASONS.join(", ")),
                        );
                        Expect::Deny(String::new())
                    }
                    Some(r) => Expect::Deny(r.get_ref().clone()),
                }
            }
            _ => {
                bad(
                    c.expect.span(),
                    &format!("{key}.expect"),
                    "must be \"allow\" or \"deny\"",
                );
                continue;
            }
        };
        cases.push(Case {
            name: c.name.clone().unwrap_or_else(|| format!("case {}", i + 1)),
            at: at(span),
            step: c.step.clone(),
            tool: c.tool.clone(),
            resource: c.resource.clone(),
            scope: c.scope.clone(),
            expect,
        });
    }
    if problems.is_empty() {
        Ok(cases)
    } else {
        Err(problems)
    }
}

/// The result of one case.
#[derive(Debug, Clone)]
pub(crate) struct CaseResult {
    /// Whether the policy answered as expected.
    pub pass: bool,
    /// What the policy answered, in the same words as the expectation.
    pub got: String,
}

fn got_text(o: &Outcome, expect: &Expect) -> String {
    match o {
        Outcome::Allow(g) => {
            let mut s = "allow".to_string();
            if let Expect::Allow { scopes, ttl } = expect {
                if scopes.is_some() {
                    let _ = write!(s, " [{}]", g.scopes.join(" "));
                }
                if ttl.is_some() {
                    let _ = write!(s, " {}s", g.ttl.as_secs());
                }
            } else {
                let _ = write!(s, " [{}] {}s", g.scopes.join(" "), g.ttl.as_secs());
            }
            s
        }
        other => format!("deny {}", other.reason()),
    }
}

/// Runs one case against a policy.
pub(crate) fn run(policy: &Policy, case: &Case) -> CaseResult {
    let o = policy.evaluate(
        &case.step,
        &case.tool,
        &case.resource,
        case.scope.as_deref(),
    );
    let pass = match (&o, &case.expect) {
        (Outcome::Allow(g), Expect::Allow { scopes, ttl }) => {
            scopes.as_ref().is_none_or(|s| *s == g.scopes)
                && ttl.is_none_or(|t| t == g.ttl.as_secs())
        }
        (_, Expect::Deny(reason)) => o.decision() == "deny" && o.reason() == reason,
        _ => false,
    };
    CaseResult {
        pass,
        got: got_text(&o, &case.expect),
    }
}

/// Runs every case and renders the results table; returns it and the number
/// of failures.
pub(crate) fn report(policy: &Policy, cases: &[Case]) -> (String, usize) {
    let header = [
        "#", "result", "name", "step", "tool", "resource", "scope", "expected", "got",
    ];
    let mut rows: Vec<[String; 9]> = Vec::new();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let r = run(policy, c);
        if !r.pass {
            failures.push((i + 1, c));
        }
        rows.push([
            (i + 1).to_string(),
            if r.pass { "ok" } else { "FAIL" }.into(),
            c.name.clone(),
            shown(&c.step),
            shown(&c.tool),
            shown(&c.resource),
            c.scope.as_deref().map_or("-".into(), shown),
            c.expect.text(),
            r.got,
        ]);
    }
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths.iter()).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            let _ = write!(l, "{cell:<w$}");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header.map(String::from), &mut out);
    for row in &rows {
        line(row, &mut out);
    }
    for (n, c) in &failures {
        let _ = writeln!(out, "FAIL #{n} {:?} at {}", c.name, c.at);
    }
    let _ = writeln!(
        out,
        "{} cases: {} as expected, {} not",
        cases.len(),
        cases.len() - failures.len(),
        failures.len()
    );
    (out, failures.len())
}
