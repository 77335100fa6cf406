//! The OAuth 2.0 client side towards third-party providers (GitHub, any
//! OpenID Connect provider): authorization URLs with PKCE (S256) and
//! `state`, code exchange, refresh, RFC 7009 revocation, the account's name,
//! and RFC 8414 / OpenID Connect discovery. The OAuth mechanics are the
//! shared client of [`crate::base::oauth`], used here by its provider rules
//! ([`oauth::Use::Provider`]); the RFC 9207 `iss` check of the callback is
//! [`oauth::check_callback_iss`], run by the pages.
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
use serde::Deserialize;
use zeroize::Zeroize;

use crate::base::oauth::{self, read_capped};
use crate::base::secret::SecretString;
use crate::infra::config::{AccountLookup, ClientAuth, Config, Endpoints, ProviderConfig};

pub use crate::base::oauth::{pkce_challenge, OAuthError as UpstreamError, TokenSet};

/// The person's account at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountInfo {
    /// The provider's stable id for the account.
    pub id: String,
    /// The name people know it by (login, e-mail).
    pub name: String,
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

#[derive(Deserialize)]
struct RawError {
    error: String,
}

/// One configured provider.
pub struct Provider {
    cfg: ProviderConfig,
    secret: Option<SecretString>,
    client: oauth::Client,
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
                let bytes = crate::infra::config::read_secret_file(p).map_err(|e| {
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
        let http = crate::base::http::outbound_client()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("credbroker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|_| UpstreamError::Config("the HTTP client could not be built".into()))?;
        Ok(Provider {
            cfg,
            secret,
            client: oauth::Client::new(http),
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
        let m = self.client.discover(issuer, oauth::Use::Provider).await?;
        let e = Arc::new(Endpoints {
            authorization: m.authorization,
            token: m.token,
            revocation: m.revocation,
            userinfo: m.userinfo,
            sends_iss: m.sends_iss,
        });
        self.discovered.store(Some(e.clone()));
        Ok(e)
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
        oauth::authorization_url(
            &ep.authorization,
            oauth::Use::Provider,
            &oauth::AuthorizationParams {
                client_id: &self.cfg.client_id,
                redirect_uri: &self.cfg.redirect_uri,
                scope: &all.join(" "),
                state,
                code_challenge,
                extra,
            },
        )
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
        let state = oauth::random_secret(32)?;
        let verifier = oauth::random_secret(32)?;
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

    fn client_auth(&self) -> oauth::ClientAuth<'_> {
        let id = self.cfg.client_id.as_str();
        let secret = self.secret.as_ref().map(|s| s.expose().as_str());
        match self.cfg.client_auth {
            ClientAuth::Basic => oauth::ClientAuth::Basic {
                id,
                secret: secret.unwrap_or_default(),
            },
            ClientAuth::Post => oauth::ClientAuth::Post { id, secret },
            ClientAuth::None => oauth::ClientAuth::Post { id, secret: None },
        }
    }

    async fn post_form(
        &self,
        url: &str,
        form: Vec<(&'static str, String)>,
    ) -> Result<(u16, Vec<u8>), UpstreamError> {
        self.client.post_form(url, form, self.client_auth()).await
    }

    async fn token_request(
        &self,
        form: Vec<(&'static str, String)>,
        extra: &[(&'static str, String)],
    ) -> Result<TokenSet, UpstreamError> {
        let ep = self.endpoints().await?;
        let (status, mut body) = self
            .client
            .post_form_with(&ep.token, form, self.client_auth(), extra)
            .await?;
        let parsed = oauth::parse_token_answer(status, &body);
        body.zeroize();
        parsed
    }

    /// Exchanges an authorization code (with its PKCE verifier) for tokens.
    pub async fn exchange_code(
        &self,
        code: &str,
        verifier: &str,
    ) -> Result<TokenSet, UpstreamError> {
        let ep = self.endpoints().await?;
        match self
            .client
            .exchange_code(
                &ep.token,
                self.client_auth(),
                code,
                verifier,
                &self.cfg.redirect_uri,
                oauth::Use::Provider,
            )
            .await?
        {
            oauth::CodeAnswer::Tokens(t) => Ok(t),
            // The provider rules never give an ID token answer.
            oauth::CodeAnswer::IdToken(_) => Err(UpstreamError::Unavailable(
                "its answer has no access_token".into(),
            )),
        }
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
        // Its own span in a traced request; the broker's `traceparent`
        // (and the trace's trusted `tracestate`) go only where
        // `propagate_to` names the providers.
        use crate::infra::telemetry::{child_kind, outgoing, Kind, Target};
        let mut span = child_kind("provider.refresh", Kind::Client);
        span.set("credbroker.service", self.cfg.name.as_str());
        let mut extra = Vec::new();
        if let Some((parent, state)) = outgoing(Target::Providers) {
            extra.push(("traceparent", parent));
            if let Some(s) = state {
                extra.push(("tracestate", s));
            }
        }
        let answer = self.token_request(form, &extra).await;
        if answer.is_err() {
            span.fail();
        }
        answer
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
                    error: oauth::sanitize_code(&e.error),
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

    /// Whether disconnecting deletes the application grant (GitHub) rather
    /// than revoking tokens one by one (RFC 7009).
    pub fn revokes_the_grant(&self) -> bool {
        self.cfg.grant_endpoint.is_some()
    }

    /// Deletes the application grant that `access_token` was issued under
    /// (GitHub's `DELETE /applications/{client_id}/grant`, basic auth of
    /// client id and secret, body `{"access_token": ...}`): every token of
    /// that grant, access and refresh, stops working. `NotSupported` when
    /// the provider has no grant API. A 404 means GitHub knows no grant for
    /// that token (already revoked there, or the token expired): an error,
    /// so the report says so rather than "revoked".
    pub async fn delete_grant(&self, access_token: &str) -> Result<Revocation, UpstreamError> {
        let Some(url) = self.cfg.grant_endpoint.as_deref() else {
            return Ok(Revocation::NotSupported);
        };
        let Some(secret) = &self.secret else {
            return Err(UpstreamError::Config(format!(
                "providers.{}.client_secret_file: GitHub's grant API needs the client secret",
                self.cfg.name
            )));
        };
        let mut body = serde_json::json!({ "access_token": access_token }).to_string();
        let sent = self
            .client
            .http()
            .delete(url)
            .basic_auth(&self.cfg.client_id, Some(secret.expose()))
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        body.zeroize();
        let resp = sent.map_err(|e| oauth::unavailable(&e))?;
        match resp.status().as_u16() {
            200..=299 => Ok(Revocation::Revoked),
            404 => Err(UpstreamError::Rejected {
                error: "no_grant_for_this_token".into(),
            }),
            s @ 400..=499 => Err(UpstreamError::Rejected {
                error: format!("http_{s}"),
            }),
            s => Err(UpstreamError::Unavailable(format!(
                "the grant API answered HTTP {s}"
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
            .client
            .http()
            .get(&url)
            .header("authorization", format!("Bearer {access_token}"))
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| oauth::unavailable(&e))?;
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
