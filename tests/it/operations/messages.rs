//! The operator's messages of the command line, each shown by running the
//! real binary: `status`'s exit codes as `--help` lists them, admin
//! commands run as another user than the broker's, and `users add`
//! without a terminal.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use crate::support::*;

/// Runs the binary as this user with stdin closed: (code, stdout, stderr).
fn run(args: &[&OsStr]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status(config: &std::path::Path) -> (i32, String, String) {
    run(&["status".as_ref(), "--config".as_ref(), config.as_os_str()])
}

#[tokio::test]
async fn status_exit_codes_are_the_ones_help_lists() {
    // --help documents every code status uses.
    let (code, help, _) = run(&["--help".as_ref()]);
    assert_eq!(code, 0);
    for line in [
        "  0  done (status: running and ready)",
        "(status: running but not ready;",
        "  3  status: no instance runs",
        "  6  status: cannot tell (the config does not load, or another user than the broker's runs it)",
    ] {
        assert!(help.contains(line), "--help lacks {line:?}:\n{help}");
    }
    let (_, status_help, _) = run(&["status".as_ref(), "--help".as_ref()]);
    assert!(
        status_help.contains("6 when it cannot tell"),
        "{status_help}"
    );

    // A missing config file: 6 and the file named, never 1 ("running but
    // not ready") nor 3 ("not running").
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-config.toml");
    let (code, out, err) = status(&missing);
    assert_eq!(code, 6, "missing config: {out}{err}");
    assert!(
        err.contains(&missing.display().to_string()),
        "the file is named: {err}"
    );
    // A config that does not parse: the same.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "agent = \n").unwrap();
    let (code, out, err) = status(&bad);
    assert_eq!(code, 6, "unparsable config: {out}{err}");
    assert!(err.contains(&bad.display().to_string()), "{err}");

    // Positive controls on a real broker: running and ready is 0, stopped
    // is 3 (running but not ready, 1, is shown where the audit log fills
    // up: operations::audit).
    let mut b = TestBroker::start();
    let (code, out, err) = status(&b.config);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("\"ready\":true"), "{out}");
    b.stop();
    let (code, out, err) = status(&b.config);
    assert_eq!(code, 3, "{out}{err}");
    assert_eq!(out.trim(), "{\"running\":false}");
}

#[tokio::test]
async fn admin_commands_run_as_another_user_say_whose_the_broker_is() {
    let Some(other) = other_user("admin commands run as another user than the broker's") else {
        return;
    };
    let mut b = TestBroker::start();
    // As on a real host: the config is readable by everyone, the broker's
    // directories are the broker's (its admin socket directory stays 0700).
    std::fs::set_permissions(b.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&b.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = b.config.clone();
    let cfg = config.as_os_str();
    let me = credbroker::internals::unix::current_uid();
    let me_name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(me))
        .unwrap()
        .unwrap()
        .name;

    // While it runs: status and freeze name the broker's user and say to
    // run as it, instead of {"running":false} or a store error.
    for args in [
        vec!["status".as_ref(), "--config".as_ref(), cfg],
        vec!["freeze".as_ref(), "on".as_ref(), "--config".as_ref(), cfg],
    ] {
        let (code, out, err) = other.run(&args);
        assert_ne!(code, 0, "{args:?}: {out}{err}");
        assert!(!out.contains("running"), "{args:?}: {out}");
        assert!(
            err.contains(&format!("this command runs as nobody (uid {})", other.uid))
                && err.contains(&format!(
                    "belongs to {me_name} (uid {me}), the broker's user"
                ))
                && err.contains(&format!("sudo -u {me_name} credbroker")),
            "{args:?}: {err}"
        );
        assert!(!err.contains("os error"), "{args:?}: {err}");
    }
    let (code, _, _) = other.run(&["status".as_ref(), "--config".as_ref(), cfg]);
    assert_eq!(code, 6, "status cannot tell as another user");
    // Positive control: as the broker's user, both work.
    let (code, out, err) = status(&b.config);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&["freeze".as_ref(), "off".as_ref(), "--config".as_ref(), cfg]);
    assert_eq!(code, 0, "{out}{err}");

    // Stopped: the offline path names the store's owner.
    b.stop();
    let (code, out, err) = other.run(&["freeze".as_ref(), "on".as_ref(), "--config".as_ref(), cfg]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains(&format!("belongs to {me_name} (uid {me})"))
            && err.contains("run it as the store's owner"),
        "{err}"
    );
    // Positive control: the owner freezes offline.
    let (code, out, err) = run(&["freeze".as_ref(), "on".as_ref(), "--config".as_ref(), cfg]);
    assert_eq!(code, 0, "{out}{err}");
}

#[tokio::test]
async fn users_add_without_a_terminal_names_password_stdin() {
    let b = TestBroker::start();
    // `setsid`: no controlling terminal, as under systemd, cron or CI.
    let out = Command::new("setsid")
        .arg("--wait")
        .arg(bin())
        .args(["users", "add", "carol", "--config"])
        .arg(&b.config)
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no terminal to prompt for the password on")
            && err.contains("--password-stdin"),
        "{err}"
    );
    assert!(!err.contains("os error"), "{err}");
    // Positive control: the way the message names works.
    let mut child = Command::new("setsid")
        .arg("--wait")
        .arg(bin())
        .args(["users", "add", "carol", "--password-stdin", "--config"])
        .arg(&b.config)
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"carols long password\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"user\":\"carol\""));
}
