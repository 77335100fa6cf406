use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::infra::store::SledStore;

fn person(sub: &str) -> Person {
    Person {
        iss: "https://idp.example".into(),
        sub: sub.into(),
    }
}

fn tokens(access: &str, refresh: Option<&str>, expires_in: Option<i64>) -> TokenSet {
    TokenSet {
        access_token: SecretString::new(access.into()),
        token_type: "Bearer".into(),
        expires_in,
        refresh_token: refresh.map(|r| SecretString::new(r.into())),
        scope: Some(vec!["repo".into()]),
    }
}

fn info(id: &str) -> AccountInfo {
    AccountInfo {
        id: id.into(),
        name: format!("{id}-name"),
    }
}

struct Env {
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("data")).unwrap());
        Env { dir, store }
    }
    fn key_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("keys/vault")
    }
    fn vault(&self) -> Vault {
        self.open().unwrap()
    }
    fn open(&self) -> Result<Vault, VaultError> {
        Vault::open(self.store.clone(), master(), &self.key_dir())
    }
}

fn master() -> Arc<Sealer> {
    Arc::new(Sealer::new(&crate::base::secret::SecretBytes::new(vec![9; 32]), &[]).unwrap())
}

/// Makes `e` look like an install from before the key record: the vault's
/// one key as a 0600 file in the key directory, the store naming it
/// current (`vault/keys`), and no record. Returns the key id.
fn as_legacy_install(e: &Env, key: &[u8]) -> String {
    let id = Sealer::new(&crate::base::secret::SecretBytes::new(key.to_vec()), &[])
        .unwrap()
        .current_key_id();
    std::fs::create_dir_all(e.key_dir()).unwrap();
    let file = e.key_dir().join(format!("{id}.key"));
    if !file.exists() {
        crate::infra::config::write_secret_file(&file, key).unwrap();
    }
    e.store.delete(Tree::State, b"vault/keyring/v1").unwrap();
    e.store
        .put(
            Tree::State,
            b"vault/keys",
            format!(r#"{{"current":"{id}","rotating":false}}"#).as_bytes(),
        )
        .unwrap();
    id
}

fn connect(v: &Vault, sub: &str, access: &str) {
    v.connect_account(
        &person(sub),
        "github",
        "https://gh",
        &info(sub),
        &tokens(access, Some("rt"), Some(3600)),
        &[],
        1000,
    )
    .unwrap();
}

#[test]
fn accounts_and_allowances_round_trip() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at-alice");
    connect(&v, "bob", "at-bob");
    let a = v.account(&person("alice"), "github").unwrap().unwrap();
    assert_eq!(a.account_name, "alice-name");
    assert_eq!(a.scopes, ["repo"]);
    assert_eq!(a.status, AccountStatus::Active);
    assert_eq!(v.accounts(None).unwrap().len(), 2);
    assert_eq!(v.accounts(Some(&person("alice"))).unwrap().len(), 1);

    v.allow(
        &person("alice"),
        "repo-helper",
        "github",
        &["repo".into()],
        1000,
    )
    .unwrap();
    let w = v
        .allow(
            &person("alice"),
            "repo-helper",
            "github",
            &["read:org".into()],
            1001,
        )
        .unwrap();
    assert_eq!(
        w.scopes,
        ["read:org", "repo"],
        "allowing more keeps what was allowed"
    );
    assert!(v
        .allowance(&person("bob"), "repo-helper", "github")
        .unwrap()
        .is_none());

    let revoke = v.tokens_to_revoke(&person("alice"), "github").unwrap();
    assert_eq!(revoke.len(), 2);
    assert!(v.delete_account(&person("alice"), "github").unwrap());
    assert!(v.account(&person("alice"), "github").unwrap().is_none());
    assert!(v
        .allowance(&person("alice"), "repo-helper", "github")
        .unwrap()
        .is_none());
    assert!(v.account(&person("bob"), "github").unwrap().is_some());
}

/// SECURITY-CASES S14: an allowance is sealed and bound to its person,
/// service and agent; one written in clear (as an earlier release did, or
/// by anyone who can write the store) or moved from another record allows
/// nothing, and allowing again replaces it.
#[test]
fn allowances_are_sealed_and_one_written_without_the_key_allows_nothing() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at-alice");
    let (alice, bob) = (person("alice"), person("bob"));
    v.allow(&alice, "repo-helper", "github", &["repo".into()], 1000)
        .unwrap();
    // Nothing of it is in the stored bytes in clear.
    let key = allowance_key(&alice, "github", "repo-helper");
    let stored = e.store.get(Tree::Allowances, &key).unwrap().unwrap();
    for clear in [&b"repo-helper"[..], b"github", b"repo", b"scopes"] {
        assert!(
            !stored.windows(clear.len()).any(|w| w == clear),
            "{} in the stored allowance",
            String::from_utf8_lossy(clear)
        );
    }

    // A clear allowance for another agent, as the store's other writers
    // (or an earlier release) would write it: it allows nothing.
    let forged = allowance_key(&alice, "github", "other-agent");
    let clear = serde_json::json!({
        "agent": "other-agent", "service": "github", "scopes": ["repo"],
        "created": 1000, "updated": 1000,
    });
    e.store
        .put(
            Tree::Allowances,
            &forged,
            &serde_json::to_vec(&clear).unwrap(),
        )
        .unwrap();
    assert_eq!(v.allowance(&alice, "other-agent", "github").unwrap(), None);
    // A sealed allowance moved to bob's key (or another agent's) does not
    // open there either.
    let moved = allowance_key(&bob, "github", "repo-helper");
    e.store.put(Tree::Allowances, &moved, &stored).unwrap();
    assert_eq!(v.allowance(&bob, "repo-helper", "github").unwrap(), None);
    // The listing shows only the one that opens.
    let listed = v.allowances(&alice, "github").unwrap();
    assert_eq!(
        listed.iter().map(|a| a.agent.as_str()).collect::<Vec<_>>(),
        ["repo-helper"]
    );

    // Positive controls: alice's own allowance opens; allowing the other
    // agent for real replaces the forged record with a sealed one.
    let own = v
        .allowance(&alice, "repo-helper", "github")
        .unwrap()
        .unwrap();
    assert_eq!(own.scopes, ["repo"]);
    let given = v
        .allow(&alice, "other-agent", "github", &["read:org".into()], 1001)
        .unwrap();
    assert_eq!(given.scopes, ["read:org"], "the forged scopes are not kept");
    assert_eq!(
        v.allowance(&alice, "other-agent", "github").unwrap(),
        Some(given)
    );

    // A rotation re-seals the allowances under the new key and removes
    // the one that does not open (bob's moved record).
    let r = v.rotate(None).unwrap();
    assert!(r.done, "{r:?}");
    assert_eq!(r.dropped_allowances, 1);
    assert_eq!(r.rewrapped, 3, "one account and two allowances: {r:?}");
    for (_, raw) in e.store.scan_prefix(Tree::Allowances, b"").unwrap() {
        assert_eq!(
            Sealer::record_key_id(&raw).as_deref(),
            Some(r.current_key.as_str())
        );
    }
    assert!(v
        .allowance(&alice, "repo-helper", "github")
        .unwrap()
        .is_some());
    assert!(e.store.get(Tree::Allowances, &moved).unwrap().is_none());
}

#[test]
fn ciphertext_copied_into_another_record_is_refused_and_reported() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at-alice");
    connect(&v, "mallory", "at-mallory");
    // Copy alice's sealed tokens into mallory's record, as someone with
    // write access to the store file might.
    let ka = account_key(&person("alice"), "github");
    let km = account_key(&person("mallory"), "github");
    let ra: AccountRecord =
        serde_json::from_slice(&e.store.get(Tree::Accounts, &ka).unwrap().unwrap()).unwrap();
    let mut rm: AccountRecord =
        serde_json::from_slice(&e.store.get(Tree::Accounts, &km).unwrap().unwrap()).unwrap();
    rm.sealed = ra.sealed.clone();
    e.store
        .put(Tree::Accounts, &km, &serde_json::to_vec(&rm).unwrap())
        .unwrap();

    let err = v
        .tokens_to_revoke(&person("mallory"), "github")
        .unwrap_err();
    assert!(matches!(err, VaultError::Unreadable { .. }), "{err:?}");
    assert!(err.to_string().contains("copied from another record"));
    let bad = v.verify_all().unwrap();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].1, "mallory");
    // Positive control: alice's own record still opens.
    assert_eq!(
        v.tokens_to_revoke(&person("alice"), "github")
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn flipped_bit_in_sealed_tokens_is_refused() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at-alice");
    let k = account_key(&person("alice"), "github");
    let (raw, mut rec) = stored(&e, "alice");
    flip_a_sealed_bit(&mut rec);
    put_record(&e, &k, &rec);
    assert!(matches!(
        v.tokens_to_revoke(&person("alice"), "github"),
        Err(VaultError::Unreadable { .. })
    ));
    // Positive control: putting the original back makes it open again.
    e.store.put(Tree::Accounts, &k, &raw).unwrap();
    assert!(v.tokens_to_revoke(&person("alice"), "github").is_ok());
}

#[test]
fn keys_of_an_older_install_are_imported_from_the_key_directory() {
    let e = Env::new();
    // An older install: accounts sealed under a key file.
    let key = [5u8; 32];
    let id = as_legacy_install(&e, &key);
    let v = e.vault();
    assert_eq!(v.keys().current(), id, "the file's key is current");
    connect(&v, "alice", "at-a");
    drop(v);
    // The store is back to the old layout (record gone), accounts intact.
    as_legacy_install(&e, &key);
    // A key file readable by others is refused at the import, naming it.
    let file = e.key_dir().join(format!("{id}.key"));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = e.open().unwrap_err();
    assert!(
        err.to_string().contains("0600") && err.to_string().contains(&id),
        "{err}"
    );
    assert!(e
        .store
        .get(Tree::State, b"vault/keyring/v1")
        .unwrap()
        .is_none());
    // Positive control: with the mode fixed the import runs, and after it
    // the account opens without the file (the record holds the key).
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(e.vault());
    std::fs::remove_file(&file).unwrap();
    let v = e.vault();
    let t = v.tokens_to_revoke(&person("alice"), "github").unwrap();
    assert!(t.iter().any(|(s, _)| s.expose() == "at-a"));
    assert_eq!(v.keys().loaded(), vec![id]);
}

#[test]
fn a_new_vault_writes_no_key_file_and_the_record_needs_the_master_key() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at");
    assert!(!e.key_dir().exists(), "a key directory was made");
    let raw = e
        .store
        .get(Tree::State, b"vault/keyring/v1")
        .unwrap()
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.contains(&v.keys().current()), "{text}");
    drop(v);
    // Another master key cannot open the record, and the error says which
    // setting to look at.
    let other =
        Arc::new(Sealer::new(&crate::base::secret::SecretBytes::new(vec![1; 32]), &[]).unwrap());
    let err = Vault::open(e.store.clone(), other, &e.key_dir()).unwrap_err();
    assert!(
        err.to_string().contains("keys.master_key_file")
            && err.to_string().contains("vault/keyring/v1"),
        "{err}"
    );
    // Positive control: the right one opens it.
    assert!(e
        .vault()
        .tokens_to_revoke(&person("alice"), "github")
        .is_ok());
}

#[test]
fn two_vaults_on_one_store_share_a_rotation() {
    // Two replicas, as two vaults over one store.
    let e = Env::new();
    let a = e.vault();
    let b = e.vault();
    connect(&a, "x", "at-x");
    assert!(b.tokens_to_revoke(&person("x"), "github").is_ok());
    let r = a.rotate(None).unwrap();
    assert!(r.done, "{r:?}");
    connect(&a, "y", "at-y");
    // B opens what A sealed under the key A added (it reloads the record
    // when it meets the unknown key id).
    let t = b.tokens_to_revoke(&person("y"), "github").unwrap();
    assert!(t.iter().any(|(s, _)| s.expose() == "at-y"));
    // ... and seals under it from then on.
    connect(&b, "z", "at-z");
    assert_eq!(
        b.account(&person("z"), "github").unwrap().unwrap().key_id,
        Some(r.current_key.clone())
    );
    assert!(a.tokens_to_revoke(&person("z"), "github").is_ok());
}

#[test]
fn rotation_interrupted_half_way_resumes_and_old_keys_open_until_done() {
    let e = Env::new();
    let v = e.vault();
    for s in ["a", "b", "c", "d"] {
        connect(&v, s, &format!("at-{s}"));
    }
    let old = v.keys().current();
    // First run stops after two records (an interruption at a record
    // boundary: each re-wrap is one compare-and-swap).
    let r = v.rotate(Some(2)).unwrap();
    assert!(!r.done);
    assert_eq!((r.rewrapped, r.remaining), (2, 2));
    let new = r.current_key.clone();
    assert_ne!(new, old);
    drop(v);

    // "Restart": both keys load; records under either key open.
    let v = e.vault();
    assert_eq!(
        v.keys().current(),
        new,
        "the new key stays current after a restart"
    );
    let mut under = std::collections::BTreeMap::new();
    for a in v.accounts(None).unwrap() {
        *under.entry(a.key_id.clone().unwrap()).or_insert(0) += 1;
        assert!(v.tokens_to_revoke(&person(&a.person_sub), "github").is_ok());
    }
    assert_eq!(under.get(&old), Some(&2));
    assert_eq!(under.get(&new), Some(&2));
    // New writes during the rotation use the new key.
    connect(&v, "e", "at-e");
    assert_eq!(
        v.account(&person("e"), "github")
            .unwrap()
            .unwrap()
            .key_id
            .as_deref(),
        Some(new.as_str())
    );

    // Resume: no new key is made; the rest is re-wrapped.
    let r = v.rotate(None).unwrap();
    assert!(r.done, "{r:?}");
    assert_eq!(r.current_key, new);
    assert_eq!(r.rewrapped, 2);
    assert_eq!(r.retired_keys, vec![old.clone()]);
    assert!(v
        .accounts(None)
        .unwrap()
        .iter()
        .all(|a| a.key_id.as_deref() == Some(new.as_str())));
    assert!(!v.keys().state(e.store.as_ref()).unwrap().unwrap().rotating);
    drop(v);
    let v = e.vault();
    for s in ["a", "b", "c", "d", "e"] {
        assert!(v.tokens_to_revoke(&person(s), "github").is_ok());
    }
}

#[test]
fn an_import_without_the_current_key_file_gives_an_explicit_error() {
    let e = Env::new();
    let id = as_legacy_install(&e, &[6u8; 32]);
    connect(&e.vault(), "a", "at-a");
    as_legacy_install(&e, &[6u8; 32]);
    let file = e.key_dir().join(format!("{id}.key"));
    let saved = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let err = e.open().unwrap_err();
    assert!(
        err.to_string().contains(&id)
            && err.to_string().contains(&e.key_dir().display().to_string()),
        "the error names the key and the directory: {err}"
    );
    // Positive control: with the file restored, the import runs.
    crate::infra::config::write_secret_file(&file, &saved).unwrap();
    assert!(e.vault().tokens_to_revoke(&person("a"), "github").is_ok());
}

#[test]
fn a_vault_with_records_and_no_keys_does_not_start_fresh() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "a", "at-a");
    drop(v);
    let saved = e
        .store
        .get(Tree::State, b"vault/keyring/v1")
        .unwrap()
        .unwrap();
    e.store.delete(Tree::State, b"vault/keyring/v1").unwrap();
    let err = e.open().unwrap_err();
    assert!(
        err.to_string().contains("holds records but no key state"),
        "{err:?}"
    );
    assert!(e
        .store
        .get(Tree::State, b"vault/keyring/v1")
        .unwrap()
        .is_none());
    // Positive control: with the record restored, it opens.
    e.store
        .put(Tree::State, b"vault/keyring/v1", &saved)
        .unwrap();
    assert!(e.vault().tokens_to_revoke(&person("a"), "github").is_ok());
}

#[test]
fn per_key_encryption_cap_refuses_then_rotation_resets_it() {
    let e = Env::new();
    let v = Vault::open_with_cap(e.store.clone(), master(), &e.key_dir(), 3).unwrap();
    connect(&v, "a", "1");
    connect(&v, "b", "2");
    connect(&v, "c", "3");
    let err = v
        .connect_account(
            &person("d"),
            "github",
            "p",
            &info("d"),
            &tokens("4", None, None),
            &[],
            1,
        )
        .unwrap_err();
    assert!(matches!(err, VaultError::KeyExhausted(_)), "{err:?}");
    // The rotation re-wraps the three under a fresh key (three seals of
    // the new key's three), then new records need another rotation.
    let r = v.rotate(None).unwrap();
    assert!(r.done);
    assert!(v
        .connect_account(
            &person("d"),
            "github",
            "p",
            &info("d"),
            &tokens("4", None, None),
            &[],
            1
        )
        .is_err());
    drop(v);
    let v = Vault::open_with_cap(e.store.clone(), master(), &e.key_dir(), 10).unwrap();
    v.connect_account(
        &person("d"),
        "github",
        "p",
        &info("d"),
        &tokens("4", None, None),
        &[],
        1,
    )
    .unwrap();
}

#[test]
fn full_disk_fails_writes_cleanly_and_keeps_existing_records() {
    let e = Env::new();
    // Writes fail while `full` is set, as on a full disk.
    let full = Arc::new(AtomicBool::new(false));
    let fs = Arc::new(crate::infra::store::Hooked::new(e.store.clone(), {
        let full = full.clone();
        move |_| match full.load(Ordering::SeqCst) {
            true => Err(StoreError::Backend(
                "No space left on device (os error 28)".into(),
            )),
            false => Ok(()),
        }
    }));
    let v = Vault::open(fs.clone(), master(), &e.key_dir()).unwrap();
    connect(&v, "a", "at-a");
    full.store(true, Ordering::SeqCst);
    let err = v
        .connect_account(
            &person("a"),
            "github",
            "p",
            &info("a"),
            &tokens("at-new", Some("rt2"), None),
            &[],
            2,
        )
        .unwrap_err();
    assert!(matches!(err, VaultError::Store(_)), "{err:?}");
    assert!(v.rotate(None).is_err());
    // The old record is intact and opens; no file other than the store's
    // and the key's was left behind (no plaintext temp files).
    full.store(false, Ordering::SeqCst);
    let t = v.tokens_to_revoke(&person("a"), "github").unwrap();
    assert!(t.iter().any(|(s, _)| s.expose() == "at-a"));
    let mut stray = Vec::new();
    for entry in walk(e.dir.path()) {
        let name = entry.to_string_lossy().to_string();
        if !(name.contains("/data/") || name.contains("/keys/vault/")) {
            stray.push(name);
        }
    }
    assert!(stray.is_empty(), "unexpected files: {stray:?}");
}

fn walk(p: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn tuple_keys_do_not_collide() {
    // ("a\0b", "c") and ("a", "b\0c") would collide under a separator.
    assert_ne!(tuple_key(&["a\0b", "c"]), tuple_key(&["a", "b\0c"]));
    assert_eq!(
        split_tuple_key(&tuple_key(&["x", "", "z"])).unwrap(),
        ["x", "", "z"]
    );
    assert!(split_tuple_key(&[0, 5, b'a']).is_none());
}

/// `sub`'s stored record: its raw bytes, and parsed.
fn stored(e: &Env, sub: &str) -> (Vec<u8>, AccountRecord) {
    let k = account_key(&person(sub), "github");
    let raw = e.store.get(Tree::Accounts, &k).unwrap().unwrap();
    let rec = serde_json::from_slice(&raw).unwrap();
    (raw, rec)
}

/// Flips one bit in the middle of `rec`'s sealed tokens.
fn flip_a_sealed_bit(rec: &mut AccountRecord) {
    let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&rec.sealed)
        .unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    rec.sealed = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes);
}

/// Writes `rec` under the account key `k`, as a writer of the store might.
fn put_record(e: &Env, k: &[u8], rec: &AccountRecord) {
    e.store
        .put(Tree::Accounts, k, &serde_json::to_vec(rec).unwrap())
        .unwrap();
}

/// The access token the fast path opens from `sub`'s stored record.
fn kept_access(e: &Env, v: &Vault, sub: &str) -> Result<String, VaultError> {
    let k = account_key(&person(sub), "github");
    let (_, rec) = stored(e, sub);
    let t = v.open_tokens_kept(&k, &rec)?;
    Ok(t.access[0].access_token.clone())
}

#[test]
fn kept_tokens_serve_only_the_sealed_bytes_they_came_from() {
    let e = Env::new();
    let v = e.vault();
    let k = account_key(&person("alice"), "github");
    connect(&v, "alice", "at-1");
    connect(&v, "mallory", "at-mallory");
    assert_eq!(kept_access(&e, &v, "alice").unwrap(), "at-1");
    assert_eq!(v.opened.len(), 1);
    // Reconnected (or refreshed) meanwhile: the new tokens, not the kept.
    connect(&v, "alice", "at-2");
    assert_eq!(kept_access(&e, &v, "alice").unwrap(), "at-2");
    let (good, mut rec) = stored(&e, "alice");
    // A flipped bit, then mallory's sealed text copied in: neither is
    // excused by the tokens kept for alice's record.
    flip_a_sealed_bit(&mut rec);
    put_record(&e, &k, &rec);
    assert!(matches!(
        kept_access(&e, &v, "alice"),
        Err(VaultError::Unreadable { .. })
    ));
    rec.sealed = stored(&e, "mallory").1.sealed;
    put_record(&e, &k, &rec);
    assert!(matches!(
        kept_access(&e, &v, "alice"),
        Err(VaultError::Unreadable { .. })
    ));
    // Positive control: the record as it was opens to its own tokens.
    e.store.put(Tree::Accounts, &k, &good).unwrap();
    assert_eq!(kept_access(&e, &v, "alice").unwrap(), "at-2");
    assert_eq!(kept_access(&e, &v, "mallory").unwrap(), "at-mallory");
}

#[test]
fn a_deleted_account_keeps_no_tokens() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at-alice");
    connect(&v, "bob", "at-bob");
    assert_eq!(kept_access(&e, &v, "alice").unwrap(), "at-alice");
    assert_eq!(kept_access(&e, &v, "bob").unwrap(), "at-bob");
    assert_eq!(v.opened.len(), 2);
    assert!(v.delete_account(&person("alice"), "github").unwrap());
    assert_eq!(v.opened.len(), 1);
    // Listing and checking every record keeps nothing more.
    connect(&v, "carol", "at-carol");
    assert!(v.verify_all().unwrap().is_empty());
    assert_eq!(v.opened.len(), 1);
    assert_eq!(kept_access(&e, &v, "bob").unwrap(), "at-bob");
}

#[test]
fn kept_records_serve_only_the_bytes_they_came_from() {
    let e = Env::new();
    let v = e.vault();
    let k = account_key(&person("alice"), "github");
    connect(&v, "alice", "at-1");
    let read = |v: &Vault| v.account_read(&person("alice"), "github").unwrap().unwrap();
    let first = read(&v);
    assert_eq!(first.account().status, AccountStatus::Active);
    assert_eq!(v.parsed.len(), 1);
    // The same bytes again: the same parse, not a new one.
    assert!(Arc::ptr_eq(&first.parsed, &read(&v).parsed));
    // Another writer marks the account for reconnection: seen at once.
    let (good, mut rec) = stored(&e, "alice");
    rec.status = AccountStatus::ReconnectRequired;
    put_record(&e, &k, &rec);
    let marked = read(&v);
    assert_eq!(marked.account().status, AccountStatus::ReconnectRequired);
    assert!(!Arc::ptr_eq(&first.parsed, &marked.parsed));
    // Bytes that do not parse are refused, whatever was kept.
    e.store.put(Tree::Accounts, &k, b"{not json").unwrap();
    assert!(matches!(
        v.account_read(&person("alice"), "github"),
        Err(VaultError::Corrupt(_))
    ));
    // Positive control: the record as it was reads as it was.
    e.store.put(Tree::Accounts, &k, &good).unwrap();
    assert_eq!(read(&v).account().status, AccountStatus::Active);
    // Deleted: nothing read, nothing kept.
    assert!(v.delete_account(&person("alice"), "github").unwrap());
    assert!(v
        .account_read(&person("alice"), "github")
        .unwrap()
        .is_none());
    assert_eq!(v.parsed.len(), 0);
}

#[test]
fn kept_allowances_serve_only_the_sealed_bytes_they_came_from() {
    let e = Env::new();
    let v = e.vault();
    connect(&v, "alice", "at-alice");
    let alice = person("alice");
    let key = allowance_key(&alice, "github", "repo-helper");
    let other = allowance_key(&alice, "github", "other-agent");
    let read = |agent: &str| v.allowance(&alice, agent, "github").unwrap();
    v.allow(&alice, "repo-helper", "github", &["repo".into()], 1000)
        .unwrap();
    v.allow(&alice, "other-agent", "github", &["read:org".into()], 1000)
        .unwrap();
    assert_eq!(read("repo-helper").unwrap().scopes, ["repo"]);
    assert_eq!(read("other-agent").unwrap().scopes, ["read:org"]);
    assert_eq!(v.allowed.len(), 2);
    let (own, theirs) = (
        e.store.get(Tree::Allowances, &key).unwrap().unwrap(),
        e.store.get(Tree::Allowances, &other).unwrap().unwrap(),
    );
    // Widened meanwhile (another replica): the new scopes, not the kept.
    v.allow(&alice, "repo-helper", "github", &["gist".into()], 1001)
        .unwrap();
    assert_eq!(read("repo-helper").unwrap().scopes, ["gist", "repo"]);
    // The other agent's sealed bytes copied in, or a flipped bit: neither
    // opens, whatever was kept for either record.
    e.store.put(Tree::Allowances, &key, &theirs).unwrap();
    assert_eq!(read("repo-helper"), None);
    let mut flipped = own.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x01;
    e.store.put(Tree::Allowances, &key, &flipped).unwrap();
    assert_eq!(read("repo-helper"), None);
    // Positive control: the bytes as they were open as they were.
    e.store.put(Tree::Allowances, &key, &own).unwrap();
    assert_eq!(read("repo-helper").unwrap().scopes, ["repo"]);
    // Withdrawn: nothing allowed, nothing kept for it.
    v.disallow(&alice, "repo-helper", "github").unwrap();
    assert_eq!(read("repo-helper"), None);
    assert_eq!(v.allowed.len(), 1);
    // A deleted account keeps no allowance either.
    assert!(v.delete_account(&alice, "github").unwrap());
    assert_eq!(read("other-agent"), None);
    assert_eq!(v.allowed.len(), 0);
}
