//! Helpers for the MCP tests: the example MCP server
//! (examples/mcp_repo_server.rs), the Python `mcp` client
//! (tests/mcp/mcp_client.py in .venv), a repository API that records what it
//! was sent, and a scripted stand-in for the broker's socket.
//!
//! Used as `crate::support::mcp` (the MCP tests glob-import it).
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds the example (a no-op when fresh) and returns its path. `cargo test
/// --test it` does not build examples by itself.
pub(crate) fn example_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_credbroker"));
    // Build it where the test's own binaries are (same profile).
    let profile = bin
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let profile = if profile == "debug" { "dev" } else { profile };
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--profile",
            profile,
            "--example",
            "mcp_repo_server",
        ])
        .current_dir(root())
        .status()
        .expect("cargo build --example mcp_repo_server");
    assert!(status.success(), "the example MCP server does not build");
    bin.parent().unwrap().join("examples/mcp_repo_server")
}

/// The Python interpreter of .venv; fails the test in one line when the
/// SDK (mcp 2.3.x) is missing.
pub(crate) fn python() -> PathBuf {
    super::prereq::venv_python(
        &["mcp"],
        "import importlib.metadata as m; assert m.version('mcp').startswith('2.3.')",
    )
}

/// A running example MCP server.
pub(crate) struct McpServer {
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// Its start-up line.
    pub hello: Value,
    pub log: PathBuf,
}

/// What the example server is started with.
pub(crate) struct McpServerOpts<'a> {
    pub socket: &'a Path,
    pub broker_issuer: &'a str,
    pub trusted_issuer: &'a str,
    /// `--jwks-file` or `--jwks-uri`.
    pub jwks: Jwks<'a>,
    pub audience: &'a str,
    pub step: &'a str,
    pub tool: &'a str,
    pub resource: &'a str,
    pub api_url: &'a str,
    pub service: &'a str,
    pub scope: Option<&'a str>,
    /// `--state-ttl` (seconds), when not the default.
    pub state_ttl: Option<i64>,
}

pub(crate) enum Jwks<'a> {
    File(&'a Path),
    Uri(&'a str),
}

impl McpServer {
    pub(crate) fn start(o: &McpServerOpts<'_>, log_dir: &Path) -> McpServer {
        McpServer::start_with(o, log_dir, &[], "info")
    }

    /// The command line of the example for `o`, with `extra` arguments.
    pub(crate) fn command(o: &McpServerOpts<'_>, extra: &[&str]) -> Command {
        let mut cmd = Command::new(example_binary());
        cmd.arg("--broker-socket")
            .arg(o.socket)
            .args(["--broker-issuer", o.broker_issuer])
            .args(["--trusted-issuer", o.trusted_issuer])
            .args(["--audience", o.audience])
            .args(["--step", o.step, "--tool", o.tool, "--resource", o.resource])
            .args(["--api-url", o.api_url, "--service", o.service]);
        match o.jwks {
            Jwks::File(p) => cmd.arg("--jwks-file").arg(p),
            Jwks::Uri(u) => cmd.args(["--jwks-uri", u]),
        };
        if let Some(s) = o.scope {
            cmd.args(["--scope", s]);
        }
        if let Some(t) = o.state_ttl {
            cmd.args(["--state-ttl", &t.to_string()]);
        }
        cmd.args(extra);
        cmd
    }

    /// The same with `extra` arguments and `RUST_LOG` set to `log_level`.
    pub(crate) fn start_with(
        o: &McpServerOpts<'_>,
        log_dir: &Path,
        extra: &[&str],
        log_level: &str,
    ) -> McpServer {
        let log = log_dir.join("mcp-server.log");
        let mut cmd = McpServer::command(o, extra);
        let mut child = cmd
            .env("RUST_LOG", log_level)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the example MCP server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let hello: Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            panic!(
                "MCP server said {line:?}; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        McpServer {
            child,
            url: hello["url"].as_str().unwrap().to_owned(),
            hello,
            log,
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs tests/mcp/mcp_client.py with `spec` (token given as a file) and
/// returns its JSON line.
pub(crate) fn python_client(dir: &Path, token: &str, mut spec: Value) -> Value {
    let py = python();
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let token_file = dir.join(format!("token-{n}"));
    std::fs::write(&token_file, token).unwrap();
    spec["token_file"] = json!(token_file);
    if let Some(other) = spec
        .get("other_token")
        .and_then(|t| t.as_str())
        .map(str::to_owned)
    {
        let f = dir.join(format!("other-token-{n}"));
        std::fs::write(&f, other).unwrap();
        spec["other_token_file"] = json!(f);
        spec.as_object_mut().unwrap().remove("other_token");
    }
    let spec_file = dir.join(format!("spec-{n}.json"));
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    let out = Command::new(py)
        .arg(root().join("tests/mcp/mcp_client.py"))
        .arg(&spec_file)
        .current_dir(root().join("tests/mcp"))
        .output()
        .expect("run the Python MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "Python MCP client failed:\n{stdout}\n{stderr}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|_| panic!("Python client printed {stdout}\n{stderr}"))
}

/// Checks what `mcp_client.py`'s `poll_expiry` run returned for a
/// requestState of `ttl` seconds: the first call asks for input, every
/// retry while the state lives is accepted (and asks again), and the last
/// is refused as an invalid or expired requestState, no earlier than the
/// lifetime less a second (the states carry whole seconds). Returns how
/// many retries were accepted, each of which reached the broker.
pub(crate) fn polled_expiry(out: &Value, ttl: f64) -> usize {
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls[0]["result"]["resultType"], "input_required", "{out}");
    let (refused, accepted) = calls[1..].split_last().unwrap();
    assert!(!accepted.is_empty(), "the state was never accepted: {out}");
    for a in accepted {
        assert_eq!(a["attempt"], "genuine");
        assert_eq!(a["result"]["resultType"], "input_required", "{out}");
    }
    assert_eq!(refused["attempt"], "genuine");
    assert_eq!(refused["error"]["code"], -32602, "{out}");
    assert_eq!(
        refused["error"]["message"],
        "Invalid or expired requestState"
    );
    let at = refused["elapsed"].as_f64().unwrap();
    assert!(
        at >= ttl - 1.0,
        "refused after {at} s, before its {ttl} s lifetime: {out}"
    );
    accepted.len()
}

/// One request the repository API received.
#[derive(Debug, Clone)]
pub(crate) struct ApiHit {
    pub authorization: Option<String>,
    pub dpop: Option<String>,
    pub path: String,
}

type Check = dyn Fn(&Request<Incoming>, &str) -> Result<String, String> + Send + Sync;
type AsyncCheck = dyn Fn(
        http::HeaderMap,
        String,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
    + Send
    + Sync;

enum Checker {
    Sync(Arc<Check>),
    Async(Arc<AsyncCheck>),
}

impl Clone for Checker {
    fn clone(&self) -> Self {
        match self {
            Checker::Sync(c) => Checker::Sync(c.clone()),
            Checker::Async(c) => Checker::Async(c.clone()),
        }
    }
}

/// A repository API on a loopback port. `check` decides who the caller is
/// from the request (and its full URL), or refuses it; the answer lists that
/// person's repositories.
pub(crate) struct RepoApi {
    pub url: String,
    pub hits: Arc<Mutex<Vec<ApiHit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RepoApi {
    pub(crate) async fn start(path: &str, check: Arc<Check>) -> RepoApi {
        RepoApi::serve(path, Checker::Sync(check)).await
    }

    /// The same with a check that may ask someone else (e.g. the provider's
    /// userinfo endpoint), given the headers and the full URL.
    pub(crate) async fn start_async(path: &str, check: Arc<AsyncCheck>) -> RepoApi {
        RepoApi::serve(path, Checker::Async(check)).await
    }

    /// `/user/repos` believing a token only when the provider's userinfo
    /// endpoint (`{issuer}/me`) does, and listing the repositories of that
    /// provider account (its `sub`).
    pub(crate) async fn provider_checked(issuer: &str) -> RepoApi {
        let userinfo = format!("{issuer}/me");
        RepoApi::start_async(
            "/user/repos",
            Arc::new(move |headers: http::HeaderMap, _url| {
                let userinfo = userinfo.clone();
                Box::pin(async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .ok_or("no token")?
                        .to_owned();
                    let r = reqwest::Client::new()
                        .get(&userinfo)
                        .header("authorization", auth)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if !r.status().is_success() {
                        return Err(format!("provider says {}", r.status()));
                    }
                    let me: Value = r.json().await.map_err(|e| e.to_string())?;
                    me["sub"]
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| "no sub".into())
                })
            }),
        )
        .await
    }

    /// `/user/repos` that puts the caller's token into its answer (an API
    /// that echoes the token, which the MCP server must withhold).
    pub(crate) async fn token_echoing() -> RepoApi {
        RepoApi::start(
            "/user/repos",
            Arc::new(|req, _| {
                let auth = req
                    .headers()
                    .get("authorization")
                    .unwrap()
                    .to_str()
                    .unwrap();
                Ok(auth.split_once(' ').map_or(auth, |(_, t)| t).to_owned())
            }),
        )
        .await
    }

    async fn serve(path: &str, check: Checker) -> RepoApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let url = format!("{base}{path}");
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (h, b) = (hits.clone(), base.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (hits, check, base) = (h.clone(), check.clone(), b.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (hits, check, base) = (hits.clone(), check.clone(), base.clone());
                        async move {
                            let header = |n: &str| {
                                req.headers()
                                    .get(n)
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned)
                            };
                            hits.lock().unwrap().push(ApiHit {
                                authorization: header("authorization"),
                                dpop: header("dpop"),
                                path: req.uri().path().to_owned(),
                            });
                            let full = format!("{base}{}", req.uri().path());
                            let verdict = match &check {
                                Checker::Sync(c) => c(&req, &full),
                                Checker::Async(c) => c(req.headers().clone(), full.clone()).await,
                            };
                            let (status, body) = match verdict {
                                Ok(who) => (
                                    200,
                                    json!({"repositories": [
                                        {"full_name": format!("{who}/notes"), "private": true},
                                        {"full_name": format!("{who}/site"), "private": false},
                                    ]}),
                                ),
                                Err(why) => (401, json!({"error": why})),
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(body.to_string())))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        RepoApi { url, hits, task }
    }

    pub(crate) fn hits(&self) -> Vec<ApiHit> {
        self.hits.lock().unwrap().clone()
    }
}

impl Drop for RepoApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the scripted broker answers one person.
#[derive(Debug, Clone, Default)]
pub(crate) struct StubAnswer {
    /// 400 `invalid_grant` with this link (`connect_uri`, `connect_id`,
    /// `connect_message`) until `connected_when` exists.
    pub link: Option<(String, String, String)>,
    /// The file whose existence means "the person connected".
    pub connected_when: Option<PathBuf>,
    /// 200 with this token once connected (or when there is no link): a
    /// DPoP-bound token, as the broker answers for a proxy resource.
    pub token: Option<String>,
    /// Answer `token` as a provider's own bearer token instead (`token_type`
    /// Bearer, `sender_constrained: false`), as for `delivery =
    /// "provider_token"`.
    pub provider_token: bool,
}

/// One derive the scripted broker received.
#[derive(Debug, Clone)]
pub(crate) struct StubHit {
    pub body: Value,
    pub dpop: Option<String>,
}

/// A scripted stand-in for the broker's orchestrator socket: answers every
/// derive per person (`sub` of the subject token, read without checks: the
/// example server has verified it) from `answers`, and records the requests.
/// It tests the MCP server's relaying on its own; the end-to-end tests use
/// the real broker.
pub(crate) struct StubBroker {
    pub socket: PathBuf,
    pub answers: Arc<Mutex<HashMap<String, StubAnswer>>>,
    pub hits: Arc<Mutex<Vec<StubHit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StubBroker {
    pub(crate) async fn start(dir: &Path) -> StubBroker {
        let socket = dir.join("stub-broker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let answers: Arc<Mutex<HashMap<String, StubAnswer>>> = Arc::default();
        let hits: Arc<Mutex<Vec<StubHit>>> = Arc::default();
        let (a, h) = (answers.clone(), hits.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (answers, hits) = (a.clone(), h.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (answers, hits) = (answers.clone(), hits.clone());
                        async move {
                            // The client reads the info once (upstreams):
                            // not a derive, not recorded; a broker without
                            // it is what the client expects of a stub.
                            if req.method() == http::Method::GET {
                                return Ok::<_, Infallible>(
                                    Response::builder()
                                        .status(404)
                                        .body(Full::new(Bytes::new()))
                                        .unwrap(),
                                );
                            }
                            let dpop = req
                                .headers()
                                .get("dpop")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned);
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let sub = body["subject_token"]
                                .as_str()
                                .and_then(|t| t.split('.').nth(1))
                                .and_then(|p| credbroker::internals::jose::b64d(p, "p").ok())
                                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                                .and_then(|c| c["sub"].as_str().map(str::to_owned))
                                .unwrap_or_default();
                            hits.lock().unwrap().push(StubHit { body, dpop });
                            let answer = answers.lock().unwrap().get(&sub).cloned();
                            let a = answer.unwrap_or_default();
                            let connected = a.link.is_none()
                                || a.connected_when.as_ref().is_some_and(|f| f.exists());
                            let (status, body) = match (&a.link, &a.token) {
                                (_, Some(t)) if connected && a.provider_token => (
                                    200,
                                    json!({
                                        "access_token": t, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                                        "token_type": "Bearer", "expires_in": 3600, "scope": "repo",
                                        "sender_constrained": false,
                                    }),
                                ),
                                (_, Some(t)) if connected => (
                                    200,
                                    json!({
                                        "access_token": t, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                                        "token_type": "DPoP", "expires_in": 300, "scope": "repo",
                                    }),
                                ),
                                (Some((uri, id, message)), _) => (
                                    400,
                                    json!({
                                        "error": "invalid_grant", "reason": "connect_required",
                                        "error_description": "connect the service first",
                                        "connect_uri": uri, "connect_id": id, "connect_expires_in": 1800,
                                        "connect_message": message,
                                    }),
                                ),
                                _ => (
                                    403,
                                    json!({"error": "access_denied", "reason": "tool_not_allowed"}),
                                ),
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .header("cache-control", "no-store")
                                    .body(Full::new(Bytes::from(body.to_string())))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        StubBroker {
            socket,
            answers,
            hits,
            task,
        }
    }

    pub(crate) fn set(&self, sub: &str, a: StubAnswer) {
        self.answers.lock().unwrap().insert(sub.to_owned(), a);
    }

    pub(crate) fn hits(&self) -> Vec<StubHit> {
        self.hits.lock().unwrap().clone()
    }
}

impl Drop for StubBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every string value anywhere in `v`.
pub(crate) fn all_strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().flat_map(all_strings).collect(),
        Value::Object(o) => o.values().flat_map(all_strings).collect(),
        _ => vec![],
    }
}

/// A raw JSON-RPC client of the example's `/mcp` endpoint, for tests that
/// check the exact bytes on the wire: no SDK in between to add, drop or
/// normalise a member.
pub(crate) struct RawMcp {
    pub url: String,
    token: String,
    http: reqwest::Client,
    /// `Mcp-Session-Id` after a 2025-11-25 `initialize`.
    pub session: Option<String>,
}

/// One HTTP answer: its status and the JSON-RPC messages in its body
/// (one for `application/json`, each `data:` line for an SSE stream).
#[derive(Debug)]
pub(crate) struct RawAnswer {
    pub status: u16,
    /// Its `Mcp-Session-Id` header.
    pub session: Option<String>,
    pub messages: Vec<Value>,
}

impl RawAnswer {
    /// The answer to request `id` (a result or an error).
    #[track_caller]
    pub(crate) fn reply(&self, id: i64) -> &Value {
        self.messages
            .iter()
            .find(|m| m["id"] == id && (m.get("result").is_some() || m.get("error").is_some()))
            .unwrap_or_else(|| panic!("no reply to id {id}: {self:?}"))
    }
}

/// `_meta` of a 2026-07-28 request: the version, the client's
/// capabilities (URL elicitation declared, or form only) and its name.
pub(crate) fn meta_2026(version: &str, url_elicitation: bool) -> Value {
    let elicitation = if url_elicitation {
        json!({"form": {}, "url": {}})
    } else {
        json!({"form": {}})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": elicitation},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test-client", "version": "1.0.0"},
    })
}

impl RawMcp {
    pub(crate) fn new(url: &str, token: &str) -> RawMcp {
        RawMcp {
            url: url.to_owned(),
            token: token.to_owned(),
            http: reqwest::Client::new(),
            session: None,
        }
    }

    /// POSTs one JSON-RPC message with `headers`; reads the body until the
    /// reply to its `id` arrived or the stream ended.
    pub(crate) async fn post(&self, headers: &[(&str, &str)], body: &Value) -> RawAnswer {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req.body(body.to_string()).send().await.unwrap();
        let status = resp.status().as_u16();
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut text = String::new();
        let mut messages = Vec::new();
        let deadline = std::time::Duration::from_secs(30);
        loop {
            let chunk = tokio::time::timeout(deadline, resp.chunk())
                .await
                .expect("the MCP server answers within 30 s")
                .unwrap();
            let Some(c) = chunk else { break };
            text.push_str(&String::from_utf8_lossy(&c));
            if sse {
                messages = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                    .collect();
                let done = messages.iter().any(|m| {
                    m.get("id") == body.get("id")
                        && (m.get("result").is_some() || m.get("error").is_some())
                });
                if done {
                    break;
                }
            }
        }
        if !sse {
            messages = serde_json::from_str::<Value>(&text).into_iter().collect();
        }
        RawAnswer {
            status,
            session,
            messages,
        }
    }

    /// 2025-11-25 style: `initialize` asking for `version` (declaring URL
    /// elicitation, or form only), then `notifications/initialized`.
    /// Returns the `initialize` reply.
    pub(crate) async fn initialize(&mut self, version: &str, url_elicitation: bool) -> Value {
        let elicitation = if url_elicitation {
            json!({"form": {}, "url": {}})
        } else {
            json!({"form": {}})
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version,
            "capabilities": {"elicitation": elicitation},
            "clientInfo": {"name": "raw-test-client", "version": "1.0.0"},
        }});
        let a = self.post(&[], &init).await;
        self.session = a.session.clone();
        let reply = a.reply(0).clone();
        if let Some(v) = reply["result"]["protocolVersion"].as_str() {
            let v = v.to_owned();
            let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            let a = self.post(&[("mcp-protocol-version", &v)], &done).await;
            assert!(a.status < 300, "notifications/initialized: {a:?}");
        }
        reply
    }
}
