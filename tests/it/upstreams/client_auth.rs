//! The broker as a client of the organisation's AS: its client key (its own
//! ring, published at `{issuer}/.well-known/client-jwks.json`, never in
//! `/.well-known/jwks.json`), `client_auth = "private_key_jwt"` (RFC 7523
//! client assertions in the draft-ietf-oauth-rfc7523bis shape) and actor
//! tokens, against oidc-provider (`tests/peers/org-as.mjs`) with a client
//! registered for `private_key_jwt` whose `jwks_uri` is the broker's client
//! JWKS. Each negative case is followed by its positive control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::{b64d, Es256Key};
use serde_json::{json, Value};

use crate::support::*;

const ORG_RESOURCE: &str = "https://org-api.example/notes";
const SECRET: &str = "org-client-secret-not-a-canary";

pub(super) struct Org {
    pub(super) peer: NodePeer,
    _cfg: tempfile::NamedTempFile,
    issuer: String,
    token_endpoint: String,
}

impl Org {
    pub(super) fn start(auth_method: &str) -> Org {
        let f = tempfile::NamedTempFile::new().unwrap();
        let cfg = json!({
            "client_id": "credbroker", "client_secret": SECRET, "audience": "repo-helper",
            "auth_method": auth_method,
            "resources": { ORG_RESOURCE: { "scope": "notes:read notes:write" } },
        });
        std::fs::write(f.path(), cfg.to_string()).unwrap();
        let peer = NodePeer::start("org-as.mjs", &[f.path().to_str().unwrap()]);
        Org {
            issuer: peer.hello["issuer"].as_str().unwrap().to_owned(),
            token_endpoint: peer.hello["token_endpoint"].as_str().unwrap().to_owned(),
            peer,
            _cfg: f,
        }
    }

    fn subject(&mut self) -> String {
        let r = self
            .peer
            .call(&json!({"cmd": "subject", "sub": "alice", "ttl": 3600}));
        r["token"].as_str().unwrap().to_owned()
    }

    /// Points the client's `jwks_uri` at `b`'s client JWKS.
    pub(super) fn trust_client_jwks_of(&mut self, b: &TestBroker) {
        let url = format!("{}/.well-known/client-jwks.json", b.public);
        let r = self.peer.call(&json!({"cmd": "client_jwks", "url": url}));
        assert_eq!(r["ok"], true);
    }

    pub(super) fn assertions(&mut self) -> Value {
        self.peer.call(&json!({"cmd": "assertions"}))
    }
}

/// A broker with the exchange resource at upstream `org`; `client` is the
/// `[upstreams.org]` lines of the client's authentication, `extra` more.
pub(super) fn broker(org: &Org, client: &str, edit: Option<fn(String) -> String>) -> TestBroker {
    let policy = format!(
        r#"{}
[resources."{ORG_RESOURCE}"]
source = "exchange"
upstream = "org"

[tools."org.notes"]
resource = "{ORG_RESOURCE}"
scopes = ["notes:read", "notes:write"]
steps = ["summarize"]
"#,
        policy_without_approval()
    );
    let iss = &org.issuer;
    let opts = Opts {
        policy: Some(policy),
        edit_config: edit,
        extra_config: format!(
            r#"
[[trusted_issuers]]
issuer = "{iss}"
jwks_uri = "{iss}/jwks"
sign_in = {{ kind = "oidc", client_id = "credbroker" }}

[upstreams.org]
issuer = "{iss}"
client_id = "credbroker"
{client}
subject_issuers = ["{iss}"]
timeout = "2s"
"#
        ),
        ..Opts::default()
    };
    let (dir, config) = prepare(&opts);
    let secret = dir.path().join("org-secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    TestBroker::spawn(dir, config, None)
}

pub(super) const PKJWT: &str = "client_auth = \"private_key_jwt\"";
const BASIC: &str = "client_secret_file = \"org-secret\"";

fn derive(b: &TestBroker, org: &Org, k: &Es256Key, subject: &str) -> HttpAnswer {
    let body = json!({
        "subject_token": subject, "step": "summarize", "tool": "org.notes",
        "resource": ORG_RESOURCE, "scope": "notes:read",
        "upstream_proofs": { "org": make_proof(k, "POST", &org.token_endpoint, now(), None, None).unwrap() },
    });
    b.post_derive(&body, Some(&b.proof(k)))
}

fn part(jwt: &str, i: usize) -> Value {
    serde_json::from_slice(&b64d(jwt.split('.').nth(i).unwrap(), "part").unwrap()).unwrap()
}

pub(super) async fn get_json(url: &str) -> (u16, Value) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub(super) fn kids(jwks: &Value) -> Vec<String> {
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn private_key_jwt_authenticates_with_the_client_key_the_as_fetches_from_its_own_url() {
    let mut org = Org::start("private_key_jwt");
    let k = key();
    let subject = org.subject();

    // Negative: a client secret where the AS registered private_key_jwt:
    // the AS says invalid_client, the operator's fault (503), not the caller's.
    let basic = broker(&org, BASIC, None);
    let a = derive(&basic, &org, &k, &subject);
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.json()["reason"], "upstream_misconfigured");
    drop(basic);

    // Positive control: private_key_jwt, the AS fetching the client JWKS.
    let b = broker(&org, PKJWT, None);
    org.trust_client_jwks_of(&b);
    let (status, client_jwks) =
        get_json(&format!("{}/.well-known/client-jwks.json", b.public)).await;
    assert_eq!(status, 200);
    let client_kids = kids(&client_jwks);
    assert_eq!(client_kids.len(), 1);
    let signing: Value = serde_json::from_slice(&b.jwks().await).unwrap();
    assert!(
        !kids(&signing).contains(&client_kids[0]),
        "the client key is never in the token JWKS"
    );
    let a = derive(&b, &org, &k, &subject);
    assert_eq!(a.status, 200, "{} {}", a.body, org.assertions());
    let checked = org.assertions();
    assert_eq!(checked["verified"], 1, "{checked}");
    assert_eq!(checked["refused"], json!([]), "{checked}");

    // What was sent: the assertion in the rfc7523bis shape, no secret.
    let last = org.peer.call(&json!({"cmd": "last"}));
    let form = &last["form"];
    assert_eq!(
        form["client_assertion_type"],
        json!(["urn:ietf:params:oauth:client-assertion-type:jwt-bearer"])
    );
    assert!(form.get("client_secret").is_none());
    let assertion = form["client_assertion"][0].as_str().unwrap().to_owned();
    let (h, c) = (part(&assertion, 0), part(&assertion, 1));
    assert_eq!(h["typ"], "client-authentication+jwt");
    assert_eq!(h["alg"], "ES256");
    assert_eq!(h["kid"], client_kids[0].as_str());
    assert_eq!(c["iss"], "credbroker");
    assert_eq!(c["sub"], "credbroker");
    assert_eq!(c["aud"], org.issuer.as_str(), "the AS's issuer only");
    assert!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap() <= 60);

    // A second derive: a new assertion (a new jti), accepted again.
    let a = derive(&b, &org, &k, &subject);
    assert_eq!(a.status, 200, "{}", a.body);
    let again = org.peer.call(&json!({"cmd": "last"}))["form"]["client_assertion"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(part(&again, 1)["jti"], c["jti"]);
    assert_eq!(org.assertions()["verified"], 2);
    // No assertion or secret in the log or the audit.
    let log = b.log_text();
    assert!(!log.contains(&assertion) && !log.contains(&again));
    assert!(!std::fs::read_to_string(b.path("data/audit.jsonl"))
        .unwrap()
        .contains(&assertion));
}

#[tokio::test]
async fn a_rotated_client_key_is_published_first_and_then_signs_the_assertions() {
    let mut org = Org::start("private_key_jwt");
    let b = broker(
        &org,
        PKJWT,
        Some(|t| t.replace("[keys]\n", "[keys]\nactivation_delay = 0\n")),
    );
    org.trust_client_jwks_of(&b);
    let url = format!("{}/.well-known/client-jwks.json", b.public);
    let before = kids(&get_json(&url).await.1);
    assert_eq!(before.len(), 1);

    // Through the running instance's admin socket, as `keys rotate` does.
    let out = std::process::Command::new(bin())
        .args(["keys", "rotate-client", "--config"])
        .arg(&b.config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let r: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(r["running"], true);
    assert_eq!(r["added"], true);
    let new = r["kid"].as_str().unwrap().to_owned();
    assert_ne!(new, before[0]);
    // Delay 0: the new key signs now, the old one stays published.
    let after = kids(&get_json(&url).await.1);
    assert_eq!(after, vec![new.clone(), before[0].clone()]);
    let signing: Value = serde_json::from_slice(&b.jwks().await).unwrap();
    assert!(!kids(&signing).contains(&new));
    let event = b
        .audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "client_keys.rotated")
        .expect("client_keys.rotated");
    assert_eq!(event["kid"], new.as_str());
    assert_eq!(event["retired_kid"], before[0].as_str());
    assert_eq!(event["outcome"], "scheduled");

    // The AS, fetching the client JWKS, verifies the new key's assertion.
    let k = key();
    let subject = org.subject();
    let a = derive(&b, &org, &k, &subject);
    assert_eq!(a.status, 200, "{}", a.body);
    let last = org.peer.call(&json!({"cmd": "last"}));
    let assertion = last["form"]["client_assertion"][0].as_str().unwrap();
    assert_eq!(part(assertion, 0)["kid"], new.as_str());
    assert_eq!(org.assertions()["verified"], 1);
}

#[tokio::test]
async fn an_actor_token_reaches_the_as_verified_and_is_no_access_token_here() {
    let mut org = Org::start("client_secret_basic");
    let k = key();
    let subject = org.subject();

    // Without actor_token, nothing of the kind is sent.
    let plain = broker(&org, BASIC, None);
    org.trust_client_jwks_of(&plain);
    let a = derive(&plain, &org, &k, &subject);
    assert_eq!(a.status, 200, "{}", a.body);
    let last = org.peer.call(&json!({"cmd": "last"}));
    assert!(last["form"].get("actor_token").is_none(), "{last}");
    assert_eq!(
        org.peer.call(&json!({"cmd": "actor"}))["claims"],
        Value::Null
    );
    drop(plain);

    let b = broker(&org, &format!("{BASIC}\nactor_token = true"), None);
    org.trust_client_jwks_of(&b);
    let a = derive(&b, &org, &k, &subject);
    assert_eq!(a.status, 200, "{}", a.body);
    // The AS's handler verified it against the client JWKS.
    let claims = org.peer.call(&json!({"cmd": "actor"}))["claims"].clone();
    assert_eq!(claims["sub"], "repo-helper", "{claims}");
    assert_eq!(claims["tool"], "org.notes");
    assert_eq!(claims["step"], "summarize");
    assert_eq!(claims["aud"], org.issuer.as_str());
    assert_eq!(claims["iss"], b.issuer.as_str());
    assert!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap() <= 60);
    let last = org.peer.call(&json!({"cmd": "last"}));
    assert_eq!(
        last["form"]["actor_token_type"],
        json!(["urn:ietf:params:oauth:token-type:jwt"])
    );
    let actor = last["form"]["actor_token"][0].as_str().unwrap().to_owned();
    assert_eq!(part(&actor, 0)["typ"], "credbroker-actor+jwt");

    // It is no access token here: a resource server verifying with the
    // broker's JWKS refuses it, while it accepts the broker's own token
    // (the positive control) ...
    let verify = |token: &str, aud: &str| {
        json!({
            "token": token, "issuer": b.issuer, "audience": aud,
            "jwks_uri": format!("{}/.well-known/jwks.json", b.public),
        })
    };
    assert!(jose("verify-token", verify(&actor, &org.issuer))
        .await
        .is_err());
    let own = b.derive_ok(&k).await;
    jose(
        "verify-token",
        verify(own.access_token.expose(), "http://127.0.0.1:9090/notes"),
    )
    .await
    .expect("the broker's own token verifies");
    // ... and the broker refuses it as a subject token.
    let a = b.post_derive(
        &json!({"subject_token": actor, "step": "summarize", "tool": "org.notes",
                "resource": ORG_RESOURCE, "scope": "notes:read"}),
        Some(&b.proof(&k)),
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(!b.log_text().contains(&actor));
}

#[tokio::test]
async fn a_subject_token_without_the_upstreams_subject_audience_is_never_sent() {
    let mut org = Org::start("client_secret_basic");
    let k = key();
    let subject = org.subject(); // aud "repo-helper"
    let sent = org.peer.call(&json!({"cmd": "count"}))["exchanges"]
        .as_i64()
        .unwrap();
    let b = broker(
        &org,
        &format!("{BASIC}\nsubject_audience = \"org-token-exchange\""),
        None,
    );
    let a = derive(&b, &org, &k, &subject);
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.json()["error"], "invalid_request");
    assert!(a.body.contains("subject_audience"), "{}", a.body);
    assert_eq!(
        org.peer.call(&json!({"cmd": "count"}))["exchanges"],
        sent,
        "nothing was sent"
    );
    drop(b);
    // Positive control: the audience the token names.
    let b = broker(
        &org,
        &format!("{BASIC}\nsubject_audience = \"repo-helper\""),
        None,
    );
    let a = derive(&b, &org, &k, &subject);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        org.peer.call(&json!({"cmd": "count"}))["exchanges"],
        sent + 1
    );
}
