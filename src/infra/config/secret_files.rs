//! Secret files: the config names files that hold secrets (never the
//! secrets), and these read and write them with the mode checks.

use std::path::Path;

// Lives in `secret` so that lower layers (the store) can read a secret
// file too; re-exported here, where the config's callers look for it.
pub use crate::base::secret::read_secret_file;

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
