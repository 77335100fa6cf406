//! Helpers of the deploy layout harnesses (tests/it/deploy/layout.rs and
//! systemd_layout.rs): files laid out with the owners and modes a kubelet or
//! systemd would give them, and the binary copied where the other users can
//! run it.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `cmd`, panicking with its stderr if it fails; its stdout.
pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

pub(crate) fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// The binary at `<root>/usr/local/bin/credbroker`, 0755: a checkout under
/// a 0700 directory (what `mktemp -d` makes) is out of reach of the
/// unprivileged uids the harnesses run it as.
pub(crate) fn install_binary(root: &Path) -> PathBuf {
    let exe = root.join("usr/local/bin/credbroker");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::fs::copy(crate::support::bin(), &exe).unwrap();
    mode(&exe, 0o755);
    exe
}

/// A throw-away P-256 certificate for 127.0.0.1: (cert PEM, key PEM).
pub(crate) fn throwaway_tls() -> (Vec<u8>, Vec<u8>) {
    let tls = tempfile::tempdir().unwrap();
    run(Command::new("openssl")
        .current_dir(tls.path())
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "k.pem",
            "-out",
            "c.pem",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .stderr(Stdio::piped()));
    (
        std::fs::read(tls.path().join("c.pem")).unwrap(),
        std::fs::read(tls.path().join("k.pem")).unwrap(),
    )
}
