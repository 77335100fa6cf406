//! A token for another proxy resource (issue 11's negative cases): the
//! broker proxies two services, `acme` and `other` (a second provider on the
//! same `oidc-provider` client), and a token minted for one proxy address
//! is refused at the other, whose own token is served.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

use super::{proxy_policy, refusal, ProxyEnv, READ_ROUTES};
use crate::support::services::{issued, refused, ProviderOpts};
use crate::support::*;

/// The proxy address of `other` under the test brokers' issuer.
const OTHER: &str = "http://127.0.0.1:0/proxy/other";

#[tokio::test]
async fn token_for_another_proxy_resource_is_refused() {
    let policy = format!(
        r#"{}
[resources."{OTHER}"]
source = "service"
service = "other"
delivery = "proxy"

[tools."other.read"]
resource = "{OTHER}"
scopes = ["repo"]
steps = ["triage"]
routes = ["GET /user"]
"#,
        proxy_policy(READ_ROUTES)
    );
    let mut p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(policy),
            more_services: vec!["other"],
            ..ProviderOpts::default()
        },
    )
    .await;
    // Alice connects her account at `other` too, through the real pages.
    let b = &p.env.broker;
    let r = refused(
        b.derive(
            &p.key,
            &b.subject_token("alice"),
            "triage",
            "other.read",
            OTHER,
            None,
        )
        .await,
    );
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    p.env
        .play_pages(&r.connect_uri.unwrap(), "alice", "octo-alice")
        .await;
    let b = &p.env.broker;
    let other = issued(
        b.derive(
            &p.key,
            &b.subject_token("alice"),
            "triage",
            "other.read",
            OTHER,
            None,
        )
        .await,
    )
    .access_token
    .expose()
    .clone();
    assert_eq!(claims_of(&other)["aud"], OTHER);
    let acme = p.token("acme.read", "triage").await;

    // The `other` token at `/proxy/acme`, with a proof for exactly that
    // call by the key it is bound to: the audience is wrong.
    let r = p.call(&other, "GET", "/user", None).await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("error=\"invalid_token\""));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["reason"], "invalid_token");
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .contains("audience"),
        "{body}"
    );
    // And the `acme` token at `/proxy/other`.
    let proof = p.proof(&acme, "GET", "/proxy/other/user");
    let (status, body) = refusal(
        p.send(
            "GET",
            "/proxy/other/user",
            &format!("DPoP {acme}"),
            &proof,
            None,
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (401, Some("invalid_token"))
    );
    assert!(p.api.records().is_empty(), "nothing went upstream");

    // Positive controls: each token at its own address.
    let r = p.call(&acme, "GET", "/user", None).await;
    assert_eq!(r.status(), 200);
    let proof = p.proof(&other, "GET", "/proxy/other/user");
    let r = p
        .send(
            "GET",
            "/proxy/other/user",
            &format!("DPoP {other}"),
            &proof,
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("login"));
    assert_eq!(p.api.records().len(), 2);
}
