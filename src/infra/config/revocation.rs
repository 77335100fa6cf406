//! `[revocation]`: the person-level stop (`credbroker persons revoke`,
//! Shared Signals): how old an event's time may be, the skew a new sign-in
//! must clear, how long a replica may go without reading the stop list,
//! what it does then, and the longest-lived subject token accepted (which
//! sets how long a stop is kept; docs/REVOCATION.md).

use std::time::Duration;

use serde::Deserialize;

use super::{parse_duration, Check};

/// `[revocation]` as read.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawRevocation {
    #[serde(default)]
    pub(super) max_event_age: Option<String>,
    #[serde(default)]
    pub(super) restore_skew: Option<String>,
    #[serde(default)]
    pub(super) watch_failure: Option<String>,
    #[serde(default)]
    pub(super) watch_bound: Option<String>,
    #[serde(default)]
    pub(super) revoke_at_providers: Option<bool>,
    #[serde(default)]
    pub(super) max_subject_token_lifetime: Option<String>,
}

/// What a replica does when it has not read the stop list within
/// [`RevocationConfig::watch_bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFailure {
    /// Refuse derives and proxied calls (503 `revocation_watch_down`): a
    /// kill switch must not fail open silently. The default.
    Refuse,
    /// Keep serving, and report the bound as broken (`/status`
    /// `revocation_watch`, `credbroker_revocation_watch_up`, the log).
    Serve,
}

/// `[revocation]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationConfig {
    /// How far an event's own time may lie before its receipt: it narrows
    /// the revocation time within [receipt - this, receipt]; an older
    /// event is refused (default 10 min).
    pub max_event_age: Duration,
    /// A stop that a new sign-in may lift is lifted only by a subject
    /// token whose `auth_time` is later than the revocation time plus this
    /// (default 30 s).
    pub restore_skew: Duration,
    /// What a replica does past the bound (default refuse).
    pub watch_failure: WatchFailure,
    /// The longest a stop stored on one replica takes to reach the others
    /// (default 10 s): each polls the list at half of it, and one that has
    /// not read it for longer reports its watch down.
    pub watch_bound: Duration,
    /// Whether every stop also revokes the person's connected accounts at
    /// their providers (default false; `persons revoke
    /// --revoke-at-providers` asks for it for one stop).
    pub revoke_at_providers: bool,
    /// The longest subject token accepted: `exp - iat`, or `exp - now`
    /// for a token without `iat` (default 24 h). A longer-lived token is
    /// refused, so that a stop, kept this long past its receipt (with the
    /// margins of `derive::persons::stop_retention`), outlives every token
    /// of the session it stopped.
    pub max_subject_token_lifetime: Duration,
}

/// The default `max_subject_token_lifetime` in seconds (24 h): above the
/// access-token lifetimes identity providers issue by default (minutes to
/// an hour; 24 h is the longest default we know of, Auth0's for APIs).
const DEFAULT_MAX_SUBJECT_TOKEN_LIFETIME: u64 = 24 * 3600;

impl Default for RevocationConfig {
    fn default() -> RevocationConfig {
        RevocationConfig {
            max_event_age: Duration::from_secs(600),
            restore_skew: Duration::from_secs(30),
            watch_failure: WatchFailure::Refuse,
            watch_bound: Duration::from_secs(10),
            revoke_at_providers: false,
            max_subject_token_lifetime: Duration::from_secs(DEFAULT_MAX_SUBJECT_TOKEN_LIFETIME),
        }
    }
}

/// Validates `[revocation]`.
pub(super) fn revocation(raw: &RawRevocation, check: &mut Check<'_>) -> RevocationConfig {
    let d = RevocationConfig::default();
    let mut duration = |key: &str,
                        v: &Option<String>,
                        default: Duration,
                        least: Duration,
                        most: Duration,
                        what: &str| {
        match v.as_deref() {
            None => default,
            Some(t) => match parse_duration(t) {
                Some(x) if x >= least && x <= most => x,
                _ => {
                    check.bad(key, what);
                    default
                }
            },
        }
    };
    let s = Duration::from_secs;
    let max_event_age = duration(
        "revocation.max_event_age",
        &raw.max_event_age,
        d.max_event_age,
        s(1),
        s(86_400),
        "must be a duration between 1s and 24h, such as \"10m\"",
    );
    let restore_skew = duration(
        "revocation.restore_skew",
        &raw.restore_skew,
        d.restore_skew,
        s(0),
        s(600),
        "must be a duration between 0s and 10m, such as \"30s\"",
    );
    let watch_bound = duration(
        "revocation.watch_bound",
        &raw.watch_bound,
        d.watch_bound,
        s(2),
        s(300),
        "must be a duration between 2s and 5m, such as \"10s\"",
    );
    let max_subject_token_lifetime = duration(
        "revocation.max_subject_token_lifetime",
        &raw.max_subject_token_lifetime,
        d.max_subject_token_lifetime,
        s(60),
        s(30 * 86_400),
        "must be a duration between 1m and 720h (30 days), such as \"24h\"",
    );
    let watch_failure = match raw.watch_failure.as_deref() {
        None | Some("refuse") => WatchFailure::Refuse,
        Some("serve") => WatchFailure::Serve,
        Some(_) => {
            check.bad(
                "revocation.watch_failure",
                "must be \"refuse\" (the default) or \"serve\"",
            );
            WatchFailure::Refuse
        }
    };
    RevocationConfig {
        max_event_age,
        restore_skew,
        watch_failure,
        watch_bound,
        revoke_at_providers: raw.revoke_at_providers.unwrap_or(false),
        max_subject_token_lifetime,
    }
}
