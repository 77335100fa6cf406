//! Push delivery (RFC 8935): each bad SET is refused with its RFC 8935
//! code (proto/ssf-push-error.schema.json) and stops no one, then a good
//! SET for the same person is accepted (202) and stops their derives.

use serde_json::{json, Value};

use super::*;

const STOPPED: &str = "403 person_revoked";

/// A schema check of every error answer of the push endpoint.
fn check_error(body: &Value, what: &str) {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/proto/ssf-push-error.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let codes: Vec<&str> = schema["properties"]["err"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let obj = body
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {body}"));
    assert!(
        codes.contains(&body["err"].as_str().unwrap_or("")),
        "{what}: err {body}"
    );
    assert!(
        body["description"].is_string(),
        "{what}: description {body}"
    );
    assert!(
        obj.keys().all(|k| k == "err" || k == "description"),
        "{what}: {body}"
    );
}

#[tokio::test]
async fn bad_sets_are_refused_each_followed_by_a_good_one_that_stops_the_person() {
    let (b, mut tx, _secrets) = push_broker();
    // (case, options of the bad SET, its status, its err)
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("unsigned", json!({"key": "none"}), 400, "invalid_request"),
        ("another key", json!({"key": "other"}), 400, "invalid_key"),
        (
            "another audience",
            json!({"aud": "https://someone-else.example"}),
            400,
            "invalid_audience",
        ),
        (
            "another issuer",
            json!({"iss": "https://evil.example"}),
            400,
            "invalid_issuer",
        ),
        (
            "iat in the future",
            json!({"iat_offset": 120}),
            400,
            "invalid_request",
        ),
        (
            "older than the maximum age",
            json!({"iat_offset": -700}),
            400,
            "invalid_request",
        ),
        (
            "a subject token's typ",
            json!({"typ": "at+jwt"}),
            400,
            "invalid_request",
        ),
        (
            "a 1 MB SET",
            json!({"pad": 1_000_000}),
            413,
            "invalid_request",
        ),
    ];
    for (i, (what, opts, status, err)) in cases.into_iter().enumerate() {
        let sub = format!("person-{i}");
        let subject = iss_sub(&b, &sub);
        let (bad, _) = tx.set("session-revoked", &subject, opts);
        let (s, body) = push(&b, &bad).await;
        assert_eq!(
            (s, body["err"].as_str().unwrap_or("")),
            (status, err),
            "{what}: {body}"
        );
        check_error(&body, what);
        assert_eq!(
            derive_as(&b, &sub).await,
            Ok(()),
            "{what}: the bad SET stopped {sub}"
        );
        // Positive control: a good SET for the same person.
        let (good, _) = tx.set("session-revoked", &subject, json!({}));
        assert_eq!(
            push(&b, &good).await.0,
            202,
            "{what}: the good SET after it"
        );
        assert_eq!(
            derive_as(&b, &sub).await,
            Err(STOPPED.into()),
            "{what}: not stopped"
        );
    }
    // A wrong Authorization value: 401, whatever the SET.
    let subject = iss_sub(&b, "late");
    let (good, _) = tx.set("session-revoked", &subject, json!({}));
    let (s, body) = push_with(&b, "Bearer not-the-value", &good).await;
    assert_eq!(
        (s, body["err"].as_str().unwrap_or("")),
        (401, "authentication_failed")
    );
    check_error(&body, "wrong authorization");
    assert_eq!(derive_as(&b, "late").await, Ok(()));
    assert_eq!(push(&b, &good).await.0, 202);
    assert_eq!(derive_as(&b, "late").await, Err(STOPPED.into()));
    // Every refused SET was counted by its code.
    assert!(
        b.metric(
            r#"credbroker_ssf_events_total{outcome="invalid_key",transmitter="idp",type="other"}"#
        ) == Some(1.0)
    );
    assert!(b.metric(r#"credbroker_ssf_events_total{outcome="stopped",transmitter="idp",type="session-revoked"}"#) >= Some(9.0));
    assert!(
        b.metric(r#"credbroker_ssf_last_event_timestamp_seconds{transmitter="idp"}"#)
            >= Some((now() - 60) as f64)
    );
}

#[tokio::test]
async fn malformed_unmappable_unknown_and_repeated_sets_stop_no_one_then_a_good_one_does() {
    let (b, mut tx, _secrets) = push_broker();
    let alice = iss_sub(&b, "alice");

    // A malformed subject: 400, nothing stored.
    let (bad, _) = tx.set(
        "session-revoked",
        &json!({"format": "iss_sub", "iss": b.issuer}),
        json!({}),
    );
    let (s, body) = push(&b, &bad).await;
    assert_eq!(
        (s, body["err"].as_str().unwrap_or("")),
        (400, "invalid_request"),
        "{body}"
    );
    // An unmappable subject (a person of an issuer this transmitter is not
    // trusted for, and a phone number): accepted, recorded, ignored.
    for subject in [
        json!({"format": "iss_sub", "iss": "https://other-idp.example", "sub": "alice"}),
        json!({"format": "phone_number", "phone_number": "+12065550100"}),
    ] {
        let (set, _) = tx.set("session-revoked", &subject, json!({}));
        assert_eq!(push(&b, &set).await.0, 202);
    }
    assert_eq!(
        b.metric(r#"credbroker_ssf_unmapped_subjects_total{transmitter="idp"}"#),
        Some(2.0)
    );
    // An unknown event type: accepted, ignored.
    let (set, _) = tx.set(
        "https://schemas.example.com/secevent/event-type/not-known",
        &alice,
        json!({}),
    );
    assert_eq!(push(&b, &set).await.0, 202);
    assert_eq!(
        derive_as(&b, "alice").await,
        Ok(()),
        "an ignored SET stopped alice"
    );

    // The good SET (CAEP credential-change, its subject in the event as the
    // drafts put it): alice is stopped.
    let (good, jti) = tx.set(
        "credential-change",
        &alice,
        json!({"subject_in_event": true}),
    );
    assert_eq!(push(&b, &good).await.0, 202);
    assert_eq!(derive_as(&b, "alice").await, Err(STOPPED.into()));
    // The same jti again: 202, and no second action.
    assert_eq!(push(&b, &good).await.0, 202);
    let events = ssf_events(&b);
    let actions: Vec<&str> = events
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["unmapped", "unmapped", "ignored", "stopped", "duplicate"],
        "{events:?}"
    );
    let stops = b
        .audit_lines()
        .into_iter()
        .filter(|e| e["event"] == "person.revoked" && e["person_sub"] == "alice")
        .count();
    assert_eq!(stops, 1, "the repeated jti {jti} acted twice");
    // The events name no subject, only its hash.
    let text = serde_json::to_string(&events).unwrap();
    assert!(!text.contains("+12065550100") && !text.contains("other-idp"));
}

#[tokio::test]
async fn a_set_for_a_person_who_never_derived_stops_their_first_derive() {
    let (b, mut tx, _secrets) = push_broker();
    let (set, _) = tx.set(
        "account-disabled",
        &iss_sub(&b, "carol"),
        json!({"event_time_offset": -30}),
    );
    assert_eq!(push(&b, &set).await.0, 202);
    assert_eq!(derive_as(&b, "carol").await, Err(STOPPED.into()));
    // Control: someone else is served.
    assert_eq!(derive_as(&b, "dave").await, Ok(()));
    let e = ssf_events(&b);
    assert_eq!(e[0]["action"], "stopped");
    assert!(e[0]["delay_seconds"].as_i64().unwrap() >= 30, "{e:?}");
}

#[tokio::test]
async fn an_email_subject_maps_only_through_a_verified_email_of_a_derive() {
    let (b, mut tx, _secrets) = push_broker();
    let with_email = |sub: &str, email: &str, verified: bool| {
        let mut c = b.subject_claims(sub);
        c["email"] = email.into();
        c["email_verified"] = verified.into();
        b.subject_with(&c)
    };
    // Erin's address is verified, Frank's (the same address) is not.
    assert_eq!(
        derive_with(&b, &with_email("erin", "erin@Example.com", true)).await,
        Ok(())
    );
    assert_eq!(
        derive_with(&b, &with_email("frank", "erin@example.com", false)).await,
        Ok(())
    );
    let subject = json!({"format": "email", "email": "erin@example.com"});
    // The address is written off the derive path: a SET may come first.
    wait_until(
        std::time::Duration::from_secs(10),
        "the SET maps erin",
        || {
            let (set, _) = tx.set("session-revoked", &subject, json!({}));
            let b = &b;
            let pushed = std::thread::scope(|s| {
                s.spawn(|| {
                    tokio::runtime::Runtime::new()
                        .unwrap()
                        .block_on(push(b, &set))
                })
                .join()
                .unwrap()
            });
            pushed.0 == 202
                && ssf_events(b)
                    .last()
                    .is_some_and(|e| e["action"] == "stopped")
        },
    );
    assert_eq!(
        derive_with(&b, &with_email("erin", "erin@example.com", true)).await,
        Err(STOPPED.into())
    );
    assert_eq!(
        derive_with(&b, &with_email("frank", "erin@example.com", false)).await,
        Ok(()),
        "an unverified email mapped"
    );
    // identifier-recycled drops the address: a later SET for it maps no one.
    let (set, _) = tx.set("identifier-recycled", &subject, json!({}));
    assert_eq!(push(&b, &set).await.0, 202);
    assert_eq!(ssf_events(&b).last().unwrap()["action"], "updated");
    let (set, _) = tx.set("session-revoked", &subject, json!({}));
    assert_eq!(push(&b, &set).await.0, 202);
    assert_eq!(ssf_events(&b).last().unwrap()["action"], "unmapped");
}

#[tokio::test]
async fn ssf_stream_create_verify_and_status_keep_the_stream_id() {
    let (b, mut tx, _secrets) = push_broker();
    let run_with = |action: &str, more: &[&str]| {
        let out = std::process::Command::new(bin())
            .args(["ssf", "stream", action, "--config"])
            .arg(&b.config)
            .args(["--transmitter", "idp"])
            .args(more)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let run = |action: &str| run_with(action, &[]);
    // Verify or status before any stream: refused, naming the command to run.
    for action in ["verify", "status"] {
        let (code, _, err) = run(action);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("ssf stream create"), "{err}");
    }
    let (code, out, err) = run("create");
    assert_eq!(code, Some(0), "{err}");
    let created: Value = serde_json::from_str(&out).unwrap();
    let id = created["stream"]["stream_id"].as_str().unwrap().to_owned();
    // The transmitter was asked to push here, with the configured value.
    let streams = tx.call(&json!({"cmd": "streams"}));
    let asked = &streams["streams"][0];
    assert_eq!(asked["stream_id"], id.as_str());
    assert_eq!(
        asked["delivery"]["endpoint_url"],
        format!("{}/ssf/events", b.issuer)
    );
    assert_eq!(asked["delivery"]["authorization_header"], PUSH_AUTH);
    let (code, out, err) = run("verify");
    assert_eq!(code, Some(0), "{err}");
    let verified: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(verified["stream"]["stream_id"], id.as_str());
    assert_eq!(verified["verification_requested"], true);
    assert_eq!(tx.call(&json!({"cmd": "streams"}))["verifications"], 1);

    // Status: enabled reads as exit 0.
    let status = |out: &str| serde_json::from_str::<Value>(out).unwrap()["status"].clone();
    let (code, out, err) = run("status");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(status(&out), json!({"status": "enabled"}));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["stream_id"],
        id.as_str()
    );
    // Paused by the transmitter: exit 1, saying what it means; the reason
    // is shown without its control characters.
    tx.call(
        &json!({"cmd": "status", "stream_id": id, "status": "paused", "reason": "upkeep\u{1b}[2J"}),
    );
    let (code, out, err) = run("status");
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        status(&out),
        json!({"status": "paused", "reason": "upkeep[2J"})
    );
    assert!(
        err.contains("is paused, not enabled: the transmitter holds its SETs"),
        "{err}"
    );
    // Set back to enabled with a reason: the transmitter has it, exit 0.
    let (code, out, err) = run_with("status", &["--set", "enabled", "--reason", "back"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(status(&out), json!({"status": "enabled", "reason": "back"}));
    let statuses = tx.call(&json!({"cmd": "streams"}))["statuses"].clone();
    assert_eq!(statuses[&id]["status"], "enabled");
    assert_eq!(statuses[&id]["reason"], "back");
    // A status that is not one: refused before anything is sent.
    let (code, _, err) = run_with("status", &["--set", "on"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        tx.call(&json!({"cmd": "streams"}))["statuses"][&id]["status"],
        "enabled"
    );
}

#[tokio::test]
async fn a_token_with_events_is_never_a_subject_token() {
    let b = TestBroker::start();
    let mut claims = b.subject_claims("alice");
    claims["events"] = json!({
        "https://schemas.openid.net/secevent/caep/event-type/session-revoked": {}
    });
    let refused = derive_with(&b, &b.subject_with(&claims)).await;
    assert!(
        refused.as_ref().is_err_and(|r| r.starts_with("400")),
        "{refused:?}"
    );
    // Control: the same token without `events` is a subject token.
    claims.as_object_mut().unwrap().remove("events");
    assert_eq!(derive_with(&b, &b.subject_with(&claims)).await, Ok(()));
}
