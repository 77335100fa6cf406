//! Statements through the connection's statement cache (deadpool's
//! `prepare_cached`), prepared again and resent once when the server no
//! longer knows a cached one or its result type changed (the module doc of
//! [`super`], "Statements").

use std::future::Future;

use deadpool_postgres::Object;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::pg_error;
use crate::infra::store::StoreError;

/// Whether the server refused a cached prepared statement without running
/// it: 26000 (it does not know the statement: this session is not the one
/// that prepared it, as behind a pooler in transaction mode, or it was
/// deallocated) or 0A000 (`cached plan must not change result type`: a
/// column it returns changed type since it was prepared). Either way
/// nothing was executed, so preparing it again and resending is safe, also
/// for a write.
fn stale_statement(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::INVALID_SQL_STATEMENT_NAME || *c == SqlState::FEATURE_NOT_SUPPORTED
    })
}

/// Runs `run` with `sql` prepared through the connection's statement
/// cache; on a stale cached statement (see [`stale_statement`]) clears this
/// connection's cache and runs it once more with a fresh one.
async fn with_statement<T, F, Fut>(c: &Object, sql: &str, run: F) -> Result<T, StoreError>
where
    F: Fn(tokio_postgres::Statement) -> Fut,
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    let st = c.prepare_cached(sql).await.map_err(pg_error)?;
    match run(st).await {
        Err(e) if stale_statement(&e) => {
            c.statement_cache.clear();
            let st = c.prepare_cached(sql).await.map_err(pg_error)?;
            run(st).await.map_err(pg_error)
        }
        r => r.map_err(pg_error),
    }
}

/// The rows of the query `sql` (see [`with_statement`]).
pub(super) async fn query_rows(
    c: &Object,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    with_statement(c, sql, |st| async move { c.query(&st, params).await }).await
}

/// The rows a statement that returns none touched (see [`with_statement`]).
pub(super) async fn execute(
    c: &Object,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    with_statement(c, sql, |st| async move { c.execute(&st, params).await }).await
}
