//! Verifying a credbroker token and its DPoP proof at a resource server
//! (RFC 9449 section 7, RFC 9068): the embedder's crate of
//! [credbroker](https://crates.io/crates/credbroker), the credential broker
//! that mints them.
//!
//! A resource server builds one [`Verifier`] for its resource URI (the
//! tokens' `aud`) and hands it each request as a [`Presented`]; the answer
//! is who called ([`Verified`]) or why not ([`VerifyError`], with the
//! `WWW-Authenticate` challenge of its 401).
//!
//! ```
//! use credbroker_verify::{Presented, Verifier, VerifyError};
//! # let jwks = br#"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","kid":"k1",
//! #   "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
//! #   "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
//! // The broker's JWKS, pinned (with the `fetch` feature,
//! // `Verifier::from_issuer` reads it from the issuer's metadata instead).
//! let v = Verifier::from_jwks("https://broker.example", "https://api.example/", jwks)?;
//! let refused = v.verify(&Presented {
//!     method: "GET",
//!     url: "https://api.example/items?page=2",
//!     authorization: Some("Bearer eyJ..."),
//!     dpop: &[],
//! });
//! assert_eq!(refused, Err(VerifyError::WrongScheme));
//! assert_eq!(
//!     VerifyError::WrongScheme.challenge(),
//!     "DPoP error=\"invalid_token\", algs=\"ES256\""
//! );
//! # Ok::<(), VerifyError>(())
//! ```
//!
//! Features:
//! - none (the default): verification only, with pinned keys
//!   ([`Verifier::from_jwks`], [`Verifier::set_jwks`]); no I/O.
//! - `fetch`: `Verifier::from_issuer` reads the issuer's RFC 8414 metadata
//!   and JWKS over HTTPS, and `Verifier::verify_refreshing` picks up a
//!   rotated key.
//! - `client`: `client`, the client of the broker's orchestrator socket.
//!
//! The modules [`jose`], [`dpop`], [`keyset`], [`clock`] and [`secret`] are
//! the building blocks the verifier is made of; the broker uses the same
//! ones, so a token is checked by one piece of code on both sides.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod dpop;
pub mod jose;
pub mod keyset;
pub mod request;
pub mod secret;

// The README's example runs as a doctest, so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;

use crate::jose::{Alg, JwkSet};
#[cfg(feature = "fetch")]
use crate::keyset::Refetch;
use crate::keyset::RemoteKeySet;

// What the verifier's public signatures mention, re-exported at the root so
// that an embedder needs nothing else: the error sources, and the clock to
// inject.
pub use crate::clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use crate::dpop::DpopError;
pub use crate::jose::JoseError;

/// Token size cap.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;
/// A verifier built from issuer metadata refetches the JWKS on an unknown
/// `kid` at most this often (seconds), so that tokens with made-up `kid`s
/// cannot turn it into a request flood against the issuer.
pub const JWKS_REFRESH_INTERVAL: i64 = crate::keyset::MIN_REFETCH_INTERVAL;
/// JWKS and metadata documents larger than this are refused.
pub const MAX_KEYS_DOCUMENT: usize = 64 * 1024;

/// Why a request was refused. Each maps to a 401 with a
/// `WWW-Authenticate: DPoP` challenge ([`VerifyError::challenge`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// No `Authorization` header.
    #[error("no access token")]
    NoToken,
    /// `Authorization: Bearer` (or another scheme) with a DPoP-bound token.
    #[error("a DPoP-bound token must be presented with the DPoP scheme")]
    WrongScheme,
    /// JWS problems.
    #[error("token: {0}")]
    Token(#[from] JoseError),
    /// Not `at+jwt`, not ES256.
    #[error("token header is not acceptable")]
    Header,
    /// No key in the JWKS matches the token's `kid` (the issuer may have
    /// rotated: see `Verifier::verify_refreshing`, feature `fetch`).
    #[error("token signing key is unknown")]
    UnknownKey,
    /// Claims missing or of the wrong type.
    #[error("token claims are missing or malformed")]
    Claims,
    /// Wrong issuer.
    #[error("token issuer is not the expected one")]
    Issuer,
    /// Wrong audience.
    #[error("token audience is not this resource")]
    Audience,
    /// Expired or issued in the future.
    #[error("token is expired or not yet valid")]
    Expired,
    /// The proof failed.
    #[error("DPoP proof: {0}")]
    Proof(#[from] DpopError),
    /// The JWKS or metadata could not be fetched.
    #[error("issuer keys unavailable")]
    Keys,
    /// A single-use token (an `each_call` approval's) presented again.
    #[error("the token is single-use and was already used")]
    AlreadyUsed,
    /// The token is bound to one request (`req_sha256`) and was checked
    /// without it: use [`Verifier::verify_request`].
    #[error("the token is bound to one request; verify it with the request's body")]
    RequestRequired,
    /// The request is not the one the token is bound to.
    #[error("the request is not the one the token is bound to")]
    RequestMismatch,
    /// The request's body cannot be bound (a JSON body that is not I-JSON,
    /// or over [`request::MAX_BOUND_BODY`]), so it is not the bound one.
    #[error("the request cannot be bound: {0}")]
    RequestUnbindable(request::RequestError),
}

impl VerifyError {
    /// The `WWW-Authenticate` value for a 401.
    pub fn challenge(&self) -> String {
        let code = match self {
            VerifyError::NoToken => return "DPoP algs=\"ES256\"".into(),
            VerifyError::Proof(_) => "invalid_dpop_proof",
            _ => "invalid_token",
        };
        format!("DPoP error=\"{code}\", algs=\"ES256\"")
    }
}

#[derive(Debug, Deserialize)]
struct Cnf<'a> {
    #[serde(borrow)]
    jkt: Cow<'a, str>,
}

#[derive(Debug, Deserialize)]
struct Act {
    sub: String,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    step: Option<String>,
}

/// A token's claims. Those only compared (`iss`, `aud`, `cnf.jkt`) are
/// borrowed from the decoded payload (owned only when the JSON escapes a
/// character).
#[derive(Debug, Deserialize)]
struct TokenClaims<'a> {
    #[serde(borrow)]
    iss: Cow<'a, str>,
    sub: String,
    #[serde(default)]
    subject_iss: Option<String>,
    #[serde(borrow)]
    aud: Cow<'a, str>,
    #[serde(default)]
    scope: String,
    act: Act,
    #[serde(borrow)]
    cnf: Cnf<'a>,
    #[serde(deserialize_with = "crate::jose::numeric_date")]
    iat: i64,
    #[serde(deserialize_with = "crate::jose::numeric_date")]
    exp: i64,
    jti: String,
    #[serde(default)]
    authorization_details: Option<serde_json::Value>,
    #[serde(default)]
    approval_id: Option<String>,
    #[serde(default)]
    single_use: bool,
    #[serde(default)]
    req_sha256: Option<String>,
}

/// What a verified request carries. Non-exhaustive: later versions add
/// fields (what the request was approved for), so match it with `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The person's `sub`.
    pub sub: String,
    /// The person's issuer.
    pub subject_iss: Option<String>,
    /// Scopes.
    pub scopes: Vec<String>,
    /// The agent (`act.sub`).
    pub agent: String,
    /// The tool (`act.tool`).
    pub tool: String,
    /// The orchestrator's step the token was derived in (`act.step`), when
    /// the token names one (tokens from before this claim do not).
    pub step: Option<String>,
    /// The bound key.
    pub jkt: String,
    /// Expiry.
    pub exp: i64,
    /// When the token was issued (`iat`).
    pub iat: i64,
    /// `jti`.
    pub jti: String,
    /// The call's RFC 9396 `authorization_details` (section 9.1), as the
    /// broker checked them against its policy and, for a tool that needs
    /// approval, as the person approved them: compare them with what the
    /// request does (docs/RESOURCE-SERVERS.md).
    pub authorization_details: Option<serde_json::Value>,
    /// The approval the token was minted on, if any.
    pub approval_id: Option<String>,
    /// Whether the token is single-use (an `each_call` approval): this
    /// verifier accepted it for this one request and refuses it after.
    pub single_use: bool,
    /// The digest of the one request the token is bound to (`req_sha256`,
    /// [`request`]), if it is bound: [`Verifier::verify_request`] compared
    /// it with the request.
    pub req_sha256: Option<String>,
}

/// An incoming request as the verifier sees it.
#[derive(Debug, Clone, Copy)]
pub struct Presented<'a> {
    /// Method.
    pub method: &'a str,
    /// The full URL the request was sent to (scheme, host, path; the query
    /// is ignored).
    pub url: &'a str,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// Every `DPoP` header value (exactly one is required).
    pub dpop: &'a [&'a str],
}

/// What the verifier does with a token bound to one request.
#[derive(Debug, Clone, Copy)]
enum Binding<'a> {
    /// Refuses it: the caller has no body to check it with.
    Refuse,
    /// Checks it against this `Content-Type` and body.
    Check(&'a str, &'a [u8]),
    /// Leaves it to the caller (the broker's proxy, which checks it later).
    Caller,
}

/// The raw path and query of a URL (`https://h/p/a?b=1#f` gives `/p/a`
/// and `b=1`), never decoded: the bytes the request line carried.
fn raw_path_and_query(url: &str) -> (&str, &str) {
    let url = url.split('#').next().unwrap_or_default();
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    let target = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
    match target.split_once('?') {
        Some((p, q)) => (if p.is_empty() { "/" } else { p }, q),
        None => (if target.is_empty() { "/" } else { target }, ""),
    }
}

/// Verifies credbroker tokens for one resource.
#[derive(Debug)]
pub struct Verifier {
    issuer: String,
    audience: String,
    /// Pinned ([`Verifier::from_jwks`]) or fetched from the issuer's
    /// `jwks_uri` ([`Verifier::from_issuer`]).
    keys: RemoteKeySet,
    proofs: dpop::Validator,
    /// The `jti`s of single-use tokens already accepted, until they expire.
    used: dpop::ReplayCache,
    clock: SharedClock,
}

/// Clock skew tolerated on `exp`/`iat` (seconds).
pub const SKEW: i64 = 5;

impl Verifier {
    /// A verifier with a known JWKS document.
    pub fn from_jwks(issuer: &str, audience: &str, jwks: &[u8]) -> Result<Verifier, VerifyError> {
        let keys = RemoteKeySet::pinned(JwkSet::from_json(jwks).map_err(|_| VerifyError::Keys)?);
        Ok(Verifier::with_keys(issuer, audience, keys))
    }

    fn with_keys(issuer: &str, audience: &str, keys: RemoteKeySet) -> Verifier {
        Verifier {
            issuer: issuer.trim_end_matches('/').to_owned(),
            audience: audience.to_owned(),
            keys,
            proofs: dpop::Validator::new(vec![Alg::ES256], 100_000, None),
            used: dpop::ReplayCache::new(100_000),
            clock: Arc::new(SystemClock),
        }
    }

    /// A verifier that reads the issuer's RFC 8414 metadata and JWKS. It
    /// remembers the `jwks_uri`, so [`Verifier::verify_refreshing`] can pick
    /// up rotated keys. (Feature `fetch`.)
    #[cfg(feature = "fetch")]
    pub async fn from_issuer(issuer: &str, audience: &str) -> Result<Verifier, VerifyError> {
        let issuer = issuer.trim_end_matches('/');
        let http = crate::keyset::http_client();
        let meta = crate::keyset::get_capped(
            &http,
            &format!("{issuer}/.well-known/oauth-authorization-server"),
            MAX_KEYS_DOCUMENT,
        )
        .await
        .map_err(|_| VerifyError::Keys)?;
        let meta: serde_json::Value =
            serde_json::from_slice(&meta).map_err(|_| VerifyError::Keys)?;
        if meta.get("issuer").and_then(|v| v.as_str()) != Some(issuer) {
            return Err(VerifyError::Issuer);
        }
        let jwks_uri = meta
            .get("jwks_uri")
            .and_then(|v| v.as_str())
            .ok_or(VerifyError::Keys)?;
        let keys = RemoteKeySet::remote(jwks_uri, MAX_KEYS_DOCUMENT, http);
        keys.fetch().await.map_err(|_| VerifyError::Keys)?;
        Ok(Verifier::with_keys(issuer, audience, keys))
    }

    /// Refetches the JWKS from the issuer's `jwks_uri`, unless the verifier
    /// has no `jwks_uri` (built with [`Verifier::from_jwks`]) or the last
    /// refetch was less than [`JWKS_REFRESH_INTERVAL`] ago. Returns whether
    /// new keys were loaded. (Feature `fetch`.)
    #[cfg(feature = "fetch")]
    pub async fn refresh_keys(&self) -> Result<bool, VerifyError> {
        match self.keys.refetch(self.clock.now()).await {
            Ok(Refetch::Fetched(_)) => Ok(true),
            Ok(Refetch::Throttled(_) | Refetch::Pinned) => Ok(false),
            Err(_) => Err(VerifyError::Keys),
        }
    }

    /// [`Verifier::verify`], and when the token names a key the verifier does
    /// not know, one [`Verifier::refresh_keys`] and a second try. The first
    /// try stops before the proof is looked at, so the retry does not see
    /// its own `jti` as a replay. (Feature `fetch`.)
    #[cfg(feature = "fetch")]
    pub async fn verify_refreshing(&self, req: &Presented<'_>) -> Result<Verified, VerifyError> {
        match self.verify(req) {
            Err(VerifyError::UnknownKey) if self.refresh_keys().await? => self.verify(req),
            other => other,
        }
    }

    /// Replaces the clock (tests).
    pub fn with_clock(mut self, clock: SharedClock) -> Verifier {
        self.clock = clock;
        self
    }

    /// Replaces the keys (after refetching a rotated JWKS).
    pub fn set_jwks(&self, jwks: &[u8]) -> Result<(), VerifyError> {
        self.keys
            .set(JwkSet::from_json(jwks).map_err(|_| VerifyError::Keys)?);
        Ok(())
    }

    /// Verifies a request: the token (signature, `typ`, `iss`, `aud`, `exp`)
    /// then the proof (`ath`, `cnf.jkt`, `htm`, `htu`, `iat`, replay), then,
    /// for a single-use token, that its `jti` was not accepted before (it is
    /// recorded only once everything else passed, so a bad proof does not
    /// use the token up).
    ///
    /// A token bound to one request (`req_sha256`) is refused here with
    /// [`VerifyError::RequestRequired`]: check it with
    /// [`Verifier::verify_request`].
    pub fn verify(&self, req: &Presented<'_>) -> Result<Verified, VerifyError> {
        self.verify_inner(req, true, false, Binding::Refuse)
            .map(|(v, _)| v)
    }

    /// [`Verifier::verify`] for a request whose body is at hand: a token
    /// bound to one request (`req_sha256`) must be bound to this one, its
    /// digest ([`request`]) made of `req.method`, the raw path and query
    /// of `req.url`, `content_type` (the `Content-Type` as received, empty
    /// without one) and `body` (as received; a JSON body is canonicalised
    /// for the digest). Checked after the proof, before a single-use token
    /// is recorded. A token bound to no request passes as with `verify`.
    pub fn verify_request(
        &self,
        req: &Presented<'_>,
        content_type: &str,
        body: &[u8],
    ) -> Result<Verified, VerifyError> {
        self.verify_inner(req, true, false, Binding::Check(content_type, body))
            .map(|(v, _)| v)
    }

    /// [`Verifier::verify`] without recording a single-use token's `jti`
    /// here: for a caller that records it itself, as the broker's own proxy
    /// does in its shared store (so that no two replicas accept it) once the
    /// call passed its policy checks too. A caller that does not record
    /// single-use tokens must use [`Verifier::verify`].
    ///
    /// `url_is_normal` says the caller built `req.url` in the form
    /// [`dpop::normalize_htu`] gives (the proxy's configured issuer, checked
    /// once, and a raw path that passed its path rules, which parsing leaves
    /// as it is): the URL is then compared with `htu` without being parsed
    /// again. A URL passed as normal that is not is compared byte for byte,
    /// so it can make a good proof fail but never let a proof for another
    /// URL pass; debug builds assert it.
    ///
    /// Gives the proof too (its `jti` and `nonce`), for the proxy's own
    /// replay and nonce checks, so that it need not decode the proof again.
    pub fn verify_unrecorded(
        &self,
        req: &Presented<'_>,
        url_is_normal: bool,
    ) -> Result<(Verified, dpop::ValidProof), VerifyError> {
        self.verify_inner(req, false, url_is_normal, Binding::Caller)
    }

    fn verify_inner(
        &self,
        req: &Presented<'_>,
        record: bool,
        url_is_normal: bool,
        binding: Binding<'_>,
    ) -> Result<(Verified, dpop::ValidProof), VerifyError> {
        let auth = req.authorization.ok_or(VerifyError::NoToken)?;
        let (scheme, token) = auth.split_once(' ').ok_or(VerifyError::WrongScheme)?;
        if !scheme.eq_ignore_ascii_case("DPoP") {
            return Err(VerifyError::WrongScheme);
        }
        let token = token.trim();
        let now = self.clock.now();
        let jws = crate::jose::parse(token, MAX_TOKEN_LEN)?;
        crate::jose::check_header(
            &jws.header,
            &crate::jose::HeaderRule {
                typ: crate::jose::TypRule::IgnoreCase("at+jwt"),
                algs: &[Alg::ES256],
            },
        )
        .map_err(|_| VerifyError::Header)?;
        let keys = self.keys.keys();
        let key = keys
            .select(jws.header.kid.as_deref(), Alg::ES256)
            .ok_or(VerifyError::UnknownKey)?;
        key.verify(Alg::ES256, &jws)?;
        let c: TokenClaims =
            serde_json::from_slice(&jws.payload).map_err(|_| VerifyError::Claims)?;
        if *c.iss != *self.issuer {
            return Err(VerifyError::Issuer);
        }
        if *c.aud != *self.audience {
            return Err(VerifyError::Audience);
        }
        if c.exp <= now - SKEW || c.iat > now + SKEW {
            return Err(VerifyError::Expired);
        }
        let [proof] = req.dpop else {
            return Err(VerifyError::Proof(DpopError::Missing));
        };
        let normalized;
        let htu = if url_is_normal {
            debug_assert_eq!(dpop::normalize_htu(req.url).as_deref(), Some(req.url));
            req.url
        } else {
            normalized = dpop::normalize_htu(req.url).ok_or(VerifyError::Proof(DpopError::Htu))?;
            normalized.as_str()
        };
        let valid = self.proofs.validate(
            proof,
            &dpop::Expect {
                method: req.method,
                htu,
                access_token: Some(token),
                jkt: Some(&c.cnf.jkt),
                now,
            },
        )?;
        if let Some(bound) = c.req_sha256.as_deref() {
            match binding {
                Binding::Caller => {}
                Binding::Refuse => return Err(VerifyError::RequestRequired),
                Binding::Check(content_type, body) => {
                    let (path, query) = raw_path_and_query(req.url);
                    let r = request::BoundRequest {
                        method: req.method,
                        path,
                        query,
                        content_type,
                        body,
                    };
                    let got = request::bind(&r).map_err(VerifyError::RequestUnbindable)?;
                    let same: bool =
                        subtle::ConstantTimeEq::ct_eq(got.sha256.as_bytes(), bound.as_bytes())
                            .into();
                    if !same {
                        return Err(VerifyError::RequestMismatch);
                    }
                }
            }
        }
        if c.single_use && record {
            // Keyed by the token's `jti` alone (the token is bound to one
            // key already), in the replay cache's compact form.
            let k = self.used.key("", &c.jti);
            self.used
                .insert(k, c.exp + SKEW, now)
                .map_err(|e| match e {
                    DpopError::Replay => VerifyError::AlreadyUsed,
                    // Fail closed: no room to remember it, so not accepted.
                    other => VerifyError::Proof(other),
                })?;
        }
        let verified = Verified {
            sub: c.sub,
            subject_iss: c.subject_iss,
            scopes: c
                .scope
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            agent: c.act.sub,
            tool: c.act.tool.unwrap_or_default(),
            step: c.act.step,
            jkt: valid.jkt.clone(),
            exp: c.exp,
            iat: c.iat,
            jti: c.jti,
            authorization_details: c.authorization_details,
            approval_id: c.approval_id,
            single_use: c.single_use,
            req_sha256: c.req_sha256,
        };
        Ok((verified, valid))
    }
}
