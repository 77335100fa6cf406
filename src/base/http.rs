//! HTTP helpers that every listener shares: the response body type, JSON
//! answers, the one capped body reader, and the correlation id of an
//! unexpected error.
//!
//! A leaf: it imports no other module of the crate, so the orchestrator
//! socket (`api`), the admin socket, the public listener and the pages all
//! use it without importing each other.

use ::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

/// The response body type of every handler.
pub(crate) type Body = Full<Bytes>;

/// A JSON response with `Cache-Control: no-store`.
pub(crate) fn json_response<T: serde::Serialize + ?Sized>(
    status: StatusCode,
    body: &T,
) -> Response<Body> {
    // Serialising a `Value` or one of the answers' typed bodies cannot fail
    // (string keys, no maps with other keys); the empty fallback only keeps
    // this total. Most answers fit the first allocation.
    let mut bytes = Vec::with_capacity(1024);
    if serde_json::to_writer(&mut bytes, body).is_err() {
        bytes.clear();
    }
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    r
}

/// A request's `Host` framing that RFC 9112 section 3.2 requires a server
/// to refuse with 400: more than one `Host` field line, or none in an
/// HTTP/1.1 request (HTTP/1.0 may omit it). The other framing rules of RFC
/// 9112 are hyper's: it refuses two different `Content-Length`s and
/// obsolete line folding with 400, and reads a request with both
/// `Transfer-Encoding` and `Content-Length` by `Transfer-Encoding` alone,
/// then closes the connection (section 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HostFraming {
    /// Two or more `Host` lines.
    #[error("more than one Host header (RFC 9112 section 3.2)")]
    Several,
    /// An HTTP/1.1 request without `Host`.
    #[error("an HTTP/1.1 request needs a Host header (RFC 9112 section 3.2)")]
    Missing,
}

/// Checks the request's `Host` lines ([`HostFraming`]).
pub(crate) fn check_host(version: ::http::Version, headers: &HeaderMap) -> Result<(), HostFraming> {
    match headers.get_all(header::HOST).iter().count() {
        0 if version == ::http::Version::HTTP_11 => Err(HostFraming::Missing),
        0 | 1 => Ok(()),
        _ => Err(HostFraming::Several),
    }
}

/// A fresh correlation id (16 hex digits) for an unexpected error: the
/// caller logs it with the cause and shows the client only the id, so an
/// operator can find the cause and the client learns no internals.
pub(crate) fn correlation_id() -> String {
    let mut id = [0u8; 8];
    // Without randomness the id is all zeros: still a valid answer, and the
    // log line next to it still carries the cause.
    let _ = aws_lc_rs::rand::fill(&mut id);
    hex::encode(id)
}

/// Why a request body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BodyError {
    /// `Content-Length` is not a number.
    #[error("bad Content-Length")]
    BadLength,
    /// The body is larger than the cap (announced or actual).
    #[error("the body is larger than the cap")]
    TooLarge,
    /// The connection failed while the body was read.
    #[error("the body could not be read")]
    Unreadable,
}

/// Reads a request body of at most `max` bytes: an announced
/// `Content-Length` over the cap is refused before a byte is read, and the
/// body itself is cut off at the cap (a chunked body announces nothing).
pub(crate) async fn read_capped<B>(
    headers: &HeaderMap,
    body: B,
    max: usize,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) if n > max as u64 => return Err(BodyError::TooLarge),
            Some(_) => {}
            None => return Err(BodyError::BadLength),
        }
    }
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyError::TooLarge)
        }
        Err(_) => Err(BodyError::Unreadable),
    }
}

/// How long an idle outbound connection is kept for reuse: below the
/// keep-alive timeouts that servers commonly use (Node.js and Apache httpd
/// close an idle connection after 5 s). A request written on a connection
/// the server is closing at that moment fails ("connection closed before
/// message completed"), and a POST such as a code exchange cannot be sent
/// again; a connection idle this long is closed here first, and the next
/// request opens a new one.
pub(crate) const OUTBOUND_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// The builder every reqwest client starts from (the IdPs' and the
/// providers' endpoints), with [`OUTBOUND_POOL_IDLE`]. Callers add their
/// own timeouts, redirect and proxy policy. The egress proxy's client to
/// the providers' APIs is hyper's own (`proxy::client`), with the same
/// idle bound.
pub(crate) fn outbound_client() -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder().pool_idle_timeout(OUTBOUND_POOL_IDLE);
    if USE_ENV_PROXY.load(std::sync::atomic::Ordering::Relaxed) {
        b
    } else {
        b.no_proxy()
    }
}

/// `[outbound] use_env_proxy` (default true): whether the clients built
/// by [`outbound_client`] honour `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`
/// and `NO_PROXY` (reqwest's reading of them). One rule for every OAuth
/// call: the IdPs', the providers' and the upstream authorization servers'.
static USE_ENV_PROXY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets the rule of [`USE_ENV_PROXY`] for the clients built from now on;
/// called once at start, from the config, before any client is built.
pub(crate) fn set_use_env_proxy(on: bool) {
    USE_ENV_PROXY.store(on, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP/1.1 server that keeps connections alive but, like a server
    /// whose keep-alive timeout has just run out, closes a connection that
    /// has been idle for `idle_close` when the next request arrives on it,
    /// without answering (hyper closes a connection whose service fails).
    /// Answers every other request `200 ok`.
    async fn closes_idle_connections(idle_close: std::time::Duration) -> String {
        use std::sync::{Arc, Mutex};
        use std::time::Instant;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let last_answer: Arc<Mutex<Option<Instant>>> = Arc::default();
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let last_answer = last_answer.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            let mut last = last_answer.lock().unwrap();
                            if last.is_some_and(|t| t.elapsed() >= idle_close) {
                                return Err("idle past the keep-alive timeout");
                            }
                            *last = Some(Instant::now());
                            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
                );
            }
        });
        format!("http://{addr}/token")
    }

    /// A GET, then, after an idle time the server's keep-alive does not
    /// outlast, a POST (a code exchange's shape).
    async fn post_after_idle(
        client: reqwest::Client,
        url: &str,
        idle: std::time::Duration,
    ) -> bool {
        let first = client.get(url).send().await.unwrap();
        assert_eq!(first.text().await.unwrap(), "ok");
        tokio::time::sleep(idle).await;
        match client.post(url).body("code=x").send().await {
            Ok(r) => r.text().await.is_ok_and(|t| t == "ok"),
            Err(_) => false,
        }
    }

    #[tokio::test]
    async fn an_idle_connection_is_not_reused_once_a_server_may_be_closing_it() {
        // The server gives up on a connection idle for the pool's time plus
        // 300 ms; the request comes after 500 ms more than the pool's time.
        let url =
            closes_idle_connections(OUTBOUND_POOL_IDLE + std::time::Duration::from_millis(300))
                .await;
        let idle = OUTBOUND_POOL_IDLE + std::time::Duration::from_millis(500);
        let ours = outbound_client().no_proxy().build().unwrap();
        // The control: reqwest's default pool (90 s) reuses the connection
        // the server has given up on, and the POST fails.
        let default = reqwest::Client::builder().no_proxy().build().unwrap();
        let (ours, default) = tokio::join!(
            post_after_idle(ours, &url, idle),
            post_after_idle(default, &url, idle)
        );
        assert!(!default, "the default pool's POST went through: the server did not act as one closing idle connections");
        assert!(ours, "the POST after an idle time failed");
    }

    fn headers(len: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(l) = len {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    #[tokio::test]
    async fn read_capped_refuses_announced_and_actual_oversize() {
        let big = Full::new(Bytes::from(vec![b'a'; 11]));
        assert_eq!(
            read_capped(&headers(Some("11")), big.clone(), 10).await,
            Err(BodyError::TooLarge)
        );
        // Nothing announced: cut off at the cap.
        assert_eq!(
            read_capped(&headers(None), big, 10).await,
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            read_capped(&headers(Some("ten")), Full::new(Bytes::new()), 10).await,
            Err(BodyError::BadLength)
        );
        // Positive control: at the cap is fine.
        let ok = Full::new(Bytes::from(vec![b'a'; 10]));
        assert_eq!(
            read_capped(&headers(Some("10")), ok, 10)
                .await
                .unwrap()
                .len(),
            10
        );
    }

    #[test]
    fn correlation_ids_are_fresh_hex() {
        let (a, b) = (correlation_id(), correlation_id());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
