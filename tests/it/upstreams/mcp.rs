//! The example MCP server (examples/mcp_repo_server.rs), driven by the real
//! Python `mcp` client, for a tool whose resource is an `exchange` one: the
//! server's derive (the Rust client) makes the relayed proof by itself, and
//! the repository API, which trusts only the org AS's keys (checked with
//! jose, token and DPoP proof), serves the person's repositories.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::sync::Arc;

use serde_json::json;

use super::exchange::{broker_policy, Org};
use crate::support::mcp::*;
use crate::support::*;

/// `/repos` believing only tokens of the org AS (its issuer, set in
/// `issuer` once it runs) for itself, bound to the key of the DPoP proof
/// that comes with them.
async fn org_checked_api(issuer: Arc<std::sync::OnceLock<String>>) -> RepoApi {
    RepoApi::start_async(
        "/repos",
        Arc::new(move |headers: http::HeaderMap, url: String| {
            let issuer = issuer.get().cloned().unwrap_or_default();
            Box::pin(async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let auth = h("authorization").ok_or("no token")?;
                let token = auth.strip_prefix("DPoP ").ok_or("not the DPoP scheme")?;
                let t = jose(
                    "verify-token",
                    json!({
                        "token": token, "issuer": issuer, "audience": url,
                        "jwks_uri": format!("{issuer}/jwks"),
                        "required_claims": ["iss", "sub", "aud", "exp", "iat", "jti", "cnf", "scope"],
                    }),
                )
                .await?;
                let p = jose(
                    "verify-proof",
                    json!({"proof": h("dpop").ok_or("no proof")?, "htm": "GET", "htu": url,
                           "access_token": token}),
                )
                .await?;
                if t["claims"]["cnf"]["jkt"] != p["jkt"] {
                    return Err("the proof's key is not the token's".into());
                }
                Ok(t["claims"]["sub"].as_str().unwrap_or_default().to_owned())
            })
        }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_mcp_server_derives_an_exchanged_token() {
    // The API's URL is the org AS's resource and the policy's: it starts
    // first, and learns the AS's issuer once that runs.
    let issuer: Arc<std::sync::OnceLock<String>> = Arc::default();
    let api = org_checked_api(issuer.clone()).await;
    let mut org = Org::start_for(json!({ api.url.clone(): { "scope": "repos.read" } }));
    issuer.set(org.issuer.clone()).unwrap();
    let policy = format!(
        r#"{}
[resources."{api}"]
source = "exchange"
upstream = "org"

[tools."repos.list"]
resource = "{api}"
scopes = ["repos.read"]
steps = ["list_repos"]
"#,
        policy_without_approval(),
        api = api.url
    );
    let b = broker_policy(&org, &org.issuer.clone(), "", policy);
    let jwks_uri = format!("{}/jwks", org.issuer);
    let server = McpServer::start(
        &McpServerOpts {
            socket: &b.socket,
            broker_issuer: &b.issuer,
            trusted_issuer: &org.issuer,
            jwks: Jwks::Uri(&jwks_uri),
            audience: "repo-helper",
            step: "list_repos",
            tool: "repos.list",
            resource: &api.url,
            api_url: &api.url,
            service: "repos",
            scope: None,
            state_ttl: None,
        },
        b.dir.path(),
    );
    let alice = org.subject(3600);
    let sent = org.exchanges();
    let dir = b.dir.path().to_owned();
    let spec = json!({"url": server.url, "mode": "auto", "scenario": "call"});
    let token = alice.clone();
    let out = tokio::task::spawn_blocking(move || python_client(&dir, &token, spec))
        .await
        .unwrap();
    let call = &out["calls"][0];
    assert_eq!(
        call["result"]["isError"],
        false,
        "{out}\n{}",
        server.log_text()
    );
    let names: Vec<&str> = call["result"]["structuredContent"]["repositories"]
        .as_array()
        .unwrap_or_else(|| panic!("no repositories in {out}"))
        .iter()
        .map(|r| r["full_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice/notes", "alice/site"]);
    assert_eq!(
        org.exchanges(),
        sent + 1,
        "one exchange, the proof right the first time"
    );
    // The API got the org AS's token (checked above), never the person's
    // access token, and the MCP client never saw it.
    let hits = api.hits();
    assert_eq!(hits.len(), 1);
    let at = hits[0]
        .authorization
        .as_deref()
        .unwrap()
        .strip_prefix("DPoP ")
        .unwrap()
        .to_owned();
    assert_ne!(at, alice);
    assert!(!all_strings(&out).join("\n").contains(&at));
    let issued = b
        .audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "derive.issued")
        .unwrap();
    assert_eq!(issued["upstream"], "org");
}
