//! DPoP replay across replicas: each replica keeps its own replay cache, so
//! with PostgreSQL server nonces are on and bound to the replica that
//! issued them. A derive proof accepted by replica A carries A's nonce, and
//! replica B, whose cache never saw its `jti`, refuses it (and any proof
//! with A's nonce) with `use_dpop_nonce`; with B's own nonce B accepts.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::dpop::make_proof;

use crate::support::postgres::{cluster_or_not_shown, database, replicas};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_derive_proof_accepted_by_one_replica_is_refused_by_another() {
    let Some(cluster) = cluster_or_not_shown("DPoP nonces bound to the replica") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "dpop_nonces");
    let r = replicas(&db, 2);
    let (a, b) = (&r[0], &r[1]);
    assert_eq!(a.htu(), b.htu(), "one issuer URL for both");
    let k = key();
    let body = a.good_body(&a.subject_token("alice"));

    // Nonces are required without `[dpop]` in the config: A asks for one.
    let first = a.post_derive(&body, Some(&a.proof(&k)));
    first.assert_refused(400, "use_dpop_nonce", "A: a proof without a nonce");
    let nonce_a = first.header("dpop-nonce").expect("A's nonce").to_owned();

    // A accepts a proof with its nonce.
    let proof = make_proof(&k, "POST", &a.htu(), now(), None, Some(&nonce_a)).unwrap();
    a.post_derive(&body, Some(&proof))
        .assert_issued("A: a proof with A's nonce");

    // The same proof sent to B: refused, though B's replay cache never saw
    // it; so is a fresh proof with A's nonce.
    let replayed = b.post_derive(&body, Some(&proof));
    replayed.assert_refused(400, "use_dpop_nonce", "B: A's accepted proof replayed");
    let fresh = make_proof(&k, "POST", &b.htu(), now(), None, Some(&nonce_a)).unwrap();
    b.post_derive(&body, Some(&fresh)).assert_refused(
        400,
        "use_dpop_nonce",
        "B: a new proof with A's nonce",
    );
    let nonce_b = replayed.header("dpop-nonce").expect("B's nonce").to_owned();
    assert_ne!(nonce_a, nonce_b, "the replicas issue different nonces");

    // Positive control: B accepts a proof with its own nonce (the same
    // `jti` A accepted would be a replay only on A), and A refuses B's.
    let own = make_proof(&k, "POST", &b.htu(), now(), None, Some(&nonce_b)).unwrap();
    a.post_derive(&body, Some(&own)).assert_refused(
        400,
        "use_dpop_nonce",
        "A: a proof with B's nonce",
    );
    b.post_derive(&body, Some(&own))
        .assert_issued("B: a proof with B's nonce");
    // ... once: B's own replay cache refuses it the second time.
    b.post_derive(&body, Some(&own)).assert_refused(
        400,
        "invalid_dpop_proof",
        "B: its accepted proof again",
    );
    // And the client library follows either replica's challenge by itself.
    a.derive_ok(&k).await;
    b.derive_ok(&k).await;
}
