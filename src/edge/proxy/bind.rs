//! Stage 4b, the bound request: on a route with `bind_request`
//! (docs/APPROVALS.md, "The request, bound"), the request read whole must
//! be the one the token was approved for: its digest (method, raw path,
//! raw query, `Content-Type` as sent, the body, canonicalised when JSON)
//! equals the token's `req_sha256`. What goes upstream is then exactly the
//! bytes that were hashed: the canonical form of a JSON body, with its own
//! `Content-Length`.

use bytes::Bytes;
use credbroker_verify::request::{self, BoundRequest, RequestError};
use http::header;

use super::refusal::Refusal;
use super::Call;

/// The body to send for `call`: unchanged on a route that binds nothing;
/// on a bound route, the hashed body of a request equal to the approved
/// one, or the refusal.
pub(super) fn check(
    call: &mut Call,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Bytes, Refusal> {
    if !call.binds {
        return Ok(body);
    }
    let mut types = parts.headers.get_all(header::CONTENT_TYPE).iter();
    let content_type = match (types.next(), types.next()) {
        (None, _) => "",
        (Some(v), None) => v.to_str().map_err(|_| Refusal::RequestMismatch)?,
        // The approved request had one.
        (Some(_), Some(_)) => return Err(Refusal::RequestMismatch),
    };
    let r = BoundRequest {
        method: parts.method.as_str(),
        path: call.rest(parts),
        query: parts.uri.query().unwrap_or_default(),
        content_type,
        body: &body,
    };
    let bound = request::bind(&r).map_err(|e| match e {
        RequestError::TooLarge => Refusal::BoundBodyTooLarge,
        RequestError::NotIJson(_) | RequestError::Charset => Refusal::BodyNotIJson,
    })?;
    let approved = call.who.req_sha256.as_deref().unwrap_or_default();
    let same: bool =
        subtle::ConstantTimeEq::ct_eq(bound.sha256.as_bytes(), approved.as_bytes()).into();
    if approved.is_empty() || !same {
        return Err(Refusal::RequestMismatch);
    }
    call.request_sha256 = Some(bound.sha256);
    Ok(Bytes::from(bound.body))
}
