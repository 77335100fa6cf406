//! Binding the listeners the config names, before the instance is built:
//! the TCP ports first (the public listener, then the metrics listener),
//! so that a busy port fails before any socket file exists, then the Unix
//! sockets. [`crate::app::server::run`] serves what this bound.

use tokio::net::{TcpListener, UnixListener};

use crate::app::StartError;
use crate::infra::config::Config;

/// The listeners of one instance.
#[derive(Debug)]
pub struct Listeners {
    /// The orchestrator socket.
    pub api: UnixListener,
    /// The admin socket.
    pub admin: UnixListener,
    /// The public TCP listener (metadata, JWKS, pages).
    pub public: Option<TcpListener>,
    /// The opt-in metrics listener (`[metrics] listen`): `GET /metrics`.
    pub metrics: Option<TcpListener>,
    /// The socket files and directories binding created, removed again if
    /// the start fails after binding ([`Listeners::abandon`]).
    pub created: crate::base::unix::Created,
}

impl Listeners {
    /// Closes the listeners and removes what binding them created: a start
    /// that fails after binding leaves nothing behind.
    pub fn abandon(self) {
        let Listeners {
            api,
            admin,
            public,
            metrics,
            mut created,
        } = self;
        drop((api, admin, public, metrics));
        created.remove_all();
    }
}

/// Binds the listeners named in the config: the TCP ports first (the
/// public listener, then the metrics listener: a busy port then fails
/// before any socket file exists), then the sockets. On an
/// error, whatever was created is removed again; the message names the
/// config file and the key.
pub(crate) async fn bind(config: &Config) -> Result<Listeners, StartError> {
    let file = config.file.display().to_string();
    let public = bind_tcp(
        &file,
        "public.listen",
        config.public.as_ref().map(|p| p.listen),
    )
    .await?;
    let metrics = bind_tcp(
        &file,
        "metrics.listen",
        config.metrics.as_ref().map(|m| m.listen),
    )
    .await?;
    let mut created = crate::base::unix::Created::default();
    let sock = |key: &'static str| {
        let file = file.clone();
        move |source| StartError::Listener { file, key, source }
    };
    let api = match crate::base::unix::bind(
        &config.socket.path,
        0o750,
        0o660,
        config.socket.group.as_deref(),
        &mut created,
    ) {
        Ok(l) => l,
        Err(e) => {
            created.remove_all();
            return Err(sock("socket.path")(e));
        }
    };
    let admin =
        match crate::base::unix::bind(&config.admin_socket, 0o700, 0o600, None, &mut created) {
            Ok(l) => l,
            Err(e) => {
                drop(api);
                created.remove_all();
                return Err(sock("admin.socket")(e));
            }
        };
    Ok(Listeners {
        api,
        admin,
        public,
        metrics,
        created,
    })
}

/// Binds a TCP listener the config names at `key`, if it names one.
async fn bind_tcp(
    file: &str,
    key: &str,
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<TcpListener>, StartError> {
    let Some(addr) = addr else { return Ok(None) };
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(Some(l)),
        Err(e) => Err(StartError::Io(format!(
            "{file}: {key}: cannot listen on {addr}: {e}"
        ))),
    }
}
