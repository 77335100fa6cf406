//! PostgreSQL crashing, stopping and running out of connections: no
//! acknowledged write is lost, operations fail closed with `Unavailable`
//! within the statement timeout, and the same store recovers when the
//! server returns.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use credbroker::internals::store::{PgStore, Store, StoreError, Tree};

use crate::support::postgres::{cluster_or_not_shown, database};

/// Retries `op` until it succeeds (the pool drops connections the restart
/// broke, one failure each), for at most `limit`.
fn until_ok<T>(limit: Duration, mut op: impl FnMut() -> Result<T, StoreError>) -> T {
    let start = Instant::now();
    loop {
        match op() {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    matches!(e, StoreError::Unavailable(_)),
                    "a broken connection is Unavailable, got {e:?}"
                );
                assert!(start.elapsed() < limit, "no recovery within {limit:?}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn acknowledged_writes_survive_a_postgres_crash() {
    let Some(cluster) = cluster_or_not_shown("durability across a PostgreSQL crash") else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let db = database(cluster, "durability");
    let store = PgStore::open(&db.settings()).unwrap();
    for i in 0..50u32 {
        store
            .put(Tree::Accounts, format!("k{i}").as_bytes(), &i.to_be_bytes())
            .unwrap();
    }
    assert!(store
        .compare_and_swap(Tree::LinkIndex, b"open", None, Some(b"link-1"))
        .unwrap());
    assert!(store
        .insert_expiring(Tree::Replay, b"jti", b"1", Duration::from_secs(600))
        .unwrap());
    // Killed without a checkpoint: only what was on disk at the
    // acknowledgement survives.
    cluster.restart_immediate();
    let reopened = PgStore::open(&db.settings()).unwrap();
    let all = reopened.scan_prefix(Tree::Accounts, b"k").unwrap();
    assert_eq!(all.len(), 50, "every acknowledged put is there");
    assert_eq!(
        reopened.get(Tree::LinkIndex, b"open").unwrap().as_deref(),
        Some(&b"link-1"[..])
    );
    assert!(
        !reopened
            .insert_expiring(Tree::Replay, b"jti", b"2", Duration::from_secs(600))
            .unwrap(),
        "the replay entry survived: the replay is refused"
    );
    // The store opened before the crash recovers on its own.
    let v = until_ok(Duration::from_secs(10), || store.get(Tree::Accounts, b"k7"));
    assert_eq!(v.as_deref(), Some(&7u32.to_be_bytes()[..]));
}

#[test]
fn postgres_stopped_fails_closed_within_the_statement_timeout_then_recovers() {
    let Some(cluster) = cluster_or_not_shown("PostgreSQL stopped and started again") else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let db = database(cluster, "stopped");
    let settings = db.settings();
    let store = PgStore::open(&settings).unwrap();
    store.put(Tree::State, b"before", b"1").unwrap();
    assert!(store.is_healthy());
    cluster.stop();
    // Every kind of operation: refused as Unavailable, within the
    // statement timeout (plus scheduling slack), never an answer.
    type Op<'a> = Box<dyn Fn() -> Result<(), StoreError> + 'a>;
    let ops: Vec<(&str, Op<'_>)> = vec![
        (
            "get",
            Box::new(|| store.get(Tree::State, b"before").map(drop)),
        ),
        ("put", Box::new(|| store.put(Tree::State, b"during", b"x"))),
        (
            "compare_and_swap",
            Box::new(|| {
                store
                    .compare_and_swap(Tree::State, b"cas", None, Some(b"x"))
                    .map(drop)
            }),
        ),
        (
            "insert_expiring",
            Box::new(|| {
                store
                    .insert_expiring(Tree::Replay, b"j", b"x", Duration::from_secs(60))
                    .map(drop)
            }),
        ),
    ];
    for (name, op) in &ops {
        let start = Instant::now();
        let r = op();
        let took = start.elapsed();
        assert!(
            matches!(r, Err(StoreError::Unavailable(_))),
            "{name} with PostgreSQL stopped: {r:?}"
        );
        assert!(
            took <= settings.statement_timeout + Duration::from_millis(500),
            "{name} answered after {took:?}"
        );
    }
    assert!(!store.is_healthy(), "unhealthy while stopped");
    cluster.start_again();
    // The same store, not reopened: recovers.
    until_ok(Duration::from_secs(10), || {
        store.put(Tree::State, b"after", b"2")
    });
    assert_eq!(
        store.get(Tree::State, b"before").unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert!(store.is_healthy());
    assert_eq!(
        store.get(Tree::State, b"during").unwrap(),
        None,
        "a refused write did not happen"
    );
}

#[test]
fn a_burst_larger_than_the_pool_is_served_in_turn() {
    let Some(cluster) = cluster_or_not_shown("a burst over a PostgreSQL pool") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "burst");
    let mut settings = db.settings();
    settings.pool_size = 2;
    settings.statement_timeout = Duration::from_secs(5);
    let store = PgStore::open(&settings).unwrap();
    // 24 threads at once, each writing and reading its own rows: twelve
    // callers for every pooled connection. Each operation is one short
    // statement, so each caller's wait in line is short; a pool that
    // refused whoever found it full (as it did before) fails many of them.
    const THREADS: usize = 24;
    const ROUNDS: usize = 25;
    let barrier = std::sync::Barrier::new(THREADS);
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, barrier) = (&store, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut failed = Vec::new();
                    for r in 0..ROUNDS {
                        let key = format!("burst-{t}-{r}");
                        let put = store.put(Tree::State, key.as_bytes(), b"1");
                        let got = store.get(Tree::State, key.as_bytes());
                        if put.is_err() || !matches!(&got, Ok(Some(v)) if v == b"1") {
                            failed.push(format!("{key}: put {put:?}, get {got:?}"));
                        }
                    }
                    failed
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} operations failed, the first: {:?}",
        failures.len(),
        THREADS * ROUNDS,
        failures.first()
    );
    // Every row landed (counted by the server, not by the store).
    assert_eq!(
        db.sql("SELECT count(*) FROM records WHERE position('\\x6275727374'::bytea in key) = 1"),
        (THREADS * ROUNDS).to_string()
    );
}

#[test]
fn a_pool_kept_busy_by_a_stuck_server_fails_after_its_wait() {
    let Some(cluster) = cluster_or_not_shown("a full PostgreSQL pool") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "pool");
    let mut settings = db.settings();
    settings.pool_size = 1;
    settings.statement_timeout = Duration::from_secs(4);
    let store = PgStore::open(&settings).unwrap();
    store.put(Tree::State, b"row", b"0").unwrap();
    // Another session holds the table, so the one pooled connection waits
    // in the server for longer than a caller waits for the pool.
    let mut holder = db
        .cluster
        .psql(
            &db.name,
            "BEGIN; LOCK TABLE records IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT;",
        )
        .spawn()
        .unwrap();
    crate::support::wait_until(Duration::from_secs(5), "the lock is held", || {
        db.sql("SELECT count(*) FROM pg_locks WHERE relation = 'records'::regclass AND mode = 'AccessExclusiveLock' AND granted")
            == "1"
    });
    std::thread::scope(|s| {
        let blocked = s.spawn(|| store.put(Tree::State, b"row", b"1"));
        // The blocked put holds the only connection once it waits for the
        // lock.
        crate::support::wait_until(Duration::from_secs(5), "the put waits", || {
            db.sql("SELECT count(*) FROM pg_locks WHERE relation = 'records'::regclass AND NOT granted")
                == "1"
        });
        let start = Instant::now();
        let r = store.get(Tree::State, b"row");
        let took = start.elapsed();
        assert!(
            matches!(&r, Err(StoreError::Unavailable(m)) if m.contains("pool stayed busy for 2000 ms")),
            "a pool kept busy: {r:?}"
        );
        // It waited in line (half the statement timeout), and no longer
        // than the statement timeout.
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
            "answered after {took:?}"
        );
        // Positive control: once the lock is released, the put lands and
        // the pool serves again.
        blocked.join().unwrap().unwrap();
    });
    assert!(holder.wait().unwrap().success());
    assert_eq!(
        store.get(Tree::State, b"row").unwrap().as_deref(),
        Some(&b"1"[..])
    );
}

#[test]
fn tls_to_postgres_trusts_only_the_configured_ca() {
    let Some(cluster) = cluster_or_not_shown("TLS to PostgreSQL") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "tls");
    // A CA that did not sign the server's certificate: refused, and the
    // refusal names the certificate problem (nothing sent in the clear).
    let stranger = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "k.pem",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=stranger",
        ])
        .current_dir(stranger.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut wrong = db.settings();
    wrong.ca_file = Some(stranger.path().join("ca.crt"));
    match PgStore::open(&wrong) {
        Err(StoreError::Unavailable(m)) => {
            for part in [
                "TLS handshake failed",
                "invalid peer certificate",
                "postgres.tls.ca_file",
            ] {
                assert!(m.contains(part), "{part:?} is not in: {m}");
            }
        }
        other => panic!("a server certificate from another CA was accepted: {other:?}"),
    }
    // Positive control: the server's CA, and the connection is TLS.
    let mut right = db.settings();
    right.ca_file = Some(cluster.ca_file.clone());
    let store = PgStore::open(&right).unwrap();
    store.put(Tree::State, b"over-tls", b"1").unwrap();
    assert_eq!(
        store.get(Tree::State, b"over-tls").unwrap().as_deref(),
        Some(&b"1"[..])
    );
    let tls_sessions = db.sql(&format!(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE s.ssl AND a.datname = '{}' AND a.application_name = 'credbroker'",
        db.name
    ));
    assert_ne!(tls_sessions, "0", "the store's sessions use TLS");
}
