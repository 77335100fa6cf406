//! Unix helpers that several modules share: the process's own uid, and
//! preparing a local socket (its directory and mode, group, stale sockets).
//! A leaf: it imports no other module of the crate, so `config` (the
//! default allow-list), `server` (binding the sockets, the admin socket's
//! uid check) and the CLI can all use it without importing `api`. The peer
//! uid allow-list itself (`SO_PEERCRED`) is checked in `server`'s accept
//! loop, before a byte of the request is read.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// The effective uid of this process (read from `/proc/self`, no `unsafe`).
pub fn current_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Errors preparing a socket path.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// I/O.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// The path exists and is not a socket (or is a symlink).
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(String),
    /// Another instance answers on the socket.
    #[error("{0} is in use by a running instance")]
    InUse(String),
    /// The directory is unsafe (symlink, or owned by another user).
    #[error("socket directory {0} is a symlink or owned by another user")]
    UnsafeDir(String),
    /// The group does not exist.
    #[error("group {0} does not exist")]
    NoGroup(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + '_ {
    move |source| SocketError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Creates the socket directory (mode `dir_mode`, group `group`), removes a
/// stale socket without following symlinks, binds, and sets the socket mode.
pub fn bind(
    path: &Path,
    dir_mode: u32,
    sock_mode: u32,
    group: Option<&str>,
) -> Result<tokio::net::UnixListener, SocketError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))
            .map_err(io(dir))?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if meta.file_type().is_symlink() || meta.uid() != current_uid() {
        return Err(SocketError::UnsafeDir(dir.display().to_string()));
    }
    let gid = match group {
        None => None,
        Some(g) => Some(
            nix::unistd::Group::from_name(g)
                .ok()
                .flatten()
                .ok_or_else(|| SocketError::NoGroup(g.to_string()))?
                .gid,
        ),
    };
    if let Some(gid) = gid {
        nix::unistd::chown(dir, None, Some(gid)).map_err(|e| io(dir)(e.into()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))
            .map_err(io(dir))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.display().to_string()));
            }
            std::fs::remove_file(path).map_err(io(path))?;
        }
        Ok(_) => return Err(SocketError::NotASocket(path.display().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(sock_mode)).map_err(io(path))?;
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(gid)).map_err(|e| io(path)(e.into()))?;
    }
    Ok(listener)
}
