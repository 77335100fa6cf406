//! The order of the derive's checks, pinned before the pipeline is split
//! (issue 37 item 5). [`CHECKS`] lists them as the code runs them today:
//! the socket's request shell (`api::handle`), then `Broker::run` in
//! `exchange` (rate limits, the policy prelude, the subject, the nonce, the
//! person's and tool's limit, the policy, the details, the proof, the
//! service source, the approval; the audit last). For each two adjacent
//! checks, a derive that fails both gets the earlier refusal, and nothing
//! was spent for the later one: no token, no `derive.issued`, no connect
//! link or approval opened, the audit holding only the earlier refusal
//! (its `derive.denied` reason), and where it can be seen, the proof still
//! unused (the same proof is then issued a token) or the rate budget still
//! there. Each pair then shows its positive controls: the derive failing
//! only the later check gets the later refusal, and one failing neither is
//! issued.
//!
//! Four brokers: [`Env::Main`] (the proxy's policy with approvals and a
//! tool with details, alice connected), [`Env::Limits`] (two derives a
//! second over the broker, one per peer, no burst), [`Env::Nonces`]
//! (nonces required, one derive a second per person and tool, no burst)
//! and [`Env::AuditDisk`] (the audit log on a small tmpfs it fills).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::proxy::approvals::{approval_policy, repository};
use crate::proxy::{ProxyEnv, PROXY};
use crate::support::services::ProviderOpts;
use crate::support::*;
use credbroker::internals::dpop::make_proof;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Env {
    Main,
    Limits,
    Nonces,
    AuditDisk,
}

/// A check of the derive: its name and the answer it refuses with (status
/// and OAuth `error`).
type Check = (&'static str, u16, &'static str);

/// Every check, in the order a derive meets it.
const CHECKS: &[Check] = &[
    ("origin", 403, "access_denied"),
    ("method", 405, "invalid_request"),
    ("content_type", 415, "invalid_request"),
    ("body_size", 413, "invalid_request"),
    ("dpop_header", 400, "invalid_dpop_proof"),
    ("body", 400, "invalid_request"),
    ("global_rate", 429, "rate_limited"),
    ("peer_rate", 429, "rate_limited"),
    ("freeze", 403, "access_denied"),
    ("scope_syntax", 400, "invalid_request"),
    ("resource", 400, "invalid_target"),
    ("subject", 400, "invalid_request"),
    ("nonce", 400, "use_dpop_nonce"),
    ("person_tool_rate", 429, "rate_limited"),
    ("policy", 403, "access_denied"),
    ("details", 400, "invalid_authorization_details"),
    ("proof", 400, "invalid_dpop_proof"),
    ("service", 400, "invalid_grant"),
    ("approval", 400, "invalid_grant"),
    ("audit", 500, "server_error"),
];

/// Where each adjacent pair of [`CHECKS`] is shown.
fn env_of(earlier: &str, later: &str) -> Env {
    match (earlier, later) {
        ("global_rate", _) | ("body", "global_rate") | ("peer_rate", _) => Env::Limits,
        ("subject", "nonce") | ("nonce", _) | ("person_tool_rate", _) => Env::Nonces,
        ("approval", "audit") => Env::AuditDisk,
        _ => Env::Main,
    }
}

#[test]
fn every_adjacent_pair_of_the_derive_checks_has_its_broker() {
    let names: Vec<&str> = CHECKS.iter().map(|c| c.0).collect();
    let mut seen = std::collections::BTreeSet::new();
    assert!(
        names.iter().all(|n| seen.insert(*n)),
        "a check listed twice"
    );
    let shown: usize = [Env::Main, Env::Limits, Env::Nonces, Env::AuditDisk]
        .into_iter()
        .map(|env| {
            let n = pairs_on(env).len();
            assert!(n > 0, "{env:?} shows no pair");
            n
        })
        .sum();
    assert_eq!(shown, CHECKS.len() - 1, "every adjacent pair is shown once");
}

/// The pairs `env` shows.
fn pairs_on(env: Env) -> Vec<(Check, Check)> {
    CHECKS
        .windows(2)
        .filter(|w| env_of(w[0].0, w[1].0) == env)
        .map(|w| (w[0], w[1]))
        .collect()
}

/// The refusal of `check`: its status and error, and no token.
#[track_caller]
fn refused_by(a: &HttpAnswer, check: &Check) {
    a.assert_refused(check.1, check.2, check.0);
}

/// What was audited so far.
struct Mark(usize);

/// A view of a running broker, the tool's key and the broker's audit log.
struct Broker<'a> {
    b: &'a TestBroker,
    key: &'a credbroker::internals::jose::Es256Key,
    audit: PathBuf,
}

impl<'a> Broker<'a> {
    fn new(b: &'a TestBroker, key: &'a credbroker::internals::jose::Es256Key) -> Broker<'a> {
        Broker {
            b,
            key,
            audit: b.path("data/audit.jsonl"),
        }
    }

    fn mark(&self) -> Mark {
        Mark(read_audit(&self.audit).len())
    }

    /// Since `m`: no token issued, no link or approval opened (unless
    /// listed in `opened`), and the refusals audited are exactly `denied`.
    #[track_caller]
    fn audited(&self, m: &Mark, denied: &[&str], opened: &[&str]) {
        let events = read_audit(&self.audit);
        let new = &events[m.0.min(events.len())..];
        let kinds = |k: &str| new.iter().filter(|e| e["event"] == k).count();
        assert_eq!(kinds("derive.issued"), 0, "a token was issued: {new:?}");
        let reasons: Vec<&str> = new
            .iter()
            .filter(|e| e["event"] == "derive.denied")
            .filter_map(|e| e["reason"].as_str())
            .collect();
        assert_eq!(reasons, denied, "{new:?}");
        for kind in ["connect.link_issued", "approval.requested"] {
            let want = usize::from(opened.contains(&kind));
            assert_eq!(kinds(kind), want, "{kind}: {new:?}");
        }
    }

    fn proof(&self) -> String {
        self.b.proof(self.key)
    }

    fn proof_with_nonce(&self, nonce: &str) -> String {
        make_proof(self.key, "POST", &self.b.htu(), now(), None, Some(nonce)).unwrap()
    }

    /// A proof for another URL.
    fn proof_elsewhere(&self) -> String {
        make_proof(
            self.key,
            "POST",
            "http://127.0.0.1:0/elsewhere",
            now(),
            None,
            None,
        )
        .unwrap()
    }

    /// A derive with `body` and `proof`.
    fn derive(&self, body: &Value, proof: Option<&str>) -> HttpAnswer {
        self.b.post_derive(body, proof)
    }

    /// The known-good body (alice, notes.read) with `changes` (a `null`
    /// removes a member).
    fn body(&self, changes: Value) -> Value {
        let mut body = self.b.good_body(&self.b.subject_token("alice"));
        patch(&mut body, &changes);
        body
    }

    /// A body for `sub` and a tool of the proxy address.
    fn proxy_body(&self, sub: &str, tool: &str, details: Option<Value>) -> Value {
        let mut body = json!({
            "subject_token": self.b.subject_token(sub),
            "step": "triage",
            "tool": tool,
            "resource": PROXY,
        });
        if let Some(d) = details {
            body["authorization_details"] = d;
        }
        body
    }

    fn freeze(&self, on: bool) {
        let (status, text) = self
            .b
            .admin_post("/freeze", if on { "on" } else { "off" })
            .unwrap();
        assert_eq!(status, 200, "{text}");
    }

    fn rate_limited(&self, limit: &str) -> f64 {
        self.b
            .metric(&format!(
                "credbroker_rate_limited_total{{limit=\"{limit}\"}}"
            ))
            .unwrap_or(0.0)
    }
}

/// A raw request on the socket.
fn request(method: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} /v1/derive HTTP/1.1\r\nhost: x\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const JSON: &str = "content-type: application/json\r\n";

// --- Env::Main ---------------------------------------------------------

/// A tool for the proxy address whose calls are described by a
/// `repository` entry, without approval.
fn tagged_tool() -> String {
    format!(
        r#"
[tools."acme.tagged"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage"]
require_authorization_details = true
routes = ["GET /repos/{{owner}}/{{repo}}/issues"]

[tools."acme.tagged".authorization_details.repository]
owner = {{ kind = "string", required = true, label = "Owner" }}
name = {{ kind = "string", required = true, label = "Repository" }}
"#
    )
}

#[tokio::test]
async fn derive_check_order_of_the_request_policy_proof_service_and_approval() {
    let mut p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(approval_policy(r#""DELETE /repos/{owner}/{repo}""#) + &tagged_tool()),
            ..ProviderOpts::default()
        },
    )
    .await;
    let key = key();
    let pairs = pairs_on(Env::Main);
    assert!(!pairs.is_empty());
    for (e, l) in &pairs {
        eprintln!("pair: {} before {}", e.0, l.0);
        let b = Broker::new(&p.env.broker, &key);
        match (e.0, l.0) {
            ("origin", "method") => origin_before_method(&b, e, l),
            ("method", "content_type") => method_before_content_type(&b, e, l),
            ("content_type", "body_size") => content_type_before_size(&b, e, l),
            ("body_size", "dpop_header") => size_before_dpop_header(&b, e, l),
            ("dpop_header", "body") => dpop_header_before_body(&b, e, l),
            ("freeze", "scope_syntax") => freeze_before_scope(&b, e, l),
            ("scope_syntax", "resource") => scope_before_resource(&b, e, l),
            ("resource", "subject") => resource_before_subject(&b, e, l),
            ("policy", "details") => policy_before_details(&b, e, l),
            ("details", "proof") => details_before_proof(&b, e, l),
            ("proof", "service") => proof_before_service(&b, e, l),
            ("service", "approval") => service_before_approval(&mut p, &key, e, l).await,
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

fn origin_before_method(b: &Broker<'_>, e: &Check, l: &Check) {
    let m = b.mark();
    let origin = "origin: https://evil.example\r\n";
    refused_by(&b.b.http(&request("GET", origin, "")), e);
    b.audited(&m, &[], &[]);
    let a = b.b.http(&request("GET", "", ""));
    refused_by(&a, l);
    assert_eq!(a.header("allow"), Some("POST"), "{}", a.raw);
    b.audited(&m, &[], &[]);
    let proof = b.proof();
    b.derive(&b.body(json!({})), Some(&proof))
        .assert_issued("neither");
}

fn method_before_content_type(b: &Broker<'_>, e: &Check, l: &Check) {
    let m = b.mark();
    let text = "content-type: text/plain\r\n";
    refused_by(&b.b.http(&request("GET", text, "x")), e);
    b.audited(&m, &[], &[]);
    refused_by(&b.b.http(&request("POST", text, "x")), l);
    b.audited(&m, &[], &[]);
    let proof = b.proof();
    b.derive(&b.body(json!({})), Some(&proof))
        .assert_issued("neither");
}

/// A JSON body over the socket's 64 KiB cap.
fn too_large() -> String {
    format!("{{\"pad\":\"{}\"}}", "p".repeat(70 * 1024))
}

fn content_type_before_size(b: &Broker<'_>, e: &Check, l: &Check) {
    let m = b.mark();
    let big = too_large();
    refused_by(
        &b.b.http(&request("POST", "content-type: text/plain\r\n", &big)),
        e,
    );
    b.audited(&m, &[], &[]);
    refused_by(&b.b.http(&request("POST", JSON, &big)), l);
    b.audited(&m, &[], &[]);
    let proof = b.proof();
    b.derive(&b.body(json!({})), Some(&proof))
        .assert_issued("neither");
}

fn size_before_dpop_header(b: &Broker<'_>, e: &Check, l: &Check) {
    let (p1, p2) = (b.proof(), b.proof());
    let two = format!("{JSON}dpop: {p1}\r\ndpop: {p2}\r\n");
    let m = b.mark();
    refused_by(&b.b.http(&request("POST", &two, &too_large())), e);
    b.audited(&m, &[], &[]);
    let good = b.body(json!({})).to_string();
    refused_by(&b.b.http(&request("POST", &two, &good)), l);
    b.audited(&m, &[], &[]);
    // Neither proof was used up.
    b.derive(&b.body(json!({})), Some(&p1))
        .assert_issued("neither");
}

fn dpop_header_before_body(b: &Broker<'_>, e: &Check, l: &Check) {
    let (p1, p2) = (b.proof(), b.proof());
    let m = b.mark();
    let two = format!("{JSON}dpop: {p1}\r\ndpop: {p2}\r\n");
    refused_by(&b.b.http(&request("POST", &two, "{not json")), e);
    b.audited(&m, &[], &[]);
    let one = format!("{JSON}dpop: {p1}\r\n");
    refused_by(&b.b.http(&request("POST", &one, "{not json")), l);
    b.audited(&m, &[], &[]);
    b.derive(&b.body(json!({})), Some(&p1))
        .assert_issued("neither, with the same proof");
}

/// A scope that is not space-separated scope tokens.
const BAD_SCOPE: &str = "notes.read  x";
/// A resource that is no absolute URL.
const BAD_RESOURCE: &str = "not a url";

fn freeze_before_scope(b: &Broker<'_>, e: &Check, l: &Check) {
    let proof = b.proof();
    let bad = b.body(json!({ "scope": BAD_SCOPE }));
    b.freeze(true);
    let m = b.mark();
    let a = b.derive(&bad, Some(&proof));
    refused_by(&a, e);
    assert_eq!(a.json()["reason"], "frozen", "{}", a.raw);
    b.audited(&m, &["frozen"], &[]);
    b.freeze(false);
    let m = b.mark();
    refused_by(&b.derive(&bad, Some(&proof)), l);
    b.audited(&m, &["invalid_request"], &[]);
    b.derive(&b.body(json!({})), Some(&proof))
        .assert_issued("neither, with the same proof");
}

fn scope_before_resource(b: &Broker<'_>, e: &Check, l: &Check) {
    let proof = b.proof();
    let m = b.mark();
    let both = b.body(json!({ "scope": BAD_SCOPE, "resource": BAD_RESOURCE }));
    refused_by(&b.derive(&both, Some(&proof)), e);
    b.audited(&m, &["invalid_request"], &[]);
    let m = b.mark();
    let later = b.body(json!({ "resource": BAD_RESOURCE }));
    refused_by(&b.derive(&later, Some(&proof)), l);
    b.audited(&m, &["invalid_target"], &[]);
    b.derive(&b.body(json!({})), Some(&proof))
        .assert_issued("neither, with the same proof");
}

fn resource_before_subject(b: &Broker<'_>, e: &Check, l: &Check) {
    let proof = b.proof();
    let m = b.mark();
    let both = b.body(json!({ "resource": BAD_RESOURCE, "subject_token": "x.y.z" }));
    refused_by(&b.derive(&both, Some(&proof)), e);
    b.audited(&m, &["invalid_target"], &[]);
    let m = b.mark();
    let later = b.body(json!({ "subject_token": "x.y.z" }));
    refused_by(&b.derive(&later, Some(&proof)), l);
    b.audited(&m, &["invalid_subject_token"], &[]);
    b.derive(&b.body(json!({})), Some(&proof))
        .assert_issued("neither, with the same proof");
}

/// Details the tagged tool does not declare.
fn undeclared_details() -> Value {
    json!([{"type": "unknown", "x": "y"}])
}

fn policy_before_details(b: &Broker<'_>, e: &Check, l: &Check) {
    let proof = b.proof();
    let m = b.mark();
    let mut both = b.proxy_body("alice", "acme.tagged", Some(undeclared_details()));
    // A step the tagged tool is not allowed in.
    both["step"] = "summarize".into();
    let a = b.derive(&both, Some(&proof));
    refused_by(&a, e);
    assert_eq!(a.json()["reason"], "step_not_allowed", "{}", a.raw);
    b.audited(&m, &["step_not_allowed"], &[]);
    let m = b.mark();
    let later = b.proxy_body("alice", "acme.tagged", Some(undeclared_details()));
    refused_by(&b.derive(&later, Some(&proof)), l);
    b.audited(&m, &["invalid_authorization_details"], &[]);
    let good = b.proxy_body("alice", "acme.tagged", Some(repository("octo", "hello")));
    b.derive(&good, Some(&proof))
        .assert_issued("neither, with the same proof");
}

fn details_before_proof(b: &Broker<'_>, e: &Check, l: &Check) {
    let bad = b.proxy_body("alice", "acme.tagged", Some(undeclared_details()));
    let good = b.proxy_body("alice", "acme.tagged", Some(repository("octo", "hello")));
    let m = b.mark();
    refused_by(&b.derive(&bad, Some(&b.proof_elsewhere())), e);
    refused_by(&b.derive(&bad, None), e);
    let proof = b.proof();
    refused_by(&b.derive(&bad, Some(&proof)), e);
    b.audited(&m, &["invalid_authorization_details"; 3], &[]);
    let m = b.mark();
    refused_by(&b.derive(&good, Some(&b.proof_elsewhere())), l);
    b.audited(&m, &["invalid_dpop_proof"], &[]);
    b.derive(&good, Some(&proof))
        .assert_issued("neither, with the proof a refused derive carried");
}

fn proof_before_service(b: &Broker<'_>, e: &Check, l: &Check) {
    // bob has no account at the service.
    let bob = b.proxy_body("bob", "acme.read", None);
    let m = b.mark();
    refused_by(&b.derive(&bob, Some(&b.proof_elsewhere())), e);
    b.audited(&m, &["invalid_dpop_proof"], &[]);
    let m = b.mark();
    let a = b.derive(&bob, Some(&b.proof()));
    refused_by(&a, l);
    assert_eq!(a.json()["reason"], "connect_required", "{}", a.raw);
    b.audited(&m, &["connect_required"], &["connect.link_issued"]);
    b.derive(&b.proxy_body("alice", "acme.read", None), Some(&b.proof()))
        .assert_issued("neither");
}

async fn service_before_approval(
    p: &mut ProxyEnv,
    key: &credbroker::internals::jose::Es256Key,
    e: &Check,
    l: &Check,
) {
    let details = repository("octo", "hello");
    let uri = {
        let b = Broker::new(&p.env.broker, key);
        let bob = b.proxy_body("bob", "acme.delete", Some(details.clone()));
        let m = b.mark();
        let a = b.derive(&bob, Some(&b.proof()));
        refused_by(&a, e);
        assert_eq!(a.json()["reason"], "connect_required", "{}", a.raw);
        // bob's connect link (opened by the pair before, or now), and no
        // approval.
        let events = b.b.audit_lines();
        let new = &events[m.0..];
        let kinds = |k: &str| new.iter().filter(|x| x["event"] == k).count();
        assert!(kinds("connect.link_issued") <= 1, "{new:?}");
        assert_eq!(kinds("approval.requested"), 0, "{new:?}");
        assert_eq!(kinds("derive.issued"), 0, "{new:?}");
        let m = b.mark();
        let alice = b.proxy_body("alice", "acme.delete", Some(details.clone()));
        let a = b.derive(&alice, Some(&b.proof()));
        refused_by(&a, l);
        assert_eq!(a.json()["reason"], "approval_required", "{}", a.raw);
        b.audited(&m, &["approval_required"], &["approval.requested"]);
        a.json()["connect_uri"].as_str().unwrap().to_string()
    };
    p.env.play_pages(&uri, "alice", "").await;
    let b = Broker::new(&p.env.broker, key);
    let alice = b.proxy_body("alice", "acme.delete", Some(details));
    b.derive(&alice, Some(&b.proof()))
        .assert_issued("neither: approved");
}

// --- Env::Limits -------------------------------------------------------

/// Two derives a second over the broker (a burst of two), one per peer
/// (no burst).
const LIMITS: &str = "[limits]\nglobal_per_second = 2\nper_peer_per_second = 1\nburst = 1\n";
const ATTEMPTS: usize = 6;

async fn idle() {
    tokio::time::sleep(Duration::from_millis(1200)).await;
}

#[tokio::test]
async fn derive_check_order_of_the_broker_and_peer_rate_limits() {
    let tb = TestBroker::start_with(Opts {
        extra_config: LIMITS.into(),
        ..Opts::default()
    });
    let key = key();
    let b = Broker::new(&tb, &key);
    let pairs = pairs_on(Env::Limits);
    assert!(!pairs.is_empty());
    for (e, l) in &pairs {
        eprintln!("pair: {} before {}", e.0, l.0);
        match (e.0, l.0) {
            ("body", "global_rate") => body_before_global(&b, e, l).await,
            ("global_rate", "peer_rate") => global_before_peer(&b, e, l).await,
            ("peer_rate", "freeze") => peer_before_freeze(&b, e, l).await,
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

/// After [`idle`]: one derive takes the peer's one and the broker's first
/// of two; a second takes the broker's second and is refused by the peer
/// limit. Until `t0 + 0.5 s` the broker has no room (its next derive is
/// due half a second after the first), until `t0 + 1 s` the peer none.
/// Returns `t0`, or `None` when the first derive found no room.
fn use_up_both(b: &Broker<'_>, l_peer: Option<&Check>) -> Option<Instant> {
    let t0 = Instant::now();
    let first = b.derive(&b.body(json!({})), Some(&b.proof()));
    if first.status != 200 {
        return None;
    }
    let peer = b.rate_limited("peer");
    let second = b.derive(&b.body(json!({})), Some(&b.proof()));
    if let Some(l) = l_peer {
        // Only the peer's limit fails: its own refusal.
        refused_by(&second, l);
    }
    assert_eq!(second.status, 429, "{}", second.raw);
    assert_eq!(
        b.rate_limited("peer"),
        peer + 1.0,
        "the peer limit refused it"
    );
    Some(t0)
}

async fn body_before_global(b: &Broker<'_>, e: &Check, l: &Check) {
    for _ in 0..ATTEMPTS {
        idle().await;
        let Some(t0) = use_up_both(b, None) else {
            continue;
        };
        let m = b.mark();
        let proof = b.proof();
        let one = format!("{JSON}dpop: {proof}\r\n");
        refused_by(&b.b.http(&request("POST", &one, "{not json")), e);
        let in_time = t0.elapsed() < Duration::from_millis(500);
        b.audited(&m, &[], &[]);
        let global = b.rate_limited("global");
        let a = b.derive(&b.body(json!({})), Some(&proof));
        if a.status == 200 || !in_time {
            continue;
        }
        refused_by(&a, l);
        assert_eq!(b.rate_limited("global"), global + 1.0, "the broker's limit");
        idle().await;
        b.derive(&b.body(json!({})), Some(&proof))
            .assert_issued("neither, with the same proof");
        return;
    }
    panic!("{ATTEMPTS} attempts, none within half a second");
}

async fn global_before_peer(b: &Broker<'_>, e: &Check, l: &Check) {
    for _ in 0..ATTEMPTS {
        idle().await;
        let Some(t0) = use_up_both(b, Some(l)) else {
            continue;
        };
        let (global, peer) = (b.rate_limited("global"), b.rate_limited("peer"));
        let m = b.mark();
        let proof = b.proof();
        let a = b.derive(&b.body(json!({})), Some(&proof));
        let in_time = t0.elapsed() < Duration::from_millis(500);
        if !in_time {
            continue;
        }
        refused_by(&a, e);
        assert_eq!(
            (b.rate_limited("global"), b.rate_limited("peer")),
            (global + 1.0, peer),
            "the broker's limit refused it, not the peer's"
        );
        b.audited(&m, &["rate_limited"], &[]);
        idle().await;
        b.derive(&b.body(json!({})), Some(&proof))
            .assert_issued("neither, with the same proof");
        return;
    }
    panic!("{ATTEMPTS} attempts, none within half a second");
}

async fn peer_before_freeze(b: &Broker<'_>, e: &Check, l: &Check) {
    b.freeze(true);
    let mut shown = false;
    for _ in 0..ATTEMPTS {
        idle().await;
        let t0 = Instant::now();
        // The peer's one derive of this second (refused by the freeze).
        let first = b.derive(&b.body(json!({})), Some(&b.proof()));
        if first.status == 429 {
            continue;
        }
        let peer = b.rate_limited("peer");
        let m = b.mark();
        let a = b.derive(&b.body(json!({})), Some(&b.proof()));
        if t0.elapsed() >= Duration::from_secs(1) {
            continue;
        }
        refused_by(&a, e);
        assert_eq!(b.rate_limited("peer"), peer + 1.0, "the peer's limit");
        b.audited(&m, &["rate_limited"], &[]);
        shown = true;
        break;
    }
    assert!(shown, "{ATTEMPTS} attempts, none within one second");
    idle().await;
    let m = b.mark();
    let a = b.derive(&b.body(json!({})), Some(&b.proof()));
    refused_by(&a, l);
    assert_eq!(a.json()["reason"], "frozen", "{}", a.raw);
    b.audited(&m, &["frozen"], &[]);
    b.freeze(false);
    idle().await;
    b.derive(&b.body(json!({})), Some(&b.proof()))
        .assert_issued("neither");
}

// --- Env::Nonces -------------------------------------------------------

/// Nonces required; one derive a second per person and tool, no burst.
const NONCES: &str =
    "[dpop]\nrequire_nonce = true\n\n[limits]\nper_person_tool_per_second = 1\nburst = 1\n";

#[tokio::test]
async fn derive_check_order_of_the_subject_nonce_and_person_rate_limit() {
    let tb = TestBroker::start_with(Opts {
        extra_config: NONCES.into(),
        ..Opts::default()
    });
    let key = key();
    let b = Broker::new(&tb, &key);
    let pairs = pairs_on(Env::Nonces);
    assert!(!pairs.is_empty());
    for (e, l) in &pairs {
        eprintln!("pair: {} before {}", e.0, l.0);
        match (e.0, l.0) {
            ("subject", "nonce") => subject_before_nonce(&b, e, l).await,
            ("nonce", "person_tool_rate") => nonce_before_person_rate(&b, e, l).await,
            ("person_tool_rate", "policy") => person_rate_before_policy(&b, e, l).await,
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

/// A nonce of the broker, from the challenge to a proof without one.
fn nonce(b: &Broker) -> String {
    let a = b.derive(&b.body(json!({ "tool": "nope" })), Some(&b.proof()));
    assert_eq!(a.error(), "use_dpop_nonce", "{}", a.raw);
    a.header("dpop-nonce").unwrap().to_string()
}

async fn subject_before_nonce(b: &Broker<'_>, e: &Check, l: &Check) {
    idle().await;
    let m = b.mark();
    let both = b.body(json!({ "subject_token": "x.y.z" }));
    refused_by(&b.derive(&both, Some(&b.proof())), e);
    b.audited(&m, &["invalid_subject_token"], &[]);
    let m = b.mark();
    let a = b.derive(&b.body(json!({})), Some(&b.proof()));
    refused_by(&a, l);
    let n = a
        .header("dpop-nonce")
        .expect("a nonce to retry with")
        .to_string();
    b.audited(&m, &["use_dpop_nonce"], &[]);
    b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)))
        .assert_issued("neither");
}

async fn nonce_before_person_rate(b: &Broker<'_>, e: &Check, l: &Check) {
    let n = nonce(b);
    // Nothing spent: a derive refused for its nonce leaves the person's
    // and tool's one derive of this second.
    idle().await;
    refused_by(&b.derive(&b.body(json!({})), Some(&b.proof())), e);
    b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)))
        .assert_issued("after a refused nonce, the second's one derive");
    for _ in 0..ATTEMPTS {
        idle().await;
        let t0 = Instant::now();
        let first = b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)));
        if first.status != 200 {
            continue;
        }
        let m = b.mark();
        let a = b.derive(&b.body(json!({})), Some(&b.proof()));
        let in_time = t0.elapsed() < Duration::from_secs(1);
        refused_by(&a, e);
        b.audited(&m, &["use_dpop_nonce"], &[]);
        let limited = b.rate_limited("person_tool");
        let a = b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)));
        if a.status == 200 || !in_time {
            continue;
        }
        refused_by(&a, l);
        assert_eq!(b.rate_limited("person_tool"), limited + 1.0);
        idle().await;
        b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)))
            .assert_issued("neither");
        return;
    }
    panic!("{ATTEMPTS} attempts, none within one second");
}

async fn person_rate_before_policy(b: &Broker<'_>, e: &Check, l: &Check) {
    let n = nonce(b);
    // notes.read is not allowed in this step.
    let wrong_step = || b.body(json!({ "step": "cleanup_confirmed" }));
    let mut shown = false;
    for _ in 0..ATTEMPTS {
        idle().await;
        let t0 = Instant::now();
        let first = b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)));
        if first.status != 200 {
            continue;
        }
        let m = b.mark();
        let proof = b.proof_with_nonce(&n);
        let a = b.derive(&wrong_step(), Some(&proof));
        if t0.elapsed() >= Duration::from_secs(1) {
            continue;
        }
        refused_by(&a, e);
        b.audited(&m, &["rate_limited"], &[]);
        shown = true;
        break;
    }
    assert!(shown, "{ATTEMPTS} attempts, none within one second");
    idle().await;
    let m = b.mark();
    let a = b.derive(&wrong_step(), Some(&b.proof_with_nonce(&n)));
    refused_by(&a, l);
    assert_eq!(a.json()["reason"], "step_not_allowed", "{}", a.raw);
    b.audited(&m, &["step_not_allowed"], &[]);
    idle().await;
    b.derive(&b.body(json!({})), Some(&b.proof_with_nonce(&n)))
        .assert_issued("neither");
}

// --- Env::AuditDisk ----------------------------------------------------

#[tokio::test]
async fn derive_check_order_of_the_approval_and_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&dir.path().join("auditfs"), "2m") else {
        not_shown(
            "the derive's approval before its audit",
            "cannot mount a tmpfs here (needs root)",
        );
        return;
    };
    let log = fs.0.join("audit.jsonl");
    let mut p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(approval_policy(r#""DELETE /repos/{owner}/{repo}""#)),
            audit_log: Some(log.clone()),
            ..ProviderOpts::default()
        },
    )
    .await;
    let key = key();
    let pairs = pairs_on(Env::AuditDisk);
    assert!(!pairs.is_empty());
    for (e, l) in &pairs {
        eprintln!("pair: {} before {}", e.0, l.0);
        match (e.0, l.0) {
            ("approval", "audit") => approval_before_audit(&mut p, &key, &fs, &log, e, l).await,
            (x, y) => panic!("no scenario for {x} before {y}"),
        }
    }
}

/// A derive whose approval is still pending, while the audit log cannot
/// be written: the approval's refusal (an approval already asked for is
/// answered without writing), the same approval, no token. A derive that
/// needs no approval gets the audit's refusal (no event, no token).
async fn approval_before_audit(
    p: &mut ProxyEnv,
    key: &credbroker::internals::jose::Es256Key,
    fs: &Tmpfs,
    log: &Path,
    e: &Check,
    l: &Check,
) {
    let details = repository("octo", "hello");
    let uri = {
        let mut b = Broker::new(&p.env.broker, key);
        b.audit = log.to_path_buf();
        let alice = b.proxy_body("alice", "acme.delete", Some(details.clone()));
        let m = b.mark();
        let asked = b.derive(&alice, Some(&b.proof()));
        refused_by(&asked, e);
        assert_eq!(asked.json()["reason"], "approval_required", "{}", asked.raw);
        b.audited(&m, &["approval_required"], &["approval.requested"]);

        fs.fill_after(log);
        let m = b.mark();
        let a = b.derive(&alice, Some(&b.proof()));
        refused_by(&a, e);
        assert_eq!(a.json()["reason"], "approval_required", "{}", a.raw);
        assert_eq!(
            a.json()["connect_id"],
            asked.json()["connect_id"],
            "the same approval, no new one"
        );
        b.audited(&m, &[], &[]);
        let a = b.derive(&b.body(json!({})), Some(&b.proof()));
        refused_by(&a, l);
        b.audited(&m, &[], &[]);
        fs.unfill();
        asked.json()["connect_uri"].as_str().unwrap().to_string()
    };
    p.env.play_pages(&uri, "alice", "").await;
    let b = Broker::new(&p.env.broker, key);
    let alice = b.proxy_body("alice", "acme.delete", Some(details));
    b.derive(&alice, Some(&b.proof()))
        .assert_issued("neither: approved, with room in the log");
}
