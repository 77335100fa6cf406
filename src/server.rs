//! Running an instance that `app` built: binding the listeners, the accept
//! loops of the three listeners, housekeeping, and graceful shutdown.
//!
//! [`run`] takes listeners that are already bound, so tests can bind a temp
//! socket and port 0 and call it in-process.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

use crate::app::{Instance, StartError};
use crate::config::Config;

/// The listeners of one instance.
#[derive(Debug)]
pub struct Listeners {
    /// The orchestrator socket.
    pub api: UnixListener,
    /// The admin socket.
    pub admin: UnixListener,
    /// The public TCP listener (metadata, JWKS, pages).
    pub public: Option<TcpListener>,
}

/// Binds the listeners named in the config.
pub async fn bind(config: &Config) -> Result<Listeners, StartError> {
    let api = crate::unix::bind(
        &config.socket.path,
        0o750,
        0o660,
        config.socket.group.as_deref(),
    )?;
    let admin = crate::unix::bind(&config.admin_socket, 0o700, 0o600, None)?;
    let public = match &config.public {
        Some(p) => Some(
            TcpListener::bind(p.listen)
                .await
                .map_err(|e| StartError::Io(format!("public listener {}: {e}", p.listen)))?,
        ),
        None => None,
    };
    Ok(Listeners { api, admin, public })
}

fn http1(header_timeout: Duration) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    // hyper's header-read timeout does nothing without a timer (see
    // `http1::Builder::header_read_timeout`); A1 in docs/SECURITY-CASES.md
    // checks that it fires.
    b.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(16 * 1024)
        .max_headers(64)
        .keep_alive(true);
    b
}

/// Serves one Unix listener: checks each peer's uid before reading a byte,
/// caps connections, and hands requests to `handler`.
async fn serve_unix<H, F>(
    listener: UnixListener,
    allowed: Arc<Vec<u32>>,
    max_conn: usize,
    header_timeout: Duration,
    handler: H,
    shutdown: tokio::sync::watch::Receiver<bool>,
) where
    H: Fn(u32, hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = hyper::Response<crate::http::Body>> + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(max_conn));
    // Refused peers are answered for a moment each; cap how many at once so
    // a flood from a refused uid cannot pile up tasks and descriptors.
    let refusals = Arc::new(Semaphore::new(64));
    let builder = http1(header_timeout);
    let mut shutdown = shutdown;
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let uid = match stream.peer_cred() {
            Ok(c) => c.uid(),
            Err(_) => continue,
        };
        if !allowed.contains(&uid) {
            tracing::warn!(
                peer_uid = uid,
                "connection refused: peer uid not in the allow-list"
            );
            // Nothing from this peer is parsed; it gets a fixed answer (if a
            // refusal slot is free, else none) and the connection is closed.
            let Ok(refusal) = refusals.clone().try_acquire_owned() else {
                continue;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _refusal = refusal;
                let mut s = stream;
                let body = br#"{"error":"access_denied","error_description":"peer uid is not allowed on this socket"}"#;
                let head = format!(
                    "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncache-control: no-store\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                // An HTTP client answered before it has sent its request
                // drops the answer as unsolicited, and one still writing
                // when the socket closes gets EPIPE: so wait (briefly) for
                // the request to start, answer, then drain a little before
                // closing. Whatever the peer sends is discarded unparsed.
                let mut sink = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_millis(500), s.read(&mut sink)).await;
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(body).await;
                    let _ = s.shutdown().await;
                    let mut left = 64 * 1024usize;
                    while left > 0 {
                        match s.read(&mut sink).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => left = left.saturating_sub(n),
                        }
                    }
                })
                .await;
            });
            continue;
        }
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!("connection refused: connection cap reached");
            continue;
        };
        let handler = handler.clone();
        let svc = service_fn(move |req| {
            let handler = handler.clone();
            async move { Ok::<_, std::convert::Infallible>(handler(uid, req).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
}

/// Runs an instance on bound listeners until `shutdown` resolves.
pub async fn run(
    instance: Instance,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StartError> {
    let broker = instance.broker.clone();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let cfg = broker.config.clone();
    let allowed = Arc::new(cfg.socket.allowed_uids.clone());
    // Before the sockets answer: installs the SIGHUP handler (see reload).
    let reload = crate::app::reload::spawn(broker.clone(), rx.clone());

    let b = broker.clone();
    let api = tokio::spawn(serve_unix(
        listeners.api,
        allowed,
        cfg.socket.max_connections,
        cfg.socket.header_timeout,
        move |uid, req| crate::api::handle(b.clone(), uid, req),
        rx.clone(),
    ));
    let handles = instance.admin_handles();
    let admin = tokio::spawn(serve_unix(
        listeners.admin,
        // Only the broker's own user may use the admin socket.
        Arc::new(vec![crate::unix::current_uid()]),
        16,
        cfg.socket.header_timeout,
        move |_uid, req| crate::admin::handle(handles.clone(), req),
        rx.clone(),
    ));
    let public = match listeners.public {
        Some(l) => {
            let tls = match &cfg.public.as_ref().and_then(|p| p.tls.clone()) {
                Some((cert, key)) => Some(crate::public::tls_acceptor(cert, key)?),
                None => None,
            };
            Some(tokio::spawn(crate::public::serve(
                l,
                tls,
                broker.clone(),
                instance.pages.clone(),
                rx.clone(),
            )))
        }
        None => None,
    };
    let house = {
        let b = broker.clone();
        let links = instance.links.clone();
        let pages = instance.pages.clone();
        let sealer = instance.sealer.clone();
        let mut rx = rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        b.limits.housekeeping();
                        // A scheduled key rotation activates here once due
                        // (the ring is store I/O and decryption).
                        let (kb, ks) = (b.clone(), sealer.clone());
                        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || kb.refresh_keys(&ks)).await {
                            tracing::warn!(error = %e, "reloading the signing key ring failed; the current keys stay in use");
                        }
                        if let Some(c) = b.connected_services() {
                            c.vault.housekeeping();
                            for name in c.providers.names() {
                                if let Some(p) = c.providers.get(name).filter(|p| p.cached_endpoints().is_none()) {
                                    let p = p.clone();
                                    tokio::spawn(async move {
                                        let _ = p.endpoints().await;
                                    });
                                }
                            }
                        }
                        let (links, now) = (links.clone(), b.clock.now());
                        // Sweeping expired connect links is store I/O.
                        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || links.sweep(now)).await {
                            tracing::warn!(error = %e, "sweeping expired connect links failed");
                        }
                        pages.housekeeping();
                    }
                    _ = rx.changed() => break,
                }
            }
        })
    };
    tracing::info!(
        agent = %cfg.agent,
        socket = %cfg.socket.path.display(),
        admin = %cfg.admin_socket.display(),
        public = ?cfg.public.as_ref().map(|p| p.listen),
        policy_hash = %broker.policy.load().hash,
        "credbroker is serving"
    );
    shutdown.await;
    tracing::info!("shutting down");
    let _ = tx.send(true);
    let _ = api.await;
    let _ = admin.await;
    if let Some(p) = public {
        let _ = p.await;
    }
    let _ = house.await;
    let _ = reload.await;
    let _ = std::fs::remove_file(&cfg.socket.path);
    let _ = std::fs::remove_file(&cfg.admin_socket);
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
