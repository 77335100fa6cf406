//! The shared backend: PostgreSQL, for several instances of one agent
//! (replicas) on one database.
//!
//! Two tables serve every tree (`migrations/0001_records.sql`): `records
//! (tree, key, value)` and `expiring (tree, key, value, expires_at)`, so a
//! new [`Tree`] needs no schema change. Every operation is one statement:
//! compare-and-swap is `INSERT ... ON CONFLICT DO NOTHING`, `UPDATE ...
//! WHERE value = $expected` or `DELETE ... WHERE value = $expected`, and the
//! rows it touched say whether it swapped, so two replicas racing on a key
//! never both win (no read-then-write). Expiry uses the database's clock.
//! Connections ask for `synchronous_commit = on`, so an acknowledged write is
//! on the server's disk (and on its synchronous standbys, if any).
//!
//! Waiting (see the parent module): the queries run on this store's own
//! small runtime; the caller waits on a channel, inside
//! `tokio::task::block_in_place` when it is a worker of a multi-thread
//! runtime. Every operation, connecting included, is bounded by the
//! statement timeout on this side (the server enforces it too). A caller
//! that finds every pooled connection busy waits in line for one, at most
//! [`pool_wait`] (half the statement timeout), so that a burst of requests
//! larger than the pool is served in turn instead of refused; a pool still
//! busy after that (a slow or stuck server) fails. Both answer
//! [`StoreError::Unavailable`].
//!
//! Statements: every one goes through the connection's statement cache
//! (deadpool's `prepare_cached`), so a statement is parsed and planned once
//! per pooled connection and each later use is one round trip (Bind and
//! Execute) instead of two. A cached statement the server no longer knows
//! (a pooler in transaction mode handing over another server session) or
//! whose result type changed under it (a schema change by another replica)
//! is refused before it runs; the connection's cache is then cleared and
//! the statement prepared and sent once more (see [`statements`]).
//!
//! Changes: a trigger on `records` sends `NOTIFY credbroker_changes` with
//! the tree's name; a dedicated connection (not from the pool) listens and
//! moves that tree's [`Store::watch`] counter. It reconnects on its own and
//! moves every counter after each (re)connect, since notifications sent
//! while it was away are lost. Writes in this process move the counter at
//! once as well.
//!
//! Reads on the caller's runtime: [`Store::get_async`] awaited on a
//! current-thread runtime (a `per_core` API thread) runs its statement on
//! that runtime, over a pool of that thread's own (`pool_size` shared out
//! over the threads), and waits on nothing else (see [`here`]).
//!
//! Files: `migrations` (the schema and its versions), `statements` (the
//! statement cache and its retry), `changes` (the change listener), `here`
//! (reads on the caller's runtime).

mod changes;
mod connect;
mod here;
pub(crate) mod migrations;
mod statements;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use tokio_postgres::NoTls;

use super::{check_tree, Entry, Fenced, Lease, Store, StoreError, Tree, Watchers};
use changes::listener;
use connect::{client_config, Reach, Tls};
use statements::{execute, query_rows};

/// Whether the schema may be migrated at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrate {
    /// Only `credbroker store migrate` migrates; an instance on an older
    /// schema refuses to start.
    Manual,
    /// An instance migrates at start (under the migration lock).
    Auto,
}

/// The validated `[postgres]` table of a config file.
#[derive(Debug, Clone)]
pub struct PgSettings {
    /// The config file (named in messages).
    pub config_file: PathBuf,
    /// Host name, address, or a socket directory (starting with `/`).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Database.
    pub database: String,
    /// User.
    pub user: String,
    /// File holding the password (0600), if the server asks for one.
    pub password_file: Option<PathBuf>,
    /// The CA that signed the server's certificate; `None` = no TLS (the
    /// config allows that only on loopback or a socket directory).
    pub ca_file: Option<PathBuf>,
    /// Connections in the pool.
    pub pool_size: usize,
    /// Bound on each operation.
    pub statement_timeout: Duration,
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// Migrate at start or not.
    pub migrate: Migrate,
}

impl PgSettings {
    /// Where the store is, for messages: `host:port/database`.
    fn place(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.database)
    }

    /// A message naming the config file, the key and the cause.
    fn at(&self, key: &str, cause: impl std::fmt::Display) -> String {
        format!("{}: {key}: {cause}", self.config_file.display())
    }
}

/// Maps a driver error: connection trouble, an operator shutting the server
/// down, exhausted resources and timeouts are [`StoreError::Unavailable`]
/// (retrying later may succeed); anything else is a backend error. Only
/// the server's message and code are kept, never its detail (which can
/// quote values).
pub(crate) fn pg_error(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            let text = format!("{} (SQLSTATE {code})", db.message());
            // 08: connection exception, 53: insufficient resources, 57:
            // operator intervention (57014 = statement timeout, 57P01 =
            // shutdown), 40001/40P01: serialization failure, deadlock.
            if ["08", "53", "57"].iter().any(|c| code.starts_with(c))
                || code == "40001"
                || code == "40P01"
            {
                StoreError::Unavailable(text)
            } else {
                StoreError::Backend(text)
            }
        }
        // Without a server error: I/O, a closed connection or a connect
        // timeout are Unavailable; a client-side failure (a parameter that
        // does not encode, a column that does not decode) is a bug, not an
        // outage. The driver's text names no value.
        None => {
            let text = e.to_string();
            let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
            if e.is_closed()
                || io
                || text.starts_with("error connecting")
                || text.starts_with("timeout")
                || text.starts_with("error communicating")
            {
                StoreError::Unavailable(text)
            } else {
                StoreError::Backend(text)
            }
        }
    }
}

/// How long an operation waits for a pooled connection when all are busy:
/// half of its statement timeout, so that the other half is left for the
/// statement itself (the whole operation stays within the timeout).
pub(crate) fn pool_wait(statement_timeout: Duration) -> Duration {
    statement_timeout / 2
}

/// Maps a failure to get a pooled connection. Waiting for a busy pool is
/// named as such; anything else is a connection that could not be opened
/// (the pool opens one when it has none idle), reported by [`Reach`] with
/// the address, the cause and the settings to check.
fn pool_error(e: PoolError, size: usize, waited: Duration, reach: &Reach) -> StoreError {
    use deadpool_postgres::TimeoutType;
    match e {
        PoolError::Timeout(TimeoutType::Wait) => StoreError::Unavailable(format!(
            "every connection of the pool stayed busy for {} ms (pool_size = {size})",
            waited.as_millis()
        )),
        PoolError::Timeout(TimeoutType::Create) => reach.timed_out(reach.connect_timeout()),
        PoolError::Timeout(t) => StoreError::Unavailable(format!("connection timeout ({t:?})")),
        PoolError::Backend(e) => reach.failed(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// A statement that did not finish within the statement timeout.
fn no_answer(limit: Duration) -> StoreError {
    StoreError::Unavailable(format!(
        "no answer within the statement timeout ({} ms)",
        limit.as_millis()
    ))
}

/// A pool of at most `size` connections with `s`'s settings. Its
/// connections are opened, and their I/O tasks spawned, on the runtime of
/// whoever first needs one.
fn build_pool(s: &PgSettings, size: usize) -> Result<Pool, StoreError> {
    let (config, tls) = client_config(s)?;
    let mc = ManagerConfig {
        // `Fast` checks only that the connection is open; a statement
        // on a connection that broke since fails as Unavailable, and the
        // pool drops it.
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls {
        Tls::None => Manager::from_config(config, NoTls, mc),
        Tls::Rustls(t) => Manager::from_config(config, t, mc),
    };
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        // A full pool queues its callers, for a bounded time.
        .wait_timeout(Some(pool_wait(s.statement_timeout)))
        .create_timeout(Some(s.connect_timeout))
        .recycle_timeout(Some(s.statement_timeout))
        .build()
        .map_err(|e| StoreError::Backend(s.at("postgres", e)))
}

/// A PostgreSQL store (see the module docs).
pub struct PgStore {
    pool: Pool,
    /// Each current-thread runtime's own pool, by its thread ([`here`]).
    local: dashmap::DashMap<std::thread::ThreadId, Pool>,
    watchers: Arc<Watchers>,
    settings: PgSettings,
    reach: Reach,
    // `Option` so that `Drop` can take it: a runtime dropped inside another
    // runtime's context panics, so it is shut down in the background.
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("at", &self.settings.place())
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl PgStore {
    /// Opens the store: builds the pool, checks the schema (and migrates it
    /// when `migrate = "auto"`), and starts listening for changes. Refuses a
    /// schema migrated for a newer binary, and an older schema unless it may
    /// migrate, naming the config file and what to do.
    pub fn open(s: &PgSettings) -> Result<PgStore, StoreError> {
        let store = PgStore::connect(s)?;
        let state = store.run("read the schema version", |c| async move {
            migrations::state(&c).await
        })?;
        match migrations::verdict(&state, migrations::THIS_BINARY) {
            migrations::Verdict::Usable => {}
            migrations::Verdict::TooNew => {
                return Err(StoreError::Backend(s.at(
                    "postgres",
                    format!(
                        "the schema of {} is at version {}, which needs credbroker {} or later; this is credbroker {} (upgrade this binary: a migration cannot be undone)",
                        s.place(),
                        state.version,
                        state.oldest_binary,
                        migrations::THIS_BINARY
                    ),
                )))
            }
            migrations::Verdict::NeedsMigration if s.migrate == Migrate::Auto => {
                let applied = store.migrate()?;
                tracing::info!(?applied, at = %s.place(), "migrated the store's schema");
            }
            migrations::Verdict::NeedsMigration => {
                return Err(StoreError::Backend(s.at(
                    "postgres",
                    format!(
                        "the schema of {} is at version {}; this binary needs version {}: run `credbroker store migrate --config {}`, or set [postgres] migrate = \"auto\"",
                        s.place(),
                        state.version,
                        migrations::LATEST,
                        s.config_file.display()
                    ),
                )))
            }
        }
        store.listen()?;
        Ok(store)
    }

    /// Opens the pool only (no schema check, no listener): for `store
    /// migrate`.
    pub fn connect(s: &PgSettings) -> Result<PgStore, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("credbroker-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot start the store's runtime: {e}")))?;
        Ok(PgStore {
            pool: build_pool(s, s.pool_size)?,
            local: dashmap::DashMap::new(),
            watchers: Arc::new(Watchers::new()),
            settings: s.clone(),
            reach: Reach::new(s),
            rt: Some(rt),
        })
    }

    /// Applies the migrations this binary has and the schema lacks; returns
    /// the versions applied (none when it was current).
    pub fn migrate(&self) -> Result<Vec<i32>, StoreError> {
        let pool = self.pool.clone();
        let size = self.settings.pool_size;
        let wait = pool_wait(self.settings.statement_timeout);
        let reach = self.reach.clone();
        // Migrations may take longer than one statement: bounded by the
        // connect timeout plus a minute, not by the statement timeout.
        let limit = Duration::from_secs(60) + self.settings.connect_timeout;
        self.block(
            limit,
            move |_| {
                StoreError::Unavailable(format!(
                    "the migration did not finish within {} s",
                    limit.as_secs()
                ))
            },
            async move {
                let mut c = pool
                    .get()
                    .await
                    .map_err(|e| pool_error(e, size, wait, &reach))?;
                // The session's statement timeout does not apply to DDL here.
                c.batch_execute("SET statement_timeout = 0")
                    .await
                    .map_err(pg_error)?;
                let applied = migrations::migrate(&mut c).await;
                // Do not hand this session back with its timeout lifted.
                let _ = c.batch_execute("RESET statement_timeout").await;
                applied.map_err(|e| match e {
                    StoreError::Backend(m) if m.contains("(SQLSTATE 42501)") => {
                        StoreError::Backend(format!(
                            "{m}: migrating needs a role with CREATE on the schema; the \
                             replicas' runtime role needs only the grants docs/STORE.md \
                             lists (\"The database roles\")"
                        ))
                    }
                    other => other,
                })
            },
        )
    }

    /// The schema as found in the database.
    pub fn schema_version(&self) -> Result<(i32, String), StoreError> {
        let s = self.run("read the schema version", |c| async move {
            migrations::state(&c).await
        })?;
        Ok((s.version, s.oldest_binary))
    }

    /// For tests: drops, on the server, the prepared statements of one
    /// pooled connection while leaving them in its client-side cache, as a
    /// pooler in transaction mode does when it hands the next transaction
    /// another server session. (A simple query: it does not go through the
    /// cache itself.)
    #[doc(hidden)]
    pub fn deallocate_on_server_only(&self) -> Result<(), StoreError> {
        self.run("deallocate", |c| async move {
            c.batch_execute("DEALLOCATE ALL").await.map_err(pg_error)
        })
    }

    /// How many rows (records and expiring entries) `tree` holds, for
    /// `store copy`'s verification.
    pub fn count(&self, tree: Tree) -> Result<u64, StoreError> {
        let table = if tree.expires() {
            "expiring"
        } else {
            "records"
        };
        let sql = format!("SELECT count(*) FROM {table} WHERE tree = $1");
        self.run("count", move |c| async move {
            let rows = query_rows(&c, &sql, &[&tree.name()]).await?;
            let n = rows.first().map_or(0, |r| r.get::<_, i64>(0));
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Writes an expiring entry as it is, with its remaining lifetime (for
    /// `store copy`).
    pub fn put_expiring_raw(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        check_tree(tree, true)?;
        let (key, value) = (key.to_vec(), value.to_vec());
        let ms = ttl.as_millis() as i64;
        self.run("copy an expiring entry", move |c| async move {
            execute(
                &c,
                "INSERT INTO expiring (tree, key, value, expires_at) \
                 VALUES ($1, $2, $3, now() + $4::bigint * interval '1 millisecond') \
                 ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at",
                &[&tree.name(), &key, &value, &ms],
            )
            .await?;
            Ok(())
        })
    }

    fn rt(&self) -> Result<&tokio::runtime::Runtime, StoreError> {
        self.rt
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable("the store is closed".into()))
    }

    /// Runs `op` with a pooled connection, bounded by the statement timeout.
    fn run<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let pool = self.pool.clone();
        let size = self.settings.pool_size;
        let limit = self.settings.statement_timeout;
        let wait = pool_wait(limit);
        let reach = self.reach.clone();
        // Whether a connection was had: a timeout before that is a
        // connection that could not be opened in time (waiting for a busy
        // pool ends earlier, at `wait`), named as such.
        let connected = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let had = connected.clone();
        let on_timeout = move |limit: Duration| {
            if had.load(std::sync::atomic::Ordering::SeqCst) {
                no_answer(limit)
            } else {
                reach.timed_out(limit)
            }
        };
        let reach = self.reach.clone();
        let r = self.block(limit, on_timeout, async move {
            let c = pool
                .get()
                .await
                .map_err(|e| pool_error(e, size, wait, &reach))?;
            connected.store(true, std::sync::atomic::Ordering::SeqCst);
            op(c).await
        });
        r.map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{what}: {m}")),
            other => other,
        })
    }

    /// Runs `fut` on the store's runtime and waits for it at most `limit`
    /// (past it, the error `on_timeout` makes), without parking a worker of
    /// the caller's runtime.
    fn block<T: Send + 'static>(
        &self,
        limit: Duration,
        on_timeout: impl FnOnce(Duration) -> StoreError + Send + 'static,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt()?.spawn(async move {
            let r = match tokio::time::timeout(limit, fut).await {
                Ok(r) => r,
                Err(_) => Err(on_timeout(limit)),
            };
            let _ = tx.send(r);
        });
        let wait = move || {
            rx.recv().unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the store's runtime stopped".into(),
                ))
            })
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            // A current-thread runtime (tests, one-shot commands) or no
            // runtime: the query runs on our own runtime, so waiting here
            // cannot deadlock.
            _ => wait(),
        }
    }

    /// Starts the change listener (see the module docs).
    fn listen(&self) -> Result<(), StoreError> {
        let (config, tls) = client_config(&self.settings)?;
        let watchers = self.watchers.clone();
        self.rt()?.spawn(listener(config, tls, watchers));
        Ok(())
    }

    /// Runs a write statement and moves the tree's counter if it changed
    /// anything; returns the rows it touched.
    fn write(
        &self,
        what: &'static str,
        tree: Tree,
        sql: &'static str,
        params: Params,
    ) -> Result<u64, StoreError> {
        let n = self.run(what, move |c| async move {
            let refs = params.refs();
            execute(&c, sql, &refs).await
        })?;
        if n > 0 {
            self.watchers.bump(tree);
        }
        Ok(n)
    }

    fn query_value(
        &self,
        what: &'static str,
        sql: &'static str,
        params: Params,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(what, move |c| async move {
            let refs = params.refs();
            // At most one row: (tree, key) is the primary key.
            let rows = query_rows(&c, sql, &refs).await?;
            Ok(rows.first().map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }
}

/// Statement parameters, owned so that they can move to the store's
/// runtime: the tree's name, then byte strings, then an optional number
/// (a lifetime in milliseconds).
struct Params {
    tree: &'static str,
    bytes: Vec<Vec<u8>>,
    ms: Option<i64>,
}

impl Params {
    fn new(tree: Tree, bytes: &[&[u8]]) -> Params {
        Params {
            tree: tree.name(),
            bytes: bytes.iter().map(|b| b.to_vec()).collect(),
            ms: None,
        }
    }

    fn with_ms(mut self, d: Duration) -> Params {
        self.ms = Some(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self
    }

    fn refs(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        let mut v: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&self.tree];
        v.extend(
            self.bytes
                .iter()
                .map(|b| b as &(dyn tokio_postgres::types::ToSql + Sync)),
        );
        if let Some(ms) = &self.ms {
            v.push(ms);
        }
        v
    }
}

/// The smallest key greater than every key starting with `prefix`, if any
/// (none when the prefix is all 0xff bytes, or empty).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl Store for PgStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_tree(tree, false)?;
        self.query_value("get", here::GET, Params::new(tree, &[key]))
    }

    fn get_async<'a>(
        &'a self,
        tree: Tree,
        key: &'a [u8],
    ) -> super::StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(self.get_here(tree, key))
    }

    fn put(&self, tree: Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        check_tree(tree, false)?;
        self.write(
            "put",
            tree,
            "INSERT INTO records (tree, key, value) VALUES ($1, $2, $3) \
             ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value",
            Params::new(tree, &[key, value]),
        )?;
        Ok(())
    }

    fn delete(&self, tree: Tree, key: &[u8]) -> Result<(), StoreError> {
        check_tree(tree, false)?;
        self.write(
            "delete",
            tree,
            "DELETE FROM records WHERE tree = $1 AND key = $2",
            Params::new(tree, &[key]),
        )?;
        Ok(())
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, StoreError> {
        check_tree(tree, false)?;
        // bytea compares bytewise (then by length), the order sled keeps.
        let (sql, params) = match prefix_end(prefix) {
            Some(end) => (
                "SELECT key, value FROM records WHERE tree = $1 AND key >= $2 AND key < $3 ORDER BY key",
                Params::new(tree, &[prefix, &end]),
            ),
            None => (
                "SELECT key, value FROM records WHERE tree = $1 AND key >= $2 ORDER BY key",
                Params::new(tree, &[prefix]),
            ),
        };
        self.run("scan", move |c| async move {
            let refs = params.refs();
            let rows = query_rows(&c, sql, &refs).await?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                .collect())
        })
    }

    fn compare_and_swap(
        &self,
        tree: Tree,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        check_tree(tree, false)?;
        let n = match (expected, new) {
            (None, Some(new)) => self.write(
                "compare-and-swap",
                tree,
                "INSERT INTO records (tree, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (tree, key) DO NOTHING",
                Params::new(tree, &[key, new]),
            )?,
            (Some(old), Some(new)) => self.write(
                "compare-and-swap",
                tree,
                "UPDATE records SET value = $4 WHERE tree = $1 AND key = $2 AND value = $3",
                Params::new(tree, &[key, old, new]),
            )?,
            (Some(old), None) => self.write(
                "compare-and-swap",
                tree,
                "DELETE FROM records WHERE tree = $1 AND key = $2 AND value = $3",
                Params::new(tree, &[key, old]),
            )?,
            // "Absent, and leave it absent": a read, as no write happens.
            (None, None) => {
                return Ok(self
                    .query_value(
                        "compare-and-swap",
                        "SELECT value FROM records WHERE tree = $1 AND key = $2",
                        Params::new(tree, &[key]),
                    )?
                    .is_none())
            }
        };
        Ok(n == 1)
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
        // One statement. `FOR SHARE` locks the lease row while the update
        // runs: a successor's takeover (the `ON CONFLICT DO UPDATE` of
        // `insert_expiring`) waits for this statement, and one that got
        // there first has changed the row, which the lock's re-check then
        // excludes. The clock is the database's, as for the lease itself.
        let (t, lt) = (tree.name(), lease.tree.name());
        let bytes: Vec<Vec<u8>> = [key, expected, new, lease.key, lease.holder]
            .iter()
            .map(|b| b.to_vec())
            .collect();
        let (held, swapped) = self.run("fenced compare-and-swap", move |c| async move {
            let rows = query_rows(
                    &c,
                    "WITH lease AS (                        SELECT 1 FROM expiring                        WHERE tree = $5 AND key = $6 AND value = $7 AND expires_at > clock_timestamp()                        FOR SHARE                      ), swapped AS (                        UPDATE records SET value = $4                        WHERE tree = $1 AND key = $2 AND value = $3 AND EXISTS (SELECT 1 FROM lease)                        RETURNING 1                      )                      SELECT EXISTS (SELECT 1 FROM lease), EXISTS (SELECT 1 FROM swapped)",
                    &[&t, &bytes[0], &bytes[1], &bytes[2], &lt, &bytes[3], &bytes[4]],
                )
                .await?;
            // The outer SELECT has no FROM: always exactly one row.
            let row = rows.first().ok_or_else(|| {
                StoreError::Backend("fenced compare-and-swap: no row returned".into())
            })?;
            Ok((row.get::<_, bool>(0), row.get::<_, bool>(1)))
        })?;
        Ok(match (held, swapped) {
            (_, true) => {
                self.watchers.bump(tree);
                Fenced::Swapped
            }
            (true, false) => Fenced::Changed,
            (false, false) => Fenced::LeaseLost,
        })
    }

    fn is_healthy(&self) -> bool {
        self.run("health check", |c| async move {
            c.simple_query("SELECT 1").await.map_err(pg_error)?;
            Ok(())
        })
        .is_ok()
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn clock_sample(
        &self,
        local: &crate::base::clock::SharedClock,
    ) -> Result<Option<super::ClockSample>, StoreError> {
        let local = local.clone();
        self.run("read the database's clock", move |c| async move {
            // Timed around the query alone, on a connection already had
            // (waiting for the pool or connecting would make the round trip
            // lopsided), and as a simple query: one round trip, where a
            // statement prepared first would take two.
            let sent_ms = local.now_ms();
            let answer = c
                .simple_query("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
                .await
                .map_err(pg_error)?;
            let received_ms = local.now_ms();
            let store_ms = answer.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    r.get(0).and_then(|v| v.parse::<i64>().ok())
                }
                _ => None,
            });
            Ok(store_ms.map(|store_ms| super::ClockSample {
                sent_ms,
                received_ms,
                store_ms,
            }))
        })
    }

    fn insert_expiring(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        check_tree(tree, true)?;
        // One statement: a racing insert waits on the key's index entry and
        // then takes the conflict branch, whose WHERE sees the winner's live
        // entry and changes nothing (0 rows).
        let n = self.write(
            "insert an expiring entry",
            tree,
            "INSERT INTO expiring (tree, key, value, expires_at) \
             VALUES ($1, $2, $3, now() + $4::bigint * interval '1 millisecond') \
             ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at \
             WHERE expiring.expires_at <= now()",
            Params::new(tree, &[key, value]).with_ms(ttl),
        )?;
        Ok(n == 1)
    }

    fn get_expiring(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_tree(tree, true)?;
        self.query_value(
            "read an expiring entry",
            "SELECT value FROM expiring WHERE tree = $1 AND key = $2 AND expires_at > now()",
            Params::new(tree, &[key]),
        )
    }

    fn replace_expiring(
        &self,
        tree: Tree,
        key: &[u8],
        expected: &[u8],
        new: Option<(&[u8], Duration)>,
    ) -> Result<bool, StoreError> {
        check_tree(tree, true)?;
        let n = match new {
            Some((value, ttl)) => self.write(
                "renew an expiring entry",
                tree,
                "UPDATE expiring SET value = $4, expires_at = now() + $5::bigint * interval '1 millisecond' \
                 WHERE tree = $1 AND key = $2 AND value = $3 AND expires_at > now()",
                Params::new(tree, &[key, expected, value]).with_ms(ttl),
            )?,
            None => self.write(
                "release an expiring entry",
                tree,
                "DELETE FROM expiring WHERE tree = $1 AND key = $2 AND value = $3 AND expires_at > now()",
                Params::new(tree, &[key, expected]),
            )?,
        };
        Ok(n == 1)
    }

    fn sweep_expired(&self, tree: Tree) -> Result<usize, StoreError> {
        check_tree(tree, true)?;
        // Several replicas sweeping at once each delete disjoint rows (a
        // row another one deleted first is skipped), so the sum is right.
        let n = self.write(
            "sweep expired entries",
            tree,
            "DELETE FROM expiring WHERE tree = $1 AND expires_at <= now()",
            Params::new(tree, &[]),
        )?;
        Ok(n as usize)
    }

    fn watch(&self, tree: Tree) -> tokio::sync::watch::Receiver<u64> {
        self.watchers.subscribe(tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::store::ALL_TREES;

    #[test]
    fn prefix_end_skips_trailing_ff() {
        assert_eq!(prefix_end(b"a/"), Some(b"a0".to_vec()));
        assert_eq!(prefix_end(&[0x61, 0xff]), Some(vec![0x62]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn every_tree_is_found_by_its_name() {
        for t in ALL_TREES {
            assert_eq!(changes::tree_named(t.name()), Some(t));
        }
        assert_eq!(changes::tree_named("nope"), None);
    }
}
