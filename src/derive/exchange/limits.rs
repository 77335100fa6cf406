//! The derive's rate limiters: over the whole broker, per peer, and per
//! (person, tool); the pipeline ([`super`]) says where each is checked.

use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Rate limiters: over the whole broker, per peer and per (person, tool).
#[derive(Debug)]
pub struct Limits {
    /// Sized so that the replay cache never refuses below it
    /// ([`crate::infra::config::max_derive_rate`]): past it a derive gets 429 with
    /// `Retry-After`, checked before anything else. None when the cache is
    /// too small for any sustained rate (its own 503 is then the bound).
    global: Option<governor::DefaultDirectRateLimiter>,
    per_peer: DefaultKeyedRateLimiter<u32>,
    per_person_tool: DefaultKeyedRateLimiter<(String, String, String)>,
}

fn quota(per_second: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

impl Limits {
    /// Limiters from config.
    pub fn new(cfg: &crate::infra::config::LimitsConfig) -> Limits {
        Limits {
            global: (cfg.global_per_second > 0)
                .then(|| RateLimiter::direct(quota(cfg.global_per_second, cfg.global_per_second))),
            per_peer: RateLimiter::keyed(quota(cfg.per_peer_per_second, cfg.burst)),
            per_person_tool: RateLimiter::keyed(quota(cfg.per_person_tool_per_second, cfg.burst)),
        }
    }

    fn retry_after(nu: &governor::NotUntil<governor::clock::QuantaInstant>) -> u64 {
        let wait = nu.wait_time_from(governor::clock::Clock::now(
            &governor::clock::DefaultClock::default(),
        ));
        wait.as_secs() + 1
    }

    /// Forgets idle keys so memory stays bounded; call periodically.
    pub fn housekeeping(&self) {
        self.per_peer.retain_recent();
        self.per_person_tool.retain_recent();
        self.per_peer.shrink_to_fit();
        self.per_person_tool.shrink_to_fit();
    }

    /// Counts one derive against the limit over the whole broker (none
    /// when the replay cache is too small for any sustained rate); `Err`
    /// holds the seconds to wait.
    pub(super) fn check_global(&self) -> Result<(), u64> {
        match self.global.as_ref().map(|g| g.check()) {
            Some(Err(nu)) => Err(Limits::retry_after(&nu)),
            _ => Ok(()),
        }
    }

    /// Counts one derive of the peer `uid` against its limit; `Err` holds
    /// the seconds to wait.
    pub(super) fn check_peer(&self, uid: u32) -> Result<(), u64> {
        self.per_peer
            .check_key(&uid)
            .map_err(|nu| Limits::retry_after(&nu))
    }

    /// Counts one call of `tool` for the person against the
    /// per-person-and-tool limit (derives and proxied calls share it);
    /// `Err` holds the seconds to wait.
    pub fn check_person_tool(&self, iss: &str, sub: &str, tool: &str) -> Result<(), u64> {
        self.per_person_tool
            .check_key(&(iss.to_string(), sub.to_string(), tool.to_string()))
            .map_err(|nu| Limits::retry_after(&nu))
    }

    /// Keys held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.per_peer.len() + self.per_person_tool.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
