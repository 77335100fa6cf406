//! Opening connections: the client settings and TLS of a [`PgSettings`],
//! and how a failed attempt is reported. A connection that cannot be
//! opened names the address, the cause (connection refused, timed out,
//! TLS, the credentials, a missing database) and the settings to check,
//! in the config file's terms; the driver's own text ("error connecting
//! to server") names none of them.

use std::sync::Arc;
use std::time::Duration;

use super::{pg_error, PgSettings};
use crate::infra::store::StoreError;

/// The connection settings and TLS of `s`, with the password read now.
pub(super) fn client_config(s: &PgSettings) -> Result<(tokio_postgres::Config, Tls), StoreError> {
    let mut c = tokio_postgres::Config::new();
    c.host(&s.host)
        .port(s.port)
        .dbname(&s.database)
        .user(&s.user)
        .application_name("credbroker")
        .connect_timeout(s.connect_timeout)
        // A peer that vanished without closing (a dead node) is noticed
        // within a minute instead of the kernel's two hours.
        .keepalives_idle(Duration::from_secs(30))
        .options(format!(
            "-c synchronous_commit=on -c statement_timeout={}",
            s.statement_timeout.as_millis()
        ));
    if let Some(p) = &s.password_file {
        let secret = crate::base::secret::read_secret_file(p).map_err(|e| {
            StoreError::Backend(s.at("postgres.password_file", format!("{}: {e}", p.display())))
        })?;
        let pw = secret.expose();
        // One trailing newline is the file's, not the password's.
        let pw = pw.strip_suffix(b"\n").unwrap_or(pw);
        c.password(pw);
    }
    let tls = match &s.ca_file {
        None => Tls::None,
        Some(ca) => Tls::Rustls(tls_connector(ca).map_err(|e| {
            StoreError::Backend(s.at("postgres.tls.ca_file", format!("{}: {e}", ca.display())))
        })?),
    };
    Ok((c, tls))
}

#[derive(Clone)]
pub(super) enum Tls {
    None,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// TLS that trusts only the CA in `ca` (PEM), with the server's name
/// checked against its certificate.
fn tls_connector(ca: &std::path::Path) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
        let cert = cert.map_err(|e| e.to_string())?;
        roots.add(cert).map_err(|e| e.to_string())?;
        n += 1;
    }
    if n == 0 {
        return Err("holds no PEM certificate".into());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// What a failed connection attempt names: where it went, and the file
/// whose settings say so. Cheap to clone into the store's tasks.
#[derive(Debug, Clone)]
pub(super) struct Reach(Arc<ReachInner>);

#[derive(Debug)]
struct ReachInner {
    config_file: String,
    /// `host:port`, or the socket directory and port.
    address: String,
    database: String,
    socket_dir: bool,
    connect_timeout: Duration,
}

const HOST_PORT: &[&str] = &["postgres.host", "postgres.port"];
const TIMED_OUT: &[&str] = &["postgres.host", "postgres.port", "postgres.connect_timeout"];

impl Reach {
    pub(super) fn new(s: &PgSettings) -> Reach {
        let socket_dir = s.host.starts_with('/');
        let address = if socket_dir {
            format!("socket directory {} (port {})", s.host, s.port)
        } else if s.host.contains(':') {
            // An IPv6 address, written as in a URL.
            format!("[{}]:{}", s.host, s.port)
        } else {
            format!("{}:{}", s.host, s.port)
        };
        Reach(Arc::new(ReachInner {
            config_file: s.config_file.display().to_string(),
            address,
            database: s.database.clone(),
            socket_dir,
            connect_timeout: s.connect_timeout,
        }))
    }

    /// The configured bound on opening a connection.
    pub(super) fn connect_timeout(&self) -> Duration {
        self.0.connect_timeout
    }

    /// No connection within `limit` (the connect timeout, or the
    /// operation's bound when that came first): a host that drops the
    /// packets, or a server (or something else) that accepts the
    /// connection and never answers.
    pub(super) fn timed_out(&self, limit: Duration) -> StoreError {
        StoreError::Unavailable(self.text(TIMED_OUT, &self.timed_out_cause(limit)))
    }

    fn timed_out_cause(&self, limit: Duration) -> String {
        format!(
            "timed out after {} (postgres.connect_timeout is {}): nothing answered as \
             PostgreSQL would (a host that drops the connection, a firewall, a hung server \
             or another service on that port)",
            span(limit),
            span(self.0.connect_timeout)
        )
    }

    /// A connection attempt the driver gave up on: the same class
    /// ([`pg_error`]: unavailable or a backend error) with the address,
    /// the cause and the settings to check. Only the server's message and
    /// code, and the causes' texts (I/O, TLS), are kept: none of them holds
    /// a value of the config or a secret.
    pub(super) fn failed(&self, e: tokio_postgres::Error) -> StoreError {
        let (keys, cause) = self.cause(&e);
        let text = self.text(&keys, &cause);
        match pg_error(e) {
            StoreError::Unavailable(_) => StoreError::Unavailable(text),
            _ => StoreError::Backend(text),
        }
    }

    fn cause(&self, e: &tokio_postgres::Error) -> (Vec<&'static str>, String) {
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            let said = format!("the server said: {} (SQLSTATE {code})", db.message());
            let keys: &[&str] = match code {
                // 28000 invalid authorization (no pg_hba.conf entry),
                // 28P01 a wrong password.
                c if c.starts_with("28") => &["postgres.user", "postgres.password_file"],
                "3D000" => &["postgres.database"],
                // Insufficient privilege (no CONNECT on the database).
                "42501" => &["postgres.user", "postgres.database"],
                _ => HOST_PORT,
            };
            return (keys.to_vec(), said);
        }
        let mut details = Vec::new();
        let mut io_kind = None;
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                io_kind.get_or_insert(io.kind());
            }
            details.push(s.to_string());
            src = s.source();
        }
        let detail = if details.is_empty() {
            e.to_string()
        } else {
            details.join(": ")
        };
        let text = e.to_string();
        if text.starts_with("error performing TLS") {
            let cause = format!("the TLS handshake failed: {detail}");
            return (vec!["postgres.tls.ca_file", "postgres.host"], cause);
        }
        if text.starts_with("authentication error") {
            let cause = format!("authentication failed: {detail}");
            return (vec!["postgres.user", "postgres.password_file"], cause);
        }
        use std::io::ErrorKind as K;
        let cause = match io_kind {
            Some(K::ConnectionRefused) => {
                "connection refused (nothing listens there: is the server running, on that \
                 address and port?)"
                    .to_string()
            }
            Some(K::TimedOut) => {
                return (
                    TIMED_OUT.to_vec(),
                    self.timed_out_cause(self.0.connect_timeout),
                )
            }
            Some(K::NotFound) if self.0.socket_dir => {
                "no server socket there (is the server running, with that socket directory \
                 and port?)"
                    .to_string()
            }
            _ => format!("{text}: {detail}"),
        };
        (HOST_PORT.to_vec(), cause)
    }

    fn text(&self, keys: &[&str], cause: &str) -> String {
        format!(
            "cannot connect to PostgreSQL at {} (database {}): {cause}; check {} in {}",
            self.0.address,
            self.0.database,
            keys.join(", "),
            self.0.config_file
        )
    }
}

/// A duration as a person reads it: whole seconds as `2 s`, else
/// milliseconds.
fn span(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}
