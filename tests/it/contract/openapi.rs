//! Every example in `proto/*openapi.yaml` validates against its own
//! definition (`tests/peers/validate_openapi_examples.py`: PyYAML and the
//! PyPI `jsonschema`, resolving `$ref`s within each file and to
//! `refusal.schema.json`, so every refusal example is also held to the
//! refusal schema); and an example that drifts is caught.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::contract::repo;

const FILES: [&str; 3] = ["openapi.yaml", "pages-openapi.yaml", "admin-openapi.yaml"];

const INSTALL: &str = "run scripts/install-test-deps (it installs the PyPI packages jsonschema and PyYAML into .venv)";

/// One verdict per example: (file, JSON pointer, valid, errors).
fn verdicts(dir: &Path) -> Vec<(String, String, bool, String)> {
    let py = repo(".venv/bin/python");
    let out = Command::new(&py)
        .arg(repo("tests/peers/validate_openapi_examples.py"))
        .args(FILES.iter().map(|f| dir.join(f)))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): {INSTALL}", py.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(3) => panic!("the example validator is missing a dependency: {stderr}\n{INSTALL}"),
        other => panic!("the example validator failed ({other:?}): {stderr}"),
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                r["file"].as_str().unwrap().to_string(),
                r["at"].as_str().unwrap().to_string(),
                r["valid"].as_bool().unwrap(),
                r["errors"].to_string(),
            )
        })
        .collect()
}

/// A copy of proto/ (the OpenAPI files and the JSON schemas they refer to).
fn proto_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo("proto")).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let path = dir.path().to_path_buf();
    (dir, path)
}

#[test]
fn every_openapi_example_matches_its_definition() {
    let v = verdicts(&repo("proto"));
    let bad: Vec<_> = v.iter().filter(|x| !x.2).collect();
    assert!(bad.is_empty(), "examples that do not match: {bad:#?}");
    // Every file has examples, and the ones this contract is about are
    // there (a validator that found none would pass the check above).
    for f in FILES {
        assert!(v.iter().any(|x| x.0 == f), "{f} has no example");
    }
    for (file, at) in [
        ("openapi.yaml", "/examples/approval_required/value"),
        ("openapi.yaml", "/examples/with_details/value"),
        ("openapi.yaml", "/components/schemas/Issued/examples/1"),
        ("openapi.yaml", "/examples/declined/value"),
        (
            "pages-openapi.yaml",
            "/components/responses/ProxyUnauthorized",
        ),
        ("pages-openapi.yaml", "/paths/~1healthz/get"),
        ("admin-openapi.yaml", "/responses/409/"),
    ] {
        assert!(
            v.iter().any(|x| x.0 == file && x.1.contains(at)),
            "no example at {file} {at}: {v:#?}"
        );
    }
}

#[test]
fn an_example_that_drifts_from_its_definition_is_caught() {
    // A refusal example with a reason the schema does not list, and an
    // issued answer with a member the answer never has.
    let (_keep, dir) = proto_copy();
    let f = dir.join("openapi.yaml");
    let text = std::fs::read_to_string(&f).unwrap();
    let drifted = text
        .replacen("reason: approval_declined", "reason: approval_refused", 1)
        .replacen(
            "scope: \"notes:read\", token_type: DPoP}",
            "scope: \"notes:read\", token_type: DPoP, refresh_token: \"r\"}",
            1,
        );
    assert_ne!(drifted, text);
    std::fs::write(&f, drifted).unwrap();
    let v = verdicts(&dir);
    let bad: Vec<&str> = v.iter().filter(|x| !x.2).map(|x| x.1.as_str()).collect();
    assert_eq!(
        bad,
        [
            "/components/schemas/Issued/examples/0",
            "/components/responses/Denied/content/application~1json/examples/declined/value",
        ],
        "{v:#?}"
    );
    // The control: the same copy unchanged passes whole.
    let (_keep2, clean) = proto_copy();
    assert!(verdicts(&clean).iter().all(|x| x.2));
}
