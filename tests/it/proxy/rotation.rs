//! The proxy follows every change of the signing key ring (issue 40 item
//! 1). It keeps one verifier per proxy address, rebuilt when the ring
//! changes; it used to tell a change by the ring's address, and a new ring
//! allocated where a freed one had been looked unchanged: after a rotation
//! the proxy refused tokens signed with the new key ("token signing key is
//! unknown"), and after an emergency rotation it kept accepting tokens
//! signed with the withdrawn key. Ten rotations, scheduled and emergency,
//! each with the proxy idle while the ring changes (the key ring's tick
//! replaces the ring every second), then one proxied call each.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use credbroker::internals::jose;

use super::{refusal, ProxyEnv};
use crate::support::services::ProviderOpts;
use crate::support::TestBroker;

/// The activation delay of these tests (s): the key ring's tick is then
/// 1 s, so the ring is replaced several times while the proxy is idle.
pub(crate) const DELAY: u64 = 2;

pub(crate) fn short_delay(t: String) -> String {
    t.replace("[keys]\n", "[keys]\nactivation_delay = 2\n")
}

pub(crate) fn kid_of(token: &str) -> String {
    jose::parse(token, 8 * 1024).unwrap().header.kid.unwrap()
}

pub(crate) fn active_kid(b: &TestBroker) -> String {
    let (code, body) = b.admin_get("/status").unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["active_kid"].as_str().unwrap().to_owned()
}

/// Rotates through the admin socket (`emergency` or not): the new `kid`.
pub(crate) fn rotate(b: &TestBroker, emergency: bool) -> String {
    let (code, out) = b
        .admin_post("/keys/rotate", if emergency { "emergency" } else { "" })
        .unwrap();
    assert_eq!(code, 200, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["emergency"], emergency, "{v}");
    v["kid"].as_str().unwrap().to_owned()
}

/// Polls the admin socket (never the proxy) until `kid` signs.
pub(crate) async fn wait_active(b: &TestBroker, kid: &str) {
    let deadline = Instant::now() + Duration::from_secs(DELAY + 15);
    while active_kid(b) != kid {
        assert!(Instant::now() < deadline, "{kid} never became active");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A proxy token, checked to be signed by `kid`.
async fn token_by(p: &ProxyEnv, kid: &str) -> String {
    let t = p.token("acme.read", "triage").await;
    assert_eq!(kid_of(&t), kid, "the token is not signed by the active key");
    t
}

/// Ten rotations on one broker: even ones scheduled, odd ones emergency.
/// Before each, a proxied call with the current key (the proxy's verifier
/// is then built from the ring of that moment); then no proxied call until
/// the new key signs and the ring has been replaced by a few more ticks.
/// After a scheduled rotation, a token signed by the new key is served;
/// after an emergency one, a token signed by the withdrawn key is refused
/// with 401 and nothing reaches the API, and a token by the new key is
/// served (the positive control).
async fn ten_rotations(p: &ProxyEnv) {
    let b = &p.env.broker;
    let mut refused_upstream = 0;
    for i in 0..10 {
        let emergency = i % 2 == 1;
        let old = active_kid(b);
        let before = token_by(p, &old).await;
        let r = p.call(&before, "GET", "/user", None).await;
        assert_eq!(r.status(), 200, "rotation {i}: the call before");
        let new = rotate(b, emergency);
        assert_ne!(new, old);
        wait_active(b, &new).await;
        // Idle a few more ticks: the ring is replaced on each.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let seen = p.api.records().len();
        if emergency {
            let r = p.call(&before, "GET", "/user", None).await;
            let (status, body) = refusal(r).await;
            assert_eq!(
                (status, body["error"].as_str()),
                (401, Some("invalid_token")),
                "rotation {i} (emergency): a token signed by the withdrawn key {old} was not refused: {body}"
            );
            assert_eq!(
                p.api.records().len(),
                seen,
                "rotation {i}: it went upstream"
            );
            refused_upstream += 1;
        }
        let after = token_by(p, &new).await;
        let r = p.call(&after, "GET", "/user", None).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(
            status,
            200,
            "rotation {i} ({}): a token signed by the new key {new} was not served: {text}",
            if emergency { "emergency" } else { "scheduled" }
        );
        assert_eq!(p.api.records().len(), seen + 1);
    }
    assert_eq!(refused_upstream, 5);
}

#[tokio::test]
async fn the_proxy_follows_ten_rotations_on_sled() {
    let p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            edit_config: Some(short_delay),
            ..ProviderOpts::default()
        },
    )
    .await;
    ten_rotations(&p).await;
}
