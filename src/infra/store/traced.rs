//! A [`Store`] that gives each operation made inside a traced request its
//! own span (`store`, with the operation's name and the tree's, never a
//! key or a value): the slow path of a request as the collector sees it.
//!
//! Only requests already traced get spans ([`telemetry::child`] finds no
//! scope elsewhere and returns at once), so background work (sweeps,
//! delivery cursors) records none. The `self` derive makes no store call,
//! so it has none either: this wrapper adds no call, it only watches.
//! The composition root wraps the store in it only when spans are on.

use std::time::Duration;

use super::{ClockSample, Entry, Fenced, Lease, Store, StoreError, StoreFuture, Tree};
use crate::base::clock::SharedClock;
use crate::infra::telemetry;

/// The store `inner`, with a span per operation in traced requests.
#[derive(Debug)]
pub(crate) struct Traced(pub(crate) std::sync::Arc<dyn Store>);

/// A span for `op` on `tree`, current until dropped, marked failed when the
/// operation fails.
fn traced<T>(
    op: &'static str,
    tree: Tree,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut span = telemetry::child("store");
    span.set("credbroker.store.operation", op);
    span.set("credbroker.store.tree", tree.name());
    let r = f();
    if r.is_err() {
        span.fail();
    }
    r
}

impl Store for Traced {
    fn get(&self, t: Tree, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        traced("get", t, || self.0.get(t, k))
    }
    fn get_async<'a>(&'a self, t: Tree, k: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            // The span is the request task's (a task-local scope), held
            // across the await as the pipeline's own spans are.
            let mut span = telemetry::child("store");
            span.set("credbroker.store.operation", "get");
            span.set("credbroker.store.tree", t.name());
            let r = self.0.get_async(t, k).await;
            if r.is_err() {
                span.fail();
            }
            r
        })
    }
    fn put(&self, t: Tree, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        traced("put", t, || self.0.put(t, k, v))
    }
    fn delete(&self, t: Tree, k: &[u8]) -> Result<(), StoreError> {
        traced("delete", t, || self.0.delete(t, k))
    }
    fn scan_prefix(&self, t: Tree, p: &[u8]) -> Result<Vec<Entry>, StoreError> {
        traced("scan_prefix", t, || self.0.scan_prefix(t, p))
    }
    fn compare_and_swap(
        &self,
        t: Tree,
        k: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        traced("compare_and_swap", t, || {
            self.0.compare_and_swap(t, k, expected, new)
        })
    }
    fn replace_fenced(
        &self,
        t: Tree,
        k: &[u8],
        expected: &[u8],
        new: &[u8],
        lease: Lease<'_>,
    ) -> Result<Fenced, StoreError> {
        traced("replace_fenced", t, || {
            self.0.replace_fenced(t, k, expected, new, lease)
        })
    }
    fn is_healthy(&self) -> bool {
        self.0.is_healthy()
    }
    fn is_shared(&self) -> bool {
        self.0.is_shared()
    }
    fn clock_sample(&self, local: &SharedClock) -> Result<Option<ClockSample>, StoreError> {
        self.0.clock_sample(local)
    }
    fn insert_expiring(
        &self,
        t: Tree,
        k: &[u8],
        v: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        traced("insert_expiring", t, || {
            self.0.insert_expiring(t, k, v, ttl)
        })
    }
    fn insert_expiring_unsynced(
        &self,
        t: Tree,
        k: &[u8],
        v: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        traced("insert_expiring", t, || {
            self.0.insert_expiring_unsynced(t, k, v, ttl)
        })
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.0.sync()
    }
    fn get_expiring(&self, t: Tree, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        traced("get_expiring", t, || self.0.get_expiring(t, k))
    }
    fn replace_expiring(
        &self,
        t: Tree,
        k: &[u8],
        expected: &[u8],
        new: Option<(&[u8], Duration)>,
    ) -> Result<bool, StoreError> {
        traced("replace_expiring", t, || {
            self.0.replace_expiring(t, k, expected, new)
        })
    }
    fn sweep_expired(&self, t: Tree) -> Result<usize, StoreError> {
        traced("sweep_expired", t, || self.0.sweep_expired(t))
    }
    fn watch(&self, t: Tree) -> tokio::sync::watch::Receiver<u64> {
        self.0.watch(t)
    }
}
