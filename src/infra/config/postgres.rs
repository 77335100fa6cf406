//! `store` and `[postgres]`: which backend holds the state. `store =
//! "<dir>"` is the embedded sled store (one instance); a `[postgres]` table
//! is the shared store that replicas of one agent use. Exactly one of them.

use std::path::PathBuf;
use std::time::Duration;

use super::raw::RawPostgres;
use super::{parse_duration, Check};
use crate::infra::store::{Backend, Migrate, PgSettings};

/// Validates the store keys; `audit_log` is required with PostgreSQL (the
/// default lives in the sled directory, which a shared store has not).
pub(super) fn backend(
    store: Option<&std::path::Path>,
    postgres: Option<RawPostgres>,
    audit_log_given: bool,
    check: &mut Check<'_>,
) -> Backend {
    match (store, postgres) {
        (Some(dir), None) => Backend::Sled(check.rel(dir)),
        (None, Some(pg)) => {
            if !audit_log_given {
                check.bad(
                    "audit_log",
                    "is required with [postgres] (each instance writes its own audit file)",
                );
            }
            Backend::Postgres(settings(pg, check))
        }
        (Some(_), Some(_)) => {
            check.bad(
                "postgres",
                "cannot be used together with `store` (choose one backend: `store` for the embedded store, [postgres] for a shared one)",
            );
            Backend::Sled(PathBuf::new())
        }
        (None, None) => {
            check.bad(
                "store",
                "is required (a directory for the embedded store), unless a [postgres] table is given",
            );
            Backend::Sled(PathBuf::new())
        }
    }
}

fn required(v: Option<String>, key: &str, check: &mut Check<'_>) -> String {
    match v {
        Some(s) if !s.is_empty() && !s.chars().any(char::is_control) => s,
        _ => {
            check.bad(key, "is required (a non-empty name)");
            String::new()
        }
    }
}

fn duration(v: Option<&str>, key: &str, default: Duration, check: &mut Check<'_>) -> Duration {
    match v.map(parse_duration) {
        None => default,
        Some(Some(d)) if d >= Duration::from_millis(100) && d <= Duration::from_secs(300) => d,
        Some(_) => {
            check.bad(
                key,
                "must be a duration between 100ms and 300s, such as \"5s\"",
            );
            default
        }
    }
}

fn settings(raw: RawPostgres, check: &mut Check<'_>) -> PgSettings {
    let host = required(raw.host, "postgres.host", check);
    let database = required(raw.database, "postgres.database", check);
    let user = required(raw.user, "postgres.user", check);
    // Without TLS the password and every sealed record would cross the
    // network in the clear: allowed only where there is no network.
    let local = host.starts_with('/')
        || host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
    if raw.tls.is_none() && !local && !host.is_empty() {
        check.bad(
            "postgres.tls",
            "is required when postgres.host is not loopback or a socket directory (give [postgres.tls] ca_file)",
        );
    }
    let port = match raw.port.map(u16::try_from) {
        None => 5432,
        Some(Ok(p)) if p > 0 => p,
        Some(_) => {
            check.bad("postgres.port", "must be a port number (1 to 65535)");
            5432
        }
    };
    let pool_size = raw.pool_size.unwrap_or(16);
    if pool_size == 0 || pool_size > 1000 {
        check.bad("postgres.pool_size", "must be between 1 and 1000");
    }
    let migrate = match raw.migrate.as_deref() {
        None | Some("manual") => Migrate::Manual,
        Some("auto") => Migrate::Auto,
        Some(_) => {
            check.bad("postgres.migrate", "must be \"manual\" or \"auto\"");
            Migrate::Manual
        }
    };
    PgSettings {
        config_file: check.file.to_owned(),
        host,
        port,
        database,
        user,
        password_file: raw.password_file.map(|p| check.rel(&p)),
        ca_file: raw.tls.map(|t| check.rel(&t.ca_file)),
        pool_size,
        statement_timeout: duration(
            raw.statement_timeout.as_deref(),
            "postgres.statement_timeout",
            Duration::from_secs(5),
            check,
        ),
        connect_timeout: duration(
            raw.connect_timeout.as_deref(),
            "postgres.connect_timeout",
            Duration::from_secs(5),
            check,
        ),
        migrate,
    }
}
