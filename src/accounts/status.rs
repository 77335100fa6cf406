//! Subject-token status: RFC 7662 introspection at the token's issuer,
//! where `[[trusted_issuers]]` names an `introspection_endpoint` (off by
//! default). An opaque subject token (not a JWT) is accepted only through
//! it; with `introspect_jwts` a JWT that passed every check of
//! [`super::subject`] is asked about too, so that a token the issuer
//! revoked stops before its `exp`.
//!
//! Fail closed: an inactive token is refused ([`Failure::Inactive`]);
//! an endpoint that cannot answer (unreachable, timed out, a 5xx, a
//! refusal of our client, a malformed or oversized answer) refuses the
//! derive ([`Failure::Unavailable`]), never lets the token through. The answers stand only as long as the subject cache
//! keeps the token, at most `introspection_cache_ttl` (in memory: the
//! `self` derive path makes no store call).

use crate::base::oauth::introspect::{self, IntrospectError, Introspection, Request};
use crate::base::secret::SecretString;
use crate::infra::config::IntrospectionConfig;

/// Why a token's status does not let it through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The issuer says it is not active.
    Inactive,
    /// No usable answer.
    Unavailable,
}

/// Bound on connecting to an introspection endpoint.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Bound on a whole introspection, its answer read.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One issuer's introspection: its endpoint, our client there.
pub(crate) struct Status {
    pub(crate) cfg: IntrospectionConfig,
    issuer: String,
    secret: SecretString,
    http: reqwest::Client,
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status")
            .field("endpoint", &self.cfg.endpoint)
            .finish_non_exhaustive()
    }
}

impl Status {
    /// Reads the client secret now (mode 0600); builds the client (no
    /// redirects, its own timeouts, `[outbound] use_env_proxy`'s rule).
    pub(crate) fn new(issuer: &str, cfg: &IntrospectionConfig) -> Result<Status, String> {
        let bytes = crate::base::secret::read_secret_file(&cfg.client_secret_file)
            .map_err(|e| e.to_string())?;
        let secret = std::str::from_utf8(bytes.expose())
            .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
            .ok()
            .filter(|s| !s.is_empty())
            .map(SecretString::new)
            .ok_or_else(|| format!("{}: empty or not UTF-8", cfg.client_secret_file.display()))?;
        let http = crate::base::http::outbound_client()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("the HTTPS client: {e}"))?;
        Ok(Status {
            cfg: cfg.clone(),
            issuer: issuer.to_owned(),
            secret,
            http,
        })
    }

    /// Asks about `token` (`client_secret_basic`); an answer that is not
    /// active is [`Failure::Inactive`].
    pub(crate) async fn ask(&self, token: &str) -> Result<Introspection, Failure> {
        let authorization = Some(crate::base::oauth::basic_authorization(
            &self.cfg.client_id,
            self.secret.expose(),
        ));
        let req = Request {
            endpoint: &self.cfg.endpoint,
            token,
            hint: "access_token",
            authorization,
            form: Vec::new(),
        };
        let answer = introspect::introspect(&self.http, req).await.map_err(|e| {
            match &e {
                IntrospectError::Refused(code) => tracing::error!(issuer = %self.issuer, error = %code, "the issuer's introspection endpoint refused this broker's request; check trusted_issuers[].introspection_client_id and its secret"),
                e => tracing::warn!(issuer = %self.issuer, error = %e, "the issuer's introspection endpoint gave no usable answer"),
            }
            Failure::Unavailable
        })?;
        if !answer.active {
            return Err(Failure::Inactive);
        }
        Ok(answer)
    }
}
