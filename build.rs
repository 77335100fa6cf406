//! Names the commit in `credbroker --version`: `CREDBROKER_COMMIT` when
//! given (the release script sets it), else `git rev-parse --short HEAD`
//! when this crate is a git checkout's top, else the crate version alone
//! (a tarball build, which may sit inside some other repository).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CREDBROKER_COMMIT");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let commit = std::env::var("CREDBROKER_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .or_else(git_commit);
    let shown = match commit {
        Some(c) => format!("{version} ({c})"),
        None => version,
    };
    println!("cargo:rustc-env=CREDBROKER_VERSION={shown}");
}

/// `git rev-parse ARGS` in the crate's directory, trimmed, if it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .arg("rev-parse")
        .args(args)
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// The checkout's short commit, when the crate is the top of a git
/// checkout; and the files that move with HEAD, to build again when it does.
fn git_commit() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let top = PathBuf::from(git(&dir, &["--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let commit = git(&dir, &["--short", "HEAD"])?;
    // Only files that exist: cargo runs a build script whose watched file
    // is missing on every build (a ref may live in packed-refs only).
    let watch = |p: String| {
        let p = PathBuf::from(p);
        let p = if p.is_absolute() { p } else { dir.join(p) };
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    };
    if let Some(head) = git(&dir, &["--git-path", "HEAD"]) {
        watch(head);
    }
    if let Some(name) = git(&dir, &["--symbolic-full-name", "HEAD"]) {
        if let Some(r) = git(&dir, &["--git-path", &name]) {
            watch(r);
        }
    }
    if let Some(packed) = git(&dir, &["--git-path", "packed-refs"]) {
        watch(packed);
    }
    Some(commit)
}
