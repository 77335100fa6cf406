//! `credbroker --version` names the commit it was built from (build.rs):
//! `CREDBROKER_COMMIT` when the build was given one, else the checkout's
//! `git rev-parse --short HEAD`, else the version alone.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::process::Command;

use crate::support::bin;

#[test]
fn version_names_the_commit() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    // What build.rs saw in this same cargo run.
    let commit = option_env!("CREDBROKER_COMMIT")
        .map(str::to_owned)
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            let o = Command::new("git")
                .args([
                    "-C",
                    env!("CARGO_MANIFEST_DIR"),
                    "rev-parse",
                    "--short",
                    "HEAD",
                ])
                .output()
                .ok()?;
            o.status
                .success()
                .then(|| String::from_utf8(o.stdout).unwrap().trim().to_owned())
        });
    let expected = match &commit {
        Some(c) => format!("credbroker {version} ({c})\n"),
        None => format!("credbroker {version}\n"),
    };
    assert_eq!(printed, expected);
    // In this repository's checkout, a commit is named (the fallback is for
    // a tarball build).
    if std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".git")
        .exists()
    {
        assert!(commit.is_some() && printed.contains(" ("), "{printed}");
    }
}
