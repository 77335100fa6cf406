//! The schema: versioned, expand-only migrations embedded in the binary.
//!
//! Each migration only adds (tables, columns with defaults, indexes), so a
//! binary that knows fewer migrations keeps working on a newer schema: a
//! rolling update migrates while old replicas still run, and a rollback
//! runs the old binary on the new schema. When a change cannot be made
//! that way, its migration raises `oldest_binary`, and every binary older
//! than that refuses to start (the only safe answer: it would misread the
//! data).
//!
//! `schema_migrations` holds one row per applied migration with the oldest
//! binary version that can use the schema from then on. Migrating takes a
//! transaction-scoped advisory lock, so replicas that start together and
//! all migrate apply each migration once.

use tokio_postgres::Client;

use super::pg_error;
use crate::infra::store::StoreError;

/// One migration.
struct Migration {
    version: i32,
    /// The oldest credbroker version that can run on the schema once this
    /// migration is applied.
    oldest_binary: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    oldest_binary: "0.1.0",
    sql: include_str!("migrations/0001_records.sql"),
}];

/// The newest schema version this binary knows.
pub(crate) const LATEST: i32 = 1;

/// An arbitrary constant naming credbroker's migration lock among the
/// database's advisory locks.
const LOCK: i64 = 0x6372_6564_6272_6f6b; // "credbrok"

/// This binary's version.
pub(crate) const THIS_BINARY: &str = env!("CARGO_PKG_VERSION");

/// The schema as found in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaState {
    /// The newest applied migration (0 for an empty database).
    pub(crate) version: i32,
    /// The oldest binary that can use it.
    pub(crate) oldest_binary: String,
}

/// Reads the schema's version (0 when nothing was ever migrated).
pub(crate) async fn state(client: &Client) -> Result<SchemaState, StoreError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
        .await
        .map_err(pg_error)?
        .get(0);
    if !exists {
        return Ok(SchemaState {
            version: 0,
            oldest_binary: "0.0.0".into(),
        });
    }
    let row = client
        .query_opt(
            "SELECT version, oldest_binary FROM schema_migrations ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await
        .map_err(pg_error)?;
    Ok(match row {
        Some(r) => SchemaState {
            version: r.get(0),
            oldest_binary: r.get(1),
        },
        None => SchemaState {
            version: 0,
            oldest_binary: "0.0.0".into(),
        },
    })
}

/// Applies every migration newer than the schema, each once, under the
/// migration lock, in one transaction. Returns the versions applied (none
/// when the schema was current: running it twice is harmless).
pub(crate) async fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    let tx = client.transaction().await.map_err(pg_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await
        .map_err(pg_error)?;
    // `CREATE TABLE IF NOT EXISTS` on an existing table answers a NOTICE
    // ("already exists, skipping"), which the client would log on every
    // run after the first: for this transaction only, warnings and worse.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await
        .map_err(pg_error)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version       integer     PRIMARY KEY,
             oldest_binary text        NOT NULL,
             applied_at    timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(pg_error)?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .map_err(pg_error)?
        .get(0);
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.batch_execute(m.sql).await.map_err(|e| {
            StoreError::Backend(format!("migration {}: {}", m.version, pg_error(e)))
        })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, oldest_binary) VALUES ($1, $2)",
            &[&m.version, &m.oldest_binary],
        )
        .await
        .map_err(pg_error)?;
        applied.push(m.version);
    }
    tx.commit().await.map_err(pg_error)?;
    Ok(applied)
}

/// A version `a.b.c` as numbers (a missing or non-numeric part counts as 0,
/// so a pre-release suffix compares as its release).
pub(crate) fn parse_version(v: &str) -> [u64; 3] {
    let mut out = [0; 3];
    for (slot, part) in out.iter_mut().zip(v.split('.')) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        *slot = digits.parse().unwrap_or(0);
    }
    out
}

/// What a binary of version `this` may do with `schema`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Use it.
    Usable,
    /// Older than this binary needs: migrate first.
    NeedsMigration,
    /// Migrated for binaries newer than this one: refuse to start.
    TooNew,
}

pub(crate) fn verdict(schema: &SchemaState, this: &str) -> Verdict {
    if parse_version(this) < parse_version(&schema.oldest_binary) {
        Verdict::TooNew
    } else if schema.version < LATEST {
        Verdict::NeedsMigration
    } else {
        Verdict::Usable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(parse_version("0.10.0") > parse_version("0.9.9"));
        assert_eq!(parse_version("1.2.3-rc1"), [1, 2, 3]);
        let s = |v: i32, ob: &str| SchemaState {
            version: v,
            oldest_binary: ob.into(),
        };
        assert_eq!(verdict(&s(LATEST, "0.1.0"), "0.1.0"), Verdict::Usable);
        // A newer schema that this binary can still use (expand-only).
        assert_eq!(verdict(&s(LATEST + 5, "0.1.0"), "0.1.0"), Verdict::Usable);
        assert_eq!(verdict(&s(LATEST + 5, "0.2.0"), "0.1.0"), Verdict::TooNew);
        assert_eq!(verdict(&s(0, "0.0.0"), "0.1.0"), Verdict::NeedsMigration);
    }
}
