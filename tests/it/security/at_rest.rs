//! S6 and the key at rest, on the files a running broker leaves behind:
//! every directory of the store (`data/`, the audit log in it) and of the
//! keys (`keys/`) is 0700 and every file 0600; the
//! minting key is in no store file in clear (its PKCS#8 document, that
//! document in base64 or base64url, the private scalar, the scalar as a
//! JWK's `d`).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::support::*;

/// Every entry under `p` (directories and files, `p` itself first).
fn walk(p: &Path) -> Vec<PathBuf> {
    let mut out = vec![p.to_path_buf()];
    if p.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for e in entries {
            out.extend(walk(&e));
        }
    }
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A broker that has written everything it writes in normal use: the
/// signing key, a local account, audit events, a derive's replay state;
/// then stopped, so sled has flushed and closed its files.
async fn used_broker() -> TestBroker {
    let mut b = TestBroker::start();
    let (status, body) = b
        .admin_post(
            "/users",
            &serde_json::json!({"name": "alice", "password": "correct horse battery"}).to_string(),
        )
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let k = key();
    for _ in 0..3 {
        b.derive_ok(&k).await;
    }
    b.stop();
    b
}

#[tokio::test]
async fn store_key_and_audit_files_are_0600_in_0700_directories() {
    let b = used_broker().await;
    let mut files = Vec::new();
    let mut bad = Vec::new();
    for root in ["data", "keys"] {
        for p in walk(&b.path(root)) {
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let want = if meta.is_dir() {
                0o700
            } else {
                assert!(
                    meta.is_file(),
                    "{} is neither file nor directory",
                    p.display()
                );
                files.push(p.clone());
                0o600
            };
            if mode(&p) != want {
                bad.push(format!("{} is {:o}, not {want:o}", p.display(), mode(&p)));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    // Positive control: the walk saw the files that hold the secrets (the
    // sled files, the audit log, the master key, the dev
    // issuer's key), so a wrong mode on any of them would have shown.
    let names: Vec<String> = files
        .iter()
        .map(|p| p.strip_prefix(b.dir.path()).unwrap().display().to_string())
        .collect();
    for expected in [
        "data/audit.jsonl",
        "data/db/conf",
        "data/db/db",
        "keys/master.key",
        "keys/dev-issuer.pem",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not walked: {names:?}"
        );
    }
    // The vault's keys are sealed in the store, never files.
    assert!(
        !names.iter().any(|n| n.starts_with("keys/vault/")),
        "a vault key without a provider: {names:?}"
    );
    assert!(
        !b.audit_lines().is_empty(),
        "the audit log holds the derives' events"
    );
}

/// The private scalar of a P-256 PKCS#8 document (RFC 5915's
/// `ECPrivateKey`: version 1, then the 32-byte octet string).
fn private_scalar(pkcs8: &[u8]) -> Vec<u8> {
    let marker = [0x02, 0x01, 0x01, 0x04, 0x20];
    let i = pkcs8
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("an ECPrivateKey in the PKCS#8 document")
        + marker.len();
    pkcs8[i..i + 32].to_vec()
}

#[tokio::test]
async fn minting_key_is_in_no_store_file_in_clear() {
    let mut b = used_broker().await;
    // Open the signing-key record as the broker does, with the master key
    // (which lives in keys/, outside the store).
    let cfg = credbroker::internals::config::Config::load(&b.config).unwrap();
    let master = credbroker::internals::config::read_secret_file(&cfg.master_key_file).unwrap();
    let sealer = credbroker::internals::seal::Sealer::new(&master, &[]).unwrap();
    let (records, der) = {
        let store =
            credbroker::internals::store::SledStore::open(cfg.store.sled_dir().unwrap()).unwrap();
        let records = credbroker::internals::store::Store::scan_prefix(
            &store,
            credbroker::internals::store::Tree::SigningKeys,
            b"",
        )
        .unwrap();
        // One record: the key ring, every key sealed on its own, exactly
        // one of them active (the one that signs).
        assert_eq!(records.len(), 1, "one key-ring record");
        let ring: serde_json::Value = serde_json::from_slice(&records[0].1).unwrap();
        let active: Vec<&serde_json::Value> = ring["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["state"] == "active")
            .collect();
        assert_eq!(active.len(), 1, "one active key: {ring}");
        let kid = active[0]["kid"].as_str().unwrap();
        let sealed =
            credbroker::internals::jose::b64d(active[0]["sealed"].as_str().unwrap(), "sealed")
                .unwrap();
        let der = sealer
            .open(format!("signing_keys/{kid}").as_bytes(), &sealed)
            .unwrap();
        (active[0].clone(), der.expose().clone())
    };
    // It is the key that signs: its kid is the one in the tokens.
    let key = credbroker::internals::jose::Es256Key::from_pkcs8(&der).unwrap();
    b.restart();
    let token = b.derive_ok(&crate::support::key()).await;
    b.stop();
    assert_eq!(
        header_of(token.access_token.expose())["kid"],
        key.kid.as_str(),
        "the record opened is the minting key"
    );

    let d = private_scalar(&der);
    let std = base64::engine::general_purpose::STANDARD;
    let forms: Vec<(&str, Vec<u8>)> = vec![
        ("PKCS#8 DER", der.clone()),
        ("PKCS#8 base64", std.encode(&der).into_bytes()),
        (
            "PKCS#8 base64url",
            credbroker::internals::jose::b64e(&der).into_bytes(),
        ),
        ("PKCS#8 hex", hex::encode(&der).into_bytes()),
        ("private scalar", d.clone()),
        (
            "private scalar base64url (JWK d)",
            credbroker::internals::jose::b64e(&d).into_bytes(),
        ),
        ("private scalar base64", std.encode(&d).into_bytes()),
        ("private scalar hex", hex::encode(&d).into_bytes()),
    ];
    let mut store_bytes = Vec::new();
    for p in walk(&b.path("data")) {
        if p.is_file() {
            store_bytes.extend(std::fs::read(&p).unwrap());
        }
    }
    // Positive control: the bytes read hold the key's sealed record as the
    // store wrote it, so a key written in clear would be found the same way.
    let sealed = records["sealed"].as_str().unwrap();
    assert!(
        contains(&store_bytes, sealed.as_bytes()),
        "the scan reads the signing-key record"
    );
    for (what, needle) in &forms {
        assert!(
            !contains(&store_bytes, needle),
            "the minting key's {what} is in a store file"
        );
    }
}
