//! The broker under test: the real `credbroker` binary started in a temp
//! directory (quick-start files, port 0), its sockets spoken to in raw HTTP,
//! its answers parsed, and another local user to act as.
// clippy's allow-unwrap-in-tests covers only #[test] functions, not the
// helpers they call; here too a failure should panic loudly.
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use credbroker::client::{Answer, Client, DeriveParams};
use credbroker::internals::jose::Es256Key;

use super::{form, now, random_bytes};

pub(crate) const RESOURCE: &str = "http://127.0.0.1:9090/notes";

/// Options for a test broker.
#[derive(Default, Clone)]
pub(crate) struct Opts {
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
    /// Where the audit log goes (`audit_log`), when not `data/audit.jsonl`:
    /// for example a small tmpfs mounted beforehand, to fill up.
    pub audit_log: Option<PathBuf>,
}

/// The quick-start policy without the approval on `notes.delete` (and so
/// without the details the approval page shows: they stay declared, but
/// optional), for the tests of steps, lifetimes and claims that need that
/// tool issued outright (the approval itself is tested in
/// `tests/it/approvals/` and by `examples/python-agent`).
pub(crate) fn policy_without_approval() -> String {
    let lines = "approval = \"each_call\"\nrequire_authorization_details = true\n";
    let qs = credbroker::internals::cli::QUICKSTART_POLICY;
    assert_eq!(
        qs.matches(lines).count(),
        1,
        "the quick start marks notes.delete"
    );
    qs.replace(lines, "")
}

/// A running broker.
pub(crate) struct TestBroker {
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
    /// A command the binary runs under (e.g. `unshare --pid --fork`),
    /// kept across restarts; empty: none.
    pub launcher: Vec<String>,
}

/// `credbroker serve --config <config>`, under `launcher` when it names a
/// command.
fn serve_command(launcher: &[String], config: &Path) -> Command {
    let mut c = match launcher.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin());
            c
        }
        None => Command::new(bin()),
    };
    c.args(["serve", "--config"]).arg(config);
    c
}

pub(crate) fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_credbroker"))
}

/// Writes the quick-start files (with `opts` applied) into a new temp dir
/// without starting anything; returns the dir and the config path.
pub(crate) fn prepare(opts: &Opts) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = credbroker::internals::cli::quickstart_files(
        dir.path(),
        opts.public_listen.as_deref().unwrap_or("127.0.0.1:0"),
    )
    .expect("files");
    if let Some(p) = &opts.policy {
        std::fs::write(dir.path().join("policy.toml"), p).unwrap();
    }
    let mut text = std::fs::read_to_string(&config).unwrap();
    if let Some(edit) = opts.edit_config {
        text = edit(text);
    }
    if let Some(a) = &opts.audit_log {
        text = text.replacen(
            "store = \"data\"",
            &format!("store = \"data\"\naudit_log = \"{}\"", a.display()),
            1,
        );
    }
    text.push_str(&opts.extra_config);
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

/// Runs `credbroker serve --config <config>` and expects it to exit on its
/// own (a refused start); returns its exit status and its stderr. Panics if
/// it is still running after `timeout`.
pub(crate) fn serve_expect_exit(
    config: &Path,
    timeout: Duration,
) -> (std::process::ExitStatus, String) {
    serve_expect_exit_with_env(config, &[], timeout)
}

/// [`serve_expect_exit`] with these variables in the broker's environment.
pub(crate) fn serve_expect_exit_with_env(
    config: &Path,
    env: &[(&str, &Path)],
    timeout: Duration,
) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn credbroker");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("credbroker kept running although its start should have been refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl TestBroker {
    pub(crate) fn start() -> TestBroker {
        TestBroker::start_with(Opts::default())
    }

    /// Writes the quick-start files into a temp dir and serves them.
    pub(crate) fn start_with(opts: Opts) -> TestBroker {
        let (dir, config) = prepare(&opts);
        TestBroker::spawn(dir, config, opts.log.as_deref())
    }

    /// Serves files already written by [`prepare`] (and possibly altered
    /// since); panics if the broker does not become ready.
    pub(crate) fn spawn(
        dir: tempfile::TempDir,
        config: PathBuf,
        log_level: Option<&str>,
    ) -> TestBroker {
        TestBroker::spawn_with_env(dir, config, log_level, &[])
    }

    /// [`TestBroker::spawn`] with extra environment for this first process
    /// only ([`TestBroker::restart`] starts without it), e.g. an armed
    /// failpoint.
    pub(crate) fn spawn_with_env(
        dir: tempfile::TempDir,
        config: PathBuf,
        log_level: Option<&str>,
        env: &[(&str, &str)],
    ) -> TestBroker {
        TestBroker::spawn_launched(dir, config, log_level, env, Vec::new())
    }

    /// [`TestBroker::spawn_with_env`] under `launcher` (a command and its
    /// arguments, the binary's path appended), this process and every
    /// restart.
    pub(crate) fn spawn_launched(
        dir: tempfile::TempDir,
        config: PathBuf,
        log_level: Option<&str>,
        env: &[(&str, &str)],
        launcher: Vec<String>,
    ) -> TestBroker {
        let log = dir.path().join("broker.log");
        let logf = std::fs::File::create(&log).unwrap();
        let child = serve_command(&launcher, &config)
            .envs(env.iter().copied())
            .env("RUST_LOG", log_level.unwrap_or("info"))
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("spawn credbroker");
        let cfg = credbroker::internals::config::Config::load(&config).expect("config");
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
            launcher,
        };
        b.wait_ready();
        b
    }

    /// Restarts the process on the same directory.
    pub(crate) fn restart(&mut self) {
        self.restart_with_env(&[]);
    }

    /// [`TestBroker::restart`] with extra environment for the new process.
    pub(crate) fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.stop();
        let logf = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = serve_command(&self.launcher, &self.config)
            .envs(env.iter().copied())
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

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A subject token from the dev issuer.
    pub(crate) fn subject_token(&self, sub: &str) -> String {
        credbroker::internals::cli::dev_subject_token(self.dir.path(), sub, 3600).unwrap()
    }

    /// Signs arbitrary claims/header with the dev issuer key.
    pub(crate) fn sign_as_dev_issuer(
        &self,
        header: serde_json::Value,
        claims: &serde_json::Value,
    ) -> String {
        let key =
            credbroker::internals::cli::load_pem_key(&self.path("keys/dev-issuer.pem")).unwrap();
        let mut h = header.as_object().cloned().unwrap_or_default();
        h.entry("kid").or_insert_with(|| key.kid.clone().into());
        key.sign_jws(h, claims).unwrap()
    }

    pub(crate) fn client(&self) -> Client {
        Client::new(&self.socket, &self.issuer)
    }

    /// The htu for `/v1/derive`.
    pub(crate) fn htu(&self) -> String {
        format!("{}/v1/derive", self.issuer)
    }

    /// A valid proof for `/v1/derive`.
    pub(crate) fn proof(&self, key: &Es256Key) -> String {
        credbroker::internals::dpop::make_proof(key, "POST", &self.htu(), now(), None, None)
            .unwrap()
    }

    /// Derives with a fresh proof.
    pub(crate) async fn derive(
        &self,
        key: &Es256Key,
        subject: &str,
        step: &str,
        tool: &str,
        resource: &str,
        scope: Option<&str>,
    ) -> Answer {
        let answer = self
            .client()
            .derive(
                &DeriveParams {
                    subject_token: subject,
                    step,
                    tool,
                    resource,
                    scope,
                },
                key,
            )
            .await
            .expect("transport");
        if let Answer::Refused(r) = &answer {
            super::contract::check_client_refusal(r, &format!("derive of {tool}"));
        }
        answer
    }

    /// The known-good request: alice, summarize, notes.read.
    pub(crate) async fn derive_ok(&self, key: &Es256Key) -> credbroker::client::Token {
        match self
            .derive(
                key,
                &self.subject_token("alice"),
                "summarize",
                "notes.read",
                RESOURCE,
                None,
            )
            .await
        {
            Answer::Issued(t) => t,
            Answer::Refused(r) => panic!("positive control refused: {r:?}"),
        }
    }

    /// Sends raw bytes on the orchestrator socket; returns what came back
    /// until the server closed or `timeout` passed.
    pub(crate) fn raw(&self, bytes: &[u8], timeout: Duration) -> String {
        let raw = raw_unix(&self.socket, bytes, timeout);
        // A refusal in it is held to the published schema.
        super::contract::check_socket_answer(&raw, "a raw answer on the socket");
        raw
    }

    /// GET on the admin socket.
    pub(crate) fn admin_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        admin_request(&self.admin, "GET", path, "")
    }

    pub(crate) fn admin_post(&self, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        admin_request(&self.admin, "POST", path, body)
    }

    pub(crate) fn metrics(&self) -> String {
        self.admin_get("/metrics").unwrap().1
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn audit_lines(&self) -> Vec<serde_json::Value> {
        super::read_audit(&self.path("data/audit.jsonl"))
    }

    /// [`TestBroker::audit_lines`] once `done` holds (see
    /// [`super::read_audit_until`]).
    pub(crate) async fn audit_lines_until(
        &self,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        super::read_audit_until(&self.path("data/audit.jsonl"), done).await
    }

    /// Sends SIGHUP: the broker reloads its policy file.
    pub(crate) fn sighup(&self) {
        let ok = Command::new("kill")
            .arg("-HUP")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success(), "kill -HUP failed");
    }

    /// The hash of the policy the running broker decides with.
    pub(crate) fn policy_hash(&self) -> String {
        let (_, body) = self.admin_get("/status").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["policy_hash"].as_str().unwrap().to_string()
    }

    /// Replaces the policy file atomically (a temp file renamed over it), as
    /// a deployment should.
    pub(crate) fn replace_policy(&self, text: &[u8]) {
        let tmp = self.path("policy.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.path("policy.toml")).unwrap();
    }

    /// The value of a metric without labels (or with exactly `labels`).
    pub(crate) fn metric(&self, name_and_labels: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|l| {
                l.strip_prefix(name_and_labels)
                    .and_then(|v| v.strip_prefix(' '))
            })
            .and_then(|v| v.trim().parse().ok())
    }

    /// Whether the process is still running (no crash, no exit).
    pub(crate) fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The broker's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the broker in KiB (from /proc). Fails the test
    /// when it cannot be read: a reading of 0 would make every "memory stays
    /// bounded" check pass.
    pub(crate) fn rss_kib(&self) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {path} ({e}): the memory checks cannot run"));
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{path} has no readable VmRSS line"));
        // Even an idle broker maps more than a megabyte.
        assert!(kib > 1024, "{path}: VmRSS {kib} KiB is not a real reading");
        kib
    }

    /// SIGKILL and reap: no clean shutdown, so the socket files stay behind.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends raw bytes on the orchestrator socket and parses the answer.
    pub(crate) fn http(&self, bytes: &[u8]) -> HttpAnswer {
        HttpAnswer::parse(&self.raw(bytes, Duration::from_secs(10)))
    }

    /// `POST /v1/derive` with a JSON body (any JSON, for malformed cases)
    /// and an optional `DPoP` header.
    pub(crate) fn post_derive(&self, body: &serde_json::Value, proof: Option<&str>) -> HttpAnswer {
        self.http(&http_derive(&body.to_string(), proof, ""))
    }

    /// `POST /token` with a form body built from `pairs`.
    pub(crate) fn post_token(&self, pairs: &[(&str, &str)], proof: Option<&str>) -> HttpAnswer {
        let body = form(pairs);
        let dpop = proof.map(|p| format!("dpop: {p}\r\n")).unwrap_or_default();
        let req = format!(
            "POST /token HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\n{dpop}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        self.http(req.as_bytes())
    }

    /// The JSON body of the known-good derive request, with `subject`.
    pub(crate) fn good_body(&self, subject: &str) -> serde_json::Value {
        serde_json::json!({
            "subject_token": subject, "step": "summarize", "tool": "notes.read", "resource": RESOURCE,
        })
    }

    /// The claims of a valid proof for `/v1/derive` (to tamper with).
    pub(crate) fn proof_claims(&self) -> serde_json::Value {
        serde_json::json!({
            "jti": credbroker::internals::jose::b64e(&random_bytes(16)),
            "htm": "POST", "htu": self.htu(), "iat": now(),
        })
    }

    /// The claims of a valid dev-issuer subject token for `sub` (to tamper with).
    pub(crate) fn subject_claims(&self, sub: &str) -> serde_json::Value {
        let n = now();
        serde_json::json!({
            "iss": self.issuer, "sub": sub, "aud": "repo-helper", "iat": n, "exp": n + 3600,
            "jti": credbroker::internals::jose::b64e(&random_bytes(12)),
        })
    }

    /// A subject token signed by the dev issuer with the usual header
    /// (`typ` `at+jwt`, the dev key's `kid`) and `claims`.
    pub(crate) fn subject_with(&self, claims: &serde_json::Value) -> String {
        self.sign_as_dev_issuer(serde_json::json!({"typ": "at+jwt"}), claims)
    }

    /// The published JWKS (from the public listener).
    pub(crate) async fn jwks(&self) -> Vec<u8> {
        reqwest::get(format!("{}/.well-known/jwks.json", self.public))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    }

    /// SIGTERM and wait.
    pub(crate) fn stop(&mut self) {
        if self.child.try_wait().unwrap().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
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
        // A failing test shows the broker's own account of it (why a
        // sign-in or a call was refused) beside the panic: the log is in a
        // temp dir that goes with the test. It holds no secret (the
        // canary tests check that).
        if std::thread::panicking() && !super::prereq::missing_here() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "--- the last {} lines of the broker's log ({}) ---\n{}",
                tail.len(),
                self.log.display(),
                tail.join("\n")
            );
        }
    }
}

pub(crate) fn raw_unix(path: &Path, bytes: &[u8], timeout: Duration) -> String {
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

fn admin_request(
    path: &Path,
    method: &str,
    uri: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
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
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((out.as_str(), ""));
    // The admin socket's errors are held to the published refusal schema
    // (`/readyz`'s 503 is the readiness document, not a refusal).
    if uri != "/readyz" {
        super::contract::check_answer(
            status,
            |name| header_of(head, name),
            body,
            &format!("admin {method} {uri}"),
        );
    }
    Ok((status, body.to_string()))
}

/// The first value of header `name` in a raw HTTP head.
fn header_of<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// A JSON derive request as raw HTTP bytes.
pub(crate) fn http_derive(body: &str, proof: Option<&str>, extra_headers: &str) -> Vec<u8> {
    let dpop = proof.map(|p| format!("dpop: {p}\r\n")).unwrap_or_default();
    format!(
        "POST /v1/derive HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{dpop}{extra_headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status code of a raw HTTP answer.
pub(crate) fn status_of(raw: &str) -> u16 {
    raw.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A parsed raw HTTP/1.1 answer.
#[derive(Debug, Clone)]
pub(crate) struct HttpAnswer {
    /// Status code (0 if nothing came back).
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
    /// Everything that came back.
    pub raw: String,
}

impl HttpAnswer {
    pub(crate) fn parse(raw: &str) -> HttpAnswer {
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let answer = HttpAnswer {
            status,
            headers,
            body: body.to_string(),
            raw: raw.to_string(),
        };
        // Every refusal of the broker a test reads is held to the
        // published schema.
        super::contract::check_answer(
            answer.status,
            |name| answer.header(name),
            &answer.body,
            "a raw HTTP answer",
        );
        answer
    }

    /// The first value of header `name`.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (Null if it is not JSON).
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The OAuth `error` code of the body.
    pub(crate) fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Asserts a refusal with `status` and `error`; `what` names the case.
    #[track_caller]
    pub(crate) fn assert_refused(&self, status: u16, error: &str, what: &str) {
        assert_eq!(
            (self.status, self.error().as_str()),
            (status, error),
            "{what}: expected {status} {error}, got {}",
            self.raw
        );
        assert!(
            self.json().get("access_token").is_none(),
            "{what}: a token came back"
        );
    }

    /// Asserts a token was issued; returns it.
    #[track_caller]
    pub(crate) fn assert_issued(&self, what: &str) -> String {
        assert_eq!(
            self.status, 200,
            "{what}: expected a token, got {}",
            self.raw
        );
        self.json()["access_token"]
            .as_str()
            .expect("access_token")
            .to_string()
    }
}

/// Another local user (`nobody`) that tests can act as, when this process
/// runs as root and can switch to it; `None` otherwise.
#[derive(Debug, Clone)]
pub(crate) struct OtherUser {
    pub uid: u32,
    pub gid: u32,
    /// The name of its primary group (for `socket.group`).
    pub group: String,
}

/// The other user, or why there is none here.
pub(crate) fn other_user_or_why() -> Result<OtherUser, String> {
    if credbroker::internals::unix::current_uid() != 0 {
        return Err("not root, so no switching to another uid".into());
    }
    let u = nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .ok_or("no user `nobody` on this machine")?;
    let g = nix::unistd::Group::from_gid(u.gid)
        .ok()
        .flatten()
        .ok_or("the primary group of `nobody` does not exist")?;
    Ok(OtherUser {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        group: g.name,
    })
}

/// The other user, for a test that can show `what` only with one. Without
/// it the half of the test that needs it cannot run: under `CI=true` that
/// fails the test (a skip there would pass unseen); elsewhere it prints
/// what was not shown and returns `None`.
pub(crate) fn other_user(what: &str) -> Option<OtherUser> {
    match other_user_or_why() {
        Ok(u) => Some(u),
        Err(why) => {
            crate::support::not_shown(what, &why);
            None
        }
    }
}

/// A copy of the binary (a hard link where possible) in `dir`, a directory
/// the other user owns under `/tmp`: the build's own copy may sit in a
/// clone that only its owner can enter (a 0700 `mktemp -d`), where exec as
/// `nobody` fails with EACCES.
fn bin_in(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let to = dir.join("credbroker");
    if std::fs::hard_link(bin(), &to).is_err() {
        std::fs::copy(bin(), &to).expect("copy the binary for the other user");
    }
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    to
}

impl OtherUser {
    /// Runs the binary with `args` as this user, from a directory it owns
    /// under `/tmp` with stdin closed. Returns the exit code, stdout and
    /// stderr.
    pub(crate) fn run(&self, args: &[&std::ffi::OsStr]) -> (i32, String, String) {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::Builder::new()
            .prefix("credbroker-other-user.")
            .tempdir_in("/tmp")
            .unwrap();
        std::os::unix::fs::chown(dir.path(), Some(self.uid), Some(self.gid)).unwrap();
        let out = Command::new(bin_in(dir.path()))
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(dir.path())
            .env("RUST_LOG", "off")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run credbroker as another user");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts the binary with `args` as this user, like
    /// [`OtherUser::run`] but without waiting for it: for a start that may
    /// succeed. The directory it runs from must outlive the child; stderr is
    /// piped.
    pub(crate) fn spawn(&self, args: &[&std::ffi::OsStr]) -> (tempfile::TempDir, Child) {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::Builder::new()
            .prefix("credbroker-other-user.")
            .tempdir_in("/tmp")
            .unwrap();
        std::os::unix::fs::chown(dir.path(), Some(self.uid), Some(self.gid)).unwrap();
        let child = Command::new(bin_in(dir.path()))
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(dir.path())
            .env("RUST_LOG", "info")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start credbroker as another user");
        (dir, child)
    }

    /// Runs `credbroker derive` as this user against `b`'s socket for alice's
    /// known-good request, with a DPoP key in a directory this user owns.
    /// Returns the exit code and stdout + stderr.
    pub(crate) fn derive(&self, b: &TestBroker, subject: &str) -> (i32, String) {
        use std::os::unix::process::CommandExt;
        // Under /tmp, not $TMPDIR: every directory on the way must be one
        // this user can enter.
        let dir = tempfile::Builder::new()
            .prefix("credbroker-other-user.")
            .tempdir_in("/tmp")
            .unwrap();
        let key_path = dir.path().join("dpop.pem");
        let (_, pkcs8) = Es256Key::generate().unwrap();
        credbroker::internals::config::write_secret_file(
            &key_path,
            credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
        )
        .unwrap();
        std::os::unix::fs::chown(dir.path(), Some(self.uid), Some(self.gid)).unwrap();
        std::os::unix::fs::chown(&key_path, Some(self.uid), Some(self.gid)).unwrap();
        let out = Command::new(bin_in(dir.path()))
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(dir.path())
            .env("RUST_LOG", "off")
            .arg("derive")
            .arg("--socket")
            .arg(&b.socket)
            .args([
                "--issuer",
                &b.issuer,
                "--subject-token",
                subject,
                "--step",
                "summarize",
            ])
            .args(["--tool", "notes.read", "--resource", RESOURCE, "--dpop-key"])
            .arg(&key_path)
            .output()
            .expect("run credbroker derive as another user");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }
}
