//! The database roles of docs/STORE.md ("The database roles"): its SQL,
//! run as written (with this test's names), gives a runtime role that can
//! do everything the store does and cannot migrate, and an owner that can.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use credbroker::internals::store::{contract, Migrate, PgStore, Store, StoreError, Tree};

use crate::support::postgres::{cluster_or_not_shown, Database};

/// The `sql` blocks of STORE.md's section on the database roles, in order.
fn documented_sql() -> Vec<String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/STORE.md")).unwrap();
    let start = doc
        .find("### The database roles")
        .expect("STORE.md has the section on the database roles");
    let section = &doc[start..];
    let end = section[4..].find("\n### ").map_or(section.len(), |e| e + 4);
    let section = &section[..end];
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(i) = rest.find("```sql\n") {
        let body = &rest[i + 7..];
        let j = body.find("```").unwrap();
        blocks.push(body[..j].to_string());
        rest = &body[j + 3..];
    }
    blocks
}

/// The statements of a block, one by one (`CREATE DATABASE` cannot run in
/// the transaction `psql -c` makes of several), comments left out.
fn statements(block: &str) -> Vec<String> {
    let text: String = block
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .map(|l| format!("{l}\n"))
        .collect();
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_documented_grants_let_the_runtime_role_run_the_store_and_not_migrate() {
    let Some(cluster) = cluster_or_not_shown("the documented database roles") else {
        return;
    };
    let _shared = cluster.shared();
    let blocks = documented_sql();
    assert_eq!(blocks.len(), 3, "create, grant, grant after migrating");
    let db = format!("t_roles_{}", std::process::id());
    let (owner, app) = (format!("{db}_owner"), format!("{db}_app"));
    let password = std::fs::read_to_string(&cluster.password_file).unwrap();
    let password = password.trim_end();
    let ours = |block: &str| -> Vec<String> {
        statements(block)
            .into_iter()
            .map(|s| {
                s.replace("credbroker_owner", &owner)
                    .replace("credbroker_app", &app)
                    .replace("DATABASE credbroker", &format!("DATABASE {db}"))
                    .replace("'owner-password'", &format!("'{password}'"))
                    .replace("'app-password'", &format!("'{password}'"))
            })
            .collect()
    };
    for s in ours(&blocks[0]) {
        cluster.sql("postgres", &s);
    }
    for s in ours(&blocks[1]) {
        cluster.sql(&db, &s);
    }
    let as_role = |user: &str| {
        let mut s = Database {
            cluster,
            name: db.clone(),
        }
        .settings();
        s.user = user.to_string();
        s.migrate = Migrate::Manual;
        s
    };
    // The runtime role cannot migrate: refused by the server, and the
    // message says what migrating needs.
    let refused = PgStore::connect(&as_role(&app))
        .unwrap()
        .migrate()
        .expect_err("the runtime role migrated");
    let m = refused.to_string();
    assert!(matches!(refused, StoreError::Backend(_)), "{m}");
    for part in [
        "permission denied",
        "SQLSTATE 42501",
        "CREATE",
        "docs/STORE.md",
    ] {
        assert!(m.contains(part), "{part:?} is not in: {m}");
    }
    // Nor does it start on the unmigrated schema.
    assert!(PgStore::open(&as_role(&app)).is_err());
    // The owner migrates (the control).
    let applied = PgStore::connect(&as_role(&owner))
        .unwrap()
        .migrate()
        .unwrap();
    assert!(!applied.is_empty());
    // The grants for a schema migrated before the default privileges
    // (here: redundant, and harmless).
    for s in ours(&blocks[2]) {
        cluster.sql(&db, &s);
    }
    // Everything the store does, as the runtime role.
    let mut settings = as_role(&app);
    settings.pool_size = 16;
    settings.statement_timeout = std::time::Duration::from_secs(15);
    settings.connect_timeout = std::time::Duration::from_secs(15);
    let store = PgStore::open(&settings).unwrap();
    contract::run_all(&store);
    contract::run_concurrent(Arc::new(store));
    // And a change it writes is heard (LISTEN and the trigger's NOTIFY).
    let a = PgStore::open(&settings).unwrap();
    let b = PgStore::open(&settings).unwrap();
    let mut state = b.watch(Tree::State);
    crate::support::wait_until(std::time::Duration::from_secs(10), "b listens", || {
        state.has_changed().unwrap_or(false)
    });
    state.borrow_and_update();
    a.put(Tree::State, b"as-app", b"1").unwrap();
    crate::support::wait_until(std::time::Duration::from_secs(5), "b hears a", || {
        state.has_changed().unwrap_or(false)
    });
}
