//! One OAuth 2.0 client, used by the pages' OpenID Connect sign-in
//! (`pages::oidc`) and by the connection to third-party providers
//! (`upstream`): discovery, PKCE (S256), bounded answers, the
//! authorization URL, the code exchange and the RFC 9207 `iss` check.
//!
//! The two uses differ in what completes a flow, and each names its rules
//! with [`Use`]: a sign-in sends a `nonce` and its code answer must carry an
//! ID token (whose `nonce` the caller then checks, with the signature, in
//! `pages::oidc`); a provider's code answer carries an access token and no
//! ID token is looked at. Neither completes on the other's rules.
//!
//! Every answer is read in chunks up to a cap and zeroized when refused;
//! errors carry no token: their texts are fixed words and the provider's
//! sanitised OAuth error code.

use base64::Engine;
use serde::Deserialize;
use zeroize::Zeroize;

use crate::base::grammar::secure_or_loopback;
use crate::base::secret::SecretString;

/// The most an OAuth answer (metadata, token answer) may hold.
pub(crate) const MAX_ANSWER: usize = 256 * 1024;

/// OAuth call failures. No token, code or secret is ever in them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    /// The server answered with an OAuth error (RFC 6749 section 5.2).
    #[error("the provider refused the request ({error})")]
    Rejected {
        /// The OAuth `error` code (sanitised, at most 64 characters).
        error: String,
    },
    /// The server could not be reached or gave no usable answer.
    #[error("the provider is unavailable: {0}")]
    Unavailable(String),
    /// The server is misconfigured here (secret file, discovery answer).
    #[error("provider configuration: {0}")]
    Config(String),
}

impl OAuthError {
    /// Whether the server said the grant is no longer valid.
    pub fn is_invalid_grant(&self) -> bool {
        matches!(self, OAuthError::Rejected { error } if error == "invalid_grant")
    }
}

/// Which flow a client call belongs to, and so which rules complete it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Use<'a> {
    /// OpenID Connect sign-in: the authorization URL carries this `nonce`
    /// and the code answer must carry an ID token.
    SignIn {
        /// The `nonce` sent, which the ID token must repeat.
        nonce: &'a str,
    },
    /// A provider connection: no `nonce`; the code answer must carry an
    /// access token and its type.
    Provider,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// `n` random bytes, base64url: a `state` or a PKCE verifier.
pub(crate) fn random_secret(n: usize) -> Result<SecretString, OAuthError> {
    let mut b = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| OAuthError::Config("no randomness".into()))?;
    let s = b64().encode(&b);
    b.zeroize();
    Ok(SecretString::new(s))
}

/// The S256 challenge of a PKCE verifier (RFC 7636 section 4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    b64().encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        verifier.as_bytes(),
    ))
}

/// The RFC 9207 check of an authorization response's `iss` (the mix-up
/// defence), the one rule both flows run: when present it must be
/// `expected` exactly (and a server without a configured issuer cannot be
/// named at all); when absent, it is refused if the server says it always
/// sends one (`sends_iss`, from its metadata).
pub fn check_callback_iss(
    expected: Option<&str>,
    sends_iss: bool,
    got: Option<&str>,
) -> Result<(), OAuthError> {
    let ok = match (got, expected) {
        (Some(got), Some(want)) => got == want,
        (Some(_), None) => false,
        (None, _) => !sends_iss,
    };
    if ok {
        Ok(())
    } else {
        Err(OAuthError::Rejected {
            error: "iss_mismatch".into(),
        })
    }
}

/// The `Authorization` value of `client_secret_basic` (RFC 6749 section
/// 2.3.1): client id and secret each form-encoded, joined by `:`, base64;
/// the joined text is zeroized.
pub(crate) fn basic_authorization(id: &str, secret: &str) -> String {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let mut raw = format!("{}:{}", enc(id), enc(secret));
    let out = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&raw)
    );
    raw.zeroize();
    out
}

/// What goes into an authorization URL besides the endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AuthorizationParams<'a> {
    /// Our client id.
    pub client_id: &'a str,
    /// The registered redirect URI.
    pub redirect_uri: &'a str,
    /// The space-separated scopes; none when empty.
    pub scope: &'a str,
    /// The single-use `state`.
    pub state: &'a str,
    /// The PKCE S256 challenge.
    pub code_challenge: &'a str,
    /// Further parameters (`max_age`, `prompt`, `login_hint`).
    pub extra: &'a [(&'a str, &'a str)],
}

/// The authorization URL (RFC 6749 section 4.1.1 with RFC 7636 PKCE S256;
/// with a `nonce` for a sign-in).
pub(crate) fn authorization_url(
    endpoint: &str,
    how: Use<'_>,
    p: &AuthorizationParams<'_>,
) -> Result<url::Url, OAuthError> {
    let mut url = url::Url::parse(endpoint)
        .map_err(|_| OAuthError::Config("the authorization endpoint is not a URL".into()))?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", p.client_id)
            .append_pair("redirect_uri", p.redirect_uri);
        if !p.scope.is_empty() {
            q.append_pair("scope", p.scope);
        }
        q.append_pair("state", p.state);
        if let Use::SignIn { nonce } = how {
            q.append_pair("nonce", nonce);
        }
        q.append_pair("code_challenge", p.code_challenge)
            .append_pair("code_challenge_method", "S256");
        for (k, v) in p.extra {
            q.append_pair(k, v);
        }
    }
    Ok(url)
}

/// An authorization server's endpoints, from its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metadata {
    /// `issuer`, identical to the one asked for.
    pub issuer: String,
    /// `authorization_endpoint`.
    pub authorization: String,
    /// `token_endpoint`.
    pub token: String,
    /// `revocation_endpoint` (RFC 7009).
    pub revocation: Option<String>,
    /// `userinfo_endpoint`.
    pub userinfo: Option<String>,
    /// `jwks_uri`.
    pub jwks_uri: Option<String>,
    /// `authorization_response_iss_parameter_supported` (RFC 9207).
    pub sends_iss: bool,
}

/// Where to look for an issuer's metadata: for a provider, RFC 8414 section
/// 3.1 first (the well-known segment goes between the host and the
/// issuer's path), then OpenID Connect discovery (appended); a sign-in
/// source is an OpenID Provider, so only the latter.
pub(crate) fn discovery_urls(issuer: &str, how: Use<'_>) -> Result<Vec<String>, OAuthError> {
    let u = url::Url::parse(issuer)
        .map_err(|_| OAuthError::Config("the issuer is not a URL".into()))?;
    let oidc = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    Ok(match how {
        Use::SignIn { .. } => vec![oidc],
        Use::Provider => {
            let path = u.path().trim_end_matches('/');
            let origin = u.origin().ascii_serialization();
            vec![
                format!("{origin}/.well-known/oauth-authorization-server{path}"),
                oidc,
            ]
        }
    })
}

/// Parses a metadata document: its `issuer` must be `issuer` exactly (RFC
/// 8414 section 3.3, OIDC Discovery section 4.3) and every endpoint https
/// (http on loopback) without a fragment (RFC 6749 section 3.1).
pub(crate) fn parse_metadata(issuer: &str, body: &[u8]) -> Result<Metadata, OAuthError> {
    #[derive(Deserialize)]
    struct Meta {
        issuer: String,
        authorization_endpoint: String,
        token_endpoint: String,
        #[serde(default)]
        revocation_endpoint: Option<String>,
        #[serde(default)]
        userinfo_endpoint: Option<String>,
        #[serde(default)]
        jwks_uri: Option<String>,
        #[serde(default)]
        authorization_response_iss_parameter_supported: bool,
    }
    let m: Meta = serde_json::from_slice(body)
        .map_err(|_| OAuthError::Unavailable("the discovery document is malformed".into()))?;
    if m.issuer != issuer {
        return Err(OAuthError::Config(
            "the discovery document names another issuer".into(),
        ));
    }
    let ok = |u: &str| {
        url::Url::parse(u).is_ok_and(|u| secure_or_loopback(&u) && u.fragment().is_none())
    };
    for u in [
        Some(&m.authorization_endpoint),
        Some(&m.token_endpoint),
        m.revocation_endpoint.as_ref(),
        m.userinfo_endpoint.as_ref(),
        m.jwks_uri.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        if !ok(u) {
            return Err(OAuthError::Config(
                "the discovery document has an endpoint that is not https".into(),
            ));
        }
    }
    Ok(Metadata {
        issuer: m.issuer,
        authorization: m.authorization_endpoint,
        token: m.token_endpoint,
        revocation: m.revocation_endpoint,
        userinfo: m.userinfo_endpoint,
        jwks_uri: m.jwks_uri,
        sends_iss: m.authorization_response_iss_parameter_supported,
    })
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ClientAuth<'a> {
    /// `client_secret_basic`: both parts form-encoded first (RFC 6749
    /// section 2.3.1).
    Basic {
        /// Client id.
        id: &'a str,
        /// Client secret.
        secret: &'a str,
    },
    /// `client_secret_post`, or a public client when `secret` is `None`.
    Post {
        /// Client id.
        id: &'a str,
        /// Client secret, if any.
        secret: Option<&'a str>,
    },
}

/// Tokens from a token endpoint.
#[derive(Debug)]
pub struct TokenSet {
    /// The access token.
    pub access_token: SecretString,
    /// `token_type` as the server said it (`bearer`, `Bearer`, ...).
    pub token_type: String,
    /// Lifetime in seconds, when the server said.
    pub expires_in: Option<i64>,
    /// A refresh token (a new one when the server rotates them).
    pub refresh_token: Option<SecretString>,
    /// The granted scopes, when the server said.
    pub scope: Option<Vec<String>>,
}

/// What completes a code exchange, by [`Use`].
#[derive(Debug)]
pub(crate) enum CodeAnswer {
    /// A sign-in's ID token, not yet validated: the caller checks its
    /// signature, claims and `nonce`.
    IdToken(SecretString),
    /// A provider's tokens.
    Tokens(TokenSet),
}

/// An OAuth client: one HTTP client (whose timeouts and redirect policy
/// the user chose) and the answer cap.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
}

impl Client {
    /// A client over `http`, which should follow no redirect.
    pub(crate) fn new(http: reqwest::Client) -> Client {
        Client { http }
    }

    /// The HTTP client (for the calls that are not OAuth's: userinfo,
    /// account look-ups).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Reads the issuer's metadata at the first of `discovery_urls` that
    /// answers with a success.
    pub(crate) async fn discover(
        &self,
        issuer: &str,
        how: Use<'_>,
    ) -> Result<Metadata, OAuthError> {
        let mut last = OAuthError::Unavailable("discovery found no metadata".into());
        for url in discovery_urls(issuer, how)? {
            let resp = match self
                .http
                .get(&url)
                .header("accept", "application/json")
                .send()
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    last = unavailable(&e);
                    continue;
                }
            };
            if !resp.status().is_success() {
                last = OAuthError::Unavailable(format!(
                    "discovery answered HTTP {}",
                    resp.status().as_u16()
                ));
                continue;
            }
            let body = read_capped(resp).await?;
            return parse_metadata(issuer, &body);
        }
        Err(last)
    }

    /// POSTs a form to `url` with the client's authentication; returns the
    /// status and the (capped) answer. The form and body are zeroized after
    /// sending: they hold codes, verifiers, secrets and refresh tokens.
    pub(crate) async fn post_form(
        &self,
        url: &str,
        form: Vec<(&'static str, String)>,
        auth: ClientAuth<'_>,
    ) -> Result<(u16, Vec<u8>), OAuthError> {
        self.post_form_with(url, form, auth, &[]).await
    }

    /// [`Self::post_form`] with `extra` headers (the caller's trace
    /// context, where it is to be sent).
    pub(crate) async fn post_form_with(
        &self,
        url: &str,
        mut form: Vec<(&'static str, String)>,
        auth: ClientAuth<'_>,
        extra: &[(&'static str, String)],
    ) -> Result<(u16, Vec<u8>), OAuthError> {
        let mut basic = None;
        match auth {
            ClientAuth::Basic { id, secret } => basic = Some(basic_authorization(id, secret)),
            ClientAuth::Post { id, secret } => {
                form.push(("client_id", id.to_owned()));
                if let Some(s) = secret {
                    form.push(("client_secret", s.to_owned()));
                }
            }
        }
        let mut body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter())
            .finish();
        for (_, v) in form.iter_mut() {
            v.zeroize();
        }
        let mut req = self
            .http
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json");
        if let Some(b) = &basic {
            req = req.header("authorization", b);
        }
        for (k, v) in extra {
            req = req.header(*k, v.as_str());
        }
        let sent = req.body(body.clone()).send().await;
        body.zeroize();
        if let Some(mut b) = basic {
            b.zeroize();
        }
        let resp = sent.map_err(|e| unavailable(&e))?;
        let status = resp.status().as_u16();
        Ok((status, read_capped(resp).await?))
    }

    /// Exchanges an authorization code (with its PKCE verifier) at
    /// `token_endpoint`, and reads the answer by the rules of `how`.
    pub(crate) async fn exchange_code(
        &self,
        token_endpoint: &str,
        auth: ClientAuth<'_>,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
        how: Use<'_>,
    ) -> Result<CodeAnswer, OAuthError> {
        let form = vec![
            ("grant_type", "authorization_code".into()),
            ("code", code.into()),
            ("redirect_uri", redirect_uri.into()),
            ("code_verifier", verifier.into()),
        ];
        let (status, mut body) = self.post_form(token_endpoint, form, auth).await?;
        let parsed = parse_code_answer(status, &body, how);
        body.zeroize();
        parsed
    }
}

/// An OAuth error code fit for a log: `[A-Za-z0-9_.-]`, at most 64.
pub(crate) fn sanitize_code(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-' || *c == '.')
        .take(64)
        .collect()
}

/// A transport failure in fixed words.
pub(crate) fn unavailable(e: &reqwest::Error) -> OAuthError {
    // reqwest's own text names the URL, which holds no secret here (tokens
    // travel in bodies and headers), but keep the words fixed anyway.
    let what = if e.is_timeout() {
        "it did not answer in time"
    } else if e.is_connect() {
        "the connection failed (refused, unreachable or TLS)"
    } else if e.is_body() || e.is_decode() {
        "its answer could not be read"
    } else {
        "the request failed"
    };
    OAuthError::Unavailable(what.into())
}

/// Reads an answer in chunks, refusing (and zeroizing what was read) once
/// it passes [`MAX_ANSWER`].
pub(crate) async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, OAuthError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| unavailable(&e))? {
        if out.len() + chunk.len() > MAX_ANSWER {
            out.zeroize();
            return Err(OAuthError::Unavailable("its answer is too large".into()));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[derive(Deserialize)]
struct RawToken {
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
    #[serde(default)]
    refresh_token: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    id_token: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

impl Drop for RawToken {
    fn drop(&mut self) {
        self.access_token.zeroize();
        self.refresh_token.zeroize();
        self.id_token.zeroize();
    }
}

/// Reads a code answer by the rules of `how`: a sign-in needs an
/// `id_token`, a provider connection an access token.
pub(crate) fn parse_code_answer(
    status: u16,
    body: &[u8],
    how: Use<'_>,
) -> Result<CodeAnswer, OAuthError> {
    match how {
        Use::Provider => parse_token_answer(status, body).map(CodeAnswer::Tokens),
        Use::SignIn { .. } => {
            if !(200..=299).contains(&status) {
                return Err(match serde_json::from_slice::<RawToken>(body) {
                    Ok(RawToken {
                        error: Some(ref e), ..
                    }) if (400..500).contains(&status) => OAuthError::Rejected {
                        error: sanitize_code(e),
                    },
                    _ => OAuthError::Unavailable(format!("it answered HTTP {status}")),
                });
            }
            let mut raw: RawToken = serde_json::from_slice(body)
                .map_err(|_| OAuthError::Unavailable("its answer is not JSON".into()))?;
            raw.id_token
                .take()
                .filter(|t| !t.is_empty())
                .map(|t| CodeAnswer::IdToken(SecretString::new(t)))
                .ok_or_else(|| OAuthError::Unavailable("its answer has no id_token".into()))
        }
    }
}

/// Interprets a token endpoint answer (code or refresh). GitHub answers
/// errors with 200 and an `error` field, so `error` is looked at whatever
/// the status.
pub(crate) fn parse_token_answer(status: u16, body: &[u8]) -> Result<TokenSet, OAuthError> {
    let raw: Result<RawToken, _> = serde_json::from_slice(body);
    match (status, raw) {
        (
            _,
            Ok(RawToken {
                error: Some(ref e), ..
            }),
        ) if (200..500).contains(&status) => Err(OAuthError::Rejected {
            error: sanitize_code(e),
        }),
        (200..=299, Ok(mut t)) => {
            let access = t
                .access_token
                .take()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| OAuthError::Unavailable("its answer has no access_token".into()))?;
            let token_type = t
                .token_type
                .take()
                .filter(|s| {
                    !s.is_empty()
                        && s.len() <= 32
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
                .ok_or_else(|| {
                    OAuthError::Unavailable("its answer has no usable token_type".into())
                })?;
            let expires_in = match &t.expires_in {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::Number(n)) => {
                    n.as_i64().filter(|n| *n >= 0).map(Some).ok_or_else(|| {
                        OAuthError::Unavailable("its expires_in is not a positive integer".into())
                    })?
                }
                // As a string too: "-1" parses as an i64, and is no lifetime.
                Some(serde_json::Value::String(s)) => {
                    Some(s.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                        OAuthError::Unavailable("its expires_in is not a positive integer".into())
                    })?)
                }
                Some(_) => {
                    return Err(OAuthError::Unavailable(
                        "its expires_in is not a number".into(),
                    ))
                }
            };
            Ok(TokenSet {
                access_token: SecretString::new(access),
                token_type,
                expires_in,
                refresh_token: t
                    .refresh_token
                    .take()
                    .filter(|r| !r.is_empty())
                    .map(SecretString::new),
                scope: t.scope.take().map(|s| {
                    s.split([' ', ','])
                        .filter(|x| !x.is_empty())
                        .map(str::to_owned)
                        .collect()
                }),
            })
        }
        (200..=299, Err(_)) => Err(OAuthError::Unavailable("its answer is not JSON".into())),
        (400..=499, _) => Err(OAuthError::Rejected {
            error: format!("http_{status}"),
        }),
        (s, _) => Err(OAuthError::Unavailable(format!("it answered HTTP {s}"))),
    }
}

pub(crate) mod introspect;

#[cfg(test)]
mod tests;
