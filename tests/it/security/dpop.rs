//! docs/SECURITY-CASES.md group D: DPoP proofs (RFC 9449) against the running
//! binary. Each negative is followed, in the same test, by the positive
//! control. D13, D14 and D17 are the resource-server side: they run the
//! embeddable `credbroker::verify::Verifier` on tokens issued by the binary,
//! with the JWKS fetched from its public listener.
// Test code panics loudly on a broken fixture: clippy.toml allows unwrap and
// expect in #[test] functions, and these helpers are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;
use credbroker::client::{Answer, DeriveParams};
use credbroker::internals::dpop::{make_proof, DpopError};
use credbroker::verify::{Presented, Verifier, VerifyError};
use serde_json::json;

/// Sends the known-good body with `proof`; the subject is a fresh alice.
fn derive_with(b: &TestBroker, proof: &str) -> HttpAnswer {
    b.post_derive(&b.good_body(&b.subject_token("alice")), Some(proof))
}

#[tokio::test]
async fn dpop_two_proofs_non_jwt_and_jwe_shapes() {
    let b = TestBroker::start();
    let k = key();
    let body = b.good_body(&b.subject_token("alice")).to_string();

    // Two DPoP headers, each a valid proof on its own.
    let (p1, p2) = (b.proof(&k), b.proof(&k));
    b.http(&http_derive(&body, Some(&p1), &format!("dpop: {p2}\r\n")))
        .assert_refused(400, "invalid_dpop_proof", "two DPoP headers");
    // Two proofs folded into one header value.
    b.http(&http_derive(&body, Some(&format!("{p1}, {p2}")), ""))
        .assert_refused(400, "invalid_dpop_proof", "two proofs in one header");
    // No proof at all.
    b.http(&http_derive(&body, None, "")).assert_refused(
        400,
        "invalid_dpop_proof",
        "no DPoP header",
    );
    for (what, bad) in [
        ("not a JWT", "not-a-jwt".to_string()),
        ("empty", String::new()),
        ("two segments", "eyJhbGciOiJFUzI1NiJ9.e30".to_string()),
        (
            "JWE with five segments",
            "eyJhbGciOiJSU0EtT0FFUCIsImVuYyI6IkEyNTZHQ00ifQ.QUFBQQ.QkJCQg.Q0NDQw.RERERA"
                .to_string(),
        ),
        ("four segments", format!("{p1}.QUFB")),
        ("padded base64url", p1.replacen('.', "=.", 1)),
        (
            "standard base64 alphabet",
            p1.replace('-', "+").replace('_', "/") + "+/",
        ),
    ] {
        b.http(&http_derive(&body, Some(&bad), ""))
            .assert_refused(400, "invalid_dpop_proof", what);
    }
    // Positive control: one proof, one header.
    b.http(&http_derive(&body, Some(&b.proof(&k)), ""))
        .assert_issued("one valid proof");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_missing_a_required_member() {
    let b = TestBroker::start();
    let k = key();
    for member in ["typ", "alg", "jwk"] {
        let proof = proof_with(&k, json!({ member: null }), &b.proof_claims());
        derive_with(&b, &proof).assert_refused(
            400,
            "invalid_dpop_proof",
            &format!("header without {member}"),
        );
    }
    for claim in ["jti", "htm", "htu", "iat"] {
        let mut claims = b.proof_claims();
        claims.as_object_mut().unwrap().remove(claim);
        let proof = proof_with(&k, json!({}), &claims);
        derive_with(&b, &proof).assert_refused(
            400,
            "invalid_dpop_proof",
            &format!("claims without {claim}"),
        );
    }
    // Positive control: the same construction with nothing removed.
    derive_with(&b, &proof_with(&k, json!({}), &b.proof_claims())).assert_issued("complete proof");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_with_typ_of_another_token_kind() {
    let b = TestBroker::start();
    let k = key();
    for typ in [
        "JWT",
        "at+jwt",
        "secevent+jwt",
        "application/at+jwt",
        "dpop+jwt ",
    ] {
        let proof = proof_with(&k, json!({ "typ": typ }), &b.proof_claims());
        derive_with(&b, &proof).assert_refused(400, "invalid_dpop_proof", &format!("typ {typ}"));
    }
    let proof = proof_with(&k, json!({ "typ": 1 }), &b.proof_claims());
    derive_with(&b, &proof).assert_refused(400, "invalid_dpop_proof", "typ as a number");
    derive_with(&b, &b.proof(&k)).assert_issued("typ dpop+jwt");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_with_alg_none_hmac_or_not_allowed() {
    let b = TestBroker::start();
    let k = key();
    let claims = b.proof_claims();
    let es256 = |input: &[u8]| k.sign_raw(input).unwrap();
    // alg none: without a signature, and with a real ES256 signature.
    let h = json!({"typ": "dpop+jwt", "alg": "none", "jwk": proof_jwk(&k)});
    let unsigned = jws_with(&h, &claims, |_| Vec::new());
    derive_with(&b, &unsigned).assert_refused(400, "invalid_dpop_proof", "alg none, no signature");
    derive_with(&b, &jws_with(&h, &claims, es256)).assert_refused(
        400,
        "invalid_dpop_proof",
        "alg none, signed",
    );
    // HS256 keyed with the public JWK the proof carries.
    let h = json!({"typ": "dpop+jwt", "alg": "HS256", "jwk": proof_jwk(&k)});
    let jwk_bytes = proof_jwk(&k).to_string();
    let forged = jws_with(&h, &claims, |input| hs256(jwk_bytes.as_bytes(), input));
    derive_with(&b, &forged).assert_refused(
        400,
        "invalid_dpop_proof",
        "alg HS256 keyed with the JWK",
    );
    // alg of the wrong JSON type, unknown, or not in the ES256-only list.
    for alg in [
        json!(1),
        json!(true),
        json!(null),
        json!("unsupported"),
        json!("es256"),
        json!("ES256 "),
    ] {
        let h = json!({"typ": "dpop+jwt", "alg": alg, "jwk": proof_jwk(&k)});
        derive_with(&b, &jws_with(&h, &claims, es256)).assert_refused(
            400,
            "invalid_dpop_proof",
            &format!("alg {alg}"),
        );
    }
    // RS256 with an RSA key: valid on its own, but only ES256 is allowed.
    let rsa = RsaKey::generate("tool-rsa");
    let mut rjwk = rsa.public_jwk();
    rjwk.as_object_mut()
        .unwrap()
        .retain(|name, _| ["kty", "n", "e"].contains(&name.as_str()));
    let h = json!({"typ": "dpop+jwt", "alg": "RS256", "jwk": rjwk});
    let rs = jws_with(&h, &b.proof_claims(), |input| rsa.sign_rs256(input));
    derive_with(&b, &rs).assert_refused(
        400,
        "invalid_dpop_proof",
        "RS256 when only ES256 is allowed",
    );
    // Positive control.
    derive_with(&b, &b.proof(&k)).assert_issued("ES256 proof");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_jwk_private_symmetric_off_curve_or_mismatched() {
    let b = TestBroker::start();
    let k = key();
    let good = proof_jwk(&k);
    let mut with_d = good.clone();
    with_d["d"] = json!(credbroker::internals::jose::b64e(&random_bytes(32)));
    let mut off_curve = good.clone();
    let mut y = credbroker::internals::jose::b64d(good["y"].as_str().unwrap(), "y").unwrap();
    y[31] ^= 1;
    off_curve["y"] = json!(credbroker::internals::jose::b64e(&y));
    let mut p384 = good.clone();
    p384["crv"] = json!("P-384");
    let mut alg_rs = good.clone();
    alg_rs["alg"] = json!("RS256");
    let mut use_enc = good.clone();
    use_enc["use"] = json!("enc");
    let mut x_number = good.clone();
    x_number["x"] = json!(12345);
    let rsa = RsaKey::generate("rsa-in-proof");
    let mut rsa_jwk = rsa.public_jwk();
    rsa_jwk
        .as_object_mut()
        .unwrap()
        .retain(|name, _| ["kty", "n", "e"].contains(&name.as_str()));
    let cases = [
        ("private key (d)", with_d),
        (
            "oct key",
            json!({"kty": "oct", "k": credbroker::internals::jose::b64e(&random_bytes(32))}),
        ),
        ("not an object", json!("a string")),
        ("an array", json!([good.clone()])),
        ("point off the curve", off_curve),
        ("crv P-384 for ES256", p384),
        ("alg RS256 on an EC key", alg_rs),
        ("use enc", use_enc),
        ("x of the wrong type", x_number),
        ("RSA key for an ES256 proof", rsa_jwk),
        ("empty object", json!({})),
    ];
    for (what, jwk) in cases {
        let proof = proof_with(&k, json!({ "jwk": jwk }), &b.proof_claims());
        derive_with(&b, &proof).assert_refused(400, "invalid_dpop_proof", what);
    }
    derive_with(
        &b,
        &proof_with(&k, json!({ "jwk": good }), &b.proof_claims()),
    )
    .assert_issued("public EC key");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_htm_of_another_method_or_case() {
    let b = TestBroker::start();
    let k = key();
    for htm in ["PUT", "post", "Post", "GET", "POST ", ""] {
        let mut c = b.proof_claims();
        c["htm"] = json!(htm);
        derive_with(&b, &proof_with(&k, json!({}), &c)).assert_refused(
            400,
            "invalid_dpop_proof",
            &format!("htm {htm:?}"),
        );
    }
    let mut c = b.proof_claims();
    c["htm"] = json!(["POST"]);
    derive_with(&b, &proof_with(&k, json!({}), &c)).assert_refused(
        400,
        "invalid_dpop_proof",
        "htm as an array",
    );
    derive_with(&b, &b.proof(&k)).assert_issued("htm POST");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_htu_of_another_host_or_path() {
    let b = TestBroker::start();
    let k = key();
    let port = b.issuer.rsplit(':').next().unwrap().to_string();
    for htu in [
        "http://evil.example/v1/derive".to_string(),
        format!("http://127.0.0.2:{port}/v1/derive"),
        format!(
            "http://127.0.0.1:{}/v1/derive",
            port.parse::<u16>().unwrap().wrapping_add(1)
        ),
        format!("https://127.0.0.1:{port}/v1/derive"),
        format!("{}/token", b.issuer),
        format!("{}/v1/derive/", b.issuer),
        format!("{}/v1/Derive", b.issuer),
        format!("{}/V1/derive", b.issuer),
        "/v1/derive".to_string(),
    ] {
        let mut c = b.proof_claims();
        c["htu"] = json!(htu);
        derive_with(&b, &proof_with(&k, json!({}), &c)).assert_refused(
            400,
            "invalid_dpop_proof",
            &format!("htu {htu}"),
        );
    }
    // The refusal names the htu this endpoint expects, and echoes nothing
    // of the proof (its htu included).
    let mut c = b.proof_claims();
    c["htu"] = json!("http://evil.example/v1/derive");
    let r = derive_with(&b, &proof_with(&k, json!({}), &c));
    r.assert_refused(400, "invalid_dpop_proof", "htu of another host");
    let d = r.json()["error_description"].as_str().unwrap().to_string();
    assert!(d.contains(&format!("expects htu {}", b.htu())), "{d}");
    assert!(!d.contains("evil.example"), "{d}");
    // Accepted: a query or fragment is not part of htu, and servers SHOULD
    // apply RFC 3986 syntax-based normalisation (RFC 9449 section 4.3).
    for htu in [
        format!("{}?x=1#f", b.htu()),
        format!("{}/v1/x/../derive", b.issuer),
        b.htu().replace("http://", "HTTP://"),
    ] {
        let mut c = b.proof_claims();
        c["htu"] = json!(htu);
        derive_with(&b, &proof_with(&k, json!({}), &c)).assert_issued(&format!("htu {htu}"));
    }
    derive_with(&b, &b.proof(&k)).assert_issued("exact htu");
    b.derive_ok(&k).await;
}

/// Waits until the start of a wall-clock second, so that the broker's clock
/// (read a few milliseconds later) is in the same second as ours.
fn at_second_start() -> i64 {
    loop {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        if d.subsec_millis() < 100 {
            return d.as_secs() as i64;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[tokio::test]
async fn dpop_proof_iat_outside_the_60s_window() {
    let b = TestBroker::start();
    let k = key();
    // Our clock is read first: a late broker only makes an old iat older;
    // a future iat gets one more second of margin for the same reason.
    for offset in [-61, -3600, 62, 3600] {
        let now = at_second_start();
        let p = make_proof(&k, "POST", &b.htu(), now + offset, None, None).unwrap();
        derive_with(&b, &p).assert_refused(
            400,
            "invalid_dpop_proof",
            &format!("iat now{offset:+}"),
        );
    }
    let mut c = b.proof_claims();
    c["iat"] = json!(now().to_string());
    derive_with(&b, &proof_with(&k, json!({}), &c)).assert_refused(
        400,
        "invalid_dpop_proof",
        "iat as a string",
    );
    // D11: within the window both ways (a proof older than the broker's
    // start, less 5 s, is refused: restart_replay.rs).
    for offset in [-4, 10] {
        let p = make_proof(&k, "POST", &b.htu(), now() + offset, None, None).unwrap();
        derive_with(&b, &p).assert_issued(&format!("iat now{offset:+}"));
    }
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_replayed_twice() {
    let b = TestBroker::start();
    let k = key();
    let p = b.proof(&k);
    derive_with(&b, &p).assert_issued("first use");
    derive_with(&b, &p).assert_refused(400, "invalid_dpop_proof", "same proof again");
    // Replay with another subject and another step of the same tool.
    let body = json!({"subject_token": b.subject_token("bob"), "step": "answer_question",
        "tool": "notes.read", "resource": RESOURCE});
    b.post_derive(&body, Some(&p)).assert_refused(
        400,
        "invalid_dpop_proof",
        "replay with another body",
    );
    // Same jti re-signed in a new proof by the same key: still a replay.
    let mut c = claims_of(&p);
    c["iat"] = json!(now());
    derive_with(&b, &proof_with(&k, json!({}), &c)).assert_refused(
        400,
        "invalid_dpop_proof",
        "same jti, new proof",
    );
    // Positive control: a fresh proof by the same key.
    derive_with(&b, &b.proof(&k)).assert_issued("fresh proof");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn dpop_proof_with_oversized_jti() {
    let b = TestBroker::start();
    let k = key();
    for (what, len) in [
        ("10 KB jti", 10 * 1024),
        ("300 byte jti", 300),
        ("empty jti", 0),
    ] {
        let mut c = b.proof_claims();
        c["jti"] = json!("j".repeat(len));
        let r = derive_with(&b, &proof_with(&k, json!({}), &c));
        r.assert_refused(400, "invalid_dpop_proof", what);
    }
    let mut c = b.proof_claims();
    c["jti"] = json!(12345);
    derive_with(&b, &proof_with(&k, json!({}), &c)).assert_refused(
        400,
        "invalid_dpop_proof",
        "jti as a number",
    );
    let mut c = b.proof_claims();
    c["jti"] = json!("j".repeat(200));
    derive_with(&b, &proof_with(&k, json!({}), &c)).assert_issued("200 byte jti");
    b.derive_ok(&k).await;
}

/// A broker that requires DPoP nonces (`[dpop] require_nonce`).
fn nonce_broker() -> TestBroker {
    TestBroker::start_with(Opts {
        extra_config: "\n[dpop]\nrequire_nonce = true\n".into(),
        ..Opts::default()
    })
}

#[tokio::test]
async fn dpop_nonce_missing_or_stale_when_required() {
    let b = nonce_broker();
    let k = key();
    // No nonce.
    let r = derive_with(&b, &b.proof(&k));
    r.assert_refused(400, "use_dpop_nonce", "proof without a nonce");
    assert!(
        r.header("www-authenticate")
            .unwrap_or_default()
            .contains("use_dpop_nonce"),
        "{}",
        r.raw
    );
    let fresh = r
        .header("dpop-nonce")
        .expect("a fresh DPoP-Nonce header")
        .to_string();

    // Stale nonces: an old time bucket under the server's own tag, one
    // from a bucket long past, garbage, and the nonce of another instance.
    let raw = credbroker::internals::jose::b64d(&fresh, "nonce").unwrap();
    assert!(raw.len() > 8, "nonce = bucket || tag");
    let bucket = i64::from_be_bytes(raw[..8].try_into().unwrap());
    let mut old = (bucket - 2).to_be_bytes().to_vec();
    old.extend_from_slice(&raw[8..]);
    let other = nonce_broker();
    let foreign = derive_with(&other, &other.proof(&k))
        .header("dpop-nonce")
        .expect("other's nonce")
        .to_string();
    for (what, nonce) in [
        (
            "nonce of an older bucket",
            credbroker::internals::jose::b64e(&old),
        ),
        (
            "random nonce",
            credbroker::internals::jose::b64e(&random_bytes(24)),
        ),
        ("nonce of another instance", foreign),
        ("empty nonce", String::new()),
    ] {
        let p = make_proof(&k, "POST", &b.htu(), now(), None, Some(&nonce)).unwrap();
        let r = derive_with(&b, &p);
        r.assert_refused(400, "use_dpop_nonce", what);
        let again = r
            .header("dpop-nonce")
            .unwrap_or_else(|| panic!("{what}: no fresh DPoP-Nonce"));
        assert_ne!(again, nonce, "{what}: the refused nonce was handed back");
    }
    // Positive control: the nonce the server handed out works.
    let p = make_proof(&k, "POST", &b.htu(), now(), None, Some(&fresh)).unwrap();
    derive_with(&b, &p).assert_issued("proof with the fresh nonce");
    // And the client library follows the challenge by itself.
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn the_client_keeps_the_nonce_it_was_handed() {
    let b = nonce_broker();
    let k = key();
    let challenges = |b: &TestBroker| {
        b.audit_lines()
            .iter()
            .filter(|e| e["reason"] == "use_dpop_nonce")
            .count()
    };
    let params = DeriveParams {
        subject_token: &b.subject_token("alice"),
        step: "summarize",
        tool: "notes.read",
        resource: RESOURCE,
        scope: None,
    };
    // Three derives, and a clone's: one challenge, the first; the nonce it
    // handed out serves the rest (RFC 9449 section 8).
    let client = b.client();
    for what in ["first", "second", "third"] {
        let a = client.derive(&params, &k).await.unwrap();
        assert!(matches!(a, Answer::Issued(_)), "{what}: {a:?}");
    }
    let a = client.clone().derive(&params, &k).await.unwrap();
    assert!(matches!(a, Answer::Issued(_)), "the clone: {a:?}");
    assert_eq!(challenges(&b), 1);
    // Positive control: the challenges are counted; a new client, which
    // holds no nonce, is challenged once.
    let a = b.client().derive(&params, &k).await.unwrap();
    assert!(matches!(a, Answer::Issued(_)), "a new client: {a:?}");
    assert_eq!(challenges(&b), 2);
}

#[test]
fn dpop_nonce_from_two_buckets_ago_is_stale() {
    // A genuinely stale nonce needs the server's key and up to 60 s of
    // waiting; the running binary's nonces are checked above, the time
    // rule here, with the same type the binary uses.
    let key = credbroker::internals::secret::SecretBytes::new(random_bytes(32));
    let n = credbroker::internals::dpop::Nonces::new(&key, "host-a/7");
    let t = 1_800_000_000;
    let nonce = n.issue(t);
    assert!(n.check(&nonce, t));
    assert!(n.check(&nonce, t + 30), "valid in the next bucket");
    assert!(!n.check(&nonce, t + 60), "stale two buckets later");
    assert!(!n.check(&nonce, t - 30), "not valid before it was issued");
    let other = credbroker::internals::dpop::Nonces::new(
        &credbroker::internals::secret::SecretBytes::new(random_bytes(32)),
        "host-a/7",
    );
    assert!(!other.check(&nonce, t), "bound to the key that made it");
    let other_replica = credbroker::internals::dpop::Nonces::new(&key, "host-b/7");
    assert!(
        !other_replica.check(&nonce, t),
        "bound to the instance that made it"
    );
    assert!(n.check(&nonce, t), "positive control");
}

/// A resource server for the broker's notes resource.
async fn resource_server(b: &TestBroker) -> Verifier {
    Verifier::from_jwks(&b.issuer, RESOURCE, &b.jwks().await).expect("verifier")
}

const RS_URL: &str = "http://127.0.0.1:9090/notes/items";

#[tokio::test]
async fn resource_server_proof_without_ath_or_ath_of_another_token() {
    let b = TestBroker::start();
    let k = key();
    let token = b.derive_ok(&k).await;
    let token = token.access_token.expose().clone();
    let other = b.derive_ok(&k).await.access_token.expose().clone();
    let rs = resource_server(&b).await;
    let auth = format!("DPoP {token}");
    let present = |proof: &str| {
        rs.verify(&Presented {
            method: "GET",
            url: RS_URL,
            authorization: Some(&auth),
            dpop: &[proof],
        })
    };
    let no_ath = make_proof(&k, "GET", RS_URL, now(), None, None).unwrap();
    assert_eq!(
        present(&no_ath),
        Err(VerifyError::Proof(DpopError::Ath)),
        "ath missing"
    );
    let wrong_ath = make_proof(&k, "GET", RS_URL, now(), Some(&other), None).unwrap();
    assert_eq!(
        present(&wrong_ath),
        Err(VerifyError::Proof(DpopError::Ath)),
        "ath of another token"
    );
    let mut c = claims_of(&no_ath);
    c["ath"] = json!(credbroker::internals::jose::sha256_hex(token.as_bytes()));
    c["jti"] = json!("hex-ath");
    assert_eq!(
        present(&proof_with(&k, json!({}), &c)),
        Err(VerifyError::Proof(DpopError::Ath)),
        "ath hex-encoded"
    );
    // Positive control.
    let good = make_proof(&k, "GET", RS_URL, now(), Some(&token), None).unwrap();
    let who = present(&good).expect("good proof");
    assert_eq!(
        (who.sub.as_str(), who.tool.as_str()),
        ("alice", "notes.read")
    );
}

#[tokio::test]
async fn resource_server_proof_signed_by_a_key_other_than_cnf_jkt() {
    let b = TestBroker::start();
    let (k, thief) = (key(), key());
    let token = b.derive_ok(&k).await.access_token.expose().clone();
    let rs = resource_server(&b).await;
    let auth = format!("DPoP {token}");
    // The stolen token with a perfectly valid proof from the thief's key.
    let p = make_proof(&thief, "GET", RS_URL, now(), Some(&token), None).unwrap();
    let r = rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: Some(&auth),
        dpop: &[&p],
    });
    assert_eq!(r, Err(VerifyError::Proof(DpopError::KeyMismatch)));
    // The thief's key may get its own token from the broker, and that one
    // still does not unlock the first token.
    b.derive_ok(&thief).await;
    let p = make_proof(&thief, "GET", RS_URL, now(), Some(&token), None).unwrap();
    let r = rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: Some(&auth),
        dpop: &[&p],
    });
    assert_eq!(r, Err(VerifyError::Proof(DpopError::KeyMismatch)));
    // Positive control: the bound key.
    let p = make_proof(&k, "GET", RS_URL, now(), Some(&token), None).unwrap();
    rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: Some(&auth),
        dpop: &[&p],
    })
    .expect("bound key");
}

#[tokio::test]
async fn resource_server_minted_token_as_bearer_or_without_proof() {
    let b = TestBroker::start();
    let k = key();
    let token = b.derive_ok(&k).await.access_token.expose().clone();
    let rs = resource_server(&b).await;
    let proof = make_proof(&k, "GET", RS_URL, now(), Some(&token), None).unwrap();
    let bearer = format!("Bearer {token}");
    let r = rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: Some(&bearer),
        dpop: &[&proof],
    });
    assert_eq!(
        r,
        Err(VerifyError::WrongScheme),
        "Bearer with a DPoP-bound token"
    );
    let dpop_auth = format!("DPoP {token}");
    let r = rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: Some(&dpop_auth),
        dpop: &[],
    });
    assert_eq!(r, Err(VerifyError::Proof(DpopError::Missing)), "no proof");
    assert!(
        r.unwrap_err().challenge().starts_with("DPoP "),
        "a 401 challenge for DPoP"
    );
    let r = rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: None,
        dpop: &[&proof],
    });
    assert_eq!(r, Err(VerifyError::NoToken), "no token");
    let r = rs.verify(&Presented {
        method: "GET",
        url: RS_URL,
        authorization: Some(&dpop_auth),
        dpop: &[&proof, &proof],
    });
    assert_eq!(r, Err(VerifyError::Proof(DpopError::Missing)), "two proofs");
    // Positive control: the token, its scheme and its proof (none of the
    // refusals above consumed the proof's jti).
    let v = rs
        .verify(&Presented {
            method: "GET",
            url: RS_URL,
            authorization: Some(&dpop_auth),
            dpop: &[&proof],
        })
        .expect("DPoP token with its proof");
    assert_eq!(v.agent, "repo-helper");
}

#[tokio::test]
async fn dpop_proof_for_the_token_endpoint_used_on_derive() {
    // The client library's own request path, with a proof made for /token.
    let b = TestBroker::start();
    let k = key();
    let st = b.subject_token("alice");
    let params = DeriveParams {
        subject_token: &st,
        step: "summarize",
        tool: "notes.read",
        resource: RESOURCE,
        scope: None,
    };
    let p = make_proof(
        &k,
        "POST",
        &format!("{}/token", b.issuer),
        now(),
        None,
        None,
    )
    .unwrap();
    match b.client().derive_with_proof(&params, &p).await.unwrap() {
        Answer::Refused(r) => assert_eq!((r.status, r.error.as_str()), (400, "invalid_dpop_proof")),
        Answer::Issued(_) => panic!("a proof for /token was accepted on /v1/derive"),
    }
    let p = make_proof(&k, "POST", &b.htu(), now(), None, None).unwrap();
    assert!(matches!(
        b.client().derive_with_proof(&params, &p).await.unwrap(),
        Answer::Issued(_)
    ));
}

#[tokio::test]
async fn dpop_replay_cache_full_refuses_rather_than_forgets() {
    // A tiny cache fills at once; a full cache must refuse new proofs (it
    // cannot tell them from replays), never evict live entries.
    let b = TestBroker::start_with(Opts {
        extra_config: "\n[dpop]\nreplay_capacity = 16\n".into(),
        ..Opts::default()
    });
    let k = key();
    let mut served = Vec::new();
    let mut full = None;
    for _ in 0..64 {
        let p = b.proof(&k);
        let r = derive_with(&b, &p);
        if r.status == 200 {
            served.push(p);
        } else {
            full = Some(r);
            break;
        }
    }
    let r = full.expect("64 proofs fitted in a cache of 16");
    r.assert_refused(503, "temporarily_unavailable", "replay cache full");
    // Exactly the capacity was served before the refusal: the cache is
    // sharded, but the capacity counts over all shards, so two proofs that
    // fall in one shard do not refuse early (none served would also make
    // the replay checks below vacuous).
    assert_eq!(served.len(), 16, "proofs served before the cache was full");
    // Every proof already served is still remembered.
    for p in &served {
        derive_with(&b, p).assert_refused(
            400,
            "invalid_dpop_proof",
            "replay while the cache is full",
        );
    }
    // Positive control: the same request on a broker with room.
    let ok = TestBroker::start();
    derive_with(&ok, &ok.proof(&k)).assert_issued("cache with room");
}
