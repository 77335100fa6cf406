//! End to end, nothing faked: the Python `mcp` client (2.3.x) talks to the
//! example MCP server (rmcp), which derives from the real broker; the broker
//! refuses with a connect link; Chromium (playwright-core) opens the link as
//! the person, who signs in at the organisation's IdP (panva's
//! oidc-provider, tests/peers/oidc-provider.mjs, which also issues the
//! access tokens the MCP client presents) and connects the third-party
//! service (oidc-provider again, tests/peers/oauth-service.mjs); the retry
//! gets a token for the broker's egress proxy, and the example's call goes
//! through the proxy to the repository API (which checks the provider's
//! token, added by the proxy, at the provider's userinfo endpoint). The
//! example never holds the provider's token.
//!
//! - 2025-11-25 (`mode="legacy"`): `-32042`, the handler opens the link,
//!   the manual retry returns the repositories;
//! - 2026-07-28 (`mode="auto"`): `input_required`, the
//!   `elicitation_callback` opens the link and answers `accept`, the
//!   automatic retry returns the repositories;
//! - both again with the link opened in another signed-in person's
//!   browser: the refusal page, the retry gets the elicitation again, and
//!   nothing is connected;
//! - a tampered `requestState` is refused;
//! - the sensitive tool `publish_repository`: refused before approval (the
//!   approval link relayed like a connect link, in both versions, and
//!   nothing reaches the API), approved in Chromium by the right person,
//!   and the retry served once with a token carrying the approved details.
//!
//! The broker requires DPoP nonces (`[dpop] require_nonce`), on the socket
//! and on its proxy: the example follows each `use_dpop_nonce` challenge,
//! for both tools' derives and for the proxied calls, and keeps the nonce
//! it was handed for the next ones.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::support::mcp::*;
use crate::support::*;
use serde_json::{json, Value};

const AGENT_RESOURCE: &str = "urn:credbroker:agent:repo-helper";
const PAGES_CLIENT: &str = "credbroker-pages";
const SERVICE_CLIENT: &str = "credbroker-acme";

/// `tests/peers`, with node and its npm packages (checked in one place).
fn peers() -> PathBuf {
    crate::support::prereq::node_peers()
}

/// Chromium and the npm peers (checked in one place).
fn require_browser() {
    crate::support::prereq::chromium();
}

/// The third-party service (tests/peers/oauth-service.mjs).
struct Service {
    child: Child,
    issuer: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    fn start(secret: &str, redirect: &str) -> Service {
        use std::io::BufRead;
        let mut child = Command::new("node")
            .arg(peers().join("oauth-service.mjs"))
            .args(["--client-id", SERVICE_CLIENT, "--client-secret", secret])
            .args(["--redirect-uri", redirect])
            .current_dir(peers())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let hello: Value =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("oauth-service said {line:?}"));
        Service {
            issuer: hello["issuer"].as_str().unwrap().to_owned(),
            child,
        }
    }
}

struct Env {
    idp: NodePeer,
    _idp_cfg: tempfile::NamedTempFile,
    service: Service,
    broker: TestBroker,
    api: RepoApi,
    /// The sensitive tool's API (a `self` resource of the broker).
    publish: RepoApi,
    server: McpServer,
    browsers: tempfile::TempDir,
}

/// The broker's proxy address for the service, on the pages' origin `base`.
fn proxy(base: &str) -> String {
    format!("{base}/proxy/acme")
}

fn policy(base: &str, publish: &str) -> String {
    let proxy = proxy(base);
    format!(
        r#"agent = "repo-helper"

[resources."{proxy}"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.repos"]
resource = "{proxy}"
scopes = ["repo"]
steps = ["list_repos"]
routes = ["GET /user/repos"]

[resources."{publish}"]
source = "self"

[tools."acme.publish"]
resource = "{publish}"
scopes = ["repo.publish"]
steps = ["list_repos"]
approval = "each_call"
require_authorization_details = true

[tools."acme.publish".authorization_details.repo_publish]
repository = {{ kind = "string", required = true, label = "Repository", log_in_clear = true }}
branch = {{ kind = "string", required = true, label = "Branch", log_in_clear = true }}
"#
    )
}

/// The sensitive tool's API: it serves only a DPoP token with a proof,
/// minted on an approval, single-use, whose details name `octo/site` and
/// `main`; it answers for the person the token names.
async fn publish_api() -> RepoApi {
    RepoApi::start(
        "/publish",
        std::sync::Arc::new(|req: &http::Request<hyper::body::Incoming>, _url: &str| {
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .ok_or("no token")?;
            let token = auth.strip_prefix("DPoP ").ok_or("not a DPoP token")?;
            if req.headers().get("dpop").is_none() || req.method() != http::Method::POST {
                return Err("no proof, or not a POST".into());
            }
            let c = crate::support::claims_of(token);
            let d = &c["authorization_details"][0];
            if !c["approval_id"].is_string()
                || c["single_use"] != true
                || d["type"] != "repo_publish"
                || d["repository"] != "octo/site"
                || d["branch"] != "main"
            {
                return Err("not the approved call".into());
            }
            Ok(c["sub"].as_str().unwrap_or_default().to_owned())
        }),
    )
    .await
}

async fn env() -> Env {
    require_browser();
    let public = free_loopback_addr();
    let base = format!("http://{public}");
    let pages_secret = "pages-client-secret-not-a-canary";
    let (idp, idp_cfg) = oidc_provider(&json!({
        "clients": [
            {
                "client_id": "orchestrator", "client_secret": "orchestrator-secret-not-a-canary",
                "redirect_uris": ["http://127.0.0.1:1/cb"],
                "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            },
            {
                "client_id": PAGES_CLIENT, "client_secret": pages_secret,
                "redirect_uris": [format!("{base}/signin/callback")],
                "grant_types": ["authorization_code"], "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_basic",
            },
        ],
        "resources": { AGENT_RESOURCE: {"audience": "repo-helper", "scope": "agent"} },
    }));
    let idp_issuer = idp.hello["issuer"].as_str().unwrap().to_owned();
    let service_secret = "acme-client-secret-not-a-canary";
    let service = Service::start(service_secret, &format!("{base}/callback/acme"));

    let secrets = tempfile::tempdir().unwrap();
    let pages_secret_file = secrets.path().join("idp-secret");
    credbroker::internals::config::write_secret_file(&pages_secret_file, pages_secret.as_bytes())
        .unwrap();
    let service_secret_file = secrets.path().join("acme-secret");
    credbroker::internals::config::write_secret_file(
        &service_secret_file,
        service_secret.as_bytes(),
    )
    .unwrap();
    // The repository API believes a token only when the provider's userinfo
    // endpoint does, and lists the repositories of that provider account.
    // It is the provider's api_base: only the proxy calls it.
    let api = RepoApi::provider_checked(&service.issuer).await;
    let api_base = api.url.trim_end_matches("/user/repos").to_owned();
    let publish = publish_api().await;
    let broker = TestBroker::start_with(Opts {
        policy: Some(policy(&base, &publish.url)),
        public_listen: Some(public.to_string()),
        extra_config: format!(
            r#"
[[trusted_issuers]]
issuer = "{idp_issuer}"
jwks_uri = "{idp_issuer}/jwks"
algs = ["ES256", "RS256"]
sign_in = {{ kind = "oidc", client_id = "{PAGES_CLIENT}", client_secret_file = "{pages}" }}

[providers.acme]
display_name = "Acme"
issuer = "{service}"
client_id = "{SERVICE_CLIENT}"
client_secret_file = "{acme}"
scopes = ["openid", "profile"]
api_base = "{api_base}"

[dpop]
require_nonce = true
"#,
            pages = pages_secret_file.display(),
            service = service.issuer,
            acme = service_secret_file.display(),
        ),
        ..Opts::default()
    });
    // Keep the secret files as long as the broker runs.
    std::mem::forget(secrets);

    let server = McpServer::start_with(
        &McpServerOpts {
            socket: &broker.socket,
            broker_issuer: &broker.issuer,
            trusted_issuer: &idp_issuer,
            jwks: Jwks::Uri(&format!("{idp_issuer}/jwks")),
            audience: "repo-helper",
            step: "list_repos",
            tool: "acme.repos",
            resource: &proxy(&base),
            api_url: &format!("{}/user/repos", proxy(&base)),
            service: "acme",
            scope: None,
            state_ttl: None,
        },
        broker.dir.path(),
        &[
            "--approval-tool",
            "acme.publish",
            "--approval-resource",
            &publish.url,
        ],
        "info",
    );
    Env {
        idp,
        _idp_cfg: idp_cfg,
        service,
        broker,
        api,
        publish,
        server,
        browsers: tempfile::tempdir().unwrap(),
    }
}

impl Env {
    /// The person's access token from the IdP (audience: the agent).
    fn access_token(&mut self, user: &str) -> String {
        let r = self.idp.call(&json!({
            "cmd": "login", "user": user, "client_id": "orchestrator",
            "client_secret": "orchestrator-secret-not-a-canary",
            "redirect_uri": "http://127.0.0.1:1/cb", "scope": "openid agent", "resource": AGENT_RESOURCE,
        }));
        assert!(r.get("error").is_none(), "IdP login failed: {r}");
        r["tokens"]["access_token"].as_str().unwrap().to_owned()
    }

    /// Makes the next browser sign-in at the service be `account` (the
    /// peer's `/test/browser-account`), so that each person connects a
    /// provider account of their own.
    async fn provider_account(&self, account: &str) {
        let url = format!(
            "{}/test/browser-account?account={account}",
            self.service.issuer
        );
        let r = reqwest::get(&url).await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["browser_account"], account, "{v}");
    }

    /// The command that opens a link in `person`'s own browser profile.
    fn browser_of(&self, person: &str) -> Value {
        json!([
            "node",
            peers().join("mcp_open_link.mjs"),
            self.browsers.path().join(person),
            person
        ])
    }

    async fn client(&self, token: &str, spec: Value) -> Value {
        let mut spec = spec;
        spec["url"] = json!(self.server.url);
        let dir = self.broker.dir.path().to_owned();
        let token = token.to_owned();
        tokio::task::spawn_blocking(move || python_client(&dir, &token, spec))
            .await
            .unwrap()
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        self.broker
            .audit_lines()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }
}

fn repo_names(call: &Value) -> Vec<String> {
    call["result"]["structuredContent"]["repositories"]
        .as_array()
        .unwrap_or_else(|| panic!("no repositories in {call}"))
        .iter()
        .map(|r| r["full_name"].as_str().unwrap().to_owned())
        .collect()
}

fn browser_result(link: &Value) -> String {
    let lines = link["open"]["lines"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    lines
        .iter()
        .find_map(|l| l["done"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("the browser did not finish: {link}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_connect_link_completed_in_chromium_in_both_protocol_versions() {
    let mut e = env().await;

    // Alice and Bob connect distinct provider accounts, so that a token
    // served to the wrong person shows in whose repositories come back.
    // 2025-11-25: -32042; the handler opens the link in Alice's browser,
    // where she signs in and connects; the manual retry gets her repositories.
    e.provider_account("octo-alice").await;
    let alice = e.access_token("alice");
    let out = e
        .client(
            &alice,
            json!({"mode": "legacy", "scenario": "flow",
            "open": e.browser_of("alice"), "answers": ["accept"]}),
        )
        .await;
    assert_eq!(out["protocol_version"], "2025-11-25");
    let first = &out["calls"][0]["error"];
    assert_eq!(first["code"], -32042, "{out}\n{}", e.server.log_text());
    let el = &first["data"]["elicitations"][0];
    let url = el["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/connect/", e.broker.issuer)),
        "{url}"
    );
    assert!(!el["elicitationId"].as_str().unwrap().is_empty());
    assert_eq!(browser_result(&out["links"][0]), "completed", "{out}");
    assert_eq!(
        repo_names(&out["calls"][1]),
        ["octo-alice/notes", "octo-alice/site"],
        "{out}"
    );

    // 2026-07-28: input_required; the callback opens the link in Bob's
    // browser and answers accept; the automatic retry gets his repositories.
    e.provider_account("octo-bob").await;
    let bob = e.access_token("bob");
    let out = e
        .client(
            &bob,
            json!({"mode": "auto", "scenario": "flow",
            "open": e.browser_of("bob"), "answers": ["accept"]}),
        )
        .await;
    assert_eq!(out["protocol_version"], "2026-07-28");
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 1, "{out}");
    assert_eq!(links[0]["params"]["mode"], "url");
    assert_eq!(browser_result(&links[0]), "completed", "{out}");
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["octo-bob/notes", "octo-bob/site"],
        "{out}"
    );
    // Alice, after Bob connected, still gets her own account's repositories
    // (no link this time: she is connected).
    let again = e
        .client(&alice, json!({"mode": "legacy", "scenario": "call"}))
        .await;
    assert_eq!(
        repo_names(&again["calls"][0]),
        ["octo-alice/notes", "octo-alice/site"],
        "{again}"
    );

    // Every call reached the API through the proxy, with the provider's
    // token (which the API checked at the provider), never a person's
    // access token, the example's credbroker token or its proof; neither
    // the MCP client nor the example's log ever saw a provider token.
    let hits = e.api.hits();
    assert_eq!(hits.len(), 3, "{hits:?}");
    let proxied = e.events("proxy.request");
    assert_eq!(
        proxied.len(),
        3,
        "one proxied call per API hit: {proxied:?}"
    );
    assert!(proxied.iter().all(|x| x["tool"] == "acme.repos"));
    // The example keeps the proxy's nonce: its first call is challenged,
    // the next ones reuse the nonce (a second challenge only if the nonce's
    // time bucket ran out meanwhile), where a client that kept nothing
    // would be challenged at each of the three calls.
    let challenged = e
        .broker
        .metric(r#"credbroker_proxy_requests_total{outcome="use_dpop_nonce",service="acme",tool="other"}"#)
        .unwrap_or(0.0);
    assert!(
        (1.0..3.0).contains(&challenged),
        "{challenged} challenges for 3 proxied calls: {}",
        e.broker
            .metrics()
            .lines()
            .filter(|l| l.contains("proxy_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let log = e.server.log_text();
    for h in hits {
        let auth = h.authorization.unwrap();
        let token = auth.strip_prefix("Bearer ").expect("the provider's scheme");
        assert!(token != alice && token != bob);
        assert_eq!(
            crate::support::quickstart::jwts_issued_by(token, &e.broker.issuer),
            0,
            "a credbroker token went upstream"
        );
        assert_eq!(h.dpop, None, "the proof never goes upstream");
        for o in [&out, &again] {
            assert!(!all_strings(o).iter().any(|s| s.contains(token)));
        }
        assert!(
            !log.contains(token),
            "a provider token in the example's log"
        );
    }
    assert_eq!(e.events("connect.completed").len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_connect_link_opened_by_another_person_connects_nothing() {
    let mut e = env().await;
    let mallory_browser = e.browser_of("mallory");

    // 2025-11-25: Carol's link, opened in Mallory's browser (signed in as
    // Mallory): the other-person page; the retry gets -32042 again.
    let carol = e.access_token("carol");
    let out = e
        .client(
            &carol,
            json!({"mode": "legacy", "scenario": "flow",
            "open": mallory_browser, "answers": ["accept", "decline"]}),
        )
        .await;
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{out}");
    assert!(calls.iter().all(|c| c["error"]["code"] == -32042), "{out}");
    assert_eq!(
        calls[0]["error"]["data"]["elicitations"][0]["url"],
        calls[1]["error"]["data"]["elicitations"][0]["url"],
        "the same link, still open for Carol"
    );
    assert_eq!(browser_result(&out["links"][0]), "other_person", "{out}");

    // 2026-07-28: Dave's link, opened by Mallory: the callback answers
    // accept, the retry gets the elicitation again, then decline ends it.
    let dave = e.access_token("dave");
    let out = e
        .client(
            &dave,
            json!({"mode": "auto", "scenario": "flow",
            "open": e.browser_of("mallory"), "answers": ["accept", "decline"]}),
        )
        .await;
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 2, "the retry got the elicitation again: {out}");
    assert_eq!(browser_result(&links[0]), "other_person", "{out}");
    assert_eq!(links[0]["params"]["url"], links[1]["params"]["url"]);
    assert_eq!(out["calls"][0]["result"]["isError"], true, "{out}");

    // Nothing connected: no repositories were fetched, the events say whose
    // browser opened what, and Mallory has nothing either.
    assert!(e.api.hits().is_empty());
    assert!(e.events("connect.completed").is_empty());
    let opened = e.events("connect.opened_by_other_person");
    let pairs: Vec<(&str, &str)> = opened
        .iter()
        .map(|x| {
            (
                x["person_sub"].as_str().unwrap(),
                x["opener_sub"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [("carol", "mallory"), ("dave", "mallory")],
        "{opened:?}"
    );
    let (status, body) = e.broker.admin_get("/accounts").unwrap();
    assert_eq!(status, 200, "{body}");
    let accounts: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        accounts["accounts"],
        json!([]),
        "nothing connected for anyone: {accounts}"
    );
    let mallory = e.access_token("mallory");
    let out = e
        .client(&mallory, json!({"mode": "legacy", "scenario": "call"}))
        .await;
    assert_eq!(out["calls"][0]["error"]["code"], -32042, "{out}");

    // Positive control: Carol opens her own link in her own browser and the
    // retry works.
    let out = e
        .client(
            &carol,
            json!({"mode": "legacy", "scenario": "flow",
            "open": e.browser_of("carol"), "answers": ["accept"]}),
        )
        .await;
    assert_eq!(browser_result(&out["links"][0]), "completed", "{out}");
    assert!(!repo_names(&out["calls"][1]).is_empty(), "{out}");
    let accounts: Value =
        serde_json::from_str(&e.broker.admin_get("/accounts").unwrap().1).unwrap();
    let owners: Vec<&str> = accounts["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["person_sub"].as_str().unwrap())
        .collect();
    assert_eq!(owners, ["carol"], "{accounts}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_request_state_is_refused_against_the_real_broker() {
    let mut e = env().await;
    let erin = e.access_token("erin");
    let frank = e.access_token("frank");
    let out = e
        .client(
            &erin,
            json!({"mode": "auto", "scenario": "tamper", "other_token": frank}),
        )
        .await;
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls[0]["result"]["resultType"], "input_required", "{out}");
    // Every named attempt ran, once: the first call plus six.
    let by_name = |n: &str| {
        let found: Vec<&Value> = calls.iter().filter(|c| c["attempt"] == n).collect();
        assert_eq!(found.len(), 1, "{n}: {out}");
        found[0]
    };
    let refused = [
        "other_person",
        "tampered_body",
        "tampered_tag",
        "no_tag",
        "other_arguments",
    ];
    assert_eq!(calls.len(), 1 + refused.len() + 1, "{out}");
    for n in refused {
        let e = &by_name(n)["error"];
        assert_eq!(e["code"], -32602, "{n}: {out}");
        assert_eq!(e["data"]["reason"], "invalid_request_state", "{n}: {out}");
    }
    // Positive control: the genuine state opens, and since Erin has not
    // connected, the server asks again.
    assert_eq!(
        by_name("genuine")["result"]["resultType"],
        "input_required",
        "{out}"
    );

    // The broker's refusal itself matches proto/refusal.schema.json.
    let k = key();
    let body = json!({"subject_token": erin, "step": "list_repos", "tool": "acme.repos", "resource": proxy(&e.broker.issuer)}).to_string();
    let raw = e.broker.raw(
        &http_derive(&body, Some(&e.broker.proof(&k)), ""),
        std::time::Duration::from_secs(10),
    );
    assert_eq!(status_of(&raw), 400, "{raw}");
    let refusal: Value = serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap();
    let f = e.broker.path("refusal.json");
    std::fs::write(&f, refusal.to_string()).unwrap();
    let v = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/check_proto.py"))
        .arg("validate")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/refusal.schema.json"))
        .arg(&f)
        .output()
        .unwrap();
    let verdict: Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(verdict["valid"], true, "{verdict}\n{refusal}");
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_sensitive_tool_waits_for_the_persons_approval_in_chromium_in_both_versions() {
    let mut e = env().await;
    let args = json!({"repository": "octo/site", "branch": "main"});
    let alice = e.access_token("alice");
    let not_opened = json!(["sh", "-c", "echo '{\"touched\": false}'"]);

    // The tool is listed; before any approval the call is refused with the
    // approval link, relayed as a connect link is: 2025-11-25 -32042 ...
    let out = e
        .client(
            &alice,
            json!({"mode": "legacy", "scenario": "flow", "tool": "publish_repository",
            "arguments": args, "open": not_opened, "answers": ["decline"]}),
        )
        .await;
    assert!(
        out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "publish_repository"),
        "{out}"
    );
    let first = &out["calls"][0]["error"];
    assert_eq!(first["code"], -32042, "{out}\n{}", e.server.log_text());
    let link = first["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        link.starts_with(&format!("{}/connect/", e.broker.issuer)),
        "{link}"
    );
    // ... and 2026-07-28 input_required under its own key, the same link
    // (the same call asks for the same approval); declined -> a tool error.
    let out = e
        .client(
            &alice,
            json!({"mode": "auto", "scenario": "flow", "tool": "publish_repository",
            "arguments": args, "open": not_opened, "answers": ["decline"]}),
        )
        .await;
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 1, "{out}");
    assert_eq!(links[0]["params"]["url"], link.as_str(), "{out}");
    assert_eq!(out["calls"][0]["result"]["isError"], true, "{out}");
    assert!(
        e.publish.hits().is_empty(),
        "nothing reached the API unapproved"
    );
    let requested = e.events("approval.requested");
    assert_eq!(requested.len(), 1, "{requested:?}");

    // Mallory opening Alice's approval link in her own browser changes
    // nothing: the retry is still refused with the same link.
    let out = e
        .client(
            &alice,
            json!({"mode": "legacy", "scenario": "flow", "tool": "publish_repository",
            "arguments": args, "open": e.browser_of("mallory"), "answers": ["accept", "decline"]}),
        )
        .await;
    assert_eq!(browser_result(&out["links"][0]), "other_person", "{out}");
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{out}");
    assert!(calls.iter().all(|c| c["error"]["code"] == -32042), "{out}");
    assert_eq!(e.events("approval.opened_by_other_person").len(), 1);
    assert!(e.events("approval.granted").is_empty());
    assert!(e.publish.hits().is_empty());

    // Positive control: Alice opens it in her browser (signs in at the IdP,
    // reads the call, presses Approve); the client's automatic retry is
    // served, with a token carrying the approved details.
    let out = e
        .client(
            &alice,
            json!({"mode": "auto", "scenario": "flow", "tool": "publish_repository",
            "arguments": args, "open": e.browser_of("alice"), "answers": ["accept"]}),
        )
        .await;
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 1, "{out}");
    assert_eq!(links[0]["params"]["url"], link.as_str());
    assert_eq!(browser_result(&links[0]), "completed", "{out}");
    let lines = links[0]["open"]["lines"].to_string();
    assert!(lines.contains("press approve"), "{lines}");
    assert_eq!(e.events("approval.granted").len(), 1);
    let res = &out["calls"][0]["result"];
    assert_eq!(res["isError"], false, "{out}\n{}", e.server.log_text());
    assert_eq!(
        res["structuredContent"]["published"]["repositories"][0]["full_name"], "alice/notes",
        "{out}"
    );
    assert_eq!(e.publish.hits().len(), 1);
    assert_eq!(e.events("approval.redeemed").len(), 1);
    // Each call needs its own approval: the same call again is refused
    // with a new link, and nothing more reaches the API.
    let out = e
        .client(
            &alice,
            json!({"mode": "legacy", "scenario": "call", "tool": "publish_repository",
            "arguments": args}),
        )
        .await;
    let again = &out["calls"][0]["error"];
    assert_eq!(again["code"], -32042, "{out}");
    assert_ne!(again["data"]["elicitations"][0]["url"], link.as_str());
    assert_eq!(e.publish.hits().len(), 1);
}
