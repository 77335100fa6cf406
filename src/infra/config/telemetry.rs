//! `[telemetry]`: OpenTelemetry export over OTLP (HTTP/protobuf), off
//! unless `otlp_endpoint` is set (docs/OPERATIONS.md, "Telemetry").

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{parse_duration, Check};
use crate::base::grammar::secure_or_loopback;

/// `[telemetry]` as serde reads it.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawTelemetry {
    #[serde(default)]
    pub(super) otlp_endpoint: Option<String>,
    #[serde(default)]
    pub(super) protocol: Option<String>,
    #[serde(default)]
    pub(super) traces: Option<bool>,
    #[serde(default)]
    pub(super) metrics: Option<bool>,
    #[serde(default)]
    pub(super) sampling_ratio: Option<f64>,
    #[serde(default)]
    pub(super) queue_size: Option<usize>,
    #[serde(default)]
    pub(super) metrics_interval: Option<String>,
    #[serde(default)]
    pub(super) headers_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) trust_socket_traceparent: Option<bool>,
    #[serde(default)]
    pub(super) propagate_to: Option<Vec<String>>,
    #[serde(default)]
    pub(super) max_tracestate: Option<usize>,
}

pub(crate) use crate::infra::telemetry::TelemetryConfig;

/// Validates `[telemetry]`.
pub(super) fn telemetry(raw: Option<RawTelemetry>, check: &mut Check<'_>) -> TelemetryConfig {
    let d = TelemetryConfig::default();
    let Some(raw) = raw else {
        return d;
    };
    let endpoint = raw.otlp_endpoint.as_deref().and_then(|e| match url::Url::parse(e) {
        Ok(u)
            if secure_or_loopback(&u)
                && u.query().is_none()
                && u.fragment().is_none()
                && u.username().is_empty()
                && u.password().is_none() =>
        {
            Some(e.trim_end_matches('/').to_string())
        }
        _ => {
            check.bad(
                "telemetry.otlp_endpoint",
                "must be an https URL (http only on loopback), without credentials, query or fragment: the collector's base, such as \"http://127.0.0.1:4318\"",
            );
            None
        }
    });
    match raw.protocol.as_deref() {
        None | Some("http/protobuf") => {}
        Some(_) => check.bad(
            "telemetry.protocol",
            "must be \"http/protobuf\" (OTLP over gRPC is not built in)",
        ),
    }
    let sampling_ratio = match raw.sampling_ratio {
        None => d.sampling_ratio,
        Some(r) if (0.0..=1.0).contains(&r) => r,
        Some(_) => {
            check.bad("telemetry.sampling_ratio", "must be between 0 and 1");
            d.sampling_ratio
        }
    };
    let queue_size = match raw.queue_size {
        None => d.queue_size,
        Some(n) if (1..=100_000).contains(&n) => n,
        Some(_) => {
            check.bad("telemetry.queue_size", "must be between 1 and 100000");
            d.queue_size
        }
    };
    let metrics_interval = match raw.metrics_interval.as_deref() {
        None => d.metrics_interval,
        Some(t) => match parse_duration(t) {
            Some(i) if i >= Duration::from_secs(1) && i <= Duration::from_secs(3600) => i,
            _ => {
                check.bad(
                    "telemetry.metrics_interval",
                    "must be a duration between 1s and 1h, such as \"60s\"",
                );
                d.metrics_interval
            }
        },
    };
    let max_tracestate = match raw.max_tracestate {
        None => d.max_tracestate,
        Some(n) if n <= 8192 => n,
        Some(_) => {
            check.bad("telemetry.max_tracestate", "must be at most 8192 bytes");
            d.max_tracestate
        }
    };
    let (mut providers, mut upstreams) = (false, false);
    for p in raw.propagate_to.iter().flatten() {
        match p.as_str() {
            "providers" => providers = true,
            "upstreams" => upstreams = true,
            _ => check.bad(
                "telemetry.propagate_to",
                "each entry must be \"providers\" or \"upstreams\"",
            ),
        }
    }
    if endpoint.is_none() && raw.otlp_endpoint.is_none() && raw.headers_file.is_some() {
        check.bad(
            "telemetry.headers_file",
            "needs telemetry.otlp_endpoint (the headers go with its requests)",
        );
    }
    TelemetryConfig {
        otlp_endpoint: endpoint,
        traces: raw.traces.unwrap_or(true),
        metrics: raw.metrics.unwrap_or(true),
        sampling_ratio,
        queue_size,
        metrics_interval,
        headers_file: raw.headers_file.as_deref().map(|p| check.rel(p)),
        trust_socket_traceparent: raw.trust_socket_traceparent.unwrap_or(false),
        propagate_to_providers: providers,
        propagate_to_upstreams: upstreams,
        max_tracestate,
    }
}
