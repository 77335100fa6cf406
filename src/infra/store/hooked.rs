//! For tests (the crate's and the integration tests'; hidden from the
//! docs, as [`super::contract`] is): a store that runs a hook before each
//! write and otherwise passes everything to the store it wraps. The hook can fail the write
//! (a full disk, a read-only file system) or write something first itself,
//! as another replica would between a reader's read and its write.

use std::sync::Arc;

use super::{Entry, Fenced, Lease, Store, StoreError, StoreFuture, Tree};

/// What runs before each write: `Err` fails the write with that error.
type Hook = Box<dyn Fn(Tree) -> Result<(), StoreError> + Send + Sync>;

/// A store whose writes go through a hook first (see the module doc).
pub struct Hooked {
    inner: Arc<dyn Store>,
    before_write: Hook,
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Hooked {
    /// `inner`, with `before_write` run before each of its writes.
    pub fn new(
        inner: Arc<dyn Store>,
        before_write: impl Fn(Tree) -> Result<(), StoreError> + Send + Sync + 'static,
    ) -> Hooked {
        Hooked {
            inner,
            before_write: Box::new(before_write),
        }
    }
}

impl Store for Hooked {
    fn get(&self, t: Tree, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(t, k)
    }
    // Reads are not hooked: the inner store's own, async where it is.
    fn get_async<'a>(&'a self, t: Tree, k: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.inner.get_async(t, k)
    }
    fn put(&self, t: Tree, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        (self.before_write)(t)?;
        self.inner.put(t, k, v)
    }
    fn delete(&self, t: Tree, k: &[u8]) -> Result<(), StoreError> {
        (self.before_write)(t)?;
        self.inner.delete(t, k)
    }
    fn scan_prefix(&self, t: Tree, p: &[u8]) -> Result<Vec<Entry>, StoreError> {
        self.inner.scan_prefix(t, p)
    }
    fn compare_and_swap(
        &self,
        t: Tree,
        k: &[u8],
        e: Option<&[u8]>,
        n: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        (self.before_write)(t)?;
        self.inner.compare_and_swap(t, k, e, n)
    }
    fn replace_fenced(
        &self,
        t: Tree,
        k: &[u8],
        e: &[u8],
        n: &[u8],
        lease: Lease<'_>,
    ) -> Result<Fenced, StoreError> {
        (self.before_write)(t)?;
        self.inner.replace_fenced(t, k, e, n, lease)
    }
    fn is_healthy(&self) -> bool {
        self.inner.is_healthy()
    }
    fn clock_sample(
        &self,
        local: &crate::base::clock::SharedClock,
    ) -> Result<Option<super::ClockSample>, StoreError> {
        self.inner.clock_sample(local)
    }
    fn insert_expiring(
        &self,
        t: Tree,
        k: &[u8],
        v: &[u8],
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        (self.before_write)(t)?;
        self.inner.insert_expiring(t, k, v, ttl)
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync()
    }
    fn get_expiring(&self, t: Tree, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_expiring(t, k)
    }
    fn replace_expiring(
        &self,
        t: Tree,
        k: &[u8],
        e: &[u8],
        n: Option<(&[u8], std::time::Duration)>,
    ) -> Result<bool, StoreError> {
        (self.before_write)(t)?;
        self.inner.replace_expiring(t, k, e, n)
    }
    fn sweep_expired(&self, t: Tree) -> Result<usize, StoreError> {
        (self.before_write)(t)?;
        self.inner.sweep_expired(t)
    }
    fn watch(&self, t: Tree) -> tokio::sync::watch::Receiver<u64> {
        self.inner.watch(t)
    }
}
