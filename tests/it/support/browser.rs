//! People with browsers: Debian's chromium driven by npm `playwright-core`
//! (tests/peers/pages_browser.mjs in its `--serve` mode). Each person has a
//! browser of their own with a fresh user data dir, kept between turns, so
//! a test can let Alice sign in, derive as her agent, then let her continue.
//! No browser is downloaded: `/usr/bin/chromium` is Debian's.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The browsers of a test.
pub(crate) struct Browsers {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Where screenshots go (`$CREDBROKER_SCREENSHOTS`, else a temp dir).
    pub shots: PathBuf,
    _profiles: tempfile::TempDir,
}

/// Fails the test in one line when chromium or the npm peers are missing:
/// the browser tests must never pass by being skipped.
pub(crate) fn require_browser() -> PathBuf {
    super::prereq::chromium()
}

impl Browsers {
    /// Starts the driver (browsers open on first use).
    pub(crate) async fn start() -> Browsers {
        let peers = require_browser();
        let profiles = tempfile::tempdir().unwrap();
        let shots = std::env::var_os("CREDBROKER_SCREENSHOTS")
            .map_or_else(|| profiles.path().join("screenshots"), PathBuf::from);
        let mut child = tokio::process::Command::new("node")
            .arg(peers.join("pages_browser.mjs"))
            .arg("--serve")
            .arg(profiles.path())
            .arg(&shots)
            .current_dir(&peers)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the browser driver starts")
            .unwrap()
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&first).unwrap()["ready"],
            true
        );
        Browsers {
            child,
            stdin,
            lines,
            shots,
            _profiles: profiles,
        }
    }

    async fn call(&mut self, cmd: &Value) -> Value {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .unwrap();
        let line = tokio::time::timeout(Duration::from_secs(120), self.lines.next_line())
            .await
            .expect("the browser answered in time")
            .unwrap()
            .expect("the browser driver is still running");
        serde_json::from_str(&line).unwrap()
    }

    /// Runs `steps` in `who`'s browser (opened on first use); returns each
    /// step's result (`url`, `status`, `sha256` of the body for
    /// navigations). Panics with the page's text when a step fails.
    pub(crate) async fn steps(&mut self, who: &str, steps: Value) -> Vec<Value> {
        let r = self.call(&json!({"browser": who, "steps": steps})).await;
        if r["ok"] != true {
            panic!(
                "{who}'s browser: step {} {} failed: {}\nat {}\n--- page ---\n{}\n{}\n--- steps before ---\n{}",
                r["i"],
                r["step"],
                r["error"],
                r["url"],
                r["text"].as_str().unwrap_or(""),
                r.get("console_errors").map(Value::to_string).unwrap_or_default(),
                r["results"]
            );
        }
        r["results"].as_array().unwrap().clone()
    }

    /// Closes `who`'s browser (the profile stays until the end of the test).
    pub(crate) async fn close(&mut self, who: &str) {
        let r = self.call(&json!({ "close": who })).await;
        assert_eq!(r["ok"], true);
    }

    /// Closes every browser and waits for the driver to exit.
    pub(crate) async fn finish(mut self) {
        drop(self.stdin);
        // The driver exits 0 once its input ends and every browser closed;
        // anything else (a crash, an error on close) fails the test.
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the browser driver exits within 30 s of its input ending")
            .expect("wait for the browser driver");
        assert!(status.success(), "the browser driver exited with {status}");
    }
}

/// From the pages' sign-in page: to the IdP, its login form, its consent
/// (the first time), and back.
pub(crate) fn idp_sign_in(idp: &str, name: &str, password: &str) -> Vec<Value> {
    vec![
        json!({"click": "a.button[href^='/signin/oidc']"}),
        json!({"expect_url": format!("{idp}/interaction/")}),
        json!({"fill": "input[name=login]", "value": name}),
        json!({"fill": "input[name=password]", "value": password}),
        json!({"click": "button[type=submit]"}),
        json!({"click_if": "input[name=prompt][value=consent] ~ button[type=submit]"}),
    ]
}

/// On the pages' sign-in page: the local account form, submitted.
pub(crate) fn local_sign_in(name: &str, password: &str) -> Vec<Value> {
    vec![
        json!({"fill": "#username", "value": name}),
        json!({"fill": "#password", "value": password}),
        json!({"click": "form[action='/signin'] button[type=submit]"}),
    ]
}
