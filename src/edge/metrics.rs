//! The opt-in metrics listener (`[metrics] listen`): plain HTTP on TCP
//! for a collector that cannot read the admin socket (a Prometheus agent
//! beside the broker in a pod, a node's scraper on loopback). It serves
//! `GET` and `HEAD /metrics` and nothing else: the same exposition the
//! admin socket's `/metrics` renders, from the one registry, so the two
//! can never disagree. No authentication, which is why the config keeps
//! it on loopback unless a dangerous-named key says otherwise, and never
//! on the public listener's port.
//!
//! Its own small connection cap ([`MAX_CONNECTIONS`]): a scraper needs
//! one or two, and a flood on this port must not take descriptors or
//! tasks from the listeners that serve derives and pages. It stops with
//! the others at shutdown, answers in flight finishing first.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::base::http::Body;
use crate::derive::exchange::Broker;
use crate::edge::admin::exposition;

/// Open connections at most on the metrics listener; more are closed
/// unread (counted as `connections_refused_total{socket="metrics",
/// reason="cap"}`).
pub(crate) const MAX_CONNECTIONS: usize = 8;

fn plain(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// One request on the metrics listener: `GET`/`HEAD /metrics`, a 405 for
/// another method on it, a 404 for any other path. Nothing is read from
/// the request but its method and path.
pub(crate) fn handle<B>(b: &Broker, req: &Request<B>) -> Response<Body> {
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: this listener serves GET /metrics only\n",
        );
    }
    match *req.method() {
        Method::GET => exposition(b),
        Method::HEAD => crate::edge::public::head_of(exposition(b)),
        _ => {
            let mut r = plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: GET or HEAD\n",
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
    }
}

/// Serves the metrics listener until shutdown, then lets the answers in
/// flight finish (bounded) before returning.
pub(crate) async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    header_timeout: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(8 * 1024)
        .max_headers(32);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            broker
                .metrics
                .connections_refused
                .with_label_values(&["metrics", "cap"])
                .inc();
            continue;
        };
        let b = broker.clone();
        let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
            let answer = handle(&b, &req);
            async move { Ok::<_, std::convert::Infallible>(answer) }
        });
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    // Closed first, so that a scraper's new connection is refused at once
    // rather than waiting in the backlog until the process exits.
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}
