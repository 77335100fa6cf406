//! Audit events: one JSON line per decision, written before a token is
//! released. A failed write fails the derive (fail closed). Events carry a
//! SHA-256 of the token's `jti`, never a token, proof, code or key.
//!
//! Names coming from requests are escaped by the JSON encoder, so control
//! characters cannot forge lines.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;

/// One audit event.
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    /// Unix time.
    pub time: i64,
    /// `derive.issued`, `derive.denied`, `policy.reloaded`, ...
    pub event: &'a str,
    /// The instance's agent.
    pub agent: &'a str,
    /// The person's issuer, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub person_iss: Option<&'a str>,
    /// The person's subject, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub person_sub: Option<&'a str>,
    /// Step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<&'a str>,
    /// Tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<&'a str>,
    /// Resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<&'a str>,
    /// Scope asked for or granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<&'a str>,
    /// `issued` or `denied`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'a str>,
    /// The refusal reason or error code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    /// Hash of the policy that decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<&'a str>,
    /// SHA-256 (hex) of the issued token's `jti`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jti_sha256: Option<String>,
    /// Peer uid on the socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_uid: Option<u32>,
    /// The connected service (`github`), for connect and account events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<&'a str>,
    /// The connect link's id (`connect_id`), never its code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_id: Option<&'a str>,
    /// Who was signed in on the pages, when that differs from `person_*`
    /// (a link opened by another person).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opener_iss: Option<&'a str>,
    /// The subject of the signed-in opener (see `opener_iss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opener_sub: Option<&'a str>,
    /// The browser's address on the public listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_addr: Option<String>,
    /// For provider tokens: whether the token was narrowed to the tool's
    /// scopes on refresh (`false`: the provider's broader token went out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub narrowed: Option<bool>,
    /// For `keys.rotated`: the rotated-in signing key's `kid` (public).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
}

impl<'a> Event<'a> {
    /// An event of `kind` for `agent` at `time`, other fields empty.
    pub fn new(time: i64, event: &'a str, agent: &'a str) -> Event<'a> {
        Event {
            time,
            event,
            agent,
            person_iss: None,
            person_sub: None,
            step: None,
            tool: None,
            resource: None,
            scope: None,
            outcome: None,
            reason: None,
            policy_hash: None,
            jti_sha256: None,
            peer_uid: None,
            service: None,
            narrowed: None,
            connect_id: None,
            opener_iss: None,
            opener_sub: None,
            client_addr: None,
            kid: None,
        }
    }
}

/// Failure to record an event.
#[derive(Debug, thiserror::Error)]
#[error("audit sink failed: {0}")]
pub struct AuditError(String);

/// The audit sink: an append-only JSON-lines file (mode 0600).
#[derive(Debug)]
pub struct Audit {
    file: Mutex<File>,
}

impl Audit {
    /// Opens (or creates) the audit file.
    pub fn open(path: &Path) -> std::io::Result<Audit> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Audit {
            file: Mutex::new(file),
        })
    }

    /// Writes one event as one line, in one `write` call.
    pub fn record(&self, e: &Event<'_>) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(e).map_err(|e| AuditError(e.to_string()))?;
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line).map_err(|e| AuditError(e.to_string()))
    }
}
