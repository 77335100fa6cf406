//! Issue 40 item 1 on PostgreSQL: two replicas on one database behind the
//! forwarder, each one's proxy following every change of the shared key
//! ring (learnt from the store, not from its own rotation, on the replica
//! that did not rotate). Ten rotations, scheduled and emergency, made on
//! each replica in turn, with both proxies idle between the rotation and
//! the activation; then one proxied call through each replica.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use super::proxy_replay::{connected_with, post, posts, proof};
use crate::proxy::rotation::{active_kid, kid_of, rotate, short_delay, wait_active};
use crate::support::postgres::cluster_or_not_shown;
use crate::support::replicas::ReplicaSet;
use crate::support::services::issued;
use crate::support::TestBroker;
use credbroker::internals::jose::Es256Key;

/// A proxy token derived at `a`, checked to be signed by `kid`.
async fn token_by(a: &TestBroker, k: &Es256Key, subject: &str, proxy: &str, kid: &str) -> String {
    let t = issued(
        a.derive(k, subject, "open_pr", "acme.pulls", proxy, None)
            .await,
    );
    let t = t.access_token.expose().clone();
    assert_eq!(kid_of(&t), kid, "not signed by the active key");
    t
}

/// A proxied call through replica `to`: first without a nonce, which a
/// replica whose verifier takes the token challenges (401
/// `use_dpop_nonce`), then with the nonce; the second answer.
async fn served(
    set: &ReplicaSet,
    to: usize,
    k: &Es256Key,
    token: &str,
    what: &str,
) -> (u16, String) {
    let (status, nonce, body) = post(set, to, token, &proof(set, k, token, None)).await;
    assert!(
        status == 401 && body.contains("use_dpop_nonce"),
        "{what}: the token was not taken ({status}): {body}"
    );
    let (status, _, body) = post(set, to, token, &proof(set, k, token, nonce.as_deref())).await;
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn every_replica_s_proxy_follows_ten_rotations() {
    let Some(cluster) = cluster_or_not_shown("the proxy across key rotations on replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let (set, api, subject, k, _) =
        connected_with(cluster, "replicas_proxy_rotation", Some(short_delay)).await;
    let proxy = format!("{}/proxy/acme", set.issuer);
    let a = &set.brokers[0];
    for i in 0..10 {
        let emergency = i % 2 == 1;
        let old = active_kid(a);
        let before = token_by(a, &k, &subject, &proxy, &old).await;
        for to in [0, 1] {
            let (status, body) = served(
                &set,
                to,
                &k,
                &before,
                &format!("rotation {i}, replica {to}, before"),
            )
            .await;
            assert_eq!(status, 201, "rotation {i}, replica {to}, before: {body}");
        }
        let new = rotate(&set.brokers[i % 2], emergency);
        assert_ne!(new, old);
        for b in &set.brokers {
            wait_active(b, &new).await;
        }
        // Idle a few more ticks: each replica replaces its ring on each.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let after = token_by(a, &k, &subject, &proxy, &new).await;
        for to in [0, 1] {
            let seen = posts(&api);
            if emergency {
                // The token is checked before the nonce: no nonce needed
                // to be refused.
                let (status, _, body) =
                    post(&set, to, &before, &proof(&set, &k, &before, None)).await;
                assert_eq!(
                    status, 401,
                    "rotation {i}, replica {to}: a token signed by the withdrawn key {old}: {body}"
                );
                assert!(body.contains("\"invalid_token\""), "{body}");
                assert_eq!(posts(&api), seen, "it went upstream");
            }
            // Challenged (the token verified), then served.
            let (status, body) = served(
                &set,
                to,
                &k,
                &after,
                &format!("rotation {i}, replica {to}, after"),
            )
            .await;
            assert_eq!(
                status, 201,
                "rotation {i} (emergency: {emergency}), replica {to}: a token signed by the new key {new}: {body}"
            );
            assert_eq!(posts(&api), seen + 1);
        }
    }
}
