//! Shared test vectors for every verifier (Rust, Python, TypeScript):
//! `tests/vectors/resource-server.json`, one request per case (token, proofs,
//! method, URL, time) and the verdict, covering the hostile tokens and proofs
//! of docs/RESOURCE-SERVERS.md section 5, and sequences of requests to one
//! verifier (a single-use token accepted once) with what each accepted
//! request's answer carries. `credbroker::verify` must reach
//! each verdict here; `clients/python/tests/unit/test_vectors.py` holds the Python
//! verifier to the same file, and `clients/typescript/test/unit/vectors.test.ts`
//! the TypeScript one.
//!
//! The file is committed (signatures are randomised, so it is written once,
//! not on every run): `CREDBROKER_WRITE_VECTORS=1 cargo test --test it
//! vectors` writes it anew from [`build`].
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::PathBuf;

use credbroker::internals::clock::ManualClock;
use credbroker::internals::jose::{b64e, sha256_b64, Es256Key};
use credbroker::verify::{Presented, Verifier};
use serde_json::{json, Value};

use crate::support::jose::{ec_thumbprint, hs256, jws_with, proof_jwk, proof_with};

const T: i64 = 1_795_960_000;
const ISSUER: &str = "https://broker.example";
const AUDIENCE: &str = "https://notes.example/notes";

fn file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/resource-server.json")
}

fn token(issuer: &Es256Key, header: Value, claims: Value) -> String {
    jws_with(&header, &claims, |i| issuer.sign_raw(i).unwrap())
}

/// The cases: a good request, then each hostile variant. `times` > 1 sends
/// the same request again; the verdict is the last answer's.
fn build() -> Value {
    let issuer = Es256Key::generate().unwrap().0;
    let tool = Es256Key::generate().unwrap().0;
    let thief = Es256Key::generate().unwrap().0;
    let jkt = ec_thumbprint(&proof_jwk(&tool));
    let header = json!({"alg": "ES256", "typ": "at+jwt", "kid": issuer.kid});
    let claims = json!({
        "iss": ISSUER, "sub": "alice", "subject_iss": "https://idp.example",
        "aud": AUDIENCE, "scope": "notes.read",
        "act": {"sub": "repo-helper", "tool": "notes.read"}, "client_id": "repo-helper",
        "cnf": {"jkt": jkt}, "iat": T, "exp": T + 300, "jti": "vector-token-1",
    });
    let good = token(&issuer, header.clone(), claims.clone());
    let with = |h: Value, c: Value| {
        let mut hh = header.clone();
        crate::support::jose::patch(&mut hh, &h);
        let mut cc = claims.clone();
        crate::support::jose::patch(&mut cc, &c);
        token(&issuer, hh, cc)
    };
    let proof = |key: &Es256Key, at: &str, htm: &str, htu: &str, iat: i64, patch: Value| {
        let mut c = json!({"jti": b64e(&crate::support::random_bytes(12)), "htm": htm, "htu": htu,
                           "iat": iat, "ath": sha256_b64(at.as_bytes())});
        crate::support::jose::patch(&mut c, &patch);
        proof_with(key, json!({}), &c)
    };
    let p = |at: &str| proof(&tool, at, "GET", AUDIENCE, T + 10, json!({}));
    let case = |name: &str, at: &str, scheme: &str, proofs: Vec<String>, verdict: &str| {
        json!({"name": name, "authorization": format!("{scheme} {at}"), "dpop": proofs,
               "method": "GET", "url": AUDIENCE, "now": T + 10, "times": 1, "verdict": verdict})
    };
    let mut cases = vec![
        case("good_request", &good, "DPoP", vec![p(&good)], "ok"),
        case(
            "bearer_scheme_with_a_proof",
            &good,
            "Bearer",
            vec![p(&good)],
            "invalid_token",
        ),
        case(
            "bearer_scheme_without_a_proof",
            &good,
            "Bearer",
            vec![],
            "invalid_token",
        ),
        case("no_proof", &good, "DPoP", vec![], "invalid_dpop_proof"),
        case(
            "two_proofs",
            &good,
            "DPoP",
            vec![p(&good), p(&good)],
            "invalid_dpop_proof",
        ),
        case(
            "proof_from_another_key",
            &good,
            "DPoP",
            vec![proof(&thief, &good, "GET", AUDIENCE, T + 10, json!({}))],
            "invalid_dpop_proof",
        ),
        case(
            "proof_for_another_method",
            &good,
            "DPoP",
            vec![proof(&tool, &good, "POST", AUDIENCE, T + 10, json!({}))],
            "invalid_dpop_proof",
        ),
        case(
            "proof_with_a_lower_case_method",
            &good,
            "DPoP",
            vec![proof(&tool, &good, "get", AUDIENCE, T + 10, json!({}))],
            "invalid_dpop_proof",
        ),
        case(
            "proof_for_another_path",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                &good,
                "GET",
                "https://notes.example/other",
                T + 10,
                json!({}),
            )],
            "invalid_dpop_proof",
        ),
        case(
            "proof_for_another_host",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                &good,
                "GET",
                "https://evil.example/notes",
                T + 10,
                json!({}),
            )],
            "invalid_dpop_proof",
        ),
        case(
            "proof_for_another_port",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                &good,
                "GET",
                "https://notes.example:8443/notes",
                T + 10,
                json!({}),
            )],
            "invalid_dpop_proof",
        ),
        case(
            "proof_for_another_scheme",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                &good,
                "GET",
                "http://notes.example/notes",
                T + 10,
                json!({}),
            )],
            "invalid_dpop_proof",
        ),
        case(
            "proof_htu_with_default_port_and_upper_case_host",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                &good,
                "GET",
                "https://NOTES.example:443/notes",
                T + 10,
                json!({}),
            )],
            "ok",
        ),
        case(
            "proof_with_ath_of_another_token",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                "another-token",
                "GET",
                AUDIENCE,
                T + 10,
                json!({}),
            )],
            "invalid_dpop_proof",
        ),
        case(
            "proof_without_ath",
            &good,
            "DPoP",
            vec![proof(
                &tool,
                &good,
                "GET",
                AUDIENCE,
                T + 10,
                json!({"ath": null}),
            )],
            "invalid_dpop_proof",
        ),
        case(
            "proof_iat_61_s_old",
            &good,
            "DPoP",
            vec![proof(&tool, &good, "GET", AUDIENCE, T + 10 - 61, json!({}))],
            "invalid_dpop_proof",
        ),
        case(
            "proof_iat_61_s_ahead",
            &good,
            "DPoP",
            vec![proof(&tool, &good, "GET", AUDIENCE, T + 10 + 61, json!({}))],
            "invalid_dpop_proof",
        ),
        case(
            "proof_iat_60_s_old",
            &good,
            "DPoP",
            vec![proof(&tool, &good, "GET", AUDIENCE, T + 10 - 60, json!({}))],
            "ok",
        ),
        case(
            "token_for_another_audience",
            &with(json!({}), json!({"aud": "https://notes.example/other"})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_with_audience_as_an_array",
            &with(json!({}), json!({"aud": [AUDIENCE]})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_from_another_issuer",
            &with(json!({}), json!({"iss": "https://evil.example"})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_naming_an_unknown_kid",
            &with(json!({"kid": "unknown"}), json!({})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_with_typ_jwt",
            &with(json!({"typ": "JWT"}), json!({})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_with_typ_dpop_jwt",
            &with(json!({"typ": "dpop+jwt"}), json!({})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_with_unknown_crit",
            &with(json!({"crit": ["exp_v2"], "exp_v2": 1}), json!({})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        {
            let upper = with(json!({"typ": "AT+JWT"}), json!({}));
            case(
                "token_with_typ_in_upper_case",
                &upper,
                "DPoP",
                vec![p(&upper)],
                "ok",
            )
        },
        {
            let no_jti = with(json!({}), json!({"jti": null}));
            case(
                "token_without_jti",
                &no_jti,
                "DPoP",
                vec![p(&no_jti)],
                "invalid_token",
            )
        },
        case(
            "token_missing_cnf",
            &with(json!({}), json!({"cnf": null})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
        case(
            "token_with_string_exp",
            &with(json!({}), json!({"exp": (T + 300).to_string()})),
            "DPoP",
            vec![],
            "invalid_token",
        ),
    ];
    // A replayed proof: the same request twice.
    let mut replay = case(
        "replayed_proof",
        &good,
        "DPoP",
        vec![p(&good)],
        "invalid_dpop_proof",
    );
    replay["times"] = 2.into();
    cases.push(replay);
    // A private key in the proof's jwk.
    let mut c = json!({"jti": "private-jwk", "htm": "GET", "htu": AUDIENCE, "iat": T + 10,
                       "ath": sha256_b64(good.as_bytes())});
    let mut jwk = proof_jwk(&tool);
    jwk["d"] = json!(b64e(&[7u8; 32]));
    let private = proof_with(&tool, json!({"jwk": jwk}), &c);
    cases.push(case(
        "proof_jwk_with_a_private_key",
        &good,
        "DPoP",
        vec![private],
        "invalid_dpop_proof",
    ));
    c["jti"] = json!("typ-jwt");
    let typ = proof_with(&tool, json!({"typ": "JWT"}), &c);
    cases.push(case(
        "proof_with_typ_jwt",
        &good,
        "DPoP",
        vec![typ],
        "invalid_dpop_proof",
    ));
    // A changed claim under the original signature.
    let sig = good.rsplit('.').next().unwrap();
    let mut widened = claims.clone();
    widened["scope"] = json!("notes.read notes.delete");
    let changed = format!(
        "{}.{}.{sig}",
        b64e(header.to_string().as_bytes()),
        b64e(widened.to_string().as_bytes())
    );
    cases.push(case(
        "token_with_a_changed_claim",
        &changed,
        "DPoP",
        vec![p(&changed)],
        "invalid_token",
    ));
    // alg none, and HS256 keyed with the issuer's public JWK.
    let none = format!(
        "{}.{}.",
        b64e(
            json!({"alg": "none", "typ": "at+jwt", "kid": issuer.kid})
                .to_string()
                .as_bytes()
        ),
        b64e(claims.to_string().as_bytes())
    );
    cases.push(case(
        "token_with_alg_none",
        &none,
        "DPoP",
        vec![p(&none)],
        "invalid_token",
    ));
    let hs = jws_with(
        &json!({"alg": "HS256", "typ": "at+jwt", "kid": issuer.kid}),
        &claims,
        |i| hs256(issuer.public_jwk.to_string().as_bytes(), i),
    );
    cases.push(case(
        "token_with_hs256_keyed_with_the_public_jwk",
        &hs,
        "DPoP",
        vec![p(&hs)],
        "invalid_token",
    ));
    // Time: after exp (with the 5 s skew), one second before, and a token
    // issued in the future.
    let at = |name: &str, now: i64, verdict: &str| {
        let mut c = case(
            name,
            &good,
            "DPoP",
            vec![proof(&tool, &good, "GET", AUDIENCE, now, json!({}))],
            verdict,
        );
        c["now"] = now.into();
        c
    };
    cases.push(at("token_after_exp_and_skew", T + 305, "invalid_token"));
    cases.push(at("token_one_second_before_exp_and_skew", T + 304, "ok"));
    cases.push(at("token_issued_in_the_future", T - 6, "invalid_token"));
    // A query on the request URL is ignored (the proof's htu has none).
    let mut q = case(
        "request_url_with_a_query",
        &good,
        "DPoP",
        vec![p(&good)],
        "ok",
    );
    q["url"] = json!(format!("{AUDIENCE}?page=2"));
    cases.push(q);
    // The claims of approved calls, of the wrong type (the sequences below
    // have them right).
    for (name, patch) in [
        (
            "token_with_single_use_as_a_string",
            json!({"single_use": "true"}),
        ),
        (
            "token_with_approval_id_as_a_number",
            json!({"approval_id": 7}),
        ),
        (
            "token_with_act_step_as_a_number",
            json!({"act": {"sub": "repo-helper", "tool": "notes.read", "step": 2}}),
        ),
    ] {
        let t = with(json!({}), patch);
        cases.push(case(name, &t, "DPoP", vec![p(&t)], "invalid_token"));
    }
    json!({
        "about": ABOUT,
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "jwks": {"keys": [issuer.public_jwk]},
        "cases": cases,
        "sequences": sequences(&issuer, &tool, &claims),
    })
}

const ABOUT: &str = "Shared verifier vectors. Each of `cases` is one request (Authorization, every DPoP header, method, URL) verified at `now` (seconds) by a verifier for `issuer` and `audience` with the keys `jwks`; a fresh verifier (and replay cache) per case, the request sent `times` times; `verdict` is the last answer: ok, invalid_token or invalid_dpop_proof (the WWW-Authenticate error). Each of `sequences` is a list of `requests` (the same members as a case, without `times`) sent in order to one fresh verifier (one replay cache and one single-use store for the whole sequence), each with its own `verdict`; an `ok` request has a `result`: what the verifier's answer carries of an approved call (single_use, approval_id, authorization_details, step; null when the token has none). A request with `body` (and `content_type`, null for none) hands the verifier the request's body and Content-Type as received, for a token bound to one request (`req_sha256`, RESOURCE-SERVERS.md check 20); without `body` such a token is refused. Written by tests/it/interop/vectors.rs.";

/// The sequences: requests sent in order to one verifier, for what only a
/// second request shows (a single-use token is accepted once).
fn sequences(issuer: &Es256Key, tool: &Es256Key, claims: &Value) -> Value {
    let header = json!({"alg": "ES256", "typ": "at+jwt", "kid": issuer.kid});
    let details = json!([{"type": "notes", "actions": ["delete"], "locations": [AUDIENCE],
                          "identifier": "note-7"}]);
    // A token of an `each_call` approval, with its `jti`.
    let single = |jti: &str, scope: &str| {
        let mut c = claims.clone();
        crate::support::jose::patch(
            &mut c,
            &json!({"jti": jti, "scope": scope, "single_use": true, "approval_id": "apr-vector-1",
                    "authorization_details": details,
                    "act": {"sub": "repo-helper", "tool": "notes.read", "step": "cleanup"}}),
        );
        token(issuer, header.clone(), c)
    };
    let plain = token(issuer, header.clone(), claims.clone());
    let req = |at: &str, htm: &str, verdict: &str| {
        let proof = proof_with(
            tool,
            json!({}),
            &json!({"jti": b64e(&crate::support::random_bytes(12)), "htm": htm,
                    "htu": AUDIENCE, "iat": T + 10, "ath": sha256_b64(at.as_bytes())}),
        );
        json!({"authorization": format!("DPoP {at}"), "dpop": [proof], "method": "GET",
               "url": AUDIENCE, "now": T + 10, "verdict": verdict})
    };
    let ok = |at: &str, result: Value| {
        let mut r = req(at, "GET", "ok");
        r["result"] = result;
        r
    };
    let approved = json!({"single_use": true, "approval_id": "apr-vector-1",
                          "authorization_details": details, "step": "cleanup"});
    let none = json!({"single_use": false, "approval_id": null,
                      "authorization_details": null, "step": null});
    let once = single("vector-single-use-1", "notes.delete");
    let first_refused = single("vector-single-use-2", "notes.delete");
    let same_jti = single("vector-single-use-3", "notes.delete");
    let same_jti_other_scope = single("vector-single-use-3", "notes.read");
    let other_jti = single("vector-single-use-4", "notes.delete");
    // A single-use token bound to one request: POST to the audience with
    // the JSON body `BOUND` (its members in this order).
    const BOUND: &str = r#"{"note":"note-7","reason":"duplicate"}"#;
    let bound_sha = credbroker::verify::request::bind(&credbroker::verify::request::BoundRequest {
        method: "POST",
        path: "/notes",
        query: "",
        content_type: "application/json",
        body: BOUND.as_bytes(),
    })
    .unwrap()
    .sha256;
    let bound = {
        let mut c = claims.clone();
        crate::support::jose::patch(
            &mut c,
            &json!({"jti": "vector-bound-1", "scope": "notes.delete", "single_use": true,
                    "approval_id": "apr-vector-2", "req_sha256": bound_sha,
                    "act": {"sub": "repo-helper", "tool": "notes.delete", "step": "cleanup"}}),
        );
        token(issuer, header.clone(), c)
    };
    let post = |body: Option<&str>, content_type: Option<&str>, verdict: &str| {
        let mut r = req(&bound, "POST", verdict);
        r["method"] = "POST".into();
        if let Some(b) = body {
            r["body"] = b.into();
            r["content_type"] = content_type.into();
        }
        if verdict == "ok" {
            r["result"] = json!({"single_use": true, "approval_id": "apr-vector-2",
                                 "authorization_details": null, "step": "cleanup"});
        }
        r
    };
    let json_type = Some("application/json");
    json!([
        {"name": "single_use_token_presented_twice", "requests": [
            ok(&once, approved.clone()),
            // A fresh proof: the refusal is the token's, not a proof replay.
            req(&once, "GET", "invalid_token"),
        ]},
        {"name": "ordinary_token_presented_twice", "requests": [
            ok(&plain, none.clone()),
            ok(&plain, none),
        ]},
        {"name": "single_use_token_refused_first_is_not_used_up", "requests": [
            req(&first_refused, "POST", "invalid_dpop_proof"),
            ok(&first_refused, approved.clone()),
            req(&first_refused, "GET", "invalid_token"),
        ]},
        {"name": "single_use_is_per_issuer_and_jti_not_per_token", "requests": [
            ok(&same_jti, approved.clone()),
            req(&same_jti_other_scope, "GET", "invalid_token"),
            ok(&other_jti, approved),
        ]},
        {"name": "single_use_token_bound_to_one_request", "requests": [
            // No body handed over, another body, another content type:
            // refused, and the token is not used up by them.
            post(None, None, "invalid_token"),
            post(Some(r#"{"note":"note-8","reason":"duplicate"}"#), json_type, "invalid_token"),
            post(Some(BOUND), Some("text/plain"), "invalid_token"),
            post(Some(BOUND), None, "invalid_token"),
            // The bound request, its members reordered and spaced: once.
            post(Some(r#"{ "reason": "duplicate", "note": "note-7" }"#), json_type, "ok"),
            post(Some(BOUND), json_type, "invalid_token"),
        ]},
    ])
}

fn verdict(v: &Value, case: &Value) -> String {
    let jwks = serde_json::to_vec(&v["jwks"]).unwrap();
    let clock = ManualClock::new(case["now"].as_i64().unwrap());
    let verifier = Verifier::from_jwks(
        v["issuer"].as_str().unwrap(),
        v["audience"].as_str().unwrap(),
        &jwks,
    )
    .unwrap()
    .with_clock(clock);
    let dpop: Vec<&str> = case["dpop"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let req = Presented {
        method: case["method"].as_str().unwrap(),
        url: case["url"].as_str().unwrap(),
        authorization: case["authorization"].as_str(),
        dpop: &dpop,
    };
    let mut last = String::new();
    for _ in 0..case["times"].as_u64().unwrap() {
        last = match verifier.verify(&req) {
            Ok(_) => "ok".into(),
            Err(e) => {
                let c = e.challenge();
                c.split("error=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("missing")
                    .to_owned()
            }
        };
    }
    last
}

/// What a sequence got wrong: each request sent in order to one verifier,
/// its verdict and (when accepted) its answer's approved-call fields
/// compared with the file's.
fn sequence_errors(v: &Value, seq: &Value) -> Vec<String> {
    let jwks = serde_json::to_vec(&v["jwks"]).unwrap();
    let clock = ManualClock::new(0);
    let verifier = Verifier::from_jwks(
        v["issuer"].as_str().unwrap(),
        v["audience"].as_str().unwrap(),
        &jwks,
    )
    .unwrap()
    .with_clock(clock.clone());
    let mut wrong = Vec::new();
    for (i, r) in seq["requests"].as_array().unwrap().iter().enumerate() {
        clock.set(r["now"].as_i64().unwrap());
        let dpop: Vec<&str> = r["dpop"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        let presented = Presented {
            method: r["method"].as_str().unwrap(),
            url: r["url"].as_str().unwrap(),
            authorization: r["authorization"].as_str(),
            dpop: &dpop,
        };
        let got = match r.get("body").and_then(Value::as_str) {
            Some(body) => verifier.verify_request(
                &presented,
                r["content_type"].as_str().unwrap_or_default(),
                body.as_bytes(),
            ),
            None => verifier.verify(&presented),
        };
        let (verdict, result) = match got {
            Ok(w) => (
                "ok".to_owned(),
                json!({"single_use": w.single_use, "approval_id": w.approval_id,
                       "authorization_details": w.authorization_details, "step": w.step}),
            ),
            Err(e) => (error_code(&e.challenge()), Value::Null),
        };
        if verdict != r["verdict"] || (verdict == "ok" && result != r["result"]) {
            wrong.push(format!(
                "{} request {i}: {verdict} {result}, want {} {}",
                seq["name"], r["verdict"], r["result"]
            ));
        }
    }
    wrong
}

fn error_code(challenge: &str) -> String {
    challenge
        .split("error=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("missing")
        .to_owned()
}

#[test]
fn shared_verifier_sequences_reach_their_verdicts_in_credbroker_verify() {
    let v: Value =
        serde_json::from_slice(&std::fs::read(file()).expect("tests/vectors/resource-server.json"))
            .unwrap();
    let names = |v: &Value| -> Vec<String> {
        v["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&v),
        names(&build()),
        "regenerate with CREDBROKER_WRITE_VECTORS=1"
    );
    let wrong: Vec<String> = v["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| sequence_errors(&v, s))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Negative control of the comparison: the single-use token's first
    // request, sent again to the same verifier with the same proof, is
    // refused (either way, the sequence's answer would differ).
    let seq = &v["sequences"][0];
    assert_eq!(seq["name"], "single_use_token_presented_twice");
    let mut twice = seq.clone();
    let first = twice["requests"][0].clone();
    twice["requests"][1] = first;
    assert_eq!(sequence_errors(&v, &twice).len(), 1);
}

#[test]
fn shared_verifier_vectors_reach_their_verdicts_in_credbroker_verify() {
    if std::env::var_os("CREDBROKER_WRITE_VECTORS").is_some() {
        std::fs::create_dir_all(file().parent().unwrap()).unwrap();
        std::fs::write(
            file(),
            serde_json::to_string_pretty(&build()).unwrap() + "\n",
        )
        .unwrap();
    }
    let v: Value =
        serde_json::from_slice(&std::fs::read(file()).expect("tests/vectors/resource-server.json"))
            .unwrap();
    // The committed file has exactly the generator's cases.
    let names = |v: &Value| -> Vec<String> {
        v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&v),
        names(&build()),
        "regenerate with CREDBROKER_WRITE_VECTORS=1"
    );
    let mut wrong = Vec::new();
    for case in v["cases"].as_array().unwrap() {
        let got = verdict(&v, case);
        if got != case["verdict"].as_str().unwrap() {
            wrong.push(format!("{}: {got}, want {}", case["name"], case["verdict"]));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The file holds both kinds of verdict, so the loop could fail either way.
    let verdicts: std::collections::HashSet<_> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["verdict"].as_str().unwrap())
        .collect();
    assert!(
        verdicts.contains("ok")
            && verdicts.contains("invalid_token")
            && verdicts.contains("invalid_dpop_proof")
    );
}
