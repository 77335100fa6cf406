//! Operator-facing behaviour: audit events, metrics, the admin socket (freeze,
//! key rotation, readiness), and the CLI that talks to it.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use crate::support::*;
use credbroker::client::Answer;

fn cli(b: &TestBroker, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .args(args)
        .arg("--config")
        .arg(&b.config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn audit_event_per_decision_without_tokens() {
    let b = TestBroker::start();
    let k = key();
    let t = b.derive_ok(&k).await;
    let denied = b
        .derive(
            &k,
            &b.subject_token("alice"),
            "summarize",
            "notes.delete",
            RESOURCE,
            None,
        )
        .await;
    assert!(matches!(denied, Answer::Refused(_)));
    // A name with control characters cannot forge a line.
    let evil_tool = "x\n{\"event\":\"derive.issued\"}";
    let _ = b
        .derive(
            &k,
            &b.subject_token("alice"),
            "summarize",
            evil_tool,
            RESOURCE,
            None,
        )
        .await;

    let lines = b.audit_lines();
    assert_eq!(
        lines.len(),
        3,
        "one line per decision, the injected newline escaped"
    );
    let issued = &lines[0];
    assert_eq!(issued["event"], "derive.issued");
    assert_eq!(issued["person_sub"], "alice");
    assert_eq!(issued["tool"], "notes.read");
    let policy_hash = b.admin_get("/status").unwrap().1;
    let status: serde_json::Value = serde_json::from_str(&policy_hash).unwrap();
    assert_eq!(issued["policy_hash"], status["policy_hash"]);
    // The jti hash matches the token's jti; the token itself is nowhere.
    let payload = t.access_token.expose().split('.').nth(1).unwrap();
    let claims: serde_json::Value =
        serde_json::from_slice(&credbroker::internals::jose::b64d(payload, "t").unwrap()).unwrap();
    let jti = claims["jti"].as_str().unwrap();
    assert_eq!(
        issued["jti_sha256"],
        credbroker::internals::jose::sha256_hex(jti.as_bytes())
    );
    let raw = std::fs::read_to_string(b.path("data/audit.jsonl")).unwrap();
    assert!(!raw.contains(t.access_token.expose()));
    assert!(
        !raw.contains(jti),
        "the jti itself is not in the audit log, only its hash"
    );
    assert_eq!(lines[1]["reason"], "step_not_allowed");
    // An undeclared tool is recorded as its length and a keyed hash only.
    assert!(lines[2].get("tool").is_none(), "{}", lines[2]);
    assert_eq!(lines[2]["undeclared"]["tool"]["len"], evil_tool.len());
    assert_eq!(
        lines[2]["undeclared"]["tool"]["hmac_sha256"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    assert_eq!(lines[2]["reason"], "tool_not_allowed");
}

#[tokio::test]
async fn audit_sink_failure_refuses_the_derive() {
    // /dev/full accepts the open and fails every write with ENOSPC.
    let b = TestBroker::start_with(Opts {
        edit_config: Some(|c| {
            c.replacen(
                "store = \"data\"",
                "store = \"data\"\naudit_log = \"/dev/full\"",
                1,
            )
        }),
        ..Opts::default()
    });
    let k = key();
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
        Answer::Refused(r) => {
            assert_eq!(r.status, 500);
            assert_eq!(r.error, "server_error");
            assert!(r.error_description.unwrap().contains("correlation id"));
        }
        Answer::Issued(_) => {
            panic!("a token was released although its audit event was not written")
        }
    }
    // Positive control: the same request with a working sink.
    let good = TestBroker::start();
    good.derive_ok(&k).await;
}

#[tokio::test]
async fn metrics_count_outcomes_with_bounded_labels() {
    let b = TestBroker::start();
    let k = key();
    b.derive_ok(&k).await;
    b.derive_ok(&k).await;
    for i in 0..5 {
        let tool = format!("attacker-chosen-{i}");
        let _ = b
            .derive(
                &k,
                &b.subject_token("alice"),
                "summarize",
                &tool,
                RESOURCE,
                None,
            )
            .await;
    }
    let m = b.metrics();
    assert!(
        m.contains(
            r#"credbroker_derives_total{outcome="issued",reason="none",tool="notes.read"} 2"#
        ),
        "{m}"
    );
    assert!(
        m.contains(
            r#"credbroker_derives_total{outcome="denied",reason="tool_not_allowed",tool="other"} 5"#
        ),
        "{m}"
    );
    assert!(
        !m.contains("attacker-chosen"),
        "labels come only from the policy"
    );
    // The second derive used the cached subject token? Each call mints a new
    // subject token here, so count misses; the cache is exercised below.
    let subject = b.subject_token("alice");
    for _ in 0..3 {
        assert!(matches!(
            b.derive(&k, &subject, "summarize", "notes.read", RESOURCE, None)
                .await,
            Answer::Issued(_)
        ));
    }
    let m = b.metrics();
    let hits: u64 = m
        .lines()
        .find(|l| l.starts_with("credbroker_subject_cache_hits_total "))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(
        hits, 2,
        "the same subject token is verified once, then served from the cache"
    );
    assert!(m.contains("credbroker_dpop_replay_cache_entries"));
    assert!(m.contains("credbroker_derive_duration_seconds_bucket"));
}

#[tokio::test]
async fn freeze_denies_everything_until_lifted_and_survives_restart() {
    let mut b = TestBroker::start();
    let k = key();
    b.derive_ok(&k).await;
    let (code, out) = cli(&b, &["freeze", "on"]);
    assert_eq!(code, 0, "{out}");
    for (step, tool) in [("summarize", "notes.read"), ("summarize", "no-such-tool")] {
        match b
            .derive(&k, &b.subject_token("alice"), step, tool, RESOURCE, None)
            .await
        {
            Answer::Refused(r) => {
                assert_eq!(r.status, 403);
                assert_eq!(
                    r.reason.as_deref(),
                    Some("frozen"),
                    "every refusal says frozen"
                );
                assert!(r.error_description.unwrap().contains("frozen"));
            }
            Answer::Issued(_) => panic!("issued while frozen"),
        }
    }
    assert!(b.metrics().contains("credbroker_frozen 1"));
    // The freeze is persisted: a restart does not lift it.
    b.restart();
    assert!(matches!(
        b.derive(
            &k,
            &b.subject_token("alice"),
            "summarize",
            "notes.read",
            RESOURCE,
            None
        )
        .await,
        Answer::Refused(_)
    ));
    let (code, _) = cli(&b, &["freeze", "off"]);
    assert_eq!(code, 0);
    b.derive_ok(&k).await;
    let events: Vec<String> = b
        .audit_lines()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        events.contains(&"admin.frozen".to_owned())
            && events.contains(&"admin.unfrozen".to_owned())
    );
}

#[tokio::test]
async fn freeze_and_rotate_work_offline_through_the_store() {
    let mut b = TestBroker::start();
    let k = key();
    b.derive_ok(&k).await;
    b.stop();
    let (code, out) = cli(&b, &["freeze", "on"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"running\":false"));
    let (code, out) = cli(&b, &["keys", "rotate"]);
    assert_eq!(code, 0, "{out}");
    let (code, _) = cli(&b, &["status"]);
    assert_eq!(code, 3, "status says not running");
    // Offline actions are audited as the admin socket's are.
    let events: Vec<String> = b
        .audit_lines()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        events.ends_with(&["admin.frozen".to_owned(), "keys.rotated".to_owned()]),
        "the offline freeze and key rotation write their events: {events:?}"
    );
    b.restart();
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
        Answer::Issued(_) => panic!("offline freeze ignored"),
    }
    cli(&b, &["freeze", "off"]);
    let jwks: serde_json::Value = reqwest::get(format!("{}/.well-known/jwks.json", b.public))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        jwks["keys"].as_array().unwrap().len(),
        2,
        "offline rotation kept the old key published"
    );
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn key_rotation_keeps_old_tokens_verifiable() {
    // Three seconds between publication and activation, so the test can
    // see both steps; activation happens at the restart (at start).
    let mut b = TestBroker::start_with(Opts {
        edit_config: Some(|t| t.replace("[keys]\n", "[keys]\nactivation_delay = 3\n")),
        ..Opts::default()
    });
    let k = key();
    let old = b.derive_ok(&k).await;
    let jwks_url = format!("{}/.well-known/jwks.json", b.public);
    let before: serde_json::Value = reqwest::get(&jwks_url).await.unwrap().json().await.unwrap();
    let (code, out) = cli(&b, &["keys", "rotate"]);
    assert_eq!(code, 0, "{out}");
    let out: serde_json::Value = serde_json::from_str(&out).unwrap();
    let new_kid = out["kid"].as_str().unwrap().to_owned();
    assert_eq!(out["added"], true);
    // Running it again while the rotation is pending adds no key.
    let (code, again) = cli(&b, &["keys", "rotate"]);
    assert_eq!(code, 0, "{again}");
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(
        (again["kid"].as_str(), again["added"].as_bool()),
        (Some(new_kid.as_str()), Some(false))
    );
    // Published first, not yet signing.
    assert_eq!(out["active_kid"], before["keys"][0]["kid"]);
    let published: serde_json::Value = reqwest::get(&jwks_url).await.unwrap().json().await.unwrap();
    assert_eq!(published["keys"][0]["kid"], before["keys"][0]["kid"]);
    assert_eq!(published["keys"][1]["kid"], new_kid.as_str());
    // The audit event names the new kid.
    assert!(
        b.audit_lines()
            .iter()
            .any(|e| e["event"] == "keys.rotated" && e["kid"] == new_kid.as_str()),
        "{:?}",
        b.audit_lines()
    );
    // ...and so does the broker's log line.
    let log = b.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("signing key rotated") && l.contains(&format!("kid={new_kid}"))),
        "no rotation log line naming kid {new_kid}: {log}"
    );
    let wait = out["activates_at"].as_i64().unwrap() - now() + 1;
    std::thread::sleep(std::time::Duration::from_secs(wait.max(0) as u64));
    b.restart();
    // The public port is new after a restart.
    let jwks_url = format!("{}/.well-known/jwks.json", b.public);
    let after_bytes = reqwest::get(&jwks_url)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let after: serde_json::Value = serde_json::from_slice(&after_bytes).unwrap();
    assert_eq!(after["keys"].as_array().unwrap().len(), 2);
    assert_eq!(after["keys"][0]["kid"], new_kid.as_str());
    assert_eq!(after["keys"][1]["kid"], before["keys"][0]["kid"]);

    let new = b.derive_ok(&k).await;
    let kid_of = |t: &str| -> String {
        let h = credbroker::internals::jose::b64d(t.split('.').next().unwrap(), "h").unwrap();
        serde_json::from_slice::<serde_json::Value>(&h).unwrap()["kid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(kid_of(new.access_token.expose()), new_kid);
    // Both tokens verify against the published JWKS.
    let v = credbroker::verify::Verifier::from_jwks(&b.issuer, RESOURCE, &after_bytes).unwrap();
    for t in [&old, &new] {
        let url = "http://127.0.0.1:9090/notes";
        let proof = credbroker::internals::dpop::make_proof(
            &k,
            "GET",
            url,
            now(),
            Some(t.access_token.expose()),
            None,
        )
        .unwrap();
        let who = v
            .verify(&credbroker::verify::Presented {
                method: "GET",
                url,
                authorization: Some(&format!("DPoP {}", t.access_token.expose())),
                dpop: &[&proof],
            })
            .unwrap();
        assert_eq!(who.sub, "alice");
    }
}

#[tokio::test]
async fn readiness_and_status() {
    let b = TestBroker::start();
    let (code, body) = b.admin_get("/readyz").unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["store"], true);
    assert_eq!(v["keys"], true);
    assert_eq!(v["policy"], true);
    let (code, out) = cli(&b, &["status"]);
    assert_eq!(code, 0);
    assert!(out.contains("\"agent\":\"repo-helper\""));
    // The admin socket is the broker's own user's only: mode 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&b.admin).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Unknown admin paths are 404, and the orchestrator socket has no admin routes.
    assert_eq!(b.admin_get("/nope").unwrap().0, 404);
    let r = b.raw(
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        std::time::Duration::from_secs(2),
    );
    assert_eq!(status_of(&r), 404);
}
