//! Local accounts and their lockout counters are shared by replicas: wrong
//! passwords tried on different replicas add up to one lockout, which then
//! holds on every replica, and ends on every replica at its time.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::pages::users::{self, Verdict, LOCK_AFTER, LOCK_FOR};
use credbroker::internals::seal::Sealer;
use credbroker::internals::secret::{SecretBytes, SecretString};
use credbroker::internals::store::{PgStore, Store};

use crate::support::postgres::{cluster_or_not_shown, database};

#[test]
fn wrong_passwords_on_different_replicas_add_up_to_one_lockout() {
    let Some(cluster) = cluster_or_not_shown("lockout counters across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "lockout");
    let settings = db.settings();
    let r: Vec<Box<dyn Store>> = (0..3)
        .map(|_| Box::new(PgStore::open(&settings).unwrap()) as Box<dyn Store>)
        .collect();
    // The replicas share the master key, so each opens the others' records.
    let sealer = Sealer::new(&SecretBytes::new(vec![7; 32]), &[]).unwrap();
    let right = SecretString::new("correct horse".into());
    let wrong = SecretString::new("battery staple".into());
    let now = crate::support::now();
    users::add(r[0].as_ref(), &sealer, "alice", &right, false, now).unwrap();
    // The account made on A signs in on B.
    assert_eq!(
        users::verify(r[1].as_ref(), &sealer, "alice", &right, now).unwrap(),
        Verdict::Ok
    );

    // Wrong guesses spread over the replicas, one after the other: each
    // counts, wherever it landed, and the last one locks the account.
    for i in 0..LOCK_AFTER {
        let v = users::verify(r[i as usize % 3].as_ref(), &sealer, "alice", &wrong, now).unwrap();
        let expected = if i + 1 == LOCK_AFTER {
            Verdict::NowLocked
        } else {
            Verdict::Wrong
        };
        assert_eq!(v, expected, "guess {i}");
    }
    // Locked on every replica, even with the right password.
    for (i, s) in r.iter().enumerate() {
        let v = users::verify(s.as_ref(), &sealer, "alice", &right, now + 1).unwrap();
        assert_eq!(v, Verdict::Locked, "replica {i}");
    }
    // Positive control: once the lock's time is over, the right password
    // works again, on a replica other than the one that locked it.
    let later = now + LOCK_FOR + 1;
    assert_eq!(
        users::verify(r[0].as_ref(), &sealer, "alice", &right, later).unwrap(),
        Verdict::Ok
    );
    assert_eq!(
        users::verify(r[2].as_ref(), &sealer, "alice", &right, later).unwrap(),
        Verdict::Ok
    );
}
