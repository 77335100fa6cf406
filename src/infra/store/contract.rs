//! The behaviour every [`Store`] backend must have, as one function per
//! property, run by each backend's tests (sled in its unit tests, PostgreSQL
//! in the integration tests against a real server). Keys are namespaced per
//! run, so the checks can run against a store that already holds data.
//!
//! A failed property panics with its name.

// Test support compiled into the library (the integration tests run it
// against PostgreSQL): a failed step is meant to panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Fenced, Lease, Store, StoreError, Tree};

/// Runs every single-threaded property against `store`.
pub fn run_all(store: &dyn Store) {
    let ns = namespace();
    records(store, &ns);
    scans_keep_order_and_prefix_bounds(store, &ns);
    compare_and_swap_semantics(store, &ns);
    trees_of_the_other_kind_are_refused(store, &ns);
    expiring_entries(store, &ns);
    leases_renew_only_while_held(store, &ns);
    fenced_replace_needs_the_live_lease(store, &ns);
    sweep_removes_only_expired(store, &ns);
    watch_moves_on_change(store, &ns);
}

/// Runs the properties that need several threads against one store.
pub fn run_concurrent(store: Arc<dyn Store>) {
    let ns = namespace();
    compare_and_swap_races_lose_no_update(store.clone(), &ns);
    insert_expiring_races_have_one_winner(store.clone(), &ns);
    a_lapsed_holder_never_writes_after_its_successor_read(store, &ns);
}

/// A key prefix unique to this run.
fn namespace() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("contract/{}/{nanos}/", std::process::id())
}

fn key(ns: &str, k: &str) -> Vec<u8> {
    format!("{ns}{k}").into_bytes()
}

fn records(s: &dyn Store, ns: &str) {
    let k = key(ns, "r");
    assert_eq!(
        s.get(Tree::State, &k).unwrap(),
        None,
        "records: absent at first"
    );
    s.put(Tree::State, &k, b"one").unwrap();
    assert_eq!(
        s.get(Tree::State, &k).unwrap().as_deref(),
        Some(&b"one"[..]),
        "records: put then get"
    );
    s.put(Tree::State, &k, b"two").unwrap();
    assert_eq!(
        s.get(Tree::State, &k).unwrap().as_deref(),
        Some(&b"two"[..]),
        "records: overwrite"
    );
    assert_eq!(
        s.get(Tree::Accounts, &k).unwrap(),
        None,
        "records: trees are separate"
    );
    s.delete(Tree::State, &k).unwrap();
    assert_eq!(s.get(Tree::State, &k).unwrap(), None, "records: delete");
    // Deleting an absent record is not an error.
    s.delete(Tree::State, &k).unwrap();
    // Binary keys and values, including bytes that are not UTF-8 and NUL.
    let bk = [key(ns, "bin"), vec![0, 0xff, 0x80]].concat();
    s.put(Tree::State, &bk, &[0, 1, 0xfe, 0]).unwrap();
    assert_eq!(
        s.get(Tree::State, &bk).unwrap().as_deref(),
        Some(&[0u8, 1, 0xfe, 0][..]),
        "records: binary"
    );
    s.delete(Tree::State, &bk).unwrap();
}

fn scans_keep_order_and_prefix_bounds(s: &dyn Store, ns: &str) {
    for k in ["a/2", "a/1", "a/10", "ab", "b/1"] {
        s.put(Tree::Links, &key(ns, k), k.as_bytes()).unwrap();
    }
    // A prefix ending in 0xff must not spill over (a naive "last byte + 1"
    // upper bound would overflow there).
    let high = [key(ns, "z"), vec![0xff]].concat();
    s.put(Tree::Links, &[high.clone(), vec![0x01]].concat(), b"h")
        .unwrap();
    s.put(Tree::Links, &key(ns, "zz"), b"after").unwrap();
    let got: Vec<Vec<u8>> = s
        .scan_prefix(Tree::Links, &key(ns, "a/"))
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        got,
        vec![b"a/1".to_vec(), b"a/10".to_vec(), b"a/2".to_vec()],
        "scan: byte order, within the prefix"
    );
    assert_eq!(
        s.scan_prefix(Tree::Links, &high).unwrap().len(),
        1,
        "scan: a prefix ending in 0xff"
    );
    assert_eq!(
        s.scan_prefix(Tree::Links, &key(ns, "")).unwrap().len(),
        7,
        "scan: the namespace"
    );
    for (k, _) in s.scan_prefix(Tree::Links, &key(ns, "")).unwrap() {
        s.delete(Tree::Links, &k).unwrap();
    }
    assert!(
        s.scan_prefix(Tree::Links, &key(ns, "")).unwrap().is_empty(),
        "scan: deleted"
    );
}

fn compare_and_swap_semantics(s: &dyn Store, ns: &str) {
    let k = key(ns, "cas");
    assert!(
        s.compare_and_swap(Tree::State, &k, None, Some(b"v1"))
            .unwrap(),
        "cas: create when absent"
    );
    assert!(
        !s.compare_and_swap(Tree::State, &k, None, Some(b"x"))
            .unwrap(),
        "cas: create refused when present"
    );
    assert!(
        !s.compare_and_swap(Tree::State, &k, Some(b"wrong"), Some(b"x"))
            .unwrap(),
        "cas: wrong expected"
    );
    assert_eq!(
        s.get(Tree::State, &k).unwrap().as_deref(),
        Some(&b"v1"[..]),
        "cas: a refused swap changes nothing"
    );
    assert!(
        s.compare_and_swap(Tree::State, &k, Some(b"v1"), Some(b"v2"))
            .unwrap(),
        "cas: swap"
    );
    assert!(
        s.compare_and_swap(Tree::State, &k, Some(b"v2"), None)
            .unwrap(),
        "cas: delete"
    );
    assert_eq!(s.get(Tree::State, &k).unwrap(), None, "cas: deleted");
    assert!(
        !s.compare_and_swap(Tree::State, &k, Some(b"v2"), None)
            .unwrap(),
        "cas: delete of absent"
    );
}

fn trees_of_the_other_kind_are_refused(s: &dyn Store, ns: &str) {
    let k = key(ns, "kind");
    assert!(
        matches!(s.put(Tree::Replay, &k, b"x"), Err(StoreError::WrongTree(_))),
        "kind: put on an expiring tree"
    );
    assert!(
        matches!(
            s.insert_expiring(Tree::State, &k, b"x", Duration::from_secs(1)),
            Err(StoreError::WrongTree(_))
        ),
        "kind: insert_expiring on a record tree"
    );
    // Positive control: each works on its own kind.
    s.put(Tree::State, &k, b"x").unwrap();
    s.delete(Tree::State, &k).unwrap();
    assert!(s
        .insert_expiring(Tree::Replay, &k, b"x", Duration::from_secs(60))
        .unwrap());
    assert!(s.replace_expiring(Tree::Replay, &k, b"x", None).unwrap());
}

fn expiring_entries(s: &dyn Store, ns: &str) {
    let k = key(ns, "jti");
    assert!(
        s.insert_expiring(Tree::Replay, &k, b"1", Duration::from_millis(300))
            .unwrap(),
        "expiring: first insert"
    );
    assert!(
        !s.insert_expiring(Tree::Replay, &k, b"2", Duration::from_secs(60))
            .unwrap(),
        "expiring: a live entry refuses"
    );
    assert_eq!(
        s.get_expiring(Tree::Replay, &k).unwrap().as_deref(),
        Some(&b"1"[..]),
        "expiring: the first value stays"
    );
    wait_until(
        "expiring: the entry expires",
        Duration::from_secs(5),
        || s.get_expiring(Tree::Replay, &k).unwrap().is_none(),
    );
    assert!(
        s.insert_expiring(Tree::Replay, &k, b"3", Duration::from_secs(60))
            .unwrap(),
        "expiring: an expired entry counts as absent"
    );
    assert_eq!(
        s.get_expiring(Tree::Replay, &k).unwrap().as_deref(),
        Some(&b"3"[..])
    );
    assert!(s.replace_expiring(Tree::Replay, &k, b"3", None).unwrap());
}

fn leases_renew_only_while_held(s: &dyn Store, ns: &str) {
    let k = key(ns, "lease");
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(60);
    assert!(s
        .insert_expiring(Tree::Leases, &k, b"holder-a", short)
        .unwrap());
    assert!(
        !s.insert_expiring(Tree::Leases, &k, b"holder-b", long)
            .unwrap(),
        "lease: held"
    );
    assert!(
        !s.replace_expiring(Tree::Leases, &k, b"holder-b", Some((b"holder-b", long)))
            .unwrap(),
        "lease: only the holder renews"
    );
    assert!(
        s.replace_expiring(Tree::Leases, &k, b"holder-a", Some((b"holder-a", short)))
            .unwrap(),
        "lease: the holder renews"
    );
    wait_until("lease: lapses", Duration::from_secs(5), || {
        s.get_expiring(Tree::Leases, &k).unwrap().is_none()
    });
    assert!(
        !s.replace_expiring(Tree::Leases, &k, b"holder-a", Some((b"holder-a", long)))
            .unwrap(),
        "lease: a lapsed holder cannot renew"
    );
    assert!(
        s.insert_expiring(Tree::Leases, &k, b"holder-b", long)
            .unwrap(),
        "lease: a successor takes it"
    );
    assert!(
        !s.replace_expiring(Tree::Leases, &k, b"holder-a", None)
            .unwrap(),
        "lease: the old holder cannot release it"
    );
    assert!(
        s.replace_expiring(Tree::Leases, &k, b"holder-b", None)
            .unwrap(),
        "lease: released"
    );
    assert_eq!(s.get_expiring(Tree::Leases, &k).unwrap(), None);
}

fn lease<'a>(k: &'a [u8], holder: &'a [u8]) -> Lease<'a> {
    Lease {
        tree: Tree::Leases,
        key: k,
        holder,
    }
}

fn fenced_replace_needs_the_live_lease(s: &dyn Store, ns: &str) {
    let (r, l) = (key(ns, "fenced-record"), key(ns, "fenced-lease"));
    let long = Duration::from_secs(60);
    s.put(Tree::Accounts, &r, b"v0").unwrap();
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"v0", b"x", lease(&l, b"holder-a"))
            .unwrap(),
        Fenced::LeaseLost,
        "fenced: no lease, no write"
    );
    assert!(s
        .insert_expiring(Tree::Leases, &l, b"holder-a", Duration::from_millis(300))
        .unwrap());
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"v0", b"x", lease(&l, b"holder-b"))
            .unwrap(),
        Fenced::LeaseLost,
        "fenced: another holder's value does not pass"
    );
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"other", b"x", lease(&l, b"holder-a"))
            .unwrap(),
        Fenced::Changed,
        "fenced: the holder, but the record is not what it expected"
    );
    assert_eq!(
        s.get(Tree::Accounts, &r).unwrap().as_deref(),
        Some(&b"v0"[..]),
        "fenced: refused writes changed nothing"
    );
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"v0", b"v1", lease(&l, b"holder-a"))
            .unwrap(),
        Fenced::Swapped,
        "fenced: the holder writes"
    );
    wait_until("fenced: the lease lapses", Duration::from_secs(5), || {
        s.get_expiring(Tree::Leases, &l).unwrap().is_none()
    });
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"v1", b"late", lease(&l, b"holder-a"))
            .unwrap(),
        Fenced::LeaseLost,
        "fenced: a lapsed holder's late save is refused"
    );
    assert!(s
        .insert_expiring(Tree::Leases, &l, b"holder-b", long)
        .unwrap());
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"v1", b"late", lease(&l, b"holder-a"))
            .unwrap(),
        Fenced::LeaseLost,
        "fenced: refused once a successor holds it"
    );
    assert_eq!(
        s.replace_fenced(Tree::Accounts, &r, b"v1", b"v2", lease(&l, b"holder-b"))
            .unwrap(),
        Fenced::Swapped,
        "fenced: the successor writes"
    );
    assert_eq!(
        s.get(Tree::Accounts, &r).unwrap().as_deref(),
        Some(&b"v2"[..])
    );
    assert!(matches!(
        s.replace_fenced(Tree::Leases, &r, b"v2", b"x", lease(&l, b"holder-b")),
        Err(StoreError::WrongTree(_))
    ));
    assert!(matches!(
        s.replace_fenced(
            Tree::Accounts,
            &r,
            b"v2",
            b"x",
            Lease {
                tree: Tree::State,
                key: &l,
                holder: b"holder-b"
            }
        ),
        Err(StoreError::WrongTree(_))
    ));
    assert!(s
        .replace_expiring(Tree::Leases, &l, b"holder-b", None)
        .unwrap());
    s.delete(Tree::Accounts, &r).unwrap();
}

fn sweep_removes_only_expired(s: &dyn Store, ns: &str) {
    let short = key(ns, "sweep-short");
    let long = key(ns, "sweep-long");
    assert!(s
        .insert_expiring(Tree::Replay, &short, b"s", Duration::from_millis(200))
        .unwrap());
    assert!(s
        .insert_expiring(Tree::Replay, &long, b"l", Duration::from_secs(60))
        .unwrap());
    wait_until(
        "sweep: the short entry expires",
        Duration::from_secs(5),
        || s.get_expiring(Tree::Replay, &short).unwrap().is_none(),
    );
    // Other runs may have left expired entries too: at least ours goes.
    assert!(
        s.sweep_expired(Tree::Replay).unwrap() >= 1,
        "sweep: removes the expired entry"
    );
    assert_eq!(
        s.get_expiring(Tree::Replay, &long).unwrap().as_deref(),
        Some(&b"l"[..]),
        "sweep: keeps the live entry"
    );
    assert!(s.replace_expiring(Tree::Replay, &long, b"l", None).unwrap());
}

fn watch_moves_on_change(s: &dyn Store, ns: &str) {
    let mut state = s.watch(Tree::State);
    let mut links = s.watch(Tree::Links);
    state.borrow_and_update();
    links.borrow_and_update();
    s.put(Tree::State, &key(ns, "watched"), b"1").unwrap();
    wait_until(
        "watch: the tree's counter moves",
        Duration::from_secs(10),
        || state.has_changed().unwrap_or(false),
    );
    assert!(
        !links.has_changed().unwrap_or(true),
        "watch: another tree's counter stays"
    );
    s.delete(Tree::State, &key(ns, "watched")).unwrap();
}

fn compare_and_swap_races_lose_no_update(s: Arc<dyn Store>, ns: &str) {
    let k = key(ns, "counter");
    s.put(Tree::State, &k, b"0").unwrap();
    let threads = 8;
    let per = 25;
    std::thread::scope(|sc| {
        for _ in 0..threads {
            let s = s.clone();
            let k = k.clone();
            sc.spawn(move || {
                for _ in 0..per {
                    loop {
                        let cur = s.get(Tree::State, &k).unwrap().unwrap();
                        let n: u64 = std::str::from_utf8(&cur).unwrap().parse().unwrap();
                        let next = (n + 1).to_string();
                        if s.compare_and_swap(Tree::State, &k, Some(&cur), Some(next.as_bytes()))
                            .unwrap()
                        {
                            break;
                        }
                    }
                }
            });
        }
    });
    let end = s.get(Tree::State, &k).unwrap().unwrap();
    assert_eq!(
        end,
        (threads * per).to_string().into_bytes(),
        "cas race: every increment counted once"
    );
    s.delete(Tree::State, &k).unwrap();
}

fn insert_expiring_races_have_one_winner(s: Arc<dyn Store>, ns: &str) {
    for round in 0..20 {
        let k = key(ns, &format!("race-{round}"));
        let wins = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for i in 0..8u8 {
                let s = s.clone();
                let k = k.clone();
                let wins = &wins;
                sc.spawn(move || {
                    if s.insert_expiring(Tree::Replay, &k, &[i], Duration::from_secs(60))
                        .unwrap()
                    {
                        wins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(
            wins.into_inner(),
            1,
            "insert race: exactly one winner (round {round})"
        );
    }
}

/// A holder writes as fast as it can while its short lease lapses, and a
/// successor takes the lease over, reads the record and writes: the
/// successor's write must always find what it read (had the old holder
/// written after the takeover, it would find `Changed`), and the old holder
/// must stop with `LeaseLost`.
fn a_lapsed_holder_never_writes_after_its_successor_read(s: Arc<dyn Store>, ns: &str) {
    for round in 0..10 {
        let r = key(ns, &format!("takeover-record-{round}"));
        let l = key(ns, &format!("takeover-lease-{round}"));
        s.put(Tree::Accounts, &r, b"0").unwrap();
        // The old holder writes once under a long lease (so this does not
        // depend on the machine's speed), then its lease is cut short.
        assert!(s
            .insert_expiring(Tree::Leases, &l, b"old", Duration::from_secs(60))
            .unwrap());
        assert_eq!(
            s.replace_fenced(Tree::Accounts, &r, b"0", b"old-first", lease(&l, b"old"))
                .unwrap(),
            Fenced::Swapped,
            "takeover: the holder writes while it holds the lease"
        );
        assert!(s
            .replace_expiring(
                Tree::Leases,
                &l,
                b"old",
                Some((b"old", Duration::from_millis(50)))
            )
            .unwrap());
        let (old_writes, successor) = std::thread::scope(|sc| {
            let old = sc.spawn(|| {
                let mut writes = 0u32;
                loop {
                    let cur = s.get(Tree::Accounts, &r).unwrap().unwrap();
                    let next = format!("old-{writes}");
                    match s
                        .replace_fenced(
                            Tree::Accounts,
                            &r,
                            &cur,
                            next.as_bytes(),
                            lease(&l, b"old"),
                        )
                        .unwrap()
                    {
                        Fenced::Swapped => writes += 1,
                        Fenced::Changed => {
                            panic!("takeover: only the old holder writes while it holds")
                        }
                        Fenced::LeaseLost => return writes,
                    }
                }
            });
            let new = sc.spawn(|| {
                while !s
                    .insert_expiring(Tree::Leases, &l, b"new", Duration::from_secs(60))
                    .unwrap()
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let seen = s.get(Tree::Accounts, &r).unwrap().unwrap();
                s.replace_fenced(Tree::Accounts, &r, &seen, b"new", lease(&l, b"new"))
                    .unwrap()
            });
            (old.join().unwrap(), new.join().unwrap())
        });
        assert_eq!(
            successor,
            Fenced::Swapped,
            "takeover: the old holder wrote after its successor read (round {round})"
        );
        eprintln!("takeover round {round}: the old holder wrote {old_writes} more times");
        assert_eq!(
            s.get(Tree::Accounts, &r).unwrap().as_deref(),
            Some(&b"new"[..])
        );
        s.delete(Tree::Accounts, &r).unwrap();
        assert!(s.replace_expiring(Tree::Leases, &l, b"new", None).unwrap());
    }
}

/// Polls `cond` until it holds, or panics naming `what` after `limit`.
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
