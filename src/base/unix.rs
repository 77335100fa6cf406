//! Unix helpers that several modules share: the process's own uid,
//! preparing a local socket (its directory and mode, group, stale sockets),
//! and the stream type the socket servers serve a connection through.
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

/// A served Unix connection, registered with the runtime for readability
/// only.
///
/// tokio registers a `UnixStream` for reading and writing, edge-triggered.
/// On a Unix stream socket every read the peer makes of an answer frees
/// send space and raises `EPOLLOUT`, so a thread that has answered and gone
/// back to sleep is woken again for nothing: about half a context switch a
/// request on the orchestrator socket (docs/PERFORMANCE.md, "Wake-ups").
/// Here a write goes straight to the socket; only one that would block
/// registers a duplicate of the descriptor for writability, and that
/// registration is dropped once the write has gone through.
pub struct ReadOnlyStream {
    read: tokio::io::unix::AsyncFd<std::os::unix::net::UnixStream>,
    /// A duplicate of the descriptor registered for writability while a
    /// write waits for send space.
    write: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl ReadOnlyStream {
    /// Takes over an accepted stream (it must be called on the runtime that
    /// serves it).
    pub fn new(stream: tokio::net::UnixStream) -> std::io::Result<ReadOnlyStream> {
        // `into_std` leaves the socket non-blocking.
        ReadOnlyStream::from_std(stream.into_std()?)
    }

    /// Takes over a non-blocking stream (on the runtime that serves it).
    pub(crate) fn from_std(std: std::os::unix::net::UnixStream) -> std::io::Result<ReadOnlyStream> {
        Ok(ReadOnlyStream {
            read: register(std, tokio::io::Interest::READABLE)?,
            write: None,
        })
    }

    /// Runs `op` (a write) until it does not return `WouldBlock`, waiting for
    /// send space in between.
    fn poll_write_with<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        mut op: impl FnMut(&std::os::unix::net::UnixStream) -> std::io::Result<T>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::io::ErrorKind::WouldBlock;
        use std::os::fd::AsFd;
        use std::task::Poll;
        let ReadOnlyStream { read, write } = self;
        loop {
            let Some(w) = write.as_ref() else {
                match op(read.get_ref()) {
                    Err(e) if e.kind() == WouldBlock => {
                        // Registered now, so the send space freed from here
                        // on raises an event (epoll reports a descriptor
                        // that is already writable when it is added).
                        let dup = read.get_ref().as_fd().try_clone_to_owned()?;
                        *write = Some(register(dup, tokio::io::Interest::WRITABLE)?);
                        continue;
                    }
                    r => return Poll::Ready(r),
                }
            };
            let mut guard = std::task::ready!(w.poll_write_ready(cx))?;
            match op(read.get_ref()) {
                Err(e) if e.kind() == WouldBlock => guard.clear_ready(),
                r => {
                    drop(guard);
                    *write = None;
                    return Poll::Ready(r);
                }
            }
        }
    }
}

/// Registers a descriptor with the runtime for `interest`.
///
/// tokio deprecated the safe `AsyncFd::with_interest` because an
/// `AsRawFd` type may return another descriptor later, or close its own
/// (tokio PR 8587), and its replacement is `unsafe`, which this crate
/// forbids. The two types given here are std's `UnixStream` and `OwnedFd`:
/// each owns its descriptor and returns that same one until dropped, which
/// is exactly the condition, so the safe call is sound for them.
#[allow(deprecated)]
fn register<T: std::os::fd::AsRawFd + Owned>(
    inner: T,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<T>> {
    tokio::io::unix::AsyncFd::with_interest(inner, interest)
}

/// The descriptor owners [`register`] is sound for.
trait Owned {}
impl Owned for std::os::unix::net::UnixStream {}
impl Owned for std::os::fd::OwnedFd {}

thread_local! {
    /// Where a read lands before it is copied into hyper's buffer: hyper
    /// hands out uninitialised memory, which safe code may only fill by
    /// copying (`ReadBufCursor::put_slice`); zeroing hyper's whole buffer
    /// first, as a tokio `ReadBuf` over it would, cost more than the copy.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 16 * 1024]);
}

impl hyper::rt::Read for ReadOnlyStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::io::Read;
        use std::task::Poll;
        loop {
            let mut guard = std::task::ready!(self.read.poll_read_ready(cx))?;
            let read = SCRATCH.with_borrow_mut(|scratch| {
                let want = buf.remaining().min(scratch.len());
                let r = guard.get_inner().read(&mut scratch[..want]);
                if let Ok(n) = r {
                    buf.put_slice(&scratch[..n]);
                }
                r.map(|n| (n, want))
            });
            match read {
                Ok((n, want)) => {
                    // As tokio does for its own streams: a short read drained
                    // the socket, and edge-triggered epoll reports what
                    // arrives next, so the next read waits for that instead
                    // of first failing with `WouldBlock`.
                    if n > 0 && n < want {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl hyper::rt::Write for ReadOnlyStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::io::Write;
        self.get_mut().poll_write_with(cx, |mut s| s.write(buf))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::io::Write;
        self.get_mut()
            .poll_write_with(cx, |mut s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(
            match self.read.get_ref().shutdown(std::net::Shutdown::Write) {
                Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(()),
                r => r,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each descriptor registered in the epoll set that holds `fd`
    /// waits for, as (descriptor, `events:` mask) from the `tfd:` lines of
    /// `/proc/self/fdinfo`: the set of this test's runtime only, whatever
    /// other tests run beside it.
    fn registered(fd: i32) -> std::collections::BTreeSet<(i32, u32)> {
        for e in std::fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let mut set = std::collections::BTreeSet::new();
            for line in text.lines().filter(|l| l.starts_with("tfd:")) {
                let w: Vec<&str> = line.split_whitespace().collect();
                let tfd = w.get(1).and_then(|f| f.parse().ok());
                let mask = w
                    .iter()
                    .position(|x| *x == "events:")
                    .and_then(|i| w.get(i + 1))
                    .and_then(|m| u32::from_str_radix(m, 16).ok());
                if let (Some(tfd), Some(mask)) = (tfd, mask) {
                    set.insert((tfd, mask));
                }
            }
            if set.iter().any(|r| r.0 == fd) {
                return set;
            }
        }
        panic!("descriptor {fd} is in no epoll set");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_served_stream_is_registered_for_reading_only_and_still_writes_what_blocks() {
        use std::os::fd::AsRawFd;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const EPOLLOUT: u32 = 0x4;
        let (ours, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let fd = ours.as_raw_fd();
        let mask = |fd: i32| registered(fd).into_iter().find(|r| r.0 == fd).map(|r| r.1);
        // Positive control: tokio registers its stream for writability too.
        assert_eq!(mask(fd).map(|m| m & EPOLLOUT), Some(EPOLLOUT));
        // (Through tokio's traits, as hyper_util's adapter gives them.)
        let mut served = hyper_util::rt::TokioIo::new(ReadOnlyStream::new(ours).unwrap());
        // Ours is registered, for reading only.
        assert_eq!(mask(fd).map(|m| m & EPOLLOUT), Some(0));
        let before = registered(fd);

        // Reading: what the peer sends arrives whole, in order.
        peer.write_all(b"POST /v1/derive").await.unwrap();
        let mut head = [0u8; 15];
        served.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"POST /v1/derive");

        // Writing more than the socket buffers, to a peer that reads only
        // later: the write would block, waits for send space, and then
        // every byte arrives in order.
        let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let expect = big.clone();
        let writer = tokio::spawn(async move {
            served.write_all(&big).await.unwrap();
            served.shutdown().await.unwrap();
            served
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "8 MiB fitted in the socket buffer");
        // While it waits, a duplicate is registered for writability.
        let added: Vec<_> = registered(fd).difference(&before).copied().collect();
        assert!(added.len() == 1 && added[0].1 & EPOLLOUT != 0, "{added:x?}");
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert!(got == expect, "{} bytes of {}", got.len(), expect.len());
        let served = writer.await.unwrap();
        // Once written, that registration is gone again.
        assert_eq!(registered(fd), before);
        drop(served);
    }

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
