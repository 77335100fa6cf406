//! OpenID Connect relying party: signs people in at the organisation's IdP,
//! the same issuer whose access tokens the agent presents (the pairing in
//! `config::SignIn::Oidc`). The person is (`iss`, `sub`).
//!
//! - Discovery (`/.well-known/openid-configuration`), whose `issuer` must be
//!   the configured one exactly; endpoints must be https (http on loopback).
//! - Authorization code with PKCE S256, a single-use `state` bound to the
//!   browser session (see `flows`), and a `nonce`; `max_age=900` and
//!   `prompt=login` when the person must sign in again.
//! - RFC 9207: an `iss` on the callback must be the issuer; when the IdP
//!   says it always sends one, a callback without it is refused.
//! - The ID token is checked in the order of `jose`: size -> parts ->
//!   base64url -> header (`typ` absent or `JWT`, `alg` in the issuer's list
//!   and bound to the key) -> key (pinned JWKS, or the IdP's `jwks_uri`) ->
//!   signature -> typed claims -> `iss`, `aud` (and `azp`), `exp`, `iat`,
//!   `nonce` (constant time), `sub`, `auth_time`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::config::{IssuerConfig, JwksSource, SignIn};
use crate::jose::{self, Alg, Audience, JwkSet};
use crate::secret::SecretString;

/// ID tokens larger than this are refused before parsing.
pub const MAX_ID_TOKEN: usize = 16 * 1024;
/// Clock skew allowed on `exp`, `iat` and `auth_time`.
pub const SKEW: i64 = 30;
/// The re-authentication window of the connect pages (docs/DESIGN.md section 5).
pub const MAX_AGE: i64 = 900;
const DISCOVERY_TTL: Duration = Duration::from_secs(3600);
const JWKS_REFETCH_MIN: Duration = Duration::from_secs(60);
const MAX_RESPONSE: usize = 256 * 1024;

/// Why an OIDC sign-in failed. No token, code or secret in here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
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
}

/// Who signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `sub`.
    pub sub: String,
    /// A name to show: `preferred_username`, `email` or `name`, else `sub`.
    pub display: String,
    /// `auth_time`, when the IdP sent it.
    pub auth_time: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
struct Metadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    #[serde(default)]
    jwks_uri: Option<String>,
    #[serde(default)]
    authorization_response_iss_parameter_supported: bool,
}

struct Rp {
    issuer: String,
    client_id: String,
    secret_file: Option<PathBuf>,
    algs: Vec<Alg>,
    pinned: bool,
    meta: tokio::sync::Mutex<Option<(Arc<Metadata>, Instant)>>,
    keys: ArcSwap<JwkSet>,
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
}

/// The relying party for every OIDC sign-in issuer of the config.
pub struct Oidc {
    http: reqwest::Client,
    rps: HashMap<String, Rp>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuers", &self.rps.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn acceptable_url(s: &str) -> bool {
    url::Url::parse(s)
        .is_ok_and(|u| crate::config::secure_or_loopback(&u) && u.fragment().is_none())
}

impl Oidc {
    /// A relying party for each issuer paired with OIDC sign-in. Pinned JWKS
    /// files are read now (they were already checked at start-up).
    pub fn new(issuers: &[IssuerConfig]) -> Oidc {
        let mut rps = HashMap::new();
        for i in issuers {
            let SignIn::Oidc {
                client_id,
                client_secret_file,
            } = &i.sign_in
            else {
                continue;
            };
            let (pinned, keys) = match &i.jwks {
                JwksSource::File(p) => (
                    true,
                    std::fs::read(p)
                        .ok()
                        .and_then(|b| JwkSet::from_json(&b).ok())
                        .unwrap_or_default(),
                ),
                JwksSource::Uri(_) => (false, JwkSet::default()),
            };
            rps.insert(
                i.issuer.clone(),
                Rp {
                    issuer: i.issuer.clone(),
                    client_id: client_id.clone(),
                    secret_file: client_secret_file.clone(),
                    algs: i.algs.clone(),
                    pinned,
                    meta: tokio::sync::Mutex::new(None),
                    keys: ArcSwap::from_pointee(keys),
                    last_fetch: tokio::sync::Mutex::new(None),
                },
            );
        }
        Oidc {
            http: crate::subject::http_client(),
            rps,
        }
    }

    /// Whether `issuer` signs people in through OIDC here.
    pub fn has(&self, issuer: &str) -> bool {
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
        let url = format!(
            "{}/.well-known/openid-configuration",
            rp.issuer.trim_end_matches('/')
        );
        let body = self
            .get_bounded(&url)
            .await
            .ok_or(OidcError::Discovery("unreachable"))?;
        let m: Metadata = serde_json::from_slice(&body)
            .map_err(|_| OidcError::Discovery("not a discovery document"))?;
        if m.issuer != rp.issuer {
            return Err(OidcError::Discovery(
                "issuer differs from the configured one",
            ));
        }
        if !acceptable_url(&m.authorization_endpoint)
            || !acceptable_url(&m.token_endpoint)
            || m.jwks_uri.as_deref().is_some_and(|u| !acceptable_url(u))
        {
            return Err(OidcError::Discovery("an endpoint is not https"));
        }
        let m = Arc::new(m);
        *cached = Some((m.clone(), Instant::now()));
        Ok(m)
    }

    async fn get_bounded(&self, url: &str) -> Option<Vec<u8>> {
        let resp = self.http.get(url).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = resp.bytes().await.ok()?;
        (body.len() <= MAX_RESPONSE).then(|| body.to_vec())
    }

    /// The URL that starts a sign-in at `issuer`.
    #[allow(clippy::too_many_arguments)]
    pub async fn authorization_url(
        &self,
        issuer: &str,
        redirect_uri: &str,
        state: &SecretString,
        nonce: &SecretString,
        code_challenge: &str,
        reauth: bool,
    ) -> Result<url::Url, OidcError> {
        let rp = self.rp(issuer)?;
        let m = self.metadata(rp).await?;
        let mut u = url::Url::parse(&m.authorization_endpoint)
            .map_err(|_| OidcError::Discovery("authorization_endpoint"))?;
        {
            let mut q = u.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &rp.client_id)
                .append_pair("redirect_uri", redirect_uri)
                .append_pair("scope", "openid profile email")
                .append_pair("state", state.expose())
                .append_pair("nonce", nonce.expose())
                .append_pair("code_challenge", code_challenge)
                .append_pair("code_challenge_method", "S256");
            if reauth {
                q.append_pair("max_age", &MAX_AGE.to_string())
                    .append_pair("prompt", "login");
            }
        }
        Ok(u)
    }

    /// Checks the callback's `iss` parameter (RFC 9207).
    pub async fn check_callback_iss(
        &self,
        issuer: &str,
        iss: Option<&str>,
    ) -> Result<(), OidcError> {
        let rp = self.rp(issuer)?;
        let m = self.metadata(rp).await?;
        match iss {
            Some(i) if i == rp.issuer => Ok(()),
            Some(_) => Err(OidcError::CallbackIss),
            None if m.authorization_response_iss_parameter_supported => Err(OidcError::CallbackIss),
            None => Ok(()),
        }
    }

    /// Redeems an authorization code and validates the ID token.
    #[allow(clippy::too_many_arguments)]
    pub async fn redeem(
        &self,
        issuer: &str,
        code: &SecretString,
        verifier: &SecretString,
        redirect_uri: &str,
        nonce: &SecretString,
        reauth: bool,
        now: i64,
    ) -> Result<Identity, OidcError> {
        let rp = self.rp(issuer)?;
        let m = self.metadata(rp).await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code.expose().as_str()),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier.expose().as_str()),
        ];
        let secret = match &rp.secret_file {
            Some(p) => {
                let bytes = crate::config::read_secret_file(p).map_err(|_| OidcError::Secret)?;
                let s = String::from_utf8(bytes.expose().clone()).map_err(|_| OidcError::Secret)?;
                Some(SecretString::new(s.trim().to_string()))
            }
            None => None,
        };
        let mut req = self.http.post(&m.token_endpoint);
        match &secret {
            // client_secret_basic: both parts form-encoded first (RFC 6749
            // section 2.3.1).
            Some(s) => {
                let enc =
                    |v: &str| form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
                req = req.basic_auth(enc(&rp.client_id), Some(enc(s.expose())));
            }
            None => form.push(("client_id", rp.client_id.as_str())),
        }
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter())
            .finish();
        let resp = req
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|_| OidcError::Token("unreachable"))?;
        if !resp.status().is_success() {
            return Err(OidcError::Token("refused"));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|_| OidcError::Token("unreadable"))?;
        if bytes.len() > MAX_RESPONSE {
            return Err(OidcError::Token("too large"));
        }
        #[derive(Deserialize)]
        struct TokenResponse {
            id_token: String,
        }
        let tr: TokenResponse =
            serde_json::from_slice(&bytes).map_err(|_| OidcError::Token("no id_token"))?;
        let id_token = SecretString::new(tr.id_token);
        let check = Expected {
            issuer: &rp.issuer,
            client_id: &rp.client_id,
            algs: &rp.algs,
            nonce: nonce.expose(),
            reauth,
            now,
        };
        let jws = jose::parse(id_token.expose(), MAX_ID_TOKEN)
            .map_err(|_| OidcError::IdToken("malformed"))?;
        let alg = header_alg(&jws, &rp.algs)?;
        let kid = jws.header.kid.clone();
        let keys = rp.keys.load_full();
        let keys = if keys.select(kid.as_deref(), alg).is_some() || rp.pinned {
            keys
        } else {
            self.refetch(rp, m.jwks_uri.as_deref())
                .await
                .unwrap_or(keys)
        };
        validate_id_token(id_token.expose(), &keys, &check)
    }

    async fn refetch(&self, rp: &Rp, jwks_uri: Option<&str>) -> Option<Arc<JwkSet>> {
        let uri = jwks_uri?;
        let mut last = rp.last_fetch.lock().await;
        if last.is_some_and(|t| t.elapsed() < JWKS_REFETCH_MIN) {
            return None;
        }
        *last = Some(Instant::now());
        let body = self.get_bounded(uri).await?;
        let set = JwkSet::from_json(&body).ok()?;
        rp.keys.store(Arc::new(set));
        Some(rp.keys.load_full())
    }
}

/// What an ID token must say.
#[derive(Debug)]
pub struct Expected<'a> {
    /// `iss`.
    pub issuer: &'a str,
    /// Our client id: in `aud` (and `azp` when present).
    pub client_id: &'a str,
    /// Allowed `alg`s.
    pub algs: &'a [Alg],
    /// The `nonce` sent.
    pub nonce: &'a str,
    /// Whether `max_age` was sent: then `auth_time` is required and recent.
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
    match jws.header.typ.as_deref() {
        None => {}
        Some(t) if t.eq_ignore_ascii_case("JWT") || t.eq_ignore_ascii_case("application/jwt") => {}
        Some(_) => return Err(OidcError::IdToken("typ is not JWT")),
    }
    let alg = Alg::parse(&jws.header.alg).map_err(|_| OidcError::IdToken("alg"))?;
    if !algs.contains(&alg) {
        return Err(OidcError::IdToken("alg"));
    }
    Ok(alg)
}

/// Validates an ID token against `keys` (pure: no I/O, time injected).
pub fn validate_id_token(
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
    if e.reauth {
        // OIDC Core 3.1.2.1: with max_age, auth_time is required; and the
        // IdP must have signed the person in again within it.
        match c.auth_time {
            Some(t) if e.now - t <= MAX_AGE + SKEW => {}
            Some(_) => return Err(OidcError::IdToken("auth_time older than max_age")),
            None => return Err(OidcError::IdToken("auth_time missing")),
        }
    }
    let display = [c.preferred_username, c.email, c.name]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty() && s.len() <= 200 && !s.chars().any(char::is_control))
        .unwrap_or_else(|| c.sub.clone());
    Ok(Identity {
        sub: c.sub,
        display,
        auth_time: c.auth_time,
    })
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

    fn expect(reauth: bool) -> Expected<'static> {
        Expected {
            issuer: ISS,
            client_id: "credbroker",
            algs: &[Alg::ES256],
            nonce: "n0",
            reauth,
            now: NOW,
        }
    }

    fn with(f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> serde_json::Value {
        let mut v = good();
        f(v.as_object_mut().unwrap());
        v
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
        for (name, token, reauth) in cases {
            assert!(
                validate_id_token(&token, &keys, &expect(reauth)).is_err(),
                "{name} accepted"
            );
        }
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
