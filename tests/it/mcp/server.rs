//! The example MCP server (examples/mcp_repo_server.rs) driven by the real
//! Python `mcp` client (2.3.x) in both protocol versions: 2025-11-25
//! (`mode="legacy"`, initialize) and 2026-07-28 (`mode="auto"`,
//! server/discover).
//!
//! - With the real broker and a `self` resource: the person's repositories
//!   come back, the person is whoever the access token says, and the tokens
//!   stay where they belong.
//! - With a scripted broker socket that refuses with a connect link: the
//!   link is relayed as `-32042` (2025-11-25) or `input_required` with a
//!   sealed `requestState` (2026-07-28), the retries work, and tampered or
//!   replayed states are refused. The cited ones of these run on the real
//!   broker too (`real_broker.rs`); the end-to-end flows with the real
//!   vault, pages and a browser are in `e2e.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::PathBuf;
use std::sync::Arc;

use crate::support::mcp::*;
use crate::support::*;
use serde_json::{json, Value};

const AGENT: &str = "repo-helper";

async fn py(dir: PathBuf, token: String, spec: Value) -> Value {
    tokio::task::spawn_blocking(move || python_client(&dir, &token, spec))
        .await
        .unwrap()
}

fn policy(api: &str) -> String {
    format!(
        r#"agent = "repo-helper"

[resources."{api}"]
source = "self"
ttl = "300s"

[tools."repos.list"]
resource = "{api}"
scopes = ["repos.read"]
steps = ["list_repos"]
"#
    )
}

type Slot = Arc<std::sync::OnceLock<credbroker::verify::Verifier>>;

/// A repository API that accepts only credbroker tokens for itself,
/// verified with `credbroker::verify` (token and DPoP proof). Its verifier is
/// set by [`bind_api`] once the broker (whose policy names the API) runs.
async fn verified_api() -> (RepoApi, Slot) {
    let slot: Slot = Arc::default();
    let v = slot.clone();
    let api = RepoApi::start(
        "/repos",
        Arc::new(move |req, url| {
            let v = v.get().ok_or("not ready")?;
            let h = |n| {
                req.headers()
                    .get(n)
                    .and_then(|x: &http::HeaderValue| x.to_str().ok())
            };
            let dpop: Vec<&str> = req
                .headers()
                .get_all("dpop")
                .iter()
                .filter_map(|x| x.to_str().ok())
                .collect();
            let ok = v
                .verify(&credbroker::verify::Presented {
                    method: req.method().as_str(),
                    url,
                    authorization: h("authorization"),
                    dpop: &dpop,
                })
                .map_err(|e| e.to_string())?;
            Ok(ok.sub)
        }),
    )
    .await;
    (api, slot)
}

async fn bind_api(b: &TestBroker, api: &RepoApi, slot: &Slot) {
    let jwks = reqwest::get(format!("{}/.well-known/jwks.json", b.public))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    slot.set(credbroker::verify::Verifier::from_jwks(&b.issuer, &api.url, &jwks).unwrap())
        .unwrap();
}

fn self_server(b: &TestBroker, api: &RepoApi) -> McpServer {
    let jwks = b.path("dev-issuer-jwks.json");
    McpServer::start(
        &McpServerOpts {
            socket: &b.socket,
            broker_issuer: &b.issuer,
            trusted_issuer: &b.issuer,
            jwks: Jwks::File(&jwks),
            audience: AGENT,
            step: "list_repos",
            tool: "repos.list",
            resource: &api.url,
            api_url: &api.url,
            service: "repos",
            scope: None,
            state_ttl: None,
        },
        b.dir.path(),
    )
}

fn repo_names(call: &Value) -> Vec<String> {
    call["result"]["structuredContent"]["repositories"]
        .as_array()
        .unwrap_or_else(|| panic!("no repositories in {call}"))
        .iter()
        .map(|r| r["full_name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn self_source_lists_the_persons_repositories_in_both_protocol_versions() {
    // The API's URL is the resource, so it must exist before the policy.
    let (api, slot) = verified_api().await;
    let b = TestBroker::start_with(Opts {
        policy: Some(policy(&api.url)),
        ..Opts::default()
    });
    bind_api(&b, &api, &slot).await;
    let server = self_server(&b, &api);
    let dir = b.dir.path().to_owned();
    let alice = b.subject_token("alice");
    let bob = b.subject_token("bob");

    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let out = py(
            dir.clone(),
            alice.clone(),
            json!({"url": server.url, "mode": mode, "scenario": "call"}),
        )
        .await;
        assert_eq!(out["protocol_version"], version, "{out}");
        assert_eq!(out["tools"], json!(["list_repositories"]));
        let call = &out["calls"][0];
        assert_eq!(
            call["result"]["isError"],
            false,
            "{out}\n{}",
            server.log_text()
        );
        assert_eq!(repo_names(call), ["alice/notes", "alice/site"], "{mode}");

        // The person is whoever the token says: Bob gets Bob's.
        let out = py(
            dir.clone(),
            bob.clone(),
            json!({"url": server.url, "mode": mode, "scenario": "call",
            "arguments": {"limit": 1}}),
        )
        .await;
        assert_eq!(
            repo_names(&out["calls"][0]),
            ["bob/notes"],
            "{mode}: limit applies"
        );
    }

    // The API got credbroker tokens with proofs, never a person's access
    // token; and no token the API got ever reached the MCP client.
    let hits = api.hits();
    assert_eq!(hits.len(), 4);
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    let seen_by_client = all_strings(&out).join("\n");
    for h in api.hits() {
        let auth = h.authorization.unwrap();
        let at = auth.strip_prefix("DPoP ").expect("DPoP scheme");
        assert!(h.dpop.is_some(), "a proof with every token");
        assert_ne!(at, alice);
        assert_ne!(at, bob);
        assert!(
            !seen_by_client.contains(at),
            "a derived token reached the MCP client"
        );
    }
    assert!(
        !server.log_text().contains(&alice),
        "the access token is in the MCP server's log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn access_token_is_verified_and_identity_never_comes_from_arguments() {
    let b = TestBroker::start();
    let stub = StubBroker::start(b.dir.path()).await;
    let api = RepoApi::start("/repos", Arc::new(|_, _| Ok("unused".into()))).await;
    let jwks = b.path("dev-issuer-jwks.json");
    let server = McpServer::start(
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
            service: "repos",
            scope: None,
            state_ttl: None,
        },
        b.dir.path(),
    );
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let post = |auth: Option<String>| {
        let mut r = http
            .post(&server.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(init.to_string());
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    // No token, a malformed one, one for another audience, an ID-token-like
    // one, one signed by a stranger: 401 with the metadata pointer.
    let now = now();
    let other_aud = b.sign_as_dev_issuer(
        json!({"alg": "ES256", "typ": "at+jwt"}),
        &json!({"iss": b.issuer, "sub": "alice", "aud": "mail-helper", "iat": now, "exp": now + 300}),
    );
    let stranger = {
        let k = key();
        let mut h = serde_json::Map::new();
        h.insert("typ".into(), "at+jwt".into());
        h.insert("kid".into(), k.kid.clone().into());
        k.sign_jws(
            h,
            &json!({"iss": b.issuer, "sub": "alice", "aud": AGENT, "iat": now, "exp": now + 300}),
        )
        .unwrap()
    };
    for auth in [
        None,
        Some("Bearer".to_owned()),
        Some("Basic YWxpY2U6eA==".to_owned()),
        Some(format!("Bearer {other_aud}")),
        Some(format!("Bearer {stranger}")),
    ] {
        let r = post(auth.clone()).await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        let www = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(
            www.starts_with("Bearer ") && www.contains("resource_metadata="),
            "{www}"
        );
    }
    assert!(
        stub.hits().is_empty(),
        "nothing reached the broker without a verified token"
    );
    let meta: Value = http
        .get(
            server
                .url
                .replace("/mcp", "/.well-known/oauth-protected-resource/mcp"),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["resource"], server.url.as_str());
    assert_eq!(meta["authorization_servers"], json!([b.issuer]));

    // Positive control: the person's own token gets in, and the derive asks
    // for that person with that very token as the subject token.
    stub.set(
        "alice",
        StubAnswer {
            token: Some("gho_alice_provider_token".into()),
            ..Default::default()
        },
    );
    let alice = b.subject_token("alice");
    let r = post(Some(format!("Bearer {alice}"))).await.unwrap();
    assert_eq!(r.status(), 200);
    let dir = b.dir.path().to_owned();
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    assert_eq!(out["calls"][0]["result"]["isError"], false, "{out}");
    let hit = stub.hits().pop().unwrap();
    assert_eq!(hit.body["subject_token"], alice.as_str());
    assert_eq!(hit.body["step"], "list_repos");
    assert_eq!(hit.body["tool"], "repos.list");
    assert!(
        hit.dpop.is_some(),
        "the derive carries the MCP server's own proof"
    );
    // The derived token went to the API (the proxy, in production) with
    // this server's proof, and nowhere else.
    let hit = api.hits().pop().unwrap();
    assert_eq!(
        hit.authorization.as_deref(),
        Some("DPoP gho_alice_provider_token")
    );
    assert!(hit.dpop.is_some(), "a proof with the call");
    assert!(!all_strings(&out)
        .iter()
        .any(|s| s.contains("gho_alice_provider_token")));

    // Naming someone else in the arguments is refused, in both versions;
    // then the same call without it works (positive control).
    for mode in ["legacy", "auto"] {
        let out = py(
            dir.clone(),
            alice.clone(),
            json!({"url": server.url, "mode": mode, "scenario": "call",
            "arguments": {"user": "bob"}}),
        )
        .await;
        assert_eq!(out["calls"][0]["error"]["code"], -32602, "{mode}: {out}");
        let out = py(
            dir.clone(),
            alice.clone(),
            json!({"url": server.url, "mode": mode, "scenario": "call",
            "arguments": {"limit": 5}}),
        )
        .await;
        assert_eq!(out["calls"][0]["result"]["isError"], false, "{mode}: {out}");
    }
}

struct StubSetup {
    b: TestBroker,
    stub: StubBroker,
    api: RepoApi,
    server: McpServer,
    link_uri: String,
}

const LINK_MSG: &str = "Connect your Repos account so that repo-helper can list your repositories.";

async fn stub_setup() -> StubSetup {
    stub_setup_with(None).await
}

async fn stub_setup_with(state_ttl: Option<i64>) -> StubSetup {
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
                Some("DPoP gho_bob") => Ok("bob".into()),
                _ => Err("bad token".into()),
            }
        }),
    )
    .await;
    let jwks = b.path("dev-issuer-jwks.json");
    let server = McpServer::start(
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
            service: "repos",
            scope: Some("repo"),
            state_ttl,
        },
        b.dir.path(),
    );
    let link_uri = format!("{}/connect/c0de-for-alice", b.public);
    StubSetup {
        b,
        stub,
        api,
        server,
        link_uri,
    }
}

impl StubSetup {
    /// Alice has no account yet; the file `connected` stands for her
    /// completing the connect page.
    fn alice_needs_to_connect(&self) -> PathBuf {
        let marker = self.b.path("alice-connected");
        let _ = std::fs::remove_file(&marker);
        self.stub.set(
            "alice",
            StubAnswer {
                link: Some((self.link_uri.clone(), "lnk_alice".into(), LINK_MSG.into())),
                connected_when: Some(marker.clone()),
                token: Some("gho_alice".into()),
                ..Default::default()
            },
        );
        marker
    }
}

/// An opener that "completes the page": touches the marker (the URL comes last).
fn completes(marker: &std::path::Path) -> Value {
    json!([
        "sh",
        "-c",
        "touch \"$0\"; echo '{\"touched\": true}'",
        marker
    ])
}

/// An opener that opens nothing that connects (someone else's browser).
fn does_not_complete() -> Value {
    json!(["sh", "-c", "echo '{\"touched\": false}'"])
}

#[tokio::test(flavor = "multi_thread")]
async fn link_is_relayed_as_url_elicitation_required_in_2025_11_25() {
    let s = stub_setup().await;
    let marker = s.alice_needs_to_connect();
    let alice = s.b.subject_token("alice");
    let out = py(
        s.b.dir.path().to_owned(),
        alice,
        json!({"url": s.server.url, "mode": "legacy", "scenario": "flow",
        "open": completes(&marker), "answers": ["accept"]}),
    )
    .await;
    assert_eq!(out["protocol_version"], "2025-11-25");
    let first = &out["calls"][0]["error"];
    assert_eq!(first["code"], -32042, "{out}");
    let el = &first["data"]["elicitations"][0];
    assert_eq!(el["mode"], "url");
    assert_eq!(el["elicitationId"], "lnk_alice");
    assert_eq!(el["url"], s.link_uri.as_str());
    assert!(
        el["message"].as_str().unwrap().contains(&s.link_uri),
        "the link as plain text too"
    );
    assert!(first["message"].as_str().unwrap().starts_with(LINK_MSG));
    assert_eq!(out["links"][0]["open"]["lines"][0]["touched"], true);
    // The manual retry returns the repositories.
    assert_eq!(
        repo_names(&out["calls"][1]),
        ["alice/notes", "alice/site"],
        "{out}"
    );
    assert_eq!(out["calls"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn link_is_relayed_as_input_required_in_2026_07_28() {
    let s = stub_setup().await;
    let marker = s.alice_needs_to_connect();
    let alice = s.b.subject_token("alice");
    let wire = s.b.path("wire.jsonl");
    let out = py(
        s.b.dir.path().to_owned(),
        alice,
        json!({"url": s.server.url, "mode": "auto", "scenario": "flow",
        "open": completes(&marker), "answers": ["accept"], "wire_log": wire}),
    )
    .await;
    assert_eq!(out["protocol_version"], "2026-07-28");
    // On the wire: the result, then a retry with a new id, the answer under
    // the same key and the exact state.
    let lines: Vec<Value> = std::fs::read_to_string(&wire)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ir = lines
        .iter()
        .find(|l| l["response"]["result"]["resultType"] == "input_required")
        .unwrap_or_else(|| panic!("no input_required on the wire: {lines:?}"));
    let result = &ir["response"]["result"];
    let req = &result["inputRequests"]["connect_repos"];
    assert_eq!(req["method"], "elicitation/create", "{result}");
    assert_eq!(req["params"]["mode"], "url");
    assert_eq!(req["params"]["url"], s.link_uri.as_str());
    // rmcp 3.11 writes `"elicitationId": ""` into 2026-07-28 URL requests,
    // a field that version removed; the Python client ignores it.
    assert!(
        req["params"].get("elicitationId").is_none_or(|v| v == ""),
        "{result}"
    );
    let state = result["requestState"].as_str().unwrap();
    let calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["request"]["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "{lines:?}");
    assert_ne!(calls[0]["request"]["id"], calls[1]["request"]["id"]);
    // The final answer says `complete`, as 2026-07-28 requires of servers.
    let done = lines
        .iter()
        .find(|l| l["response"]["result"]["structuredContent"].is_object())
        .unwrap_or_else(|| panic!("no final result on the wire: {lines:?}"));
    assert_eq!(done["response"]["result"]["resultType"], "complete");
    assert_eq!(calls[1]["request"]["params"]["requestState"], state);
    assert_eq!(
        calls[1]["request"]["params"]["inputResponses"],
        json!({"connect_repos": {"action": "accept"}})
    );
    eprintln!("2026-07-28 input_required on the wire: {result}");
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 1, "{out}");
    assert_eq!(links[0]["via"], "elicitation_callback");
    assert_eq!(links[0]["params"]["mode"], "url");
    assert_eq!(links[0]["params"]["url"], s.link_uri.as_str());
    assert!(links[0]["params"]["message"]
        .as_str()
        .unwrap()
        .contains(&s.link_uri));
    // The client's automatic retry returned the repositories.
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["alice/notes", "alice/site"],
        "{out}"
    );
    // Two derives: the first refused, the retry issued; the state was sealed
    // and opened in between.
    assert_eq!(s.stub.hits().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn unfinished_or_declined_link_asks_again_and_connects_nothing() {
    let s = stub_setup().await;
    let marker = s.alice_needs_to_connect();
    let dir = s.b.dir.path().to_owned();
    let alice = s.b.subject_token("alice");
    // 2026-07-28: accepted but the page was not completed -> asked again;
    // then declined -> a tool error naming the link, and no repositories.
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": s.server.url, "mode": "auto", "scenario": "flow",
        "open": does_not_complete(), "answers": ["accept", "decline"]}),
    )
    .await;
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 2, "the retry got the elicitation again: {out}");
    assert_eq!(links[0]["params"]["url"], links[1]["params"]["url"]);
    let res = &out["calls"][0]["result"];
    assert_eq!(res["isError"], true, "{out}");
    assert!(res["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("declined"));
    assert!(s.api.hits().is_empty(), "nothing reached the API");
    // 2025-11-25: the same, by hand.
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": s.server.url, "mode": "legacy", "scenario": "flow",
        "open": does_not_complete(), "answers": ["accept", "decline"]}),
    )
    .await;
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{out}");
    assert!(calls.iter().all(|c| c["error"]["code"] == -32042));
    assert!(s.api.hits().is_empty());
    assert!(!marker.exists());
    // Positive control: completing the page makes the next round succeed.
    let out = py(
        dir,
        alice,
        json!({"url": s.server.url, "mode": "auto", "scenario": "flow",
        "open": completes(&marker), "answers": ["accept"]}),
    )
    .await;
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["alice/notes", "alice/site"],
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_or_replayed_request_state_is_refused() {
    let s = stub_setup().await;
    let marker = s.alice_needs_to_connect();
    s.stub.set(
        "bob",
        StubAnswer {
            token: Some("gho_bob".into()),
            ..Default::default()
        },
    );
    let alice = s.b.subject_token("alice");
    let bob = s.b.subject_token("bob");
    let out = py(
        s.b.dir.path().to_owned(),
        alice,
        json!({"url": s.server.url, "mode": "auto", "scenario": "tamper",
        "other_token": bob}),
    )
    .await;
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls[0]["result"]["resultType"], "input_required", "{out}");
    let by_name = |n: &str| {
        calls
            .iter()
            .find(|c| c["attempt"] == n)
            .unwrap_or_else(|| panic!("{n}: {out}"))
    };
    for n in [
        "other_person",
        "tampered_body",
        "tampered_tag",
        "no_tag",
        "other_arguments",
    ] {
        let e = &by_name(n)["error"];
        assert_eq!(e["code"], -32602, "{n}: {out}");
        assert_eq!(e["message"], "Invalid or expired requestState", "{n}");
        assert_eq!(e["data"]["reason"], "invalid_request_state", "{n}");
    }
    // Refused states never reached the broker (1 derive: the first call;
    // 1 more: the genuine retry below).
    let derives = s.stub.hits().len();
    assert_eq!(
        derives, 2,
        "only the first call and the genuine retry derive"
    );
    // Positive control: the genuine state is accepted and the server asks
    // again (Alice has not connected yet).
    assert_eq!(
        by_name("genuine")["result"]["resultType"],
        "input_required",
        "{out}"
    );
    assert!(!marker.exists());
    assert!(s.server.log_text().contains("requestState refused"));
}

#[tokio::test(flavor = "multi_thread")]
async fn form_only_client_gets_the_link_as_text() {
    let s = stub_setup().await;
    s.alice_needs_to_connect();
    let alice = s.b.subject_token("alice");
    for mode in ["legacy", "auto"] {
        // No elicitation_callback: the Python client declares no URL mode.
        let out = py(
            s.b.dir.path().to_owned(),
            alice.clone(),
            json!({"url": s.server.url, "mode": mode,
            "scenario": "call", "elicitation": false}),
        )
        .await;
        let res = &out["calls"][0]["result"];
        assert_eq!(res["isError"], true, "{mode}: {out}");
        let text = res["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with(LINK_MSG) && text.ends_with(&s.link_uri),
            "{mode}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_request_state_is_refused() {
    let _serial = crate::support::serial().await;
    let s = stub_setup_with(Some(3)).await;
    s.alice_needs_to_connect();
    let alice = s.b.subject_token("alice");
    let dir = s.b.dir.path().to_owned();
    // The genuine state, retried until it is refused: accepted while it
    // lives (each retry asks again), refused once its 3 s lifetime is over,
    // and the refused retry never reaches the broker. Bounds are relative
    // to the lifetime (whole seconds: refused after at least 2 s, within
    // three lifetimes), not a fixed sleep.
    let ttl = 3.0;
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": s.server.url, "mode": "auto",
        "scenario": "tamper", "only_genuine": true, "poll_expiry": 3.0 * ttl}),
    )
    .await;
    let accepted = polled_expiry(&out, ttl);
    assert_eq!(
        s.stub.hits().len(),
        1 + accepted,
        "an expired state never reaches the broker"
    );
    assert!(s.server.log_text().contains("requestState has expired"));
    // Positive control: retried at once, the same kind of state is accepted.
    let out = py(
        dir,
        alice,
        json!({"url": s.server.url, "mode": "auto",
        "scenario": "tamper", "only_genuine": true}),
    )
    .await;
    assert_eq!(
        out["calls"][1]["result"]["resultType"], "input_required",
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn api_answer_echoing_the_provider_token_is_withheld() {
    let b = TestBroker::start();
    let stub = StubBroker::start(b.dir.path()).await;
    // An API that puts the bearer token into its answer.
    let echo = RepoApi::token_echoing().await;
    let honest = RepoApi::start("/user/repos", Arc::new(|_, _| Ok("alice".into()))).await;
    let jwks = b.path("dev-issuer-jwks.json");
    let start = |api: &RepoApi| {
        McpServer::start(
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
                service: "repos",
                scope: None,
                state_ttl: None,
            },
            b.dir.path(),
        )
    };
    stub.set(
        "alice",
        StubAnswer {
            token: Some("gho_echo_me_secret".into()),
            ..Default::default()
        },
    );
    let alice = b.subject_token("alice");
    let dir = b.dir.path().to_owned();
    let server = start(&echo);
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    let res = &out["calls"][0]["result"];
    assert_eq!(res["isError"], true, "{out}");
    assert!(res["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("withheld"));
    assert!(!all_strings(&out)
        .iter()
        .any(|s| s.contains("gho_echo_me_secret")));
    assert_eq!(echo.hits().len(), 1, "the API was called");
    drop(server);
    // Positive control: an API that does not echo it is passed through.
    let server = start(&honest);
    let out = py(
        dir,
        alice,
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["alice/notes", "alice/site"],
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_bearer_token_from_the_broker_is_refused_unused() {
    let b = TestBroker::start();
    let stub = StubBroker::start(b.dir.path()).await;
    let api = RepoApi::start("/user/repos", Arc::new(|_, _| Ok("alice".into()))).await;
    let jwks = b.path("dev-issuer-jwks.json");
    let server = McpServer::start(
        &McpServerOpts {
            socket: &stub.socket,
            broker_issuer: &b.issuer,
            trusted_issuer: &b.issuer,
            jwks: Jwks::File(&jwks),
            audience: AGENT,
            step: "list_repos",
            tool: "repos.list",
            resource: &format!("{}/proxy/repos", b.issuer),
            api_url: &api.url,
            service: "repos",
            scope: None,
            state_ttl: None,
        },
        b.dir.path(),
    );
    // The broker answers with a provider's own bearer token (a policy with
    // delivery = "provider_token"): the example sends it nowhere.
    stub.set(
        "alice",
        StubAnswer {
            token: Some("gho_handed_over_secret".into()),
            provider_token: true,
            ..Default::default()
        },
    );
    let alice = b.subject_token("alice");
    let dir = b.dir.path().to_owned();
    for mode in ["legacy", "auto"] {
        let out = py(
            dir.clone(),
            alice.clone(),
            json!({"url": server.url, "mode": mode, "scenario": "call"}),
        )
        .await;
        let res = &out["calls"][0]["result"];
        assert_eq!(res["isError"], true, "{mode}: {out}");
        assert!(
            res["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("delivery = \"proxy\""),
            "{mode}: {out}"
        );
        assert!(!all_strings(&out)
            .iter()
            .any(|s| s.contains("gho_handed_over_secret")));
    }
    assert!(api.hits().is_empty(), "the provider token went nowhere");
    assert!(!server.log_text().contains("gho_handed_over_secret"));
    // Positive control: a DPoP-bound token (what the broker answers for a
    // proxy resource) is used, with this server's proof.
    stub.set(
        "alice",
        StubAnswer {
            token: Some("proxy_token_for_alice".into()),
            ..Default::default()
        },
    );
    let out = py(
        dir,
        alice,
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["alice/notes", "alice/site"],
        "{out}"
    );
    let hit = api.hits().pop().unwrap();
    assert_eq!(
        hit.authorization.as_deref(),
        Some("DPoP proxy_token_for_alice")
    );
    assert!(hit.dpop.is_some());
}
