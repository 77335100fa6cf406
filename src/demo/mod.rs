//! The quick start's built-in demo service: a stand-in for a third-party
//! service such as GitHub, so that a newcomer can see a connect link work
//! without registering an OAuth app anywhere. **A demo, not a provider**:
//! `credbroker quickstart` alone runs it, on loopback, and `credbroker
//! serve` refuses a config that names it (`preset = "quickstart-demo"`).
//!
//! It has two parts on one listener:
//! - an OAuth 2.0 authorization server (RFC 6749 code flow): `/authorize`
//!   shows a plain page where the person picks one of two demo accounts and
//!   allows or denies; `/token` exchanges a code (single use, 60 s, PKCE
//!   S256 required, RFC 7636 section 4.6) and a refresh token; `/revoke`
//!   (RFC 7009) revokes a token's whole grant, its access and refresh
//!   tokens alike (section 2.1); `/jwks` publishes its signing key;
//! - a demo API under a configurable base URL (`api_base`, also the
//!   audience of its access tokens, so a proxy can sit in front of it):
//!   `GET {api_base}/me` (the account, for the broker's account look-up)
//!   and `GET {api_base}/notes` (scope `notes:read`). It accepts only
//!   access tokens it signed itself, for its own audience, unexpired.
//!
//! Tokens are ES256 JWTs signed with the demo's own key (kept in the quick
//! start's directory), so they survive a restart of the quick start and
//! any JOSE library can read them. Codes live in memory; revoked grants
//! are kept in a file of the quick start's directory (one id a line), so
//! a revocation survives a restart too. Nothing is logged but fixed words
//! and the demo account's name.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::base::clock::SharedClock;
use crate::base::http::{json_response, read_capped, Body};
use crate::base::jose::{Alg, Es256Key, HeaderRule, TypRule};

/// The demo's two accounts: (id, login, what the page shows).
pub(crate) const ACCOUNTS: [(&str, &str, &str); 2] = [
    ("1001", "alice.demo", "Alice's demo account"),
    ("1002", "bob.demo", "Bob's demo account"),
];

/// The scope of the demo API's notes.
pub(crate) const NOTES_SCOPE: &str = "notes:read";

/// The lifetime of an access token (seconds).
const ACCESS_TTL: i64 = 600;
/// The lifetime of a refresh token (seconds).
const REFRESH_TTL: i64 = 30 * 86_400;
/// The lifetime of an authorization code (seconds).
const CODE_TTL: i64 = 60;
/// Open codes kept at most (older ones are dropped first).
const MAX_CODES: usize = 1000;
/// Largest request body read.
const MAX_BODY: usize = 16 * 1024;
/// The access token's `typ` (RFC 9068).
const ACCESS_TYP: &str = "at+jwt";
/// The refresh token's `typ` (the demo's own).
const REFRESH_TYP: &str = "demo-rt+jwt";

/// What the demo service is set up with.
#[derive(Debug)]
pub(crate) struct DemoOptions {
    /// Its issuer URL (`http://127.0.0.1:PORT`): `iss` of its tokens and the
    /// base of its OAuth endpoints.
    pub issuer: String,
    /// The base URL of its API (the audience of its access tokens); its
    /// path is where the API is served on this listener.
    pub api_base: String,
    /// The one OAuth client it knows (the broker).
    pub client_id: String,
    /// That client's one redirect URI, compared exactly.
    pub redirect_uri: String,
    /// Its signing key.
    pub key: Es256Key,
    /// Where revoked grants are kept, one id a line (`None`: in memory
    /// only).
    pub revoked_file: Option<PathBuf>,
}

/// An authorization code waiting for its exchange.
struct Pending {
    account: usize,
    scope: String,
    challenge: String,
    expires: i64,
}

/// The running demo service's state.
pub(crate) struct Demo {
    opts: DemoOptions,
    api_path: String,
    clock: SharedClock,
    codes: Mutex<HashMap<String, Pending>>,
    /// The ids of revoked grants.
    revoked: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo")
            .field("issuer", &self.opts.issuer)
            .finish_non_exhaustive()
    }
}

/// Why the demo service could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
    /// `api_base` is not an http URL under the issuer.
    #[error("the demo API base {0} is not an http URL on the demo service's own address")]
    ApiBase(String),
    /// The file of revoked grants cannot be read.
    #[error("the demo service's revoked grants, {0}: {1}")]
    Revoked(String, std::io::Error),
}

impl Demo {
    /// The demo service with these options.
    pub(crate) fn new(opts: DemoOptions, clock: SharedClock) -> Result<Arc<Demo>, DemoError> {
        let api_path = match (
            url::Url::parse(&opts.api_base),
            url::Url::parse(&opts.issuer),
        ) {
            (Ok(a), Ok(i)) if a.origin() == i.origin() && a.query().is_none() => {
                a.path().trim_end_matches('/').to_string()
            }
            _ => return Err(DemoError::ApiBase(opts.api_base.clone())),
        };
        if api_path.is_empty()
            || ["/authorize", "/token", "/revoke", "/jwks"].contains(&api_path.as_str())
        {
            return Err(DemoError::ApiBase(opts.api_base.clone()));
        }
        let revoked = match &opts.revoked_file {
            None => HashSet::new(),
            Some(f) => match std::fs::read_to_string(f) {
                Ok(text) => text.lines().map(str::to_string).collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
                Err(e) => return Err(DemoError::Revoked(f.display().to_string(), e)),
            },
        };
        Ok(Arc::new(Demo {
            opts,
            api_path,
            clock,
            codes: Mutex::new(HashMap::new()),
            revoked: Mutex::new(revoked),
        }))
    }

    /// Its issuer URL.
    pub(crate) fn issuer(&self) -> &str {
        &self.opts.issuer
    }

    /// Answers one request.
    pub(crate) async fn handle<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body + Send,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or("").to_string();
        let form = if parts.method == Method::POST {
            match read_capped(&parts.headers, body, MAX_BODY).await {
                Ok(b) => pairs(&String::from_utf8_lossy(&b)),
                Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large"),
            }
        } else {
            HashMap::new()
        };
        let api = path
            .strip_prefix(&self.api_path)
            .filter(|rest| rest.starts_with('/'));
        match (&parts.method, path.as_str(), api) {
            (&Method::GET, "/", _) => self.home(),
            (&Method::GET, "/authorize", _) => self.authorize_page(&pairs(&query)),
            (&Method::POST, "/authorize", _) => self.authorize_decision(&parts.headers, &form),
            (&Method::POST, "/token", _) => self.token(&form),
            (&Method::POST, "/revoke", _) => self.revoke(&form),
            (&Method::GET, "/jwks", _) => json_response(
                StatusCode::OK,
                &json!({"keys": [self.opts.key.public_jwk.clone()]}),
            ),
            (&Method::GET, _, Some("/me")) => self.api(&parts.headers, None, |a| {
                json!({"id": ACCOUNTS[a].0, "login": ACCOUNTS[a].1, "demo": true})
            }),
            (&Method::GET, _, Some("/notes")) => {
                self.api(&parts.headers, Some(NOTES_SCOPE), |a| {
                    json!({
                        "demo": true,
                        "account": ACCOUNTS[a].1,
                        "notes": [format!("A note in {}, from the credbroker demo service", ACCOUNTS[a].2)],
                    })
                })
            }
            _ => plain(StatusCode::NOT_FOUND, "not found on the demo service"),
        }
    }

    fn home(&self) -> Response<Body> {
        page(
            StatusCode::OK,
            "<p>This is the demo service that <code>credbroker quickstart</code> runs: \
             a stand-in for a real service such as GitHub, to try connect links with. \
             Its accounts, tokens and notes are made up.</p>",
            None,
        )
    }

    /// Checks an authorization request; on success returns the fields the
    /// page carries forward, else what the page says (a bad client or
    /// redirect URI is never redirected to, RFC 6749 section 4.1.2.1).
    fn check_request<'a>(
        &self,
        q: &'a HashMap<String, String>,
    ) -> Result<[(&'static str, &'a str); 7], &'static str> {
        let get = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
        if get("client_id") != self.opts.client_id || get("redirect_uri") != self.opts.redirect_uri
        {
            return Err(
                "<p>This request is not from the credbroker of this quick start \
                 (unknown client or redirect URI). Nothing was done.</p>",
            );
        }
        if get("response_type") != "code"
            || get("code_challenge_method") != "S256"
            || get("code_challenge").len() != 43
            || get("state").is_empty()
        {
            return Err(
                "<p>The request lacks <code>response_type=code</code>, a PKCE S256 \
                 <code>code_challenge</code> or a <code>state</code>. Nothing was done.</p>",
            );
        }
        Ok([
            ("response_type", get("response_type")),
            ("code_challenge_method", get("code_challenge_method")),
            ("client_id", get("client_id")),
            ("redirect_uri", get("redirect_uri")),
            ("state", get("state")),
            ("code_challenge", get("code_challenge")),
            ("scope", get("scope")),
        ])
    }

    fn authorize_page(&self, q: &HashMap<String, String>) -> Response<Body> {
        let fields = match self.check_request(q) {
            Ok(f) => f,
            Err(why) => return page(StatusCode::BAD_REQUEST, why, None),
        };
        let mut hidden = String::new();
        for (k, v) in fields {
            hidden.push_str(&format!(
                r#"<input type="hidden" name="{k}" value="{}">"#,
                escape(v)
            ));
        }
        let mut choices = String::new();
        for (i, (_, login, label)) in ACCOUNTS.iter().enumerate() {
            let checked = if i == 0 { " checked" } else { "" };
            choices.push_str(&format!(
                r#"<p><label><input type="radio" name="account" value="{login}"{checked}> {label} (<code>{login}</code>)</label></p>"#
            ));
        }
        let scope = q.get("scope").map(String::as_str).unwrap_or("");
        let body = format!(
            r#"<h2>credbroker wants to use your demo account</h2>
<p>It asks for: <code>{scope}</code></p>
<form method="post" action="/authorize">{hidden}
<fieldset><legend>Sign in to the demo service as</legend>{choices}</fieldset>
<p><button type="submit" name="decision" value="allow" id="allow">Allow</button>
<button type="submit" name="decision" value="deny" id="deny">Deny</button></p>
</form>"#,
            scope = escape(scope)
        );
        page(StatusCode::OK, &body, Some(&self.opts.redirect_uri))
    }

    fn authorize_decision(&self, h: &HeaderMap, form: &HashMap<String, String>) -> Response<Body> {
        // A form posted from another site is not the person's choice.
        if h.get("sec-fetch-site")
            .is_some_and(|v| v != "same-origin" && v != "none")
        {
            return plain(StatusCode::FORBIDDEN, "cross-site form refused");
        }
        if let Err(why) = self.check_request(form) {
            return page(StatusCode::BAD_REQUEST, why, None);
        }
        let get = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
        let Ok(mut back) = url::Url::parse(&self.opts.redirect_uri) else {
            return plain(StatusCode::BAD_REQUEST, "the redirect URI is not a URL");
        };
        let state = get("state");
        let Some(account) = ACCOUNTS.iter().position(|a| a.1 == get("account")) else {
            return plain(StatusCode::BAD_REQUEST, "pick one of the demo accounts");
        };
        if get("decision") != "allow" {
            tracing::info!("demo service (quick start only): the person denied the request");
            back.query_pairs_mut()
                .append_pair("error", "access_denied")
                .append_pair("state", state)
                .append_pair("iss", &self.opts.issuer);
            return see_other(back.as_str());
        }
        let Some(code) = random_token() else {
            return plain(StatusCode::SERVICE_UNAVAILABLE, "no randomness");
        };
        let now = self.clock.now();
        {
            let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
            codes.retain(|_, p| p.expires > now);
            if codes.len() >= MAX_CODES {
                return plain(StatusCode::SERVICE_UNAVAILABLE, "too many open requests");
            }
            codes.insert(
                code.clone(),
                Pending {
                    account,
                    scope: get("scope").to_string(),
                    challenge: get("code_challenge").to_string(),
                    expires: now + CODE_TTL,
                },
            );
        }
        tracing::info!(
            account = ACCOUNTS[account].1,
            "demo service (quick start only): the person allowed credbroker"
        );
        back.query_pairs_mut()
            .append_pair("code", &code)
            .append_pair("state", state)
            .append_pair("iss", &self.opts.issuer);
        see_other(back.as_str())
    }

    fn token(&self, form: &HashMap<String, String>) -> Response<Body> {
        let get = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
        if get("client_id") != self.opts.client_id {
            return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client");
        }
        let now = self.clock.now();
        let (account, scope, grant) = match get("grant_type") {
            "authorization_code" => {
                // Taken out first: a code is used once, right or wrong.
                let pending = self
                    .codes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(get("code"));
                let Some(p) = pending.filter(|p| p.expires > now) else {
                    return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
                };
                let verifier = get("code_verifier");
                if get("redirect_uri") != self.opts.redirect_uri
                    || !(43..=128).contains(&verifier.len())
                    || crate::base::jose::sha256_b64(verifier.as_bytes()) != p.challenge
                {
                    return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
                }
                let Some(grant) = random_token() else {
                    return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error");
                };
                (p.account, p.scope, grant)
            }
            "refresh_token" => match self.verify(get("refresh_token"), REFRESH_TYP, None) {
                Some((account, claims)) if claims["client_id"] == self.opts.client_id.as_str() => {
                    let granted = claims["scope"].as_str().unwrap_or("").to_string();
                    // A narrower scope may be asked for, never a wider one.
                    let asked = get("scope");
                    let scope = if asked.is_empty() {
                        granted
                    } else if asked.split(' ').all(|s| granted.split(' ').any(|g| g == s)) {
                        asked.to_string()
                    } else {
                        return oauth_error(StatusCode::BAD_REQUEST, "invalid_scope");
                    };
                    // The refreshed tokens stay in the grant (a token of
                    // an earlier demo, which named none, starts one).
                    let Some(grant) = claims["grant"]
                        .as_str()
                        .map(str::to_string)
                        .or_else(random_token)
                    else {
                        return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error");
                    };
                    (account, scope, grant)
                }
                _ => return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant"),
            },
            _ => return oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type"),
        };
        let (Some(access), Some(refresh)) = (
            self.sign(ACCESS_TYP, account, &scope, &grant, now, ACCESS_TTL),
            self.sign(REFRESH_TYP, account, &scope, &grant, now, REFRESH_TTL),
        ) else {
            return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error");
        };
        json_response(
            StatusCode::OK,
            &json!({
                "access_token": access, "token_type": "Bearer", "expires_in": ACCESS_TTL,
                "refresh_token": refresh, "scope": scope,
            }),
        )
    }

    /// Revokes the grant of a token this service issued to its client
    /// (RFC 7009): its access and refresh tokens alike stop working. A
    /// token it does not know is answered 200 too (section 2.2); a
    /// revocation that cannot be kept is a 503.
    fn revoke(&self, form: &HashMap<String, String>) -> Response<Body> {
        if form.get("client_id").map(String::as_str) != Some(self.opts.client_id.as_str()) {
            return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client");
        }
        let token = form.get("token").map(String::as_str).unwrap_or("");
        let grant = [REFRESH_TYP, ACCESS_TYP]
            .iter()
            .find_map(|typ| self.verify(token, typ, None))
            .filter(|(_, c)| c["client_id"] == self.opts.client_id.as_str())
            .and_then(|(_, c)| revocable(&c).map(str::to_string));
        let Some(grant) = grant else {
            return json_response(StatusCode::OK, &json!({}));
        };
        let mut revoked = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &self.opts.revoked_file {
            let kept = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(f)
                .and_then(|mut f| f.write_all(format!("{grant}\n").as_bytes()));
            if kept.is_err() {
                return oauth_error(StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable");
            }
        }
        revoked.insert(grant);
        json_response(StatusCode::OK, &json!({}))
    }

    fn sign(
        &self,
        typ: &str,
        account: usize,
        scope: &str,
        grant: &str,
        now: i64,
        ttl: i64,
    ) -> Option<String> {
        let mut header = serde_json::Map::new();
        header.insert("typ".into(), typ.into());
        header.insert("kid".into(), self.opts.key.kid.clone().into());
        let aud = if typ == ACCESS_TYP {
            self.opts.api_base.clone()
        } else {
            self.opts.issuer.clone()
        };
        let claims = json!({
            "iss": self.opts.issuer, "aud": aud, "sub": ACCOUNTS[account].0,
            "client_id": self.opts.client_id, "scope": scope, "grant": grant,
            "iat": now, "exp": now + ttl, "jti": random_token()?, "demo": true,
        });
        self.opts.key.sign_jws(header, &claims).ok()
    }

    /// A token this service signed, of this `typ`, unexpired, of a grant
    /// not revoked, with the scope `need` when given: its account and
    /// claims.
    fn verify(&self, token: &str, typ: &str, need: Option<&str>) -> Option<(usize, Value)> {
        let jws = crate::base::jose::parse(token, 8192).ok()?;
        let rule = HeaderRule {
            typ: TypRule::Exact(typ),
            algs: &[Alg::ES256],
        };
        let alg = crate::base::jose::check_header(&jws.header, &rule).ok()?;
        if jws.header.kid.as_deref() != Some(self.opts.key.kid.as_str()) {
            return None;
        }
        self.opts.key.jwk().verify(alg, &jws).ok()?;
        let claims: Value = serde_json::from_slice(&jws.payload).ok()?;
        let aud = if typ == ACCESS_TYP {
            &self.opts.api_base
        } else {
            &self.opts.issuer
        };
        if claims["iss"] != self.opts.issuer.as_str()
            || claims["aud"] != aud.as_str()
            || claims["exp"].as_i64().is_none_or(|e| e <= self.clock.now())
        {
            return None;
        }
        if let Some(s) = need {
            if !claims["scope"]
                .as_str()
                .unwrap_or("")
                .split(' ')
                .any(|x| x == s)
            {
                return None;
            }
        }
        if let Some(g) = revocable(&claims) {
            if self
                .revoked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(g)
            {
                return None;
            }
        }
        let account = ACCOUNTS.iter().position(|a| claims["sub"] == a.0)?;
        Some((account, claims))
    }

    fn api(
        &self,
        h: &HeaderMap,
        need: Option<&str>,
        answer: impl FnOnce(usize) -> Value,
    ) -> Response<Body> {
        let token = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match token.and_then(|t| self.verify(t, ACCESS_TYP, need)) {
            Some((account, _)) => json_response(StatusCode::OK, &answer(account)),
            None => {
                let mut r = json_response(
                    StatusCode::UNAUTHORIZED,
                    &json!({"error": "invalid_token", "demo": true,
                            "error_description": "the demo API takes only its own unexpired access tokens with the scope it needs"}),
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
                r
            }
        }
    }
}

/// What revoking a token ends: its grant, or for a token of an earlier
/// demo, which named no grant, the token itself (its `jti`).
fn revocable(claims: &Value) -> Option<&str> {
    claims["grant"].as_str().or_else(|| claims["jti"].as_str())
}

/// Serves the demo service on `listener` until the task is dropped.
pub(crate) async fn serve(listener: tokio::net::TcpListener, demo: Arc<Demo>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            %addr,
            "demo service (quick start only, not a real provider) listening"
        );
    }
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // As on the public listener: no Nagle delay between the writes of
        // one answer.
        let _ = stream.set_nodelay(true);
        let demo = demo.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let demo = demo.clone();
                async move { Ok::<_, std::convert::Infallible>(demo.handle(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(std::time::Duration::from_secs(5))
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// 256 random bits, base64url; `None` without randomness (then nothing
/// is issued).
fn random_token() -> Option<String> {
    let mut r = [0u8; 32];
    aws_lc_rs::rand::fill(&mut r).ok()?;
    Some(crate::base::jose::b64e(&r))
}

fn pairs(s: &str) -> HashMap<String, String> {
    form_urlencoded::parse(s.as_bytes()).into_owned().collect()
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn oauth_error(status: StatusCode, code: &str) -> Response<Body> {
    json_response(status, &json!({"error": code}))
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn see_other(to: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A page of the demo service, marked as a demo on every page. The form
/// may post to itself and be redirected to `form_to` (the broker's
/// callback): browsers apply `form-action` to the redirect too.
fn page(status: StatusCode, body: &str, form_to: Option<&str>) -> Response<Body> {
    let html = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>Demo service (credbroker quick start)</title>
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:36rem;margin:2rem auto;padding:0 1rem}}
.demo{{background:#fff3c4;border:1px solid #c9a400;padding:.5rem 1rem}}button{{font-size:1rem;padding:.4rem 1rem}}</style></head>
<body><p class="demo" role="note"><strong>Demo service</strong>: run by <code>credbroker quickstart</code> on loopback to try connect links. Not a real provider; nothing here is real.</p>
<h1>Demo service</h1>
{body}
</body></html>"#
    );
    let origin = form_to
        .and_then(|u| url::Url::parse(u).ok())
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_default();
    let csp = format!(
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' {origin}; frame-ancestors 'none'; base-uri 'none'"
    );
    let mut r = Response::new(Full::new(Bytes::from(html)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(csp.trim_end()) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    r
}

#[cfg(test)]
mod tests;
