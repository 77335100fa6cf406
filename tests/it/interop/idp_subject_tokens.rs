//! Subject tokens from a real IdP (panva's oidc-provider): RFC 9068 JWT
//! access tokens whose audience is the agent, keys fetched from its JWKS URI.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;
use credbroker::client::Answer;
use serde_json::json;

const AGENT_RESOURCE: &str = "urn:credbroker:agent:repo-helper";
const OTHER_AGENT: &str = "urn:credbroker:agent:mail-helper";

fn idp() -> (NodePeer, tempfile::NamedTempFile) {
    oidc_provider(&json!({
        "clients": [{
            "client_id": "orchestrator", "client_secret": "orchestrator-secret-not-a-canary",
            "redirect_uris": ["http://127.0.0.1:1/cb"],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
        }],
        "resources": {
            AGENT_RESOURCE: {"audience": "repo-helper", "scope": "agent"},
            "urn:credbroker:agent:repo-helper:rsa": {"audience": "repo-helper", "scope": "agent", "alg": "RS256"},
            OTHER_AGENT: {"audience": "mail-helper", "scope": "agent"},
        },
    }))
}

fn login(idp: &mut NodePeer, user: &str, resource: &str) -> serde_json::Value {
    let r = idp.call(&json!({
        "cmd": "login", "user": user, "client_id": "orchestrator",
        "client_secret": "orchestrator-secret-not-a-canary",
        "redirect_uri": "http://127.0.0.1:1/cb", "scope": "openid agent", "resource": resource,
    }));
    assert!(r.get("error").is_none(), "IdP login failed: {r}");
    r["tokens"].clone()
}

fn broker_trusting(issuer: &str) -> TestBroker {
    TestBroker::start_with(Opts {
        extra_config: format!(
            r#"
[[trusted_issuers]]
issuer = "{issuer}"
jwks_uri = "{issuer}/jwks"
algs = ["ES256", "RS256"]
sign_in = {{ kind = "oidc", client_id = "credbroker" }}
"#
        ),
        ..Opts::default()
    })
}

fn claims(token: &str) -> serde_json::Value {
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&credbroker::internals::jose::b64d(p, "p").unwrap()).unwrap()
}

#[tokio::test]
async fn idp_access_tokens_are_subject_tokens_and_id_tokens_are_not() {
    let (mut idp, _cfg) = idp();
    let issuer = idp.hello["issuer"].as_str().unwrap().to_owned();
    let b = broker_trusting(&issuer);
    let k = key();

    let es = login(&mut idp, "alice", AGENT_RESOURCE);
    let at = es["access_token"].as_str().unwrap();
    match b
        .derive(&k, at, "summarize", "notes.read", RESOURCE, None)
        .await
    {
        Answer::Issued(t) => {
            let c = claims(t.access_token.expose());
            assert_eq!(c["sub"], "alice");
            assert_eq!(
                c["subject_iss"],
                issuer.as_str(),
                "the person is (iss, sub) of the IdP"
            );
            // Never longer than the subject token, never longer than 300 s.
            assert!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap() <= 300);
        }
        Answer::Refused(r) => panic!("IdP access token refused: {r:?}"),
    }

    // The ID token of the same login is not an access token: refused.
    let id_token = es["id_token"].as_str().unwrap();
    match b
        .derive(&k, id_token, "summarize", "notes.read", RESOURCE, None)
        .await
    {
        Answer::Refused(r) => assert_eq!(r.error, "invalid_request"),
        Answer::Issued(_) => panic!("an ID token was accepted as a subject token"),
    }
    // An access token for another agent: wrong audience, refused.
    let other = login(&mut idp, "alice", OTHER_AGENT);
    match b
        .derive(
            &k,
            other["access_token"].as_str().unwrap(),
            "summarize",
            "notes.read",
            RESOURCE,
            None,
        )
        .await
    {
        Answer::Refused(r) => assert!(r.error_description.unwrap().contains("audience")),
        Answer::Issued(_) => panic!("a token for another agent was accepted"),
    }
    // RS256 access tokens from the same IdP work too (alg bound to the RSA key).
    let rs = login(&mut idp, "bob", "urn:credbroker:agent:repo-helper:rsa");
    let rs_at = rs["access_token"].as_str().unwrap();
    let header: serde_json::Value = serde_json::from_slice(
        &credbroker::internals::jose::b64d(rs_at.split('.').next().unwrap(), "h").unwrap(),
    )
    .unwrap();
    assert_eq!(header["alg"], "RS256");
    match b
        .derive(&k, rs_at, "summarize", "notes.read", RESOURCE, None)
        .await
    {
        Answer::Issued(t) => assert_eq!(claims(t.access_token.expose())["sub"], "bob"),
        Answer::Refused(r) => panic!("RS256 access token refused: {r:?}"),
    }
    // Positive control: the quick-start issuer still works beside the IdP.
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn untrusted_idp_is_refused_then_trusted_one_accepted() {
    let (mut trusted, _c1) = idp();
    let (mut stranger, _c2) = idp();
    let b = broker_trusting(trusted.hello["issuer"].as_str().unwrap());
    let k = key();
    let foreign = login(&mut stranger, "alice", AGENT_RESOURCE);
    match b
        .derive(
            &k,
            foreign["access_token"].as_str().unwrap(),
            "summarize",
            "notes.read",
            RESOURCE,
            None,
        )
        .await
    {
        Answer::Refused(r) => assert!(r.error_description.unwrap().contains("not trusted")),
        Answer::Issued(_) => panic!("a token from an untrusted issuer was accepted"),
    }
    let good = login(&mut trusted, "alice", AGENT_RESOURCE);
    assert!(matches!(
        b.derive(
            &k,
            good["access_token"].as_str().unwrap(),
            "summarize",
            "notes.read",
            RESOURCE,
            None
        )
        .await,
        Answer::Issued(_)
    ));
}
