//! `store::contract` against a real PostgreSQL server.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use credbroker::internals::store::{contract, PgStore, Store, Tree};

use crate::support::postgres::{cluster_or_not_shown, database};

#[test]
fn the_store_contract_holds_on_postgres() {
    let Some(cluster) = cluster_or_not_shown("the store contract on PostgreSQL") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "contract");
    let mut settings = db.settings();
    // The racing properties run 8 threads at once: a pool of 4 would
    // answer the others "busy" (as it must, see faults.rs).
    settings.pool_size = 16;
    // Nothing here is about timeouts (faults.rs is): generous ones, so a
    // loaded machine cannot fail a property that holds.
    settings.statement_timeout = std::time::Duration::from_secs(15);
    settings.connect_timeout = std::time::Duration::from_secs(15);
    let store = PgStore::open(&settings).unwrap();
    contract::run_all(&store);
    contract::run_concurrent(Arc::new(store));
}

#[test]
fn a_write_on_one_instance_moves_the_other_instances_watch_within_a_second() {
    let Some(cluster) = cluster_or_not_shown("watch across instances on PostgreSQL") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "watch");
    let a = PgStore::open(&db.settings()).unwrap();
    let b = PgStore::open(&db.settings()).unwrap();
    let mut state = b.watch(Tree::State);
    let mut links = b.watch(Tree::Links);
    // The listener's first connect moves every counter: wait for that, so
    // the change below is the write's.
    crate::support::wait_until(Duration::from_secs(10), "b's listener", || {
        state.has_changed().unwrap_or(false) && links.has_changed().unwrap_or(false)
    });
    state.borrow_and_update();
    links.borrow_and_update();
    let start = Instant::now();
    a.put(Tree::State, b"frozen", b"1").unwrap();
    // Within a second, or four times what the write took on a loaded
    // machine (support::slack), from before the write.
    let bound = crate::support::slack(start.elapsed());
    crate::support::wait_until(
        bound.saturating_sub(start.elapsed()),
        "b sees a's write",
        || state.has_changed().unwrap_or(false),
    );
    eprintln!("b saw a's write after {:?}", start.elapsed());
    assert!(
        !links.has_changed().unwrap(),
        "another tree's counter stays"
    );
    // And the value b reads is a's.
    assert_eq!(
        b.get(Tree::State, b"frozen").unwrap().as_deref(),
        Some(&b"1"[..])
    );
}
