//! Canonical resource URIs (RFC 8707 section 2, RFC 3986 section 6).
//!
//! A resource must be an absolute `https` URI (or `http` on loopback, for
//! development), without userinfo, query or fragment. Anything that could
//! make two different strings point at the same place after decoding (dot
//! segments, encoded dots or slashes, backslashes) is refused outright rather
//! than normalised, so a request can never reach a resource by a path trick.

/// Why a resource URI is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// Not an absolute URI.
    #[error("not an absolute URI")]
    NotAbsolute,
    /// Has a fragment.
    #[error("has a fragment")]
    Fragment,
    /// Has a query.
    #[error("has a query")]
    Query,
    /// Has userinfo.
    #[error("has userinfo")]
    UserInfo,
    /// Not https (or http on loopback).
    #[error("must be https (http only on loopback)")]
    Scheme,
    /// Dot segments, encoded dots or slashes, backslashes, spaces, controls.
    #[error("contains dot segments, encoded separators or forbidden characters")]
    Ambiguous,
    /// More than one resource in one request.
    #[error("must be given once (one token, one audience)")]
    Multiple,
    /// Longer than 2048 bytes.
    #[error("too long")]
    TooLong,
}

/// Returns the canonical form used for comparison, or why the URI is refused.
pub(crate) fn canonical_resource(raw: &str) -> Result<String, ResourceError> {
    if raw.len() > 2048 {
        return Err(ResourceError::TooLong);
    }
    if raw.contains('#') {
        return Err(ResourceError::Fragment);
    }
    if raw.contains('?') {
        return Err(ResourceError::Query);
    }
    // Only characters RFC 3986 allows in a URI: anything else (spaces,
    // controls, backslashes, braces, backticks, non-ASCII) would be
    // percent-encoded by the parser, so that the canonical form differed
    // from the raw one and could outgrow the length cap (found by fuzzing).
    if !raw.bytes().all(uri_char) {
        return Err(ResourceError::Ambiguous);
    }
    let lower = raw.to_ascii_lowercase();
    if lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || lower.contains("%00")
    {
        return Err(ResourceError::Ambiguous);
    }
    // `scheme://authority` spelled out: the URL parser would also accept
    // `https:host`, `https:/host` or `https:///host`, normalise them (dot
    // segments included), and the raw checks below would then see no path at
    // all (found by fuzzing).
    let (scheme, after_scheme) = match raw.split_once("://") {
        Some((scheme, rest)) if !rest.is_empty() && !rest.starts_with('/') => (scheme, rest),
        _ => return Err(ResourceError::NotAbsolute),
    };
    let url = url::Url::parse(raw).map_err(|_| ResourceError::NotAbsolute)?;
    if url.cannot_be_a_base() || url.host().is_none() || !scheme.eq_ignore_ascii_case(url.scheme())
    {
        return Err(ResourceError::NotAbsolute);
    }
    // The raw path (after the authority) must have no dot segments.
    let path = after_scheme.find('/').map_or("", |i| &after_scheme[i..]);
    if path.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(ResourceError::Ambiguous);
    }
    if !url.username().is_empty() || url.password().is_some() || after_scheme.contains('@') {
        return Err(ResourceError::UserInfo);
    }
    if !crate::base::grammar::secure_or_loopback(&url) {
        return Err(ResourceError::Scheme);
    }
    // url has lower-cased scheme and host and dropped the default port; an
    // empty path becomes "/". It leaves percent-escapes as written, so their
    // hex digits are upper-cased here (RFC 3986 section 6.2.2.1), and a `%`
    // that does not start an escape is refused rather than guessed at.
    // The parser decodes escapes in the host (`%22` becomes `"`), so an
    // escape there is refused, and the result must itself be a strict URI
    // (found by fuzzing: canonicalising must be idempotent).
    let authority = after_scheme.split('/').next().unwrap_or("");
    if authority.contains('%') {
        return Err(ResourceError::Ambiguous);
    }
    let out = upper_case_escapes(url.as_str())?;
    if !out.bytes().all(uri_char) {
        return Err(ResourceError::Ambiguous);
    }
    Ok(out)
}

/// A byte RFC 3986 allows in a URI: unreserved, reserved, or `%`.
fn uri_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b)
}

fn upper_case_escapes(s: &str) -> Result<String, ResourceError> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '%' {
            for _ in 0..2 {
                match chars.next() {
                    Some(h) if h.is_ascii_hexdigit() => out.push(h.to_ascii_uppercase()),
                    _ => return Err(ResourceError::Ambiguous),
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_case_port_and_empty_path() {
        let a = canonical_resource("HTTPS://Mail.Internal.Example:443").unwrap();
        let b = canonical_resource("https://mail.internal.example/").unwrap();
        assert_eq!(a, b);
        assert_ne!(
            canonical_resource("https://api.example/v1").unwrap(),
            canonical_resource("https://api.example/v1/").unwrap()
        );
    }

    #[test]
    fn refuses_tricks() {
        for bad in [
            "https://api.example/v1/../admin",
            "https://api.example/v1/./x",
            "https://api.example/%2e%2e/admin",
            "https://api.example/a%2Fb",
            "https://api.example/#frag",
            "https://api.example/?q=1",
            "https://user@api.example/",
            "http://api.example/",
            "/relative",
            "api.example",
            "https://api.example/ x",
            "https://api.example/\0",
            "https://аpi.example/",
            "https://api.example/a%zz",
            "https://api.example/a%4",
            "https:api.example/",
            "https:///api.example/",
            "https://",
            // No `//`: `url` would normalise these past the raw checks.
            "https:api.example/v1/../admin",
            "https:/api.example/a/./b",
            "https:./a/0Xexa`m/ple@/",
            "https://api.example/a{b}",
            "HTTPS://Mail.Example%221",
            "https://mail.example%2e/",
            "https://api.example/a`b",
            "https://api.example/a|b",
            "https://api.example/a\"b",
            "https://api.example/a<b>",
        ] {
            assert!(canonical_resource(bad).is_err(), "{bad}");
        }
        assert!(canonical_resource("https://api.example/v1").is_ok());
        assert!(canonical_resource("http://127.0.0.1:9000/api").is_ok());
    }
}
