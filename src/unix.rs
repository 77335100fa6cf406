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
    /// The directory is unsafe (a symlink, not a directory, or owned by
    /// another user). The message says what to do: the broker makes its
    /// own socket directory.
    #[error(
        "socket directory {dir} {why}; the broker makes its own socket directory: point socket.path into one that does not exist yet (its parent must not be writable by others), or remove this one or give it to uid {uid}"
    )]
    UnsafeDir {
        /// The socket directory.
        dir: String,
        /// What is wrong with it.
        why: String,
        /// This process's uid.
        uid: u32,
    },
    /// The directory to create the socket directory in is unsafe.
    #[error(
        "{dir}, where the socket directory would be created, {why}; refusing to create it there"
    )]
    UnsafeParent {
        /// The parent directory.
        dir: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The group does not exist.
    #[error("group {0} does not exist")]
    NoGroup(String),
    /// The process may not give a path to the socket group: it is not a
    /// member (chown answered EPERM). The message says how to fix it, since
    /// "Operation not permitted" alone names neither the group nor the cause.
    #[error(
        "{path}: cannot give it to the socket group {group} (gid {gid}): the broker's user (uid {uid}) is not a member of that group; add the user to it (systemd: SupplementaryGroups=; Kubernetes: supplementalGroups or fsGroup) or set socket.group to a group the user is in"
    )]
    NotInGroup {
        /// The socket directory or the socket.
        path: String,
        /// `socket.group` as configured.
        group: String,
        /// Its gid.
        gid: u32,
        /// This process's uid.
        uid: u32,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + '_ {
    move |source| SocketError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Gives `path` to the socket group `gid` (`group` as configured).
fn give_to_group(path: &Path, gid: nix::unistd::Gid, group: &str) -> Result<(), SocketError> {
    match nix::unistd::chown(path, None, Some(gid)) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => Err(SocketError::NotInGroup {
            path: path.display().to_string(),
            group: group.to_string(),
            gid: gid.as_raw(),
            uid: current_uid(),
        }),
        Err(e) => Err(io(path)(e.into())),
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

/// Paths a start created, removed again if the start fails (sockets first,
/// then the directories, innermost last created first).
#[derive(Debug, Default)]
pub struct Created(Vec<std::path::PathBuf>);

impl Created {
    /// Removes every path recorded, newest first; best effort.
    pub fn remove_all(&mut self) {
        while let Some(p) = self.0.pop() {
            let _ = match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(&p),
                _ => std::fs::remove_file(&p),
            };
        }
    }
}

/// Refuses a parent directory that others could use to swap the socket
/// directory: a symlink, or writable by others without the sticky bit.
fn check_parent(parent: &Path) -> Result<(), SocketError> {
    let unsafe_parent = |why| SocketError::UnsafeParent {
        dir: parent.display().to_string(),
        why,
    };
    let meta = match std::fs::symlink_metadata(parent) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(unsafe_parent("does not exist"))
        }
        Err(e) => return Err(io(parent)(e)),
    };
    if meta.file_type().is_symlink() {
        return Err(unsafe_parent("is a symlink"));
    }
    if !meta.is_dir() {
        return Err(unsafe_parent("is not a directory"));
    }
    let mode = meta.permissions().mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(unsafe_parent(
            "is writable by others without the sticky bit",
        ));
    }
    Ok(())
}

/// Binds a Unix socket at `path`. The socket directory (the path's parent)
/// is the broker's own: when missing it is created (one level, mode
/// `dir_mode`, group `group`) in a parent that must be safe (not a symlink,
/// not writable by others without the sticky bit); when present it must be
/// a real directory owned by this user. A stale socket is removed without
/// following symlinks; the socket gets mode `sock_mode`. What was created is
/// recorded in `created`.
pub fn bind(
    path: &Path,
    dir_mode: u32,
    sock_mode: u32,
    group: Option<&str>,
    created: &mut Created,
) -> Result<tokio::net::UnixListener, SocketError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let gid = group.map(resolve_group).transpose()?;
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            check_parent(
                dir.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new(".")),
            )?;
            std::fs::create_dir(dir).map_err(io(dir))?;
            created.0.push(dir.to_owned());
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))
                .map_err(io(dir))?;
            tracing::info!(dir = %dir.display(), mode = format!("{dir_mode:o}"), group = group.unwrap_or("-"), "created the socket directory");
        }
        Err(e) => return Err(io(dir)(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    let uid = current_uid();
    let why = if meta.file_type().is_symlink() {
        Some("is a symlink".to_string())
    } else if !meta.is_dir() {
        Some("is not a directory".to_string())
    } else if meta.uid() != uid {
        Some(format!(
            "is owned by uid {}, not the broker's uid {uid}",
            meta.uid()
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return Err(SocketError::UnsafeDir {
            dir: dir.display().to_string(),
            why,
            uid,
        });
    }
    if let (Some(gid), Some(group)) = (gid, group) {
        give_to_group(dir, gid, group)?;
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
    created.0.push(path.to_owned());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(sock_mode)).map_err(io(path))?;
    if let (Some(gid), Some(group)) = (gid, group) {
        give_to_group(path, gid, group)?;
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
        let l = bind(
            &path,
            0o750,
            0o660,
            Some(&gid.to_string()),
            &mut Created::default(),
        )
        .unwrap();
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
            &mut Created::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "group no-such-group-x1 does not exist");
        // ... nor is a number with a sign.
        assert!(matches!(
            bind(
                &dir.path().join("c/s.sock"),
                0o750,
                0o660,
                Some("+5"),
                &mut Created::default()
            ),
            Err(SocketError::NoGroup(_))
        ));
    }
}
