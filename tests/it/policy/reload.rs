//! Hot reload of the policy in the running broker: under load, with good,
//! broken, truncated, half-written, missing, oversized and foreign-agent
//! versions; and the P cases of docs/SECURITY-CASES.md against a policy that came
//! in by reload.
// Test helpers panic loudly, like the tests they serve (clippy.toml allows
// unwrap/expect in #[test] functions only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use credbroker::client::Answer;
use credbroker::internals::jose::sha256_hex;

/// A good version `i`: `notes.read` everywhere, a probe tool that only
/// version `i` has, and `notes.audit` last, whose `ttl` line ends the file:
/// the file cut before it is a *valid* policy that would let notes.audit
/// tokens live 300 s instead of 10 s.
fn good(i: usize) -> String {
    format!(
        r#"# version {i}
agent = "repo-helper"

[resources."{RESOURCE}"]
source = "self"
ttl = "300s"

[tools."notes.read"]
resource = "{RESOURCE}"
scopes = ["notes.read"]
steps = ["summarize"]

[tools."probe.v{i}"]
resource = "{RESOURCE}"
steps = ["summarize"]

[tools."notes.audit"]
resource = "{RESOURCE}"
scopes = ["notes.audit"]
steps = ["summarize"]
ttl = "10s"
"#
    )
}

/// A tool that only broken versions name: it must never be issued.
fn evil_block() -> String {
    format!("\n[tools.\"evil.tool\"]\nresource = \"{RESOURCE}\"\nsteps = [\"summarize\"]\n")
}

#[derive(Debug, Clone, Copy)]
enum Version {
    Good,
    SyntaxError,
    BadTtl,
    UnknownKey,
    OtherAgent,
    Truncated,
    Empty,
    NotUtf8,
    TooLarge,
    Missing,
    HalfWritten,
}

/// The broken contents of each kind, with `evil.tool` where the kind allows,
/// so that a loader that accepted any of them would issue it.
fn broken(kind: Version, i: usize) -> Vec<u8> {
    let g = good(i);
    match kind {
        Version::SyntaxError => {
            format!("{g}{}\n[tools.\"x\"\nresource = \"", evil_block()).into_bytes()
        }
        Version::BadTtl => format!("{g}{}ttl = \"1h\"\n", evil_block()).into_bytes(),
        Version::UnknownKey => g
            .replace(
                "agent = \"repo-helper\"",
                "agent = \"repo-helper\"\ndefault = \"allow\"",
            )
            .into_bytes(),
        Version::OtherAgent => format!(
            "{}{}",
            g.replace("agent = \"repo-helper\"", "agent = \"other-agent\""),
            evil_block()
        )
        .into_bytes(),
        Version::Truncated => {
            // Cut in the middle of the probe's resource string.
            let at = g.find("[tools.\"probe").unwrap() + 40;
            g.as_bytes()[..at].to_vec()
        }
        Version::Empty => Vec::new(),
        Version::NotUtf8 => {
            let mut b = format!("{g}{}", evil_block()).into_bytes();
            b.extend_from_slice(b"# \xff\xfe\n");
            b
        }
        Version::TooLarge => {
            // Valid, with evil.tool, but over the 1 MiB cap.
            let mut s = format!("{g}{}", evil_block());
            let pad = format!("# {}\n", "x".repeat(1000));
            while s.len() <= 1024 * 1024 {
                s.push_str(&pad);
            }
            s.into_bytes()
        }
        Version::Good | Version::Missing | Version::HalfWritten => unreachable!(),
    }
}

#[derive(Default)]
struct Seen {
    read_issued: usize,
    read_refused: Vec<String>,
    audit_issued: Vec<i64>,
    evil_issued: usize,
    evil_refused_other: Vec<String>,
}

async fn wait_async(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn issued(
    b: &TestBroker,
    k: &credbroker::internals::jose::Es256Key,
    subject: &str,
    tool: &str,
) -> Result<i64, String> {
    match b
        .derive(k, subject, "summarize", tool, RESOURCE, None)
        .await
    {
        Answer::Issued(t) => Ok(t.expires_in),
        Answer::Refused(r) => Err(r.reason.unwrap_or(r.error)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_under_load_never_answers_from_a_broken_policy() {
    let _serial = crate::support::serial().await;
    let b = Arc::new(TestBroker::start_with(Opts {
        policy: Some(good(0)),
        ..Default::default()
    }));
    let mut good_hashes: BTreeSet<String> = [sha256_hex(good(0).as_bytes())].into();
    let mut forbidden: BTreeSet<String> = BTreeSet::new();
    assert_eq!(b.policy_hash(), sha256_hex(good(0).as_bytes()));

    // Derives run continuously while the file is rewritten.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (b, stop, seen) = (b.clone(), stop.clone(), seen.clone());
        workers.push(tokio::spawn(async move {
            let k = key();
            let subject = b.subject_token("alice");
            while !stop.load(Ordering::SeqCst) {
                let r = issued(&b, &k, &subject, "notes.read").await;
                let a = issued(&b, &k, &subject, "notes.audit").await;
                let e = issued(&b, &k, &subject, "evil.tool").await;
                let mut s = seen.lock().unwrap();
                match r {
                    Ok(_) => s.read_issued += 1,
                    Err(reason) => s.read_refused.push(reason),
                }
                if let Ok(exp) = a {
                    s.audit_issued.push(exp);
                }
                match e {
                    Ok(_) => s.evil_issued += 1,
                    Err(reason) if reason == "tool_not_allowed" => {}
                    Err(reason) => s.evil_refused_other.push(reason),
                }
            }
        }));
    }

    let plan = [
        Version::Good,
        Version::SyntaxError,
        Version::HalfWritten,
        Version::Truncated,
        Version::Good,
        Version::BadTtl,
        Version::Good,
        Version::Empty,
        Version::Missing,
        Version::Good,
        Version::OtherAgent,
        Version::HalfWritten,
        Version::NotUtf8,
        Version::Good,
        Version::TooLarge,
        Version::UnknownKey,
        Version::Good,
        Version::Truncated,
        Version::HalfWritten,
        Version::SyntaxError,
        Version::Good,
        Version::Missing,
        Version::Good,
        Version::BadTtl,
        Version::HalfWritten,
        Version::OtherAgent,
        Version::Good,
        Version::Empty,
        Version::TooLarge,
        Version::SyntaxError,
    ];
    let k = key();
    let subject = b.subject_token("alice");
    let policy = b.path("policy.toml");
    let failures = |b: &TestBroker| {
        b.metric("credbroker_policy_reload_failures_total")
            .unwrap_or(0.0) as u64
    };
    let (mut version, mut current) = (0usize, 0usize);
    let (mut broken_writes, mut half_conclusive) = (0usize, 0usize);
    let mut half_pending: Option<(usize, bool)> = None;
    let changing = |b: &TestBroker| {
        b.log_text()
            .matches("policy file is still changing")
            .count()
    };
    for (n, kind) in plan.iter().enumerate() {
        match kind {
            Version::Good | Version::HalfWritten => {
                version += 1;
                let text = good(version);
                let hash = sha256_hex(text.as_bytes());
                good_hashes.insert(hash.clone());
                if let Version::HalfWritten = kind {
                    // In place, in two writes; the first part is a valid
                    // policy that would widen notes.audit to 300 s.
                    let cut = text.rfind("ttl = \"10s\"").unwrap();
                    let (head, tail) = text.split_at(cut);
                    let changing_before = changing(&b);
                    let started = Instant::now();
                    let mut f = std::fs::File::create(&policy).unwrap();
                    f.write_all(head.as_bytes()).unwrap();
                    f.flush().unwrap();
                    b.sighup();
                    // The writer's stall between its two writes (part of
                    // the scenario, not a synchronisation: whether the
                    // broker saw the half file is read from its log below).
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    f.write_all(tail.as_bytes()).unwrap();
                    drop(f);
                    // The settle window is SETTLE: a writer that stalled
                    // longer between its two writes is the documented limit
                    // (use rename). Measured from before the first write, a
                    // stall shorter than SETTLE cannot outlast the broker's
                    // settle sleep, whatever the load.
                    let prompt = started.elapsed() < credbroker::internals::app::reload::SETTLE;
                    if prompt {
                        forbidden.insert(sha256_hex(head.as_bytes()));
                    }
                    half_pending = Some((changing_before, prompt));
                } else if n % 2 == 0 {
                    b.replace_policy(text.as_bytes());
                } else {
                    std::fs::write(&policy, &text).unwrap();
                }
                // Every other good version is left to the watcher alone.
                if n % 3 == 0 {
                    b.sighup();
                }
                let bb = b.clone();
                wait_async(
                    Duration::from_secs(10),
                    &format!("version {version} to load"),
                    || bb.policy_hash() == hash,
                )
                .await;
                // Its probe works; the previous version's probe is gone.
                assert!(
                    issued(&b, &k, &subject, &format!("probe.v{version}"))
                        .await
                        .is_ok(),
                    "probe of version {version}"
                );
                assert_eq!(
                    issued(&b, &k, &subject, &format!("probe.v{current}")).await,
                    Err("tool_not_allowed".to_string())
                );
                current = version;
                // Conclusive only if the broker was seen reading the file
                // mid-write (and refusing it as still changing), not merely
                // if the writer was quick.
                if let Some((before, prompt)) = half_pending.take() {
                    if prompt && changing(&b) > before {
                        half_conclusive += 1;
                    }
                }
            }
            Version::Missing => {
                broken_writes += 1;
                let before = failures(&b);
                std::fs::remove_file(&policy).unwrap();
                b.sighup();
                let bb = b.clone();
                wait_async(
                    Duration::from_secs(10),
                    "a failed reload (missing file)",
                    || failures(&bb) > before,
                )
                .await;
            }
            kind => {
                broken_writes += 1;
                let bytes = broken(*kind, version + 100);
                forbidden.insert(sha256_hex(&bytes));
                assert!(
                    credbroker::internals::policy::Policy::parse(std::path::Path::new("x"), &bytes)
                        .map(|p| p.agent != "repo-helper" || bytes.len() > 1024 * 1024)
                        .unwrap_or(true),
                    "{kind:?} must be a version the broker refuses"
                );
                let before = failures(&b);
                std::fs::write(&policy, &bytes).unwrap();
                b.sighup();
                let bb = b.clone();
                wait_async(
                    Duration::from_secs(10),
                    &format!("a failed reload ({kind:?})"),
                    || failures(&bb) > before,
                )
                .await;
            }
        }
        // Whatever was written, the last good version decides.
        assert_eq!(
            b.policy_hash(),
            sha256_hex(good(current).as_bytes()),
            "after {kind:?}"
        );
        assert!(
            issued(&b, &k, &subject, &format!("probe.v{current}"))
                .await
                .is_ok(),
            "after {kind:?}"
        );
        assert_eq!(
            issued(&b, &k, &subject, "evil.tool").await,
            Err("tool_not_allowed".to_string())
        );
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }

    let seen = seen.lock().unwrap();
    eprintln!(
        "notes.read issued {}, notes.audit issued {}, conclusive half-writes {half_conclusive}, broken writes {broken_writes}",
        seen.read_issued,
        seen.audit_issued.len()
    );
    assert!(
        seen.read_issued >= 100,
        "the load was real: {} notes.read issued",
        seen.read_issued
    );
    assert!(
        seen.read_refused.is_empty(),
        "notes.read refused during reloads: {:?}",
        seen.read_refused
    );
    assert_eq!(
        seen.evil_issued, 0,
        "evil.tool was issued from a broken file"
    );
    assert!(
        seen.evil_refused_other.is_empty(),
        "{:?}",
        seen.evil_refused_other
    );
    assert!(!seen.audit_issued.is_empty());
    assert!(
        seen.audit_issued.iter().all(|e| *e <= 10),
        "a notes.audit token outlived its 10 s ttl (a half-written file was served)"
    );
    assert!(
        half_conclusive >= 1,
        "the broker was never seen refusing a half-written file as still changing"
    );

    // Every decision names a good version; no broken or partial one ever
    // decided anything.
    let events = b.audit_lines();
    let mut decisions = 0;
    for e in &events {
        let kind = e["event"].as_str().unwrap();
        let hash = e["policy_hash"].as_str().unwrap_or_default();
        if kind.starts_with("derive.") {
            decisions += 1;
            assert!(
                good_hashes.contains(hash),
                "{kind} decided by policy {hash}"
            );
        }
        if kind == "policy.reloaded" || kind == "policy.reload_failed" {
            assert!(good_hashes.contains(hash), "{kind} names {hash}");
        }
        assert!(!forbidden.contains(hash), "{e}");
    }
    assert!(decisions > 300, "{decisions} decisions");
    let failed_events: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "policy.reload_failed")
        .collect();
    let reasons: BTreeSet<&str> = failed_events
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["agent_mismatch", "invalid", "too_large", "unreadable"].into(),
        "every kind of failure is named"
    );
    assert!(failed_events.len() >= broken_writes);
    assert_eq!(
        failures(&b),
        failed_events.len() as u64,
        "metric and events agree"
    );
    let reloaded: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["event"] == "policy.reloaded")
        .map(|e| e["policy_hash"].as_str().unwrap())
        .collect();
    assert_eq!(
        reloaded.len(),
        version,
        "each good version was loaded once it was complete"
    );
    let last = sha256_hex(good(current).as_bytes());
    assert_eq!(
        b.metric(&format!("credbroker_policy_info{{hash=\"{last}\"}}")),
        Some(1.0)
    );
    let loaded_at = b
        .metric("credbroker_policy_loaded_timestamp_seconds")
        .unwrap();
    assert!((now() as f64 - loaded_at).abs() < 120.0);
}

/// A policy for the P cases, loaded by reload (not at start-up).
fn p_policy() -> String {
    let r = "https://repo.internal.example/api";
    format!(
        r#"agent = "repo-helper"

[resources."{r}"]
source = "self"

[tools."github.read"]
resource = "{r}"
scopes = ["repo:read"]
steps = ["review"]

[tools."github.write"]
resource = "{r}"
scopes = ["repo:read", "repo:write"]
steps = ["apply_confirmed"]
"#
    )
}

async fn refused(
    b: &TestBroker,
    k: &credbroker::internals::jose::Es256Key,
    s: &str,
    step: &str,
    tool: &str,
    res: &str,
    scope: Option<&str>,
) -> String {
    match b.derive(k, s, step, tool, res, scope).await {
        Answer::Refused(r) => r.reason.unwrap_or(r.error),
        Answer::Issued(t) => panic!(
            "issued for step {step:?} tool {tool:?} resource {res:?} scope {scope:?}: {}",
            t.scope
        ),
    }
}

#[tokio::test]
async fn p_cases_hold_for_a_policy_loaded_by_reload() {
    let b = TestBroker::start();
    let k = key();
    let s = b.subject_token("alice");
    let r = "https://repo.internal.example/api";
    // The watcher alone (no signal) picks up an atomic replacement.
    let text = p_policy();
    b.replace_policy(text.as_bytes());
    let hash = sha256_hex(text.as_bytes());
    wait_until(Duration::from_secs(10), "the P policy to load", || {
        b.policy_hash() == hash
    });
    let ok = |step: &'static str, tool: &'static str, scope: Option<&'static str>| {
        let (b, k, s) = (&b, &k, &s);
        async move {
            match b.derive(k, s, step, tool, r, scope).await {
                Answer::Issued(t) => t,
                Answer::Refused(x) => panic!("positive control refused: {x:?}"),
            }
        }
    };

    // P2: names match byte for byte.
    for tool in [
        "github.admin",
        "GitHub.Read",
        "github.re\u{0430}d",
        "github.read ",
        "github.read\0",
        " github.read",
    ] {
        // Each spelling, a NUL included (valid JSON, \u0000), is simply
        // another name the policy does not list.
        assert_eq!(
            refused(&b, &k, &s, "review", tool, r, None).await,
            "tool_not_allowed",
            "{tool:?}"
        );
    }
    assert_eq!(ok("review", "github.read", None).await.scope, "repo:read");

    // P3: no wildcards, globs or path tricks in tool, step or resource.
    for tool in [
        "*",
        "github.*",
        "github.rea?",
        "../github.read",
        "github%2eread",
    ] {
        assert_eq!(
            refused(&b, &k, &s, "review", tool, r, None).await,
            "tool_not_allowed",
            "{tool:?}"
        );
    }
    for step in ["*", "revi*", "../review", "review/..", "%72eview"] {
        assert_eq!(
            refused(&b, &k, &s, step, "github.read", r, None).await,
            "step_not_allowed",
            "{step:?}"
        );
    }
    // A glob is a well-formed other name; dot segments, plain or encoded,
    // are refused before any comparison.
    for (res, expected) in [
        ("https://repo.internal.example/*", "resource_mismatch"),
        (
            "https://repo.internal.example/api/../admin",
            "invalid_target",
        ),
        (
            "https://repo.internal.example/api/%2e%2e/admin",
            "invalid_target",
        ),
        ("https://repo.internal.example/%2e/api", "invalid_target"),
    ] {
        assert_eq!(
            refused(&b, &k, &s, "review", "github.read", res, None).await,
            expected,
            "{res}"
        );
    }
    assert_eq!(ok("review", "github.read", None).await.scope, "repo:read");

    // P4: a tool outside the steps its entry lists.
    assert_eq!(
        refused(&b, &k, &s, "review", "github.write", r, None).await,
        "step_not_allowed"
    );
    assert_eq!(
        ok("apply_confirmed", "github.write", Some("repo:write"))
            .await
            .scope,
        "repo:write"
    );

    // P5: more scope than allowed is denied whole, never narrowed.
    assert_eq!(
        refused(
            &b,
            &k,
            &s,
            "review",
            "github.read",
            r,
            Some("repo:read repo:write")
        )
        .await,
        "scope_not_allowed"
    );
    assert_eq!(
        ok("review", "github.read", Some("repo:read")).await.scope,
        "repo:read"
    );

    // P1: a broken reload keeps this policy (and never allows everything).
    std::fs::write(
        b.path("policy.toml"),
        "agent = \"repo-helper\"\n[tools.\"github.read\"\n",
    )
    .unwrap();
    b.sighup();
    wait_until(Duration::from_secs(10), "the failed reload", || {
        b.metric("credbroker_policy_reload_failures_total") == Some(1.0)
    });
    assert_eq!(b.policy_hash(), hash);
    assert_eq!(
        refused(&b, &k, &s, "review", "github.write", r, None).await,
        "step_not_allowed"
    );
    assert_eq!(
        refused(&b, &k, &s, "review", "notes.read", RESOURCE, None).await,
        "tool_not_allowed"
    );
    assert_eq!(ok("review", "github.read", None).await.scope, "repo:read");

    // And a good reload that removes a tool takes effect.
    let narrowed = text.replace(
        "[tools.\"github.write\"]",
        "[tools.\"github.write.removed\"]",
    );
    b.replace_policy(narrowed.as_bytes());
    b.sighup();
    let nh = sha256_hex(narrowed.as_bytes());
    wait_until(Duration::from_secs(10), "the narrowed policy", || {
        b.policy_hash() == nh
    });
    assert_eq!(
        refused(
            &b,
            &k,
            &s,
            "apply_confirmed",
            "github.write",
            r,
            Some("repo:write")
        )
        .await,
        "tool_not_allowed"
    );
    assert_eq!(ok("review", "github.read", None).await.scope, "repo:read");
}

#[tokio::test]
async fn reload_refuses_a_policy_for_another_agent_and_a_frozen_file_freezes() {
    let b = TestBroker::start();
    let k = key();
    let start = b.policy_hash();
    let other = credbroker::internals::cli::QUICKSTART_POLICY
        .replace("agent = \"repo-helper\"", "agent = \"mail-agent\"");
    b.replace_policy(other.as_bytes());
    b.sighup();
    wait_until(Duration::from_secs(10), "the refused reload", || {
        b.metric("credbroker_policy_reload_failures_total") == Some(1.0)
    });
    assert_eq!(b.policy_hash(), start);
    let failed = b
        .audit_lines()
        .into_iter()
        .find(|e| e["event"] == "policy.reload_failed")
        .unwrap();
    assert_eq!(failed["reason"], "agent_mismatch");
    assert_eq!(failed["policy_hash"], start.as_str());
    // The log line names the policy file with line:col, the key, and the
    // config file whose `agent` it contradicts (policy/README.md promises
    // file, line:col and key for every reload refusal).
    let line = other
        .lines()
        .position(|l| l.trim_start().starts_with("agent"))
        .unwrap()
        + 1;
    let log = b.log_text();
    let refused = log
        .lines()
        .find(|l| l.contains("policy reload failed"))
        .unwrap_or_else(|| panic!("no reload refusal logged: {log}"));
    for part in [
        format!("{}:{line}:", b.path("policy.toml").display()),
        ": agent: ".to_string(),
        "mail-agent".to_string(),
        b.config.display().to_string(),
    ] {
        assert!(refused.contains(&part), "{part:?} not in: {refused}");
    }
    b.derive_ok(&k).await;

    // A reloaded `frozen = true` denies everything, and says so.
    let frozen = credbroker::internals::cli::QUICKSTART_POLICY.replace(
        "agent = \"repo-helper\"",
        "agent = \"repo-helper\"\nfrozen = true",
    );
    b.replace_policy(frozen.as_bytes());
    b.sighup();
    let fh = sha256_hex(frozen.as_bytes());
    wait_until(Duration::from_secs(10), "the frozen policy", || {
        b.policy_hash() == fh
    });
    match b
        .derive(
            &k,
            &b.subject_token("alice"),
            "summarize",
            "notes.read",
            RESOURCE,
            None,
        )
        .await
    {
        Answer::Refused(r) => assert_eq!(r.reason.as_deref(), Some("frozen")),
        Answer::Issued(_) => panic!("issued under a frozen policy"),
    }
    assert_eq!(b.metric("credbroker_frozen"), Some(1.0));
    let reloaded = b
        .audit_lines()
        .into_iter()
        .rev()
        .find(|e| e["event"] == "policy.reloaded")
        .unwrap();
    assert_eq!(reloaded["policy_hash"], fh.as_str());
    // Positive control: unfreezing by reload works again.
    b.replace_policy(credbroker::internals::cli::QUICKSTART_POLICY.as_bytes());
    b.sighup();
    wait_until(Duration::from_secs(10), "the unfrozen policy", || {
        b.policy_hash() == start
    });
    b.derive_ok(&k).await;
    assert_eq!(b.metric("credbroker_frozen"), Some(0.0));
}
