//! HTTP plumbing of the pages: the security headers every answer carries
//! (set in one place, [`secure`]), bounded form parsing, cookies, and the
//! allow-list of `return_to` paths.

use std::collections::HashMap;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::base::http::{read_capped, Body, BodyError};

/// Form bodies larger than this are refused.
pub(crate) const MAX_FORM: usize = 8 * 1024;

/// The base CSP of every page: nothing but our own stylesheet; forms post
/// only to us; no framing; no `<base>`; no script at all.
pub(crate) const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Sets the headers every page answer carries: no caching, no framing, no
/// referrer (codes are in URLs), no MIME sniffing, and the CSP.
/// `form_action_extra` adds one origin to `form-action` (the provider a
/// connect button redirects to).
pub(crate) fn secure(h: &mut HeaderMap, form_action_extra: Option<&str>) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    let csp = match form_action_extra {
        Some(origin) if is_plain_origin(origin) => CSP.replace(
            "form-action 'self'",
            &format!("form-action 'self' {origin}"),
        ),
        _ => CSP.to_string(),
    };
    match HeaderValue::from_str(&csp) {
        Ok(v) => h.insert(header::CONTENT_SECURITY_POLICY, v),
        Err(_) => h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
    };
}

/// `scheme://host[:port]` with nothing that could end or extend a CSP
/// directive.
fn is_plain_origin(s: &str) -> bool {
    url::Url::parse(s).is_ok_and(|u| u.origin().ascii_serialization() == s)
        && !s.contains([';', ',', ' ', '\''])
}

/// An HTML answer with the security headers.
pub(crate) fn html(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    html_with(status, body, None)
}

/// An HTML answer whose CSP allows forms to lead to `form_action_extra`.
pub(crate) fn html_with(
    status: StatusCode,
    body: impl Into<Bytes>,
    form_action_extra: Option<&str>,
) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(r.headers_mut(), form_action_extra);
    r
}

/// A `303 See Other` to `location` (a relative path of ours, or a provider's
/// authorization URL), with the security headers.
pub(crate) fn redirect(location: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    secure(r.headers_mut(), None);
    r
}

/// Why a request could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RequestError {
    /// The body is larger than [`MAX_FORM`].
    #[error("request body too large")]
    TooLarge,
    /// Not a form, a repeated field, or bad encoding.
    #[error("malformed form")]
    Malformed,
}

/// Reads a form body: `application/x-www-form-urlencoded`, at most
/// [`MAX_FORM`] bytes, no field twice.
pub(crate) async fn read_form<B>(headers: &HeaderMap, body: B) -> Result<Form, RequestError>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ctype.split(';').next().is_some_and(|t| {
        t.trim()
            .eq_ignore_ascii_case("application/x-www-form-urlencoded")
    }) {
        return Err(RequestError::Malformed);
    }
    let bytes = read_capped(headers, body, MAX_FORM)
        .await
        .map_err(|e| match e {
            // Hyper refuses a malformed `Content-Length` before a handler
            // runs; one that gets here is a malformed request.
            BodyError::BadLength => RequestError::Malformed,
            BodyError::TooLarge | BodyError::Unreadable => RequestError::TooLarge,
        })?;
    Form::parse(&bytes)
}

/// Decoded form or query fields; a field given twice is refused when
/// parsing, so each name has one value.
#[derive(Default)]
pub(crate) struct Form(HashMap<String, String>);

impl std::fmt::Debug for Form {
    // Forms carry passwords and codes: show the field names only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Drop for Form {
    fn drop(&mut self) {
        for v in self.0.values_mut() {
            zeroize::Zeroize::zeroize(v);
        }
    }
}

impl Form {
    /// Parses `a=b&c=d`.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Form, RequestError> {
        let mut map = HashMap::new();
        for (k, v) in form_urlencoded::parse(bytes) {
            if map.insert(k.into_owned(), v.into_owned()).is_some() {
                return Err(RequestError::Malformed);
            }
        }
        Ok(Form(map))
    }

    /// The query string of a URI (an empty form when there is none).
    pub(crate) fn query(uri: &http::Uri) -> Result<Form, RequestError> {
        Form::parse(uri.query().unwrap_or("").as_bytes())
    }

    /// A field.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Takes a field out (for secrets: the caller wraps it).
    pub(crate) fn take(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }
}

/// The value of cookie `name` in the request's `Cookie` headers. When a
/// name appears more than once (a cookie planted by a sibling host), all
/// values are returned so that the caller tries each.
pub(crate) fn cookies(headers: &HeaderMap, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for v in headers.get_all(header::COOKIE) {
        let Ok(s) = v.to_str() else { continue };
        for pair in s.split(';') {
            if let Some((k, v)) = pair.trim().split_once('=') {
                if k == name && !v.is_empty() {
                    out.push(v.to_string());
                }
            }
        }
    }
    out
}

/// Where the browser may be sent back after signing in: only our own pages,
/// as relative paths from a fixed allow-list (a connect link, or the
/// account page). Anything else (absolute URLs, `//host`, backslashes,
/// dot segments, encodings) is refused.
pub(crate) fn safe_return_to(s: &str) -> Option<String> {
    if s == "/account" {
        return Some(s.to_string());
    }
    let code = s.strip_prefix("/connect/")?;
    is_code_shaped(code).then(|| s.to_string())
}

/// Whether `s` has the shape of a link code: 43 characters of unpadded
/// base64url (32 bytes).
pub(crate) fn is_code_shaped(s: &str) -> bool {
    s.len() == 43
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The `Origin` of a URL, for comparing with a request's `Origin` header.
pub(crate) fn origin_of(url: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()
        .map(|u| u.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_to_allow_list() {
        let code = "A".repeat(43);
        assert_eq!(safe_return_to("/account").as_deref(), Some("/account"));
        assert!(safe_return_to(&format!("/connect/{code}")).is_some());
        for bad in [
            "https://evil.example/account",
            "//evil.example/account",
            "/\\evil.example",
            "/connect/../account",
            "/account/../../x",
            "/connect/short",
            &format!("/connect/{code}/x"),
            &format!("/connect/{code}?x=1"),
            "/account?next=//evil",
            "account",
            "",
            "/%2e%2e/account",
            "javascript:alert(1)",
        ] {
            assert_eq!(safe_return_to(bad), None, "{bad}");
        }
    }

    #[test]
    fn repeated_fields_refused() {
        assert!(Form::parse(b"a=1&b=2").is_ok());
        assert_eq!(
            Form::parse(b"a=1&a=2").unwrap_err(),
            RequestError::Malformed
        );
    }

    #[test]
    fn csp_extra_origin_must_be_an_origin() {
        let mut h = HeaderMap::new();
        secure(&mut h, Some("https://github.com"));
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("form-action 'self' https://github.com;"));
        let mut h = HeaderMap::new();
        secure(&mut h, Some("https://x.example; script-src *"));
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP);
        // Positive control: every page has framing and caching off.
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        assert!(CSP.contains("frame-ancestors 'none'"));
        assert!(!CSP.contains("script-src"));
    }
}
