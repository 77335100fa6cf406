//! Issue 40 item 1 on PostgreSQL: three replicas on one database behind
//! the forwarder, a front that picks a replica per request, each one's
//! proxy following every change of the shared key ring (learnt from the
//! store, not from its own rotation, on the replicas that did not rotate).
//! Ten rotations, scheduled and emergency, made on each replica in turn,
//! with every proxy idle between the rotation and the activation; then
//! proxied calls through the front, each challenged by one replica and
//! retried with the nonce at the next, until every replica has challenged
//! and served one; after an emergency rotation, a token signed by the
//! withdrawn key is refused by every replica.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use super::proxy_replay::{connected_with, post, post_picked, posts, proof};
use crate::proxy::rotation::{active_kid, kid_of, rotate, short_delay, wait_active};
use crate::support::api_standin::ApiStandin;
use crate::support::postgres::cluster_or_not_shown;
use crate::support::replicas::{Pick, ReplicaSet};
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

/// The replicas behind the front.
const N: usize = 3;

/// A proxied call through the front picking as `pick` says: first without
/// a nonce, which a replica whose verifier takes the token challenges (401
/// `use_dpop_nonce`), then with the nonce; the second answer, and the
/// replicas that answered the first and the second.
async fn served(
    set: &ReplicaSet,
    pick: Pick,
    k: &Es256Key,
    token: &str,
    what: &str,
) -> (u16, String, usize, usize) {
    let (status, nonce, body) = post_picked(set, pick, token, &proof(set, k, token, None)).await;
    assert!(
        status == 401 && body.contains("use_dpop_nonce"),
        "{what}: the token was not taken ({status}): {body}"
    );
    let (status, _, body) =
        post_picked(set, pick, token, &proof(set, k, token, nonce.as_deref())).await;
    let log = set.lb.log();
    let [.., challenged, answered] = &log[..] else {
        panic!("{what}: the front passed on fewer than two requests");
    };
    (status, body, challenged.replica, answered.replica)
}

/// `N` proxied calls with `token` through the front, round-robin: each
/// challenged by one replica and served by the next (the retry lands on
/// another replica), every replica challenging once and serving once, each
/// call reaching the API once.
async fn served_through_front(
    set: &ReplicaSet,
    api: &ApiStandin,
    k: &Es256Key,
    token: &str,
    what: &str,
) {
    let (mut challenged, mut answered) = (Vec::new(), Vec::new());
    for call in 0..N {
        let seen = posts(api);
        let (status, body, c, a) = served(set, Pick::RoundRobin, k, token, what).await;
        assert_eq!(
            status, 201,
            "{what}, call {call} (challenged by {c}, retried at {a}): {body}"
        );
        assert_ne!(
            c, a,
            "{what}, call {call}: the retry landed on the same replica"
        );
        assert_eq!(posts(api), seen + 1, "{what}, call {call}");
        challenged.push(c);
        answered.push(a);
    }
    challenged.sort_unstable();
    answered.sort_unstable();
    let every: Vec<usize> = (0..N).collect();
    assert_eq!(challenged, every, "{what}: every replica challenged");
    assert_eq!(answered, every, "{what}: every replica served");
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
        connected_with(cluster, "replicas_proxy_rotation", N, Some(short_delay)).await;
    let proxy = format!("{}/proxy/acme", set.issuer);
    let a = &set.brokers[0];
    for i in 0..10 {
        let emergency = i % 2 == 1;
        let old = active_kid(a);
        let before = token_by(a, &k, &subject, &proxy, &old).await;
        served_through_front(&set, &api, &k, &before, &format!("rotation {i}, before")).await;
        let new = rotate(&set.brokers[i % N], emergency);
        assert_ne!(new, old);
        for b in &set.brokers {
            wait_active(b, &new).await;
        }
        // Idle a few more ticks: each replica replaces its ring on each.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let after = token_by(a, &k, &subject, &proxy, &new).await;
        if emergency {
            for to in 0..N {
                let seen = posts(&api);
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
        }
        // The control: the new key's token, challenged (the token
        // verified) and served at every replica.
        served_through_front(
            &set,
            &api,
            &k,
            &after,
            &format!("rotation {i} (emergency: {emergency}), after, new key {new}"),
        )
        .await;
    }
}
