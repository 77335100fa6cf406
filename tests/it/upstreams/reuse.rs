//! Reuse of exchanged tokens (`upstreams.<name>.reuse_margin`, issue 41
//! item 8) against the real org AS: a token is given again only to the
//! same derive, with its margin left and never past the subject token's
//! end; it is dropped on a freeze and on a policy reload. Each negative
//! case is followed by its positive control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

use super::exchange::{broker_config, claims, exchange_policy, proof, Org, ORG_RESOURCE};
use crate::support::*;

/// A derive of `org.notes` for `scope` with a fresh relayed proof.
fn derive_scope(b: &TestBroker, org: &Org, k: &Es256Key, subject: &str, scope: &str) -> Value {
    let body = json!({
        "subject_token": subject, "step": "summarize", "tool": "org.notes",
        "resource": ORG_RESOURCE, "scope": scope,
        "upstream_proofs": { "org": proof(k, &org.token_endpoint) },
    });
    let a = b.post_derive(&body, Some(&b.proof(k)));
    assert_eq!(a.status, 200, "{}", a.body);
    a.json()
}

fn token(answer: &Value) -> String {
    answer["access_token"].as_str().unwrap().to_owned()
}

fn last_issued(b: &TestBroker) -> Value {
    b.audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "derive.issued")
        .unwrap()
}

#[tokio::test]
async fn a_token_is_given_again_only_to_the_same_derive() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "reuse_margin = \"60s\"");
    let k = key();
    let subject = org.subject(3600);
    let sent = org.exchanges();

    let first = derive_scope(&b, &org, &k, &subject, "notes:read");
    assert_eq!(org.exchanges(), sent + 1);
    assert_eq!(last_issued(&b)["reused"], false);
    // The same derive: the same token, nothing sent, audited as reused.
    let again = derive_scope(&b, &org, &k, &subject, "notes:read");
    assert_eq!(token(&again), token(&first));
    assert_eq!(org.exchanges(), sent + 1, "no call to the AS");
    assert!(again["expires_in"].as_i64().unwrap() <= first["expires_in"].as_i64().unwrap());
    let e = last_issued(&b);
    assert_eq!(e["reused"], true);
    assert_eq!(e["upstream"], "org");
    let c = claims(&token(&first));
    assert_eq!(e["expires_at"], c["exp"]);
    assert_eq!(
        e["jti_sha256"],
        credbroker::internals::jose::sha256_hex(c["jti"].as_str().unwrap().as_bytes())
    );
    assert!(!e.to_string().contains(&token(&first)));
    // Without a relayed proof too: the derive proof shows the same key.
    let body = json!({
        "subject_token": subject, "step": "summarize", "tool": "org.notes",
        "resource": ORG_RESOURCE, "scope": "notes:read",
    });
    let a = b.post_derive(&body, Some(&b.proof(&k)));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(token(&a.json()), token(&first));
    assert_eq!(
        b.metric("credbroker_upstream_exchanges_total{outcome=\"reused\",upstream=\"org\"}"),
        Some(2.0),
        "{}",
        b.metrics()
    );
    assert_eq!(
        b.metric("credbroker_upstream_token_cache_entries"),
        Some(1.0)
    );

    // Another key: not given; its own exchange, bound to that key.
    let k2 = key();
    let other = derive_scope(&b, &org, &k2, &subject, "notes:read");
    assert_ne!(token(&other), token(&first));
    assert_eq!(claims(&token(&other))["cnf"]["jkt"], k2.thumbprint());
    assert_eq!(org.exchanges(), sent + 2);
    // Other scopes: not given (a wider set, then a different one).
    let wider = derive_scope(&b, &org, &k, &subject, "notes:read notes:write");
    assert_ne!(token(&wider), token(&first));
    assert_eq!(claims(&token(&wider))["scope"], "notes:read notes:write");
    let write = derive_scope(&b, &org, &k, &subject, "notes:write");
    assert_ne!(token(&write), token(&first));
    assert_eq!(org.exchanges(), sent + 4);
    // Another person: not given.
    let bob = org.subject_of("bob", 3600);
    let theirs = derive_scope(&b, &org, &k, &bob, "notes:read");
    assert_ne!(token(&theirs), token(&first));
    assert_eq!(claims(&token(&theirs))["sub"], "bob");
    assert_eq!(org.exchanges(), sent + 5);
    // Positive control: the first derive's token is still given.
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &subject, "notes:read")),
        token(&first)
    );
    assert_eq!(org.exchanges(), sent + 5);
}

#[tokio::test]
async fn a_token_is_not_given_under_its_margin_nor_past_the_subject_token() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "reuse_margin = \"200s\"");
    let k = key();
    let sent = org.exchanges();
    // A subject token with 150 s left: the AS's token ends with it, under
    // the 200 s margin, so it is never given again.
    let short = org.subject(150);
    let a = derive_scope(&b, &org, &k, &short, "notes:read");
    let a2 = derive_scope(&b, &org, &k, &short, "notes:read");
    assert_ne!(token(&a), token(&a2));
    assert_eq!(org.exchanges(), sent + 2);
    assert_eq!(last_issued(&b)["reused"], false);

    // A long subject token: its token (300 s) is given again...
    let long = org.subject(3600);
    let first = derive_scope(&b, &org, &k, &long, "notes:read");
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &long, "notes:read")),
        token(&first)
    );
    assert_eq!(org.exchanges(), sent + 3);
    // ...but not to a newer subject token of the same person that ends
    // before it: that derive gets a token ending with its subject token.
    let newer = org.subject(250);
    let bounded = derive_scope(&b, &org, &k, &newer, "notes:read");
    assert_ne!(token(&bounded), token(&first));
    assert!(bounded["expires_in"].as_i64().unwrap() <= 250);
    assert_eq!(org.exchanges(), sent + 4);
    // Positive control: that token replaced the first one, and it is
    // given to the long subject token too (it ends before it).
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &long, "notes:read")),
        token(&bounded)
    );
    assert_eq!(org.exchanges(), sent + 4);
}

#[tokio::test]
async fn a_freeze_and_a_policy_reload_drop_every_kept_token() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "reuse_margin = \"60s\"");
    let k = key();
    let subject = org.subject(3600);
    let first = derive_scope(&b, &org, &k, &subject, "notes:read");
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &subject, "notes:read")),
        token(&first)
    );
    let sent = org.exchanges();

    // Freeze, then lift it: the kept token is gone.
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    assert_eq!(
        b.metric("credbroker_upstream_token_cache_entries"),
        Some(0.0)
    );
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
    let after_freeze = derive_scope(&b, &org, &k, &subject, "notes:read");
    assert_ne!(token(&after_freeze), token(&first));
    assert_eq!(org.exchanges(), sent + 1);
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &subject, "notes:read")),
        token(&after_freeze),
        "kept again after the freeze"
    );

    // A reload (here: the tool loses a scope) drops it too.
    let before = b.policy_hash();
    let narrowed = exchange_policy().replace(
        "scopes = [\"notes:read\", \"notes:write\"]",
        "scopes = [\"notes:read\"]",
    );
    b.replace_policy(narrowed.as_bytes());
    b.sighup();
    wait_until(std::time::Duration::from_secs(10), "the reload", || {
        b.policy_hash() != before
    });
    let after_reload = derive_scope(&b, &org, &k, &subject, "notes:read");
    assert_ne!(token(&after_reload), token(&after_freeze));
    assert_eq!(org.exchanges(), sent + 2);
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &subject, "notes:read")),
        token(&after_reload)
    );
}

#[tokio::test]
async fn the_person_level_stop_drops_that_persons_kept_tokens_only() {
    let mut org = Org::start();
    let b = broker_config(&org, &org.issuer.clone(), "reuse_margin = \"60s\"");
    let k = key();
    let alice = org.subject(3600);
    let bob = org.subject_of("bob", 3600);
    let a1 = derive_scope(&b, &org, &k, &alice, "notes:read");
    let b1 = derive_scope(&b, &org, &k, &bob, "notes:read");
    let sent = org.exchanges();
    let person = |sub: &str| json!({"person_iss": org.issuer, "person_sub": sub}).to_string();
    let (code, body) = b.admin_post("/persons/revoke", &person("alice")).unwrap();
    assert_eq!(code, 200, "{body}");
    // Stopped: refused, whatever is kept.
    let body_alice = json!({
        "subject_token": alice, "step": "summarize", "tool": "org.notes",
        "resource": ORG_RESOURCE, "scope": "notes:read",
    });
    let a = b.post_derive(&body_alice, Some(&b.proof(&k)));
    assert_eq!(a.status, 403, "{}", a.body);
    assert_eq!(a.json()["reason"], "person_revoked");
    // Restored: hers was dropped (a new exchange); Bob's is still given.
    let (code, body) = b.admin_post("/persons/restore", &person("alice")).unwrap();
    assert_eq!(code, 200, "{body}");
    let a2 = derive_scope(&b, &org, &k, &alice, "notes:read");
    assert_ne!(token(&a2), token(&a1));
    assert_eq!(org.exchanges(), sent + 1);
    assert_eq!(
        token(&derive_scope(&b, &org, &k, &bob, "notes:read")),
        token(&b1)
    );
    assert_eq!(org.exchanges(), sent + 1);
}
