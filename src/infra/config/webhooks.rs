//! `[webhooks.<name>]`: subscriptions that receive this instance's audit
//! events as Standard Webhooks (docs/OPERATIONS.md, "Webhooks"), and the
//! admin socket's event-stream cap.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::RawWebhook;
use super::{parse_duration, Check};
use crate::base::grammar::secure_or_loopback;
use crate::infra::events::Kind;

/// How deliveries are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signing {
    /// `v1,`: HMAC-SHA256 under each `whsec_` secret of `secret_files`
    /// (one signature per file, so a rotation overlaps).
    V1,
    /// `v1a,`: Ed25519 under `ed25519_key_file` (a receiver holds only the
    /// public key, so it cannot forge a delivery).
    V1a,
}

/// One webhook subscription.
#[derive(Debug, Clone)]
pub(crate) struct WebhookConfig {
    /// Its name (metric label, events, the cursor's key).
    pub name: String,
    /// Where deliveries are POSTed: https, or http on loopback. May hold a
    /// query (some receivers take a token there), so it is never logged.
    pub url: url::Url,
    /// The event types delivered (`*`: all).
    pub events: Vec<String>,
    /// Files (mode 0600) each holding one `whsec_` secret (`v1`).
    pub secret_files: Vec<PathBuf>,
    /// How deliveries are signed.
    pub signing: Signing,
    /// The file (mode 0600) holding the Ed25519 key (`v1a`).
    pub ed25519_key_file: Option<PathBuf>,
    /// Bound on one attempt, the answer read (a slow-drip receiver is cut).
    pub timeout: Duration,
    /// Deliveries in flight at once.
    pub max_concurrency: usize,
    /// Events older than this still undelivered are dropped.
    pub max_backlog_age: Duration,
    /// Undelivered audit bytes beyond this are dropped, oldest first.
    pub max_backlog_bytes: u64,
    /// The longest `Retry-After` honoured; a longer one is cut to it.
    pub max_retry_after: Duration,
}

impl WebhookConfig {
    /// Whether events of type `kind` go to this subscription.
    pub(crate) fn wants(&self, kind: &str) -> bool {
        self.events.iter().any(|e| e == "*" || e == kind)
    }
}

/// The default `admin.event_stream_max_connections`.
pub(crate) const EVENT_STREAMS_DEFAULT: usize = 4;
/// Its highest value: the admin socket has 16 connection slots, and the
/// rest stay free for the commands (`freeze` above all).
pub(crate) const EVENT_STREAMS_MAX: usize = 8;

/// Validates `admin.event_stream_max_connections`.
pub(super) fn event_streams(v: Option<usize>, check: &mut Check<'_>) -> usize {
    match v {
        None => EVENT_STREAMS_DEFAULT,
        Some(n) if (1..=EVENT_STREAMS_MAX).contains(&n) => n,
        Some(_) => {
            check.bad(
                "admin.event_stream_max_connections",
                "must be from 1 to 8: the admin socket's other slots stay free for its commands",
            );
            EVENT_STREAMS_DEFAULT
        }
    }
}

/// Validates `[webhooks.<name>]`.
pub(super) fn webhooks(
    raw: BTreeMap<String, RawWebhook>,
    check: &mut Check<'_>,
) -> Vec<WebhookConfig> {
    let mut out = Vec::new();
    for (name, w) in raw {
        let key = format!("webhooks.{name}");
        if !super::valid_name(&name) {
            check.bad(
                &key,
                "a subscription's name is letters, digits, '-' and '_' (at most 64)",
            );
            continue;
        }
        if let Some(c) = webhook(name, w, &key, check) {
            out.push(c);
        }
    }
    out
}

fn webhook(name: String, w: RawWebhook, key: &str, check: &mut Check<'_>) -> Option<WebhookConfig> {
    let before = check.problems.len();
    let url = match url::Url::parse(&w.url) {
        Ok(u) if secure_or_loopback(&u) && u.fragment().is_none() => Some(u),
        _ => {
            check.bad(
                &format!("{key}.url"),
                "must be an https URL (http only on loopback), without user, password or fragment",
            );
            None
        }
    };
    if w.events.is_empty() {
        check.bad(
            &format!("{key}.events"),
            "must list at least one event type, or \"*\" for all",
        );
    }
    for e in &w.events {
        if e != "*" && !Kind::ALL.iter().any(|k| k.as_str() == e) {
            check.bad(
                &format!("{key}.events"),
                "names an event type that does not exist (docs/OPERATIONS.md, \"Event types\")",
            );
        }
    }
    let secret_files: Vec<PathBuf> = w
        .secret_files
        .unwrap_or_default()
        .iter()
        .map(|p| check.rel(p))
        .collect();
    let signing = match w.signing.as_deref() {
        None | Some("v1") => Signing::V1,
        Some("v1a") => Signing::V1a,
        Some(_) => {
            check.bad(&format!("{key}.signing"), "must be \"v1\" or \"v1a\"");
            Signing::V1
        }
    };
    let ed25519_key_file = w.ed25519_key_file.as_deref().map(|p| check.rel(p));
    match signing {
        Signing::V1 if secret_files.is_empty() => check.bad(
            &format!("{key}.secret_files"),
            "must list at least one file (mode 0600) holding a whsec_ secret",
        ),
        Signing::V1 if ed25519_key_file.is_some() => check.bad(
            &format!("{key}.ed25519_key_file"),
            "is used only with signing = \"v1a\"",
        ),
        Signing::V1a if ed25519_key_file.is_none() => check.bad(
            &format!("{key}.ed25519_key_file"),
            "is required with signing = \"v1a\": the file (mode 0600) holding a whsk_ key",
        ),
        Signing::V1a if !secret_files.is_empty() => check.bad(
            &format!("{key}.secret_files"),
            "is used only with signing = \"v1\"",
        ),
        _ => {}
    }
    let mut duration = |k: &str, v: &Option<String>, default: u64, max: u64| match v.as_deref() {
        None => Duration::from_secs(default),
        Some(t) => match parse_duration(t) {
            Some(d) if !d.is_zero() && d <= Duration::from_secs(max) => d,
            _ => {
                check.bad(
                    &format!("{key}.{k}"),
                    &format!("must be a duration above 0 and at most {max} s (\"10s\", \"5m\")"),
                );
                Duration::from_secs(default)
            }
        },
    };
    let timeout = duration("timeout", &w.timeout, 10, 60);
    let max_backlog_age = duration("max_backlog_age", &w.max_backlog_age, 86_400, 30 * 86_400);
    let max_retry_after = duration("max_retry_after", &w.max_retry_after, 300, 86_400);
    let max_concurrency = match w.max_concurrency {
        None => 4,
        Some(n) if (1..=64).contains(&n) => n,
        Some(_) => {
            check.bad(&format!("{key}.max_concurrency"), "must be from 1 to 64");
            4
        }
    };
    let max_backlog_bytes = match w.max_backlog_bytes {
        None => 256 << 20,
        Some(n) if n >= 1024 => n,
        Some(_) => {
            check.bad(&format!("{key}.max_backlog_bytes"), "must be at least 1024");
            256 << 20
        }
    };
    if check.problems.len() > before {
        return None;
    }
    Some(WebhookConfig {
        name,
        url: url?,
        events: w.events,
        secret_files,
        signing,
        ed25519_key_file,
        timeout,
        max_concurrency,
        max_backlog_age,
        max_backlog_bytes,
        max_retry_after,
    })
}
