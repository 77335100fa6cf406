//! `credbroker policy check | test | explain | diff`, run as a security team
//! would run them: the real binary on good and broken files, with exact
//! error positions, exit codes and texts.
// Test helpers panic loudly, like the tests they serve (clippy.toml allows
// unwrap/expect in #[test] functions only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_credbroker"))
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Runs `credbroker policy ARGS` in `dir`; returns (exit code, stdout).
fn policy(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .current_dir(dir)
        .arg("policy")
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run credbroker");
    (
        out.status.code().expect("exit code"),
        String::from_utf8(out.stdout).expect("utf-8 output"),
    )
}

fn short_hash(path: &Path) -> String {
    credbroker::internals::jose::sha256_hex(&std::fs::read(path).unwrap())[..12].to_string()
}

/// A temp dir holding copies of the examples, so paths in messages are short.
fn workdir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for f in [
        "mail-agent.toml",
        "mail-agent.cases.toml",
        "internal-api.toml",
        "repo-helper-github.toml",
    ] {
        std::fs::copy(repo(&format!("policy/examples/{f}")), d.path().join(f)).unwrap();
    }
    d
}

const MAIL: &str = "https://mail.internal.example/api";

// ------------------------------------------------------------------ check

#[test]
fn check_accepts_the_examples() {
    let d = workdir();
    let (code, out) = policy(d.path(), &["check", "mail-agent.toml", "internal-api.toml"]);
    assert_eq!(
        out,
        format!(
            "mail-agent.toml: ok: agent mail-agent, 3 tools, 1 resources, sha256 {}\n\
             internal-api.toml: ok: agent support-agent, 2 tools, 1 resources, sha256 {}\n\
             checked 2 file(s): 0 error(s), 0 warning(s)\n",
            short_hash(&d.path().join("mail-agent.toml")),
            short_hash(&d.path().join("internal-api.toml"))
        )
    );
    assert_eq!(code, 0);
}

#[test]
fn check_reports_every_error_with_its_position_and_a_hint() {
    let d = workdir();
    std::fs::write(
        d.path().join("broken.toml"),
        r#"agent = "mail-agent"

[resources."https://mail.internal.example/api"]
source = "self"
ttl = "10m"

[tools."mail.send"]
resource = "https://mail.internal.example/ap"
scopes = ["mail.send", "mail.send"]
steps = ["send_reply"]
ttl = "30"
"#,
    )
    .unwrap();
    let (code, out) = policy(d.path(), &["check", "broken.toml"]);
    assert_eq!(
        out,
        r#"broken.toml:5:7: error: resources."https://mail.internal.example/api".ttl: is longer than the 300s maximum
  hint: a whole number of seconds or minutes from "1s" to "300s" ("5m"), e.g. ttl = "60s"
broken.toml:8:12: error: tools."mail.send".resource: names a resource that is not declared under [resources]
  hint: use the URI of a resource declared as [resources."<uri>"] (compared in canonical form)
broken.toml:9:24: error: tools."mail.send".scopes: scope listed twice
  hint: scopes are RFC 6749 tokens: printable ASCII without spaces, quotes or backslashes, each listed once
broken.toml:11:7: error: tools."mail.send".ttl: must be a whole number of seconds or minutes such as "60s" or "5m"
  hint: a whole number of seconds or minutes from "1s" to "300s" ("5m"), e.g. ttl = "60s"
checked 1 file(s): 4 error(s), 0 warning(s)
"#
    );
    assert_eq!(code, 1);

    // Positive control: the corrected file passes.
    let fixed = std::fs::read_to_string(d.path().join("broken.toml"))
        .unwrap()
        .replace("\"10m\"", "\"5m\"")
        .replace("/ap\"", "/api\"")
        .replace("\"mail.send\", \"mail.send\"", "\"mail.send\"")
        .replace("\"30\"", "\"30s\"");
    std::fs::write(d.path().join("broken.toml"), fixed).unwrap();
    assert_eq!(policy(d.path(), &["check", "broken.toml"]).0, 0);
}

#[test]
fn check_reports_syntax_errors_unknown_keys_and_unreadable_files() {
    let d = workdir();
    std::fs::write(
        d.path().join("syntax.toml"),
        "agent = \"a\"\n[tools.\"t\"\nresource = 1\n",
    )
    .unwrap();
    std::fs::write(
        d.path().join("typo.toml"),
        "agent = \"a\"\n[resources.\"https://api.example/\"]\nsource = \"self\"\n[tools.t]\nresource = \"https://api.example/\"\nscope = [\"r\"]\nsteps = [\"s\"]\n",
    )
    .unwrap();
    std::fs::write(d.path().join("empty.toml"), "\n").unwrap();
    let (code, out) = policy(
        d.path(),
        &[
            "check",
            "syntax.toml",
            "typo.toml",
            "empty.toml",
            "missing.toml",
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "syntax.toml:2:11: error: unclosed table, expected `…`",
        "{out}"
    );
    assert_eq!(
        lines[1],
        "  hint: the file is not valid TOML here, or a value has the wrong type; check quotes, brackets and commas"
    );
    assert_eq!(lines[2], "typo.toml:6:1: error: tools.t.scope: unknown key");
    assert_eq!(
        lines[3],
        "  hint: did you mean `scopes`? the keys of a tool are: resource, scopes, steps, ttl"
    );
    assert!(
        lines[4].starts_with("empty.toml:1:1: error: the policy is empty"),
        "{out}"
    );
    assert!(
        lines[6].starts_with("missing.toml: error: cannot read the policy: "),
        "{out}"
    );
    assert_eq!(lines[7], "checked 4 file(s): 4 error(s), 0 warning(s)");
    assert_eq!(code, 1);
}

#[test]
fn check_warnings_and_deny_warnings() {
    let d = workdir();
    let risky = r#"agent = "a"
steps = ["triage", "draft", "review", "send", "cleanup"]

[resources."https://api.example/"]
source = "self"

[resources."https://unused.example/"]
source = "self"

[tools."api.read"]
resource = "https://api.example/"
scopes = ["read"]
steps = ["triage", "draft", "review", "send"]

[tools."api.admin"]
resource = "https://api.example/"
scopes = ["admin"]
steps = ["clenaup"]

[tools."*"]
resource = "https://api.example/"
steps = ["triage"]
"#;
    std::fs::write(d.path().join("risky.toml"), risky).unwrap();
    let expected_warnings = r#"risky.toml:20:2: warning: tools."*": names containing wildcard characters: *; they are matched literally, byte for byte
  hint: policies have no wildcards: name each tool and step exactly
risky.toml:15:2: warning: tools."api.admin": is granted scopes admin but no step can reach it: none of its steps (clenaup) is in the declared `steps`
  hint: fix the step names (a typo?) or add the steps to `steps`; until then every request for this tool is denied
risky.toml:10:2: warning: tools."api.read": is allowed in 4 steps (draft, review, send, triage); each one is another place where a prompt-injected model can reach it
  hint: list only the steps whose code needs this tool
risky.toml:7:2: warning: resources."https://unused.example/": is declared but no tool uses it
  hint: remove it, or name it in a tool's `resource`
"#;
    let summary = format!(
        "risky.toml: ok: agent a, 3 tools, 2 resources, sha256 {}, 4 warning(s)\nchecked 1 file(s): 0 error(s), 4 warning(s)\n",
        short_hash(&d.path().join("risky.toml"))
    );
    let (code, out) = policy(d.path(), &["check", "risky.toml"]);
    assert_eq!(out, format!("{expected_warnings}{summary}"));
    assert_eq!(
        code, 0,
        "warnings alone do not fail without --deny-warnings"
    );

    let (code, out) = policy(d.path(), &["check", "--deny-warnings", "risky.toml"]);
    assert_eq!(out, format!("{expected_warnings}{summary}"));
    assert_eq!(code, 2);

    // Errors win over warnings.
    std::fs::write(d.path().join("bad.toml"), "agent = 1\n").unwrap();
    assert_eq!(
        policy(
            d.path(),
            &["check", "--deny-warnings", "risky.toml", "bad.toml"]
        )
        .0,
        1
    );

    // Positive control: a clean file passes --deny-warnings.
    assert_eq!(
        policy(d.path(), &["check", "--deny-warnings", "mail-agent.toml"]).0,
        0
    );
}

#[test]
fn check_agent_must_match() {
    let d = workdir();
    let (code, out) = policy(
        d.path(),
        &["check", "--agent", "repo-helper", "mail-agent.toml"],
    );
    assert_eq!(
        out,
        "mail-agent.toml:10:1: error: agent: the policy is for agent \"mail-agent\", not \"repo-helper\"\n  \
         hint: the agent's name, exactly as in the broker config's `agent`\n\
         checked 1 file(s): 1 error(s), 0 warning(s)\n"
    );
    assert_eq!(code, 1);
    assert_eq!(
        policy(
            d.path(),
            &["check", "--agent", "mail-agent", "mail-agent.toml"]
        )
        .0,
        0
    );
}

/// The GitHub example uses the egress proxy: it loads without a warning.
/// The same policy with `delivery = "provider_token"` (and no routes) is
/// warned about, an error with `--deny-warnings`.
#[test]
fn check_github_example_passes_and_provider_tokens_are_warned_about() {
    let d = workdir();
    let (code, out) = policy(
        d.path(),
        &["check", "--deny-warnings", "repo-helper-github.toml"],
    );
    assert_eq!(code, 0, "{out}");
    let text = std::fs::read_to_string(d.path().join("repo-helper-github.toml")).unwrap();
    let bearer: String = text
        .replace("delivery = \"proxy\"", "delivery = \"provider_token\"")
        .lines()
        .filter(|l| !l.starts_with("routes") && !l.starts_with("  \"GET") && *l != "]")
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(d.path().join("bearer.toml"), bearer).unwrap();
    let (code, out) = policy(d.path(), &["check", "bearer.toml"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(credbroker::internals::policy::lint::PROVIDER_TOKEN_WARNING),
        "provider_token must be warned about:\n{out}"
    );
    assert_eq!(
        policy(d.path(), &["check", "--deny-warnings", "bearer.toml"]).0,
        2
    );
}

/// The policy `credbroker quickstart` writes (with and without the demo
/// tool) passes its own `policy check --deny-warnings`; without the details
/// its approval requires, the same check fails on the warning.
#[test]
fn check_quickstart_policy_passes_deny_warnings() {
    let d = tempfile::tempdir().unwrap();
    let qs = credbroker::internals::cli::QUICKSTART_POLICY;
    std::fs::write(d.path().join("quickstart.toml"), qs).unwrap();
    let demo = credbroker::internals::cli::demo_policy("http://127.0.0.1:8440");
    std::fs::write(d.path().join("with-demo.toml"), format!("{qs}{demo}")).unwrap();
    let (code, out) = policy(
        d.path(),
        &[
            "check",
            "--deny-warnings",
            "--agent",
            "repo-helper",
            "quickstart.toml",
            "with-demo.toml",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.ends_with("checked 2 file(s): 0 error(s), 0 warning(s)\n"),
        "{out}"
    );
    // Negative control: the approval without required details is warned
    // about, and --deny-warnings fails on it.
    let line = "require_authorization_details = true\n";
    assert_eq!(qs.matches(line).count(), 1);
    std::fs::write(d.path().join("optional.toml"), qs.replace(line, "")).unwrap();
    let (code, out) = policy(d.path(), &["check", "--deny-warnings", "optional.toml"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "tools.\"notes.delete\": needs approval but does not require authorization_details"
        ),
        "{out}"
    );
}

// ------------------------------------------------------------------ test

#[test]
fn test_runs_the_example_cases() {
    let d = workdir();
    let (code, out) = policy(
        d.path(),
        &[
            "test",
            "mail-agent.toml",
            "--cases",
            "mail-agent.cases.toml",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10, "{out}");
    assert!(lines[0].starts_with("#  result  name"), "{out}");
    assert!(
        lines[3].starts_with("3  ok      no sending while drafting"),
        "{out}"
    );
    assert!(
        lines[3].ends_with("deny step_not_allowed   deny step_not_allowed"),
        "{out}"
    );
    assert_eq!(lines[9], "8 cases: 8 as expected, 0 not");
}

#[test]
fn test_fails_on_a_mismatch_and_names_the_case() {
    let d = workdir();
    // The policy change a reviewer must catch: mail.send in draft_reply.
    let widened = std::fs::read_to_string(d.path().join("mail-agent.toml"))
        .unwrap()
        .replace(
            "steps = [\"send_reply\"]",
            "steps = [\"draft_reply\", \"send_reply\"]",
        );
    std::fs::write(d.path().join("widened.toml"), widened).unwrap();
    let (code, out) = policy(
        d.path(),
        &["test", "widened.toml", "--cases", "mail-agent.cases.toml"],
    );
    assert_eq!(code, 1, "{out}");
    let row = out.lines().find(|l| l.starts_with("3 ")).unwrap();
    assert!(
        row.starts_with("3  FAIL    no sending while drafting"),
        "{row}"
    );
    assert!(
        row.ends_with("deny step_not_allowed   allow [mail.send] 30s"),
        "{row}"
    );
    assert!(
        out.contains("FAIL #3 \"no sending while drafting\" at mail-agent.cases.toml:25:1\n"),
        "{out}"
    );
    assert!(out.ends_with("8 cases: 7 as expected, 1 not\n"), "{out}");
    // Positive control: the unchanged policy passes the same cases.
    assert_eq!(
        policy(
            d.path(),
            &[
                "test",
                "mail-agent.toml",
                "--cases",
                "mail-agent.cases.toml"
            ]
        )
        .0,
        0
    );
}

#[test]
fn test_refuses_a_broken_cases_file() {
    let d = workdir();
    std::fs::write(
        d.path().join("bad.cases.toml"),
        r#"[[case]]
step = "triage"
tool = "mail.read"
resource = "https://mail.internal.example/api"
expect = "deny"

[[case]]
step = "triage"
tool = "mail.read"
resource = "https://mail.internal.example/api"
expect = "maybe"
"#,
    )
    .unwrap();
    let (code, out) = policy(
        d.path(),
        &["test", "mail-agent.toml", "--cases", "bad.cases.toml"],
    );
    assert_eq!(
        out,
        "bad.cases.toml:5:10: error: case[1].reason: a denial must name its reason (a deny for another reason often hides a mistake)\n\
         bad.cases.toml:11:10: error: case[2].expect: must be \"allow\" or \"deny\"\n"
    );
    assert_eq!(code, 1);
    // A file with no case would pass vacuously: refused.
    std::fs::write(d.path().join("none.cases.toml"), "# nothing\n").unwrap();
    let (code, out) = policy(
        d.path(),
        &["test", "mail-agent.toml", "--cases", "none.cases.toml"],
    );
    assert_eq!(code, 1);
    assert!(out.contains("no [[case]] in the file"), "{out}");
}

// ------------------------------------------------------------------ explain

#[test]
fn explain_names_the_rule_and_the_near_miss_of_a_step() {
    let d = workdir();
    let (code, out) = policy(
        d.path(),
        &[
            "explain",
            "--policy",
            "mail-agent.toml",
            "--step",
            "draft_reply",
            "--tool",
            "mail.send",
            "--resource",
            MAIL,
        ],
    );
    assert_eq!(
        out,
        "decision: deny (step_not_allowed)\n\
         request:  step draft_reply, tool mail.send, resource https://mail.internal.example/api, no scope (asks for the tool's full set)\n\
         rule:     [tools.\"mail.send\"] at mail-agent.toml:34:2\n\
         why:      tool mail.send exists but is allowed only in step send_reply, not in step draft_reply\n\
         near misses:\n  \
         - in step draft_reply the tools allowed on this resource are: mail.draft, mail.read\n"
    );
    assert_eq!(code, 0);

    // Positive control: in its step, allowed, with the rule and the grant.
    let (code, out) = policy(
        d.path(),
        &[
            "explain",
            "--policy",
            "mail-agent.toml",
            "--step",
            "send_reply",
            "--tool",
            "mail.send",
            "--resource",
            MAIL,
        ],
    );
    assert_eq!(
        out,
        "decision: allow\n\
         request:  step send_reply, tool mail.send, resource https://mail.internal.example/api, no scope (asks for the tool's full set)\n\
         rule:     [tools.\"mail.send\"] at mail-agent.toml:34:2, [resources.\"https://mail.internal.example/api\"] at mail-agent.toml:16:2\n\
         why:      tool mail.send is allowed in step send_reply and its resource is https://mail.internal.example/api; no scope was asked for, so the tool's full set is granted\n\
         grant:    scopes mail.send; audience https://mail.internal.example/api; source self (minted by credbroker: ES256, DPoP-bound to the tool's key); lifetime at most 30s (tool ttl 30s, resource ttl 120s, broker cap 300s), and never past the subject token's expiry\n"
    );
    assert_eq!(code, 0);
}

#[test]
fn explain_shows_look_alike_tool_names_and_extra_scopes() {
    let d = workdir();
    let explain = |tool: &str, scope: Option<&str>| {
        let mut args = vec![
            "explain",
            "--policy",
            "mail-agent.toml",
            "--step",
            "draft_reply",
            "--tool",
            tool,
            "--resource",
            MAIL,
        ];
        if let Some(s) = scope {
            args.extend(["--scope", s]);
        }
        policy(d.path(), &args)
    };
    // Cyrillic е in place of e.
    let (code, out) = explain("mail.r\u{0435}ad", None);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "decision: deny (tool_not_allowed)\n\
         request:  step draft_reply, tool \"mail.r\u{0435}ad\", resource https://mail.internal.example/api, no scope (asks for the tool's full set)\n\
         why:      no tool named \"mail.r\u{0435}ad\" in the policy; tool names are matched byte for byte, there are no wildcards, and what is not written is denied\n\
         near misses:\n  \
         - tool mail.read exists (a similar name)\n  \
         - the requested tool name has a non-ASCII character at character 7 (U+0435); a look-alike or invisible character never matches\n  \
         - in step draft_reply the tools allowed on this resource are: mail.draft, mail.read\n"
    );
    let (_, out) = explain("mail.read ", None);
    assert!(
        out.contains("  - tool mail.read exists (differs only in surrounding whitespace)\n"),
        "{out}"
    );

    let (_, out) = explain("mail.read", Some("mail.read mail.send"));
    assert_eq!(
        out,
        "decision: deny (scope_not_allowed)\n\
         request:  step draft_reply, tool mail.read, resource https://mail.internal.example/api, scope \"mail.read mail.send\"\n\
         rule:     [tools.\"mail.read\"] at mail-agent.toml:21:2\n\
         why:      tool mail.read has scopes mail.read; the request also asks for mail.send, so it is denied whole (never narrowed)\n\
         near misses:\n  \
         - scope mail.send belongs to tool mail.send, allowed only in step send_reply\n"
    );
    // Positive control: the scope it has is granted.
    let (_, out) = explain("mail.read", Some("mail.read"));
    assert!(out.starts_with("decision: allow\n"), "{out}");
}

#[test]
fn explain_refuses_a_broken_policy() {
    let d = workdir();
    std::fs::write(
        d.path().join("broken.toml"),
        "agent = \"mail-agent\"\nfrozen = 1\n",
    )
    .unwrap();
    let (code, out) = policy(
        d.path(),
        &[
            "explain",
            "--policy",
            "broken.toml",
            "--step",
            "s",
            "--tool",
            "t",
            "--resource",
            MAIL,
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(
        out,
        "broken.toml:2:10: error: frozen: invalid type: integer `…`, expected a boolean\n  \
         hint: the file is not valid TOML here, or a value has the wrong type; check quotes, brackets and commas\n"
    );
}

// ------------------------------------------------------------------ diff

#[test]
fn diff_lists_access_gained_and_lost() {
    let d = workdir();
    let old = std::fs::read_to_string(d.path().join("mail-agent.toml")).unwrap();
    let new = old
        // mail.send now also while drafting, and its token lives longer.
        .replace(
            "steps = [\"send_reply\"]\nttl = \"30s\"",
            "steps = [\"draft_reply\", \"send_reply\"]\nttl = \"60s\"",
        )
        // mail.read loses triage but gains a scope.
        .replace(
            "scopes = [\"mail.read\"]\nsteps = [\"triage\", \"draft_reply\"]",
            "scopes = [\"mail.read\", \"mail.labels\"]\nsteps = [\"draft_reply\"]",
        )
        // The resource's tokens live shorter.
        .replace("ttl = \"120s\"", "ttl = \"90s\"");
    let new = new.replace(
        "# Saving a draft changes nothing the recipient sees.\n[tools.\"mail.draft\"]\nresource = \"https://mail.internal.example/api\"\nscopes = [\"mail.draft\"]\nsteps = [\"draft_reply\"]\n",
        "",
    ) + "\n[tools.\"mail.archive\"]\nresource = \"https://mail.internal.example/api\"\nscopes = [\"mail.archive\"]\nsteps = [\"triage\"]\n";
    std::fs::write(d.path().join("new.toml"), &new).unwrap();
    let (code, out) = policy(d.path(), &["diff", "mail-agent.toml", "new.toml"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        format!(
            "### Policy diff: `mail-agent.toml` -> `new.toml`\n\
             \n\
             sha256 {} -> {}\n\
             \n\
             **Access gained (review carefully)** (4)\n\
             \n\
             - tool `mail.archive` can now be used in step `triage` on `https://mail.internal.example/api` with scopes `mail.archive`, tokens up to 90s\n\
             - tool `mail.read` scopes widened: + `mail.labels`\n\
             - tool `mail.send` can now be used in step `draft_reply` (before: `send_reply`)\n\
             - tool `mail.send` tokens live longer: 30s -> 60s\n\
             \n\
             **Access lost** (3)\n\
             \n\
             - tool `mail.draft` can no longer be used (was: in step `draft_reply` on `https://mail.internal.example/api` with scopes `mail.draft`, tokens up to 120s)\n\
             - tool `mail.read` can no longer be used in step `triage` (now: `draft_reply`)\n\
             - tool `mail.read` tokens live shorter: 120s -> 90s\n\
             \n\
             **Resources changed** (1)\n\
             \n\
             - resource `https://mail.internal.example/api` ttl changed: 120s -> 90s\n",
            short_hash(&d.path().join("mail-agent.toml")),
            short_hash(&d.path().join("new.toml")),
        )
    );
}

#[test]
fn diff_ignores_formatting_and_sees_freeze_and_declared_steps() {
    let d = workdir();
    let old = std::fs::read_to_string(d.path().join("mail-agent.toml")).unwrap();
    // Comments removed and tools reordered: same access.
    let mut lines: Vec<&str> = old.lines().filter(|l| !l.starts_with('#')).collect();
    lines.push("");
    std::fs::write(d.path().join("reformatted.toml"), lines.join("\n")).unwrap();
    let (code, out) = policy(d.path(), &["diff", "mail-agent.toml", "reformatted.toml"]);
    assert_eq!(code, 0);
    assert!(out.ends_with("\nNo change in access.\n"), "{out}");

    // Dropping `send_reply` from the declared steps closes mail.send.
    let closed = old.replace(
        "steps = [\"triage\", \"draft_reply\", \"send_reply\"]",
        "steps = [\"triage\", \"draft_reply\"]",
    );
    std::fs::write(d.path().join("closed.toml"), closed).unwrap();
    let (_, out) = policy(d.path(), &["diff", "mail-agent.toml", "closed.toml"]);
    assert!(out.contains("**Access lost** (1)\n\n- tool `mail.send` can no longer be used (was: in step `send_reply`"), "{out}");
    assert!(
        out.contains("**Other changes** (1)\n\n- declared `steps`: removed `send_reply`\n"),
        "{out}"
    );
    assert!(!out.contains("Access gained"), "{out}");

    // Freezing loses everything.
    let frozen = old.replace(
        "agent = \"mail-agent\"\n",
        "agent = \"mail-agent\"\nfrozen = true\n",
    );
    std::fs::write(d.path().join("frozen.toml"), frozen).unwrap();
    let (_, out) = policy(d.path(), &["diff", "mail-agent.toml", "frozen.toml"]);
    assert!(out.contains("**Access lost** (3)"), "{out}");
    assert!(
        out.contains(
            "- `frozen = true` added: every derive is denied while this version is loaded\n"
        ),
        "{out}"
    );
}

#[test]
fn diff_refuses_a_broken_version() {
    let d = workdir();
    std::fs::write(
        d.path().join("broken.toml"),
        "agent = \"mail-agent\"\n[tools.t]\nsteps = [\"s\"]\n",
    )
    .unwrap();
    let (code, out) = policy(d.path(), &["diff", "mail-agent.toml", "broken.toml"]);
    assert_eq!(code, 1);
    assert_eq!(
        out,
        "broken.toml:2:1: error: tools.t: missing field `resource`\n  \
         hint: add the required key; see policy/README.md for the keys of each table\n"
    );
}

// ------------------------------------------------------- check --config

/// A broker config (the quick start's, agent `repo-helper`) with one
/// provider, `acme`, in a temp dir that lives as long as the first value.
fn broker_config() -> (tempfile::TempDir, PathBuf) {
    let (dir, config) = crate::support::prepare(&crate::support::Opts::default());
    let secret = dir.path().join("acme.secret");
    credbroker::internals::config::write_secret_file(&secret, b"client-secret").unwrap();
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[providers.acme]\ndisplay_name = \"Acme\"\nissuer = \"https://idp.acme.example\"\n\
         client_id = \"credbroker\"\nclient_secret_file = \"{}\"\nscopes = [\"openid\"]\n",
        secret.display()
    ));
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

#[test]
fn check_against_the_broker_config_catches_an_unknown_service_and_agent() {
    let d = workdir();
    let (_broker, config) = broker_config();
    let c = config.to_str().unwrap();
    // The GitHub example names service "github": this broker has only acme.
    let (code, out) = policy(
        d.path(),
        &["check", "--config", c, "repo-helper-github.toml"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with(&format!(
            "repo-helper-github.toml:26:1: error: resources.\"https://broker.example.com/proxy/github\".service: \
             service \"github\" has no [providers.github] table in {c}: the broker refuses this \
             policy at start-up and on reload\n  hint: name a service the broker config has a \
             [providers.NAME] table for, or add that table to the config first\n"
        )),
        "{out}"
    );
    assert!(
        out.ends_with("checked 1 file(s): 1 error(s), 0 warning(s)\n"),
        "{out}"
    );
    // An exchange resource naming an upstream this config lacks, then one
    // it has.
    let exchange = "agent = \"repo-helper\"\n[resources.\"https://crm.example.com/api\"]\nsource = \"exchange\"\nupstream = \"okta\"\n";
    std::fs::write(d.path().join("exchange.toml"), exchange).unwrap();
    let (code, out) = policy(d.path(), &["check", "--config", c, "exchange.toml"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with(&format!(
            "exchange.toml:4:1: error: resources.\"https://crm.example.com/api\".upstream: \
             upstream \"okta\" has no [upstreams.okta] table in {c}: the broker refuses this \
             policy at start-up and on reload\n  hint: name an authorization server"
        )),
        "{out}"
    );
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[upstreams.okta]\nissuer = \"https://okta.example\"\nclient_id = \"broker\"\nclient_secret_file = \"acme.secret\"\nsubject_issuers = [\"http://127.0.0.1:0\"]\n");
    std::fs::write(&config, text).unwrap();
    let (code, out) = policy(d.path(), &["check", "--config", c, "exchange.toml"]);
    assert_eq!(code, 0, "{out}");
    // A policy for another agent is refused, naming the config.
    let (code, out) = policy(d.path(), &["check", "--config", c, "mail-agent.toml"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "mail-agent.toml:10:1: error: agent: the policy is for agent \"mail-agent\", not \"repo-helper\" (the `agent` of {c})"
        )),
        "{out}"
    );
    // A config the broker would refuse is refused here, with its message.
    let broken = d.path().join("broken-broker.toml");
    std::fs::write(&broken, "agent = 1\n").unwrap();
    let (code, out) = policy(
        d.path(),
        &[
            "check",
            "--config",
            broken.to_str().unwrap(),
            "repo-helper-github.toml",
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("broken-broker.toml"), "{out}");
    // Positive control: the same policy naming acme passes against it.
    // (Its proxy address is this broker's issuer followed by /proxy/acme.)
    let cfg_text = std::fs::read_to_string(&config).unwrap();
    let issuer = cfg_text
        .lines()
        .find_map(|l| l.strip_prefix("issuer = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the broker config names its issuer");
    let text = std::fs::read_to_string(d.path().join("repo-helper-github.toml")).unwrap();
    std::fs::write(
        d.path().join("repo-helper-acme.toml"),
        text.replace("service = \"github\"", "service = \"acme\"")
            .replace(
                "https://broker.example.com/proxy/github",
                &format!("{issuer}/proxy/acme"),
            ),
    )
    .unwrap();
    let (code, out) = policy(d.path(), &["check", "--config", c, "repo-helper-acme.toml"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("repo-helper-acme.toml: ok: agent repo-helper"),
        "{out}"
    );
}

#[test]
fn check_of_the_examples_directory_checks_the_cases_files_as_cases() {
    // What the README and CI run: every file of policy/examples.
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("policy/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let cases = files
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".cases.toml"))
        .count();
    assert!(cases >= 1, "{files:?}");
    let out = Command::new(bin())
        .arg("policy")
        .arg("check")
        .args(&files)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("mail-agent.cases.toml: ok: cases file, ")
            && text.contains("(not a policy: run it with `credbroker policy test POLICY --cases "),
        "{text}"
    );
    assert_eq!(text.matches(": ok: ").count(), files.len(), "{text}");
    // A broken cases file is still an error, with its position.
    let d = workdir();
    std::fs::write(
        d.path().join("broken.cases.toml"),
        "[[case]]\nname = \"x\"\nstep = \"triage\"\n",
    )
    .unwrap();
    let (code, out) = policy(d.path(), &["check", "broken.cases.toml", "mail-agent.toml"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("broken.cases.toml:"), "{out}");
    assert!(out.contains("mail-agent.toml: ok: "), "{out}");
}
