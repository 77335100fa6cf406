//! The embedded backend: sled 0.34 (single process; see `admin` for how the
//! CLI reaches a running instance instead of opening the store).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::OnceLock;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sled::Transactional;

use super::{
    check_tree, decode_expiring, encode_expiring, Fenced, Lease, Store, StoreError, Tree, Watchers,
    ALL_TREES,
};

/// A sled database in a directory of mode 0700.
///
/// sled is single-process (it locks its file), so every writer is in this
/// process and [`Store::watch`] is complete with in-process counters.
#[derive(Debug)]
pub struct SledStore {
    db: sled::Db,
    /// Each tree's handle, opened on first use: `Db::open_tree` takes a
    /// lock and looks the name up, on every call that asked it.
    trees: [OnceLock<sled::Tree>; ALL_TREES.len()],
    watchers: Watchers,
    // Declared after `db`, so dropped after it (fields drop in order).
    _closed: WaitForRelease,
}

/// Makes dropping a [`SledStore`] mean "closed": waits until sled has
/// released its lock on the database file.
///
/// sled 0.34's `Db::drop` returns while its I/O threads may still hold a
/// clone of the locked file for a moment (the write that a flush waited for
/// has completed, but the task that did it has not yet dropped its handle;
/// spacejam/sled#1234, #1289). A store reopened at once in the same process
/// (a restart in-process, or a test) then failed with `Locked` now and then.
/// The condition is observable: the lock is free once our own exclusive
/// non-blocking `flock` on the file succeeds.
#[derive(Debug)]
struct WaitForRelease {
    file: std::path::PathBuf,
}

impl Drop for WaitForRelease {
    fn drop(&mut self) {
        use nix::fcntl::{Flock, FlockArg};
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let Ok(f) = std::fs::File::open(&self.file) else {
                return;
            };
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                // Released: ours is dropped at once (unlocked and closed).
                Ok(_released) => return,
                Err((_, nix::errno::Errno::EWOULDBLOCK))
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err((_, e)) => {
                    tracing::warn!(error = %e, file = %self.file.display(), "the store's lock was not released on close");
                    return;
                }
            }
        }
    }
}

fn backend(e: sled::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl SledStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Backend(e.to_string()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let db = sled::Config::new()
            .path(dir.join("db"))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(ref io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    StoreError::Locked(dir.display().to_string())
                }
                sled::Error::Io(ref io) if io.to_string().contains("lock") => {
                    StoreError::Locked(dir.display().to_string())
                }
                e => backend(e),
            })?;
        // sled creates its files with the process umask; tighten them
        // (its `blobs` directory too, which must stay a usable directory).
        if let Ok(entries) = std::fs::read_dir(dir.join("db")) {
            for e in entries.flatten() {
                let mode = if e.file_type().is_ok_and(|t| t.is_dir()) {
                    0o700
                } else {
                    0o600
                };
                let _ = std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode));
            }
        }
        let _ = std::fs::set_permissions(dir.join("db"), std::fs::Permissions::from_mode(0o700));
        Ok(SledStore {
            db,
            trees: std::array::from_fn(|_| OnceLock::new()),
            watchers: Watchers::new(),
            _closed: WaitForRelease {
                // The file sled locks (its `Config::db_path`).
                file: dir.join("db").join("db"),
            },
        })
    }

    fn tree(&self, t: Tree) -> Result<&sled::Tree, StoreError> {
        // `Tree` is fieldless and `ALL_TREES` has every variant.
        let cell = &self.trees[t as usize];
        if let Some(tree) = cell.get() {
            return Ok(tree);
        }
        // Two first uses at once open the same tree; either handle is kept.
        let opened = self.db.open_tree(t.name()).map_err(backend)?;
        Ok(cell.get_or_init(|| opened))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(backend)
    }

    /// The live expiring entries of `tree` with their remaining lifetimes
    /// (for `store copy`).
    pub fn live_expiring(&self, tree: Tree) -> Result<Vec<super::LiveExpiring>, StoreError> {
        check_tree(tree, true)?;
        let now = now_ms();
        let mut out = Vec::new();
        for entry in self.tree(tree)?.iter() {
            let (k, raw) = entry.map_err(backend)?;
            if let Some((exp, v)) = decode_expiring(&raw).filter(|(exp, _)| *exp > now) {
                out.push((k.to_vec(), v.to_vec(), Duration::from_millis(exp - now)));
            }
        }
        Ok(out)
    }

    /// Flushes a write to `tree` and tells its watchers.
    fn written(&self, tree: Tree) -> Result<(), StoreError> {
        self.flush()?;
        self.watchers.bump(tree);
        Ok(())
    }
}

/// The store's clock for expiring entries, in Unix milliseconds.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn expiry(ttl: Duration) -> u64 {
    now_ms().saturating_add(ttl.as_millis() as u64)
}

/// The value of an expiring entry if it is still live at `now`.
fn live(raw: &[u8], now: u64) -> Option<&[u8]> {
    decode_expiring(raw).and_then(|(exp, v)| (exp > now).then_some(v))
}

impl Store for SledStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_tree(tree, false)?;
        Ok(self
            .tree(tree)?
            .get(key)
            .map_err(backend)?
            .map(|v| v.to_vec()))
    }

    fn put(&self, tree: Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        check_tree(tree, false)?;
        self.tree(tree)?.insert(key, value).map_err(backend)?;
        self.written(tree)
    }

    fn delete(&self, tree: Tree, key: &[u8]) -> Result<(), StoreError> {
        check_tree(tree, false)?;
        self.tree(tree)?.remove(key).map_err(backend)?;
        self.written(tree)
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<super::Entry>, StoreError> {
        check_tree(tree, false)?;
        self.tree(tree)?
            .scan_prefix(prefix)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(backend))
            .collect()
    }

    fn compare_and_swap(
        &self,
        tree: Tree,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        check_tree(tree, false)?;
        let swapped = self
            .tree(tree)?
            .compare_and_swap(key, expected, new)
            .map_err(backend)?
            .is_ok();
        if swapped {
            self.written(tree)?;
        }
        Ok(swapped)
    }

    fn replace_fenced(
        &self,
        tree: Tree,
        key: &[u8],
        expected: &[u8],
        new: &[u8],
        lease: Lease<'_>,
    ) -> Result<Fenced, StoreError> {
        check_tree(tree, false)?;
        check_tree(lease.tree, true)?;
        let (records, leases) = (self.tree(tree)?, self.tree(lease.tree)?);
        // A sled transaction excludes every other write of this process
        // (its concurrency control), and sled is single-process: the lease
        // check and the swap are one step.
        let outcome = (records, leases)
            .transaction(|(r, l)| {
                let held = l
                    .get(lease.key)?
                    .is_some_and(|raw| live(&raw, now_ms()) == Some(lease.holder));
                if !held {
                    return Ok(Fenced::LeaseLost);
                }
                if r.get(key)?.as_deref() != Some(expected) {
                    return Ok(Fenced::Changed);
                }
                r.insert(key, new)?;
                Ok(Fenced::Swapped)
            })
            .map_err(|e: sled::transaction::TransactionError<()>| match e {
                sled::transaction::TransactionError::Storage(e) => backend(e),
                sled::transaction::TransactionError::Abort(()) => {
                    StoreError::Backend("fenced replace aborted".into())
                }
            })?;
        if outcome == Fenced::Swapped {
            self.written(tree)?;
        }
        Ok(outcome)
    }

    fn is_healthy(&self) -> bool {
        self.db.was_recovered() || self.db.size_on_disk().is_ok()
    }

    fn insert_expiring(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let inserted = self.insert_expiring_unsynced(tree, key, value, ttl)?;
        if inserted {
            self.written(tree)?;
        }
        Ok(inserted)
    }

    fn insert_expiring_unsynced(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        check_tree(tree, true)?;
        let t = self.tree(tree)?;
        let new = encode_expiring(expiry(ttl), value);
        // First as a new key (the usual case: one step, no read before);
        // then, while the swap finds an expired entry, in its place. A live
        // entry is a refusal. Another thread's write in between makes the
        // swap fail and show what it wrote.
        // No flush here: sled's own flusher (every 500 ms) and its close
        // write it; `insert_expiring` flushes before returning.
        let mut expected: Option<sled::IVec> = None;
        loop {
            match t
                .compare_and_swap(key, expected.as_ref(), Some(new.as_slice()))
                .map_err(backend)?
            {
                Ok(()) => return Ok(true),
                Err(found) => {
                    if found
                        .current
                        .as_deref()
                        .is_some_and(|raw| live(raw, now_ms()).is_some())
                    {
                        return Ok(false);
                    }
                    expected = found.current;
                }
            }
        }
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.flush()
    }

    fn get_expiring(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_tree(tree, true)?;
        let raw = self.tree(tree)?.get(key).map_err(backend)?;
        Ok(raw.and_then(|raw| live(&raw, now_ms()).map(<[u8]>::to_vec)))
    }

    fn replace_expiring(
        &self,
        tree: Tree,
        key: &[u8],
        expected: &[u8],
        new: Option<(&[u8], Duration)>,
    ) -> Result<bool, StoreError> {
        check_tree(tree, true)?;
        let t = self.tree(tree)?;
        let Some(current) = t.get(key).map_err(backend)? else {
            return Ok(false);
        };
        if live(&current, now_ms()) != Some(expected) {
            return Ok(false);
        }
        let replacement = new.map(|(v, ttl)| encode_expiring(expiry(ttl), v));
        let swapped = t
            .compare_and_swap(key, Some(current), replacement)
            .map_err(backend)?
            .is_ok();
        if swapped {
            self.written(tree)?;
        }
        Ok(swapped)
    }

    fn sweep_expired(&self, tree: Tree) -> Result<usize, StoreError> {
        check_tree(tree, true)?;
        let t = self.tree(tree)?;
        let now = now_ms();
        let mut removed = 0;
        for entry in t.iter() {
            let (k, raw) = entry.map_err(backend)?;
            if live(&raw, now).is_none()
                && t.compare_and_swap(&k, Some(raw), None::<&[u8]>)
                    .map_err(backend)?
                    .is_ok()
            {
                removed += 1;
            }
        }
        if removed > 0 {
            self.written(tree)?;
        }
        Ok(removed)
    }

    fn watch(&self, tree: Tree) -> tokio::sync::watch::Receiver<u64> {
        self.watchers.subscribe(tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handle cache is indexed by `Tree as usize`: every tree's
    /// index is its place in `ALL_TREES`, and each is its own sled tree.
    #[test]
    fn each_tree_has_its_own_cached_handle() {
        for (i, t) in ALL_TREES.iter().enumerate() {
            assert_eq!(*t as usize, i, "{}", t.name());
        }
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(dir.path()).unwrap();
        for t in ALL_TREES {
            assert_eq!(&s.tree(t).unwrap().name()[..], t.name().as_bytes());
            // The second use is the same handle.
            assert!(std::ptr::eq(s.tree(t).unwrap(), s.tree(t).unwrap()));
        }
    }

    #[test]
    fn put_get_cas_scan_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(dir.path()).unwrap();
            s.put(Tree::State, b"a/1", b"x").unwrap();
            s.put(Tree::State, b"a/2", b"y").unwrap();
            s.put(Tree::State, b"b/1", b"z").unwrap();
            assert_eq!(s.scan_prefix(Tree::State, b"a/").unwrap().len(), 2);
            assert!(!s
                .compare_and_swap(Tree::State, b"a/1", Some(b"wrong"), Some(b"n"))
                .unwrap());
            assert!(s
                .compare_and_swap(Tree::State, b"a/1", Some(b"x"), Some(b"n"))
                .unwrap());
            s.delete(Tree::State, b"b/1").unwrap();
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert_eq!(
            s.get(Tree::State, b"a/1").unwrap().as_deref(),
            Some(&b"n"[..])
        );
        assert_eq!(s.get(Tree::State, b"b/1").unwrap(), None);
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn the_store_contract_holds_on_sled() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(dir.path()).unwrap();
        crate::infra::store::contract::run_all(&s);
        crate::infra::store::contract::run_concurrent(std::sync::Arc::new(s));
    }

    #[test]
    fn expiring_entries_survive_a_reopen_until_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(dir.path()).unwrap();
            assert!(s
                .insert_expiring(Tree::Replay, b"j", b"1", Duration::from_secs(60))
                .unwrap());
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert!(!s
            .insert_expiring(Tree::Replay, b"j", b"1", Duration::from_secs(60))
            .unwrap());
        assert_eq!(
            s.get_expiring(Tree::Replay, b"j").unwrap().as_deref(),
            Some(&b"1"[..])
        );
    }

    /// An entry written without a flush is refused a second time at once,
    /// and is still there after the store was closed and reopened (a
    /// restart that was not a crash); a key never written is not.
    #[test]
    fn an_unsynced_expiring_entry_refuses_a_replay_and_survives_a_close() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(60);
        {
            let s = SledStore::open(dir.path()).unwrap();
            assert!(s
                .insert_expiring_unsynced(Tree::Replay, b"p", b"1", ttl)
                .unwrap());
            assert!(!s
                .insert_expiring_unsynced(Tree::Replay, b"p", b"1", ttl)
                .unwrap());
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert!(!s
            .insert_expiring_unsynced(Tree::Replay, b"p", b"1", ttl)
            .unwrap());
        // Positive control: another key is inserted.
        assert!(s
            .insert_expiring_unsynced(Tree::Replay, b"q", b"1", ttl)
            .unwrap());
    }
}
