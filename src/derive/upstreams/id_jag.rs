//! Identity chaining with the Identity Assertion JWT Authorization Grant
//! (ID-JAG): an upstream with `grant = "id_jag"` is the person's IdP; a
//! derive there has two legs, each with the tool's own relayed proof for
//! that leg's token endpoint (`upstream_proofs`, keyed by upstream name):
//!
//! 1. at the IdP, an RFC 8693 exchange of the subject token for an ID-JAG
//!    (`requested_token_type` id-jag, `audience` = the resource AS's
//!    issuer, `resource`, the granted scopes, leg 1's proof, so that the
//!    IdP binds the ID-JAG to the tool's key: `cnf.jkt`);
//! 2. at the resource's AS (the IdP's `resource_upstream`), the RFC 7523
//!    `jwt-bearer` grant with the ID-JAG as `assertion` and leg 2's proof;
//!    its answer passes every check of [`super::answer`].
//!
//! Both legs' endpoints and both relayed proofs are checked before leg 1
//! is sent. The ID-JAG is checked before leg 2 is sent ([`check_jag`]),
//! and is never returned to the caller: it is dropped (zeroized) once
//! leg 2 has answered. Between the legs the caller's `between` is asked
//! whether the derive is still allowed (a reload or a freeze meanwhile).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Deserialize;
use zeroize::Zeroize;

use super::answer::{self, rejected, Cnf, RawAnswer};
use super::call::{self, Grant, Leg, TokenAnswer, ID_JAG_TYPE};
use super::{
    outcome, ExchangeInput, Exchanged, LegError, Resolved, Upstream, UpstreamError, Upstreams,
    MAX_LIFETIME,
};
use crate::base::jose::{self, Audience};
use crate::base::secret::SecretString;

/// Clock tolerance between the IdP and the broker (seconds).
const SKEW: i64 = 60;

/// The error of `u`'s leg.
fn on(u: &Upstream) -> impl FnOnce(UpstreamError) -> LegError + '_ {
    move |error| LegError {
        upstream: u.cfg.name.clone(),
        error,
    }
}

/// Both legs, `idp` then `ras` (the resource's AS), as the module doc says.
pub(super) async fn chain(
    ups: &Upstreams,
    [idp, ras]: [&Upstream; 2],
    input: &ExchangeInput<'_>,
    between: impl FnOnce() -> bool,
    observe: impl FnOnce(&'static str, Duration),
) -> Result<Exchanged, LegError> {
    let r1 = idp.ready(Leg::IdJag).await.map_err(on(idp))?;
    let r2 = ras.ready(Leg::JwtBearer).await.map_err(on(ras))?;
    // Both proofs present before either is recorded as used: a caller
    // told that leg 2's is missing can send leg 1's again.
    // The same for a proof without its AS's current nonce.
    for (u, r) in [(idp, r1), (ras, r2)] {
        super::present(u, r, input).map_err(on(u))?;
    }
    let p1 = ups.relayed(idp, r1, input).map_err(on(idp))?;
    let p2 = ups.relayed(ras, r2, input).map_err(on(ras))?;
    let started = Instant::now();
    let result = legs([(idp, r1, p1), (ras, r2, p2)], input, between).await;
    observe(
        outcome(&result.as_ref().map(|_| ()).map_err(|e| e.error.clone())),
        started.elapsed(),
    );
    result
}

/// Sends leg 1, checks the ID-JAG, asks `between`, sends leg 2 and checks
/// its answer.
async fn legs(
    [(idp, r1, p1), (ras, r2, p2)]: [(&Upstream, &Resolved, &str); 2],
    input: &ExchangeInput<'_>,
    between: impl FnOnce() -> bool,
) -> Result<Exchanged, LegError> {
    let grant = Grant::Exchange {
        requested: ID_JAG_TYPE,
        audience: Some(&ras.cfg.issuer),
    };
    let answer = call::post(idp, r1, input, &idp.shape(input.resource), p1, grant)
        .await
        .map_err(on(idp))?;
    let jag = check_jag(idp, r1, ras, input, answer)
        .await
        .map_err(on(idp))?;
    if !between() {
        return Err(on(idp)(UpstreamError::Withdrawn));
    }
    let shape = ras.shape(input.resource);
    let grant = Grant::JwtBearer {
        assertion: jag.expose(),
    };
    let sent = call::post(ras, r2, input, &shape, p2, grant).await;
    drop(jag);
    let answer = sent.map_err(on(ras))?;
    answer::check(ras, r2, input, &shape, answer, false)
        .await
        .map_err(on(ras))
}

#[derive(Deserialize)]
struct JagClaims {
    iss: Option<String>,
    sub: Option<String>,
    aud: Option<Audience>,
    client_id: Option<String>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    iat: Option<i64>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    exp: Option<i64>,
    cnf: Option<Cnf>,
    resource: Option<serde_json::Value>,
    scope: Option<serde_json::Value>,
}

/// Leg 1's answer: an ID-JAG (`issued_token_type` id-jag, `token_type`
/// `N_A`: RFC 8693 section 2.2.1, it is not an access token), typed
/// `oauth-id-jag+jwt`, signed by a key of the IdP's JWKS, for the
/// resource AS and the broker's client there, naming the person, bound to
/// the tool's key, short-lived. Gives the ID-JAG.
async fn check_jag(
    idp: &Upstream,
    r1: &Resolved,
    ras: &Upstream,
    input: &ExchangeInput<'_>,
    answer: TokenAnswer,
) -> Result<SecretString, UpstreamError> {
    let mut raw: RawAnswer = serde_json::from_slice(&answer.body)
        .map_err(|_| UpstreamError::BadAnswer("it is not a token answer"))?;
    drop(answer);
    raw.refresh_token.zeroize();
    raw.refresh_token = None;
    let jag = raw
        .access_token
        .take()
        .filter(|t| !t.is_empty())
        .map(SecretString::new)
        .ok_or(UpstreamError::BadAnswer("it has no access_token"))?;
    if raw.issued_token_type.as_deref() != Some(ID_JAG_TYPE) {
        return Err(rejected("issued_token_type is not an ID-JAG"));
    }
    if !raw
        .token_type
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("N_A"))
    {
        return Err(rejected("the ID-JAG's token_type is not N_A"));
    }
    let c: JagClaims =
        answer::verify(idp, r1, jag.expose(), input.now, &["oauth-id-jag+jwt"]).await?;
    jag_claims(idp, ras, input, &c)?;
    Ok(jag)
}

/// The ID-JAG's claims against the derive.
fn jag_claims(
    idp: &Upstream,
    ras: &Upstream,
    input: &ExchangeInput<'_>,
    c: &JagClaims,
) -> Result<(), UpstreamError> {
    if c.iss.as_deref() != Some(idp.cfg.issuer.as_str()) || idp.cfg.issuer != input.subject_iss {
        return Err(rejected("the ID-JAG's iss is not the person's IdP"));
    }
    if c.sub.as_deref() != Some(input.subject_sub) {
        return Err(rejected("the ID-JAG's sub is not the person's"));
    }
    let aud_ok = match &c.aud {
        Some(Audience::One(a)) => a == &ras.cfg.issuer,
        Some(Audience::Many(v)) => v.len() == 1 && v[0] == ras.cfg.issuer,
        None => false,
    };
    if !aud_ok {
        return Err(rejected(
            "the ID-JAG's aud is not exactly the resource AS's issuer",
        ));
    }
    if c.client_id.as_deref() != Some(ras.cfg.client_id.as_str()) {
        return Err(rejected(
            "the ID-JAG is for another client than the broker's at the resource AS",
        ));
    }
    match c.cnf.as_ref().and_then(|c| c.jkt.as_deref()) {
        Some(j) if j == input.jkt => {}
        Some(_) => {
            return Err(rejected(
                "the ID-JAG is bound to another key than the tool's",
            ))
        }
        None => {
            return Err(rejected(
                "the ID-JAG is not bound to the tool's key (no cnf.jkt): a downgrade",
            ))
        }
    }
    let (Some(iat), Some(exp)) = (c.iat, c.exp) else {
        return Err(rejected("the ID-JAG has no iat or exp"));
    };
    if exp - iat > MAX_LIFETIME || exp > input.now + MAX_LIFETIME + SKEW {
        return Err(rejected("the ID-JAG lives longer than 300 s"));
    }
    if iat > input.now + SKEW || exp <= input.now {
        return Err(rejected(
            "the ID-JAG is not valid now (iat in the future or expired)",
        ));
    }
    let resource_ok = match &c.resource {
        None => true,
        Some(serde_json::Value::String(r)) => r == input.resource,
        Some(serde_json::Value::Array(a)) => a.len() == 1 && a[0].as_str() == Some(input.resource),
        Some(_) => false,
    };
    if !resource_ok {
        return Err(rejected("the ID-JAG's resource is not the derive's"));
    }
    let granted: BTreeSet<&str> = input.scopes.iter().map(String::as_str).collect();
    match &c.scope {
        None => {}
        Some(serde_json::Value::String(s))
            if s.split(' ')
                .filter(|x| !x.is_empty())
                .collect::<BTreeSet<_>>()
                == granted => {}
        Some(_) => {
            return Err(rejected(
                "the ID-JAG's scope is not exactly the granted scopes",
            ))
        }
    }
    Ok(())
}
