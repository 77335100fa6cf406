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
