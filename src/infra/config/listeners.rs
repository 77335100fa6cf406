//! `[socket]`, `[public]`, `[metrics]` and `[admin]`: where the broker
//! listens.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::raw::{RawAdmin, RawMetrics, RawPublic, RawSocket};
use super::{parse_duration, Check};

/// The orchestrator socket.
#[derive(Debug, Clone)]
pub struct SocketConfig {
    /// Socket path; its directory is created 0750.
    pub path: PathBuf,
    /// Group owning the directory and the socket (the orchestrator's).
    pub group: Option<String>,
    /// Peer uids allowed to connect (`SO_PEERCRED`).
    pub allowed_uids: Vec<u32>,
    /// Open connections at most.
    pub max_connections: usize,
    /// Time allowed to send a request's headers, and then its body.
    pub header_timeout: Duration,
    /// How the socket's connections are spread over threads.
    pub runtime: ApiRuntime,
}

/// `socket.runtime`: the runtime shape serving the orchestrator socket
/// (docs/PERFORMANCE.md, "Runtime shape").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiRuntime {
    /// `"shared"`: the broker's multi-thread runtime, with the admin socket,
    /// the public listener and housekeeping.
    Shared,
    /// `"per_core"`: one thread per core, each with its own current-thread
    /// runtime accepting on its own copy of the socket.
    PerCore,
}

/// The public TCP listener.
#[derive(Debug, Clone)]
pub struct PublicConfig {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Certificate chain and key (PEM); plain HTTP only on loopback.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// The opt-in metrics listener (`[metrics]`): `GET /metrics` over plain
/// HTTP, no authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Address to bind: loopback unless
    /// `allow_unauthenticated_non_loopback` says otherwise.
    pub listen: SocketAddr,
}

/// Validates `[socket]`.
pub(super) fn socket(raw: RawSocket, check: &mut Check<'_>) -> SocketConfig {
    let header_timeout = match raw.header_timeout.as_deref() {
        None => Duration::from_secs(5),
        Some(s) => parse_duration(s)
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| {
                check.bad("socket.header_timeout", "must be a duration such as \"5s\"");
                Duration::from_secs(5)
            }),
    };
    // Default allow-list: only the broker's own uid (quick start, tests).
    let allowed_uids = raw
        .allowed_uids
        .unwrap_or_else(|| vec![crate::base::unix::current_uid()]);
    if allowed_uids.is_empty() {
        check.bad("socket.allowed_uids", "must list at least one uid");
    }
    let runtime = match raw.runtime.as_deref() {
        None | Some("per_core") => ApiRuntime::PerCore,
        Some("shared") => ApiRuntime::Shared,
        Some(_) => {
            check.bad("socket.runtime", "must be \"per_core\" or \"shared\"");
            ApiRuntime::PerCore
        }
    };
    SocketConfig {
        path: check.rel(&raw.path),
        group: raw.group,
        allowed_uids,
        max_connections: raw.max_connections.unwrap_or(512),
        header_timeout,
        runtime,
    }
}

/// Validates `[public]`: plain HTTP only on loopback.
pub(super) fn public(raw: Option<RawPublic>, check: &mut Check<'_>) -> Option<PublicConfig> {
    let p = raw?;
    let Ok(listen) = p.listen.parse::<SocketAddr>() else {
        check.bad("public.listen", "must be an address such as 127.0.0.1:8440");
        return None;
    };
    let tls = match (p.tls_cert, p.tls_key) {
        (Some(c), Some(k)) => Some((check.rel(&c), check.rel(&k))),
        (None, None) => None,
        _ => {
            check.bad("public.tls_cert", "tls_cert and tls_key go together");
            None
        }
    };
    if tls.is_none() && !listen.ip().is_loopback() {
        check.bad(
            "public.listen",
            "plain HTTP is allowed only on loopback; set tls_cert and tls_key",
        );
    }
    Some(PublicConfig { listen, tls })
}

/// Validates `[metrics]`: loopback only unless the dangerous-named key
/// allows more (anyone who reaches the port reads the metrics: counts,
/// tool names, the policy's hash), and never the public listener's port
/// (the public listener serves browsers and resource servers, which have
/// no business reading metrics, and one port cannot be bound twice).
pub(super) fn metrics(
    raw: Option<RawMetrics>,
    public: Option<&PublicConfig>,
    check: &mut Check<'_>,
) -> Option<MetricsConfig> {
    let m = raw?;
    let Ok(listen) = m.listen.parse::<SocketAddr>() else {
        check.bad(
            "metrics.listen",
            "must be an address such as 127.0.0.1:9464",
        );
        return None;
    };
    if !listen.ip().is_loopback() && m.allow_unauthenticated_non_loopback != Some(true) {
        check.bad(
            "metrics.listen",
            "must be a loopback address (127.0.0.1 or [::1]): the metrics listener has no authentication; set metrics.allow_unauthenticated_non_loopback = true to serve it beyond loopback (then limit who reaches the port, for example with a NetworkPolicy)",
        );
    }
    if let Some(p) = public {
        let overlap = listen.ip() == p.listen.ip()
            || listen.ip().is_unspecified()
            || p.listen.ip().is_unspecified();
        if listen.port() != 0 && listen.port() == p.listen.port() && overlap {
            check.bad(
                "metrics.listen",
                "is the public listener's address (public.listen): metrics are never served on the public listener; give another port",
            );
        }
    }
    Some(MetricsConfig { listen })
}

/// The admin socket's path: `[admin] socket`, else `admin.sock` beside the
/// config.
pub(super) fn admin_socket(raw: Option<&RawAdmin>, check: &Check<'_>) -> PathBuf {
    match raw.and_then(|a| a.socket.as_deref()) {
        Some(p) => check.rel(p),
        None => check.rel(Path::new("admin.sock")),
    }
}
