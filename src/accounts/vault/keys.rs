//! The vault's encryption keys: ONE store record (tree `State`, key
//! `vault/keyring/v1`) holding every key, each sealed under the master key,
//! the id of the current key and whether a re-wrap is unfinished; and a cap
//! on how many records one key may seal.
//!
//! Every key of the record can open records; only the current key seals.
//! The record changes only by compare-and-swap of the whole record (as the
//! signing key ring does, `mint`), so replicas sharing a store
//! share the keys: a rotation on one replica is read by the others when
//! they see the record change (the store's change counter for `State`) or,
//! at the latest, when they meet a record sealed under a key they have not
//! loaded yet. Rotation adds a new key and makes it current *before*
//! re-wrapping, so old keys keep opening what they sealed until the re-wrap
//! finishes; keys are never removed from the record.
//!
//! Installs made before the record kept the keys as files in `[vault]
//! key_dir` (32 bytes, mode 0600, named `<key id>.key`) and the current id
//! in the store (`vault/keys`). At the first start without the record,
//! every file is imported by one compare-and-swap that creates the record;
//! the files are only read, never changed, so a crash before that write
//! leaves the old install as it was and a crash after it leaves the record
//! complete. From then on the directory is not read again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use super::VaultError;
use crate::base::secret::SecretBytes;
use crate::infra::failpoint;
use crate::infra::seal::{SealError, Sealer};
use crate::infra::store::{Store, Tree};

/// The key record (tree `State`).
const RECORD_KEY: &[u8] = b"vault/keyring/v1";
/// Where installs before the record kept the current key id and the
/// rotation flag (tree `State`); read only for the import.
const LEGACY_STATE_KEY: &[u8] = b"vault/keys";
/// Prefix of the per-key seal counters (tree `State`).
const SEALS_PREFIX: &str = "vault/seals/";
/// Seals reserved per counter write, so the counter costs one store write
/// per this many seals. A crash wastes at most one block.
const SEAL_BLOCK: u64 = 1024;
/// Compare-and-swap attempts before giving up (others keep writing).
const CAS_ATTEMPTS: usize = 16;
/// Records one key may seal. AES-256-GCM with random 96-bit nonces stays
/// within NIST SP 800-38D's 2^-32 collision bound up to 2^32 messages; the
/// cap keeps a margin of four.
pub(crate) const DEFAULT_SEAL_CAP: u64 = 1 << 30;

/// Names the record in errors.
const WHERE: &str = "vault keys (store tree state, record vault/keyring/v1)";

/// The persisted key state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyState {
    /// Hex id of the key that seals new records.
    pub current: String,
    /// Whether a re-wrap under `current` is unfinished.
    pub rotating: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredKey {
    /// Hex key id.
    id: String,
    /// The 32 key bytes sealed under the master key (AAD
    /// `vault/keyring/<id>`), base64url.
    sealed: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRecord {
    /// Bumped on every write (every new record differs from the old).
    generation: u64,
    current: String,
    rotating: bool,
    keys: Vec<StoredKey>,
}

impl KeyRecord {
    fn bytes(&self) -> Result<Vec<u8>, VaultError> {
        serde_json::to_vec(self).map_err(|_| VaultError::Keys(format!("{WHERE}: encode")))
    }

    fn state(&self) -> KeyState {
        KeyState {
            current: self.current.clone(),
            rotating: self.rotating,
        }
    }
}

#[derive(Debug, Default)]
struct Counter {
    /// The next seal's number under the current key.
    used: u64,
    /// The end of the block this process reserved (seals up to it are
    /// counted in the store).
    reserved: u64,
}

/// What was built from one version of the record.
struct Loaded {
    /// The record's bytes (compared to notice a change).
    raw: Vec<u8>,
    ids: Vec<String>,
}

/// The loaded keys and the current one.
pub struct VaultKeys {
    dir: PathBuf,
    master: Arc<Sealer>,
    sealer: ArcSwap<Sealer>,
    loaded: Mutex<Loaded>,
    /// Moves when a `State` record changes (here or on another replica).
    changes: Mutex<Option<tokio::sync::watch::Receiver<u64>>>,
    counter: Mutex<Counter>,
    cap: u64,
    /// No key exists yet and none was made (no provider is configured): the
    /// sealer holds a throw-away key and every seal or rotation is refused,
    /// so nothing is ever sealed under a key that is not in the store.
    unused: bool,
}

impl std::fmt::Debug for VaultKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultKeys")
            .field("current", &self.sealer.load().current_key_id())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn io(what: &str, path: &Path, e: std::io::Error) -> VaultError {
    VaultError::Keys(format!("{what} {}: {e}", path.display()))
}

/// Reads every `*.key` file of `dir` (the layout before the record): (id,
/// key). Each must be a regular file of mode 0600 (or stricter) holding
/// exactly 32 bytes, named by its id.
fn read_dir_keys(dir: &Path) -> Result<Vec<(String, SecretBytes)>, VaultError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // Absent, or a component of the path is a file: no keys there.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(out)
        }
        Err(e) => return Err(io("cannot read the vault key directory", dir, e)),
    };
    for e in entries {
        let e = e.map_err(|e| io("cannot read the vault key directory", dir, e))?;
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("key") {
            continue;
        }
        let key = crate::infra::config::read_secret_file(&path)
            .map_err(|e| io("vault key file", &path, e))?;
        let id = key_id(&key).map_err(|_| {
            VaultError::Keys(format!(
                "vault key file {} must hold exactly 32 bytes",
                path.display()
            ))
        })?;
        if path.file_stem().and_then(|s| s.to_str()) != Some(id.as_str()) {
            return Err(VaultError::Keys(format!(
                "vault key file {} holds key {id}; name it {id}.key",
                path.display()
            )));
        }
        out.push((id, key));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn key_id(key: &SecretBytes) -> Result<String, SealError> {
    Ok(Sealer::new(key, &[])?.current_key_id())
}

fn random_key() -> Result<(String, SecretBytes), VaultError> {
    let mut bytes = vec![0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes)
        .map_err(|_| VaultError::Keys("no randomness for a vault key".into()))?;
    let key = SecretBytes::new(bytes);
    let id = key_id(&key).map_err(|_| VaultError::Keys("vault key".into()))?;
    Ok((id, key))
}

fn aad(id: &str) -> Vec<u8> {
    format!("vault/keyring/{id}").into_bytes()
}

fn seal_key(master: &Sealer, id: &str, key: &SecretBytes) -> Result<StoredKey, VaultError> {
    let sealed = master
        .seal(&aad(id), key.expose())
        .map_err(|_| VaultError::Keys(format!("{WHERE}: encryption failed")))?;
    Ok(StoredKey {
        id: id.to_string(),
        sealed: crate::base::jose::b64e(&sealed),
    })
}

/// Opens every key of the record (each must open under the master key and
/// be the key its id names) and checks that the current one is among them.
fn open_record(master: &Sealer, rec: &KeyRecord) -> Result<Vec<(String, SecretBytes)>, VaultError> {
    let mut out = Vec::with_capacity(rec.keys.len());
    for k in &rec.keys {
        let bad = |why: &str| VaultError::Keys(format!("{WHERE}: key {}: {why}", k.id));
        let sealed =
            crate::base::jose::b64d(&k.sealed, "vault key").map_err(|_| bad("not base64url"))?;
        let key = master.open(&aad(&k.id), &sealed).map_err(|_| {
            bad("does not decrypt under the master key (keys.master_key_file is not the one this store was made with, or the record was altered)")
        })?;
        if key_id(&key).ok().as_deref() != Some(k.id.as_str()) {
            return Err(bad("holds another key than its id names"));
        }
        if out.iter().any(|(id, _)| *id == k.id) {
            return Err(bad("appears twice"));
        }
        out.push((k.id.clone(), key));
    }
    if !out.iter().any(|(id, _)| *id == rec.current) {
        return Err(VaultError::Keys(format!(
            "{WHERE}: the current key {} is not in the record",
            rec.current
        )));
    }
    Ok(out)
}

fn read_record(store: &dyn Store) -> Result<Option<(Vec<u8>, KeyRecord)>, VaultError> {
    let Some(raw) = store.get(Tree::State, RECORD_KEY)? else {
        return Ok(None);
    };
    let rec = serde_json::from_slice(&raw)
        .map_err(|_| VaultError::Keys(format!("{WHERE}: the record does not parse")))?;
    Ok(Some((raw, rec)))
}

fn read_legacy_state(store: &dyn Store) -> Result<Option<KeyState>, VaultError> {
    match store.get(Tree::State, LEGACY_STATE_KEY)? {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v).map(Some).map_err(|_| {
            VaultError::Keys(
                "the vault key state in the store (tree state, record vault/keys) is unreadable"
                    .into(),
            )
        }),
    }
}

fn build_sealer(keys: &[(String, SecretBytes)], current: &str) -> Result<Sealer, VaultError> {
    let cur = keys
        .iter()
        .find(|(id, _)| id == current)
        .map(|(_, k)| k)
        .ok_or_else(|| VaultError::KeyMissing(current.to_string()))?;
    let others: Vec<SecretBytes> = keys
        .iter()
        .filter(|(id, _)| id != current)
        .map(|(_, k)| k.clone())
        .collect();
    Sealer::new(cur, &others).map_err(|_| VaultError::Keys("vault key".into()))
}

/// The first record: the key files and key state of an install made
/// before the record (every file, so every account stays readable), or a
/// new key for a new vault.
fn first_record(
    store: &dyn Store,
    master: &Sealer,
    dir: &Path,
    vault_empty: bool,
) -> Result<KeyRecord, VaultError> {
    let files = read_dir_keys(dir)?;
    let (current, rotating, keys) = match read_legacy_state(store)? {
        Some(s) => {
            if !files.iter().any(|(id, _)| *id == s.current) {
                return Err(VaultError::Keys(format!(
                    "importing the vault keys: the store names key {} as current, but {} has no file {}.key; restore the key files into it",
                    s.current,
                    dir.display(),
                    s.current
                )));
            }
            (s.current, s.rotating, files)
        }
        None => {
            if !vault_empty {
                return Err(VaultError::Keys(format!(
                    "the vault holds records but no key state; restore the key files into {}",
                    dir.display()
                )));
            }
            match files.len() {
                // An operator-provided single key becomes current.
                1 => (files[0].0.clone(), false, files),
                0 => {
                    let (id, key) = random_key()?;
                    (id.clone(), false, vec![(id, key)])
                }
                _ => {
                    return Err(VaultError::Keys(format!(
                        "{} holds several keys but the store names no current one",
                        dir.display()
                    )))
                }
            }
        }
    };
    Ok(KeyRecord {
        generation: 1,
        current,
        rotating,
        keys: keys
            .iter()
            .map(|(id, k)| seal_key(master, id, k))
            .collect::<Result<_, _>>()?,
    })
}

impl VaultKeys {
    /// Loads the keys from the store record. Without the record, it is
    /// made once: from the key files in `dir` and the key state of an
    /// older install, or, while `vault_empty`, with one new key (a vault
    /// with records and no keys is an error, never a fresh start). With
    /// `create` false (no provider is configured) and nothing to import,
    /// nothing is written and the keys refuse to seal.
    pub fn load(
        store: &dyn Store,
        master: Arc<Sealer>,
        dir: &Path,
        vault_empty: bool,
        cap: u64,
        create: bool,
    ) -> Result<VaultKeys, VaultError> {
        // Subscribed before the first read, so no change after it is missed.
        let changes = store.watch(Tree::State);
        for _ in 0..CAS_ATTEMPTS {
            if let Some((raw, rec)) = read_record(store)? {
                let keys = open_record(&master, &rec)?;
                let sealer = build_sealer(&keys, &rec.current)?;
                return Ok(VaultKeys {
                    dir: dir.to_owned(),
                    master,
                    sealer: ArcSwap::from_pointee(sealer),
                    loaded: Mutex::new(Loaded {
                        raw,
                        ids: keys.into_iter().map(|(id, _)| id).collect(),
                    }),
                    changes: Mutex::new(Some(changes)),
                    counter: Mutex::new(Counter::default()),
                    cap,
                    unused: false,
                });
            }
            if !create
                && vault_empty
                && read_legacy_state(store)?.is_none()
                && read_dir_keys(dir)?.is_empty()
            {
                return Self::unused(dir, master, cap);
            }
            let rec = first_record(store, &master, dir, vault_empty)?;
            failpoint::hit("vault.import.before_write");
            if store.compare_and_swap(Tree::State, RECORD_KEY, None, Some(&rec.bytes()?))? {
                failpoint::hit("vault.import.after_write");
                tracing::info!(keys = rec.keys.len(), current = %rec.current, "vault keys stored in the store record");
            }
            // Read back what is stored now (ours, or another replica's).
        }
        Err(VaultError::Keys(format!(
            "{WHERE}: changed by another process {CAS_ATTEMPTS} times in a row; try again"
        )))
    }

    fn unused(dir: &Path, master: Arc<Sealer>, cap: u64) -> Result<VaultKeys, VaultError> {
        // A random key kept in memory only; `count_seal` and
        // `begin_rotation` refuse before it could seal anything.
        let (_, key) = random_key()?;
        let sealer = Sealer::new(&key, &[]).map_err(|_| VaultError::Keys("vault key".into()))?;
        Ok(VaultKeys {
            dir: dir.to_owned(),
            master,
            sealer: ArcSwap::from_pointee(sealer),
            loaded: Mutex::new(Loaded {
                raw: Vec::new(),
                ids: Vec::new(),
            }),
            changes: Mutex::new(None),
            counter: Mutex::new(Counter::default()),
            cap,
            unused: true,
        })
    }

    fn refuse_unused(&self) -> Result<(), VaultError> {
        if self.unused {
            return Err(VaultError::Keys(
                "no provider is configured, so no vault key was created; configure a provider and restart".into(),
            ));
        }
        Ok(())
    }

    /// The sealer (current key seals, every loaded key opens).
    pub fn sealer(&self) -> Arc<Sealer> {
        self.sealer.load_full()
    }

    /// The sealer after taking in a change of the record another process
    /// made (a rotation on another replica), if the store says one may have
    /// happened since the last look.
    pub fn fresh_sealer(&self, store: &dyn Store) -> Result<Arc<Sealer>, VaultError> {
        let changed = lock(&self.changes).as_mut().is_some_and(|rx| {
            let moved = rx.has_changed().unwrap_or(false);
            if moved {
                rx.borrow_and_update();
            }
            moved
        });
        if changed {
            self.reload(store)?;
        }
        Ok(self.sealer())
    }

    /// Re-reads the record and, if it changed, loads its keys. Returns
    /// whether it changed. For a record sealed under a key not loaded yet.
    pub fn reload(&self, store: &dyn Store) -> Result<bool, VaultError> {
        if self.unused {
            return Ok(false);
        }
        let Some((raw, rec)) = read_record(store)? else {
            return Err(VaultError::Keys(format!("{WHERE}: the record is gone")));
        };
        if raw == lock(&self.loaded).raw {
            return Ok(false);
        }
        self.install(raw, &rec)?;
        Ok(true)
    }

    fn install(&self, raw: Vec<u8>, rec: &KeyRecord) -> Result<(), VaultError> {
        let keys = open_record(&self.master, rec)?;
        let sealer = build_sealer(&keys, &rec.current)?;
        let mut loaded = lock(&self.loaded);
        let mut counter = lock(&self.counter);
        if sealer.current_key_id() != self.current() {
            *counter = Counter::default();
        }
        self.sealer.store(Arc::new(sealer));
        *loaded = Loaded {
            raw,
            ids: keys.into_iter().map(|(id, _)| id).collect(),
        };
        Ok(())
    }

    /// Hex id of the current key.
    pub fn current(&self) -> String {
        self.sealer.load().current_key_id()
    }

    /// Ids of every loaded key.
    pub fn loaded(&self) -> Vec<String> {
        lock(&self.loaded).ids.clone()
    }

    /// The key directory of installs before the record (read only to
    /// import it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counts one seal under the current key; refuses past the cap. The
    /// count is shared by every process on the store: each reserves a
    /// block of [`SEAL_BLOCK`] seals by compare-and-swap of the counter.
    pub fn count_seal(&self, store: &dyn Store) -> Result<(), VaultError> {
        self.refuse_unused()?;
        let mut c = lock(&self.counter);
        if c.used >= c.reserved {
            let key = format!("{SEALS_PREFIX}{}", self.current());
            let mut reserved = None;
            for _ in 0..CAS_ATTEMPTS {
                let raw = store.get(Tree::State, key.as_bytes())?;
                let from = match raw.as_deref() {
                    Some(v) => u64::from_be_bytes(v.try_into().map_err(|_| {
                        VaultError::Keys(format!(
                            "the seal counter of vault key {} (store tree state) is malformed",
                            self.current()
                        ))
                    })?),
                    None => 0,
                };
                if from >= self.cap {
                    return Err(VaultError::KeyExhausted(self.current()));
                }
                let to = (from + SEAL_BLOCK).min(self.cap);
                if store.compare_and_swap(
                    Tree::State,
                    key.as_bytes(),
                    raw.as_deref(),
                    Some(&to.to_be_bytes()),
                )? {
                    reserved = Some((from, to));
                    break;
                }
            }
            let (from, to) = reserved.ok_or_else(|| {
                VaultError::Keys("the vault seal counter keeps changing; try again".into())
            })?;
            c.used = from;
            c.reserved = to;
        }
        if c.used >= self.cap {
            return Err(VaultError::KeyExhausted(self.current()));
        }
        c.used += 1;
        Ok(())
    }

    /// Starts a rotation, or finds the one in progress: returns the key
    /// state with `rotating = true`. The new key is in the record (and so
    /// readable by every replica) before it seals anything.
    pub fn begin_rotation(&self, store: &dyn Store) -> Result<KeyState, VaultError> {
        self.refuse_unused()?;
        for _ in 0..CAS_ATTEMPTS {
            let Some((raw, rec)) = read_record(store)? else {
                return Err(VaultError::Keys(format!("{WHERE}: the record is gone")));
            };
            if rec.rotating {
                self.install(raw, &rec)?;
                return Ok(rec.state());
            }
            let (id, key) = random_key()?;
            let mut next = rec.clone();
            next.generation += 1;
            next.keys.push(seal_key(&self.master, &id, &key)?);
            next.current = id;
            next.rotating = true;
            let bytes = next.bytes()?;
            if store.compare_and_swap(Tree::State, RECORD_KEY, Some(&raw), Some(&bytes))? {
                self.install(bytes, &next)?;
                return Ok(next.state());
            }
        }
        Err(VaultError::Keys(format!(
            "{WHERE}: changed by another process {CAS_ATTEMPTS} times in a row; try again"
        )))
    }

    /// Marks the rotation to `current` finished (nothing if another
    /// rotation started meanwhile).
    pub fn finish_rotation(&self, store: &dyn Store, current: &str) -> Result<(), VaultError> {
        for _ in 0..CAS_ATTEMPTS {
            let Some((raw, rec)) = read_record(store)? else {
                return Err(VaultError::Keys(format!("{WHERE}: the record is gone")));
            };
            if rec.current != current || !rec.rotating {
                return Ok(());
            }
            let mut next = rec.clone();
            next.generation += 1;
            next.rotating = false;
            let bytes = next.bytes()?;
            if store.compare_and_swap(Tree::State, RECORD_KEY, Some(&raw), Some(&bytes))? {
                self.install(bytes, &next)?;
                return Ok(());
            }
        }
        Err(VaultError::Keys(format!(
            "{WHERE}: changed by another process {CAS_ATTEMPTS} times in a row; try again"
        )))
    }

    /// The persisted state.
    pub fn state(&self, store: &dyn Store) -> Result<Option<KeyState>, VaultError> {
        Ok(read_record(store)?.map(|(_, r)| r.state()))
    }
}
