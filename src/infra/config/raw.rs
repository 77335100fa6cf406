//! Stage one: the file as serde reads it. Every key is optional or
//! defaulted where the validated stage has a default, and no key is
//! rejected here: unknown keys are collected by `serde_ignored` (see
//! `diagnostics::parse_toml`), so that one run reports them all.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub(super) struct RawConfig {
    pub(super) agent: String,
    pub(super) issuer: String,
    pub(super) policy: PathBuf,
    #[serde(default)]
    pub(super) store: Option<PathBuf>,
    #[serde(default)]
    pub(super) postgres: Option<RawPostgres>,
    #[serde(default)]
    pub(super) audit_log: Option<PathBuf>,
    pub(super) socket: RawSocket,
    #[serde(default)]
    pub(super) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(super) public: Option<RawPublic>,
    #[serde(default)]
    pub(super) metrics: Option<RawMetrics>,
    pub(super) keys: RawKeys,
    #[serde(default)]
    pub(super) dpop: RawDpop,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default)]
    pub(super) proxy: RawProxy,
    #[serde(default)]
    pub(super) clock: RawClock,
    #[serde(default)]
    pub(super) outbound: RawOutbound,
    #[serde(default)]
    pub(super) revocation: super::revocation::RawRevocation,
    #[serde(default)]
    pub(super) trusted_issuers: Vec<RawIssuer>,
    #[serde(default)]
    pub(super) vault: Option<RawVault>,
    #[serde(default)]
    pub(super) providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    pub(super) upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub(super) webhooks: BTreeMap<String, RawWebhook>,
    #[serde(default)]
    pub(super) ssf: Option<RawSsf>,
    #[serde(default)]
    pub(super) telemetry: Option<super::telemetry::RawTelemetry>,
}

/// `[ssf]`: the Shared Signals receiver (docs/SSF.md).
#[derive(Debug, Deserialize)]
pub(super) struct RawSsf {
    #[serde(default)]
    pub(super) transmitters: BTreeMap<String, RawTransmitter>,
}

/// `[ssf.transmitters.<name>]`: one SSF transmitter and its stream.
#[derive(Debug, Deserialize)]
pub(super) struct RawTransmitter {
    pub(super) issuer: String,
    #[serde(default)]
    pub(super) metadata_url: Option<String>,
    #[serde(default)]
    pub(super) jwks_uri: Option<String>,
    #[serde(default)]
    pub(super) audience: Option<String>,
    #[serde(default)]
    pub(super) delivery: Option<String>,
    #[serde(default)]
    pub(super) push_authorization_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) management_credentials_file: Option<PathBuf>,
    pub(super) trusted_issuers: Vec<String>,
    #[serde(default)]
    pub(super) map_email: Option<bool>,
    #[serde(default)]
    pub(super) poll_interval: Option<String>,
    #[serde(default)]
    pub(super) max_set_bytes: Option<usize>,
    #[serde(default)]
    pub(super) per_second: Option<u32>,
}

/// `[webhooks.<name>]`: a subscription that receives audit events as
/// Standard Webhooks.
#[derive(Debug, Deserialize)]
pub(super) struct RawWebhook {
    pub(super) url: String,
    pub(super) events: Vec<String>,
    #[serde(default)]
    pub(super) secret_files: Option<Vec<PathBuf>>,
    #[serde(default)]
    pub(super) signing: Option<String>,
    #[serde(default)]
    pub(super) ed25519_key_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) max_concurrency: Option<usize>,
    #[serde(default)]
    pub(super) max_backlog_age: Option<String>,
    #[serde(default)]
    pub(super) max_backlog_bytes: Option<u64>,
    #[serde(default)]
    pub(super) max_retry_after: Option<String>,
}

/// `[upstreams.<name>]`: an organisation's authorization server for
/// `source = "exchange"` resources (RFC 8693).
#[derive(Debug, Deserialize)]
pub(super) struct RawUpstream {
    pub(super) issuer: String,
    #[serde(default)]
    pub(super) discovery: Option<bool>,
    #[serde(default)]
    pub(super) token_endpoint: Option<String>,
    #[serde(default)]
    pub(super) jwks_uri: Option<String>,
    pub(super) client_id: String,
    #[serde(default)]
    pub(super) client_auth: Option<String>,
    #[serde(default)]
    pub(super) client_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) subject_issuers: Vec<String>,
    #[serde(default)]
    pub(super) actor_token: Option<bool>,
    #[serde(default)]
    pub(super) subject_audience: Option<String>,
    #[serde(default)]
    pub(super) grant: Option<String>,
    #[serde(default)]
    pub(super) resource_upstream: Option<String>,
    #[serde(default)]
    pub(super) connect_timeout: Option<String>,
    #[serde(default)]
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) reuse_margin: Option<String>,
    #[serde(default)]
    pub(super) introspection_endpoint: Option<String>,
    #[serde(default)]
    pub(super) resources: BTreeMap<String, RawUpstreamResource>,
}

/// `[upstreams.<name>.resources."<uri>"]`: what that AS's tokens for one
/// resource look like.
#[derive(Debug, Deserialize)]
pub(super) struct RawUpstreamResource {
    #[serde(default)]
    pub(super) audience: Option<Vec<String>>,
    #[serde(default)]
    pub(super) audience_param: Option<String>,
    #[serde(default)]
    pub(super) scope_claim: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawPostgres {
    #[serde(default)]
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) port: Option<u32>,
    #[serde(default)]
    pub(super) database: Option<String>,
    #[serde(default)]
    pub(super) user: Option<String>,
    #[serde(default)]
    pub(super) password_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) tls: Option<RawPostgresTls>,
    #[serde(default)]
    pub(super) pool_size: Option<usize>,
    #[serde(default)]
    pub(super) statement_timeout: Option<String>,
    #[serde(default)]
    pub(super) connect_timeout: Option<String>,
    #[serde(default)]
    pub(super) migrate: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawPostgresTls {
    pub(super) ca_file: PathBuf,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawVault {
    pub(super) key_dir: PathBuf,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawProvider {
    #[serde(default)]
    pub(super) preset: Option<String>,
    #[serde(default)]
    pub(super) display_name: Option<String>,
    #[serde(default)]
    pub(super) grant_endpoint: Option<String>,
    #[serde(default)]
    pub(super) issuer: Option<String>,
    #[serde(default)]
    pub(super) authorization_endpoint: Option<String>,
    #[serde(default)]
    pub(super) token_endpoint: Option<String>,
    #[serde(default)]
    pub(super) revocation_endpoint: Option<String>,
    #[serde(default)]
    pub(super) userinfo_endpoint: Option<String>,
    pub(super) client_id: String,
    #[serde(default)]
    pub(super) client_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) token_endpoint_auth: Option<String>,
    #[serde(default)]
    pub(super) redirect_uri: Option<String>,
    #[serde(default)]
    pub(super) scopes: Option<Vec<String>>,
    #[serde(default)]
    pub(super) narrow_on_refresh: Option<bool>,
    #[serde(default)]
    pub(super) account: Option<RawAccountLookup>,
    #[serde(default)]
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) recheck_unexpiring_token_after: Option<String>,
    /// The origin the egress proxy may call for this service.
    #[serde(default)]
    pub(super) api_base: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawAccountLookup {
    #[serde(default)]
    pub(super) userinfo_id_claim: Option<String>,
    #[serde(default)]
    pub(super) userinfo_name_claim: Option<String>,
    #[serde(default)]
    pub(super) url: Option<String>,
    #[serde(default)]
    pub(super) id_field: Option<String>,
    #[serde(default)]
    pub(super) name_field: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawSocket {
    pub(super) path: PathBuf,
    #[serde(default)]
    pub(super) group: Option<String>,
    #[serde(default)]
    pub(super) allowed_uids: Option<Vec<u32>>,
    #[serde(default)]
    pub(super) max_connections: Option<usize>,
    #[serde(default)]
    pub(super) header_timeout: Option<String>,
    #[serde(default)]
    pub(super) runtime: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawAdmin {
    #[serde(default)]
    pub(super) socket: Option<PathBuf>,
    #[serde(default)]
    pub(super) event_stream_max_connections: Option<usize>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawPublic {
    pub(super) listen: String,
    #[serde(default)]
    pub(super) tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub(super) tls_key: Option<PathBuf>,
}

/// `[metrics]`: the opt-in TCP listener for `GET /metrics`.
#[derive(Debug, Deserialize)]
pub(super) struct RawMetrics {
    pub(super) listen: String,
    #[serde(default)]
    pub(super) allow_unauthenticated_non_loopback: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawKeys {
    pub(super) master_key_file: PathBuf,
    #[serde(default)]
    pub(super) activation_delay: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct RawDpop {
    /// `None`: not given (on with `[postgres]`, off otherwise).
    #[serde(default)]
    pub(super) require_nonce: Option<bool>,
    #[serde(default)]
    pub(super) algs: Option<Vec<String>>,
    #[serde(default)]
    pub(super) replay_capacity: Option<usize>,
    #[serde(default)]
    pub(super) replay_cache_bytes: Option<usize>,
}

/// `[clock]`: the bounds on this instance's offset from the shared store's
/// clock.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawClock {
    #[serde(default)]
    pub(super) max_skew: Option<String>,
    #[serde(default)]
    pub(super) warn_skew: Option<String>,
    #[serde(default)]
    pub(super) check_interval: Option<String>,
}

/// `[outbound]`: the broker's own outbound OAuth calls.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawOutbound {
    #[serde(default)]
    pub(super) use_env_proxy: Option<bool>,
}

/// `[proxy]`: the egress proxy's limits and timeouts.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawProxy {
    #[serde(default)]
    pub(super) max_request_body: Option<u64>,
    #[serde(default)]
    pub(super) connect_timeout: Option<String>,
    #[serde(default)]
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) max_concurrent_per_service: Option<u32>,
    #[serde(default)]
    pub(super) max_in_flight: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct RawLimits {
    #[serde(default)]
    pub(super) per_peer_per_second: Option<u32>,
    #[serde(default)]
    pub(super) per_person_tool_per_second: Option<u32>,
    #[serde(default)]
    pub(super) burst: Option<u32>,
    #[serde(default)]
    pub(super) global_per_second: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawIssuer {
    pub(super) issuer: String,
    #[serde(default)]
    pub(super) audience: Option<String>,
    #[serde(default)]
    pub(super) jwks_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) jwks_uri: Option<String>,
    #[serde(default)]
    pub(super) algs: Option<Vec<String>>,
    #[serde(default)]
    pub(super) token_types: Option<Vec<String>>,
    #[serde(default)]
    pub(super) required_claims: Option<Vec<String>>,
    #[serde(default)]
    pub(super) sign_in: Option<RawSignIn>,
    #[serde(default)]
    pub(super) introspection_endpoint: Option<String>,
    #[serde(default)]
    pub(super) introspection_client_id: Option<String>,
    #[serde(default)]
    pub(super) introspection_client_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) introspect_jwts: Option<bool>,
    #[serde(default)]
    pub(super) introspection_cache_ttl: Option<String>,
}

/// A plain struct rather than a tagged enum: serde buffers a tagged enum's
/// content, so `serde_ignored` would never see a misspelt key inside it, and
/// an unknown `kind` would be echoed in serde's message.
#[derive(Debug, Deserialize)]
pub(super) struct RawSignIn {
    pub(super) kind: String,
    #[serde(default)]
    pub(super) client_id: Option<String>,
    #[serde(default)]
    pub(super) client_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) display_name: Option<String>,
}
