//! Configuration: raw TOML -> validated [`Config`], in two stages.
//!
//! Stage one ([`raw`]) deserializes into raw structs and collects *every*
//! unknown key with its path (through `serde_ignored`, so that one run
//! reports them all, where `deny_unknown_fields` would stop at the first).
//! Stage two checks the values, one section function per table, and
//! collects every problem. Messages name keys and positions, never values:
//! a secret pasted into the wrong key must not end up in a log.
//!
//! Secrets are never inline: the config names files (mode 0600) that hold
//! them ([`read_secret_file`]). Relative paths are resolved against the
//! config file's directory.
//!
//! Files: `raw` (stage one), `listeners` (`[socket]`, `[public]`,
//! `[metrics]`, `[admin]`), `issuers` (`[[trusted_issuers]]`), `providers`
//! (`[providers.<name>]`), `upstreams` (`[upstreams.<name>]`), `ssf`
//! (`[ssf.transmitters.<name>]`), `webhooks` (`[webhooks.<name>]`),
//! `secret_files`, `reference` (the accepted keys,
//! read from `raw`, which `docs/CONFIGURATION.md` is tested against),
//! `reserved` (keys named for features not built yet, refused as such);
//! this file holds the validated
//! [`Config`] and the order in which the sections are checked.

mod issuers;
mod listeners;
mod postgres;
mod providers;
mod raw;
mod reference;
mod reserved;
mod revocation;
mod secret_files;
mod ssf;
mod telemetry;
mod upstreams;
mod webhooks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) use issuers::default_display_name;
pub use issuers::{IntrospectionConfig, IssuerConfig, JwksSource, SignIn};
pub(crate) use listeners::{ApiRuntime, MetricsConfig, PublicConfig, SocketConfig};
pub use providers::{AccountLookup, ClientAuth, Endpoints, ProviderConfig};
pub(crate) use providers::{GITHUB_API, QUICKSTART_DEMO};
pub use reference::{accepted_keys, AcceptedKey};
pub use reserved::RESERVED_KEYS;
pub(crate) use revocation::{RevocationConfig, WatchFailure};
pub use secret_files::{read_secret_file, write_secret_file};
pub(crate) use ssf::{SsfDelivery, SsfTransmitter};
pub(crate) use telemetry::TelemetryConfig;
pub(crate) use upstreams::{
    AudienceParam, ScopeClaim, UpstreamClientAuth, UpstreamConfig, UpstreamGrant, UpstreamResource,
};
pub(crate) use webhooks::{Signing, WebhookConfig};

use crate::base::grammar::secure_or_loopback;
use crate::base::jose::Alg;
use crate::infra::diagnostics::{key_at, parse_toml, Problem};
use crate::infra::reserved::reserved_problems;
use raw::{RawClock, RawConfig, RawDpop, RawLimits, RawProxy};

/// Errors loading the config: all problems found, each with its place.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// One or more problems in the file.
    #[error("{}", format_problems(.0))]
    Invalid(Vec<Problem>),
}

fn format_problems(p: &[Problem]) -> String {
    let mut s = format!("{} problem(s) in the configuration:", p.len());
    for x in p {
        s.push_str("\n  ");
        s.push_str(&x.to_string());
    }
    s
}

/// Parses `"300s"`, `"5m"`, `"1h"`, `"250ms"`.
pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

/// The validated configuration of one instance.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from.
    pub file: PathBuf,
    /// The one agent this instance serves (docs/DESIGN.md section 2).
    pub agent: String,
    /// The public issuer URL: `iss` of minted tokens, base of `htu`.
    pub issuer: String,
    /// The policy file.
    pub policy: PathBuf,
    /// The store: a sled directory (`store`) or PostgreSQL (`[postgres]`).
    pub store: crate::infra::store::Backend,
    /// Audit events (JSON lines): the configured path, resolved against the
    /// config file's directory, or `<store>/audit.jsonl` when unset (sled
    /// only: with PostgreSQL it is required).
    pub audit_log: PathBuf,
    /// The orchestrator socket.
    pub socket: SocketConfig,
    /// The admin socket.
    pub admin_socket: PathBuf,
    /// The public listener, if any.
    pub public: Option<PublicConfig>,
    /// The opt-in metrics listener (`[metrics]`), if any.
    pub metrics: Option<MetricsConfig>,
    /// File holding the 32-byte key that encrypts keys at rest (0600).
    pub master_key_file: PathBuf,
    /// Seconds a rotated-in signing key is published before it signs
    /// (`[keys] activation_delay`, default `ACTIVATION_DELAY`).
    pub key_activation_delay: i64,
    /// DPoP settings.
    pub dpop: DpopConfig,
    /// Rate limits.
    pub limits: LimitsConfig,
    /// The egress proxy's limits and timeouts (`[proxy]`).
    pub proxy: ProxyConfig,
    /// `[clock]`: the bounds on the offset from the shared store's clock.
    pub clock: ClockConfig,
    /// `[outbound] use_env_proxy`: whether the broker's OAuth calls (the
    /// IdPs', the providers' and the upstream authorization servers'
    /// endpoints) go through a proxy named by `HTTP_PROXY`, `HTTPS_PROXY`,
    /// `ALL_PROXY` (except `NO_PROXY`'s hosts). Default `true`. The egress
    /// proxy's calls to `api_base` never do.
    pub use_env_proxy: bool,
    /// `[revocation]`: the person-level stop (`derive::persons`).
    pub revocation: RevocationConfig,
    /// `[telemetry]`: OpenTelemetry export (off by default).
    pub telemetry: TelemetryConfig,
    /// Trusted subject-token issuers.
    pub trusted_issuers: Vec<IssuerConfig>,
    /// Deprecated (`[vault] key_dir`): the directory where installs made
    /// before the vault's keys moved into the store kept them as files;
    /// read only to import them at the first start (see
    /// `crate::accounts::vault::keys`), never written.
    pub vault_key_dir: PathBuf,
    /// Third-party services people can connect, by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// The provider (by name) that is the quick start's built-in demo
    /// service (`preset = "quickstart-demo"`), if any: only `credbroker
    /// quickstart` serves a config with one.
    pub quickstart_demo: Option<String>,
    /// The organisation's authorization servers (`[upstreams.<name>]`), by
    /// name: where `source = "exchange"` resources' tokens come from.
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    /// The Shared Signals transmitters (`[ssf.transmitters.<name>]`), by
    /// name.
    pub ssf: BTreeMap<String, SsfTransmitter>,
    /// Webhook subscriptions (`[webhooks.<name>]`), in name order.
    pub(crate) webhooks: Vec<WebhookConfig>,
    /// Live event streams the admin socket serves at once
    /// (`admin.event_stream_max_connections`).
    pub event_streams: usize,
}

/// DPoP settings.
#[derive(Debug, Clone)]
pub struct DpopConfig {
    /// Require server nonces (RFC 9449 section 8).
    pub require_nonce: bool,
    /// Accepted proof algorithms.
    pub algs: Vec<Alg>,
    /// Capacity of the `jti` replay cache in entries (from
    /// `replay_cache_bytes`, or the deprecated `replay_capacity`); full =
    /// refuse.
    pub replay_capacity: usize,
    /// The memory the replay cache's slots may take, in bytes.
    pub replay_cache_bytes: usize,
}

/// `[clock]`: the bounds on this instance's offset from the database's
/// clock, measured only with `[postgres]` (docs/STORE.md, "Clocks").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockConfig {
    /// Beyond it derives and proxied calls are refused (503 `clock_skew`);
    /// default 5 s, never more than the verifiers' leeway
    /// ([`credbroker_verify::SKEW`]).
    pub max_skew: Duration,
    /// Beyond it a warning is logged; default 2 s, below `max_skew`.
    pub warn_skew: Duration,
    /// How often the offset is measured; default 10 s.
    pub check_interval: Duration,
}

/// `[proxy]`: the egress proxy's limits and timeouts (docs/PROXY.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Largest request body forwarded (bytes; default 10 MiB): a larger one
    /// gets 413 and nothing goes upstream.
    pub max_request_body: u64,
    /// Bound on connecting to the provider's API (default 5 s).
    pub connect_timeout: Duration,
    /// Bound on a whole proxied call, answer included (default 30 s).
    pub timeout: Duration,
    /// Concurrent upstream calls per service (default 64): more get 503.
    pub max_concurrent_per_service: u32,
    /// Proxied calls in flight on the public listener, all services
    /// together (default 256, below the listener's connection cap), so that
    /// slow streams never take every connection from the sign-in pages.
    pub max_in_flight: u32,
}

/// Rate limits (governor).
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    /// Derives per second per peer uid.
    pub per_peer_per_second: u32,
    /// Derives per second per (person, tool).
    pub per_person_tool_per_second: u32,
    /// Burst size of both.
    pub burst: u32,
    /// Derives per second over the whole broker (its burst is one second's
    /// worth). Never above what the replay cache can check: see
    /// [`max_derive_rate`]. 0 only for a cache too small to sustain even
    /// one derive a second (under 136 entries): then there is no global
    /// limit and the cache's own refusal (503) is the bound.
    pub global_per_second: u32,
}

/// The JWKS document's `Cache-Control: max-age` (seconds). It lives here,
/// below `mint` which serves it, because [`ACTIVATION_DELAY`] is built on it.
pub(crate) const JWKS_MAX_AGE: i64 = 60;
/// How long a rotated-in key is published before it signs (seconds): the
/// JWKS cache lifetime plus the resource servers' refetch interval, so that
/// every resource server has the new key before the first token it signs.
/// The default of `[keys] activation_delay`, which overrides it.
pub(crate) const ACTIVATION_DELAY: i64 = JWKS_MAX_AGE + crate::verify::JWKS_REFRESH_INTERVAL;

/// The default `dpop.replay_cache_bytes`: 16 MiB.
pub const DEFAULT_REPLAY_CACHE_BYTES: usize = 16 << 20;

/// The highest sustained derive rate a replay cache of `entries` can check
/// without refusing: a `jti` is kept up to [`crate::base::dpop::MAX_JTI_LIFETIME`]
/// seconds, and the global limit's burst (one second's worth) comes on top;
/// one tenth is left spare.
pub fn max_derive_rate(entries: usize) -> u32 {
    let per_second = entries as u64 * 9 / 10 / (crate::base::dpop::MAX_JTI_LIFETIME as u64 + 1);
    u32::try_from(per_second).unwrap_or(u32::MAX)
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Validates config text; `path` names it in messages and anchors
    /// relative paths. Sections are checked in the order of the file's
    /// documentation, and their problems are reported in that order.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        // A key reserved for a feature not built yet is refused as such
        // (not as unknown), before anything else.
        let reserved = reserved_problems(path, text, RESERVED_KEYS);
        if !reserved.is_empty() {
            return Err(ConfigError::Invalid(reserved));
        }
        let raw: RawConfig = parse_toml(path, text).map_err(ConfigError::Invalid)?;
        let mut check = Check::new(path, text);
        agent(&raw.agent, &mut check);
        let issuer = own_issuer(&raw.issuer, &mut check);
        let socket = listeners::socket(raw.socket, &mut check);
        let public = listeners::public(raw.public, &mut check);
        let metrics = listeners::metrics(raw.metrics, public.as_ref(), &mut check);
        let dpop = dpop(raw.dpop, raw.postgres.is_some(), &mut check);
        let limits = limits(&raw.limits, &dpop, &mut check);
        let proxy = proxy(&raw.proxy, &mut check);
        let clock = clock(&raw.clock, &mut check);
        let revocation = revocation::revocation(&raw.revocation, &mut check);
        let telemetry = telemetry::telemetry(raw.telemetry, &mut check);
        let trusted_issuers =
            issuers::trusted_issuers(raw.trusted_issuers, &issuer, &raw.agent, &mut check);
        let quickstart_demo = raw
            .providers
            .iter()
            .find(|(_, p)| p.preset.as_deref() == Some(QUICKSTART_DEMO))
            .map(|(name, _)| name.clone());
        let providers = providers::providers(raw.providers, &issuer, &mut check);
        let upstreams = upstreams::upstreams(raw.upstreams, &trusted_issuers, &mut check);
        let ssf = ssf::ssf(raw.ssf, &trusted_issuers, &issuer, &mut check);
        let webhooks = webhooks::webhooks(raw.webhooks, &mut check);
        let event_streams = webhooks::event_streams(
            raw.admin
                .as_ref()
                .and_then(|a| a.event_stream_max_connections),
            &mut check,
        );
        let store = postgres::backend(
            raw.store.as_deref(),
            raw.postgres,
            raw.audit_log.is_some(),
            &mut check,
        );
        if !check.problems.is_empty() {
            return Err(ConfigError::Invalid(check.problems));
        }
        Ok(Config {
            file: path.to_owned(),
            agent: raw.agent,
            issuer,
            policy: check.rel(&raw.policy),
            audit_log: match (&raw.audit_log, store.sled_dir()) {
                (Some(p), _) => check.rel(p),
                (None, Some(dir)) => dir.join("audit.jsonl"),
                // Refused above: PostgreSQL needs `audit_log`.
                (None, None) => PathBuf::new(),
            },
            admin_socket: listeners::admin_socket(raw.admin.as_ref(), &check),
            store,
            socket,
            public,
            metrics,
            master_key_file: check.rel(&raw.keys.master_key_file),
            // Capped at a day: a longer wait is a typo, and the cap keeps
            // the sum with a Unix time far from overflow.
            key_activation_delay: raw
                .keys
                .activation_delay
                .map_or(ACTIVATION_DELAY, |d| d.min(86_400) as i64),
            dpop,
            limits,
            proxy,
            clock,
            use_env_proxy: raw.outbound.use_env_proxy.unwrap_or(true),
            revocation,
            telemetry,
            trusted_issuers,
            vault_key_dir: match raw.vault {
                Some(v) => check.rel(&v.key_dir),
                // Beside the master key, in its own directory.
                None => check
                    .rel(&raw.keys.master_key_file)
                    .parent()
                    .map_or_else(|| check.rel(Path::new("vault-keys")), |d| d.join("vault")),
            },
            providers,
            quickstart_demo,
            upstreams,
            ssf,
            webhooks,
            event_streams,
        })
    }
}

/// Stage two's state over one file: where relative paths are anchored, and
/// every problem found so far, each placed at its key.
struct Check<'a> {
    file: &'a Path,
    text: &'a str,
    base: &'a Path,
    problems: Vec<Problem>,
}

impl<'a> Check<'a> {
    fn new(file: &'a Path, text: &'a str) -> Check<'a> {
        Check {
            file,
            text,
            base: file.parent().unwrap_or(Path::new(".")),
            problems: Vec::new(),
        }
    }

    /// Reports a problem at `key` (a dotted path); the message names no value.
    fn bad(&mut self, key: &str, message: &str) {
        self.problems.push(Problem {
            at: key_at(self.file, self.text, key),
            key: Some(key.to_string()),
            message: message.to_string(),
        });
    }

    /// `p` anchored at the config file's directory, unless absolute.
    fn rel(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base.join(p)
        }
    }

    /// An `algs` list: each a supported algorithm, at least one; `default`
    /// when the key is absent.
    fn algs(&mut self, key: &str, v: Option<Vec<String>>, default: Vec<Alg>) -> Vec<Alg> {
        let Some(list) = v else {
            return default;
        };
        let mut out = Vec::new();
        for a in &list {
            match Alg::parse(a) {
                Ok(a) => out.push(a),
                Err(_) => self.bad(key, "unsupported algorithm (ES256, RS256, PS256)"),
            }
        }
        if out.is_empty() {
            self.bad(key, "must list at least one algorithm");
        }
        out
    }

    /// An endpoint or issuer URL: https (http only on loopback), without
    /// query or fragment; reported at `key` when not.
    fn url(&mut self, key: &str, v: &str) {
        let ok = url::Url::parse(v)
            .is_ok_and(|u| secure_or_loopback(&u) && u.query().is_none() && u.fragment().is_none());
        if !ok {
            self.bad(
                key,
                "must be an https URL (http only on loopback), without query or fragment",
            );
        }
    }

    /// A duration key's value within `range`; `None` after reporting
    /// `message` at `key` when it is not a duration or out of range.
    fn duration_in(
        &mut self,
        key: &str,
        v: &str,
        range: impl std::ops::RangeBounds<Duration>,
        message: &str,
    ) -> Option<Duration> {
        match parse_duration(v) {
            Some(d) if range.contains(&d) => Some(d),
            _ => {
                self.bad(key, message);
                None
            }
        }
    }
}

/// A name in a table's key (`upstreams.<name>`, `ssf.transmitters.<name>`,
/// `webhooks.<name>`): 1 to 64 ASCII letters, digits, `-` and `_`.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Validates `agent`: a name without control characters.
fn agent(agent: &str, check: &mut Check<'_>) {
    if agent.is_empty() || agent.chars().any(|c| c.is_control()) {
        check.bad(
            "agent",
            "must be a non-empty name without control characters",
        );
    }
}

/// Validates `issuer` and returns it without its trailing slash (`iss` and
/// `htu` are built from it); empty if invalid.
fn own_issuer(raw: &str, check: &mut Check<'_>) -> String {
    match url::Url::parse(raw) {
        Ok(u) if secure_or_loopback(&u) && u.query().is_none() && u.fragment().is_none() => {
            raw.trim_end_matches('/').to_string()
        }
        _ => {
            check.bad(
                "issuer",
                "must be an https URL (http only on loopback), without query or fragment",
            );
            String::new()
        }
    }
}

/// Validates `[dpop]`. With a shared store (`[postgres]`) server nonces
/// are on by default and cannot be turned off: replicas keep their derive
/// replay caches each to itself, and only a nonce bound to the replica that
/// issued it keeps a proof accepted by one replica from being accepted
/// again by another.
fn dpop(raw: RawDpop, shared_store: bool, check: &mut Check<'_>) -> DpopConfig {
    if shared_store && raw.require_nonce == Some(false) {
        check.bad(
            "dpop.require_nonce",
            "cannot be false with [postgres]: replicas keep their DPoP replay caches each to itself, so only server nonces bound to the replica stop a proof accepted by one replica from being replayed to another; remove the key (it defaults to true with [postgres])",
        );
    }
    let require_nonce = raw.require_nonce.unwrap_or(shared_store);
    let algs = check.algs("dpop.algs", raw.algs, vec![Alg::ES256]);
    // `replay_capacity` (entries) is deprecated but still honoured: the
    // bytes are what bounds memory, so they are derived from it.
    let (replay_capacity, replay_cache_bytes) = match (raw.replay_capacity, raw.replay_cache_bytes)
    {
        (Some(_), Some(_)) => {
            check.bad(
                "dpop.replay_capacity",
                "is deprecated and cannot be combined with dpop.replay_cache_bytes: keep only replay_cache_bytes",
            );
            (16, 0)
        }
        (Some(n), None) => {
            if n < 16 {
                check.bad("dpop.replay_capacity", "must be at least 16");
            }
            let cache = crate::base::dpop::ReplayCache::new(n);
            (n, cache.slot_bytes())
        }
        (None, bytes) => {
            let bytes = bytes.unwrap_or(DEFAULT_REPLAY_CACHE_BYTES);
            let n = crate::base::dpop::ReplayCache::capacity_for_bytes(bytes);
            if n < 16 {
                check.bad(
                    "dpop.replay_cache_bytes",
                    &format!(
                        "holds fewer than 16 entries ({} bytes a slot): give at least 1024",
                        crate::base::dpop::REPLAY_SLOT_BYTES
                    ),
                );
            }
            (n, bytes)
        }
    };
    DpopConfig {
        require_nonce,
        algs,
        replay_capacity,
        replay_cache_bytes,
    }
}

/// Validates `[proxy]`.
fn proxy(raw: &RawProxy, check: &mut Check<'_>) -> ProxyConfig {
    let mut duration = |key: &str, v: &Option<String>, default: u64| match v.as_deref() {
        None => Duration::from_secs(default),
        Some(t) => match parse_duration(t) {
            Some(d) if !d.is_zero() && d <= Duration::from_secs(600) => d,
            _ => {
                check.bad(
                    key,
                    "must be a duration between 1ms and 10m, such as \"5s\"",
                );
                Duration::from_secs(default)
            }
        },
    };
    let connect_timeout = duration("proxy.connect_timeout", &raw.connect_timeout, 5);
    let timeout = duration("proxy.timeout", &raw.timeout, 30);
    let cfg = ProxyConfig {
        max_request_body: raw.max_request_body.unwrap_or(10 * 1024 * 1024),
        connect_timeout,
        timeout,
        max_concurrent_per_service: raw.max_concurrent_per_service.unwrap_or(64),
        max_in_flight: raw.max_in_flight.unwrap_or(256),
    };
    if cfg.max_concurrent_per_service == 0 {
        check.bad("proxy.max_concurrent_per_service", "must be at least 1");
    }
    if cfg.max_in_flight == 0 || cfg.max_in_flight > 1000 {
        check.bad(
            "proxy.max_in_flight",
            "must be between 1 and 1000 (below the public listener's 1024 connections)",
        );
    }
    cfg
}

/// Validates `[clock]`.
fn clock(raw: &RawClock, check: &mut Check<'_>) -> ClockConfig {
    let leeway = Duration::from_secs(credbroker_verify::SKEW as u64);
    let mut duration =
        |key: &str, v: &Option<String>, default: Duration, most: Duration, what: &str| match v
            .as_deref()
        {
            None => default,
            Some(t) => match parse_duration(t) {
                Some(d) if d >= Duration::from_millis(100) && d <= most => d,
                _ => {
                    check.bad(key, what);
                    default
                }
            },
        };
    let max_skew = duration(
        "clock.max_skew",
        &raw.max_skew,
        leeway,
        leeway,
        "must be a duration between 100ms and 5s, such as \"5s\" (no more than the 5 s leeway verifiers allow a token's iat and exp)",
    );
    let warn_skew = duration(
        "clock.warn_skew",
        &raw.warn_skew,
        Duration::from_secs(2),
        leeway,
        "must be a duration between 100ms and 5s, such as \"2s\"",
    );
    let check_interval = duration(
        "clock.check_interval",
        &raw.check_interval,
        Duration::from_secs(10),
        Duration::from_secs(300),
        "must be a duration between 100ms and 5m, such as \"10s\"",
    );
    if warn_skew > max_skew {
        check.bad("clock.warn_skew", "must not be above clock.max_skew");
    }
    ClockConfig {
        max_skew,
        warn_skew,
        check_interval,
    }
}

/// Validates `[limits]`.
fn limits(raw: &RawLimits, dpop: &DpopConfig, check: &mut Check<'_>) -> LimitsConfig {
    // The replay cache's bound wins over every rate limit: the global limit
    // refuses (429) before the cache would (503), never after.
    let most = max_derive_rate(dpop.replay_capacity);
    let global_per_second = match raw.global_per_second {
        Some(0) => {
            check.bad("limits.global_per_second", "must be positive");
            most
        }
        Some(r) if r > most => {
            check.bad(
                "limits.global_per_second",
                &format!(
                    "is above the {most} derives/s the replay cache can check ({} entries, a jti kept up to {} s): lower it or raise dpop.replay_cache_bytes",
                    dpop.replay_capacity,
                    crate::base::dpop::MAX_JTI_LIFETIME
                ),
            );
            most
        }
        Some(r) => r,
        None => most,
    };
    let limits = LimitsConfig {
        global_per_second,
        per_peer_per_second: raw.per_peer_per_second.unwrap_or(20_000),
        per_person_tool_per_second: raw.per_person_tool_per_second.unwrap_or(1_000),
        burst: raw.burst.unwrap_or(2_000),
    };
    if limits.per_peer_per_second == 0
        || limits.per_person_tool_per_second == 0
        || limits.burst == 0
    {
        check.bad("limits", "rates and burst must be positive");
    }
    limits
}

/// For the crate's tests: a minimal instance in `d` (an identity
/// provider's JWKS, a master key, `policy`, and a config naming them, with
/// `extra` appended), parsed. Gives the identity provider's key too.
#[cfg(test)]
// reason: test code, where a panic is the failure report.
#[allow(clippy::unwrap_used)]
pub(crate) fn test_instance(
    d: &Path,
    policy: &str,
    extra: &str,
) -> (crate::base::jose::Es256Key, Config) {
    use std::os::unix::fs::PermissionsExt;
    let (idp, _) = crate::base::jose::Es256Key::generate().unwrap();
    let jwks = serde_json::json!({ "keys": [idp.public_jwk] });
    std::fs::write(d.join("idp-jwks.json"), jwks.to_string()).unwrap();
    std::fs::write(d.join("master.key"), [7u8; 32]).unwrap();
    std::fs::set_permissions(d.join("master.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(d.join("policy.toml"), policy).unwrap();
    let config = format!(
        r#"agent = "repo-helper"
issuer = "http://127.0.0.1:9"
policy = "policy.toml"
store = "data"

[socket]
path = "broker.sock"

[keys]
master_key_file = "master.key"

[[trusted_issuers]]
issuer = "https://idp.example"
jwks_file = "idp-jwks.json"
sign_in = {{ kind = "oidc", client_id = "broker" }}
{extra}"#
    );
    let config = Config::parse(&d.join("credbroker.toml"), &config).unwrap();
    (idp, config)
}

#[cfg(test)]
mod provider_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upstream_tests;
