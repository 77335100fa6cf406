//! Races between two processes on one database: compare-and-swap loses no
//! update and an expiring insert has exactly one winner. The parent runs
//! this test binary twice more, each time running only the worker below.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use credbroker::internals::store::{PgStore, Store, Tree};

use crate::support::postgres::{cluster_or_not_shown, database};

const ROUNDS: usize = 20;
/// Increments per round and process.
const PER_ROUND: u64 = 2;
/// Increments per process.
const INCREMENTS: u64 = ROUNDS as u64 * PER_ROUND;

#[test]
fn cas_and_insert_races_between_two_processes() {
    let Some(cluster) = cluster_or_not_shown("store races between two processes") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "processes");
    let store = PgStore::open(&db.settings()).unwrap();
    store.put(Tree::State, b"counter", b"0").unwrap();
    let exe = std::env::current_exe().unwrap();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([
                "--ignored",
                "--exact",
                "store::processes::race_worker",
                "--nocapture",
                "--test-threads=1",
            ]);
            db.pass_to(&mut cmd);
            cmd.stdout(std::process::Stdio::piped()).spawn().unwrap()
        })
        .collect();
    let mut wins = 0;
    for w in workers {
        let out = w.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "a worker failed: {text}");
        let line = text
            .lines()
            .find_map(|l| l.split("insert-wins=").nth(1))
            .unwrap_or_else(|| panic!("the worker ran no race: {text}"));
        wins += line.trim().parse::<usize>().unwrap();
    }
    assert_eq!(
        store.get(Tree::State, b"counter").unwrap(),
        Some((2 * INCREMENTS).to_string().into_bytes()),
        "every increment of both processes counted once"
    );
    assert_eq!(wins, ROUNDS, "each key inserted by exactly one process");
}

/// One side of the race above (run only by it, with the database in the
/// environment).
#[test]
#[ignore = "run by cas_and_insert_races_between_two_processes"]
fn race_worker() {
    let settings = crate::support::postgres::settings_from_env();
    let store = PgStore::open(&settings).unwrap();
    let mut wins = 0;
    for round in 0..ROUNDS {
        // Interleave the two kinds of race.
        for _ in 0..PER_ROUND {
            increment(&store);
        }
        if store
            .insert_expiring(
                Tree::Replay,
                format!("race-{round}").as_bytes(),
                b"w",
                Duration::from_secs(600),
            )
            .unwrap()
        {
            wins += 1;
        }
    }
    println!("insert-wins={wins}");
}

fn increment(store: &PgStore) {
    loop {
        let cur = store.get(Tree::State, b"counter").unwrap().unwrap();
        let n: u64 = std::str::from_utf8(&cur).unwrap().parse().unwrap();
        if store
            .compare_and_swap(
                Tree::State,
                b"counter",
                Some(&cur),
                Some((n + 1).to_string().as_bytes()),
            )
            .unwrap()
        {
            return;
        }
    }
}
