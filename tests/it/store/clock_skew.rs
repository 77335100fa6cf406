//! A replica whose clock is off the database's (issue 40 item 2): two
//! replicas of the real binary on the test PostgreSQL, replica B's clock
//! moved with the `failpoints` build's clock injection
//! (`CREDBROKER_FAILPOINT_CLOCK_OFFSET`). 90 s ahead it refuses derives
//! and proxied calls with 503 `clock_skew` (A, correct, serves), says so in
//! `/status`, the metric and its log; 150 s ahead it does not activate a
//! pending key early, and a rotation made on it activates by the
//! database's clock; 3 s ahead it serves (the control), and a connect link
//! it makes expires by the database's clock, not its own.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::client::Answer;
use serde_json::Value;

use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::replicas::{Forwarder, ReplicaSet};
use crate::support::services::{refused, ProviderOpts, SERVICE};
use crate::support::{key, TestBroker, RESOURCE};

const SHIFT: &str = "CREDBROKER_FAILPOINT_CLOCK_OFFSET";

fn status(b: &TestBroker) -> Value {
    let (code, body) = b.admin_get("/status").unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The database's clock, in Unix seconds.
fn db_now(set: &ReplicaSet) -> i64 {
    set.db
        .sql("SELECT floor(extract(epoch FROM now()))::bigint")
        .parse()
        .unwrap()
}

/// A `self` derive on `b`'s socket.
async fn derive_self(b: &TestBroker, k: &credbroker::internals::jose::Es256Key) -> Answer {
    b.derive(
        k,
        &b.subject_token("alice"),
        "summarize",
        "notes.read",
        RESOURCE,
        None,
    )
    .await
}

/// A proxied call without a token, straight to `b`'s public listener:
/// the status and the body.
async fn proxied(b: &TestBroker) -> (u16, Value) {
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{}/proxy/acme/user", b.public))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_replica_off_the_database_clock_refuses_beyond_the_bound_and_writes_database_time() {
    let Some(cluster) = cluster_or_not_shown("a replica whose clock is off") else {
        return;
    };
    let _shared = cluster.shared();
    let mut set = ReplicaSet::start(
        Forwarder::start(),
        database(cluster, "clock_skew"),
        2,
        ProviderOpts {
            // The proxy is reached, never its upstream.
            extra_config: "api_base = \"http://127.0.0.1:9\"\n".into(),
            ..ProviderOpts::default()
        },
    );
    let k = key();

    // B 90 s ahead: beyond clock.max_skew (5 s).
    set.brokers[1].restart_with_env(&[(SHIFT, "90")]);
    let (a, b) = (&set.brokers[0], &set.brokers[1]);
    assert!(b.log_text().contains("failpoint clock: shifted by 90 s"));
    let clock = &status(b)["clock"];
    assert_eq!(clock["standing"], "beyond_max_skew", "{clock}");
    let offset = clock["offset_seconds"].as_f64().unwrap();
    assert!((offset - 90.0).abs() < 2.0, "{clock}");
    // The gauge is set by the first tick's measurement, just after start.
    crate::support::wait_until(
        std::time::Duration::from_secs(10),
        "the offset gauge",
        || {
            let metrics = b.admin_get("/metrics").unwrap().1;
            metrics
                .lines()
                .find_map(|l| l.strip_prefix("credbroker_clock_offset_seconds "))
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|g| (g - 90.0).abs() < 2.0)
        },
    );
    assert!(
        b.log_text().contains("beyond clock.max_skew"),
        "{}",
        b.log_text()
    );
    let r = refused(derive_self(b, &k).await);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.error, "temporarily_unavailable");
    assert_eq!(r.reason.as_deref(), Some("clock_skew"), "{r:?}");
    let (code, body) = proxied(b).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (503, Some("clock_skew")),
        "{body}"
    );
    // A, on a correct clock, serves the same calls (the proxy call gets as
    // far as its token check).
    let ca = &status(a)["clock"];
    assert_eq!(ca["standing"], "ok", "{ca}");
    a.derive_ok(&k).await;
    let (code, body) = proxied(a).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (401, Some("invalid_token")),
        "{body}"
    );

    // A rotation on A (correct): the new key activates 120 s from now.
    let (code, body) = a.admin_post("/keys/rotate", "").unwrap();
    assert_eq!(code, 200, "{body}");
    let rotated: Value = serde_json::from_str(&body).unwrap();
    let next = rotated["kid"].as_str().unwrap().to_string();
    let active = status(a)["active_kid"].as_str().unwrap().to_string();
    assert_ne!(next, active);
    // B restarted 150 s ahead, past that activation by its own clock: it
    // loads the key ring at start, and on every tick, by the database's
    // clock, so the key stays pending on both (B writing the activation
    // would make it everyone's).
    set.brokers[1].restart_with_env(&[(SHIFT, "150")]);
    let (a, b) = (&set.brokers[0], &set.brokers[1]);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    for (name, r) in [("A", a), ("B", b)] {
        let s = status(r);
        assert_eq!(s["active_kid"], active.as_str(), "{name}: {s}");
        assert_eq!(s["next_kid"], next.as_str(), "{name}: {s}");
    }
    // A rotation on B (after an emergency one on A, so none is pending):
    // the activation time it writes for everyone is the database's now
    // plus the delay (120 s), not B's.
    assert_eq!(a.admin_post("/keys/rotate", "emergency").unwrap().0, 200);
    let before = db_now(&set);
    let (code, body) = b.admin_post("/keys/rotate", "").unwrap();
    assert_eq!(code, 200, "{body}");
    let after = db_now(&set);
    let rotated: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rotated["added"], true, "{rotated}");
    let at = rotated["activates_at"].as_i64().unwrap();
    assert!(
        (before + 120 - 1..=after + 120 + 1).contains(&at),
        "activates_at {at}, the database's now {before}..{after} plus 120 s"
    );

    // B 3 s ahead: within the bound (a warning), and it serves.
    set.brokers[1].restart_with_env(&[(SHIFT, "3")]);
    let b = &set.brokers[1];
    let clock = &status(b)["clock"];
    assert_eq!(clock["standing"], "warn", "{clock}");
    b.derive_ok(&k).await;
    let (code, body) = proxied(b).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (401, Some("invalid_token")),
        "{body}"
    );
    // A connect link B makes expires by the database's clock: its record's
    // `expires` is the database's now plus the link lifetime.
    let before = db_now(&set);
    let r = refused(
        b.derive(
            &k,
            &b.subject_token("alice"),
            "triage",
            "acme.issues",
            SERVICE,
            None,
        )
        .await,
    );
    let after = db_now(&set);
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    let records = set
        .db
        .sql("SELECT convert_from(value, 'UTF8') FROM records WHERE tree = 'links'");
    let link: Value = serde_json::from_str(records.lines().next().unwrap()).unwrap();
    let expires = link["expires"].as_i64().unwrap();
    let ttl = credbroker::internals::connect::LINK_TTL;
    assert!(
        (before + ttl - 1..=after + ttl + 1).contains(&expires),
        "expires {expires}, the database's now {before}..{after} plus {ttl} s"
    );
}
