//! The upstream's answer, checked before the tool sees it. Any failed
//! check refuses (502 `upstream_token_rejected`): never a wider or unbound
//! token, never a fall-back to a token of the broker's own. A refresh
//! token in the answer is dropped (zeroized), never kept or returned.
//!
//! The order: the answer's members (`issued_token_type` an access token:
//! required of an RFC 8693 answer, and when present in an RFC 7523 one,
//! `token_type` DPoP, `scope` and `expires_in` when given), then the JWT
//! (size, three parts, header `typ` `at+jwt` and `alg`, the key from the
//! AS's JWKS, the signature), then its claims (`iss`, `aud` exactly the
//! configured set, `cnf.jkt` the tool's key, the scopes exactly those
//! granted, `iat`/`exp` at most 300 s apart, not past the subject token's
//! `exp`). An opaque token is refused, unless the upstream names its
//! RFC 7662 introspection endpoint: then the introspection's answer must
//! show the same facts, and its members go through the same claim checks
//! ([`super::introspect`]).

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use zeroize::Zeroize;

use super::call::TokenAnswer;
use super::{
    ExchangeInput, Exchanged, Resolved, Upstream, UpstreamError, ACCESS_TOKEN_TYPE, MAX_LIFETIME,
};
use crate::base::jose::{self, Alg, Audience, JoseError};
use crate::base::keyset::Refetch;
use crate::base::secret::SecretString;
use crate::infra::config::{ScopeClaim, UpstreamResource};

/// The largest token accepted.
const MAX_TOKEN: usize = 16 * 1024;
/// Clock tolerance between the AS and the broker (seconds).
const SKEW: i64 = 60;

/// A token endpoint's JSON answer (also read by `id_jag` for leg 1).
#[derive(Deserialize)]
pub(super) struct RawAnswer {
    #[serde(default)]
    pub(super) access_token: Option<String>,
    #[serde(default)]
    pub(super) issued_token_type: Option<String>,
    #[serde(default)]
    pub(super) token_type: Option<String>,
    #[serde(default)]
    pub(super) expires_in: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) scope: Option<String>,
    #[serde(default)]
    pub(super) refresh_token: Option<String>,
}

impl Drop for RawAnswer {
    fn drop(&mut self) {
        self.access_token.zeroize();
        self.refresh_token.zeroize();
    }
}

#[derive(Deserialize)]
pub(super) struct Cnf {
    pub(super) jkt: Option<String>,
}

/// A token's claims: a JWT's, or what introspection says of an opaque
/// token ([`Claims::introspected`]).
#[derive(Deserialize)]
pub(super) struct Claims {
    iss: Option<String>,
    aud: Option<Audience>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    iat: Option<i64>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    exp: Option<i64>,
    cnf: Option<Cnf>,
    scope: Option<serde_json::Value>,
    scp: Option<serde_json::Value>,
    jti: Option<String>,
}

impl Claims {
    /// An introspection answer's facts, for the same checks as a JWT's
    /// claims. RFC 7662 carries scopes as one `scope` string: it stands
    /// for either claim form the resource's entry names.
    pub(super) fn introspected(a: crate::base::oauth::introspect::Introspection) -> Claims {
        let scp = a.scope.as_deref().map(|s| {
            serde_json::Value::Array(
                s.split(' ')
                    .filter(|x| !x.is_empty())
                    .map(|x| serde_json::Value::String(x.to_owned()))
                    .collect(),
            )
        });
        Claims {
            iss: a.iss,
            aud: a.aud,
            iat: a.iat,
            exp: a.exp,
            cnf: a.cnf.map(|c| Cnf { jkt: c.jkt }),
            scope: a.scope.map(serde_json::Value::String),
            scp,
            jti: a.jti,
        }
    }
}

pub(super) fn rejected(why: &'static str) -> UpstreamError {
    UpstreamError::TokenRejected(why)
}

/// Every check of the module doc; gives the token and its `exp`.
/// `exchange`: an RFC 8693 answer, which must name `issued_token_type`
/// (an RFC 7523 answer, leg 2 of an ID-JAG derive, need not).
pub(super) async fn check(
    u: &Upstream,
    resolved: &Resolved,
    input: &ExchangeInput<'_>,
    shape: &UpstreamResource,
    answer: TokenAnswer,
    exchange: bool,
) -> Result<Exchanged, UpstreamError> {
    let mut raw: RawAnswer = serde_json::from_slice(&answer.body)
        .map_err(|_| UpstreamError::BadAnswer("it is not a token answer"))?;
    drop(answer);
    // Dropped whatever else happens: never stored, never returned.
    raw.refresh_token.zeroize();
    raw.refresh_token = None;
    let token = raw
        .access_token
        .take()
        .filter(|t| !t.is_empty())
        .map(SecretString::new)
        .ok_or(UpstreamError::BadAnswer("it has no access_token"))?;
    let issued = raw.issued_token_type.as_deref();
    if issued != Some(ACCESS_TOKEN_TYPE) && (exchange || issued.is_some()) {
        return Err(rejected("issued_token_type is not an access token"));
    }
    if !raw
        .token_type
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("DPoP"))
    {
        return Err(rejected("token_type is not DPoP (an unbound token)"));
    }
    let granted: BTreeSet<&str> = input.scopes.iter().map(String::as_str).collect();
    if let Some(s) = &raw.scope {
        if s.split(' ')
            .filter(|x| !x.is_empty())
            .collect::<BTreeSet<_>>()
            != granted
        {
            return Err(rejected("its scope is not exactly the granted scopes"));
        }
    }
    match &raw.expires_in {
        None => {}
        Some(v) if v.as_i64().is_some_and(|n| n > 0 && n <= MAX_LIFETIME) => {}
        Some(_) => return Err(rejected("its expires_in is not between 1 and 300 s")),
    }
    let opaque =
        jose::parse(token.expose(), MAX_TOKEN).is_err() && token.expose().len() <= MAX_TOKEN;
    let claims: Claims = match &u.cfg.introspection_endpoint {
        Some(endpoint) if opaque => {
            super::introspect::claims(u, endpoint, input, token.expose()).await?
        }
        _ => verify(u, resolved, token.expose(), input.now, &["at+jwt"]).await?,
    };
    let exp = check_claims(u, shape, input, &granted, &claims)?;
    let id = claims
        .jti
        .filter(|j| !j.is_empty() && j.len() <= 256)
        .unwrap_or_else(|| format!("upstream:{}", jose::sha256_hex(token.expose().as_bytes())));
    Ok(Exchanged {
        access_token: token,
        exp,
        id,
    })
}

/// The JWT's header (`typ` one of `typ`), key (from the AS's JWKS: the one
/// key-set cache) and signature; gives its claims.
pub(super) async fn verify<C: DeserializeOwned>(
    u: &Upstream,
    resolved: &Resolved,
    token: &str,
    now: i64,
    typ: &[&str],
) -> Result<C, UpstreamError> {
    let jws = jose::parse(token, MAX_TOKEN).map_err(|_| {
        rejected("it is not a JWT: its binding to the tool's key cannot be shown (the upstream has no introspection_endpoint)")
    })?;
    let alg = jose::check_header(
        &jws.header,
        &jose::HeaderRule {
            typ: jose::TypRule::MediaTypes {
                allowed: typ,
                absent_ok: false,
            },
            algs: &[Alg::ES256, Alg::RS256, Alg::PS256],
        },
    )
    .map_err(|_| rejected("its header does not have the expected typ and an accepted alg"))?;
    let kid = jws.header.kid.as_deref();
    let keys = resolved.keys.keys();
    let jwk = match keys.select(kid, alg) {
        Some(k) => k.clone(),
        None => match resolved.keys.refetch(now).await {
            Ok(Refetch::Fetched(set) | Refetch::Throttled(set)) => set
                .select(kid, alg)
                .cloned()
                .ok_or(rejected("it is signed by a key the AS does not publish"))?,
            Ok(Refetch::Pinned) => {
                return Err(rejected("it is signed by a key the AS does not publish"))
            }
            Err(_) => {
                tracing::warn!(upstream = %u.cfg.name, "the upstream's JWKS could not be fetched");
                return Err(UpstreamError::Unavailable);
            }
        },
    };
    jwk.verify(alg, &jws).map_err(|e| match e {
        JoseError::Alg => rejected("its alg does not fit the key"),
        _ => rejected("its signature does not verify against the AS's keys"),
    })?;
    serde_json::from_slice(&jws.payload).map_err(|_| rejected("its claims are malformed"))
}

/// The claims against the request; gives `exp`.
fn check_claims(
    u: &Upstream,
    shape: &UpstreamResource,
    input: &ExchangeInput<'_>,
    granted: &BTreeSet<&str>,
    c: &Claims,
) -> Result<i64, UpstreamError> {
    if c.iss.as_deref() != Some(u.cfg.issuer.as_str()) {
        return Err(rejected("its iss is not the upstream's issuer"));
    }
    let aud: BTreeSet<&str> = match &c.aud {
        Some(Audience::One(a)) => [a.as_str()].into(),
        Some(Audience::Many(v)) => v.iter().map(String::as_str).collect(),
        None => BTreeSet::new(),
    };
    let want: BTreeSet<&str> = shape.audience.iter().map(String::as_str).collect();
    let many = matches!(&c.aud, Some(Audience::Many(v)) if v.len() != aud.len());
    if aud != want || many {
        return Err(rejected("its aud is not exactly the configured audience"));
    }
    match c.cnf.as_ref().and_then(|c| c.jkt.as_deref()) {
        Some(j) if j == input.jkt => {}
        Some(_) => return Err(rejected("it is bound to another key than the tool's")),
        None => return Err(rejected("it is not bound to the tool's key (no cnf.jkt)")),
    }
    let scopes = match shape.scope_claim {
        ScopeClaim::Scope => match &c.scope {
            Some(serde_json::Value::String(s)) => {
                Some(s.split(' ').filter(|x| !x.is_empty()).collect::<Vec<_>>())
            }
            None if granted.is_empty() => Some(Vec::new()),
            _ => None,
        },
        ScopeClaim::Scp => match &c.scp {
            Some(serde_json::Value::Array(a)) => a.iter().map(|v| v.as_str()).collect(),
            None if granted.is_empty() => Some(Vec::new()),
            _ => None,
        },
    };
    let scopes = scopes.ok_or(rejected("its scope claim is missing or malformed"))?;
    let set: BTreeSet<&str> = scopes.iter().copied().collect();
    if &set != granted || set.len() != scopes.len() {
        return Err(rejected("its scopes are not exactly the granted scopes"));
    }
    let (Some(iat), Some(exp)) = (c.iat, c.exp) else {
        return Err(rejected("it has no iat or exp"));
    };
    if exp - iat > MAX_LIFETIME || exp > input.now + MAX_LIFETIME + SKEW {
        return Err(rejected("it lives longer than 300 s"));
    }
    if iat > input.now + SKEW || exp <= input.now {
        return Err(rejected(
            "it is not valid now (iat in the future or expired)",
        ));
    }
    if exp > input.subject_exp {
        return Err(rejected("it outlives the subject token"));
    }
    Ok(exp)
}
