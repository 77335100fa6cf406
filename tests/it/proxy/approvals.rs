//! Step-up approvals on the proxy (issue 12 item 4): an `each_call`
//! approval's token serves exactly one proxied call. The approval is
//! granted through the real pages over HTTP, as the person's browser would.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};

use super::{proxy_policy, refusal, ProxyEnv, PROXY, READ_ROUTES};
use crate::support::services::ProviderOpts;
use crate::support::*;
use credbroker::client::{Answer, DeriveParams};

/// [`proxy_policy`] plus `acme.delete`, which needs the person's approval
/// of each call, described as a `repository` entry. `delete_route` is its
/// one route (a string or a route table).
pub(crate) fn approval_policy(delete_route: &str) -> String {
    format!(
        r#"{}
[tools."acme.delete"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage"]
approval = "each_call"
require_authorization_details = true
routes = [{delete_route}]

[tools."acme.delete".authorization_details.repository]
owner = {{ kind = "string", required = true, label = "Owner" }}
name = {{ kind = "string", required = true, label = "Repository", log_in_clear = true }}
"#,
        proxy_policy(READ_ROUTES)
    )
}

pub(crate) async fn start(delete_route: &str) -> ProxyEnv {
    ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(approval_policy(delete_route)),
            ..ProviderOpts::default()
        },
    )
    .await
}

pub(crate) fn repository(owner: &str, name: &str) -> Value {
    json!([{"type": "repository", "owner": owner, "name": name}])
}

/// A derive of `acme.delete` for the call `details`.
async fn derive(p: &ProxyEnv, details: &Value) -> Answer {
    let b = &p.env.broker;
    let proof = credbroker::client::proof(&p.key, "POST", &format!("{}/v1/derive", b.issuer), None)
        .unwrap();
    let subject = b.subject_token("alice");
    b.client()
        .derive_with_details(
            &DeriveParams {
                subject_token: &subject,
                step: "triage",
                tool: "acme.delete",
                resource: PROXY,
                scope: None,
            },
            Some(details),
            &proof,
        )
        .await
        .unwrap()
}

/// Alice approves the call `details` through the real pages; its token.
pub(crate) async fn approved_token(p: &mut ProxyEnv, details: &Value) -> String {
    let r = services::refused(derive(p, details).await);
    assert_eq!(r.reason.as_deref(), Some("approval_required"), "{r:?}");
    let uri = r.connect_uri.unwrap();
    p.env.play_pages(&uri, "alice", "").await;
    let t = services::issued(derive(p, details).await);
    t.access_token.expose().clone()
}

/// Where the broker requires DPoP nonces, a derive for a call's
/// `authorization_details` made with the client's key follows the nonce
/// challenge by itself, as a plain derive does (the example MCP server's
/// sensitive tool uses it).
#[tokio::test]
async fn a_derive_for_details_follows_the_nonce_challenge() {
    let mut p = ProxyEnv::start_with(
        "\n[dpop]\nrequire_nonce = true",
        ProviderOpts {
            policy: Some(approval_policy(r#""DELETE /repos/{owner}/{repo}""#)),
            ..ProviderOpts::default()
        },
    )
    .await;
    let details = repository("octo", "hello");
    // The challenge is real: a proof without a nonce is refused.
    let r = services::refused(derive(&p, &details).await);
    assert_eq!(r.error, "use_dpop_nonce", "{r:?}");
    let subject = p.env.broker.subject_token("alice");
    let params = DeriveParams {
        subject_token: &subject,
        step: "triage",
        tool: "acme.delete",
        resource: PROXY,
        scope: None,
    };
    let client = p.env.broker.client();
    // Followed: the call reaches the approval step.
    let r = services::refused(
        client
            .derive_for_details(&params, Some(&details), &p.key)
            .await
            .unwrap(),
    );
    assert_eq!(r.reason.as_deref(), Some("approval_required"), "{r:?}");
    // Positive control: once Alice approves, the same call is issued.
    p.env.play_pages(&r.connect_uri.unwrap(), "alice", "").await;
    let t = services::issued(
        client
            .derive_for_details(&params, Some(&details), &p.key)
            .await
            .unwrap(),
    );
    assert_eq!(claims_of(t.access_token.expose())["single_use"], true);
}

/// An `each_call` token serves one proxied call: a second call with the
/// same token (and a fresh proof) is refused with `token_already_used` and
/// never reaches the service; a refused call before it did not use it up;
/// a new approval's token is served again.
#[tokio::test]
async fn each_call_token_serves_exactly_one_proxied_call() {
    let mut p = start(r#""DELETE /repos/{owner}/{repo}""#).await;
    let details = repository("octo", "hello");
    let token = approved_token(&mut p, &details).await;
    let claims = claims_of(&token);
    assert_eq!(claims["single_use"], true);
    assert_eq!(claims["authorization_details"], details);

    // A call the policy refuses (not a route of the tool) leaves the token
    // unspent.
    let (status, body) = refusal(p.call(&token, "GET", "/user", None).await).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (403, Some("route_not_allowed"))
    );
    assert!(p.api.records().is_empty());

    // The one call.
    let r = p.call(&token, "DELETE", "/repos/octo/hello", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["deleted"], "octo/hello");
    assert_eq!(p.api.records().len(), 1);

    // The same token again, with a fresh proof: refused, nothing upstream.
    let r = p.call(&token, "DELETE", "/repos/octo/hello", None).await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("error=\"invalid_token\""));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["reason"], "token_already_used", "{body}");
    assert_eq!(
        p.api.records().len(),
        1,
        "the second call never went upstream"
    );
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| {
            es.iter()
                .any(|e| e["event"] == "proxy.completed" && e["reason"] == "token_already_used")
        })
        .await;
    let spent = audit
        .iter()
        .find(|e| e["reason"] == "token_already_used")
        .unwrap();
    assert_eq!(spent["outcome"], "denied");
    assert_eq!(spent["tool"], "acme.delete");

    // Positive control: a new approval of the same call gives a token that
    // is served.
    let again = approved_token(&mut p, &details).await;
    assert_ne!(again, token);
    let r = p.call(&again, "DELETE", "/repos/octo/hello", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(p.api.records().len(), 2);
}

/// Where the policy binds the route's variables to the approved details,
/// an approved token is refused (`details_mismatch`) on a path whose
/// variables differ, and nothing reaches the service; the approved path is
/// then served with the same, still unspent, token.
#[tokio::test]
async fn approved_token_is_refused_on_a_path_other_than_the_approved_one() {
    let mut p = start(
        r#"{ route = "DELETE /repos/{owner}/{repo}", details = { owner = "repository.owner", repo = "repository.name" } }"#,
    )
    .await;
    let token = approved_token(&mut p, &repository("octo", "hello")).await;
    for other in ["/repos/octo/important", "/repos/mallory/hello"] {
        let (status, body) = refusal(p.call(&token, "DELETE", other, None).await).await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (403, Some("details_mismatch")),
            "{other}: {body}"
        );
    }
    assert!(p.api.records().is_empty(), "nothing went upstream");
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| es.iter().any(|e| e["reason"] == "details_mismatch"))
        .await;
    let denied = audit
        .iter()
        .find(|e| e["reason"] == "details_mismatch")
        .unwrap();
    assert_eq!(denied["proxy"]["route"], "DELETE /repos/{owner}/{repo}");

    // Positive control: the approved repository.
    let r = p.call(&token, "DELETE", "/repos/octo/hello", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["deleted"], "octo/hello");
    assert_eq!(p.api.records().len(), 1);
}
