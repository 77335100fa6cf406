//! The example MCP server's own bytes on the wire, read by a raw JSON-RPC
//! client (`RawMcp`: no SDK to normalise them), against the files in
//! proto/mcp/ in both protocol versions; the versions it serves, its log
//! (no link code at any level) and its `--state-ttl` bound.
//!
//! The scripted broker refuses with exactly
//! proto/mcp/refusal-connect-required.json, the service is `github` and the
//! call `list_repositories {"limit": 10}`, as in the files, so every answer
//! must be the file's, byte for byte once parsed. Only the `requestState`
//! differs (it is bound to this server's URL, the test person and the time)
//! and is checked by opening it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::{Path, PathBuf};
use std::sync::Arc;

use credbroker::client::mcp::{call_hash, Binding, StateKey};
use credbroker::internals::secret::SecretBytes;
use serde_json::{json, Value};

use crate::support::mcp::*;
use crate::support::*;

const AGENT: &str = "repo-helper";
const V2025: &str = "2025-11-25";
/// The version before it, which many deployed clients still speak.
const V2025_06: &str = "2025-06-18";
const V2026: &str = "2026-07-28";

fn load(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("proto/mcp")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

struct Wire {
    b: TestBroker,
    _stub: StubBroker,
    _api: RepoApi,
    server: McpServer,
    /// Its existence means "alice completed the connect page".
    connected: PathBuf,
    refusal: Value,
}

/// The example on a scripted broker that refuses alice with the proto
/// refusal until `connected` exists, with the all-0x42 state key of the
/// proto files.
async fn wire_setup(log_level: &str) -> Wire {
    let b = TestBroker::start();
    let stub = StubBroker::start(b.dir.path()).await;
    let api = RepoApi::start(
        "/user/repos",
        Arc::new(|req, _| {
            match req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
            {
                Some("DPoP gho_alice") => Ok("alice".into()),
                _ => Err("bad token".into()),
            }
        }),
    )
    .await;
    let refusal = load("refusal-connect-required.json");
    let connected = b.path("alice-connected");
    let s = |k: &str| refusal[k].as_str().unwrap().to_owned();
    stub.set(
        "alice",
        StubAnswer {
            link: Some((s("connect_uri"), s("connect_id"), s("connect_message"))),
            connected_when: Some(connected.clone()),
            token: Some("gho_alice".into()),
            ..Default::default()
        },
    );
    let key_file = b.path("state.key");
    credbroker::internals::config::write_secret_file(&key_file, &[0x42; 32]).unwrap();
    let jwks = b.path("dev-issuer-jwks.json");
    let server = McpServer::start_with(
        &McpServerOpts {
            socket: &stub.socket,
            broker_issuer: &b.issuer,
            trusted_issuer: &b.issuer,
            jwks: Jwks::File(&jwks),
            audience: AGENT,
            step: "list_repos",
            tool: "repos.list",
            resource: "https://api.repos.example/",
            api_url: &api.url,
            service: "github",
            scope: Some("repo"),
            state_ttl: None,
        },
        b.dir.path(),
        &["--state-key-file", key_file.to_str().unwrap()],
        log_level,
    );
    Wire {
        b,
        _stub: stub,
        _api: api,
        server,
        connected,
        refusal,
    }
}

/// `tools/call list_repositories {"limit": 10}` with `id`.
fn call(id: i64, meta: Option<Value>) -> Value {
    let mut params = json!({"name": "list_repositories", "arguments": {"limit": 10}});
    if let Some(m) = meta {
        params["_meta"] = m;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

const CALL_HEADERS_2026: &[(&str, &str)] = &[
    ("mcp-protocol-version", V2026),
    ("mcp-method", "tools/call"),
    ("mcp-name", "list_repositories"),
];

/// The payload of a sealed state (readable, not secret).
fn state_payload(state: &str) -> Value {
    let body = state.split('.').next().unwrap();
    serde_json::from_slice(&credbroker::internals::jose::b64d(body, "state").unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn example_answers_on_the_wire_are_the_files_in_proto_mcp_in_both_versions() {
    let w = wire_setup("info").await;
    let alice = w.b.subject_token("alice");

    // 2025-11-25, URL elicitation declared: the -32042 error of the file.
    let mut legacy = RawMcp::new(&w.server.url, &alice);
    let init = legacy.initialize(V2025, true).await;
    assert_eq!(init["result"]["protocolVersion"], V2025, "{init}");
    let a = legacy
        .post(&[("mcp-protocol-version", V2025)], &call(2, None))
        .await;
    assert_eq!(
        a.reply(2),
        &load("2025-11-25-url-elicitation-required.json"),
        "2025-11-25 -32042"
    );

    // 2025-11-25, form only: the tool error of the file.
    let mut form = RawMcp::new(&w.server.url, &alice);
    form.initialize(V2025, false).await;
    let a = form
        .post(&[("mcp-protocol-version", V2025)], &call(2, None))
        .await;
    assert_eq!(a.reply(2), &load("form-only-client.json"), "2025 form only");

    // 2026-07-28: the input_required result of the file (no
    // `elicitationId`: that version removed it); only the state differs.
    let raw = RawMcp::new(&w.server.url, &alice);
    let a = raw
        .post(CALL_HEADERS_2026, &call(1, Some(meta_2026(V2026, true))))
        .await;
    let got = a.reply(1).clone();
    let state = got["result"]["requestState"].as_str().unwrap().to_owned();
    let mut expected = load("2026-07-28-input-required.json");
    let file_state = expected["result"]["requestState"]
        .as_str()
        .unwrap()
        .to_owned();
    expected["result"]["requestState"] = json!(state);
    assert_eq!(got, expected, "2026-07-28 input_required");
    assert!(
        !got.to_string().contains("elicitationId"),
        "2026-07-28 has no elicitationId: {got}"
    );
    // The state has the file's members, bound to this server, alice, this
    // call and the link, for ten minutes, and opens under the key.
    let (mine, theirs) = (state_payload(&state), state_payload(&file_state));
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&mine), keys(&theirs), "{mine} vs {theirs}");
    let call_h = call_hash(
        "tools/call",
        "list_repositories",
        Some(&json!({"limit": 10})),
    );
    assert_eq!(mine["aud"], w.server.url.as_str());
    assert_eq!(mine["sub"], "alice");
    assert_eq!(mine["call"], call_h.as_str());
    assert_eq!(mine["link"], w.refusal["connect_id"]);
    assert_eq!(
        mine["exp"].as_i64().unwrap() - mine["iat"].as_i64().unwrap(),
        600
    );
    let key = StateKey::new(&SecretBytes::new(vec![0x42; 32])).unwrap();
    let binding = Binding {
        aud: &w.server.url,
        iss: mine["iss"].as_str().unwrap(),
        sub: "alice",
        client: mine["client"].as_str(),
        call: &call_h,
    };
    key.open(&state, &binding, mine["iat"].as_i64().unwrap())
        .expect("the state opens under the server's key");

    // 2026-07-28 form only: the file's tool error, marked complete as that
    // version requires of every final result.
    let a = raw
        .post(CALL_HEADERS_2026, &call(2, Some(meta_2026(V2026, false))))
        .await;
    let mut got = a.reply(2).clone();
    assert_eq!(
        got["result"].as_object_mut().unwrap().remove("resultType"),
        Some(json!("complete")),
        "{got}"
    );
    assert_eq!(got, load("form-only-client.json"), "2026 form only");

    // The retry of the file with an altered state: the file's refusal.
    let mut retry = load("2026-07-28-retry.json");
    let mut tampered = state.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    retry["params"]["requestState"] = json!(String::from_utf8(tampered).unwrap());
    let a = raw.post(CALL_HEADERS_2026, &retry).await;
    assert_eq!(
        a.reply(2),
        &load("2026-07-28-request-state-rejected.json"),
        "tampered state"
    );

    // Positive control: alice connects, and the file's retry with the
    // genuine state returns her repositories.
    std::fs::write(&w.connected, "").unwrap();
    retry["params"]["requestState"] = json!(state);
    let a = raw.post(CALL_HEADERS_2026, &retry).await;
    let done = a.reply(2);
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["repositories"][0]["full_name"], "alice/notes",
        "{done}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn example_serves_exactly_the_protocol_versions_it_announces() {
    let w = wire_setup("info").await;
    let alice = w.b.subject_token("alice");
    let announced = w.server.hello["protocol_versions"].clone();
    assert_eq!(
        announced,
        json!([V2025_06, V2025, V2026]),
        "{}",
        w.server.hello
    );

    // server/discover lists the same versions.
    let raw = RawMcp::new(&w.server.url, &alice);
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": meta_2026(V2026, true)}});
    let a = raw
        .post(
            &[
                ("mcp-protocol-version", V2026),
                ("mcp-method", "server/discover"),
            ],
            &discover,
        )
        .await;
    assert_eq!(
        a.reply(1)["result"]["supportedVersions"],
        announced,
        "{a:?}"
    );

    // A request naming another version is refused with the list, the same
    // way whether the version is a known older one or an unknown one.
    for other in ["2025-03-26", "2024-11-05", "2027-01-01"] {
        let headers = [
            ("mcp-protocol-version", other),
            ("mcp-method", "tools/call"),
            ("mcp-name", "list_repositories"),
        ];
        let a = raw
            .post(&headers, &call(3, Some(meta_2026(other, true))))
            .await;
        assert_eq!(a.status, 400, "{other}: {a:?}");
        let e = &a.messages[0]["error"];
        assert_eq!(e["code"], -32022, "{other}: {a:?}");
        assert_eq!(e["data"]["requested"], other);
        assert_eq!(e["data"]["supported"], announced, "{other}: {a:?}");
    }
    // An initialize asking for another version is answered with 2025-11-25
    // (MCP's negotiation), never with the version asked for.
    for other in ["2025-03-26", "2024-11-05"] {
        let mut c = RawMcp::new(&w.server.url, &alice);
        let init = c.initialize(other, true).await;
        assert_eq!(init["result"]["protocolVersion"], V2025, "{other}: {init}");
    }

    // 2025-06-18, which has no URL elicitation: negotiated as asked, and
    // the link comes as the form-only tool error even from a client that
    // declares URL elicitation (that version's clients cannot follow one).
    let mut old = RawMcp::new(&w.server.url, &alice);
    let init = old.initialize(V2025_06, true).await;
    assert_eq!(init["result"]["protocolVersion"], V2025_06, "{init}");
    let a = old
        .post(&[("mcp-protocol-version", V2025_06)], &call(2, None))
        .await;
    assert_eq!(a.reply(2), &load("form-only-client.json"), "2025-06-18");

    // Positive controls: the other announced versions are served.
    let mut legacy = RawMcp::new(&w.server.url, &alice);
    let init = legacy.initialize(V2025, true).await;
    assert_eq!(init["result"]["protocolVersion"], V2025, "{init}");
    let a = legacy
        .post(&[("mcp-protocol-version", V2025)], &call(2, None))
        .await;
    assert_eq!(a.reply(2)["error"]["code"], -32042, "{a:?}");
    let a = raw
        .post(CALL_HEADERS_2026, &call(4, Some(meta_2026(V2026, true))))
        .await;
    assert_eq!(
        a.reply(4)["result"]["resultType"],
        "input_required",
        "{a:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn example_never_logs_a_link_code_at_any_level() {
    let w = wire_setup("trace").await;
    let alice = w.b.subject_token("alice");
    let uri = w.refusal["connect_uri"].as_str().unwrap();
    let code = uri.rsplit('/').next().unwrap();

    let mut legacy = RawMcp::new(&w.server.url, &alice);
    legacy.initialize(V2025, true).await;
    let a = legacy
        .post(&[("mcp-protocol-version", V2025)], &call(2, None))
        .await;
    // The client still gets the link (the log alone is blanked).
    assert!(a.reply(2).to_string().contains(code), "{a:?}");
    let raw = RawMcp::new(&w.server.url, &alice);
    let a = raw
        .post(CALL_HEADERS_2026, &call(1, Some(meta_2026(V2026, true))))
        .await;
    assert!(a.reply(1).to_string().contains(code), "{a:?}");

    let log = w.server.log_text();
    assert!(
        !log.contains(code),
        "a link code in the example's log:\n{log}"
    );
    // Positive control: rmcp did log both answers (its `-32042` at warn,
    // results at debug), with the link blanked.
    assert!(log.contains("response error"), "{log}");
    assert!(log.contains("/connect/[REDACTED]"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn state_ttl_outside_its_bounds_is_refused_at_start_up() {
    let b = TestBroker::start();
    let jwks = b.path("dev-issuer-jwks.json");
    let socket = b.path("no-broker.sock");
    let opts = |ttl| McpServerOpts {
        socket: &socket,
        broker_issuer: &b.issuer,
        trusted_issuer: &b.issuer,
        jwks: Jwks::File(&jwks),
        audience: AGENT,
        step: "list_repos",
        tool: "repos.list",
        resource: "https://api.repos.example/",
        api_url: "https://api.repos.example/user/repos",
        service: "github",
        scope: None,
        state_ttl: Some(ttl),
    };
    for ttl in [900, 601, 0] {
        let mut child = McpServer::command(&opts(ttl), &[])
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // It must exit on its own; one that serves is killed and fails.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.stdout.is_empty(),
            "--state-ttl {ttl} started: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(out.status.code(), Some(1), "--state-ttl {ttl}: {stderr}");
        assert!(
            stderr.contains(&format!("error: --state-ttl {ttl}:"))
                && stderr.contains("from 1 to 600 seconds"),
            "{stderr}"
        );
    }
    // Positive control: the bounds themselves start.
    for ttl in [600, 1] {
        let s = McpServer::start(&opts(ttl), b.dir.path());
        assert!(s.url.starts_with("http://127.0.0.1:"), "{}", s.hello);
    }
}
