//! Security Event Tokens (RFC 8417) as SSF 1.0 profiles them, checked in
//! the crate's order: size -> three parts -> base64url -> header (`typ`
//! `secevent+jwt`, never absent; `alg` in [`ALGS`]; no `crit`) -> `iss` is
//! the transmitter's -> key (the transmitter's JWKS only) -> signature ->
//! typed claims (`aud`, `jti`, `iat` within [now - max age, now + skew],
//! exactly one event, a subject). Each failure carries its RFC 8935 error
//! code ([`SetError::code`]); none carries token bytes.
//!
//! A SET is never a subject token and a subject token never a SET: the
//! `typ` differs (`secevent+jwt` here, never absent; `at+jwt` there, and
//! `[[trusted_issuers]].token_types` refuses `secevent+jwt`), and the
//! subject validator refuses any token with an `events` claim.

use std::collections::HashMap;

use serde::Deserialize;

use crate::base::jose::{self, Alg, Audience, JoseError, JwkSet};

/// The algorithms a SET may be signed with (SSF 1.0 requires RS256 support;
/// the others are the crate's).
pub(crate) const ALGS: [Alg; 3] = [Alg::RS256, Alg::PS256, Alg::ES256];
/// How far in the future `iat` may be (seconds): clocks differ a little.
pub(crate) const IAT_SKEW: i64 = 5;
/// The longest `jti` kept (bytes): it is part of a store key.
const MAX_JTI: usize = 256;

/// Why a SET was refused, by RFC 8935 section 2.4's codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SetError {
    /// `invalid_request`: not a well-formed SET of this profile.
    #[error("{0}")]
    Request(&'static str),
    /// `invalid_key`: no key of the transmitter verifies it.
    #[error("{0}")]
    Key(&'static str),
    /// `invalid_issuer`: `iss` is not the transmitter.
    #[error("the SET's iss is not this transmitter's issuer")]
    Issuer,
    /// `invalid_audience`: `aud` does not name this receiver.
    #[error("the SET's aud does not name this receiver")]
    Audience,
}

impl SetError {
    /// The RFC 8935 `err` code.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            SetError::Request(_) => "invalid_request",
            SetError::Key(_) => "invalid_key",
            SetError::Issuer => "invalid_issuer",
            SetError::Audience => "invalid_audience",
        }
    }
}

/// What the checks need to know of the transmitter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect<'a> {
    /// Its issuer.
    pub(crate) issuer: &'a str,
    /// Our audience at it.
    pub(crate) audience: &'a str,
    /// The largest SET.
    pub(crate) max_bytes: usize,
    /// The oldest `iat` accepted is `now - max_age` (seconds).
    pub(crate) max_age: i64,
}

/// A SET that passed every check.
#[derive(Debug, Clone)]
pub(crate) struct Set {
    /// Its `jti`.
    pub(crate) jti: String,
    /// Its `iat`.
    pub(crate) iat: i64,
    /// The event type URI (its one `events` member).
    pub(crate) event_type: String,
    /// That member's value.
    pub(crate) event: serde_json::Map<String, serde_json::Value>,
    /// The subject: `sub_id` (SSF 1.0), or the event's `subject` (the
    /// drafts before it).
    pub(crate) subject: serde_json::Value,
    /// The time the event says it happened (CAEP `event_timestamp`), if any.
    pub(crate) event_time: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct PeekIss {
    iss: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Claims {
    iss: String,
    aud: Audience,
    jti: String,
    #[serde(deserialize_with = "jose::numeric_date")]
    iat: i64,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    exp: Option<i64>,
    events: HashMap<String, serde_json::Value>,
    #[serde(default)]
    sub_id: Option<serde_json::Value>,
}

/// Parses the header and payload of `token` and checks it against the
/// transmitter (`expect`) and its keys at `now`. `keys` is called with
/// whether the first set lacked the key (a refetch, rate-limited by the
/// key-set cache) and returns the keys to try.
pub(crate) async fn check<F, Fut>(
    token: &str,
    expect: &Expect<'_>,
    now: i64,
    keys: F,
) -> Result<Set, SetError>
where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = Option<std::sync::Arc<JwkSet>>>,
{
    let jws = jose::parse(token, expect.max_bytes).map_err(|e| match e {
        JoseError::TooLarge(_) => SetError::Request("the SET is larger than max_set_bytes"),
        JoseError::Crit => SetError::Request("the SET's header has crit or b64"),
        _ => {
            SetError::Request("the SET is not a compact JWS (three base64url parts, a JSON header)")
        }
    })?;
    let alg = jose::check_header(
        &jws.header,
        &jose::HeaderRule {
            typ: jose::TypRule::MediaTypes {
                allowed: &["secevent+jwt"],
                absent_ok: false,
            },
            algs: &ALGS,
        },
    )
    .map_err(|e| match e {
        jose::HeaderError::Typ => SetError::Request("the SET's typ is not secevent+jwt"),
        jose::HeaderError::Alg => SetError::Request(
            "the SET's alg is not one of RS256, PS256, ES256 (unsigned SETs are refused)",
        ),
    })?;
    let peek: PeekIss = serde_json::from_slice(&jws.payload)
        .map_err(|_| SetError::Request("the SET's payload is not a JSON object"))?;
    match peek.iss {
        Some(serde_json::Value::String(s)) if s == expect.issuer => {}
        Some(serde_json::Value::String(_)) => return Err(SetError::Issuer),
        _ => return Err(SetError::Request("the SET has no iss")),
    }
    let kid = jws.header.kid.as_deref();
    let jwk = match keys(false).await.and_then(|k| k.select(kid, alg).cloned()) {
        Some(k) => k,
        None => keys(true)
            .await
            .and_then(|k| k.select(kid, alg).cloned())
            .ok_or(SetError::Key(
                "no key of the transmitter matches the SET's kid and alg",
            ))?,
    };
    jwk.verify(alg, &jws).map_err(|_| {
        SetError::Key("the SET's signature does not verify with the transmitter's key")
    })?;
    let claims: Claims = serde_json::from_slice(&jws.payload).map_err(|_| {
        SetError::Request("the SET's claims are missing or malformed (iss, aud, jti, iat, events)")
    })?;
    claims_ok(claims, expect, now)
}

/// The claim checks after the signature.
fn claims_ok(claims: Claims, expect: &Expect<'_>, now: i64) -> Result<Set, SetError> {
    if claims.iss != expect.issuer {
        return Err(SetError::Issuer);
    }
    if !claims.aud.contains(expect.audience) {
        return Err(SetError::Audience);
    }
    if claims.jti.is_empty() || claims.jti.len() > MAX_JTI {
        return Err(SetError::Request(
            "the SET's jti is empty or longer than 256 bytes",
        ));
    }
    if claims.iat > now + IAT_SKEW {
        return Err(SetError::Request("the SET's iat is in the future"));
    }
    if claims.iat < now - expect.max_age {
        return Err(SetError::Request(
            "the SET's iat is older than the maximum event age (revocation.max_event_age)",
        ));
    }
    if claims.exp.is_some_and(|e| e <= now) {
        return Err(SetError::Request("the SET has expired"));
    }
    if claims.events.len() != 1 {
        return Err(SetError::Request(
            "the SET's events must hold exactly one event",
        ));
    }
    let Some((event_type, event)) = claims.events.into_iter().next() else {
        return Err(SetError::Request(
            "the SET's events must hold exactly one event",
        ));
    };
    let serde_json::Value::Object(event) = event else {
        return Err(SetError::Request("the SET's event is not a JSON object"));
    };
    let subject = match (claims.sub_id, event.get("subject")) {
        (Some(s), _) => s,
        (None, Some(s)) => s.clone(),
        (None, None) => {
            return Err(SetError::Request(
                "the SET names no subject (sub_id, or the event's subject)",
            ))
        }
    };
    let event_time = match event.get("event_timestamp") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
                .ok_or(SetError::Request(
                    "the event's event_timestamp is not a number",
                ))?,
        ),
    };
    Ok(Set {
        jti: claims.jti,
        iat: claims.iat,
        event_type,
        event,
        subject,
        event_time,
    })
}

#[cfg(test)]
mod tests;
