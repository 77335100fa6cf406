//! `credbroker store copy`: every record of a sled store into an empty
//! PostgreSQL store, as stored (sealed records stay sealed: nothing is
//! decrypted on the way), then verified by reading each one back and
//! comparing the counts per tree.

use std::time::Duration;

use super::{PgStore, SledStore, Store, StoreError, Tree, ALL_TREES};

/// What was copied, per tree.
#[derive(Debug, Default)]
pub(crate) struct CopyReport {
    /// `(tree, entries copied)`, every tree in [`ALL_TREES`] order.
    pub trees: Vec<(&'static str, u64)>,
}

/// Errors of a copy.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    /// A store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The target already holds entries.
    #[error("the target store is not empty ({0} entries in tree {1}); refusing to overwrite it without --force")]
    NotEmpty(u64, &'static str),
    /// A copied entry does not read back as written, or the counts differ.
    #[error("verification failed in tree {tree}: {what}")]
    Mismatch {
        /// The tree.
        tree: &'static str,
        /// What differs (counts, never values).
        what: String,
    },
}

/// Copies `from` into `to` (see the module docs). Refuses a target that
/// holds anything unless `force`; with `force`, entries of the same key are
/// overwritten and others kept, so the count check becomes "at least".
pub(crate) fn copy(from: &SledStore, to: &PgStore, force: bool) -> Result<CopyReport, CopyError> {
    let mut before = Vec::new();
    for t in ALL_TREES {
        let n = to.count(t)?;
        if n > 0 && !force {
            return Err(CopyError::NotEmpty(n, t.name()));
        }
        before.push(n);
    }
    let mut report = CopyReport::default();
    for (t, had) in ALL_TREES.into_iter().zip(before) {
        let copied = if t.expires() {
            copy_expiring(from, to, t)?
        } else {
            copy_records(from, to, t)?
        };
        let now = to.count(t)?;
        // Expiring entries may lapse during the copy; records may not.
        let ok = if t.expires() {
            now <= had + copied
        } else if had == 0 {
            now == copied
        } else {
            now >= copied
        };
        if !ok {
            return Err(CopyError::Mismatch {
                tree: t.name(),
                what: format!("copied {copied}, the target holds {now} (held {had} before)"),
            });
        }
        report.trees.push((t.name(), copied));
    }
    Ok(report)
}

fn copy_records(from: &SledStore, to: &PgStore, t: Tree) -> Result<u64, CopyError> {
    let entries = from.scan_prefix(t, b"")?;
    for (k, v) in &entries {
        to.put(t, k, v)?;
    }
    for (i, (k, v)) in entries.iter().enumerate() {
        if to.get(t, k)?.as_deref() != Some(v.as_slice()) {
            return Err(CopyError::Mismatch {
                tree: t.name(),
                what: format!("entry {i} does not read back as written"),
            });
        }
    }
    Ok(entries.len() as u64)
}

fn copy_expiring(from: &SledStore, to: &PgStore, t: Tree) -> Result<u64, CopyError> {
    let mut n = 0;
    for (k, v, left) in from.live_expiring(t)? {
        to.put_expiring_raw(t, &k, &v, left.max(Duration::from_millis(1)))?;
        n += 1;
    }
    Ok(n)
}
