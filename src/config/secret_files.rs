//! Secret files: the config names files that hold secrets (never the
//! secrets), and these read and write them with the mode checks.

use std::path::Path;

use crate::secret::SecretBytes;

/// Reads a secret file, refusing one that group or others can read (mode
/// must be 0600 or stricter) or that is not a regular file. Symlinks are
/// followed and the target is checked: Kubernetes mounts secrets as links.
pub fn read_secret_file(path: &Path) -> Result<SecretBytes, std::io::Error> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} must have mode 0600 (it is readable by others)",
            path.display()
        )));
    }
    Ok(SecretBytes::new(std::fs::read(path)?))
}

/// Writes a new secret file with mode 0600, failing if it exists.
pub fn write_secret_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}
