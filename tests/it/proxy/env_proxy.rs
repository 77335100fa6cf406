//! The proxy's client never goes through a proxy named in the broker's
//! environment (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`): a provider
//! token sent to `api_base` must not pass through anyone else. The
//! broker's other outbound calls (the provider's token endpoint) do honour
//! the environment, which is the control that the variables took effect.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::ProxyEnv;

/// A forward proxy for plain-HTTP requests in absolute form: it records
/// each request's method and URI, then sends it on and relays the answer.
/// Returns its URL and the records.
async fn forward_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let onward = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let records = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (records, onward) = (records.clone(), onward.clone());
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (records, onward) = (records.clone(), onward.clone());
                async move {
                    records
                        .lock()
                        .unwrap()
                        .push(format!("{} {}", req.method(), req.uri()));
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await.unwrap().to_bytes();
                    let mut rb = onward
                        .request(parts.method, parts.uri.to_string())
                        .body(body);
                    for (k, v) in &parts.headers {
                        if !matches!(k.as_str(), "host" | "proxy-connection" | "content-length") {
                            rb = rb.header(k, v);
                        }
                    }
                    let mut answer = Response::new(Full::new(Bytes::new()));
                    *answer.status_mut() = http::StatusCode::BAD_GATEWAY;
                    if let Ok(r) = rb.send().await {
                        *answer.status_mut() = r.status();
                        for (k, v) in r.headers() {
                            if !matches!(k.as_str(), "content-length" | "transfer-encoding") {
                                answer.headers_mut().append(k, v.clone());
                            }
                        }
                        *answer.body_mut() = Full::new(r.bytes().await.unwrap_or_default());
                    }
                    Ok::<_, Infallible>(answer)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (url, seen)
}

#[tokio::test]
async fn the_proxy_never_sends_a_call_through_a_proxy_from_the_environment() {
    let mut p = ProxyEnv::start("").await;
    let (via, seen) = forward_proxy().await;
    let env = [
        ("HTTP_PROXY", via.as_str()),
        ("http_proxy", via.as_str()),
        ("HTTPS_PROXY", via.as_str()),
        ("ALL_PROXY", via.as_str()),
    ];
    p.env.broker.restart_with_env(&env);
    let read = p.token("acme.read", "triage").await;

    // The provider refuses the first token: the broker refreshes it at the
    // provider's token endpoint (through the proxy from its environment)
    // and retries the call (straight to api_base).
    let refreshes = p.env.peer.refreshes().await;
    p.api.refuse_next_token();
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(p.env.peer.refreshes().await, refreshes + 1);
    let calls = p.api.records();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(!calls[0].authorized && calls[1].authorized, "{calls:?}");

    let seen = seen.lock().unwrap().clone();
    // Control: the environment took effect in the broker's process.
    assert!(
        seen.iter()
            .any(|s| s.starts_with("POST ") && s.contains(&p.env.peer.issuer)),
        "the refresh did not go through the environment's proxy: {seen:?}"
    );
    // Neither the call nor its retry went through it.
    assert!(
        !seen.iter().any(|s| s.contains(&p.api.base)),
        "a proxied call went through the environment's proxy: {seen:?}"
    );
}

/// `[outbound] use_env_proxy = false`: the same refresh as above goes
/// straight to the provider's token endpoint, with the same environment
/// (the test above is the control that the variables take effect).
#[tokio::test]
async fn with_use_env_proxy_false_no_oauth_call_goes_through_the_environments_proxy() {
    let mut p = ProxyEnv::start("\n[outbound]\nuse_env_proxy = false").await;
    let (via, seen) = forward_proxy().await;
    let env = [
        ("HTTP_PROXY", via.as_str()),
        ("http_proxy", via.as_str()),
        ("HTTPS_PROXY", via.as_str()),
        ("ALL_PROXY", via.as_str()),
    ];
    p.env.broker.restart_with_env(&env);
    let read = p.token("acme.read", "triage").await;
    let refreshes = p.env.peer.refreshes().await;
    p.api.refuse_next_token();
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        p.env.peer.refreshes().await,
        refreshes + 1,
        "the refresh happened"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.is_empty(),
        "a call went through the environment's proxy: {seen:?}"
    );
}
