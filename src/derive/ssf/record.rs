//! The events received, one record per (transmitter, `jti`) in
//! [`Tree::SsfEvents`], written before the SET is acted on and marked done
//! after: a repeat of a done `jti` is acknowledged with no second action,
//! and one stored but never done (the process died between) is acted on
//! when the transmitter sends it again. The record holds no subject.

use serde::{Deserialize, Serialize};

use super::set::Set;
use crate::infra::store::{tuple_key, Store, StoreError, Tree};

/// How long a record stored but not done keeps a repeat out (seconds): the
/// first receipt may still be acting on it.
const IN_PROGRESS: i64 = 60;

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    /// When it was received (the store's clock).
    received_at: i64,
    /// Its `iat`.
    iat: i64,
    /// Its event type.
    event_type: String,
    /// What was done (`None`: not done yet).
    #[serde(default)]
    action: Option<String>,
}

/// How [`begin`] found the `jti`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begun {
    /// New (or stored but left undone): act on it.
    New,
    /// Done before: acknowledge, do nothing.
    Repeat,
}

fn key(transmitter: &str, jti: &str) -> Vec<u8> {
    tuple_key(&[transmitter, jti])
}

/// Stores the SET as received, unless its `jti` is known.
pub(super) fn begin(
    store: &dyn Store,
    transmitter: &str,
    set: &Set,
    now: i64,
) -> Result<Begun, super::ReceiveError> {
    let k = key(transmitter, &set.jti);
    let fresh = Record {
        received_at: now,
        iat: set.iat,
        event_type: set.event_type.clone(),
        action: None,
    };
    let bytes = serde_json::to_vec(&fresh).unwrap_or_default();
    for _ in 0..4 {
        let old = store.get(Tree::SsfEvents, &k)?;
        match old.as_deref().map(serde_json::from_slice::<Record>) {
            Some(Ok(r)) if r.action.is_some() => return Ok(Begun::Repeat),
            Some(Ok(r)) if now - r.received_at < IN_PROGRESS => {
                return Err(super::ReceiveError::Unavailable(
                    "this jti is being acted on now; send it again later".into(),
                ))
            }
            _ => {}
        }
        if store.compare_and_swap(Tree::SsfEvents, &k, old.as_deref(), Some(&bytes))? {
            return Ok(Begun::New);
        }
    }
    Err(super::ReceiveError::Unavailable(
        "this jti's record kept changing; send it again later".into(),
    ))
}

/// Marks the SET done with `action`.
pub(super) fn finish(
    store: &dyn Store,
    transmitter: &str,
    set: &Set,
    now: i64,
    action: &str,
) -> Result<(), StoreError> {
    let r = Record {
        received_at: now,
        iat: set.iat,
        event_type: set.event_type.clone(),
        action: Some(action.to_owned()),
    };
    store.put(
        Tree::SsfEvents,
        &key(transmitter, &set.jti),
        &serde_json::to_vec(&r).unwrap_or_default(),
    )
}

/// Forgets a SET that was stored but could not be acted on, so that the
/// transmitter's retry is acted on at once.
pub(super) fn abandon(store: &dyn Store, transmitter: &str, set: &Set) -> Result<(), StoreError> {
    store.delete(Tree::SsfEvents, &key(transmitter, &set.jti))
}

/// Deletes the records whose `iat` is older than twice the maximum event
/// age: a repeat of them is refused for its age before its `jti` is looked
/// up. Returns how many.
pub(super) fn sweep(store: &dyn Store, now: i64, max_age: i64) -> Result<usize, StoreError> {
    let mut n = 0;
    for (k, v) in store.scan_prefix(Tree::SsfEvents, b"")? {
        let old = serde_json::from_slice::<Record>(&v)
            .map_or(true, |r| r.iat < now - 2 * max_age - super::set::IAT_SKEW);
        if old {
            store.delete(Tree::SsfEvents, &k)?;
            n += 1;
        }
    }
    Ok(n)
}
