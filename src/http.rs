//! HTTP helpers that every listener shares: the response body type, JSON
//! answers, the one capped body reader, and the correlation id of an
//! unexpected error.
//!
//! A leaf: it imports no other module of the crate, so the orchestrator
//! socket (`api`), the admin socket, the public listener and the pages all
//! use it without importing each other.

use ::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

/// The response body type of every handler.
pub(crate) type Body = Full<Bytes>;

/// A JSON response with `Cache-Control: no-store`.
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    // Serialising a `Value` cannot fail (its map keys are strings); the
    // empty fallback only keeps this total.
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    r
}

/// A fresh correlation id (16 hex digits) for an unexpected error: the
/// caller logs it with the cause and shows the client only the id, so an
/// operator can find the cause and the client learns no internals.
pub(crate) fn correlation_id() -> String {
    let mut id = [0u8; 8];
    // Without randomness the id is all zeros: still a valid answer, and the
    // log line next to it still carries the cause.
    let _ = aws_lc_rs::rand::fill(&mut id);
    hex::encode(id)
}

/// Why a request body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BodyError {
    /// `Content-Length` is not a number.
    #[error("bad Content-Length")]
    BadLength,
    /// The body is larger than the cap (announced or actual).
    #[error("the body is larger than the cap")]
    TooLarge,
    /// The connection failed while the body was read.
    #[error("the body could not be read")]
    Unreadable,
}

/// Reads a request body of at most `max` bytes: an announced
/// `Content-Length` over the cap is refused before a byte is read, and the
/// body itself is cut off at the cap (a chunked body announces nothing).
pub(crate) async fn read_capped<B>(
    headers: &HeaderMap,
    body: B,
    max: usize,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) if n > max as u64 => return Err(BodyError::TooLarge),
            Some(_) => {}
            None => return Err(BodyError::BadLength),
        }
    }
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyError::TooLarge)
        }
        Err(_) => Err(BodyError::Unreadable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(len: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(l) = len {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    #[tokio::test]
    async fn read_capped_refuses_announced_and_actual_oversize() {
        let big = Full::new(Bytes::from(vec![b'a'; 11]));
        assert_eq!(
            read_capped(&headers(Some("11")), big.clone(), 10).await,
            Err(BodyError::TooLarge)
        );
        // Nothing announced: cut off at the cap.
        assert_eq!(
            read_capped(&headers(None), big, 10).await,
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            read_capped(&headers(Some("ten")), Full::new(Bytes::new()), 10).await,
            Err(BodyError::BadLength)
        );
        // Positive control: at the cap is fine.
        let ok = Full::new(Bytes::from(vec![b'a'; 10]));
        assert_eq!(
            read_capped(&headers(Some("10")), ok, 10)
                .await
                .unwrap()
                .len(),
            10
        );
    }

    #[test]
    fn correlation_ids_are_fresh_hex() {
        let (a, b) = (correlation_id(), correlation_id());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
