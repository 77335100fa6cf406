//! Running an instance: start-up from config, the accept loops of the three
//! listeners, housekeeping, and graceful shutdown.
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

use crate::config::Config;
use crate::exchange::Broker;
use crate::seal::Sealer;

/// Errors starting an instance.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Config.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Policy.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// Store.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Keys.
    #[error("signing keys: {0}")]
    Mint(#[from] crate::mint::MintError),
    /// Secret files.
    #[error("{what}: {source}")]
    Secret {
        /// Which secret.
        what: &'static str,
        /// Error.
        source: std::io::Error,
    },
    /// Sealing key.
    #[error("master key: {0}")]
    Seal(#[from] crate::seal::SealError),
    /// The vault (keys, records).
    #[error("vault: {0}")]
    Vault(#[from] crate::vault::VaultError),
    /// A provider (client secret file).
    #[error(transparent)]
    Upstream(#[from] crate::upstream::UpstreamError),
    /// The policy names a service the config does not define.
    #[error("the policy's service resources name {0:?}, which has no [providers.{0}] table in the config")]
    UnknownService(String),
    /// Subject-token issuers.
    #[error(transparent)]
    Subject(#[from] crate::subject::SetupError),
    /// Sockets.
    #[error(transparent)]
    Socket(#[from] crate::api::peer::SocketError),
    /// Other I/O.
    #[error("{0}")]
    Io(String),
    /// The policy is for another agent.
    #[error("the policy is written for agent {policy:?} but this instance serves {config:?}")]
    AgentMismatch {
        /// In the policy.
        policy: String,
        /// In the config.
        config: String,
    },
}

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

/// Everything an instance runs with.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The broker.
    pub broker: Arc<Broker>,
    /// The sealer for keys at rest.
    pub sealer: Arc<Sealer>,
    /// Connected accounts and allowances.
    pub vault: Arc<crate::vault::Vault>,
    /// Connect-link records.
    pub links: Arc<crate::connect::Links>,
    /// Third-party providers.
    pub providers: Arc<crate::upstream::Providers>,
    /// The public listener's bound address, once bound.
    pub public_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    /// The browser pages on the public listener.
    pub pages: Arc<crate::pages::Pages>,
}

/// Builds an instance from a validated config: opens the store, loads or
/// creates the signing key, loads the policy and the trusted issuers.
pub async fn build(
    config: Config,
    clock: crate::clock::SharedClock,
) -> Result<Instance, StartError> {
    let policy = crate::policy::Policy::load(&config.policy)?;
    if policy.agent != config.agent {
        return Err(StartError::AgentMismatch {
            policy: policy.agent,
            config: config.agent,
        });
    }
    let providers = Arc::new(crate::upstream::Providers::from_config(&config)?);
    if let Some(missing) = policy
        .services()
        .into_iter()
        .find(|s| providers.get(s).is_none())
    {
        return Err(StartError::UnknownService(missing.to_string()));
    }
    let master = crate::config::read_secret_file(&config.master_key_file).map_err(|source| {
        StartError::Secret {
            what: "keys.master_key_file",
            source,
        }
    })?;
    let sealer = Arc::new(Sealer::new(&master, &[])?);
    let store: Arc<dyn crate::store::Store> =
        Arc::new(crate::store::SledStore::open(&config.store)?);
    let ring = crate::mint::load_or_create(store.as_ref(), &sealer, clock.now())?;
    let vault = Arc::new(crate::vault::Vault::open(
        store.clone(),
        &config.vault_key_dir,
    )?);
    let links = Arc::new(crate::connect::Links::new(
        store.clone(),
        &crate::connect::Links::derive_key(&master),
        &config.issuer,
    ));
    let minter = Arc::new(crate::mint::Minter::new(
        config.issuer.clone(),
        config.agent.clone(),
        ring,
    ));
    // Our own tokens are never accepted as subject tokens; the check reads
    // the live key ring, so a rotated key is known at once.
    let m = minter.clone();
    let subjects = crate::subject::Validator::new(
        &config.trusted_issuers,
        Box::new(move |kid| m.is_own_kid(kid)),
    )
    .await?;
    let nonces = if config.dpop.require_nonce {
        let mut key = vec![0u8; 32];
        aws_lc_rs::rand::fill(&mut key).map_err(|_| StartError::Io("random".into()))?;
        Some(crate::dpop::Nonces::new(&crate::secret::SecretBytes::new(
            key,
        )))
    } else {
        None
    };
    let proofs = crate::dpop::Validator::new(
        config.dpop.algs.clone(),
        config.dpop.replay_capacity,
        nonces,
    );
    let audit = crate::events::Audit::open(&config.audit_log)
        .map_err(|e| StartError::Io(format!("audit log {}: {e}", config.audit_log.display())))?;
    let connected = Arc::new(crate::exchange::Connected {
        vault: vault.clone(),
        links: links.clone(),
        providers: providers.clone(),
    });
    let broker = Arc::new(
        Broker::new(
            config,
            policy,
            subjects,
            proofs,
            minter,
            audit,
            crate::metrics::Metrics::new(),
            store,
            clock,
        )
        .with_connected(connected),
    );
    // Providers found by discovery: learn their endpoints now (bounded),
    // so the pages can build authorization URLs; a failure is retried by
    // housekeeping and on the first refresh.
    for name in providers.names() {
        if let Some(p) = providers.get(name) {
            if p.cached_endpoints().is_none() {
                match tokio::time::timeout(p.config().timeout, p.endpoints()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(provider = %name, error = %e, "provider discovery failed; will retry")
                    }
                    Err(_) => {
                        tracing::warn!(provider = %name, "provider discovery timed out; will retry")
                    }
                }
            }
        }
    }
    let backend = crate::connect::Backend::new(
        vault.clone(),
        links.clone(),
        providers.clone(),
        broker.clock.clone(),
    );
    let pages = Arc::new(crate::pages::Pages::new(
        broker.clone(),
        sealer.clone(),
        crate::pages::Options {
            services: backend.services(),
            ..crate::pages::Options::default()
        },
    ));
    Ok(Instance {
        broker,
        sealer,
        vault,
        links,
        providers,
        public_addr: Arc::default(),
        pages,
    })
}

/// Binds the listeners named in the config.
pub async fn bind(config: &Config) -> Result<Listeners, StartError> {
    let api = crate::api::peer::bind(
        &config.socket.path,
        0o750,
        0o660,
        config.socket.group.as_deref(),
    )?;
    let admin = crate::api::peer::bind(&config.admin_socket, 0o700, 0o600, None)?;
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
    F: Future<Output = hyper::Response<crate::api::Body>> + Send + 'static,
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
    let reload = crate::policy::reload::spawn(broker.clone(), rx.clone());

    let b = broker.clone();
    let api = tokio::spawn(serve_unix(
        listeners.api,
        allowed,
        cfg.socket.max_connections,
        cfg.socket.header_timeout,
        move |uid, req| crate::api::handle(b.clone(), uid, req),
        rx.clone(),
    ));
    let inst = instance.clone();
    let admin = tokio::spawn(serve_unix(
        listeners.admin,
        // Only the broker's own user may use the admin socket.
        Arc::new(vec![crate::api::peer::current_uid()]),
        16,
        cfg.socket.header_timeout,
        move |_uid, req| crate::admin::handle(inst.clone(), req),
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
        let mut rx = rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        b.limits.housekeeping();
                        if let Some(c) = b.connected() {
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
