//! Stage 8, upstream: the call goes to the provider's `api_base` + path +
//! query and nowhere else (the client, `client`, reads no proxy from the
//! environment and follows no redirect), with an allowlist of the tool's
//! request headers and the provider token in the provider's scheme. A 401
//! to an idempotent call (RFC 9110 section 9.2.2), whose body is all here,
//! is retried once after a refresh; a grant that is gone marks the account
//! and answers `reconnect_required`.

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Method, Request, StatusCode};

use super::refusal::{Missing, Refusal, UpstreamFailure};
use super::{client, Call, Proxy, Slots};
use crate::accounts::vault::ServiceToken;

/// Request headers forwarded upstream, besides those a provider preset
/// names; the provider token and `Accept-Encoding: identity` are added.
const REQUEST_HEADERS: &[&str] = &["content-type", "accept", "user-agent"];
/// Request headers GitHub's API reads.
const GITHUB_REQUEST_HEADERS: &[&str] = &["x-github-api-version"];

/// Where a call goes: `api_base` + the raw path + the query.
pub(super) struct Target {
    uri: http::Uri,
    /// Headers of the tool's request the provider's preset adds to
    /// [`REQUEST_HEADERS`].
    preset_headers: &'static [&'static str],
}

/// The provider's answer to a call, before its body is read.
pub(super) struct Sent {
    pub(super) resp: http::Response<hyper::body::Incoming>,
    /// The token the call went with, and the one a retry replaced: the
    /// echo guard looks for both.
    pub(super) tokens: Vec<ServiceToken>,
    /// The call's total timeout (`proxy.timeout`), from before the send.
    pub(super) deadline: tokio::time::Instant,
    pub(super) bytes_up: u64,
    pub(super) slots: Slots,
}

impl Proxy {
    /// The call's target, made before the provider's token is read and the
    /// call spent.
    pub(super) fn target(
        &self,
        call: &Call,
        parts: &http::request::Parts,
    ) -> Result<Target, Refusal> {
        let conn = self
            .broker
            .connected_services()
            .ok_or(Refusal::NotConfigured(Missing::ConnectedServices))?;
        let provider = conn
            .providers
            .get(&call.service)
            .ok_or(Refusal::NotConfigured(Missing::Provider))?;
        let api_base = provider
            .config()
            .api_base
            .as_deref()
            .ok_or(Refusal::NotConfigured(Missing::ApiBase))?;
        let preset_headers: &[&str] = if api_base == crate::infra::config::GITHUB_API {
            GITHUB_REQUEST_HEADERS
        } else {
            &[]
        };
        let rest = call.rest(parts);
        // A bound request's empty query hashes as none, and goes as none.
        let query = parts.uri.query().filter(|q| !(call.binds && q.is_empty()));
        let target = match query {
            Some(q) => format!("{api_base}{rest}?{q}"),
            None => format!("{api_base}{rest}"),
        };
        // api_base is an origin, and the path and query passed the
        // listener's parse and the path grammar.
        let uri = http::Uri::try_from(target).map_err(|_| Refusal::Unsendable)?;
        Ok(Target {
            uri,
            preset_headers,
        })
    }

    /// Sends the call, and retries it once after a refresh when the
    /// provider refuses the token of an idempotent call.
    pub(super) async fn send(
        &self,
        call: &Call,
        parts: &http::request::Parts,
        body: Bytes,
        target: Target,
        token: ServiceToken,
        slots: Slots,
    ) -> Result<Sent, Refusal> {
        let deadline = tokio::time::Instant::now() + self.broker.config.proxy.timeout;
        let idempotent = matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
        );
        let mut tokens = vec![token];
        loop {
            let req = request(parts, &body, &target, &tokens[0])?;
            let sent = tokio::time::timeout_at(deadline, self.client.request(req)).await;
            let resp = match sent {
                Err(_) => return Err(Refusal::Timeout),
                Ok(Err(e)) if client::is_connect_timeout(&e) => {
                    return Err(Refusal::Upstream(UpstreamFailure::ConnectTimeout))
                }
                Ok(Err(_)) => return Err(Refusal::Upstream(UpstreamFailure::Unreachable)),
                Ok(Ok(r)) => r,
            };
            if resp.status() != StatusCode::UNAUTHORIZED || !idempotent || tokens.len() > 1 {
                return Ok(Sent {
                    resp,
                    tokens,
                    deadline,
                    bytes_up: body.len() as u64,
                    slots,
                });
            }
            // The provider refused the token: one refresh, one retry, for an
            // idempotent call whose body is all here. A grant that is gone
            // marks the account and answers reconnect_required.
            let fresh = self
                .provider_token(call, Some(tokens[0].access_token.expose()))
                .await?;
            tokens.insert(0, fresh);
        }
    }
}

/// The upstream request: the allowlisted headers of the tool's request,
/// then the provider token and `Accept-Encoding: identity`.
fn request(
    parts: &http::request::Parts,
    body: &Bytes,
    target: &Target,
    token: &ServiceToken,
) -> Result<Request<http_body_util::Full<Bytes>>, Refusal> {
    let scheme = if token.token_type.eq_ignore_ascii_case("bearer") {
        "Bearer"
    } else {
        token.token_type.as_str()
    };
    let mut authorization =
        HeaderValue::try_from(format!("{scheme} {}", token.access_token.expose()))
            .map_err(|_| Refusal::Upstream(UpstreamFailure::TokenNotAHeader))?;
    authorization.set_sensitive(true);
    let mut req = Request::new(http_body_util::Full::new(body.clone()));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = target.uri.clone();
    let h = req.headers_mut();
    for name in REQUEST_HEADERS.iter().chain(target.preset_headers) {
        for v in parts.headers.get_all(*name) {
            h.append(HeaderName::from_static(name), v.clone());
        }
    }
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    h.insert(header::AUTHORIZATION, authorization);
    // The broker's own trace context, where `propagate_to` names the
    // providers (the tool's never: none of its trace headers is on the
    // allowlist above).
    crate::infra::telemetry::propagate(crate::infra::telemetry::Target::Providers, h);
    // An empty GET or HEAD goes with no length; another method with an
    // empty body says `Content-Length: 0`, as clients do.
    if body.is_empty() && !matches!(parts.method, Method::GET | Method::HEAD) {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    Ok(req)
}
