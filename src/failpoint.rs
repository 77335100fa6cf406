//! Crash points for fault tests. Built only with the `failpoints` cargo
//! feature (never in a release build): when `CREDBROKER_FAILPOINT` names a
//! point, the process aborts there, as a kill -9 or a power cut would stop
//! it at that write. Without the feature, [`hit`] is empty and inlined away.
//!
//! Named points: `keys.rotate.before_write`, `keys.rotate.after_write`,
//! `keys.activate.before_write`, `keys.activate.after_write`,
//! `keys.migrate.before_write`, `keys.migrate.after_write` (see
//! [`crate::mint`]); `vault.import.before_write`,
//! `vault.import.after_write` (the import of an older install's vault key
//! files, see [`crate::vault::keys`]).

/// The environment variable that arms one point.
pub const ENV: &str = "CREDBROKER_FAILPOINT";

/// Aborts the process if `ENV` names `point`.
#[cfg(feature = "failpoints")]
pub fn hit(point: &str) {
    if std::env::var_os(ENV).is_some_and(|v| v == point) {
        eprintln!("failpoint {point}: aborting");
        std::process::abort();
    }
}

/// Does nothing: built without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: &str) {}
