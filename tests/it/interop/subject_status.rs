//! Subject-token status (`[[trusted_issuers]]` `introspection_*`): RFC 7662
//! introspection at a real IdP (panva's oidc-provider, issuing opaque
//! access tokens it stores, with its introspection and RFC 7009 revocation
//! endpoints). A revoked token goes inactive and is refused once the short
//! cache has let it go; introspection that cannot answer refuses (fail
//! closed). Each negative case is followed by its positive control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

use crate::support::oidc::secret_file;
use crate::support::*;

const OPAQUE: &str = "urn:credbroker:agent:repo-helper";
const JWT: &str = "urn:credbroker:agent:repo-helper:jwt";
const ORCHESTRATOR_SECRET: &str = "orchestrator-secret-not-a-canary";
const RS_SECRET: &str = "introspection-secret-not-a-canary";

fn idp() -> (NodePeer, tempfile::NamedTempFile) {
    oidc_provider(&json!({
        "introspection": true,
        "clients": [
            {
                "client_id": "orchestrator", "client_secret": ORCHESTRATOR_SECRET,
                "redirect_uris": ["http://127.0.0.1:1/cb"],
                "grant_types": ["authorization_code"], "response_types": ["code"],
            },
            {
                // The broker's client at the IdP, for introspection only.
                "client_id": "credbroker-rs", "client_secret": RS_SECRET,
                "redirect_uris": [], "grant_types": [], "response_types": [],
            },
        ],
        "resources": {
            OPAQUE: {"audience": "repo-helper", "scope": "agent", "format": "opaque"},
            JWT: {"audience": "repo-helper", "scope": "agent"},
        },
    }))
}

fn login(idp: &mut NodePeer, user: &str, resource: &str) -> String {
    let r = idp.call(&json!({
        "cmd": "login", "user": user, "client_id": "orchestrator",
        "client_secret": ORCHESTRATOR_SECRET,
        "redirect_uri": "http://127.0.0.1:1/cb", "scope": "openid agent", "resource": resource,
    }));
    assert!(r.get("error").is_none(), "IdP login failed: {r}");
    r["tokens"]["access_token"].as_str().unwrap().to_owned()
}

fn introspections(idp: &mut NodePeer) -> i64 {
    idp.call(&json!({"cmd": "introspections"}))["n"]
        .as_i64()
        .unwrap()
}

/// A broker trusting the IdP, asking it about subject tokens with `more`.
fn broker(issuer: &str, more: &str) -> TestBroker {
    let opts = Opts {
        extra_config: format!(
            r#"
[[trusted_issuers]]
issuer = "{issuer}"
jwks_uri = "{issuer}/jwks"
algs = ["ES256", "RS256"]
sign_in = {{ kind = "oidc", client_id = "credbroker" }}
introspection_endpoint = "{issuer}/token/introspection"
introspection_client_id = "credbroker-rs"
introspection_client_secret_file = "rs-secret"
{more}
"#
        ),
        ..Opts::default()
    };
    let (dir, config) = prepare(&opts);
    secret_file(dir.path(), "rs-secret", RS_SECRET);
    TestBroker::spawn(dir, config, None)
}

fn derive(b: &TestBroker, k: &Es256Key, subject: &str) -> HttpAnswer {
    b.post_derive(
        &json!({"subject_token": subject, "step": "summarize", "tool": "notes.read",
                "resource": RESOURCE}),
        Some(&b.proof(k)),
    )
}

fn issued_to(a: &HttpAnswer, who: &str, issuer: &str) {
    assert_eq!(a.status, 200, "{}", a.body);
    let t = a.json()["access_token"].as_str().unwrap().to_owned();
    let p = t.split('.').nth(1).unwrap();
    let c: Value =
        serde_json::from_slice(&credbroker::internals::jose::b64d(p, "p").unwrap()).unwrap();
    assert_eq!(c["sub"], who);
    assert_eq!(c["subject_iss"], issuer);
}

#[tokio::test]
async fn a_revoked_opaque_subject_token_is_refused_once_the_short_cache_lets_it_go() {
    let (mut idp, _cfg) = idp();
    let issuer = idp.hello["issuer"].as_str().unwrap().to_owned();
    let b = broker(&issuer, "introspection_cache_ttl = \"1s\"");
    let k = key();
    let token = login(&mut idp, "alice", OPAQUE);
    assert!(!token.contains('.'), "an opaque token: {token}");

    // Accepted through introspection: the person is the IdP's alice.
    let n = introspections(&mut idp);
    issued_to(&derive(&b, &k, &token), "alice", &issuer);
    assert_eq!(introspections(&mut idp), n + 1);
    // Within the cache: not asked again (in memory, no call).
    issued_to(&derive(&b, &k, &token), "alice", &issuer);
    assert_eq!(introspections(&mut idp), n + 1);

    // The orchestrator's token is revoked at the IdP (RFC 7009).
    let r = idp.call(
        &json!({"cmd": "revoke", "token": token, "client_id": "orchestrator",
                             "client_secret": ORCHESTRATOR_SECRET}),
    );
    assert_eq!(r["status"], 200, "{r}");
    // Past the 1 s cache the IdP is asked again: inactive, refused.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let a = derive(&b, &k, &token);
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.error(), "invalid_request");
    assert!(a.body.contains("not active at its issuer"), "{}", a.body);
    assert!(!a.body.contains(&token));
    assert_eq!(introspections(&mut idp), n + 2);
    // Positive control: her new token is accepted.
    let fresh = login(&mut idp, "alice", OPAQUE);
    issued_to(&derive(&b, &k, &fresh), "alice", &issuer);
    // A JWT of the same IdP is not introspected (off for JWTs by
    // default): accepted by its signature alone.
    let n = introspections(&mut idp);
    let jwt = login(&mut idp, "bob", JWT);
    issued_to(&derive(&b, &k, &jwt), "bob", &issuer);
    assert_eq!(introspections(&mut idp), n, "a JWT is not introspected");
    assert!(!b.log_text().contains(RS_SECRET));
}

#[tokio::test]
async fn introspection_that_cannot_answer_refuses_the_derive() {
    let (mut idp, _cfg) = idp();
    let issuer = idp.hello["issuer"].as_str().unwrap().to_owned();
    // No cache: each derive asks.
    let b = broker(&issuer, "introspection_cache_ttl = \"0s\"");
    let k = key();
    let token = login(&mut idp, "alice", OPAQUE);
    idp.call(&json!({"cmd": "introspection", "fail": true}));
    let a = derive(&b, &k, &token);
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.error(), "temporarily_unavailable");
    assert_eq!(a.json()["reason"], "introspection_unavailable");
    assert!(a.header("retry-after").is_some());
    assert!(a.json().get("access_token").is_none());
    idp.call(&json!({"cmd": "introspection", "fail": false}));
    issued_to(&derive(&b, &k, &token), "alice", &issuer);

    // introspect_jwts: this IdP does not introspect its JWTs (oidc-provider
    // answers unsupported_token_type), so a JWT cannot be shown active:
    // refused, never let through on its signature.
    let strict = broker(&issuer, "introspect_jwts = true");
    let jwt = login(&mut idp, "alice", JWT);
    let a = derive(&strict, &k, &jwt);
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.json()["reason"], "introspection_unavailable");
    // Control: the same broker takes the opaque token it can ask about.
    issued_to(&derive(&strict, &k, &token), "alice", &issuer);
}
