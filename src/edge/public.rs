//! The public TCP listener: what resource servers and browsers reach. RFC
//! 8414 metadata and the JWKS here; every other path goes to the pages
//! (`pages::Pages::handle`), `/proxy/` to the egress proxy, and, when a
//! Shared Signals transmitter pushes, `{issuer}/ssf/events` to `edge::ssf`
//! (before the pages, whose cross-site rules and body cap it does not
//! follow). A request
//! whose `Host` framing RFC 9112 refuses (two `Host` lines, none in
//! HTTP/1.1) gets 400 and nothing else ([`crate::base::http::check_host`]).
//! TLS through rustls when a certificate is configured; plain HTTP only on
//! loopback (the config refuses anything else).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::base::http::{json_response, Body};
use crate::derive::exchange::Broker;
use crate::edge::pages::Pages;

const MAX_PUBLIC_CONNECTIONS: usize = 1024;

/// Why the public listener's TLS could not be set up. The composition root
/// turns it into its start-up error (`app::StartError`), so this module
/// does not depend on the wiring above it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The key file could not be read safely (missing, or not mode 0600).
    #[error("public.tls_key: {0}")]
    KeyFile(#[source] std::io::Error),
    /// The certificate or the key is not usable.
    #[error("{0}")]
    Invalid(String),
}

/// Builds a rustls acceptor from PEM files.
pub(crate) fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Invalid(format!("TLS certificate {}: {e}", cert.display())))?;
    let key_bytes = crate::infra::config::read_secret_file(key).map_err(TlsError::KeyFile)?;
    let key = PrivateKeyDer::from_pem_slice(key_bytes.expose()).map_err(|_| {
        TlsError::Invalid(format!("TLS key {}: not a PEM private key", key.display()))
    })?;
    let cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Invalid(format!("TLS configuration: {e}")))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// RFC 8414 metadata for this instance.
pub(crate) fn metadata(broker: &Broker) -> serde_json::Value {
    let iss = &broker.config.issuer;
    serde_json::json!({
        "issuer": iss,
        "jwks_uri": format!("{iss}/.well-known/jwks.json"),
        // Reached over the local socket only; it is also the htu base of
        // DPoP proofs sent to the socket.
        "token_endpoint": format!("{iss}/token"),
        "grant_types_supported": [crate::base::grammar::TOKEN_EXCHANGE],
        "token_endpoint_auth_methods_supported": ["none"],
        "dpop_signing_alg_values_supported":
            broker.config.dpop.algs.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
        "response_types_supported": [],
        "credbroker_derive_endpoint": format!("{iss}/v1/derive"),
        "credbroker_access_token_signing_alg_values_supported": ["ES256"],
    })
}

/// One cache policy for the two public documents: cacheable by anyone for
/// `max-age` seconds. `json_response` marks answers `no-store` with
/// `Pragma: no-cache`; a cacheable document drops the `Pragma`, so no
/// cache sees two contradicting policies.
fn with_cache(mut r: Response<Body>, max_age: &'static str) -> Response<Body> {
    let h = r.headers_mut();
    h.remove(header::PRAGMA);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(max_age));
    r
}

/// The metadata document with its cache policy (public listener and
/// orchestrator socket answer the same).
pub(crate) fn metadata_response(broker: &Broker) -> Response<Body> {
    with_cache(
        json_response(StatusCode::OK, &metadata(broker)),
        "public, max-age=300",
    )
}

/// A HEAD answer: the GET answer's status and headers (`Content-Length`
/// included), no body.
pub(crate) fn head_of(r: Response<Body>) -> Response<Body> {
    let (mut parts, body) = r.into_parts();
    let len = hyper::body::Body::size_hint(&body).exact().unwrap_or(0);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Response::from_parts(parts, Full::new(Bytes::new()))
}

/// Handles one public request from `client`.
pub(crate) async fn handle<B>(
    broker: Arc<Broker>,
    pages: Arc<Pages>,
    req: Request<B>,
    client: IpAddr,
) -> Response<Body>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // RFC 9112 section 3.2: nothing is served to a request whose Host
    // framing is refused (the proxy refuses it in its first stage).
    if let Err(f) = crate::base::http::check_host(req.version(), req.headers()) {
        return json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": "invalid_request", "error_description": f.to_string()}),
        );
    }
    let head = req.method() == Method::HEAD;
    let get = head || req.method() == Method::GET;
    let answer = match (get, req.uri().path()) {
        (true, "/.well-known/oauth-authorization-server") => metadata_response(&broker),
        (true, "/.well-known/jwks.json") => with_cache(
            json_response(
                StatusCode::OK,
                &broker.minter.ring().jwks(broker.clock.now()),
            ),
            // Short, so that rotated keys are seen quickly; the rotation
            // delay counts on it (config::ACTIVATION_DELAY).
            crate::derive::mint::JWKS_CACHE_CONTROL,
        ),
        // The client key's public keys (docs/UPSTREAM.md), for the upstream
        // authorization servers' `jwks_uri` of this broker's client: never
        // in the JWKS above, so nothing it signs verifies as our token.
        (true, "/.well-known/client-jwks.json") if broker.client_keys().is_some() => with_cache(
            json_response(
                StatusCode::OK,
                &broker
                    .client_keys()
                    .map(|k| k.jwks(broker.clock.now()))
                    .unwrap_or_default(),
            ),
            crate::derive::mint::JWKS_CACHE_CONTROL,
        ),
        (true, "/healthz") => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"ok\n")));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            r
        }
        // RFC 8414 requires `token_endpoint` in the metadata, and its URL
        // is the `htu` base of proofs, so both endpoints are named under the
        // issuer; they are served only on the orchestrator's socket. A
        // client that tries them here gets an OAuth error that says so, not
        // the pages' HTML 404.
        (_, path @ ("/token" | "/v1/derive")) => json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({
                "error": "invalid_request",
                "error_description": format!(
                    "{path} is served on the orchestrator's Unix socket (socket.path in the broker's config), not on the public listener"
                ),
            }),
        ),
        _ => return pages.handle(req, client).await,
    };
    if head {
        head_of(answer)
    } else {
        answer
    }
}

/// Serves the public listener until shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    broker: Arc<Broker>,
    pages: Arc<Pages>,
    proxy: Arc<crate::edge::proxy::Proxy>,
    ssf: Option<Arc<crate::derive::ssf::Receiver>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    // The push endpoint's path: the issuer's path, then `/ssf/events`.
    let ssf_path = url::Url::parse(&broker.config.issuer)
        .map(|u| {
            format!(
                "{}{}",
                u.path().trim_end_matches('/'),
                crate::edge::ssf::PATH
            )
        })
        .unwrap_or_else(|_| crate::edge::ssf::PATH.to_owned());
    let ssf = ssf
        .filter(|r| r.has_pushers())
        .map(|r| (r, Arc::new(ssf_path)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // The egress proxy (built with the instance) answers streams; its own
    // budget of calls in flight (proxy.max_in_flight) keeps slow streams
    // from taking every connection.
    let slots = Arc::new(Semaphore::new(MAX_PUBLIC_CONNECTIONS));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .max_buf_size(16 * 1024)
        .max_headers(64);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        // An answer goes out in several writes (the proxy sends its head,
        // then the body as it streams): with Nagle's algorithm on, a write
        // after the first waits for the client's delayed ACK, about 40 ms
        // on Linux. A failure only costs that latency.
        let _ = stream.set_nodelay(true);
        let b = broker.clone();
        let pg = pages.clone();
        let px = proxy.clone();
        let sf = ssf.clone();
        let client = peer.ip();
        let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
            let b = b.clone();
            let pg = pg.clone();
            let px = px.clone();
            let sf = sf.clone();
            async move {
                let answer = if req.uri().path().starts_with(crate::edge::proxy::PREFIX) {
                    px.handle(req).await
                } else if let Some((r, _)) =
                    sf.as_ref().filter(|(_, p)| req.uri().path() == p.as_str())
                {
                    crate::edge::ssf::handle(r.clone(), req)
                        .await
                        .map(Either::Left)
                } else {
                    handle(b, pg, req, client).await.map(Either::Left)
                };
                Ok::<_, std::convert::Infallible>(answer)
            }
        });
        match &tls {
            None => {
                let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(permit);
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let builder = builder.clone();
                // Watched from the accept on, as a plain connection is: a
                // TLS handshake or answer under way is drained too, not cut
                // when the process exits.
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let Ok(Ok(tls)) =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                            .await
                    else {
                        return;
                    };
                    let _ = watcher
                        .watch(builder.serve_connection(TokioIo::new(tls), svc))
                        .await;
                    drop(permit);
                });
            }
        }
    }
    // Closed before the drain: a new connection is refused at once (its
    // client or load balancer goes elsewhere) instead of waiting in the
    // backlog until the process exits.
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    // The proofs' replay entries still queued reach the store before it
    // closes (docs/PROXY.md, "A crash and the replay check").
    let px = proxy.clone();
    let _ = tokio::task::spawn_blocking(move || px.close_replays()).await;
}
