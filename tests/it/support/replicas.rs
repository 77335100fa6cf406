//! Replicas behind a load balancer: `n` instances of the real binary on one
//! PostgreSQL database ([`super::postgres::replicas_with`]), each with the
//! `acme` provider (the oidc-provider peer) configured as
//! [`super::services::ServiceEnv`] configures one broker, one issuer URL,
//! and a small forwarding proxy ([`Forwarder`]) in front of their public
//! listeners. The issuer URL is the forwarder's address, so every link,
//! redirect URI and `htu` names it, as in a deployment behind a Service;
//! the forwarder picks a replica per request, round-robin or as the test
//! directs, and records which replica served what.
//!
//! The orchestrator sockets and admin sockets are each replica's own (each
//! pod's orchestrator talks to its own sidecar).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::postgres::{replicas_with, Database};
use super::services::{broker_opts, Provider, ProviderOpts};
use super::TestBroker;

/// How the forwarder picks a replica for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// A, B, C, A, ... (one counter over every request).
    RoundRobin,
    /// Always this replica (its index).
    To(usize),
}

/// One request the forwarder passed on.
#[derive(Debug, Clone)]
pub(crate) struct Forwarded {
    pub method: String,
    /// The path, without the query (which may hold codes).
    pub path: String,
    /// The replica that answered (its index).
    pub replica: usize,
    pub status: u16,
}

#[derive(Debug)]
struct Routes {
    backends: Vec<String>,
    pick: Pick,
    /// Path prefixes sent to a given replica whatever `pick` says (e.g.
    /// the provider callback to C while the rest of a flow goes to B).
    by_prefix: Vec<(String, usize)>,
    next: usize,
    log: Vec<Forwarded>,
}

impl Routes {
    fn choose(&mut self, path: &str) -> Option<(usize, String)> {
        if self.backends.is_empty() {
            return None;
        }
        let i = match self
            .by_prefix
            .iter()
            .find(|(prefix, _)| path.starts_with(prefix.as_str()))
        {
            Some((_, i)) => *i,
            None => match self.pick {
                Pick::To(i) => i,
                Pick::RoundRobin => {
                    self.next += 1;
                    (self.next - 1) % self.backends.len()
                }
            },
        };
        Some((i, self.backends[i].clone()))
    }
}

/// A forwarding HTTP/1.1 proxy on a loopback port, in front of the
/// replicas' public listeners, as a load balancer (a Kubernetes Service)
/// would be: each request, also on a kept-alive connection, goes to the
/// replica picked for it, with its `Host` header unchanged; the answer
/// comes back as the replica gave it (redirects are not followed).
pub(crate) struct Forwarder {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    routes: Arc<Mutex<Routes>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    /// Binds a loopback port and serves on a thread of its own (with its
    /// own runtime, so a test blocking its runtime's workers does not stall
    /// the forwarder). Until [`Forwarder::set_backends`], every request is
    /// answered 502.
    pub(crate) fn start() -> Forwarder {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let routes = Arc::new(Mutex::new(Routes {
            backends: Vec::new(),
            pick: Pick::RoundRobin,
            by_prefix: Vec::new(),
            next: 0,
            log: Vec::new(),
        }));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let r = routes.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(serve(listener, r, rx));
        });
        Forwarder {
            addr,
            routes,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`: the replicas' issuer URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The replicas' public base URLs (`http://127.0.0.1:PORT`), by index.
    pub(crate) fn set_backends(&self, backends: Vec<String>) {
        self.routes.lock().unwrap().backends = backends;
    }

    /// How the next requests are spread (prefix routes still win).
    pub(crate) fn pick(&self, pick: Pick) {
        self.routes.lock().unwrap().pick = pick;
    }

    /// Sends requests whose path starts with `prefix` to `replica`,
    /// whatever [`Forwarder::pick`] says, until [`Forwarder::clear_prefixes`].
    pub(crate) fn route_prefix(&self, prefix: &str, replica: usize) {
        self.routes
            .lock()
            .unwrap()
            .by_prefix
            .push((prefix.to_string(), replica));
    }

    pub(crate) fn clear_prefixes(&self) {
        self.routes.lock().unwrap().by_prefix.clear();
    }

    /// Every request passed on so far, in order.
    pub(crate) fn log(&self) -> Vec<Forwarded> {
        self.routes.lock().unwrap().log.clone()
    }

    /// The replicas that answered requests for paths starting with `prefix`.
    pub(crate) fn served(&self, prefix: &str) -> Vec<usize> {
        self.log()
            .into_iter()
            .filter(|f| f.path.starts_with(prefix))
            .map(|f| f.replica)
            .collect()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    routes: Arc<Mutex<Routes>>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    // No proxy from the environment, no redirects followed: the browser
    // sees each replica's answer as it was.
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
        };
        let routes = routes.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let routes = routes.clone();
                let http = http.clone();
                async move { Ok::<_, std::convert::Infallible>(forward(req, &routes, &http).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110
/// section 7.6.1), or that the client recomputes.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "content-length",
];

async fn forward(
    req: Request<hyper::body::Incoming>,
    routes: &Mutex<Routes>,
    http: &reqwest::Client,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    let Some((replica, base)) = routes.lock().unwrap().choose(&path) else {
        return plain(StatusCode::BAD_GATEWAY, "no replicas yet");
    };
    let method = req.method().clone();
    let mut headers = req.headers().clone();
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return plain(StatusCode::BAD_REQUEST, "the request body did not arrive");
    };
    // The `Host` header stays the forwarder's (the issuer's), as a load
    // balancer keeps it; reqwest keeps a `Host` it is given.
    let answer = http
        .request(method.clone(), format!("{base}{path_and_query}"))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let Ok(answer) = answer else {
        routes.lock().unwrap().log.push(Forwarded {
            method: method.to_string(),
            path,
            replica,
            status: 502,
        });
        return plain(StatusCode::BAD_GATEWAY, "the replica did not answer");
    };
    let status = answer.status();
    let mut out_headers = answer.headers().clone();
    for h in HOP_BY_HOP {
        out_headers.remove(h);
    }
    let body = answer.bytes().await.unwrap_or_default();
    routes.lock().unwrap().log.push(Forwarded {
        method: method.to_string(),
        path,
        replica,
        status: status.as_u16(),
    });
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    *r.headers_mut() = out_headers;
    r
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r
}

/// The pool size of [`super::postgres::Database::config_toml`].
const DEFAULT_POOL: usize = 4;

/// The replicas, their provider and the forwarder in front of them.
pub(crate) struct ReplicaSet {
    /// By index: A, B, C.
    pub brokers: Vec<TestBroker>,
    pub lb: Forwarder,
    /// The `acme` provider, whose client's redirect URI is
    /// `{issuer}/callback/acme` (through the forwarder).
    pub provider: Provider,
    /// The forwarder's URL.
    pub issuer: String,
    pub db: Database,
}

impl ReplicaSet {
    /// Starts `n` replicas on `db` behind `lb` (started first, so its
    /// address can be put in a trusted issuer's redirect URIs, as
    /// [`super::oidc::OrgIdp::start`] needs), with the `acme` provider and
    /// `p` (its `extra_config`, `extra_policy`, `policy`, `log`;
    /// `public_listen` and `audit_log` are the harness's). Each replica's
    /// public listener is on a port of its own; the issuer URL is `lb`'s.
    pub(crate) fn start(lb: Forwarder, db: Database, n: usize, p: ProviderOpts) -> ReplicaSet {
        ReplicaSet::start_pooled(lb, db, n, p, DEFAULT_POOL)
    }

    /// [`ReplicaSet::start`] with `pool_size` connections per replica (the
    /// pool answers "busy" at once when every connection is in use, so a
    /// test of many concurrent derives per replica needs a larger one).
    /// With more than the default, connecting and each statement may take
    /// 10 s (opening many connections at once, SCRAM included, and serving
    /// them is slow for a debug build on two cores).
    pub(crate) fn start_pooled(
        lb: Forwarder,
        db: Database,
        n: usize,
        p: ProviderOpts,
        pool_size: usize,
    ) -> ReplicaSet {
        assert!(p.public_listen.is_none() && p.audit_log.is_none());
        let issuer = lb.url();
        let provider = Provider::start(&format!("{issuer}/callback/acme"));
        let mut opts = broker_opts(&p, &provider.peer, &provider.secrets);
        // The quick-start files name the forwarder as the issuer and the
        // listener; the listener is then moved to a port of its own.
        opts.public_listen = Some(lb.addr.clone());
        let listen = format!("\nlisten = \"{}\"\n", lb.addr);
        let pool = format!("\npool_size = {DEFAULT_POOL}\n");
        let edit = move |text: String| {
            assert!(text.contains(&listen), "the [public] listen line");
            assert!(text.contains(&pool), "the [postgres] pool_size line");
            let text = text.replacen(&listen, "\nlisten = \"127.0.0.1:0\"\n", 1);
            if pool_size == DEFAULT_POOL {
                return text;
            }
            text.replacen(&pool, &format!("\npool_size = {pool_size}\n"), 1)
                .replacen("connect_timeout = \"2s\"", "connect_timeout = \"10s\"", 1)
                .replacen(
                    "statement_timeout = \"2s\"",
                    "statement_timeout = \"10s\"",
                    1,
                )
        };
        let brokers = replicas_with(&db, n, &opts, &edit);
        for b in &brokers {
            assert_eq!(b.issuer, issuer, "one issuer URL");
        }
        lb.set_backends(brokers.iter().map(|b| b.public.clone()).collect());
        ReplicaSet {
            brokers,
            lb,
            provider,
            issuer,
            db,
        }
    }

    /// The audit events replica `i` wrote so far.
    pub(crate) fn audit(&self, i: usize) -> Vec<serde_json::Value> {
        super::read_audit(&self.brokers[i].path("audit.jsonl"))
    }

    /// The events named `event` that replica `i` wrote.
    pub(crate) fn events(&self, i: usize, event: &str) -> Vec<serde_json::Value> {
        self.audit(i)
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// `GET path` through the forwarder, directed at replica `i` (the
    /// forwarder stays directed there).
    pub(crate) async fn get_via(&self, i: usize, path: &str) -> reqwest::Response {
        self.lb.pick(Pick::To(i));
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .get(format!("{}{path}", self.issuer))
            .send()
            .await
            .unwrap()
    }
}
