//! What the integration tests need beyond the Rust toolchain, each checked
//! in one place: Node.js with the npm peers of `tests/peers`, Debian's
//! chromium, and the Python virtualenv `.venv`. `scripts/install-test-deps`
//! installs all of them (PostgreSQL's binaries too: see
//! `postgres::cluster_or_not_shown`, which reports them as not shown
//! outside CI).
//!
//! A test that lacks one fails with one line that names what is missing and
//! the command that installs it, instead of a backtrace or a peer's own
//! error: `cargo test` on a fresh checkout otherwise fails a hundred tests,
//! each in its own way. The failure unwinds without the panic hook (no
//! "panicked at", no backtrace under `RUST_BACKTRACE`), and the brokers a
//! test started leave their logs out of it ([`missing_here`]).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The command that installs every prerequisite.
pub(crate) const INSTALL: &str = "scripts/install-test-deps";

thread_local! {
    static MISSING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is unwinding from a missing prerequisite (a
/// broker's drop then keeps its log to itself: it says nothing about it).
pub(crate) fn missing_here() -> bool {
    MISSING.with(Cell::get)
}

/// Fails the test with one line naming `what` and [`INSTALL`].
pub(crate) fn missing(what: &str) -> ! {
    let line = format!("missing test prerequisite: {what}; run {INSTALL}");
    MISSING.with(|m| m.set(true));
    eprintln!("{line}");
    std::panic::resume_unwind(Box::new(line))
}

pub(crate) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Each check's verdict, made once per test binary (`Err` is what is
/// missing).
fn checked(name: &str, check: impl FnOnce() -> Result<(), String>) {
    static DONE: OnceLock<Mutex<BTreeMap<String, Result<(), String>>>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(BTreeMap::new()));
    let verdict = {
        let mut m = done.lock().unwrap_or_else(|e| e.into_inner());
        if !m.contains_key(name) {
            let v = check();
            m.insert(name.to_string(), v);
        }
        m[name].clone()
    };
    if let Err(what) = verdict {
        missing(&what);
    }
}

/// `tests/peers`, once `node` (20 or later) runs and every dependency of
/// its package.json is in its node_modules (oidc-provider, jose,
/// playwright-core).
pub(crate) fn node_peers() -> PathBuf {
    let dir = repo().join("tests/peers");
    checked("node", || {
        let out = Command::new("node")
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("node 20 or later on PATH ({e})"))?;
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let major = v
            .strip_prefix('v')
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse::<u32>().ok());
        match major {
            Some(m) if out.status.success() && m >= 20 => Ok(()),
            _ => Err(format!("node 20 or later (`node --version` said {v:?})")),
        }
    });
    checked("node_modules", || {
        let manifest = std::fs::read_to_string(dir.join("package.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        let absent: Vec<&str> = manifest["dependencies"]
            .as_object()
            .expect("tests/peers/package.json has dependencies")
            .keys()
            .map(String::as_str)
            .filter(|p| {
                !dir.join("node_modules")
                    .join(p)
                    .join("package.json")
                    .is_file()
            })
            .collect();
        if absent.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the npm packages {} in tests/peers/node_modules",
                absent.join(", ")
            ))
        }
    });
    dir
}

/// Debian's chromium, which `tests/peers/pages_browser.mjs` drives with
/// playwright-core (no browser is downloaded); returns `tests/peers`.
pub(crate) fn chromium() -> PathBuf {
    let peers = node_peers();
    checked("chromium", || {
        if Path::new("/usr/bin/chromium").is_file() {
            Ok(())
        } else {
            Err("chromium (/usr/bin/chromium, Debian's package)".into())
        }
    });
    peers
}

/// `.venv/bin/python`, once it imports each of `modules` (and then runs
/// `check`, Python code that fails when an installed module is not the
/// one wanted, such as a version pin).
pub(crate) fn venv_python(modules: &[&str], check: &str) -> PathBuf {
    let py = repo().join(".venv/bin/python");
    let name = format!("venv {modules:?} {check}");
    checked(&name, || {
        let what = || {
            format!(
                "the Python packages {} in .venv (python 3.11 or later)",
                modules.join(", ")
            )
        };
        if !py.exists() {
            return Err(what());
        }
        let code = format!(
            "import sys\nassert sys.version_info >= (3, 11)\nimport {}\n{check}",
            modules.join(", ")
        );
        let ok = Command::new(&py)
            .args(["-c", &code])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Ok(())
        } else {
            Err(what())
        }
    });
    py
}
