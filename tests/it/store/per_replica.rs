//! What stays each replica's own on a shared store, as docs/STORE.md says:
//! the policy file (each replica loads and reloads its own, and reports
//! the hash of the one it decides with) and the derive rate limits (each
//! replica counts only what it served, so N replicas admit N times the
//! configured limit).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::sha256_hex;

use crate::support::postgres::{cluster_or_not_shown, database, replicas, replicas_with};
use crate::support::*;

/// The hash a replica reports where an operator looks: `GET /status` on
/// its admin socket, and its `/metrics` (`credbroker_policy_info{hash}`).
fn reported(b: &TestBroker) -> String {
    let hash = b.policy_hash();
    assert_eq!(
        b.metric(&format!("credbroker_policy_info{{hash=\"{hash}\"}}")),
        Some(1.0),
        "the metrics name the policy /status names"
    );
    hash
}

#[test]
fn each_replica_reports_the_policy_hash_it_loaded() {
    let Some(cluster) = cluster_or_not_shown("the policy hash of each replica") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "policy_hash");
    let r = replicas(&db, 2);
    let (a, b) = (&r[0], &r[1]);
    let first = std::fs::read(a.path("policy.toml")).unwrap();
    let first_hash = sha256_hex(&first);
    assert_eq!(reported(a), first_hash);
    assert_eq!(reported(b), first_hash);

    // A new policy file on B only (a rollout that reached one pod): B
    // reloads it and says so; A, whose file did not change, keeps
    // reporting the old one. The store does not carry policies.
    let mut second = first.clone();
    second.extend_from_slice(b"\n# rolled out to replica B only\n");
    let second_hash = sha256_hex(&second);
    assert_ne!(first_hash, second_hash);
    b.replace_policy(&second);
    b.sighup();
    let start = Instant::now();
    while b.policy_hash() != second_hash {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "replica B did not load its new policy file"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(reported(b), second_hash);
    assert_eq!(
        b.metric(&format!("credbroker_policy_info{{hash=\"{first_hash}\"}}")),
        None,
        "B's metrics no longer name the old policy"
    );
    assert_eq!(reported(a), first_hash, "A still decides with its own file");

    // The same file on A: both report the same hash again.
    a.replace_policy(&second);
    a.sighup();
    let start = Instant::now();
    while a.policy_hash() != second_hash {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "replica A did not load its new policy file"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(reported(a), reported(b));
}

fn per_person_tool_limit(text: String) -> String {
    format!("{text}\n[limits]\nper_peer_per_second = 10000\nper_person_tool_per_second = 1\nburst = 2\n")
}

/// Derives until refused other than for a nonce (at most `max` issued);
/// returns how many were issued and the refusal. With PostgreSQL a replica
/// requires its own DPoP nonce: a `use_dpop_nonce` answer is retried with
/// the nonce it hands out, as a client does.
fn until_refused(b: &TestBroker, body: &serde_json::Value, max: usize) -> (usize, HttpAnswer) {
    let k = key();
    let mut nonce: Option<String> = None;
    let mut issued = 0;
    for _ in 0..2 * max {
        let proof = make_proof(&k, "POST", &b.htu(), now(), None, nonce.as_deref()).unwrap();
        let r = b.post_derive(body, Some(&proof));
        if let Some(n) = r.header("dpop-nonce") {
            nonce = Some(n.to_owned());
        }
        if r.status == 200 {
            issued += 1;
            assert!(issued < max, "{max} derives in a row were all served");
            continue;
        }
        if r.status == 400 && r.error() == "use_dpop_nonce" {
            continue;
        }
        return (issued, r);
    }
    panic!("no answer but nonce challenges");
}

#[test]
fn rate_limits_are_counted_per_replica() {
    let Some(cluster) = cluster_or_not_shown("the rate limits of each replica") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "rate_limits");
    let r = replicas_with(&db, 2, &Opts::default(), &per_person_tool_limit);
    let (a, b) = (&r[0], &r[1]);
    let alice = a.good_body(&a.subject_token("alice"));
    // A's bucket for (alice, notes.read) runs dry. The burst is 2, and the
    // first request's nonce challenge counts against it too (the limit is
    // checked before the proof), so at least one derive is issued.
    let (issued, refusal) = until_refused(a, &alice, 20);
    assert!(issued >= 1, "A served what its burst admits ({issued})");
    assert_eq!(refusal.status, 429, "{}", refusal.raw);
    // B, which counts only what it served, still has a bucket of its own:
    // the same person and tool, at the same moment, are issued there (a
    // shared limit would refuse them), until B's own limit holds too.
    let (on_b, refusal_b) = until_refused(b, &alice, 20);
    assert!(on_b >= 1, "B served a burst of its own ({on_b})");
    assert_eq!(refusal_b.status, 429, "B's own limit holds too");
}
