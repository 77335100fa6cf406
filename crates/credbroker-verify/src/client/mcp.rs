//! Relaying a connect link through MCP as a URL elicitation, in both
//! protocol versions (see the project's MCP reference notes and
//! `proto/mcp/`):
//!
//! - 2025-11-25: a JSON-RPC error `-32042` whose `data.elicitations[]` holds
//!   `{mode: "url", elicitationId, url, message}` ([`url_elicitation_error`]);
//! - 2026-07-28: a result `resultType: "input_required"` with one
//!   `elicitation/create` URL request and an integrity-protected
//!   `requestState` ([`input_required_result`], sealed with
//!   [`StateKey::seal`] and checked on the retry with [`StateKey::open`]).
//!
//! The message always carries the link as plain text too, for clients that
//! only do form elicitation.
//!
//! `requestState` comes back from the client, so it is attacker-controlled
//! input: it is HMAC-SHA256 sealed under the MCP server's key, and bound to
//! the server that made it, the person (`iss`, `sub`), the OAuth client, the
//! exact call (method, tool, canonical arguments) and a short lifetime. The
//! state is signed, not encrypted: the client can read who it is for and the
//! link id, which it already knows (the person's own access token names them,
//! and 2025-11-25 sends the link id as `elicitationId`). A retry that passes
//! [`StateKey::open`] proves only that the state is ours: the server then
//! decides from its own state (a fresh derive), never from the client's
//! `accept`, which means "the person agreed to open the URL", not "done".

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::jose;
use crate::secret::SecretBytes;

/// The W3C trace context of an MCP request (`traceparent` and `tracestate`
/// in its `_meta`, MCP 2026-07-28), to pass on to the derive
/// ([`super::Client::with_trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// A well-formed `traceparent` (lowercase hex, four fields).
    pub traceparent: String,
    /// Its `tracestate`, when printable ASCII of at most 8192 bytes (the
    /// broker keeps less).
    pub tracestate: Option<String>,
}

/// The trace context in an MCP request's `_meta` (a JSON object); `None`
/// when it has no well-formed `traceparent`. `baggage` is never taken.
pub fn trace_from_meta(meta: &serde_json::Value) -> Option<TraceContext> {
    let parent = meta.get("traceparent")?.as_str()?;
    let fields: Vec<&str> = parent.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let ok = fields.len() == 4
        && hex(fields[0], 2)
        && hex(fields[1], 32)
        && hex(fields[2], 16)
        && hex(fields[3], 2);
    if !ok {
        return None;
    }
    let tracestate = meta
        .get("tracestate")
        .and_then(|v| v.as_str())
        .filter(|s| {
            !s.is_empty() && s.len() <= 8192 && s.bytes().all(|b| (0x20..=0x7e).contains(&b))
        })
        .map(str::to_owned);
    Some(TraceContext {
        traceparent: parent.to_owned(),
        tracestate,
    })
}

/// The JSON-RPC error code of MCP 2025-11-25 for "URL elicitation required".
/// Reserved for 2025-11-25: 2026-07-28 answers with `input_required`.
pub const URL_ELICITATION_REQUIRED: i64 = -32042;

/// JSON-RPC "invalid params", the answer to a refused `requestState`.
pub const INVALID_PARAMS: i64 = -32602;

/// The longest a `requestState` stays valid (the connect link itself lasts
/// 30 minutes; a person who takes longer starts the call again and gets the
/// same link with a fresh state).
pub const STATE_TTL: i64 = 10 * 60;

/// How far in the future a state's `iat` may lie (clock skew between
/// replicas sharing a key).
pub const STATE_FUTURE_SKEW: i64 = 60;

/// Sealed states longer than this are refused before any work.
pub const MAX_STATE_LEN: usize = 4096;

/// The state format version, under the MAC.
const STATE_VERSION: u8 = 1;

/// Domain separation: a MAC made for anything else never opens as a state.
const STATE_LABEL: &[u8] = b"credbroker/mcp/request-state/v1\0";

/// A connect link as MCP relays it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link<'a> {
    /// `connect_id`.
    pub id: &'a str,
    /// `connect_uri`.
    pub url: &'a str,
    /// `connect_message`.
    pub message: &'a str,
}

/// The message with the link appended as plain text (form-only clients).
pub fn message_with_link(link: &Link<'_>) -> String {
    format!("{} {}", link.message.trim_end(), link.url)
}

/// The MCP 2025-11-25 error object (`error` member of a JSON-RPC response).
pub fn url_elicitation_error(link: &Link<'_>) -> serde_json::Value {
    let message = message_with_link(link);
    serde_json::json!({
        "code": URL_ELICITATION_REQUIRED,
        "message": message,
        "data": { "elicitations": [{
            "mode": "url",
            "elicitationId": link.id,
            "url": link.url,
            "message": message,
        }]},
    })
}

/// The MCP 2026-07-28 `input_required` result for a refusal with a link.
/// `key_name` names the input request (e.g. `connect_github`); the retry
/// answers under the same name. No `elicitationId`: 2026-07-28 removed it.
pub fn input_required_result(
    link: &Link<'_>,
    key_name: &str,
    sealed_state: &str,
) -> serde_json::Value {
    let message = message_with_link(link);
    serde_json::json!({
        "resultType": "input_required",
        "inputRequests": {
            key_name: {
                "method": "elicitation/create",
                "params": { "mode": "url", "url": link.url, "message": message },
            }
        },
        "requestState": sealed_state,
    })
}

/// The error object for a `requestState` that did not open. The wire says
/// the same thing whatever the reason (tampered, expired, another person's),
/// so that it tells a prober nothing; log the [`StateError`] instead.
pub fn state_rejected_error() -> serde_json::Value {
    serde_json::json!({
        "code": INVALID_PARAMS,
        "message": "Invalid or expired requestState",
        "data": { "reason": "invalid_request_state" },
    })
}

/// What a retry must match: who made the state, for whom, and for which call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding<'a> {
    /// The MCP server's own identity (e.g. its resource URL), so that a state
    /// made by another server that shares the key is refused.
    pub aud: &'a str,
    /// The person's issuer, from the verified access token.
    pub iss: &'a str,
    /// The person's subject, from the verified access token.
    pub sub: &'a str,
    /// The OAuth client the access token was issued to (`client_id` or
    /// `azp`), when the token names one.
    pub client: Option<&'a str>,
    /// [`call_hash`] of the request.
    pub call: &'a str,
}

/// What a `requestState` carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestState {
    /// Format version.
    pub v: u8,
    /// The MCP server that made it.
    pub aud: String,
    /// The person's issuer.
    pub iss: String,
    /// The person's subject.
    pub sub: String,
    /// The OAuth client, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// [`call_hash`] of the call.
    pub call: String,
    /// The connect link's id (for logs and events; the decision on the retry
    /// comes from a fresh derive).
    pub link: String,
    /// Unix time it was made.
    pub iat: i64,
    /// Unix time after which it is refused.
    pub exp: i64,
}

impl RequestState {
    /// A state for `binding` and the link `link_id`, valid [`STATE_TTL`].
    pub fn new(binding: &Binding<'_>, link_id: &str, now: i64) -> RequestState {
        RequestState::with_ttl(binding, link_id, now, STATE_TTL)
    }

    /// The same with a shorter lifetime (`ttl` is kept within 1 s and
    /// [`STATE_TTL`]).
    pub fn with_ttl(binding: &Binding<'_>, link_id: &str, now: i64, ttl: i64) -> RequestState {
        RequestState {
            v: STATE_VERSION,
            aud: binding.aud.to_owned(),
            iss: binding.iss.to_owned(),
            sub: binding.sub.to_owned(),
            client: binding.client.map(str::to_owned),
            call: binding.call.to_owned(),
            link: link_id.to_owned(),
            iat: now,
            exp: now + ttl.clamp(1, STATE_TTL),
        }
    }

    fn matches(&self, b: &Binding<'_>) -> bool {
        self.aud == b.aud
            && self.iss == b.iss
            && self.sub == b.sub
            && self.client.as_deref() == b.client
            && self.call == b.call
    }
}

/// Hashes a request (method, tool name, arguments) for binding: SHA-256,
/// base64url, over length-prefixed parts and the arguments in canonical JSON
/// (object keys sorted at every level, whatever map type serde_json was
/// built with). Absent arguments hash like `{}`.
pub fn call_hash(method: &str, tool: &str, arguments: Option<&serde_json::Value>) -> String {
    let mut args = String::new();
    match arguments {
        None | Some(serde_json::Value::Null) => args.push_str("{}"),
        Some(v) => canonical_json(v, &mut args),
    }
    let mut h = Vec::with_capacity(method.len() + tool.len() + args.len() + 24);
    for part in [method.as_bytes(), tool.as_bytes(), args.as_bytes()] {
        h.extend_from_slice(&(part.len() as u64).to_be_bytes());
        h.extend_from_slice(part);
    }
    jose::sha256_b64(&h)
}

fn canonical_json(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = map.get(k) {
                    canonical_json(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Why a `requestState` was refused (for the server's log; the wire always
/// gets [`state_rejected_error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not ours, or altered, or of another format.
    #[error("requestState is malformed or was altered")]
    Tampered,
    /// Past its deadline, or made in the future.
    #[error("requestState has expired")]
    Expired,
    /// Made by another server, or for another person, client or call.
    #[error("requestState belongs to another server, person, client or call")]
    Mismatch,
}

/// Why a [`StateKey`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateKeyError {
    /// HMAC-SHA256 keys must carry at least 256 bits.
    #[error("a requestState key needs at least 32 bytes, got {0}")]
    TooShort(usize),
    /// The system random generator failed.
    #[error("no randomness for a requestState key")]
    Random,
}

/// The MCP server's key for `requestState` (HMAC-SHA256).
pub struct StateKey(aws_lc_rs::hmac::Key);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey([REDACTED])")
    }
}

impl StateKey {
    /// A key from 32 or more secret bytes (e.g. a 0600 file shared by the
    /// replicas of one MCP server).
    pub fn new(key: &SecretBytes) -> Result<StateKey, StateKeyError> {
        let k = key.expose();
        if k.len() < 32 {
            return Err(StateKeyError::TooShort(k.len()));
        }
        Ok(StateKey(aws_lc_rs::hmac::Key::new(
            aws_lc_rs::hmac::HMAC_SHA256,
            k,
        )))
    }

    /// A random process-local key: states die with the process, which only
    /// makes a client start its call again.
    pub fn generate() -> Result<StateKey, StateKeyError> {
        let mut bytes = vec![0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| StateKeyError::Random)?;
        StateKey::new(&SecretBytes::new(bytes))
    }

    fn tag(&self, body: &str) -> aws_lc_rs::hmac::Tag {
        let mut ctx = aws_lc_rs::hmac::Context::with_key(&self.0);
        ctx.update(STATE_LABEL);
        ctx.update(body.as_bytes());
        ctx.sign()
    }

    /// Seals a state: `base64url(json) "." base64url(hmac)`.
    pub fn seal(&self, state: &RequestState) -> String {
        // Serialising a struct of strings and integers cannot fail; an empty
        // body would only make a state that never opens.
        let body = jose::b64e(&serde_json::to_vec(state).unwrap_or_default());
        let tag = self.tag(&body);
        format!("{body}.{}", jose::b64e(tag.as_ref()))
    }

    /// Opens a state from a retry, in order: size, shape, MAC (constant
    /// time), format, lifetime, binding. The caller then decides from its own
    /// state (a fresh derive), not from the client's `accept`.
    pub fn open(
        &self,
        sealed: &str,
        expect: &Binding<'_>,
        now: i64,
    ) -> Result<RequestState, StateError> {
        if sealed.len() > MAX_STATE_LEN {
            return Err(StateError::Tampered);
        }
        let (body, tag) = sealed.split_once('.').ok_or(StateError::Tampered)?;
        let tag = jose::b64d(tag, "state").map_err(|_| StateError::Tampered)?;
        let want = self.tag(body);
        if !bool::from(want.as_ref().ct_eq(&tag)) {
            return Err(StateError::Tampered);
        }
        let bytes = jose::b64d(body, "state").map_err(|_| StateError::Tampered)?;
        let state: RequestState =
            serde_json::from_slice(&bytes).map_err(|_| StateError::Tampered)?;
        if state.v != STATE_VERSION {
            return Err(StateError::Tampered);
        }
        if state.exp <= now || state.iat > now + STATE_FUTURE_SKEW {
            return Err(StateError::Expired);
        }
        if !state.matches(expect) {
            return Err(StateError::Mismatch);
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: Link<'static> = Link {
        id: "lnk_123",
        url: "https://broker.example.com/connect/abc",
        message: "Connect GitHub so that repo-helper can read your repositories.",
    };

    fn key(b: u8) -> StateKey {
        StateKey::new(&SecretBytes::new(vec![b; 32])).unwrap()
    }

    #[test]
    fn error_2025_11_25_shape() {
        let e = url_elicitation_error(&LINK);
        assert_eq!(e["code"], -32042);
        let els = e["data"]["elicitations"].as_array().unwrap();
        assert_eq!(els.len(), 1);
        let el = &els[0];
        assert_eq!(el["mode"], "url");
        assert_eq!(el["elicitationId"], "lnk_123");
        assert_eq!(el["url"], LINK.url);
        assert!(
            el["message"].as_str().unwrap().ends_with(LINK.url),
            "link as plain text too"
        );
        assert!(e["message"].as_str().unwrap().contains(LINK.url));
    }

    #[test]
    fn result_2026_07_28_shape() {
        let r = input_required_result(&LINK, "connect_github", "s.t");
        assert_eq!(r["resultType"], "input_required");
        let req = &r["inputRequests"]["connect_github"];
        assert_eq!(req["method"], "elicitation/create");
        assert_eq!(req["params"]["mode"], "url");
        assert_eq!(req["params"]["url"], LINK.url);
        assert!(req["params"]["message"]
            .as_str()
            .unwrap()
            .ends_with(LINK.url));
        assert!(
            req["params"].get("elicitationId").is_none(),
            "2026-07-28 has no elicitationId"
        );
        assert_eq!(r["requestState"], "s.t");
        assert_eq!(state_rejected_error()["code"], -32602);
    }

    #[test]
    fn short_keys_are_refused() {
        assert_eq!(
            StateKey::new(&SecretBytes::new(vec![1; 31])).unwrap_err(),
            StateKeyError::TooShort(31)
        );
        // Positive control: 32 bytes and a random key work.
        assert!(StateKey::new(&SecretBytes::new(vec![1; 32])).is_ok());
        let g = StateKey::generate().unwrap();
        let call = call_hash("tools/call", "t", None);
        let b = Binding {
            aud: "a",
            iss: "i",
            sub: "s",
            client: None,
            call: &call,
        };
        let st = RequestState::new(&b, "l", 100);
        assert_eq!(g.open(&g.seal(&st), &b, 101).unwrap(), st);
    }

    #[test]
    fn call_hash_is_canonical_and_binds_every_part() {
        let a = serde_json::json!({"org": "x", "page": {"n": 1, "size": 30}});
        let b: serde_json::Value =
            serde_json::from_str(r#"{"page":{"size":30,"n":1},"org":"x"}"#).unwrap();
        assert_eq!(
            call_hash("tools/call", "list", Some(&a)),
            call_hash("tools/call", "list", Some(&b))
        );
        assert_eq!(
            call_hash("tools/call", "list", None),
            call_hash("tools/call", "list", Some(&serde_json::json!({})))
        );
        let base = call_hash("tools/call", "list", Some(&a));
        assert_ne!(base, call_hash("prompts/get", "list", Some(&a)));
        assert_ne!(base, call_hash("tools/call", "lis", Some(&a)));
        assert_ne!(
            base,
            call_hash("tools/call", "list", Some(&serde_json::json!({"org": "y"})))
        );
        // Length prefixes: moving bytes between the name and the method changes the hash.
        assert_ne!(call_hash("ab", "c", None), call_hash("a", "bc", None));
    }

    #[test]
    fn request_state_binds_server_person_client_call_and_time() {
        let k = key(7);
        let call = call_hash(
            "tools/call",
            "list_repos",
            Some(&serde_json::json!({"org": "x"})),
        );
        let b = Binding {
            aud: "http://mcp",
            iss: "https://idp",
            sub: "alice",
            client: Some("cli"),
            call: &call,
        };
        let st = RequestState::new(&b, "lnk_123", 1000);
        let sealed = k.seal(&st);
        let now = 1000 + STATE_TTL - 1;

        // Tampered body (Mallory rewrites the person), tampered tag, another key: refused.
        let (body, tag) = sealed.split_once('.').unwrap();
        let mut forged = st.clone();
        forged.sub = "mallory".into();
        let forged_body = jose::b64e(&serde_json::to_vec(&forged).unwrap());
        let as_mallory = Binding {
            sub: "mallory",
            ..b
        };
        assert_eq!(
            k.open(&format!("{forged_body}.{tag}"), &as_mallory, now),
            Err(StateError::Tampered)
        );
        assert_eq!(
            k.open(&format!("{body}.AAAA"), &b, now),
            Err(StateError::Tampered)
        );
        assert_eq!(k.open(body, &b, now), Err(StateError::Tampered));
        assert_eq!(
            k.open(&"A".repeat(MAX_STATE_LEN + 1), &b, now),
            Err(StateError::Tampered)
        );
        assert_eq!(key(8).open(&sealed, &b, now), Err(StateError::Tampered));
        // A MAC over the body without the domain label does not open.
        let plain = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &[7; 32]),
            body.as_bytes(),
        );
        assert_eq!(
            k.open(&format!("{body}.{}", jose::b64e(plain.as_ref())), &b, now),
            Err(StateError::Tampered)
        );

        // Another server, person, issuer, client or call: refused.
        assert_eq!(
            k.open(
                &sealed,
                &Binding {
                    aud: "http://other",
                    ..b
                },
                now
            ),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            k.open(&sealed, &Binding { sub: "bob", ..b }, now),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            k.open(
                &sealed,
                &Binding {
                    iss: "https://evil",
                    ..b
                },
                now
            ),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            k.open(&sealed, &Binding { client: None, ..b }, now),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            k.open(
                &sealed,
                &Binding {
                    client: Some("other"),
                    ..b
                },
                now
            ),
            Err(StateError::Mismatch)
        );
        let call2 = call_hash(
            "tools/call",
            "list_repos",
            Some(&serde_json::json!({"org": "y"})),
        );
        assert_eq!(
            k.open(&sealed, &Binding { call: &call2, ..b }, now),
            Err(StateError::Mismatch)
        );

        // Too late, or minted too far in the future: refused.
        assert_eq!(
            k.open(&sealed, &b, 1000 + STATE_TTL),
            Err(StateError::Expired)
        );
        let future = RequestState::new(&b, "lnk_123", 1000 + STATE_FUTURE_SKEW + 1);
        assert_eq!(k.open(&k.seal(&future), &b, 1000), Err(StateError::Expired));

        // A shorter lifetime is honoured; a longer one is cut to STATE_TTL.
        let short = RequestState::with_ttl(&b, "lnk_123", 1000, 5);
        assert_eq!(k.open(&k.seal(&short), &b, 1005), Err(StateError::Expired));
        assert!(k.open(&k.seal(&short), &b, 1004).is_ok());
        assert_eq!(
            RequestState::with_ttl(&b, "l", 1000, 86_400).exp,
            1000 + STATE_TTL
        );

        // Positive control.
        assert_eq!(k.open(&sealed, &b, now).unwrap(), st);
    }

    #[test]
    fn refusal_link_carries_the_connect_fields() {
        let r: crate::client::Refusal = serde_json::from_value(serde_json::json!({
            "error": "invalid_grant", "reason": "connect_required",
            "connect_uri": LINK.url, "connect_id": LINK.id,
            "connect_expires_in": 1800, "connect_message": LINK.message,
        }))
        .unwrap();
        assert_eq!(r.link(), Some(LINK));
        // Connect fields on another kind of answer are not a link.
        let mut odd = r.clone();
        odd.error = "access_denied".into();
        assert_eq!(odd.link(), None);
        // A refusal without a link (a policy denial) has none.
        let d: crate::client::Refusal = serde_json::from_value(
            serde_json::json!({"error": "access_denied", "reason": "tool_not_allowed"}),
        )
        .unwrap();
        assert_eq!(d.link(), None);
    }

    #[test]
    fn trace_from_meta_keeps_a_valid_traceparent_only() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = super::trace_from_meta(
            &serde_json::json!({"traceparent": parent, "tracestate": "a=1", "baggage": "x=y"}),
        )
        .unwrap();
        assert_eq!(t.traceparent, parent);
        assert_eq!(t.tracestate.as_deref(), Some("a=1"));
        let bad_state = super::trace_from_meta(
            &serde_json::json!({"traceparent": parent, "tracestate": "a=\n1"}),
        );
        assert_eq!(bad_state.unwrap().tracestate, None);
        for meta in [
            serde_json::json!({}),
            serde_json::json!({"traceparent": parent.to_uppercase()}),
            serde_json::json!({"traceparent": format!("{parent}\r\nx: y")}),
            serde_json::json!({"traceparent": 5}),
            serde_json::json!("text"),
        ] {
            assert_eq!(super::trace_from_meta(&meta), None, "{meta}");
        }
    }
}
