//! Event delivery on replicas (docs/STORE.md, "Audit logs are per
//! instance"): two replicas on one database, each with the same webhook
//! subscription, each deliver their own events, each once; neither
//! delivers the other's, and their cursors (keyed by each replica's own
//! delivery id) do not mix.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use crate::operations::webhooks::{deliveries_reach, secret_file, subscription, Receiver};
use crate::support::postgres::{cluster_or_not_shown, database, replicas_with};
use crate::support::*;

fn ids(b: &TestBroker) -> BTreeSet<String> {
    read_audit(&b.path("audit.jsonl"))
        .iter()
        .filter(|e| e["event"] == "derive.issued")
        .map(|e| format!("msg_{}_{}", e["boot_id"].as_str().unwrap(), e["seq"]))
        .collect()
}

// The cluster's shared guard is held for the whole test, across awaits, so
// that no test stopping the cluster runs meanwhile (as refresh_replicas.rs).
#[allow(clippy::await_holding_lock)]
#[tokio::test]
async fn two_replicas_each_deliver_their_own_events_once() {
    let Some(cluster) = cluster_or_not_shown("webhook delivery on two replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "webhooks_two_replicas");
    let keys = tempfile::tempdir().unwrap();
    let (f, s) = secret_file(keys.path(), "s.whsec");
    let r = Receiver::start(keys.path(), 0, &["--secret".into(), s]);
    let opts = Opts {
        extra_config: subscription(r.port, r#"["derive.issued"]"#, &[&f], ""),
        ..Opts::default()
    };
    let reps = replicas_with(&db, 2, &opts, &|t| t);
    let (a, b) = (&reps[0], &reps[1]);
    let k = key();
    for _ in 0..3 {
        a.derive_ok(&k).await;
    }
    for _ in 0..2 {
        b.derive_ok(&k).await;
    }
    let (from_a, from_b) = (ids(a), ids(b));
    assert_eq!((from_a.len(), from_b.len()), (3, 2));
    assert!(from_a.is_disjoint(&from_b), "each event has its own id");
    let want: BTreeSet<String> = from_a.union(&from_b).cloned().collect();
    r.until(30, |got| {
        got.iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect::<BTreeSet<_>>()
            == want
    })
    .await;
    // A few more of each loop's polls (200 ms): nothing comes twice.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = r.requests();
    assert_eq!(got.len(), 5, "each event delivered once: {got:?}");
    assert!(got
        .iter()
        .all(|x| x["verified"] == serde_json::json!([true])));
    // Each replica counted its own deliveries (once it read the answer).
    deliveries_reach(a, "delivered", 3.0).await;
    deliveries_reach(b, "delivered", 2.0).await;
    // Each replica's delivery id is its own, beside its own audit file.
    let id = |t: &TestBroker| std::fs::read_to_string(t.path("audit.jsonl.delivery-id")).unwrap();
    assert_ne!(id(a), id(b));
}
