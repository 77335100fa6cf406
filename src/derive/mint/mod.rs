//! Minting: the instance's ES256 signing keys (generated on first start,
//! sealed at rest), RFC 9068 access tokens bound to a DPoP key, the JWKS, and
//! key rotation.
//!
//! The key ring is ONE store record (`signing_keys/ring/v1`) holding every
//! key, each sealed under the master key and marked `next`, `active` or
//! `retired` with its times. It changes only by compare-and-swap of the
//! whole record, so a crash leaves either the old ring or the new one, never
//! a mix (the PostgreSQL backend's `UPDATE ... WHERE value =` has the same
//! shape). Invariants, checked on every load: exactly one `active` key, at
//! most one `next`, and the JWKS holds every key that may have signed a
//! token not yet expired.
//!
//! A rotation publishes the new key first (`next`, in the JWKS) and makes it
//! active only [`crate::infra::config::ACTIVATION_DELAY`] later: a resource server that fetched
//! the JWKS just before the rotation may keep it for [`crate::infra::config::JWKS_MAX_AGE`], and
//! one that refetched for an unknown `kid` does not refetch again for
//! [`crate::verify::JWKS_REFRESH_INTERVAL`]. Activation is a pure function
//! of the record and the time ([`advance`]), applied (and written back) at
//! start, on the housekeeping tick, and by any process that loads the ring.
//! The key it replaces is retired at the activation time and stays published
//! for [`RETIRED_KEY_GRACE`]. An emergency rotation (suspected compromise)
//! activates the new key at once and withdraws every other key from the
//! JWKS: tokens they signed stop verifying, and a resource server that
//! fetched the JWKS less than a minute ago rejects the new `kid` until it
//! refetches.

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::base::jose::{self, Es256Key, JoseError};
use crate::base::secret::SecretString;
use crate::derive::policy::MAX_TTL;
use crate::infra::failpoint;
use crate::infra::seal::{SealError, Sealer};
use crate::infra::store::{Store, StoreError, Tree};

mod rotate;

pub(crate) use rotate::{rotate, rotate_ring, Rotation, RotationKind};

/// How long a retired key stays published: the longest token lifetime plus
/// a minute of clock skew.
pub(crate) const RETIRED_KEY_GRACE: i64 = MAX_TTL.as_secs() as i64 + 60;
/// The JWKS document's `Cache-Control` header (its `max-age` is
/// [`crate::infra::config::JWKS_MAX_AGE`]; a unit test keeps the two equal).
pub(crate) const JWKS_CACHE_CONTROL: &str = "public, max-age=60";
/// The key of the ring record in its tree ([`RingSpec::tree`]). `/` cannot
/// occur in a `kid` (a base64url thumbprint), so it never meets a legacy
/// per-key record.
const RING_KEY: &[u8] = b"ring/v1";

/// Which key ring: the token-signing keys ([`SIGNING`]), or the client key
/// the broker authenticates with at upstream authorization servers
/// ([`CLIENT`], `derive::client_keys`). Both have the same shape, record
/// and rules; each its own store tree, so neither ever reads, migrates or
/// publishes the other's keys.
#[derive(Debug)]
pub struct RingSpec {
    /// Its store tree (the record is `ring/v1` there; a key's AAD is
    /// `<tree>/<kid>`).
    pub(crate) tree: Tree,
    /// What messages call its keys.
    pub(crate) what: &'static str,
    /// Whether the per-key records of an install before the ring are
    /// migrated (the signing keys only).
    legacy: bool,
    /// Failpoints: create (migrate), activate, rotate; each before, then
    /// after, its write.
    points: [&'static str; 6],
}

/// The token-signing keys (`/.well-known/jwks.json`).
pub(crate) const SIGNING: RingSpec = RingSpec {
    tree: Tree::SigningKeys,
    what: "signing key",
    legacy: true,
    points: [
        "keys.migrate.before_write",
        "keys.migrate.after_write",
        "keys.activate.before_write",
        "keys.activate.after_write",
        "keys.rotate.before_write",
        "keys.rotate.after_write",
    ],
};

/// The client key (`{issuer}/.well-known/client-jwks.json`): client
/// assertions and actor tokens at upstream authorization servers, never a
/// token a resource server accepts.
pub(crate) const CLIENT: RingSpec = RingSpec {
    tree: Tree::ClientKeys,
    what: "client key",
    legacy: false,
    points: [
        "client_keys.create.before_write",
        "client_keys.create.after_write",
        "client_keys.activate.before_write",
        "client_keys.activate.after_write",
        "client_keys.rotate.before_write",
        "client_keys.rotate.after_write",
    ],
};
/// Compare-and-swap attempts before giving up (another process keeps
/// writing the ring).
const CAS_ATTEMPTS: usize = 16;

/// What a record sealed under another master key tells the operator: the
/// likeliest cause, a `keys.master_key_file` that is not this store's.
fn master_hint(e: &SealError) -> &'static str {
    match e {
        SealError::UnknownKey(_) => "; keys.master_key_file is not the master key this store was made with (every replica needs the same one)",
        _ => "",
    }
}

/// Errors of the minting layer.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A key record did not decrypt.
    #[error("{what} record (store tree {tree}): {cause}{hint}", what = .0.what, tree = .0.tree.name(), cause = .1, hint = master_hint(.1))]
    Seal(&'static RingSpec, SealError),
    /// A key or signature operation failed.
    #[error("signing: {0}")]
    Jose(#[from] JoseError),
    /// A key record is malformed.
    #[error("signing key record is malformed")]
    Record,
    /// The ring record breaks an invariant (the cause is named).
    #[error("{what} ring (store tree {tree}, record ring/v1): {cause}", what = .0.what, tree = .0.tree.name(), cause = .1)]
    Ring(&'static RingSpec, &'static str),
    /// Other writers kept changing the ring.
    #[error("{what} ring (store tree {tree}, record ring/v1): changed by another process {CAS_ATTEMPTS} times in a row; try again", what = .0.what, tree = .0.tree.name())]
    Contended(&'static RingSpec),
}

/// A key's place in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KeyState {
    /// Published, not yet signing; becomes active at `activates_at`.
    Next,
    /// Signs new tokens (exactly one).
    Active,
    /// No longer signs; published until `retired_at + RETIRED_KEY_GRACE`.
    Retired,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingKey {
    kid: String,
    created: i64,
    state: KeyState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    activates_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retired_at: Option<i64>,
    /// The PKCS#8 key sealed under the master key (AAD `<tree>/<kid>`).
    sealed: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingRecord {
    /// Bumped on every write (makes every new record differ from the old).
    generation: u64,
    keys: Vec<RingKey>,
}

impl RingRecord {
    fn check(&self, spec: &'static RingSpec) -> Result<(), MintError> {
        let count = |s| self.keys.iter().filter(|k| k.state == s).count();
        if count(KeyState::Active) != 1 {
            return Err(MintError::Ring(spec, "not exactly one active key"));
        }
        if count(KeyState::Next) > 1 {
            return Err(MintError::Ring(spec, "more than one next key"));
        }
        for k in &self.keys {
            match k.state {
                KeyState::Next if k.activates_at.is_none() => {
                    return Err(MintError::Ring(spec, "a next key has no activates_at"))
                }
                KeyState::Retired if k.retired_at.is_none() => {
                    return Err(MintError::Ring(spec, "a retired key has no retired_at"))
                }
                _ => {}
            }
        }
        let mut kids: Vec<&str> = self.keys.iter().map(|k| k.kid.as_str()).collect();
        kids.sort_unstable();
        if kids.windows(2).any(|w| w[0] == w[1]) {
            return Err(MintError::Ring(spec, "a kid appears twice"));
        }
        Ok(())
    }

    fn bytes(&self) -> Result<Vec<u8>, MintError> {
        serde_json::to_vec(self).map_err(|_| MintError::Record)
    }
}

/// The ring's state at `now`: a `next` key whose time has come becomes
/// active (the active key retires at that same time), and retired keys past
/// their grace are dropped. Pure, so every process computes the same ring
/// from the same record. Returns `None` if nothing changes.
fn advance(rec: &RingRecord, now: i64) -> Option<RingRecord> {
    let mut out = rec.clone();
    if let Some(at) = out
        .keys
        .iter()
        .find(|k| k.state == KeyState::Next)
        .and_then(|k| k.activates_at)
        .filter(|at| *at <= now)
    {
        for k in &mut out.keys {
            match k.state {
                KeyState::Active => {
                    k.state = KeyState::Retired;
                    k.retired_at = Some(at);
                }
                KeyState::Next => {
                    k.state = KeyState::Active;
                    k.activates_at = None;
                }
                KeyState::Retired => {}
            }
        }
    }
    out.keys.retain(|k| {
        k.state != KeyState::Retired || k.retired_at.is_some_and(|r| r + RETIRED_KEY_GRACE > now)
    });
    if out == *rec {
        return None;
    }
    out.generation += 1;
    Some(out)
}

/// A key waiting to become active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingKey {
    /// Its `kid` (already in the JWKS).
    pub kid: String,
    /// When it starts signing.
    pub activates_at: i64,
}

/// The keys: the active signer and every public key still published.
#[derive(Debug, Clone)]
pub struct KeyRing {
    /// Signs new tokens.
    pub active: Arc<Es256Key>,
    /// The key published ahead of its activation, if a rotation is pending.
    pub next: Option<PendingKey>,
    /// Public JWKs published (active first, then next, then retired), with
    /// their retirement time.
    pub published: Vec<(serde_json::Value, Option<i64>)>,
    /// Which of the minter's rings this is: [`Minter::set_ring`] gives a
    /// ring whose keys differ from the current one's the next number, and
    /// one with the same keys the same number (0 until then).
    pub generation: u64,
}

impl KeyRing {
    /// The JWKS document at `now`.
    pub fn jwks(&self, now: i64) -> serde_json::Value {
        let keys: Vec<&serde_json::Value> = self
            .published
            .iter()
            .filter(|(_, r)| r.is_none_or(|r| r + RETIRED_KEY_GRACE > now))
            .map(|(k, _)| k)
            .collect();
        serde_json::json!({ "keys": keys })
    }

    /// The first moment after `now` at which this ring, unchanged, signs
    /// or publishes other keys: a pending key's activation, or the end of
    /// a retired key's grace. `None` if there is none.
    pub fn changes_after(&self, now: i64) -> Option<i64> {
        let ends = self
            .published
            .iter()
            .filter_map(|(_, r)| r.map(|r| r.saturating_add(RETIRED_KEY_GRACE)));
        let activation = self.next.as_ref().map(|p| p.activates_at);
        ends.chain(activation).filter(|t| *t > now).min()
    }

    /// Whether `other` holds the same keys in the same states.
    fn same_keys(&self, other: &KeyRing) -> bool {
        self.active.kid == other.active.kid
            && self.next == other.next
            && self.published == other.published
    }

    /// The `kid`s published at `now`, in JWKS order.
    pub fn published_kids(&self, now: i64) -> Vec<String> {
        self.published
            .iter()
            .filter(|(_, r)| r.is_none_or(|r| r + RETIRED_KEY_GRACE > now))
            .filter_map(|(k, _)| k.get("kid").and_then(|v| v.as_str()).map(str::to_owned))
            .collect()
    }
}

/// What a cache built from the key ring remembers of it (the proxy's
/// verifiers, `edge::proxy`), to tell whether the ring changed since: the
/// ring's generation (a new one whenever the minter's keys change,
/// [`Minter::set_ring`]) and the first moment the same ring publishes or
/// signs with other keys by time alone ([`KeyRing::changes_after`]). Never
/// the ring's address: a new ring allocated where a freed one was would
/// look unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingStamp {
    generation: u64,
    until: i64,
}

impl RingStamp {
    /// The stamp of `ring` as seen at `now`.
    pub(crate) fn of(ring: &KeyRing, now: i64) -> RingStamp {
        RingStamp {
            generation: ring.generation,
            until: ring.changes_after(now).unwrap_or(i64::MAX),
        }
    }

    /// Whether a cache stamped so still holds what `ring` gives at `now`.
    pub(crate) fn is_current(&self, ring: &KeyRing, now: i64) -> bool {
        self.generation == ring.generation && now < self.until
    }
}

fn aad(spec: &RingSpec, kid: &str) -> Vec<u8> {
    format!("{}/{kid}", spec.tree.name()).into_bytes()
}

fn open_key(
    spec: &'static RingSpec,
    sealer: &Sealer,
    kid: &str,
    sealed: &str,
) -> Result<Es256Key, MintError> {
    let sealed = jose::b64d(sealed, "key record").map_err(|_| MintError::Record)?;
    let der = sealer
        .open(&aad(spec, kid), &sealed)
        .map_err(|e| MintError::Seal(spec, e))?;
    let key = Es256Key::from_pkcs8(der.expose())?;
    if key.kid != kid {
        return Err(MintError::Record);
    }
    Ok(key)
}

fn open_ring(
    spec: &'static RingSpec,
    rec: &RingRecord,
    sealer: &Sealer,
) -> Result<KeyRing, MintError> {
    rec.check(spec)?;
    let mut active = None;
    let mut next = None;
    let mut published = Vec::new();
    let mut retired = Vec::new();
    for k in &rec.keys {
        let key = open_key(spec, sealer, &k.kid, &k.sealed)?;
        match k.state {
            KeyState::Active => active = Some(key),
            KeyState::Next => {
                next = Some((
                    key.public_jwk.clone(),
                    PendingKey {
                        kid: k.kid.clone(),
                        activates_at: k.activates_at.unwrap_or(i64::MAX),
                    },
                ))
            }
            KeyState::Retired => retired.push((key.public_jwk.clone(), k.retired_at)),
        }
    }
    let active = Arc::new(active.ok_or(MintError::Ring(spec, "not exactly one active key"))?);
    published.push((active.public_jwk.clone(), None));
    let next = next.map(|(jwk, p)| {
        published.push((jwk, None));
        p
    });
    published.extend(retired);
    Ok(KeyRing {
        active,
        next,
        published,
        generation: 0,
    })
}

fn new_key(
    spec: &'static RingSpec,
    sealer: &Sealer,
    now: i64,
    state: KeyState,
) -> Result<RingKey, MintError> {
    let (key, pkcs8) = Es256Key::generate()?;
    let sealed = sealer
        .seal(&aad(spec, &key.kid), pkcs8.expose())
        .map_err(|e| MintError::Seal(spec, e))?;
    Ok(RingKey {
        kid: key.kid.clone(),
        created: now,
        state,
        activates_at: None,
        retired_at: None,
        sealed: jose::b64e(&sealed),
    })
}

/// The ring record as stored (its bytes, for the compare-and-swap).
fn read_ring(
    spec: &'static RingSpec,
    store: &dyn Store,
) -> Result<Option<(Vec<u8>, RingRecord)>, MintError> {
    let Some(raw) = store.get(spec.tree, RING_KEY)? else {
        return Ok(None);
    };
    let rec: RingRecord = serde_json::from_slice(&raw)
        .map_err(|_| MintError::Ring(spec, "the record does not parse"))?;
    rec.check(spec)?;
    Ok(Some((raw, rec)))
}

/// A per-key record of the layout before the ring (one record per `kid`).
#[derive(Debug, Deserialize)]
struct LegacyKeyRecord {
    kid: String,
    created: i64,
    #[serde(default)]
    retired: Option<i64>,
    sealed: String,
}

fn legacy_entries(spec: &RingSpec, store: &dyn Store) -> Result<Vec<Vec<u8>>, MintError> {
    if !spec.legacy {
        return Ok(Vec::new());
    }
    Ok(store
        .scan_prefix(spec.tree, b"")?
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != RING_KEY)
        .collect())
}

/// The first ring: the per-key records of an existing install (so it keeps
/// its keys), or one new key. Of the legacy records, the newest unretired one
/// stays active; any other unretired one (left by a rotation that crashed
/// between its two writes, and possibly signing until now) is retired now,
/// so it stays published for the grace period.
fn first_ring(
    spec: &'static RingSpec,
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<RingRecord, MintError> {
    let scanned = match spec.legacy {
        true => store.scan_prefix(spec.tree, b"")?,
        false => Vec::new(),
    };
    let mut legacy: Vec<LegacyKeyRecord> = scanned
        .into_iter()
        .filter(|(k, _)| k != RING_KEY)
        .map(|(_, v)| serde_json::from_slice(&v).map_err(|_| MintError::Record))
        .collect::<Result<_, _>>()?;
    legacy.sort_by_key(|r| std::cmp::Reverse(r.created));
    let mut keys = Vec::new();
    let mut have_active = false;
    for r in legacy {
        // Each must still open: a ring is never built from keys it cannot use.
        open_key(spec, sealer, &r.kid, &r.sealed)?;
        let (state, retired_at) = match r.retired {
            None if !have_active => {
                have_active = true;
                (KeyState::Active, None)
            }
            None => (KeyState::Retired, Some(now)),
            Some(t) if t + RETIRED_KEY_GRACE > now => (KeyState::Retired, Some(t)),
            Some(_) => continue,
        };
        keys.push(RingKey {
            kid: r.kid,
            created: r.created,
            state,
            activates_at: None,
            retired_at,
            sealed: r.sealed,
        });
    }
    if !have_active {
        keys.insert(0, new_key(spec, sealer, now, KeyState::Active)?);
    }
    let rec = RingRecord {
        generation: 1,
        keys,
    };
    rec.check(spec)?;
    Ok(rec)
}

/// Loads the key ring at `now`: creates it on first start (migrating the
/// per-key records of an older install), applies a due activation and
/// writes it back. Called at start, on the housekeeping tick, and by any
/// process that opens the store.
pub(crate) fn load_or_create(
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<KeyRing, MintError> {
    load_ring(&SIGNING, store, sealer, now)
}

/// [`load_or_create`] for the ring of `spec`.
pub(crate) fn load_ring(
    spec: &'static RingSpec,
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<KeyRing, MintError> {
    let [create_before, create_after, activate_before, activate_after, _, _] = spec.points;
    for _ in 0..CAS_ATTEMPTS {
        let Some((raw, rec)) = read_ring(spec, store)? else {
            let rec = first_ring(spec, store, sealer, now)?;
            failpoint::hit(create_before);
            if !store.compare_and_swap(spec.tree, RING_KEY, None, Some(&rec.bytes()?))? {
                continue;
            }
            failpoint::hit(create_after);
            continue;
        };
        // Leftovers of the migration (a crash after the ring was written):
        // the ring already holds them, so they go.
        for k in legacy_entries(spec, store)? {
            store.delete(spec.tree, &k)?;
        }
        let Some(next) = advance(&rec, now) else {
            return open_ring(spec, &rec, sealer);
        };
        let ring = open_ring(spec, &next, sealer)?;
        failpoint::hit(activate_before);
        if !store.compare_and_swap(spec.tree, RING_KEY, Some(&raw), Some(&next.bytes()?))? {
            continue;
        }
        failpoint::hit(activate_after);
        if let Some(p) = rec.keys.iter().find(|k| k.state == KeyState::Next) {
            if next
                .keys
                .iter()
                .any(|k| k.kid == p.kid && k.state == KeyState::Active)
            {
                if spec.legacy {
                    tracing::info!(kid = %p.kid, "signing key activated");
                } else {
                    tracing::info!(kid = %p.kid, "client key activated");
                }
            }
        }
        return Ok(ring);
    }
    Err(MintError::Contended(spec))
}

/// The ring of `spec` as it stands at `now`, read only: a due activation
/// applied in memory and nothing written (a command that only looks, such as
/// `upstream check`, changes no record); `None` when there is no ring yet.
pub(crate) fn peek_ring(
    spec: &'static RingSpec,
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<Option<KeyRing>, MintError> {
    let Some((_, rec)) = read_ring(spec, store)? else {
        return Ok(None);
    };
    let rec = advance(&rec, now).unwrap_or(rec);
    open_ring(spec, &rec, sealer).map(Some)
}

/// What to put in a minted token.
#[derive(Debug, Clone, Copy)]
pub struct Claims<'a> {
    /// The person's `sub`.
    pub sub: &'a str,
    /// The person's issuer.
    pub subject_iss: &'a str,
    /// The audience: exactly the resource.
    pub aud: &'a str,
    /// Granted scopes.
    pub scopes: &'a [String],
    /// The tool.
    pub tool: &'a str,
    /// The orchestrator's step the token was derived in (`act.step`): the
    /// egress proxy checks it against the route on every call, and a
    /// resource server may (docs/RESOURCE-SERVERS.md).
    pub step: Option<&'a str>,
    /// The DPoP key thumbprint.
    pub jkt: &'a str,
    /// Issued at.
    pub iat: i64,
    /// Expires at.
    pub exp: i64,
    /// The call's RFC 9396 `authorization_details`, checked against the
    /// policy (and approved, when the tool needs approval).
    pub authorization_details: Option<&'a serde_json::Value>,
    /// The approval the token was minted on.
    pub approval_id: Option<&'a str>,
    /// Whether a resource server must accept the token once only
    /// (`each_call` approvals): the `single_use` claim.
    pub single_use: bool,
    /// The bound request's digest (docs/APPROVALS.md, "The request,
    /// bound"): the `req_sha256` claim.
    pub req_sha256: Option<&'a str>,
}

#[derive(Serialize)]
struct Act<'a> {
    sub: &'a str,
    tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
}

#[derive(Serialize)]
struct Cnf<'a> {
    jkt: &'a str,
}

#[derive(Serialize)]
struct TokenClaims<'a> {
    iss: &'a str,
    sub: &'a str,
    subject_iss: &'a str,
    aud: &'a str,
    scope: String,
    act: Act<'a>,
    cnf: Cnf<'a>,
    client_id: &'a str,
    iat: i64,
    exp: i64,
    jti: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    authorization_details: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval_id: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    single_use: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    req_sha256: Option<&'a str>,
}

/// A minted token.
#[derive(Debug)]
pub struct Minted {
    /// The JWT.
    pub token: SecretString,
    /// Its `jti` (events carry only its hash).
    pub jti: String,
}

/// Mints tokens with the active key.
#[derive(Debug)]
pub struct Minter {
    issuer: String,
    agent: String,
    ring: ArcSwap<KeyRing>,
    /// Held while the ring is replaced, so each new ring's generation
    /// follows the one it replaces.
    replacing: std::sync::Mutex<()>,
}

impl Minter {
    /// A minter for `issuer` on behalf of `agent`.
    pub fn new(issuer: String, agent: String, ring: KeyRing) -> Minter {
        Minter {
            issuer,
            agent,
            ring: ArcSwap::from_pointee(ring),
            replacing: std::sync::Mutex::new(()),
        }
    }

    /// Replaces the key ring (after a rotation, on each reload): a ring
    /// whose keys differ from the current one's gets the next generation,
    /// so every cache built from the ring sees the change
    /// ([`RingStamp`]).
    pub fn set_ring(&self, mut ring: KeyRing) {
        let _one = self
            .replacing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.ring.load();
        ring.generation = if current.same_keys(&ring) {
            current.generation
        } else {
            current.generation.wrapping_add(1)
        };
        self.ring.store(Arc::new(ring));
    }

    /// The current ring.
    pub fn ring(&self) -> Arc<KeyRing> {
        self.ring.load_full()
    }

    /// Rotates the signing key (one compare-and-swap of the key ring, see
    /// [`rotate`]) and puts the new ring in use: a scheduled rotation
    /// publishes the new key now and activates it after its delay; an
    /// emergency one activates it at once and withdraws every other key.
    pub(crate) fn rotate(
        &self,
        store: &dyn Store,
        sealer: &Sealer,
        now: i64,
        kind: RotationKind,
    ) -> Result<Rotation, MintError> {
        let r = rotate(store, sealer, now, kind)?;
        self.set_ring(r.ring.clone());
        Ok(r)
    }

    /// Reloads the key ring from the store and applies a due activation
    /// (the housekeeping tick; also picks up a rotation by another process).
    pub(crate) fn refresh(
        &self,
        store: &dyn Store,
        sealer: &Sealer,
        now: i64,
    ) -> Result<(), MintError> {
        let ring = load_or_create(store, sealer, now)?;
        if ring.active.kid != self.ring().active.kid {
            tracing::info!(kid = %ring.active.kid, "signing key now active");
        }
        self.set_ring(ring);
        Ok(())
    }

    /// Whether `kid` is one of ours (to refuse our own tokens as subjects).
    pub fn is_own_kid(&self, kid: &str) -> bool {
        self.ring
            .load()
            .published
            .iter()
            .any(|(k, _)| k.get("kid").and_then(|v| v.as_str()) == Some(kid))
    }

    /// Mints an RFC 9068 access token, DPoP-bound.
    pub fn mint(&self, c: &Claims<'_>) -> Result<Minted, MintError> {
        let mut jti = [0u8; 16];
        aws_lc_rs::rand::fill(&mut jti).map_err(|_| MintError::Jose(JoseError::Sign))?;
        let jti = jose::b64e(&jti);
        let ring = self.ring.load();
        let mut header = serde_json::Map::new();
        header.insert("typ".into(), "at+jwt".into());
        header.insert("kid".into(), ring.active.kid.clone().into());
        let claims = TokenClaims {
            iss: &self.issuer,
            sub: c.sub,
            subject_iss: c.subject_iss,
            aud: c.aud,
            scope: c.scopes.join(" "),
            act: Act {
                sub: &self.agent,
                tool: c.tool,
                step: c.step,
            },
            cnf: Cnf { jkt: c.jkt },
            client_id: &self.agent,
            iat: c.iat,
            exp: c.exp,
            jti: &jti,
            authorization_details: c.authorization_details,
            approval_id: c.approval_id,
            single_use: c.single_use,
            req_sha256: c.req_sha256,
        };
        let token = ring.active.sign_jws(header, &claims)?;
        Ok(Minted {
            token: SecretString::new(token),
            jti,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::config::{ACTIVATION_DELAY, JWKS_MAX_AGE};
    use crate::infra::store::SledStore;

    fn setup() -> (tempfile::TempDir, SledStore, Sealer) {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&dir.path().join("data")).unwrap();
        let sealer =
            Sealer::new(&crate::base::secret::SecretBytes::new(vec![7u8; 32]), &[]).unwrap();
        (dir, store, sealer)
    }

    const T0: i64 = 1_800_000_000;

    #[test]
    fn jwks_cache_control_names_the_max_age() {
        assert_eq!(
            JWKS_CACHE_CONTROL,
            format!("public, max-age={JWKS_MAX_AGE}")
        );
        assert_eq!(ACTIVATION_DELAY, 120);
    }

    #[test]
    fn scheduled_rotation_publishes_first_and_activates_after_the_delay() {
        let (_d, store, sealer) = setup();
        let ring = load_or_create(&store, &sealer, T0).unwrap();
        let old = ring.active.kid.clone();
        let kind = RotationKind::Scheduled {
            activation_delay: ACTIVATION_DELAY,
        };
        let r = rotate(&store, &sealer, T0 + 10, kind).unwrap();
        assert!(r.added);
        assert_eq!(r.activates_at, T0 + 10 + ACTIVATION_DELAY);
        // Published, not signing.
        assert_eq!(r.ring.active.kid, old);
        assert_eq!(
            r.ring.published_kids(T0 + 10),
            vec![old.clone(), r.kid.clone()]
        );
        // A second rotate while pending adds nothing and names the same key.
        let again = rotate(&store, &sealer, T0 + 20, kind).unwrap();
        assert!(!again.added);
        assert_eq!(again.kid, r.kid);
        assert_eq!(again.ring.published.len(), 2);
        // One second early: still the old key.
        let ring = load_or_create(&store, &sealer, r.activates_at - 1).unwrap();
        assert_eq!(ring.active.kid, old);
        // Due: the new key signs, the old one is published for the grace.
        let ring = load_or_create(&store, &sealer, r.activates_at).unwrap();
        assert_eq!(ring.active.kid, r.kid);
        assert!(ring.next.is_none());
        let until = r.activates_at + RETIRED_KEY_GRACE;
        assert_eq!(
            ring.published_kids(until - 1),
            vec![r.kid.clone(), old.clone()]
        );
        assert_eq!(ring.published_kids(until), vec![r.kid.clone()]);
        // The activation was written: a reader at that time sees it too.
        let (_, rec) = read_ring(&SIGNING, &store).unwrap().unwrap();
        assert_eq!(
            rec.keys
                .iter()
                .map(|k| (k.kid.clone(), k.state))
                .collect::<Vec<_>>(),
            vec![
                (old.clone(), KeyState::Retired),
                (r.kid.clone(), KeyState::Active)
            ]
        );
        // Past the grace the retired key leaves the record.
        let ring = load_or_create(&store, &sealer, until).unwrap();
        assert_eq!(ring.published.len(), 1);
        // And a new rotation is possible again.
        assert!(rotate(&store, &sealer, until, kind).unwrap().added);
    }

    #[test]
    fn emergency_rotation_activates_at_once_and_withdraws_every_other_key() {
        let (_d, store, sealer) = setup();
        let old = load_or_create(&store, &sealer, T0)
            .unwrap()
            .active
            .kid
            .clone();
        let kind = RotationKind::Scheduled {
            activation_delay: ACTIVATION_DELAY,
        };
        let pending = rotate(&store, &sealer, T0, kind).unwrap().kid;
        let r = rotate(&store, &sealer, T0 + 1, RotationKind::Emergency).unwrap();
        assert!(r.added);
        assert_eq!(r.ring.active.kid, r.kid);
        assert_eq!(r.ring.published_kids(T0 + 1), vec![r.kid.clone()]);
        assert_eq!(r.withdrawn, vec![old, pending]);
    }

    #[test]
    fn zero_delay_activates_in_the_same_call() {
        let (_d, store, sealer) = setup();
        let old = load_or_create(&store, &sealer, T0)
            .unwrap()
            .active
            .kid
            .clone();
        let kind = RotationKind::Scheduled {
            activation_delay: 0,
        };
        let r = rotate(&store, &sealer, T0, kind).unwrap();
        assert_eq!(r.ring.active.kid, r.kid);
        assert_eq!(r.ring.published_kids(T0), vec![r.kid.clone(), old]);
    }

    fn minter(ring: KeyRing) -> Minter {
        Minter::new("https://b.example".into(), "agent".into(), ring)
    }

    /// Issue 40 item 1: the proxy's verifiers were stamped with the ring's
    /// address, and a ring allocated where a freed one had been looked
    /// unchanged. Here the ring a verifier was built from is freed by one
    /// replacement (an emergency rotation) and the next ring (the tick's
    /// reload of the same record) takes its place in memory: the stamp
    /// must still see the change, else the withdrawn key stays accepted.
    #[test]
    fn a_new_ring_where_a_freed_one_was_is_still_a_change() {
        let (_d, store, sealer) = setup();
        let m = minter(load_or_create(&store, &sealer, T0).unwrap());
        let old = m.ring().active.kid.clone();
        let seen = RingStamp::of(&m.ring(), T0);
        assert!(seen.is_current(&m.ring(), T0));
        let r = rotate(&store, &sealer, T0 + 1, RotationKind::Emergency).unwrap();
        let reloaded = load_or_create(&store, &sealer, T0 + 1).unwrap();
        m.set_ring(r.ring);
        m.set_ring(reloaded);
        let now = m.ring();
        assert_eq!(now.published_kids(T0 + 1), vec![r.kid.clone()]);
        assert!(
            !seen.is_current(&now, T0 + 1),
            "the ring that withdrew {old} looks unchanged to a cache built before"
        );
        // Positive control: a stamp taken now is current, and stays so
        // across a reload that changes nothing.
        let fresh = RingStamp::of(&now, T0 + 1);
        assert!(fresh.is_current(&now, T0 + 1));
        drop(now);
        m.set_ring(load_or_create(&store, &sealer, T0 + 2).unwrap());
        assert!(fresh.is_current(&m.ring(), T0 + 2));
    }

    /// The generation: the next number for every ring whose keys differ
    /// (a scheduled rotation publishing, its activation, an emergency
    /// rotation), the same for a reload that changes nothing.
    #[test]
    fn the_generation_changes_with_the_keys_and_only_then() {
        let (_d, store, sealer) = setup();
        let m = minter(load_or_create(&store, &sealer, T0).unwrap());
        let g = |m: &Minter| m.ring().generation;
        let g0 = g(&m);
        m.set_ring(load_or_create(&store, &sealer, T0).unwrap());
        assert_eq!(g(&m), g0, "a reload that changes nothing");
        let kind = RotationKind::Scheduled {
            activation_delay: ACTIVATION_DELAY,
        };
        let r = m.rotate(&store, &sealer, T0, kind).unwrap();
        assert_eq!(g(&m), g0 + 1, "the next key published");
        m.refresh(&store, &sealer, r.activates_at - 1).unwrap();
        assert_eq!(g(&m), g0 + 1, "not yet due");
        m.refresh(&store, &sealer, r.activates_at).unwrap();
        assert_eq!(g(&m), g0 + 2, "activated");
        assert_eq!(m.ring().active.kid, r.kid);
        m.rotate(&store, &sealer, r.activates_at + 1, RotationKind::Emergency)
            .unwrap();
        assert_eq!(g(&m), g0 + 3, "emergency");
        m.refresh(&store, &sealer, r.activates_at + 2).unwrap();
        assert_eq!(g(&m), g0 + 3, "reloaded unchanged");
        // A ring read before the emergency (a reload that raced it) differs
        // from the current one: a change too, not mistaken for the old one.
        let (_d2, other, _) = setup();
        m.set_ring(load_or_create(&other, &sealer, T0).unwrap());
        assert_eq!(g(&m), g0 + 4);
    }

    /// The published set also changes by time alone, with the same ring:
    /// a stamp lasts until the next such moment (a pending key's
    /// activation, a retired key's end of grace) and not past it.
    #[test]
    fn a_stamp_ends_when_the_published_set_changes_by_time() {
        let (_d, store, sealer) = setup();
        load_or_create(&store, &sealer, T0).unwrap();
        let kind = RotationKind::Scheduled {
            activation_delay: ACTIVATION_DELAY,
        };
        let r = rotate(&store, &sealer, T0, kind).unwrap();
        let at = r.activates_at;
        let m = minter(load_or_create(&store, &sealer, at).unwrap());
        let ring = m.ring();
        let until = at + RETIRED_KEY_GRACE;
        assert_eq!(ring.published_kids(until - 1).len(), 2);
        assert_eq!(ring.published_kids(until).len(), 1);
        let seen = RingStamp::of(&ring, at);
        assert!(seen.is_current(&ring, until - 1), "nothing changed yet");
        assert!(
            !seen.is_current(&ring, until),
            "the retired key left the JWKS at {until}"
        );
        // Before the activation the stamp lasts until it, no longer.
        let pending = minter(r.ring);
        let ring = pending.ring();
        let seen = RingStamp::of(&ring, T0);
        assert!(seen.is_current(&ring, at - 1));
        assert!(!seen.is_current(&ring, at));
    }

    fn legacy(store: &SledStore, sealer: &Sealer, created: i64, retired: Option<i64>) -> String {
        let (key, pkcs8) = Es256Key::generate().unwrap();
        let sealed = sealer
            .seal(&aad(&SIGNING, &key.kid), pkcs8.expose())
            .unwrap();
        let rec = serde_json::json!({
            "kid": key.kid, "created": created, "retired": retired, "sealed": jose::b64e(&sealed),
        });
        store
            .put(
                Tree::SigningKeys,
                key.kid.as_bytes(),
                &serde_json::to_vec(&rec).unwrap(),
            )
            .unwrap();
        key.kid.clone()
    }

    #[test]
    fn per_key_records_migrate_into_one_ring_and_keep_every_signing_key() {
        let (_d, store, sealer) = setup();
        // The shape a crash between the two writes of the old rotate left:
        // two unretired keys, plus one retired recently and one long ago.
        let gone = legacy(&store, &sealer, T0 - 10_000, Some(T0 - 5_000));
        let retired = legacy(&store, &sealer, T0 - 100, Some(T0 - 50));
        let old_active = legacy(&store, &sealer, T0 - 40, None);
        let newest = legacy(&store, &sealer, T0 - 30, None);
        let ring = load_or_create(&store, &sealer, T0).unwrap();
        assert_eq!(ring.active.kid, newest);
        let kids = ring.published_kids(T0);
        assert_eq!(
            kids,
            vec![newest.clone(), old_active.clone(), retired.clone()]
        );
        assert!(!kids.contains(&gone));
        // The old active key (which may have signed until now) stays
        // published for the whole grace from now.
        assert!(ring
            .published_kids(T0 + RETIRED_KEY_GRACE - 1)
            .contains(&old_active));
        // Only the ring record is left.
        let keys: Vec<Vec<u8>> = store
            .scan_prefix(Tree::SigningKeys, b"")
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec![RING_KEY.to_vec()]);
        // Loading again changes nothing.
        let again = load_or_create(&store, &sealer, T0).unwrap();
        assert_eq!(again.published_kids(T0), kids);
    }

    #[test]
    fn a_ring_breaking_an_invariant_is_refused_with_its_cause() {
        let (_d, store, sealer) = setup();
        load_or_create(&store, &sealer, T0).unwrap();
        let (_, mut rec) = read_ring(&SIGNING, &store).unwrap().unwrap();
        rec.keys[0].state = KeyState::Retired;
        rec.keys[0].retired_at = Some(T0);
        store
            .put(Tree::SigningKeys, RING_KEY, &rec.bytes().unwrap())
            .unwrap();
        let err = load_or_create(&store, &sealer, T0).unwrap_err().to_string();
        assert_eq!(
            err,
            "signing key ring (store tree signing_keys, record ring/v1): not exactly one active key"
        );
        // Positive control: the intact record loads.
        rec.keys[0].state = KeyState::Active;
        rec.keys[0].retired_at = None;
        store
            .put(Tree::SigningKeys, RING_KEY, &rec.bytes().unwrap())
            .unwrap();
        assert!(load_or_create(&store, &sealer, T0).is_ok());
    }

    #[test]
    fn a_lost_compare_and_swap_is_retried_on_the_new_ring() {
        let (_d, store, sealer) = setup();
        load_or_create(&store, &sealer, T0).unwrap();
        let (raw, rec) = read_ring(&SIGNING, &store).unwrap().unwrap();
        // Another process rotated in between: the stale CAS must fail.
        let kind = RotationKind::Scheduled {
            activation_delay: ACTIVATION_DELAY,
        };
        let r = rotate(&store, &sealer, T0, kind).unwrap();
        let mut stale = rec.clone();
        stale.generation += 1;
        assert!(!store
            .compare_and_swap(
                Tree::SigningKeys,
                RING_KEY,
                Some(&raw),
                Some(&stale.bytes().unwrap())
            )
            .unwrap());
        assert_eq!(
            load_or_create(&store, &sealer, T0)
                .unwrap()
                .next
                .map(|p| p.kid),
            Some(r.kid)
        );
    }
}
