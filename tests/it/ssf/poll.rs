//! Poll delivery (RFC 8936): two replicas on PostgreSQL, one lease, so each
//! SET is taken once and acknowledged after it is stored and acted on.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::support::postgres::{cluster_or_not_shown, database, replicas_with};

/// How long a stop written by one replica may take to reach another's
/// in-memory list (the watch's bound, with the slack of a loaded machine).
const WATCH_BOUND: Duration = Duration::from_secs(4);

// reason: the cluster's shared guard is held for the whole test (a
// restart by another test must not land in the middle), across awaits.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_poll_one_stream_under_one_lease() {
    let Some(cluster) = cluster_or_not_shown("SSF poll under a lease across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "ssf_poll");
    // Every replica's issuer is the quick start's default one.
    let issuer = "http://127.0.0.1:0".to_owned();
    let mut tx = Tx::start(&issuer);
    let secrets = tempfile::tempdir().unwrap();
    secret_file(&secrets.path().join("ssf-management"), MANAGEMENT);
    let table = transmitter_toml(&tx, &issuer, "poll", secrets.path());
    let replicas = replicas_with(&db, 2, &Opts::default(), &|text| format!("{text}\n{table}"));
    let b = &replicas[0];
    assert_eq!(b.issuer, issuer, "the replicas' issuer");

    // The stream, made through replica A's admin socket, is in the store.
    let out = std::process::Command::new(bin())
        .args(["ssf", "stream", "create", "--config"])
        .arg(&b.config)
        .args(["--transmitter", "idp"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A bad SET (another audience) and good ones for three people.
    let (bad, bad_jti) = tx.set(
        "session-revoked",
        &iss_sub(b, "alice"),
        json!({"aud": "https://someone-else.example"}),
    );
    tx.call(&json!({"cmd": "queue", "set": bad, "jti": bad_jti}));
    let mut jtis = Vec::new();
    for sub in ["alice", "bob", "carol"] {
        let (set, jti) = tx.set("session-revoked", &iss_sub(b, sub), json!({}));
        tx.call(&json!({"cmd": "queue", "set": set, "jti": jti}));
        jtis.push(jti);
    }
    wait_until(Duration::from_secs(20), "every SET acknowledged", || {
        tx.call(&json!({"cmd": "polls"}))["pending"] == 0
    });
    let polls = tx.call(&json!({"cmd": "polls"}));
    let mut acked: Vec<String> = serde_json::from_value(polls["acked"].clone()).unwrap();
    acked.sort();
    jtis.sort();
    assert_eq!(acked, jtis, "each good SET acknowledged once");
    assert_eq!(
        polls["errs"][&bad_jti]["err"], "invalid_audience",
        "{polls}"
    );
    // One replica took them all: the other wrote no ssf.event_received.
    let taken: Vec<usize> = replicas
        .iter()
        .map(|r| {
            ssf_events_at(r)
                .iter()
                .filter(|e| e["action"] == "stopped")
                .count()
        })
        .collect();
    assert!(
        taken == [3, 0] || taken == [0, 3],
        "both replicas polled: {taken:?}"
    );
    // The replica that took the SETs acted before acknowledging them: it
    // refuses Alice at once; the other learns the stop through its watch,
    // within the bound (tests/it/store/person_stop.rs measures that bound).
    let (taker, other) = if taken[0] == 3 {
        (&replicas[0], &replicas[1])
    } else {
        (&replicas[1], &replicas[0])
    };
    assert_eq!(
        derive_as(taker, "alice").await,
        Err("403 person_revoked".into())
    );
    let start = std::time::Instant::now();
    loop {
        // Judged by when the derive was sent, not when a loaded machine
        // answered it.
        let sent = start.elapsed();
        let got = derive_as(other, "alice").await;
        if got == Err("403 person_revoked".into()) {
            break;
        }
        assert!(
            sent < WATCH_BOUND,
            "the other replica still answers {got:?} after {WATCH_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Control: someone with no SET is served, on both.
    for r in &replicas {
        assert_eq!(derive_as(r, "dave").await, Ok(()));
    }
}
