//! Infrastructure: the instance's config, its storage, and what it
//! records.
//!
//! - [`config`]: the validated instance config.
//! - [`diagnostics`]: TOML problems and their positions (config and policy).
//! - [`store`]: storage behind a small trait (sled for one instance,
//!   PostgreSQL for replicas).
//! - [`seal`]: encryption at rest.
//! - [`events`]: audit events.
//! - [`webhooks`]: audit events delivered to webhook subscriptions and the
//!   admin socket's event stream.
//! - [`metrics`]: Prometheus metrics.
//! - [`skew`]: this instance's clock against the shared store's.
//! - [`telemetry`]: OpenTelemetry spans and metrics over OTLP (off by
//!   default).
//! - [`failpoint`]: crash points for fault tests (`failpoints` feature only).
//! - [`reserved`]: config and policy keys named for features not built yet,
//!   refused until then.

pub(crate) mod config;
pub(crate) mod diagnostics;
pub(crate) mod events;
pub(crate) mod failpoint;
pub(crate) mod metrics;
pub(crate) mod reserved;
pub(crate) mod seal;
pub(crate) mod skew;
pub(crate) mod store;
pub(crate) mod telemetry;
pub(crate) mod webhooks;
