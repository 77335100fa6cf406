//! Stage 1, admission: the checks that need nothing of the caller, before
//! its token is read. The proxy's own budget of calls in flight is taken in
//! [`Proxy::handle`](super::Proxy::handle); here the request's shape (its
//! `Host` framing first, RFC 9112 section 3.2), the
//! service's address, the raw path and the freeze.

use http::{header, Method};

use super::refusal::{Refusal, Shape};
use super::{Proxy, PREFIX};
use crate::base::grammar::check_raw_path;

/// The service a path under [`PREFIX`] names (empty when it names none);
/// not checked yet.
pub(super) fn service_of(path: &str) -> &str {
    path.strip_prefix(PREFIX)
        .map(|r| r.split('/').next().unwrap_or_default())
        .unwrap_or_default()
}

impl Proxy {
    /// Checks the request's shape, that it names a configured service's
    /// proxy address with a raw path the grammar allows, and that the
    /// broker is not frozen; returns the service.
    pub(super) fn admit<'p>(&self, parts: &'p http::request::Parts) -> Result<&'p str, Refusal> {
        crate::base::http::check_host(parts.version, &parts.headers)
            .map_err(|f| Refusal::Shape(Shape::Framing(f)))?;
        if parts.method == Method::CONNECT || parts.method == Method::TRACE {
            return Err(Refusal::Shape(Shape::Method));
        }
        if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
            return Err(Refusal::Shape(Shape::AbsoluteForm));
        }
        let upgrade = parts.headers.contains_key(header::UPGRADE)
            || parts.headers.get_all(header::CONNECTION).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.to_ascii_lowercase().contains("upgrade"))
            });
        if upgrade {
            return Err(Refusal::Shape(Shape::Upgrade));
        }
        let path = parts.uri.path();
        let service = service_of(path);
        let valid_service = !service.is_empty()
            && service
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
        // Only a configured provider has a proxy address: the set of
        // verifiers (one per address) stays bounded by the config, whatever
        // names requests carry. A service the policy no longer proxies is
        // still known here, so its callers get the policy's 403.
        let known = self
            .broker
            .connected_services()
            .is_some_and(|c| c.providers.get(service).is_some());
        if !valid_service || !known {
            return Err(Refusal::NotFound);
        }
        let rest = &path[PREFIX.len() + service.len()..];
        if rest.is_empty() {
            return Err(Refusal::NotFound);
        }
        check_raw_path(rest).map_err(Refusal::Path)?;
        if self.broker.is_frozen() {
            return Err(Refusal::Frozen);
        }
        // Before the token: a replica whose clock is too far off the
        // database's checks `exp`, `iat` and nonces against the wrong time
        // (memory only, the last measured offset).
        if self.broker.skew.check().is_err() {
            return Err(Refusal::ClockSkew);
        }
        // A replica that has not read the person stop list within its
        // bound cannot tell a stopped person (memory only).
        if self.broker.stops.check_watch().is_err() {
            return Err(Refusal::RevocationWatchDown);
        }
        Ok(service)
    }

    /// The person stop list (`derive::persons`, memory only): the token's
    /// person, and when it was minted. Checked once the token is verified,
    /// and again at the last gate before the upstream send.
    pub(super) fn person_check(&self, who: &crate::verify::Verified) -> Result<(), Refusal> {
        let person = crate::accounts::subject::Person {
            iss: who.subject_iss.clone().unwrap_or_default(),
            sub: who.sub.clone(),
        };
        self.broker
            .stops
            .check_minted(&person, who.iat)
            .map_err(|r| match r {
                crate::derive::persons::Refused::Revoked => Refusal::PersonRevoked,
                crate::derive::persons::Refused::WatchDown => Refusal::RevocationWatchDown,
            })
    }
}
