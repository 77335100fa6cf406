//! `Secret<T>`: a value that must never reach a log, a metric, an event, an
//! error page or a panic message. The type is the embedder crate's
//! [`credbroker_verify::secret`] (the socket client hands tokens out in it);
//! reading a secret file is the broker's own.

pub use credbroker_verify::secret::{SecretBytes, SecretString};

/// Reads a secret file, refusing one that group or others can read (mode
/// must be 0600 or stricter) or that is not a regular file. Symlinks are
/// followed and the target is checked: Kubernetes mounts secrets as links.
pub fn read_secret_file(path: &std::path::Path) -> Result<SecretBytes, std::io::Error> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} has mode {mode:04o}, which lets its group or others in; a secret file must have mode 0600 or stricter: chmod 600 it (a Kubernetes Secret mounted with fsGroup is 0440: copy it into a file the broker owns with mode 0600, as the init container of deploy/kubernetes.yaml does)",
            path.display()
        )));
    }
    match std::fs::read(path) {
        Ok(bytes) => Ok(SecretBytes::new(bytes)),
        // "Permission denied" alone does not say that the file is someone
        // else's (a Secret mounted without fsGroup is root's, mode 0400).
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::MetadataExt;
            Err(std::io::Error::new(
                e.kind(),
                format!(
                    "{}: permission denied: the file belongs to uid {} (mode {mode:04o}) and the broker runs as uid {}; make the broker's user its owner, with mode 0600",
                    path.display(),
                    meta.uid(),
                    nix::unistd::geteuid()
                ),
            ))
        }
        Err(e) => Err(e),
    }
}
