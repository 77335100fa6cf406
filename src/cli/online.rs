//! The online-or-offline pattern, written once: a command goes to the
//! running instance through its admin socket; when none answers, it opens
//! the store itself ([`crate::derive::ops::Offline`], which refuses anyone but the
//! store's owner). A running instance holds the store's lock, so the two
//! cannot both write.

use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;

use crate::derive::ops::Offline;
use crate::infra::config::Config;

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
    check_user(cfg)?;
    if !listening(cfg) {
        return Ok(Reached::Stopped(Offline::open(cfg)?));
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

/// Refuses to go on as another user than the broker's, naming who owns
/// what: the admin socket (or the directory on its path that is closed to
/// this user) must belong to this process's uid. The instance would refuse
/// the connection anyway; without this the command would report
/// `{"running":false}`, or try the store and fail on its permissions. When
/// there is no socket, [`Offline::open`] checks the store's owner instead.
pub(super) fn check_user(cfg: &Config) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = crate::base::unix::current_uid();
    let socket = &cfg.admin_socket;
    let (what, owner) = match std::fs::symlink_metadata(socket) {
        Ok(m) => (format!("the admin socket {}", socket.display()), m.uid()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // The deepest directory that can still be looked at is the one
            // this user may not enter.
            let closed = socket
                .ancestors()
                .skip(1)
                .find_map(|d| std::fs::metadata(d).ok().map(|m| (d, m.uid())));
            match closed {
                Some((dir, owner)) => (
                    format!(
                        "the directory {} (on the way to the admin socket {}) is closed to it and",
                        dir.display(),
                        socket.display()
                    ),
                    owner,
                ),
                None => return Ok(()),
            }
        }
        Err(_) => return Ok(()),
    };
    if owner == me {
        return Ok(());
    }
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(owner))
        .ok()
        .flatten()
        .map_or_else(|| format!("#{owner}"), |u| u.name);
    Err(format!(
        "this command runs as {}, but {what} belongs to {}, the broker's user: run the command as that user \
         (e.g. `sudo -u {name} credbroker ... --config {}`); the admin socket accepts only the broker's uid",
        crate::derive::ops::user_name(me),
        crate::derive::ops::user_name(owner),
        cfg.file.display()
    ))
}

/// Whether an instance listens on the admin socket: `false` when there is
/// no socket file or nobody accepts on it.
pub(super) fn listening(cfg: &Config) -> bool {
    match std::os::unix::net::UnixStream::connect(&cfg.admin_socket) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
        ),
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
