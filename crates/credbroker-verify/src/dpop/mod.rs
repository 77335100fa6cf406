//! DPoP proofs (RFC 9449): validation of every check of section 4.3, the
//! `jti` replay cache, and server nonces (section 8).
//!
//! The same validator serves the broker (a proof on each derive, no access
//! token) and resource servers (section 7: a proof with `ath` over the token,
//! and the key bound to the token's `cnf.jkt`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

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
/// The longest a `jti` is kept (seconds): a proof dated `IAT_WINDOW`
/// ahead passes until `IAT_WINDOW` after its `iat`, and one second more
/// covers the truncation of times to seconds.
pub const MAX_JTI_LIFETIME: i64 = 2 * IAT_WINDOW + 1;

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

/// The claims a proof carries. Those only compared are borrowed from the
/// decoded payload (owned only when the JSON escapes a character).
#[derive(Debug, Deserialize)]
struct ProofClaims<'a> {
    jti: String,
    #[serde(borrow)]
    htm: Cow<'a, str>,
    #[serde(borrow)]
    htu: Cow<'a, str>,
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
    /// `normalize_htu`).
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
    /// `jti` of the proof (already recorded in the validator's replay
    /// cache).
    pub jti: String,
    /// `nonce` of the proof, if it carries one (checked only when the
    /// validator requires nonces).
    pub nonce: Option<String>,
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

/// Bytes of one slot of the replay cache: a 16-byte key and a 32-bit expiry.
pub const REPLAY_SLOT_BYTES: usize = 16 + 4;

/// Caches of at least this many entries are split over [`SHARDS`] locks;
/// smaller ones have one (and then the capacity is exact to the entry).
const SHARD_FROM: usize = 65_536;
/// Lock shards of a large cache.
const SHARDS: usize = 16;

/// One slot: `exp == 0` marks it empty. The key is a keyed hash, so its
/// value says nothing about the proof, and nobody outside this process can
/// choose which shard or slot a proof falls in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    key: [u8; 16],
    exp: u32,
}

/// A bounded `jti` replay cache in fixed memory. Entries live until their
/// proof could no longer pass the `iat` check; when the cache is full of
/// live entries, `insert` fails and the request is refused.
///
/// Every slot is allocated (zeroed, so not yet resident) when the cache
/// is made and never again: each
/// shard is an open-addressing table (linear probing, backward-shift
/// deletion) of 20-byte slots, so the cache's memory is its slot count
/// times [`REPLAY_SLOT_BYTES`] whatever the derive rate, and
/// [`ReplayCache::with_bytes`] sizes it from a budget in bytes.
///
/// Live entries are counted over the whole cache (at most `capacity`). A
/// large cache is split over shards by the key, each with room for 1.25
/// times its share at a load of at most 4/5: the keys are a keyed hash, so
/// shards fill evenly (for a 500 000-entry cache a shard's share is about
/// 31 000 +- 180), and a shard refusing while the whole cache has room
/// would take a deviation of over forty standard deviations.
#[derive(Debug)]
pub struct ReplayCache {
    shards: Vec<Mutex<Shard>>,
    capacity: usize,
    /// Live entries in every shard, changed only under that shard's lock; a
    /// slot is reserved here before an entry is added, so the total never
    /// passes `capacity`.
    live: AtomicUsize,
    /// Two independently keyed SipHash instances (std's `RandomState`,
    /// keyed from the OS at start): together 128 bits of keyed hash.
    hash: [std::collections::hash_map::RandomState; 2],
}

#[derive(Debug)]
struct Shard {
    /// The slots, as two arrays of zeros (`calloc`): nothing is resident
    /// at start, but keys land uniformly, so after a few inserts per 4 KiB
    /// page the whole budget is; it never grows past it.
    keys: Box<[[u8; 16]]>,
    exps: Box<[u32]>,
    /// Occupied slots (live or expired but not yet removed).
    used: usize,
    /// At most this many slots may be occupied (4/5 of them).
    max_used: usize,
    /// The last `now` at which expired entries were removed.
    swept: i64,
}

impl Shard {
    fn new(slots: usize) -> Shard {
        Shard {
            keys: vec![[0u8; 16]; slots].into_boxed_slice(),
            exps: vec![0u32; slots].into_boxed_slice(),
            used: 0,
            max_used: (slots * 4 / 5).max(1).min(slots.saturating_sub(1)).max(1),
            swept: i64::MIN,
        }
    }

    fn len(&self) -> usize {
        self.exps.len()
    }

    fn slot(&self, i: usize) -> Slot {
        Slot {
            key: self.keys[i],
            exp: self.exps[i],
        }
    }

    fn set(&mut self, i: usize, s: Slot) {
        self.keys[i] = s.key;
        self.exps[i] = s.exp;
    }

    fn home(&self, key: &[u8; 16]) -> usize {
        let mut h = [0u8; 8];
        h.copy_from_slice(&key[..8]);
        (u64::from_le_bytes(h) % self.len() as u64) as usize
    }

    /// Empties slot `i` and moves later entries of its probe run back, so
    /// every entry stays reachable from its home slot.
    fn remove(&mut self, mut i: usize) {
        let n = self.len();
        let mut j = i;
        loop {
            j = (j + 1) % n;
            if self.exps[j] == 0 {
                break;
            }
            let k = self.home(&self.keys[j]);
            // Move j into the hole at i unless its home lies cyclically in
            // (i, j]: then it must stay where it is.
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                self.set(i, self.slot(j));
                i = j;
            }
        }
        self.set(i, Slot::default());
        self.used -= 1;
    }

    /// Removes every expired entry; returns how many were live-counted.
    fn sweep(&mut self, now: i64) -> usize {
        self.swept = now;
        let mut removed = 0;
        let mut i = 0;
        while i < self.len() {
            let s = self.slot(i);
            if s.exp != 0 && i64::from(s.exp) <= now {
                self.remove(i);
                removed += 1;
                // The slot may now hold an entry moved back: look again.
                continue;
            }
            i += 1;
        }
        removed
    }

    /// `Err(Replay)` if `key` is held and live; else where it goes: its own
    /// expired slot (`true`: reused, no slot taken), or the empty slot that
    /// ends its probe run.
    fn find(&self, key: &[u8; 16], now: i64) -> Result<(usize, bool), DpopError> {
        let n = self.len();
        let mut i = self.home(key);
        for _ in 0..n {
            let s = self.slot(i);
            if s.exp == 0 {
                return Ok((i, false));
            }
            if s.key == *key {
                // A key is held at most once: a live one is a replay, an
                // expired one is overwritten in place.
                return if i64::from(s.exp) > now {
                    Err(DpopError::Replay)
                } else {
                    Ok((i, true))
                };
            }
            i = (i + 1) % n;
        }
        // Unreachable while `used < slots` (kept by `max_used`).
        Err(DpopError::ReplayCacheFull)
    }
}

impl ReplayCache {
    /// A cache holding at most `capacity` live entries (at least 1) in
    /// all, whichever shards they fall in.
    pub fn new(capacity: usize) -> ReplayCache {
        let capacity = capacity.max(1);
        let (shards, slots) = Self::layout(capacity);
        ReplayCache {
            shards: (0..shards).map(|_| Mutex::new(Shard::new(slots))).collect(),
            capacity,
            live: AtomicUsize::new(0),
            hash: Default::default(),
        }
    }

    /// The largest cache whose slots take at most `bytes` (at least one
    /// entry).
    pub fn with_bytes(bytes: usize) -> ReplayCache {
        ReplayCache::new(Self::capacity_for_bytes(bytes))
    }

    /// How many entries a budget of `bytes` holds (what
    /// [`ReplayCache::with_bytes`] makes).
    pub fn capacity_for_bytes(bytes: usize) -> usize {
        let slots = bytes / REPLAY_SLOT_BYTES;
        // The layout is monotonic in the capacity: search the largest
        // capacity whose slot count fits.
        let (mut lo, mut hi) = (1usize, slots.max(1));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            let (n, per) = Self::layout(mid);
            if n * per <= slots {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// (shards, slots per shard) for `capacity` live entries: room for the
    /// whole capacity at a load of 4/5 with one shard; with several, room
    /// for 1.25 times a shard's share at that load.
    fn layout(capacity: usize) -> (usize, usize) {
        if capacity < SHARD_FROM {
            // +1: a probe run always ends at an empty slot.
            (1, (capacity * 5).div_ceil(4) + 1)
        } else {
            let share = capacity.div_ceil(SHARDS);
            (SHARDS, (share * 25).div_ceil(16) + 1)
        }
    }

    /// Bytes the slots take (allocated once, when the cache is made).
    pub fn slot_bytes(&self) -> usize {
        let (n, per) = Self::layout(self.capacity);
        n * per * REPLAY_SLOT_BYTES
    }

    /// The cache key of a proof: 128 bits of keyed hash of the key's
    /// thumbprint and the `jti`.
    pub fn key(&self, jkt: &str, jti: &str) -> [u8; 16] {
        use std::hash::{BuildHasher, Hasher};
        let mut out = [0u8; 16];
        for (half, state) in out.chunks_exact_mut(8).zip(&self.hash) {
            let mut h = state.build_hasher();
            // Lengths first: ("ab", "c") and ("a", "bc") differ.
            h.write_usize(jkt.len());
            h.write(jkt.as_bytes());
            h.write_usize(jti.len());
            h.write(jti.as_bytes());
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
        out
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
    /// entries (or, for a sharded cache, the key's shard has no slot left).
    pub fn insert(&self, key: [u8; 16], expires: i64, now: i64) -> Result<(), DpopError> {
        // Expiry in 32 bits: Unix seconds up to 2106; never 0 (empty).
        let exp = u32::try_from(expires.max(1)).unwrap_or(u32::MAX);
        let i = usize::from(key[8]) % self.shards.len();
        let mut s = self.lock(i);
        // Expired entries are removed at most once a second per shard, and
        // only once the shard is half used: the sweep reads every slot.
        if now > s.swept && s.used * 2 >= s.max_used {
            let freed = s.sweep(now);
            self.live.fetch_sub(freed, Ordering::SeqCst);
        }
        if let (at, true) = s.find(&key, now)? {
            // Its own expired entry: the slot and the count carry over.
            s.exps[at] = exp;
            return Ok(());
        }
        if s.used >= s.max_used || !self.reserve() {
            // Full: reclaim expired entries everywhere before refusing.
            // One shard lock at a time (ours released first), so two
            // inserts sweeping at once cannot deadlock.
            drop(s);
            for j in 0..self.shards.len() {
                let freed = self.lock(j).sweep(now);
                self.live.fetch_sub(freed, Ordering::SeqCst);
            }
            s = self.lock(i);
            // The sweep removed this key if it was expired: only an empty
            // slot can come back now.
            s.find(&key, now)?;
            if s.used >= s.max_used || !self.reserve() {
                return Err(DpopError::ReplayCacheFull);
            }
        }
        // Found again: a sweep may have moved entries since the first look.
        let (at, _) = s.find(&key, now)?;
        s.set(at, Slot { key, exp });
        s.used += 1;
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

/// Stateless server nonces: `base64url(bucket || HMAC(key, label || bucket
/// || binding))` in 30 s buckets. Two domains, told apart by the label in
/// the MAC, so neither ever accepts the other's nonces:
///
/// - derive nonces ([`Nonces::new`]): bound to one instance and its boot
///   (the caller's binding: the instance name and a random boot id), valid
///   in the bucket they were made in and the one after. Binding to the
///   instance is what makes a per-replica replay cache enough when replicas
///   share the key (it is a store record): a proof carries the nonce of the
///   replica it was made for, so another replica, whose replay cache never
///   saw its `jti`, refuses it with `use_dpop_nonce` instead of accepting it
///   a second time; binding to the boot does the same for the instance's
///   next process, whose replay cache starts empty.
/// - proxy nonces ([`Nonces::proxy`]): bound to nothing but the shared key,
///   so valid at every replica of the deployment, in the bucket before,
///   the bucket of and the bucket after the checker's clock (replicas'
///   clocks differ by a few seconds). That is safe because the proxy's
///   replay check is in the store every replica shares.
///
/// Checking costs one HMAC per bucket tried and no store access.
pub struct Nonces {
    key: aws_lc_rs::hmac::Key,
    domain: NonceDomain,
    binding: Vec<u8>,
}

/// Which checks a nonce is for (see [`Nonces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceDomain {
    /// Derives on the socket: one instance, one boot.
    Derive,
    /// Proxied calls on the public listener: every replica.
    Proxy,
}

impl NonceDomain {
    /// The MAC's label; both end in a NUL, so neither is a prefix of the
    /// other's input.
    fn label(self) -> &'static [u8] {
        match self {
            NonceDomain::Derive => b"credbroker dpop nonce derive\0",
            NonceDomain::Proxy => b"credbroker dpop nonce proxy\0",
        }
    }
}

impl std::fmt::Debug for Nonces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nonces")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

const NONCE_BUCKET: i64 = 30;

impl Nonces {
    /// Derive nonces under `key` (32 bytes), issued and accepted only by
    /// the holder of `binding` (the broker passes its instance name and
    /// boot id).
    pub fn new(key: &SecretBytes, binding: &str) -> Nonces {
        Nonces {
            key: aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key.expose()),
            domain: NonceDomain::Derive,
            binding: binding.as_bytes().to_vec(),
        }
    }

    /// Proxy nonces under `key` (32 bytes): every holder of the key issues
    /// and accepts the same ones.
    pub fn proxy(key: &SecretBytes) -> Nonces {
        Nonces {
            key: aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key.expose()),
            domain: NonceDomain::Proxy,
            binding: Vec::new(),
        }
    }

    /// The domain of the nonces these issue and accept.
    pub fn domain(&self) -> NonceDomain {
        self.domain
    }

    /// A fresh nonce for `now`.
    pub fn issue(&self, now: i64) -> String {
        self.make(now.div_euclid(NONCE_BUCKET))
    }

    fn make(&self, bucket: i64) -> String {
        let b = bucket.to_be_bytes();
        // The bucket has a fixed length, so the binding after it needs no
        // delimiter.
        let mut ctx = aws_lc_rs::hmac::Context::with_key(&self.key);
        ctx.update(self.domain.label());
        ctx.update(&b);
        ctx.update(&self.binding);
        let tag = ctx.sign();
        let mut raw = b.to_vec();
        raw.extend_from_slice(&tag.as_ref()[..16]);
        jose::b64e(&raw)
    }

    /// Whether `nonce` was issued in this domain (and binding) in a bucket
    /// it accepts at `now` (see [`Nonces`]).
    pub fn check(&self, nonce: &str, now: i64) -> bool {
        let bucket = now.div_euclid(NONCE_BUCKET);
        let buckets: &[i64] = match self.domain {
            NonceDomain::Derive => &[bucket, bucket - 1],
            NonceDomain::Proxy => &[bucket, bucket - 1, bucket + 1],
        };
        buckets
            .iter()
            .any(|b| bool::from(self.make(*b).as_bytes().ct_eq(nonce.as_bytes())))
    }
}

/// The most proof headers [`HeaderCache`] keeps; when full it starts
/// again empty. A header is at most a few hundred bytes (an RSA `jwk` is
/// the largest), so the cache stays well under a MiB.
const HEADER_CACHE_MAX: usize = 1024;

/// A proof header that passed every header check, with its parsed key.
#[derive(Debug)]
struct CheckedHeader {
    alg: Alg,
    jwk: Jwk,
}

/// Proof headers already checked, by their base64url text, with their
/// parsed keys. A tool signs every proof with one key, so its proofs'
/// headers (`typ`, `alg`, `jwk`) repeat byte for byte; a header seen
/// before skips its base64url and JSON, the point's curve check and the
/// thumbprint's hash.
///
/// What is kept is a function of the header's bytes and of the
/// validator's fixed `algs` alone, so a hit decides exactly what parsing
/// again would. A header enters only once a proof signed under it has
/// verified. A client that sends many keys makes the cache start again
/// empty: other tools' next proofs are parsed again, never judged
/// differently.
#[derive(Debug, Default)]
struct HeaderCache {
    map: RwLock<HashMap<Box<str>, Arc<CheckedHeader>>>,
}

impl HeaderCache {
    fn get(&self, header: &str) -> Option<Arc<CheckedHeader>> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(header).cloned()
    }

    fn insert(&self, header: &str, checked: &Arc<CheckedHeader>) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= HEADER_CACHE_MAX {
            map.clear();
        }
        map.insert(header.into(), checked.clone());
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Validates DPoP proofs.
#[derive(Debug)]
pub struct Validator {
    algs: Vec<Alg>,
    replay: ReplayCache,
    nonces: Option<Nonces>,
    headers: HeaderCache,
}

impl Validator {
    /// A validator accepting `algs`, with a replay cache of `capacity`, and
    /// requiring nonces when `nonces` is given.
    pub fn new(algs: Vec<Alg>, capacity: usize, nonces: Option<Nonces>) -> Validator {
        Validator {
            algs,
            replay: ReplayCache::new(capacity),
            nonces,
            headers: HeaderCache::default(),
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

    /// Whether nonces are required and `proof` is a compact JWS whose
    /// payload carries no nonce this validator would accept. Only the
    /// payload is decoded: nothing here is verified, so a `true` may only
    /// ever lead to a `use_dpop_nonce` refusal, never to anything granted.
    /// A proof that does not decode is left to [`Validator::validate`].
    pub fn lacks_fresh_nonce(&self, proof: &str, now: i64) -> bool {
        #[derive(serde::Deserialize)]
        struct Nonce {
            nonce: Option<String>,
        }
        if self.nonces.is_none() {
            return false;
        }
        let Ok([_, p, _]) = jose::split(proof, MAX_PROOF_LEN) else {
            return false;
        };
        let Some(claims) = jose::b64d(p, "payload")
            .ok()
            .and_then(|p| serde_json::from_slice::<Nonce>(&p).ok())
        else {
            return false;
        };
        !self.nonce_ok(claims.nonce.as_deref(), now)
    }

    /// A fresh nonce, when nonces are required.
    pub fn fresh_nonce(&self, now: i64) -> Option<String> {
        self.nonces.as_ref().map(|n| n.issue(now))
    }

    /// Runs every check of RFC 9449 section 4.3 (and section 7 when an access
    /// token is presented), then records the `jti`.
    pub fn validate(&self, proof: &str, expect: &Expect<'_>) -> Result<ValidProof, DpopError> {
        let [h, p, s] = jose::split(proof, MAX_PROOF_LEN)?;
        let (checked, payload, signature, seen) = match self.headers.get(h) {
            Some(c) => (
                c,
                jose::b64d(p, "payload")?,
                jose::b64d(s, "signature")?,
                true,
            ),
            None => {
                let jws = jose::parse(proof, MAX_PROOF_LEN)?;
                let (alg, jwk) = self.check_header(&jws.header)?;
                let c = Arc::new(CheckedHeader { alg, jwk });
                (c, jws.payload, jws.signature, false)
            }
        };
        let signing_input = &proof[..h.len() + 1 + p.len()];
        checked
            .jwk
            .verify_signature(checked.alg, signing_input.as_bytes(), &signature)
            .map_err(|e| match e {
                JoseError::Alg => DpopError::Alg,
                other => DpopError::Jose(other),
            })?;
        if !seen {
            self.headers.insert(h, &checked);
        }
        let jwk = &checked.jwk;
        let claims: ProofClaims =
            serde_json::from_slice(&payload).map_err(|_| DpopError::Claims)?;
        if claims.jti.is_empty() || claims.jti.len() > MAX_JTI_LEN {
            return Err(DpopError::Replay);
        }
        if claims.htm.as_ref() != expect.method {
            return Err(DpopError::Htm);
        }
        // `expect.htu` is normalised, and a normalised URL is a fixed point
        // of normalising: a proof naming exactly it needs no URL parse.
        if claims.htu.as_ref() != expect.htu
            && normalize_htu(&claims.htu).as_deref() != Some(expect.htu)
        {
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
        let key = self.replay.key(&jwk.thumbprint, &claims.jti);
        let expires = claims.iat.max(expect.now) + IAT_WINDOW + 1;
        self.replay.insert(key, expires, expect.now)?;
        Ok(ValidProof {
            jkt: jwk.thumbprint.clone(),
            iat: claims.iat,
            jti: claims.jti,
            nonce: claims.nonce,
        })
    }

    /// The header checks of section 4.3 (`typ`, `alg`, a public `jwk`),
    /// giving the algorithm and the parsed key.
    fn check_header(&self, header: &jose::Header) -> Result<(Alg, Jwk), DpopError> {
        let alg = jose::check_header(
            header,
            &jose::HeaderRule {
                typ: jose::TypRule::Exact("dpop+jwt"),
                algs: &self.algs,
            },
        )
        .map_err(|e| match e {
            jose::HeaderError::Typ => DpopError::Typ,
            jose::HeaderError::Alg => DpopError::Alg,
        })?;
        let jwk = header
            .jwk
            .as_ref()
            .ok_or(DpopError::Jwk)
            .and_then(|v| Jwk::from_value(v).map_err(|_| DpopError::Jwk))?;
        Ok((alg, jwk))
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
