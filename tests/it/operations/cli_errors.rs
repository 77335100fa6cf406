//! The command line's errors are readable: a file error names the file and
//! its cause, and an instance's refusal is said in words, never printed as
//! its raw JSON body.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::process::Command;

use crate::support::*;

/// Runs the binary: exit code and standard error.
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn key_file_errors_name_the_file_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-key.pem");
    let (code, err) = run(&[
        "proof",
        "--key",
        missing.to_str().unwrap(),
        "--url",
        "http://127.0.0.1:1/x",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains(missing.to_str().unwrap()) && err.contains("No such file"),
        "{err}"
    );
    // A new key cannot be written into a missing directory: named too.
    let unwritable = dir.path().join("no-such-dir/k.pem");
    let (code, err) = run(&[
        "derive",
        "--socket",
        dir.path().join("no.sock").to_str().unwrap(),
        "--issuer",
        "http://127.0.0.1:1",
        "--subject-token",
        "x",
        "--step",
        "s",
        "--tool",
        "t",
        "--resource",
        "http://127.0.0.1:1/x",
        "--dpop-key",
        unwritable.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(err.contains(unwritable.to_str().unwrap()), "{err}");
    // Positive control: a key that exists makes a proof.
    let key = dir.path().join("k.pem");
    let (_, pkcs8) = credbroker::internals::jose::Es256Key::generate().unwrap();
    credbroker::internals::config::write_secret_file(
        &key,
        credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
    )
    .unwrap();
    let out = Command::new(bin())
        .args([
            "proof",
            "--key",
            key.to_str().unwrap(),
            "--url",
            "http://127.0.0.1:1/x",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("eyJ"));
}

#[test]
fn an_instances_refusal_is_said_in_words() {
    let b = TestBroker::start();
    let mut child = Command::new(bin())
        .args(["users", "add", "bad name", "--password-stdin", "--config"])
        .arg(&b.config)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    // Refused before the instance is asked (a bad name): in words.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("{\""), "no raw JSON: {err}");
    // An instance's own refusal: a duplicate account.
    let add = |name: &str| {
        let mut c = Command::new(bin())
            .args(["users", "add", name, "--password-stdin", "--config"])
            .arg(&b.config)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(c.stdin.take().unwrap(), "a long password").unwrap();
        c.wait_with_output().unwrap()
    };
    let first = add("carol");
    assert!(first.status.success(), "positive control");
    let again = add("carol");
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("the instance refused (409 conflict): user carol already exists"),
        "{err}"
    );
    assert!(!err.contains("{\""), "no raw JSON: {err}");
}
