//! The HTTP side of an exchange: the upstream's metadata, and the one
//! token request, with the AS's answer sorted into what the orchestrator
//! can act on. No redirect is followed (the client has none), bodies are
//! read up to [`MAX_ANSWER`], connect and total timeouts are the
//! upstream's.

use serde::Deserialize;
use zeroize::Zeroize;

use super::{ExchangeInput, Resolved, Upstream, UpstreamError};
use crate::base::grammar::{secure_or_loopback, TOKEN_EXCHANGE};
use crate::base::oauth::sanitize_code;
use crate::derive::client_keys::{Actor, ASSERTION_TYPE, JWT_TOKEN_TYPE};
use crate::infra::config::{AudienceParam, UpstreamClientAuth, UpstreamResource};

/// The most an upstream's answer (metadata or token) may hold.
pub(super) const MAX_ANSWER: usize = 64 * 1024;

/// The RFC 7523 JWT bearer grant type (RFC 7523 section 2.1): leg 2 of
/// an ID-JAG derive.
pub(super) const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The token type of an ID-JAG (Identity Assertion JWT Authorization
/// Grant), asked for in leg 1.
pub(super) const ID_JAG_TYPE: &str = "urn:ietf:params:oauth:token-type:id-jag";

/// Which leg an upstream serves in a derive: what its metadata must not
/// contradict.
#[derive(Debug, Clone, Copy)]
pub(super) enum Leg {
    /// An RFC 8693 exchange for an access token.
    Exchange,
    /// An RFC 8693 exchange for an ID-JAG (the IdP, leg 1).
    IdJag,
    /// The `jwt-bearer` grant with an ID-JAG (the resource's AS, leg 2).
    JwtBearer,
}

/// What an upstream's metadata advertises, when it does: RFC 8414
/// `grant_types_supported`, and the identity-chaining
/// `identity_chaining_requested_token_types_supported`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Advertised {
    #[serde(default)]
    grant_types_supported: Option<Vec<String>>,
    #[serde(default)]
    identity_chaining_requested_token_types_supported: Option<Vec<String>>,
    /// RFC 9449 section 5.1 (read by `credbroker upstream check` only).
    #[serde(default)]
    pub(super) dpop_signing_alg_values_supported: Option<Vec<String>>,
    /// RFC 8414 section 2 (read by `credbroker upstream check` only).
    #[serde(default)]
    pub(super) token_endpoint_auth_methods_supported: Option<Vec<String>>,
}

impl Advertised {
    /// `Err(what)`: the metadata advertises its grants (or token types)
    /// and `leg`'s is not among them.
    /// Whether the metadata lists its grant types.
    pub(super) fn grant_types_advertised(&self) -> bool {
        self.grant_types_supported.is_some()
    }

    /// Whether the metadata lists its identity-chaining token types.
    pub(super) fn id_jag_types_advertised(&self) -> bool {
        self.identity_chaining_requested_token_types_supported
            .is_some()
    }

    pub(super) fn supports(&self, leg: Leg) -> Result<(), &'static str> {
        let has = |list: &Option<Vec<String>>, v: &str| {
            list.as_ref().is_none_or(|l| l.iter().any(|x| x == v))
        };
        let grant = match leg {
            Leg::Exchange | Leg::IdJag => TOKEN_EXCHANGE,
            Leg::JwtBearer => JWT_BEARER,
        };
        if !has(&self.grant_types_supported, grant) {
            return Err(match leg {
                Leg::JwtBearer => "grant_types_supported lacks jwt-bearer",
                _ => "grant_types_supported lacks token-exchange",
            });
        }
        if matches!(leg, Leg::IdJag)
            && !has(
                &self.identity_chaining_requested_token_types_supported,
                ID_JAG_TYPE,
            )
        {
            return Err("identity_chaining_requested_token_types_supported lacks id-jag");
        }
        Ok(())
    }
}

/// The grant a token request makes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Grant<'a> {
    /// RFC 8693: the person's subject token for `requested`; `audience`
    /// (an ID-JAG's: the resource AS's issuer) replaces the configured
    /// audience, with `resource` always sent.
    Exchange {
        requested: &'static str,
        audience: Option<&'a str>,
    },
    /// RFC 7523: the ID-JAG as `assertion`.
    JwtBearer { assertion: &'a str },
}

/// A success answer's body, not yet checked.
pub(super) struct TokenAnswer {
    pub(super) body: Vec<u8>,
}

impl Drop for TokenAnswer {
    fn drop(&mut self) {
        self.body.zeroize();
    }
}

/// Reads a body up to [`MAX_ANSWER`]; `Err(true)`: too large, `Err(false)`:
/// unreadable. What was read is zeroized on failure.
pub(super) async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, bool> {
    if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(true);
    }
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) if out.len() + c.len() > MAX_ANSWER => {
                out.zeroize();
                return Err(true);
            }
            Ok(Some(c)) => out.extend_from_slice(&c),
            Ok(None) => return Ok(out),
            Err(_) => {
                out.zeroize();
                return Err(false);
            }
        }
    }
}

fn is_json(headers: &reqwest::header::HeaderMap) -> bool {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The token endpoint and JWKS URI from the upstream's metadata (RFC 8414
/// section 3.1 first, then OpenID Connect discovery), its `issuer`
/// identical to the configured one, both URLs https (http on loopback).
pub(super) async fn discover(u: &Upstream) -> Result<(String, String, Advertised), String> {
    #[derive(Deserialize)]
    struct Meta {
        issuer: String,
        token_endpoint: String,
        jwks_uri: String,
        #[serde(flatten)]
        advertised: Advertised,
    }
    let issuer = &u.cfg.issuer;
    let parsed = url::Url::parse(issuer).map_err(|_| "the issuer is not a URL".to_string())?;
    let path = parsed.path().trim_end_matches('/');
    let urls = [
        format!(
            "{}/.well-known/oauth-authorization-server{path}",
            parsed.origin().ascii_serialization()
        ),
        format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ),
    ];
    let mut last = String::from("no metadata found");
    for url in urls {
        let resp = match u
            .http
            .get(&url)
            .header("accept", "application/json")
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                last = format!("metadata answered HTTP {}", r.status().as_u16());
                continue;
            }
            Err(_) => {
                last = "metadata could not be fetched".into();
                continue;
            }
        };
        let body = read_capped(resp)
            .await
            .map_err(|_| "the metadata is unreadable or too large".to_string())?;
        let m: Meta =
            serde_json::from_slice(&body).map_err(|_| "the metadata is malformed".to_string())?;
        if &m.issuer != issuer {
            return Err("the metadata names another issuer".into());
        }
        let ok = |s: &str| {
            url::Url::parse(s).is_ok_and(|x| {
                secure_or_loopback(&x) && x.fragment().is_none() && x.query().is_none()
            })
        };
        if !ok(&m.token_endpoint) || !ok(&m.jwks_uri) {
            return Err("the metadata has an endpoint that is not https".into());
        }
        return Ok((m.token_endpoint, m.jwks_uri, m.advertised));
    }
    Err(last)
}

/// The request's form (RFC 8693 section 2.1, or RFC 7523 section 2.1
/// with the ID-JAG), before the client's credentials. Zeroized by the
/// caller.
fn form(
    input: &ExchangeInput<'_>,
    shape: &UpstreamResource,
    grant: Grant<'_>,
) -> Vec<(&'static str, String)> {
    let mut form = match grant {
        Grant::Exchange {
            requested,
            audience,
        } => {
            let mut form = vec![
                ("grant_type", TOKEN_EXCHANGE.to_owned()),
                ("subject_token", input.subject_token.to_owned()),
                ("subject_token_type", input.subject_token_type.to_owned()),
                ("requested_token_type", requested.to_owned()),
            ];
            match audience {
                // An ID-JAG: for the resource AS, about the resource.
                Some(a) => {
                    form.push(("audience", a.to_owned()));
                    form.push(("resource", input.resource.to_owned()));
                }
                None => audience_params(&mut form, input, shape),
            }
            form
        }
        Grant::JwtBearer { assertion } => vec![
            ("grant_type", JWT_BEARER.to_owned()),
            ("assertion", assertion.to_owned()),
        ],
    };
    if !input.scopes.is_empty() {
        form.push(("scope", input.scopes.join(" ")));
    }
    form
}

/// `resource` and/or `audience` as the upstream's resource entry says.
fn audience_params(
    form: &mut Vec<(&'static str, String)>,
    input: &ExchangeInput<'_>,
    shape: &UpstreamResource,
) {
    if matches!(
        shape.audience_param,
        AudienceParam::Resource | AudienceParam::Both
    ) {
        form.push(("resource", input.resource.to_owned()));
    }
    if matches!(
        shape.audience_param,
        AudienceParam::Audience | AudienceParam::Both
    ) {
        for a in &shape.audience {
            form.push(("audience", a.clone()));
        }
    }
}

/// `actor_token = true`: an actor token (RFC 8693 section 2.1) naming the
/// agent, the tool and the step, for this AS only, signed with the client
/// key; `actor_token_type` jwt.
fn actor(
    u: &Upstream,
    input: &ExchangeInput<'_>,
    form: &mut Vec<(&'static str, String)>,
) -> Result<(), UpstreamError> {
    if !u.cfg.actor_token {
        return Ok(());
    }
    let Some(c) = &u.client else {
        tracing::error!(upstream = %u.cfg.name, "the client key is not loaded: no actor token");
        return Err(UpstreamError::Misconfigured);
    };
    let actor = Actor {
        agent: &c.agent,
        tool: input.tool,
        step: Some(input.step),
    };
    let t = c
        .keys
        .actor_token(&c.issuer, &actor, &u.cfg.issuer, input.now)
        .map_err(|e| {
            tracing::error!(upstream = %u.cfg.name, error = %e, "the actor token could not be signed");
            UpstreamError::Misconfigured
        })?;
    form.push(("actor_token", t.expose().to_owned()));
    form.push(("actor_token_type", JWT_TOKEN_TYPE.to_owned()));
    Ok(())
}

/// The client's credentials that go in the body: `client_secret_post`'s
/// id and secret, or `private_key_jwt`'s assertion (RFC 7523 section 2.2),
/// signed now with the client key for this AS's issuer identifier only.
pub(super) fn credentials(
    u: &Upstream,
    now: i64,
    form: &mut Vec<(&'static str, String)>,
) -> Result<(), UpstreamError> {
    match (u.cfg.client_auth, &u.secret, &u.client) {
        (UpstreamClientAuth::SecretPost, Some(secret), _) => {
            form.push(("client_id", u.cfg.client_id.clone()));
            form.push(("client_secret", secret.expose().to_owned()));
        }
        (UpstreamClientAuth::PrivateKeyJwt, _, Some(c)) => {
            let a = c
                .keys
                .client_assertion(&u.cfg.client_id, &u.cfg.issuer, now)
                .map_err(|e| {
                    tracing::error!(upstream = %u.cfg.name, error = %e, "the client assertion could not be signed");
                    UpstreamError::Misconfigured
                })?;
            form.push(("client_assertion_type", ASSERTION_TYPE.to_owned()));
            form.push(("client_assertion", a.expose().to_owned()));
        }
        (UpstreamClientAuth::SecretBasic, Some(_), _) => {}
        _ => {
            tracing::error!(upstream = %u.cfg.name, "the upstream's client credentials are not loaded");
            return Err(UpstreamError::Misconfigured);
        }
    }
    Ok(())
}

/// `client_secret_basic`: both parts form-encoded, then base64 (RFC 6749
/// section 2.3.1).
pub(super) fn basic(u: &Upstream) -> Option<String> {
    let secret = match (u.cfg.client_auth, &u.secret) {
        (UpstreamClientAuth::SecretBasic, Some(s)) => s,
        _ => return None,
    };
    Some(crate::base::oauth::basic_authorization(
        &u.cfg.client_id,
        secret.expose(),
    ))
}

/// Sends the exchange and sorts the answer: a 200 JSON answer is handed
/// on for its checks; everything else becomes the refusal the
/// orchestrator can act on.
pub(super) async fn post(
    u: &Upstream,
    resolved: &Resolved,
    input: &ExchangeInput<'_>,
    shape: &UpstreamResource,
    proof: &str,
    grant: Grant<'_>,
) -> Result<TokenAnswer, UpstreamError> {
    let mut fields = form(input, shape, grant);
    // An actor token is an RFC 8693 parameter: not in leg 2's jwt-bearer.
    let exchange = matches!(grant, Grant::Exchange { .. });
    let added = credentials(u, input.now, &mut fields).and_then(|()| {
        if exchange {
            actor(u, input, &mut fields)
        } else {
            Ok(())
        }
    });
    if let Err(e) = added {
        for (_, v) in fields.iter_mut() {
            v.zeroize();
        }
        return Err(e);
    }
    let mut body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields.iter())
        .finish();
    for (_, v) in fields.iter_mut() {
        v.zeroize();
    }
    let mut req = u
        .http
        .post(&resolved.token_endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("accept", "application/json")
        .header("dpop", proof);
    let mut auth = basic(u);
    if let Some(a) = &auth {
        req = req.header("authorization", a.as_str());
    }
    // The broker's trace context, only where `propagate_to` names the
    // upstreams.
    if let Some((parent, state)) =
        crate::infra::telemetry::outgoing(crate::infra::telemetry::Target::Upstreams)
    {
        req = req.header("traceparent", parent);
        if let Some(s) = state {
            req = req.header("tracestate", s);
        }
    }
    let sent = req.body(body.clone()).send().await;
    body.zeroize();
    if let Some(a) = auth.as_mut() {
        a.zeroize();
    }
    let resp = sent.map_err(|e| {
        tracing::warn!(upstream = %u.cfg.name, timeout = e.is_timeout(), connect = e.is_connect(), "the upstream authorization server could not be reached");
        UpstreamError::Unavailable
    })?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    u.remember_nonce(&headers);
    if (300..400).contains(&status) {
        return Err(UpstreamError::BadAnswer("it redirected (not followed)"));
    }
    if status >= 500 {
        tracing::warn!(upstream = %u.cfg.name, status, "the upstream authorization server failed");
        return Err(UpstreamError::Unavailable);
    }
    let body = match read_capped(resp).await {
        Ok(b) => TokenAnswer { body: b },
        Err(true) => return Err(UpstreamError::BadAnswer("it is too large")),
        Err(false) => return Err(UpstreamError::Unavailable),
    };
    if !is_json(&headers) {
        return Err(UpstreamError::BadAnswer("it is not JSON"));
    }
    match status {
        200 => Ok(body),
        400..=499 => Err(refusal(u, resolved, status, &body.body)),
        _ => Err(UpstreamError::BadAnswer("its status is not 200")),
    }
}

/// An error answer (RFC 6749 section 5.2) as the refusal the orchestrator
/// acts on; only allow-listed codes are ever named to the caller.
fn refusal(u: &Upstream, resolved: &Resolved, status: u16, body: &[u8]) -> UpstreamError {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    let Ok(e) = serde_json::from_slice::<ErrorBody>(body) else {
        return UpstreamError::BadAnswer("an error answer without an OAuth error code");
    };
    match e.error.as_str() {
        "invalid_grant" => UpstreamError::SubjectRejected,
        "invalid_scope" => UpstreamError::Denied("invalid_scope"),
        "invalid_target" => UpstreamError::Denied("invalid_target"),
        "access_denied" => UpstreamError::Denied("access_denied"),
        "use_dpop_nonce" => UpstreamError::ProofRequired {
            htu: resolved.token_endpoint.clone(),
            nonce: u.current_nonce(),
        },
        "invalid_dpop_proof" => {
            UpstreamError::ProofInvalid("was refused by the upstream authorization server")
        }
        other => {
            // invalid_client, unauthorized_client, unsupported_grant_type,
            // invalid_request...: this broker's registration or request, not
            // the caller's fault.
            tracing::error!(upstream = %u.cfg.name, status, error = %sanitize_code(other), "the upstream authorization server refused this broker's exchange request; check upstreams.{}'s client registration and grant", u.cfg.name);
            UpstreamError::Misconfigured
        }
    }
}
