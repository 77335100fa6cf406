//! The OAuth 2.0 client side towards third-party providers (GitHub, any
//! OpenID Connect provider): authorization URLs with PKCE (S256) and
//! `state`, code exchange, refresh, RFC 7009 revocation, the account's name,
//! and RFC 8414 / OpenID Connect discovery.
//!
//! Every call is bounded by the provider's `timeout` (connect, send and the
//! whole answer), follows no redirect, and reads at most 256 KiB. Failures
//! come in two kinds that callers treat differently: the provider *refused*
//! ([`UpstreamError::Rejected`], e.g. `invalid_grant`: the grant is gone) or
//! could not be *reached or understood* ([`UpstreamError::Unavailable`]:
//! timeout, connection or TLS failure, 5xx, malformed JSON). Neither carries
//! a token: error texts are built here from fixed words and the provider's
//! OAuth error code.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use base64::Engine;
use serde::Deserialize;
use zeroize::Zeroize;

use crate::config::{
    secure_or_loopback, AccountLookup, ClientAuth, Config, Endpoints, ProviderConfig,
};
use crate::secret::SecretString;

/// The most a provider answer may hold.
const MAX_ANSWER: usize = 256 * 1024;

/// Tokens from a provider's token endpoint.
#[derive(Debug)]
pub struct TokenSet {
    /// The access token.
    pub access_token: SecretString,
    /// `token_type` as the provider said it (`bearer`, `Bearer`, ...).
    pub token_type: String,
    /// Lifetime in seconds, when the provider said.
    pub expires_in: Option<i64>,
    /// A refresh token (a new one when the provider rotates them).
    pub refresh_token: Option<SecretString>,
    /// The granted scopes, when the provider said.
    pub scope: Option<Vec<String>>,
}

/// The person's account at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountInfo {
    /// The provider's stable id for the account.
    pub id: String,
    /// The name people know it by (login, e-mail).
    pub name: String,
}

/// Provider call failures. No token, code or secret is ever in them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The provider answered with an OAuth error (RFC 6749 section 5.2).
    #[error("the provider refused the request ({error})")]
    Rejected {
        /// The OAuth `error` code (sanitised, at most 64 characters).
        error: String,
    },
    /// The provider could not be reached or gave no usable answer.
    #[error("the provider is unavailable: {0}")]
    Unavailable(String),
    /// The provider is misconfigured here (secret file, discovery answer).
    #[error("provider configuration: {0}")]
    Config(String),
}

impl UpstreamError {
    /// Whether the provider said the grant is no longer valid.
    pub fn is_invalid_grant(&self) -> bool {
        matches!(self, UpstreamError::Rejected { error } if error == "invalid_grant")
    }
}

/// What a revocation achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    /// The provider accepted it (RFC 7009: also for unknown tokens).
    Revoked,
    /// The provider has no revocation endpoint.
    NotSupported,
}

/// A started authorization: the URL to send the browser to, and what the
/// callback must check and use. The caller keeps `state` and `verifier`
/// server-side, bound to the browser session and the link.
#[derive(Debug)]
pub struct AuthorizationRequest {
    /// The authorization URL.
    pub url: String,
    /// The single-use `state` value.
    pub state: SecretString,
    /// The PKCE code verifier (RFC 7636).
    pub verifier: SecretString,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

fn random_b64(n: usize) -> Result<SecretString, UpstreamError> {
    let mut b = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| UpstreamError::Config("no randomness".into()))?;
    let s = b64().encode(&b);
    b.zeroize();
    Ok(SecretString::new(s))
}

/// The S256 challenge of a PKCE verifier.
pub fn pkce_challenge(verifier: &str) -> String {
    b64().encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        verifier.as_bytes(),
    ))
}

fn sanitize_code(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-' || *c == '.')
        .take(64)
        .collect()
}

fn unavailable(e: &reqwest::Error) -> UpstreamError {
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
    UpstreamError::Unavailable(what.into())
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
    error: Option<String>,
}

impl Drop for RawToken {
    fn drop(&mut self) {
        self.access_token.zeroize();
        self.refresh_token.zeroize();
    }
}

#[derive(Deserialize)]
struct RawError {
    error: String,
}

/// One configured provider.
pub struct Provider {
    cfg: ProviderConfig,
    secret: Option<SecretString>,
    http: reqwest::Client,
    discovered: ArcSwapOption<Endpoints>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.cfg.name)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// A provider from its config; reads the client secret file (0600).
    pub fn new(cfg: ProviderConfig) -> Result<Provider, UpstreamError> {
        let secret = match &cfg.client_secret_file {
            None => None,
            Some(p) => {
                let bytes = crate::config::read_secret_file(p).map_err(|e| {
                    UpstreamError::Config(format!("providers.{}.client_secret_file: {e}", cfg.name))
                })?;
                let s = std::str::from_utf8(bytes.expose())
                    .map_err(|_| {
                        UpstreamError::Config(format!(
                            "providers.{}.client_secret_file is not UTF-8",
                            cfg.name
                        ))
                    })?
                    .trim_end_matches(['\r', '\n'])
                    .to_string();
                if s.is_empty() {
                    return Err(UpstreamError::Config(format!(
                        "providers.{}.client_secret_file is empty",
                        cfg.name
                    )));
                }
                Some(SecretString::new(s))
            }
        };
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("credbroker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|_| UpstreamError::Config("the HTTP client could not be built".into()))?;
        Ok(Provider {
            cfg,
            secret,
            http,
            discovered: ArcSwapOption::empty(),
        })
    }

    /// The provider's config.
    pub fn config(&self) -> &ProviderConfig {
        &self.cfg
    }

    /// The provider's name (the policy's `service`).
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The name people know it by.
    pub fn display_name(&self) -> &str {
        &self.cfg.display_name
    }

    /// What identifies the provider in account records: its issuer, or its
    /// token endpoint when it has none.
    pub fn id(&self) -> String {
        match (&self.cfg.issuer, &self.cfg.endpoints) {
            (Some(i), _) => i.clone(),
            (None, Some(e)) => e.token.clone(),
            (None, None) => self.cfg.name.clone(),
        }
    }

    /// The provider's endpoints: from the config, or discovered once from
    /// its issuer (RFC 8414, then OpenID Connect discovery). A failed
    /// discovery is retried on the next call.
    pub async fn endpoints(&self) -> Result<Arc<Endpoints>, UpstreamError> {
        if let Some(e) = &self.cfg.endpoints {
            return Ok(Arc::new(e.clone()));
        }
        if let Some(e) = self.discovered.load_full() {
            return Ok(e);
        }
        let issuer = self
            .cfg
            .issuer
            .as_deref()
            .ok_or_else(|| UpstreamError::Config("no endpoints and no issuer".into()))?;
        let e = Arc::new(self.discover(issuer).await?);
        self.discovered.store(Some(e.clone()));
        Ok(e)
    }

    async fn discover(&self, issuer: &str) -> Result<Endpoints, UpstreamError> {
        let mut last = UpstreamError::Unavailable("discovery found no metadata".into());
        for url in discovery_urls(issuer)? {
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
                last = UpstreamError::Unavailable(format!(
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

    /// The endpoints if known without a network call (configured, or
    /// already discovered).
    pub fn cached_endpoints(&self) -> Option<Arc<Endpoints>> {
        match &self.cfg.endpoints {
            Some(e) => Some(Arc::new(e.clone())),
            None => self.discovered.load_full(),
        }
    }

    /// The authorization URL for a `state` and PKCE S256 `code_challenge`
    /// made by the caller (the pages keep both, bound to the session), with
    /// the provider's default scopes added to `scopes`. Needs the endpoints
    /// known ([`Provider::cached_endpoints`]).
    pub fn authorization_url(
        &self,
        state: &str,
        code_challenge: &str,
        scopes: &[String],
        extra: &[(&str, &str)],
    ) -> Result<url::Url, UpstreamError> {
        let ep = self.cached_endpoints().ok_or_else(|| {
            UpstreamError::Unavailable("the provider's endpoints are not discovered yet".into())
        })?;
        let mut all: Vec<String> = self.cfg.scopes.clone();
        for s in scopes {
            if !all.contains(s) {
                all.push(s.clone());
            }
        }
        let mut url = url::Url::parse(&ep.authorization)
            .map_err(|_| UpstreamError::Config("the authorization endpoint is not a URL".into()))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &self.cfg.client_id)
                .append_pair("redirect_uri", &self.cfg.redirect_uri)
                .append_pair("state", state)
                .append_pair("code_challenge", code_challenge)
                .append_pair("code_challenge_method", "S256");
            if !all.is_empty() {
                q.append_pair("scope", &all.join(" "));
            }
            for (k, v) in extra {
                q.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// Starts an authorization: a URL with `response_type=code`, the
    /// provider's redirect URI, `scope`, a fresh `state` and a PKCE S256
    /// challenge (always sent: GitHub accepts PKCE without enforcing it, so
    /// `state` is what protects the callback there). `extra` adds
    /// parameters such as `prompt` or `login_hint`.
    pub async fn authorization_request(
        &self,
        scopes: &[String],
        extra: &[(&str, &str)],
    ) -> Result<AuthorizationRequest, UpstreamError> {
        self.endpoints().await?;
        let state = random_b64(32)?;
        let verifier = random_b64(32)?;
        let url = self.authorization_url(
            state.expose(),
            &pkce_challenge(verifier.expose()),
            scopes,
            extra,
        )?;
        Ok(AuthorizationRequest {
            url: url.into(),
            state,
            verifier,
        })
    }

    fn form_with_auth(
        &self,
        mut form: Vec<(&'static str, String)>,
    ) -> (Vec<(&'static str, String)>, Option<String>) {
        let mut basic = None;
        match self.cfg.client_auth {
            ClientAuth::Basic => {
                let enc =
                    |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
                let secret = self
                    .secret
                    .as_ref()
                    .map(|s| s.expose().as_str())
                    .unwrap_or_default();
                let raw = format!("{}:{}", enc(&self.cfg.client_id), enc(secret));
                basic = Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(raw)
                ));
            }
            ClientAuth::Post => {
                form.push(("client_id", self.cfg.client_id.clone()));
                if let Some(s) = &self.secret {
                    form.push(("client_secret", s.expose().clone()));
                }
            }
            ClientAuth::None => form.push(("client_id", self.cfg.client_id.clone())),
        }
        (form, basic)
    }

    async fn post_form(
        &self,
        url: &str,
        form: Vec<(&'static str, String)>,
    ) -> Result<(u16, Vec<u8>), UpstreamError> {
        let (mut form, basic) = self.form_with_auth(form);
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
        let sent = req.body(body.clone()).send().await;
        body.zeroize();
        let resp = sent.map_err(|e| unavailable(&e))?;
        let status = resp.status().as_u16();
        Ok((status, read_capped(resp).await?))
    }

    async fn token_request(
        &self,
        form: Vec<(&'static str, String)>,
    ) -> Result<TokenSet, UpstreamError> {
        let ep = self.endpoints().await?;
        let (status, mut body) = self.post_form(&ep.token, form).await?;
        let parsed = parse_token_answer(status, &body);
        body.zeroize();
        parsed
    }

    /// Checks the RFC 9207 `iss` of an authorization response (mix-up
    /// defence): when present it must be this provider's issuer exactly.
    /// Providers that do not send it (GitHub) pass with `None`.
    pub fn check_callback_iss(&self, iss: Option<&str>) -> Result<(), UpstreamError> {
        match (iss, self.cfg.issuer.as_deref()) {
            (None, _) => Ok(()),
            (Some(got), Some(want)) if got == want => Ok(()),
            _ => Err(UpstreamError::Rejected {
                error: "iss_mismatch".into(),
            }),
        }
    }

    /// Exchanges an authorization code (with its PKCE verifier) for tokens.
    pub async fn exchange_code(
        &self,
        code: &str,
        verifier: &str,
    ) -> Result<TokenSet, UpstreamError> {
        self.token_request(vec![
            ("grant_type", "authorization_code".into()),
            ("code", code.into()),
            ("redirect_uri", self.cfg.redirect_uri.clone()),
            ("code_verifier", verifier.into()),
        ])
        .await
    }

    /// Refreshes; `scope` narrows the new access token where the provider
    /// accepts it (`narrow_on_refresh`).
    pub async fn refresh(
        &self,
        refresh_token: &str,
        scope: Option<&[String]>,
    ) -> Result<TokenSet, UpstreamError> {
        let mut form = vec![
            ("grant_type", "refresh_token".into()),
            ("refresh_token", refresh_token.into()),
        ];
        if let Some(s) = scope {
            form.push(("scope", s.join(" ")));
        }
        self.token_request(form).await
    }

    /// Revokes a token (RFC 7009). `hint` is `refresh_token` or
    /// `access_token`.
    pub async fn revoke(&self, token: &str, hint: &str) -> Result<Revocation, UpstreamError> {
        let ep = self.endpoints().await?;
        let Some(url) = ep.revocation.as_deref() else {
            return Ok(Revocation::NotSupported);
        };
        let (status, body) = self
            .post_form(
                url,
                vec![("token", token.into()), ("token_type_hint", hint.into())],
            )
            .await?;
        match status {
            200..=299 => Ok(Revocation::Revoked),
            400..=499 => Err(match serde_json::from_slice::<RawError>(&body) {
                Ok(e) => UpstreamError::Rejected {
                    error: sanitize_code(&e.error),
                },
                Err(_) => UpstreamError::Rejected {
                    error: format!("http_{status}"),
                },
            }),
            _ => Err(UpstreamError::Unavailable(format!(
                "revocation answered HTTP {status}"
            ))),
        }
    }

    /// The account's id and name at the provider, read with its access token.
    pub async fn account_info(&self, access_token: &str) -> Result<AccountInfo, UpstreamError> {
        let (url, id_field, name_field) = match &self.cfg.account {
            AccountLookup::Userinfo {
                id_claim,
                name_claim,
            } => {
                let ep = self.endpoints().await?;
                let u = ep.userinfo.clone().ok_or_else(|| {
                    UpstreamError::Config("the provider has no userinfo endpoint".into())
                })?;
                (u, id_claim.clone(), name_claim.clone())
            }
            AccountLookup::Api {
                url,
                id_field,
                name_field,
            } => (url.clone(), id_field.clone(), name_field.clone()),
        };
        let resp = self
            .http
            .get(&url)
            .header("authorization", format!("Bearer {access_token}"))
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let status = resp.status().as_u16();
        let body = read_capped(resp).await?;
        match status {
            200..=299 => {}
            401 | 403 => {
                return Err(UpstreamError::Rejected {
                    error: "invalid_token".into(),
                })
            }
            s => {
                return Err(UpstreamError::Unavailable(format!(
                    "the account look-up answered HTTP {s}"
                )))
            }
        }
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|_| {
            UpstreamError::Unavailable("the account look-up answer is not JSON".into())
        })?;
        let field = |f: &str| match v.get(f) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let id = field(&id_field).ok_or_else(|| {
            UpstreamError::Unavailable(format!("the account look-up answer has no {id_field}"))
        })?;
        let name = field(&name_field).unwrap_or_else(|| id.clone());
        Ok(AccountInfo { id, name })
    }
}

async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, UpstreamError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| unavailable(&e))? {
        if out.len() + chunk.len() > MAX_ANSWER {
            out.zeroize();
            return Err(UpstreamError::Unavailable("its answer is too large".into()));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Interprets a token endpoint answer. GitHub answers errors with 200 and
/// an `error` field, so `error` is looked at whatever the status.
pub(crate) fn parse_token_answer(status: u16, body: &[u8]) -> Result<TokenSet, UpstreamError> {
    let raw: Result<RawToken, _> = serde_json::from_slice(body);
    match (status, raw) {
        (
            _,
            Ok(RawToken {
                error: Some(ref e), ..
            }),
        ) if (200..500).contains(&status) => Err(UpstreamError::Rejected {
            error: sanitize_code(e),
        }),
        (200..=299, Ok(mut t)) => {
            let access = t
                .access_token
                .take()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    UpstreamError::Unavailable("its answer has no access_token".into())
                })?;
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
                    UpstreamError::Unavailable("its answer has no usable token_type".into())
                })?;
            let expires_in = match &t.expires_in {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::Number(n)) => {
                    n.as_i64().filter(|n| *n >= 0).map(Some).ok_or_else(|| {
                        UpstreamError::Unavailable(
                            "its expires_in is not a positive integer".into(),
                        )
                    })?
                }
                // As a string too: "-1" parses as an i64, and is no lifetime.
                Some(serde_json::Value::String(s)) => {
                    Some(s.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                        UpstreamError::Unavailable(
                            "its expires_in is not a positive integer".into(),
                        )
                    })?)
                }
                Some(_) => {
                    return Err(UpstreamError::Unavailable(
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
        (200..=299, Err(_)) => Err(UpstreamError::Unavailable("its answer is not JSON".into())),
        (400..=499, _) => Err(UpstreamError::Rejected {
            error: format!("http_{status}"),
        }),
        (s, _) => Err(UpstreamError::Unavailable(format!("it answered HTTP {s}"))),
    }
}

/// RFC 8414 section 3.1: the well-known segment goes between the host and
/// the issuer's path; OpenID Connect discovery appends it.
fn discovery_urls(issuer: &str) -> Result<Vec<String>, UpstreamError> {
    let u = url::Url::parse(issuer)
        .map_err(|_| UpstreamError::Config("the issuer is not a URL".into()))?;
    let path = u.path().trim_end_matches('/');
    let origin = u.origin().ascii_serialization();
    Ok(vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ),
    ])
}

pub(crate) fn parse_metadata(issuer: &str, body: &[u8]) -> Result<Endpoints, UpstreamError> {
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
        authorization_response_iss_parameter_supported: bool,
    }
    let m: Meta = serde_json::from_slice(body)
        .map_err(|_| UpstreamError::Unavailable("the discovery document is malformed".into()))?;
    // RFC 8414 section 3.3: the issuer in the document must be identical.
    if m.issuer != issuer {
        return Err(UpstreamError::Config(
            "the discovery document names another issuer".into(),
        ));
    }
    let ok = |u: &str| url::Url::parse(u).is_ok_and(|u| secure_or_loopback(&u));
    for u in [
        Some(&m.authorization_endpoint),
        Some(&m.token_endpoint),
        m.revocation_endpoint.as_ref(),
        m.userinfo_endpoint.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        if !ok(u) {
            return Err(UpstreamError::Config(
                "the discovery document has an endpoint that is not https".into(),
            ));
        }
    }
    Ok(Endpoints {
        authorization: m.authorization_endpoint,
        token: m.token_endpoint,
        revocation: m.revocation_endpoint,
        userinfo: m.userinfo_endpoint,
        sends_iss: m.authorization_response_iss_parameter_supported,
    })
}

/// Every configured provider, by name.
#[derive(Debug, Default)]
pub struct Providers {
    by_name: BTreeMap<String, Arc<Provider>>,
}

impl Providers {
    /// Builds every provider of the config (reads their secret files).
    pub fn from_config(config: &Config) -> Result<Providers, UpstreamError> {
        let mut by_name = BTreeMap::new();
        for (name, p) in &config.providers {
            by_name.insert(name.clone(), Arc::new(Provider::new(p.clone())?));
        }
        Ok(Providers { by_name })
    }

    /// The provider named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Provider>> {
        self.by_name.get(name)
    }

    /// Provider names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests;
