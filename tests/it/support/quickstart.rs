//! The real `credbroker quickstart` as a newcomer runs it: the binary in a
//! fresh directory, on free loopback ports, its banner read for the
//! passwords of `alice` and `bob` and the next steps.
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{bin, free_loopback_addr};

/// A running quick start.
pub(crate) struct Quickstart {
    /// The working directory it was started in (the README's `$PWD`).
    pub cwd: tempfile::TempDir,
    /// Its directory (`credbroker-quickstart`, relative to `cwd`).
    pub dir: PathBuf,
    /// The public listener (`127.0.0.1:PORT`) and its issuer URL.
    pub listen: String,
    pub issuer: String,
    /// The demo service (`127.0.0.1:PORT`) and its URL.
    pub demo_listen: String,
    pub demo: String,
    /// What it printed on standard error.
    pub log: PathBuf,
    child: Child,
}

impl Drop for Quickstart {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Quickstart {
    /// Starts `credbroker quickstart --listen A --demo-listen B` in a fresh
    /// working directory and waits until its pages and demo service answer.
    pub(crate) async fn start() -> Quickstart {
        let cwd = tempfile::tempdir().unwrap();
        let listen = free_loopback_addr();
        let demo_listen = free_loopback_addr();
        Quickstart::start_in(cwd, &listen, &demo_listen).await
    }

    /// Starts it in `cwd` with these addresses.
    pub(crate) async fn start_in(
        cwd: tempfile::TempDir,
        listen: &str,
        demo_listen: &str,
    ) -> Quickstart {
        let args = ["--listen", listen, "--demo-listen", demo_listen];
        Quickstart::start_with(cwd, &args, listen, demo_listen).await
    }

    /// Starts `credbroker quickstart ARGS` in `cwd`, where the flags make
    /// it serve on `listen` and its demo service on `demo_listen`.
    pub(crate) async fn start_with(
        cwd: tempfile::TempDir,
        args: &[&str],
        listen: &str,
        demo_listen: &str,
    ) -> Quickstart {
        let log = cwd
            .path()
            .join(format!("quickstart-{}.log", std::process::id()));
        let child = Command::new(bin())
            .arg("quickstart")
            .args(args)
            .current_dir(cwd.path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut q = Quickstart {
            dir: cwd.path().join("credbroker-quickstart"),
            cwd,
            issuer: format!("http://{listen}"),
            demo: format!("http://{demo_listen}"),
            listen: listen.to_string(),
            demo_listen: demo_listen.to_string(),
            log,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = q.child.try_wait().unwrap() {
                panic!("the quick start exited ({status}):\n{}", q.printed());
            }
            let up = reqwest::get(format!("{}/healthz", q.issuer)).await.is_ok()
                && reqwest::get(format!("{}/", q.demo)).await.is_ok()
                && q.printed().contains("Next steps");
            if up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the quick start did not come up:\n{}",
                q.printed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        q
    }

    /// Stops it and hands back its working directory (the quick-start
    /// directory stays, for a second run or an edit).
    pub(crate) fn stop(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let empty = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.cwd, empty)
    }

    /// Everything it printed so far.
    pub(crate) fn printed(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The password the banner printed for `name`.
    pub(crate) fn password(&self, name: &str) -> String {
        let printed = self.printed();
        let line = printed
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")) && l.contains("password"))
            .unwrap_or_else(|| panic!("no password printed for {name}:\n{printed}"));
        line.split_whitespace()
            .skip_while(|w| *w != "password")
            .nth(1)
            .unwrap()
            .to_string()
    }

    /// The orchestrator socket.
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("credbroker.sock")
    }

    /// The config file.
    pub(crate) fn config(&self) -> PathBuf {
        self.dir.join("credbroker.toml")
    }

    /// The demo API's base URL on the demo service itself (the audience of
    /// the demo's own tokens; the tool never calls it directly).
    pub(crate) fn demo_api(&self) -> String {
        format!("{}/api", self.demo)
    }

    /// The demo tool's resource: the broker's proxy address for the demo
    /// service.
    pub(crate) fn demo_proxy(&self) -> String {
        credbroker::internals::cli::demo_proxy(&self.issuer)
    }

    /// Panics if `text` (`what`, for the message) holds a token the demo
    /// service signed: any JWT whose `iss` is the demo service (its access
    /// and refresh tokens are both such JWTs).
    pub(crate) fn assert_no_demo_token(&self, text: &str, what: &str) {
        assert!(
            jwts_issued_by(text, &self.demo) == 0,
            "{what} holds a token of the demo service"
        );
    }

    /// The audit events of type `kind` so far.
    pub(crate) fn events(&self, kind: &str) -> Vec<serde_json::Value> {
        audit_events(&self.dir.join("data/audit.jsonl"), kind)
    }

    /// A subject token for `sub` from the quick start's dev issuer.
    pub(crate) fn subject_token(&self, sub: &str) -> String {
        credbroker::internals::cli::dev_subject_token(&self.dir, sub, 3600).unwrap()
    }

    /// `credbroker ARGS` in the working directory: (exit code, stdout, stderr).
    pub(crate) fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(bin())
            .args(args)
            .current_dir(self.cwd.path())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// How many JWTs issued by `iss` appear in `text`.
pub(crate) fn jwts_issued_by(text: &str, iss: &str) -> usize {
    use base64::Engine as _;
    let b64url = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    text.split(|c: char| !(b64url(c) || c == '.'))
        .filter(|w| w.starts_with("eyJ"))
        .filter_map(|w| {
            let parts: Vec<&str> = w.split('.').collect();
            let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(parts.get(1)?)
                .ok()?;
            serde_json::from_slice::<serde_json::Value>(&payload).ok()
        })
        .filter(|claims| claims["iss"] == iss)
        .count()
}

/// Browser steps: sign in on the pages' form as `name`.
pub(crate) fn sign_in_steps(name: &str, password: &str) -> Vec<serde_json::Value> {
    vec![
        serde_json::json!({"fill": "#username", "value": name}),
        serde_json::json!({"fill": "#password", "value": password}),
        serde_json::json!({"click": "form[action='/signin'] button[type=submit]"}),
    ]
}

/// Browser steps: Alice opens her connect `link`, signs in, presses
/// Connect, picks her demo account at the demo service and allows; the
/// pages then say she is done.
pub(crate) fn alice_connects_steps(
    q: &Quickstart,
    link: &str,
    password: &str,
) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut steps = vec![json!({"goto": link})];
    steps.extend(sign_in_steps("alice", password));
    steps.extend([
        json!({"expect_url": link}),
        json!({"expect_text": "Connect Demo service for repo-helper"}),
        json!({"click": "button[value=connect]"}),
        json!({"expect_url": format!("{}/authorize?", q.demo)}),
        json!({"expect_text": "Not a real provider"}),
        json!({"expect_text": "Alice's demo account"}),
        json!({"expect_text": "Bob's demo account"}),
        json!({"screenshot": "quickstart-demo-authorize"}),
        json!({"check": "input[value='alice.demo']"}),
        json!({"click": "#allow"}),
        json!({"expect_url": format!("{}/done/connected", q.issuer)}),
        json!({"expect_text": "Go back to your agent"}),
    ]);
    steps
}

/// Browser steps: Bob opens Alice's `link` and signs in: the page says the
/// link is another account's and names nobody.
pub(crate) fn bob_opens_steps(
    q: &Quickstart,
    link: &str,
    password: &str,
) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut steps = vec![
        json!({"goto": link}),
        json!({"expect_url": format!("{}/signin?return_to=", q.issuer)}),
    ];
    steps.extend(sign_in_steps("bob", password));
    steps.extend([
        json!({"expect_status": 403}),
        json!({"expect_text": "This link was made for another account"}),
        json!({"expect_no_text": "alice"}),
    ]);
    steps
}

/// The events of type `kind` in an audit log.
pub(crate) fn audit_events(path: &Path, kind: &str) -> Vec<serde_json::Value> {
    super::read_audit(path)
        .into_iter()
        .filter(|e| e["event"] == kind)
        .collect()
}

/// Runs `credbroker ARGS` in `cwd` and expects it to exit on its own within
/// 20 s (a refused start); returns its exit code and standard error.
pub(crate) fn run_expect_exit(cwd: &Path, args: &[&str]) -> (i32, String) {
    let err = cwd.join("refused.log");
    let mut child = Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (
                status.code().unwrap_or(-1),
                std::fs::read_to_string(&err).unwrap(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("credbroker {args:?} kept running although it should have been refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
