//! The store's prepared-statement cache: a statement the server no longer
//! knows (as behind a pooler in transaction mode) is prepared again and the
//! operation still answers, reads and writes alike.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use credbroker::internals::store::{PgStore, Store, Tree};

use crate::support::postgres::{cluster_or_not_shown, database};

#[test]
fn a_cached_statement_the_server_dropped_is_prepared_again() {
    let Some(cluster) = cluster_or_not_shown("PostgreSQL's prepared statements") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "statements");
    let mut settings = db.settings();
    // One connection: the statements cached and the one deallocated are on
    // the same session.
    settings.pool_size = 1;
    let store = PgStore::open(&settings).unwrap();
    // Each operation once, so that its statement is in the cache.
    store.put(Tree::State, b"a", b"1").unwrap();
    assert_eq!(
        store.get(Tree::State, b"a").unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(store.scan_prefix(Tree::State, b"").unwrap().len(), 1);
    assert!(store
        .compare_and_swap(Tree::State, b"a", Some(b"1"), Some(b"2"))
        .unwrap());
    assert!(store
        .insert_expiring(Tree::Replay, b"j1", b"1", Duration::from_secs(60))
        .unwrap());

    store.deallocate_on_server_only().unwrap();

    // Without the retry each of these fails with SQLSTATE 26000
    // (`prepared statement "s0" does not exist`).
    assert_eq!(
        store.get(Tree::State, b"a").unwrap().as_deref(),
        Some(&b"2"[..]),
        "a read after the server dropped its statement"
    );
    store.deallocate_on_server_only().unwrap();
    assert!(
        store
            .compare_and_swap(Tree::State, b"a", Some(b"2"), Some(b"3"))
            .unwrap(),
        "a compare-and-swap after the server dropped its statement"
    );
    store.deallocate_on_server_only().unwrap();
    // A replay entry is still refused once (the retry did not run the
    // statement twice), and a new one is still taken.
    assert!(!store
        .insert_expiring(Tree::Replay, b"j1", b"1", Duration::from_secs(60))
        .unwrap());
    assert!(store
        .insert_expiring(Tree::Replay, b"j2", b"1", Duration::from_secs(60))
        .unwrap());
    store.deallocate_on_server_only().unwrap();
    assert_eq!(store.scan_prefix(Tree::State, b"").unwrap().len(), 1);
    assert_eq!(
        db.sql("SELECT encode(value, 'escape') FROM records WHERE tree = 'state' AND key = 'a'"),
        "3",
        "the swap landed once"
    );
}
