//! The GitHub preset revokes on disconnect through GitHub's application
//! grant API (GitHub has no RFC 7009 endpoint): `DELETE
//! /applications/{client_id}/grant` with basic auth of the client id and
//! secret and `{"access_token": ...}`. Tested against an in-process stand-in
//! that speaks that API.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::oidc::secret_file;
use credbroker::internals::config::{AccountLookup, ClientAuth, Endpoints, ProviderConfig};
use credbroker::internals::secret::SecretString;
use credbroker::internals::store::{SledStore, Store};
use credbroker::internals::subject::Person;
use credbroker::internals::upstream::{AccountInfo, Provider, TokenSet};
use credbroker::internals::vault::{TokenOutcome, TokenRequest, Vault};

const CLIENT_ID: &str = "Iv1.standin";
const CLIENT_SECRET: &str = "github-client-secret-canary";
const TOKEN: &str = "gho_standin_access_token_canary";

/// What the stand-in saw: (method, path, Authorization, body).
type Seen = Arc<Mutex<Vec<(String, String, String, String)>>>;

/// GitHub's grant API as far as credbroker uses it: 204 when the basic
/// auth is the app's and the token is one of its live grants (then the
/// grant is gone), 404 otherwise (GitHub's answer for an unknown token).
async fn standin(live: Arc<Mutex<Vec<String>>>, seen: Seen) -> String {
    use http_body_util::BodyExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = l.accept().await else {
                continue;
            };
            let (live, seen) = (live.clone(), seen.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (live, seen) = (live.clone(), seen.clone());
                        async move {
                            let method = req.method().to_string();
                            let path = req.uri().path().to_string();
                            let auth = req
                                .headers()
                                .get("authorization")
                                .map(|v| v.to_str().unwrap().to_string())
                                .unwrap_or_default();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let body = String::from_utf8(body.to_vec()).unwrap();
                            seen.lock().unwrap().push((
                                method.clone(),
                                path.clone(),
                                auth.clone(),
                                body.clone(),
                            ));
                            let basic = format!(
                                "Basic {}",
                                base64_std(&format!("{CLIENT_ID}:{CLIENT_SECRET}"))
                            );
                            let token = serde_json::from_str::<serde_json::Value>(&body)
                                .ok()
                                .and_then(|v| v["access_token"].as_str().map(str::to_owned));
                            let ok = method == "DELETE"
                                && path == format!("/applications/{CLIENT_ID}/grant")
                                && auth == basic;
                            if method == "GET" && path == "/user" {
                                let live = auth
                                    .strip_prefix("Bearer ")
                                    .is_some_and(|t| live.lock().unwrap().iter().any(|x| x == t));
                                let (status, body) = if live {
                                    (200, r#"{"id":1001,"login":"octo-alice"}"#)
                                } else {
                                    (401, r#"{"message":"Bad credentials"}"#)
                                };
                                return Ok::<_, std::convert::Infallible>(
                                    hyper::Response::builder()
                                        .status(status)
                                        .header("content-type", "application/json")
                                        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                                        .unwrap(),
                                );
                            }
                            let status = match token {
                                Some(t) if ok => {
                                    let mut l = live.lock().unwrap();
                                    match l.iter().position(|x| *x == t) {
                                        Some(i) => {
                                            l.remove(i);
                                            204
                                        }
                                        None => 404,
                                    }
                                }
                                _ if auth != basic => 401,
                                _ => 422,
                            };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    base
}

fn base64_std(s: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn github(base: &str, dir: &std::path::Path) -> Provider {
    Provider::new(ProviderConfig {
        name: "github".into(),
        display_name: "GitHub".into(),
        issuer: None,
        endpoints: Some(Endpoints {
            authorization: format!("{base}/login/oauth/authorize"),
            token: format!("{base}/login/oauth/access_token"),
            revocation: None,
            userinfo: None,
            sends_iss: false,
        }),
        client_id: CLIENT_ID.into(),
        client_secret_file: Some(secret_file(dir, "gh.secret", CLIENT_SECRET)),
        client_auth: ClientAuth::Post,
        redirect_uri: "http://127.0.0.1:9/callback/github".into(),
        scopes: vec![],
        narrow_on_refresh: false,
        account: AccountLookup::Api {
            url: format!("{base}/user"),
            id_field: "id".into(),
            name_field: "login".into(),
        },
        timeout: Duration::from_secs(5),
        grant_endpoint: Some(format!("{base}/applications/{CLIENT_ID}/grant")),
        recheck_unexpiring_token_after: Duration::from_secs(3600),
        api_base: None,
    })
    .unwrap()
}

fn alice() -> Person {
    Person {
        iss: "https://idp.example".into(),
        sub: "alice".into(),
    }
}

fn connect(vault: &Vault, p: &Provider) {
    let tokens = TokenSet {
        access_token: SecretString::new(TOKEN.into()),
        token_type: "bearer".into(),
        expires_in: None,
        refresh_token: None,
        scope: Some(vec!["repo".into()]),
    };
    let who = AccountInfo {
        id: "1001".into(),
        name: "octo-alice".into(),
    };
    vault
        .connect_account(
            &alice(),
            "github",
            &p.id(),
            &who,
            &tokens,
            &["repo".to_string()],
            crate::support::now(),
        )
        .unwrap();
}

#[tokio::test]
async fn github_disconnect_deletes_the_application_grant_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let live = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen: Seen = Arc::default();
    let base = standin(live.clone(), seen.clone()).await;
    let p = github(&base, dir.path());
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("data")).unwrap());
    let vault = Vault::open(
        store,
        crate::support::test_master(),
        &dir.path().join("keys/vault"),
    )
    .unwrap();
    connect(&vault, &p);

    // GitHub knows no grant for the token (already revoked there): the
    // report says it was not deleted there, and the account is kept.
    let r = credbroker::internals::connect::disconnect_account(
        &vault,
        Some(&p),
        &alice(),
        "github",
        false,
    )
    .await
    .unwrap();
    assert_eq!(r.revocation, "failed", "{}", r.message);
    assert!(!r.deleted);
    assert!(
        r.message.contains("the grant at GitHub was not deleted"),
        "{}",
        r.message
    );
    assert!(vault.account(&alice(), "github").unwrap().is_some());

    // Positive control: a live grant is deleted, the report says exactly
    // that, and the account is deleted here.
    live.lock().unwrap().push(TOKEN.into());
    let r = credbroker::internals::connect::disconnect_account(
        &vault,
        Some(&p),
        &alice(),
        "github",
        false,
    )
    .await
    .unwrap();
    assert_eq!(r.revocation, "revoked", "{}", r.message);
    assert!(r.deleted);
    assert!(
        r.message.contains("the application grant was deleted"),
        "{}",
        r.message
    );
    assert!(r.message.contains("(access and refresh)"), "{}", r.message);
    assert!(
        live.lock().unwrap().is_empty(),
        "the grant is gone at GitHub"
    );
    assert!(vault.account(&alice(), "github").unwrap().is_none());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let (method, path, auth, body) = &seen[1];
    assert_eq!(method, "DELETE");
    assert_eq!(path, &format!("/applications/{CLIENT_ID}/grant"));
    assert_eq!(
        auth,
        &format!(
            "Basic {}",
            base64_std(&format!("{CLIENT_ID}:{CLIENT_SECRET}"))
        )
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).unwrap(),
        serde_json::json!({ "access_token": TOKEN })
    );
    // The secret and the token stay out of the report.
    assert!(!r.message.contains(CLIENT_SECRET) && !r.message.contains(TOKEN));
}

/// A GitHub token has no lifetime (no `expires_in`) and no refresh token:
/// it is served without asking GitHub for `recheck_unexpiring_token_after`
/// (1 hour by default), then checked with the user API before it is
/// served again; a token GitHub no longer accepts makes the account
/// "reconnect required" instead of being served forever.
#[tokio::test]
async fn a_token_without_a_lifetime_is_rechecked_after_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let live = Arc::new(Mutex::new(vec![TOKEN.to_string()]));
    let seen: Seen = Arc::default();
    let base = standin(live.clone(), seen.clone()).await;
    let p = github(&base, dir.path());
    assert_eq!(
        p.config().recheck_unexpiring_token_after,
        Duration::from_secs(3600)
    );
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("data")).unwrap());
    let vault = Vault::open(
        store,
        crate::support::test_master(),
        &dir.path().join("keys/vault"),
    )
    .unwrap();
    connect(&vault, &p);
    let t0 = crate::support::now();
    let clock = credbroker::internals::clock::ManualClock::new(t0 + 10);
    let person = alice();
    let scopes = vec!["repo".to_string()];
    let req = TokenRequest {
        person: &person,
        service: "github",
        scopes: &scopes,
    };
    let user_calls = || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|x| x.1 == "/user")
            .count()
    };
    let served = |o: TokenOutcome| match o {
        TokenOutcome::Token(t) => {
            assert_eq!(t.access_token.expose(), TOKEN);
            assert_eq!(t.expires_at, None);
        }
        other => panic!("not served: {other:?}"),
    };
    // Within the cap: served as stored, GitHub is not asked.
    served(
        vault
            .provider_token(&p, &req, clock.as_ref())
            .await
            .unwrap(),
    );
    assert_eq!(user_calls(), 0);
    // Past the cap: checked with GitHub once, then served again for an hour.
    clock.set(t0 + 3600 + 5);
    served(
        vault
            .provider_token(&p, &req, clock.as_ref())
            .await
            .unwrap(),
    );
    assert_eq!(user_calls(), 1, "a fresh check with the provider");
    clock.set(t0 + 3600 + 600);
    served(
        vault
            .provider_token(&p, &req, clock.as_ref())
            .await
            .unwrap(),
    );
    assert_eq!(user_calls(), 1, "the check restarts the cap");
    // GitHub no longer accepts it (revoked there): past the cap, the
    // account needs reconnecting; nothing is served.
    live.lock().unwrap().clear();
    clock.set(t0 + 2 * 3600 + 10);
    assert!(matches!(
        vault
            .provider_token(&p, &req, clock.as_ref())
            .await
            .unwrap(),
        TokenOutcome::Reconnect
    ));
    assert_eq!(user_calls(), 2);
    // Positive control: connected again, the new token is served.
    live.lock().unwrap().push(TOKEN.into());
    connect(&vault, &p);
    clock.set(crate::support::now() + 10);
    served(
        vault
            .provider_token(&p, &req, clock.as_ref())
            .await
            .unwrap(),
    );
}
