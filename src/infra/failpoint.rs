//! Crash points for fault tests. Built only with the `failpoints` cargo
//! feature (never in a release build): when `CREDBROKER_FAILPOINT` names a
//! point, the process aborts there, as a kill -9 or a power cut would stop
//! it at that write. Without the feature, [`hit`] is empty and inlined away.
//!
//! Named points: `keys.rotate.before_write`, `keys.rotate.after_write`,
//! `keys.activate.before_write`, `keys.activate.after_write`,
//! `keys.migrate.before_write`, `keys.migrate.after_write` (see
//! [`crate::derive::mint`]); `vault.import.before_write`,
//! `vault.import.after_write` (the import of an older install's vault key
//! files, see [`crate::accounts::vault::keys`]).
//!
//! Pause points: when `CREDBROKER_FAILPOINT` is `pause:<point>`, the
//! process stops at that point (it prints `failpoint <point>: paused` to
//! stderr and blocks the thread for good), so a test can find it there and
//! kill it: `vault.refresh.lease_taken` (a refresh lease just taken, see
//! [`crate::accounts::vault`]).

/// The environment variable that arms one point.
pub const ENV: &str = "CREDBROKER_FAILPOINT";

/// Aborts the process if `ENV` names `point`.
#[cfg(feature = "failpoints")]
pub(crate) fn hit(point: &str) {
    if std::env::var_os(ENV).is_some_and(|v| v == point) {
        eprintln!("failpoint {point}: aborting");
        std::process::abort();
    }
}

/// Does nothing: built without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_point: &str) {}

/// Stops the process here for good if `ENV` is `pause:<point>` (the test
/// that armed it kills the process).
#[cfg(feature = "failpoints")]
pub(crate) fn pause(point: &str) {
    let armed = std::env::var(ENV).is_ok_and(|v| v.strip_prefix("pause:") == Some(point));
    if armed {
        eprintln!("failpoint {point}: paused");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Does nothing: built without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn pause(_point: &str) {}
