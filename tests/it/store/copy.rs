//! Moving an install from sled to PostgreSQL with the CLI: `store migrate`
//! (twice), `store copy` (counts verified; a non-empty target refused
//! without --force), and the instance started on PostgreSQL keeps its
//! signing keys.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::*;

fn cli(args: &[&str], config: &Path) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .arg(config)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_sled_install_moves_to_postgres_and_keeps_its_keys() {
    let Some(cluster) = cluster_or_not_shown("store copy from sled to PostgreSQL") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "copy");
    // An install made by the sled code path, used once.
    let mut b = TestBroker::start();
    let (key, _) = credbroker::internals::jose::Es256Key::generate().unwrap();
    b.derive_ok(&key).await;
    let jwks_on_sled = b.jwks().await;
    b.stop();

    let text = std::fs::read_to_string(&b.config).unwrap();
    let pg = b.path("postgres.toml");
    std::fs::write(
        &pg,
        format!(
            "{}\n{}",
            text.replace("store = \"data\"\n", "audit_log = \"audit.jsonl\"\n"),
            db.config_toml("manual")
        ),
    )
    .unwrap();

    // `store migrate`: applies the schema, and a second run applies nothing.
    let (code, out, err) = cli(&["store", "migrate", "--config"], &pg);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["applied"], serde_json::json!([1]), "{out}");
    let (code, out, _) = cli(&["store", "migrate", "--config"], &pg);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["applied"], serde_json::json!([]), "{out}");
    assert_eq!(v["schema_version"], 1);

    let data = b.path("data");
    let from = data.to_str().unwrap();
    let (code, out, err) = cli(&["store", "copy", "--from", from, "--to"], &pg);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verified"], true);
    assert!(v["copied"]["signing_keys"].as_u64().unwrap() >= 1, "{out}");
    // The copied rows are in the database.
    let rows: u64 = db
        .sql("SELECT count(*) FROM records WHERE tree = 'signing_keys'")
        .parse()
        .unwrap();
    assert_eq!(rows, v["copied"]["signing_keys"].as_u64().unwrap());
    // Again: the target is no longer empty.
    let (code, _, err) = cli(&["store", "copy", "--from", from, "--to"], &pg);
    assert_eq!(code, 1);
    assert!(
        err.contains("not empty") && err.contains("--force"),
        "{err}"
    );
    let (code, _, err) = cli(&["store", "copy", "--force", "--from", from, "--to"], &pg);
    assert_eq!(code, 0, "with --force: {err}");

    // The same instance on PostgreSQL: the same keys, and it issues.
    b.config = pg;
    b.restart();
    assert_eq!(b.jwks().await, jwks_on_sled, "the key ring came along");
    b.derive_ok(&key).await;
}
