//! Cross-checks against an independent JOSE implementation (npm `jose`, run
//! by node from `tests/peers/jose/`): proofs made by jose are accepted by the
//! broker and by the example resource server, tokens minted by the broker
//! verify in jose with the claims of security case X5, proofs made by
//! credbroker verify in jose, and both agree on RFC 7638 thumbprints.
//!
//! The example resource server (`examples/resource_server.rs`) is served
//! in-process on port 0 (`support::resource`).
//!
//! Needs node and `tests/peers/node_modules` (`scripts/install-test-deps`);
//! without them these tests fail, they never pass vacuously.

// clippy's allow-unwrap-in-tests covers only #[test] functions, not the
// helpers they call; here too a failure should panic loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use crate::support::resource::start_resource_server;
use crate::support::*;
use serde_json::{json, Value};

const AGENT: &str = "repo-helper";

/// A tool key made by jose: `{private_jwk, public_jwk, jkt}`.
async fn jose_key() -> Value {
    jose("keygen", json!({})).await.unwrap()
}

/// A DPoP proof made by jose with `key` (from [`jose_key`]).
async fn jose_proof(key: &Value, htm: &str, htu: &str, access_token: Option<&str>) -> String {
    let mut input = json!({"private_jwk": key["private_jwk"], "htm": htm, "htu": htu});
    if let Some(t) = access_token {
        input["access_token"] = t.into();
    }
    jose("make-proof", input).await.unwrap()["proof"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A broker whose issuer URL is where its metadata is really served, so that
/// jose and the resource server can discover its keys.
fn broker() -> TestBroker {
    TestBroker::start_with(Opts {
        public_listen: Some(free_loopback_addr()),
        // A rotation here activates at once (the resource servers under
        // test refetch on an unknown kid, which is what is being tested).
        edit_config: Some(|t| t.replace("[keys]\n", "[keys]\nactivation_delay = 0\n")),
        // One of the tokens verified in jose is notes.delete's.
        policy: Some(policy_without_approval()),
        ..Opts::default()
    })
}

/// `/v1/derive` with a proof made elsewhere: (status, JSON body).
fn derive_with_proof(b: &TestBroker, tool: &str, step: &str, proof: &str) -> (u16, Value) {
    let body = json!({
        "subject_token": b.subject_token("alice"), "step": step, "tool": tool, "resource": RESOURCE,
    })
    .to_string();
    let raw = b.raw(
        &http_derive(&body, Some(proof), ""),
        Duration::from_secs(10),
    );
    (status_of(&raw), body_json(&raw))
}

/// `POST /token` (RFC 8693 form) with a proof made elsewhere.
fn token_endpoint_with_proof(b: &TestBroker, proof: &str) -> (u16, Value) {
    let subject = b.subject_token("alice");
    let body: String = form_urlencoded::Serializer::new(String::new())
        .append_pair(
            "grant_type",
            "urn:ietf:params:oauth:grant-type:token-exchange",
        )
        .append_pair("subject_token", &subject)
        .append_pair(
            "subject_token_type",
            "urn:ietf:params:oauth:token-type:access_token",
        )
        .append_pair("resource", RESOURCE)
        .append_pair("step", "summarize")
        .append_pair("tool", "notes.read")
        .finish();
    let req = format!(
        "POST /token HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\n\
         dpop: {proof}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let raw = b.raw(req.as_bytes(), Duration::from_secs(10));
    (status_of(&raw), body_json(&raw))
}

fn body_json(raw: &str) -> Value {
    let body = raw.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not a JSON answer:\n{raw}"))
}

/// Checks security case X5 on a token as jose decoded it.
fn assert_x5(b: &TestBroker, verified: &Value, tool_jkt: &str, tool: &str) {
    let (h, c) = (&verified["header"], &verified["claims"]);
    assert_eq!(h["alg"], "ES256");
    assert_eq!(h["typ"], "at+jwt");
    assert!(h["kid"].is_string(), "kid names the signing key");
    assert_eq!(c["iss"], b.issuer.as_str());
    // Exactly the resource, as a string: not an array that merely contains it.
    assert_eq!(c["aud"], RESOURCE);
    assert_eq!(c["sub"], "alice");
    assert_eq!(
        c["cnf"]["jkt"], tool_jkt,
        "bound to the tool's key, by jose's thumbprint"
    );
    assert_eq!(c["act"]["sub"], AGENT);
    assert_eq!(c["act"]["tool"], tool);
    let (iat, exp) = (c["iat"].as_i64().unwrap(), c["exp"].as_i64().unwrap());
    assert!(exp > iat && exp - iat <= 300, "lifetime {} s", exp - iat);
    assert!(c["jti"].as_str().is_some_and(|j| !j.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jose_proofs_are_accepted_and_minted_tokens_verify_in_jose() {
    require_peers();
    let b = broker();
    let tool = jose_key().await;
    let tool_jkt = tool["jkt"].as_str().unwrap();
    let derive_htu = b.htu();

    // A jose proof made for another endpoint is refused...
    let wrong = jose_proof(&tool, "POST", &format!("{}/token", b.issuer), None).await;
    let (status, body) = derive_with_proof(&b, "notes.read", "summarize", &wrong);
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_dpop_proof")),
        "{body}"
    );
    // ...and the right one is accepted, on both endpoints.
    let p = jose_proof(&tool, "POST", &derive_htu, None).await;
    let (status, first) = derive_with_proof(&b, "notes.read", "summarize", &p);
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["token_type"], "DPoP");
    let p = jose_proof(&tool, "POST", &format!("{}/token", b.issuer), None).await;
    let (status, second) = token_endpoint_with_proof(&b, &p);
    assert_eq!(status, 200, "{second}");
    let p = jose_proof(&tool, "POST", &derive_htu, None).await;
    let (status, third) = derive_with_proof(&b, "notes.delete", "cleanup_confirmed", &p);
    assert_eq!(status, 200, "{third}");

    // jose verifies each token, finding the keys through the issuer metadata.
    let mut jtis = HashSet::new();
    for (answer, tool_name) in [
        (&first, "notes.read"),
        (&second, "notes.read"),
        (&third, "notes.delete"),
    ] {
        let token = answer["access_token"].as_str().unwrap();
        let v = jose(
            "verify-token",
            json!({"token": token, "issuer": b.issuer, "audience": RESOURCE}),
        )
        .await
        .unwrap_or_else(|e| panic!("jose refused a minted token: {e}"));
        assert_eq!(v["jwks_uri"], format!("{}/.well-known/jwks.json", b.issuer));
        assert_x5(&b, &v, tool_jkt, tool_name);
        assert!(
            jtis.insert(v["claims"]["jti"].as_str().unwrap().to_owned()),
            "jti reused"
        );
    }
    let token = first["access_token"].as_str().unwrap();
    let v = jose(
        "verify-token",
        json!({"token": token, "issuer": b.issuer, "audience": RESOURCE}),
    )
    .await
    .unwrap();
    assert_eq!(v["claims"]["scope"], "notes.read");
    assert!(v["claims"]["client_id"].is_string());
    // The token lifetime answered is the one in the token.
    let c = &v["claims"];
    assert!(
        first["expires_in"].as_i64().unwrap()
            <= c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap()
    );

    // jose's checks are not vacuous: another audience, another issuer, a
    // changed payload and a token from someone else's key are refused...
    let other_aud = "http://127.0.0.1:9090/notes/other";
    let e = jose(
        "verify-token",
        json!({"token": token, "issuer": b.issuer, "audience": other_aud}),
    )
    .await
    .unwrap_err();
    assert_eq!(e, "ERR_JWT_CLAIM_VALIDATION_FAILED");
    let e = jose(
        "verify-token",
        json!({"token": token, "issuer": "http://127.0.0.1:1", "audience": RESOURCE,
        "jwks_uri": format!("{}/.well-known/jwks.json", b.issuer)}),
    )
    .await
    .unwrap_err();
    assert_eq!(e, "ERR_JWT_CLAIM_VALIDATION_FAILED");
    let e = jose(
        "verify-token",
        json!({"token": tamper_payload(token), "issuer": b.issuer, "audience": RESOURCE}),
    )
    .await
    .unwrap_err();
    assert_eq!(e, "ERR_JWS_SIGNATURE_VERIFICATION_FAILED");
    let other_broker = broker();
    let e = jose(
        "verify-token",
        json!({"token": token, "issuer": b.issuer, "audience": RESOURCE,
        "jwks_uri": format!("{}/.well-known/jwks.json", other_broker.issuer)}),
    )
    .await
    .unwrap_err();
    assert_eq!(e, "ERR_JWKS_NO_MATCHING_KEY");
    // ...and the same token still verifies (positive control).
    jose(
        "verify-token",
        json!({"token": token, "issuer": b.issuer, "audience": RESOURCE}),
    )
    .await
    .unwrap();
}

/// The token with one claim changed and the signature kept.
fn tamper_payload(token: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = "mallory".into();
    format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(claims.to_string()),
        parts[2]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credbroker_proofs_and_thumbprints_verify_in_jose() {
    require_peers();
    let (key, pkcs8) = credbroker::internals::jose::Es256Key::generate().unwrap();
    let url = "http://127.0.0.1:9090/notes";

    // Thumbprints agree both ways: of our key as jose computes it, and of
    // jose's key as we compute it.
    let v = jose("thumbprint", json!({"jwk": key.public_jwk}))
        .await
        .unwrap();
    assert_eq!(v["jkt"], key.thumbprint());
    let theirs = jose_key().await;
    let ours = credbroker::internals::jose::Jwk::from_value(&theirs["public_jwk"]).unwrap();
    assert_eq!(ours.thumbprint, theirs["jkt"].as_str().unwrap());

    // A proof from `dpop::make_proof`, checked by jose with the embedded key.
    let at = "eyJhbGciOiJFUzI1NiJ9.e30.sig";
    let proof =
        credbroker::internals::dpop::make_proof(&key, "GET", url, now(), Some(at), None).unwrap();
    let check = |access_token: &str| json!({"proof": proof, "htm": "GET", "htu": url, "access_token": access_token});
    // Negative first: jose finds an ath over another token wrong...
    assert_eq!(
        jose("verify-proof", check("another-token"))
            .await
            .unwrap_err(),
        "ath"
    );
    // ...and accepts the proof for the token it was made for.
    let v = jose("verify-proof", check(at)).await.unwrap();
    assert_eq!(v["jkt"], key.thumbprint());
    assert_eq!(v["header"]["typ"], "dpop+jwt");
    assert_eq!(v["header"]["alg"], "ES256");
    assert!(v["header"]["jwk"].get("d").is_none());

    // A proof from the CLI (`credbroker proof`), as a shell script makes one.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("tool.pem");
    credbroker::internals::config::write_secret_file(
        &key_file,
        credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
    )
    .unwrap();
    let out = std::process::Command::new(bin())
        .args([
            "proof",
            "--method",
            "POST",
            "--url",
            url,
            "--access-token",
            at,
            "--key",
        ])
        .arg(&key_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let proof = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let e = jose(
        "verify-proof",
        json!({"proof": proof, "htm": "GET", "htu": url, "access_token": at}),
    )
    .await
    .unwrap_err();
    assert_eq!(e, "htm");
    let v = jose(
        "verify-proof",
        json!({"proof": proof, "htm": "POST", "htu": url, "access_token": at}),
    )
    .await
    .unwrap();
    assert_eq!(v["jkt"], key.thumbprint());
}

/// A request to the resource server: (status, `WWW-Authenticate`, body).
async fn call(
    url: &str,
    authorization: Option<String>,
    dpop: Option<&str>,
) -> (u16, String, Value) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    if let Some(p) = dpop {
        req = req.header("dpop", p);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, challenge, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_server_accepts_jose_proofs_and_refuses_bearer_and_missing_proofs() {
    require_peers();
    let b = broker();
    let rs = start_resource_server(&["--issuer", &b.issuer, "--audience", RESOURCE]).await;
    let notes = format!("{rs}/notes");
    let tool = jose_key().await;
    let p = jose_proof(&tool, "POST", &b.htu(), None).await;
    let (status, answer) = derive_with_proof(&b, "notes.read", "summarize", &p);
    assert_eq!(status, 200, "{answer}");
    let at = answer["access_token"].as_str().unwrap();
    // Proofs name the URL clients use, which is the audience (see
    // `resource_server::App::origin`), not the test's port.
    let proof = |htu: &'static str| jose_proof(&tool, "GET", htu, Some(at));

    // D17: the bound token used as a Bearer token, without and with a proof.
    let (status, challenge, _) = call(&notes, Some(format!("Bearer {at}")), None).await;
    assert_eq!(status, 401);
    assert_eq!(challenge, r#"DPoP error="invalid_token", algs="ES256""#);
    let (status, challenge, _) = call(
        &notes,
        Some(format!("Bearer {at}")),
        Some(&proof(RESOURCE).await),
    )
    .await;
    assert_eq!(
        (status, challenge.as_str()),
        (401, r#"DPoP error="invalid_token", algs="ES256""#)
    );
    // D17: the DPoP scheme without a proof.
    let (status, challenge, body) = call(&notes, Some(format!("DPoP {at}")), None).await;
    assert_eq!(
        (status, challenge.as_str()),
        (401, r#"DPoP error="invalid_dpop_proof", algs="ES256""#)
    );
    assert_eq!(body["error"], "invalid_dpop_proof");
    // No token at all: the challenge names the scheme only.
    let (status, challenge, _) = call(&notes, None, None).await;
    assert_eq!((status, challenge.as_str()), (401, r#"DPoP algs="ES256""#));

    // Positive control: token + jose proof, and the server says who called.
    let good = proof(RESOURCE).await;
    let (status, _, who) = call(&notes, Some(format!("DPoP {at}")), Some(&good)).await;
    assert_eq!(status, 200, "{who}");
    assert_eq!(who["notes"].as_array().map(Vec::len), Some(2), "{who}");
    assert_eq!(
        who,
        json!({"sub": "alice", "agent": AGENT, "tool": "notes.read", "scopes": ["notes.read"],
               "notes": who["notes"]})
    );

    // replayed_proof: the same proof again is refused; a fresh one works.
    let (status, challenge, _) = call(&notes, Some(format!("DPoP {at}")), Some(&good)).await;
    assert_eq!(
        (status, challenge.as_str()),
        (401, r#"DPoP error="invalid_dpop_proof", algs="ES256""#)
    );
    // two_proofs_for_one_request: the server may not pick one.
    let (p1, p2) = (proof(RESOURCE).await, proof(RESOURCE).await);
    let resp = reqwest::Client::new()
        .get(&notes)
        .header("authorization", format!("DPoP {at}"))
        .header("dpop", &p1)
        .header("dpop", &p2)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let (status, _, _) = call(&notes, Some(format!("DPoP {at}")), Some(&p1)).await;
    assert_eq!(status, 200, "either proof alone is fine");
    // stolen_token_used_with_attackers_key: a valid proof from another key.
    let attacker = jose_key().await;
    let p = jose_proof(&attacker, "GET", RESOURCE, Some(at)).await;
    let (status, _, _) = call(&notes, Some(format!("DPoP {at}")), Some(&p)).await;
    assert_eq!(status, 401);
    // proof_made_for_another_url: htu of a sibling resource.
    let p = proof("http://127.0.0.1:9090/other").await;
    let (status, _, _) = call(&notes, Some(format!("DPoP {at}")), Some(&p)).await;
    assert_eq!(status, 401);
    // Paths under the audience are served (the query is not part of htu);
    // other paths are not this resource.
    let p = proof("http://127.0.0.1:9090/notes/2024/summary").await;
    let (status, _, _) = call(
        &format!("{notes}/2024/summary?page=2"),
        Some(format!("DPoP {at}")),
        Some(&p),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = call(&format!("{rs}/other"), Some(format!("DPoP {at}")), Some(&p)).await;
    assert_eq!(status, 404);
    let (status, _, who) = call(
        &notes,
        Some(format!("DPoP {at}")),
        Some(&proof(RESOURCE).await),
    )
    .await;
    assert_eq!((status, who["sub"].as_str()), (200, Some("alice")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_server_picks_up_a_rotated_key_unless_its_jwks_is_pinned() {
    require_peers();
    let b = broker();
    let jwks = reqwest::get(format!("{}/.well-known/jwks.json", b.public))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let jwks_file = dir.path().join("jwks.json");
    std::fs::write(&jwks_file, &jwks).unwrap();
    let discovering = start_resource_server(&["--issuer", &b.issuer, "--audience", RESOURCE]).await;
    let pinned = start_resource_server(&[
        "--issuer",
        &b.issuer,
        "--audience",
        RESOURCE,
        "--jwks-file",
        jwks_file.to_str().unwrap(),
    ])
    .await;
    let tool = jose_key().await;
    let old = new_token(&b, &tool).await;
    assert_eq!(present(&discovering, &old, &tool).await.0, 200);
    assert_eq!(present(&pinned, &old, &tool).await.0, 200);

    let (status, body) = b.admin_post("/keys/rotate", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let new = new_token(&b, &tool).await;
    // The discovering server meets an unknown kid, refetches, and accepts.
    let (status, _, who) = present(&discovering, &new, &tool).await;
    assert_eq!((status, who["sub"].as_str()), (200, Some("alice")));
    // The pinned one cannot know the new key: invalid_token...
    let (status, challenge, _) = present(&pinned, &new, &tool).await;
    assert_eq!(
        (status, challenge.as_str()),
        (401, r#"DPoP error="invalid_token", algs="ES256""#)
    );
    // ...while tokens from the key it pins still work, on both.
    assert_eq!(present(&pinned, &old, &tool).await.0, 200);
    assert_eq!(present(&discovering, &old, &tool).await.0, 200);

    // jwks_refetch_flood: a second unknown kid within a minute of the last
    // refetch does not make the server fetch again (a token naming made-up
    // kids would otherwise turn every request into one to the broker)...
    let (status, body) = b.admin_post("/keys/rotate", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let newest = new_token(&b, &tool).await;
    let (status, challenge, _) = present(&discovering, &newest, &tool).await;
    assert_eq!(
        (status, challenge.as_str()),
        (401, r#"DPoP error="invalid_token", algs="ES256""#)
    );
    // ...while the keys it has keep working.
    assert_eq!(present(&discovering, &new, &tool).await.0, 200);
}

/// A fresh token for `tool`'s key, derived with a jose proof.
async fn new_token(b: &TestBroker, tool: &Value) -> String {
    let p = jose_proof(tool, "POST", &b.htu(), None).await;
    let (status, answer) = derive_with_proof(b, "notes.read", "summarize", &p);
    assert_eq!(status, 200, "{answer}");
    answer["access_token"].as_str().unwrap().to_owned()
}

/// `at` with a fresh jose proof at `rs`'s `/notes`.
async fn present(rs: &str, at: &str, tool: &Value) -> (u16, String, Value) {
    let p = jose_proof(tool, "GET", RESOURCE, Some(at)).await;
    call(&format!("{rs}/notes"), Some(format!("DPoP {at}")), Some(&p)).await
}
