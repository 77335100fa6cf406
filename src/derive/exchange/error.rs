//! Every way a derive can fail, and the refusals that carry a link.
//! `api::error_response` maps each to its HTTP answer; a failure below the
//! pipeline (the vault, a connect link, the approval store, the audit sink,
//! signing) is kept as its typed source, never flattened to a string.

use crate::accounts::connect::ConnectError;
use crate::accounts::subject::SubjectError;
use crate::accounts::vault::VaultError;
use crate::base::dpop::DpopError;
use crate::base::secret::SecretString;
use crate::derive::approve::ApproveError;
use crate::derive::mint::MintError;
use crate::derive::policy::{DenyReason, ResourceError};
use crate::derive::upstreams::UpstreamError;
use crate::infra::events::AuditError;
use crate::infra::store::StoreError;

/// A refusal that carries an approval link: the same link fields as a
/// connect refusal, so every relay works unchanged.
#[derive(Debug)]
pub struct ApprovalRefusal {
    /// The URL the person opens.
    pub uri: SecretString,
    /// The approval id.
    pub id: String,
    /// Seconds the link stays open.
    pub expires_in: i64,
    /// A sentence for the person, naming the agent and the tool.
    pub message: String,
}

impl LinkRefusal {
    /// The refusal's JSON body, the same on the socket and from the proxy.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": "invalid_grant",
            "reason": self.kind.reason(),
            "error_description": self.message,
            "connect_uri": self.uri.expose(),
            "connect_id": self.id,
            "connect_expires_in": self.expires_in,
            "connect_message": self.message,
        })
    }
}

/// A refusal that carries a connect link (step 6 of the pipeline; the
/// links: docs/DESIGN.md section 5).
#[derive(Debug)]
pub struct LinkRefusal {
    /// What the link is for; its `reason()` is the refusal's reason.
    pub kind: crate::accounts::connect::LinkKind,
    /// The URL the person opens (it holds the link code).
    pub uri: SecretString,
    /// The link id (also the MCP elicitation id).
    pub id: String,
    /// Seconds the link stays open.
    pub expires_in: i64,
    /// A sentence for the person, naming the agent and the service.
    pub message: String,
}

/// Every way a derive can fail. `api::error_response` maps each to HTTP.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    /// Malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// Bad subject token.
    #[error(transparent)]
    Subject(#[from] SubjectError),
    /// Bad DPoP proof (or a nonce is needed).
    #[error("{0}")]
    Proof(DpopError, Option<String>),
    /// The resource is not acceptable.
    #[error("resource {0}")]
    Target(#[from] ResourceError),
    /// The policy denies it.
    #[error("denied: {}", .0.as_str())]
    Denied(DenyReason),
    /// A rate limit.
    #[error("rate limited")]
    RateLimited {
        /// Seconds to wait.
        retry_after: u64,
    },
    /// This instance cannot serve a service-backed grant: connected services
    /// are not configured, or the policy names a service with no provider
    /// (a reload can); nothing issued.
    #[error("temporarily unavailable: {0}")]
    Unavailable(&'static str),
    /// This instance's clock is off the database's beyond `clock.max_skew`
    /// (`infra::skew`): nothing is issued until it is corrected.
    #[error("{0}")]
    ClockSkew(crate::infra::skew::TooFar),
    /// The person is stopped (`credbroker persons revoke`, a Shared
    /// Signals event; `derive::persons`).
    #[error("person_revoked")]
    PersonRevoked,
    /// This instance has not read the person stop list within
    /// `revocation.watch_bound`, and `revocation.watch_failure` is
    /// `refuse`: nothing is issued until it has.
    #[error("revocation_watch_down")]
    RevocationWatchDown,
    /// The person must open a link first (connect, allow, reconnect).
    #[error("{}", .0.kind.reason())]
    LinkRequired(Box<LinkRefusal>),
    /// `authorization_details` the policy does not accept (RFC 9396
    /// section 5); refused before any approval link is made.
    #[error("invalid authorization_details: {0}")]
    InvalidDetails(String),
    /// The call needs its person's approval: the link to it.
    #[error("approval_required")]
    ApprovalRequired(Box<ApprovalRefusal>),
    /// The person declined this call.
    #[error("approval_declined")]
    ApprovalDeclined,
    /// Too many approvals already wait for this person from this agent,
    /// or they are asked too fast: no new link.
    #[error("too many open approvals")]
    TooManyApprovals,
    /// A service's provider did not answer usably in time; nothing issued.
    #[error("the provider of service {service} is unavailable")]
    UpstreamUnavailable {
        /// The service.
        service: String,
    },
    /// The exchange at an upstream authorization server was refused
    /// (`exchange` resources; docs/UPSTREAM.md).
    #[error("upstream {upstream}: {error}")]
    Upstream {
        /// The upstream's name.
        upstream: String,
        /// Why.
        error: UpstreamError,
    },
    /// The vault failed (a record that does not open, the store, keys).
    #[error("vault: {0}")]
    Vault(#[source] VaultError),
    /// An internal failure (audit sink, signing).
    #[error("internal error")]
    Internal(#[source] InternalError),
}

impl DeriveError {
    /// A short, bounded label for metrics and events.
    pub fn reason(&self) -> &'static str {
        match self {
            DeriveError::BadRequest(_) => "invalid_request",
            DeriveError::Subject(SubjectError::IntrospectionUnavailable) => {
                "introspection_unavailable"
            }
            DeriveError::Subject(_) => "invalid_subject_token",
            DeriveError::Proof(DpopError::UseNonce, _) => "use_dpop_nonce",
            DeriveError::Proof(DpopError::ReplayCacheFull, _) => "replay_cache_full",
            DeriveError::Proof(..) => "invalid_dpop_proof",
            DeriveError::Target(_) => "invalid_target",
            DeriveError::Denied(r) => r.as_str(),
            DeriveError::RateLimited { .. } => "rate_limited",
            DeriveError::Unavailable(_) => "temporarily_unavailable",
            DeriveError::ClockSkew(_) => "clock_skew",
            DeriveError::PersonRevoked => "person_revoked",
            DeriveError::RevocationWatchDown => "revocation_watch_down",
            DeriveError::LinkRequired(l) => l.kind.reason(),
            DeriveError::InvalidDetails(_) => "invalid_authorization_details",
            DeriveError::ApprovalRequired(_) => "approval_required",
            DeriveError::ApprovalDeclined => "approval_declined",
            DeriveError::TooManyApprovals => "too_many_open_approvals",
            DeriveError::UpstreamUnavailable { .. } => "upstream_unavailable",
            DeriveError::Upstream { error, .. } => match error {
                UpstreamError::NotConfigured => "temporarily_unavailable",
                UpstreamError::SubjectIssuerNotListed | UpstreamError::SubjectAudience => {
                    "invalid_subject_token"
                }
                UpstreamError::ProofRequired { .. } => "upstream_proof_required",
                UpstreamError::ProofInvalid(_) => "upstream_proof_invalid",
                UpstreamError::ProofCacheFull => "replay_cache_full",
                UpstreamError::SubjectRejected => "subject_token_rejected_upstream",
                UpstreamError::Denied(_) => "upstream_denied",
                UpstreamError::Misconfigured => "upstream_misconfigured",
                UpstreamError::Unavailable => "upstream_unavailable",
                UpstreamError::BadAnswer(_) => "upstream_bad_answer",
                UpstreamError::TokenRejected(_) => "upstream_token_rejected",
                UpstreamError::Withdrawn => "tool_not_allowed",
            },
            DeriveError::Vault(_) => "vault_error",
            DeriveError::Internal(_) => "internal_error",
        }
    }
}

/// An internal failure of a derive: what failed, with its error.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    /// The audit sink did not take the event (no event, no token).
    #[error("{0}")]
    Audit(#[source] AuditError),
    /// Signing the token failed.
    #[error("{0}")]
    Mint(#[source] MintError),
    /// The connect-link store failed.
    #[error("connect link: {0}")]
    Link(#[source] ConnectError),
    /// The approval store failed.
    #[error("approvals: {0}")]
    Approvals(#[source] ApproveError),
}

impl From<crate::derive::persons::Refused> for DeriveError {
    fn from(r: crate::derive::persons::Refused) -> DeriveError {
        match r {
            crate::derive::persons::Refused::Revoked => DeriveError::PersonRevoked,
            crate::derive::persons::Refused::WatchDown => DeriveError::RevocationWatchDown,
        }
    }
}

impl From<AuditError> for DeriveError {
    fn from(e: AuditError) -> DeriveError {
        DeriveError::Internal(InternalError::Audit(e))
    }
}

impl From<MintError> for DeriveError {
    fn from(e: MintError) -> DeriveError {
        DeriveError::Internal(InternalError::Mint(e))
    }
}

/// A shared store that does not answer (down, slow past its statement
/// timeout, its pool full): a temporary refusal, nothing issued.
fn store_unavailable(e: &StoreError) -> Option<DeriveError> {
    let StoreError::Unavailable(m) = e else {
        return None;
    };
    tracing::warn!(error = %m, "the store is unavailable during a derive");
    Some(DeriveError::Unavailable(
        "the store is unavailable; retry shortly",
    ))
}

/// A vault failure during a derive: a store that does not answer is a
/// temporary refusal; an unreadable record is reported (log and the derive
/// event's reason), never served; its text holds no secret.
pub(super) fn vault_error(e: VaultError) -> DeriveError {
    if let VaultError::Store(s) = &e {
        if let Some(r) = store_unavailable(s) {
            return r;
        }
    }
    tracing::error!(error = %e, "vault failure during a derive");
    DeriveError::Vault(e)
}

/// A connect-link failure during a derive: a store that does not answer
/// is a temporary refusal, like [`vault_error`]'s.
pub(super) fn link_error(e: ConnectError) -> DeriveError {
    if let ConnectError::Store(s) = &e {
        if let Some(r) = store_unavailable(s) {
            return r;
        }
    }
    DeriveError::Internal(InternalError::Link(e))
}

/// An approval-store failure during a derive: a store that does not
/// answer is a temporary refusal, like [`vault_error`]'s (the call is
/// neither approved nor recorded, so nothing is issued).
pub(super) fn approval_error(e: ApproveError) -> DeriveError {
    if let ApproveError::Store(s) = &e {
        if let Some(r) = store_unavailable(s) {
            return r;
        }
    }
    DeriveError::Internal(InternalError::Approvals(e))
}

#[cfg(test)]
mod store_outage_tests {
    //! A shared store that does not answer fails a service derive closed
    //! with a temporary refusal (503 `temporarily_unavailable`), not a 500.
    use super::*;

    #[test]
    fn an_unavailable_store_is_a_temporary_refusal() {
        let outage = || StoreError::Unavailable("get: connection refused".into());
        let e = vault_error(VaultError::Store(outage()));
        assert!(matches!(e, DeriveError::Unavailable(_)), "{e:?}");
        assert_eq!(e.reason(), "temporarily_unavailable");
        let e = link_error(ConnectError::Store(outage()));
        assert!(matches!(e, DeriveError::Unavailable(_)), "{e:?}");
        let e = approval_error(ApproveError::Store(outage()));
        assert!(matches!(e, DeriveError::Unavailable(_)), "{e:?}");
        let e = approval_error(ApproveError::Corrupt);
        assert!(matches!(e, DeriveError::Internal(_)), "{e:?}");
        // Positive control: a broken record stays what it is, and keeps
        // its source.
        let e = vault_error(VaultError::Store(StoreError::Backend("corrupt".into())));
        assert!(matches!(e, DeriveError::Vault(_)), "{e:?}");
        let source = std::error::Error::source(&e).expect("the vault error is the source");
        assert!(source.to_string().contains("corrupt"), "{source}");
    }
}
