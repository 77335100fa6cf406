//! The client key: what this broker signs with when it is the *client* of
//! an upstream authorization server (`[upstreams.<name>]`): RFC 7523
//! client assertions (`client_auth = "private_key_jwt"`) and actor tokens
//! (`actor_token = true`). It is not a token-signing key: it has its own
//! ring in its own store tree ([`mint::CLIENT`], `client_keys`), sealed
//! under the master key like the signing keys, so every replica sharing
//! the store has it; its public keys are published at
//! `{issuer}/.well-known/client-jwks.json` and never in
//! `/.well-known/jwks.json`, so nothing it signs verifies as one of this
//! broker's access tokens.
//!
//! The ring is read into memory at start, on the key tick, when another
//! replica changes it (the store's watch) and after a rotation: signing an
//! assertion or actor token makes no store call. A rotation has the
//! signing keys' overlap ([`mint::rotate_ring`]): the new key is published
//! first and signs only after `[keys] activation_delay`, and the key it
//! replaces stays published for [`mint::RETIRED_KEY_GRACE`].

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::base::jose::{self, JoseError};
use crate::base::secret::SecretString;
use crate::derive::mint::{self, KeyRing, MintError, Rotation, RotationKind};
use crate::infra::seal::Sealer;
use crate::infra::store::Store;

/// The `typ` of a client assertion: `client-authentication+jwt`
/// (draft-ietf-oauth-rfc7523bis, section 4; registered as the media type
/// `application/client-authentication+jwt`).
pub(crate) const ASSERTION_TYP: &str = "client-authentication+jwt";
/// The `typ` of an actor token: this broker's own, so no verifier that
/// wants an access token (`at+jwt`) or a DPoP proof accepts one.
pub(crate) const ACTOR_TYP: &str = "credbroker-actor+jwt";
/// The lifetime of a client assertion or actor token (seconds).
pub(crate) const LIFETIME: i64 = 60;
/// The RFC 7523 `client_assertion_type`.
pub(crate) const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The RFC 8693 token type of a JWT (the actor token's `actor_token_type`).
pub(crate) const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";

/// What an actor token names: the agent this broker serves, and the tool
/// and step of the derive it is sent for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Actor<'a> {
    /// The agent (`sub`).
    pub agent: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The orchestrator's step.
    pub step: Option<&'a str>,
}

#[derive(Serialize)]
struct AssertionClaims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    iat: i64,
    exp: i64,
    jti: &'a str,
}

#[derive(Serialize)]
struct ActorClaims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
    iat: i64,
    exp: i64,
    jti: &'a str,
}

/// The client key ring in memory.
#[derive(Debug)]
pub struct ClientKeys {
    ring: ArcSwap<KeyRing>,
}

/// A fresh `jti`: 128 random bits.
fn jti() -> Result<String, MintError> {
    let mut b = [0u8; 16];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| MintError::Jose(JoseError::Sign))?;
    Ok(jose::b64e(&b))
}

impl ClientKeys {
    /// Loads the ring (created on first use), a due activation applied.
    pub(crate) fn load(
        store: &dyn Store,
        sealer: &Sealer,
        now: i64,
    ) -> Result<ClientKeys, MintError> {
        let ring = mint::load_ring(&mint::CLIENT, store, sealer, now)?;
        Ok(ClientKeys {
            ring: ArcSwap::from_pointee(ring),
        })
    }

    /// The ring as stored, read only ([`mint::peek_ring`]): `None` when
    /// no broker has created it yet. For a command that signs one
    /// assertion with the client key while no instance runs.
    pub(crate) fn peek(
        store: &dyn Store,
        sealer: &Sealer,
        now: i64,
    ) -> Result<Option<ClientKeys>, MintError> {
        Ok(
            mint::peek_ring(&mint::CLIENT, store, sealer, now)?.map(|ring| ClientKeys {
                ring: ArcSwap::from_pointee(ring),
            }),
        )
    }

    /// Re-reads the ring (the key tick, or another replica changed it).
    pub(crate) fn refresh(
        &self,
        store: &dyn Store,
        sealer: &Sealer,
        now: i64,
    ) -> Result<(), MintError> {
        let ring = mint::load_ring(&mint::CLIENT, store, sealer, now)?;
        if ring.active.kid != self.ring.load().active.kid {
            tracing::info!(kid = %ring.active.kid, "client key now active");
        }
        self.ring.store(Arc::new(ring));
        Ok(())
    }

    /// Rotates the client key ([`rotate`]) and puts the new ring in use.
    pub(crate) fn rotate(
        &self,
        store: &dyn Store,
        sealer: &Sealer,
        now: i64,
        kind: RotationKind,
    ) -> Result<Rotation, MintError> {
        let r = rotate(store, sealer, now, kind)?;
        self.ring.store(Arc::new(r.ring.clone()));
        Ok(r)
    }

    /// The `kid` that signs now.
    pub fn active_kid(&self) -> String {
        self.ring.load().active.kid.clone()
    }

    /// The client JWKS at `now`: the active key, a pending one, and retired
    /// ones still in their grace.
    pub fn jwks(&self, now: i64) -> serde_json::Value {
        self.ring.load().jwks(now)
    }

    /// An RFC 7523 client assertion for `client_id` at the authorization
    /// server whose issuer identifier is `aud` (that one value only): `iss`
    /// = `sub` = the client id, [`LIFETIME`] seconds, a fresh `jti`, `typ`
    /// [`ASSERTION_TYP`], ES256 with the active client key.
    pub(crate) fn client_assertion(
        &self,
        client_id: &str,
        aud: &str,
        now: i64,
    ) -> Result<SecretString, MintError> {
        let jti = jti()?;
        let claims = AssertionClaims {
            iss: client_id,
            sub: client_id,
            aud,
            iat: now,
            exp: now + LIFETIME,
            jti: &jti,
        };
        self.sign(ASSERTION_TYP, &claims)
    }

    /// An actor token naming `actor` for the authorization server `aud`:
    /// `iss` this broker, `sub` the agent, `tool`, `step`, [`LIFETIME`]
    /// seconds, `typ` [`ACTOR_TYP`], ES256 with the active client key.
    pub(crate) fn actor_token(
        &self,
        issuer: &str,
        actor: &Actor<'_>,
        aud: &str,
        now: i64,
    ) -> Result<SecretString, MintError> {
        let jti = jti()?;
        let claims = ActorClaims {
            iss: issuer,
            sub: actor.agent,
            aud,
            tool: actor.tool,
            step: actor.step,
            iat: now,
            exp: now + LIFETIME,
            jti: &jti,
        };
        self.sign(ACTOR_TYP, &claims)
    }

    fn sign(&self, typ: &str, claims: &impl Serialize) -> Result<SecretString, MintError> {
        let ring = self.ring.load();
        let mut header = serde_json::Map::new();
        header.insert("typ".into(), typ.into());
        header.insert("kid".into(), ring.active.kid.clone().into());
        Ok(SecretString::new(ring.active.sign_jws(header, claims)?))
    }
}

/// Rotates the client key with one compare-and-swap of its ring, as
/// [`mint::rotate`] does the signing key (a scheduled rotation while one is
/// pending adds nothing and reports the pending key).
pub(crate) fn rotate(
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
    kind: RotationKind,
) -> Result<Rotation, MintError> {
    mint::rotate_ring(&mint::CLIENT, store, sealer, now, kind)
}

/// The `kid` signing now, read from the store (creating the ring if it is
/// missing): what a rotation replaces.
pub(crate) fn active_kid(
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<String, MintError> {
    Ok(mint::load_ring(&mint::CLIENT, store, sealer, now)?
        .active
        .kid
        .clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::jose::Jwk;
    use crate::infra::store::{SledStore, Tree};

    fn setup() -> (tempfile::TempDir, SledStore, Sealer) {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&dir.path().join("data")).unwrap();
        let sealer =
            Sealer::new(&crate::base::secret::SecretBytes::new(vec![7u8; 32]), &[]).unwrap();
        (dir, store, sealer)
    }

    fn parts(jwt: &str) -> (serde_json::Value, serde_json::Value) {
        let mut it = jwt.split('.');
        let mut next =
            || serde_json::from_slice(&jose::b64d(it.next().unwrap(), "part").unwrap()).unwrap();
        (next(), next())
    }

    #[test]
    fn the_client_key_is_its_own_ring_and_never_a_signing_key() {
        let (_d, store, sealer) = setup();
        let signing = mint::load_or_create(&store, &sealer, 1_000).unwrap();
        let client = ClientKeys::load(&store, &sealer, 1_000).unwrap();
        assert_ne!(client.active_kid(), signing.active.kid);
        assert!(store.get(Tree::ClientKeys, b"ring/v1").unwrap().is_some());
        // Neither JWKS holds the other's key.
        let kids = |v: serde_json::Value| -> Vec<String> {
            v["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k["kid"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(kids(client.jwks(1_000)), vec![client.active_kid()]);
        assert!(!kids(signing.jwks(1_000)).contains(&client.active_kid()));
        // The signing ring, reloaded, is the same one (nothing migrated in).
        let again = mint::load_or_create(&store, &sealer, 1_001).unwrap();
        assert_eq!(again.active.kid, signing.active.kid);
        assert_eq!(again.published.len(), 1);
    }

    #[test]
    fn a_peek_writes_nothing_and_reads_the_ring_a_broker_made() {
        let (_d, store, sealer) = setup();
        assert!(ClientKeys::peek(&store, &sealer, 1_000).unwrap().is_none());
        assert!(
            store.get(Tree::ClientKeys, b"ring/v1").unwrap().is_none(),
            "a peek creates no ring"
        );
        // The control: once a broker has loaded (created) it, the peek
        // signs with the same key.
        let keys = ClientKeys::load(&store, &sealer, 1_000).unwrap();
        let seen = ClientKeys::peek(&store, &sealer, 1_001).unwrap().unwrap();
        assert_eq!(seen.active_kid(), keys.active_kid());
    }

    #[test]
    fn an_assertion_has_the_rfc7523bis_shape_and_verifies_with_the_client_jwks() {
        let (_d, store, sealer) = setup();
        let keys = ClientKeys::load(&store, &sealer, 1_000).unwrap();
        let a = keys
            .client_assertion("broker", "https://as.example", 1_000)
            .unwrap();
        let b = keys
            .client_assertion("broker", "https://as.example", 1_000)
            .unwrap();
        let (h, c) = parts(a.expose());
        assert_eq!(h["typ"], ASSERTION_TYP);
        assert_eq!(h["alg"], "ES256");
        assert_eq!(h["kid"], keys.active_kid().as_str());
        assert_eq!(c["iss"], "broker");
        assert_eq!(c["sub"], "broker");
        assert_eq!(c["aud"], "https://as.example", "one audience, a string");
        assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 60);
        let (_, c2) = parts(b.expose());
        assert_ne!(c["jti"], c2["jti"], "a fresh jti each time");
        // Its signature verifies with the published key.
        let jwk = Jwk::from_value(&keys.jwks(1_000)["keys"][0]).unwrap();
        let jws = jose::parse(a.expose(), 8192).unwrap();
        jwk.verify(jose::Alg::ES256, &jws).unwrap();
        // An actor token has its own typ and names the tool and step.
        let t = keys
            .actor_token(
                "https://broker.example",
                &Actor {
                    agent: "repo-helper",
                    tool: "org.notes",
                    step: Some("summarize"),
                },
                "https://as.example",
                1_000,
            )
            .unwrap();
        let (h, c) = parts(t.expose());
        assert_eq!(h["typ"], ACTOR_TYP);
        assert_eq!(c["sub"], "repo-helper");
        assert_eq!(c["tool"], "org.notes");
        assert_eq!(c["step"], "summarize");
        assert_eq!(c["aud"], "https://as.example");
        assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 60);
    }

    #[test]
    fn a_rotation_publishes_first_signs_later_and_keeps_the_old_key_published() {
        let (_d, store, sealer) = setup();
        let keys = ClientKeys::load(&store, &sealer, 1_000).unwrap();
        let old = keys.active_kid();
        let r = keys
            .rotate(
                &store,
                &sealer,
                1_000,
                RotationKind::Scheduled {
                    activation_delay: 120,
                },
            )
            .unwrap();
        assert!(r.added);
        assert_eq!(keys.active_kid(), old, "not signing before its time");
        assert_eq!(keys.jwks(1_000)["keys"].as_array().unwrap().len(), 2);
        // Another replica's view, at the activation time.
        let other = ClientKeys::load(&store, &sealer, 1_120).unwrap();
        assert_eq!(other.active_kid(), r.kid);
        keys.refresh(&store, &sealer, 1_121).unwrap();
        assert_eq!(keys.active_kid(), r.kid);
        let a = keys
            .client_assertion("broker", "https://as", 1_121)
            .unwrap();
        assert_eq!(parts(a.expose()).0["kid"], r.kid.as_str());
        // The replaced key stays published for its grace, then goes.
        assert_eq!(keys.jwks(1_121)["keys"].as_array().unwrap().len(), 2);
        let late = 1_120 + mint::RETIRED_KEY_GRACE;
        keys.refresh(&store, &sealer, late).unwrap();
        assert_eq!(keys.jwks(late)["keys"].as_array().unwrap().len(), 1);
        // The signing ring never moved.
        assert!(store.get(Tree::SigningKeys, b"ring/v1").unwrap().is_none());
    }
}
