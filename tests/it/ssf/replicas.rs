//! Push delivery (RFC 8935) on PostgreSQL replicas: a SET pushed to one
//! replica is acted on at the other within the watch's bound, and its
//! repeat there is acknowledged with no second action; a SET pushed while
//! PostgreSQL is down is refused as retriable (503, not acknowledged), and
//! the transmitter's retry after the restart stops the person, with the
//! stop acknowledged before the outage kept.

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::support::postgres::{cluster_or_not_shown, database, OUTLASTS_OUTAGES};

const STOPPED: &str = "403 person_revoked";

/// `revocation.watch_bound` in the first test (the default): a stop stored
/// on one replica applies on the others within it (docs/REVOCATION.md).
const WATCH_BOUND: Duration = Duration::from_secs(10);

/// Waits until `b` refuses `sub` as stopped, at most `most`; returns how
/// long it took. Never asserts another replica at once: its watch moves
/// within the bound, not with the write.
async fn until_stopped(b: &TestBroker, sub: &str, most: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let got = derive_as(b, sub).await;
        if got == Err(STOPPED.into()) {
            return start.elapsed();
        }
        assert!(start.elapsed() < most, "{sub} still {got:?} after {most:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `person.revoked` events for `sub` in every replica's audit file.
fn revoked(replicas: &[TestBroker], sub: &str) -> usize {
    replicas
        .iter()
        .flat_map(|r| read_audit(&r.path("audit.jsonl")))
        .filter(|e| e["event"] == "person.revoked" && e["person_sub"] == sub)
        .count()
}

// reason: the cluster's shared guard is held for the whole test (a
// restart by another test must not land in the middle), across awaits.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread")]
async fn a_set_pushed_to_one_replica_stops_the_person_on_the_other_within_the_bound() {
    let Some(cluster) = cluster_or_not_shown("an SSF push acted on across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "ssf_push_replicas");
    let (replicas, mut tx, _secrets) = push_replicas(&db, 2, "");
    let (a, b) = (&replicas[0], &replicas[1]);
    for r in [a, b] {
        assert_eq!(derive_as(r, "alice").await, Ok(()), "served before");
    }
    let (set, _) = tx.set("session-revoked", &iss_sub(a, "alice"), json!({}));
    assert_eq!(push(a, &set).await.0, 202);
    // A stored and acted on it before acknowledging: refused at once.
    assert_eq!(derive_as(a, "alice").await, Err(STOPPED.into()));
    // B learns it through its watch, within the bound.
    let took = until_stopped(b, "alice", WATCH_BOUND).await;
    eprintln!("alice refused on B {took:?} after A acknowledged (bound {WATCH_BOUND:?})");
    // The transmitter sends the same SET to B (a retry through another
    // replica): acknowledged, no second action.
    assert_eq!(push(b, &set).await.0, 202);
    let at_b: Vec<_> = ssf_events_at(b)
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(at_b, ["duplicate"]);
    assert_eq!(ssf_events_at(a)[0]["action"], "stopped");
    assert_eq!(revoked(&replicas, "alice"), 1, "one stop for one SET");
    // Control: Bob, with no SET, is served on both.
    for r in [a, b] {
        assert_eq!(derive_as(r, "bob").await, Ok(()), "bob");
    }
}

// reason: the cluster's exclusive guard is held for the whole test (it
// stops the server), across awaits.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread")]
async fn a_set_pushed_while_postgres_is_down_is_not_acknowledged_and_its_retry_stops_the_person() {
    let Some(cluster) = cluster_or_not_shown("an SSF push through a PostgreSQL restart") else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let db = database(cluster, "ssf_push_restart");
    // A watch bound past the outage: derives are served through it, so
    // what is refused below is refused for the stop, not the watch.
    let (replicas, mut tx, _secrets) = push_replicas(&db, 1, OUTLASTS_OUTAGES);
    let b = &replicas[0];
    // Acknowledged before the outage: carol.
    let (before, _) = tx.set("session-revoked", &iss_sub(b, "carol"), json!({}));
    assert_eq!(push(b, &before).await.0, 202);
    assert_eq!(derive_as(b, "carol").await, Err(STOPPED.into()));

    cluster.stop();
    let (set, _) = tx.set("session-revoked", &iss_sub(b, "alice"), json!({}));
    let r = reqwest::Client::new()
        .post(format!("{}/ssf/events", b.public))
        .header("authorization", PUSH_AUTH)
        .header("content-type", "application/secevent+jwt")
        .body(set.clone())
        .send()
        .await
        .unwrap();
    let (status, retry) = (r.status().as_u16(), r.headers().get("retry-after").cloned());
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (
            status,
            body["err"].as_str(),
            retry.as_ref().map(|v| v.to_str().unwrap())
        ),
        (503, Some("access_denied"), Some("5")),
        "a SET that cannot be stored is not acknowledged: {body}"
    );
    // Not acted on, and nothing recorded as received.
    assert_eq!(derive_as(b, "alice").await, Ok(()), "stopped unstored");
    assert_eq!(ssf_events_at(b).len(), 1, "{:?}", ssf_events_at(b));

    cluster.start_again();
    // The transmitter's retry: refused as retriable until the store
    // answers again, then acknowledged.
    let start = Instant::now();
    loop {
        let (status, body) = push(b, &set).await;
        if status == 202 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still {status} {body} 30 s after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "the retry was acknowledged {:?} after the restart",
        start.elapsed()
    );
    assert_eq!(derive_as(b, "alice").await, Err(STOPPED.into()));
    // Nothing lost: carol's stop from before the outage is kept, both are
    // in the store's list, and each SET acted once.
    assert_eq!(derive_as(b, "carol").await, Err(STOPPED.into()));
    let (code, list) = b.admin_get("/persons").unwrap();
    assert_eq!(code, 200, "{list}");
    assert!(
        list.contains("\"alice\"") && list.contains("\"carol\""),
        "{list}"
    );
    let actions: Vec<_> = ssf_events_at(b)
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(actions, ["stopped", "stopped"]);
    assert_eq!(revoked(&replicas, "alice"), 1);
    // Control: someone with no SET is served.
    assert_eq!(derive_as(b, "dave").await, Ok(()));
}
