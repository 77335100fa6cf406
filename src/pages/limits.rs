//! Rate limits per client address on the public pages: link-code look-ups
//! (so codes cannot be enumerated) and sign-in (so passwords cannot be
//! guessed quickly; the per-account lockout in `users` is the second line).
//!
//! IPv6 clients are keyed by their /64, since one host usually holds a whole
//! /64. Behind a reverse proxy every request comes from the proxy's address;
//! such deployments need the proxy to limit instead.

use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Limits per client address.
#[derive(Debug, Clone, Copy)]
pub struct PageLimits {
    /// Code look-ups per minute (sustained).
    pub lookups_per_minute: u32,
    /// Code look-ups allowed in a burst.
    pub lookup_burst: u32,
    /// Sign-in attempts (and sign-in flow starts) per minute.
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

/// The limiters.
#[derive(Debug)]
pub struct Limiters {
    lookups: DefaultKeyedRateLimiter<IpAddr>,
    signins: DefaultKeyedRateLimiter<IpAddr>,
}

fn quota(per_minute: u32, burst: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN))
        .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

/// The key of a client address (IPv6 by /64).
pub fn client_key(ip: IpAddr) -> IpAddr {
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

impl Limiters {
    /// Limiters with these limits.
    pub fn new(l: &PageLimits) -> Limiters {
        Limiters {
            lookups: RateLimiter::keyed(quota(l.lookups_per_minute, l.lookup_burst)),
            signins: RateLimiter::keyed(quota(l.signins_per_minute, l.signin_burst)),
        }
    }

    /// Whether `ip` may look up one more code.
    pub fn lookup(&self, ip: IpAddr) -> bool {
        self.lookups.check_key(&client_key(ip)).is_ok()
    }

    /// Whether `ip` may try one more sign-in.
    pub fn signin(&self, ip: IpAddr) -> bool {
        self.signins.check_key(&client_key(ip)).is_ok()
    }

    /// Forgets idle addresses (governor keeps every key until told).
    pub fn housekeeping(&self) {
        self.lookups.retain_recent();
        self.signins.retain_recent();
        self.lookups.shrink_to_fit();
        self.signins.shrink_to_fit();
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
            assert!(l.lookup(a));
        }
        assert!(!l.lookup(a));
        assert!(l.lookup(b), "another address is not affected");
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..3 {
            assert!(l.lookup(v6a));
        }
        assert!(!l.lookup(v6b), "same /64");
        assert!(l.lookup("2001:db8:1:3::1".parse().unwrap()));
    }
}
