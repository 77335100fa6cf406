//! docs/SECURITY-CASES.md group J: JWT/JOSE parsing of subject tokens (and proofs)
//! against the running binary. Subject tokens are signed by the quick
//! start's dev issuer key, by a second (RSA) issuer configured for these
//! tests, or forged. Each negative is followed by the positive control.
// Test code panics loudly on a broken fixture: clippy.toml allows unwrap and
// expect in #[test] functions, and these helpers are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;
use credbroker::internals::jose::{b64d, b64e, Es256Key};
use serde_json::json;

/// Derives the known-good request with `subject` and a fresh valid proof.
fn with_subject(b: &TestBroker, subject: &str) -> HttpAnswer {
    b.post_derive(&b.good_body(subject), Some(&b.proof(&key())))
}

#[track_caller]
fn refused(b: &TestBroker, subject: &str, what: &str) {
    with_subject(b, subject).assert_refused(400, "invalid_request", what);
}

const RSA_ISSUER: &str = "http://127.0.0.1:9/rsa-idp";

/// A broker that also trusts an IdP whose JWKS holds an RSA key (`rsa-1`)
/// and an EC key (`ec-1`), and allows it RS256 and ES256 (not PS256).
fn broker_with_rsa_issuer(rsa: &RsaKey, ec: &Es256Key) -> TestBroker {
    let opts = Opts {
        extra_config: format!(
            "\n[[trusted_issuers]]\nissuer = \"{RSA_ISSUER}\"\njwks_file = \"rsa-idp-jwks.json\"\n\
             algs = [\"RS256\", \"ES256\"]\nsign_in = {{ kind = \"oidc\", client_id = \"credbroker-test\" }}\n"
        ),
        ..Opts::default()
    };
    let (dir, config) = prepare(&opts);
    let mut ec_jwk = ec.public_jwk.clone();
    ec_jwk["kid"] = json!("ec-1");
    let jwks = json!({ "keys": [rsa.public_jwk(), ec_jwk] });
    std::fs::write(dir.path().join("rsa-idp-jwks.json"), jwks.to_string()).unwrap();
    TestBroker::spawn(dir, config, None)
}

fn rsa_idp_claims(sub: &str) -> serde_json::Value {
    json!({ "iss": RSA_ISSUER, "sub": sub, "aud": "repo-helper", "iat": now(), "exp": now() + 600 })
}

#[tokio::test]
async fn subject_token_signed_hs256_with_issuer_public_key() {
    let rsa = RsaKey::generate("rsa-1");
    let ec = Es256Key::generate().unwrap().0;
    let b = broker_with_rsa_issuer(&rsa, &ec);
    let dev_jwks = std::fs::read(b.path("dev-issuer-jwks.json")).unwrap();
    let dev: serde_json::Value = serde_json::from_slice(&dev_jwks).unwrap();
    let dev_jwk = dev["keys"][0].clone();
    let dev_kid = dev_jwk["kid"].as_str().unwrap().to_string();
    let mut point = vec![4u8];
    point.extend(b64d(dev_jwk["x"].as_str().unwrap(), "x").unwrap());
    point.extend(b64d(dev_jwk["y"].as_str().unwrap(), "y").unwrap());
    let claims = b.subject_claims("mallory");
    for (what, secret) in [
        ("the JWKS file", dev_jwks.clone()),
        ("the JWK JSON", dev_jwk.to_string().into_bytes()),
        ("the EC point", point),
        (
            "the x coordinate",
            b64d(dev_jwk["x"].as_str().unwrap(), "x").unwrap(),
        ),
    ] {
        let h = json!({"alg": "HS256", "typ": "at+jwt", "kid": dev_kid});
        let forged = jws_with(&h, &claims, |input| hs256(&secret, input));
        refused(
            &b,
            &forged,
            &format!("HS256 keyed with {what} of the dev issuer"),
        );
    }
    // The classic RS256 -> HS256 confusion with the RSA issuer's public key.
    let der = rsa.public_der();
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64_std(&der)
    );
    for (what, secret) in [("DER", der.clone()), ("PEM", pem.into_bytes())] {
        let h = json!({"alg": "HS256", "typ": "at+jwt", "kid": "rsa-1"});
        let forged = jws_with(&h, &rsa_idp_claims("mallory"), |input| {
            hs256(&secret, input)
        });
        refused(
            &b,
            &forged,
            &format!("HS256 keyed with the RSA public key {what}"),
        );
    }
    // Positive controls: both issuers' real algorithms.
    let h = json!({"alg": "RS256", "typ": "at+jwt", "kid": "rsa-1"});
    let good = jws_with(&h, &rsa_idp_claims("carol"), |i| rsa.sign_rs256(i));
    with_subject(&b, &good).assert_issued("RS256 from the RSA issuer");
    b.derive_ok(&key()).await;
}

fn base64_std(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn subject_token_alg_none_with_signature() {
    let b = TestBroker::start();
    let dev = credbroker::internals::cli::load_pem_key(&b.path("keys/dev-issuer.pem")).unwrap();
    let claims = b.subject_claims("mallory");
    for alg in ["none", "None", "NONE", "nOnE"] {
        let h = json!({"alg": alg, "typ": "at+jwt", "kid": dev.kid});
        let signed = jws_with(&h, &claims, |i| dev.sign_raw(i).unwrap());
        refused(
            &b,
            &signed,
            &format!("alg {alg} with a valid ES256 signature"),
        );
        let unsigned = jws_with(&h, &claims, |_| Vec::new());
        refused(&b, &unsigned, &format!("alg {alg} without a signature"));
    }
    // Duplicate alg members: a lenient parser could read either one.
    for header in [
        format!(
            r#"{{"alg":"none","alg":"ES256","typ":"at+jwt","kid":"{}"}}"#,
            dev.kid
        ),
        format!(
            r#"{{"alg":"ES256","alg":"none","typ":"at+jwt","kid":"{}"}}"#,
            dev.kid
        ),
    ] {
        let t = jws_raw(header.as_bytes(), claims.to_string().as_bytes(), &dev);
        refused(&b, &t, "duplicate alg in the header");
    }
    with_subject(&b, &b.subject_with(&claims)).assert_issued("ES256 from the dev issuer");
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn subject_token_ec_alg_with_rsa_key() {
    let rsa = RsaKey::generate("rsa-1");
    let ec = Es256Key::generate().unwrap().0;
    let b = broker_with_rsa_issuer(&rsa, &ec);
    let claims = rsa_idp_claims("mallory");
    // ES256 naming the RSA key, signed by the issuer's own EC key: a key is
    // bound to its type, so the kid cannot lend the EC alg to the RSA key.
    let h = json!({"alg": "ES256", "typ": "at+jwt", "kid": "rsa-1"});
    refused(
        &b,
        &jws_with(&h, &claims, |i| ec.sign_raw(i).unwrap()),
        "ES256 with the RSA key's kid",
    );
    // And the other way round.
    let h = json!({"alg": "RS256", "typ": "at+jwt", "kid": "ec-1"});
    refused(
        &b,
        &jws_with(&h, &claims, |i| rsa.sign_rs256(i)),
        "RS256 with the EC key's kid",
    );
    // PS256 is a valid RSA algorithm, but not in this issuer's allow-list.
    let h = json!({"alg": "PS256", "typ": "at+jwt", "kid": "rsa-1"});
    refused(
        &b,
        &jws_with(&h, &claims, |i| rsa.sign_ps256(i)),
        "PS256 not in the issuer's algs",
    );
    // RS256 for the dev issuer, whose allow-list is ES256 only.
    let h = json!({"alg": "RS256", "typ": "at+jwt", "kid": "rsa-1"});
    refused(
        &b,
        &jws_with(&h, &b.subject_claims("mallory"), |i| rsa.sign_rs256(i)),
        "RS256 claiming the dev issuer",
    );
    // Positive controls: each key with its own algorithm.
    let h = json!({"alg": "RS256", "typ": "at+jwt", "kid": "rsa-1"});
    with_subject(
        &b,
        &jws_with(&h, &rsa_idp_claims("carol"), |i| rsa.sign_rs256(i)),
    )
    .assert_issued("RS256 + rsa-1");
    let h = json!({"alg": "ES256", "typ": "at+jwt", "kid": "ec-1"});
    with_subject(
        &b,
        &jws_with(&h, &rsa_idp_claims("carol"), |i| ec.sign_raw(i).unwrap()),
    )
    .assert_issued("ES256 + ec-1");
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn subject_token_jku_x5u_x5c_jwk_headers_ignored() {
    let b = TestBroker::start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let attacker = key();
    let dev = credbroker::internals::cli::load_pem_key(&b.path("keys/dev-issuer.pem")).unwrap();
    let claims = b.subject_claims("mallory");
    let fake_cert = base64_std(b"not really a certificate, but the broker must not even look");
    let pointers = [
        json!({"jku": format!("{base}/jwks.json")}),
        json!({"x5u": format!("{base}/cert.pem")}),
        json!({"x5c": [fake_cert]}),
        json!({"jwk": attacker.public_jwk}),
        json!({"jku": format!("{base}/jwks.json"), "x5u": format!("{base}/c.pem"), "jwk": attacker.public_jwk}),
    ];
    for p in &pointers {
        // The attacker's key, named by its own kid, by the dev kid, or by none.
        for kid in [json!(attacker.kid), json!(dev.kid), serde_json::Value::Null] {
            let mut h = json!({"alg": "ES256", "typ": "at+jwt", "kid": kid});
            patch(&mut h, p);
            let t = jws_with(&h, &claims, |i| attacker.sign_raw(i).unwrap());
            refused(&b, &t, &format!("attacker key with {p} and kid {kid}"));
        }
    }
    // Positive control: the same headers on a token the pinned key signed
    // are ignored (the token is accepted on the pinned key alone).
    let mut h = json!({"alg": "ES256", "typ": "at+jwt", "kid": dev.kid});
    patch(&mut h, &pointers[4]);
    patch(&mut h, &pointers[2]);
    let t = jws_with(&h, &b.subject_claims("alice"), |i| dev.sign_raw(i).unwrap());
    with_subject(&b, &t).assert_issued("pinned key with jku/x5u/x5c/jwk headers");
    b.derive_ok(&key()).await;
    // No outbound fetch happened at any point.
    std::thread::sleep(std::time::Duration::from_millis(300));
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the broker connected to the jku/x5u listener (from {peer})"),
        Err(e) => panic!("listener: {e}"),
    }
}

#[tokio::test]
async fn subject_token_huge_deeply_nested_or_with_iat_1e400() {
    let mut b = TestBroker::start();
    let dev = credbroker::internals::cli::load_pem_key(&b.path("keys/dev-issuer.pem")).unwrap();
    let header = format!(r#"{{"alg":"ES256","typ":"at+jwt","kid":"{}"}}"#, dev.kid);

    // 1 MB token: the body cap answers before anything is parsed.
    let mut claims = b.subject_claims("alice");
    claims["pad"] = json!("p".repeat(1024 * 1024));
    let huge = b.subject_with(&claims);
    let started = std::time::Instant::now();
    let r = with_subject(&b, &huge);
    r.assert_refused(413, "invalid_request", "1 MB subject token");
    assert!(started.elapsed().as_secs() < 5, "the size cap answers fast");
    // 20 KB token: under the body cap, over the subject-token cap.
    claims["pad"] = json!("p".repeat(20 * 1024));
    let r = with_subject(&b, &b.subject_with(&claims));
    r.assert_refused(400, "invalid_request", "20 KB subject token");
    // The same size cap on the RFC 8693 form.
    let p = credbroker::internals::dpop::make_proof(
        &key(),
        "POST",
        &format!("{}/token", b.issuer),
        now(),
        None,
        None,
    )
    .unwrap();
    let big = b.subject_with(&claims);
    b.post_token(
        &[
            ("grant_type", credbroker::internals::api::TOKEN_EXCHANGE),
            ("subject_token", &big),
            (
                "subject_token_type",
                credbroker::internals::api::ACCESS_TOKEN_TYPE,
            ),
            ("resource", RESOURCE),
            ("step", "summarize"),
            ("tool", "notes.read"),
        ],
        Some(&p),
    )
    .assert_refused(400, "invalid_request", "20 KB subject token on /token");

    // 50k-level nesting: in the request body itself (50 KB, under the body
    // cap), and inside a signed token (over the size caps).
    // (Opening brackets only: closed, it would be over the 64 KB body cap.)
    let body = format!(r#"{{"subject_token":{}"#, "[".repeat(50_000));
    b.http(&http_derive(&body, Some(&b.proof(&key())), ""))
        .assert_refused(400, "invalid_request", "50k-level nesting in the body");
    let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    let payload = format!(r#"{{"iss":"{}","sub":{deep}}}"#, b.issuer);
    // 100 KB of brackets, 133 KB once encoded: the body cap answers before
    // the token is parsed (the 5k case below reaches the parser).
    with_subject(&b, &jws_raw(header.as_bytes(), payload.as_bytes(), &dev)).assert_refused(
        413,
        "invalid_request",
        "50k-level nesting in a token",
    );
    // 5k levels fit under the 16 KB token cap: the JSON parser must refuse
    // them without recursing that deep.
    let deep5k = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
    let payload = format!(
        r#"{{"iss":"{}","sub":"alice","aud":"repo-helper","exp":{},"x":{deep5k}}}"#,
        b.issuer,
        now() + 600
    );
    refused(
        &b,
        &jws_raw(header.as_bytes(), payload.as_bytes(), &dev),
        "5k-level nesting in a signed token",
    );
    let deep_header = format!(
        r#"{{"alg":"ES256","typ":"at+jwt","x":{}{}}}"#,
        "[".repeat(5_000),
        "]".repeat(5_000)
    );
    refused(
        &b,
        &jws_raw(deep_header.as_bytes(), b"{}", &dev),
        "5k-level nesting in a token header",
    );
    // ... and in a DPoP proof header, under the proof cap.
    let deep_proof_header = format!(
        r#"{{"typ":"dpop+jwt","alg":"ES256","x":{}{}}}"#,
        "[".repeat(1_200),
        "]".repeat(1_200)
    );
    let k = key();
    let deep_proof = jws_raw(
        deep_proof_header.as_bytes(),
        b.proof_claims().to_string().as_bytes(),
        &k,
    );
    b.post_derive(&b.good_body(&b.subject_token("alice")), Some(&deep_proof))
        .assert_refused(400, "invalid_dpop_proof", "deep nesting in a proof header");

    // Numbers out of range: iat=1e400, exp=1e400, exp=1e300, exp=-1e400.
    for (what, tail) in [
        ("iat=1e400", format!(r#""iat":1e400,"exp":{}"#, now() + 600)),
        ("exp=1e400", r#""exp":1e400"#.to_string()),
        ("exp=1e300", r#""exp":1e300"#.to_string()),
        ("exp=-1e400", r#""exp":-1e400"#.to_string()),
        (
            "exp=18446744073709551616",
            r#""exp":18446744073709551616"#.to_string(),
        ),
        ("nbf=1e400", format!(r#""nbf":1e400,"exp":{}"#, now() + 600)),
    ] {
        let payload = format!(
            r#"{{"iss":"{}","sub":"alice","aud":"repo-helper",{tail}}}"#,
            b.issuer
        );
        refused(
            &b,
            &jws_raw(header.as_bytes(), payload.as_bytes(), &dev),
            what,
        );
    }
    let proof_claims = format!(
        r#"{{"jti":"{}","htm":"POST","htu":"{}","iat":1e400}}"#,
        b64e(&random_bytes(12)),
        b.htu()
    );
    let k = key();
    let p = jws_raw(
        json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": proof_jwk(&k)})
            .to_string()
            .as_bytes(),
        proof_claims.as_bytes(),
        &k,
    );
    b.post_derive(&b.good_body(&b.subject_token("alice")), Some(&p))
        .assert_refused(400, "invalid_dpop_proof", "proof iat=1e400");

    // No crash, no stuck connection: the broker still serves.
    assert!(b.is_running(), "the broker died: {}", b.log_text());
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn subject_token_with_crit_header() {
    let b = TestBroker::start();
    let dev = credbroker::internals::cli::load_pem_key(&b.path("keys/dev-issuer.pem")).unwrap();
    let claims = b.subject_claims("alice");
    for (what, extra) in [
        (
            "unknown crit entry",
            json!({"crit": ["urn:example:unknown"], "urn:example:unknown": true}),
        ),
        ("crit b64", json!({"crit": ["b64"], "b64": false})),
        ("crit b64 true", json!({"crit": ["b64"], "b64": true})),
        ("empty crit", json!({"crit": []})),
        ("crit of the wrong type", json!({"crit": "exp"})),
        ("crit naming a registered header", json!({"crit": ["alg"]})),
        ("b64 false without crit", json!({"b64": false})),
    ] {
        let mut h = json!({"alg": "ES256", "typ": "at+jwt", "kid": dev.kid});
        patch(&mut h, &extra);
        refused(
            &b,
            &jws_with(&h, &claims, |i| dev.sign_raw(i).unwrap()),
            what,
        );
        // The same headers on a DPoP proof.
        let k = key();
        let p = proof_with(&k, extra.clone(), &b.proof_claims());
        b.post_derive(&b.good_body(&b.subject_token("alice")), Some(&p))
            .assert_refused(400, "invalid_dpop_proof", &format!("proof with {what}"));
    }
    // An unprotected crit only exists in the JSON serialisation, which is
    // not a compact JWS and is refused as such.
    let compact = b.subject_with(&claims);
    let parts: Vec<&str> = compact.split('.').collect();
    let json_serialised = json!({
        "payload": parts[1], "protected": parts[0], "signature": parts[2],
        "header": {"crit": ["urn:example:unknown"]},
    });
    refused(
        &b,
        &json_serialised.to_string(),
        "JSON serialisation with an unprotected crit",
    );
    with_subject(&b, &compact).assert_issued("the same token, compact, without crit");
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn subject_token_claims_of_the_wrong_type() {
    let b = TestBroker::start();
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("aud as an object", json!({"aud": {"repo-helper": true}})),
        ("aud as a number", json!({"aud": 7})),
        (
            "aud array with a number",
            json!({"aud": ["repo-helper", 7]}),
        ),
        ("aud of another agent", json!({"aud": "other-agent"})),
        ("aud missing", json!({"aud": null})),
        ("exp as a string", json!({"exp": (now() + 600).to_string()})),
        ("exp as a boolean", json!({"exp": true})),
        ("exp missing", json!({"exp": null})),
        ("sub as a number", json!({"sub": 42})),
        ("sub empty", json!({"sub": ""})),
        ("sub as an object", json!({"sub": {"id": "alice"}})),
        ("sub missing", json!({"sub": null})),
        ("iss as an array", json!({"iss": [b.issuer.clone()]})),
        ("nbf as a string", json!({"nbf": "0"})),
        ("cnf as a string", json!({"cnf": "jkt"})),
        ("cnf as an object", json!({"cnf": {"jkt": "abc"}})),
        ("an ID token (nonce)", json!({"nonce": "n-0S6_WzA2Mj"})),
        (
            "an ID token (at_hash)",
            json!({"at_hash": "77QmUPtjPfzWtF2AnpK9RQ"}),
        ),
    ];
    for (what, change) in cases {
        let mut c = b.subject_claims("alice");
        patch(&mut c, &change);
        refused(&b, &b.subject_with(&c), what);
    }
    // A nested act in the subject token decides nothing: the minted token's
    // act names this instance's agent, the tool and the step, and nothing
    // else.
    let mut c = b.subject_claims("alice");
    c["act"] = json!({"sub": "mallory-agent", "act": {"sub": "repo-helper"}});
    let token =
        with_subject(&b, &b.subject_with(&c)).assert_issued("subject token with a nested act");
    let minted = claims_of(&token);
    assert_eq!(
        minted["act"],
        json!({"sub": "repo-helper", "tool": "notes.read", "step": "summarize"}),
        "{minted}"
    );
    assert_eq!(minted["sub"], "alice");
    let mut c = b.subject_claims("alice");
    c["act"] = json!("mallory-agent");
    let token =
        with_subject(&b, &b.subject_with(&c)).assert_issued("subject token with a string act");
    assert_eq!(claims_of(&token)["act"]["sub"], "repo-helper");
    b.derive_ok(&key()).await;
}
