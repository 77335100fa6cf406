//! The order of the proxy's checks, pinned before the proxy is split into
//! stages (issue 37 item 5). The order is the table "How each call is
//! checked" in docs/PROXY.md, read here at test time: for each two adjacent
//! rows, a call that fails both gets the earlier row's refusal (status and
//! reason, as the table gives them), and nothing was spent, recorded or
//! sent for the later one: the API stand-in saw no request, the audit log
//! holds no `proxy.request` and at most the earlier refusal's own
//! `proxy.completed` (outcome `denied`), and where it can be seen, the
//! proof or the single-use token is still unspent. Each pair then has its
//! positive controls: the call that fails only the later check gets the
//! later refusal, and the call that fails neither is served.
//!
//! A reordered table fails [`the_documented_order_is_the_order_tested`]
//! (its adjacent pairs are no longer the ones below); a reordered code
//! path fails the pair's scenario.
//!
//! The pairs run on three brokers, since some need settings that would
//! stop the others: [`Env::Main`] (one call per service, a 1 KiB body cap,
//! the audit log on a small tmpfs it can fill), [`Env::OneSlot`] (one call
//! in flight, DPoP nonces required) and [`Env::Limited`] (one call a second
//! per person and tool, with no burst).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::approvals::{approval_policy, approved_token, repository};
use super::{proxy_policy, ProxyEnv, PROXY, READ_ROUTES};
use crate::support::services::ProviderOpts;
use crate::support::*;
use credbroker::client::{Answer as Derived, DeriveParams};
use credbroker::verify::request::BoundRequest;

/// Where each adjacent pair of the table is shown, in the table's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Env {
    Main,
    OneSlot,
    Limited,
    /// The pair cannot be failed by one call; the reason says why.
    NotConstructible(&'static str),
}

/// Each row is named by the first refusal it lists.
const PAIRS: &[(&str, &str, Env)] = &[
    ("proxy_busy", "method_refused", Env::OneSlot),
    ("method_refused", "invalid_path", Env::Main),
    ("invalid_path", "frozen", Env::Main),
    ("frozen", "invalid_token", Env::Main),
    ("invalid_token", "use_dpop_nonce", Env::OneSlot),
    ("use_dpop_nonce", "invalid_dpop_proof", Env::OneSlot),
    ("invalid_dpop_proof", "credentials_in_query", Env::OneSlot),
    ("credentials_in_query", "tool_not_allowed", Env::Main),
    ("tool_not_allowed", "details_mismatch", Env::Main),
    ("details_mismatch", "rate_limited", Env::Limited),
    ("rate_limited", "service_busy", Env::Limited),
    ("service_busy", "request_too_large", Env::Main),
    ("request_too_large", "bound_body_too_large", Env::Main),
    ("bound_body_too_large", "connect_required", Env::Main),
    ("connect_required", "token_already_used", Env::Main),
    ("token_already_used", "audit_unavailable", Env::Main),
    ("audit_unavailable", "upstream_unreachable", Env::Main),
    (
        "upstream_unreachable",
        "echo_blocked",
        // The echo guard scans the provider's answer; a provider that was
        // unreachable or did not answer in time gave no answer to scan. The
        // only overlap, an answer whose head (in time) carries the token and
        // whose body then stalls, does not fail the timeout row for its
        // head: the head is scanned first and the call ends `echo_blocked`.
        Env::NotConstructible("an unreachable or silent provider gives no answer to scan"),
    ),
];

/// One row of the table: its refusals (the first names it) and status.
#[derive(Debug, Clone)]
struct Row {
    key: String,
    reasons: Vec<String>,
    status: Option<u16>,
}

/// The rows of docs/PROXY.md's check table, in order.
fn rows() -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/PROXY.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let section = text
        .split("## How each call is checked")
        .nth(1)
        .expect("docs/PROXY.md has the section \"How each call is checked\"");
    let mut rows = Vec::new();
    let mut started = false;
    for line in section.lines().map(str::trim) {
        if !line.starts_with('|') {
            if started {
                break;
            }
            continue;
        }
        started = true;
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() != 3 || cells[0] == "check" || cells[0].starts_with("---") {
            continue;
        }
        let reasons: Vec<String> = cells[1]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        assert!(!reasons.is_empty(), "a row without a refusal: {line}");
        rows.push(Row {
            key: reasons[0].clone(),
            reasons,
            status: cells[2].parse().ok(),
        });
    }
    rows
}

/// The table's row named `key`.
fn row(key: &str) -> Row {
    rows().into_iter().find(|r| r.key == key).unwrap()
}

/// The table's adjacent pairs that run on `env`.
fn pairs_on(env: Env) -> Vec<(Row, Row)> {
    rows()
        .windows(2)
        .filter(|w| {
            let known = PAIRS
                .iter()
                .find(|(a, b, _)| *a == w[0].key && *b == w[1].key);
            let (_, _, e) = known.unwrap_or_else(|| {
                panic!(
                    "docs/PROXY.md puts {} right before {}: no scenario shows that order",
                    w[0].key, w[1].key
                )
            });
            *e == env
        })
        .map(|w| (w[0].clone(), w[1].clone()))
        .collect()
}

#[test]
fn the_documented_order_is_the_order_tested() {
    let rows = rows();
    assert!(rows.len() >= 10, "the table was not found whole: {rows:?}");
    let documented: Vec<(&str, &str)> = rows
        .windows(2)
        .map(|w| (w[0].key.as_str(), w[1].key.as_str()))
        .collect();
    let tested: Vec<(&str, &str)> = PAIRS.iter().map(|(a, b, _)| (*a, *b)).collect();
    assert_eq!(
        documented, tested,
        "docs/PROXY.md's order of checks is not the order these tests pin"
    );
    for (a, b, env) in PAIRS {
        if let Env::NotConstructible(why) = env {
            eprintln!("NOT SHOWN ({why}): {a} before {b}");
        }
    }
}

/// An answer of the proxy: status, headers (lower-case names), JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Answer {
    async fn of(r: reqwest::Response) -> Answer {
        let status = r.status().as_u16();
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
            .collect();
        let text = r.text().await.unwrap_or_default();
        Answer {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or_default()
    }

    /// This is `row`'s refusal `reason`, with the row's status.
    #[track_caller]
    fn is(&self, row: &Row, reason: &str) {
        assert!(
            row.reasons.iter().any(|r| r == reason),
            "{reason} is not a refusal of the row {row:?}"
        );
        assert_eq!(self.reason(), reason, "{self:?}");
        if let Some(status) = row.status {
            assert_eq!(self.status, status, "{self:?}");
        }
        if self.status == 401 {
            let challenge = self.header("www-authenticate").unwrap_or_default();
            assert!(challenge.starts_with("DPoP "), "{self:?}");
        }
    }

    #[track_caller]
    fn served(&self, status: u16) {
        assert_eq!(self.status, status, "the positive control: {self:?}");
    }
}

/// The three test brokers, each with its peers.
struct Broker {
    p: ProxyEnv,
    audit: PathBuf,
    /// The small file system the audit log is on, in [`Env::Main`].
    audit_fs: Option<Tmpfs>,
    _dir: tempfile::TempDir,
}

/// What was sent upstream and audited so far.
struct Mark {
    upstream: usize,
    audit: usize,
}

impl Broker {
    async fn start(proxy_keys: &str, policy: String, audit_on_tmpfs: bool) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let audit_fs = if audit_on_tmpfs {
            Tmpfs::mount(&dir.path().join("auditfs"), "2m")
        } else {
            None
        };
        let audit_log = audit_fs.as_ref().map(|f| f.0.join("audit.jsonl"));
        let p = ProxyEnv::start_with(
            proxy_keys,
            ProviderOpts {
                policy: Some(policy),
                audit_log: audit_log.clone(),
                ..ProviderOpts::default()
            },
        )
        .await;
        let audit = audit_log.unwrap_or_else(|| p.env.broker.path("data/audit.jsonl"));
        Broker {
            p,
            audit,
            audit_fs,
            _dir: dir,
        }
    }

    fn mark(&self) -> Mark {
        Mark {
            upstream: self.p.api.records().len(),
            audit: read_audit(&self.audit).len(),
        }
    }

    /// Since `m`: nothing went upstream, no `proxy.request` was written,
    /// and the refusals audited are exactly `denied` (the refusals after
    /// the token check are; those before it are not).
    #[track_caller]
    fn nothing_spent(&self, m: &Mark, denied: Option<&str>) {
        let records = self.p.api.records();
        assert_eq!(
            records.len(),
            m.upstream,
            "a refused call went upstream: {:?}",
            &records[m.upstream.min(records.len())..]
        );
        let events = read_audit(&self.audit);
        let new = &events[m.audit.min(events.len())..];
        assert!(
            !new.iter().any(|e| e["event"] == "proxy.request"),
            "a refused call was recorded as sent: {new:?}"
        );
        // A hanging call of the scenario may time out meanwhile.
        let refusals: Vec<&str> = new
            .iter()
            .filter(|e| e["event"] == "proxy.completed" && e["outcome"] == "denied")
            .filter_map(|e| e["reason"].as_str())
            .filter(|r| *r != "upstream_timeout")
            .collect();
        assert_eq!(refusals, denied.into_iter().collect::<Vec<_>>(), "{new:?}");
    }

    /// A proof for `method` on `path` with the given `jti` (random when
    /// `None`) and `nonce`.
    fn proof(
        &self,
        token: &str,
        method: &str,
        path: &str,
        nonce: Option<&str>,
        jti: Option<&str>,
    ) -> String {
        let jti = jti.map_or_else(
            || credbroker::internals::jose::b64e(&random_bytes(16)),
            str::to_string,
        );
        let mut claims = json!({
            "jti": jti,
            "htm": method,
            "htu": format!("{}{path}", self.p.env.broker.issuer),
            "iat": now(),
            "ath": credbroker::internals::jose::sha256_b64(token.as_bytes()),
        });
        if let Some(n) = nonce {
            claims["nonce"] = n.into();
        }
        proof_with(&self.p.key, json!({}), &claims)
    }

    /// A call to `path_and_query` under `/proxy/acme` with `proof`.
    async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        authorization: &str,
        proof: &str,
        body: Option<Vec<u8>>,
    ) -> Answer {
        let full = format!("/proxy/acme{path_and_query}");
        Answer::of(self.p.send(method, &full, authorization, proof, body).await).await
    }

    /// The tool's call with a fresh proof (carrying `nonce`).
    async fn call(
        &self,
        token: &str,
        method: &str,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        nonce: Option<&str>,
    ) -> Answer {
        let path = format!("/proxy/acme{}", path_and_query.split('?').next().unwrap());
        let proof = self.proof(token, method, &path, nonce, None);
        self.send(
            method,
            path_and_query,
            &format!("DPoP {token}"),
            &proof,
            body,
        )
        .await
    }

    /// Raw bytes to the public listener (for request shapes an HTTP client
    /// would not send).
    async fn raw(&self, request: String) -> Answer {
        let addr = self.p.env.broker.public.trim_start_matches("http://");
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let headers = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let json = body
            .find('{')
            .zip(body.rfind('}'))
            .and_then(|(a, b)| serde_json::from_str(&body[a..=b]).ok())
            .unwrap_or(Value::Null);
        Answer {
            status: status_of(&text),
            headers,
            body: json,
        }
    }

    /// A raw GET of `target` with a token and a proof for exactly that path.
    async fn raw_get(&self, token: &str, target: &str, extra: &str, nonce: Option<&str>) -> Answer {
        let proof = self.proof(token, "GET", target, nonce, None);
        self.raw(format!(
            "GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: DPoP {token}\r\nDPoP: {proof}\r\n{extra}Connection: close\r\n\r\n"
        ))
        .await
    }

    /// A token for `tool` in `step`, waiting out the rate limit of
    /// [`Env::Limited`].
    async fn token(&self, tool: &str, step: &str, details: Option<&Value>) -> String {
        let b = &self.p.env.broker;
        let subject = b.subject_token("alice");
        let params = DeriveParams {
            subject_token: &subject,
            step,
            tool,
            resource: PROXY,
            scope: None,
        };
        for _ in 0..10 {
            match b
                .client()
                .derive_for_details(&params, details, &self.p.key)
                .await
                .unwrap()
            {
                Derived::Issued(t) => return t.access_token.expose().clone(),
                Derived::Refused(r) if r.error == "rate_limited" => {
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                }
                Derived::Refused(r) => panic!("{tool} in {step}: {r:?}"),
            }
        }
        panic!("{tool} in {step}: still rate limited");
    }

    /// Starts a call to the stand-in's `/hang` and returns once the
    /// stand-in holds it.
    async fn hang(
        &self,
        token: &str,
        nonce: Option<&str>,
    ) -> tokio::task::JoinHandle<reqwest::Response> {
        let seen = self
            .p
            .api
            .records()
            .iter()
            .filter(|r| r.path == "/hang")
            .count();
        let proof = self.proof(token, "GET", "/proxy/acme/hang", nonce, None);
        let rb = self
            .p
            .http
            .get(format!("{}/proxy/acme/hang", self.p.env.broker.public))
            .header("authorization", format!("DPoP {token}"))
            .header("dpop", proof);
        let call = tokio::spawn(async move { rb.send().await.unwrap() });
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .p
            .api
            .records()
            .iter()
            .filter(|r| r.path == "/hang")
            .count()
            == seen
        {
            assert!(
                Instant::now() < deadline,
                "the hanging call never went upstream"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        call
    }

    /// A nonce of this broker, from the challenge to a proof without one.
    async fn nonce(&self, token: &str) -> String {
        let a = self.call(token, "GET", "/user", None, None).await;
        assert_eq!(a.reason(), "use_dpop_nonce", "{a:?}");
        a.header("dpop-nonce").unwrap().to_string()
    }

    /// The admin freeze on or off.
    fn freeze(&self, on: bool) {
        let (status, body) = self
            .p
            .env
            .broker
            .admin_post("/freeze", if on { "on" } else { "off" })
            .unwrap();
        assert_eq!(status, 200, "{body}");
    }

    /// Replaces the policy and waits until the broker decides with it.
    async fn reload(&self, policy: &str) {
        let b = &self.p.env.broker;
        let before = b.policy_hash();
        b.replace_policy(policy.as_bytes());
        b.sighup();
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.policy_hash() == before {
            assert!(Instant::now() < deadline, "the reload never took effect");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fills the audit log's file system (none left for one more line).
    fn fill_audit_disk(&self) {
        self.audit_fs.as_ref().unwrap().fill_after(&self.audit);
    }

    fn free_audit_disk(&self) {
        self.audit_fs.as_ref().unwrap().unfill();
    }
}

/// A tool whose one route binds its variables to the call's details, in
/// step `triage` only (the tool is also allowed `open_pr`).
fn tagged_tool() -> String {
    format!(
        r#"
[tools."acme.tagged"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage", "open_pr"]
require_authorization_details = true
routes = [{{ route = "GET /repos/{{owner}}/{{repo}}/issues", steps = ["triage"], details = {{ owner = "repository.owner", repo = "repository.name" }} }}]

[tools."acme.tagged".authorization_details.repository]
owner = {{ kind = "string", required = true, label = "Owner" }}
name = {{ kind = "string", required = true, label = "Repository" }}
"#
    )
}

/// A tool whose one route binds the request (`bind_request`), approved
/// for each call.
fn bound_tool() -> String {
    format!(
        r#"
[tools."acme.bound"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage"]
approval = "each_call"
routes = [{{ route = "POST /repos/{{owner}}/{{repo}}/pulls", bind_request = true }}]
"#
    )
}

fn main_policy() -> String {
    approval_policy(r#""DELETE /repos/{owner}/{repo}""#) + &tagged_tool() + &bound_tool()
}

/// [`main_policy`] where the writing and deleting tools need a provider
/// scope alice never granted: their calls need her to reconnect.
fn policy_needing_a_new_scope() -> String {
    let mut text = main_policy();
    for tool in ["acme.write", "acme.delete", "acme.bound"] {
        let from = format!("[tools.\"{tool}\"]\nresource = \"{PROXY}\"\nscopes = [\"repo\"]");
        let to = from.replace("[\"repo\"]", "[\"repo\", \"delete_repo\"]");
        assert!(text.contains(&from), "{tool} in {text}");
        text = text.replacen(&from, &to, 1);
    }
    text
}

const MAIN_KEYS: &str = "timeout = \"2s\"\nmax_request_body = 1024\nmax_concurrent_per_service = 1";
const ONE_SLOT_KEYS: &str = "max_in_flight = 1\ntimeout = \"2s\"\n\n[dpop]\nrequire_nonce = true";
const LIMITED_KEYS: &str = "max_concurrent_per_service = 1\ntimeout = \"5s\"\n\n[limits]\nper_peer_per_second = 10000\nper_person_tool_per_second = 1\nburst = 1";

#[tokio::test]
async fn check_order_on_one_call_per_service_and_a_full_audit_disk() {
    let mut b = Broker::start(MAIN_KEYS, main_policy(), true).await;
    let pairs = pairs_on(Env::Main);
    assert!(!pairs.is_empty());
    for (earlier, later) in &pairs {
        eprintln!("pair: {} before {}", earlier.key, later.key);
        let (e, l) = (earlier, later);
        match (e.key.as_str(), l.key.as_str()) {
            ("method_refused", "invalid_path") => shape_before_path(&b, e, l).await,
            ("invalid_path", "frozen") => path_before_freeze(&b, e, l).await,
            ("frozen", "invalid_token") => freeze_before_token(&b, e, l).await,
            ("credentials_in_query", "tool_not_allowed") => query_before_policy(&b, e, l).await,
            ("tool_not_allowed", "details_mismatch") => policy_before_details(&b, e, l).await,
            ("service_busy", "request_too_large") => busy_before_body(&b, e, l).await,
            ("request_too_large", "bound_body_too_large") => body_before_bound(&mut b, e, l).await,
            ("bound_body_too_large", "connect_required") => {
                bound_before_account(&mut b, e, l).await;
                // On a route that binds nothing the bound row does not
                // apply: the body row comes right before the account row.
                body_before_account(&b, &row("request_too_large"), l).await;
            }
            ("connect_required", "token_already_used") => {
                account_before_single_use(&mut b, e, l).await
            }
            ("token_already_used", "audit_unavailable") => {
                single_use_before_audit(&mut b, e, l).await
            }
            ("audit_unavailable", "upstream_unreachable") => audit_before_upstream(&b, e, l).await,
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

#[tokio::test]
async fn check_order_with_one_call_in_flight_and_nonces_required() {
    let mut b = Broker::start(ONE_SLOT_KEYS, proxy_policy(READ_ROUTES), false).await;
    let pairs = pairs_on(Env::OneSlot);
    assert!(!pairs.is_empty());
    for (e, l) in &pairs {
        eprintln!("pair: {} before {}", e.key, l.key);
        // The one slot is free again once the last answer's body is done
        // on the broker's side too.
        tokio::time::sleep(Duration::from_millis(200)).await;
        match (e.key.as_str(), l.key.as_str()) {
            ("proxy_busy", "method_refused") => in_flight_before_shape(&b, e, l).await,
            ("invalid_token", "use_dpop_nonce") => token_before_nonce(&b, e, l).await,
            ("use_dpop_nonce", "invalid_dpop_proof") => nonce_before_replay(&mut b, e, l).await,
            ("invalid_dpop_proof", "credentials_in_query") => {
                replay_before_query(&mut b, e, l).await
            }
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

#[tokio::test]
async fn check_order_at_one_call_a_second_per_person_and_tool() {
    let b = Broker::start(
        LIMITED_KEYS,
        proxy_policy(READ_ROUTES) + &tagged_tool(),
        false,
    )
    .await;
    let pairs = pairs_on(Env::Limited);
    assert!(!pairs.is_empty());
    for (e, l) in &pairs {
        eprintln!("pair: {} before {}", e.key, l.key);
        match (e.key.as_str(), l.key.as_str()) {
            ("details_mismatch", "rate_limited") => details_before_rate(&b, e, l).await,
            ("rate_limited", "service_busy") => rate_before_service_busy(&b, e, l).await,
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

// --- Env::Main ---------------------------------------------------------

/// A path the path rules refuse (a trailing `/`).
const BAD_PATH: &str = "/proxy/acme/user/";

async fn shape_before_path(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let m = b.mark();
    let trace = b
        .raw(format!(
            "TRACE {BAD_PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ))
        .await;
    trace.is(e, "method_refused");
    let absolute = format!("{}{BAD_PATH}", b.p.env.broker.public);
    b.raw_get(&read, &absolute, "", None)
        .await
        .is(e, "absolute_form");
    b.raw_get(&read, BAD_PATH, "Upgrade: websocket\r\n", None)
        .await
        .is(e, "upgrade_refused");
    b.nothing_spent(&m, None);
    // Only the path: its own refusal.
    let m = b.mark();
    b.raw_get(&read, BAD_PATH, "", None)
        .await
        .is(l, "invalid_path");
    b.nothing_spent(&m, None);
    b.raw_get(&read, "/proxy/acme/user", "", None)
        .await
        .served(200);
}

async fn path_before_freeze(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    b.freeze(true);
    let m = b.mark();
    b.raw_get(&read, BAD_PATH, "", None)
        .await
        .is(e, "invalid_path");
    b.nothing_spent(&m, None);
    let proof = b.proof(&read, "GET", "/proxy/acme/user", None, None);
    let auth = format!("DPoP {read}");
    b.send("GET", "/user", &auth, &proof, None)
        .await
        .is(l, "frozen");
    b.nothing_spent(&m, None);
    b.freeze(false);
    // The frozen call did not use its proof up.
    b.send("GET", "/user", &auth, &proof, None)
        .await
        .served(200);
}

async fn freeze_before_token(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let proof = b.proof(&read, "GET", "/proxy/acme/user", None, None);
    let bearer = format!("Bearer {read}");
    b.freeze(true);
    let m = b.mark();
    b.send("GET", "/user", &bearer, &proof, None)
        .await
        .is(e, "frozen");
    b.nothing_spent(&m, None);
    b.freeze(false);
    let a = b.send("GET", "/user", &bearer, &proof, None).await;
    a.is(l, "invalid_token");
    assert!(
        a.header("www-authenticate")
            .is_some_and(|c| c.contains("error=\"invalid_token\"")),
        "{a:?}"
    );
    b.nothing_spent(&m, None);
    // Neither refusal used the proof up.
    b.send("GET", "/user", &format!("DPoP {read}"), &proof, None)
        .await
        .served(200);
}

async fn query_before_policy(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let m = b.mark();
    b.call(&read, "GET", "/nope?access_token=abc", None, None)
        .await
        .is(e, "credentials_in_query");
    b.nothing_spent(&m, Some("credentials_in_query"));
    let m = b.mark();
    b.call(&read, "GET", "/nope", None, None)
        .await
        .is(l, "route_not_allowed");
    b.nothing_spent(&m, Some("route_not_allowed"));
    b.call(&read, "GET", "/user?page=2", None, None)
        .await
        .served(200);
}

async fn policy_before_details(b: &Broker, e: &Row, l: &Row) {
    let hello = repository("octo", "hello");
    // The tool's step open_pr: its one route is for triage only.
    let other_step = b.token("acme.tagged", "open_pr", Some(&hello)).await;
    let tagged = b.token("acme.tagged", "triage", Some(&hello)).await;
    let m = b.mark();
    b.call(&other_step, "GET", "/repos/octo/other/issues", None, None)
        .await
        .is(e, "step_not_allowed");
    b.nothing_spent(&m, Some("step_not_allowed"));
    let m = b.mark();
    b.call(&tagged, "GET", "/repos/octo/other/issues", None, None)
        .await
        .is(l, "details_mismatch");
    b.nothing_spent(&m, Some("details_mismatch"));
    b.call(&tagged, "GET", "/repos/octo/hello/issues", None, None)
        .await
        .served(200);
}

async fn busy_before_body(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let write = b.token("acme.write", "open_pr", None).await;
    let too_large = || Some(vec![b' '; 2000]);
    // The service's one slot is held by a call the stand-in never answers.
    let hanging = b.hang(&read, None).await;
    let m = b.mark();
    b.call(&write, "POST", "/repos/o/r/pulls", too_large(), None)
        .await
        .is(e, "service_busy");
    b.nothing_spent(&m, Some("service_busy"));
    let timed_out = Answer::of(hanging.await.unwrap()).await;
    assert_eq!(timed_out.reason(), "upstream_timeout", "{timed_out:?}");
    let m = b.mark();
    b.call(&write, "POST", "/repos/o/r/pulls", too_large(), None)
        .await
        .is(l, "request_too_large");
    b.nothing_spent(&m, Some("request_too_large"));
    b.call(
        &write,
        "POST",
        "/repos/o/r/pulls",
        Some(vec![b' '; 1000]),
        None,
    )
    .await
    .served(201);
}

async fn body_before_account(b: &Broker, e: &Row, l: &Row) {
    let write = b.token("acme.write", "open_pr", None).await;
    b.reload(&policy_needing_a_new_scope()).await;
    let m = b.mark();
    b.call(
        &write,
        "POST",
        "/repos/o/r/pulls",
        Some(vec![b' '; 2000]),
        None,
    )
    .await
    .is(e, "request_too_large");
    b.nothing_spent(&m, Some("request_too_large"));
    let m = b.mark();
    let a = b
        .call(
            &write,
            "POST",
            "/repos/o/r/pulls",
            Some(vec![b' '; 1000]),
            None,
        )
        .await;
    let reason = account_refusal(&a);
    a.is(l, &reason);
    assert!(
        a.body["connect_uri"]
            .as_str()
            .is_some_and(|u| u.contains("/connect/")),
        "{a:?}"
    );
    b.nothing_spent(&m, Some(&reason));
    b.reload(&main_policy()).await;
    b.call(
        &write,
        "POST",
        "/repos/o/r/pulls",
        Some(vec![b' '; 1000]),
        None,
    )
    .await
    .served(201);
}

/// The request `acme.bound` is approved for, and another one (one body
/// byte changed).
const BOUND_PATH: &str = "/repos/o/r/pulls";
const BOUND_BODY: &str = r#"{"base":"main","head":"fix-1"}"#;
const OTHER_BODY: &str = r#"{"base":"main","head":"fix-2"}"#;

/// A derive of `acme.bound` for the request [`BOUND_BODY`].
async fn derive_bound(p: &ProxyEnv) -> Derived {
    let request = BoundRequest {
        method: "POST",
        path: BOUND_PATH,
        query: "",
        content_type: "application/json",
        body: BOUND_BODY.as_bytes(),
    };
    let broker = &p.env.broker;
    let proof = credbroker::client::proof(
        &p.key,
        "POST",
        &format!("{}/v1/derive", broker.issuer),
        None,
    )
    .unwrap();
    let subject = broker.subject_token("alice");
    let params = DeriveParams {
        subject_token: &subject,
        step: "triage",
        tool: "acme.bound",
        resource: PROXY,
        scope: None,
    };
    broker
        .client()
        .derive_with_request(&params, None, &request, &proof)
        .await
        .unwrap()
}

/// Alice approves `acme.bound`'s call through the real pages; its
/// single-use token, bound to that request.
async fn bound_token(b: &mut Broker) -> String {
    let r = services::refused(derive_bound(&b.p).await);
    assert_eq!(r.reason.as_deref(), Some("approval_required"), "{r:?}");
    b.p.env
        .play_pages(&r.connect_uri.unwrap(), "alice", "")
        .await;
    let t = services::issued(derive_bound(&b.p).await);
    t.access_token.expose().clone()
}

async fn body_before_bound(b: &mut Broker, e: &Row, l: &Row) {
    let t = bound_token(b).await;
    // Over max_request_body (1 KiB) and not the approved request.
    let large = format!(r#"{{"base":"main","head":"{}"}}"#, "x".repeat(2000));
    let m = b.mark();
    b.call(&t, "POST", BOUND_PATH, Some(large.into_bytes()), None)
        .await
        .is(e, "request_too_large");
    b.nothing_spent(&m, Some("request_too_large"));
    // Within it, not the approved request: the bound row (its 16 KiB cap
    // is above this broker's 1 KiB, so its own size refusal cannot be
    // reached here; tests/it/proxy/bound.rs shows it).
    let m = b.mark();
    b.call(&t, "POST", BOUND_PATH, Some(OTHER_BODY.into()), None)
        .await
        .is(l, "request_mismatch");
    b.nothing_spent(&m, Some("request_mismatch"));
    b.call(&t, "POST", BOUND_PATH, Some(BOUND_BODY.into()), None)
        .await
        .served(201);
}

async fn bound_before_account(b: &mut Broker, e: &Row, l: &Row) {
    let t = bound_token(b).await;
    b.reload(&policy_needing_a_new_scope()).await;
    let m = b.mark();
    b.call(&t, "POST", BOUND_PATH, Some(OTHER_BODY.into()), None)
        .await
        .is(e, "request_mismatch");
    b.nothing_spent(&m, Some("request_mismatch"));
    let m = b.mark();
    let a = b
        .call(&t, "POST", BOUND_PATH, Some(BOUND_BODY.into()), None)
        .await;
    let reason = account_refusal(&a);
    a.is(l, &reason);
    b.nothing_spent(&m, Some(&reason));
    b.reload(&main_policy()).await;
    b.call(&t, "POST", BOUND_PATH, Some(BOUND_BODY.into()), None)
        .await
        .served(201);
}

/// The reason of a refusal by the account row (which of its three
/// depends on what the account lacks).
#[track_caller]
fn account_refusal(a: &Answer) -> String {
    let reason = a.reason();
    assert!(
        ["connect_required", "allow_required", "reconnect_required"].contains(&reason),
        "{a:?}"
    );
    reason.to_string()
}

async fn account_before_single_use(b: &mut Broker, e: &Row, l: &Row) {
    let hello = repository("octo", "hello");
    let spent = approved_token(&mut b.p, &hello).await;
    let fresh = approved_token(&mut b.p, &hello).await;
    b.call(&spent, "DELETE", "/repos/octo/hello", None, None)
        .await
        .served(200);
    b.reload(&policy_needing_a_new_scope()).await;
    let m = b.mark();
    let a = b
        .call(&spent, "DELETE", "/repos/octo/hello", None, None)
        .await;
    let reason = account_refusal(&a);
    a.is(e, &reason);
    b.nothing_spent(&m, Some(&reason));
    // An unspent single-use token is refused the same way, and not spent.
    let m = b.mark();
    b.call(&fresh, "DELETE", "/repos/octo/hello", None, None)
        .await
        .is(e, &reason);
    b.nothing_spent(&m, Some(&reason));
    b.reload(&main_policy()).await;
    let m = b.mark();
    let a = b
        .call(&spent, "DELETE", "/repos/octo/hello", None, None)
        .await;
    a.is(l, "token_already_used");
    assert!(
        a.header("www-authenticate")
            .is_some_and(|c| c.contains("invalid_token")),
        "{a:?}"
    );
    b.nothing_spent(&m, Some("token_already_used"));
    b.call(&fresh, "DELETE", "/repos/octo/hello", None, None)
        .await
        .served(200);
}

/// Whether the audit log is on a file system this test can fill.
fn audit_disk(b: &Broker, what: &str) -> bool {
    if b.audit_fs.is_none() {
        not_shown(what, "cannot mount a tmpfs here (needs root)");
        return false;
    }
    true
}

async fn single_use_before_audit(b: &mut Broker, e: &Row, l: &Row) {
    if !audit_disk(b, "token_already_used before audit_unavailable") {
        return;
    }
    let hello = repository("octo", "hello");
    // Every token first: a derive needs the audit log too.
    let spent = approved_token(&mut b.p, &hello).await;
    let unspent = approved_token(&mut b.p, &hello).await;
    b.call(&spent, "DELETE", "/repos/octo/hello", None, None)
        .await
        .served(200);
    b.fill_audit_disk();
    let m = b.mark();
    b.call(&spent, "DELETE", "/repos/octo/hello", None, None)
        .await
        .is(e, "token_already_used");
    b.nothing_spent(&m, None);
    b.call(&unspent, "DELETE", "/repos/octo/hello", None, None)
        .await
        .is(l, "audit_unavailable");
    b.nothing_spent(&m, None);
    b.free_audit_disk();
    let again = approved_token(&mut b.p, &hello).await;
    b.call(&again, "DELETE", "/repos/octo/hello", None, None)
        .await
        .served(200);
}

async fn audit_before_upstream(b: &Broker, e: &Row, l: &Row) {
    if !audit_disk(b, "audit_unavailable before upstream_timeout") {
        return;
    }
    let read = b.token("acme.read", "triage", None).await;
    b.fill_audit_disk();
    let m = b.mark();
    // The stand-in never answers /hang: the audit refuses it first, at once.
    let started = Instant::now();
    b.call(&read, "GET", "/hang", None, None)
        .await
        .is(e, "audit_unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no upstream wait"
    );
    b.nothing_spent(&m, None);
    b.free_audit_disk();
    let m = b.mark();
    let a = b.call(&read, "GET", "/hang", None, None).await;
    a.is(l, "upstream_timeout");
    assert_eq!(a.status, 504, "{a:?}");
    assert_eq!(b.p.api.records().len(), m.upstream + 1, "it went upstream");
    b.call(&read, "GET", "/user", None, None).await.served(200);
}

// --- Env::OneSlot ------------------------------------------------------

async fn in_flight_before_shape(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let nonce = b.nonce(&read).await;
    let trace = "TRACE /proxy/acme/user HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    // The one call in flight: one the stand-in never answers.
    let hanging = b.hang(&read, Some(&nonce)).await;
    let m = b.mark();
    b.raw(trace.into()).await.is(e, "proxy_busy");
    b.nothing_spent(&m, None);
    let timed_out = Answer::of(hanging.await.unwrap()).await;
    assert_eq!(timed_out.reason(), "upstream_timeout", "{timed_out:?}");
    let m = b.mark();
    b.raw(trace.into()).await.is(l, "method_refused");
    b.nothing_spent(&m, None);
    b.call(&read, "GET", "/user", None, Some(&nonce))
        .await
        .served(200);
}

async fn token_before_nonce(b: &Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let without_nonce = b.proof(&read, "GET", "/proxy/acme/user", None, None);
    let m = b.mark();
    b.send(
        "GET",
        "/user",
        &format!("Bearer {read}"),
        &without_nonce,
        None,
    )
    .await
    .is(e, "invalid_token");
    b.nothing_spent(&m, None);
    let a = b
        .send(
            "GET",
            "/user",
            &format!("DPoP {read}"),
            &without_nonce,
            None,
        )
        .await;
    a.is(l, "use_dpop_nonce");
    let nonce = a.header("dpop-nonce").expect("a nonce to retry with");
    b.nothing_spent(&m, None);
    b.call(&read, "GET", "/user", None, Some(nonce))
        .await
        .served(200);
}

/// The store's replay check is seen apart from the verifier's own replay
/// cache (the token row) only on a broker that restarted since it saw the
/// proof's `jti`, as another instance sharing the store would be: each use
/// of a `jti` below comes after a restart.
async fn nonce_before_replay(b: &mut Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let jti = credbroker::internals::jose::b64e(&random_bytes(16));
    let nonce = b.nonce(&read).await;
    let auth = format!("DPoP {read}");
    let used = b.proof(&read, "GET", "/proxy/acme/user", Some(&nonce), Some(&jti));
    b.send("GET", "/user", &auth, &used, None).await.served(200);

    b.p.env.broker.restart();
    let m = b.mark();
    // The jti is in the store, and the proof has no nonce.
    let replayed = b.proof(&read, "GET", "/proxy/acme/user", None, Some(&jti));
    b.send("GET", "/user", &auth, &replayed, None)
        .await
        .is(e, "use_dpop_nonce");
    b.nothing_spent(&m, None);

    b.p.env.broker.restart();
    let nonce = b.nonce(&read).await;
    let m = b.mark();
    let replayed = b.proof(&read, "GET", "/proxy/acme/user", Some(&nonce), Some(&jti));
    b.send("GET", "/user", &auth, &replayed, None)
        .await
        .is(l, "invalid_dpop_proof");
    b.nothing_spent(&m, None);
    b.call(&read, "GET", "/user", None, Some(&nonce))
        .await
        .served(200);
}

async fn replay_before_query(b: &mut Broker, e: &Row, l: &Row) {
    let read = b.token("acme.read", "triage", None).await;
    let jti = credbroker::internals::jose::b64e(&random_bytes(16));
    let nonce = b.nonce(&read).await;
    let auth = format!("DPoP {read}");
    let used = b.proof(&read, "GET", "/proxy/acme/user", Some(&nonce), Some(&jti));
    b.send("GET", "/user", &auth, &used, None).await.served(200);

    b.p.env.broker.restart();
    let nonce = b.nonce(&read).await;
    let m = b.mark();
    let replayed = b.proof(&read, "GET", "/proxy/acme/user", Some(&nonce), Some(&jti));
    b.send("GET", "/user?access_token=abc", &auth, &replayed, None)
        .await
        .is(e, "invalid_dpop_proof");
    b.nothing_spent(&m, None);
    let m = b.mark();
    b.call(&read, "GET", "/user?access_token=abc", None, Some(&nonce))
        .await
        .is(l, "credentials_in_query");
    b.nothing_spent(&m, Some("credentials_in_query"));
    b.call(&read, "GET", "/user?page=2", None, Some(&nonce))
        .await
        .served(200);
}

// --- Env::Limited ------------------------------------------------------

/// One call a second, no burst: once a call at `t0` or later is counted,
/// no other is allowed before `t0 + 1 s`. A call refused before then was
/// refused while the limit was used up, so had the limit been checked first
/// it would have answered `rate_limited`. A slower run retries.
const WINDOW: Duration = Duration::from_secs(1);
const ATTEMPTS: usize = 6;

async fn wait_for_the_limit() {
    tokio::time::sleep(Duration::from_millis(1200)).await;
}

async fn details_before_rate(b: &Broker, e: &Row, l: &Row) {
    let hello = repository("octo", "hello");
    let tagged = b.token("acme.tagged", "triage", Some(&hello)).await;
    let mut shown = false;
    for _ in 0..ATTEMPTS {
        wait_for_the_limit().await;
        let t0 = Instant::now();
        // The person's and tool's one call of this second.
        let first = b
            .call(&tagged, "GET", "/repos/octo/hello/issues", None, None)
            .await;
        if first.status != 200 {
            assert_eq!(first.reason(), "rate_limited", "{first:?}");
            continue;
        }
        let m = b.mark();
        b.call(&tagged, "GET", "/repos/octo/other/issues", None, None)
            .await
            .is(e, "details_mismatch");
        let both_failed = t0.elapsed() < WINDOW;
        b.nothing_spent(&m, Some("details_mismatch"));
        let m = b.mark();
        let a = b
            .call(&tagged, "GET", "/repos/octo/hello/issues", None, None)
            .await;
        if a.status == 200 {
            continue; // the second was over: try again
        }
        a.is(l, "rate_limited");
        assert!(a.header("retry-after").is_some(), "{a:?}");
        b.nothing_spent(&m, Some("rate_limited"));
        if both_failed {
            shown = true;
            break;
        }
    }
    assert!(shown, "{ATTEMPTS} attempts, none within one second");
    wait_for_the_limit().await;
    b.call(&tagged, "GET", "/repos/octo/hello/issues", None, None)
        .await
        .served(200);
}

async fn rate_before_service_busy(b: &Broker, e: &Row, l: &Row) {
    let hello = repository("octo", "hello");
    let read = b.token("acme.read", "triage", None).await;
    let write = b.token("acme.write", "open_pr", None).await;
    let tagged = b.token("acme.tagged", "triage", Some(&hello)).await;
    let mut shown = false;
    for _ in 0..ATTEMPTS {
        wait_for_the_limit().await;
        // The service's one slot, held (read's budget pays for it).
        let hanging = b.hang(&read, None).await;
        let t0 = Instant::now();
        // The tagged tool's one call of this second, spent by a derive
        // (derives and calls share the budget).
        b.token("acme.tagged", "triage", Some(&hello)).await;
        let m = b.mark();
        let a = b
            .call(&tagged, "GET", "/repos/octo/hello/issues", None, None)
            .await;
        let both_failed = t0.elapsed() < WINDOW;
        if a.status == 200 {
            panic!("served while the service's one slot was held: {a:?}");
        }
        if a.reason() == "service_busy" && !both_failed {
            // The limit had room again: this says nothing of the order.
            drop(hanging.await);
            continue;
        }
        a.is(e, "rate_limited");
        b.nothing_spent(&m, Some("rate_limited"));
        // Only the slot: write's budget has room.
        let m = b.mark();
        b.call(
            &write,
            "POST",
            "/repos/o/r/pulls",
            Some(b"{}".to_vec()),
            None,
        )
        .await
        .is(l, "service_busy");
        b.nothing_spent(&m, Some("service_busy"));
        let timed_out = Answer::of(hanging.await.unwrap()).await;
        assert_eq!(timed_out.reason(), "upstream_timeout", "{timed_out:?}");
        if both_failed {
            shown = true;
            break;
        }
    }
    assert!(shown, "{ATTEMPTS} attempts, none within one second");
    wait_for_the_limit().await;
    b.call(&tagged, "GET", "/repos/octo/hello/issues", None, None)
        .await
        .served(200);
}
