// reason: test code, where a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::base::jose::{Es256Key, JwkSet};

const ISS: &str = "https://tx.example";
const AUD: &str = "https://broker.example";
const NOW: i64 = 1_800_000_000;
const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

fn expect() -> Expect<'static> {
    Expect {
        issuer: ISS,
        audience: AUD,
        max_bytes: 16 * 1024,
        max_age: 600,
    }
}

/// The CAEP 1.0 session-revoked example (section 3.1.2), with our `iss`,
/// `aud` and times.
fn claims() -> Value {
    json!({
        "iss": ISS, "jti": "24c63fb56e5a2d77a6b512616ca9fa24", "iat": NOW - 5, "aud": AUD,
        "sub_id": {"format": "iss_sub", "iss": "https://idp.example.com/3456789/", "sub": "jane.smith@example.com"},
        "events": { SESSION_REVOKED: {
            "initiating_entity": "policy", "reason_admin": {"en": "Landspeed Policy Violation: C076E82F"},
            "event_timestamp": NOW - 10,
        }},
    })
}

fn sign(k: &Es256Key, header: Value, claims: &Value) -> String {
    let mut h = header.as_object().cloned().unwrap();
    h.entry("kid").or_insert_with(|| k.kid.clone().into());
    k.sign_jws(h, claims).unwrap()
}

fn good(k: &Es256Key, claims: &Value) -> String {
    sign(k, json!({"typ": "secevent+jwt"}), claims)
}

async fn run(k: &Es256Key, token: &str) -> Result<Set, SetError> {
    let set = Arc::new(
        JwkSet::from_json(json!({"keys": [k.public_jwk]}).to_string().as_bytes()).unwrap(),
    );
    check(token, &expect(), NOW, |_| {
        let set = set.clone();
        async move { Some(set) }
    })
    .await
}

#[tokio::test]
async fn the_caep_example_passes_and_each_bad_variant_gets_its_code() {
    let (k, _) = Es256Key::generate().unwrap();
    let (other, _) = Es256Key::generate().unwrap();
    let ok = run(&k, &good(&k, &claims())).await.unwrap();
    assert_eq!(ok.event_type, SESSION_REVOKED);
    assert_eq!(ok.event_time, Some(NOW - 10));
    assert_eq!(ok.subject["sub"], "jane.smith@example.com");

    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims();
        f(&mut c);
        c
    };
    // An unsigned SET (alg none).
    let signed = good(&k, &claims());
    let payload = signed.split('.').nth(1).unwrap();
    let none = format!(
        "{}.{payload}.AA",
        crate::base::jose::b64e(br#"{"alg":"none","typ":"secevent+jwt"}"#),
    );
    let cases: Vec<(String, &str)> = vec![
        (none, "invalid_request"),
        (good(&other, &claims()), "invalid_key"),
        (
            sign(
                &other,
                json!({"typ": "secevent+jwt", "kid": k.kid}),
                &claims(),
            ),
            "invalid_key",
        ),
        (
            sign(&k, json!({"typ": "at+jwt"}), &claims()),
            "invalid_request",
        ),
        (sign(&k, json!({}), &claims()), "invalid_request"),
        (
            good(&k, &with(&|c| c["aud"] = json!("https://other.example"))),
            "invalid_audience",
        ),
        (
            good(&k, &with(&|c| c["iss"] = json!("https://evil.example"))),
            "invalid_issuer",
        ),
        (
            good(&k, &with(&|c| c["iat"] = json!(NOW + 60))),
            "invalid_request",
        ),
        (
            good(&k, &with(&|c| c["iat"] = json!(NOW - 601))),
            "invalid_request",
        ),
        (
            good(
                &k,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("jti");
                }),
            ),
            "invalid_request",
        ),
        (
            good(&k, &with(&|c| c["jti"] = json!(""))),
            "invalid_request",
        ),
        (
            good(
                &k,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("sub_id");
                }),
            ),
            "invalid_request",
        ),
        (
            good(&k, &with(&|c| c["events"] = json!({}))),
            "invalid_request",
        ),
        (
            good(
                &k,
                &with(&|c| c["events"]["https://x.example/e"] = json!({})),
            ),
            "invalid_request",
        ),
        (
            good(&k, &with(&|c| c["padding"] = json!("x".repeat(20_000)))),
            "invalid_request",
        ),
        ("not.a.jws".to_owned(), "invalid_request"),
    ];
    for (i, (token, code)) in cases.iter().enumerate() {
        match run(&k, token).await {
            Err(e) => assert_eq!(e.code(), *code, "case {i}: {e}"),
            Ok(_) => panic!("case {i} passed"),
        }
    }
    // Positive control after them all: the same good SET still passes.
    assert!(run(&k, &good(&k, &claims())).await.is_ok());
    // The drafts' place for the subject (inside the event) is read too.
    let mut older = claims();
    let sub = older.as_object_mut().unwrap().remove("sub_id").unwrap();
    older["events"][SESSION_REVOKED]["subject"] = sub;
    assert_eq!(
        run(&k, &good(&k, &older)).await.unwrap().subject["format"],
        "iss_sub"
    );
}
