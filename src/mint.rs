//! Minting: the instance's ES256 signing keys (generated on first start,
//! sealed at rest), RFC 9068 access tokens bound to a DPoP key, the JWKS, and
//! key rotation.
//!
//! Rotation adds a key and makes it active; the old public key stays in the
//! JWKS until every token it signed has expired (`MAX_TTL` + a minute).

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::jose::{self, Es256Key, JoseError};
use crate::policy::MAX_TTL;
use crate::seal::{SealError, Sealer};
use crate::secret::SecretString;
use crate::store::{Store, StoreError, Tree};

/// How long a retired key stays published.
pub const RETIRED_KEY_GRACE: i64 = MAX_TTL.as_secs() as i64 + 60;

/// Errors of the minting layer.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A key record did not decrypt.
    #[error("signing key record: {0}")]
    Seal(#[from] SealError),
    /// A key or signature operation failed.
    #[error("signing: {0}")]
    Jose(#[from] JoseError),
    /// A key record is malformed.
    #[error("signing key record is malformed")]
    Record,
}

#[derive(Debug, Serialize, Deserialize)]
struct KeyRecord {
    kid: String,
    created: i64,
    #[serde(default)]
    retired: Option<i64>,
    sealed: String,
}

/// The keys: the active signer and every public key still published.
#[derive(Debug)]
pub struct KeyRing {
    /// Signs new tokens.
    pub active: Arc<Es256Key>,
    /// Public JWKs published (active first), with their retirement time.
    pub published: Vec<(serde_json::Value, Option<i64>)>,
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
}

fn aad(kid: &str) -> Vec<u8> {
    format!("signing_keys/{kid}").into_bytes()
}

fn load_ring(store: &dyn Store, sealer: &Sealer) -> Result<Option<KeyRing>, MintError> {
    let mut records: Vec<KeyRecord> = store
        .scan_prefix(Tree::SigningKeys, b"")?
        .into_iter()
        .map(|(_, v)| serde_json::from_slice(&v).map_err(|_| MintError::Record))
        .collect::<Result<_, _>>()?;
    records.sort_by_key(|r| std::cmp::Reverse(r.created));
    let Some(active_rec) = records.iter().find(|r| r.retired.is_none()) else {
        return Ok(None);
    };
    let sealed = jose::b64d(&active_rec.sealed, "key record").map_err(|_| MintError::Record)?;
    let der = sealer.open(&aad(&active_rec.kid), &sealed)?;
    let active = Arc::new(Es256Key::from_pkcs8(der.expose())?);
    if active.kid != active_rec.kid {
        return Err(MintError::Record);
    }
    let mut published = vec![(active.public_jwk.clone(), None)];
    for r in records.iter().filter(|r| r.retired.is_some()) {
        let sealed = jose::b64d(&r.sealed, "key record").map_err(|_| MintError::Record)?;
        let der = sealer.open(&aad(&r.kid), &sealed)?;
        let k = Es256Key::from_pkcs8(der.expose())?;
        published.push((k.public_jwk.clone(), r.retired));
    }
    Ok(Some(KeyRing { active, published }))
}

fn store_new_key(store: &dyn Store, sealer: &Sealer, now: i64) -> Result<String, MintError> {
    let (key, pkcs8) = Es256Key::generate()?;
    let sealed = sealer.seal(&aad(&key.kid), pkcs8.expose())?;
    let rec = KeyRecord {
        kid: key.kid.clone(),
        created: now,
        retired: None,
        sealed: jose::b64e(&sealed),
    };
    let bytes = serde_json::to_vec(&rec).map_err(|_| MintError::Record)?;
    store.put(Tree::SigningKeys, key.kid.as_bytes(), &bytes)?;
    Ok(key.kid)
}

/// Loads the key ring, generating the first key if there is none.
pub fn load_or_create(store: &dyn Store, sealer: &Sealer, now: i64) -> Result<KeyRing, MintError> {
    if let Some(r) = load_ring(store, sealer)? {
        return Ok(r);
    }
    store_new_key(store, sealer, now)?;
    load_ring(store, sealer)?.ok_or(MintError::Record)
}

/// Rotates: a new active key; the previous active key is retired at `now`
/// and stays published for [`RETIRED_KEY_GRACE`]. Keys retired longer ago
/// than that are deleted. Returns the new ring.
pub fn rotate(store: &dyn Store, sealer: &Sealer, now: i64) -> Result<KeyRing, MintError> {
    let records: Vec<(Vec<u8>, KeyRecord)> = store
        .scan_prefix(Tree::SigningKeys, b"")?
        .into_iter()
        .map(|(k, v)| {
            Ok((
                k,
                serde_json::from_slice(&v).map_err(|_| MintError::Record)?,
            ))
        })
        .collect::<Result<_, MintError>>()?;
    // The new key is written first: a crash in between leaves two active
    // keys, and the newest wins on load, which is safe.
    store_new_key(
        store,
        sealer,
        now.max(records.iter().map(|r| r.1.created + 1).max().unwrap_or(now)),
    )?;
    for (k, mut rec) in records {
        match rec.retired {
            None => {
                rec.retired = Some(now);
                let bytes = serde_json::to_vec(&rec).map_err(|_| MintError::Record)?;
                store.put(Tree::SigningKeys, &k, &bytes)?;
            }
            Some(r) if r + RETIRED_KEY_GRACE <= now => store.delete(Tree::SigningKeys, &k)?,
            Some(_) => {}
        }
    }
    load_ring(store, sealer)?.ok_or(MintError::Record)
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
    /// The DPoP key thumbprint.
    pub jkt: &'a str,
    /// Issued at.
    pub iat: i64,
    /// Expires at.
    pub exp: i64,
}

#[derive(Serialize)]
struct Act<'a> {
    sub: &'a str,
    tool: &'a str,
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
}

impl Minter {
    /// A minter for `issuer` on behalf of `agent`.
    pub fn new(issuer: String, agent: String, ring: KeyRing) -> Minter {
        Minter {
            issuer,
            agent,
            ring: ArcSwap::from_pointee(ring),
        }
    }

    /// Replaces the key ring (after rotation).
    pub fn set_ring(&self, ring: KeyRing) {
        self.ring.store(Arc::new(ring));
    }

    /// The current ring.
    pub fn ring(&self) -> Arc<KeyRing> {
        self.ring.load_full()
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
            },
            cnf: Cnf { jkt: c.jkt },
            client_id: &self.agent,
            iat: c.iat,
            exp: c.exp,
            jti: &jti,
        };
        let token = ring.active.sign_jws(header, &claims)?;
        Ok(Minted {
            token: SecretString::new(token),
            jti,
        })
    }
}
