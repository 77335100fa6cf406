//! OTLP over HTTP/protobuf: the spans' export loop, their encoding, and
//! the attribute allowlist enforced there.

use std::time::Duration;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::Receiver;

use super::{Finished, Value, EXPORT_TIMEOUT};

/// What an attribute's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// A route template as the policy writes it (`/repos/{owner}`): starts
    /// with `/`, no query, no fragment.
    Template,
    /// A standard HTTP method.
    Method,
    /// A name from the config or the policy, or from a fixed set: short
    /// and printable.
    Name,
    /// An HMAC-SHA-256 in hex (an undeclared request value, as the audit
    /// records it).
    Hmac,
    /// An integer.
    Int,
    /// A boolean.
    Bool,
}

/// Every attribute a span may carry, with the rule of its value; anything
/// else is dropped when the span is encoded (docs/OPERATIONS.md,
/// "Telemetry", lists them).
pub(crate) const ALLOWED_ATTRIBUTES: &[(&str, Rule)] = &[
    ("http.route", Rule::Template),
    ("http.request.method", Rule::Method),
    ("http.response.status_code", Rule::Int),
    ("credbroker.service", Rule::Name),
    ("credbroker.tool", Rule::Name),
    ("credbroker.tool_hmac", Rule::Hmac),
    ("credbroker.step", Rule::Name),
    ("credbroker.step_hmac", Rule::Hmac),
    ("credbroker.resource", Rule::Name),
    ("credbroker.resource_hmac", Rule::Hmac),
    ("credbroker.outcome", Rule::Name),
    ("credbroker.reason", Rule::Name),
    ("credbroker.source", Rule::Name),
    ("credbroker.upstream", Rule::Name),
    ("credbroker.page", Rule::Name),
    ("credbroker.store.operation", Rule::Name),
    ("credbroker.store.tree", Rule::Name),
    ("credbroker.subject.cached", Rule::Bool),
    ("credbroker.bytes_up", Rule::Int),
    ("credbroker.bytes_down", Rule::Int),
];

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// Whether `key = value` may leave.
pub(crate) fn allowed(key: &str, value: &Value) -> bool {
    let Some((_, rule)) = ALLOWED_ATTRIBUTES.iter().find(|(k, _)| *k == key) else {
        return false;
    };
    match (rule, value) {
        (Rule::Int, Value::Int(_)) | (Rule::Bool, Value::Bool(_)) => true,
        (Rule::Method, Value::Str(s)) => METHODS.contains(&s.as_str()),
        (Rule::Hmac, Value::Str(s)) => {
            s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
        (Rule::Name, Value::Str(s)) => {
            !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
        }
        (Rule::Template, Value::Str(s)) => {
            s.starts_with('/')
                && s.len() <= 256
                && s.bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) && b != b'?' && b != b'#')
        }
        _ => false,
    }
}

fn any(v: &Value) -> AnyValue {
    AnyValue {
        value: Some(match v {
            Value::Str(s) => any_value::Value::StringValue(s.clone()),
            Value::Int(i) => any_value::Value::IntValue(*i),
            Value::Bool(b) => any_value::Value::BoolValue(*b),
        }),
    }
}

fn kv(key: &str, value: &Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(any(value)),
        ..Default::default()
    }
}

/// The HTTP client of both exports, with the collector's address, the
/// headers of `headers_file`, and the resource every batch names.
#[derive(Debug, Clone)]
pub(super) struct Client {
    http: reqwest::Client,
    traces_url: String,
    pub(super) metrics_url: String,
    headers: http::HeaderMap,
    pub(super) resource: Resource,
    pub(super) scope: InstrumentationScope,
}

impl Client {
    pub(super) fn new(
        endpoint: &str,
        headers: http::HeaderMap,
        resource: &super::Resource,
    ) -> Result<Client, String> {
        // Never a proxy from the environment, never a redirect: the spans
        // go to the configured collector or nowhere.
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("telemetry: the OTLP client cannot start: {e}"))?;
        let attr = |k: &str, v: &str| kv(k, &Value::Str(v.to_string()));
        Ok(Client {
            http,
            traces_url: format!("{endpoint}/v1/traces"),
            metrics_url: format!("{endpoint}/v1/metrics"),
            headers,
            resource: Resource {
                attributes: vec![
                    attr("service.name", "credbroker"),
                    attr("service.version", env!("CARGO_PKG_VERSION")),
                    attr("service.instance.id", &resource.instance),
                ],
                ..Default::default()
            },
            scope: InstrumentationScope {
                name: "credbroker".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                ..Default::default()
            },
        })
    }

    /// POSTs one protobuf message; `Err` with a short reason (never the
    /// collector's answer body).
    pub(super) async fn post(&self, url: &str, body: Vec<u8>) -> Result<(), String> {
        let r = self
            .http
            .post(url)
            .headers(self.headers.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    "timed out".to_string()
                } else {
                    "not reachable".to_string()
                }
            })?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!("answered {}", r.status().as_u16()))
        }
    }
}

/// The most spans sent in one request.
const BATCH: usize = 512;
/// How long a finished span may wait for others before it is sent.
const DELAY: Duration = Duration::from_millis(500);
/// How often a filling batch takes what the queue holds. The loop sleeps
/// between takes instead of waiting on the queue, so a finished span never
/// wakes it while a batch fills: waiting on the queue woke the task once per
/// span, several context switches per derive at peak (issue 44's benchmark,
/// `scripts/bench-telemetry`). At the queue's default 2,048 spans this holds
/// 100,000 spans a second before one is dropped (and counted).
const TICK: Duration = Duration::from_millis(20);

/// The export loop: batches from the queue, sent in order; a batch that
/// cannot be sent is dropped and counted (the queue behind it keeps its
/// bound). Ends when every sender is gone.
pub(super) async fn spans(
    client: Client,
    mut rx: Receiver<Box<Finished>>,
    dropped: prometheus::IntCounter,
) {
    let mut failing = false;
    let mut encoder = super::wire::Encoder::new(&client.resource, &client.scope);
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.clear();
        batch.push(first);
        fill(&mut rx, &mut batch).await;
        let n = batch.len() as u64;
        let body = encoder.encode(&batch).to_vec();
        batch.clear();
        match client.post(&client.traces_url, body).await {
            Ok(()) => {
                if failing {
                    tracing::info!("telemetry: spans are exported again");
                }
                failing = false;
            }
            Err(why) => {
                dropped.inc_by(n);
                if !failing {
                    tracing::warn!(collector = %client.traces_url, why = %why, spans = n, "telemetry: spans not exported (dropped and counted in credbroker_otel_spans_dropped_total)");
                }
                failing = true;
            }
        }
    }
}

/// Adds to `batch` what the queue holds, taken every [`TICK`] until the
/// batch is full, [`DELAY`] has passed or every sender is gone.
// reason: the spans arrive boxed (a span's one allocation, moved to the
// queue as it is); unboxing them into the batch would copy each again.
#[allow(clippy::vec_box)]
async fn fill(rx: &mut Receiver<Box<Finished>>, batch: &mut Vec<Box<Finished>>) {
    let deadline = tokio::time::Instant::now() + DELAY;
    loop {
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(f) => batch.push(f),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let now = tokio::time::Instant::now();
        if batch.len() >= BATCH || now >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline.min(now + TICK)).await;
    }
}
