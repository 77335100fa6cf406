//! Protocol grammar shared by the config, the policy and the wire: scope
//! tokens (RFC 6749 section 3.3) and the rule for URLs the broker trusts
//! (https, or http on a loopback host, never with credentials).
//!
//! A leaf: it depends on nothing in the crate, so every module that parses
//! these shapes uses the same definition.

/// Whether `s` is a valid scope token (RFC 6749 section 3.3).
pub(crate) fn valid_scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// A requested `scope` that is not a space-separated list of scope tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("scope must be scope tokens separated by single spaces")]
pub(crate) struct InvalidScope;

/// Splits a requested `scope` string. `Err` if it is not a valid
/// space-separated list of scope tokens.
pub(crate) fn parse_scope(s: &str) -> Result<Vec<String>, InvalidScope> {
    let v: Vec<String> = s.split(' ').map(str::to_owned).collect();
    if v.iter().all(|t| valid_scope_token(t)) {
        Ok(v)
    } else {
        Err(InvalidScope)
    }
}

fn is_loopback_url(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

/// Whether `u` is https, or http on a loopback host, and carries no
/// credentials (secrets are never inline; an issuer URL ends up in `iss`).
pub(crate) fn secure_or_loopback(u: &url::Url) -> bool {
    u.username().is_empty()
        && u.password().is_none()
        && (u.scheme() == "https" || (u.scheme() == "http" && is_loopback_url(u)))
}

/// The RFC 8693 token-exchange grant type (RFC 8693 section 2.1).
pub const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// Why a raw request path (or a route's literal segment) is refused by the
/// egress proxy. The proxy never decodes a path: the bytes that are matched
/// against the routes are the bytes that are compared with the proof's `htu`
/// and sent upstream, so anything two parsers could read differently is
/// refused instead of normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    /// Not starting with `/`.
    #[error("the path must start with /")]
    NotAbsolute,
    /// A byte outside RFC 3986 `pchar` and `/`.
    #[error("the path holds a character outside RFC 3986 pchar")]
    Character,
    /// `%` not followed by two uppercase hex digits.
    #[error("a percent-escape must be % and two uppercase hex digits")]
    Escape,
    /// `%2F`, `%5C`, `%2E` or `%00`: an encoded slash, backslash, dot or NUL.
    #[error("an encoded slash, backslash, dot or NUL is refused")]
    EncodedDelimiter,
    /// `//` or a trailing `/`.
    #[error("the path has an empty segment")]
    EmptySegment,
    /// A `.` or `..` segment.
    #[error("the path has a dot segment")]
    DotSegment,
}

impl PathError {
    /// The cause in words (what `Display` prints).
    pub(crate) fn message(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "the path must start with /",
            PathError::Character => "the path holds a character outside RFC 3986 pchar",
            PathError::Escape => "a percent-escape must be % and two uppercase hex digits",
            PathError::EncodedDelimiter => "an encoded slash, backslash, dot or NUL is refused",
            PathError::EmptySegment => "the path has an empty segment",
            PathError::DotSegment => "the path has a dot segment",
        }
    }
}

fn is_pchar_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// Checks one path segment (without its `/`) against the proxy's rules.
pub(crate) fn check_path_segment(seg: &str) -> Result<(), PathError> {
    if seg.is_empty() {
        return Err(PathError::EmptySegment);
    }
    if seg == "." || seg == ".." {
        return Err(PathError::DotSegment);
    }
    let b = seg.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = |x: u8| x.is_ascii_digit() || (b'A'..=b'F').contains(&x);
                let (Some(&h), Some(&l)) = (b.get(i + 1), b.get(i + 2)) else {
                    return Err(PathError::Escape);
                };
                // Checked before the case rule, so `%2f` and `%2F` get the
                // same, more useful, answer.
                if matches!(
                    [h.to_ascii_uppercase(), l.to_ascii_uppercase()],
                    [b'2', b'F'] | [b'5', b'C'] | [b'2', b'E'] | [b'0', b'0']
                ) {
                    return Err(PathError::EncodedDelimiter);
                }
                if !hex(h) || !hex(l) {
                    return Err(PathError::Escape);
                }
                i += 3;
            }
            c if is_pchar_byte(c) => i += 1,
            _ => return Err(PathError::Character),
        }
    }
    Ok(())
}

/// Checks a raw request path for the egress proxy: `/`, or `/` followed by
/// segments that each pass [`check_path_segment`].
pub(crate) fn check_raw_path(path: &str) -> Result<(), PathError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NotAbsolute);
    };
    if rest.is_empty() {
        return Ok(());
    }
    rest.split('/').try_for_each(check_path_segment)
}

#[cfg(test)]
mod path_tests {
    use super::*;

    #[test]
    fn raw_path_rules() {
        for ok in [
            "/",
            "/user",
            "/repos/a/b/contents/x%20y.md",
            "/a:b@c/~x",
            "/q%C3%A9",
        ] {
            assert_eq!(check_raw_path(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("user", PathError::NotAbsolute),
            ("/a%2Fb", PathError::EncodedDelimiter),
            ("/a%2fb", PathError::EncodedDelimiter),
            ("/a%5cb", PathError::EncodedDelimiter),
            ("/a%2e", PathError::EncodedDelimiter),
            ("/a%00", PathError::EncodedDelimiter),
            ("/a%c3", PathError::Escape),
            ("/a%4", PathError::Escape),
            ("/a%zz", PathError::Escape),
            ("/a//b", PathError::EmptySegment),
            ("/a/", PathError::EmptySegment),
            ("/a/./b", PathError::DotSegment),
            ("/a/..", PathError::DotSegment),
            ("/a b", PathError::Character),
            ("/a\\b", PathError::Character),
            ("/a?b", PathError::Character),
            ("/é", PathError::Character),
        ] {
            assert_eq!(check_raw_path(bad), Err(why), "{bad}");
        }
    }
}
