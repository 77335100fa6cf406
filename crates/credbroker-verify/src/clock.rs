//! Time, injected: validators take a [`Clock`] instead of reading the system
//! time deep inside, so tests can move it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// A source of the current Unix time in seconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Seconds since the Unix epoch.
    fn now(&self) -> i64;
    /// Milliseconds since the Unix epoch (for measuring an offset from
    /// another clock); by default [`Clock::now`] in milliseconds.
    fn now_ms(&self) -> i64 {
        self.now().saturating_mul(1000)
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        // A clock before 1970 is a broken machine; treat it as the epoch and
        // let every expiry check fail closed.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    }
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that tests set by hand.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `now`.
    pub fn new(now: i64) -> Arc<Self> {
        Arc::new(ManualClock(AtomicI64::new(now)))
    }
    /// Moves the clock to `now`.
    pub fn set(&self, now: i64) {
        self.0.store(now, Ordering::SeqCst);
    }
    /// Moves the clock forward.
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The shared clock handle used across the crate.
pub type SharedClock = Arc<dyn Clock>;
