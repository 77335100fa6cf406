//! proto/refusal.schema.json and proto/mcp/*.json: the examples are exactly
//! what `credbroker::client::mcp` produces from the refusal example, the
//! refusal (and the real broker's refusals) validate against the schema
//! (the PyPI `jsonschema` package, an independent validator), and the Python
//! `mcp` SDK reads every MCP example with its own types.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::path::{Path, PathBuf};
use std::process::Command;

use credbroker::client::mcp::{
    call_hash, input_required_result, message_with_link, state_rejected_error,
    url_elicitation_error, Binding, RequestState, StateError, StateKey, STATE_TTL,
};
use credbroker::client::Refusal;
use credbroker::internals::secret::SecretBytes;
use serde_json::{json, Value};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn load(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo("proto/mcp").join(name)).unwrap()).unwrap()
}

/// The example's requestState, recomputed (see proto/mcp/README.md).
const IAT: i64 = 1_795_960_000;
const AUD: &str = "https://mcp.example.com/mcp";
const ISS: &str = "https://idp.example.com";
const SUB: &str = "248289761001";
const CLIENT: &str = "agent-desktop";

fn example_key() -> StateKey {
    StateKey::new(&SecretBytes::new(vec![0x42; 32])).unwrap()
}

#[test]
fn mcp_examples_are_what_the_client_library_produces() {
    let refusal: Refusal = serde_json::from_value(load("refusal-connect-required.json")).unwrap();
    let link = refusal.link().expect("the example carries a link");

    // 2025-11-25.
    let e = load("2025-11-25-url-elicitation-required.json");
    assert_eq!(e["error"], url_elicitation_error(&link));

    // 2026-07-28: the state in the files is the one this library seals.
    let call = call_hash(
        "tools/call",
        "list_repositories",
        Some(&json!({"limit": 10})),
    );
    let binding = Binding {
        aud: AUD,
        iss: ISS,
        sub: SUB,
        client: Some(CLIENT),
        call: &call,
    };
    let key = example_key();
    let sealed = key.seal(&RequestState::new(&binding, link.id, IAT));
    let r = load("2026-07-28-input-required.json");
    assert_eq!(
        r["result"],
        input_required_result(&link, "connect_github", &sealed)
    );

    // The retry carries the exact state, which opens for the retried call...
    let retry = load("2026-07-28-retry.json");
    let p = &retry["params"];
    assert_eq!(p["requestState"], sealed.as_str());
    assert_ne!(retry["id"], r["id"], "a retry is a new request");
    let retried = call_hash(
        "tools/call",
        p["name"].as_str().unwrap(),
        Some(&p["arguments"]),
    );
    let opened = key
        .open(
            &sealed,
            &Binding {
                call: &retried,
                ..binding
            },
            IAT + 60,
        )
        .unwrap();
    assert_eq!(opened.link, refusal.connect_id.clone().unwrap());
    // ...and not once altered, late, or for another call (then the example's rejection).
    let mut altered = sealed.clone();
    altered.replace_range(10..11, if &sealed[10..11] == "A" { "B" } else { "A" });
    assert_eq!(
        key.open(&altered, &binding, IAT + 60),
        Err(StateError::Tampered)
    );
    assert_eq!(
        key.open(&sealed, &binding, IAT + STATE_TTL),
        Err(StateError::Expired)
    );
    let other = call_hash(
        "tools/call",
        "list_repositories",
        Some(&json!({"limit": 11})),
    );
    assert_eq!(
        key.open(
            &sealed,
            &Binding {
                call: &other,
                ..binding
            },
            IAT + 60
        ),
        Err(StateError::Mismatch)
    );
    assert_eq!(
        load("2026-07-28-request-state-rejected.json")["error"],
        state_rejected_error()
    );

    // Form-only clients.
    let f = load("form-only-client.json");
    assert_eq!(f["result"]["isError"], true);
    assert_eq!(
        f["result"]["content"][0]["text"],
        message_with_link(&link).as_str()
    );
}

#[test]
fn python_sdk_reads_every_mcp_example() {
    let out = Command::new(crate::support::mcp::python())
        .arg(repo("tests/mcp/check_proto.py"))
        .arg("sdk")
        .arg(repo("proto/mcp"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let refusal = load("refusal-connect-required.json");
    let url = refusal["connect_uri"].as_str().unwrap();
    assert_eq!(v["2025"]["code"], -32042);
    let el = &v["2025"]["elicitations"][0];
    assert_eq!(el["mode"], "url");
    assert_eq!(el["url"], url);
    assert_eq!(el["elicitationId"], refusal["connect_id"]);
    assert_eq!(v["2026"]["result_type"], "input_required");
    let req = &v["2026"]["input_requests"]["connect_github"];
    assert_eq!(req["method"], "elicitation/create");
    assert_eq!(req["params"]["url"], url);
    assert_eq!(
        v["2026"]["request_state"],
        load("2026-07-28-input-required.json")["result"]["requestState"]
    );
    assert_eq!(v["retry"]["name"], "list_repositories");
    assert_eq!(
        v["retry"]["input_responses"]["connect_github"]["action"],
        "accept"
    );
    assert_eq!(v["rejected"]["code"], -32602);
    assert_eq!(v["form_only"]["is_error"], true);
    assert!(v["form_only"]["text"].as_str().unwrap().ends_with(url));
}

/// The schema's verdicts, from the independent validator.
fn verdicts(docs: &[(&str, Value)]) -> Vec<(String, bool, Value)> {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = docs
        .iter()
        .map(|(name, doc)| {
            let f = dir.path().join(format!("{name}.json"));
            std::fs::write(&f, doc.to_string()).unwrap();
            f
        })
        .collect();
    let out = Command::new(crate::support::mcp::python())
        .arg(repo("tests/mcp/check_proto.py"))
        .arg("validate")
        .arg(repo("proto/refusal.schema.json"))
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    // One verdict per document: zip would silently drop the documents the
    // validator said nothing about.
    assert_eq!(lines.len(), docs.len(), "verdicts: {stdout}");
    lines
        .into_iter()
        .zip(docs)
        .map(|(l, (name, _))| {
            let r: Value = serde_json::from_str(l).unwrap();
            // ...and each verdict is about the document it is paired with.
            let file = r["file"].as_str().unwrap_or_default();
            assert!(file.ends_with(&format!("/{name}.json")), "{name}: {l}");
            (
                name.to_string(),
                r["valid"].as_bool().unwrap(),
                r["errors"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn refusal_schema_accepts_real_refusals_and_rejects_malformed_ones() {
    let example = load("refusal-connect-required.json");
    let mut without_uri = example.clone();
    without_uri.as_object_mut().unwrap().remove("connect_uri");
    let mut wrong_error = example.clone();
    wrong_error["error"] = json!("access_denied");
    let mut link_on_denial = json!({"error": "access_denied", "reason": "tool_not_allowed"});
    link_on_denial["connect_uri"] = example["connect_uri"].clone();
    let mut extra = example.clone();
    extra["access_token"] = json!("eyJ...");
    let mut long_lived = example.clone();
    long_lived["connect_expires_in"] = json!(86400);
    let mut fragment = example.clone();
    fragment["connect_uri"] = json!("https://broker.example.com/connect/abc#x");
    // The quick start's plain HTTP on loopback is fine.
    let mut loopback = example.clone();
    loopback["connect_uri"] =
        json!("http://127.0.0.1:8080/connect/Y1jBQmQ4Mu4Fua_O5B9l_HI_y0hRDonNsxxz6V22Inw");
    let mut plain_http = example.clone();
    plain_http["connect_uri"] =
        json!("http://broker.example.com/connect/Y1jBQmQ4Mu4Fua_O5B9l_HI_y0hRDonNsxxz6V22Inw");

    // Real answers of the running broker: a policy denial and a bad request.
    let b = crate::support::TestBroker::start();
    let k = crate::support::key();
    let alice = b.subject_token("alice");
    let body_of = |subject: &str, tool: &str| {
        let body = json!({"subject_token": subject, "step": "summarize", "tool": tool,
            "resource": crate::support::RESOURCE})
        .to_string();
        let raw = b.raw(
            &crate::support::http_derive(&body, Some(&b.proof(&k)), ""),
            std::time::Duration::from_secs(5),
        );
        let status = crate::support::status_of(&raw);
        let json: Value = serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap();
        (status, json)
    };
    let (s1, denial) = body_of(&alice, "notes.delete");
    assert_eq!(
        (s1, denial["error"].as_str()),
        (403, Some("access_denied")),
        "{denial}"
    );
    let (s2, bad) = body_of("not-a-jwt", "notes.read");
    assert_eq!(s2, 400, "{bad}");
    // Positive control: the same request with alice's token is issued.
    assert_eq!(body_of(&alice, "notes.read").0, 200);

    let v = verdicts(&[
        ("example", example.clone()),
        ("loopback_http", loopback),
        ("broker_denial", denial),
        ("broker_bad_request", bad),
        ("without_uri", without_uri),
        ("link_reason_on_access_denied", wrong_error),
        ("link_on_denial", link_on_denial),
        ("token_in_refusal", extra),
        ("link_for_a_day", long_lived),
        ("uri_with_fragment", fragment),
        ("plain_http_off_loopback", plain_http),
    ]);
    for (name, valid, errors) in v {
        let want = matches!(
            name.as_str(),
            "example" | "loopback_http" | "broker_denial" | "broker_bad_request"
        );
        assert_eq!(valid, want, "{name}: {errors}");
    }
}

/// The README's MCP section points to the Python client's `link_answer`:
/// what it builds from the refusal is the published messages.
#[test]
fn python_client_link_answer_builds_the_same_messages() {
    let out = Command::new(crate::support::mcp::python())
        .arg(repo("tests/mcp/check_proto.py"))
        .arg("client")
        .arg(repo("clients/python/src"))
        .arg(repo("proto/mcp/refusal-connect-required.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["2025-11-25"]["error"],
        load("2025-11-25-url-elicitation-required.json")["error"]
    );
    // The Python SDK seals its own state; everything else is the example.
    let mut want = load("2026-07-28-input-required.json")["result"].clone();
    want["requestState"] = load("refusal-connect-required.json")["connect_id"].clone();
    assert_eq!(v["2026-07-28"]["result"], want);
}
