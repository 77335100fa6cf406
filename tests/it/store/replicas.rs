//! Instances of one agent sharing one PostgreSQL database (replicas), with
//! the real binary behind a forwarding proxy (`support/replicas.rs`): one
//! key ring (the JWKS fetched through the forwarder from each replica is
//! identical, before and after a rotation on one of them), and a freeze on
//! one replica holding on the others within a second.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use credbroker::client::Answer;
use credbroker::internals::jose::Es256Key;

use crate::support::postgres::{cluster_or_not_shown, database, replicas_with, OUTLASTS_OUTAGES};
use crate::support::replicas::{Forwarder, ReplicaSet};
use crate::support::services::ProviderOpts;
use crate::support::*;

const JWKS: &str = "/.well-known/jwks.json";

fn kids(jwks: &[u8]) -> BTreeSet<String> {
    let v: serde_json::Value = serde_json::from_slice(jwks).unwrap();
    v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

async fn refused(b: &TestBroker, key: &Es256Key) -> bool {
    matches!(
        b.derive(
            key,
            &b.subject_token("alice"),
            "summarize",
            "notes.read",
            RESOURCE,
            None,
        )
        .await,
        Answer::Refused(_)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn replicas_share_the_key_ring_and_the_freeze() {
    let Some(cluster) = cluster_or_not_shown("replicas on one PostgreSQL database") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "replicas");
    let set = ReplicaSet::start(Forwarder::start(), db, 3, ProviderOpts::default());
    let r = &set.brokers;
    let (a, b, c) = (&r[0], &r[1], &r[2]);
    let (key, _) = Es256Key::generate().unwrap();
    // The JWKS a resource server gets through the load balancer from
    // replica `i`: the bytes, and that replica `i` is what answered.
    let jwks_via = |i: usize| {
        let set = &set;
        async move {
            let before = set.lb.served(JWKS).len();
            let r = set.get_via(i, JWKS).await;
            assert_eq!(r.status(), 200);
            let body = r.bytes().await.unwrap().to_vec();
            let served = set.lb.served(JWKS);
            assert_eq!((served.len(), served.last()), (before + 1, Some(&i)));
            body
        }
    };

    // One key ring: the same JWKS from every replica, and a token from any.
    let jwks = jwks_via(0).await;
    assert_eq!(kids(&jwks).len(), 1);
    for (i, x) in [(1, b), (2, c)] {
        assert_eq!(jwks_via(i).await, jwks, "one JWKS for all, byte for byte");
        x.derive_ok(&key).await;
    }

    // A freeze on B holds on A and C within a second (docs/STORE.md), or
    // four times what B took to write it on a loaded machine
    // (support::slack): a derive sent to them after that is refused.
    let start = Instant::now();
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let bound = slack(start.elapsed());
    for (name, x) in [("A", a), ("C", c)] {
        let what = format!("the freeze reaching {name}");
        holds_by(start, bound, &what, || refused(x, &key)).await;
    }
    eprintln!("freeze on every replica after {:?}", start.elapsed());
    // A writer to the database without the master key lifts nothing: not
    // with the earlier unsigned "not frozen", not by deleting the record.
    // For 2 s (twice the time the freeze took to reach every replica
    // above) every replica stays frozen.
    for forged in [
        "UPDATE records SET value = '\\x30'::bytea WHERE tree = 'state' AND key = '\\x66726f7a656e'::bytea",
        "DELETE FROM records WHERE tree = 'state' AND key = '\\x66726f7a656e'::bytea",
    ] {
        set.db.sql(forged);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            for x in [a, b, c] {
                assert!(refused(x, &key).await, "a replica followed: {forged}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Lifted on A: B and C issue again (the positive control).
    let start = Instant::now();
    assert_eq!(a.admin_post("/freeze", "off").unwrap().0, 200);
    let bound = slack(start.elapsed());
    for (name, x) in [("B", b), ("C", c)] {
        let what = format!("the lift reaching {name}");
        holds_by(start, bound, &what, || async { !refused(x, &key).await }).await;
    }

    // A rotation on C is published by every replica within 10 s (the
    // activation delay, 120 s by default, is far longer, so no replica
    // signs with a key another's JWKS lacks).
    let (code, body) = c.admin_post("/keys/rotate", "").unwrap();
    assert_eq!(code, 200, "{body}");
    let rotated = jwks_via(2).await;
    assert_eq!(kids(&rotated).len(), 2, "the new key is published at once");
    assert!(kids(&rotated).is_superset(&kids(&jwks)));
    let start = Instant::now();
    for i in [0, 1] {
        while jwks_via(i).await != rotated {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a replica did not publish the new key within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    eprintln!("rotation on every replica after {:?}", start.elapsed());
    for i in 0..3 {
        assert_eq!(jwks_via(i).await, rotated, "one JWKS again, byte for byte");
    }
    // Each replica's audit file names the instance that wrote it; a sled
    // instance's events have no such field (tests elsewhere read those).
    let instances: BTreeSet<String> = [a, b, c]
        .iter()
        .map(|x| {
            let text = std::fs::read_to_string(x.path("audit.jsonl")).unwrap();
            let names: BTreeSet<String> = text
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    v["instance"].as_str().unwrap().to_string()
                })
                .collect();
            assert_eq!(names.len(), 1, "one instance per file: {names:?}");
            names.into_iter().next().unwrap()
        })
        .collect();
    assert_eq!(instances.len(), 3, "three instances: {instances:?}");
    // Until activation the old key signs, on every replica.
    let old: BTreeSet<String> = kids(&jwks);
    for x in [a, b, c] {
        let t = x.derive_ok(&key).await;
        let jws = credbroker::internals::jose::parse(t.access_token.expose(), 8192).unwrap();
        assert!(old.contains(jws.header.kid.as_deref().unwrap()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn self_derives_and_readiness_survive_postgres_down() {
    let Some(cluster) = cluster_or_not_shown("a replica while PostgreSQL is down") else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let db = database(cluster, "pg_down");
    // The outage stays within the person stop list's watch bound (past it
    // every derive is refused, as store::person_stop shows).
    let opts = Opts {
        extra_config: OUTLASTS_OUTAGES.into(),
        ..Opts::default()
    };
    let r = replicas_with(&db, 1, &opts, &|t| t);
    let a = &r[0];
    let (key, _) = Es256Key::generate().unwrap();
    a.derive_ok(&key).await;
    let readyz = |b: &TestBroker| {
        let (code, body) = b.admin_get("/readyz").unwrap();
        (
            code,
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        )
    };
    assert_eq!(readyz(a).0, 200);
    cluster.stop();
    // Readiness reports the store, but does not take the replica out of
    // the Service (every replica would leave at once), and the `self`
    // path, which needs no store, keeps issuing.
    let (code, body) = readyz(a);
    assert_eq!(body["store"], false, "{body}");
    assert_eq!(code, 200, "{body}");
    a.derive_ok(&key).await;
    // What needs the store fails closed: a freeze cannot be lifted
    // without writing it.
    let (code, _) = a.admin_post("/freeze", "off").unwrap();
    assert_ne!(code, 200, "a write with the store down is not acknowledged");
    cluster.start_again();
    let start = Instant::now();
    while readyz(a).1["store"] != true {
        assert!(start.elapsed() < Duration::from_secs(10), "no recovery");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(a.admin_post("/freeze", "off").unwrap().0, 200);
    a.derive_ok(&key).await;
}
