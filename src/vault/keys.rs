//! The vault's encryption keys: a directory of key files (32 random bytes
//! each, mode 0600, named `<key id>.key`), the id of the current key in the
//! store, and a cap on how many records one key may seal.
//!
//! Every file in the directory can open records; only the current key
//! seals. Rotation adds a new key and makes it current *before* re-wrapping,
//! so old keys keep opening what they sealed until the re-wrap finishes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use super::VaultError;
use crate::seal::Sealer;
use crate::secret::SecretBytes;
use crate::store::{Store, Tree};

/// Where the current key id and the rotation flag live (tree `State`).
const STATE_KEY: &[u8] = b"vault/keys";
/// Prefix of the per-key seal counters (tree `State`).
const SEALS_PREFIX: &str = "vault/seals/";
/// Seals reserved per counter write, so the counter costs one store write
/// per this many seals. A crash wastes at most one block.
const SEAL_BLOCK: u64 = 1024;
/// Records one key may seal. AES-256-GCM with random 96-bit nonces stays
/// within NIST SP 800-38D's 2^-32 collision bound up to 2^32 messages; the
/// cap keeps a margin of four.
pub const DEFAULT_SEAL_CAP: u64 = 1 << 30;

/// The persisted key state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyState {
    /// Hex id of the key that seals new records.
    pub current: String,
    /// Whether a re-wrap under `current` is unfinished.
    pub rotating: bool,
}

#[derive(Debug, Default)]
struct Counter {
    /// Seals used under the current key.
    used: u64,
    /// Seals covered by the persisted counter.
    reserved: u64,
}

/// The loaded keys and the current one.
pub struct VaultKeys {
    dir: PathBuf,
    sealer: ArcSwap<Sealer>,
    /// All loaded key ids (hex), for reports.
    ids: Mutex<Vec<String>>,
    counter: Mutex<Counter>,
    cap: u64,
    /// No key exists yet and none was made (no provider is configured): the
    /// sealer holds a throw-away key and every seal or rotation is refused,
    /// so nothing is ever sealed under a key that is not on disk.
    unused: bool,
}

impl std::fmt::Debug for VaultKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultKeys")
            .field("dir", &self.dir)
            .field("current", &self.sealer.load().current_key_id())
            .finish_non_exhaustive()
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> VaultError {
    VaultError::Keys(format!("{what} {}: {e}", path.display()))
}

/// Reads every `*.key` file of `dir`: (id, key). Each must be a regular
/// file of mode 0600 (or stricter) holding exactly 32 bytes, named by its id.
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
        let key =
            crate::config::read_secret_file(&path).map_err(|e| io("vault key file", &path, e))?;
        let sealer = Sealer::new(&key, &[]).map_err(|_| {
            VaultError::Keys(format!(
                "vault key file {} must hold exactly 32 bytes",
                path.display()
            ))
        })?;
        let id = sealer.current_key_id();
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

/// Creates a new random key file in `dir` (0700), durably: the file and the
/// directory entry are synced before the key seals anything.
fn create_key(dir: &Path) -> Result<(String, SecretBytes), VaultError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| io("cannot create the vault key directory", dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("cannot set the mode of", dir, e))?;
    let mut bytes = vec![0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes)
        .map_err(|_| VaultError::Keys("no randomness for a vault key".into()))?;
    let key = SecretBytes::new(bytes);
    let id = Sealer::new(&key, &[])
        .map_err(|_| VaultError::Keys("vault key".into()))?
        .current_key_id();
    let path = dir.join(format!("{id}.key"));
    crate::config::write_secret_file(&path, key.expose())
        .map_err(|e| io("cannot write the vault key", &path, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("cannot sync the vault key directory", dir, e))?;
    Ok((id, key))
}

fn read_state(store: &dyn Store) -> Result<Option<KeyState>, VaultError> {
    match store.get(Tree::State, STATE_KEY)? {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|_| VaultError::Keys("the vault key state in the store is unreadable".into())),
    }
}

fn write_state(store: &dyn Store, s: &KeyState) -> Result<(), VaultError> {
    let v = serde_json::to_vec(s).map_err(|_| VaultError::Keys("key state".into()))?;
    store.put(Tree::State, STATE_KEY, &v)?;
    Ok(())
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

impl VaultKeys {
    /// Loads the keys of `dir`. With no key state in the store yet, the
    /// first key is created, but only while `vault_empty` (a vault with
    /// records and no keys is an error, never a fresh start). With
    /// `create` false (no provider is configured) nothing is created: the
    /// directory is neither made nor written, and the keys refuse to seal.
    pub fn load(
        store: &dyn Store,
        dir: &Path,
        vault_empty: bool,
        cap: u64,
        create: bool,
    ) -> Result<VaultKeys, VaultError> {
        let mut keys = read_dir_keys(dir)?;
        let state = match read_state(store)? {
            Some(s) => s,
            None if !create && keys.is_empty() && vault_empty => return Self::unused(dir, cap),
            None => {
                if !vault_empty {
                    return Err(VaultError::Keys(format!(
                        "the vault holds records but no key state; restore the key files into {}",
                        dir.display()
                    )));
                }
                let (id, key) = match keys.len() {
                    // An operator-provided single key becomes current.
                    1 => (keys[0].0.clone(), keys[0].1.clone()),
                    0 => create_key(dir)?,
                    _ => {
                        return Err(VaultError::Keys(format!(
                            "{} holds several keys but the store names no current one",
                            dir.display()
                        )))
                    }
                };
                if !keys.iter().any(|(i, _)| *i == id) {
                    keys.push((id.clone(), key));
                }
                let s = KeyState {
                    current: id,
                    rotating: false,
                };
                write_state(store, &s)?;
                s
            }
        };
        let sealer = build_sealer(&keys, &state.current)?;
        let used = read_counter(store, &state.current)?;
        Ok(VaultKeys {
            dir: dir.to_owned(),
            sealer: ArcSwap::from_pointee(sealer),
            ids: Mutex::new(keys.into_iter().map(|(id, _)| id).collect()),
            counter: Mutex::new(Counter {
                used,
                reserved: used,
            }),
            cap,
            unused: false,
        })
    }

    fn unused(dir: &Path, cap: u64) -> Result<VaultKeys, VaultError> {
        // A random key kept in memory only; `count_seal` and
        // `begin_rotation` refuse before it could seal anything.
        let mut bytes = vec![0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes)
            .map_err(|_| VaultError::Keys("no randomness for a vault key".into()))?;
        let sealer = Sealer::new(&SecretBytes::new(bytes), &[])
            .map_err(|_| VaultError::Keys("vault key".into()))?;
        Ok(VaultKeys {
            dir: dir.to_owned(),
            sealer: ArcSwap::from_pointee(sealer),
            ids: Mutex::new(Vec::new()),
            counter: Mutex::new(Counter {
                used: 0,
                reserved: 0,
            }),
            cap,
            unused: true,
        })
    }

    fn refuse_unused(&self) -> Result<(), VaultError> {
        if self.unused {
            return Err(VaultError::Keys(format!(
                "no provider is configured, so no vault key was created in {}; configure a provider and restart",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// The sealer (current key seals, every loaded key opens).
    pub fn sealer(&self) -> Arc<Sealer> {
        self.sealer.load_full()
    }

    /// Hex id of the current key.
    pub fn current(&self) -> String {
        self.sealer.load().current_key_id()
    }

    /// Ids of every loaded key.
    pub fn loaded(&self) -> Vec<String> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The key directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counts one seal under the current key; refuses past the cap.
    pub fn count_seal(&self, store: &dyn Store) -> Result<(), VaultError> {
        self.refuse_unused()?;
        let mut c = self.counter.lock().unwrap_or_else(|p| p.into_inner());
        if c.used >= self.cap {
            return Err(VaultError::KeyExhausted(self.current()));
        }
        if c.used >= c.reserved {
            let next = (c.reserved + SEAL_BLOCK).min(self.cap);
            let key = format!("{SEALS_PREFIX}{}", self.current());
            store.put(Tree::State, key.as_bytes(), &next.to_be_bytes())?;
            c.reserved = next;
        }
        c.used += 1;
        Ok(())
    }

    /// Starts a rotation, or finds the one in progress: returns the key
    /// state with `rotating = true`. A new key is written (and synced)
    /// before the store names it, and it seals from then on.
    pub fn begin_rotation(&self, store: &dyn Store) -> Result<KeyState, VaultError> {
        self.refuse_unused()?;
        if let Some(s) = read_state(store)? {
            if s.rotating {
                return Ok(s);
            }
        }
        let (id, _) = create_key(&self.dir)?;
        let keys = read_dir_keys(&self.dir)?;
        let sealer = build_sealer(&keys, &id)?;
        let s = KeyState {
            current: id.clone(),
            rotating: true,
        };
        write_state(store, &s)?;
        self.sealer.store(Arc::new(sealer));
        *self.ids.lock().unwrap_or_else(|p| p.into_inner()) =
            keys.into_iter().map(|(i, _)| i).collect();
        *self.counter.lock().unwrap_or_else(|p| p.into_inner()) = Counter::default();
        Ok(s)
    }

    /// Marks the rotation finished.
    pub fn finish_rotation(&self, store: &dyn Store) -> Result<(), VaultError> {
        write_state(
            store,
            &KeyState {
                current: self.current(),
                rotating: false,
            },
        )
    }

    /// The persisted state.
    pub fn state(&self, store: &dyn Store) -> Result<Option<KeyState>, VaultError> {
        read_state(store)
    }
}

fn read_counter(store: &dyn Store, id: &str) -> Result<u64, VaultError> {
    let key = format!("{SEALS_PREFIX}{id}");
    Ok(match store.get(Tree::State, key.as_bytes())? {
        Some(v) if v.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v);
            u64::from_be_bytes(b)
        }
        _ => 0,
    })
}
