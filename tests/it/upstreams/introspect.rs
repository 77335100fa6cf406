//! Opaque access tokens from the organisation's AS, accepted only through
//! RFC 7662 introspection at that AS (`introspection_endpoint`):
//! oidc-provider issues them with its own AccessToken model and answers
//! for them at its introspection endpoint (features.introspection), so
//! the facts come from the AS, not from the test. The token answers leave
//! out `scope` and `expires_in`: only introspection tells them. Each
//! negative case is followed by its positive control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

use super::exchange::{broker_config, derive, proof, Org};
use crate::support::*;

impl Org {
    fn introspection_endpoint(&self) -> String {
        self.peer.hello["introspection_endpoint"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn opaque(&mut self, on: bool) {
        assert_eq!(
            self.peer.call(&json!({"cmd": "opaque", "on": on}))["ok"],
            true
        );
    }

    fn introspection_mode(&mut self, mode: &str) {
        assert_eq!(
            self.peer
                .call(&json!({"cmd": "introspection", "mode": mode}))["ok"],
            true
        );
    }

    fn introspections(&mut self) -> Value {
        self.peer.call(&json!({"cmd": "introspections"}))
    }
}

/// A broker whose upstream `org` introspects opaque tokens at the AS.
fn introspecting(org: &Org) -> TestBroker {
    let more = format!(
        "introspection_endpoint = \"{}\"",
        org.introspection_endpoint()
    );
    broker_config(org, &org.issuer, &more)
}

fn refused(a: &HttpAnswer, status: u16, reason: &str, said: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.json()["reason"], reason, "{}", a.body);
    let d = a.json()["error_description"].as_str().unwrap().to_owned();
    assert!(d.contains(said), "{said:?} not in {d:?}");
}

/// The positive control: an opaque token, introspected, handed over.
fn opaque_ok(b: &TestBroker, org: &mut Org, k: &Es256Key, subject: &str) -> Value {
    let before = org.introspections()["n"].as_i64().unwrap();
    let a = derive(b, k, subject, Some(&proof(k, &org.token_endpoint)));
    assert_eq!(a.status, 200, "positive control refused: {}", a.body);
    assert_eq!(org.introspections()["n"].as_i64().unwrap(), before + 1);
    a.json()
}

#[tokio::test]
async fn opaque_tokens_are_handed_over_only_as_introspection_shows_them() {
    let mut org = Org::start();
    let b = introspecting(&org);
    let k = key();
    let subject = org.subject(3600);
    org.opaque(true);

    let answer = opaque_ok(&b, &mut org, &k, &subject);
    let token = answer["access_token"].as_str().unwrap();
    assert!(!token.contains('.'), "an opaque token: {token}");
    assert_eq!(answer["token_type"], "DPoP");
    assert_eq!(answer["scope"], "notes:read");
    let ttl = answer["expires_in"].as_i64().unwrap();
    assert!(
        (290..=300).contains(&ttl),
        "expires_in from the introspected exp: {ttl}"
    );
    // Asked as the broker's client (client_secret_basic), for an access token.
    let seen = org.introspections();
    assert_eq!(seen["authorization"], true, "{seen}");
    assert_eq!(seen["token_hint"], "access_token", "{seen}");
    let issued = b
        .audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "derive.issued")
        .unwrap();
    assert_eq!(issued["upstream"], "org");
    assert!(!issued.to_string().contains(token));

    // What introspection shows, each failing one fact a JWT must carry.
    for (mode, intro, said) in [
        ("unbound", "ok", "(an unbound token)"),
        ("other_key", "ok", "bound to another key"),
        (
            "wider_scope",
            "ok",
            "scopes are not exactly the granted scopes",
        ),
        (
            "two_aud",
            "ok",
            "aud is not exactly the configured audience",
        ),
        ("long_life", "ok", "300 s"),
        // A token the AS does not know (never issued by its model).
        ("opaque", "ok", "not active"),
        ("ok", "other_iss", "iss is not the upstream's issuer"),
        ("ok", "bearer", "(an unbound token)"),
    ] {
        org.mode(mode);
        org.introspection_mode(intro);
        let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
        refused(&a, 502, "upstream_token_rejected", said);
        org.mode("ok");
        org.introspection_mode("ok");
        opaque_ok(&b, &mut org, &k, &subject);
    }
    // One outliving the subject token (300 s for a subject with 120 s left).
    let short = org.subject(120);
    org.mode("past_subject");
    let a = derive(&b, &k, &short, Some(&proof(&k, &org.token_endpoint)));
    refused(
        &a,
        502,
        "upstream_token_rejected",
        "outlives the subject token",
    );
    org.mode("ok");
    let ok = opaque_ok(&b, &mut org, &k, &short);
    assert!(ok["expires_in"].as_i64().unwrap() <= 120, "{ok}");

    // Without introspection_endpoint the same opaque token is refused, and
    // nothing is introspected; the JWT path is unchanged (the control).
    let plain = broker_config(&org, &org.issuer, "");
    let before = org.introspections()["n"].clone();
    let a = derive(&plain, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
    refused(
        &a,
        502,
        "upstream_token_rejected",
        "no introspection_endpoint",
    );
    assert_eq!(org.introspections()["n"], before);
    org.opaque(false);
    let a = derive(&plain, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        org.introspections()["n"],
        before,
        "a JWT is not introspected"
    );
}

#[tokio::test]
async fn introspection_that_cannot_be_had_refuses() {
    let mut org = Org::start();
    let b = introspecting(&org);
    let k = key();
    let subject = org.subject(3600);
    org.opaque(true);
    for (intro, status, reason) in [
        ("error500", 503, "upstream_unavailable"),
        ("hang", 503, "upstream_unavailable"),
        ("redirect", 502, "upstream_bad_answer"),
        ("big", 502, "upstream_bad_answer"),
    ] {
        org.introspection_mode(intro);
        let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
        assert_eq!(a.status, status, "{intro}: {}", a.body);
        assert_eq!(a.json()["reason"], reason, "{intro}: {}", a.body);
        assert!(a.json().get("access_token").is_none());
        if status == 503 {
            assert!(a.header("retry-after").is_some(), "{intro}");
        }
        org.introspection_mode("ok");
        opaque_ok(&b, &mut org, &k, &subject);
    }
}
