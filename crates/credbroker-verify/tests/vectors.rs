//! The shared verifier vectors (`tests/vectors/resource-server.json` at the
//! workspace root, written by the broker's `tests/it/interop/vectors.rs`)
//! run against this crate itself, with its default features (verification
//! only): every case reaches its verdict, and every sequence (requests to
//! one verifier: a single-use token accepted once) its verdicts and
//! results. The Python and TypeScript verifiers are held to the same file.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::collections::HashSet;
use std::path::PathBuf;

use credbroker_verify::{ManualClock, Presented, Verifier};
use serde_json::{json, Value};

fn vectors() -> Value {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/resource-server.json");
    serde_json::from_slice(&std::fs::read(&file).expect("tests/vectors/resource-server.json"))
        .unwrap()
}

/// The last answer to the case's request, sent `times` times to a fresh
/// verifier: `ok`, or the `error` of its `WWW-Authenticate` challenge.
fn verdict(v: &Value, case: &Value) -> String {
    let jwks = serde_json::to_vec(&v["jwks"]).unwrap();
    let verifier = Verifier::from_jwks(
        v["issuer"].as_str().unwrap(),
        v["audience"].as_str().unwrap(),
        &jwks,
    )
    .unwrap()
    .with_clock(ManualClock::new(case["now"].as_i64().unwrap()));
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
            Err(e) => e
                .challenge()
                .split("error=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("missing")
                .to_owned(),
        };
    }
    last
}

#[test]
fn shared_verifier_vectors_reach_their_verdicts_in_the_embedder_crate() {
    let v = vectors();
    let cases = v["cases"].as_array().unwrap();
    // The file holds the whole list (the broker's test checks it against
    // its generator), not a stub.
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut wrong = Vec::new();
    for case in cases {
        let got = verdict(&v, case);
        if got != case["verdict"].as_str().unwrap() {
            wrong.push(format!("{}: {got}, want {}", case["name"], case["verdict"]));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Every kind of verdict is there, so the loop could fail either way.
    let verdicts: HashSet<_> = cases
        .iter()
        .map(|c| c["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(
        verdicts,
        HashSet::from(["ok", "invalid_token", "invalid_dpop_proof"])
    );
}

#[test]
fn a_case_with_its_verdict_changed_is_caught() {
    // Negative control of the comparison above: the good request, replayed
    // (sent twice), is refused the second time; sent once it is accepted.
    let v = vectors();
    let good = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "good_request")
        .unwrap()
        .clone();
    let mut twice = good.clone();
    twice["times"] = 2.into();
    assert_eq!(verdict(&v, &twice), "invalid_dpop_proof");
    assert_eq!(verdict(&v, &good), "ok");
}

/// What a sequence got wrong: its requests sent in order to one fresh
/// verifier, each verdict and (when accepted) the answer's approved-call
/// fields compared with the file's.
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
        // A request with a body hands it over (a token bound to one request).
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
            Err(e) => (
                e.challenge()
                    .split("error=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("missing")
                    .to_owned(),
                Value::Null,
            ),
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

#[test]
fn shared_verifier_sequences_reach_their_verdicts_in_the_embedder_crate() {
    let v = vectors();
    let seqs = v["sequences"].as_array().unwrap();
    assert!(
        seqs.iter()
            .any(|s| s["name"] == "single_use_token_presented_twice"),
        "the single-use sequence is in the file"
    );
    let wrong: Vec<String> = seqs.iter().flat_map(|s| sequence_errors(&v, s)).collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}
