//! The policy README's CI recipe, run as written (`sh`, the real binary on
//! `PATH`) in a throw-away policy repository: a change that opens a
//! dangerous tool in another step and breaks a case fails the build, and
//! `policy-diff.md` for the review is written all the same, naming the
//! tool; the unchanged repository passes.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::Path;
use std::process::Command;

use crate::support::bin;

/// The `sh` block after "In the CI of a policy repository".
fn recipe() -> String {
    let readme = include_str!("../../../policy/README.md");
    let from = readme
        .find("**In the CI of a policy repository**")
        .expect("the README has its CI recipe");
    let block = readme[from..].split("```sh\n").nth(1).unwrap();
    block.split("\n```").next().unwrap().to_string() + "\n"
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=ci", "-c", "user.email=ci@example.invalid"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// Runs the recipe in `dir`: (exit success, policy-diff.md if written).
fn run(dir: &Path, script: &Path) -> (bool, Option<String>, String) {
    let path = format!(
        "{}:{}",
        bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let _ = std::fs::remove_file(dir.join("policy-diff.md"));
    let out = Command::new("sh")
        .arg(script)
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .unwrap();
    let diff = std::fs::read_to_string(dir.join("policy-diff.md")).ok();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), diff, log)
}

#[test]
fn ci_recipe_writes_the_diff_even_when_a_case_fails_and_fails_the_build() {
    // `credbroker` on PATH must be the binary under test.
    assert_eq!(bin().file_name().unwrap(), "credbroker");
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/examples");
    std::fs::create_dir_all(r.join("policies")).unwrap();
    std::fs::create_dir_all(r.join("tests")).unwrap();
    let policy = std::fs::read_to_string(examples.join("mail-agent.toml")).unwrap();
    std::fs::write(r.join("policies/mail-agent.toml"), &policy).unwrap();
    std::fs::copy(
        examples.join("mail-agent.cases.toml"),
        r.join("tests/mail-agent.cases.toml"),
    )
    .unwrap();
    let script = repo.path().join("check-policies.sh");
    std::fs::write(&script, recipe()).unwrap();
    git(r, &["init", "-q"]);
    git(r, &["add", "policies", "tests"]);
    git(r, &["commit", "-q", "-m", "base"]);
    git(r, &["update-ref", "refs/remotes/origin/main", "HEAD"]);

    // The positive control: nothing changed, every case holds.
    let (ok, diff, log) = run(r, &script);
    assert!(ok, "the unchanged policy repository failed: {log}");
    assert!(diff.is_some(), "no policy-diff.md: {log}");

    // mail.send allowed while drafting: access gained, and the case "no
    // sending while drafting" now fails.
    let opened = policy.replace(
        "scopes = [\"mail.send\"]\nsteps = [\"send_reply\"]",
        "scopes = [\"mail.send\"]\nsteps = [\"draft_reply\", \"send_reply\"]",
    );
    assert_ne!(opened, policy, "the example's mail.send changed shape");
    std::fs::write(r.join("policies/mail-agent.toml"), &opened).unwrap();
    git(r, &["commit", "-q", "-am", "open mail.send in draft_reply"]);
    let (ok, diff, log) = run(r, &script);
    assert!(!ok, "a failing case passed the build: {log}");
    assert!(log.contains("FAIL"), "{log}");
    let diff = diff.unwrap_or_else(|| panic!("no policy-diff.md after a failing case: {log}"));
    assert!(
        diff.contains("mail.send") && diff.contains("draft_reply"),
        "policy-diff.md does not show the change: {diff}"
    );
}
