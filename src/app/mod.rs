//! The composition root: builds an instance from a validated config and
//! wires its parts together. Everything that needs to know about several
//! parts at once lives here, so the parts themselves import one way:
//!
//! - [`Instance`], [`build`], [`StartError`]: start-up; [`bind`] binds
//!   the listeners the config names, and [`server`] runs an instance this
//!   module built on them (accept loops, shutdown).
//! - [`backend`]: the pages' connected-services traits implemented on the
//!   link records, the vault and the providers.
//! - [`reload`]: hot reload of the policy file into the running broker.

pub(crate) mod backend;
pub(crate) mod bind;
pub(crate) mod housekeeping;
pub(crate) mod reload;
pub(crate) mod server;
pub(crate) mod ssf;

use std::sync::Arc;

use crate::derive::exchange::Broker;
use crate::infra::config::Config;
use crate::infra::seal::Sealer;

pub(crate) use backend::Backend;

/// Errors starting an instance.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Config.
    #[error(transparent)]
    Config(#[from] crate::infra::config::ConfigError),
    /// Policy.
    #[error(transparent)]
    Policy(#[from] crate::derive::policy::PolicyError),
    /// Store.
    #[error(transparent)]
    Store(#[from] crate::infra::store::StoreError),
    /// Keys.
    #[error("signing keys: {0}")]
    Mint(#[from] crate::derive::mint::MintError),
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
    Seal(#[from] crate::infra::seal::SealError),
    /// The vault (keys, records).
    #[error("vault: {0}")]
    Vault(#[from] crate::accounts::vault::VaultError),
    /// A provider (client secret file).
    #[error(transparent)]
    Upstream(#[from] crate::accounts::upstream::UpstreamError),
    /// An upstream authorization server could not be set up.
    #[error("{file}: {source}")]
    UpstreamAs {
        /// The config file.
        file: String,
        /// Why (names the key).
        source: crate::derive::upstreams::SetupError,
    },
    /// The policy names an upstream the config does not define.
    #[error("the policy's exchange resources name upstream {0:?}, which has no [upstreams.{0}] table in the config")]
    UnknownUpstream(String),
    /// The policy names a service the config does not define.
    #[error("the policy's service resources name {0:?}, which has no [providers.{0}] table in the config")]
    UnknownService(String),
    /// A `delivery = "proxy"` resource that breaks the proxy address rule,
    /// or whose provider has no `api_base` (the message names the file).
    #[error("{0}")]
    Proxy(String),
    /// The egress proxy cannot start: its HTTPS client to the providers'
    /// APIs could not be built (it trusts the platform's certificate
    /// authorities, and found none).
    #[error("the egress proxy cannot start (it serves /proxy/ on the public listener, public.listen in {file}): its HTTPS client to the providers' APIs: {source} (the certificate authorities are read from SSL_CERT_FILE and SSL_CERT_DIR when set, else from the system's store)")]
    ProxyClient {
        /// The config file.
        file: String,
        /// Why.
        source: rustls::Error,
    },
    /// A Shared Signals transmitter could not be set up (a secret file).
    #[error("{file}: {source}")]
    Ssf {
        /// The config file.
        file: String,
        /// Why (names the key).
        source: crate::derive::ssf::SetupError,
    },
    /// Subject-token issuers (a pinned JWKS file, named by its key).
    #[error("{file}: {source}")]
    Subject {
        /// The config file.
        file: String,
        /// Why.
        source: crate::accounts::subject::SetupError,
    },
    /// Sockets.
    #[error(transparent)]
    Socket(#[from] crate::base::unix::SocketError),
    /// A socket of the config could not be bound.
    #[error("{file}: {key}: {source}")]
    Listener {
        /// The config file.
        file: String,
        /// The key naming the socket.
        key: &'static str,
        /// Why.
        source: crate::base::unix::SocketError,
    },
    /// Other I/O.
    #[error("{0}")]
    Io(String),
    /// The policy is for another agent.
    #[error("{0}")]
    AgentMismatch(String),
    /// A value of the config that cannot be used, named by file and key.
    #[error("{file}: {key}: {detail}")]
    At {
        /// The config file.
        file: String,
        /// The key.
        key: &'static str,
        /// What is wrong (never a secret's value).
        detail: String,
    },
}

/// Everything an instance runs with.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The broker.
    pub broker: Arc<Broker>,
    /// The sealer for keys at rest.
    pub sealer: Arc<Sealer>,
    /// Connected accounts and allowances.
    pub vault: Arc<crate::accounts::vault::Vault>,
    /// Connect-link records.
    pub links: Arc<crate::accounts::connect::Links>,
    /// Third-party providers.
    pub providers: Arc<crate::accounts::upstream::Providers>,
    /// The public listener's bound address, once bound.
    pub public_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    /// The browser pages on the public listener.
    pub pages: Arc<crate::edge::pages::Pages>,
    /// The egress proxy on the public listener (`None` without one).
    pub(crate) proxy: Option<Arc<crate::edge::proxy::Proxy>>,
    /// The Shared Signals receiver (`None` without transmitters).
    pub(crate) ssf: Option<Arc<crate::derive::ssf::Receiver>>,
    /// This process among replicas (`<host>/<pid>/<boot id>`): the holder
    /// written in the leases it takes.
    pub(crate) holder: String,
    /// Event delivery: the webhook subscriptions and the event stream.
    pub(crate) events: Arc<crate::infra::webhooks::Hub>,
}

impl From<crate::edge::public::TlsError> for StartError {
    // The same messages as when `public` returned `StartError` itself.
    fn from(e: crate::edge::public::TlsError) -> Self {
        match e {
            crate::edge::public::TlsError::KeyFile(source) => StartError::Secret {
                what: "public.tls_key",
                source,
            },
            crate::edge::public::TlsError::Invalid(m) => StartError::Io(m),
        }
    }
}

impl From<&Broker> for crate::edge::pages::Deps {
    /// The four parts of the broker the pages use: the config's names, the
    /// clock, the store and the audit sink. The pages' clock is the
    /// corrected one (the database's time): their sessions, flows, links
    /// and approvals are shared with every replica.
    fn from(b: &Broker) -> Self {
        crate::edge::pages::Deps {
            issuer: b.config.issuer.clone(),
            agent: b.config.agent.clone(),
            trusted_issuers: b.config.trusted_issuers.clone(),
            clock: b.shared_clock.clone(),
            store: b.store.clone(),
            audit: b.audit.clone(),
            telemetry: b.telemetry.clone(),
        }
    }
}

impl From<Arc<Broker>> for crate::edge::pages::Deps {
    fn from(b: Arc<Broker>) -> Self {
        crate::edge::pages::Deps::from(&*b)
    }
}

impl Instance {
    /// The admin socket's handles: only what its commands need.
    pub fn admin_handles(&self) -> crate::edge::admin::Handles {
        crate::edge::admin::Handles {
            broker: self.broker.clone(),
            sealer: self.sealer.clone(),
            vault: self.vault.clone(),
            providers: self.providers.clone(),
            public_addr: self.public_addr.clone(),
            events: self.events.clone(),
            streams: Arc::default(),
            stop: None,
        }
    }
}

/// This process's name among replicas: `<host name>/<pid>`.
fn instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{host}/{}", std::process::id())
}

/// A fresh random id for this process's boot (128 bits, hex): the instance
/// name `<host>/<pid>` repeats after a restart under PID 1 in a container
/// with a fixed host name, the boot id never does. Derive nonces are bound
/// to it, and every audit event carries it.
fn boot_id() -> Result<String, StartError> {
    let mut id = [0u8; 16];
    aws_lc_rs::rand::fill(&mut id).map_err(|_| StartError::Io("boot id: no randomness".into()))?;
    Ok(hex::encode(id))
}

/// The DPoP nonce key's record (tree `State`): 32 random bytes sealed under
/// the master key.
const NONCE_KEY_RECORD: &[u8] = b"dpop/nonce_key/v1";

/// The DPoP nonce key: one record in the store, created once by
/// compare-and-swap (of replicas starting together, one creates it and the
/// others read it). Every replica holds it, so proxy nonces are valid at
/// every replica; derive nonces are bound to the instance and its boot as
/// well ([`crate::base::dpop::Nonces`]), so sharing the key lets no replica,
/// and no later process, accept another's derive nonce.
fn nonce_key(
    store: &dyn crate::infra::store::Store,
    sealer: &Sealer,
) -> Result<crate::base::secret::SecretBytes, StartError> {
    use crate::infra::store::Tree;
    let bad = |why: &str| {
        StartError::Io(format!(
            "DPoP nonce key (store tree state, record dpop/nonce_key/v1): {why}"
        ))
    };
    for _ in 0..4 {
        if let Some(sealed) = store.get(Tree::State, NONCE_KEY_RECORD)? {
            let key = sealer.open(NONCE_KEY_RECORD, &sealed).map_err(|_| {
                bad("does not decrypt under keys.master_key_file (not the master key this store was made with, or the record was altered)")
            })?;
            if key.expose().len() != 32 {
                return Err(bad("not 32 bytes"));
            }
            return Ok(key);
        }
        let mut key = vec![0u8; 32];
        aws_lc_rs::rand::fill(&mut key).map_err(|_| bad("no randomness"))?;
        let key = crate::base::secret::SecretBytes::new(key);
        let sealed = sealer
            .seal(NONCE_KEY_RECORD, key.expose())
            .map_err(|_| bad("encryption failed"))?;
        if store.compare_and_swap(Tree::State, NONCE_KEY_RECORD, None, Some(&sealed))? {
            return Ok(key);
        }
    }
    Err(bad(
        "changed by another process while it was created; try again",
    ))
}

/// Builds an instance from a validated config: loads the policy and the
/// trusted issuers (reading their pinned JWKS files) first, then opens the
/// store and loads or creates the signing key, so a start refused for a
/// bad file creates no store and no key.
pub async fn build(
    config: Config,
    clock: crate::base::clock::SharedClock,
) -> Result<Instance, StartError> {
    // Before any outbound client is built: one rule for them all.
    crate::base::http::set_use_env_proxy(config.use_env_proxy);
    let file = config.file.display().to_string();
    let policy = load_policy(&config, &file)?;
    check_store_path(&config, &file)?;
    // The egress proxy's client, before any other outbound client: a proxy
    // that cannot start is a start-up error that names its cause, not a
    // public listener that is never served.
    let proxy_client = match &config.public {
        Some(_) => Some(proxy_client(&config, &file)?),
        None => None,
    };
    let providers = providers_for(&config, &policy)?;
    let (master, sealer) = master_key(&config)?;
    let (subjects, own_minter) = subject_validator(&config).await?;
    let upstreams = upstreams(&config, &policy, &subjects)?;
    // With spans on, each store operation of a traced request has its own.
    let store = crate::infra::store::traced(config.store.open()?, config.telemetry.traces_on());
    // The offset from the database's clock, measured before the key ring
    // is loaded: a due activation it writes goes by the database's time.
    let skew = Arc::new(crate::infra::skew::Skew::new(&config.clock));
    crate::infra::skew::measure(store.as_ref(), &clock, &skew);
    let shared_now = crate::base::clock::Clock::now(
        crate::infra::skew::Corrected::new(clock.clone(), skew.clone()).as_ref(),
    );
    let records = open_records(&config, &store, &sealer, &master, shared_now)?;
    // The validator was built before the store (above); from here on its
    // own-key check reads the live key ring, so a rotated key is known at once.
    let _ = own_minter.set(records.minter.clone());
    let key_sets = subjects.key_sets();
    let instance = instance_name();
    let boot_id = boot_id()?;
    let holder = format!("{instance}/{boot_id}");
    let emails = ssf::emails(&config, &store);
    let (proofs, proxy_nonces) =
        proof_validator(&config, store.as_ref(), &sealer, &instance, &boot_id)?;
    let instance_for_telemetry = instance.clone();
    let audit = open_audit(
        &config,
        &master,
        boot_id,
        instance,
        store.is_shared(),
        &clock,
    )?;
    let connected = Arc::new(crate::derive::exchange::ConnectedServices {
        vault: records.vault.clone(),
        links: records.links.clone(),
        providers: providers.clone(),
    });
    let metrics = crate::infra::metrics::Metrics::new();
    let telemetry = telemetry(&config, &metrics, &instance_for_telemetry)?;
    let mut broker = Broker::new(
        config,
        policy,
        subjects,
        proofs,
        records.minter.clone(),
        audit,
        metrics,
        store,
        crate::derive::freeze::FreezeKey::derive(&master),
        clock,
    )
    .with_skew(skew)
    .with_connected_services(connected)
    .with_approvals(records.approvals.clone())
    .with_telemetry(telemetry);
    if let Some(n) = proxy_nonces {
        broker = broker.with_proxy_nonces(n);
    }
    if let Some(u) = upstreams {
        broker = with_upstreams(broker, u, &sealer, shared_now).await?;
    }
    let _ = broker
        .end_sessions
        .set(crate::edge::pages::session::end_person_sessions);
    if let Some(e) = emails {
        broker = broker.with_emails(e);
    }
    let broker = Arc::new(broker);
    let ssf = ssf::receiver(&broker, &key_sets).await?;
    discover_endpoints(&providers).await;
    let pages = pages(&broker, &sealer, &records, &providers, key_sets, &master);
    let proxy = proxy_client.map(|c| Arc::new(crate::edge::proxy::Proxy::new(broker.clone(), c)));
    Ok(Instance {
        events: event_hub(&broker)?,
        broker,
        sealer,
        vault: records.vault,
        links: records.links,
        providers,
        public_addr: Arc::default(),
        pages,
        proxy,
        ssf,
        holder,
    })
}

/// The broker with its upstream authorization servers, their metadata
/// resolved, and the client key read into memory now: an assertion or
/// actor token makes no store call.
async fn with_upstreams(
    broker: Broker,
    mut upstreams: crate::derive::upstreams::Upstreams,
    sealer: &Sealer,
    now: i64,
) -> Result<Broker, StartError> {
    let keys = Arc::new(crate::derive::client_keys::ClientKeys::load(
        broker.store.as_ref(),
        sealer,
        now,
    )?);
    upstreams.set_client_keys(keys.clone(), &broker.config.issuer, &broker.config.agent);
    upstreams.resolve_all().await;
    Ok(broker
        .with_client_keys(keys)
        .with_upstreams(Arc::new(upstreams)))
}

/// The webhook deliveries and the event stream of the instance's audit
/// events; its delivery id is kept beside the audit file.
fn event_hub(broker: &Broker) -> Result<Arc<crate::infra::webhooks::Hub>, StartError> {
    let hub = crate::infra::webhooks::Hub::new(
        &broker.config.webhooks,
        broker.store.clone(),
        broker.audit.clone(),
        broker.metrics.webhooks.clone(),
        broker.clock.clone(),
        &broker.config.agent,
    )
    .map_err(|e| {
        StartError::Io(format!(
            "webhook delivery id beside {}: {e}",
            broker.config.audit_log.display()
        ))
    })?;
    Ok(Arc::new(hub))
}

/// The policy file, refused when it is written for another agent than the
/// config's.
fn load_policy(config: &Config, file: &str) -> Result<crate::derive::policy::Policy, StartError> {
    let policy = crate::derive::policy::Policy::load(&config.policy)?;
    if policy.agent != config.agent {
        let text = std::fs::read_to_string(&config.policy).unwrap_or_default();
        return Err(StartError::AgentMismatch(agent_mismatch(
            &config.policy,
            &text,
            &policy.agent,
            file,
            &config.agent,
        )));
    }
    Ok(policy)
}

/// A store path that is not a directory fails here, before anything is
/// created, with the key that names it.
fn check_store_path(config: &Config, file: &str) -> Result<(), StartError> {
    if let Some(m) = config
        .store
        .sled_dir()
        .and_then(|d| std::fs::metadata(d).ok())
    {
        if !m.is_dir() {
            return Err(StartError::At {
                file: file.to_string(),
                key: "store",
                detail: format!(
                    "{} exists and is not a directory (the store is a directory)",
                    config
                        .store
                        .sled_dir()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                ),
            });
        }
    }
    Ok(())
}

/// The egress proxy's HTTPS client to the providers' APIs.
fn proxy_client(config: &Config, file: &str) -> Result<crate::edge::proxy::Upstream, StartError> {
    crate::edge::proxy::upstream_client(&config.proxy).map_err(|source| StartError::ProxyClient {
        file: file.to_string(),
        source,
    })
}

/// The config's providers, refused when the policy names a service none of
/// them is, or serves one through the proxy that cannot be ([`proxy_problem`]).
fn providers_for(
    config: &Config,
    policy: &crate::derive::policy::Policy,
) -> Result<Arc<crate::accounts::upstream::Providers>, StartError> {
    let providers = Arc::new(crate::accounts::upstream::Providers::from_config(config)?);
    if let Some(missing) = policy
        .services()
        .into_iter()
        .find(|s| providers.get(s).is_none())
    {
        return Err(StartError::UnknownService(missing.to_string()));
    }
    proxy_problem(policy, config).map_or(Ok(()), |m| Err(StartError::Proxy(m)))?;
    Ok(providers)
}

/// The master key (from its 0600 file) and the sealer of keys at rest made
/// from it.
fn master_key(
    config: &Config,
) -> Result<(crate::base::secret::SecretBytes, Arc<Sealer>), StartError> {
    let master =
        crate::infra::config::read_secret_file(&config.master_key_file).map_err(|source| {
            StartError::Secret {
                what: "keys.master_key_file",
                source,
            }
        })?;
    let sealer = Arc::new(Sealer::new(&master, &[]).map_err(|e| StartError::At {
        file: config.file.display().to_string(),
        key: "keys.master_key_file",
        detail: format!(
            "{}: {e} (it holds {} bytes; make one with `head -c 32 /dev/urandom`)",
            config.master_key_file.display(),
            master.expose().len()
        ),
    })?);
    Ok((master, sealer))
}

/// Where the subject validator learns our own minter once it exists.
type OwnMinter = Arc<std::sync::OnceLock<Arc<crate::derive::mint::Minter>>>;

/// The trusted issuers, and so their pinned JWKS files, before the store
/// is opened or a key created: a missing or broken file then leaves
/// nothing behind. Our own tokens are never accepted as subject tokens;
/// until the minter exists (it needs the store) every kid counts as ours,
/// which refuses rather than accepts, and nothing validates before
/// start-up ends anyway. The caller sets the returned cell to the minter.
async fn subject_validator(
    config: &Config,
) -> Result<(crate::accounts::subject::Validator, OwnMinter), StartError> {
    let own_minter: OwnMinter = Arc::default();
    let m = own_minter.clone();
    let subjects = crate::accounts::subject::Validator::new(
        &config.trusted_issuers,
        Box::new(move |kid| m.get().is_none_or(|m| m.is_own_kid(kid))),
    )
    .await
    .map_err(|source| StartError::Subject {
        file: config.file.display().to_string(),
        source,
    })?
    .with_max_lifetime(config.revocation.max_subject_token_lifetime);
    Ok((subjects, own_minter))
}

/// What the instance keeps in its store beside the broker's own records.
struct Records {
    /// Connected accounts and allowances.
    vault: Arc<crate::accounts::vault::Vault>,
    /// Connect-link records.
    links: Arc<crate::accounts::connect::Links>,
    /// Approval records.
    approvals: Arc<crate::derive::approve::Approvals>,
    /// The minter over the signing key ring.
    minter: Arc<crate::derive::mint::Minter>,
}

/// Loads or creates the signing keys, then opens the vault, the connect
/// links and the approvals over the store.
fn open_records(
    config: &Config,
    store: &Arc<dyn crate::infra::store::Store>,
    sealer: &Arc<Sealer>,
    master: &crate::base::secret::SecretBytes,
    now: i64,
) -> Result<Records, StartError> {
    let ring = crate::derive::mint::load_or_create(store.as_ref(), sealer, now)?;
    // No provider, no vault key: the key record is made only when a
    // provider could need it. The key directory is only read, to import the
    // keys of an older install.
    let vault = Arc::new(crate::accounts::vault::Vault::open_for(
        store.clone(),
        sealer.clone(),
        &config.vault_key_dir,
        !config.providers.is_empty(),
    )?);
    let links = Arc::new(crate::accounts::connect::Links::new(
        store.clone(),
        &crate::accounts::connect::Links::derive_key(master),
        &config.issuer,
    ));
    let approvals = Arc::new(crate::derive::approve::Approvals::new(
        store.clone(),
        &crate::derive::approve::Approvals::derive_key(master),
        &config.issuer,
    )?);
    let minter = Arc::new(crate::derive::mint::Minter::new(
        config.issuer.clone(),
        config.agent.clone(),
        ring,
    ));
    Ok(Records {
        vault,
        links,
        approvals,
        minter,
    })
}

/// The DPoP proof validator, and the proxy's nonces. Derive nonces: this
/// instance and this boot; proxy nonces: every replica (the proxy's replay
/// check is in the shared store).
fn proof_validator(
    config: &Config,
    store: &dyn crate::infra::store::Store,
    sealer: &Sealer,
    instance: &str,
    boot_id: &str,
) -> Result<
    (
        crate::base::dpop::Validator,
        Option<crate::base::dpop::Nonces>,
    ),
    StartError,
> {
    let (nonces, proxy_nonces) = if config.dpop.require_nonce {
        let key = nonce_key(store, sealer)?;
        (
            Some(crate::base::dpop::Nonces::new(
                &key,
                &format!("{instance}\n{boot_id}"),
            )),
            Some(crate::base::dpop::Nonces::proxy(&key)),
        )
    } else {
        (None, None)
    };
    let proofs = crate::base::dpop::Validator::new(
        config.dpop.algs.clone(),
        config.dpop.replay_capacity,
        nonces,
    );
    Ok((proofs, proxy_nonces))
}

/// Starts OpenTelemetry's exporters when `[telemetry]` names a collector;
/// the headers file is read now, with the secret-file checks.
fn telemetry(
    config: &Config,
    metrics: &crate::infra::metrics::Metrics,
    instance: &str,
) -> Result<Option<Arc<crate::infra::telemetry::Telemetry>>, StartError> {
    let cfg = &config.telemetry;
    let mut headers = http::HeaderMap::new();
    if let (Some(path), Some(_)) = (&cfg.headers_file, &cfg.otlp_endpoint) {
        let text =
            crate::infra::config::read_secret_file(path).map_err(|source| StartError::Secret {
                what: "telemetry.headers_file",
                source,
            })?;
        headers = crate::infra::telemetry::parse_headers(text.expose()).map_err(|line| {
            StartError::Io(format!(
                "{}: telemetry.headers_file: line {line} is not a `Name: value` header",
                config.file.display()
            ))
        })?;
    }
    crate::infra::telemetry::Telemetry::start(
        cfg,
        metrics,
        crate::infra::telemetry::Resource {
            instance: instance.to_string(),
        },
        headers,
    )
    .map_err(StartError::Io)
}

/// Opens the audit log: its value key, this boot's id, and (replicas) the
/// instance's name; a torn tail cut at open is recorded before the first
/// new event.
fn open_audit(
    config: &Config,
    master: &crate::base::secret::SecretBytes,
    boot_id: String,
    instance: String,
    shared_store: bool,
    clock: &crate::base::clock::SharedClock,
) -> Result<crate::infra::events::Audit, StartError> {
    let audit = crate::infra::events::Audit::open(&config.audit_log)
        .map_err(|e| StartError::Io(format!("audit log {}: {e}", config.audit_log.display())))?
        .with_value_key(&crate::infra::events::Audit::derive_key(master))
        .with_boot_id(boot_id);
    // Replicas write one audit file each about one shared state: each
    // event names the instance that wrote it (host name and process id: a
    // pod's name in Kubernetes).
    let audit = if shared_store {
        audit.with_instance(instance)
    } else {
        audit
    };
    // A torn tail was cut at open; say so before the first new event.
    audit
        .record_repair(clock.now(), &config.agent)
        .map_err(|e| StartError::Io(format!("audit log {}: {e}", config.audit_log.display())))?;
    Ok(audit)
}

/// Providers found by discovery: learn their endpoints now (bounded), so
/// the pages can build authorization URLs; a failure is retried by
/// housekeeping and on the first refresh.
async fn discover_endpoints(providers: &crate::accounts::upstream::Providers) {
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
}

/// The browser pages: connected services over the vault, links and
/// providers, and approvals offered only while the broker is not frozen.
fn pages(
    broker: &Arc<Broker>,
    sealer: &Arc<Sealer>,
    records: &Records,
    providers: &Arc<crate::accounts::upstream::Providers>,
    key_sets: std::collections::HashMap<String, Arc<crate::base::keyset::RemoteKeySet>>,
    master: &crate::base::secret::SecretBytes,
) -> Arc<crate::edge::pages::Pages> {
    let backend = Backend::new(
        records.vault.clone(),
        records.links.clone(),
        providers.clone(),
        broker.shared_clock.clone(),
        backend::Stopped::of(broker),
    );
    let weak = Arc::downgrade(broker);
    let approval_pages = backend::ApprovalBackend::new(
        records.approvals.clone(),
        // A broker that is gone offers nothing (fail closed).
        Box::new(move || weak.upgrade().is_none_or(|b| b.is_frozen())),
        backend::Stopped::of(broker),
    );
    Arc::new(crate::edge::pages::Pages::new(
        broker.clone(),
        sealer.clone(),
        crate::edge::pages::Options {
            services: backend.services(),
            approvals: approval_pages,
            key_sets,
            session_key: crate::edge::pages::session::Sessions::derive_key(master),
            ..crate::edge::pages::Options::default()
        },
    ))
}

/// The upstream authorization servers of the config (their client
/// secrets read now), when it has any; the policy's `exchange` resources
/// must each name one.
fn upstreams(
    config: &Config,
    policy: &crate::derive::policy::Policy,
    subjects: &crate::accounts::subject::Validator,
) -> Result<Option<crate::derive::upstreams::Upstreams>, StartError> {
    if let Some(missing) = policy
        .upstreams()
        .into_iter()
        .find(|u| !config.upstreams.contains_key(*u))
    {
        return Err(StartError::UnknownUpstream(missing.to_string()));
    }
    if config.upstreams.is_empty() {
        return Ok(None);
    }
    crate::derive::upstreams::Upstreams::new(
        &config.upstreams,
        &subjects.key_sets(),
        config.dpop.algs.clone(),
        config.dpop.replay_capacity,
    )
    .map(Some)
    .map_err(|source| StartError::UpstreamAs {
        file: config.file.display().to_string(),
        source,
    })
}

/// The message for a policy written for another agent, shared with reload:
/// the policy file with the line:col of its `agent` key, and the config
/// file's `agent`.
pub(crate) fn agent_mismatch(
    policy_file: &std::path::Path,
    policy_text: &str,
    policy_agent: &str,
    config_file: &str,
    config_agent: &str,
) -> String {
    let at = policy_text
        .lines()
        .enumerate()
        .find_map(|(i, l)| {
            let rest = l.trim_start().strip_prefix("agent")?;
            rest.trim_start().starts_with('=').then(|| {
                let col = l.find('=').map_or(1, |c| c + 1);
                format!(":{}:{}", i + 1, col + 1)
            })
        })
        .unwrap_or_default();
    format!(
        "{}{at}: agent: the policy is written for agent {policy_agent:?}, but {config_file} `agent` is {config_agent:?}",
        policy_file.display()
    )
}

/// What is wrong with the policy's proxy resources given this config, if
/// anything (start-up and reload): the proxy address rule
/// (`Policy::check_proxy_addresses`), and a provider with an `api_base` for
/// each of them. The message names the policy file, or the config file and
/// the key.
pub(crate) fn proxy_problem(
    policy: &crate::derive::policy::Policy,
    config: &crate::infra::config::Config,
) -> Option<String> {
    if let Err(m) = policy.check_proxy_addresses(&config.issuer) {
        return Some(format!("{}: {m}", config.policy.display()));
    }
    for r in policy.resources.values() {
        if let crate::derive::policy::Source::Service {
            service,
            delivery: crate::derive::policy::Delivery::Proxy,
        } = &r.source
        {
            let has_base = config
                .providers
                .get(service)
                .is_some_and(|p| p.api_base.is_some());
            if !has_base {
                return Some(format!(
                    "{}: providers.{service}.api_base: the policy serves service {service:?} through the proxy (delivery = \"proxy\"), so its provider needs api_base, the origin the proxy may call",
                    config.file.display()
                ));
            }
        }
    }
    None
}
