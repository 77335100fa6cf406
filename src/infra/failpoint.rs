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
//!
//! A shifted clock: when `CREDBROKER_FAILPOINT_CLOCK_OFFSET` holds a signed
//! number of seconds, the instance's clock ([`clock`]) runs that far ahead
//! of the system's (behind, when negative), as a replica whose clock
//! drifted would: the clock-skew tests (`tests/it/store/clock_skew.rs`) run
//! one replica so.

/// The environment variable that arms one point.
pub const ENV: &str = "CREDBROKER_FAILPOINT";

/// The environment variable that shifts the instance's clock (seconds).
#[cfg(feature = "failpoints")]
pub(crate) const CLOCK_ENV: &str = "CREDBROKER_FAILPOINT_CLOCK_OFFSET";

/// `base`, shifted by [`CLOCK_ENV`]'s seconds when it is set.
#[cfg(feature = "failpoints")]
pub(crate) fn clock(base: crate::base::clock::SharedClock) -> crate::base::clock::SharedClock {
    let Some(by) = std::env::var(CLOCK_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
    else {
        return base;
    };
    eprintln!("failpoint clock: shifted by {by} s");
    std::sync::Arc::new(Shifted { base, by })
}

/// The system clock as it is: built without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn clock(base: crate::base::clock::SharedClock) -> crate::base::clock::SharedClock {
    base
}

/// A clock `by` seconds off `base`.
#[cfg(feature = "failpoints")]
#[derive(Debug)]
struct Shifted {
    base: crate::base::clock::SharedClock,
    by: i64,
}

#[cfg(feature = "failpoints")]
impl crate::base::clock::Clock for Shifted {
    fn now(&self) -> i64 {
        self.base.now() + self.by
    }
    fn now_ms(&self) -> i64 {
        self.base.now_ms() + self.by * 1000
    }
}

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
