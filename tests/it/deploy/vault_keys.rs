//! The vault's key directory is made only when a provider is configured, so
//! a broker without providers starts although its `key_dir` is on a path it
//! cannot write (a read-only `/etc` under `ProtectSystem=strict`, a Secret
//! mount): the regression of issue 15, `vault: cannot create the vault key
//! directory`.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::broker::{prepare, serve_expect_exit, Opts, TestBroker};
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

// The key directory sits under a regular file: no one, root included, can
// create it (root ignores the mode bits, so a 0500 parent would prove
// nothing where CI runs as root).
#[tokio::test]
async fn no_provider_starts_with_an_unwritable_vault_key_dir_and_creates_nothing() {
    let (dir, config) = prepare(&Opts::default());
    let blocker = dir.path().join("read-only");
    std::fs::write(&blocker, b"not a directory").unwrap();
    with_key_dir(&config, &blocker.join("vault"), "");
    let broker = TestBroker::spawn(dir, config, None);
    let key = Es256Key::generate().unwrap().0;
    broker.derive_ok(&key).await;
    assert!(blocker.is_file(), "the key directory's parent was replaced");
    drop(broker);

    // Positive control: with a provider configured the key is created, so
    // the same unwritable path refuses the start and names the directory.
    let (_dir2, config) = prepare(&Opts::default());
    let blocker = _dir2.path().join("read-only");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let key_dir = blocker.join("vault");
    with_key_dir(&config, &key_dir, GITHUB);
    let (status, err) = serve_expect_exit(&config, Duration::from_secs(20));
    assert!(!status.success());
    assert!(
        err.contains("cannot create the vault key directory")
            && err.contains(&key_dir.display().to_string()),
        "{err}"
    );
    // ... and on a writable path it starts and writes one 0600 key.
    let (dir, config) = prepare(&Opts::default());
    let key_dir = dir.path().join("state/vault-keys");
    with_key_dir(&config, &key_dir, GITHUB);
    let broker = TestBroker::spawn(dir, config, None);
    broker.derive_ok(&key).await;
    let keys: Vec<_> = std::fs::read_dir(&key_dir).unwrap().collect();
    assert_eq!(keys.len(), 1, "one vault key in {}", key_dir.display());
}
