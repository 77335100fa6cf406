//! Every refusal of the proxy: one type, [`Refusal`], whose variants are
//! the rows of the check table in docs/PROXY.md, each carrying its typed
//! denial (never a sentence to match on). The `reason` on the wire, the
//! event's and the metrics' label, comes from [`Refusal::reason`]; the
//! HTTP answer from [`Refusal::response`], through the answer every HTTP
//! surface shares ([`Answer`]), and nowhere else.

use http::{Response, StatusCode};

use crate::base::grammar::PathError;
use crate::base::http::{correlation_id, Body};
use crate::base::jose::Alg;
use crate::derive::exchange::DeriveError;
use crate::derive::policy::RouteDenial;
use crate::edge::answer::Answer;
use crate::verify::VerifyError;

/// Why the proxy refused a call, in the order of the check table.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// `proxy.max_in_flight` calls are in flight (503 `proxy_busy`).
    ProxyBusy,
    /// The request's shape (400).
    Shape(Shape),
    /// No proxy address here: not a configured service, or no path under
    /// it (404 `not_a_proxy_address`).
    NotFound,
    /// The raw path breaks the path grammar (400 `invalid_path`).
    Path(PathError),
    /// The broker is frozen (403 `frozen`).
    Frozen,
    /// This instance's clock is off the database's beyond
    /// `clock.max_skew` (503 `clock_skew`).
    ClockSkew,
    /// This instance has not read the person stop list within
    /// `revocation.watch_bound` (503 `revocation_watch_down`).
    RevocationWatchDown,
    /// The token or its proof (401, with a DPoP challenge).
    Token(VerifyError),
    /// The token's person is stopped (401 `invalid_token`, reason
    /// `person_revoked`, with a DPoP challenge).
    PersonRevoked,
    /// A fresh nonce is required (`[dpop] require_nonce`): 401
    /// `use_dpop_nonce` with the nonce to sign the next proof with.
    UseNonce(String),
    /// The store's replay tree could not answer (503
    /// `replay_store_unavailable`).
    ReplayStore(ReplayCheck),
    /// A credential in the query (400 `credentials_in_query`).
    CredentialsInQuery,
    /// The current policy refuses the call (403).
    Route(RouteDenial),
    /// The per-person-and-tool rate limit: retry after this many seconds
    /// (429 `rate_limited`).
    RateLimited(u64),
    /// `proxy.max_concurrent_per_service` calls to this service are in
    /// flight (503 `service_busy`).
    ServiceBusy,
    /// The request body is over the cap, in bytes (413
    /// `request_too_large`).
    TooLarge(u64),
    /// The request body could not be read (400 `invalid_request`).
    BodyUnreadable,
    /// On a route with `bind_request`: the body is over the largest
    /// bindable body (413 `bound_body_too_large`).
    BoundBodyTooLarge,
    /// On a route with `bind_request`: a JSON body that is not I-JSON
    /// (400 `body_not_ijson`).
    BodyNotIJson,
    /// On a route with `bind_request`: the request is not the one the
    /// token was approved for (403 `request_mismatch`).
    RequestMismatch,
    /// `proxy.timeout` ran out, reading the request body or waiting for
    /// the provider (504 `upstream_timeout`).
    Timeout,
    /// This instance's config cannot reach the service (503).
    NotConfigured(Missing),
    /// The path and query cannot be sent on (400 `invalid_request`).
    Unsendable,
    /// The service source refused: connect, allow, reconnect, or the
    /// provider did not answer usably.
    Derive(DeriveError),
    /// The `proxy.request` event could not be written (503
    /// `audit_unavailable`).
    AuditUnavailable,
    /// The provider (502 or 504).
    Upstream(UpstreamFailure),
}

/// A request the proxy never forwards, whatever its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `CONNECT` or `TRACE`.
    Method,
    /// An absolute-form request target.
    AbsoluteForm,
    /// `Upgrade` (or `Connection: upgrade`).
    Upgrade,
    /// More than one `Authorization` header.
    TwoAuthorizations,
    /// `Host` framing RFC 9112 refuses: two `Host` lines, or none in HTTP/1.1.
    Framing(crate::base::http::HostFraming),
}

/// Which replay check the store could not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayCheck {
    /// The proof's `jti`.
    Proof,
    /// A single-use token's `jti`.
    SingleUse,
}

/// What this instance's config lacks to reach the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// No connected services at all.
    ConnectedServices,
    /// No provider for the policy's service.
    Provider,
    /// The provider has no `api_base`.
    ApiBase,
}

impl Missing {
    /// What the answer's sentence says is missing.
    fn sentence(self) -> &'static str {
        match self {
            Missing::ConnectedServices => "connected services are not configured on this instance",
            Missing::Provider => "the policy names a service that has no provider in the config",
            Missing::ApiBase => "the service's provider has no api_base",
        }
    }
}

/// How the call to the provider failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamFailure {
    /// The provider's token cannot be sent in a header (502
    /// `upstream_unreachable`).
    TokenNotAHeader,
    /// The provider's API could not be reached (502
    /// `upstream_unreachable`).
    Unreachable,
    /// Connecting took longer than `proxy.connect_timeout` (504
    /// `upstream_timeout`).
    ConnectTimeout,
    /// The answer failed before its head went out (502 `upstream_failed`).
    Failed,
    /// The answer's head or first chunk carried a provider token (502
    /// `echo_blocked`).
    Echo,
}

impl Refusal {
    /// The `reason` of the answer, the event and the metrics.
    pub(crate) fn reason(&self) -> &'static str {
        // One arm per reason, each `=> "literal"` on its line: the
        // contract test (tests/it/contract/refusals.rs) reads them here.
        match self {
            Refusal::ProxyBusy => "proxy_busy",
            Refusal::Shape(Shape::Method) => "method_refused",
            Refusal::Shape(Shape::AbsoluteForm) => "absolute_form",
            Refusal::Shape(Shape::Upgrade) => "upgrade_refused",
            Refusal::Shape(Shape::TwoAuthorizations) => "invalid_request",
            Refusal::Shape(Shape::Framing(_)) => "invalid_framing",
            Refusal::NotFound => "not_a_proxy_address",
            Refusal::Path(_) => "invalid_path",
            Refusal::Frozen => "frozen",
            Refusal::ClockSkew => "clock_skew",
            Refusal::RevocationWatchDown => "revocation_watch_down",
            Refusal::PersonRevoked => "person_revoked",
            Refusal::Token(VerifyError::Proof(_)) => "invalid_dpop_proof",
            Refusal::Token(VerifyError::AlreadyUsed) => "token_already_used",
            Refusal::Token(_) => "invalid_token",
            Refusal::UseNonce(_) => "use_dpop_nonce",
            Refusal::ReplayStore(_) => "replay_store_unavailable",
            Refusal::CredentialsInQuery => "credentials_in_query",
            Refusal::Route(d) => d.as_str(),
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::ServiceBusy => "service_busy",
            Refusal::TooLarge(_) => "request_too_large",
            Refusal::BodyUnreadable => "invalid_request",
            Refusal::BoundBodyTooLarge => "bound_body_too_large",
            Refusal::BodyNotIJson => "body_not_ijson",
            Refusal::RequestMismatch => "request_mismatch",
            Refusal::Timeout => "upstream_timeout",
            Refusal::NotConfigured(_) => "temporarily_unavailable",
            Refusal::Unsendable => "invalid_request",
            Refusal::Derive(e) => e.reason(),
            Refusal::AuditUnavailable => "audit_unavailable",
            Refusal::Upstream(UpstreamFailure::TokenNotAHeader) => "upstream_unreachable",
            Refusal::Upstream(UpstreamFailure::Unreachable) => "upstream_unreachable",
            Refusal::Upstream(UpstreamFailure::ConnectTimeout) => "upstream_timeout",
            Refusal::Upstream(UpstreamFailure::Failed) => "upstream_failed",
            Refusal::Upstream(UpstreamFailure::Echo) => "echo_blocked",
        }
    }

    /// The status, the OAuth `error` and the sentence of the refusal's
    /// answer.
    fn answer_of(&self) -> Answer {
        use StatusCode as S;
        let bad = |d: &'static str| Answer::new(S::BAD_REQUEST, "invalid_request", d);
        let unavailable =
            |d: &'static str| Answer::new(S::SERVICE_UNAVAILABLE, "temporarily_unavailable", d);
        let forbidden = |d: &'static str| Answer::new(S::FORBIDDEN, "insufficient_scope", d);
        match self {
            Refusal::ProxyBusy => unavailable("too many proxied calls in flight; retry later"),
            Refusal::ClockSkew => unavailable(
                "this instance's clock is too far off the database's (clock.max_skew); nothing was sent; retry, another replica may serve",
            ),
            Refusal::RevocationWatchDown => unavailable(
                "this instance has not read the person stop list within revocation.watch_bound; nothing was sent; retry, another replica may serve",
            ),
            Refusal::PersonRevoked => Answer::new(
                S::UNAUTHORIZED,
                "invalid_token",
                "this person's access is stopped (credbroker persons revoke, or their identity provider's signal); nothing was sent",
            ),
            Refusal::Shape(shape) => shape_answer(shape),
            Refusal::NotFound => Answer::new(
                S::NOT_FOUND,
                "invalid_request",
                "no proxy address here: calls go to {issuer}/proxy/{service}/{path}",
            ),
            Refusal::Path(e) => bad(e.message()),
            Refusal::Route(RouteDenial::DetailsMismatch) => forbidden(
                "the path's variables are not the ones in the token's approved authorization_details",
            ),
            Refusal::Frozen | Refusal::Route(_) => forbidden(
                "the current policy does not allow this call for the token's tool and step",
            ),
            Refusal::Token(e) => {
                let error = if matches!(e, VerifyError::Proof(_)) {
                    "invalid_dpop_proof"
                } else {
                    "invalid_token"
                };
                Answer::new(S::UNAUTHORIZED, error, e.to_string())
            }
            Refusal::UseNonce(_) => Answer::new(
                S::UNAUTHORIZED,
                "use_dpop_nonce",
                "a fresh DPoP nonce is required: sign a new proof with the DPoP-Nonce of this answer",
            ),
            Refusal::ReplayStore(ReplayCheck::Proof) => {
                unavailable("the proof's replay check could not be made; retry later")
            }
            Refusal::ReplayStore(ReplayCheck::SingleUse) => {
                unavailable("the token's single-use check could not be made; retry later")
            }
            Refusal::CredentialsInQuery => bad("a credential in the query is refused (send the token in Authorization only); nothing was sent"),
            Refusal::RateLimited(_) => Answer::new(
                S::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many calls for this person and tool; retry later",
            ),
            Refusal::ServiceBusy => unavailable("too many calls to this service in flight (proxy.max_concurrent_per_service); retry later"),
            Refusal::TooLarge(cap) => Answer::new(
                S::PAYLOAD_TOO_LARGE,
                "invalid_request",
                format!("the request body is larger than the proxy's cap of {cap} bytes (proxy.max_request_body); nothing was sent"),
            ),
            Refusal::BodyUnreadable => bad("the request body could not be read"),
            Refusal::BoundBodyTooLarge => Answer::new(
                S::PAYLOAD_TOO_LARGE,
                "invalid_request",
                format!(
                    "the route binds the request to its approval, and the body is over the largest bindable body ({} bytes); nothing was sent",
                    credbroker_verify::request::MAX_BOUND_BODY
                ),
            ),
            Refusal::BodyNotIJson => bad("the route binds the request to its approval, and its JSON body is not I-JSON (a duplicate member name, a lone surrogate, a number a double does not hold exactly or beyond 2^53 - 1, or too deep), or its charset is not utf-8; nothing was sent"),
            Refusal::RequestMismatch => forbidden(
                "the request (method, path, query, content type or body) is not the one approved for this token; nothing was sent",
            ),
            Refusal::Timeout => Answer::new(
                S::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the provider did not answer within the proxy's timeout (proxy.timeout)",
            ),
            Refusal::NotConfigured(missing) => unavailable(missing.sentence()),
            Refusal::Unsendable => bad("the request's path or query cannot be sent on"),
            Refusal::AuditUnavailable => {
                unavailable("the audit log cannot be written, so nothing was sent; retry later")
            }
            Refusal::Upstream(failure) => upstream_answer(failure),
            Refusal::Derive(e) => derive_answer(e),
        }
    }

    /// The refusal's HTTP answer, the one place a refusal becomes one:
    /// its `reason`, `Retry-After` on a 429 and on a 503 (but a vault or
    /// internal error's), and on a 401 the
    /// DPoP challenge naming `algs` (the config's `dpop.algs`).
    pub(crate) fn response(&self, algs: &[Alg]) -> Response<Body> {
        let answer = match self {
            // A service source's refusal with a link is answered as a
            // derive answers it.
            Refusal::Derive(DeriveError::LinkRequired(l)) => {
                return Answer::connect_link(l).response()
            }
            _ => self.answer_of().reason(self.reason()),
        };
        let answer = match self {
            Refusal::Token(e) => answer.challenge(challenge_error(e), algs),
            Refusal::PersonRevoked => answer.challenge(Some("invalid_token"), algs),
            Refusal::RevocationWatchDown => answer.retry_after(5),
            Refusal::UseNonce(nonce) => answer
                .challenge(Some("use_dpop_nonce"), algs)
                .nonce(Some(nonce)),
            Refusal::RateLimited(wait) => answer.retry_after(*wait),
            Refusal::ProxyBusy
            | Refusal::ServiceBusy
            | Refusal::ReplayStore(_)
            | Refusal::NotConfigured(_)
            | Refusal::AuditUnavailable => answer.retry_after(1),
            Refusal::ClockSkew => answer.retry_after(10),
            // As a derive answers it; a vault or internal error is not
            // known to pass, so it names no time.
            Refusal::Derive(DeriveError::UpstreamUnavailable { .. }) => answer.retry_after(5),
            _ => answer,
        };
        answer.response()
    }
}

/// The answer to a request of a shape the proxy never sends on (400).
fn shape_answer(shape: &Shape) -> Answer {
    let sentence = match shape {
        Shape::Method => "CONNECT and TRACE are never proxied",
        Shape::AbsoluteForm => "an absolute-form request target is refused; send the path only",
        Shape::Upgrade => "Upgrade is never proxied",
        Shape::TwoAuthorizations => "one Authorization header only",
        Shape::Framing(f) => {
            return Answer::new(StatusCode::BAD_REQUEST, "invalid_request", f.to_string())
        }
    };
    Answer::new(StatusCode::BAD_REQUEST, "invalid_request", sentence)
}

/// The answer when the provider's API failed the call: a connect timeout
/// (504), else a bad gateway (502).
fn upstream_answer(failure: &UpstreamFailure) -> Answer {
    let sentence = match failure {
        UpstreamFailure::ConnectTimeout => {
            return Answer::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the provider's API could not be connected to within proxy.connect_timeout",
            )
        }
        UpstreamFailure::TokenNotAHeader => "the provider's token cannot be sent in a header",
        UpstreamFailure::Unreachable => "the provider's API could not be reached",
        UpstreamFailure::Failed => "the provider's answer failed",
        UpstreamFailure::Echo => {
            "the provider's answer carried a provider token; it was not passed on"
        }
    };
    Answer::new(StatusCode::BAD_GATEWAY, "bad_gateway", sentence)
}

/// The answer when the service source could not give the provider's
/// token (503); an unexpected error is logged under a correlation id that
/// the answer names, and nothing more of it is told.
fn derive_answer(e: &DeriveError) -> Answer {
    let sentence = match e {
        DeriveError::UpstreamUnavailable { .. } => std::borrow::Cow::Borrowed(
            "the provider did not give a usable token in time; nothing was sent; retry later",
        ),
        e => {
            let id = correlation_id();
            tracing::error!(correlation_id = %id, error = %e, "proxy: service source failed");
            format!("internal error; correlation id {id}").into()
        }
    };
    Answer::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        sentence,
    )
}

/// The `error` of the DPoP challenge for a token or proof refusal (RFC
/// 9449 section 7.1; none when no token was sent, RFC 6750 section 3.1).
fn challenge_error(e: &VerifyError) -> Option<&'static str> {
    match e {
        VerifyError::NoToken => None,
        VerifyError::Proof(_) => Some("invalid_dpop_proof"),
        _ => Some("invalid_token"),
    }
}
