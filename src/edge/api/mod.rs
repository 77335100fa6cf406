//! The orchestrator's socket: HTTP/1.1 over a Unix socket.
//!
//! `POST /v1/derive` (JSON) and `POST /token` (RFC 8693 form) feed the same
//! pipeline; `GET /v1/info` tells a client library what it needs to build
//! proofs and which API version it speaks to. Requests carrying `Origin` are refused (no browser may reach
//! the socket); bodies are capped before parsing; every error is mapped to
//! its HTTP answer in [`error_response`], and nowhere else.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use serde::Deserialize;

use crate::accounts::subject::SubjectError;
use crate::base::dpop::DpopError;
use crate::base::http::{correlation_id, json_response, read_capped, Body, BodyError};
use crate::base::jose::Alg;
use crate::base::secret::SecretString;
use crate::derive::exchange::{
    Broker, DeriveError, DeriveRequest, Endpoint, IntendedRequest, Issued, SubjectTokenType,
};
use crate::derive::upstreams::UpstreamError;
use crate::derive::upstreams::ID_TOKEN_TYPE;
use crate::edge::answer::{Answer, Link};

/// The most relayed proofs one derive may carry (one per leg; two for an
/// identity chain).
const MAX_UPSTREAM_PROOFS: usize = 2;

/// Request bodies larger than this are refused with 413.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// The RFC 8693 grant type (defined in `grammar`, which the public
/// listener's metadata also reads).
pub use crate::base::grammar::TOKEN_EXCHANGE;
/// RFC 8693 token type for access tokens.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// RFC 8693 token type for JWTs.
pub const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";

/// The socket API's version, answered by `GET /v1/info`. A client library
/// refuses to work with a broker whose version it does not know. Members
/// are only ever added to the info document; a change that breaks a client
/// gets a new version.
pub(crate) const API_VERSION: &str = "1";

/// `GET /v1/info`: the API version, the broker's version, the issuer, both
/// `htu`s and the DPoP rules, so that a client needs only the socket path.
fn info_response(broker: &Broker) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "api_version": API_VERSION,
            "broker_version": env!("CARGO_PKG_VERSION"),
            "issuer": broker.config.issuer,
            "derive_htu": broker.htu(Endpoint::Derive),
            "token_htu": broker.htu(Endpoint::Token),
            "dpop_signing_alg_values_supported":
                broker.config.dpop.algs.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
            "dpop_nonce_required": broker.config.dpop.require_nonce,
            "upstreams": broker.upstreams().map_or_else(|| serde_json::json!({}), |u| u.info()),
            "upstream_resources": upstream_resources(broker),
        }),
    )
}

/// The current policy's `exchange` resources, each with its upstream's
/// name: a client sends a proof for that upstream's token endpoint with a
/// derive for the resource (`upstream_proofs`).
fn upstream_resources(broker: &Broker) -> serde_json::Value {
    let policy = broker.policy.load();
    let mut out = serde_json::Map::new();
    for r in policy.resources.values() {
        if let crate::derive::policy::Source::Exchange { upstream } = &r.source {
            out.insert(r.canonical.clone(), upstream.as_str().into());
        }
    }
    out.into()
}

fn oauth_error(
    status: StatusCode,
    error: &'static str,
    description: impl Into<std::borrow::Cow<'static, str>>,
) -> Response<Body> {
    Answer::new(status, error, description).response()
}

/// Maps every derive error to its HTTP answer, in one place; `algs` are
/// the DPoP algorithms the config accepts (`dpop.algs`), named in the
/// challenge of a `use_dpop_nonce` answer.
pub fn error_response(err: &DeriveError, algs: &[Alg]) -> Response<Body> {
    error_answer(err, algs).response()
}

fn error_answer(err: &DeriveError, algs: &[Alg]) -> Answer {
    use StatusCode as S;
    match err {
        DeriveError::BadRequest(d) => Answer::new(S::BAD_REQUEST, "invalid_request", d.clone()),
        DeriveError::Subject(e @ SubjectError::IntrospectionUnavailable) => {
            Answer::new(S::SERVICE_UNAVAILABLE, "temporarily_unavailable", e.to_string())
                .reason("introspection_unavailable")
                .retry_after(5)
        }
        DeriveError::Subject(e) => Answer::new(S::BAD_REQUEST, "invalid_request", e.to_string()),
        DeriveError::Proof(e, nonce) => proof_answer(e, nonce.as_deref(), algs),
        DeriveError::Target(e) => {
            Answer::new(S::BAD_REQUEST, "invalid_target", format!("the resource {e}"))
        }
        DeriveError::Denied(reason) => denied_answer(*reason),
        DeriveError::RateLimited { retry_after } => Answer::new(
            S::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; retry after the delay in Retry-After",
        )
        .retry_after(*retry_after),
        DeriveError::Unavailable(what) => {
            Answer::new(S::SERVICE_UNAVAILABLE, "temporarily_unavailable", *what)
        }
        DeriveError::ClockSkew(_) => Answer::new(
            S::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "this instance's clock is too far off the database's (clock.max_skew); nothing was issued; retry, another replica may serve",
        )
        .reason("clock_skew")
        .retry_after(10),
        DeriveError::PersonRevoked => Answer::new(
            S::FORBIDDEN,
            "access_denied",
            "this person's access is stopped (credbroker persons revoke, or their identity provider's signal); nothing was issued",
        )
        .reason("person_revoked"),
        DeriveError::RevocationWatchDown => Answer::new(
            S::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "this instance has not read the person stop list within revocation.watch_bound; nothing was issued; retry, another replica may serve",
        )
        .reason("revocation_watch_down")
        .retry_after(5),
        DeriveError::LinkRequired(l) => Answer::connect_link(l),
        DeriveError::InvalidDetails(d) => {
            Answer::new(S::BAD_REQUEST, "invalid_authorization_details", d.clone())
        }
        DeriveError::ApprovalRequired(l) => {
            Answer::new(S::BAD_REQUEST, "invalid_grant", l.message.clone())
                .reason("approval_required")
                .link(Link {
                    uri: l.uri.expose().to_string(),
                    id: l.id.clone(),
                    expires_in: l.expires_in,
                    message: l.message.clone(),
                })
        }
        DeriveError::ApprovalDeclined => Answer::new(
            S::FORBIDDEN,
            "access_denied",
            "the person declined this call; ask again only with other details",
        )
        .reason("approval_declined"),
        DeriveError::TooManyApprovals => Answer::new(
            S::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "{} approvals already wait for this person from this agent, or they were asked too fast; no new link was made until the person answers one or they expire",
                crate::derive::approve::MAX_OPEN
            ),
        )
        .reason("too_many_open_approvals")
        .retry_after(60),
        DeriveError::UpstreamUnavailable { service } => Answer::new(
            S::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            format!(
                "the provider of service {service} did not answer usably in time; nothing was issued; retry later"
            ),
        )
        .reason("upstream_unavailable")
        .retry_after(5),
        DeriveError::Upstream { upstream, error } => upstream_answer(upstream, error),
        DeriveError::Vault(detail) => {
            let id = correlation_id();
            tracing::error!(correlation_id = %id, error = %detail, "vault error in derive");
            Answer::new(
                S::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("the stored account could not be used (correlation id {id})"),
            )
            .reason("vault_error")
        }
        DeriveError::Internal(detail) => {
            let id = correlation_id();
            tracing::error!(correlation_id = %id, error = %detail, "internal error in derive");
            Answer::new(
                S::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("internal error (correlation id {id})"),
            )
        }
    }
}

/// The answer to a refused DPoP proof: a required nonce (with the nonce
/// to sign and the challenge naming `algs`), a full replay cache (503), or
/// the proof's own fault.
fn proof_answer(e: &DpopError, nonce: Option<&str>, algs: &[Alg]) -> Answer {
    use StatusCode as S;
    match e {
        DpopError::UseNonce => Answer::new(
            S::BAD_REQUEST,
            "use_dpop_nonce",
            "a DPoP nonce is required; retry with the nonce in the DPoP-Nonce header",
        )
        .nonce(nonce)
        .challenge(Some("use_dpop_nonce"), algs),
        DpopError::ReplayCacheFull => Answer::new(
            S::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "the DPoP replay cache is full; retry shortly",
        ),
        e => Answer::new(S::BAD_REQUEST, "invalid_dpop_proof", e.to_string()),
    }
}

/// The answer to a derive the policy denies (403 `access_denied`, the
/// reason named).
fn denied_answer(reason: crate::derive::policy::DenyReason) -> Answer {
    use crate::derive::policy::DenyReason;
    let description = match reason {
        DenyReason::Frozen => {
            "credbroker is frozen by its operators: every derive is denied until the freeze is lifted"
        }
        DenyReason::ToolNotAllowed => "the policy has no such tool for this agent",
        DenyReason::StepNotAllowed => "the policy does not allow this tool in this step",
        DenyReason::ScopeNotAllowed => "the requested scope exceeds what the policy allows this tool",
        DenyReason::ResourceMismatch => "the resource is not the one the policy gives this tool",
    };
    Answer::new(StatusCode::FORBIDDEN, "access_denied", description).reason(reason.as_str())
}

/// The answer to a refused exchange at an upstream authorization server
/// (docs/UPSTREAM.md, "Errors").
fn upstream_answer(upstream: &str, error: &UpstreamError) -> Answer {
    use crate::derive::policy::DenyReason;
    use StatusCode as S;
    let text = format!("upstream {upstream}: {error}");
    match error {
        UpstreamError::NotConfigured => Answer::new(
            S::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            format!("the policy names upstream {upstream}, which this instance does not configure; nothing was issued"),
        ),
        UpstreamError::SubjectIssuerNotListed | UpstreamError::SubjectAudience => {
            Answer::new(S::BAD_REQUEST, "invalid_request", text)
        }
        UpstreamError::ProofRequired { htu, nonce } => {
            let a = Answer::new(
                S::BAD_REQUEST,
                "invalid_dpop_proof",
                format!("{text}: send upstream_proofs.{upstream}, a DPoP proof by the tool's key with htm POST and htu {htu}"),
            )
            .reason("upstream_proof_required")
            .member("upstream_htu", htu.clone());
            match nonce {
                Some(n) => a.member("upstream_nonce", n.clone()),
                None => a,
            }
        }
        UpstreamError::ProofInvalid(_) => Answer::new(S::BAD_REQUEST, "invalid_dpop_proof", text)
            .reason("upstream_proof_invalid"),
        UpstreamError::ProofCacheFull => Answer::new(
            S::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "the DPoP replay cache is full; retry shortly",
        ),
        UpstreamError::SubjectRejected => Answer::new(S::BAD_REQUEST, "invalid_grant", text)
            .reason("subject_token_rejected_upstream"),
        UpstreamError::Denied(code) => Answer::new(S::FORBIDDEN, "access_denied", text)
            .reason("upstream_denied")
            .member("upstream_error", *code),
        UpstreamError::Misconfigured => {
            Answer::new(S::SERVICE_UNAVAILABLE, "temporarily_unavailable", text)
                .reason("upstream_misconfigured")
                .retry_after(30)
        }
        UpstreamError::Unavailable => {
            Answer::new(S::SERVICE_UNAVAILABLE, "temporarily_unavailable", text)
                .reason("upstream_unavailable")
                .retry_after(5)
        }
        UpstreamError::BadAnswer(_) => {
            Answer::new(S::BAD_GATEWAY, "bad_gateway", text).reason("upstream_bad_answer")
        }
        UpstreamError::TokenRejected(_) => {
            Answer::new(S::BAD_GATEWAY, "bad_gateway", text).reason("upstream_token_rejected")
        }
        // The derive answers with the policy's own refusal instead; should
        // it not, as a tool the policy no longer allows.
        UpstreamError::Withdrawn => Answer::new(S::FORBIDDEN, "access_denied", text)
            .reason(DenyReason::ToolNotAllowed.as_str()),
    }
}

/// The body of a derive's answer (RFC 8693 section 2.2.1), typed, so that
/// the answer is written straight from the issued token: no JSON map is
/// built, and no copy of the token is made besides the body itself. The
/// fields are in the order a `serde_json::Value` map would print them.
#[derive(serde::Serialize)]
struct IssuedBody<'a> {
    access_token: &'a str,
    /// RFC 9396 section 7: the answer says what the token is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    authorization_details: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_in: Option<i64>,
    issued_token_type: &'static str,
    scope: &'a str,
    /// Present (and `false`) only for a token not bound to the tool's DPoP
    /// key (docs/DESIGN.md section 2, `delivery = "provider_token"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    sender_constrained: Option<bool>,
    token_type: &'a str,
}

fn issued_response(i: &Issued) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &IssuedBody {
            access_token: i.access_token.expose(),
            authorization_details: i.authorization_details.as_ref(),
            expires_in: i.expires_in,
            issued_token_type: ACCESS_TOKEN_TYPE,
            scope: &i.scope,
            sender_constrained: (!i.sender_constrained).then_some(false),
            token_type: &i.token_type,
        },
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeriveJson {
    subject_token: String,
    /// RFC 8693 `subject_token_type`: absent (an access token), or one of
    /// the types [`subject_type`] accepts.
    #[serde(default)]
    subject_token_type: Option<String>,
    step: String,
    tool: String,
    resource: String,
    #[serde(default)]
    scope: Option<String>,
    /// RFC 9396 section 3: a JSON array (checked in the pipeline).
    #[serde(default)]
    authorization_details: Option<serde_json::Value>,
    /// The tool's DPoP proofs for upstream token endpoints, by upstream
    /// name (`exchange` resources; docs/UPSTREAM.md).
    #[serde(default)]
    upstream_proofs: std::collections::BTreeMap<String, String>,
    /// The whole request the token is for (docs/APPROVALS.md, "The
    /// request, bound"), checked in the pipeline.
    #[serde(default)]
    request: Option<IntendedRequest>,
}

/// Exactly one `DPoP` header, or `None` (the pipeline refuses a missing one).
fn dpop_header(headers: &HeaderMap) -> Result<Option<SecretString>, DeriveError> {
    let mut it = headers.get_all("dpop").iter();
    match (it.next(), it.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v
            .to_str()
            .map(|s| Some(SecretString::new(s.to_owned())))
            .map_err(|_| DeriveError::Proof(DpopError::Missing, None)),
        (Some(_), Some(_)) => Err(DeriveError::Proof(DpopError::Missing, None)),
    }
}

fn bad(msg: &str) -> DeriveError {
    DeriveError::BadRequest(msg.to_owned())
}

/// The subject token's type: an access token (`...:access_token` or
/// `...:jwt`), or an ID token (`...:id_token`, for an `exchange` resource
/// only: the pipeline refuses it for any other).
fn subject_type(t: &str) -> Result<SubjectTokenType, DeriveError> {
    match t {
        ACCESS_TOKEN_TYPE | JWT_TOKEN_TYPE => Ok(SubjectTokenType::Access),
        ID_TOKEN_TYPE => Ok(SubjectTokenType::Id),
        _ => Err(bad(
            "subject_token_type is not supported (use ...:access_token, ...:jwt, or ...:id_token for an exchange resource)",
        )),
    }
}

/// Parses a derive body (JSON) into a request.
pub fn parse_json(
    body: &[u8],
    dpop: Option<SecretString>,
    peer_uid: u32,
) -> Result<DeriveRequest, DeriveError> {
    // serde's messages may quote values; answer with a fixed text.
    let j: DeriveJson = serde_json::from_slice(body).map_err(|_| {
        bad("the body must be a JSON object with string fields subject_token, step, tool, resource, optional subject_token_type, optional scope, optional authorization_details (a JSON array), optional upstream_proofs (an object of strings), optional request (an object of strings method, path, query, content_type, body), and nothing else")
    })?;
    let subject_token_type = match j.subject_token_type.as_deref() {
        None => SubjectTokenType::Access,
        Some(t) => subject_type(t)?,
    };
    if j.upstream_proofs.len() > MAX_UPSTREAM_PROOFS {
        return Err(bad("upstream_proofs holds more proofs than there are legs"));
    }
    Ok(DeriveRequest {
        subject_token: SecretString::new(j.subject_token),
        subject_token_type,
        step: j.step,
        tool: j.tool,
        resource: j.resource,
        scope: j.scope,
        dpop,
        authorization_details: j.authorization_details,
        upstream_proofs: j
            .upstream_proofs
            .into_iter()
            .map(|(k, v)| (k, SecretString::new(v)))
            .collect(),
        request: j.request,
        endpoint: Endpoint::Derive,
        peer_uid,
    })
}

/// Parses an RFC 8693 form body into a request.
pub fn parse_form(
    body: &[u8],
    dpop: Option<SecretString>,
    peer_uid: u32,
) -> Result<DeriveRequest, DeriveError> {
    let mut grant_type = None;
    let mut subject_token = None;
    let mut subject_token_type = None;
    let mut requested_token_type = None;
    let mut resources = Vec::new();
    let mut scope = None;
    let mut step = None;
    let mut tool = None;
    let mut details = None;
    let mut relayed = None;
    for (k, v) in form_urlencoded::parse(body) {
        let slot = match k.as_ref() {
            "resource" => {
                resources.push(v.into_owned());
                continue;
            }
            "grant_type" => &mut grant_type,
            "subject_token" => &mut subject_token,
            "subject_token_type" => &mut subject_token_type,
            "requested_token_type" => &mut requested_token_type,
            "scope" => &mut scope,
            "step" => &mut step,
            "tool" => &mut tool,
            "authorization_details" => &mut details,
            "upstream_proofs" => &mut relayed,
            // RFC 8693 parameters we do not support are refused, not ignored.
            "actor_token" | "actor_token_type" | "audience" => {
                return Err(bad(
                    "actor_token and audience are not supported; name the resource",
                ))
            }
            _ => continue,
        };
        if slot.is_some() {
            return Err(bad("a parameter is repeated"));
        }
        *slot = Some(v.into_owned());
    }
    if grant_type.as_deref() != Some(TOKEN_EXCHANGE) {
        return Err(bad(
            "grant_type must be urn:ietf:params:oauth:grant-type:token-exchange",
        ));
    }
    let subject_token = subject_token.ok_or_else(|| bad("subject_token is missing"))?;
    let subject_token_type = match subject_token_type.as_deref() {
        Some(t) => subject_type(t)?,
        None => return Err(bad("subject_token_type is missing")),
    };
    match requested_token_type.as_deref() {
        None | Some(ACCESS_TOKEN_TYPE) => {}
        Some(_) => {
            return Err(bad(
                "requested_token_type is not supported (only ...:access_token)",
            ))
        }
    }
    let resource = match resources.len() {
        1 => resources.remove(0),
        0 => return Err(DeriveError::BadRequest("resource is missing".into())),
        _ => {
            return Err(DeriveError::Target(
                crate::derive::policy::ResourceError::Multiple,
            ))
        }
    };
    // RFC 9396 section 6: at the token endpoint the parameter is the JSON
    // array, JSON-encoded.
    let authorization_details = match details {
        None => None,
        Some(d) => Some(serde_json::from_str(&d).map_err(|_| {
            DeriveError::InvalidDetails("authorization_details must be a JSON array".into())
        })?),
    };
    // As the JSON body's member, JSON-encoded (as authorization_details).
    let upstream_proofs = match relayed {
        None => Default::default(),
        Some(r) => {
            let m: std::collections::BTreeMap<String, String> = serde_json::from_str(&r)
                .map_err(|_| bad("upstream_proofs must be a JSON object of strings"))?;
            if m.len() > MAX_UPSTREAM_PROOFS {
                return Err(bad("upstream_proofs holds more proofs than there are legs"));
            }
            m.into_iter()
                .map(|(k, v)| (k, SecretString::new(v)))
                .collect()
        }
    };
    Ok(DeriveRequest {
        subject_token: SecretString::new(subject_token),
        subject_token_type,
        step: step.ok_or_else(|| bad("step is missing"))?,
        tool: tool.ok_or_else(|| bad("tool is missing"))?,
        resource,
        scope,
        dpop,
        authorization_details,
        upstream_proofs,
        // Nor for the request: a bound route refuses this token.
        request: None,
        endpoint: Endpoint::Token,
        peer_uid,
    })
}

async fn read_body(
    body: hyper::body::Incoming,
    headers: &HeaderMap,
) -> Result<Bytes, Response<Body>> {
    read_capped(headers, body, MAX_BODY)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => oauth_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                "the body is larger than 64 KiB",
            ),
            BodyError::BadLength => oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "bad Content-Length",
            ),
            BodyError::Unreadable => oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the body could not be read",
            ),
        })
}

fn content_type_is(headers: &HeaderMap, want: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
}

/// The root span of a derive: the orchestrator's `traceparent` is its
/// parent when `trust_socket_traceparent` says so, and only linked
/// otherwise (a new trace, sampled by the broker's ratio).
fn socket_span(
    t: &Arc<crate::infra::telemetry::Telemetry>,
    headers: &HeaderMap,
) -> crate::infra::telemetry::Span {
    use crate::infra::telemetry as tel;
    let incoming = tel::incoming(headers);
    let state = tel::incoming_state(headers);
    let trusted = t.config().trust_socket_traceparent;
    let mut root = t.server_span("derive", incoming, trusted, state.as_deref());
    root.set("http.route", "/v1/derive");
    root
}

/// Handles one request on the orchestrator socket.
pub(crate) async fn handle(
    broker: Arc<Broker>,
    peer_uid: u32,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    if req.headers().contains_key(header::ORIGIN) {
        return oauth_error(
            StatusCode::FORBIDDEN,
            "access_denied",
            "requests with an Origin header are refused: browsers may not reach this socket",
        );
    }
    let endpoint = match (req.method(), req.uri().path()) {
        // The same metadata as the public listener, so an orchestrator that
        // only reaches the socket can discover `token_endpoint` and the
        // DPoP algorithms.
        (&Method::GET, "/.well-known/oauth-authorization-server") => {
            return crate::edge::public::metadata_response(&broker)
        }
        (&Method::HEAD, "/.well-known/oauth-authorization-server") => {
            return crate::edge::public::head_of(crate::edge::public::metadata_response(&broker))
        }
        (&Method::GET, "/v1/info") => return info_response(&broker),
        (&Method::HEAD, "/v1/info") => return crate::edge::public::head_of(info_response(&broker)),
        (&Method::POST, "/v1/derive") => Endpoint::Derive,
        (&Method::POST, "/token") => Endpoint::Token,
        (_, "/v1/info") => {
            let mut r = oauth_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request",
                "use GET",
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        (_, "/v1/derive" | "/token") => {
            let mut r = oauth_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request",
                "use POST",
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        _ => {
            return oauth_error(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown path; use POST /v1/derive, POST /token, GET /v1/info or GET /.well-known/oauth-authorization-server",
            )
        }
    };
    let (parts, body) = req.into_parts();
    let want = match endpoint {
        Endpoint::Derive => "application/json",
        Endpoint::Token => "application/x-www-form-urlencoded",
    };
    if !content_type_is(&parts.headers, want) {
        return oauth_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request",
            format!("Content-Type must be {want}"),
        );
    }
    // The header timeout ends once the head is in; without a deadline of
    // its own a stalled body would hold a connection slot forever.
    let deadline = broker.config.socket.header_timeout;
    let body = match tokio::time::timeout(deadline, read_body(body, &parts.headers)).await {
        Ok(Ok(b)) => b,
        Ok(Err(r)) => return r,
        Err(_) => {
            let mut r = oauth_error(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request",
                "the body did not arrive in time",
            );
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
    let parsed = dpop_header(&parts.headers).and_then(|dpop| match endpoint {
        Endpoint::Derive => parse_json(&body, dpop, peer_uid),
        Endpoint::Token => parse_form(&body, dpop, peer_uid),
    });
    let result = match parsed {
        Ok(r) => match &broker.telemetry {
            None => broker.derive(r).await,
            Some(t) => {
                let root = socket_span(t, &parts.headers);
                crate::infra::telemetry::run(root, async {
                    let result = broker.derive(r).await;
                    // A line of the request's own: it carries the trace id.
                    tracing::debug!(issued = result.is_ok(), "derive answered");
                    result
                })
                .await
            }
        },
        Err(e) => Err(e),
    };
    match result {
        Ok(issued) => issued_response(&issued),
        // The one answer that needs the request's endpoint: say which `htu`
        // this socket expects (the issuer URL plus the path, public in the
        // metadata), never the one the proof carried.
        Err(DeriveError::Proof(DpopError::Htu, _)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_dpop_proof",
            format!(
                "htu does not match the request URL: this endpoint expects htu {} (the issuer URL plus the path)",
                broker.htu(endpoint)
            ),
        ),
        Err(e) => error_response(&e, &broker.config.dpop.algs),
    }
}
