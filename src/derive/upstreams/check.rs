//! `credbroker upstream check NAME`: what can be learnt about one upstream
//! authorization server without a person's token or a tool's key, each
//! check named, in order (docs/UPSTREAM.md, "Checking an upstream"):
//!
//! 1. `metadata`: the endpoints, from the metadata (RFC 8414, then OpenID
//!    Connect discovery) with `issuer` identical and https endpoints, or
//!    as configured with `discovery = false`;
//! 2. `grant`: what the metadata advertises for the grant this upstream
//!    serves (token-exchange; for an `id_jag` IdP the id-jag token type;
//!    for a resource AS jwt-bearer), as a derive checks it;
//! 3. `dpop_algs`: ES256, the algorithm of the credbroker clients' relayed
//!    proofs, among `dpop_signing_alg_values_supported`;
//! 4. `client_auth_method`: the configured `client_auth` among
//!    `token_endpoint_auth_methods_supported`;
//! 5. `client_auth`: one token request with the client's authentication
//!    exactly as a derive sends it and a grant the AS must refuse (a subject
//!    token, or assertion, that is no token, and no DPoP proof).
//!
//! A check whose metadata member is absent is skipped (`skip`), not passed.

use super::call::{self, Leg, ID_JAG_TYPE, JWT_BEARER};
use super::{Upstream, Upstreams};
use crate::base::grammar::TOKEN_EXCHANGE;
use crate::base::oauth::sanitize_code;
use crate::infra::config::{UpstreamClientAuth, UpstreamGrant};

/// What the `client_auth` check sends as the subject token or assertion:
/// no AS can take it for a token.
const NOT_A_TOKEN: &str = "credbroker-upstream-check-not-a-token";

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Ok,
    /// It failed: the upstream is not usable as configured.
    Fail,
    /// Not checked (the AS does not advertise what it would compare).
    Skip,
}

/// One named check and what it found (never a secret).
#[derive(Debug, Clone)]
pub struct CheckLine {
    /// Its name (`metadata`, `grant`, `dpop_algs`, `client_auth_method`,
    /// `client_auth`).
    pub name: &'static str,
    /// Its outcome.
    pub outcome: Outcome,
    /// What was compared, or why it failed.
    pub detail: String,
}

/// Check 5 as one process ran it, with what it ran it for: a caller that
/// asked another process (the running instance) compares these with its
/// own config before it trusts the line.
#[derive(Debug, Clone)]
pub struct ClientAuthCheck {
    /// The upstream's issuer.
    pub issuer: String,
    /// The client id it authenticated as.
    pub client_id: String,
    /// The method (`client_secret_basic`, `client_secret_post`,
    /// `private_key_jwt`).
    pub client_auth: &'static str,
    /// The token endpoint it sent to (`None`: not known, see the line).
    pub token_endpoint: Option<String>,
    /// The `client_auth` line.
    pub line: CheckLine,
}

fn line(name: &'static str, outcome: Outcome, detail: impl Into<String>) -> CheckLine {
    CheckLine {
        name,
        outcome,
        detail: detail.into(),
    }
}

/// Whether `list`, when advertised, holds `want`.
fn advertised(
    name: &'static str,
    member: &str,
    list: Option<&Vec<String>>,
    want: &str,
) -> CheckLine {
    match list {
        None => line(name, Outcome::Skip, format!("{member} not advertised")),
        Some(l) if l.iter().any(|x| x == want) => {
            line(name, Outcome::Ok, format!("{member} lists {want}"))
        }
        Some(l) => line(
            name,
            Outcome::Fail,
            format!("{member} lacks {want} (it lists {})", l.join(", ")),
        ),
    }
}

impl Upstreams {
    /// The checks of the module doc for the upstream `name`, in order;
    /// `None` when it is not configured. Stops after `metadata` when the
    /// endpoints are not known.
    pub async fn check(&self, name: &str, now: i64) -> Option<Vec<CheckLine>> {
        let u = self.by_name.get(name)?;
        let mut out = Vec::new();
        let r = match u.resolve().await {
            Ok(r) => r,
            Err(e) => {
                out.push(line("metadata", Outcome::Fail, e));
                return Some(out);
            }
        };
        out.push(line(
            "metadata",
            Outcome::Ok,
            match u.cfg.discovery {
                true => format!(
                    "issuer {} identical; token endpoint {}",
                    u.cfg.issuer, r.token_endpoint
                ),
                false => format!("configured token endpoint {}", r.token_endpoint),
            },
        ));
        let leg = self.leg_of(u);
        out.push(match r.advertised.supports(leg) {
            Err(missing) => line("grant", Outcome::Fail, missing),
            Ok(()) => line(
                "grant",
                match r.advertised.grant_types_advertised() {
                    true => Outcome::Ok,
                    false => Outcome::Skip,
                },
                grant_detail(leg, &r.advertised),
            ),
        });
        out.push(advertised(
            "dpop_algs",
            "dpop_signing_alg_values_supported",
            r.advertised.dpop_signing_alg_values_supported.as_ref(),
            "ES256",
        ));
        out.push(advertised(
            "client_auth_method",
            "token_endpoint_auth_methods_supported",
            r.advertised.token_endpoint_auth_methods_supported.as_ref(),
            auth_method(u.cfg.client_auth),
        ));
        out.push(client_auth(u, &r.token_endpoint, leg, now).await);
        Some(out)
    }

    /// Check 5 alone (`client_auth`), for the upstream `name` as this
    /// process has it: what a running instance answers on its admin socket
    /// (`POST /upstreams/check-client-auth`) so `upstream check` can test
    /// `private_key_jwt` with the client key the instance holds in memory.
    /// `None` when `name` is not configured.
    pub async fn check_client_auth(&self, name: &str, now: i64) -> Option<ClientAuthCheck> {
        let u = self.by_name.get(name)?;
        let (token_endpoint, line) = match u.resolve().await {
            Ok(r) => (
                Some(r.token_endpoint.clone()),
                client_auth(u, &r.token_endpoint, self.leg_of(u), now).await,
            ),
            Err(e) => (None, line("client_auth", Outcome::Fail, e)),
        };
        Some(ClientAuthCheck {
            issuer: u.cfg.issuer.clone(),
            client_id: u.cfg.client_id.clone(),
            client_auth: auth_method(u.cfg.client_auth),
            token_endpoint,
            line,
        })
    }

    /// What `name` authenticates as: its issuer, client id and method.
    pub fn client_of(&self, name: &str) -> Option<(&str, &str, &'static str)> {
        let u = self.by_name.get(name)?;
        Some((
            &u.cfg.issuer,
            &u.cfg.client_id,
            auth_method(u.cfg.client_auth),
        ))
    }

    /// The token endpoint of `name` as this process resolved it (`None`:
    /// not configured, or its metadata could not be read).
    pub async fn resolved_token_endpoint(&self, name: &str) -> Option<String> {
        let u = self.by_name.get(name)?;
        u.resolve().await.ok().map(|r| r.token_endpoint.clone())
    }

    /// The grant `u` serves in a derive: leg 2 when an `id_jag` upstream
    /// names it as its `resource_upstream`.
    fn leg_of(&self, u: &Upstream) -> Leg {
        let second = self.by_name.values().any(|o| {
            matches!(&o.cfg.grant, UpstreamGrant::IdJag { resource_upstream } if *resource_upstream == u.cfg.name)
        });
        match (&u.cfg.grant, second) {
            (UpstreamGrant::IdJag { .. }, _) => Leg::IdJag,
            (UpstreamGrant::TokenExchange, true) => Leg::JwtBearer,
            (UpstreamGrant::TokenExchange, false) => Leg::Exchange,
        }
    }
}

/// What the `grant` check compared (`supports` passed): each member
/// either lists what the leg needs or is not advertised.
fn grant_detail(leg: Leg, a: &call::Advertised) -> String {
    let grant = match leg {
        Leg::JwtBearer => "jwt-bearer",
        _ => "token-exchange",
    };
    let said = |set: bool, what: &str| match set {
        true => format!("lists {what}"),
        false => "not advertised (not checked)".to_owned(),
    };
    let mut d = format!(
        "grant_types_supported {}",
        said(a.grant_types_advertised(), grant)
    );
    if matches!(leg, Leg::IdJag) {
        d.push_str(&format!(
            "; identity_chaining_requested_token_types_supported {}",
            said(a.id_jag_types_advertised(), "id-jag")
        ));
    }
    d
}

fn auth_method(a: UpstreamClientAuth) -> &'static str {
    match a {
        UpstreamClientAuth::SecretBasic => "client_secret_basic",
        UpstreamClientAuth::SecretPost => "client_secret_post",
        UpstreamClientAuth::PrivateKeyJwt => "private_key_jwt",
    }
}

/// One token request with the client's authentication as a derive sends
/// it, and a grant the AS must refuse: `invalid_client` (or a 401) fails
/// the check; another OAuth error passes it (the AS got past the client's
/// authentication); a token fails it loudly (the AS took something that is
/// no token).
async fn client_auth(u: &Upstream, token_endpoint: &str, leg: Leg, now: i64) -> CheckLine {
    const NAME: &str = "client_auth";
    if matches!(u.cfg.client_auth, UpstreamClientAuth::PrivateKeyJwt) && u.client.is_none() {
        return line(
            NAME,
            Outcome::Skip,
            "private_key_jwt: the client key is not loaded by this command (not checked)",
        );
    }
    let mut fields: Vec<(&'static str, String)> = match leg {
        Leg::JwtBearer => vec![
            ("grant_type", JWT_BEARER.into()),
            ("assertion", NOT_A_TOKEN.into()),
        ],
        _ => vec![
            ("grant_type", TOKEN_EXCHANGE.into()),
            ("subject_token", NOT_A_TOKEN.into()),
            (
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token".into(),
            ),
            (
                "requested_token_type",
                match leg {
                    Leg::IdJag => ID_JAG_TYPE,
                    _ => "urn:ietf:params:oauth:token-type:access_token",
                }
                .into(),
            ),
        ],
    };
    if call::credentials(u, now, &mut fields).is_err() {
        return line(
            NAME,
            Outcome::Fail,
            "the client's credentials could not be made",
        );
    }
    let mut body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields.iter())
        .finish();
    for (_, v) in fields.iter_mut() {
        zeroize::Zeroize::zeroize(v);
    }
    let mut req = u
        .http
        .post(token_endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("accept", "application/json");
    let mut auth = call::basic(u);
    if let Some(a) = &auth {
        req = req.header("authorization", a.as_str());
    }
    let sent = req.body(body.clone()).send().await;
    zeroize::Zeroize::zeroize(&mut body);
    if let Some(a) = auth.as_mut() {
        zeroize::Zeroize::zeroize(a);
    }
    let resp = match sent {
        Ok(r) => r,
        Err(_) => {
            return line(
                NAME,
                Outcome::Fail,
                "the token endpoint could not be reached",
            )
        }
    };
    let status = resp.status().as_u16();
    // Only `error` is read: a token in the answer (the AS took what is no
    // token) is never parsed out, and the bytes are zeroized.
    #[derive(serde::Deserialize)]
    struct ErrorOnly {
        #[serde(default)]
        error: Option<String>,
    }
    let code = match call::read_capped(resp).await {
        Ok(mut b) => {
            let c = serde_json::from_slice::<ErrorOnly>(&b)
                .ok()
                .and_then(|e| e.error)
                .map(|e| sanitize_code(&e));
            zeroize::Zeroize::zeroize(&mut b);
            c
        }
        Err(_) => None,
    };
    // The kid names which client key signed (public, as in the client JWKS).
    let method = match &u.client {
        Some(c) if matches!(u.cfg.client_auth, UpstreamClientAuth::PrivateKeyJwt) => {
            format!("private_key_jwt, client key {}", c.keys.active_kid())
        }
        _ => auth_method(u.cfg.client_auth).to_owned(),
    };
    verdict(status, code.as_deref(), &method)
}

/// What the AS's answer to the `client_auth` test shows (module doc).
fn verdict(status: u16, code: Option<&str>, method: &str) -> CheckLine {
    const NAME: &str = "client_auth";
    match (status, code) {
        (200, _) => line(
            NAME,
            Outcome::Fail,
            "the AS issued a token for a subject token that is no token: do not use it",
        ),
        (_, Some("invalid_client")) | (401, _) => line(
            NAME,
            Outcome::Fail,
            format!("the AS refused the client's authentication ({method}, HTTP {status}, invalid_client): check client_id and its credentials"),
        ),
        (_, Some(c @ ("unauthorized_client" | "unsupported_grant_type"))) => line(
            NAME,
            Outcome::Fail,
            format!("the AS authenticated the client but refuses it the grant ({c}): check the registration's grant types"),
        ),
        (400..=499, Some(c)) => line(
            NAME,
            Outcome::Ok,
            format!("{method} not refused: the AS answered {c} (HTTP {status}) to a request whose subject token is no token"),
        ),
        _ => line(
            NAME,
            Outcome::Fail,
            format!("the AS answered HTTP {status} without an OAuth error code"),
        ),
    }
}
