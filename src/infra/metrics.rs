//! Prometheus metrics. Label values come only from names in the loaded
//! policy (tools) and fixed sets (outcomes, reasons); anything else is
//! `other`, so the number of series stays bounded whatever clients send.

use prometheus::core::Collector;
use prometheus::proto::MetricType;
use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// The broker's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Derives by outcome, reason and tool.
    pub derives: IntCounterVec,
    /// Derive latency in seconds, by outcome.
    pub latency: HistogramVec,
    /// Live entries in the DPoP replay cache.
    pub replay_cache_entries: IntGauge,
    /// Capacity of the replay cache.
    pub replay_cache_capacity: IntGauge,
    /// Subject-token cache hits.
    pub subject_cache_hits: IntCounter,
    /// Subject-token cache misses.
    pub subject_cache_misses: IntCounter,
    /// Policy loaded (value 1, label `hash`).
    pub policy_info: IntGaugeVecWrapper,
    /// Unix time the policy was loaded.
    pub policy_loaded_time: Gauge,
    /// Failed policy reloads.
    pub policy_reload_failures: IntCounter,
    /// 1 while the emergency freeze is on.
    pub frozen: IntGauge,
    /// 1 when the instance is ready (what `/readyz` answers), computed
    /// when `/metrics` is read.
    pub ready: IntGauge,
    /// Requests refused by rate limits, by limit.
    pub rate_limited: IntCounterVec,
    /// Connections closed unread, by socket (`api`, `admin`, `metrics`)
    /// and reason (`uid`: the peer uid is not allowed; `cap`: every slot
    /// holds a request in flight, or on the metrics listener every slot is
    /// taken).
    pub connections_refused: IntCounterVec,
    /// Idle connections closed to make room for a new one at the cap, by
    /// socket.
    pub connections_shed: IntCounterVec,
    /// Proxied calls by service, tool (names from the policy, else
    /// `other`) and outcome (a fixed set: the proxy's reasons).
    pub proxy_requests: IntCounterVec,
    /// Proxied call latency in seconds (to the end of the answer), by
    /// service.
    pub proxy_latency: HistogramVec,
    /// Token exchanges sent to upstream authorization servers, by upstream
    /// (a config name) and outcome (`issued`, `refused`, `unavailable`,
    /// `bad_answer`), and exchanged tokens given again (`reused`).
    pub upstream_exchanges: IntCounterVec,
    /// Their latency in seconds, the answer's checks included, by upstream
    /// and outcome (exchanges sent only).
    pub upstream_exchange_latency: HistogramVec,
    /// Exchanged tokens kept for reuse that can still be given, computed
    /// when read.
    pub upstream_token_cache_entries: IntGauge,
    /// This instance's clock minus the database's, in seconds, as last
    /// measured (`[postgres]` only).
    pub clock_offset: Gauge,
    /// Unix time of the last measurement of the offset.
    pub clock_offset_checked: Gauge,
    /// Persons stopped now (`derive::persons`), as this instance holds
    /// the list.
    pub persons_revoked: IntGauge,
    /// 1 while this instance has read the person stop list within
    /// `revocation.watch_bound`.
    pub revocation_watch_up: IntGauge,
    /// Security Event Tokens received, by transmitter (a config name),
    /// type (a fixed set, else `other`) and outcome (the action, or the
    /// RFC 8935 code it was refused with, or `unavailable`).
    pub ssf_events: IntCounterVec,
    /// When the last SET accepted from each transmitter was received
    /// (Unix time): a transmitter gone silent is what to alert on.
    pub ssf_last_event: prometheus::GaugeVec,
    /// SETs whose subject maps to no person, by transmitter.
    pub ssf_unmapped: IntCounterVec,
    /// Finished spans not exported: the export queue was full, or the
    /// collector did not take their batch (`infra::telemetry`).
    pub otel_spans_dropped: IntCounter,
    /// Webhook delivery metrics (`infra::webhooks`).
    pub webhooks: WebhookMetrics,
}

/// The webhook subscriptions' metrics, labelled by subscription (a config
/// name) and outcome (a fixed set).
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    /// Delivery attempts by subscription and outcome (`delivered`,
    /// `failed`, `retry_after`, `refused`, `dead_lettered`).
    pub deliveries: IntCounterVec,
    /// Events of the audit file not yet delivered, by subscription.
    pub backlog: prometheus::IntGaugeVec,
    /// Events dropped past the backlog cap, by subscription.
    pub dropped: IntCounterVec,
    /// Dead letters kept, by subscription.
    pub dead_letters: prometheus::IntGaugeVec,
    /// Open connections to the admin socket's event stream.
    pub streams: IntGauge,
}

fn webhook_metrics() -> WebhookMetrics {
    let sub = &["subscription"];
    WebhookMetrics {
        deliveries: must(IntCounterVec::new(
            Opts::new(
                "webhook_deliveries_total",
                "Webhook delivery attempts, by subscription and outcome",
            ),
            &["subscription", "outcome"],
        )),
        backlog: must(prometheus::IntGaugeVec::new(
            Opts::new(
                "webhook_backlog_events",
                "Events waiting for delivery, by subscription",
            ),
            sub,
        )),
        dropped: must(IntCounterVec::new(
            Opts::new(
                "webhook_events_dropped_total",
                "Events dropped undelivered past the backlog cap, by subscription",
            ),
            sub,
        )),
        dead_letters: must(prometheus::IntGaugeVec::new(
            Opts::new(
                "webhook_dead_letters",
                "Deliveries given up and kept for redelivery, by subscription",
            ),
            sub,
        )),
        streams: must(IntGauge::new(
            "event_stream_connections",
            "Open connections to the admin socket's event stream",
        )),
    }
}

/// The namespace the registry puts before every name.
const PREFIX: &str = "credbroker";

/// One metric of [`Metrics::catalogue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricInfo {
    /// The exposed name (`credbroker_derives_total`).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its label names, in order.
    pub labels: Vec<String>,
    /// Its help text.
    pub help: String,
}

/// A metric reserved for a feature not built yet (issue 38): named, typed
/// and labelled once so the features of this wave do not reshape the list,
/// but not registered (a metric that measures nothing is not served).
/// `docs/OPERATIONS.md` lists each in its "Reserved metrics" table; a
/// feature that registers one takes it out of [`RESERVED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedMetric {
    /// The name it will be exposed under.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its label names, in order.
    pub labels: &'static [&'static str],
    /// The issue whose feature registers it.
    pub issue: u32,
}

const fn reserved(
    name: &'static str,
    kind: &'static str,
    labels: &'static [&'static str],
    issue: u32,
) -> ReservedMetric {
    ReservedMetric {
        name,
        kind,
        labels,
        issue,
    }
}

/// Every reserved metric, in the order of `docs/OPERATIONS.md`.
pub const RESERVED: &[ReservedMetric] = &[reserved(
    "credbroker_introspection_requests_total",
    "counter",
    &["issuer", "outcome"],
    43,
)];

/// The loaded policy: its hash, when it was loaded, and the reloads that
/// failed.
fn policy_metrics() -> (IntGaugeVecWrapper, Gauge, IntCounter) {
    (
        IntGaugeVecWrapper(must(prometheus::IntGaugeVec::new(
            Opts::new("policy_info", "The loaded policy (label: its SHA-256)"),
            &["hash"],
        ))),
        must(Gauge::new(
            "policy_loaded_timestamp_seconds",
            "When the policy was loaded",
        )),
        must(IntCounter::new(
            "policy_reload_failures_total",
            "Policy reloads that failed and kept the last good policy",
        )),
    )
}

/// The sockets' connection caps: connections closed unread, and idle ones
/// shed to make room.
fn connection_metrics() -> (IntCounterVec, IntCounterVec) {
    (
        must(IntCounterVec::new(
            Opts::new(
                "connections_refused_total",
                "Connections closed unread, by socket and reason",
            ),
            &["socket", "reason"],
        )),
        must(IntCounterVec::new(
            Opts::new(
                "connections_shed_total",
                "Idle Unix-socket connections closed to make room at the connection cap",
            ),
            &["socket"],
        )),
    )
}

/// The egress proxy's calls: their counter and their latency.
fn proxy_metrics() -> (IntCounterVec, HistogramVec) {
    (
        must(IntCounterVec::new(
            Opts::new(
                "proxy_requests_total",
                "Proxied calls by service, tool and outcome",
            ),
            &["service", "tool", "outcome"],
        )),
        must(HistogramVec::new(
            HistogramOpts::new(
                "proxy_duration_seconds",
                "Proxied call latency, to the end of the answer",
            )
            .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.5, 2.0, 10.0, 30.0]),
            &["service"],
        )),
    )
}

/// The clock's offset from the database's and when it was measured
/// (`infra::skew`).
fn clock_metrics() -> (Gauge, Gauge) {
    (
        must(Gauge::new(
            "clock_offset_seconds",
            "This instance's clock minus the database's, as last measured",
        )),
        must(Gauge::new(
            "clock_offset_checked_timestamp_seconds",
            "When the clock offset was last measured",
        )),
    )
}

/// The person stop list: how many are stopped, and whether the watch is
/// within its bound.
fn revocation_metrics() -> (IntGauge, IntGauge) {
    (
        must(IntGauge::new(
            "persons_revoked",
            "Persons stopped now (credbroker persons revoke, Shared Signals)",
        )),
        must(IntGauge::new(
            "revocation_watch_up",
            "1 while the person stop list was read within revocation.watch_bound, 0 when not",
        )),
    )
}

/// The token exchanges at upstream authorization servers: their counter
/// and their latency, by upstream and outcome.
fn upstream_metrics() -> (IntCounterVec, HistogramVec, IntGauge) {
    let count = must(IntCounterVec::new(
        Opts::new(
            "upstream_exchanges_total",
            "Token exchanges sent to upstream authorization servers, and exchanged tokens given again (outcome reused), by upstream and outcome",
        ),
        &["upstream", "outcome"],
    ));
    let latency = must(HistogramVec::new(
        HistogramOpts::new(
            "upstream_exchange_duration_seconds",
            "Token exchange latency at upstream authorization servers, the answer's checks included",
        )
        .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.5, 2.0, 10.0]),
        &["upstream", "outcome"],
    ));
    let cached = must(IntGauge::new(
        "upstream_token_cache_entries",
        "Exchanged tokens kept for reuse that can still be given",
    ));
    (count, latency, cached)
}

/// The Shared Signals receiver's: SETs by transmitter, type and outcome;
/// the last one's time per transmitter; unmapped subjects.
fn ssf_metrics() -> (IntCounterVec, prometheus::GaugeVec, IntCounterVec) {
    (
        must(IntCounterVec::new(
            Opts::new(
                "ssf_events_total",
                "Security Event Tokens received, by transmitter, event type and outcome",
            ),
            &["transmitter", "type", "outcome"],
        )),
        must(prometheus::GaugeVec::new(
            Opts::new(
                "ssf_last_event_timestamp_seconds",
                "When the last Security Event Token accepted from the transmitter was received",
            ),
            &["transmitter"],
        )),
        must(IntCounterVec::new(
            Opts::new(
                "ssf_unmapped_subjects_total",
                "Security Event Tokens whose subject maps to no person, by transmitter",
            ),
            &["transmitter"],
        )),
    )
}

/// A gauge vector whose only label is replaced on each set (policy hash).
#[derive(Debug, Clone)]
pub struct IntGaugeVecWrapper(prometheus::IntGaugeVec);

impl IntGaugeVecWrapper {
    /// Sets the single current label value.
    pub fn set_only(&self, value: &str) {
        self.0.reset();
        self.0.with_label_values(&[value]).set(1);
    }
}

fn must<T>(r: Result<T, prometheus::Error>) -> T {
    // Metric definitions are static; a failure here is a programming error
    // caught by the unit test below.
    r.unwrap_or_else(|e| panic!("metric definition: {e}"))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let registry =
            Registry::new_custom(Some(PREFIX.into()), None).unwrap_or_else(|_| Registry::new());
        let derives = must(IntCounterVec::new(
            Opts::new(
                "derives_total",
                "Derive requests by outcome, reason and tool",
            ),
            &["outcome", "reason", "tool"],
        ));
        let latency = must(HistogramVec::new(
            HistogramOpts::new("derive_duration_seconds", "Derive latency").buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0,
            ]),
            &["outcome"],
        ));
        let replay_cache_entries = must(IntGauge::new(
            "dpop_replay_cache_entries",
            "Live DPoP jti entries",
        ));
        let replay_cache_capacity = must(IntGauge::new(
            "dpop_replay_cache_capacity",
            "DPoP jti cache capacity",
        ));
        let subject_cache_hits = must(IntCounter::new(
            "subject_cache_hits_total",
            "Subject tokens served from cache",
        ));
        let subject_cache_misses = must(IntCounter::new(
            "subject_cache_misses_total",
            "Subject tokens verified",
        ));
        let (policy_info, policy_loaded_time, policy_reload_failures) = policy_metrics();
        let frozen = must(IntGauge::new(
            "frozen",
            "1 while the emergency freeze denies every derive",
        ));
        let ready = must(IntGauge::new(
            "ready",
            "1 when the instance is ready (as /readyz), 0 when not; computed when read",
        ));
        let rate_limited = must(IntCounterVec::new(
            Opts::new("rate_limited_total", "Requests refused by a rate limit"),
            &["limit"],
        ));
        let (connections_refused, connections_shed) = connection_metrics();
        let (proxy_requests, proxy_latency) = proxy_metrics();
        let (upstream_exchanges, upstream_exchange_latency, upstream_token_cache_entries) =
            upstream_metrics();
        let (clock_offset, clock_offset_checked) = clock_metrics();
        let (persons_revoked, revocation_watch_up) = revocation_metrics();
        let (ssf_events, ssf_last_event, ssf_unmapped) = ssf_metrics();
        let otel_spans_dropped = must(IntCounter::new(
            "otel_spans_dropped_total",
            "Finished spans not exported to the OTLP collector (queue full or export failed)",
        ));
        let metrics = Metrics {
            registry,
            derives,
            latency,
            replay_cache_entries,
            replay_cache_capacity,
            subject_cache_hits,
            subject_cache_misses,
            policy_info,
            policy_loaded_time,
            policy_reload_failures,
            frozen,
            ready,
            rate_limited,
            connections_refused,
            connections_shed,
            proxy_requests,
            proxy_latency,
            upstream_exchanges,
            upstream_exchange_latency,
            upstream_token_cache_entries,
            clock_offset,
            clock_offset_checked,
            persons_revoked,
            revocation_watch_up,
            ssf_events,
            ssf_last_event,
            ssf_unmapped,
            otel_spans_dropped,
            webhooks: webhook_metrics(),
        };
        for c in metrics.collectors() {
            must(metrics.registry.register(c));
        }
        metrics
    }

    /// Every metric, as registered: the one list that both registration
    /// and [`Metrics::catalogue`] read.
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.derives.clone()),
            Box::new(self.latency.clone()),
            Box::new(self.replay_cache_entries.clone()),
            Box::new(self.replay_cache_capacity.clone()),
            Box::new(self.subject_cache_hits.clone()),
            Box::new(self.subject_cache_misses.clone()),
            Box::new(self.policy_info.0.clone()),
            Box::new(self.policy_loaded_time.clone()),
            Box::new(self.policy_reload_failures.clone()),
            Box::new(self.frozen.clone()),
            Box::new(self.ready.clone()),
            Box::new(self.rate_limited.clone()),
            Box::new(self.connections_refused.clone()),
            Box::new(self.connections_shed.clone()),
            Box::new(self.proxy_requests.clone()),
            Box::new(self.proxy_latency.clone()),
            Box::new(self.upstream_exchanges.clone()),
            Box::new(self.upstream_exchange_latency.clone()),
            Box::new(self.upstream_token_cache_entries.clone()),
            Box::new(self.clock_offset.clone()),
            Box::new(self.clock_offset_checked.clone()),
            Box::new(self.persons_revoked.clone()),
            Box::new(self.revocation_watch_up.clone()),
            Box::new(self.ssf_events.clone()),
            Box::new(self.ssf_last_event.clone()),
            Box::new(self.ssf_unmapped.clone()),
            Box::new(self.otel_spans_dropped.clone()),
            Box::new(self.webhooks.deliveries.clone()),
            Box::new(self.webhooks.backlog.clone()),
            Box::new(self.webhooks.dropped.clone()),
            Box::new(self.webhooks.dead_letters.clone()),
            Box::new(self.webhooks.streams.clone()),
        ]
    }

    /// Name, type, labels and help of every registered metric, whether or
    /// not it has a value yet (a labelled metric is absent from
    /// [`Metrics::render`] until its first label set). `docs/OPERATIONS.md`
    /// is tested against this.
    pub fn catalogue(&self) -> Vec<MetricInfo> {
        let mut out = Vec::new();
        for c in self.collectors() {
            let labels: Vec<String> = c
                .desc()
                .iter()
                .flat_map(|d| d.variable_labels.iter().cloned())
                .collect();
            for family in c.collect() {
                out.push(MetricInfo {
                    name: format!("{PREFIX}_{}", family.name()),
                    kind: match family.get_field_type() {
                        MetricType::COUNTER => "counter",
                        MetricType::GAUGE => "gauge",
                        MetricType::HISTOGRAM => "histogram",
                        MetricType::SUMMARY => "summary",
                        MetricType::UNTYPED => "untyped",
                    },
                    labels: labels.clone(),
                    help: family.help().to_string(),
                });
            }
        }
        out
    }

    /// The registry's samples (for the OTLP metrics export).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn registers_and_renders() {
        let m = super::Metrics::new();
        m.derives
            .with_label_values(&["issued", "none", "mail.read"])
            .inc();
        m.policy_info.set_only("abc");
        let text = m.render();
        assert!(text.contains(
            "credbroker_derives_total{outcome=\"issued\",reason=\"none\",tool=\"mail.read\"} 1"
        ));
        assert!(text.contains("credbroker_policy_info{hash=\"abc\"} 1"));
    }
}
