//! The schema's versions: a migration run twice changes nothing, an older
//! schema is migrated only when the config allows it, and a schema made
//! for a newer binary is refused with a message saying what to do, while
//! a rollback to a binary the newer schema still admits keeps serving.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::store::{Migrate, PgStore, StoreError};

use std::time::Duration;

use credbroker::internals::jose::Es256Key;

use crate::support::postgres::{cluster_or_not_shown, database, replicas};
use crate::support::serve_expect_exit;

fn refusal(r: Result<PgStore, StoreError>) -> String {
    match r {
        Err(StoreError::Backend(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_migration_run_twice_applies_nothing_the_second_time() {
    let Some(cluster) = cluster_or_not_shown("migrations run twice") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "migrate_twice");
    let store = PgStore::connect(&db.settings()).unwrap();
    assert_eq!(store.schema_version().unwrap().0, 0, "an empty database");
    let first = store.migrate().unwrap();
    assert!(!first.is_empty(), "the first run applies the migrations");
    let (version, _) = store.schema_version().unwrap();
    assert_eq!(version, *first.last().unwrap());
    assert_eq!(store.migrate().unwrap(), Vec::<i32>::new(), "second run");
    assert_eq!(store.schema_version().unwrap().0, version);
    assert_eq!(
        db.sql("SELECT count(*) FROM schema_migrations"),
        first.len().to_string(),
        "one row per migration"
    );
}

/// Issue 40 item 7: `credbroker store migrate` run a second time said,
/// at the default log level, what PostgreSQL answered to `CREATE TABLE IF
/// NOT EXISTS` (a NOTICE that the table exists, skipping). Both runs are
/// quiet on stderr; the first applies, the second applies nothing.
#[test]
fn store_migrate_run_twice_prints_no_notice() {
    let Some(cluster) = cluster_or_not_shown("store migrate twice, on stderr") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "migrate_quiet");
    let (_dir, config) = crate::support::prepare(&crate::support::Opts::default());
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace("store = \"data\"\n", "audit_log = \"audit.jsonl\"\n");
    std::fs::write(&config, format!("{text}\n{}", db.config_toml("manual"))).unwrap();
    let run = || {
        let out = std::process::Command::new(crate::support::bin())
            .args(["store", "migrate", "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            v["applied"].clone(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (what, applied) in [
        ("first", serde_json::json!([1])),
        ("second", serde_json::json!([])),
    ] {
        let (got, stderr) = run();
        assert_eq!(got, applied, "{what} run");
        assert!(
            !stderr.contains("NOTICE") && !stderr.contains("already exists"),
            "{what} run, stderr: {stderr}"
        );
    }
}

#[test]
fn an_unmigrated_database_is_refused_unless_migrate_is_auto() {
    let Some(cluster) = cluster_or_not_shown("migrate = manual refuses an old schema") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "manual");
    let mut manual = db.settings();
    manual.migrate = Migrate::Manual;
    let m = refusal(PgStore::open(&manual));
    assert!(
        m.contains("test.toml: postgres:")
            && m.contains("version 0")
            && m.contains("credbroker store migrate --config test.toml")
            && m.contains("migrate = \"auto\""),
        "{m}"
    );
    // Positive control: with "auto" the instance migrates at start, and
    // then a manual one starts too.
    PgStore::open(&db.settings()).unwrap();
    PgStore::open(&manual).unwrap();
}

#[test]
fn a_schema_made_for_a_newer_binary_is_refused_with_a_clear_message() {
    let Some(cluster) = cluster_or_not_shown("a newer schema refused") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "too_new");
    PgStore::open(&db.settings()).unwrap();
    // What a future binary's migration that old binaries cannot follow
    // would leave.
    db.sql("INSERT INTO schema_migrations (version, oldest_binary) VALUES (9999, '99.0.0')");
    let m = refusal(PgStore::open(&db.settings()));
    assert!(
        m.contains("test.toml: postgres:")
            && m.contains("version 9999")
            && m.contains("needs credbroker 99.0.0 or later")
            && m.contains(&format!("this is credbroker {}", env!("CARGO_PKG_VERSION"))),
        "{m}"
    );
    // A newer schema that still admits this binary (an expand-only
    // migration) is used: a rolling update's old replicas keep running.
    db.sql("UPDATE schema_migrations SET oldest_binary = '0.0.1' WHERE version = 9999");
    PgStore::open(&db.settings()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_rollback_to_a_binary_the_schema_still_admits_keeps_serving() {
    let Some(cluster) = cluster_or_not_shown("a rollback onto a newer schema") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "rollback");
    let mut r = replicas(&db, 1);
    let a = &mut r[0];
    let (key, _) = Es256Key::generate().unwrap();
    a.derive_ok(&key).await;
    let jwks = a.jwks().await;
    a.stop();

    // What a newer binary's expand-only migration leaves behind: a column
    // with a default on a table this binary writes, a table it does not
    // know, and a schema version above its own.
    db.sql(
        "ALTER TABLE records ADD COLUMN written_by text NOT NULL DEFAULT 'newer'; \
         CREATE TABLE newer_feature (id bigint PRIMARY KEY); \
         INSERT INTO schema_migrations (version, oldest_binary) VALUES (9999, '99.0.0')",
    );
    // First as a migration that old binaries cannot follow: the real
    // binary refuses to start, naming the versions and its config file.
    let (status, stderr) = serve_expect_exit(&a.config, Duration::from_secs(30));
    assert!(!status.success(), "{stderr}");
    let config = a.config.display().to_string();
    assert!(
        stderr.contains(&config)
            && stderr.contains("version 9999")
            && stderr.contains("needs credbroker 99.0.0 or later")
            && stderr.contains(&format!("this is credbroker {}", env!("CARGO_PKG_VERSION"))),
        "{stderr}"
    );
    // Then as one that still admits this binary (the rollback the schema's
    // oldest version allows): it starts on the newer schema, with the same
    // key ring, issues, and writes.
    db.sql("UPDATE schema_migrations SET oldest_binary = '0.1.0' WHERE version = 9999");
    a.restart();
    assert_eq!(a.jwks().await, jwks, "the key ring survived the rollback");
    a.derive_ok(&key).await;
    assert_eq!(a.admin_post("/freeze", "on").unwrap().0, 200);
    assert_eq!(a.admin_post("/freeze", "off").unwrap().0, 200);
    a.derive_ok(&key).await;
    assert_eq!(
        db.sql("SELECT max(version) FROM schema_migrations"),
        "9999",
        "the older binary migrated nothing back"
    );
}
