//! The README walkthrough, as an orchestrator and a tool would do it.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;
use credbroker::client::Answer;

#[tokio::test]
async fn derive_then_deny_then_restart_keeps_keys() {
    let mut b = TestBroker::start_with(Opts {
        policy: Some(policy_without_approval()),
        ..Opts::default()
    });
    let k = key();
    let t = b.derive_ok(&k).await;
    assert_eq!(t.token_type, "DPoP");
    assert!(t.expires_in <= 300 && t.expires_in > 290);
    assert_eq!(t.scope, "notes.read");

    // Sensitive tool outside its step: denied with the reason.
    match b
        .derive(
            &k,
            &b.subject_token("alice"),
            "summarize",
            "notes.delete",
            RESOURCE,
            None,
        )
        .await
    {
        Answer::Refused(r) => {
            assert_eq!(r.status, 403);
            assert_eq!(r.reason.as_deref(), Some("step_not_allowed"));
        }
        Answer::Issued(_) => panic!("sensitive tool issued outside its step"),
    }
    // Positive control: in its step it works, with its own shorter ttl.
    match b
        .derive(
            &k,
            &b.subject_token("alice"),
            "cleanup_confirmed",
            "notes.delete",
            RESOURCE,
            None,
        )
        .await
    {
        Answer::Issued(t) => assert!(t.expires_in <= 60),
        Answer::Refused(r) => panic!("{r:?}"),
    }

    let jwks_before = reqwest::get(format!("{}/.well-known/jwks.json", b.public))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    b.restart();
    let jwks_after = reqwest::get(format!("{}/.well-known/jwks.json", b.public))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        jwks_before, jwks_after,
        "the signing key survives a restart"
    );
    b.derive_ok(&k).await;
}
