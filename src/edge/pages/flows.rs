//! Single-use `state` records for the two redirect flows the pages start:
//! sign-in at the organisation's IdP, and the provider flow that connects a
//! service.
//!
//! The `state` is 32 random bytes; the record is stored under its SHA-256,
//! sealed (AES-256-GCM, associated data = the record's key) because it holds
//! the PKCE verifier and the nonce. Taking a record deletes it with a
//! compare-and-swap, so a `state` works once even under concurrent
//! callbacks. Each record is bound to the browser session that started the
//! flow (by the session key, never the id).

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::links::LinkKind;
use crate::base::secret::SecretString;
use crate::infra::seal::Sealer;
use crate::infra::store::{Store, StoreError, Tree};

/// How long a flow may take from redirect to callback.
pub(crate) const FLOW_TTL: i64 = 10 * 60;

/// What a flow is for.
#[derive(Serialize, Deserialize, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
#[serde(tag = "flow", rename_all = "snake_case")]
pub enum Flow {
    /// OIDC sign-in.
    SignIn {
        /// The IdP (trusted issuer).
        issuer: String,
        /// The OIDC `nonce`.
        nonce: String,
        /// PKCE verifier.
        verifier: String,
        /// Where to go after sign-in (already allow-listed).
        return_to: String,
        /// Whether `prompt=login` was asked for (signing in again).
        reauth: bool,
        /// Whether `max_age` was sent: then the ID token must carry a
        /// recent `auth_time` (OpenID Connect Core 3.1.2.1). Records
        /// written before the field existed read as `reauth`'s value.
        #[serde(default)]
        max_age: bool,
    },
    /// Connecting a service for a link.
    Provider {
        /// The link id.
        link_id: String,
        /// The link's kind when the flow started (the callback re-checks).
        #[zeroize(skip)]
        kind: LinkKind,
        /// The service; its callback path must match.
        service: String,
        /// PKCE verifier.
        verifier: String,
        /// The redirect URI sent (it must be sent again on exchange).
        redirect_uri: String,
    },
}

impl std::fmt::Debug for Flow {
    // Verifiers and nonces never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Flow::SignIn {
                issuer,
                reauth,
                max_age,
                ..
            } => f
                .debug_struct("Flow::SignIn")
                .field("issuer", issuer)
                .field("reauth", reauth)
                .field("max_age", max_age)
                .finish_non_exhaustive(),
            Flow::Provider {
                link_id, service, ..
            } => f
                .debug_struct("Flow::Provider")
                .field("link_id", link_id)
                .field("service", service)
                .finish_non_exhaustive(),
        }
    }
}

#[derive(Serialize, Deserialize, Zeroize, ZeroizeOnDrop)]
struct Stored {
    /// The session key (hex SHA-256 of the session id) that started it.
    session: String,
    expires: i64,
    flow: Flow,
}

/// A taken flow: what it was for, and the session it was bound to.
#[derive(Debug)]
pub struct Taken {
    /// The flow.
    pub flow: Flow,
    /// The session key it was bound to.
    pub session: String,
}

fn key_of(state: &str) -> Vec<u8> {
    let mut k = b"state/".to_vec();
    k.extend_from_slice(
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, state.as_bytes()).as_ref(),
    );
    k
}

fn sealing(e: crate::infra::seal::SealError) -> StoreError {
    StoreError::Backend(format!("flow record: {e}"))
}

/// Stores a new flow for `session` and returns its `state`.
pub fn start(
    store: &dyn Store,
    sealer: &Sealer,
    session: &str,
    flow: Flow,
    now: i64,
) -> Result<SecretString, StoreError> {
    let state = super::session::random_token()?;
    let key = key_of(state.expose());
    let stored = Stored {
        session: session.to_string(),
        expires: now + FLOW_TTL,
        flow,
    };
    let mut plain = serde_json::to_vec(&stored).map_err(|e| StoreError::Backend(e.to_string()))?;
    let sealed = sealer.seal(&key, &plain).map_err(sealing);
    plain.zeroize();
    store.put(Tree::PageFlows, &key, &sealed?)?;
    Ok(state)
}

/// Takes the flow of `state` (single use). Unknown, used and expired states
/// are all `None`.
pub fn take(
    store: &dyn Store,
    sealer: &Sealer,
    state: &str,
    now: i64,
) -> Result<Option<Taken>, StoreError> {
    if !super::http::is_code_shaped(state) {
        return Ok(None);
    }
    let key = key_of(state);
    let Some(sealed) = store.get(Tree::PageFlows, &key)? else {
        return Ok(None);
    };
    // Whoever deletes it first owns it.
    if !store.compare_and_swap(Tree::PageFlows, &key, Some(&sealed), None)? {
        return Ok(None);
    }
    let plain = sealer.open(&key, &sealed).map_err(sealing)?;
    let stored: Stored =
        serde_json::from_slice(plain.expose()).map_err(|e| StoreError::Backend(e.to_string()))?;
    if stored.expires <= now {
        return Ok(None);
    }
    // `Stored` zeroizes on drop; move the parts out by cloning the strings
    // we return (they zeroize in `Flow`'s own drop).
    let session = stored.session.clone();
    let flow = match &stored.flow {
        Flow::SignIn {
            issuer,
            nonce,
            verifier,
            return_to,
            reauth,
            max_age,
        } => Flow::SignIn {
            issuer: issuer.clone(),
            nonce: nonce.clone(),
            verifier: verifier.clone(),
            return_to: return_to.clone(),
            reauth: *reauth,
            max_age: *max_age || *reauth,
        },
        Flow::Provider {
            link_id,
            kind,
            service,
            verifier,
            redirect_uri,
        } => Flow::Provider {
            link_id: link_id.clone(),
            kind: *kind,
            service: service.clone(),
            verifier: verifier.clone(),
            redirect_uri: redirect_uri.clone(),
        },
    };
    Ok(Some(Taken { flow, session }))
}

/// Deletes expired flows (their state can no longer be used).
pub fn sweep(store: &dyn Store, sealer: &Sealer, now: i64) -> Result<usize, StoreError> {
    let mut n = 0;
    for (k, v) in store.scan_prefix(Tree::PageFlows, b"state/")? {
        let dead = match sealer.open(&k, &v) {
            Ok(p) => {
                serde_json::from_slice::<Stored>(p.expose()).map_or(true, |s| s.expires <= now)
            }
            Err(_) => true,
        };
        if dead {
            store.delete(Tree::PageFlows, &k)?;
            n += 1;
        }
    }
    Ok(n)
}

/// A PKCE pair: a random verifier and its S256 challenge.
pub(crate) fn pkce() -> Result<(SecretString, String), StoreError> {
    let verifier = super::session::random_token()?;
    let challenge = crate::base::oauth::pkce_challenge(verifier.expose());
    Ok((verifier, challenge))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, crate::infra::store::SledStore, Sealer) {
        let d = tempfile::tempdir().unwrap();
        let st = crate::infra::store::SledStore::open(d.path()).unwrap();
        let sealer = Sealer::new(&crate::base::secret::SecretBytes::new(vec![7; 32]), &[]).unwrap();
        (d, st, sealer)
    }

    fn flow() -> Flow {
        Flow::SignIn {
            issuer: "https://idp.example".into(),
            nonce: "n-canary".into(),
            verifier: "v-canary".into(),
            return_to: "/account".into(),
            reauth: false,
            max_age: false,
        }
    }

    #[test]
    fn state_is_single_use_sealed_and_expires() {
        let (_d, st, sealer) = setup();
        let state = start(&st, &sealer, "sess", flow(), 100).unwrap();
        // Nothing readable in the store, which does hold the flow (a scan
        // of an empty tree would find nothing readable either).
        let rows = st.scan_prefix(Tree::PageFlows, b"").unwrap();
        assert_eq!(rows.len(), 1, "the started flow is stored");
        for (k, v) in rows {
            for needle in [&b"v-canary"[..], b"n-canary", state.expose().as_bytes()] {
                assert!(!v.windows(needle.len()).any(|w| w == needle));
                assert!(!k.windows(needle.len()).any(|w| w == needle));
            }
        }
        let t = take(&st, &sealer, state.expose(), 101).unwrap().unwrap();
        assert_eq!(t.session, "sess");
        assert_eq!(t.flow, flow());
        // Reused: gone.
        assert!(take(&st, &sealer, state.expose(), 101).unwrap().is_none());
        // Expired: gone.
        let s2 = start(&st, &sealer, "sess", flow(), 100).unwrap();
        assert!(take(&st, &sealer, s2.expose(), 100 + FLOW_TTL)
            .unwrap()
            .is_none());
        // Unknown and malformed: none.
        assert!(take(&st, &sealer, &"A".repeat(43), 101).unwrap().is_none());
        assert!(take(&st, &sealer, "x", 101).unwrap().is_none());
        // Positive control: a fresh one works.
        let s3 = start(&st, &sealer, "sess", flow(), 100).unwrap();
        assert!(take(&st, &sealer, s3.expose(), 200).unwrap().is_some());
    }

    #[test]
    fn sweep_removes_expired() {
        let (_d, st, sealer) = setup();
        start(&st, &sealer, "s", flow(), 0).unwrap();
        let live = start(&st, &sealer, "s", flow(), 1000).unwrap();
        assert_eq!(sweep(&st, &sealer, FLOW_TTL + 1).unwrap(), 1);
        assert!(take(&st, &sealer, live.expose(), 1001).unwrap().is_some());
    }
}
