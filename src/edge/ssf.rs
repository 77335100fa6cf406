//! Push delivery of Security Event Tokens (RFC 8935) at
//! `{issuer}/ssf/events`, on the public listener before the pages: their
//! cross-site rules and 8 KiB body cap do not apply here; this endpoint has
//! its own checks, in this order, before a byte of the body is read past
//! the cap:
//! 1. the `Host` framing of RFC 9112 (400), then `POST` only (405);
//! 2. the `Authorization` value is one push transmitter's, compared in
//!    constant time (401 `authentication_failed`): that names the
//!    transmitter;
//! 3. that transmitter's rate (`per_second`; 429 with `Retry-After`);
//! 4. `Content-Type: application/secevent+jwt` (400 `invalid_request`);
//! 5. the body within its `max_set_bytes` (413 `invalid_request`);
//! 6. the SET itself (`derive::ssf`): 202 when stored and acted on (or a
//!    repeat of a `jti` already done), 400 with RFC 8935's code, or 503
//!    with `Retry-After` when it cannot be taken now.
//!
//! Every error answer is `{"err", "description"}`
//! (proto/ssf-push-error.schema.json); none names the person.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::base::http::{json_response, read_capped, Body, BodyError};
use crate::derive::ssf::{ReceiveError, Receiver};

/// The push endpoint's path under the issuer.
pub(crate) const PATH: &str = "/ssf/events";

/// The SET media type (RFC 8417 section 2.3).
const SET_TYPE: &str = "application/secevent+jwt";

fn error(status: StatusCode, err: &str, description: &str) -> Response<Body> {
    json_response(
        status,
        &serde_json::json!({"err": err, "description": description}),
    )
}

fn retry_after(mut r: Response<Body>, seconds: u32) -> Response<Body> {
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    r
}

/// Handles one request to the push endpoint.
pub(crate) async fn handle<B>(receiver: Arc<Receiver>, req: Request<B>) -> Response<Body>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Err(f) = crate::base::http::check_host(req.version(), req.headers()) {
        return error(StatusCode::BAD_REQUEST, "invalid_request", &f.to_string());
    }
    if req.method() != Method::POST {
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            "SETs are pushed with POST (RFC 8935)",
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let Some(t) = receiver.pusher(auth) else {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "authentication_failed",
            "the Authorization value is not one configured for a transmitter (ssf.transmitters.<name>.push_authorization_file)",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"ssf\""),
        );
        return r;
    };
    if t.limiter.check().is_err() {
        return retry_after(
            error(
                StatusCode::TOO_MANY_REQUESTS,
                "access_denied",
                "too many SETs from this transmitter (ssf.transmitters.<name>.per_second); send it again later",
            ),
            1,
        );
    }
    let typ_ok = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(SET_TYPE));
    if !typ_ok {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the Content-Type must be application/secevent+jwt",
        );
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_capped(&parts.headers, body, t.cfg.max_set_bytes).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                "the SET is larger than this transmitter's max_set_bytes",
            )
        }
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the body could not be read",
            )
        }
    };
    let Ok(token) = std::str::from_utf8(&bytes) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the SET is not a compact JWS",
        );
    };
    match receiver.receive(t, token.trim_ascii()).await {
        Ok(_) => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        }
        Err(ReceiveError::Set(e)) => error(StatusCode::BAD_REQUEST, e.code(), &e.to_string()),
        Err(ReceiveError::Unavailable(_)) => retry_after(
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "access_denied",
                "the SET cannot be taken now (its keys or the store are unavailable); send it again later",
            ),
            5,
        ),
    }
}
