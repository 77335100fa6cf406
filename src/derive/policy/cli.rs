//! `credbroker policy check | test | explain | diff`: the commands a
//! security team runs on policy files, locally and in the CI of the
//! repository that holds them. `src/cli.rs` only delegates here.
//!
//! Reports go to standard output. Exit codes:
//! - `check`: 0 no error (warnings allowed), 1 errors, 2 warnings only and
//!   `--deny-warnings`;
//! - `test`: 0 every case as expected, 1 a case failed or a file is invalid;
//! - `explain`, `diff`: 0 done, 1 a file is invalid.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::explain::{explain, Query};
use super::lint::{lint, Warning};
use super::{Policy, PolicyError};
use crate::infra::diagnostics::Problem;

/// The `credbroker policy` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Check policy files: errors (file:line:column, with a hint) and
    /// warnings about risky constructs.
    Check {
        /// The policy files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Exit with 2 when there are warnings (and no errors).
        #[arg(long)]
        deny_warnings: bool,
        /// Also require the files to be written for this agent (the
        /// broker's `agent`): a broker refuses a policy for another agent.
        #[arg(long, conflicts_with = "config")]
        agent: Option<String>,
        /// Also check the files against this broker config, as the broker
        /// does at start-up and on reload: the config's `agent`, and a
        /// `[providers.NAME]` table for every service a resource names.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run a table of requests with expected decisions against a policy.
    Test {
        /// The policy file.
        file: PathBuf,
        /// The cases file (TOML, `[[case]]` tables).
        #[arg(long)]
        cases: PathBuf,
    },
    /// Explain which rule decides one request, and why.
    Explain {
        /// The policy file.
        #[arg(long)]
        policy: PathBuf,
        /// The request.
        #[command(flatten)]
        call: CallArgs,
    },
    /// Access gained and lost between two versions of a policy (Markdown).
    Diff {
        /// The old version.
        old: PathBuf,
        /// The new version.
        new: PathBuf,
    },
}

/// One tool call as the command line names it (shared by `policy explain`
/// and `credbroker derive`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CallArgs {
    /// Step.
    #[arg(long)]
    pub step: String,
    /// Tool.
    #[arg(long)]
    pub tool: String,
    /// Resource.
    #[arg(long)]
    pub resource: String,
    /// Requested scope (space-separated).
    #[arg(long)]
    pub scope: Option<String>,
}

/// Reads a broker config for `check --config` (given by the command line,
/// which owns the config loader: `policy` does not depend on `config`).
pub(crate) type ConfigReader<'a> = &'a dyn Fn(&Path) -> Result<Broker, String>;

/// Runs a `policy` subcommand; returns the exit code.
pub(crate) fn run(cmd: PolicyCommand, read_config: ConfigReader<'_>) -> ExitCode {
    let mut out = String::new();
    let code = match cmd {
        PolicyCommand::Check {
            files,
            deny_warnings,
            agent,
            config,
        } => match (agent, config) {
            (_, Some(config)) => match read_config(&config) {
                Ok(b) => check(&files, deny_warnings, Some(&b), &mut out),
                Err(e) => {
                    out.push_str(&format!("{e}\n"));
                    1
                }
            },
            (Some(agent), None) => {
                let b = Broker {
                    file: None,
                    agent,
                    services: None,
                    upstreams: None,
                };
                check(&files, deny_warnings, Some(&b), &mut out)
            }
            (None, None) => check(&files, deny_warnings, None, &mut out),
        },
        PolicyCommand::Test { file, cases } => test(&file, &cases, &mut out),
        PolicyCommand::Explain { policy, call } => match load(&policy, &mut out) {
            Some((p, text)) => {
                let q = Query {
                    step: &call.step,
                    tool: &call.tool,
                    resource: &call.resource,
                    scope: call.scope.as_deref(),
                };
                out.push_str(&explain(&policy, &text, &p, &q).render(&q));
                0
            }
            None => 1,
        },
        PolicyCommand::Diff { old, new } => {
            let o = load(&old, &mut out);
            let n = load(&new, &mut out);
            match (o, n) {
                (Some((o, _)), Some((n, _))) => {
                    let report = super::diff::diff(&o, &n);
                    out.push_str(&super::diff::render(
                        &old.display().to_string(),
                        &new.display().to_string(),
                        &o,
                        &n,
                        &report,
                    ));
                    0
                }
                _ => 1,
            }
        }
    };
    print!("{out}");
    ExitCode::from(code)
}

/// Loads a policy, writing its errors (with hints) to `out` on failure.
fn load(path: &Path, out: &mut String) -> Option<(Policy, String)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            out.push_str(&format!(
                "{}: error: cannot read the policy: {e}\n",
                path.display()
            ));
            return None;
        }
    };
    match Policy::parse(path, &bytes) {
        Ok(p) => Some((p, String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) => {
            write_policy_error(&e, out);
            None
        }
    }
}

fn write_policy_error(e: &PolicyError, out: &mut String) -> usize {
    match e {
        PolicyError::Read { path, source } => {
            out.push_str(&format!(
                "{}: error: cannot read the policy: {source}\n",
                path.display()
            ));
            1
        }
        PolicyError::Invalid(problems) => {
            for p in problems {
                write_problem(p, out);
            }
            problems.len()
        }
    }
}

/// `file:line:column: error: key: message`, then `  hint: ...`.
fn write_problem(p: &Problem, out: &mut String) {
    match &p.key {
        Some(k) => out.push_str(&format!("{}: error: {k}: {}\n", p.at, p.message)),
        None => out.push_str(&format!("{}: error: {}\n", p.at, p.message)),
    }
    out.push_str(&format!("  hint: {}\n", hint(p)));
}

fn write_warning(w: &Warning, out: &mut String) {
    out.push_str(&format!(
        "{}: warning: {}: {}\n  hint: {}\n",
        w.at, w.key, w.message, w.hint
    ));
}

const TOP_KEYS: &[&str] = &["agent", "frozen", "steps", "resources", "tools"];
const RESOURCE_KEYS: &[&str] = &["source", "ttl"];
const TOOL_KEYS: &[&str] = &["resource", "scopes", "steps", "ttl"];

/// A hint for a loader problem, chosen by the kind of key it is about, so
/// that new loader messages get a sensible hint without editing this table.
/// The hint for a TOML syntax error or a value of the wrong type.
const TOML_HINT: &str =
    "the file is not valid TOML here, or a value has the wrong type; check quotes, brackets and commas";

fn hint(p: &Problem) -> String {
    // serde's own messages get the same hint whether or not the key is
    // known (the loader names the key of a missing field or a bad value).
    if p.message.contains("missing field") {
        return "add the required key; see policy/README.md for the keys of each table".into();
    }
    let type_error = [
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
    ]
    .iter()
    .any(|m| p.message.starts_with(m));
    if type_error {
        return TOML_HINT.into();
    }
    let Some(key) = &p.key else {
        if p.message.contains("empty") {
            return "start with agent = \"<the broker's agent>\", then declare [resources.\"...\"] and [tools.\"...\"]".into();
        }
        if p.message.contains("UTF-8") {
            return "save the file as UTF-8".into();
        }
        return TOML_HINT.into();
    };
    if p.message == "unknown key" {
        return unknown_key_hint(key);
    }
    let last = key.rsplit('.').next().unwrap_or(key);
    match (key.starts_with("resources."), key.starts_with("tools."), last) {
        (_, _, "agent") => "the agent's name, exactly as in the broker config's `agent`".into(),
        (_, _, "ttl") => "a whole number of seconds or minutes from \"1s\" to \"300s\" (\"5m\"), e.g. ttl = \"60s\"".into(),
        (true, _, "service") => "name a service the broker config has a [providers.NAME] table for, or add that table to the config first".into(),
        (true, _, "upstream") => "name an authorization server the broker config has an [upstreams.NAME] table for, or add that table to the config first (docs/UPSTREAM.md)".into(),
        (true, _, "source") => "source = \"self\": tokens minted by credbroker for this resource; \"service\" (with service and delivery) or \"exchange\" (with upstream) for the other sources".into(),
        (_, true, "resource") => "use the URI of a resource declared as [resources.\"<uri>\"] (compared in canonical form)".into(),
        (_, true, "scopes") => "scopes are RFC 6749 tokens: printable ASCII without spaces, quotes or backslashes, each listed once".into(),
        (_, _, "steps") => "step names as the orchestrator's code declares them, each listed once, without spaces or control characters".into(),
        (true, _, _) => "a resource is an absolute https URI without query, fragment, userinfo or dot segments (http only on loopback)".into(),
        (_, true, _) => "tool names are matched byte for byte: no spaces, control characters or look-alike letters".into(),
        _ => "see policy/README.md".into(),
    }
}

fn unknown_key_hint(key: &str) -> String {
    let parts = key.split('.').count();
    let (known, place): (&[&str], &str) = if key.starts_with("resources.") && parts > 2 {
        (RESOURCE_KEYS, "a resource")
    } else if key.starts_with("tools.") && parts > 2 {
        (TOOL_KEYS, "a tool")
    } else {
        (TOP_KEYS, "the top level")
    };
    let last = key.rsplit('.').next().unwrap_or(key);
    let close = known.iter().find(|k| {
        k.eq_ignore_ascii_case(last)
            || (last.len() > 3 && (k.starts_with(last) || last.starts_with(*k)))
    });
    match close {
        Some(k) => format!(
            "did you mean `{k}`? the keys of {place} are: {}",
            known.join(", ")
        ),
        None => format!("the keys of {place} are: {}", known.join(", ")),
    }
}

/// What `check` compares the policies with: the broker's `agent`, and,
/// from a config file, the services it has providers for.
#[derive(Debug, Clone)]
pub(crate) struct Broker {
    /// The config file, when the comparison comes from one.
    pub file: Option<PathBuf>,
    /// The broker's `agent`.
    pub agent: String,
    /// The `[providers.NAME]` tables; `None` when only the agent is known.
    pub services: Option<std::collections::BTreeSet<String>>,
    /// The `[upstreams.NAME]` tables; `None` when only the agent is known.
    pub upstreams: Option<std::collections::BTreeSet<String>>,
}

impl Broker {
    /// The problems of `policy` against this broker: a wrong agent, then
    /// every service without a provider table.
    fn problems(&self, path: &Path, text: &str, policy: &Policy) -> Vec<Problem> {
        let config = self
            .file
            .as_ref()
            .map(|f| format!(" (the `agent` of {})", f.display()))
            .unwrap_or_default();
        if policy.agent != self.agent {
            return vec![Problem {
                at: crate::infra::diagnostics::top_key_at(path, text, "agent"),
                key: Some("agent".into()),
                message: format!(
                    "the policy is for agent {:?}, not {:?}{config}",
                    policy.agent, self.agent
                ),
            }];
        }
        let (Some(services), Some(upstreams), Some(file)) =
            (&self.services, &self.upstreams, &self.file)
        else {
            return vec![];
        };
        policy
            .resources
            .values()
            .filter_map(|r| match &r.source {
                super::Source::Exchange { upstream } if !upstreams.contains(upstream) => {
                    let key = format!("resources.\"{}\".upstream", r.id);
                    let lookup = format!("resources.{}.upstream", r.id);
                    Some(Problem {
                        at: crate::infra::diagnostics::key_at(path, text, &lookup),
                        key: Some(key),
                        message: format!(
                            "upstream {upstream:?} has no [upstreams.{upstream}] table in {}: the broker refuses this policy at start-up and on reload",
                            file.display()
                        ),
                    })
                }
                super::Source::Service { service, .. } if !services.contains(service) => {
                    let key = format!("resources.\"{}\".service", r.id);
                    // The finder compares table names without their quotes.
                    let lookup = format!("resources.{}.service", r.id);
                    Some(Problem {
                        at: crate::infra::diagnostics::key_at(path, text, &lookup),
                        key: Some(key),
                        message: format!(
                            "service {service:?} has no [providers.{service}] table in {}: the broker refuses this policy at start-up and on reload",
                            file.display()
                        ),
                    })
                }
                _ => None,
            })
            .collect()
    }
}

/// A file of `[[case]]` tables and no `agent`: the input of `policy
/// test --cases`, which often sits beside the policies it tests.
fn is_cases_file(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .is_some_and(|t| t.contains_key("case") && !t.contains_key("agent"))
}

fn check(files: &[PathBuf], deny_warnings: bool, broker: Option<&Broker>, out: &mut String) -> u8 {
    let (mut errors, mut warnings) = (0usize, 0usize);
    for path in files {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                out.push_str(&format!(
                    "{}: error: cannot read the policy: {e}\n",
                    path.display()
                ));
                errors += 1;
                continue;
            }
        };
        // A cases file is checked as one (a glob over a directory of
        // policies picks up the cases beside them).
        if is_cases_file(&bytes) {
            match super::cases::load(path) {
                Ok(cases) => out.push_str(&format!(
                    "{}: ok: cases file, {} case(s) (not a policy: run it with `credbroker policy test POLICY --cases {}`)\n",
                    path.display(),
                    cases.len(),
                    path.display()
                )),
                Err(problems) => {
                    for p in &problems {
                        write_problem(p, out);
                    }
                    errors += problems.len();
                }
            }
            continue;
        }
        let policy = match Policy::parse(path, &bytes) {
            Ok(p) => p,
            Err(e) => {
                errors += write_policy_error(&e, out);
                continue;
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        if let Some(b) = broker {
            let problems = b.problems(path, &text, &policy);
            if !problems.is_empty() {
                for p in &problems {
                    write_problem(p, out);
                }
                errors += problems.len();
                continue;
            }
        }
        let ws = lint(path, &text, &policy);
        for w in &ws {
            write_warning(w, out);
        }
        warnings += ws.len();
        out.push_str(&format!(
            "{}: ok: agent {}, {} tools, {} resources, sha256 {}{}\n",
            path.display(),
            policy.agent,
            policy.tools.len(),
            policy.resources.len(),
            policy.hash.get(..12).unwrap_or(&policy.hash),
            if ws.is_empty() {
                String::new()
            } else {
                format!(", {} warning(s)", ws.len())
            }
        ));
    }
    out.push_str(&format!(
        "checked {} file(s): {errors} error(s), {warnings} warning(s)\n",
        files.len()
    ));
    if errors > 0 {
        1
    } else if warnings > 0 && deny_warnings {
        2
    } else {
        0
    }
}

fn test(file: &Path, cases: &Path, out: &mut String) -> u8 {
    let policy = load(file, out);
    let cases = match super::cases::load(cases) {
        Ok(c) => Some(c),
        Err(problems) => {
            for p in &problems {
                match &p.key {
                    Some(k) => out.push_str(&format!("{}: error: {k}: {}\n", p.at, p.message)),
                    None => out.push_str(&format!("{}: error: {}\n", p.at, p.message)),
                }
            }
            None
        }
    };
    let (Some((policy, _)), Some(cases)) = (policy, cases) else {
        return 1;
    };
    let (table, failures) = super::cases::report(&policy, &cases);
    out.push_str(&table);
    u8::from(failures > 0)
}
