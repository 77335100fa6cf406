//! The embedded backend: sled 0.34 (single process; see `admin` for how the
//! CLI reaches a running instance instead of opening the store).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Store, StoreError, Tree};

/// A sled database in a directory of mode 0700.
#[derive(Debug)]
pub struct SledStore {
    db: sled::Db,
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
            _closed: WaitForRelease {
                // The file sled locks (its `Config::db_path`).
                file: dir.join("db").join("db"),
            },
        })
    }

    fn tree(&self, t: Tree) -> Result<sled::Tree, StoreError> {
        self.db.open_tree(t.name()).map_err(backend)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(backend)
    }
}

impl Store for SledStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .tree(tree)?
            .get(key)
            .map_err(backend)?
            .map(|v| v.to_vec()))
    }

    fn put(&self, tree: Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.tree(tree)?.insert(key, value).map_err(backend)?;
        self.flush()
    }

    fn delete(&self, tree: Tree, key: &[u8]) -> Result<(), StoreError> {
        self.tree(tree)?.remove(key).map_err(backend)?;
        self.flush()
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<super::Entry>, StoreError> {
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
        let swapped = self
            .tree(tree)?
            .compare_and_swap(key, expected, new)
            .map_err(backend)?
            .is_ok();
        if swapped {
            self.flush()?;
        }
        Ok(swapped)
    }

    fn is_healthy(&self) -> bool {
        self.db.was_recovered() || self.db.size_on_disk().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
