//! A database that cannot be reached: the refusal to start names the
//! address, the cause and the setting to check (issue 40 item 6), for a
//! closed port and for a server that accepts the connection and never
//! answers; and, where the test PostgreSQL runs, for a wrong password and a
//! missing database.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use credbroker::internals::store::PgStore;

use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::{prepare, serve_expect_exit, Opts};

/// A quick-start config whose `[postgres]` table points at `port` on
/// loopback, with a 2 s connect timeout.
fn config_for(port: u16) -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, config) = prepare(&Opts::default());
    let pw = dir.path().join("pg-password");
    std::fs::write(&pw, "not-used\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace("store = \"data\"\n", "audit_log = \"audit.jsonl\"\n");
    let text = format!(
        "{text}\n[postgres]\nhost = \"127.0.0.1\"\nport = {port}\ndatabase = \"credbroker\"\nuser = \"credbroker\"\npassword_file = \"{}\"\nconnect_timeout = \"2s\"\nstatement_timeout = \"2s\"\nmigrate = \"auto\"\n",
        pw.display()
    );
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

#[test]
fn closed_port_names_the_address_the_refusal_and_the_settings() {
    // A port nothing listens on, below the ephemeral range: no other
    // test's listen(0) can take it before the broker connects (one bound
    // on port 0 and closed could be handed straight to one).
    let port = crate::support::free_loopback_port();
    let (_dir, config) = config_for(port);
    let (status, err) = serve_expect_exit(&config, Duration::from_secs(30));
    assert!(!status.success(), "{err}");
    eprintln!("the refusal: {err}");
    let addr = format!("127.0.0.1:{port}");
    for part in [
        addr.as_str(),
        "connection refused",
        "postgres.host",
        "postgres.port",
        &config.display().to_string(),
    ] {
        assert!(err.contains(part), "{part:?} is not in:\n{err}");
    }
}

#[test]
fn silent_server_names_the_address_the_timeout_and_the_setting() {
    // A listener that never accepts: the kernel completes the handshake
    // (into its backlog) and nothing is ever said, as with a hung server.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let (_dir, config) = config_for(port);
    let start = Instant::now();
    let (status, err) = serve_expect_exit(&config, Duration::from_secs(40));
    assert!(!status.success(), "{err}");
    eprintln!("the refusal: {err}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "refused after {:?}",
        start.elapsed()
    );
    let addr = format!("127.0.0.1:{port}");
    for part in [
        addr.as_str(),
        "timed out after 2 s",
        "postgres.connect_timeout",
        "postgres.host",
    ] {
        assert!(err.contains(part), "{part:?} is not in:\n{err}");
    }
    drop(silent);
}

#[test]
fn wrong_password_and_missing_database_name_their_settings() {
    let Some(cluster) = cluster_or_not_shown("PostgreSQL refusing the credentials") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "unreachable");
    let bad = tempfile::tempdir().unwrap();
    let pw = bad.path().join("pw");
    std::fs::write(&pw, "wrong\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut wrong = db.settings();
    wrong.password_file = Some(pw);
    let addr = format!("127.0.0.1:{}", cluster.port);
    let m = PgStore::open(&wrong).expect_err("a wrong password was accepted");
    let m = m.to_string();
    eprintln!("the refusal: {m}");
    for part in [
        addr.as_str(),
        "password authentication failed",
        "postgres.user",
        "postgres.password_file",
    ] {
        assert!(m.contains(part), "{part:?} is not in: {m}");
    }
    let mut missing = db.settings();
    missing.database = format!("{}_missing", db.name);
    let m = PgStore::open(&missing)
        .expect_err("a missing database was opened")
        .to_string();
    eprintln!("the refusal: {m}");
    for part in [addr.as_str(), "does not exist", "postgres.database"] {
        assert!(m.contains(part), "{part:?} is not in: {m}");
    }
    // Positive control: the right settings open the store.
    PgStore::open(&db.settings()).unwrap();
}
