//! A stand-in for a connected service's API (what `api.github.com` is to
//! GitHub), for the egress proxy's tests. It accepts only the provider's
//! real access tokens, checked the way a resource server would: RFC 7662
//! introspection at the `oidc-provider` peer, with the client's
//! credentials. It records every request it receives, headers included, so
//! tests can show what reached it and what never did.
//!
//! Its routes (all answer 401 without a live provider token):
//! - `GET /user`: `{"login": ...}` from the introspection's `sub`;
//! - `GET /repos/{o}/{r}/issues`: echoes the query;
//! - `POST /repos/{o}/{r}/pulls`: echoes the body's length and SHA-256;
//! - `GET /download/{mib}`: that many MiB of a known pattern;
//! - `GET /trickle/{mib}`: the same, streamed in 64 KiB chunks every 20 ms
//!   as the reader takes them, each download recorded ([`ApiStandin::trickles`]):
//!   how much was sent, and whether the reader went away before the end
//!   (the proxy cut it);
//! - `GET /stream`: five chunks, each after the tool has read the one before;
//! - `GET /echo/{start|split|header}`: an answer that carries the token it
//!   was sent (at the start of the body, split over two chunks late in the
//!   body, or in a header);
//! - `GET /echo/refused`: an answer that carries the last token it refused
//!   (a provider that echoes the token a retry replaced);
//! - `GET /redirect`: a 302 to `redirect_to` (another host);
//! - `GET /hang`: never answers.
//!
//! [`ApiStandin::refuse_next_token`] makes it answer 401 to the token of
//! the next request, and to every later request with that same token, as
//! a provider does once it has revoked an access token.
// Test helpers panic loudly, like the tests they serve.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

/// One request as the stand-in received it.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
    /// The body's bytes (the first 64 KiB).
    pub body: Vec<u8>,
    /// Whether its bearer token was live at the provider.
    pub authorized: bool,
}

impl Record {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One `GET /trickle/{mib}` as the stand-in sent it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trickle {
    /// Bytes handed to the connection so far.
    pub sent: usize,
    /// The whole answer was sent.
    pub done: bool,
    /// The reader went away before the end.
    pub cut: bool,
}

/// A running stand-in.
pub(crate) struct ApiStandin {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    pub records: Arc<Mutex<Vec<Record>>>,
    trickles: Arc<Mutex<Vec<Trickle>>>,
    refusals: Arc<Mutex<Refusals>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiStandin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tokens the stand-in refuses although the provider says they are live.
#[derive(Default)]
struct Refusals {
    next: bool,
    tokens: Vec<String>,
}

/// Bytes `i` of the download pattern.
pub(crate) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// A body fed from a channel (the stream and split answers).
struct Chan(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Chan {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

type Out = http_body_util::Either<Full<Bytes>, Chan>;

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Out> {
    let mut r = Response::new(http_body_util::Either::Left(Full::new(body.into())));
    *r.status_mut() = status;
    r
}

impl ApiStandin {
    /// A listener for it, bound before the broker's config is written
    /// (the config names the stand-in as `api_base`).
    pub(crate) fn bind() -> std::net::TcpListener {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        l
    }

    /// The introspection endpoint of the provider at `issuer` (from its
    /// metadata), where the stand-in checks tokens.
    pub(crate) async fn introspection_of(issuer: &str) -> String {
        let meta: serde_json::Value = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("{issuer}/.well-known/openid-configuration"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        meta["introspection_endpoint"].as_str().unwrap().to_string()
    }

    /// Serves on `listener`: tokens are checked at `introspection` with the
    /// client's id and secret; `/redirect` points at `redirect_to`.
    pub(crate) async fn start(
        listener: std::net::TcpListener,
        introspection: String,
        client_id: String,
        client_secret: String,
        redirect_to: String,
    ) -> ApiStandin {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let rec = records.clone();
        let refusals: Arc<Mutex<Refusals>> = Arc::default();
        let refs = refusals.clone();
        let trickles: Arc<Mutex<Vec<Trickle>>> = Arc::default();
        let tri = trickles.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let rec = rec.clone();
                let refs = refs.clone();
                let tri = tri.clone();
                let http = http.clone();
                let (intro, id, secret, to) = (
                    introspection.clone(),
                    client_id.clone(),
                    client_secret.clone(),
                    redirect_to.clone(),
                );
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let rec = rec.clone();
                        let refs = refs.clone();
                        let tri = tri.clone();
                        let http = http.clone();
                        let (intro, id, secret, to) =
                            (intro.clone(), id.clone(), secret.clone(), to.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                serve(req, rec, refs, tri, http, intro, id, secret, to).await,
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ApiStandin {
            base,
            records,
            trickles,
            refusals,
            task,
        }
    }

    /// Refuses, with 401, the token of the next request and every later
    /// request carrying it.
    pub(crate) fn refuse_next_token(&self) {
        self.refusals.lock().unwrap().next = true;
    }

    /// Every `GET /trickle/{mib}` so far, in order.
    pub(crate) fn trickles(&self) -> Vec<Trickle> {
        self.trickles.lock().unwrap().clone()
    }

    /// Every request received so far.
    pub(crate) fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().clone()
    }
}

/// The introspection of `token`: the `sub` when it is live.
async fn introspect(
    http: &reqwest::Client,
    url: &str,
    id: &str,
    secret: &str,
    token: &str,
) -> Option<String> {
    let v: serde_json::Value = http
        .post(url)
        .basic_auth(id, Some(secret))
        .form(&[("token", token), ("token_type_hint", "access_token")])
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    if v["active"] == true {
        Some(v["sub"].as_str().unwrap_or_default().to_string())
    } else {
        None
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    req: Request<hyper::body::Incoming>,
    records: Arc<Mutex<Vec<Record>>>,
    refusals: Arc<Mutex<Refusals>>,
    trickles: Arc<Mutex<Vec<Trickle>>>,
    http: reqwest::Client,
    intro: String,
    id: String,
    secret: String,
    redirect_to: String,
) -> Response<Out> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let token = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let refused = token.as_ref().is_some_and(|t| {
        let mut r = refusals.lock().unwrap();
        if std::mem::take(&mut r.next) {
            r.tokens.push(t.clone());
        }
        r.tokens.contains(t)
    });
    let sub = match &token {
        Some(_) if refused => None,
        Some(t) => introspect(&http, &intro, &id, &secret, t).await,
        None => None,
    };
    records.lock().unwrap().push(Record {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect(),
        body_len: body.len(),
        body: body[..body.len().min(64 * 1024)].to_vec(),
        authorized: sub.is_some(),
    });
    let (Some(sub), Some(token)) = (sub, token) else {
        let mut r = full(StatusCode::UNAUTHORIZED, r#"{"message":"Bad credentials"}"#);
        r.headers_mut()
            .insert("www-authenticate", "Bearer".parse().unwrap());
        return r;
    };
    let path = parts.uri.path();
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let json = |v: serde_json::Value| {
        let mut r = full(StatusCode::OK, v.to_string());
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        // Never passed on by the proxy.
        r.headers_mut()
            .insert("set-cookie", "session=standin; HttpOnly".parse().unwrap());
        r
    };
    match (parts.method.as_str(), segs.as_slice()) {
        ("GET" | "HEAD", ["user"]) => json(serde_json::json!({ "login": sub })),
        ("GET", ["repos", o, r, "issues"]) => json(serde_json::json!({
            "repo": format!("{o}/{r}"),
            "query": parts.uri.query(),
        })),
        ("DELETE", ["repos", o, r]) => json(serde_json::json!({
            "deleted": format!("{o}/{r}"),
        })),
        ("POST", ["repos", _, _, "pulls"]) => {
            let mut r = json(serde_json::json!({
                "received": body.len(),
                "sha256": hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &body)),
            }));
            *r.status_mut() = StatusCode::CREATED;
            r
        }
        ("GET", ["download", mib]) => {
            let n: usize = mib.parse().unwrap_or(1);
            let mut r = full(StatusCode::OK, pattern(n * 1024 * 1024));
            r.headers_mut()
                .insert("content-type", "application/octet-stream".parse().unwrap());
            r
        }
        ("GET", ["trickle", mib]) => {
            let n: usize = mib.parse().unwrap_or(1) * 1024 * 1024;
            let (tx, rx) = mpsc::channel(1);
            let at = {
                let mut t = trickles.lock().unwrap();
                t.push(Trickle::default());
                t.len() - 1
            };
            tokio::spawn(async move {
                let all = Bytes::from(pattern(n));
                let mut off = 0;
                while off < n {
                    let end = (off + 64 * 1024).min(n);
                    if tx.send(all.slice(off..end)).await.is_err() {
                        trickles.lock().unwrap()[at].cut = true;
                        return;
                    }
                    trickles.lock().unwrap()[at].sent = end;
                    off = end;
                    // About 3 MiB/s: a reader sees it in flight for 3 s.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // The end is sent once hyper polls past the last chunk.
                tx.closed().await;
                trickles.lock().unwrap()[at].done = true;
            });
            let mut r = Response::new(http_body_util::Either::Right(Chan(rx)));
            r.headers_mut()
                .insert("content-type", "application/octet-stream".parse().unwrap());
            r
        }
        ("GET", ["stream"]) => {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                for i in 0..5 {
                    if tx.send(Bytes::from(format!("chunk {i}\n"))).await.is_err() {
                        return;
                    }
                }
            });
            Response::new(http_body_util::Either::Right(Chan(rx)))
        }
        ("GET", ["echo", "start"]) => full(StatusCode::OK, format!("{token} is your token")),
        ("GET", ["echo", "refused"]) => {
            let last = refusals.lock().unwrap().tokens.last().cloned();
            full(
                StatusCode::OK,
                format!("you were refused {}", last.unwrap_or_default()),
            )
        }
        ("GET", ["echo", "header"]) => {
            let mut r = full(StatusCode::OK, "see the header");
            r.headers_mut().insert(
                "link",
                format!("<https://x.example/?t={token}>").parse().unwrap(),
            );
            r
        }
        ("GET", ["echo", "split"]) => {
            // 64 KiB of filler, then the token split over two chunks.
            let (tx, rx) = mpsc::channel(8);
            let (a, b) = token.split_at(token.len() / 2);
            let (a, b) = (a.to_string(), b.to_string());
            tokio::spawn(async move {
                let _ = tx.send(Bytes::from(vec![b'.'; 64 * 1024])).await;
                let _ = tx.send(Bytes::from(a)).await;
                let _ = tx.send(Bytes::from(b)).await;
                let _ = tx.send(Bytes::from_static(b"THE-END")).await;
            });
            Response::new(http_body_util::Either::Right(Chan(rx)))
        }
        ("GET", ["redirect"]) => {
            let mut r = full(StatusCode::FOUND, "");
            r.headers_mut()
                .insert("location", redirect_to.parse().unwrap());
            r
        }
        ("GET", ["hang"]) => {
            tokio::time::sleep(Duration::from_secs(120)).await;
            full(StatusCode::OK, "too late")
        }
        _ => full(StatusCode::NOT_FOUND, r#"{"message":"Not Found"}"#),
    }
}
