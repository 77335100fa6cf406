//! Audit events: one JSON line per decision, written before a token is
//! released. A failed write fails the derive (fail closed). Events carry a
//! SHA-256 of the token's `jti`, never a token, proof, code or key.
//!
//! The file stays readable line by line whatever happens to a write:
//! - a failed or short write (a full disk, a file-size limit) is truncated
//!   back to where the file ended before it, so no partial line is left for
//!   the next event to be glued onto;
//! - a torn tail found at open (a power loss, or a writer older than this
//!   rule) is truncated away before the first new write, and an
//!   `audit.repaired` event says how many bytes went. The torn bytes were
//!   never a recorded event: a token or link is released only after its
//!   line was written whole.
//!
//! Nothing is fsync'd: the invariant holds against kill -9 and a crash of
//! the process (the kernel has the bytes), not against power loss, which may
//! drop the last events (docs/ARCHITECTURE.md, "The audit log").
//!
//! Names coming from requests are escaped by the JSON encoder, and
//! [`escape_line_breaks`] escapes what a viewer may split lines on (U+0085,
//! U+2028, U+2029 and the other C1 controls) or reorder text with (the
//! bidirectional overrides), so no value can forge a line. A request value
//! the policy does not declare is never written in clear: see
//! [`Audit::opaque`].

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use aws_lc_rs::hmac;
use serde::Serialize;

use crate::base::secret::SecretBytes;

mod kind;
pub use kind::Kind;

/// A request value the policy does not declare, as it is recorded: its
/// length and an HMAC under the instance's audit key, never the value (a
/// prefix could be the secret itself, and an unkeyed hash of a guessable
/// value can be confirmed). Equal values give equal HMACs within an
/// instance, so repeated attempts can still be correlated.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Opaque {
    /// Length in bytes.
    pub len: usize,
    /// HMAC-SHA-256 (hex) under the audit key.
    pub hmac_sha256: String,
}

/// One audit event.
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    /// Unix time.
    pub time: i64,
    /// Its type (`derive.issued`, `policy.reloaded`, ...: see [`Kind`]).
    pub event: Kind,
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
    pub jti_sha256: Option<std::borrow::Cow<'a, str>>,
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
    /// For an `exchange` resource: the upstream (`[upstreams.<name>]`) whose
    /// authorization server issued, or was asked for, the token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<&'a str>,
    /// For an exchanged token: its expiry (Unix time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// For an exchanged token: `true` when a token issued before was given
    /// again (docs/UPSTREAM.md, "Reuse"), `false` when it was exchanged now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused: Option<bool>,
    /// Request values (`resource`, `step`, `tool`, `scope`) the policy does
    /// not declare, by field name: recorded as [`Opaque`], never in clear.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undeclared: Option<BTreeMap<&'static str, Opaque>>,
    /// For `audit.repaired`: how many bytes of a torn tail were removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed_bytes: Option<u64>,
    /// For `keys.rotated`: the rotated-in signing key's `kid` (public); for
    /// `client_keys.rotated`, the rotated-in client key's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    /// For `client_keys.rotated`: the client key it replaces (public).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retired_kid: Option<String>,
    /// The step-up approval (`approval.*`, and the derive it covered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<&'a str>,
    /// SHA-256 (hex) of the call's `authorization_details` in RFC 8785 form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details_sha256: Option<&'a str>,
    /// The bound request's `req_sha256` (docs/APPROVALS.md, "The request,
    /// bound"): on `approval.*` and the derive events of a call that
    /// carried its request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_sha256: Option<&'a str>,
    /// A `per_step` approval's reach as the policy spells it (`"90s"`,
    /// `"5m"`), on its `approval.*` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_ttl: Option<String>,
    /// The detail fields the policy marks `log_in_clear`, as
    /// `{entry}.{type}.{field}` -> value; every other value stays out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details_in_clear: Option<serde_json::Map<String, serde_json::Value>>,
    /// For `proxy.request` and `proxy.completed` events: the proxied call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyCall<'a>>,
    /// On `person.revoked` (`manual`, `ssf`) and `person.restored`
    /// (`manual`, `sign_in`): what stopped or restored the person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'a str>,
    /// On `person.revoked` and `ssf.event_received`: the Security Event
    /// Token's event type URI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssf_event_type: Option<&'a str>,
    /// On `person.revoked`: whether the person's connected accounts were
    /// to be revoked at the providers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoke_at_providers: Option<bool>,
    /// On `person.revoked`: the revocation time (Unix time, the store's
    /// clock): the receipt, narrowed by the SET's event time within
    /// `revocation.max_event_age`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_time: Option<i64>,
    /// On `person.restored`: when the lifted stop began (Unix time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation_time: Option<i64>,
    /// On `ssf.event_received`: the SSF transmitter (its name in the
    /// config).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transmitter: Option<&'a str>,
    /// On `ssf.event_received`: SHA-256 (hex) of the SET's subject (its
    /// JSON as received), never the subject itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject_sha256: Option<&'a str>,
    /// On `ssf.event_received`: what the SET did (`stopped`, `updated`,
    /// `ignored`, `unmapped`, `duplicate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<&'a str>,
    /// On `ssf.event_received`: seconds from the SET's event time to its
    /// receipt, when it states one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<i64>,
    /// The instance that wrote it, when several share one store (replicas):
    /// added by `Audit::record` from `Audit::with_instance`; callers
    /// leave it empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<&'a str>,
    /// The boot of the process that wrote it: added by `Audit::record`
    /// from `Audit::with_boot_id`; callers leave it empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<&'a str>,
    /// The OpenTelemetry trace id of the request that wrote it (32 hex
    /// digits): added by `Audit::record` from the request's telemetry scope
    /// when it is traced; set here only for an event written outside it
    /// (a proxied call's end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<&'a str>,
    /// The webhook subscription (its name in the config), on `webhook.*`
    /// events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscription: Option<&'a str>,
    /// For `webhook.events_dropped`: how many events were dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// For `webhook.events_dropped`: the time of the oldest dropped event
    /// (Unix time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_time: Option<i64>,
    /// For `webhook.dead_lettered`: the delivery's `webhook-id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_id: Option<&'a str>,
    /// For `webhook.dead_lettered`: the delivery attempts made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The event's number within its process's boot (from 1): with
    /// `boot_id` it names the event, and a webhook delivery's
    /// `webhook-id` is made from the two. Added by `Audit::record`; callers
    /// leave it empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Fields named for features not built yet (issue 38), written at the
    /// top level of the event; always empty until their feature fills them.
    #[serde(flatten)]
    pub reserved: ReservedFields<'a>,
}

/// The event fields reserved for this wave's features (issue 38): named
/// once, so the features add no field of their own; nothing sets them yet,
/// and `docs/OPERATIONS.md` marks each "reserved: not yet emitted". A
/// feature that writes one moves it into [`Event`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReservedFields<'a> {
    /// Every field named for this wave is written now; the struct stays for
    /// the next wave's names.
    #[serde(skip)]
    pub _none: std::marker::PhantomData<&'a ()>,
}

/// The event written before a proxied call goes upstream (no event, no
/// call).
pub(crate) const PROXY_REQUEST: Kind = Kind::ProxyRequest;
/// The event written when a proxied call is over (its status and sizes).
pub(crate) const PROXY_COMPLETED: Kind = Kind::ProxyCompleted;

/// What the two proxy events say about one call. Never a token, a proof,
/// the concrete path or the query in clear: the path goes in as a hash,
/// the route as the policy's template.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ProxyCall<'a> {
    /// The request method.
    pub method: &'a str,
    /// The route template that matched, as the policy writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<&'a str>,
    /// SHA-256 (hex) of the raw path.
    pub path_sha256: &'a str,
    /// The provider's status (completed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// Request body bytes sent upstream (completed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Response body bytes sent to the tool (completed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    /// Milliseconds from the request to the end of the answer (completed
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// On a route with `bind_request`: the `req_sha256` of the request
    /// sent (equal to the token's, or the call was refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_sha256: Option<&'a str>,
}

impl<'a> Event<'a> {
    /// An event of `kind` for `agent` at `time`, other fields empty.
    pub fn new(time: i64, event: Kind, agent: &'a str) -> Event<'a> {
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
            upstream: None,
            expires_at: None,
            reused: None,
            connect_id: None,
            opener_iss: None,
            opener_sub: None,
            client_addr: None,
            undeclared: None,
            removed_bytes: None,
            kid: None,
            retired_kid: None,
            approval_id: None,
            details_sha256: None,
            request_sha256: None,
            approval_ttl: None,
            details_in_clear: None,
            proxy: None,
            source: None,
            ssf_event_type: None,
            revoke_at_providers: None,
            effective_time: None,
            revocation_time: None,
            transmitter: None,
            subject_sha256: None,
            action: None,
            delay_seconds: None,
            instance: None,
            boot_id: None,
            trace_id: None,
            subscription: None,
            count: None,
            oldest_time: None,
            webhook_id: None,
            attempts: None,
            seq: None,
            reserved: ReservedFields::default(),
        }
    }

    /// Records `field` as an undeclared value (see [`Opaque`]).
    pub fn undeclared(&mut self, field: &'static str, value: Opaque) {
        self.undeclared
            .get_or_insert_with(BTreeMap::new)
            .insert(field, value);
    }
}

/// Failure to record an event.
#[derive(Debug, thiserror::Error)]
#[error("audit sink failed: {0}")]
pub struct AuditError(String);

/// Where the lines go: the audit file, or a unit test's stand-in that
/// fails the way a full disk does.
pub trait Sink: Send {
    /// The current length: where the next line starts.
    fn end(&mut self) -> std::io::Result<u64>;
    /// Appends with one `write` call, which may write only part of `buf`.
    fn append(&mut self, buf: &[u8]) -> std::io::Result<usize>;
    /// Cuts the sink back to `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

impl Sink for File {
    fn end(&mut self) -> std::io::Result<u64> {
        // fstat, not a remembered offset: a `copytruncate` rotation or an
        // operator action appending to the same file moves the end.
        Ok(self.metadata()?.len())
    }
    fn append(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Write::write(self, buf)
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }
}

struct Writer {
    sink: Box<dyn Sink>,
    /// Set when a partial line could not be cut away: how many bytes of it
    /// end the file, to cut before anything else is written.
    torn: Option<u64>,
}

/// The audit sink: an append-only JSON-lines file (mode 0600).
pub struct Audit {
    path: PathBuf,
    writer: Mutex<Writer>,
    /// The last write's outcome (readiness).
    writable: AtomicBool,
    /// Bytes of a torn tail removed at open, if any.
    repaired: Option<u64>,
    /// Written into every event when set (see [`Audit::with_instance`]).
    instance: Option<String>,
    /// Written into every event when set (see [`Audit::with_boot_id`]).
    boot_id: Option<String>,
    /// The last `seq` given (see [`Event::seq`]).
    seq: AtomicU64,
    /// Keys [`Audit::opaque`] (boxed: the key schedule is large, and an
    /// `Audit` travels by value in `ops::Offline`).
    key: Box<hmac::Key>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit")
            .field("path", &self.path)
            .field("writable", &self.writable.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Audit {
    /// Opens (or creates) the audit file and cuts away a torn tail (see the
    /// module doc); [`Audit::record_repair`] then records that it did.
    /// Until [`Audit::with_value_key`] is called, undeclared values are
    /// keyed by a random per-process key.
    pub fn open(path: &Path) -> std::io::Result<Audit> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let removed = repair_torn_tail(&mut file)?;
        let mut audit = Audit::with_sink(path, Box::new(file));
        audit.repaired = (removed > 0).then_some(removed);
        Ok(audit)
    }

    /// An audit writer on any sink (unit tests inject faults with this).
    pub fn with_sink(path: &Path, sink: Box<dyn Sink>) -> Audit {
        let mut random = [0u8; 32];
        // A failed RNG leaves a zero key: values are still not in clear,
        // only guessable ones become confirmable. aws-lc's RNG does not fail
        // on Linux short of a broken kernel.
        let _ = aws_lc_rs::rand::fill(&mut random);
        Audit {
            path: path.to_path_buf(),
            writer: Mutex::new(Writer { sink, torn: None }),
            writable: AtomicBool::new(true),
            repaired: None,
            instance: None,
            boot_id: None,
            seq: AtomicU64::new(0),
            key: Box::new(hmac::Key::new(hmac::HMAC_SHA256, &random)),
        }
    }

    /// Names this instance in every event it writes: for replicas, whose
    /// audit files are each their own but describe one shared state.
    pub fn with_instance(mut self, name: String) -> Audit {
        self.instance = Some(name);
        self
    }

    /// Names this process's boot in every event it writes (a random id
    /// made at start): the events of one process, told apart from those of
    /// the process before it under the same instance name.
    pub fn with_boot_id(mut self, id: String) -> Audit {
        self.boot_id = Some(id);
        self
    }

    /// Keys [`Audit::opaque`] with `key` (from [`Audit::derive_key`]), so
    /// HMACs stay comparable across restarts of the instance.
    pub fn with_value_key(mut self, key: &SecretBytes) -> Audit {
        self.key = Box::new(hmac::Key::new(hmac::HMAC_SHA256, key.expose()));
        self
    }

    /// The audit value key, derived from the master key under its own label
    /// (the same scheme as the connect-link key): it never leaves memory.
    pub fn derive_key(master: &SecretBytes) -> SecretBytes {
        let k = hmac::Key::new(hmac::HMAC_SHA256, master.expose());
        SecretBytes::new(
            hmac::sign(&k, b"credbroker audit value key v1")
                .as_ref()
                .to_vec(),
        )
    }

    /// How an undeclared request value is recorded.
    pub fn opaque(&self, value: &str) -> Opaque {
        Opaque {
            len: value.len(),
            hmac_sha256: hex::encode(hmac::sign(&self.key, value.as_bytes())),
        }
    }

    /// The audit file's path (event delivery reads it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of a torn tail removed when the file was opened.
    pub fn repaired(&self) -> Option<u64> {
        self.repaired
    }

    /// Records `audit.repaired` if a torn tail was removed at open (the
    /// caller knows the agent and the time).
    pub fn record_repair(&self, time: i64, agent: &str) -> Result<(), AuditError> {
        let Some(removed) = self.repaired else {
            return Ok(());
        };
        tracing::warn!(
            path = %self.path.display(),
            removed_bytes = removed,
            "the audit log ended in a torn line; it was cut back to the last whole event"
        );
        let mut e = Event::new(time, Kind::AuditRepaired, agent);
        e.reason = Some("torn_tail_truncated");
        e.removed_bytes = Some(removed);
        self.record(&e)
    }

    /// Whether the last write succeeded.
    pub fn is_writable(&self) -> bool {
        self.writable.load(Ordering::SeqCst)
    }

    /// Readiness: true if the last write succeeded; after a failure, tries
    /// again by recording `audit.recovered` (a failed try leaves nothing).
    pub fn probe(&self, time: i64, agent: &str) -> bool {
        if self.is_writable() {
            return true;
        }
        let mut e = Event::new(time, Kind::AuditRecovered, agent);
        e.reason = Some("the audit log is writable again");
        self.record(&e).is_ok()
    }

    /// Writes one event as one whole line, or nothing (see the module doc).
    pub fn record(&self, e: &Event<'_>) -> Result<(), AuditError> {
        // Room for a whole proxy event up front: serde_json's own buffer
        // starts at 128 bytes and grows by copying.
        let mut json = Vec::with_capacity(1024);
        serde_json::to_writer(&mut json, e).map_err(|e| AuditError(e.to_string()))?;
        let mut json = String::from_utf8(json).map_err(|e| AuditError(e.to_string()))?;
        // The instance goes last in the object (an `Event` serializes as an
        // object, so the text ends in `}`).
        if let (Some(name), None) = (&self.instance, e.instance) {
            if json.ends_with('}') {
                json.pop();
                json.push_str(",\"instance\":");
                json.push_str(&serde_json::to_string(name).map_err(|e| AuditError(e.to_string()))?);
                json.push('}');
            }
        }
        // The boot id after it (a hex string: nothing to escape).
        if let (Some(id), None) = (&self.boot_id, e.boot_id) {
            if json.ends_with('}') {
                json.pop();
                json.push_str(",\"boot_id\":");
                json.push_str(&serde_json::to_string(id).map_err(|e| AuditError(e.to_string()))?);
                // The event's number in this boot: with the boot id it
                // names the event (a webhook's `webhook-id`). A failed
                // write leaves a gap, never a reuse.
                if e.seq.is_none() {
                    let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
                    json.push_str(",\"seq\":");
                    json.push_str(&n.to_string());
                }
                json.push('}');
            }
        }
        // The trace id of the request that wrote it (hex: nothing to
        // escape), when the request is traced (`infra::telemetry`).
        if let Some(id) = e
            .trace_id
            .is_none()
            .then(crate::infra::telemetry::trace_id)
            .flatten()
        {
            if json.ends_with('}') {
                json.pop();
                json.push_str(",\"trace_id\":\"");
                json.push_str(&id);
                json.push_str("\"}");
            }
        }
        let mut line = match escape_line_breaks(&json) {
            std::borrow::Cow::Borrowed(_) => json.into_bytes(),
            std::borrow::Cow::Owned(escaped) => escaped.into_bytes(),
        };
        line.push(b'\n');
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let result = write_line(&mut w, &line);
        self.writable.store(result.is_ok(), Ordering::SeqCst);
        result.map_err(|err| AuditError(format!("{}: {err}", self.path.display())))
    }
}

/// Appends `line` whole, or leaves the sink as it was. The success path
/// is one `write`: the end is read (`fstat`) only to cut a partial line,
/// as the current end less the bytes written (the file is `O_APPEND`, so
/// they are its tail).
fn write_line(w: &mut Writer, line: &[u8]) -> std::io::Result<()> {
    if let Some(partial) = w.torn {
        cut_tail(w.sink.as_mut(), partial).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("a partial line from an earlier failed write cannot be removed: {e}"),
            )
        })?;
        w.torn = None;
    }
    let mut done = 0;
    let failure = loop {
        if done == line.len() {
            return Ok(());
        }
        match w.sink.append(&line[done..]) {
            Ok(0) => break std::io::Error::from(std::io::ErrorKind::WriteZero),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break e,
        }
    };
    // Cut back what a short write left; if even that fails, remember it so
    // that no later event is glued onto the partial line.
    if done > 0 {
        // `done` is at most the line's length.
        let partial = done as u64;
        if let Err(t) = cut_tail(w.sink.as_mut(), partial) {
            w.torn = Some(partial);
            return Err(std::io::Error::new(
                failure.kind(),
                format!("{failure}; the partial line could not be removed yet: {t}"),
            ));
        }
    }
    Err(failure)
}

/// Removes the last `partial` bytes.
fn cut_tail(sink: &mut dyn Sink, partial: u64) -> std::io::Result<()> {
    let end = sink.end()?;
    sink.truncate(end.saturating_sub(partial))
}

/// Cuts a tail not ending in `\n` back to the last `\n` (or to empty);
/// returns how many bytes went.
fn repair_torn_tail(file: &mut File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut keep = 0;
    let mut pos = len;
    let mut buf = vec![0u8; 64 * 1024];
    'scan: while pos > 0 {
        let n = (buf.len() as u64).min(pos);
        let from = pos - n;
        file.seek(SeekFrom::Start(from))?;
        // `n` is at most the buffer's length, so it fits in usize.
        let chunk = &mut buf[..n as usize];
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            keep = from + i as u64 + 1;
            break 'scan;
        }
        pos = from;
    }
    if keep < len {
        file.set_len(keep)?;
    }
    Ok(len - keep)
}

/// Characters a viewer may treat as a line break (NEL U+0085 and the other
/// C1 controls, U+2028, U+2029) or that reorder how a line is shown (the
/// bidirectional embeddings, overrides and isolates), plus DEL.
fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{7f}'..='\u{9f}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// Escapes, as `\uXXXX`, what [`needs_escape`] names in a JSON text. JSON's
/// structure is ASCII, so these only occur inside strings, where the escape
/// means the same character: the line still parses to the same event.
pub(crate) fn escape_line_breaks(json: &str) -> std::borrow::Cow<'_, str> {
    if json.is_ascii() || !json.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if needs_escape(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests;
