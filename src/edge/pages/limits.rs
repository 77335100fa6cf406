//! Rate limits per client address on the public pages: link-code look-ups
//! (so codes cannot be enumerated), sign-in (so passwords cannot be guessed
//! quickly; the per-account lockout in `users` is the second line), and new
//! browser sessions (each one is a durable write). Each is a token bucket
//! (GCRA): `burst` requests at once, then one every `60 / per_minute`
//! seconds. A refused request gets 429 with `Retry-After` = the seconds
//! until the bucket would admit it.
//!
//! IPv6 clients are keyed by their /64, since one host usually holds a whole
//! /64. Everyone behind one address (an office NAT) shares its buckets.
//! Behind a reverse proxy every request comes from the proxy's address;
//! such deployments need the proxy to limit instead.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;

use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Limits per client address.
#[derive(Debug, Clone, Copy)]
pub struct PageLimits {
    /// Code look-ups (`GET`/`POST /connect/{code}`) per minute (sustained).
    pub lookups_per_minute: u32,
    /// Code look-ups allowed in a burst.
    pub lookup_burst: u32,
    /// Sign-in attempts per minute: `POST /signin`, `GET /signin/oidc`
    /// and `GET /signin/callback` each count one.
    pub signins_per_minute: u32,
    /// Sign-in attempts allowed in a burst.
    pub signin_burst: u32,
}

impl Default for PageLimits {
    fn default() -> Self {
        PageLimits {
            lookups_per_minute: 60,
            lookup_burst: 30,
            signins_per_minute: 10,
            signin_burst: 20,
        }
    }
}

/// New anonymous sessions (a first visit to `/signin`, or a sign-in
/// started without a session) per minute and address: fixed, generous for
/// an office behind one address, and apart from the look-up limit so that
/// page views never use up a person's code look-ups.
pub(crate) const NEW_SESSIONS_PER_MINUTE: u32 = 60;
/// New anonymous sessions allowed in a burst.
pub(crate) const NEW_SESSION_BURST: u32 = 60;
/// At most this many `signin.failed` events (and their log lines) are
/// written a minute, whatever their source; the rest are counted, and the
/// count is logged once the minute is over.
pub const SIGNIN_FAILED_PER_MINUTE: u32 = 60;

/// Seconds until a limiter would admit the client (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(pub u64);

/// The limiters.
#[derive(Debug)]
pub(crate) struct Limiters {
    lookups: DefaultKeyedRateLimiter<IpAddr>,
    signins: DefaultKeyedRateLimiter<IpAddr>,
    sessions: DefaultKeyedRateLimiter<IpAddr>,
}

fn quota(per_minute: u32, burst: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN))
        .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

/// The key of a client address (IPv6 by /64).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut s = v6.segments();
                s[4..].fill(0);
                IpAddr::V6(s.into())
            }
        },
    }
}

fn check(l: &DefaultKeyedRateLimiter<IpAddr>, ip: IpAddr) -> Result<(), RetryAfter> {
    l.check_key(&client_key(ip)).map_err(|not_until| {
        let wait = not_until.wait_time_from(l.clock().now());
        // Rounded up: a client that waits this long is admitted.
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        RetryAfter(secs.max(1))
    })
}

impl Limiters {
    /// Limiters with these limits.
    pub(crate) fn new(l: &PageLimits) -> Limiters {
        Limiters {
            lookups: RateLimiter::keyed(quota(l.lookups_per_minute, l.lookup_burst)),
            signins: RateLimiter::keyed(quota(l.signins_per_minute, l.signin_burst)),
            sessions: RateLimiter::keyed(quota(NEW_SESSIONS_PER_MINUTE, NEW_SESSION_BURST)),
        }
    }

    /// Whether `ip` may look up one more code.
    pub(crate) fn lookup(&self, ip: IpAddr) -> Result<(), RetryAfter> {
        check(&self.lookups, ip)
    }

    /// Whether `ip` may try one more sign-in.
    pub(crate) fn signin(&self, ip: IpAddr) -> Result<(), RetryAfter> {
        check(&self.signins, ip)
    }

    /// Whether `ip` may create one more anonymous session.
    pub(crate) fn new_session(&self, ip: IpAddr) -> Result<(), RetryAfter> {
        check(&self.sessions, ip)
    }

    /// Forgets idle addresses (governor keeps every key until told).
    pub(crate) fn housekeeping(&self) {
        for l in [&self.lookups, &self.signins, &self.sessions] {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// A budget of events per minute of the broker's clock (a fixed window).
#[derive(Debug)]
pub(crate) struct EventBudget {
    per_minute: u32,
    /// (the window's minute, events admitted in it, events refused in it).
    state: Mutex<(i64, u32, u64)>,
}

impl EventBudget {
    /// A budget of `per_minute` events a minute.
    pub(crate) fn new(per_minute: u32) -> EventBudget {
        EventBudget {
            per_minute,
            state: Mutex::new((i64::MIN, 0, 0)),
        }
    }

    /// Whether one more event at `now` is within the budget; and, when a
    /// new minute began, how many the last minute refused (to be logged).
    pub(crate) fn admit(&self, now: i64) -> (bool, Option<u64>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let minute = now.div_euclid(60);
        let mut over = None;
        if st.0 != minute {
            if st.2 > 0 {
                over = Some(st.2);
            }
            *st = (minute, 0, 0);
        }
        if st.1 < self.per_minute {
            st.1 += 1;
            (true, over)
        } else {
            st.2 += 1;
            (false, over)
        }
    }

    /// When the window of the refused events is over, their count (once).
    pub(crate) fn flush(&self, now: i64) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.0 != now.div_euclid(60) && st.2 > 0 {
            let n = st.2;
            st.2 = 0;
            return Some(n);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_address_and_ipv6_by_prefix() {
        let l = Limiters::new(&PageLimits {
            lookups_per_minute: 1,
            lookup_burst: 3,
            ..PageLimits::default()
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..3 {
            assert!(l.lookup(a).is_ok());
        }
        assert!(l.lookup(a).is_err());
        assert!(l.lookup(b).is_ok(), "another address is not affected");
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..3 {
            assert!(l.lookup(v6a).is_ok());
        }
        assert!(l.lookup(v6b).is_err(), "same /64");
        assert!(l.lookup("2001:db8:1:3::1".parse().unwrap()).is_ok());
    }

    #[test]
    fn retry_after_is_the_wait_until_the_bucket_admits() {
        // 60 a minute: one token a second. After the burst, the next is
        // admitted within a second, not a minute.
        let l = Limiters::new(&PageLimits {
            lookups_per_minute: 60,
            lookup_burst: 2,
            signins_per_minute: 2,
            signin_burst: 1,
        });
        let a: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(l.lookup(a).is_ok() && l.lookup(a).is_ok());
        assert_eq!(l.lookup(a), Err(RetryAfter(1)));
        // 2 a minute: one token every 30 s.
        assert!(l.signin(a).is_ok());
        let Err(RetryAfter(s)) = l.signin(a) else {
            panic!("second sign-in admitted")
        };
        assert!((29..=30).contains(&s), "{s}");
        // Positive control: after the wait the bucket admits again.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(l.lookup(a).is_ok());
    }

    #[test]
    fn event_budget_caps_a_minute_and_reports_what_it_dropped() {
        let b = EventBudget::new(3);
        let t = 6_000;
        for _ in 0..3 {
            assert_eq!(b.admit(t), (true, None));
        }
        assert_eq!(b.admit(t + 1), (false, None));
        assert_eq!(b.admit(t + 2), (false, None));
        assert_eq!(b.flush(t + 59), None, "the minute is not over");
        // The next minute admits again and reports the two dropped.
        assert_eq!(b.admit(t + 60), (true, Some(2)));
        assert_eq!(b.flush(t + 200), None, "reported once");
        assert_eq!(b.admit(t + 60), (true, None));
    }
}
