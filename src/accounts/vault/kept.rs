//! What the token's fast path keeps between calls: values worked out from a
//! record's stored bytes, served again only for the very same bytes.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// The most entries each of the vault's [`Kept`] maps holds; when full it
/// starts again empty.
const KEPT_MAX: usize = 4096;

/// What the token's fast path (a proxied call, a derive for a service)
/// worked out from an account's stored bytes, by account key, each with
/// the bytes it came from, so that the same bytes are not worked on again.
/// A value is served only while the bytes handed in are byte for byte the
/// ones it came from: what is kept is a function of those bytes alone.
/// The record itself is still read from the store on every call, so a
/// disconnect or a refresh on another replica is seen at once.
pub(super) struct Kept<V> {
    /// Account (or allowance) key -> (the bytes, what came from them).
    map: Mutex<HashMap<Vec<u8>, KeptEntry<V>>>,
}

type KeptEntry<V> = (Vec<u8>, V);

impl<V> Default for Kept<V> {
    fn default() -> Self {
        Kept {
            map: Mutex::default(),
        }
    }
}

impl<V> std::fmt::Debug for Kept<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kept([REDACTED])")
    }
}

impl<V: Clone> Kept<V> {
    pub(super) fn get(&self, key: &[u8], from: &[u8]) -> Option<V> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(key) {
            Some((f, v)) if f == from => Some(v.clone()),
            _ => None,
        }
    }

    pub(super) fn put(&self, key: &[u8], from: &[u8], v: V) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= KEPT_MAX && !map.contains_key(key) {
            map.clear();
        }
        map.insert(key.to_vec(), (from.to_vec(), v));
    }

    pub(super) fn forget(&self, key: &[u8]) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}
