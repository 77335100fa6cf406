//! `credbroker store migrate | copy`: work on the store itself, with no
//! instance involved (PostgreSQL is shared, so instances may run meanwhile;
//! a sled store being copied must not be in use, and its lock says so).

use std::path::Path;

use super::exit::Exit;
use super::Res;
use crate::infra::config::Config;
use crate::infra::store::{Backend, PgSettings, PgStore, SledStore};

fn postgres_of(config: &Path) -> Result<PgSettings, Box<dyn std::error::Error>> {
    let cfg = Config::load(config)?;
    match cfg.store {
        Backend::Postgres(s) => Ok(s),
        Backend::Sled(_) => Err(format!(
            "{}: this config uses the embedded store (`store`); store migrate and store copy need a [postgres] table",
            config.display()
        )
        .into()),
    }
}

/// `credbroker store migrate`.
pub(super) fn migrate(config: &Path) -> Res {
    let s = postgres_of(config)?;
    let store = PgStore::connect(&s)?;
    let applied = store.migrate()?;
    let (version, oldest) = store.schema_version()?;
    println!(
        "{}",
        serde_json::json!({
            "applied": applied,
            "schema_version": version,
            "oldest_binary": oldest,
        })
    );
    Ok(Exit::Ok)
}

/// `credbroker store copy`.
pub(super) fn copy(from: &Path, to: &Path, force: bool) -> Res {
    let s = postgres_of(to)?;
    // Opening would create an empty store; a mistyped --from must not
    // "copy" nothing.
    if !from.join("db").exists() {
        return Err(format!("--from {}: no sled store there", from.display()).into());
    }
    let source = SledStore::open(from)?;
    let target = PgStore::open(&s)?;
    let report = crate::infra::store::copy(&source, &target, force)?;
    let trees: serde_json::Map<String, serde_json::Value> = report
        .trees
        .iter()
        .map(|(t, n)| ((*t).to_string(), (*n).into()))
        .collect();
    println!(
        "{}",
        serde_json::json!({ "copied": trees, "verified": true })
    );
    Ok(Exit::Ok)
}
