//! DPoP proofs (RFC 9449): validation of every check of section 4.3, the
//! `jti` replay cache, and server nonces (section 8).
//!
//! The same validator serves the broker (a proof on each derive, no access
//! token) and resource servers (section 7: a proof with `ath` over the token,
//! and the key bound to the token's `cnf.jkt`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::jose::{self, Alg, JoseError, Jwk};
use crate::secret::SecretBytes;

/// Proofs larger than this are refused before parsing.
pub const MAX_PROOF_LEN: usize = 4096;
/// `jti` longer than this is refused (RFC 9449 suggests 96 bits of entropy;
/// a long `jti` would only fill the cache).
pub const MAX_JTI_LEN: usize = 256;
/// Proofs whose `iat` is further than this from now are refused (seconds).
pub const IAT_WINDOW: i64 = 60;

/// Why a proof was refused. Messages carry no proof bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DpopError {
    /// No proof, or more than one `DPoP` header.
    #[error("exactly one DPoP proof is required")]
    Missing,
    /// The JWS layer failed.
    #[error("malformed proof: {0}")]
    Jose(#[from] JoseError),
    /// `typ` is not `dpop+jwt`.
    #[error("typ must be dpop+jwt")]
    Typ,
    /// `alg` not allowed.
    #[error("alg is not allowed for DPoP proofs")]
    Alg,
    /// No usable `jwk` header.
    #[error("jwk header missing or not a public signing key")]
    Jwk,
    /// A claim is missing or of the wrong type.
    #[error("claims missing or malformed")]
    Claims,
    /// `htm` does not match the request method.
    #[error("htm does not match the request method")]
    Htm,
    /// `htu` does not match the request URL.
    #[error("htu does not match the request URL")]
    Htu,
    /// `iat` outside the window.
    #[error("iat is outside the accepted window")]
    Iat,
    /// `jti` already used, or too long.
    #[error("jti was already used or is invalid")]
    Replay,
    /// `ath` missing or wrong.
    #[error("ath does not match the access token")]
    Ath,
    /// The proof key is not the one the token is bound to.
    #[error("proof key does not match the token's cnf.jkt")]
    KeyMismatch,
    /// The server requires a nonce and the proof has none or a stale one.
    #[error("a fresh DPoP nonce is required")]
    UseNonce,
    /// The replay cache is full: refuse rather than let a proof through.
    #[error("replay cache is full")]
    ReplayCacheFull,
}

#[derive(Debug, Deserialize)]
struct ProofClaims {
    jti: String,
    htm: String,
    htu: String,
    #[serde(deserialize_with = "jose::numeric_date")]
    iat: i64,
    #[serde(default)]
    ath: Option<String>,
    #[serde(default)]
    nonce: Option<String>,
}

/// What the proof must match.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The request method, compared case-sensitively.
    pub method: &'a str,
    /// The request URL without query or fragment (already normalised by
    /// [`normalize_htu`]).
    pub htu: &'a str,
    /// The access token presented with the proof (resource servers).
    pub access_token: Option<&'a str>,
    /// The `cnf.jkt` the proof key must match (resource servers).
    pub jkt: Option<&'a str>,
    /// Current Unix time.
    pub now: i64,
}

/// A proof that passed every check.
#[derive(Debug, Clone)]
pub struct ValidProof {
    /// RFC 7638 thumbprint of the proof key.
    pub jkt: String,
    /// `iat` of the proof.
    pub iat: i64,
}

/// Normalises a URL for `htu` comparison: parsed, query and fragment dropped.
pub fn normalize_htu(u: &str) -> Option<String> {
    let mut url = url::Url::parse(u).ok()?;
    if url.cannot_be_a_base() {
        return None;
    }
    url.set_query(None);
    url.set_fragment(None);
    Some(url.to_string())
}

/// A bounded `jti` replay cache. Entries live until their proof could no
/// longer pass the `iat` check; when the whole cache is full of live
/// entries, `insert` fails and the request is refused.
///
/// The entries are spread over shards (by the key's first byte) so that
/// concurrent derives rarely wait for one lock; the capacity is counted
/// over all shards together, so a shard that happens to hold more than its
/// share does not refuse while the cache has room.
#[derive(Debug)]
pub struct ReplayCache {
    shards: Vec<Mutex<Shard>>,
    capacity: usize,
    /// Entries in every shard's `seen`, changed only under that shard's
    /// lock; a slot is reserved here before an entry is added, so the
    /// total never passes `capacity`.
    live: AtomicUsize,
}

#[derive(Debug, Default)]
struct Shard {
    seen: HashMap<[u8; 32], i64>,
    order: VecDeque<([u8; 32], i64)>,
}

impl Shard {
    /// Drops the expired entries at the front of the insertion order;
    /// returns how many were removed from `seen`.
    fn expire_front(&mut self, now: i64) -> usize {
        let mut removed = 0;
        while let Some(&(k, exp)) = self.order.front() {
            if exp > now {
                break;
            }
            self.order.pop_front();
            if self.seen.get(&k) == Some(&exp) {
                self.seen.remove(&k);
                removed += 1;
            }
        }
        removed
    }

    /// Drops every expired entry. Expiry times are not in insertion order
    /// (`iat` may be ahead of now), so expired entries can sit behind a
    /// live one at the front; this costs a scan, done only when full.
    fn expire_all(&mut self, now: i64) -> usize {
        let before = self.seen.len();
        self.seen.retain(|_, exp| *exp > now);
        self.order.retain(|(_, exp)| *exp > now);
        before - self.seen.len()
    }
}

impl ReplayCache {
    /// A cache holding at most `capacity` live entries (at least 1) in
    /// all, whichever shards they fall in.
    pub fn new(capacity: usize) -> ReplayCache {
        let capacity = capacity.max(1);
        ReplayCache {
            shards: (0..capacity.min(16))
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            capacity,
            live: AtomicUsize::new(0),
        }
    }

    fn lock(&self, i: usize) -> std::sync::MutexGuard<'_, Shard> {
        // A panic while holding a shard leaves only entries behind.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one slot of the capacity, if one is free.
    fn reserve(&self) -> bool {
        self.live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok()
    }

    /// Records `key` until `expires`. `Err(Replay)` if it is already there,
    /// `Err(ReplayCacheFull)` if the whole cache holds `capacity` live
    /// entries.
    pub fn insert(&self, key: [u8; 32], expires: i64, now: i64) -> Result<(), DpopError> {
        let i = key[0] as usize % self.shards.len();
        let mut s = self.lock(i);
        let freed = s.expire_front(now);
        self.live.fetch_sub(freed, Ordering::SeqCst);
        if s.seen.contains_key(&key) {
            return Err(DpopError::Replay);
        }
        if !self.reserve() {
            // Full: reclaim expired entries everywhere before refusing.
            // One shard lock at a time (ours released first), so two
            // inserts sweeping at once cannot deadlock.
            drop(s);
            for j in 0..self.shards.len() {
                let freed = self.lock(j).expire_all(now);
                self.live.fetch_sub(freed, Ordering::SeqCst);
            }
            s = self.lock(i);
            if s.seen.contains_key(&key) {
                return Err(DpopError::Replay);
            }
            if !self.reserve() {
                return Err(DpopError::ReplayCacheFull);
            }
        }
        s.seen.insert(key, expires);
        s.order.push_back((key, expires));
        Ok(())
    }

    /// Live entries (for the metric).
    pub fn len(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The total capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// Stateless server nonces: `base64url(bucket || HMAC(key, bucket))`, valid
/// in the bucket they were made in and the one after (30 s buckets).
pub struct Nonces {
    key: aws_lc_rs::hmac::Key,
}

impl std::fmt::Debug for Nonces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nonces").finish_non_exhaustive()
    }
}

const NONCE_BUCKET: i64 = 30;

impl Nonces {
    /// Nonces under `key` (32 bytes). Replicated instances share the key.
    pub fn new(key: &SecretBytes) -> Nonces {
        Nonces {
            key: aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key.expose()),
        }
    }

    /// A fresh nonce for `now`.
    pub fn issue(&self, now: i64) -> String {
        self.make(now.div_euclid(NONCE_BUCKET))
    }

    fn make(&self, bucket: i64) -> String {
        let b = bucket.to_be_bytes();
        let tag = aws_lc_rs::hmac::sign(&self.key, &b);
        let mut raw = b.to_vec();
        raw.extend_from_slice(&tag.as_ref()[..16]);
        jose::b64e(&raw)
    }

    /// Whether `nonce` was issued in this bucket or the previous one.
    pub fn check(&self, nonce: &str, now: i64) -> bool {
        let bucket = now.div_euclid(NONCE_BUCKET);
        [bucket, bucket - 1]
            .iter()
            .any(|b| bool::from(self.make(*b).as_bytes().ct_eq(nonce.as_bytes())))
    }
}

/// Validates DPoP proofs.
#[derive(Debug)]
pub struct Validator {
    algs: Vec<Alg>,
    replay: ReplayCache,
    nonces: Option<Nonces>,
}

impl Validator {
    /// A validator accepting `algs`, with a replay cache of `capacity`, and
    /// requiring nonces when `nonces` is given.
    pub fn new(algs: Vec<Alg>, capacity: usize, nonces: Option<Nonces>) -> Validator {
        Validator {
            algs,
            replay: ReplayCache::new(capacity),
            nonces,
        }
    }

    /// The replay cache (for metrics).
    pub fn replay_cache(&self) -> &ReplayCache {
        &self.replay
    }

    /// Whether `nonce` satisfies this validator's nonce rule: always when
    /// nonces are not required, else a nonce it issued in this or the
    /// previous bucket (for proofs checked by another validator, such as the
    /// egress proxy's resource-server verifier).
    pub fn nonce_ok(&self, nonce: Option<&str>, now: i64) -> bool {
        match (&self.nonces, nonce) {
            (None, _) => true,
            (Some(n), Some(v)) => n.check(v, now),
            (Some(_), None) => false,
        }
    }

    /// A fresh nonce, when nonces are required.
    pub fn fresh_nonce(&self, now: i64) -> Option<String> {
        self.nonces.as_ref().map(|n| n.issue(now))
    }

    /// Runs every check of RFC 9449 section 4.3 (and section 7 when an access
    /// token is presented), then records the `jti`.
    pub fn validate(&self, proof: &str, expect: &Expect<'_>) -> Result<ValidProof, DpopError> {
        let jws = jose::parse(proof, MAX_PROOF_LEN)?;
        let alg = jose::check_header(
            &jws.header,
            &jose::HeaderRule {
                typ: jose::TypRule::Exact("dpop+jwt"),
                algs: &self.algs,
            },
        )
        .map_err(|e| match e {
            jose::HeaderError::Typ => DpopError::Typ,
            jose::HeaderError::Alg => DpopError::Alg,
        })?;
        let jwk = jws
            .header
            .jwk
            .as_ref()
            .ok_or(DpopError::Jwk)
            .and_then(|v| Jwk::from_value(v).map_err(|_| DpopError::Jwk))?;
        jwk.verify(alg, &jws).map_err(|e| match e {
            JoseError::Alg => DpopError::Alg,
            other => DpopError::Jose(other),
        })?;
        let claims: ProofClaims =
            serde_json::from_slice(&jws.payload).map_err(|_| DpopError::Claims)?;
        if claims.jti.is_empty() || claims.jti.len() > MAX_JTI_LEN {
            return Err(DpopError::Replay);
        }
        if claims.htm != expect.method {
            return Err(DpopError::Htm);
        }
        if normalize_htu(&claims.htu).as_deref() != Some(expect.htu) {
            return Err(DpopError::Htu);
        }
        // abs_diff: `iat - now` could overflow (and wrap to pass in release).
        if claims.iat.abs_diff(expect.now) > IAT_WINDOW.unsigned_abs() {
            return Err(DpopError::Iat);
        }
        if let Some(token) = expect.access_token {
            let want = jose::sha256_b64(token.as_bytes());
            match &claims.ath {
                Some(ath) if bool::from(ath.as_bytes().ct_eq(want.as_bytes())) => {}
                _ => return Err(DpopError::Ath),
            }
        }
        if let Some(jkt) = expect.jkt {
            if !bool::from(jwk.thumbprint.as_bytes().ct_eq(jkt.as_bytes())) {
                return Err(DpopError::KeyMismatch);
            }
        }
        if let Some(n) = &self.nonces {
            match &claims.nonce {
                Some(nonce) if n.check(nonce, expect.now) => {}
                _ => return Err(DpopError::UseNonce),
            }
        }
        // Only a proof that passed every other check may take a cache slot.
        let mut h = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        h.update(jwk.thumbprint.as_bytes());
        h.update(b"\0");
        h.update(claims.jti.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(h.finish().as_ref());
        let expires = claims.iat.max(expect.now) + IAT_WINDOW + 1;
        self.replay.insert(key, expires, expect.now)?;
        Ok(ValidProof {
            jkt: jwk.thumbprint,
            iat: claims.iat,
        })
    }
}

/// Builds a DPoP proof (for the CLI, the client library and tests).
pub fn make_proof(
    key: &jose::Es256Key,
    method: &str,
    htu: &str,
    now: i64,
    access_token: Option<&str>,
    nonce: Option<&str>,
) -> Result<String, JoseError> {
    let mut header = serde_json::Map::new();
    header.insert("typ".into(), "dpop+jwt".into());
    let mut jwk = key.public_jwk.clone();
    if let Some(o) = jwk.as_object_mut() {
        o.remove("kid");
        o.remove("use");
        o.remove("alg");
    }
    header.insert("jwk".into(), jwk);
    let mut jti = [0u8; 16];
    aws_lc_rs::rand::fill(&mut jti).map_err(|_| JoseError::Sign)?;
    let mut claims = serde_json::json!({
        "jti": jose::b64e(&jti), "htm": method, "htu": htu, "iat": now,
    });
    if let Some(t) = access_token {
        claims["ath"] = jose::sha256_b64(t.as_bytes()).into();
    }
    if let Some(n) = nonce {
        claims["nonce"] = n.into();
    }
    key.sign_jws(header, &claims)
}

#[cfg(test)]
mod tests;
