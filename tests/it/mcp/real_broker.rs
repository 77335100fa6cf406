//! The behaviours of `server.rs` that the threat model cites, run against
//! the real broker too (the scripted socket there reads `sub` without
//! checks and answers what it was told): the example MCP server derives on
//! the real broker's socket, whose policy has a `service` resource played
//! by oidc-provider (tests/peers/oauth-service.mjs); links are real links,
//! finished, when a test finishes one, through the real pages over HTTP
//! (`ServiceEnv::play_pages`); the repository API believes a token only
//! when the provider's userinfo endpoint does.
//!
//! - an unfinished or declined link asks again (the same link) and
//!   connects nothing; finishing the page makes the next round work;
//! - an expired `requestState` never reaches the broker;
//! - a client without URL elicitation gets the broker's link as text;
//! - an API answer that echoes the provider's token is withheld (by the
//!   proxy's echo guard: the example calls the service through the proxy).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::support::mcp::*;
use crate::support::services::{refused, ProviderOpts, ServiceEnv};
use crate::support::*;
use serde_json::{json, Value};

async fn py(dir: PathBuf, token: String, spec: Value) -> Value {
    tokio::task::spawn_blocking(move || python_client(&dir, &token, spec))
        .await
        .unwrap()
}

/// The repository API behind the proxy, and how it answers.
struct Api {
    api: RepoApi,
    /// The provider's userinfo endpoint, known once the provider runs.
    userinfo: Arc<Mutex<String>>,
    /// When set, the API puts the caller's token into its answer.
    echo: Arc<AtomicBool>,
}

/// The repository API: lists `{account}/notes` and `{account}/site` for
/// the provider account whose token the provider's userinfo endpoint
/// accepts (or, with `echo`, answers the token itself as the account).
async fn repo_api() -> Api {
    let userinfo = Arc::new(Mutex::new(String::new()));
    let echo = Arc::new(AtomicBool::new(false));
    let (u, e) = (userinfo.clone(), echo.clone());
    let api = RepoApi::start_async(
        "/user/repos",
        Arc::new(move |headers: http::HeaderMap, _url| {
            let userinfo = u.lock().unwrap().clone();
            let echo = e.load(Ordering::SeqCst);
            Box::pin(async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .ok_or("no token")?
                    .to_owned();
                if echo {
                    return Ok(auth.trim_start_matches("Bearer ").to_owned());
                }
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
    .await;
    Api {
        api,
        userinfo,
        echo,
    }
}

/// The broker with the `acme` service behind its egress proxy: the tool
/// `acme.issues` has the resource `{issuer}/proxy/acme` and the one route
/// `GET /user/repos`, and the provider's `api_base` is the repository API
/// (started first, since the config names it).
async fn proxied_env() -> (ServiceEnv, Api) {
    let api = repo_api().await;
    let public = free_loopback_addr();
    let proxy = format!("http://{public}/proxy/acme");
    let origin = api.api.url.trim_end_matches("/user/repos").to_owned();
    let env = ServiceEnv::start_with(ProviderOpts {
        public_listen: Some(public),
        extra_config: format!("api_base = \"{origin}\"\n"),
        policy: Some(format!(
            r#"{}
[resources."{proxy}"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.issues"]
resource = "{proxy}"
scopes = ["repo"]
steps = ["triage"]
routes = ["GET /user/repos"]
"#,
            credbroker::internals::cli::QUICKSTART_POLICY
        )),
        ..ProviderOpts::default()
    });
    *api.userinfo.lock().unwrap() = format!("{}/me", env.peer.issuer);
    (env, api)
}

/// The proxy address of the env's broker.
fn proxy_of(env: &ServiceEnv) -> String {
    format!("{}/proxy/acme", env.broker.issuer)
}

/// A derive for `acme.issues` through the proxy resource.
async fn derive(env: &ServiceEnv, sub: &str) -> credbroker::client::Answer {
    env.broker
        .derive(
            &key(),
            &env.broker.subject_token(sub),
            "triage",
            "acme.issues",
            &proxy_of(env),
            None,
        )
        .await
}

/// The example MCP server on the real broker's socket, for `acme.issues`,
/// calling the repository API through the broker's proxy.
fn mcp_server(env: &ServiceEnv, state_ttl: Option<i64>) -> McpServer {
    let jwks = env.broker.path("dev-issuer-jwks.json");
    let proxy = proxy_of(env);
    McpServer::start(
        &McpServerOpts {
            socket: &env.broker.socket,
            broker_issuer: &env.broker.issuer,
            trusted_issuer: &env.broker.issuer,
            jwks: Jwks::File(&jwks),
            audience: "repo-helper",
            step: "triage",
            tool: "acme.issues",
            resource: &proxy,
            api_url: &format!("{proxy}/user/repos"),
            service: "acme",
            scope: None,
            state_ttl,
        },
        env.broker.dir.path(),
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

/// The derives the broker decided (its audit events).
fn derives(env: &ServiceEnv) -> usize {
    env.broker
        .audit_lines()
        .iter()
        .filter(|e| {
            e["event"]
                .as_str()
                .is_some_and(|n| n.starts_with("derive."))
        })
        .count()
}

/// The accounts the broker holds.
fn accounts(env: &ServiceEnv) -> Vec<Value> {
    let (status, body) = env.broker.admin_get("/accounts").unwrap();
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["accounts"].as_array().unwrap().clone()
}

/// An opener that opens nothing that connects.
fn does_not_complete() -> Value {
    json!(["sh", "-c", "echo '{\"touched\": false}'"])
}

#[tokio::test(flavor = "multi_thread")]
async fn unfinished_or_declined_link_asks_again_and_connects_nothing_on_the_real_broker() {
    let (mut env, api) = proxied_env().await;
    let server = mcp_server(&env, None);
    let dir = env.broker.dir.path().to_owned();
    let alice = env.broker.subject_token("alice");
    // 2026-07-28: accepted but the page was not completed -> asked again,
    // with the same link; then declined -> a tool error, no repositories.
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto", "scenario": "flow",
        "open": does_not_complete(), "answers": ["accept", "decline"]}),
    )
    .await;
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 2, "the retry got the elicitation again: {out}");
    let url = links[0]["params"]["url"].as_str().unwrap().to_owned();
    assert_eq!(links[1]["params"]["url"], url.as_str(), "the same link");
    let res = &out["calls"][0]["result"];
    assert_eq!(res["isError"], true, "{out}");
    assert!(res["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("declined"));
    // 2025-11-25: the same, by hand.
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "legacy", "scenario": "flow",
        "open": does_not_complete(), "answers": ["accept", "decline"]}),
    )
    .await;
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{out}");
    for c in calls {
        assert_eq!(c["error"]["code"], -32042, "{out}");
        assert_eq!(
            c["error"]["data"]["elicitations"][0]["url"],
            url.as_str(),
            "{out}"
        );
    }
    // Nothing connected, nothing reached the API; the link the broker
    // hands out is still that one.
    assert!(accounts(&env).is_empty(), "{:?}", accounts(&env));
    assert!(api.api.hits().is_empty(), "nothing reached the API");
    let r = refused(derive(&env, "alice").await);
    assert_eq!(r.connect_uri.as_deref(), Some(url.as_str()));

    // Positive control: the person finishes the page; the next round
    // returns her repositories at the provider.
    env.play_pages(&url, "alice", "octo-alice").await;
    let out = py(
        dir,
        alice,
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["octo-alice/notes", "octo-alice/site"],
        "{out}"
    );
    assert_eq!(accounts(&env).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_request_state_is_refused_on_the_real_broker() {
    let (env, _api) = proxied_env().await;
    let server = mcp_server(&env, Some(3));
    let alice = env.broker.subject_token("alice");
    let dir = env.broker.dir.path().to_owned();
    let before = derives(&env);
    // The genuine state, retried until it is refused (polled, not a fixed
    // sleep): each retry while it lives reaches the broker, which asks for
    // the link again; once its 3 s lifetime is over it is refused and that
    // retry never reaches the broker. Bounds are relative to the lifetime
    // (whole seconds: refused after at least 2 s, within three lifetimes).
    let ttl = 3.0;
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto",
        "scenario": "tamper", "only_genuine": true, "poll_expiry": 3.0 * ttl}),
    )
    .await;
    let accepted = polled_expiry(&out, ttl);
    let after_poll = derives(&env);
    assert_eq!(
        after_poll - before,
        1 + accepted,
        "the first call and each accepted retry reached the broker, the refused one did not"
    );
    assert!(server.log_text().contains("requestState has expired"));
    // Positive control: retried at once, the state opens and the broker is
    // asked again (Alice has not connected, so it asks for the link again).
    let out = py(
        dir,
        alice,
        json!({"url": server.url, "mode": "auto",
        "scenario": "tamper", "only_genuine": true}),
    )
    .await;
    assert_eq!(
        out["calls"][1]["result"]["resultType"], "input_required",
        "{out}"
    );
    assert_eq!(
        derives(&env) - after_poll,
        2,
        "both calls reached the broker"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn form_only_client_gets_the_link_as_text_on_the_real_broker() {
    let (mut env, _api) = proxied_env().await;
    let server = mcp_server(&env, None);
    let alice = env.broker.subject_token("alice");
    // The link and its message, as the broker hands them out.
    let r = refused(derive(&env, "alice").await);
    let link = r.connect_uri.clone().unwrap();
    let message = r.connect_message.clone().unwrap();
    for mode in ["legacy", "auto"] {
        // No elicitation_callback: the Python client declares no URL mode.
        let out = py(
            env.broker.dir.path().to_owned(),
            alice.clone(),
            json!({"url": server.url, "mode": mode,
            "scenario": "call", "elicitation": false}),
        )
        .await;
        let res = &out["calls"][0]["result"];
        assert_eq!(res["isError"], true, "{mode}: {out}");
        let text = res["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with(&message) && text.ends_with(&link),
            "{mode}: {text}"
        );
    }
    // Positive control: once the link is finished, the same client gets
    // the repositories.
    env.play_pages(&link, "alice", "octo-alice").await;
    let out = py(
        env.broker.dir.path().to_owned(),
        alice,
        json!({"url": server.url, "mode": "auto",
        "scenario": "call", "elicitation": false}),
    )
    .await;
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["octo-alice/notes", "octo-alice/site"],
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn api_answer_echoing_the_provider_token_is_withheld_on_the_real_broker() {
    let (mut env, api) = proxied_env().await;
    let r = refused(derive(&env, "alice").await);
    env.play_pages(r.connect_uri.as_deref().unwrap(), "alice", "octo-alice")
        .await;
    // The API puts the token it got (the provider's, added by the proxy)
    // into its answer: the proxy's echo guard stops it, and the example
    // passes on only the status.
    api.echo.store(true, Ordering::SeqCst);
    let alice = env.broker.subject_token("alice");
    let dir = env.broker.dir.path().to_owned();
    let server = mcp_server(&env, None);
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    let res = &out["calls"][0]["result"];
    assert_eq!(res["isError"], true, "{out}");
    assert!(
        res["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("HTTP 502"),
        "{out}"
    );
    let hits = api.api.hits();
    assert_eq!(hits.len(), 1, "the API was called through the proxy");
    let issued = env.peer.issued_tokens().await;
    assert!(!issued.is_empty(), "the provider issued tokens");
    let strings = all_strings(&out);
    let log = server.log_text();
    for t in &issued {
        assert!(
            !strings.iter().any(|s| s.contains(t.as_str())),
            "a provider token reached the MCP client"
        );
        assert!(
            !log.contains(t.as_str()),
            "a provider token in the example's log"
        );
    }
    // Positive control: the same API, no longer echoing, is served, and it
    // saw the provider's token only (never the credbroker token or the
    // example's proof).
    api.echo.store(false, Ordering::SeqCst);
    let out = py(
        dir,
        alice,
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    assert_eq!(
        repo_names(&out["calls"][0]),
        ["octo-alice/notes", "octo-alice/site"],
        "{out}"
    );
    for h in api.api.hits() {
        let auth = h.authorization.unwrap();
        let bearer = auth.strip_prefix("Bearer ").expect("the provider's scheme");
        assert!(issued.iter().any(|t| t == bearer), "not a provider token");
        assert_eq!(h.dpop, None, "the proof never goes upstream");
    }
    assert!(
        env.broker
            .audit_lines()
            .iter()
            .any(|e| e["event"] == "proxy.request" && e["tool"] == "acme.issues"),
        "the calls went through the proxy"
    );
}
