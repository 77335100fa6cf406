//! Identity chaining with the Identity Assertion JWT Authorization Grant
//! (`grant = "id_jag"`) against real peers: oidc-provider as the
//! organisation's IdP issuing ID-JAGs (`tests/peers/org-as.mjs`), and a
//! second oidc-provider as the resource's own AS redeeming them with the
//! jwt-bearer grant (`tests/peers/resource-as.mjs`); both check the relayed
//! DPoP proof with jose and bind what they issue to its key. The token is
//! verified with jose against the resource AS's JWKS only. Each negative
//! case is followed by its positive control.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

use crate::support::*;

pub(super) const CRM: &str = "https://crm.example/api";
const ORG_SECRET: &str = "org-client-secret-not-a-canary";
const CRM_SECRET: &str = "crm-client-secret-not-a-canary";
/// The broker's client id at the resource AS (the ID-JAG's `client_id`).
const CRM_CLIENT: &str = "credbroker-at-crm";

/// The two authorization servers.
pub(super) struct Chain {
    pub(super) org: NodePeer,
    pub(super) ras: NodePeer,
    _cfgs: [tempfile::NamedTempFile; 2],
    pub(super) org_issuer: String,
    pub(super) org_te: String,
    pub(super) ras_issuer: String,
    pub(super) ras_te: String,
}

impl Chain {
    pub(super) fn start() -> Chain {
        Chain::start_advertising(true)
    }

    /// With `advertise`: the IdP's metadata lists id-jag among its
    /// identity-chaining token types.
    pub(super) fn start_advertising(advertise: bool) -> Chain {
        let f1 = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f1.path(),
            json!({
                "client_id": "credbroker", "client_secret": ORG_SECRET, "audience": "repo-helper",
                "resources": {}, "advertise_id_jag": advertise,
            })
            .to_string(),
        )
        .unwrap();
        let mut org = NodePeer::start("org-as.mjs", &[f1.path().to_str().unwrap()]);
        let org_issuer = org.hello["issuer"].as_str().unwrap().to_owned();
        let f2 = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f2.path(),
            json!({
                "client_id": CRM_CLIENT, "client_secret": CRM_SECRET,
                "idp_issuer": org_issuer, "idp_jwks_uri": format!("{org_issuer}/jwks"),
                "resources": { CRM: { "scope": "crm:read crm:write" } },
            })
            .to_string(),
        )
        .unwrap();
        let ras = NodePeer::start("resource-as.mjs", &[f2.path().to_str().unwrap()]);
        let ras_issuer = ras.hello["issuer"].as_str().unwrap().to_owned();
        let r =
            org.call(&json!({"cmd": "id_jag", "audience": ras_issuer, "client_id": CRM_CLIENT}));
        assert_eq!(r["ok"], true);
        Chain {
            org_te: org.hello["token_endpoint"].as_str().unwrap().to_owned(),
            ras_te: ras.hello["token_endpoint"].as_str().unwrap().to_owned(),
            org,
            ras,
            _cfgs: [f1, f2],
            org_issuer,
            ras_issuer,
        }
    }

    pub(super) fn subject(&mut self) -> String {
        let r = self
            .org
            .call(&json!({"cmd": "subject", "sub": "alice", "ttl": 3600}));
        r["token"].as_str().unwrap().to_owned()
    }

    fn id_token(&mut self, aud: &str) -> String {
        let r = self
            .org
            .call(&json!({"cmd": "id_token", "sub": "alice", "aud": aud}));
        r["token"].as_str().unwrap().to_owned()
    }

    fn org_mode(&mut self, mode: &str) {
        let r = self.org.call(&json!({"cmd": "mode", "mode": mode}));
        assert_eq!(r["ok"], true);
    }

    pub(super) fn ras_mode(&mut self, mode: &str) {
        let r = self.ras.call(&json!({"cmd": "mode", "mode": mode}));
        assert_eq!(r["ok"], true);
    }

    /// Token requests each AS received so far: (IdP, resource AS).
    pub(super) fn counts(&mut self) -> (i64, i64) {
        let a = self.org.call(&json!({"cmd": "count"}))["exchanges"]
            .as_i64()
            .unwrap();
        let b = self.ras.call(&json!({"cmd": "count"}))["redemptions"]
            .as_i64()
            .unwrap();
        (a, b)
    }
}

/// The policy: the quick-start's, plus `crm.read` on the chained resource
/// (left out with `tool = false`).
fn policy(tool: bool) -> String {
    let mut p = format!(
        "{}\n[resources.\"{CRM}\"]\nsource = \"exchange\"\nupstream = \"org\"\n",
        policy_without_approval()
    );
    if tool {
        p.push_str(&format!(
            "\n[tools.\"crm.read\"]\nresource = \"{CRM}\"\nscopes = [\"crm:read\", \"crm:write\"]\nsteps = [\"summarize\"]\n"
        ));
    }
    p
}

/// A broker with `[upstreams.org]` the IdP (`grant = "id_jag"`) and
/// `[upstreams.crm]` the resource AS.
pub(super) fn broker(c: &Chain) -> TestBroker {
    let (org, ras) = (&c.org_issuer, &c.ras_issuer);
    let opts = Opts {
        policy: Some(policy(true)),
        extra_config: format!(
            r#"
[[trusted_issuers]]
issuer = "{org}"
jwks_uri = "{org}/jwks"
sign_in = {{ kind = "oidc", client_id = "credbroker" }}

[upstreams.org]
issuer = "{org}"
client_id = "credbroker"
client_secret_file = "org-secret"
subject_issuers = ["{org}"]
grant = "id_jag"
resource_upstream = "crm"
timeout = "5s"

[upstreams.crm]
issuer = "{ras}"
client_id = "{CRM_CLIENT}"
client_secret_file = "crm-secret"
timeout = "5s"
"#
        ),
        ..Opts::default()
    };
    let (dir, config) = prepare(&opts);
    for (file, secret) in [("org-secret", ORG_SECRET), ("crm-secret", CRM_SECRET)] {
        let p = dir.path().join(file);
        std::fs::write(&p, secret).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    TestBroker::spawn(dir, config, None)
}

fn proof(k: &Es256Key, htu: &str) -> String {
    make_proof(k, "POST", htu, now(), None, None).unwrap()
}

/// Fresh proofs by `k` for both legs.
fn proofs(c: &Chain, k: &Es256Key) -> Value {
    json!({ "org": proof(k, &c.org_te), "crm": proof(k, &c.ras_te) })
}

/// `POST /v1/derive` for `crm.read` with `upstream_proofs` = `relayed`.
fn derive(b: &TestBroker, k: &Es256Key, subject: &str, relayed: &Value) -> HttpAnswer {
    derive_as(b, k, subject, relayed, None)
}

fn derive_as(
    b: &TestBroker,
    k: &Es256Key,
    subject: &str,
    relayed: &Value,
    subject_type: Option<&str>,
) -> HttpAnswer {
    let mut body = json!({
        "subject_token": subject, "step": "summarize", "tool": "crm.read",
        "resource": CRM, "scope": "crm:read", "upstream_proofs": relayed,
    });
    if let Some(t) = subject_type {
        body["subject_token_type"] = t.into();
    }
    b.post_derive(&body, Some(&b.proof(k)))
}

/// The positive control: fresh proofs for both legs, 200.
fn derive_ok(b: &TestBroker, c: &Chain, k: &Es256Key, subject: &str) -> Value {
    let a = derive(b, k, subject, &proofs(c, k));
    assert_eq!(a.status, 200, "positive control refused: {}", a.body);
    a.json()
}

fn claims(token: &str) -> Value {
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&credbroker::internals::jose::b64d(p, "p").unwrap()).unwrap()
}

fn header(token: &str) -> Value {
    let p = token.split('.').next().unwrap();
    serde_json::from_slice(&credbroker::internals::jose::b64d(p, "h").unwrap()).unwrap()
}

fn refused(a: &HttpAnswer, status: u16, reason: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.json()["reason"], reason, "{}", a.body);
}

/// A resource server that trusts only the resource AS's keys.
pub(super) async fn verified_by_the_resource_as(c: &Chain, token: &str) -> Value {
    jose(
        "verify-token",
        json!({
            "token": token, "issuer": c.ras_issuer, "audience": CRM,
            "jwks_uri": format!("{}/jwks", c.ras_issuer),
            "required_claims": ["iss", "sub", "aud", "exp", "iat", "jti", "cnf", "scope"],
        }),
    )
    .await
    .expect("jose accepts the resource AS's token")
}

#[tokio::test]
async fn the_token_is_the_resource_as_token_bound_to_the_tools_key() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let subject = c.subject();

    // Both legs' token endpoints are published, so a client makes both
    // proofs the first time.
    let info: Value = serde_json::from_str(
        &b.http(b"GET /v1/info HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .body,
    )
    .unwrap();
    assert_eq!(info["upstream_resources"][CRM], "org");
    assert_eq!(info["upstreams"]["org"]["grant"], "id_jag");
    assert_eq!(info["upstreams"]["org"]["resource_upstream"], "crm");
    assert_eq!(
        info["upstreams"]["org"]["token_endpoint"],
        c.org_te.as_str()
    );
    assert_eq!(
        info["upstreams"]["crm"]["token_endpoint"],
        c.ras_te.as_str()
    );
    assert_eq!(info["upstreams"]["crm"]["grant"], "token_exchange");

    let answer = derive_ok(&b, &c, &k, &subject);
    assert_eq!(answer["token_type"], "DPoP");
    assert_eq!(answer["scope"], "crm:read");
    let token = answer["access_token"].as_str().unwrap();
    // The ID-JAG is never handed over: the answer holds the resource AS's
    // access token and the usual members, nothing else.
    assert_eq!(header(token)["typ"], "at+jwt");
    let members: Vec<&str> = answer
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        members,
        [
            "access_token",
            "expires_in",
            "issued_token_type",
            "scope",
            "token_type"
        ],
        "{answer}"
    );
    let cl = claims(token);
    assert_eq!(cl["iss"], c.ras_issuer.as_str(), "the resource AS's token");
    assert_eq!(cl["cnf"]["jkt"], k.thumbprint());
    assert_eq!(cl["aud"], CRM);
    assert_eq!(cl["scope"], "crm:read");
    assert_eq!(cl["client_id"], CRM_CLIENT);
    let checked = verified_by_the_resource_as(&c, token).await;
    assert_eq!(checked["claims"]["sub"], "alice");
    // A resource server trusting only the IdP refuses it.
    let idp_only = jose(
        "verify-token",
        json!({
            "token": token, "issuer": c.ras_issuer, "audience": CRM,
            "jwks_uri": format!("{}/jwks", c.org_issuer),
        }),
    )
    .await;
    assert!(idp_only.is_err(), "the IdP's keys do not verify it");

    // Leg 1 asked the IdP for an ID-JAG for the resource AS; leg 2 redeemed
    // it with the jwt-bearer grant, each with its own proof.
    let leg1 = c.org.call(&json!({"cmd": "last"}));
    assert_eq!(
        leg1["form"]["requested_token_type"][0],
        "urn:ietf:params:oauth:token-type:id-jag"
    );
    assert_eq!(leg1["form"]["audience"][0], c.ras_issuer.as_str());
    assert_eq!(leg1["form"]["resource"][0], CRM);
    assert_eq!(leg1["form"]["scope"][0], "crm:read");
    let leg2 = c.ras.call(&json!({"cmd": "last"}));
    assert_eq!(
        leg2["form"]["grant_type"][0],
        "urn:ietf:params:oauth:grant-type:jwt-bearer"
    );
    assert_eq!(
        claims(leg1["dpop"].as_str().unwrap())["htu"],
        c.org_te.as_str()
    );
    assert_eq!(
        claims(leg2["dpop"].as_str().unwrap())["htu"],
        c.ras_te.as_str()
    );
    let issued = b
        .audit_lines()
        .into_iter()
        .rfind(|e| e["event"] == "derive.issued")
        .unwrap();
    assert_eq!(issued["upstream"], "org");
    assert_eq!(issued["expires_at"], cl["exp"]);
}

#[tokio::test]
async fn an_unbound_or_foreign_id_jag_is_refused_before_leg_2() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let subject = c.subject();
    for (mode, why) in [
        (
            "unbound_jag",
            "not bound to the tool's key (no cnf.jkt): a downgrade",
        ),
        ("other_client_jag", "for another client than the broker's"),
        (
            "wrong_aud_jag",
            "aud is not exactly the resource AS's issuer",
        ),
    ] {
        c.org_mode(mode);
        let before = c.counts();
        let a = derive(&b, &k, &subject, &proofs(&c, &k));
        refused(&a, 502, "upstream_token_rejected");
        assert!(a.body.contains(why), "{mode}: {}", a.body);
        let after = c.counts();
        assert_eq!(after.0, before.0 + 1, "{mode}: leg 1 was sent");
        assert_eq!(after.1, before.1, "{mode}: nothing reached the resource AS");
        c.org_mode("ok");
        derive_ok(&b, &c, &k, &subject);
    }
}

#[tokio::test]
async fn each_leg_needs_its_own_proof() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let other = key();
    let subject = c.subject();
    // No proof for leg 2: its htu is named, nothing is sent.
    let before = c.counts();
    let a = derive(&b, &k, &subject, &json!({ "org": proof(&k, &c.org_te) }));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], c.ras_te.as_str());
    assert!(a.body.contains("upstream_proofs.crm"), "{}", a.body);
    // No proof for leg 1.
    let a = derive(&b, &k, &subject, &json!({ "crm": proof(&k, &c.ras_te) }));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], c.org_te.as_str());
    // Leg 2's proof made for leg 1's htu, or by another key.
    for bad in [proof(&k, &c.org_te), proof(&other, &c.ras_te)] {
        let relayed = json!({ "org": proof(&k, &c.org_te), "crm": bad });
        refused(
            &derive(&b, &k, &subject, &relayed),
            400,
            "upstream_proof_invalid",
        );
    }
    assert_eq!(c.counts(), before, "nothing was sent to either AS");
    derive_ok(&b, &c, &k, &subject);

    // Leg 2's proof replayed with a fresh one for leg 1.
    let used = proofs(&c, &k);
    assert_eq!(derive(&b, &k, &subject, &used).status, 200);
    let before = c.counts();
    let replay = json!({ "org": proof(&k, &c.org_te), "crm": used["crm"] });
    let a = derive(&b, &k, &subject, &replay);
    refused(&a, 400, "upstream_proof_invalid");
    assert!(a.body.contains("already used"), "{}", a.body);
    assert_eq!(c.counts(), before, "nothing was sent");
    derive_ok(&b, &c, &k, &subject);
}

#[tokio::test]
async fn leg_2s_known_nonce_is_checked_before_either_leg_is_sent() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let subject = c.subject();
    c.ras_mode("nonce");
    // The broker does not know the resource AS's nonce yet: leg 1 is sent,
    // leg 2 refused by the AS with use_dpop_nonce, and the derive names leg
    // 2's htu and that nonce.
    let before = c.counts();
    let a = derive(&b, &k, &subject, &proofs(&c, &k));
    refused(&a, 400, "upstream_proof_required");
    assert_eq!(a.json()["upstream_htu"], c.ras_te.as_str());
    let nonce = a.json()["upstream_nonce"].as_str().unwrap().to_owned();
    assert_eq!(c.counts(), (before.0 + 1, before.1 + 1));
    // Now it knows it: leg 2's proof without it, or with another nonce,
    // is refused here, naming leg 2's htu and the nonce, and nothing is
    // sent to either AS (leg 1 included).
    let before = c.counts();
    for bad in [None, Some("not-the-as-nonce")] {
        let relayed = json!({
            "org": proof(&k, &c.org_te),
            "crm": make_proof(&k, "POST", &c.ras_te, now(), None, bad).unwrap(),
        });
        let a = derive(&b, &k, &subject, &relayed);
        refused(&a, 400, "upstream_proof_required");
        assert_eq!(a.json()["upstream_htu"], c.ras_te.as_str());
        assert_eq!(a.json()["upstream_nonce"], nonce.as_str());
    }
    assert_eq!(c.counts(), before, "nothing was sent to either AS");
    // Control: leg 2's proof with the nonce (leg 1's with none: the IdP
    // never gave one) goes through, both legs sent once.
    let relayed = json!({
        "org": proof(&k, &c.org_te),
        "crm": make_proof(&k, "POST", &c.ras_te, now(), None, Some(&nonce)).unwrap(),
    });
    let a = derive(&b, &k, &subject, &relayed);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(c.counts(), (before.0 + 1, before.1 + 1));
    c.ras_mode("ok");
}

/// Holds leg 1's answer at the IdP, runs `meanwhile` while it is held,
/// then releases it; gives the derive's answer.
fn with_leg_1_held(
    c: &mut Chain,
    b: &TestBroker,
    k: &Es256Key,
    meanwhile: impl FnOnce(),
) -> HttpAnswer {
    let subject = c.subject();
    let relayed = proofs(c, k);
    c.org_mode("hold");
    std::thread::scope(|s| {
        let d = s.spawn(|| derive(b, k, &subject, &relayed));
        wait_until(Duration::from_secs(5), "leg 1 held at the IdP", || {
            c.org.call(&json!({"cmd": "held"}))["held"] == true
        });
        meanwhile();
        assert_eq!(c.org.call(&json!({"cmd": "release"}))["ok"], true);
        d.join().unwrap()
    })
}

#[tokio::test]
async fn a_reload_removing_the_tool_between_legs_refuses_before_leg_2() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let with_tool = b.policy_hash();
    let before = c.counts();
    let a = with_leg_1_held(&mut c, &b, &k, || {
        b.replace_policy(policy(false).as_bytes());
        b.sighup();
        wait_until(Duration::from_secs(5), "the reload", || {
            b.policy_hash() != with_tool
        });
    });
    refused(&a, 403, "tool_not_allowed");
    let after = c.counts();
    assert_eq!(after.0, before.0 + 1, "leg 1 was sent");
    assert_eq!(after.1, before.1, "leg 2 was not");
    // Control: the tool back, the same derive goes through.
    b.replace_policy(policy(true).as_bytes());
    b.sighup();
    wait_until(Duration::from_secs(5), "the reload back", || {
        b.policy_hash() == with_tool
    });
    c.org_mode("ok");
    let subject = c.subject();
    derive_ok(&b, &c, &k, &subject);
}

#[tokio::test]
async fn a_freeze_refuses_before_either_leg_and_between_them() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let subject = c.subject();
    assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    let before = c.counts();
    refused(&derive(&b, &k, &subject, &proofs(&c, &k)), 403, "frozen");
    assert_eq!(c.counts(), before, "nothing sent while frozen");
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
    derive_ok(&b, &c, &k, &subject);

    let before = c.counts();
    let a = with_leg_1_held(&mut c, &b, &k, || {
        assert_eq!(b.admin_post("/freeze", "on").unwrap().0, 200);
    });
    refused(&a, 403, "frozen");
    assert_eq!(c.counts().1, before.1, "leg 2 was not sent");
    assert_eq!(b.admin_post("/freeze", "off").unwrap().0, 200);
    c.org_mode("ok");
    derive_ok(&b, &c, &k, &subject);
}

#[tokio::test]
async fn the_resource_as_rotates_its_keys() {
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    let subject = c.subject();
    let t = derive_ok(&b, &c, &k, &subject);
    let old = header(t["access_token"].as_str().unwrap())["kid"].clone();
    let new = c.ras.call(&json!({"cmd": "rotate"}))["kid"].clone();
    assert_ne!(old, new);
    // A token under the new key: the broker refetches the JWKS on its
    // unknown kid, and a resource server verifies it too.
    let t = derive_ok(&b, &c, &k, &subject);
    let token = t["access_token"].as_str().unwrap();
    assert_eq!(header(token)["kid"], new);
    verified_by_the_resource_as(&c, token).await;
    // A token under the removed key is refused.
    c.ras_mode("old_key");
    let a = derive(&b, &k, &subject, &proofs(&c, &k));
    refused(&a, 502, "upstream_token_rejected");
    assert!(
        a.body.contains("a key the AS does not publish"),
        "{}",
        a.body
    );
    c.ras_mode("ok");
    derive_ok(&b, &c, &k, &subject);
}

#[tokio::test]
async fn an_id_token_is_a_subject_only_for_an_exchange_resource() {
    const ID: &str = "urn:ietf:params:oauth:token-type:id_token";
    let mut c = Chain::start();
    let b = broker(&c);
    let k = key();
    // For the chained resource, an ID token for the broker's client at the
    // IdP is the subject; the IdP is told what it is.
    let id_token = c.id_token("credbroker");
    let a = derive_as(&b, &k, &id_token, &proofs(&c, &k), Some(ID));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        c.org.call(&json!({"cmd": "last"}))["form"]["subject_token_type"][0],
        ID
    );
    // One for another client is refused, nothing sent.
    let before = c.counts();
    let other = c.id_token("someone-else");
    let a = derive_as(&b, &k, &other, &proofs(&c, &k), Some(ID));
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.json()["error"], "invalid_request");
    // Sent as an access token, the ID token is refused too.
    let a = derive_as(&b, &k, &id_token, &proofs(&c, &k), None);
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(c.counts(), before, "nothing was sent");
    let a = derive_as(&b, &k, &id_token, &proofs(&c, &k), Some(ID));
    assert_eq!(a.status, 200, "{}", a.body);

    // Never for a `self` resource, even a valid one.
    let mut body = b.good_body(&id_token);
    body["subject_token_type"] = ID.into();
    let a = b.post_derive(&body, Some(&b.proof(&k)));
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.body.contains("only for an exchange resource"),
        "{}",
        a.body
    );
    let a = b.post_derive(&b.good_body(&b.subject_token("alice")), Some(&b.proof(&k)));
    assert_eq!(a.status, 200, "{}", a.body);
}

#[tokio::test]
async fn an_idp_not_advertising_id_jag_is_not_asked() {
    let mut c = Chain::start_advertising(false);
    let b = broker(&c);
    let k = key();
    let subject = c.subject();
    let a = derive(&b, &k, &subject, &proofs(&c, &k));
    refused(&a, 503, "upstream_misconfigured");
    assert_eq!(c.counts(), (0, 0), "nothing was sent");
    assert!(
        b.log_text()
            .contains("identity_chaining_requested_token_types_supported lacks id-jag"),
        "the log names what is missing"
    );
    // Control: an IdP that advertises it.
    let mut c = Chain::start();
    let b = broker(&c);
    let subject = c.subject();
    derive_ok(&b, &c, &k, &subject);
}
