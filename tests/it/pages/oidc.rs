//! Sign-in through OIDC at the organisation's IdP: discovery, code + PKCE
//! S256 + state + nonce, the ID token fully checked, `auth_time` and
//! re-authentication with `max_age=900`/`prompt=login` (C3), RFC 9207 `iss`.
//!
//! The IdP here is a small fake served by the test (it approves at once and
//! lets each test bend one thing); the issue's browser test against panva's
//! oidc-provider is separate.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::support::pages::*;
use credbroker::internals::jose::Es256Key;
use credbroker::internals::pages::links::LinkKind;
use credbroker::internals::subject::Person;

const CLIENT_ID: &str = "credbroker-pages";
const CLIENT_SECRET: &str = "idp-client-secret-canary";

#[derive(Clone)]
struct Behaviour {
    sub: String,
    /// Seconds before now of `auth_time` (None: omit it).
    auth_age: Option<i64>,
    /// When max_age is asked for, sign in again (auth_time = now).
    honour_max_age: bool,
    nonce: Option<String>,
    aud: Option<String>,
    iss_claim: Option<String>,
    iss_param: Option<String>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            sub: "u-alice".into(),
            auth_age: Some(60),
            honour_max_age: true,
            nonce: None,
            aud: None,
            iss_claim: None,
            iss_param: None,
        }
    }
}

type Params = HashMap<String, String>;
type Bend = Box<dyn Fn(&mut Behaviour)>;

struct Idp {
    base: String,
    key: Es256Key,
    behaviour: Mutex<Behaviour>,
    /// The last authorization request's parameters.
    last_authorize: Mutex<HashMap<String, String>>,
    /// code -> (authorize params, auth_time)
    codes: Mutex<HashMap<String, (Params, Option<i64>)>>,
    /// Each token request's form and `Authorization` header.
    token_requests: Mutex<Vec<(Params, Option<String>)>>,
}

fn resp(
    status: u16,
    headers: &[(&str, &str)],
    body: String,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let mut b = hyper::Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

async fn serve_idp(listener: tokio::net::TcpListener, idp: Arc<Idp>) {
    use http_body_util::BodyExt;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let idp = idp.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let idp = idp.clone();
                async move {
                    let path = req.uri().path().to_string();
                    let q: HashMap<String, String> =
                        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                            .into_owned()
                            .collect();
                    let auth = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_string());
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let b = idp.behaviour.lock().unwrap().clone();
                    let r = match path.as_str() {
                        "/.well-known/openid-configuration" => resp(
                            200,
                            &[("content-type", "application/json")],
                            serde_json::json!({
                                "issuer": idp.base,
                                "authorization_endpoint": format!("{}/authorize", idp.base),
                                "token_endpoint": format!("{}/token", idp.base),
                                "jwks_uri": format!("{}/jwks", idp.base),
                                "authorization_response_iss_parameter_supported": true,
                                "code_challenge_methods_supported": ["S256"],
                            })
                            .to_string(),
                        ),
                        "/jwks" => resp(
                            200,
                            &[("content-type", "application/json")],
                            serde_json::json!({"keys": [idp.key.public_jwk]}).to_string(),
                        ),
                        "/authorize" => {
                            *idp.last_authorize.lock().unwrap() = q.clone();
                            let reauth = q.contains_key("max_age") && b.honour_max_age;
                            let auth_time = if reauth {
                                Some(now())
                            } else {
                                b.auth_age.map(|a| now() - a)
                            };
                            let code = format!("idc_{}", now_nanos());
                            idp.codes
                                .lock()
                                .unwrap()
                                .insert(code.clone(), (q.clone(), auth_time));
                            let mut u = url::Url::parse(&q["redirect_uri"]).unwrap();
                            u.query_pairs_mut()
                                .append_pair("code", &code)
                                .append_pair("state", &q["state"])
                                .append_pair("iss", b.iss_param.as_deref().unwrap_or(&idp.base));
                            resp(302, &[("location", u.as_str())], String::new())
                        }
                        "/token" => {
                            let f: HashMap<String, String> =
                                url::form_urlencoded::parse(&body).into_owned().collect();
                            idp.token_requests
                                .lock()
                                .unwrap()
                                .push((f.clone(), auth.clone()));
                            let Some((aq, auth_time)) =
                                idp.codes.lock().unwrap().remove(&f["code"])
                            else {
                                return Ok::<_, std::convert::Infallible>(resp(
                                    400,
                                    &[],
                                    r#"{"error":"invalid_grant"}"#.into(),
                                ));
                            };
                            let pkce_ok = credbroker::internals::jose::sha256_b64(
                                f["code_verifier"].as_bytes(),
                            ) == aq["code_challenge"];
                            if !pkce_ok || f["redirect_uri"] != aq["redirect_uri"] {
                                return Ok(resp(400, &[], r#"{"error":"invalid_grant"}"#.into()));
                            }
                            let mut claims = serde_json::json!({
                                "iss": b.iss_claim.clone().unwrap_or(idp.base.clone()),
                                "sub": b.sub, "aud": b.aud.clone().unwrap_or(CLIENT_ID.into()),
                                "iat": now(), "exp": now() + 300,
                                "nonce": b.nonce.clone().unwrap_or(aq["nonce"].clone()),
                                "preferred_username": "alice@example.org",
                            });
                            if let Some(t) = auth_time {
                                claims["auth_time"] = t.into();
                            }
                            let mut h = serde_json::Map::new();
                            h.insert("typ".into(), "JWT".into());
                            h.insert("kid".into(), idp.key.kid.clone().into());
                            let id_token = idp.key.sign_jws(h, &claims).unwrap();
                            resp(200, &[("content-type", "application/json")], serde_json::json!({"id_token": id_token, "access_token": "at", "token_type": "Bearer"}).to_string())
                        }
                        _ => resp(404, &[], String::new()),
                    };
                    Ok(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

async fn setup() -> (PagesServer, Arc<Idp>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let idp = Arc::new(Idp {
        base: base.clone(),
        key: Es256Key::generate().unwrap().0,
        behaviour: Mutex::new(Behaviour::default()),
        last_authorize: Mutex::default(),
        codes: Mutex::default(),
        token_requests: Mutex::default(),
    });
    tokio::spawn(serve_idp(l, idp.clone()));
    let b2 = base.clone();
    let s = PagesServer::start_with(Setup {
        edit_config: Some(Arc::new(move |mut text: String| {
            text.push_str(&format!(
                "\n[[trusted_issuers]]\nissuer = \"{b2}\"\njwks_uri = \"{b2}/jwks\"\nalgs = [\"ES256\"]\nsign_in = {{ kind = \"oidc\", client_id = \"{CLIENT_ID}\", client_secret_file = \"idp-secret\" }}\n"
            ));
            text
        })),
        ..Setup::default()
    })
    .await;
    // The secret file is read when needed (mode 0600).
    let p = s.dir.path().join("idp-secret");
    credbroker::internals::config::write_secret_file(&p, format!("{CLIENT_SECRET}\n").as_bytes())
        .unwrap();
    (s, idp)
}

fn q_of(u: &str) -> HashMap<String, String> {
    url::Url::parse(u)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

/// Runs the OIDC sign-in from `signin_path` through the IdP; returns the
/// callback's response.
async fn oidc_sign_in(
    s: &PagesServer,
    c: &reqwest::Client,
    signin_path: &str,
) -> reqwest::Response {
    let html = c
        .get(s.url(signin_path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let i = html
        .find("href=\"/signin/oidc?")
        .expect("an OIDC sign-in link")
        + 6;
    let j = html[i..].find('"').unwrap() + i;
    let href = html[i..j].replace("&#38;", "&");
    let r = c.get(s.url(&href)).send().await.unwrap();
    assert_eq!(r.status(), 303, "to the IdP");
    let to_idp = location(&r);
    let r = c.get(&to_idp).send().await.unwrap();
    assert_eq!(r.status(), 302, "IdP answers");
    c.get(location(&r)).send().await.unwrap()
}

#[tokio::test]
async fn oidc_sign_in_with_pkce_state_nonce_then_the_link() {
    let (s, idp) = setup().await;
    let person = Person {
        iss: idp.base.clone(),
        sub: "u-alice".into(),
    };
    let (code, _) = s
        .fake
        .issue(&person, "github", LinkKind::Connect, &["repo"], now());
    let link = format!("/connect/{code}");
    let c = s.client();
    let r = c.get(s.url(&link)).send().await.unwrap();
    let signin = location(&r);
    let r = oidc_sign_in(&s, &c, &signin).await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        location(&r),
        link,
        "back to the link, and the code leaves the address bar"
    );

    let a = idp.last_authorize.lock().unwrap().clone();
    assert_eq!(a["response_type"], "code");
    assert_eq!(a["client_id"], CLIENT_ID);
    assert_eq!(a["redirect_uri"], s.url("/signin/callback"));
    assert_eq!(a["code_challenge_method"], "S256");
    assert_eq!(a["state"].len(), 43);
    assert_eq!(a["nonce"].len(), 43);
    assert!(a["scope"].split(' ').any(|x| x == "openid"));
    // A sign-in that leads to a link asks for max_age (the link needs a
    // recent auth_time), but does not force a new login.
    assert_eq!(a["max_age"], "900");
    assert!(!a.contains_key("prompt"));
    let (form, auth) = idp.token_requests.lock().unwrap()[0].clone();
    assert_eq!(form["grant_type"], "authorization_code");
    assert_eq!(form["code_verifier"].len(), 43);
    assert!(auth.unwrap().starts_with("Basic "), "client_secret_basic");

    let r = c.get(s.url(&link)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("alice@example.org"),
        "shows the person's own account"
    );
    let e = s.events("signin.succeeded");
    assert_eq!(e[0]["person_iss"], idp.base.as_str());
    assert_eq!(e[0]["person_sub"], "u-alice");
    // The client secret is nowhere in events.
    assert!(
        !std::fs::read_to_string(s.dir.path().join("data/audit.jsonl"))
            .unwrap()
            .contains(CLIENT_SECRET)
    );
}

/// C3 with OIDC: a stale or missing `auth_time` sends the person back to the
/// IdP with `max_age=900&prompt=login`; an IdP that does not re-authenticate
/// is refused.
#[tokio::test]
async fn stale_or_missing_auth_time_forces_max_age_and_prompt_login() {
    let (s, idp) = setup().await;
    let person = Person {
        iss: idp.base.clone(),
        sub: "u-alice".into(),
    };
    let (code, _) = s
        .fake
        .issue(&person, "github", LinkKind::Connect, &["repo"], now());
    let link = format!("/connect/{code}");
    for (age, refused) in [(Some(16 * 60), 400), (None, 502)] {
        idp.behaviour.lock().unwrap().auth_age = age;
        idp.behaviour.lock().unwrap().honour_max_age = false;
        let c = s.client();
        // Signed in for the account page (no max_age asked for), then the
        // link: the sign-in is too old, or its age unknown.
        let r = oidc_sign_in(&s, &c, "/signin").await;
        assert_eq!(location(&r), "/account", "signed in ({age:?})");
        assert!(!idp.last_authorize.lock().unwrap().contains_key("max_age"));
        let r = c.get(s.url(&link)).send().await.unwrap();
        assert_eq!(r.status(), 303);
        let again = location(&r);
        assert!(again.ends_with("&reauth=1"), "{again}");
        // The IdP ignores max_age: the old auth_time is refused.
        let r = oidc_sign_in(&s, &c, &again).await;
        let a = idp.last_authorize.lock().unwrap().clone();
        assert_eq!(a["max_age"], "900");
        assert_eq!(a["prompt"], "login");
        // Too old: refused; no auth_time at all although max_age was sent:
        // an IdP error (OpenID Connect Core 3.1.2.1), not another loop.
        assert_eq!(r.status(), refused, "({age:?})");
        assert_eq!(
            c.get(s.url(&link)).send().await.unwrap().status(),
            303,
            "still not offered"
        );
        // Positive control: an IdP that signs the person in again.
        idp.behaviour.lock().unwrap().honour_max_age = true;
        let r = oidc_sign_in(&s, &c, &again).await;
        assert_eq!(location(&r), link);
        assert_eq!(c.get(s.url(&link)).send().await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn bad_id_tokens_and_callbacks_sign_nobody_in() {
    let (s, idp) = setup().await;
    let base = idp.base.clone();
    let cases: Vec<(&str, Bend)> = vec![
        (
            "nonce of another flow",
            Box::new(|b| b.nonce = Some("n-other".into())),
        ),
        (
            "aud of another client",
            Box::new(|b| b.aud = Some("other-client".into())),
        ),
        (
            "iss of another IdP",
            Box::new(|b| b.iss_claim = Some("https://evil.example".into())),
        ),
        (
            "callback iss of another IdP (RFC 9207)",
            Box::new(|b| b.iss_param = Some("https://evil.example".into())),
        ),
    ];
    for (what, bend) in cases {
        *idp.behaviour.lock().unwrap() = Behaviour::default();
        bend(&mut idp.behaviour.lock().unwrap());
        let c = s.client();
        let r = oidc_sign_in(&s, &c, "/signin").await;
        assert_eq!(r.status(), 400, "{what}");
        assert_eq!(
            c.get(s.url("/account")).send().await.unwrap().status(),
            303,
            "{what}: not signed in"
        );
    }
    *idp.behaviour.lock().unwrap() = Behaviour::default();
    // A callback replayed (state reused), and one carried to another browser.
    let c = s.client();
    let html = c
        .get(s.url("/signin"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let i = html.find("href=\"/signin/oidc?").unwrap() + 6;
    let href = html[i..i + html[i..].find('"').unwrap()].replace("&#38;", "&");
    let to_idp = location(&c.get(s.url(&href)).send().await.unwrap());
    let callback = location(&c.get(&to_idp).send().await.unwrap());
    let other = s.client();
    other.get(s.url("/signin")).send().await.unwrap();
    let r = other.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 400, "another browser's callback");
    let r = c.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 400, "the state was spent by the first use");
    assert!(q_of(&callback).contains_key("state"));
    // Positive control: a clean flow signs in.
    let r = oidc_sign_in(&s, &c, "/signin").await;
    assert_eq!(r.status(), 303);
    assert_eq!(c.get(s.url("/account")).send().await.unwrap().status(), 200);
    let reasons: Vec<_> = s
        .events("signin.failed")
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "id_token",
            "id_token",
            "id_token",
            "callback_iss",
            "state_of_another_session",
            "state_unknown"
        ]
    );
    let _ = base;
}

/// The IdP answers a sign-in that asked for `max_age` with an ID token
/// without `auth_time`: the person gets a page that says what the IdP got
/// wrong and how to start again (not a "sign in again" loop), and
/// `signin.failed` records `auth_time_missing`.
#[tokio::test]
async fn an_idp_that_omits_auth_time_despite_max_age_gets_an_idp_error_not_a_loop() {
    let (s, idp) = setup().await;
    let person = Person {
        iss: idp.base.clone(),
        sub: "u-alice".into(),
    };
    let (code, _) = s
        .fake
        .issue(&person, "github", LinkKind::Connect, &["repo"], now());
    let link = format!("/connect/{code}");
    idp.behaviour.lock().unwrap().auth_age = None;
    idp.behaviour.lock().unwrap().honour_max_age = false;
    let c = s.client();
    let signin = location(&c.get(s.url(&link)).send().await.unwrap());
    let r = oidc_sign_in(&s, &c, &signin).await;
    assert_eq!(idp.last_authorize.lock().unwrap()["max_age"], "900");
    assert_eq!(r.status(), 502);
    let html = r.text().await.unwrap();
    assert!(html.contains("auth_time"), "{html}");
    assert!(html.contains("OpenID Connect Core 3.1.2.1"), "{html}");
    let again = format!("href=\"/signin?return_to={}\"", urlenc(&link)).replace('&', "&#38;");
    assert!(html.contains(&again), "a way to start again: {html}");
    assert!(
        !html.contains("Sign in again"),
        "not the re-authentication page"
    );
    assert_eq!(s.events("signin.failed")[0]["reason"], "auth_time_missing");
    assert!(s.events("signin.succeeded").is_empty());
    // Positive control: an IdP that honours max_age signs the person in
    // once and the link's page is offered.
    idp.behaviour.lock().unwrap().honour_max_age = true;
    let r = oidc_sign_in(&s, &c, &signin).await;
    assert_eq!(location(&r), link);
    assert_eq!(c.get(s.url(&link)).send().await.unwrap().status(), 200);
    assert_eq!(s.events("signin.succeeded").len(), 1);
}

/// A replayed callback and another browser's callback (the login-CSRF
/// shape) each write `signin.failed` and offer a way to start again; a
/// flood of them writes at most the budget of events a minute.
#[tokio::test]
async fn refused_callbacks_are_recorded_within_a_budget_and_offer_a_restart() {
    let (s, _idp) = setup().await;
    let c = s.client();
    c.get(s.url("/signin")).send().await.unwrap();
    let r = c
        .get(s.url("/signin/callback?code=x&state=not-a-state"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let html = r.text().await.unwrap();
    assert!(html.contains("This sign-in has expired"));
    assert!(html.contains("href=\"/signin\""), "Start again: {html}");
    assert_eq!(s.events("signin.failed")[0]["reason"], "state_unknown");
    assert_eq!(
        s.events("signin.failed")[0]["client_addr"],
        "127.0.0.1",
        "who sent it"
    );
    let budget = credbroker::internals::pages::limits::SIGNIN_FAILED_PER_MINUTE as usize;
    for _ in 0..budget + 20 {
        c.get(s.url("/signin/callback?state=x"))
            .send()
            .await
            .unwrap();
    }
    let n = s.events("signin.failed").len();
    // The budget is per minute of the broker's clock; the flood may cross a
    // minute boundary of the manual clock only if the test stalls (it does
    // not advance), so one minute's budget holds.
    assert_eq!(n, budget, "capped at the budget");
    // Positive control: the next minute records again.
    s.clock.advance(60);
    c.get(s.url("/signin/callback?state=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(s.events("signin.failed").len(), budget + 1);
}

/// The person opens a link and signs in once at panva's oidc-provider,
/// whose ID tokens leave `auth_time` out unless `max_age` is asked for (its
/// default; no `require_auth_time` in the client registration): the pages
/// ask for `max_age=900` because the sign-in leads to a link, so the ID
/// token says when she signed in and the link's page is offered at once,
/// not a second "Sign in again".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_sign_in_at_oidc_provider_signs_in_once() {
    let addr = crate::support::free_loopback_addr();
    let base = format!("http://{addr}");
    let secret = "pages-client-secret-canary-once";
    let redirect_uri = format!("{base}/signin/callback");
    let (idp, _idp_cfg) = crate::support::oidc_provider(&serde_json::json!({
        "clients": [{
            "client_id": CLIENT_ID, "client_secret": secret,
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code"], "response_types": ["code"],
            "token_endpoint_auth_method": "client_secret_basic",
        }],
    }));
    let idp = Arc::new(Mutex::new(idp));
    let issuer = idp.lock().unwrap().hello["issuer"]
        .as_str()
        .unwrap()
        .to_string();
    let iss = issuer.clone();
    let s = PagesServer::start_with(Setup {
        listen: Some(addr.parse().unwrap()),
        edit_config: Some(Arc::new(move |mut text: String| {
            text.push_str(&format!(
                "\n[[trusted_issuers]]\nissuer = \"{iss}\"\njwks_uri = \"{iss}/jwks\"\nalgs = [\"RS256\", \"ES256\"]\nsign_in = {{ kind = \"oidc\", client_id = \"{CLIENT_ID}\", client_secret_file = \"idp-secret\", display_name = \"Example IdP\" }}\n"
            ));
            text
        })),
        ..Setup::default()
    })
    .await;
    credbroker::internals::config::write_secret_file(
        &s.dir.path().join("idp-secret"),
        secret.as_bytes(),
    )
    .unwrap();
    let person = Person {
        iss: issuer.clone(),
        sub: "alice".into(),
    };
    let (code, _) = s
        .fake
        .issue(&person, "github", LinkKind::Connect, &["repo"], now());
    let link = format!("/connect/{code}");
    let c = s.client();
    let signin = location(&c.get(s.url(&link)).send().await.unwrap());
    let html = c
        .get(s.url(&signin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("Sign in at Example IdP"),
        "display_name: {html}"
    );
    let i = html.find("href=\"/signin/oidc?").unwrap() + 6;
    let href = html[i..i + html[i..].find('"').unwrap()].replace("&#38;", "&");
    let r = c.get(s.url(&href)).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let to_idp = location(&r);
    let q = q_of(&to_idp);
    let (peer, url, ru) = (idp.clone(), to_idp.clone(), redirect_uri.clone());
    let back = tokio::task::spawn_blocking(move || {
        peer.lock().unwrap().call(&serde_json::json!({
            "cmd": "authorize", "url": url, "redirect_uri": ru,
            "user": "alice", "password": "any",
        }))
    })
    .await
    .unwrap();
    let callback = back["location"]
        .as_str()
        .unwrap_or_else(|| panic!("{back}"));
    let r = c.get(callback).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), link, "back to the link after one sign-in");
    let r = c.get(s.url(&link)).send().await.unwrap();
    assert_eq!(r.status(), 200, "offered at once, not 'Sign in again'");
    let html = r.text().await.unwrap();
    assert!(html.contains("Connect GitHub for"), "{html}");
    assert!(
        html.contains("alice (signed in at Example IdP)"),
        "the person is named with the sign-in source: {html}"
    );
    // Why: the sign-in asked for max_age (and did not force a new login).
    assert_eq!(q.get("max_age").map(String::as_str), Some("900"));
    assert!(
        !q.contains_key("prompt"),
        "no forced login on the first sign-in"
    );
    let signins = s.events("signin.succeeded");
    assert_eq!(signins.len(), 1, "signed in once");
    assert_eq!(signins[0]["person_sub"], "alice");
    assert!(s.events("signin.failed").is_empty());
}
