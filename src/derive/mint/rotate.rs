//! Rotating a key ring ([`super`] describes the ring): a scheduled
//! rotation publishes the new key as `next` and activates it after the
//! delay, an emergency one activates it at once and withdraws every other
//! key; either is one compare-and-swap of the ring record.

use super::{
    load_ring, new_key, open_ring, read_ring, KeyRing, KeyState, MintError, RingRecord, RingSpec,
    CAS_ATTEMPTS, RING_KEY, SIGNING,
};
use crate::infra::failpoint;
use crate::infra::seal::Sealer;
use crate::infra::store::Store;

/// How to rotate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RotationKind {
    /// Publish a new key now, activate it after the delay (seconds).
    Scheduled {
        /// Seconds between publication and activation.
        activation_delay: i64,
    },
    /// Suspected compromise: the new key signs at once and every other key
    /// leaves the JWKS (tokens they signed stop verifying).
    Emergency,
}

impl RotationKind {
    /// An emergency rotation, or a scheduled one with this delay (seconds).
    pub(crate) fn new(emergency: bool, activation_delay: i64) -> RotationKind {
        if emergency {
            RotationKind::Emergency
        } else {
            RotationKind::Scheduled { activation_delay }
        }
    }
}

/// What a rotation did.
#[derive(Debug)]
pub(crate) struct Rotation {
    /// The rotated-in key.
    pub kid: String,
    /// Whether this call created it (false: a scheduled rotation was
    /// already pending, and this call reports that key instead of adding a
    /// second one).
    pub added: bool,
    /// When it signs (`now` for an emergency rotation).
    pub activates_at: i64,
    /// The keys an emergency rotation withdrew from the JWKS.
    pub withdrawn: Vec<String>,
    /// Whether it was an emergency rotation.
    pub emergency: bool,
    /// The ring after the rotation.
    pub ring: KeyRing,
}

/// Rotates the signing key with one compare-and-swap of the ring. A
/// scheduled rotation while one is pending adds nothing and reports the
/// pending key, so a retried `credbroker keys rotate` never adds two keys.
pub(crate) fn rotate(
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
    kind: RotationKind,
) -> Result<Rotation, MintError> {
    rotate_ring(&SIGNING, store, sealer, now, kind)
}

/// [`rotate`] for the ring of `spec`.
pub(crate) fn rotate_ring(
    spec: &'static RingSpec,
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
    kind: RotationKind,
) -> Result<Rotation, MintError> {
    let [_, _, _, _, rotate_before, rotate_after] = spec.points;
    for _ in 0..CAS_ATTEMPTS {
        // Start from the ring as it is now (migrated, due activation applied).
        load_ring(spec, store, sealer, now)?;
        let Some((raw, rec)) = read_ring(spec, store)? else {
            return Err(MintError::Ring(spec, "missing after it was created"));
        };
        let (new, kid, activates_at, withdrawn) = match kind {
            RotationKind::Scheduled { activation_delay } => {
                if let Some(p) = rec.keys.iter().find(|k| k.state == KeyState::Next) {
                    let ring = open_ring(spec, &rec, sealer)?;
                    return Ok(Rotation {
                        kid: p.kid.clone(),
                        added: false,
                        activates_at: p.activates_at.unwrap_or(now),
                        withdrawn: Vec::new(),
                        emergency: false,
                        ring,
                    });
                }
                let at = now + activation_delay.max(0);
                let mut k = new_key(spec, sealer, now, KeyState::Next)?;
                k.activates_at = Some(at);
                let kid = k.kid.clone();
                let mut new = rec.clone();
                new.generation += 1;
                new.keys.push(k);
                (new, kid, at, Vec::new())
            }
            RotationKind::Emergency => {
                let k = new_key(spec, sealer, now, KeyState::Active)?;
                let kid = k.kid.clone();
                let withdrawn = rec.keys.iter().map(|k| k.kid.clone()).collect();
                let new = RingRecord {
                    generation: rec.generation + 1,
                    keys: vec![k],
                };
                (new, kid, now, withdrawn)
            }
        };
        new.check(spec)?;
        failpoint::hit(rotate_before);
        if !store.compare_and_swap(spec.tree, RING_KEY, Some(&raw), Some(&new.bytes()?))? {
            continue;
        }
        failpoint::hit(rotate_after);
        // A zero delay activates now (a second write, through the same path
        // as the tick).
        let ring = load_ring(spec, store, sealer, now)?;
        return Ok(Rotation {
            kid,
            added: true,
            activates_at,
            withdrawn,
            emergency: kind == RotationKind::Emergency,
            ring,
        });
    }
    Err(MintError::Contended(spec))
}
