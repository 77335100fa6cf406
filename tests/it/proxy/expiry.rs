//! A proxy token past its `exp` (plus the verifier's skew) is refused at
//! the proxy like at any resource server.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use super::{proxy_policy, refusal, ProxyEnv, READ_ROUTES};
use crate::support::services::ProviderOpts;
use crate::support::*;

#[tokio::test]
async fn expired_proxy_token_is_invalid_token_and_a_fresh_one_is_served() {
    // The reading tool's tokens live one second.
    let policy = proxy_policy(READ_ROUTES).replacen(
        "[tools.\"acme.read\"]\n",
        "[tools.\"acme.read\"]\nttl = \"1s\"\n",
        1,
    );
    let p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(policy),
            ..ProviderOpts::default()
        },
    )
    .await;
    let read = p.token("acme.read", "triage").await;
    let c = claims_of(&read);
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 1);

    // Polled with a call the token may never make (403 while the token is
    // valid, so nothing goes upstream) until the token itself is refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    let v = loop {
        let r = p.call(&read, "DELETE", "/user", None).await;
        if r.status() == 401 {
            assert!(r.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .contains("error=\"invalid_token\""));
            break refusal(r).await.1;
        }
        assert_eq!(refusal(r).await.1["reason"], "route_not_allowed");
        assert!(Instant::now() < deadline, "the token never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(v["error"], "invalid_token", "{v}");
    // An allowed call with the expired token is refused too, before the API.
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(refusal(r).await.0, 401);
    assert!(p.api.records().is_empty(), "nothing went upstream");

    // Positive control: a fresh token for the same tool is served.
    let fresh = p.token("acme.read", "triage").await;
    assert_eq!(p.call(&fresh, "GET", "/user", None).await.status(), 200);
    assert_eq!(p.api.records().len(), 1);
}
