//! Event delivery: the instance's audit events sent to webhook
//! subscriptions (`[webhooks.<name>]`) as Standard Webhooks, and read live
//! on the admin socket's event stream (`edge::admin`, `GET /events`).
//!
//! Delivery reads the instance's own audit file ([`tail`]), which is
//! written before any token is released and survives `kill -9`; it never
//! sits on a request's path, so no derive waits for it or for the store.
//! Each subscription keeps a cursor in the store ([`Tree::Webhooks`]),
//! keyed by this instance's delivery id (a random id kept beside the audit
//! file, so it follows the file across restarts and is each replica's
//! own) and the subscription's name: each replica delivers its own events,
//! each once per subscription, at least once on the wire (an event sent
//! but not yet recorded as sent when the process dies is sent again after
//! the restart, under the same `webhook-id`).
//!
//! Files: [`tail`] (the audit file read from a position, across
//! rotations), [`sign`] (the `v1` and `v1a` signatures), [`deliver`] (a
//! subscription's loop: batches, retries, the backlog cap, dead letters).

pub(crate) mod deliver;
pub(crate) mod sign;
pub(crate) mod tail;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::base::clock::SharedClock;
use crate::infra::config::WebhookConfig;
use crate::infra::events::Audit;
use crate::infra::metrics::WebhookMetrics;
use crate::infra::store::{tuple_key, Store, StoreError, Tree};

/// What the loops and the admin socket share.
#[derive(Debug)]
pub(crate) struct Hub {
    subs: Vec<Arc<Sub>>,
    /// This instance's delivery id (see the module doc).
    delivery_id: String,
    store: Arc<dyn Store>,
    audit: Arc<Audit>,
    metrics: WebhookMetrics,
    clock: SharedClock,
    agent: String,
}

/// One subscription's state.
#[derive(Debug)]
pub(crate) struct Sub {
    pub(crate) cfg: WebhookConfig,
    /// Woken by `credbroker events redeliver`.
    pub(crate) redeliver: tokio::sync::Notify,
    pub(crate) status: Mutex<SubStatus>,
}

/// What `/status` shows of a subscription.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct SubStatus {
    /// Audit bytes not yet passed by the cursor.
    pub(crate) backlog_bytes: u64,
    /// Dead letters kept.
    pub(crate) dead_letters: u64,
    /// Unix time of the last delivery that succeeded.
    pub(crate) last_delivered_at: Option<i64>,
    /// Why the last attempt failed (a status or a fixed sentence, never a
    /// URL or an answer's text).
    pub(crate) last_failure: Option<String>,
    /// Events dropped past the backlog cap since the start.
    pub(crate) dropped: u64,
    /// The `whpk_` key receivers verify `v1a` with.
    pub(crate) public_key: Option<String>,
}

/// A dead letter, as kept in the store.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct DeadLetter {
    /// The audit line (an event: no secret by construction).
    pub(crate) line: String,
    /// Its `webhook-id`.
    pub(crate) id: String,
    /// Attempts made.
    pub(crate) attempts: u32,
    /// When it was given up (Unix time).
    pub(crate) time: i64,
}

/// Why a redelivery request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedeliverError {
    /// No subscription of that name.
    #[error("no webhook subscription is named so in the config")]
    NoSuchSubscription,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The file beside the audit log holding this instance's delivery id.
fn id_file(audit: &Path) -> PathBuf {
    let mut name = audit.file_name().unwrap_or_default().to_os_string();
    name.push(".delivery-id");
    audit.with_file_name(name)
}

/// Reads the delivery id, or makes one (random, 0600) on the first start.
fn delivery_id(audit: &Path) -> std::io::Result<String> {
    let path = id_file(audit);
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut random = [0u8; 16];
    aws_lc_rs::rand::fill(&mut random).map_err(|_| std::io::Error::other("no randomness"))?;
    let id = hex::encode(random);
    crate::infra::config::write_secret_file(&path, id.as_bytes())?;
    Ok(id)
}

impl Hub {
    /// The hub for `subs`; reads (or makes) the delivery id when there is
    /// a subscription.
    pub(crate) fn new(
        subs: &[WebhookConfig],
        store: Arc<dyn Store>,
        audit: Arc<Audit>,
        metrics: WebhookMetrics,
        clock: SharedClock,
        agent: &str,
    ) -> std::io::Result<Hub> {
        let delivery_id = if subs.is_empty() {
            String::new()
        } else {
            delivery_id(audit.path())?
        };
        let hub = Hub {
            subs: subs
                .iter()
                .map(|c| {
                    Arc::new(Sub {
                        cfg: c.clone(),
                        redeliver: tokio::sync::Notify::new(),
                        status: Mutex::new(SubStatus::default()),
                    })
                })
                .collect(),
            delivery_id,
            store,
            audit,
            metrics,
            clock,
            agent: agent.to_string(),
        };
        hub.start_cursors();
        Ok(hub)
    }

    /// Places a new subscription's cursor at the end of the audit file
    /// before anything is served, so it gets every event written from
    /// then on; and shows a `v1a` public key from the start. A store that
    /// does not answer now leaves it to the loop (which starts where the
    /// file ends when it gets there).
    fn start_cursors(&self) {
        for s in &self.subs {
            let name = &s.cfg.name;
            let placed = self
                .load_cursor(name)
                .map_err(|e| e.to_string())
                .and_then(|c| {
                    if c.is_some() {
                        return Ok(());
                    }
                    let t = tail::Tail::open(self.audit.path(), None).map_err(|e| e.to_string())?;
                    self.save_cursor(name, t.position())
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = placed {
                tracing::warn!(subscription = %name, error = %e, "cannot place the delivery cursor at start; the delivery loop tries again");
            }
            if let Ok(signer) = sign::Signer::load(&s.cfg) {
                s.status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .public_key = signer.public_key();
            }
        }
    }

    /// The audit file the event stream reads.
    pub(crate) fn audit_path(&self) -> &Path {
        self.audit.path()
    }

    /// The metrics (the event stream counts its connections there).
    pub(crate) fn metrics(&self) -> &WebhookMetrics {
        &self.metrics
    }

    /// Starts one delivery loop per subscription; they end when `stop`
    /// changes.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        self.subs
            .iter()
            .map(|s| tokio::spawn(deliver::run(self.clone(), s.clone(), stop.clone())))
            .collect()
    }

    /// The subscriptions as `/status` shows them.
    pub(crate) fn status(&self) -> serde_json::Value {
        let list: Vec<serde_json::Value> = self
            .subs
            .iter()
            .map(|s| {
                let st = s.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let mut v = serde_json::json!(st);
                v["name"] = s.cfg.name.clone().into();
                v
            })
            .collect();
        serde_json::Value::Array(list)
    }

    /// Wakes the named subscription (or all) to send its dead letters
    /// again; answers how many were waiting.
    pub(crate) fn redeliver(&self, name: Option<&str>) -> Result<u64, RedeliverError> {
        let mut n = 0;
        let mut any = false;
        for s in &self.subs {
            if name.is_some_and(|x| x != s.cfg.name) {
                continue;
            }
            any = true;
            n += self.dead_letters(&s.cfg.name)?.len() as u64;
            s.redeliver.notify_one();
        }
        if !any && name.is_some() {
            return Err(RedeliverError::NoSuchSubscription);
        }
        Ok(n)
    }

    fn cursor_key(&self, sub: &str) -> Vec<u8> {
        tuple_key(&["cursor", &self.delivery_id, sub])
    }

    fn dead_prefix(&self, sub: &str) -> Vec<u8> {
        tuple_key(&["dead", &self.delivery_id, sub])
    }

    /// The stored cursor of `sub`.
    pub(crate) fn load_cursor(&self, sub: &str) -> Result<Option<tail::Position>, StoreError> {
        let raw = self.store.get(Tree::Webhooks, &self.cursor_key(sub))?;
        Ok(raw.and_then(|r| serde_json::from_slice(&r).ok()))
    }

    /// Stores the cursor of `sub`.
    pub(crate) fn save_cursor(&self, sub: &str, pos: &tail::Position) -> Result<(), StoreError> {
        let v = serde_json::to_vec(pos).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.store.put(Tree::Webhooks, &self.cursor_key(sub), &v)
    }

    /// Keeps a dead letter.
    pub(crate) fn put_dead(&self, sub: &str, d: &DeadLetter) -> Result<(), StoreError> {
        let mut key = self.dead_prefix(sub);
        key.extend_from_slice(&tuple_key(&[&d.id]));
        let v = serde_json::to_vec(d).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.store.put(Tree::Webhooks, &key, &v)
    }

    /// Removes a dead letter (delivered again).
    pub(crate) fn remove_dead(&self, sub: &str, id: &str) -> Result<(), StoreError> {
        let mut key = self.dead_prefix(sub);
        key.extend_from_slice(&tuple_key(&[id]));
        self.store.delete(Tree::Webhooks, &key)
    }

    /// The dead letters of `sub`.
    pub(crate) fn dead_letters(&self, sub: &str) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = self
            .store
            .scan_prefix(Tree::Webhooks, &self.dead_prefix(sub))?;
        Ok(rows
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
            .collect())
    }

    /// The `webhook-id` of an audit line: from its `boot_id` and `seq`
    /// (unique per event), else (a line written by an older version or
    /// the offline command line) from the instance, the place and the
    /// line.
    pub(crate) fn webhook_id(&self, line: &tail::Line, event: &serde_json::Value) -> String {
        match (event["boot_id"].as_str(), event["seq"].as_u64()) {
            (Some(b), Some(n)) => format!("msg_{b}_{n}"),
            _ => {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                h.update(self.delivery_id.as_bytes());
                h.update(line.after.ino.to_be_bytes());
                h.update(line.start.to_be_bytes());
                h.update(&line.text);
                format!("msg_{}", &hex::encode(h.finalize())[..32])
            }
        }
    }
}

/// The body of a delivery and of a stream message: the Standard Webhooks
/// envelope (`type`, `timestamp`, `data`) around the audit event as it was
/// written, with the schema's version (`proto/event.schema.json`).
pub(crate) fn envelope(line: &[u8]) -> Option<(String, Vec<u8>)> {
    let event: serde_json::Value = serde_json::from_slice(line).ok()?;
    let kind = event["event"].as_str()?.to_string();
    let time = event["time"].as_i64()?;
    let mut body = Vec::with_capacity(line.len() + 96);
    body.extend_from_slice(b"{\"version\":1,\"type\":");
    body.extend_from_slice(serde_json::to_string(&kind).ok()?.as_bytes());
    body.extend_from_slice(b",\"timestamp\":\"");
    body.extend_from_slice(rfc3339(time).as_bytes());
    body.extend_from_slice(b"\",\"data\":");
    body.extend_from_slice(line);
    body.push(b'}');
    Some((kind, body))
}

/// `2026-12-06T11:04:23Z` for a Unix time (UTC; the civil-from-days
/// algorithm of H. Hinnant's date library).
pub(crate) fn rfc3339(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_of_known_times() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_614_265_330), "2021-02-25T15:02:10Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn the_envelope_holds_the_event_as_written() {
        let line = br#"{"time":0,"event":"derive.issued","agent":"a"}"#;
        let (kind, body) = super::envelope(line).unwrap();
        assert_eq!(kind, "derive.issued");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "derive.issued");
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00Z");
        assert_eq!(v["data"]["agent"], "a");
        assert!(super::envelope(b"not json").is_none());
    }
}
