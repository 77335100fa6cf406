//! The vault's key directory is never written (the keys live in the store;
//! the directory is read only to import an older install's keys), so a
//! broker starts although its `key_dir` is on a path it cannot write (a
//! read-only `/etc` under `ProtectSystem=strict`, a Secret mount): the
//! regression of issue 15, `vault: cannot create the vault key directory`.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::PermissionsExt;

use crate::support::broker::{prepare, Opts, TestBroker};
use credbroker::internals::jose::Es256Key;

const GITHUB: &str = "[providers.github]\npreset = \"github\"\nclient_id = \"Iv1\"\nclient_secret_file = \"keys/gh\"\n";

/// Appends `[vault] key_dir = ...` (and `more`) to the config.
fn with_key_dir(config: &std::path::Path, key_dir: &std::path::Path, more: &str) {
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str(&format!(
        "\n[vault]\nkey_dir = {:?}\n{more}",
        key_dir.display().to_string()
    ));
    std::fs::write(config, text).unwrap();
    if !more.is_empty() {
        let secret = config.parent().unwrap().join("keys/gh");
        std::fs::write(&secret, b"client-secret").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

/// Whether the stopped broker's store holds the vault key record.
fn has_key_record(b: &mut TestBroker) -> bool {
    b.stop();
    let cfg = credbroker::internals::config::Config::load(&b.config).unwrap();
    let store =
        credbroker::internals::store::SledStore::open(cfg.store.sled_dir().unwrap()).unwrap();
    credbroker::internals::store::Store::get(
        &store,
        credbroker::internals::store::Tree::State,
        b"vault/keyring/v1",
    )
    .unwrap()
    .is_some()
}

// The key directory sits under a regular file: no one, root included, can
// create it (root ignores the mode bits, so a 0500 parent would prove
// nothing where CI runs as root). The vault's keys live in the store, so
// the directory is never written, with or without providers.
#[tokio::test]
async fn no_provider_starts_with_an_unwritable_vault_key_dir_and_creates_nothing() {
    let (dir, config) = prepare(&Opts::default());
    let blocker = dir.path().join("read-only");
    std::fs::write(&blocker, b"not a directory").unwrap();
    with_key_dir(&config, &blocker.join("vault"), "");
    let mut broker = TestBroker::spawn(dir, config, None);
    let key = Es256Key::generate().unwrap().0;
    broker.derive_ok(&key).await;
    assert!(blocker.is_file(), "the key directory's parent was replaced");
    assert!(
        !has_key_record(&mut broker),
        "a vault key was made without a provider"
    );

    // With a provider configured the key is created, in the store: the
    // same unwritable path is not touched.
    let (dir, config) = prepare(&Opts::default());
    let blocker = dir.path().join("read-only");
    std::fs::write(&blocker, b"not a directory").unwrap();
    with_key_dir(&config, &blocker.join("vault"), GITHUB);
    let mut broker = TestBroker::spawn(dir, config, None);
    broker.derive_ok(&key).await;
    assert!(blocker.is_file(), "the key directory's parent was replaced");
    assert!(has_key_record(&mut broker), "no vault key in the store");
}
