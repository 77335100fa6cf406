//! Relaying a connect link through MCP as a URL elicitation, in both
//! protocol versions (see the project's MCP reference notes):
//!
//! - 2025-11-25: a JSON-RPC error `-32042` whose `data.elicitations[]` holds
//!   `{mode: "url", elicitationId, url, message}` ([`url_elicitation_error`]);
//! - 2026-07-28: a result `resultType: "input_required"` with one
//!   `elicitation/create` URL request and an integrity-protected
//!   `requestState` ([`input_required_result`], checked on the retry with
//!   [`StateKey::open`]).
//!
//! The message always carries the link as plain text too, for clients that
//! only do form elicitation.

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::jose;
use crate::secret::SecretBytes;

/// The JSON-RPC error code of MCP 2025-11-25 for "URL elicitation required".
pub const URL_ELICITATION_REQUIRED: i64 = -32042;

/// The longest a `requestState` stays valid.
pub const STATE_TTL: i64 = 15 * 60;

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

/// What a `requestState` binds: the person, the tool call, and a deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestState {
    /// The person's issuer.
    pub iss: String,
    /// The person's subject.
    pub sub: String,
    /// SHA-256 (base64url) of the tool name and its canonical arguments.
    pub call: String,
    /// The connect link's id.
    pub link: String,
    /// Unix time after which the state is refused.
    pub exp: i64,
}

impl RequestState {
    /// Hashes a tool call (name and arguments) for binding.
    pub fn call_hash(tool: &str, arguments: &serde_json::Value) -> String {
        let mut h = tool.as_bytes().to_vec();
        h.push(0);
        // serde_json's Map is ordered by key, so this is canonical enough
        // for equality of the same call.
        h.extend_from_slice(arguments.to_string().as_bytes());
        jose::sha256_b64(&h)
    }
}

/// Why a `requestState` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not ours, or altered.
    #[error("requestState is malformed or was altered")]
    Tampered,
    /// Past its deadline.
    #[error("requestState has expired")]
    Expired,
    /// Made for another person or another call.
    #[error("requestState belongs to another person or tool call")]
    Mismatch,
}

/// The MCP server's key for `requestState` (HMAC-SHA256).
pub struct StateKey(aws_lc_rs::hmac::Key);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey([REDACTED])")
    }
}

impl StateKey {
    /// A key from 32 or more secret bytes.
    pub fn new(key: &SecretBytes) -> StateKey {
        StateKey(aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key.expose()))
    }

    /// Seals a state: `base64url(json) "." base64url(hmac)`.
    pub fn seal(&self, state: &RequestState) -> String {
        let body = jose::b64e(&serde_json::to_vec(state).unwrap_or_default());
        let tag = aws_lc_rs::hmac::sign(&self.0, body.as_bytes());
        format!("{body}.{}", jose::b64e(tag.as_ref()))
    }

    /// Opens a state from a retry, checking integrity, deadline, person and
    /// call. The caller then decides from its own state (a fresh derive), not
    /// from the client's `accept`.
    pub fn open(
        &self,
        sealed: &str,
        iss: &str,
        sub: &str,
        call: &str,
        now: i64,
    ) -> Result<RequestState, StateError> {
        if sealed.len() > 4096 {
            return Err(StateError::Tampered);
        }
        let (body, tag) = sealed.split_once('.').ok_or(StateError::Tampered)?;
        let tag = jose::b64d(tag, "state").map_err(|_| StateError::Tampered)?;
        let want = aws_lc_rs::hmac::sign(&self.0, body.as_bytes());
        if !bool::from(want.as_ref().ct_eq(&tag)) {
            return Err(StateError::Tampered);
        }
        let bytes = jose::b64d(body, "state").map_err(|_| StateError::Tampered)?;
        let state: RequestState = serde_json::from_slice(&bytes).map_err(|_| StateError::Tampered)?;
        if state.exp <= now {
            return Err(StateError::Expired);
        }
        if state.iss != iss || state.sub != sub || state.call != call {
            return Err(StateError::Mismatch);
        }
        Ok(state)
    }
}

/// The MCP 2026-07-28 `input_required` result for a refusal with a link.
/// `key_name` names the input request (e.g. `connect_github`).
pub fn input_required_result(link: &Link<'_>, key_name: &str, sealed_state: &str) -> serde_json::Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: Link<'static> = Link {
        id: "lnk_123",
        url: "https://broker.example.com/connect/abc",
        message: "Connect GitHub so that repo-helper can read your repositories.",
    };

    #[test]
    fn error_2025_11_25_shape() {
        let e = url_elicitation_error(&LINK);
        assert_eq!(e["code"], -32042);
        let el = &e["data"]["elicitations"][0];
        assert_eq!(el["mode"], "url");
        assert_eq!(el["elicitationId"], "lnk_123");
        assert_eq!(el["url"], LINK.url);
        assert!(el["message"].as_str().unwrap().ends_with(LINK.url), "link as plain text too");
    }

    #[test]
    fn request_state_binds_person_call_and_time() {
        let key = StateKey::new(&SecretBytes::new(vec![7; 32]));
        let call = RequestState::call_hash("list_repos", &serde_json::json!({"org": "x"}));
        let st = RequestState {
            iss: "https://idp".into(),
            sub: "alice".into(),
            call: call.clone(),
            link: "lnk_123".into(),
            exp: 1000,
        };
        let sealed = key.seal(&st);
        let r = input_required_result(&LINK, "connect_github", &sealed);
        assert_eq!(r["resultType"], "input_required");
        assert_eq!(r["inputRequests"]["connect_github"]["params"]["mode"], "url");
        // Tampered body, tampered tag, another key: refused.
        let (body, tag) = sealed.split_once('.').unwrap();
        let mut forged = st.clone();
        forged.sub = "mallory".into();
        let forged_body = jose::b64e(&serde_json::to_vec(&forged).unwrap());
        assert_eq!(key.open(&format!("{forged_body}.{tag}"), "https://idp", "mallory", &call, 900), Err(StateError::Tampered));
        assert_eq!(key.open(&format!("{body}.AAAA"), "https://idp", "alice", &call, 900), Err(StateError::Tampered));
        let other = StateKey::new(&SecretBytes::new(vec![8; 32]));
        assert_eq!(other.open(&sealed, "https://idp", "alice", &call, 900), Err(StateError::Tampered));
        // Another person, another call, too late: refused.
        assert_eq!(key.open(&sealed, "https://idp", "bob", &call, 900), Err(StateError::Mismatch));
        let call2 = RequestState::call_hash("list_repos", &serde_json::json!({"org": "y"}));
        assert_eq!(key.open(&sealed, "https://idp", "alice", &call2, 900), Err(StateError::Mismatch));
        assert_eq!(key.open(&sealed, "https://idp", "alice", &call, 1000), Err(StateError::Expired));
        // Positive control.
        assert_eq!(key.open(&sealed, "https://idp", "alice", &call, 900).unwrap(), st);
    }
}
