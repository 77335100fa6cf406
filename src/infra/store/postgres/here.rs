//! Reads on the caller's runtime ([`Store::get_async`]; the module doc of
//! [`super`]). Awaited on a current-thread runtime (each `per_core` API
//! thread has one), a read runs its statement on that runtime over a pool
//! of that thread's own, made on first use there, so its connections'
//! I/O tasks run on that runtime too: the request's thread writes the
//! statement, goes back to its other connections, and reads the answer
//! when it comes, with no other thread woken. Anywhere else (a
//! multi-thread runtime, no runtime) it is [`Store::get`].
//!
//! Each thread's pool holds at most `pool_size` divided by the number of
//! CPUs (rounded up) connections, so the API threads together stay near
//! `pool_size`, beside the store's own pool for every other operation.
//! The bounds are [`Store::get`]'s: the pool's wait, then the statement
//! timeout on the whole read.

use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::Pool;

use super::statements::query_rows;
use super::{build_pool, no_answer, pool_error, pool_wait, PgStore};
use crate::infra::store::{check_tree, Store, StoreError, Tree};

/// The statement of [`Store::get`].
pub(super) const GET: &str = "SELECT value FROM records WHERE tree = $1 AND key = $2";

impl PgStore {
    /// This thread's pool, when the caller runs on a current-thread
    /// runtime; made on first use. `None` elsewhere, or when the pool
    /// cannot be built (the password file unreadable since start): the
    /// read then goes the usual way, which reports that.
    fn local_pool(&self) -> Option<Pool> {
        let here = tokio::runtime::Handle::try_current().ok()?;
        if here.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread {
            return None;
        }
        let thread = std::thread::current().id();
        if let Some(p) = self.local.get(&thread) {
            return Some(p.clone());
        }
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let pool = build_pool(&self.settings, self.settings.pool_size.div_ceil(cpus)).ok()?;
        self.local.insert(thread, pool.clone());
        Some(pool)
    }

    /// [`Store::get`] on the caller's runtime where it can be (see the
    /// module doc).
    pub(super) async fn get_here(
        &self,
        tree: Tree,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        check_tree(tree, false)?;
        let Some(pool) = self.local_pool() else {
            return self.get(tree, key);
        };
        let limit = self.settings.statement_timeout;
        let wait = pool_wait(limit);
        let size = pool.status().max_size;
        // Whether a connection was had: a timeout before that is one that
        // could not be opened in time (as `run` names it).
        let connected = AtomicBool::new(false);
        let name = tree.name();
        let read = async {
            let c = pool
                .get()
                .await
                .map_err(|e| pool_error(e, size, wait, &self.reach))?;
            connected.store(true, Ordering::Relaxed);
            let rows = query_rows(&c, GET, &[&name, &key]).await?;
            // At most one row: (tree, key) is the primary key.
            Ok(rows.first().map(|r| r.get::<_, Vec<u8>>(0)))
        };
        let r = match tokio::time::timeout(limit, read).await {
            Ok(r) => r,
            Err(_) if connected.load(Ordering::Relaxed) => Err(no_answer(limit)),
            Err(_) => Err(self.reach.timed_out(limit)),
        };
        r.map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("get: {m}")),
            other => other,
        })
    }
}
