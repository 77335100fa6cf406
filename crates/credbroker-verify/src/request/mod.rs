//! Request binding (docs/APPROVALS.md, "The request, bound"): the digest
//! of the exact request a token was approved for, its `req_sha256` claim.
//!
//! The digest input is six fields, each written as its length in bytes
//! (four bytes, big-endian) followed by its bytes:
//!
//! 1. the label `credbroker-request-v1`;
//! 2. the method (`POST`), as sent;
//! 3. the raw path (`/v1/mail/send`), never decoded;
//! 4. the raw query without its `?` (`b=1&a=2`), never decoded or
//!    reordered; empty when there is none;
//! 5. the `Content-Type` value as sent, parameters (`charset`) included;
//!    empty when there is none;
//! 6. the body: empty when there is none; for a JSON media type
//!    (`application/json`, `*/*+json`) its RFC 8785 (JCS) form, after the
//!    I-JSON checks of [`jcs::parse`]; otherwise its bytes as they are.
//!
//! `req_sha256` is the lower-case hex SHA-256 of that input. The vectors in
//! `proto/request-binding-vectors.json` pin it (this module's tests run
//! every vector); an implementation in another language is checked
//! against the same file.

pub mod jcs;

pub use jcs::IJsonError;

/// The digest input's first field.
pub const LABEL: &str = "credbroker-request-v1";

/// The largest body a request binding takes, raw and in its canonical
/// form (bytes): the derive carries it whole over the socket, whose
/// bodies are capped at 64 KiB with the rest of the derive, and the
/// approval page shows it whole.
pub const MAX_BOUND_BODY: usize = 16 * 1024;

/// A request as it is bound: what the derive carries and what the proxy
/// (or a resource server) receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundRequest<'a> {
    /// The method, as sent (`POST`).
    pub method: &'a str,
    /// The raw path (from `/`, without the query).
    pub path: &'a str,
    /// The raw query, without `?` (empty when there is none).
    pub query: &'a str,
    /// The `Content-Type` value as sent (empty when there is none).
    pub content_type: &'a str,
    /// The body as sent.
    pub body: &'a [u8],
}

/// Why a request cannot be bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A JSON body that is not I-JSON, or a JSON media type whose charset
    /// is not UTF-8.
    #[error("{0}")]
    NotIJson(#[from] IJsonError),
    /// A JSON media type with a charset other than UTF-8.
    #[error("a JSON body's charset must be utf-8")]
    Charset,
    /// The body (or its canonical form) is over [`MAX_BOUND_BODY`].
    #[error("the body is over the largest bindable body ({MAX_BOUND_BODY} bytes)")]
    TooLarge,
}

/// A bound request: the body that is sent (the canonical form of a JSON
/// body) and the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The body as it is hashed and, by the broker's proxy, sent.
    pub body: Vec<u8>,
    /// `req_sha256`: lower-case hex SHA-256 of the digest input.
    pub sha256: String,
}

/// Whether a `Content-Type` names a JSON media type (`application/json`
/// or a `+json` suffix, RFC 6839), whatever its case and parameters; and
/// whether its charset, if any, is UTF-8.
pub fn json_media_type(content_type: &str) -> Option<bool> {
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let json =
        essence == "application/json" || (essence.ends_with("+json") && essence.contains('/'));
    if !json {
        return None;
    }
    let utf8 = parts.all(|p| match p.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    Some(utf8)
}

/// The body as it is hashed: empty stays empty; a JSON body is checked as
/// I-JSON and canonicalised; any other body is its bytes.
pub fn hashed_body(content_type: &str, body: &[u8]) -> Result<Vec<u8>, RequestError> {
    if body.len() > MAX_BOUND_BODY {
        return Err(RequestError::TooLarge);
    }
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let out = match json_media_type(content_type) {
        Some(false) => return Err(RequestError::Charset),
        Some(true) => jcs::canonicalize(body)?.into_bytes(),
        None => body.to_vec(),
    };
    if out.len() > MAX_BOUND_BODY {
        return Err(RequestError::TooLarge);
    }
    Ok(out)
}

/// The digest input of `r` whose body is already the hashed one.
pub fn digest_input(r: &BoundRequest<'_>, hashed_body: &[u8]) -> Vec<u8> {
    let fields: [&[u8]; 6] = [
        LABEL.as_bytes(),
        r.method.as_bytes(),
        r.path.as_bytes(),
        r.query.as_bytes(),
        r.content_type.as_bytes(),
        hashed_body,
    ];
    let mut out = Vec::with_capacity(fields.iter().map(|f| f.len() + 4).sum());
    for f in fields {
        // Every field is far below 4 GiB (the body is capped).
        out.extend_from_slice(&(f.len() as u32).to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// Binds `r`: its hashed body and its `req_sha256`.
pub fn bind(r: &BoundRequest<'_>) -> Result<Bound, RequestError> {
    let body = hashed_body(r.content_type, r.body)?;
    let input = digest_input(r, &body);
    let sha256 = hex::encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        &input,
    ));
    Ok(Bound { body, sha256 })
}

#[cfg(test)]
mod tests;
