//! OpenTelemetry: spans of the broker's own requests and its metrics, sent
//! over OTLP (HTTP/protobuf) to a collector; off unless `[telemetry]
//! otlp_endpoint` is set (docs/OPERATIONS.md, "Telemetry").
//!
//! Written for this broker rather than on the OpenTelemetry SDK, so that
//! what leaves is decided here:
//! - a span's attributes are chosen names with values the code sets, never
//!   `tracing` fields; [`export`] drops every attribute whose name is not
//!   in its allowlist or whose value breaks the name's rule, when the span
//!   is encoded;
//! - trace context from outside is untrusted input ([`context`]): a tool's
//!   `traceparent` on the proxy is only linked; the orchestrator socket's
//!   becomes the parent only with `trust_socket_traceparent`; `tracestate`
//!   is capped and kept only from a trusted parent; `baggage` is never read
//!   or sent;
//! - finished spans wait in a bounded queue; when it is full they are
//!   dropped and counted (`credbroker_otel_spans_dropped_total`), never
//!   waited for.
//!
//! With telemetry off nothing here runs: the edges hold no [`Telemetry`],
//! every span is [`Span::none`], and the task-local scope below is never
//! entered, so [`child`] and [`trace_id`] find nothing and return at once.
//!
//! A request's spans share a task-local scope ([`run`]): its root span
//! (ended when the scope ends), the current span (the parent of the next
//! [`child`]), and so the trace id that the audit events and the log lines
//! of the request carry.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::Instrument;

pub(crate) mod context;
mod export;
mod metrics_export;
mod settings;
mod wire;

pub(crate) use settings::TelemetryConfig;
mod recent;
#[cfg(test)]
mod tests;

pub(crate) use context::{parse_traceparent, SpanContext};

/// A remembered span's context and its trusted `tracestate`.
pub(crate) type Recalled = recent::Remembered;

/// One attribute value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u16> for Value {
    fn from(v: u16) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// The OTLP span kinds used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Work inside the broker.
    Internal = 1,
    /// A request the broker serves.
    Server = 2,
    /// A request the broker sends.
    Client = 3,
}

/// Where an outgoing request goes, for `propagate_to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A provider's API (the proxy) or token endpoint (refresh).
    Providers,
    /// An upstream authorization server (token exchange).
    Upstreams,
}

/// A span as it is queued for export.
#[derive(Debug, Clone)]
pub(crate) struct Finished {
    ctx: SpanContext,
    parent: Option<[u8; 8]>,
    name: &'static str,
    kind: Kind,
    start: u64,
    end: u64,
    attrs: Vec<(&'static str, Value)>,
    links: Vec<SpanContext>,
    error: bool,
    trace_state: Option<Arc<str>>,
}

/// The telemetry of one instance: its config, the export queue, and the
/// recent derives a proxied call continues.
#[derive(Debug)]
pub(crate) struct Telemetry {
    cfg: TelemetryConfig,
    queue: Option<tokio::sync::mpsc::Sender<Box<Finished>>>,
    dropped: prometheus::IntCounter,
    recent: Mutex<recent::Recent>,
    /// The page flows' roots, by the SHA-256 of a link code or a `state`
    /// (`edge::pages::traced`).
    flows: Mutex<recent::Recent>,
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What an instance tells the collector about itself (the OTLP resource).
#[derive(Debug, Clone)]
pub(crate) struct Resource {
    /// `service.instance.id`: the instance's name (host name and process
    /// id, as its audit events say with replicas).
    pub(crate) instance: String,
}

impl Telemetry {
    /// Starts the exporters `cfg` turns on (on the current runtime), or
    /// returns `None` when telemetry is off. `headers` are the
    /// `headers_file`'s, already read.
    pub(crate) fn start(
        cfg: &TelemetryConfig,
        metrics: &crate::infra::metrics::Metrics,
        resource: Resource,
        headers: http::HeaderMap,
    ) -> Result<Option<Arc<Telemetry>>, String> {
        let Some(endpoint) = cfg.otlp_endpoint.as_deref() else {
            return Ok(None);
        };
        if !cfg.traces_on() && !cfg.metrics_on() {
            return Ok(None);
        }
        let client = export::Client::new(endpoint, headers, &resource)?;
        let queue = cfg.traces_on().then(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(cfg.queue_size);
            tokio::spawn(export::spans(
                client.clone(),
                rx,
                metrics.otel_spans_dropped.clone(),
            ));
            tx
        });
        let tel = Arc::new(Telemetry {
            cfg: cfg.clone(),
            queue,
            dropped: metrics.otel_spans_dropped.clone(),
            recent: Mutex::new(recent::Recent::default()),
            flows: Mutex::new(recent::Recent::default()),
        });
        if cfg.metrics_on() {
            tokio::spawn(metrics_export::run(
                client,
                Arc::downgrade(&tel),
                metrics.clone(),
                cfg.metrics_interval,
            ));
        }
        Ok(Some(tel))
    }

    /// Whether spans are recorded.
    pub(crate) fn traces_on(&self) -> bool {
        self.queue.is_some()
    }

    /// The config.
    pub(crate) fn config(&self) -> &TelemetryConfig {
        &self.cfg
    }

    fn finish(&self, f: Box<Finished>) {
        if let Some(q) = &self.queue {
            if q.try_send(f).is_err() {
                self.dropped.inc();
            }
        }
    }

    /// A new root span for a request the broker serves. `incoming` is the
    /// caller's `traceparent`, `trusted` whether it may be the parent (it
    /// is linked otherwise), `tracestate` its `tracestate` (kept, capped,
    /// only from a trusted parent).
    pub(crate) fn server_span(
        self: &Arc<Self>,
        name: &'static str,
        incoming: Option<SpanContext>,
        trusted: bool,
        tracestate: Option<&str>,
    ) -> Span {
        if !self.traces_on() {
            return Span::none();
        }
        match incoming {
            Some(parent) if trusted => {
                let state = tracestate
                    .and_then(|s| context::cap_tracestate(s, self.cfg.max_tracestate))
                    .map(Arc::from);
                Span::open(self, name, Kind::Server, Some(parent), state, Vec::new())
            }
            other => Span::open(
                self,
                name,
                Kind::Server,
                None,
                None,
                other.into_iter().collect(),
            ),
        }
    }

    /// The root span of a proxied call: a child of `derive` (the span of
    /// the derive that issued its token, when known, with the derive's
    /// trusted `tracestate`), else the root of a new trace; `tool` (the
    /// tool's `traceparent`) is linked, never the parent: a tool chooses
    /// neither the trace id nor the sampling.
    pub(crate) fn call_span(
        self: &Arc<Self>,
        name: &'static str,
        derive: Option<Recalled>,
        tool: Option<SpanContext>,
    ) -> Span {
        if !self.traces_on() {
            return Span::none();
        }
        let (parent, state) = match derive {
            Some(r) => (Some(r.0), r.1),
            None => (None, None),
        };
        Span::open(
            self,
            name,
            Kind::Server,
            parent,
            state,
            tool.into_iter().collect(),
        )
    }

    /// Remembers the span of a derive whose token was `jti_sha256` (and its
    /// trusted `tracestate`, already capped), so that the proxied call made
    /// with it continues its trace (in memory, bounded; see `recent`).
    pub(crate) fn remember(&self, jti_sha256: &str, ctx: Recalled, until: i64) {
        if let Ok(mut r) = self.recent.lock() {
            r.insert(jti_sha256, ctx, until);
        }
    }

    /// The span of a page request: a child of its flow's first span when
    /// the flow is known (`parent`), else the root of a new trace.
    pub(crate) fn page_span(
        self: &Arc<Self>,
        name: &'static str,
        parent: Option<SpanContext>,
    ) -> Span {
        if !self.traces_on() {
            return Span::none();
        }
        Span::open(self, name, Kind::Server, parent, None, Vec::new())
    }

    /// Remembers a page flow's first span under `key` (a SHA-256), until
    /// `until`.
    pub(crate) fn remember_flow(&self, key: &str, ctx: SpanContext, until: i64) {
        if let Ok(mut r) = self.flows.lock() {
            r.insert(key, (ctx, None), until);
        }
    }

    /// The page flow remembered under `key`, if any.
    pub(crate) fn flow(&self, key: &str, now: i64) -> Option<Recalled> {
        self.flows.lock().ok()?.get(key, now)
    }

    /// The derive span remembered for `jti_sha256`, if any.
    pub(crate) fn recall(&self, jti_sha256: &str, now: i64) -> Option<Recalled> {
        self.recent.lock().ok()?.get(jti_sha256, now)
    }
}

/// One span, ended (and queued) when dropped; [`Span::none`] when telemetry
/// is off or the trace is not sampled, which does nothing.
#[derive(Debug, Default)]
pub(crate) struct Span(Option<Open>);

/// A recording span: its one allocation is the boxed [`Finished`], which
/// moves to the export queue as it is.
#[derive(Debug)]
struct Open {
    tel: Arc<Telemetry>,
    f: Box<Finished>,
}

impl Span {
    /// A span that records nothing.
    pub(crate) fn none() -> Span {
        Span(None)
    }

    fn open(
        tel: &Arc<Telemetry>,
        name: &'static str,
        kind: Kind,
        parent: Option<SpanContext>,
        trace_state: Option<Arc<str>>,
        links: Vec<SpanContext>,
    ) -> Span {
        let (trace_id, sampled) = match parent {
            Some(p) => (p.trace_id, p.sampled),
            None => {
                let id = context::random_id::<16>();
                (id, context::sample(&id, tel.cfg.sampling_ratio))
            }
        };
        Span(Some(Open {
            tel: tel.clone(),
            f: Box::new(Finished {
                ctx: SpanContext {
                    trace_id,
                    span_id: context::random_id::<8>(),
                    sampled,
                },
                parent: parent.map(|p| p.span_id),
                name,
                kind,
                start: unix_nanos(SystemTime::now()),
                end: 0,
                attrs: Vec::new(),
                links,
                error: false,
                trace_state,
            }),
        }))
    }

    /// A child of this span (none if this is none).
    pub(crate) fn child(&self, name: &'static str, kind: Kind) -> Span {
        match &self.0 {
            Some(o) => Span::open(
                &o.tel,
                name,
                kind,
                Some(o.f.ctx),
                o.f.trace_state.clone(),
                Vec::new(),
            ),
            None => Span::none(),
        }
    }

    /// Sets an attribute (kept at export only if allowed: see [`export`]).
    pub(crate) fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(o) = &mut self.0 {
            if o.f.ctx.sampled {
                o.f.attrs.push((key, value.into()));
            }
        }
    }

    /// Marks the span failed (status ERROR, with no message: an error's
    /// text may quote what it refused).
    pub(crate) fn fail(&mut self) {
        if let Some(o) = &mut self.0 {
            o.f.error = true;
        }
    }

    /// Moves its start back to `at` (a span begun before its trace was
    /// known).
    pub(crate) fn started_at(mut self, at: SystemTime) -> Span {
        if let Some(o) = &mut self.0 {
            o.f.start = unix_nanos(at);
        }
        self
    }

    /// Its place in the trace.
    pub(crate) fn context(&self) -> Option<SpanContext> {
        self.0.as_ref().map(|o| o.f.ctx)
    }

    /// A copy of `root`'s context, trace state and telemetry that is never
    /// exported (its `end` is skipped: see `Drop`).
    pub(crate) fn context_copy(&self) -> Span {
        Span::context_only(self)
    }

    fn context_only(root: &Span) -> Span {
        Span(root.0.as_ref().map(|o| Open {
            tel: o.tel.clone(),
            f: Box::new(Finished {
                attrs: Vec::new(),
                links: Vec::new(),
                end: u64::MAX,
                ..(*o.f).clone()
            }),
        }))
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mut o) = self.0.take() {
            // `end` is set only on a context-only copy, never exported.
            if o.f.ctx.sampled && o.f.end == 0 {
                o.f.end = unix_nanos(SystemTime::now()).max(o.f.start);
                o.tel.finish(o.f);
            }
        }
    }
}

/// The task-local state of one traced request.
struct Scope {
    tel: Arc<Telemetry>,
    /// The request's root span when the scope owns it ([`run`]); none
    /// when the caller keeps it ([`within`]).
    root: RefCell<Span>,
    current: Cell<SpanContext>,
    trace_state: Option<Arc<str>>,
}

tokio::task_local! {
    static SCOPE: Scope;
}

async fn scoped<F: Future>(
    tel: Arc<Telemetry>,
    root: Span,
    ctx: SpanContext,
    trace_state: Option<Arc<str>>,
    fut: F,
) -> F::Output {
    let logs = tracing::info_span!("trace", trace_id = %ctx.trace_hex());
    SCOPE
        .scope(
            Scope {
                tel,
                root: RefCell::new(root),
                current: Cell::new(ctx),
                trace_state,
            },
            fut.instrument(logs),
        )
        .await
}

/// Runs `fut` as the request of `root`: its [`child`] spans nest under it,
/// its audit events and log lines carry its trace id, and `root` ends when
/// `fut` does. A [`Span::none`] root runs `fut` as it is.
pub(crate) async fn run<F: Future>(root: Span, fut: F) -> F::Output {
    let Some(o) = &root.0 else {
        return fut.await;
    };
    // The scope keeps `root` (and so ends it last).
    let (tel, ctx, state) = (o.tel.clone(), o.f.ctx, o.f.trace_state.clone());
    scoped(tel, root, ctx, state, fut).await
}

/// Runs `fut` under `parent` (kept by the caller, which ends it): as
/// [`run`], for a request whose root outlives `fut` (a proxied call's
/// answer streams after its handler returned).
pub(crate) async fn within<F: Future>(parent: &Span, fut: F) -> F::Output {
    let Some(o) = &parent.0 else {
        return fut.await;
    };
    let (tel, ctx, state) = (o.tel.clone(), o.f.ctx, o.f.trace_state.clone());
    scoped(tel, Span::none(), ctx, state, fut).await
}

/// A child span of the current one in this request's scope, current until
/// it is dropped; nothing outside a traced request.
pub(crate) fn child(name: &'static str) -> Guard {
    child_kind(name, Kind::Internal)
}

/// [`child`] of the given kind (`Client` for a request the broker sends).
pub(crate) fn child_kind(name: &'static str, kind: Kind) -> Guard {
    SCOPE
        .try_with(|s| {
            let span = Span::open(
                &s.tel,
                name,
                kind,
                Some(s.current.get()),
                s.trace_state.clone(),
                Vec::new(),
            );
            let prev = span.context().map(|c| s.current.replace(c));
            Guard { span, prev }
        })
        .unwrap_or(Guard::none())
}

/// A span made current by [`child`]; dropping it ends it and makes its
/// parent current again.
#[derive(Debug)]
pub(crate) struct Guard {
    span: Span,
    prev: Option<SpanContext>,
}

impl Guard {
    /// A guard of no span (telemetry off).
    pub(crate) fn none() -> Guard {
        Guard {
            span: Span::none(),
            prev: None,
        }
    }

    /// Sets an attribute of this span.
    pub(crate) fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.span.set(key, value);
    }

    /// Marks this span failed.
    pub(crate) fn fail(&mut self) {
        self.span.fail();
    }

    /// Starts this span when `other` started.
    pub(crate) fn start_with(&mut self, other: &Span) {
        if let (Some(me), Some(o)) = (&mut self.span.0, &other.0) {
            me.f.start = o.f.start;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            let _ = SCOPE.try_with(|s| s.current.set(prev));
        }
    }
}

/// Sets an attribute of the request's root span (nothing outside a traced
/// request).
pub(crate) fn set_root(key: &'static str, value: impl Into<Value>) {
    let _ = SCOPE.try_with(|s| s.root.borrow_mut().set(key, value));
}

/// Marks the request's root span failed.
pub(crate) fn fail_root() {
    let _ = SCOPE.try_with(|s| s.root.borrow_mut().fail());
}

/// The current span of this request, if it is traced.
pub(crate) fn current() -> Option<SpanContext> {
    SCOPE.try_with(|s| s.current.get()).ok()
}

/// The request's root span and its telemetry, to remember a derive for
/// the proxied call that follows.
pub(crate) fn remember_root(jti_sha256: &str, until: i64) {
    let _ = SCOPE.try_with(|s| {
        if let Some(ctx) = s.root.borrow().context() {
            s.tel
                .remember(jti_sha256, (ctx, s.trace_state.clone()), until);
        }
    });
}

/// The trace id (hex) of this request, if it is traced: the audit's
/// `trace_id`.
pub(crate) fn trace_id() -> Option<String> {
    current().map(|c| c.trace_hex())
}

/// The `traceparent` (and capped `tracestate`) to send to `target`, when
/// `propagate_to` names it and this request is traced.
pub(crate) fn outgoing(target: Target) -> Option<(String, Option<String>)> {
    SCOPE
        .try_with(|s| {
            let allowed = match target {
                Target::Providers => s.tel.cfg.propagate_to_providers,
                Target::Upstreams => s.tel.cfg.propagate_to_upstreams,
            };
            allowed.then(|| {
                (
                    s.current.get().traceparent(),
                    s.trace_state.as_deref().map(str::to_string),
                )
            })
        })
        .ok()
        .flatten()
}

/// Adds [`outgoing`]'s headers for `target` to `headers` (and takes out
/// any `traceparent`, `tracestate` or `baggage` already there: only the
/// broker's own context leaves, and only where configured).
pub(crate) fn propagate(target: Target, headers: &mut http::HeaderMap) {
    headers.remove("traceparent");
    headers.remove("tracestate");
    headers.remove("baggage");
    if let Some((parent, state)) = outgoing(target) {
        if let Ok(v) = http::HeaderValue::from_str(&parent) {
            headers.insert("traceparent", v);
        }
        if let Some(v) = state.and_then(|s| http::HeaderValue::from_str(&s).ok()) {
            headers.insert("tracestate", v);
        }
    }
}

/// A `traceparent` header of `headers`, when it is one valid value (two
/// headers are none: the spec leaves them undefined).
pub(crate) fn incoming(headers: &http::HeaderMap) -> Option<SpanContext> {
    let mut all = headers.get_all("traceparent").iter();
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    parse_traceparent(first.to_str().ok()?)
}

/// The `tracestate` of `headers`, joined (the spec allows several lines).
pub(crate) fn incoming_state(headers: &http::HeaderMap) -> Option<String> {
    let parts: Vec<&str> = headers
        .get_all("tracestate")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The `headers_file`'s `Name: value` lines (blank lines and `#`
/// comments skipped) as headers, each marked sensitive; `Err` with the
/// first bad line's number (never its text: it may hold the credential).
pub(crate) fn parse_headers(text: &[u8]) -> Result<http::HeaderMap, usize> {
    let mut out = http::HeaderMap::new();
    let text = std::str::from_utf8(text).map_err(|_| 1usize)?;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(i + 1)?;
        let name = http::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| i + 1)?;
        let mut value = http::HeaderValue::from_str(value.trim()).map_err(|_| i + 1)?;
        value.set_sensitive(true);
        out.append(name, value);
    }
    Ok(out)
}

/// How long an export may take before it is abandoned.
pub(crate) const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
