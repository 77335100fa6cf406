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

/// The gid of `group`: a group name, or else a number (as chown(1) reads
/// it), which need not be in /etc/group: a container image often has no
/// entry for the pod's supplemental group.
fn resolve_group(group: &str) -> Result<nix::unistd::Gid, SocketError> {
    if let Some(g) = nix::unistd::Group::from_name(group).ok().flatten() {
        return Ok(g.gid);
    }
    match group.parse::<u32>() {
        Ok(n) if !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(nix::unistd::Gid::from_raw(n))
        }
        _ => Err(SocketError::NoGroup(group.to_string())),
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
        Some(g) => Some(resolve_group(g)?),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn numeric_socket_group_without_a_group_entry_is_accepted() {
        // A gid with no /etc/group entry (as in a container image) that the
        // process may still chown to: root may use any; others only their
        // own groups, so use our primary gid when not root.
        let gid = if current_uid() == 0 {
            4_000_017
        } else {
            nix::unistd::getgid().as_raw()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock/s.sock");
        let l = bind(&path, 0o750, 0o660, Some(&gid.to_string())).unwrap();
        let meta = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(meta.gid(), gid);
        assert_eq!(std::fs::metadata(&path).unwrap().gid(), gid);
        drop(l);
        // Negative: a name that is neither a group nor a number is refused,
        // named in the message.
        let err = bind(
            &dir.path().join("b/s.sock"),
            0o750,
            0o660,
            Some("no-such-group-x1"),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "group no-such-group-x1 does not exist");
        // ... nor is a number with a sign.
        assert!(matches!(
            bind(&dir.path().join("c/s.sock"), 0o750, 0o660, Some("+5")),
            Err(SocketError::NoGroup(_))
        ));
    }
}
