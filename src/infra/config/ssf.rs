//! `[ssf.transmitters.<name>]`: the Shared Signals transmitters whose
//! Security Event Tokens this instance receives (docs/SSF.md). Each names
//! its issuer, how its SETs arrive (pushed to `{issuer}/ssf/events`, RFC
//! 8935, or polled, RFC 8936), and the trusted issuers whose people it may
//! stop: no other person is ever acted on for it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::{RawSsf, RawTransmitter};
use super::{valid_name, Check, IssuerConfig};

/// How a transmitter's SETs arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SsfDelivery {
    /// Pushed to `{issuer}/ssf/events` (RFC 8935).
    Push,
    /// Polled from the transmitter by one replica at a time (RFC 8936).
    Poll,
}

impl SsfDelivery {
    /// The SSF 1.0 delivery method URN.
    pub fn method(self) -> &'static str {
        match self {
            SsfDelivery::Push => "urn:ietf:rfc:8935",
            SsfDelivery::Poll => "urn:ietf:rfc:8936",
        }
    }
}

/// The default of `max_set_bytes`: SETs are small; 64 KiB is plenty.
pub(crate) const DEFAULT_MAX_SET_BYTES: usize = 64 * 1024;
/// The most `max_set_bytes` may be.
pub(crate) const MOST_SET_BYTES: usize = 1024 * 1024;

/// One SSF transmitter.
#[derive(Debug, Clone)]
pub struct SsfTransmitter {
    /// Its name in the config (labels, events, the CLI).
    pub name: String,
    /// Its issuer: the SETs' `iss`, and its metadata's `issuer`.
    pub issuer: String,
    /// Its SSF metadata (default: `/.well-known/ssf-configuration` inserted
    /// between the issuer's host and path, SSF 1.0 section 7.2).
    pub metadata_url: String,
    /// Its JWKS URI, when given (otherwise the metadata's `jwks_uri`).
    pub jwks_uri: Option<String>,
    /// The SETs' expected `aud` (default: this broker's issuer).
    pub audience: String,
    /// Push or poll.
    pub delivery: SsfDelivery,
    /// The file (0600) holding the `Authorization` value the transmitter
    /// sends with each push (required for push).
    pub push_authorization_file: Option<PathBuf>,
    /// The file (0600) holding the bearer token for the transmitter's
    /// stream management API (`credbroker ssf stream create|verify`, and
    /// polling).
    pub management_credentials_file: Option<PathBuf>,
    /// The trusted issuers (`[[trusted_issuers]]` entries) whose people its
    /// SETs may stop.
    pub trusted_issuers: Vec<String>,
    /// Whether an `email` subject maps, through the verified email recorded
    /// for a person of those issuers (default false).
    pub map_email: bool,
    /// How often to poll (poll only; default 30 s).
    pub poll_interval: Duration,
    /// The largest SET accepted (bytes; default 64 KiB).
    pub max_set_bytes: usize,
    /// Pushes accepted per second (default 50); more get 429.
    pub per_second: u32,
}

/// Validates `[ssf]`; `trusted` are the validated `[[trusted_issuers]]`,
/// `own_issuer` the broker's issuer (the default audience).
pub(super) fn ssf(
    raw: Option<RawSsf>,
    trusted: &[IssuerConfig],
    own_issuer: &str,
    check: &mut Check<'_>,
) -> BTreeMap<String, SsfTransmitter> {
    let mut out = BTreeMap::new();
    for (name, t) in raw.map(|r| r.transmitters).unwrap_or_default() {
        let key = format!("ssf.transmitters.{name}");
        if !valid_name(&name) {
            check.bad(
                &key,
                "a transmitter's name is letters, digits, '-' and '_' (at most 64)",
            );
            continue;
        }
        if let Some(c) = transmitter(&name, t, trusted, own_issuer, &key, check) {
            out.insert(name, c);
        }
    }
    let mut issuers = std::collections::HashSet::new();
    for t in out.values() {
        if !issuers.insert(t.issuer.clone()) {
            check.bad(
                &format!("ssf.transmitters.{}.issuer", t.name),
                "another transmitter has the same issuer",
            );
        }
    }
    out
}

/// `/.well-known/ssf-configuration` between the issuer's host and path.
pub(crate) fn default_metadata_url(issuer: &str) -> Option<String> {
    let u = url::Url::parse(issuer).ok()?;
    let path = u.path().trim_end_matches('/');
    Some(format!(
        "{}/.well-known/ssf-configuration{path}",
        u.origin().ascii_serialization()
    ))
}

fn transmitter(
    name: &str,
    t: RawTransmitter,
    trusted: &[IssuerConfig],
    own_issuer: &str,
    key: &str,
    check: &mut Check<'_>,
) -> Option<SsfTransmitter> {
    let before = check.problems.len();
    check.url(&format!("{key}.issuer"), &t.issuer);
    for (k, v) in [("metadata_url", &t.metadata_url), ("jwks_uri", &t.jwks_uri)] {
        if let Some(v) = v {
            check.url(&format!("{key}.{k}"), v);
        }
    }
    let audience = t.audience.unwrap_or_else(|| own_issuer.to_owned());
    if audience.is_empty() || audience.chars().any(char::is_control) {
        check.bad(
            &format!("{key}.audience"),
            "must be a non-empty string without control characters",
        );
    }
    let delivery = match t.delivery.as_deref() {
        None | Some("push") => SsfDelivery::Push,
        Some("poll") => SsfDelivery::Poll,
        Some(_) => {
            check.bad(&format!("{key}.delivery"), "must be \"push\" or \"poll\"");
            SsfDelivery::Push
        }
    };
    if delivery == SsfDelivery::Push && t.push_authorization_file.is_none() {
        check.bad(
            &format!("{key}.push_authorization_file"),
            "is required with delivery = \"push\": the file (mode 0600) holding the Authorization value the transmitter sends with each SET",
        );
    }
    if delivery == SsfDelivery::Poll && t.push_authorization_file.is_some() {
        check.bad(
            &format!("{key}.push_authorization_file"),
            "is only for delivery = \"push\": a polled transmitter pushes nothing",
        );
    }
    if delivery == SsfDelivery::Poll && t.management_credentials_file.is_none() {
        check.bad(
            &format!("{key}.management_credentials_file"),
            "is required with delivery = \"poll\": the file (mode 0600) holding the bearer token for the transmitter's stream and poll endpoints",
        );
    }
    if t.trusted_issuers.is_empty() {
        check.bad(
            &format!("{key}.trusted_issuers"),
            "must list at least one trusted issuer whose people this transmitter's events may stop",
        );
    }
    for s in &t.trusted_issuers {
        if !trusted.iter().any(|i| &i.issuer == s) {
            check.bad(
                &format!("{key}.trusted_issuers"),
                "names an issuer that is not a [[trusted_issuers]] entry's issuer",
            );
        }
    }
    let poll_interval = t
        .poll_interval
        .as_deref()
        .and_then(|v| {
            check.duration_in(
                &format!("{key}.poll_interval"),
                v,
                Duration::from_millis(100)..=Duration::from_secs(3600),
                "must be a duration between 100ms and 1h, such as \"30s\"",
            )
        })
        .unwrap_or(Duration::from_secs(30));
    let max_set_bytes = t.max_set_bytes.unwrap_or(DEFAULT_MAX_SET_BYTES);
    if !(1024..=MOST_SET_BYTES).contains(&max_set_bytes) {
        check.bad(
            &format!("{key}.max_set_bytes"),
            "must be between 1024 and 1048576 bytes",
        );
    }
    let per_second = t.per_second.unwrap_or(50);
    if per_second == 0 || per_second > 10_000 {
        check.bad(&format!("{key}.per_second"), "must be between 1 and 10000");
    }
    if check.problems.len() > before {
        return None;
    }
    Some(SsfTransmitter {
        name: name.to_owned(),
        metadata_url: t
            .metadata_url
            .or_else(|| default_metadata_url(&t.issuer))
            .unwrap_or_default(),
        issuer: t.issuer,
        jwks_uri: t.jwks_uri,
        audience,
        delivery,
        push_authorization_file: t.push_authorization_file.map(|p| check.rel(&p)),
        management_credentials_file: t.management_credentials_file.map(|p| check.rel(&p)),
        trusted_issuers: t.trusted_issuers,
        map_email: t.map_email.unwrap_or(false),
        poll_interval,
        max_set_bytes,
        per_second,
    })
}

#[cfg(test)]
mod tests {
    use super::default_metadata_url;

    #[test]
    fn metadata_url_goes_between_host_and_path() {
        assert_eq!(
            default_metadata_url("https://tx.example/tenant/1").as_deref(),
            Some("https://tx.example/.well-known/ssf-configuration/tenant/1")
        );
        assert_eq!(
            default_metadata_url("https://tx.example/").as_deref(),
            Some("https://tx.example/.well-known/ssf-configuration")
        );
    }
}
