//! `source = "exchange"` against a real authorization server:
//! oidc-provider with the RFC 8693 grant (`tests/peers/org-as.mjs`), which
//! checks the relayed DPoP proof with jose and binds its token to that key.
//! Each negative case is followed by its positive control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

use crate::support::*;

pub(super) const ORG_RESOURCE: &str = "https://org-api.example/notes";
pub(super) const SECRET: &str = "org-client-secret-not-a-canary";

pub(super) struct Org {
    pub(super) peer: NodePeer,
    _cfg: tempfile::NamedTempFile,
    pub(super) issuer: String,
    pub(super) token_endpoint: String,
}

impl Org {
    pub(super) fn start() -> Org {
        Org::start_for(json!({ ORG_RESOURCE: { "scope": "notes:read notes:write" } }))
    }

    /// An org AS that issues tokens for `resources` (its config's member).
    pub(super) fn start_for(resources: Value) -> Org {
        let f = tempfile::NamedTempFile::new().unwrap();
        let cfg = json!({
            "client_id": "credbroker", "client_secret": SECRET, "audience": "repo-helper",
            "resources": resources,
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

    pub(super) fn subject(&mut self, ttl: i64) -> String {
        self.subject_of("alice", ttl)
    }

    /// A subject token for `sub`, `ttl` seconds long.
    pub(super) fn subject_of(&mut self, sub: &str, ttl: i64) -> String {
        let r = self
            .peer
            .call(&json!({"cmd": "subject", "sub": sub, "ttl": ttl}));
        r["token"].as_str().unwrap().to_owned()
    }

    pub(super) fn mode(&mut self, mode: &str) {
        assert_eq!(
            self.peer.call(&json!({"cmd": "mode", "mode": mode}))["ok"],
            true
        );
    }

    pub(super) fn exchanges(&mut self) -> i64 {
        self.peer.call(&json!({"cmd": "count"}))["exchanges"]
            .as_i64()
            .unwrap()
    }
}

/// A broker whose policy adds an exchange resource at upstream `org`,
/// trusting the org AS as a subject-token issuer.
fn broker(org: &Org) -> TestBroker {
    broker_with(org, &org.issuer)
}

/// [`broker`] with `upstream_issuer` as `upstreams.org.issuer`.
fn broker_with(org: &Org, upstream_issuer: &str) -> TestBroker {
    broker_config(org, upstream_issuer, "")
}

/// The exchange policy (the default one plus the `org.notes` tool).
pub(super) fn exchange_policy() -> String {
    format!(
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
    )
}

/// [`broker_with`] with `more` added to `[upstreams.org]`.
pub(super) fn broker_config(org: &Org, upstream_issuer: &str, more: &str) -> TestBroker {
    broker_policy(org, upstream_issuer, more, exchange_policy())
}

/// [`broker_config`] with `policy`.
pub(super) fn broker_policy(
    org: &Org,
    upstream_issuer: &str,
    more: &str,
    policy: String,
) -> TestBroker {
    let iss = &org.issuer;
    let opts = Opts {
        policy: Some(policy),
        extra_config: format!(
            r#"
[[trusted_issuers]]
issuer = "{iss}"
jwks_uri = "{iss}/jwks"
sign_in = {{ kind = "oidc", client_id = "credbroker" }}

[upstreams.org]
issuer = "{upstream_issuer}"
client_id = "credbroker"
client_secret_file = "org-secret"
subject_issuers = ["{iss}"]
timeout = "2s"
{more}
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

/// A proof by `k` for `htu` (the relayed one when `htu` is the AS's token
/// endpoint).
pub(super) fn proof(k: &Es256Key, htu: &str) -> String {
    make_proof(k, "POST", htu, now(), None, None).unwrap()
}

/// `POST /v1/derive` for the exchange resource with `relayed` as the
/// upstream proof (none: no `upstream_proofs`).
pub(super) fn derive(
    b: &TestBroker,
    k: &Es256Key,
    subject: &str,
    relayed: Option<&str>,
) -> HttpAnswer {
    let mut body = json!({
        "subject_token": subject, "step": "summarize", "tool": "org.notes",
        "resource": ORG_RESOURCE, "scope": "notes:read",
    });
    if let Some(p) = relayed {
        body["upstream_proofs"] = json!({ "org": p });
    }
    b.post_derive(&body, Some(&b.proof(k)))
}

/// The positive control: a fresh relayed proof, 200.
fn derive_ok(b: &TestBroker, org: &Org, k: &Es256Key, subject: &str) -> Value {
    let a = derive(b, k, subject, Some(&proof(k, &org.token_endpoint)));
    assert_eq!(a.status, 200, "positive control refused: {}", a.body);
    a.json()
}

pub(super) fn claims(token: &str) -> Value {
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&credbroker::internals::jose::b64d(p, "p").unwrap()).unwrap()
}

fn refused(a: &HttpAnswer, status: u16, reason: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.json()["reason"], reason, "{}", a.body);
}

#[tokio::test]
async fn exchanged_token_is_the_org_as_token_bound_to_the_tools_key() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let subject = org.subject(3600);

    // The socket publishes where the relayed proof goes.
    let info: Value = serde_json::from_str(
        &b.http(b"GET /v1/info HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .body,
    )
    .unwrap();
    assert_eq!(
        info["upstreams"]["org"]["token_endpoint"],
        org.token_endpoint.as_str()
    );
    assert_eq!(info["upstream_resources"][ORG_RESOURCE], "org");

    let answer = derive_ok(&b, &org, &k, &subject);
    assert_eq!(answer["token_type"], "DPoP");
    assert_eq!(answer["scope"], "notes:read");
    assert!(answer.get("refresh_token").is_none());
    let token = answer["access_token"].as_str().unwrap();
    let c = claims(token);
    assert_eq!(
        c["iss"],
        org.issuer.as_str(),
        "the org AS's token, not the broker's"
    );
    assert_eq!(c["cnf"]["jkt"], k.thumbprint());
    assert_eq!(c["aud"], ORG_RESOURCE);
    assert_eq!(c["scope"], "notes:read", "exactly the granted scope");
    assert!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap() <= 300);
    // A resource server that trusts only the org AS's keys accepts it.
    let checked = jose(
        "verify-token",
        json!({
            "token": token, "issuer": org.issuer, "audience": ORG_RESOURCE,
            "jwks_uri": format!("{}/jwks", org.issuer),
            "required_claims": ["iss", "sub", "aud", "exp", "iat", "jti", "cnf", "scope"],
        }),
    )
    .await
    .expect("jose accepts the exchanged token");
    assert_eq!(checked["claims"]["sub"], "alice");
    // The event names the upstream, the token's expiry and its jti's hash,
    // never the token.
    let issued = b
        .audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "derive.issued")
        .unwrap();
    assert_eq!(issued["upstream"], "org");
    assert_eq!(issued["expires_at"], c["exp"]);
    assert_eq!(
        issued["jti_sha256"],
        credbroker::internals::jose::sha256_hex(c["jti"].as_str().unwrap().as_bytes())
    );
    assert!(!issued.to_string().contains(token));
    // What was sent: the granted scope, the resource, an access token
    // asked for, the client secret in the Authorization header only.
    let last = org.peer.call(&json!({"cmd": "last"}));
    assert_eq!(last["form"]["scope"], json!(["notes:read"]));
    assert_eq!(last["form"]["resource"], json!([ORG_RESOURCE]));
    assert_eq!(
        last["form"]["requested_token_type"],
        json!(["urn:ietf:params:oauth:token-type:access_token"])
    );
    assert!(last["form"].get("client_secret").is_none());

    // A refresh token in the AS's answer is dropped.
    org.mode("with_refresh");
    let answer = derive_ok(&b, &org, &k, &subject);
    assert!(answer.get("refresh_token").is_none(), "{answer}");
    assert!(!b.log_text().contains(SECRET));
}

#[tokio::test]
async fn relayed_proof_missing_or_wrong_is_refused_before_anything_is_sent() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let subject = org.subject(3600);
    let sent = org.exchanges();

    // None: the refusal names the htu to sign.
    let a = derive(&b, &k, &subject, None);
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], org.token_endpoint.as_str());
    let denied = b.audit_lines().pop().unwrap();
    assert_eq!(denied["event"], "derive.denied");
    assert_eq!(denied["reason"], "upstream_proof_required");
    assert_eq!(denied["upstream"], "org");
    // Another htu (the broker's own derive endpoint, a near miss).
    for htu in [
        b.htu(),
        format!("{}/", org.token_endpoint),
        format!("{}/token/x", org.issuer),
    ] {
        refused(
            &derive(&b, &k, &subject, Some(&proof(&k, &htu))),
            400,
            "upstream_proof_invalid",
        );
    }
    // Another key than the derive proof's.
    refused(
        &derive(&b, &k, &subject, Some(&proof(&key(), &org.token_endpoint))),
        400,
        "upstream_proof_invalid",
    );
    // With an ath.
    let with_ath = make_proof(&k, "POST", &org.token_endpoint, now(), Some("tok"), None).unwrap();
    refused(
        &derive(&b, &k, &subject, Some(&with_ath)),
        400,
        "upstream_proof_invalid",
    );
    // Another method.
    let get = make_proof(&k, "GET", &org.token_endpoint, now(), None, None).unwrap();
    refused(
        &derive(&b, &k, &subject, Some(&get)),
        400,
        "upstream_proof_invalid",
    );
    // Stale.
    let old = make_proof(&k, "POST", &org.token_endpoint, now() - 600, None, None).unwrap();
    refused(
        &derive(&b, &k, &subject, Some(&old)),
        400,
        "upstream_proof_invalid",
    );
    assert_eq!(org.exchanges(), sent, "nothing reached the AS");

    // Positive control, then the same relayed proof replayed.
    let relayed = proof(&k, &org.token_endpoint);
    assert_eq!(derive(&b, &k, &subject, Some(&relayed)).status, 200);
    refused(
        &derive(&b, &k, &subject, Some(&relayed)),
        400,
        "upstream_proof_invalid",
    );
    assert_eq!(org.exchanges(), sent + 1);
    derive_ok(&b, &org, &k, &subject);
}

#[tokio::test]
async fn answers_failing_a_check_are_refused_never_handed_over() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let subject = org.subject(3600);
    for (mode, why) in [
        ("unbound", "no cnf.jkt"),
        ("bearer", "token_type is not DPoP"),
        ("wider_scope", "scope is not exactly the granted scopes"),
        ("two_aud", "aud is not exactly the configured audience"),
        ("long_life", "300 s"),
        ("other_key", "bound to another key"),
        ("refresh_type", "issued_token_type is not an access token"),
        ("opaque", "it is not a JWT"),
    ] {
        org.mode(mode);
        let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
        refused(&a, 502, "upstream_token_rejected");
        let said = a.json()["error_description"].as_str().unwrap().to_owned();
        assert!(said.contains(why), "{mode}: {said}");
        assert!(!a.body.contains("eyJ"), "{mode}: no token in the refusal");
        org.mode("ok");
        derive_ok(&b, &org, &k, &subject);
    }
    // A token outliving the subject token: the AS answers 300 s for a
    // subject token with 120 s left.
    let short = org.subject(120);
    org.mode("past_subject");
    let a = derive(&b, &k, &short, Some(&proof(&k, &org.token_endpoint)));
    refused(&a, 502, "upstream_token_rejected");
    assert!(a.body.contains("outlives the subject token"), "{}", a.body);
    org.mode("ok");
    let ok = derive_ok(&b, &org, &k, &short);
    assert!(ok["expires_in"].as_i64().unwrap() <= 120, "{ok}");
}

#[tokio::test]
async fn as_failures_become_errors_the_orchestrator_can_act_on() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let subject = org.subject(3600);
    for (mode, status, reason) in [
        ("error500", 503, "upstream_unavailable"),
        ("hang", 503, "upstream_unavailable"),
        ("html", 502, "upstream_bad_answer"),
        ("redirect", 502, "upstream_bad_answer"),
        ("big", 502, "upstream_bad_answer"),
        ("invalid_grant", 400, "subject_token_rejected_upstream"),
        ("invalid_scope", 403, "upstream_denied"),
        ("invalid_client", 503, "upstream_misconfigured"),
    ] {
        org.mode(mode);
        let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
        refused(&a, status, reason);
        if reason == "upstream_unavailable" {
            assert!(a.header("retry-after").is_some(), "{mode}");
        }
        if reason == "upstream_denied" {
            assert_eq!(a.json()["upstream_error"], "invalid_scope");
        }
        org.mode("ok");
        derive_ok(&b, &org, &k, &subject);
    }
    // Every exchange sent is counted by its outcome.
    for (outcome, n) in [
        ("issued", 8.0),
        ("unavailable", 2.0),
        ("bad_answer", 3.0),
        ("refused", 3.0),
    ] {
        assert_eq!(
            b.metric(&format!(
                "credbroker_upstream_exchanges_total{{outcome=\"{outcome}\",upstream=\"org\"}}"
            )),
            Some(n),
            "{outcome}: {}",
            b.metrics()
        );
    }
    // The operator's fault is logged naming the upstream.
    assert!(
        b.log_text().contains("upstream=org") || b.log_text().contains("upstream: org"),
        "{}",
        b.log_text()
    );
}

#[tokio::test]
async fn a_subject_token_from_an_unlisted_issuer_is_never_sent() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let sent = org.exchanges();
    // The quick start's dev issuer is trusted, but not listed for `org`.
    let dev = b.subject_token("alice");
    let a = derive(&b, &k, &dev, Some(&proof(&k, &org.token_endpoint)));
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.error(), "invalid_request");
    assert!(a.json()["error_description"]
        .as_str()
        .unwrap()
        .contains("not listed"));
    assert_eq!(org.exchanges(), sent, "nothing was sent");
    // The same issuer's token still gets a `self` token (its own path)...
    b.derive_ok(&k).await;
    // ...and the listed issuer's token the exchanged one.
    let subject = org.subject(3600);
    derive_ok(&b, &org, &k, &subject);
}

#[tokio::test]
async fn an_as_nonce_is_relayed_to_the_client_published_and_checked_before_sending() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let subject = org.subject(3600);
    org.mode("nonce");
    // A proof without the AS's nonce: the AS says use_dpop_nonce, and the
    // refusal carries the htu and the nonce to sign.
    let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], org.token_endpoint.as_str());
    let nonce = a.json()["upstream_nonce"].as_str().unwrap().to_owned();
    // /v1/info publishes it too, for the next client.
    let info: Value = serde_json::from_str(
        &b.http(b"GET /v1/info HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .body,
    )
    .unwrap();
    assert_eq!(info["upstreams"]["org"]["dpop_nonce"], nonce.as_str());
    // A proof with it is accepted.
    let with_nonce =
        make_proof(&k, "POST", &org.token_endpoint, now(), None, Some(&nonce)).unwrap();
    let a = derive(&b, &k, &subject, Some(&with_nonce));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        claims(a.json()["access_token"].as_str().unwrap())["cnf"]["jkt"],
        k.thumbprint()
    );

    // Now that the broker knows the AS's nonce, a relayed proof without it
    // is refused before anything is sent, naming the htu and the nonce.
    let sent = org.exchanges();
    let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], org.token_endpoint.as_str());
    assert_eq!(a.json()["upstream_nonce"], nonce.as_str());
    assert_eq!(org.exchanges(), sent, "nothing sent");
    // The AS moves to a new nonce: the first proof with the old one is sent
    // (the broker cannot know yet), the AS refuses it and the broker learns
    // the new nonce from its DPoP-Nonce.
    let new = org.peer.call(&json!({"cmd": "new_nonce"}))["nonce"]
        .as_str()
        .unwrap()
        .to_owned();
    let te = org.token_endpoint.clone();
    let stale = || make_proof(&k, "POST", &te, now(), None, Some(&nonce)).unwrap();
    let a = derive(&b, &k, &subject, Some(&stale()));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_nonce"], new.as_str());
    assert_eq!(org.exchanges(), sent + 1);
    // From then on a proof with the stale nonce is refused here, nothing
    // sent; and the positive control, the new nonce, is served.
    let a = derive(&b, &k, &subject, Some(&stale()));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_nonce"], new.as_str());
    assert_eq!(org.exchanges(), sent + 1, "nothing sent");
    let fresh = make_proof(&k, "POST", &org.token_endpoint, now(), None, Some(&new)).unwrap();
    let a = derive(&b, &k, &subject, Some(&fresh));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(org.exchanges(), sent + 2);
}

#[tokio::test]
async fn metadata_naming_another_issuer_is_refused_and_nothing_is_sent() {
    let mut org = Org::start();
    // The AS's metadata says `issuer` without the trailing slash configured
    // here: not the same identifier (RFC 8414 section 3.3).
    let b = broker_with(&org, &format!("{}/", org.issuer));
    let k = key();
    let subject = org.subject(3600);
    let sent = org.exchanges();
    let a = derive(&b, &k, &subject, Some(&proof(&k, &org.token_endpoint)));
    refused(&a, 503, "upstream_unavailable");
    assert!(a.header("retry-after").is_some());
    assert_eq!(org.exchanges(), sent, "nothing was sent");
    assert!(
        b.log_text().contains("the metadata names another issuer"),
        "{}",
        b.log_text()
    );
    // Control: the issuer as the AS names it.
    let good = broker(&org);
    derive_ok(&good, &org, &k, &subject);
}

#[tokio::test]
async fn the_token_endpoint_takes_the_relayed_proof_as_a_form_parameter() {
    let mut org = Org::start();
    let b = broker(&org);
    let k = key();
    let subject = org.subject(3600);
    let token_proof = || {
        make_proof(
            &k,
            "POST",
            &format!("{}/token", b.issuer),
            now(),
            None,
            None,
        )
        .unwrap()
    };
    let post = |relayed: Option<String>| {
        let mut pairs = vec![
            (
                "grant_type",
                "urn:ietf:params:oauth:grant-type:token-exchange".to_owned(),
            ),
            ("subject_token", subject.clone()),
            (
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token".to_owned(),
            ),
            ("resource", ORG_RESOURCE.to_owned()),
            ("scope", "notes:read".to_owned()),
            ("step", "summarize".to_owned()),
            ("tool", "org.notes".to_owned()),
        ];
        if let Some(r) = relayed {
            pairs.push(("upstream_proofs", r));
        }
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(a, v)| (*a, v.as_str())).collect();
        b.post_token(&pairs, Some(&token_proof()))
    };
    let sent = org.exchanges();
    // Without it: upstream_proof_required naming the htu, nothing sent.
    let a = post(None);
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], org.token_endpoint.as_str());
    // Not a JSON object of strings, or for another htu: refused, nothing
    // sent.
    let a = post(Some("org=abc".into()));
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.json()["error"], "invalid_request", "{}", a.body);
    let other = json!({ "org": proof(&k, &format!("{}/token", b.issuer)) }).to_string();
    refused(&post(Some(other)), 400, "upstream_proof_invalid");
    assert_eq!(org.exchanges(), sent);
    // The control: the JSON-encoded object with the AS's proof.
    let good = json!({ "org": proof(&k, &org.token_endpoint) }).to_string();
    let a = post(Some(good));
    assert_eq!(a.status, 200, "{}", a.body);
    let c = claims(a.json()["access_token"].as_str().unwrap());
    assert_eq!(c["iss"], org.issuer.as_str());
    assert_eq!(c["cnf"]["jkt"], k.thumbprint());
    assert_eq!(org.exchanges(), sent + 1);
}
