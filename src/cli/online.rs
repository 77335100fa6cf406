//! The online-or-offline pattern, written once: a command goes to the
//! running instance through its admin socket; when none answers, it opens
//! the store itself ([`crate::ops::Offline`], which refuses anyone but the
//! store's owner). A running instance holds the store's lock, so the two
//! cannot both write.

use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;

use crate::config::Config;
use crate::ops::Offline;

/// Where a command ran.
pub(super) enum Reached {
    /// A running instance answered (its status code and body).
    Instance {
        /// The HTTP status.
        status: u16,
        /// The body, as text.
        body: String,
    },
    /// No instance answers: the store, opened by its owner.
    Stopped(Offline),
}

/// Sends the command to the admin socket, or opens the store when no
/// instance listens there (no socket file, or nobody accepting on it).
///
/// Any other failure (the instance died while handling the request) leaves
/// it open whether the command took effect, so it is an error and never a
/// second, offline run: that is how an interrupted `keys rotate` once added
/// two keys and reported one.
pub(super) async fn reach(
    cfg: &Config,
    method: &str,
    path: &str,
    body: &str,
) -> Result<Reached, Box<dyn std::error::Error>> {
    if let Err(e) = std::os::unix::net::UnixStream::connect(&cfg.admin_socket) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
        ) {
            return Ok(Reached::Stopped(Offline::open(cfg)?));
        }
    }
    match admin_call(&cfg.admin_socket, method, path, body).await {
        Ok((status, body)) => Ok(Reached::Instance { status, body }),
        Err(e) => Err(format!(
            "admin socket {}: {method} {path}: {e}; the instance may or may not have \
             carried it out: run `credbroker status` before trying again",
            cfg.admin_socket.display()
        )
        .into()),
    }
}

/// One request on the admin socket.
pub(super) async fn admin_call(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), crate::client::ClientError> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "credbroker-admin")
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|_| crate::client::ClientError::Unexpected(0))?;
    let a = crate::client::send(socket, req).await?;
    Ok((
        a.status.as_u16(),
        String::from_utf8_lossy(&a.body).into_owned(),
    ))
}
