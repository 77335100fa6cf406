//! Shared helpers for integration tests: start the real `credbroker` binary
//! in a temp directory (quick-start files, port 0), talk to its sockets, mint
//! subject tokens from its dev issuer, and make DPoP proofs.
// clippy's allow-unwrap-in-tests covers only #[test] functions, not the
// helpers they call; here too a failure should panic loudly.
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

pub mod oidc;
pub mod services;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use credbroker::client::{Answer, Client, DeriveParams};
use credbroker::jose::Es256Key;

pub const RESOURCE: &str = "http://127.0.0.1:9090/notes";

/// Options for a test broker.
#[derive(Default, Clone)]
pub struct Opts {
    /// Replace the quick-start policy with this text.
    pub policy: Option<String>,
    /// Extra TOML appended to the config (new tables only).
    pub extra_config: String,
    /// Replace the whole `[dpop]`-free config text via a closure on it.
    pub edit_config: Option<fn(String) -> String>,
    /// `RUST_LOG` for the child.
    pub log: Option<String>,
    /// The public listener's address, which also makes the issuer URL
    /// (`http://ADDR`). Default `127.0.0.1:0`: any free port, but then the
    /// issuer URL names port 0 and does not match where metadata is served;
    /// tests that discover keys through the issuer's metadata pass
    /// `free_loopback_addr()` here.
    pub public_listen: Option<String>,
}

/// A running broker.
pub struct TestBroker {
    pub dir: tempfile::TempDir,
    pub child: Child,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub admin: PathBuf,
    /// The issuer URL (also the htu base).
    pub issuer: String,
    /// Where the public listener is bound.
    pub public: String,
    pub log: PathBuf,
    /// `RUST_LOG` of the child, kept across restarts.
    pub log_level: String,
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_credbroker"))
}

impl TestBroker {
    pub fn start() -> TestBroker {
        TestBroker::start_with(Opts::default())
    }

    /// Writes the quick-start files into a temp dir and serves them.
    pub fn start_with(opts: Opts) -> TestBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = credbroker::cli::quickstart_files(dir.path(), opts.public_listen.as_deref().unwrap_or("127.0.0.1:0")).expect("files");
        if let Some(p) = &opts.policy {
            std::fs::write(dir.path().join("policy.toml"), p).unwrap();
        }
        let mut text = std::fs::read_to_string(&config).unwrap();
        if let Some(edit) = opts.edit_config {
            text = edit(text);
        }
        text.push_str(&opts.extra_config);
        std::fs::write(&config, text).unwrap();
        TestBroker::spawn(dir, config, opts.log.as_deref())
    }

    fn spawn(dir: tempfile::TempDir, config: PathBuf, log_level: Option<&str>) -> TestBroker {
        let log = dir.path().join("broker.log");
        let logf = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", log_level.unwrap_or("info"))
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("spawn credbroker");
        let cfg = credbroker::config::Config::load(&config).expect("config");
        let mut b = TestBroker {
            socket: cfg.socket.path.clone(),
            admin: cfg.admin_socket.clone(),
            issuer: cfg.issuer.clone(),
            public: String::new(),
            dir,
            child,
            config,
            log,
            log_level: log_level.unwrap_or("info").to_string(),
        };
        b.wait_ready();
        b
    }

    /// Restarts the process on the same directory.
    pub fn restart(&mut self) {
        self.stop();
        let logf = std::fs::OpenOptions::new().append(true).open(&self.log).unwrap();
        self.child = Command::new(bin())
            .args(["serve", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", &self.log_level)
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("spawn credbroker");
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "credbroker exited early ({status}); log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if let Ok((200, body)) = self.admin_get("/status") {
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                if let Some(addr) = v["public_addr"].as_str() {
                    self.public = format!("http://{addr}");
                }
                return;
            }
            assert!(Instant::now() < deadline, "broker did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A subject token from the dev issuer.
    pub fn subject_token(&self, sub: &str) -> String {
        credbroker::cli::dev_subject_token(self.dir.path(), sub, 3600).unwrap()
    }

    /// Signs arbitrary claims/header with the dev issuer key.
    pub fn sign_as_dev_issuer(&self, header: serde_json::Value, claims: &serde_json::Value) -> String {
        let key = credbroker::cli::load_pem_key(&self.path("keys/dev-issuer.pem")).unwrap();
        let mut h = header.as_object().cloned().unwrap_or_default();
        h.entry("kid").or_insert_with(|| key.kid.clone().into());
        key.sign_jws(h, claims).unwrap()
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket, &self.issuer)
    }

    /// The htu for `/v1/derive`.
    pub fn htu(&self) -> String {
        format!("{}/v1/derive", self.issuer)
    }

    /// A valid proof for `/v1/derive`.
    pub fn proof(&self, key: &Es256Key) -> String {
        credbroker::dpop::make_proof(key, "POST", &self.htu(), now(), None, None).unwrap()
    }

    /// Derives with a fresh proof.
    pub async fn derive(&self, key: &Es256Key, subject: &str, step: &str, tool: &str, resource: &str, scope: Option<&str>) -> Answer {
        self.client()
            .derive(&DeriveParams { subject_token: subject, step, tool, resource, scope }, key)
            .await
            .expect("transport")
    }

    /// The known-good request: alice, summarize, notes.read.
    pub async fn derive_ok(&self, key: &Es256Key) -> credbroker::client::Token {
        match self.derive(key, &self.subject_token("alice"), "summarize", "notes.read", RESOURCE, None).await {
            Answer::Issued(t) => t,
            Answer::Refused(r) => panic!("positive control refused: {r:?}"),
        }
    }

    /// Sends raw bytes on the orchestrator socket; returns what came back
    /// until the server closed or `timeout` passed.
    pub fn raw(&self, bytes: &[u8], timeout: Duration) -> String {
        raw_unix(&self.socket, bytes, timeout)
    }

    /// GET on the admin socket.
    pub fn admin_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        admin_request(&self.admin, "GET", path, "")
    }

    pub fn admin_post(&self, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        admin_request(&self.admin, "POST", path, body)
    }

    pub fn metrics(&self) -> String {
        self.admin_get("/metrics").unwrap().1
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn audit_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.path("data/audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }

    /// Sends SIGHUP: the broker reloads its policy file.
    pub fn sighup(&self) {
        let ok = Command::new("kill").arg("-HUP").arg(self.child.id().to_string()).status().unwrap();
        assert!(ok.success(), "kill -HUP failed");
    }

    /// The hash of the policy the running broker decides with.
    pub fn policy_hash(&self) -> String {
        let (_, body) = self.admin_get("/status").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["policy_hash"].as_str().unwrap().to_string()
    }

    /// Replaces the policy file atomically (a temp file renamed over it), as
    /// a deployment should.
    pub fn replace_policy(&self, text: &[u8]) {
        let tmp = self.path("policy.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.path("policy.toml")).unwrap();
    }

    /// The value of a metric without labels (or with exactly `labels`).
    pub fn metric(&self, name_and_labels: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if self.child.try_wait().unwrap().is_some() {
            return;
        }
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 20 ms until it is true; panics naming `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A loopback address with a port that was free a moment ago (the listener
/// is closed before returning, so another process could take it: a small race
/// that only tests needing a real issuer URL accept).
pub fn free_loopback_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").to_string()
}

pub fn key() -> Es256Key {
    Es256Key::generate().unwrap().0
}

pub fn raw_unix(path: &Path, bytes: &[u8], timeout: Duration) -> String {
    let mut s = StdUnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(timeout)).unwrap();
    s.set_write_timeout(Some(timeout)).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn admin_request(path: &Path, method: &str, uri: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = StdUnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {uri} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let body = out.split_once("\r\n\r\n").map(|x| x.1.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// A JSON derive request as raw HTTP bytes.
pub fn http_derive(body: &str, proof: Option<&str>, extra_headers: &str) -> Vec<u8> {
    let dpop = proof.map(|p| format!("dpop: {p}\r\n")).unwrap_or_default();
    format!(
        "POST /v1/derive HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{dpop}{extra_headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status code of a raw HTTP answer.
pub fn status_of(raw: &str) -> u16 {
    raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// A Node.js peer from `tests/peers/` (oidc-provider, jose checks), talked to
/// with one JSON line per command on stdin/stdout.
pub struct NodePeer {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    /// The first line the peer printed (e.g. its issuer URL).
    pub hello: serde_json::Value,
}

/// The directory of the Node.js peers; fails loudly when they are not
/// installed (the tests must never pass silently without their peers).
pub fn peers_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers");
    assert!(
        dir.join("node_modules/oidc-provider").is_dir() && dir.join("node_modules/jose").is_dir(),
        "the Node.js test peers are not installed: run scripts/install-test-deps (or `npm ci` in tests/peers)"
    );
    dir
}

impl NodePeer {
    /// Starts `node tests/peers/SCRIPT ARGS...` and reads its first line.
    pub fn start(script: &str, args: &[&str]) -> NodePeer {
        use std::io::BufRead;
        let dir = peers_dir();
        let mut child = Command::new("node")
            .arg(dir.join(script))
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node is not installed: run scripts/install-test-deps");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let hello = serde_json::from_str(&line).unwrap_or_else(|_| panic!("peer {script} said: {line}"));
        NodePeer { child, stdin, stdout, hello }
    }

    /// Sends one command and reads one JSON answer.
    pub fn call(&mut self, cmd: &serde_json::Value) -> serde_json::Value {
        use std::io::BufRead;
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("peer answered: {line}"))
    }
}

impl Drop for NodePeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts oidc-provider with `config` (see tests/peers/oidc-provider.mjs).
pub fn oidc_provider(config: &serde_json::Value) -> (NodePeer, tempfile::NamedTempFile) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), config.to_string()).unwrap();
    let p = NodePeer::start("oidc-provider.mjs", &[f.path().to_str().unwrap()]);
    (p, f)
}
