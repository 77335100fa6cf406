//! `[[trusted_issuers]]`: who may vouch for the person, and how the pages
//! sign that person in.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::{RawIssuer, RawSignIn};
use super::{parse_duration, Check};
use crate::base::grammar::secure_or_loopback;
use crate::base::jose::Alg;

/// How the pages sign in the person that an issuer's `sub` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignIn {
    /// OIDC at the same issuer.
    Oidc {
        /// Our client id at the IdP.
        client_id: String,
        /// Its secret, in a 0600 file.
        client_secret_file: Option<PathBuf>,
    },
    /// Local accounts; only for the broker's own issuer.
    Local,
}

/// Where an issuer's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A pinned JWKS file.
    File(PathBuf),
    /// A JWKS URI (https, or http on loopback).
    Uri(String),
}

/// One trusted subject-token issuer.
#[derive(Debug, Clone)]
pub struct IssuerConfig {
    /// `iss`, compared exactly.
    pub issuer: String,
    /// Expected `aud` (default: the agent's name).
    pub audience: String,
    /// Its keys.
    pub jwks: JwksSource,
    /// Allowed `alg`s.
    pub algs: Vec<Alg>,
    /// Allowed `typ` header values (access tokens, not ID tokens).
    pub token_types: Vec<String>,
    /// Claims that must be present.
    pub required_claims: Vec<String>,
    /// The paired sign-in source.
    pub sign_in: SignIn,
    /// The sign-in source's name on the pages (`sign_in.display_name`):
    /// the sign-in button, and beside the person's name wherever the pages
    /// name them. Default: the issuer URL's host.
    pub display_name: String,
    /// Subject-token status by RFC 7662 introspection at this issuer
    /// (off: `None`).
    pub introspection: Option<IntrospectionConfig>,
}

/// `trusted_issuers[].introspection_*`: the subject tokens' status asked
/// of the issuer (docs/REVOCATION.md, "Subject-token status").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntrospectionConfig {
    /// The RFC 7662 endpoint (https, http only on loopback).
    pub endpoint: String,
    /// The broker's client id there (`client_secret_basic`).
    pub client_id: String,
    /// Its secret, in a 0600 file.
    pub client_secret_file: PathBuf,
    /// Whether JWT subject tokens are introspected too (an opaque one
    /// always is).
    pub jwts: bool,
    /// How long an answer stands (the subject cache's lifetime for this
    /// issuer's tokens); zero: asked at every derive.
    pub cache_ttl: Duration,
}

/// The default `introspection_cache_ttl`.
const DEFAULT_INTROSPECTION_CACHE_TTL: Duration = Duration::from_secs(10);

/// Validates `[[trusted_issuers]]`: at least one, each well formed and
/// paired with a sign-in source, none listed twice. `own_issuer` is the
/// broker's (validated) issuer, `agent` the default audience.
pub(super) fn trusted_issuers(
    raw: Vec<RawIssuer>,
    own_issuer: &str,
    agent: &str,
    check: &mut Check<'_>,
) -> Vec<IssuerConfig> {
    if raw.is_empty() {
        check.bad(
            "trusted_issuers",
            "at least one trusted subject-token issuer is needed",
        );
    }
    let issuers: Vec<IssuerConfig> = raw
        .into_iter()
        .enumerate()
        .map(|(i, ti)| trusted_issuer(i, ti, own_issuer, agent, check))
        .collect();
    let mut seen = HashSet::new();
    for (i, ti) in issuers.iter().enumerate() {
        if !seen.insert(ti.issuer.clone()) {
            check.bad(
                &format!("trusted_issuers[{i}].issuer"),
                "an issuer is listed twice",
            );
        }
    }
    issuers
}

/// Validates one `[[trusted_issuers]]` entry, the `i`th.
fn trusted_issuer(
    i: usize,
    ti: RawIssuer,
    own_issuer: &str,
    agent: &str,
    check: &mut Check<'_>,
) -> IssuerConfig {
    let key = |k: &str| format!("trusted_issuers[{i}].{k}");
    let introspection = introspection(&ti, &key, check);
    let iss_url = url::Url::parse(&ti.issuer).ok();
    if !iss_url.as_ref().is_some_and(secure_or_loopback) {
        check.bad(
            &key("issuer"),
            "must be an https URL (http only on loopback)",
        );
    }
    let jwks = match (ti.jwks_file, ti.jwks_uri) {
        (Some(f), None) => JwksSource::File(check.rel(&f)),
        (None, Some(u)) => {
            if !url::Url::parse(&u).is_ok_and(|u| secure_or_loopback(&u)) {
                check.bad(
                    &key("jwks_uri"),
                    "must be an https URL (http only on loopback)",
                );
            }
            JwksSource::Uri(u)
        }
        _ => {
            check.bad(
                &key("jwks_file"),
                "give exactly one of jwks_file or jwks_uri",
            );
            JwksSource::File(PathBuf::new())
        }
    };
    let algs = check.algs(&key("algs"), ti.algs, vec![Alg::ES256, Alg::RS256]);
    let display_name = ti
        .sign_in
        .as_ref()
        .and_then(|s| s.display_name.clone())
        .map_or_else(
            || default_display_name(&ti.issuer),
            |n| {
                if !valid_display_name(&n) {
                    check.bad(
                        &key("sign_in.display_name"),
                        "must be 1 to 60 characters, without control characters",
                    );
                }
                n
            },
        );
    let sign_in = sign_in(ti.sign_in, &ti.issuer, own_issuer, &key, check);
    let token_types = ti.token_types.unwrap_or_else(|| vec!["at+jwt".into()]);
    if token_types
        .iter()
        .any(|t| t.eq_ignore_ascii_case("dpop+jwt"))
    {
        check.bad(&key("token_types"), "DPoP proofs are never subject tokens");
    }
    // A Security Event Token (RFC 8417) is a statement about a person, not
    // a credential for them: it never passes as a subject token.
    if token_types
        .iter()
        .any(|t| crate::base::jose::normalize_typ(t) == "secevent+jwt")
    {
        check.bad(
            &key("token_types"),
            "Security Event Tokens (secevent+jwt) are never subject tokens",
        );
    }
    IssuerConfig {
        introspection,
        issuer: ti.issuer,
        audience: ti.audience.unwrap_or_else(|| agent.to_string()),
        jwks,
        algs,
        token_types,
        required_claims: ti.required_claims.unwrap_or_default(),
        sign_in,
        display_name,
    }
}

/// `introspection_*`: all or none (besides the two with defaults), the
/// endpoint https, the cache at most a minute (the subject cache's own
/// bound).
fn introspection(
    ti: &RawIssuer,
    key: &dyn Fn(&str) -> String,
    check: &mut Check<'_>,
) -> Option<IntrospectionConfig> {
    let Some(endpoint) = &ti.introspection_endpoint else {
        for (k, set) in [
            (
                "introspection_client_id",
                ti.introspection_client_id.is_some(),
            ),
            (
                "introspection_client_secret_file",
                ti.introspection_client_secret_file.is_some(),
            ),
            ("introspect_jwts", ti.introspect_jwts.is_some()),
            (
                "introspection_cache_ttl",
                ti.introspection_cache_ttl.is_some(),
            ),
        ] {
            if set {
                check.bad(&key(k), "is used only with introspection_endpoint");
            }
        }
        return None;
    };
    let before = check.problems.len();
    if !url::Url::parse(endpoint)
        .is_ok_and(|u| secure_or_loopback(&u) && u.query().is_none() && u.fragment().is_none())
    {
        check.bad(
            &key("introspection_endpoint"),
            "must be an https URL (http only on loopback), without query or fragment",
        );
    }
    let client_id = ti.introspection_client_id.clone().unwrap_or_default();
    if client_id.is_empty() || client_id.chars().any(char::is_control) {
        check.bad(
            &key("introspection_client_id"),
            "is required with introspection_endpoint: the broker's client id there, without control characters",
        );
    }
    let client_secret_file = match &ti.introspection_client_secret_file {
        Some(p) => check.rel(p),
        None => {
            check.bad(
                &key("introspection_client_secret_file"),
                "is required with introspection_endpoint: the file (mode 0600) holding the client secret",
            );
            PathBuf::new()
        }
    };
    let cache_ttl = match ti.introspection_cache_ttl.as_deref() {
        None => DEFAULT_INTROSPECTION_CACHE_TTL,
        Some(t) => match parse_duration(t) {
            Some(d) if d <= Duration::from_secs(60) => d,
            _ => {
                check.bad(
                    &key("introspection_cache_ttl"),
                    "must be a duration from 0s to 60s, such as \"10s\"",
                );
                DEFAULT_INTROSPECTION_CACHE_TTL
            }
        },
    };
    (check.problems.len() == before).then(|| IntrospectionConfig {
        endpoint: endpoint.clone(),
        client_id,
        client_secret_file,
        jwts: ti.introspect_jwts.unwrap_or(false),
        cache_ttl,
    })
}

/// The name a sign-in source has without `display_name`: its host (and
/// port), which is what a person can check in the address bar.
pub(crate) fn default_display_name(issuer: &str) -> String {
    url::Url::parse(issuer)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_string();
            Some(match u.port() {
                Some(p) => format!("{host}:{p}"),
                None => host,
            })
        })
        .unwrap_or_else(|| issuer.to_string())
}

/// A name to show on a page: short, and nothing that could break a line.
pub(super) fn valid_display_name(n: &str) -> bool {
    let len = n.chars().count();
    (1..=60).contains(&len) && !n.chars().any(char::is_control) && !n.trim().is_empty()
}

/// Validates an issuer's `sign_in`: local only for the broker's own
/// issuer, OIDC with a client id.
fn sign_in(
    raw: Option<RawSignIn>,
    issuer: &str,
    own_issuer: &str,
    key: &dyn Fn(&str) -> String,
    check: &mut Check<'_>,
) -> SignIn {
    let Some(s) = raw else {
        check.bad(&key("sign_in"), "every trusted issuer must be paired with a sign-in source (kind = \"oidc\" or \"local\")");
        return SignIn::Local;
    };
    match (s.kind.as_str(), s.client_id, s.client_secret_file) {
        ("local", None, None) => {
            if issuer.trim_end_matches('/') != own_issuer {
                check.bad(
                    &key("sign_in"),
                    "local sign-in pairs only with the broker's own issuer",
                );
            }
            SignIn::Local
        }
        ("local", _, _) => {
            check.bad(
                &key("sign_in"),
                "local sign-in takes no client_id or client_secret_file",
            );
            SignIn::Local
        }
        ("oidc", Some(client_id), client_secret_file) => SignIn::Oidc {
            client_id,
            client_secret_file: client_secret_file.map(|p| check.rel(&p)),
        },
        ("oidc", None, _) => {
            check.bad(&key("sign_in.client_id"), "OIDC sign-in needs a client_id");
            SignIn::Local
        }
        _ => {
            check.bad(&key("sign_in.kind"), "must be \"oidc\" or \"local\"");
            SignIn::Local
        }
    }
}
