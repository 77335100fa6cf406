//! OpenID Connect relying party: signs people in at the organisation's IdP,
//! the same issuer whose access tokens the agent presents (the pairing in
//! `config::SignIn::Oidc`). The person is (`iss`, `sub`).
//!
//! - Discovery (`/.well-known/openid-configuration`), whose `issuer` must be
//!   the configured one exactly; endpoints must be https (http on loopback).
//! - Authorization code with PKCE S256, a single-use `state` bound to the
//!   browser session (see `flows`), and a `nonce`; `max_age=900` on every
//!   sign-in that leads to a link (the link's page needs a recent
//!   `auth_time`, docs/DESIGN.md section 5), and `prompt=login` too when the
//!   person must sign in again. Once `max_age` is sent, `auth_time` is
//!   required (OpenID Connect Core 3.1.2.1): an ID token without it is an
//!   IdP error ([`OidcError::NoAuthTime`]), never a second sign-in.
//! - RFC 9207: an `iss` on the callback must be the issuer; when the IdP
//!   says it always sends one, a callback without it is refused.
//! - The ID token is checked in the order of `jose`: size -> parts ->
//!   base64url -> header (`typ` absent or `JWT`, `alg` in the issuer's list
//!   and bound to the key) -> key (the issuer's key set, shared with the subject-token validator) ->
//!   signature -> typed claims -> `iss`, `aud` (and `azp`), `exp`, `iat`,
//!   `nonce` (constant time), `sub`, `auth_time`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::base::jose::{self, Alg, Audience, JwkSet};
use crate::base::keyset::{self, Refetch, RemoteKeySet};
use crate::base::oauth::{self, Metadata};
use crate::base::secret::SecretString;
use crate::infra::config::{IssuerConfig, JwksSource, SignIn};

/// ID tokens larger than this are refused before parsing.
pub(crate) const MAX_ID_TOKEN: usize = 16 * 1024;
/// Clock skew allowed on `exp`, `iat` and `auth_time`.
pub(crate) const SKEW: i64 = 30;
/// The re-authentication window of the connect pages (docs/DESIGN.md section 5).
pub(crate) const MAX_AGE: i64 = 900;
const DISCOVERY_TTL: Duration = Duration::from_secs(3600);
const MAX_RESPONSE: usize = oauth::MAX_ANSWER;

/// Why an OIDC sign-in failed. No token, code or secret in here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OidcError {
    /// The issuer is not an OIDC sign-in source of this instance.
    #[error("not an OIDC sign-in issuer")]
    UnknownIssuer,
    /// Discovery failed or the document is unacceptable.
    #[error("discovery failed: {0}")]
    Discovery(&'static str),
    /// The IdP's callback `iss` is wrong or missing (RFC 9207).
    #[error("the callback's iss does not name the issuer")]
    CallbackIss,
    /// The token endpoint failed or refused.
    #[error("token request failed: {0}")]
    Token(&'static str),
    /// The client secret file could not be read.
    #[error("client secret file unreadable")]
    Secret,
    /// The ID token is not acceptable.
    #[error("ID token refused: {0}")]
    IdToken(&'static str),
    /// `max_age` was sent, and the ID token has no `auth_time` (OpenID
    /// Connect Core 3.1.2.1 makes it required then): the IdP, or its client
    /// registration, does not honour `max_age`.
    #[error("ID token refused: max_age was sent and auth_time is missing")]
    NoAuthTime,
}

/// Who signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// `sub`.
    pub sub: String,
    /// A name to show: `preferred_username`, `email` or `name`, else `sub`.
    pub display: String,
    /// `auth_time`, when the IdP sent it.
    pub auth_time: Option<i64>,
}

struct Rp {
    issuer: String,
    client_id: String,
    secret_file: Option<PathBuf>,
    algs: Vec<Alg>,
    meta: tokio::sync::Mutex<Option<(Arc<Metadata>, Instant)>>,
    /// The issuer's key set, shared with the subject-token validator when
    /// the wiring hands it over.
    keys: Arc<RemoteKeySet>,
}

/// The relying party for every OIDC sign-in issuer of the config.
pub(crate) struct Oidc {
    client: oauth::Client,
    rps: HashMap<String, Rp>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuers", &self.rps.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// A relying party for each issuer paired with OIDC sign-in. Its keys
    /// are the issuer's set in `key_sets` (the one the subject-token
    /// validator uses); an issuer missing there gets a set of its own:
    /// pinned JWKS files are read now (they were already checked at
    /// start-up), JWKS URIs on first use.
    pub(crate) fn new(
        issuers: &[IssuerConfig],
        key_sets: &HashMap<String, Arc<RemoteKeySet>>,
    ) -> Oidc {
        let http = keyset::http_client();
        let mut rps = HashMap::new();
        for i in issuers {
            let SignIn::Oidc {
                client_id,
                client_secret_file,
            } = &i.sign_in
            else {
                continue;
            };
            let keys = match (key_sets.get(&i.issuer), &i.jwks) {
                (Some(shared), _) => shared.clone(),
                (None, JwksSource::File(p)) => Arc::new(RemoteKeySet::pinned(
                    std::fs::read(p)
                        .ok()
                        .and_then(|b| JwkSet::from_json(&b).ok())
                        .unwrap_or_default(),
                )),
                (None, JwksSource::Uri(u)) => {
                    Arc::new(RemoteKeySet::remote(u, MAX_RESPONSE, http.clone()))
                }
            };
            rps.insert(
                i.issuer.clone(),
                Rp {
                    issuer: i.issuer.clone(),
                    client_id: client_id.clone(),
                    secret_file: client_secret_file.clone(),
                    algs: i.algs.clone(),
                    meta: tokio::sync::Mutex::new(None),
                    keys,
                },
            );
        }
        Oidc {
            client: oauth::Client::new(http),
            rps,
        }
    }

    /// Whether `issuer` signs people in through OIDC here.
    pub(crate) fn has(&self, issuer: &str) -> bool {
        self.rps.contains_key(issuer)
    }

    fn rp(&self, issuer: &str) -> Result<&Rp, OidcError> {
        self.rps.get(issuer).ok_or(OidcError::UnknownIssuer)
    }

    async fn metadata(&self, rp: &Rp) -> Result<Arc<Metadata>, OidcError> {
        let mut cached = rp.meta.lock().await;
        if let Some((m, at)) = cached.as_ref() {
            if at.elapsed() < DISCOVERY_TTL {
                return Ok(m.clone());
            }
        }
        // Only the nonce's presence matters to discovery (an OpenID
        // Provider: openid-configuration only).
        let m = self
            .client
            .discover(&rp.issuer, oauth::Use::SignIn { nonce: "" })
            .await
            .map_err(|e| match e {
                oauth::OAuthError::Config(_) => OidcError::Discovery(
                    "issuer differs from the configured one, or an endpoint is not https",
                ),
                oauth::OAuthError::Unavailable(_) | oauth::OAuthError::Rejected { .. } => {
                    OidcError::Discovery("unreachable or not a discovery document")
                }
            })?;
        let m = Arc::new(m);
        *cached = Some((m.clone(), Instant::now()));
        Ok(m)
    }

    /// The URL that starts a sign-in at `issuer`.
    // reason: the sign-in's own values (state, nonce, PKCE challenge) are
    // secrets passed one by one so none is stored longer than the call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn authorization_url(
        &self,
        issuer: &str,
        redirect_uri: &str,
        state: &SecretString,
        nonce: &SecretString,
        code_challenge: &str,
        max_age: bool,
        reauth: bool,
    ) -> Result<url::Url, OidcError> {
        let rp = self.rp(issuer)?;
        let m = self.metadata(rp).await?;
        let age = MAX_AGE.to_string();
        let with_max_age = [("max_age", age.as_str())];
        let reauth_params = [("max_age", age.as_str()), ("prompt", "login")];
        let extra: &[(&str, &str)] = if reauth {
            &reauth_params
        } else if max_age {
            &with_max_age
        } else {
            &[]
        };
        oauth::authorization_url(
            &m.authorization,
            oauth::Use::SignIn {
                nonce: nonce.expose(),
            },
            &oauth::AuthorizationParams {
                client_id: &rp.client_id,
                redirect_uri,
                scope: "openid profile email",
                state: state.expose(),
                code_challenge,
                extra,
            },
        )
        .map_err(|_| OidcError::Discovery("authorization_endpoint"))
    }

    /// Checks the callback's `iss` parameter (RFC 9207).
    pub(crate) async fn check_callback_iss(
        &self,
        issuer: &str,
        iss: Option<&str>,
    ) -> Result<(), OidcError> {
        let rp = self.rp(issuer)?;
        let m = self.metadata(rp).await?;
        oauth::check_callback_iss(Some(&rp.issuer), m.sends_iss, iss)
            .map_err(|_| OidcError::CallbackIss)
    }

    /// Redeems an authorization code and validates the ID token.
    // reason: the same secrets as `authorization_url`, plus the code and the
    // time of the check; passed one by one for the same reason.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn redeem(
        &self,
        issuer: &str,
        code: &SecretString,
        verifier: &SecretString,
        redirect_uri: &str,
        nonce: &SecretString,
        max_age_sent: bool,
        reauth: bool,
        now: i64,
    ) -> Result<Identity, OidcError> {
        let rp = self.rp(issuer)?;
        let m = self.metadata(rp).await?;
        let secret = match &rp.secret_file {
            Some(p) => {
                let bytes =
                    crate::infra::config::read_secret_file(p).map_err(|_| OidcError::Secret)?;
                let s = String::from_utf8(bytes.expose().clone()).map_err(|_| OidcError::Secret)?;
                Some(SecretString::new(s.trim().to_string()))
            }
            None => None,
        };
        let auth = match &secret {
            Some(s) => oauth::ClientAuth::Basic {
                id: &rp.client_id,
                secret: s.expose(),
            },
            None => oauth::ClientAuth::Post {
                id: &rp.client_id,
                secret: None,
            },
        };
        let answer = self
            .client
            .exchange_code(
                &m.token,
                auth,
                code.expose(),
                verifier.expose(),
                redirect_uri,
                oauth::Use::SignIn {
                    nonce: nonce.expose(),
                },
            )
            .await
            .map_err(|e| match e {
                oauth::OAuthError::Rejected { .. } => OidcError::Token("refused"),
                _ => OidcError::Token("unreachable, unreadable or no id_token"),
            })?;
        let oauth::CodeAnswer::IdToken(id_token) = answer else {
            // The sign-in rules give only an ID token answer.
            return Err(OidcError::Token("no id_token"));
        };
        let check = Expected {
            issuer: &rp.issuer,
            client_id: &rp.client_id,
            algs: &rp.algs,
            nonce: nonce.expose(),
            max_age_sent,
            reauth,
            now,
        };
        let jws = jose::parse(id_token.expose(), MAX_ID_TOKEN)
            .map_err(|_| OidcError::IdToken("malformed"))?;
        let alg = header_alg(&jws, &rp.algs)?;
        let kid = jws.header.kid.clone();
        let keys = rp.keys.keys();
        let keys = if keys.select(kid.as_deref(), alg).is_some() {
            keys
        } else {
            // An unknown kid: the IdP may have rotated. The key set throttles
            // refetches; a pinned set is never fetched.
            match rp.keys.refetch(now).await {
                Ok(Refetch::Fetched(fresh) | Refetch::Throttled(fresh)) => fresh,
                _ => keys,
            }
        };
        validate_id_token(id_token.expose(), &keys, &check)
    }
}

/// What an ID token must say.
#[derive(Debug)]
pub(crate) struct Expected<'a> {
    /// `iss`.
    pub issuer: &'a str,
    /// Our client id: in `aud` (and `azp` when present).
    pub client_id: &'a str,
    /// Allowed `alg`s.
    pub algs: &'a [Alg],
    /// The `nonce` sent.
    pub nonce: &'a str,
    /// Whether `max_age` was sent: then `auth_time` is required (OpenID
    /// Connect Core 3.1.2.1).
    pub max_age_sent: bool,
    /// Whether the person was asked to sign in again (`prompt=login`): then
    /// `auth_time` must also be within `max_age`. Without it, an older
    /// `auth_time` still signs the person in, and the link's own 15-minute
    /// check sends them to sign in again with `prompt=login`.
    pub reauth: bool,
    /// Now.
    pub now: i64,
}

#[derive(Deserialize)]
struct IdClaims {
    iss: String,
    sub: String,
    aud: Audience,
    #[serde(deserialize_with = "jose::numeric_date")]
    exp: i64,
    #[serde(deserialize_with = "jose::numeric_date")]
    iat: i64,
    nonce: String,
    #[serde(default, deserialize_with = "jose::opt_numeric_date")]
    auth_time: Option<i64>,
    #[serde(default)]
    azp: Option<String>,
    #[serde(default)]
    preferred_username: Option<String>,
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

fn header_alg(jws: &jose::Jws<'_>, algs: &[Alg]) -> Result<Alg, OidcError> {
    // ID tokens are plain JWTs; anything typed as another kind of token
    // (an access token, a DPoP proof, a logout token) is not one.
    jose::check_header(
        &jws.header,
        &jose::HeaderRule {
            typ: jose::TypRule::MediaTypes {
                allowed: &["JWT"],
                absent_ok: true,
            },
            algs,
        },
    )
    .map_err(|e| match e {
        jose::HeaderError::Typ => OidcError::IdToken("typ is not JWT"),
        jose::HeaderError::Alg => OidcError::IdToken("alg"),
    })
}

/// Validates an ID token against `keys` (pure: no I/O, time injected).
pub(crate) fn validate_id_token(
    token: &str,
    keys: &JwkSet,
    e: &Expected<'_>,
) -> Result<Identity, OidcError> {
    let jws = jose::parse(token, MAX_ID_TOKEN).map_err(|_| OidcError::IdToken("malformed"))?;
    let alg = header_alg(&jws, e.algs)?;
    let key = keys
        .select(jws.header.kid.as_deref(), alg)
        .ok_or(OidcError::IdToken("no key"))?;
    key.verify(alg, &jws)
        .map_err(|_| OidcError::IdToken("signature"))?;
    let c: IdClaims =
        serde_json::from_slice(&jws.payload).map_err(|_| OidcError::IdToken("claims"))?;
    if c.iss != e.issuer {
        return Err(OidcError::IdToken("iss"));
    }
    if !c.aud.contains(e.client_id) {
        return Err(OidcError::IdToken("aud"));
    }
    let several = matches!(&c.aud, Audience::Many(v) if v.len() > 1);
    match &c.azp {
        Some(azp) if azp != e.client_id => return Err(OidcError::IdToken("azp")),
        None if several => return Err(OidcError::IdToken("azp")),
        _ => {}
    }
    if c.exp + SKEW <= e.now {
        return Err(OidcError::IdToken("expired"));
    }
    if c.iat - SKEW > e.now {
        return Err(OidcError::IdToken("issued in the future"));
    }
    if !bool::from(c.nonce.as_bytes().ct_eq(e.nonce.as_bytes())) {
        return Err(OidcError::IdToken("nonce"));
    }
    if c.sub.is_empty() {
        return Err(OidcError::IdToken("sub"));
    }
    if let Some(t) = c.auth_time {
        if t - SKEW > e.now {
            return Err(OidcError::IdToken("auth_time in the future"));
        }
    }
    if e.max_age_sent || e.reauth {
        // OIDC Core 3.1.2.1: with max_age, auth_time is required; and after
        // prompt=login the IdP must have signed the person in again.
        match c.auth_time {
            Some(t) if !e.reauth || e.now - t <= MAX_AGE + SKEW => {}
            Some(_) => return Err(OidcError::IdToken("auth_time older than max_age")),
            None => return Err(OidcError::NoAuthTime),
        }
    }
    let display = [c.preferred_username, c.email, c.name]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty() && s.len() <= DISPLAY_MAX && !s.chars().any(char::is_control))
        .unwrap_or_else(|| shown_sub(&c.sub));
    Ok(Identity {
        sub: c.sub,
        display,
        auth_time: c.auth_time,
    })
}

/// The longest name claim shown as the person's display name, in bytes.
const DISPLAY_MAX: usize = 200;

/// The `sub` as a display name, when no name claim is usable: as it is,
/// unless it holds a control character (OIDC Core allows any string up to
/// 255 ASCII characters, and some IdPs go further). Then each control
/// character becomes U+FFFD and the name is cut at [`DISPLAY_MAX`] bytes,
/// so that no page or log line shows a raw control character from an IdP.
/// The `sub` itself, which identifies the person, is kept unchanged.
fn shown_sub(sub: &str) -> String {
    if !sub.chars().any(char::is_control) {
        return sub.to_owned();
    }
    let mut shown = String::new();
    for ch in sub.chars() {
        let ch = if ch.is_control() { '\u{FFFD}' } else { ch };
        if shown.len() + ch.len_utf8() > DISPLAY_MAX {
            break;
        }
        shown.push(ch);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ISS: &str = "https://idp.example";
    const NOW: i64 = 1_800_000_000;

    fn setup() -> (jose::Es256Key, JwkSet) {
        let (k, _) = jose::Es256Key::generate().unwrap();
        let set =
            JwkSet::from_json(json!({"keys": [k.public_jwk]}).to_string().as_bytes()).unwrap();
        (k, set)
    }

    fn good() -> serde_json::Value {
        json!({"iss": ISS, "sub": "u-123", "aud": "credbroker", "exp": NOW + 300, "iat": NOW,
               "nonce": "n0", "auth_time": NOW - 60, "preferred_username": "alice"})
    }

    fn sign(k: &jose::Es256Key, header: serde_json::Value, claims: &serde_json::Value) -> String {
        let mut h = header.as_object().cloned().unwrap_or_default();
        h.entry("kid").or_insert_with(|| k.kid.clone().into());
        k.sign_jws(h, claims).unwrap()
    }

    fn expect(max_age_sent: bool) -> Expected<'static> {
        Expected {
            issuer: ISS,
            client_id: "credbroker",
            algs: &[Alg::ES256],
            nonce: "n0",
            max_age_sent,
            reauth: max_age_sent,
            now: NOW,
        }
    }

    fn with(f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> serde_json::Value {
        let mut v = good();
        f(v.as_object_mut().unwrap());
        v
    }

    #[test]
    fn an_idp_that_is_issuer_and_sign_in_source_has_one_key_cache() {
        let cfg = |issuer: &str| IssuerConfig {
            issuer: issuer.into(),
            audience: "agent".into(),
            jwks: JwksSource::Uri(format!("{issuer}/jwks")),
            algs: vec![Alg::ES256],
            token_types: vec!["at+jwt".into()],
            required_claims: vec![],
            sign_in: SignIn::Oidc {
                client_id: "credbroker".into(),
                client_secret_file: None,
            },
            display_name: "IdP".into(),
            introspection: None,
        };
        let shared = Arc::new(RemoteKeySet::remote(
            &format!("{ISS}/jwks"),
            keyset::MAX_ISSUER_JWKS,
            keyset::http_client(),
        ));
        let sets = HashMap::from([(ISS.to_string(), shared.clone())]);
        let oidc = Oidc::new(&[cfg(ISS), cfg("https://other.example")], &sets);
        assert!(Arc::ptr_eq(&oidc.rps[ISS].keys, &shared));
        // Positive control: an issuer the wiring did not hand over gets a
        // set of its own.
        assert!(!Arc::ptr_eq(
            &oidc.rps["https://other.example"].keys,
            &shared
        ));
    }

    /// Found by the `id_token` fuzz target: with no usable name claim the
    /// display name was the raw `sub`, control characters and all.
    #[test]
    fn display_name_from_a_sub_with_control_characters_has_none() {
        let (k, keys) = setup();
        let name = |sub: &str| {
            let claims = with(|m| {
                m.remove("preferred_username");
                m.insert("sub".into(), sub.into());
            });
            let id =
                validate_id_token(&sign(&k, json!({}), &claims), &keys, &expect(false)).unwrap();
            assert_eq!(id.sub, sub, "the sub itself is kept");
            id.display
        };
        let long = format!("u-{}\u{7f}{}", "5".repeat(150), "L".repeat(150));
        for sub in ["u-1\u{7f}23", "\u{1b}[31mred", long.as_str()] {
            let shown = name(sub);
            assert!(!shown.is_empty() && shown.len() <= DISPLAY_MAX, "{shown:?}");
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
        assert_eq!(name("u-1\u{7f}23"), "u-1\u{FFFD}23");
        // Positive control: a clean sub, however long, is shown as it is.
        let clean = "u-".to_string() + &"5".repeat(300);
        assert_eq!(name(&clean), clean);
        assert_eq!(name("u-123"), "u-123");
    }

    #[test]
    fn id_token_checks() {
        let (k, keys) = setup();
        let (other, _) = jose::Es256Key::generate().unwrap();
        let ok = sign(&k, json!({"typ": "JWT"}), &good());
        let id = validate_id_token(&ok, &keys, &expect(true)).unwrap();
        assert_eq!(id.sub, "u-123");
        assert_eq!(id.display, "alice");
        assert_eq!(id.auth_time, Some(NOW - 60));

        let cases: Vec<(&str, String, bool)> = vec![
            (
                "wrong nonce",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("nonce".into(), "n1".into());
                    }),
                ),
                false,
            ),
            (
                "no nonce",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.remove("nonce");
                    }),
                ),
                false,
            ),
            (
                "wrong iss",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("iss".into(), "https://evil.example".into());
                    }),
                ),
                false,
            ),
            (
                "wrong aud",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("aud".into(), "other-client".into());
                    }),
                ),
                false,
            ),
            (
                "aud as object",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("aud".into(), json!({"a": 1}));
                    }),
                ),
                false,
            ),
            (
                "several aud, no azp",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("aud".into(), json!(["credbroker", "x"]));
                    }),
                ),
                false,
            ),
            (
                "azp of another client",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("azp".into(), "x".into());
                    }),
                ),
                false,
            ),
            (
                "expired",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("exp".into(), (NOW - 31).into());
                    }),
                ),
                false,
            ),
            (
                "exp as string",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("exp".into(), "9999999999".into());
                    }),
                ),
                false,
            ),
            (
                "iat in the future",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("iat".into(), (NOW + 120).into());
                    }),
                ),
                false,
            ),
            (
                "empty sub",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("sub".into(), "".into());
                    }),
                ),
                false,
            ),
            (
                "sub as number",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("sub".into(), 5.into());
                    }),
                ),
                false,
            ),
            (
                "auth_time missing with max_age",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.remove("auth_time");
                    }),
                ),
                true,
            ),
            (
                "auth_time 16 min old with max_age",
                sign(
                    &k,
                    json!({}),
                    &with(|m| {
                        m.insert("auth_time".into(), (NOW - 16 * 60).into());
                    }),
                ),
                true,
            ),
            (
                "typ at+jwt",
                sign(&k, json!({"typ": "at+jwt"}), &good()),
                false,
            ),
            (
                "typ dpop+jwt",
                sign(&k, json!({"typ": "dpop+jwt"}), &good()),
                false,
            ),
            (
                "signed by another key",
                sign(&other, json!({"kid": k.kid.clone()}), &good()),
                false,
            ),
        ];
        // Each case is refused by its own check, not by whichever comes
        // first.
        let reason = |name: &str| match name {
            "wrong nonce" => "nonce",
            "no nonce" | "aud as object" | "exp as string" | "sub as number" => "claims",
            "wrong iss" => "iss",
            "wrong aud" => "aud",
            "several aud, no azp" | "azp of another client" => "azp",
            "expired" => "expired",
            "iat in the future" => "issued in the future",
            "empty sub" => "sub",
            "auth_time 16 min old with max_age" => "auth_time older than max_age",
            "typ at+jwt" | "typ dpop+jwt" => "typ is not JWT",
            "signed by another key" => "signature",
            other => panic!("no expected reason for {other}"),
        };
        let n = cases.len();
        for (name, token, reauth) in cases {
            // A missing `auth_time` after `max_age` was sent has its own
            // error (the person sees an IdP error, not a sign-in loop).
            let want = if name == "auth_time missing with max_age" {
                OidcError::NoAuthTime
            } else {
                OidcError::IdToken(reason(name))
            };
            assert_eq!(
                validate_id_token(&token, &keys, &expect(reauth)).err(),
                Some(want),
                "{name}"
            );
        }
        assert_eq!(n, 17, "every case ran");
        // alg none and HS256 keyed with the public key: the good token's
        // header (typ JWT, the key's kid) with only `alg` changed, so the
        // refusal can only come from the alg check.
        let (good_header, _) = ok.split_once('.').unwrap();
        let mut header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&jose::b64d(good_header, "header").unwrap()).unwrap();
        assert_eq!(header["typ"], "JWT");
        assert_eq!(header["kid"], json!(k.kid));
        let assemble = |header: &serde_json::Map<String, serde_json::Value>,
                        sign: &dyn Fn(&[u8]) -> Vec<u8>| {
            let input = format!(
                "{}.{}",
                jose::b64e(&serde_json::to_vec(header).unwrap()),
                jose::b64e(&serde_json::to_vec(&good()).unwrap())
            );
            let sig = sign(input.as_bytes());
            format!("{input}.{}", jose::b64e(&sig))
        };
        let es256 = |m: &[u8]| k.sign_raw(m).unwrap();
        // Positive control of the assembly: alg ES256 is accepted.
        let same = assemble(&header, &es256);
        assert_eq!(
            validate_id_token(&same, &keys, &expect(true)).unwrap().sub,
            "u-123"
        );
        header.insert("alg".into(), json!("none"));
        // With the key's real ES256 signature (a validator that fell back to
        // the key's own algorithm would accept it)...
        assert_eq!(
            validate_id_token(&assemble(&header, &es256), &keys, &expect(true)).err(),
            Some(OidcError::IdToken("alg")),
            "alg none, signed"
        );
        // ...and unsigned: the empty third part is refused as malformed.
        assert_eq!(
            validate_id_token(&assemble(&header, &|_| Vec::new()), &keys, &expect(true)).err(),
            Some(OidcError::IdToken("malformed")),
            "alg none, unsigned"
        );
        // A real HMAC keyed with the public key, as an attacker holding the
        // JWKS would make it.
        header.insert("alg".into(), json!("HS256"));
        let published = serde_json::to_vec(&json!({"keys": [k.public_jwk]})).unwrap();
        for secret in [serde_json::to_vec(&k.public_jwk).unwrap(), published] {
            let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &secret);
            let hs = assemble(&header, &|m| {
                aws_lc_rs::hmac::sign(&key, m).as_ref().to_vec()
            });
            assert_eq!(
                validate_id_token(&hs, &keys, &expect(true)).err(),
                Some(OidcError::IdToken("alg")),
                "HS256 keyed with {}",
                String::from_utf8_lossy(&secret)
            );
        }
        // Without max_age, a missing auth_time is accepted (the session then
        // counts as not recently signed in).
        let no_at = sign(
            &k,
            json!({}),
            &with(|m| {
                m.remove("auth_time");
            }),
        );
        assert_eq!(
            validate_id_token(&no_at, &keys, &expect(false))
                .unwrap()
                .auth_time,
            None
        );
        // Positive control after the refusals.
        assert!(validate_id_token(&ok, &keys, &expect(true)).is_ok());
    }
}
