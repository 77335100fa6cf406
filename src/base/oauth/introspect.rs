//! RFC 7662 token introspection: one POST of a token to an authorization
//! server's introspection endpoint, with the caller's client
//! authentication, and the answer read strictly. It serves the opaque
//! access tokens an upstream AS issues (`derive::upstreams`) and subject
//! tokens (`accounts::subject`); each caller checks the facts it needs.
//!
//! Here: no redirect is followed (the caller's client has none; a 3xx is
//! refused), the answer is read up to [`MAX_ANSWER`], a transport failure,
//! a timeout, a 429 or a 5xx is `Unavailable` (the callers refuse: fail
//! closed), the answer must be JSON with a boolean `active`, and its
//! members have the types RFC 7662 section 2.2 gives them (a malformed one
//! refuses the whole answer). The token and the client's credentials are
//! zeroized once sent, and no error carries them.

use serde::Deserialize;
use zeroize::Zeroize;

use super::sanitize_code;
use crate::base::jose::{self, Audience};

/// The most an introspection answer may hold.
pub(crate) const MAX_ANSWER: usize = 64 * 1024;

/// Why an introspection gave no answer to check. No token or secret in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IntrospectError {
    /// Unreachable, timed out, 429 or 5xx.
    #[error("the introspection endpoint is unavailable")]
    Unavailable,
    /// A 4xx: the server refused this client or request (the sanitised
    /// OAuth error code, or "" without one): the operator's to fix.
    #[error("the introspection endpoint refused this client ({0})")]
    Refused(String),
    /// A redirect, an answer too large, not JSON, or not an RFC 7662 answer.
    #[error("the introspection answer is unusable: {0}")]
    BadAnswer(&'static str),
}

/// The `cnf` member (RFC 7800; RFC 9449 section 6.2 for `jkt`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Cnf {
    /// The DPoP key's thumbprint.
    #[serde(default)]
    pub(crate) jkt: Option<String>,
}

/// An introspection answer (RFC 7662 section 2.2), as far as the callers
/// read it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Introspection {
    /// Whether the token is active: required.
    pub(crate) active: bool,
    #[serde(default)]
    pub(crate) iss: Option<String>,
    #[serde(default)]
    pub(crate) sub: Option<String>,
    #[serde(default)]
    pub(crate) aud: Option<Audience>,
    /// Space-separated scopes.
    #[serde(default)]
    pub(crate) scope: Option<String>,
    #[serde(default)]
    pub(crate) token_type: Option<String>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    pub(crate) exp: Option<i64>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    pub(crate) iat: Option<i64>,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    pub(crate) nbf: Option<i64>,
    #[serde(default)]
    pub(crate) cnf: Option<Cnf>,
    #[serde(default)]
    pub(crate) jti: Option<String>,
    /// Every other member (`auth_time`, `email`, an issuer's own).
    #[serde(flatten)]
    pub(crate) rest: std::collections::HashMap<String, serde_json::Value>,
}

/// One introspection request.
pub(crate) struct Request<'a> {
    /// The endpoint (validated by the config: https, or http on loopback).
    pub(crate) endpoint: &'a str,
    /// The token asked about.
    pub(crate) token: &'a str,
    /// Its `token_type_hint`.
    pub(crate) hint: &'static str,
    /// An `Authorization` value (`client_secret_basic`), if any.
    pub(crate) authorization: Option<String>,
    /// Client credentials that go in the body (`client_secret_post`, or a
    /// `private_key_jwt` assertion): zeroized here once sent.
    pub(crate) form: Vec<(&'static str, String)>,
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        self.authorization.zeroize();
        for (_, v) in self.form.iter_mut() {
            v.zeroize();
        }
    }
}

/// Sends `req` with `http` (the caller's client: its timeouts, no
/// redirects) and reads the answer (module doc).
pub(crate) async fn introspect(
    http: &reqwest::Client,
    req: Request<'_>,
) -> Result<Introspection, IntrospectError> {
    let mut body = form_urlencoded::Serializer::new(String::new())
        .append_pair("token", req.token)
        .append_pair("token_type_hint", req.hint)
        .extend_pairs(req.form.iter())
        .finish();
    let mut r = http
        .post(req.endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("accept", "application/json");
    if let Some(a) = &req.authorization {
        r = r.header("authorization", a.as_str());
    }
    let sent = r.body(body.clone()).send().await;
    body.zeroize();
    drop(req);
    let resp = sent.map_err(|_| IntrospectError::Unavailable)?;
    let status = resp.status().as_u16();
    if (300..400).contains(&status) {
        return Err(IntrospectError::BadAnswer("it redirected (not followed)"));
    }
    if status == 429 || status >= 500 {
        return Err(IntrospectError::Unavailable);
    }
    let json = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    let body = read_capped(resp).await?;
    if !json {
        return Err(IntrospectError::BadAnswer("it is not JSON"));
    }
    parse(status, &body)
}

/// The answer of `status` with `body` (module doc).
pub(crate) fn parse(status: u16, body: &[u8]) -> Result<Introspection, IntrospectError> {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    match status {
        200 => serde_json::from_slice(body)
            .map_err(|_| IntrospectError::BadAnswer("it is not an RFC 7662 answer")),
        400..=499 => Err(IntrospectError::Refused(
            serde_json::from_slice::<ErrorBody>(body)
                .map(|e| sanitize_code(&e.error))
                .unwrap_or_default(),
        )),
        _ => Err(IntrospectError::BadAnswer("its status is not 200")),
    }
}

/// Reads up to [`MAX_ANSWER`] (an announced larger length is refused
/// unread); what was read is zeroized on failure.
async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, IntrospectError> {
    const TOO_LARGE: IntrospectError = IntrospectError::BadAnswer("it is too large");
    if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(TOO_LARGE);
    }
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) if out.len() + c.len() > MAX_ANSWER => {
                out.zeroize();
                return Err(TOO_LARGE);
            }
            Ok(Some(c)) => out.extend_from_slice(&c),
            Ok(None) => return Ok(out),
            Err(_) => {
                out.zeroize();
                return Err(IntrospectError::Unavailable);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_strictly() {
        let ok = parse(
            200,
            br#"{"active":true,"iss":"https://as","aud":["a","b"],"scope":"x y","exp":10,"iat":1.5,"cnf":{"jkt":"k"},"token_type":"DPoP"}"#,
        )
        .unwrap();
        assert!(ok.active);
        assert_eq!(ok.iat, Some(1));
        assert_eq!(ok.cnf.unwrap().jkt.as_deref(), Some("k"));
        assert!(!parse(200, br#"{"active":false}"#).unwrap().active);
        for bad in [
            &br#"{"iss":"https://as"}"#[..],
            br#"{"active":"true"}"#,
            br#"{"active":true,"aud":5}"#,
            br#"{"active":true,"exp":"soon"}"#,
            br#"{"active":true,"scope":["x"]}"#,
            b"[]",
        ] {
            assert!(
                matches!(parse(200, bad), Err(IntrospectError::BadAnswer(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            parse(401, br#"{"error":"invalid_client\n"}"#).unwrap_err(),
            IntrospectError::Refused("invalid_client".into())
        );
        assert_eq!(
            parse(400, b"{}").unwrap_err(),
            IntrospectError::Refused(String::new())
        );
        assert!(matches!(
            parse(204, b""),
            Err(IntrospectError::BadAnswer(_))
        ));
    }
}
