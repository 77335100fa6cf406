//! Stage 2, the token: the token and its DPoP proof, checked by the
//! verifier resource servers use ([`crate::verify`]), one per proxy
//! address; the broker's nonce rule; the proof's `jti` used once by every
//! instance sharing the store; no credential in the query. Stage 6, the
//! single-use token of an `each_call` approval spent, is here too: it is
//! the same replay tree, used once every other check has passed.

use std::sync::Arc;

use http::header;

use super::refusal::{Refusal, ReplayCheck, Shape};
use super::{Call, Proxy, PREFIX};
use crate::derive::mint::RingStamp;
use crate::derive::policy::{canonical_resource, proxy_path};
use crate::verify::{Presented, Verified, Verifier, VerifyError};

/// The verifier of one proxy address, with the address's canonical
/// resource (the policy's key for it).
#[derive(Debug)]
pub(super) struct AddressVerifier {
    /// The minter's key ring the verifier's keys came from.
    stamp: RingStamp,
    verifier: Arc<Verifier>,
    resource: Arc<str>,
}

/// How long a proof's replay entry is kept (seconds): either side of now
/// ([`crate::base::dpop::IAT_WINDOW`]), plus the verifier's skew.
pub(super) const REPLAY_WINDOW_SECS: i64 = 2 * crate::base::dpop::IAT_WINDOW + 10;

/// The replay tree's key for a proof: its `jti` with the key it is bound to.
pub(super) fn replay_key(jti: &str, jkt: &str) -> String {
    let mut key = Vec::with_capacity(jti.len() + 1 + jkt.len());
    key.extend_from_slice(jti.as_bytes());
    key.push(0);
    key.extend_from_slice(jkt.as_bytes());
    crate::base::jose::sha256_hex(&key)
}

/// Whether `issuer` followed by any proxy path that passed
/// [`crate::base::grammar::check_raw_path`] is a fixed point of
/// [`crate::base::dpop::normalize_htu`]. Such a path is `pchar`s and `/`,
/// escapes in uppercase hex and no dot or empty segments, none of which
/// parsing changes; the issuer is what could (an uppercase host, a default
/// port, a dot segment), so it is tried once with a path of that kind.
pub(super) fn issuer_is_normal(issuer: &str) -> bool {
    let probe = format!("{issuer}{PREFIX}s/a");
    crate::base::dpop::normalize_htu(&probe).as_deref() == Some(probe.as_str())
}

/// The one `Authorization` header's value, if any.
fn authorization(parts: &http::request::Parts) -> Result<Option<&str>, Refusal> {
    match parts
        .headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .collect::<Vec<_>>()[..]
    {
        [] => Ok(None),
        [one] => one
            .to_str()
            .map(Some)
            .map_err(|_| Refusal::Token(VerifyError::WrongScheme)),
        _ => Err(Refusal::Shape(Shape::TwoAuthorizations)),
    }
}

/// Credentials never travel in the query: no `access_token` parameter,
/// and neither the token nor a parameter whose value is the token.
pub(super) fn no_credential_in_query(parts: &http::request::Parts) -> Result<(), Refusal> {
    let Some(q) = parts.uri.query() else {
        return Ok(());
    };
    // The token was verified, so its header is the one valid value.
    let token = authorization(parts)
        .ok()
        .flatten()
        .and_then(|a| a.split_once(' '))
        .map(|(_, t)| t.trim())
        .unwrap_or_default();
    let carries = (!token.is_empty() && q.contains(token))
        || url::form_urlencoded::parse(q.as_bytes()).any(|(k, v)| {
            k.eq_ignore_ascii_case("access_token") || (!token.is_empty() && v == token)
        });
    if carries {
        return Err(Refusal::CredentialsInQuery);
    }
    Ok(())
}

impl Proxy {
    /// Verifies the token and its proof for this call, then the nonce and
    /// the proof's first use; the call, as the events name it.
    pub(super) fn authenticate(
        &self,
        parts: &http::request::Parts,
        service: &str,
    ) -> Result<Call, Refusal> {
        let b = &self.broker;
        let path = parts.uri.path();
        // The URL the proof must name is built from the configured issuer
        // and the raw path.
        let (verifier, resource) = self.verifier(service).map_err(Refusal::Token)?;
        let dpop: Vec<&str> = parts
            .headers
            .get_all("dpop")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let authorization = authorization(parts)?;
        let url = format!("{}{path}", b.config.issuer);
        let (who, proof) = verifier
            .verify_unrecorded(
                &Presented {
                    method: parts.method.as_str(),
                    url: &url,
                    authorization,
                    dpop: &dpop,
                },
                // The service name is letters, digits, `-` and `_`, and the
                // rest of the path passed check_raw_path (`admit`).
                self.issuer_is_normal,
            )
            .map_err(Refusal::Token)?;
        // The verifier's replay cache is this instance's; the store's is
        // every instance's (a replicated store): a proof is used once.
        self.first_use(proof, &who.jkt)?;
        Ok(Call {
            service: service.to_string(),
            method: parts.method.clone(),
            path_sha256: crate::base::jose::sha256_hex(path.as_bytes()),
            jti_sha256: crate::base::jose::sha256_hex(who.jti.as_bytes()),
            who,
            policy: b.policy.load_full(),
            resource,
            route: None,
            binds: false,
            request_sha256: None,
            span: crate::infra::telemetry::Span::none(),
            trace_id: None,
        })
    }

    /// The verifier of `service`'s proxy address, with the minter's current
    /// public keys, and the address's canonical resource (the policy's key
    /// for it). Kept by service name: the caller has checked the name is a
    /// configured provider's, so the map stays bounded by the config.
    fn verifier(&self, service: &str) -> Result<(Arc<Verifier>, Arc<str>), VerifyError> {
        let ring = self.broker.minter.ring();
        let now = self.broker.clock.now();
        let mut map = self
            .verifiers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(a) = map.get(service) {
            if a.stamp.is_current(&ring, now) {
                return Ok((a.verifier.clone(), a.resource.clone()));
            }
        }
        let audience = format!("{}{}", self.broker.config.issuer, proxy_path(service));
        let audience = audience.as_str();
        let jwks = serde_json::to_vec(&ring.jwks(now)).map_err(|_| VerifyError::Keys)?;
        let verifier = match map.get(service) {
            Some(a) => {
                a.verifier.set_jwks(&jwks)?;
                a.verifier.clone()
            }
            None => Arc::new(
                Verifier::from_jwks(&self.broker.config.issuer, audience, &jwks)?
                    .with_clock(self.broker.clock.clone()),
            ),
        };
        let resource: Arc<str> = canonical_resource(audience)
            .unwrap_or_else(|_| audience.to_string())
            .into();
        map.insert(
            service.to_string(),
            AddressVerifier {
                stamp: RingStamp::of(&ring, now),
                verifier: verifier.clone(),
                resource: resource.clone(),
            },
        );
        Ok((verifier, resource))
    }

    /// Checks the proof's nonce when nonces are required, then records the
    /// proof's `jti` (with the key it is bound to) in the store's replay
    /// tree for as long as the proof could be accepted; a second use
    /// anywhere is a replay. On a store no other instance shares, once this
    /// proxy has run for [`REPLAY_WINDOW_SECS`], the entry is queued and
    /// written within [`replays::INTERVAL`](super::replays::INTERVAL) instead (the module doc of
    /// [`replays`](super::replays) says why that refuses every replay the store would). A
    /// store that cannot answer fails the call closed. `proof` is what the
    /// verifier read from the proof it checked (and recorded).
    pub(super) fn first_use(
        &self,
        proof: crate::base::dpop::ValidProof,
        jkt: &str,
    ) -> Result<(), Refusal> {
        // The nonce rule of the socket (`[dpop] require_nonce`) holds here
        // too, with the proxy's own nonces: valid at every replica (the
        // replay check below is in the shared store), so a retry may reach
        // another replica than the challenge; the verifier resource
        // servers use knows no nonces.
        let now = self.broker.clock.now();
        if let Some(nonces) = &self.broker.proxy_nonces {
            if !proof.nonce.as_deref().is_some_and(|n| nonces.check(n, now)) {
                return Err(Refusal::UseNonce(nonces.issue(now)));
            }
        }
        let mut key = replay_key(&proof.jti, jkt);
        if now >= self.started.saturating_add(REPLAY_WINDOW_SECS) {
            if let Some(batched) = &self.replays {
                match batched.queue(key) {
                    Ok(()) => return Ok(()),
                    Err(back) => key = back,
                }
            }
        }
        let window = std::time::Duration::from_secs(REPLAY_WINDOW_SECS as u64);
        // Unsynced: on sled the entry reaches disk at the next flush (every
        // 500 ms, and at close), not before the call goes on. A flush per
        // call was half of the proxy's CPU per call; what a crash can lose is
        // said in docs/PROXY.md. PostgreSQL writes it durably either way.
        match self.broker.store.insert_expiring_unsynced(
            crate::infra::store::Tree::Replay,
            key.as_bytes(),
            b"1",
            window,
        ) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Refusal::Token(VerifyError::Proof(
                crate::base::dpop::DpopError::Replay,
            ))),
            Err(e) => {
                tracing::error!(error = %e, "the replay store failed; proxied call refused");
                Err(Refusal::ReplayStore(ReplayCheck::Proof))
            }
        }
    }

    /// Stage 6: records a single-use token's `jti` in the store's replay tree until
    /// the token expires: the first call wins, on every instance sharing
    /// the store; a second is refused with `token_already_used`. A store
    /// that cannot answer fails the call closed.
    pub(super) fn spend(&self, who: &Verified) -> Result<(), Refusal> {
        let mut key = b"single_use\0".to_vec();
        key.extend_from_slice(who.jti.as_bytes());
        let key = crate::base::jose::sha256_hex(&key);
        let left = who.exp.saturating_sub(self.broker.clock.now()).max(0) + 10;
        let ttl = std::time::Duration::from_secs(u64::try_from(left).unwrap_or(10));
        match self.broker.store.insert_expiring(
            crate::infra::store::Tree::Replay,
            key.as_bytes(),
            b"1",
            ttl,
        ) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Refusal::Token(VerifyError::AlreadyUsed)),
            Err(e) => {
                tracing::error!(error = %e, "the replay store failed; single-use token not accepted");
                Err(Refusal::ReplayStore(ReplayCheck::SingleUse))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proof's `htu` is compared with the URL as the proxy builds it
    /// (issuer, then the raw path) when [`issuer_is_normal`] holds: that is
    /// sound only if parsing leaves every path that passes
    /// [`crate::base::grammar::check_raw_path`] as it is. Tried on every byte and escape a path
    /// may hold, and on 20 000 pseudo-random paths built from them.
    #[test]
    fn a_checked_path_after_a_normal_issuer_is_already_normal() {
        let issuer = "https://broker.example.com";
        assert!(issuer_is_normal(issuer));
        let mut units: Vec<String> = (0..=255u8)
            .filter(|&b| crate::base::grammar::check_raw_path(&format!("/x{}x", b as char)).is_ok())
            .map(|b| (b as char).to_string())
            .collect();
        // Sanity: the pchar bytes (66 unreserved, 11 sub-delims, `:`, `@`)
        // and `/`.
        assert_eq!(units.len(), 80, "{units:?}");
        units.extend((0..=255u8).map(|b| format!("%{b:02X}")));
        units.retain(|u| crate::base::grammar::check_raw_path(&format!("/x{u}x")).is_ok());
        // Every escape but %00, %2E, %2F and %5C.
        assert_eq!(units.len(), 80 + 252, "{units:?}");
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut tried = 0;
        for i in 0..20_000 + units.len() {
            let mut path = String::from("/");
            if i < units.len() {
                path.push_str(&units[i]);
                path.push('x');
            } else {
                for _ in 0..1 + i % 12 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    path.push_str(&units[(x % units.len() as u64) as usize]);
                }
            }
            if crate::base::grammar::check_raw_path(&path).is_err() {
                continue;
            }
            let url = format!("{issuer}{PREFIX}svc_1-a{path}");
            assert_eq!(
                crate::base::dpop::normalize_htu(&url).as_deref(),
                Some(url.as_str()),
                "{path}"
            );
            tried += 1;
        }
        assert!(tried > 10_000, "{tried}");
        // Negative controls: paths the rules refuse do change when parsed,
        // and so do issuers that are not in normal form.
        for bad in ["/a/../b", "/a/%2e%2e/b", "/a b", "/a\\b", "/%c3%a9/./x"] {
            assert!(crate::base::grammar::check_raw_path(bad).is_err(), "{bad}");
            let url = format!("{issuer}{PREFIX}s{bad}");
            assert_ne!(
                crate::base::dpop::normalize_htu(&url).as_deref(),
                Some(url.as_str()),
                "{bad}"
            );
        }
        for issuer in [
            "https://Broker.example.com",
            "https://broker.example.com:443",
            "http://127.0.0.1:80",
            "https://broker.example.com/a/../b",
        ] {
            assert!(!issuer_is_normal(issuer), "{issuer}");
        }
        assert!(issuer_is_normal("http://127.0.0.1:8440"));
    }
}
