//! `credbroker users add` against the real binary: through the admin socket
//! while an instance runs, straight into the store when none does; then the
//! account signs in on the pages.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::*;

fn users_add(b: &TestBroker, name: &str, password: &str, extra: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(bin())
        .args(["users", "add", name, "--password-stdin", "--config"])
        .arg(&b.config)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Signs in on the pages; returns the status of the answer to the POST.
async fn sign_in(b: &TestBroker, name: &str, password: &str) -> u16 {
    sign_in_browser(b, name, password).await.0
}

/// Signs in on the pages with a fresh browser (a cookie store); returns the
/// status of the answer to the POST and the browser.
async fn sign_in_browser(b: &TestBroker, name: &str, password: &str) -> (u16, reqwest::Client) {
    let c = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let html = c
        .get(format!("{}/signin", b.public))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let marker = "name=\"csrf\" value=\"";
    let i = html.find(marker).unwrap() + marker.len();
    let csrf = &html[i..i + html[i..].find('"').unwrap()];
    let status = c
        .post(format!("{}/signin", b.public))
        .form(&[
            ("csrf", csrf),
            ("username", name),
            ("password", password),
            ("return_to", "/account"),
        ])
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    (status, c)
}

/// `credbroker users ARGS --config FILE`: success, stdout, stderr.
fn users(b: &TestBroker, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .arg("users")
        .args(args)
        .arg("--config")
        .arg(&b.config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The status of `GET /account` in browser `c` (200 signed in, 303 to the
/// sign-in page when not).
async fn account_status(b: &TestBroker, c: &reqwest::Client) -> u16 {
    c.get(format!("{}/account", b.public))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The names `users list` prints (its `users[].name`).
fn listed(out: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(out).unwrap();
    v["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn users_remove_signs_out_that_users_browsers_only() {
    let mut b = TestBroker::start();
    for (name, pw) in [
        ("alice", "alices long password"),
        ("bob", "bobs long password"),
    ] {
        let (ok, _, err) = users_add(&b, name, pw, &[]);
        assert!(ok, "{err}");
    }
    let (ok, out, err) = users(&b, &["list"]);
    assert!(ok, "{err}");
    assert_eq!(listed(&out), ["alice", "bob"]);
    assert!(out.contains("\"running\": true"), "{out}");
    assert!(!out.contains("argon2"), "no hash is listed: {out}");

    let (s, alice) = sign_in_browser(&b, "alice", "alices long password").await;
    assert_eq!(s, 303);
    let (s, bob) = sign_in_browser(&b, "bob", "bobs long password").await;
    assert_eq!(s, 303);
    assert_eq!(account_status(&b, &alice).await, 200, "alice is signed in");

    // Removed while running: alice's browser is signed out at once, her
    // password no longer signs in, and she is no longer listed.
    let (ok, out, err) = users(&b, &["remove", "alice"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["removed"], &v["sessions_ended"], &v["running"]),
        (&true.into(), &1.into(), &true.into()),
        "{out}"
    );
    assert_eq!(account_status(&b, &alice).await, 303, "alice is signed out");
    assert_eq!(sign_in(&b, "alice", "alices long password").await, 403);
    // Positive control: bob's browser is still signed in.
    assert_eq!(account_status(&b, &bob).await, 200, "bob stays signed in");
    let (_, out, _) = users(&b, &["list"]);
    assert_eq!(listed(&out), ["bob"]);
    assert!(b.audit_lines().iter().any(|e| e["event"] == "users.removed"
        && e["person_sub"] == "alice"
        && e["outcome"] == "removed"));

    // No such account: exits 1 and says so in words (no raw JSON).
    let (ok, _, err) = users(&b, &["remove", "alice"]);
    assert!(!ok);
    assert!(err.contains("no local account alice"), "{err}");

    // Stopped: the same, on the store; bob's session ends with him.
    b.stop();
    let (ok, out, err) = users(&b, &["remove", "bob"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"running\":false"), "{out}");
    assert!(out.contains("\"sessions_ended\":1"), "{out}");
    let (ok, out, err) = users(&b, &["list"]);
    assert!(ok, "{err}");
    assert!(listed(&out).is_empty(), "{out}");
    b.restart();
    assert_eq!(account_status(&b, &bob).await, 303, "bob is signed out");
    assert_eq!(sign_in(&b, "bob", "bobs long password").await, 403);
}

#[tokio::test]
async fn users_add_while_running_and_while_stopped() {
    let mut b = TestBroker::start();
    // Running: through the admin socket.
    let (ok, out, _) = users_add(&b, "alice", "correct horse battery", &[]);
    assert!(ok);
    assert!(out.contains("\"running\":true"), "{out}");
    assert_eq!(sign_in(&b, "alice", "correct horse battery").await, 303);
    assert_eq!(sign_in(&b, "alice", "wrong password!").await, 403);
    // Refusals: the account exists; a short password; a bad name.
    let (ok, _, err) = users_add(&b, "alice", "another password", &[]);
    assert!(!ok);
    assert!(err.contains("already exists"), "{err}");
    let (ok, _, err) = users_add(&b, "bob", "short", &[]);
    assert!(!ok && err.contains("8 to 1024"), "{err}");
    let (ok, _, err) = users_add(&b, "bob smith", "long enough pw", &[]);
    assert!(
        !ok && err.contains("a user name is 1 to 64 characters"),
        "a name with a space is refused for its name: {err}"
    );
    // The password never reaches the log or the events.
    assert!(!b.log_text().contains("correct horse battery"));
    assert!(!std::fs::read_to_string(b.path("data/audit.jsonl"))
        .unwrap()
        .contains("correct horse battery"));
    assert!(b
        .audit_lines()
        .iter()
        .any(|e| e["event"] == "users.added" && e["person_sub"] == "alice"));

    // Stopped: straight into the store.
    b.stop();
    let (ok, out, err) = users_add(&b, "bob", "bobs long password", &[]);
    assert!(ok, "{err}");
    assert!(out.contains("\"running\":false"), "{out}");
    let (ok, _, _) = users_add(&b, "alice", "a new password", &["--replace"]);
    assert!(ok);
    // The offline adds are audited like the running instance's.
    let offline: Vec<(String, String)> = b
        .audit_lines()
        .iter()
        .filter(|e| e["event"] == "users.added")
        .map(|e| {
            (
                e["person_sub"].as_str().unwrap().to_owned(),
                e["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        offline[1..],
        [
            ("bob".to_owned(), "added".to_owned()),
            ("alice".to_owned(), "replaced".to_owned())
        ],
        "every offline users add writes its event"
    );
    b.restart();
    assert_eq!(sign_in(&b, "bob", "bobs long password").await, 303);
    assert_eq!(
        sign_in(&b, "alice", "correct horse battery").await,
        403,
        "replaced"
    );
    // Positive control: the new password.
    assert_eq!(sign_in(&b, "alice", "a new password").await, 303);
}
