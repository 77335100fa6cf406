//! The validated `[telemetry]` settings (read by `infra::config`, which
//! depends on this module, not the other way round).

use std::path::PathBuf;
use std::time::Duration;

/// The validated `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// The collector's base URL (`/v1/traces` and `/v1/metrics` are added);
    /// `None`: telemetry is off.
    pub otlp_endpoint: Option<String>,
    /// Spans are exported (default: on when an endpoint is set).
    pub traces: bool,
    /// Metrics are exported (default: on when an endpoint is set).
    pub metrics: bool,
    /// The share of new traces recorded (0 to 1, default 1).
    pub sampling_ratio: f64,
    /// Finished spans waiting for export, at most; past it they are dropped
    /// and counted.
    pub queue_size: usize,
    /// How often the metrics are sent.
    pub metrics_interval: Duration,
    /// A file of `Name: value` lines sent with every export (a collector's
    /// credentials), read at start with the secret-file checks.
    pub headers_file: Option<PathBuf>,
    /// Whether a `traceparent` on the orchestrator socket becomes the
    /// parent of the derive's span (otherwise it is only linked).
    pub trust_socket_traceparent: bool,
    /// The broker's `traceparent` goes to the providers' APIs (the proxy,
    /// refreshes).
    pub propagate_to_providers: bool,
    /// The broker's `traceparent` goes to upstream authorization servers.
    pub propagate_to_upstreams: bool,
    /// The bytes of a trusted `tracestate` kept (whole list members).
    pub max_tracestate: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            traces: true,
            metrics: true,
            sampling_ratio: 1.0,
            queue_size: 2048,
            metrics_interval: Duration::from_secs(60),
            headers_file: None,
            trust_socket_traceparent: false,
            propagate_to_providers: false,
            propagate_to_upstreams: false,
            max_tracestate: 512,
        }
    }
}

impl TelemetryConfig {
    /// Whether spans are recorded and sent.
    pub fn traces_on(&self) -> bool {
        self.otlp_endpoint.is_some() && self.traces
    }

    /// Whether metrics are sent.
    pub fn metrics_on(&self) -> bool {
        self.otlp_endpoint.is_some() && self.metrics
    }
}
