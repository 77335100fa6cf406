//! The MCP relay of an approval: the example MCP server (real binary)
//! derives on the real broker for a tool that needs approval, and relays the
//! `approval_required` refusal exactly as a connect link, in both protocol
//! versions (2026-07-28 URL elicitation, 2025-11-25 error -32042), to the
//! Python `mcp` SDK's client; once the person approves on the real pages,
//! the next round is served with a token carrying the approval.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::PathBuf;
use std::sync::Arc;

use crate::support::claims_of;
use crate::support::mcp::*;
use crate::support::services::{ProviderOpts, ServiceEnv};
use serde_json::{json, Value};

async fn py(dir: PathBuf, token: String, spec: Value) -> Value {
    tokio::task::spawn_blocking(move || python_client(&dir, &token, spec))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_relays_an_approval_link_in_both_versions_then_the_approved_call_is_served() {
    // The API stands in for the tool's resource: it serves only a DPoP
    // token minted on an approval, for the person it names.
    let api = RepoApi::start(
        "/user/repos",
        Arc::new(|req: &http::Request<hyper::body::Incoming>, _url: &str| {
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .ok_or("no token")?;
            let token = auth.strip_prefix("DPoP ").ok_or("not a DPoP token")?;
            if req.headers().get("dpop").is_none() {
                return Err("no proof".into());
            }
            let c = claims_of(token);
            if !c["approval_id"].is_string() || c["single_use"] != true {
                return Err("not an approved call".into());
            }
            Ok(c["sub"].as_str().unwrap_or_default().to_owned())
        }),
    )
    .await;
    let mut env = ServiceEnv::start_with(ProviderOpts {
        extra_policy: format!(
            r#"
[resources."{url}"]
source = "self"

[tools."repo.publish"]
resource = "{url}"
scopes = ["repo.publish"]
steps = ["triage"]
approval = "each_call"
"#,
            url = api.url
        ),
        ..ProviderOpts::default()
    });
    let jwks = env.broker.path("dev-issuer-jwks.json");
    let server = McpServer::start(
        &McpServerOpts {
            socket: &env.broker.socket,
            broker_issuer: &env.broker.issuer,
            trusted_issuer: &env.broker.issuer,
            jwks: Jwks::File(&jwks),
            audience: "repo-helper",
            step: "triage",
            tool: "repo.publish",
            resource: &api.url,
            api_url: &api.url,
            service: "acme",
            scope: None,
            state_ttl: None,
        },
        env.broker.dir.path(),
    );
    let dir = env.broker.dir.path().to_owned();
    let alice = env.broker.subject_token("alice");
    let not_opened = json!(["sh", "-c", "echo '{\"touched\": false}'"]);

    // 2026-07-28: URL elicitation with the approval link, asked again with
    // the same link while it waits; declined -> a tool error.
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "auto", "scenario": "flow",
        "open": not_opened, "answers": ["accept", "decline"]}),
    )
    .await;
    let links = out["links"].as_array().unwrap();
    assert_eq!(links.len(), 2, "{out}");
    let url = links[0]["params"]["url"].as_str().unwrap().to_owned();
    assert!(url.contains("/connect/"), "{url}");
    assert_eq!(links[1]["params"]["url"], url.as_str(), "the same link");
    let requested: Vec<Value> = env
        .broker
        .audit_lines()
        .into_iter()
        .filter(|e| e["event"] == "approval.requested")
        .collect();
    assert_eq!(requested.len(), 1, "{requested:?}");
    let id = requested[0]["approval_id"].as_str().unwrap().to_owned();
    if let Some(el) = links[0]["params"].get("elicitationId").filter(|v| *v != "") {
        assert_eq!(el, id.as_str());
    }
    assert_eq!(out["calls"][0]["result"]["isError"], true, "{out}");

    // 2025-11-25: error -32042 carrying the same link.
    let out = py(
        dir.clone(),
        alice.clone(),
        json!({"url": server.url, "mode": "legacy", "scenario": "flow",
        "open": not_opened, "answers": ["accept", "decline"]}),
    )
    .await;
    for c in out["calls"].as_array().unwrap() {
        assert_eq!(c["error"]["code"], -32042, "{out}");
        assert_eq!(
            c["error"]["data"]["elicitations"][0]["url"],
            url.as_str(),
            "{out}"
        );
    }
    assert!(api.hits().is_empty(), "nothing reached the API unapproved");

    // Positive control: Alice approves on the real pages; the next round
    // is served, once.
    env.play_pages(&url, "alice", "unused").await;
    let out = py(
        dir,
        alice,
        json!({"url": server.url, "mode": "auto", "scenario": "call"}),
    )
    .await;
    let repos = out["calls"][0]["result"]["structuredContent"]["repositories"]
        .as_array()
        .unwrap_or_else(|| panic!("not served: {out}"))
        .clone();
    assert!(!repos.is_empty(), "{out}");
    assert_eq!(api.hits().len(), 1);
    let redeemed = env
        .broker
        .audit_lines()
        .into_iter()
        .filter(|e| e["event"] == "approval.redeemed" && e["approval_id"] == id.as_str())
        .count();
    assert_eq!(redeemed, 1);
}
