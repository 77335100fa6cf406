//! The published contract, held against what the tests see: every refusal
//! body the broker sends that a test reads (the orchestrator's socket, the
//! public listener, the egress proxy, the admin socket) is validated against
//! `proto/refusal.schema.json` where the helpers parse it
//! ([`check_answer`], [`check_refusal`]), with `boon` (a Draft 2020-12
//! validator, a dev-dependency). `tests/it/contract/` walks every reason the
//! code can send and the OpenAPI files' examples.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;

/// The repository's root (the crate's manifest directory).
pub(crate) fn repo(rel: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The refusal schema as published, parsed.
pub(crate) fn refusal_schema_json() -> Value {
    let path = repo("proto/refusal.schema.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A compiled schema and the verdicts it gives.
pub(crate) struct Validator {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

impl Validator {
    /// Compiles `schema` (a Draft 2020-12 document).
    pub(crate) fn new(schema: Value) -> Validator {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        // Under a URL of its own: the schema's `$id` still sets the base
        // of its references.
        let loc = "file:///credbroker/proto/refusal.schema.json";
        compiler.add_resource(loc, schema).unwrap();
        let index = compiler
            .compile(loc, &mut schemas)
            .unwrap_or_else(|e| panic!("the refusal schema does not compile: {e:#}"));
        Validator { schemas, index }
    }

    /// `Ok` or the validator's errors as text.
    pub(crate) fn verdict(&self, body: &Value) -> Result<(), String> {
        self.schemas
            .validate(body, self.index)
            .map_err(|e| format!("{e}"))
    }
}

/// The published schema, compiled once per test run.
pub(crate) fn published() -> &'static Validator {
    static V: OnceLock<Validator> = OnceLock::new();
    V.get_or_init(|| Validator::new(refusal_schema_json()))
}

/// Panics, naming `what` and the validator's errors, unless `body` is a
/// refusal the published schema accepts.
#[track_caller]
pub(crate) fn check_refusal(body: &Value, what: &str) {
    if let Err(e) = published().verdict(body) {
        panic!("{what}: the refusal does not match proto/refusal.schema.json:\n{body}\n{e}");
    }
}

/// Whether an answer is one of the broker's own JSON refusals: an error
/// status with the headers `json_response` sets (`application/json` and
/// `Pragma: no-cache`). A provider's answer relayed by the proxy never
/// carries `Pragma` (the proxy's response-header allowlist drops it), so it
/// is not taken for the broker's.
pub(crate) fn is_broker_refusal<'a>(
    status: u16,
    mut header: impl FnMut(&str) -> Option<&'a str>,
) -> bool {
    status >= 400
        && header("content-type").is_some_and(|v| v.starts_with("application/json"))
        && header("pragma") == Some("no-cache")
}

/// Checks an HTTP answer a test has read, when it is the broker's own JSON
/// refusal with a whole body (a body cut short by the test, or answers
/// pipelined on one connection, are not checked).
#[track_caller]
pub(crate) fn check_answer<'a>(
    status: u16,
    header: impl FnMut(&str) -> Option<&'a str>,
    body: &str,
    what: &str,
) {
    if !is_broker_refusal(status, header) {
        return;
    }
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        check_refusal(&v, &format!("{what} ({status})"));
    }
}

/// Checks an answer read raw from the orchestrator's socket: everything
/// there is the broker's, so a whole JSON body with an error status is a
/// refusal (the peer-uid refusal is written by hand, without `Pragma`).
#[track_caller]
pub(crate) fn check_socket_answer(raw: &str, what: &str) {
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    if status >= 400 {
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(body) {
            check_refusal(&v, &format!("{what} ({status})"));
        }
    }
}

/// Checks a refusal the Rust client library parsed: its fields as sent
/// (the client keeps every member the schema names; status, `DPoP-Nonce`
/// and `Retry-After` come from the headers and are not in the body).
#[track_caller]
pub(crate) fn check_client_refusal(r: &credbroker::client::Refusal, what: &str) {
    let body = serde_json::to_value(r).unwrap();
    check_refusal(&body, &format!("{what} ({})", r.status));
}
