//! An opaque access token from an upstream AS, accepted only through RFC
//! 7662 introspection at that AS (`upstreams.<name>.introspection_endpoint`):
//! the broker asks as its own client (the same authentication as at the
//! token endpoint: `client_secret_basic`, `_post`, or a `private_key_jwt`
//! assertion for the AS's issuer), and the answer must show the facts a
//! JWT must carry. Here: `active` true, `token_type` DPoP where it is
//! reported, `nbf` not in the future; the answer's `iss`, `aud`, `scope`,
//! `cnf.jkt`, `iat`, `exp` and `jti` then go through the very checks of a
//! JWT's claims (`answer::check_claims`). Introspection that cannot be
//! had refuses: unreachable, timed out or a 5xx is 503
//! `upstream_unavailable`; the AS refusing our client is the operator's
//! (503 `upstream_misconfigured`); a redirect, an oversized or malformed
//! answer is 502 `upstream_bad_answer`. Never a fall-back to an unbound
//! or wider token.

use super::answer::{rejected, Claims};
use super::{call, ExchangeInput, Upstream, UpstreamError};
use crate::base::oauth::introspect::{self, IntrospectError, Request};

/// Clock tolerance for `nbf` (seconds), as for a JWT's `iat`.
const SKEW: i64 = 60;

/// Introspects `token` at `endpoint`; gives its facts as a JWT's claims
/// for the common checks, once the introspection-only ones pass.
pub(super) async fn claims(
    u: &Upstream,
    endpoint: &str,
    input: &ExchangeInput<'_>,
    token: &str,
) -> Result<Claims, UpstreamError> {
    let mut form = Vec::new();
    call::credentials(u, input.now, &mut form)?;
    let req = Request {
        endpoint,
        token,
        hint: "access_token",
        authorization: call::basic(u),
        form,
    };
    let a = introspect::introspect(&u.http, req)
        .await
        .map_err(|e| match e {
            IntrospectError::Unavailable => {
                tracing::warn!(upstream = %u.cfg.name, "the upstream's introspection endpoint is unavailable");
                UpstreamError::Unavailable
            }
            IntrospectError::Refused(code) => {
                tracing::error!(upstream = %u.cfg.name, error = %code, "the upstream's introspection endpoint refused this broker's request; check upstreams.{}'s client registration and introspection_endpoint", u.cfg.name);
                UpstreamError::Misconfigured
            }
            IntrospectError::BadAnswer(why) => UpstreamError::BadAnswer(why),
        })?;
    if !a.active {
        return Err(rejected("introspection says it is not active"));
    }
    if a.token_type
        .as_deref()
        .is_some_and(|t| !t.eq_ignore_ascii_case("DPoP"))
    {
        return Err(rejected(
            "introspection reports a token_type that is not DPoP (an unbound token)",
        ));
    }
    if a.nbf.is_some_and(|n| n > input.now + SKEW) {
        return Err(rejected("introspection says it is not valid yet (nbf)"));
    }
    Ok(Claims::introspected(a))
}
