//! The proxy's HTTP client to the providers' APIs: hyper's pooled HTTP/1.1
//! client over rustls, and nothing besides. It reads no proxy from the
//! environment, follows no redirect, adds no request header of its own but
//! `Host`, and bounds connecting (TCP and TLS together) by
//! `proxy.connect_timeout`.
//!
//! A general-purpose client (reqwest, which the IdP and provider calls use)
//! would add layers the proxy turns off or never needs (redirects, cookies,
//! proxies from the environment) and parse each call's URL three more
//! times; here a call is one request on a pooled connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client: request bodies are read whole before they are sent.
pub(crate) type Upstream =
    Client<TimedConnect<hyper_rustls::HttpsConnector<HttpConnector>>, Full<Bytes>>;

/// The client, trusting the platform's certificate authorities (as the
/// broker's other outbound calls do). `https` or `http`: the configuration
/// allows `http` only for a loopback `api_base`.
pub(crate) fn upstream(connect_timeout: Duration) -> Result<Upstream, rustls::Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_platform_verifier()?
    .with_no_client_auth();
    Ok(upstream_with(connect_timeout, tls))
}

/// The client with the TLS configuration `tls` (tests give their own
/// certificate authority).
pub(crate) fn upstream_with(connect_timeout: Duration, tls: rustls::ClientConfig) -> Upstream {
    let mut http = HttpConnector::new();
    // The scheme is the TLS layer's to check: it takes `https` and `http`.
    http.enforce_http(false);
    // A request goes out in one or two writes and waits for its answer:
    // never hold the last segment back for an acknowledgement.
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(crate::base::http::OUTBOUND_POOL_IDLE)
        .pool_timer(TokioTimer::new())
        .build(TimedConnect {
            inner: https,
            timeout: connect_timeout,
        })
}

/// Whether the client's error is a connection that took longer than
/// `proxy.connect_timeout`.
pub(crate) fn is_connect_timeout(e: &hyper_util::client::legacy::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<ConnectTimeout>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Connecting took longer than `proxy.connect_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("connecting to the provider's API took longer than proxy.connect_timeout")]
pub(crate) struct ConnectTimeout;

/// A connector whose connections (TCP, then TLS) must be made within
/// `timeout`.
#[derive(Debug, Clone)]
pub(crate) struct TimedConnect<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower_service::Service<http::Uri> for TimedConnect<C>
where
    C: tower_service::Service<http::Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(made) => made.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimeout) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use http_body_util::BodyExt;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    /// A certificate for `127.0.0.1` and its key, made with the `openssl`
    /// command (as the PostgreSQL tests do).
    fn self_signed(dir: &Path) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let out = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-addext",
                "extendedKeyUsage=serverAuth",
            ])
            .current_dir(dir)
            .output()
            .expect("the openssl command runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            CertificateDer::from_pem_file(dir.join("cert.pem")).unwrap(),
            PrivateKeyDer::from_pem_file(dir.join("key.pem")).unwrap(),
        )
    }

    /// An HTTPS server on loopback with `cert`, answering every request
    /// 200 with its `Host` header; returns its port and the count of
    /// requests it answered. With `stall`, it accepts connections and
    /// never says a word of TLS.
    async fn https_server(
        cert: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
        stall: bool,
    ) -> (u16, Arc<AtomicUsize>) {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                if stall {
                    held.push(tcp);
                    continue;
                }
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            count.fetch_add(1, Ordering::SeqCst);
                            let host = req.headers().get(http::header::HOST).cloned();
                            async move {
                                let body = host.map(|h| Bytes::copy_from_slice(h.as_bytes()));
                                Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                    body.unwrap_or_default(),
                                )))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        (port, served)
    }

    fn get(port: u16) -> Request<Full<Bytes>> {
        Request::get(format!("https://127.0.0.1:{port}/x"))
            .body(Full::default())
            .unwrap()
    }

    /// The TLS configuration of a client that trusts `cert` alone.
    fn trusting(cert: CertificateDer<'static>) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
    }

    #[tokio::test]
    async fn an_api_whose_certificate_no_trusted_authority_signed_is_never_sent_a_request() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path());
        let (port, served) = https_server(cert.clone(), key, false).await;
        // The platform's authorities never signed the test certificate.
        let platform = upstream(Duration::from_secs(5)).unwrap();
        let e = platform.request(get(port)).await.unwrap_err();
        assert!(e.is_connect(), "{e:?}");
        assert!(!is_connect_timeout(&e));
        assert_eq!(served.load(Ordering::SeqCst), 0);
        // Positive control: a client trusting it is served, over TLS, with
        // the API's host in Host.
        let trusted = upstream_with(Duration::from_secs(5), trusting(cert));
        let r = trusted.request(get(port)).await.unwrap();
        assert_eq!(r.status(), 200);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], format!("127.0.0.1:{port}").as_bytes());
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_tls_handshake_that_never_ends_is_a_connect_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path());
        let (stalled, _) = https_server(cert.clone(), key.clone_key(), true).await;
        let client = upstream_with(Duration::from_millis(300), trusting(cert));
        let started = std::time::Instant::now();
        let e = client.request(get(stalled)).await.unwrap_err();
        assert!(is_connect_timeout(&e), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // Positive control: the same client, to a server that answers.
        let (port, served) = https_server(
            CertificateDer::from_pem_file(dir.path().join("cert.pem")).unwrap(),
            key,
            false,
        )
        .await;
        assert_eq!(client.request(get(port)).await.unwrap().status(), 200);
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }
}
