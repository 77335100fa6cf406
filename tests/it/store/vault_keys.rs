//! The vault's encryption keys live in the store (one record sealed under
//! the master key): an install from before the record has its key files
//! imported at its first start, a crash at either side of that write loses
//! no key, and replicas on one PostgreSQL database read each other's vault
//! rotations.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
#[cfg(feature = "failpoints")]
use std::sync::Arc;

use credbroker::internals::config::Config;
#[cfg(feature = "failpoints")]
use credbroker::internals::seal::Sealer;
#[cfg(feature = "failpoints")]
use credbroker::internals::secret::SecretBytes;
use credbroker::internals::secret::SecretString;
#[cfg(feature = "failpoints")]
use credbroker::internals::store::{Store, Tree};
use credbroker::internals::subject::Person;
use credbroker::internals::upstream::{AccountInfo, TokenSet};
use credbroker::internals::vault::Vault;

use crate::support::postgres::{cluster_or_not_shown, database, replicas};
use crate::support::*;

const GITHUB: &str = "\n[providers.github]\npreset = \"github\"\nclient_id = \"Iv1\"\nclient_secret_file = \"keys/gh\"\n";
#[cfg(feature = "failpoints")]
const RECORD: &[u8] = b"vault/keyring/v1";

/// Gives the broker of `config` a provider (a vault needs one to hold keys).
fn add_provider(config: &std::path::Path) {
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str(GITHUB);
    std::fs::write(config, text).unwrap();
    let secret = config.parent().unwrap().join("keys/gh");
    std::fs::write(&secret, b"client-secret").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn person(sub: &str) -> Person {
    Person {
        iss: "https://idp.example".into(),
        sub: sub.into(),
    }
}

fn connect(vault: &Vault, sub: &str) {
    let tokens = TokenSet {
        access_token: SecretString::new(format!("gho-token-of-{sub}")),
        token_type: "bearer".into(),
        expires_in: None,
        refresh_token: None,
        scope: Some(vec!["repo".into()]),
    };
    let who = AccountInfo {
        id: format!("id-{sub}"),
        name: format!("octo-{sub}"),
    };
    vault
        .connect_account(
            &person(sub),
            "github",
            "https://github.com",
            &who,
            &tokens,
            &[],
            now(),
        )
        .unwrap();
}

fn cli(config: &std::path::Path, args: &[&str], failpoint: Option<&str>) -> Output {
    let mut c = Command::new(bin());
    c.args(args).arg("--config").arg(config);
    if let Some(p) = failpoint {
        c.env(credbroker::internals::failpoint::ENV, p);
    }
    c.stdin(Stdio::null()).output().unwrap()
}

/// `accounts list` (offline or through the running instance): the listed
/// services and the unreadable records.
fn list(config: &std::path::Path) -> (Vec<String>, Vec<serde_json::Value>) {
    let out = cli(config, &["accounts", "list"], None);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("accounts list: {out:?}"));
    let mut subs: Vec<String> = v["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["person_sub"].as_str().unwrap().to_owned())
        .collect();
    subs.sort();
    (subs, v["unreadable"].as_array().unwrap().clone())
}

/// A sled install as versions before the key record left it: the vault's
/// key as a 0600 file in `[vault] key_dir`, the store naming it current,
/// and accounts sealed under it. Returns the key file.
#[cfg(feature = "failpoints")]
fn legacy_install(config: &std::path::Path) -> std::path::PathBuf {
    let cfg = Config::load(config).unwrap();
    let key = random_bytes(32);
    let id = Sealer::new(&SecretBytes::new(key.clone()), &[])
        .unwrap()
        .current_key_id();
    std::fs::create_dir_all(&cfg.vault_key_dir).unwrap();
    let file = cfg.vault_key_dir.join(format!("{id}.key"));
    credbroker::internals::config::write_secret_file(&file, &key).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        credbroker::internals::store::SledStore::open(cfg.store.sled_dir().unwrap()).unwrap(),
    );
    // The vault takes the one file as its key; then the record it made is
    // taken away again and the old key state put in its place.
    let vault = Vault::open(store.clone(), config_master(&cfg), &cfg.vault_key_dir).unwrap();
    assert_eq!(vault.keys().current(), id);
    connect(&vault, "alice");
    connect(&vault, "bob");
    drop(vault);
    store.delete(Tree::State, RECORD).unwrap();
    store
        .put(
            Tree::State,
            b"vault/keys",
            format!(r#"{{"current":"{id}","rotating":false}}"#).as_bytes(),
        )
        .unwrap();
    file
}

#[cfg(feature = "failpoints")]
fn has_record(config: &std::path::Path) -> bool {
    let cfg = Config::load(config).unwrap();
    let store =
        credbroker::internals::store::SledStore::open(cfg.store.sled_dir().unwrap()).unwrap();
    store.get(Tree::State, RECORD).unwrap().is_some()
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn an_older_install_keeps_every_account_through_a_crash_at_either_side_of_the_import() {
    use std::os::unix::process::ExitStatusExt;
    for point in ["vault.import.before_write", "vault.import.after_write"] {
        let (dir, config) = prepare(&Opts::default());
        add_provider(&config);
        let file = legacy_install(&config);
        assert!(!has_record(&config));
        // The first start of the new version stops at the point.
        let out = cli(&config, &["accounts", "list"], Some(point));
        assert_eq!(out.status.signal(), Some(6), "{point}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!("failpoint {point}: aborting")),
            "{point}: {out:?}"
        );
        assert_eq!(
            has_record(&config),
            point == "vault.import.after_write",
            "{point}: the record is written exactly at the import's write"
        );
        assert!(file.is_file(), "{point}: the import touched the key file");
        // The next start imports (or finds the import done) and every
        // account opens.
        let (subs, unreadable) = list(&config);
        assert_eq!(subs, ["alice", "bob"], "{point}");
        assert!(unreadable.is_empty(), "{point}: {unreadable:?}");
        assert!(has_record(&config), "{point}");
        // From then on the key directory is not needed: without it the
        // running broker serves every account from the record.
        let cfg = Config::load(&config).unwrap();
        std::fs::rename(&cfg.vault_key_dir, dir.path().join("old-vault-keys")).unwrap();
        let broker = TestBroker::spawn(dir, config.clone(), None);
        let (subs, unreadable) = list(&broker.config);
        assert_eq!(subs, ["alice", "bob"], "{point}: through the instance");
        assert!(unreadable.is_empty(), "{point}: {unreadable:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_vault_rotation_on_one_replica_is_readable_on_another() {
    let Some(cluster) = cluster_or_not_shown("vault keys shared by replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "vault_keys");
    let mut r = replicas(&db, 2);
    for b in r.iter_mut() {
        add_provider(&b.config);
        b.restart();
    }
    let (a, b) = (&r[0], &r[1]);
    // An account in the shared vault, sealed under the first key (which
    // both replicas loaded at start).
    let cfg = Config::load(&a.config).unwrap();
    let store = cfg.store.open().unwrap();
    let vault = Vault::open(store, config_master(&cfg), &cfg.vault_key_dir).unwrap();
    let first = vault.keys().current();
    connect(&vault, "alice");
    drop(vault);
    assert_eq!(list(&b.config), (vec!["alice".to_owned()], vec![]));

    // A rotates: a new key, and A re-wraps the account under it.
    let out = cli(&a.config, &["keys", "rotate-vault"], None);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["done"], true, "{v}");
    assert_eq!(v["rewrapped"], 1, "{v}");
    let second = v["current_key"].as_str().unwrap().to_owned();
    assert_ne!(second, first);

    // B, which never saw the new key at start, opens the record A sealed.
    let out = cli(&b.config, &["accounts", "list"], None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["running"], serde_json::Value::Null, "answered by B: {v}");
    assert_eq!(v["accounts"][0]["key_id"], second.as_str(), "{v}");
    assert_eq!(v["unreadable"], serde_json::json!([]), "{v}");
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn store_copy_carries_the_vault_key_record_to_postgres() {
    let Some(cluster) = cluster_or_not_shown("store copy of the vault keys") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "vault_keys_copy");
    // A sled install with an account; its vault keys exist only in the store.
    let (dir, config) = prepare(&Opts::default());
    add_provider(&config);
    let cfg = Config::load(&config).unwrap();
    let vault = Vault::open(
        cfg.store.open().unwrap(),
        config_master(&cfg),
        &cfg.vault_key_dir,
    )
    .unwrap();
    connect(&vault, "alice");
    drop(vault);
    assert!(!cfg.vault_key_dir.exists());

    let text = std::fs::read_to_string(&config).unwrap();
    let pg = dir.path().join("postgres.toml");
    std::fs::write(
        &pg,
        format!(
            "{}\n{}",
            text.replace("store = \"data\"\n", "audit_log = \"audit.jsonl\"\n"),
            db.config_toml("auto")
        ),
    )
    .unwrap();
    let out = cli(&pg, &["store", "migrate"], None);
    assert!(out.status.success(), "{out:?}");
    let out = Command::new(bin())
        .args(["store", "copy", "--from"])
        .arg(dir.path().join("data"))
        .arg("--to")
        .arg(&pg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // On PostgreSQL the account opens: the key record came along.
    let (subs, unreadable) = list(&pg);
    assert_eq!(subs, ["alice"]);
    assert!(unreadable.is_empty(), "{unreadable:?}");
    let rows = db.sql(
        "SELECT count(*) FROM records WHERE tree = 'state' AND key = 'vault/keyring/v1'::bytea",
    );
    assert_eq!(rows, "1", "the record is a row of the database");
}
