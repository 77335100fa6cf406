//! OTLP metrics from the Prometheus registry: every `metrics_interval`
//! the registry's samples (what `/metrics` serves) are mapped to OTLP and
//! sent, so the hot path updates one set of instruments. Counters become
//! monotonic cumulative sums, gauges gauges, histograms cumulative
//! explicit-bucket histograms (Prometheus's cumulative bucket counts
//! turned into per-bucket counts, the `+Inf` bucket last); label pairs
//! become the data points' attributes (their values are the bounded label
//! values of `infra::metrics`).

use std::sync::Weak;
use std::time::SystemTime;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use prometheus::proto::{MetricFamily, MetricType};
use prost::Message;

use super::export::Client;
use super::{unix_nanos, Telemetry};

/// Sends the registry every `interval` while the instance's telemetry
/// lives.
pub(super) async fn run(
    client: Client,
    tel: Weak<Telemetry>,
    metrics: crate::infra::metrics::Metrics,
    interval: std::time::Duration,
) {
    let start = unix_nanos(SystemTime::now());
    let mut failing = false;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if tel.upgrade().is_none() {
            return;
        }
        let now = unix_nanos(SystemTime::now());
        let body = encode(&client, &metrics.gather(), start, now).encode_to_vec();
        match client.post(&client.metrics_url, body).await {
            Ok(()) => failing = false,
            Err(why) => {
                if !failing {
                    tracing::warn!(collector = %client.metrics_url, why = %why, "telemetry: metrics not exported; retried at the next interval");
                }
                failing = true;
            }
        }
    }
}

fn attributes(m: &prometheus::proto::Metric) -> Vec<KeyValue> {
    m.get_label()
        .iter()
        .map(|l| KeyValue {
            key: l.name().to_string(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(l.value().to_string())),
            }),
            ..Default::default()
        })
        .collect()
}

fn number(m: &prometheus::proto::Metric, value: f64, start: u64, now: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attributes(m),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    }
}

fn histogram(m: &prometheus::proto::Metric, start: u64, now: u64) -> HistogramDataPoint {
    let h = m.get_histogram();
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    let mut below = 0u64;
    for b in h.get_bucket() {
        if b.upper_bound().is_infinite() {
            continue;
        }
        bounds.push(b.upper_bound());
        counts.push(b.cumulative_count().saturating_sub(below));
        below = b.cumulative_count();
    }
    counts.push(h.get_sample_count().saturating_sub(below));
    HistogramDataPoint {
        attributes: attributes(m),
        start_time_unix_nano: start,
        time_unix_nano: now,
        count: h.get_sample_count(),
        sum: Some(h.get_sample_sum()),
        bucket_counts: counts,
        explicit_bounds: bounds,
        ..Default::default()
    }
}

/// One family as an OTLP metric (`None` for a type not served here).
fn family(f: &MetricFamily, start: u64, now: u64) -> Option<Metric> {
    let cumulative = AggregationTemporality::Cumulative as i32;
    let data = match f.get_field_type() {
        MetricType::COUNTER => metric::Data::Sum(Sum {
            data_points: f
                .get_metric()
                .iter()
                .map(|m| number(m, m.get_counter().get_value(), start, now))
                .collect(),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        MetricType::GAUGE => metric::Data::Gauge(Gauge {
            data_points: f
                .get_metric()
                .iter()
                .map(|m| number(m, m.get_gauge().get_value(), start, now))
                .collect(),
        }),
        MetricType::HISTOGRAM => metric::Data::Histogram(Histogram {
            data_points: f
                .get_metric()
                .iter()
                .map(|m| histogram(m, start, now))
                .collect(),
            aggregation_temporality: cumulative,
        }),
        MetricType::SUMMARY | MetricType::UNTYPED => return None,
    };
    Some(Metric {
        name: f.name().to_string(),
        description: f.help().to_string(),
        unit: if f.name().ends_with("_seconds") {
            "s".into()
        } else {
            String::new()
        },
        data: Some(data),
        ..Default::default()
    })
}

/// The OTLP request for `families`.
pub(super) fn encode(
    client: &Client,
    families: &[MetricFamily],
    start: u64,
    now: u64,
) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(client.resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(client.scope.clone()),
                metrics: families
                    .iter()
                    .filter_map(|f| family(f, start, now))
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}
