//! This instance's clock against the shared store's (PostgreSQL): the
//! offset measured in the background, the bound derives and proxied calls
//! check, and the corrected clock the rare shared writes take.
//!
//! Replicas on one database each sign tokens with their own clock, and
//! write times other replicas act on (a key's activation, link and
//! approval expiries, page sessions). A replica whose clock is off writes
//! times that are off for the whole deployment, and mints tokens whose
//! `iat` and `exp` a correct verifier sees as shifted. So each replica
//! measures its offset from the database's clock every
//! `clock.check_interval` (one `SELECT clock_timestamp()`, compensated for
//! the round trip), never per request; a derive or a proxied call only
//! reads the last measured offset from memory ([`Skew::check`]: two atomic
//! loads, no store call, so the `self` path still needs no database).
//!
//! - Beyond `clock.max_skew`: derives and proxied calls are refused (503
//!   `clock_skew`), logged once per change and shown in `/status` and the
//!   metrics.
//! - Beyond `clock.warn_skew`: a warning, at most once a minute.
//! - Unknown (never measured, or the last measurement failed: the database
//!   is away): nothing is refused and readiness is unchanged (STORE.md:
//!   an outage of the shared store does not make replicas unready).
//!
//! With sled (one instance) nothing is measured: the offset stays unknown
//! and the corrected clock is the local one.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::base::clock::{Clock, SharedClock};
use crate::infra::config::ClockConfig;
use crate::infra::store::{ClockSample, Store};

/// The offset's value while none is known.
const UNKNOWN: i64 = i64::MIN;

/// A measurement whose round trip took longer than this is not used: half
/// the round trip is its uncertainty.
const MAX_ROUND_TRIP_MS: i64 = 2_000;

/// How often the warning for an offset beyond `warn_skew` repeats.
const WARN_EVERY_MS: i64 = 60_000;

/// The measured offset and its bounds (see the module docs).
#[derive(Debug)]
pub struct Skew {
    max_ms: i64,
    warn_ms: i64,
    /// Our clock minus the database's, in ms (positive: ours is ahead);
    /// [`UNKNOWN`] when not known.
    offset_ms: AtomicI64,
    /// Our clock (ms) at the last good measurement; 0: never.
    checked_ms: AtomicI64,
    /// Our clock (ms) at the last warning; for the rate limit.
    warned_ms: AtomicI64,
}

/// How the last measured offset stands against the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not known: nothing is refused.
    Unknown,
    /// Within `warn_skew`.
    Fine,
    /// Beyond `warn_skew`, within `max_skew`: served, with a warning.
    Warn,
    /// Beyond `max_skew`: derives and proxied calls are refused.
    Beyond,
}

impl Standing {
    /// The word `/status` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Unknown => "unknown",
            Standing::Fine => "ok",
            Standing::Warn => "warn",
            Standing::Beyond => "beyond_max_skew",
        }
    }
}

/// A derive or proxied call refused: the offset (ms) beyond the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this instance's clock is {offset_ms} ms off the database's, beyond clock.max_skew ({max_ms} ms)")]
pub struct TooFar {
    /// Our clock minus the database's.
    pub offset_ms: i64,
    /// `clock.max_skew`.
    pub max_ms: i64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Skew {
    /// No offset known yet.
    pub fn new(cfg: &ClockConfig) -> Skew {
        Skew {
            max_ms: ms(cfg.max_skew),
            warn_ms: ms(cfg.warn_skew),
            offset_ms: AtomicI64::new(UNKNOWN),
            checked_ms: AtomicI64::new(0),
            warned_ms: AtomicI64::new(0),
        }
    }

    /// Our clock minus the database's (ms; positive: ours is ahead), if
    /// known.
    pub fn offset_ms(&self) -> Option<i64> {
        match self.offset_ms.load(Ordering::Relaxed) {
            UNKNOWN => None,
            o => Some(o),
        }
    }

    /// Our clock (ms) at the last good measurement, if any.
    pub fn checked_ms(&self) -> Option<i64> {
        match self.checked_ms.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// How the offset stands against the bounds.
    pub fn standing(&self) -> Standing {
        match self.offset_ms() {
            None => Standing::Unknown,
            Some(o) if o.unsigned_abs() > self.max_ms.unsigned_abs() => Standing::Beyond,
            Some(o) if o.unsigned_abs() > self.warn_ms.unsigned_abs() => Standing::Warn,
            Some(_) => Standing::Fine,
        }
    }

    /// The check of a derive or a proxied call: refused only when the last
    /// measured offset is beyond `max_skew` (an unknown one is served).
    /// Reads memory only.
    pub fn check(&self) -> Result<(), TooFar> {
        match self.offset_ms() {
            Some(o) if o.unsigned_abs() > self.max_ms.unsigned_abs() => Err(TooFar {
                offset_ms: o,
                max_ms: self.max_ms,
            }),
            _ => Ok(()),
        }
    }

    /// Takes one measurement: `sent_ms` and `received_ms` by our clock
    /// around the query, `db_ms` the database's clock in its answer. The
    /// database read its clock about halfway through the round trip. A
    /// measurement with a round trip over 2 s is dropped (the last offset
    /// stays). Logs a change of standing, and an offset beyond
    /// `warn_skew` at most once a minute. Returns the offset used.
    pub fn record(&self, sent_ms: i64, received_ms: i64, db_ms: i64) -> Option<i64> {
        let rtt = received_ms.saturating_sub(sent_ms);
        if !(0..=MAX_ROUND_TRIP_MS).contains(&rtt) {
            tracing::debug!(
                round_trip_ms = rtt,
                "clock offset measurement dropped: round trip too long"
            );
            return None;
        }
        let offset = (sent_ms + rtt / 2) - db_ms;
        let before = self.standing();
        self.offset_ms.store(offset, Ordering::Relaxed);
        self.checked_ms.store(received_ms.max(1), Ordering::Relaxed);
        let now = self.standing();
        let secs = offset as f64 / 1000.0;
        match now {
            Standing::Beyond if before != Standing::Beyond => tracing::error!(
                offset_seconds = secs,
                max_skew_seconds = self.max_ms as f64 / 1000.0,
                "clock offset from the database beyond clock.max_skew: derives and proxied calls are refused (503 clock_skew) until the clock is corrected"
            ),
            Standing::Warn | Standing::Beyond => {
                let last = self.warned_ms.load(Ordering::Relaxed);
                if before != now || received_ms.saturating_sub(last) >= WARN_EVERY_MS {
                    self.warned_ms.store(received_ms, Ordering::Relaxed);
                    tracing::warn!(
                        offset_seconds = secs,
                        warn_skew_seconds = self.warn_ms as f64 / 1000.0,
                        "clock offset from the database beyond clock.warn_skew"
                    );
                }
            }
            Standing::Fine if matches!(before, Standing::Warn | Standing::Beyond) => {
                tracing::info!(
                    offset_seconds = secs,
                    "clock offset from the database back within clock.warn_skew"
                )
            }
            _ => {}
        }
        Some(offset)
    }

    /// The measurement failed (the database did not answer): the offset is
    /// unknown until the next one, and nothing is refused meanwhile.
    pub fn lost(&self) {
        self.offset_ms.store(UNKNOWN, Ordering::Relaxed);
    }
}

/// Takes one measurement against `store`'s clock (blocking: a store
/// call) and records it in `skew`; a failure leaves the offset unknown.
/// Returns the sample and the offset recorded, if any. Does nothing on a
/// store without a clock of its own (sled).
pub(crate) fn measure(
    store: &dyn Store,
    local: &SharedClock,
    skew: &Skew,
) -> Option<(ClockSample, i64)> {
    match store.clock_sample(local) {
        Ok(Some(s)) => skew
            .record(s.sent_ms, s.received_ms, s.store_ms)
            .map(|o| (s, o)),
        Ok(None) => None,
        Err(e) => {
            if skew.offset_ms().is_some() {
                tracing::warn!(error = %e, "measuring the clock offset from the database failed; the offset is unknown until the next measurement, and nothing is refused for it meanwhile");
            }
            skew.lost();
            None
        }
    }
}

/// Our clock corrected by the measured offset: the database's time, for
/// the times replicas share (a key's activation, link, approval and page
/// session expiries). Tokens keep the local clock. With no offset known it
/// is the local clock.
#[derive(Debug)]
pub(crate) struct Corrected {
    local: SharedClock,
    skew: Arc<Skew>,
}

impl Corrected {
    /// `local` corrected by `skew`'s offset.
    pub(crate) fn new(local: SharedClock, skew: Arc<Skew>) -> Arc<Corrected> {
        Arc::new(Corrected { local, skew })
    }
}

impl Clock for Corrected {
    fn now(&self) -> i64 {
        self.now_ms().div_euclid(1000)
    }
    fn now_ms(&self) -> i64 {
        self.local.now_ms() - self.skew.offset_ms().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::ManualClock;

    fn skew() -> Skew {
        Skew::new(&ClockConfig {
            max_skew: Duration::from_secs(5),
            warn_skew: Duration::from_secs(2),
            check_interval: Duration::from_secs(10),
        })
    }

    #[test]
    fn the_offset_is_measured_against_the_middle_of_the_round_trip() {
        let s = skew();
        assert_eq!(s.standing(), Standing::Unknown);
        assert!(s.check().is_ok(), "unknown: served");
        // Sent at 1000, answered at 1400, the database said -88800: it
        // read its clock at about 1200 of ours, so ours is 90 s ahead.
        assert_eq!(s.record(1_000, 1_400, -88_800), Some(90_000));
        assert_eq!(s.standing(), Standing::Beyond);
        assert_eq!(
            s.check(),
            Err(TooFar {
                offset_ms: 90_000,
                max_ms: 5_000
            })
        );
        // Behind as much: the same.
        assert_eq!(s.record(1_000, 1_000, 91_000), Some(-90_000));
        assert!(s.check().is_err());
        // Within warn_skew and between the two bounds: served.
        s.record(1_000, 1_000, -500);
        assert_eq!(s.standing(), Standing::Fine);
        assert!(s.check().is_ok());
        s.record(1_000, 1_000, 5_000);
        assert_eq!(s.standing(), Standing::Warn);
        assert!(s.check().is_ok());
        // 5 s exactly is within; a millisecond more is not.
        s.record(0, 0, -5_000);
        assert!(s.check().is_ok());
        s.record(0, 0, -5_001);
        assert!(s.check().is_err());
        // A slow round trip is dropped: the last offset stays.
        assert_eq!(s.record(0, 2_001, 0), None);
        assert_eq!(s.offset_ms(), Some(5_001));
        // The database away: unknown, served.
        s.lost();
        assert_eq!(s.standing(), Standing::Unknown);
        assert!(s.check().is_ok());
    }

    #[test]
    fn the_corrected_clock_is_the_databases_time() {
        let local = ManualClock::new(1_000);
        let s = Arc::new(skew());
        let c = Corrected::new(local.clone(), s.clone());
        assert_eq!(c.now(), 1_000, "no offset known: the local clock");
        // Our clock 90 s ahead: the database's is 90 s behind ours.
        s.record(1_000_000, 1_000_000, 910_000);
        assert_eq!(c.now(), 910);
        assert_eq!(c.now_ms(), 910_000);
        s.record(1_000_000, 1_000_000, 1_000_500);
        assert_eq!(c.now(), 1_000);
    }
}
