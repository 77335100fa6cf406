//! docs/SECURITY-CASES.md group P: the policy denies by default, compares names
//! byte for byte, has no wildcards, and never widens a request. Against the
//! running binary; each negative is followed by the positive control.
// Test code panics loudly on a broken fixture: clippy.toml allows unwrap and
// expect in #[test] functions, and these helpers are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::support::*;
use serde_json::{json, Value};

/// Derives with an arbitrary step/tool/resource/scope for alice.
fn ask(b: &TestBroker, step: &str, tool: &str, resource: &str, scope: Option<&str>) -> HttpAnswer {
    let mut body = json!({"subject_token": b.subject_token("alice"), "step": step, "tool": tool, "resource": resource});
    if let Some(s) = scope {
        body["scope"] = json!(s);
    }
    b.post_derive(&body, Some(&b.proof(&key())))
}

#[track_caller]
fn denied(r: &HttpAnswer, reason: &str, what: &str) {
    r.assert_refused(403, "access_denied", what);
    assert_eq!(r.json()["reason"], reason, "{what}: {}", r.raw);
}

const GOOD_POLICY: &str = r#"agent = "repo-helper"

[resources."http://127.0.0.1:9090/notes"]
source = "self"
ttl = "300s"

[tools."notes.read"]
resource = "http://127.0.0.1:9090/notes"
scopes = ["notes.read"]
steps = ["summarize"]
"#;

#[tokio::test]
async fn invalid_policy_refuses_to_start_with_its_position() {
    let broken: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "ttl over the 300 s cap",
            GOOD_POLICY.replace("\"300s\"", "\"10m\"").into_bytes(),
            "policy.toml:5:7",
        ),
        (
            "unknown key",
            format!("{GOOD_POLICY}wildcard = true\n").into_bytes(),
            "policy.toml:11:1",
        ),
        // toml reports a missing `]` where the next token starts.
        (
            "unclosed array",
            GOOD_POLICY
                .replace("[\"notes.read\"]", "[\"notes.read\"")
                .into_bytes(),
            "policy.toml:10:1",
        ),
        (
            "undeclared resource",
            GOOD_POLICY
                .replace(
                    "resource = \"http://127.0.0.1:9090/notes\"",
                    "resource = \"http://127.0.0.1:9090/other\"",
                )
                .into_bytes(),
            "policy.toml:8:12",
        ),
        (
            "unknown source",
            GOOD_POLICY
                .replace("source = \"self\"", "source = \"anything\"")
                .into_bytes(),
            "policy.toml:4:10",
        ),
        (
            "source exchange (not yet)",
            GOOD_POLICY
                .replace("source = \"self\"", "source = \"exchange\"")
                .into_bytes(),
            "policy.toml:4:10",
        ),
        (
            "a tool with no step",
            GOOD_POLICY.replace("[\"summarize\"]", "[]").into_bytes(),
            "policy.toml:10:9",
        ),
        (
            "resource with a dot segment",
            GOOD_POLICY
                .replace("9090/notes\"]", "9090/x/../notes\"]")
                .into_bytes(),
            "policy.toml:3:2",
        ),
        (
            "not UTF-8",
            {
                let mut v = b"agent = \"repo-helper\"\n# caf".to_vec();
                v.extend_from_slice(&[0xe9, b'\n']);
                v
            },
            "policy.toml:2:6",
        ),
        ("empty file", b"".to_vec(), "the policy is empty"),
        (
            "only comments",
            b"# nothing here\n\n".to_vec(),
            "policy.toml:1:1",
        ),
        (
            "policy for another agent",
            GOOD_POLICY
                .replace("agent = \"repo-helper\"", "agent = \"other-agent\"")
                .into_bytes(),
            "written for agent",
        ),
    ];
    for (what, text, expect) in broken {
        let (dir, config) = prepare(&Opts::default());
        std::fs::write(dir.path().join("policy.toml"), &text).unwrap();
        let (status, stderr) = serve_expect_exit(&config, Duration::from_secs(20));
        assert!(!status.success(), "{what}: started");
        assert!(
            stderr.contains(expect),
            "{what}: expected {expect:?} in:\n{stderr}"
        );
        // Never served: nothing listens on the socket.
        assert!(
            std::os::unix::net::UnixStream::connect(dir.path().join("credbroker.sock")).is_err(),
            "{what}: the socket answers"
        );
    }
    // A missing file.
    let (dir, config) = prepare(&Opts::default());
    std::fs::remove_file(dir.path().join("policy.toml")).unwrap();
    let (status, stderr) = serve_expect_exit(&config, Duration::from_secs(20));
    assert!(
        !status.success() && stderr.contains("cannot read policy"),
        "missing policy: {stderr}"
    );

    // Positive control: the same file, correct, serves.
    let b = TestBroker::start_with(Opts {
        policy: Some(GOOD_POLICY.into()),
        ..Opts::default()
    });
    b.derive_ok(&key()).await;
}

// Multi-threaded: the load task runs while this one blocks on signals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_policy_reload_under_load_keeps_the_last_good_policy() {
    let b = TestBroker::start_with(Opts {
        policy: Some(GOOD_POLICY.into()),
        ..Opts::default()
    });
    let k = key();
    b.derive_ok(&k).await;
    let good_hash = b.audit_lines().last().unwrap()["policy_hash"].clone();
    let path = b.path("policy.toml");
    let count = |b: &TestBroker, event: &str| {
        b.audit_lines()
            .iter()
            .filter(|e| e["event"] == event)
            .count()
    };
    // Signals that arrive while a reload is settling coalesce, and the file
    // watcher may judge a rewrite before the signal does, so each rewrite
    // waits until the broker has judged it (a new `event`).
    let hup = |b: &TestBroker, event: &str| {
        let before = count(b, event);
        let ok = std::process::Command::new("kill")
            .args(["-HUP", &b.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while count(b, event) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "no {event} event after a rewrite"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Load: derives run continuously while the file is rewritten.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (socket, issuer, stop) = (b.socket.clone(), b.issuer.clone(), stop.clone());
        let subject = b.subject_token("alice");
        tokio::spawn(async move {
            let client = credbroker::client::Client::new(socket, &issuer);
            let k = key();
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for tool in ["notes.read", "notes.delete"] {
                    let p = credbroker::client::DeriveParams {
                        subject_token: &subject,
                        step: "summarize",
                        tool,
                        resource: RESOURCE,
                        scope: None,
                    };
                    answers.push((tool, client.derive(&p, &k).await.unwrap()));
                }
            }
            answers
        })
    };
    // A broken file, a truncated one, an empty one, a missing one, and one
    // that would allow everything if it were half-applied.
    let allow_all = format!(
        "{GOOD_POLICY}\n[tools.\"notes.delete\"]\nresource = \"http://127.0.0.1:9090/notes\"\nscopes = [\"notes.delete\"]\nsteps = [\"summarize\"]\nttl = \"1h\"\n"
    );
    for bad in [
        GOOD_POLICY.replace("[\"notes.read\"]", "[\"notes.read\""),
        GOOD_POLICY[..GOOD_POLICY.len() / 2].to_string(),
        String::new(),
        allow_all,
    ] {
        std::fs::write(&path, bad).unwrap();
        hup(&b, "policy.reload_failed");
    }
    std::fs::remove_file(&path).unwrap();
    hup(&b, "policy.reload_failed");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answers = load.await.unwrap();
    assert!(!answers.is_empty());
    for (tool, a) in &answers {
        match (tool, a) {
            (&"notes.read", credbroker::client::Answer::Issued(_)) => {}
            (&"notes.delete", credbroker::client::Answer::Refused(r))
                if r.reason.as_deref() == Some("tool_not_allowed") => {}
            other => panic!("an answer did not come from the last good policy: {other:?}"),
        }
    }
    let failed = b
        .audit_lines()
        .iter()
        .filter(|e| e["event"] == "policy.reload_failed")
        .count();
    // Each broken version was judged at least once (by the signal, the file
    // watcher, or both), and none was ever taken.
    assert!(
        failed >= 5,
        "one policy.reload_failed event per broken reload at least: {failed}"
    );
    assert!(b
        .metrics()
        .contains(&format!("policy_reload_failures_total {failed}")));
    assert_eq!(
        count(&b, "policy.reloaded"),
        0,
        "no broken version was loaded"
    );
    // One derive.issued event per token issued (the first derive and every
    // notes.read of the load), each under the good policy's hash.
    let issued: Vec<Value> = b
        .audit_lines()
        .into_iter()
        .filter(|e| e["event"] == "derive.issued")
        .collect();
    let answered = answers
        .iter()
        .filter(|(_, a)| matches!(a, credbroker::client::Answer::Issued(_)))
        .count();
    assert!(
        answered > 0,
        "the load got no token while the file was rewritten"
    );
    assert_eq!(issued.len(), 1 + answered, "{issued:?}");
    assert!(
        issued.iter().all(|e| e["policy_hash"] == good_hash),
        "{issued:?}"
    );
    // Positive control: a good new version is taken, atomically, with its hash.
    std::fs::write(
        &path,
        GOOD_POLICY.replace("[\"summarize\"]", "[\"summarize\", \"answer_question\"]"),
    )
    .unwrap();
    hup(&b, "policy.reloaded");
    let reloaded = b
        .audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "policy.reloaded")
        .expect("policy.reloaded");
    assert_ne!(reloaded["policy_hash"], good_hash);
    ask(&b, "answer_question", "notes.read", RESOURCE, None)
        .assert_issued("allowed by the new policy");
}

#[tokio::test]
async fn tool_and_step_names_compared_byte_for_byte() {
    let b = TestBroker::start();
    for tool in [
        "github.read",
        "Notes.Read",
        "NOTES.READ",
        "n\u{043e}tes.read",  // Cyrillic o
        "notes.re\u{0430}d",  // Cyrillic a
        "notes\u{ff0e}read",  // fullwidth full stop
        "notes\u{200b}.read", // zero-width space
        "notes.read ",
        " notes.read",
        "notes.read\t",
        "notes.read\u{0}",
        "notes.read\n",
        "notes.read\u{0301}",
        "",
    ] {
        denied(
            &ask(&b, "summarize", tool, RESOURCE, None),
            "tool_not_allowed",
            &format!("tool {tool:?}"),
        );
    }
    for step in [
        "Summarize",
        "summarize ",
        "summarize\u{0}",
        "s\u{0443}mmarize",
        "",
    ] {
        denied(
            &ask(&b, step, "notes.read", RESOURCE, None),
            "step_not_allowed",
            &format!("step {step:?}"),
        );
    }
    // Labels on /metrics come only from names in the policy.
    let m = b.metrics();
    for leaked in [
        "n\u{043e}tes",
        "github.read",
        "Notes.Read",
        "\u{200b}",
        "Summarize",
    ] {
        assert!(!m.contains(leaked), "{leaked:?} became a metric label");
    }
    ask(&b, "summarize", "notes.read", RESOURCE, None).assert_issued("exact names");
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn wildcards_globs_and_dot_segments_never_match() {
    let b = TestBroker::start();
    for tool in [
        "*",
        "notes.*",
        "*.read",
        "notes.rea?",
        "notes.[r]ead",
        "notes%2eread",
        "notes.read/..",
        "../notes.read",
        "%2e%2e/notes.read",
        ".*",
    ] {
        denied(
            &ask(&b, "summarize", tool, RESOURCE, None),
            "tool_not_allowed",
            &format!("tool {tool:?}"),
        );
    }
    for step in [
        "*",
        "summ*",
        "summari?e",
        "../summarize",
        "summarize/..",
        "%2e%2e",
        ".*",
    ] {
        denied(
            &ask(&b, step, "notes.read", RESOURCE, None),
            "step_not_allowed",
            &format!("step {step:?}"),
        );
    }
    // Resources that could reach the policy's resource by a path trick are
    // refused before any comparison; a glob is just another URI.
    for resource in [
        "http://127.0.0.1:9090/x/../notes",
        "http://127.0.0.1:9090/notes/../notes",
        "http://127.0.0.1:9090/%2e%2e/notes",
        "http://127.0.0.1:9090/notes/%2E",
        "http://127.0.0.1:9090/notes/.",
        "http://127.0.0.1:9090/.%2e/notes",
        "http://127.0.0.1:9090/notes%2f",
        "http://127.0.0.1:9090\\notes",
    ] {
        ask(&b, "summarize", "notes.read", resource, None).assert_refused(
            400,
            "invalid_target",
            &format!("resource {resource:?}"),
        );
    }
    // A URI that only looks like the policy's: a well-formed other name is
    // denied as another resource; one with a query is not a resource at all.
    ask(
        &b,
        "summarize",
        "notes.read",
        "http://127.0.0.1:9090/note?",
        None,
    )
    .assert_refused(400, "invalid_target", "resource with an empty query");
    for resource in [
        "http://127.0.0.1:9090/*",
        "http://127.0.0.1:9090/notes/",
        "http://127.0.0.1:9090/notes/sub",
        "http://127.0.0.1:9091/notes",
    ] {
        denied(
            &ask(&b, "summarize", "notes.read", resource, None),
            "resource_mismatch",
            &format!("resource {resource:?}"),
        );
    }
    ask(&b, "summarize", "notes.read", RESOURCE, None).assert_issued("exact names");
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn literal_star_in_the_policy_is_a_name_not_a_pattern() {
    let policy = r#"agent = "repo-helper"

[resources."http://127.0.0.1:9090/notes"]
source = "self"

[tools."*"]
resource = "http://127.0.0.1:9090/notes"
scopes = ["notes.read"]
steps = ["*"]
"#;
    let b = TestBroker::start_with(Opts {
        policy: Some(policy.into()),
        ..Opts::default()
    });
    denied(
        &ask(&b, "summarize", "notes.read", RESOURCE, None),
        "tool_not_allowed",
        "any tool under a * tool",
    );
    denied(
        &ask(&b, "summarize", "*", RESOURCE, None),
        "step_not_allowed",
        "any step under a * step",
    );
    denied(
        &ask(&b, "*", "notes.read", RESOURCE, None),
        "tool_not_allowed",
        "* step, another tool",
    );
    // Positive control: the literal names match byte for byte.
    let t = ask(&b, "*", "*", RESOURCE, None).assert_issued("literal * tool in literal * step");
    assert_eq!(claims_of(&t)["act"]["tool"], "*");
}

#[tokio::test]
async fn tool_asked_for_in_a_step_its_policy_does_not_list() {
    let b = TestBroker::start_with(Opts {
        policy: Some(policy_without_approval()),
        ..Opts::default()
    });
    for (step, tool) in [
        ("summarize", "notes.delete"),
        ("answer_question", "notes.delete"),
        ("cleanup_confirmed", "notes.read"),
        ("unknown_step", "notes.read"),
    ] {
        let r = ask(&b, step, tool, RESOURCE, None);
        denied(&r, "step_not_allowed", &format!("{tool} in {step}"));
    }
    // One event per refusal, each with the reason (an empty or unreadable
    // audit log must not pass).
    let events = b.audit_lines();
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(
        events.iter().all(|e| e["event"] == "derive.denied"
            && e["outcome"] == "denied"
            && e["reason"] == "step_not_allowed"),
        "{events:?}"
    );
    // Positive controls: the same tools in their listed steps.
    ask(&b, "cleanup_confirmed", "notes.delete", RESOURCE, None)
        .assert_issued("notes.delete in cleanup_confirmed");
    ask(&b, "answer_question", "notes.read", RESOURCE, None)
        .assert_issued("notes.read in answer_question");
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn scope_wider_than_the_policy_is_denied_whole() {
    let policy = r#"agent = "repo-helper"

[resources."http://127.0.0.1:9090/repo"]
source = "self"

[tools."github.read"]
resource = "http://127.0.0.1:9090/repo"
scopes = ["repo:read", "issues:read"]
steps = ["triage"]
"#;
    let b = TestBroker::start_with(Opts {
        policy: Some(policy.into()),
        ..Opts::default()
    });
    let repo = "http://127.0.0.1:9090/repo";
    for scope in [
        "repo:read repo:write",
        "repo:write",
        "repo:read issues:read admin",
        "repo:*",
        "REPO:READ",
    ] {
        let r = ask(&b, "triage", "github.read", repo, Some(scope));
        denied(&r, "scope_not_allowed", &format!("scope {scope:?}"));
    }
    for scope in [
        "repo:read  issues:read",
        " repo:read",
        "repo:read\n",
        "",
        "repo:\"read",
    ] {
        ask(&b, "triage", "github.read", repo, Some(scope)).assert_refused(
            400,
            "invalid_request",
            &format!("malformed scope {scope:?}"),
        );
    }
    // Positive controls: exactly what is allowed, a subset, or nothing said.
    let t = ask(&b, "triage", "github.read", repo, Some("repo:read")).assert_issued("repo:read");
    assert_eq!(claims_of(&t)["scope"], "repo:read");
    let t = ask(
        &b,
        "triage",
        "github.read",
        repo,
        Some("repo:read issues:read"),
    )
    .assert_issued("both");
    assert_eq!(claims_of(&t)["scope"], "issues:read repo:read");
    let t = ask(&b, "triage", "github.read", repo, None).assert_issued("the tool's scopes");
    assert_eq!(claims_of(&t)["scope"], "issues:read repo:read");
}
