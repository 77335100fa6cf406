//! The emergency freeze as the store holds it (tree `state`, key
//! `frozen`), signed so that a writer to a shared store who lacks the
//! master key cannot lift it.
//!
//! The record is `v2 EPOCH STATE TAG`. STATE is `1` (frozen) or `0`;
//! EPOCH counts the changes; TAG is an HMAC-SHA256 over both, under a key
//! derived from the master key. Each instance remembers the highest epoch
//! it has read, and from then on follows only a record whose tag checks and
//! whose epoch is at least that high:
//! - a record whose tag does not check, a record of the earlier unsigned
//!   form saying "not frozen", or no record at all (once one was read),
//!   freezes the instance: it fails closed;
//! - an older record whose tag checks (one put back) changes nothing.
//!
//! A record of the earlier unsigned form saying "not frozen" is rewritten
//! signed by the first instance that reads it at start-up. An unsigned
//! `1` is left as it is: it freezes this release and the earlier one
//! alike, whose replicas read only `1` as frozen (during a rolling
//! upgrade a signed record would lift the freeze on them).
//!
//! Left to a writer without the master key:
//! - an instance that starts while an old signed record, put back, is in
//!   the store follows it (it has read no newer one);
//! - an earlier release's unsigned `1` can be replaced with `0`, which an
//!   instance that has read no signed record follows, until an operator
//!   next sets or lifts the freeze;
//! - freezing: anyone who can write the store can, as they can delete any
//!   record.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use aws_lc_rs::hmac;
use base64::Engine;

use crate::base::secret::SecretBytes;
use crate::infra::store::{Store, StoreError, Tree};

/// The record's key in [`Tree::State`]; this module is its one owner.
const KEY: &[u8] = b"frozen";

/// The key that signs the freeze record, derived from the master key.
pub(crate) struct FreezeKey(hmac::Key);

impl std::fmt::Debug for FreezeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FreezeKey([REDACTED])")
    }
}

/// What the store's freeze record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// No record.
    Absent,
    /// The earlier, unsigned form (`1` or `0`).
    Unsigned(bool),
    /// A record whose tag checks.
    Signed {
        /// Its place in the order of changes.
        epoch: u64,
        /// Whether it freezes.
        frozen: bool,
    },
    /// Anything else: a tag that does not check, or no known form.
    Forged,
}

impl FreezeKey {
    /// The key for the master key `master`.
    pub(crate) fn derive(master: &SecretBytes) -> FreezeKey {
        let k = hmac::Key::new(hmac::HMAC_SHA256, master.expose());
        let sub = hmac::sign(&k, b"credbroker freeze key v1");
        FreezeKey(hmac::Key::new(hmac::HMAC_SHA256, sub.as_ref()))
    }

    fn message(epoch: u64, frozen: bool) -> String {
        format!("credbroker freeze v2\n{epoch}\n{}", u8::from(frozen))
    }

    /// The record for `frozen` at `epoch`.
    pub(crate) fn record(&self, epoch: u64, frozen: bool) -> Vec<u8> {
        let tag = hmac::sign(&self.0, FreezeKey::message(epoch, frozen).as_bytes());
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref());
        format!("v2 {epoch} {} {tag}", u8::from(frozen)).into_bytes()
    }

    /// What the stored bytes `raw` are.
    pub(crate) fn parse(&self, raw: Option<&[u8]>) -> Stored {
        let Some(raw) = raw else {
            return Stored::Absent;
        };
        match raw {
            b"1" => return Stored::Unsigned(true),
            b"0" => return Stored::Unsigned(false),
            _ => {}
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            return Stored::Forged;
        };
        let fields: Vec<&str> = text.split(' ').collect();
        let ["v2", epoch, state, tag] = fields.as_slice() else {
            return Stored::Forged;
        };
        let (Ok(epoch), Some(frozen)) = (
            epoch.parse::<u64>(),
            match *state {
                "1" => Some(true),
                "0" => Some(false),
                _ => None,
            },
        ) else {
            return Stored::Forged;
        };
        let Ok(tag) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tag) else {
            return Stored::Forged;
        };
        match hmac::verify(&self.0, FreezeKey::message(epoch, frozen).as_bytes(), &tag) {
            Ok(()) => Stored::Signed { epoch, frozen },
            Err(_) => Stored::Forged,
        }
    }
}

/// The highest epoch one instance has read (0: none yet), and whether it
/// has said that the record was tampered with: said once, until a current
/// signed record is read again (each change of the `state` tree reads the
/// record, so without this a tampered one would be said at every change).
#[derive(Debug, Default)]
pub(crate) struct Seen {
    epoch: AtomicU64,
    alarmed: AtomicBool,
}

impl Seen {
    /// The highest epoch read so far.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether an instance that has read what `self` holds is frozen by
    /// `stored`; `None` when it keeps the state it has (an older record put
    /// back). Takes a signed record's epoch in.
    pub(crate) fn judge(&self, stored: Stored) -> Option<bool> {
        let seen = self.epoch();
        match stored {
            Stored::Absent | Stored::Unsigned(false) if seen == 0 => Some(false),
            Stored::Unsigned(true) => Some(true),
            Stored::Absent => {
                if !self.alarmed.swap(true, Ordering::SeqCst) {
                    tracing::error!(
                        "the emergency freeze record was removed from the store; frozen until an operator sets the freeze again (credbroker freeze on|off)"
                    );
                }
                Some(true)
            }
            Stored::Unsigned(false) | Stored::Forged => {
                if !self.alarmed.swap(true, Ordering::SeqCst) {
                    tracing::error!(
                        "the emergency freeze record in the store is not signed with this deployment's master key; frozen until an operator sets the freeze again (credbroker freeze on|off)"
                    );
                }
                Some(true)
            }
            Stored::Signed { epoch, .. } if epoch < seen => {
                if !self.alarmed.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        epoch,
                        seen,
                        "an older emergency freeze record was put back in the store; ignored"
                    );
                }
                None
            }
            Stored::Signed { epoch, frozen } => {
                self.epoch.fetch_max(epoch, Ordering::SeqCst);
                self.alarmed.store(false, Ordering::SeqCst);
                Some(frozen)
            }
        }
    }
}

/// Reads the store's freeze record.
pub(crate) fn read(store: &dyn Store, key: &FreezeKey) -> Result<Stored, StoreError> {
    Ok(key.parse(store.get(Tree::State, KEY)?.as_deref()))
}

/// Writes `frozen` at the next epoch (past both the stored record's and
/// what `seen` holds), by compare-and-swap; returns the epoch written.
pub(crate) fn write(
    store: &dyn Store,
    key: &FreezeKey,
    seen: &Seen,
    frozen: bool,
) -> Result<u64, StoreError> {
    loop {
        let current = store.get(Tree::State, KEY)?;
        let stored = match key.parse(current.as_deref()) {
            Stored::Signed { epoch, .. } => epoch,
            _ => 0,
        };
        let epoch = stored.max(seen.epoch()) + 1;
        let record = key.record(epoch, frozen);
        if store.compare_and_swap(Tree::State, KEY, current.as_deref(), Some(&record))? {
            seen.epoch.fetch_max(epoch, Ordering::SeqCst);
            return Ok(epoch);
        }
    }
}

/// The freeze at an instance's start: the earlier unsigned "not frozen" is
/// rewritten signed, then the record is judged.
pub(crate) fn at_start(
    store: &dyn Store,
    key: &FreezeKey,
    seen: &Seen,
) -> Result<bool, StoreError> {
    let mut stored = read(store, key)?;
    if stored == Stored::Unsigned(false) {
        write(store, key, seen, false)?;
        stored = read(store, key)?;
    }
    Ok(seen.judge(stored).unwrap_or(true))
}

/// The emergency freeze as one running instance holds it: the flag every
/// derive reads, the key that signs the record, the highest epoch read, and
/// whether a freeze set here could not be written to the store.
#[derive(Debug)]
pub(crate) struct State {
    /// Set at run time (admin or a replica through the store).
    frozen: AtomicBool,
    /// A freeze set here whose write to the store failed: it holds until
    /// lifted here, whatever the store says (see [`State::reload`]).
    unpersisted: AtomicBool,
    key: FreezeKey,
    seen: Seen,
}

impl State {
    /// The state at an instance's start ([`at_start`]); a store that does
    /// not answer leaves it unfrozen here (it fails the start elsewhere).
    pub(crate) fn at_start(store: &dyn Store, key: FreezeKey) -> State {
        let seen = Seen::default();
        let frozen = at_start(store, &key, &seen).unwrap_or(false);
        State {
            frozen: AtomicBool::new(frozen),
            unpersisted: AtomicBool::new(false),
            key,
            seen,
        }
    }

    /// Whether the run-time freeze is set (the policy file's own flag is
    /// the caller's to add).
    pub(crate) fn is_set(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Re-reads the freeze from the store, where another instance sharing
    /// it (a replica) or an offline `credbroker freeze` may have changed
    /// it. A store that does not answer changes nothing (`None`), and a
    /// freeze this instance could not persist is kept (it fails closed);
    /// otherwise returns the flag now in force.
    pub(crate) fn reload(&self, store: &dyn Store) -> Option<bool> {
        let stored = read(store, &self.key).ok()?;
        let kept = self.frozen.load(Ordering::SeqCst);
        let on = self.seen.judge(stored).unwrap_or(kept) || self.unpersisted.load(Ordering::SeqCst);
        if self.frozen.swap(on, Ordering::SeqCst) != on {
            tracing::warn!(frozen = on, "the emergency freeze changed in the store");
        }
        Some(on)
    }

    /// Sets or lifts the freeze: persisted before it takes effect when
    /// lifting, and after it takes effect when setting (so a failing store
    /// can never keep a freeze from applying).
    pub(crate) fn set(&self, store: &dyn Store, on: bool) -> Result<(), StoreError> {
        if on {
            self.frozen.store(true, Ordering::SeqCst);
            let r = write(store, &self.key, &self.seen, true).map(|_| ());
            self.unpersisted.store(r.is_err(), Ordering::SeqCst);
            r
        } else {
            write(store, &self.key, &self.seen, false)?;
            self.unpersisted.store(false, Ordering::SeqCst);
            self.frozen.store(false, Ordering::SeqCst);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::store::SledStore;

    fn key(byte: u8) -> FreezeKey {
        FreezeKey::derive(&SecretBytes::new(vec![byte; 32]))
    }

    fn store() -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(&dir.path().join("data")).unwrap();
        (dir, s)
    }

    #[test]
    fn a_writer_without_the_key_cannot_lift_a_freeze() {
        let (_d, s) = store();
        let k = key(1);
        let replica = Seen::default();
        write(&s, &k, &Seen::default(), true).unwrap();
        assert_eq!(replica.judge(read(&s, &k).unwrap()), Some(true));
        let signed_freeze = s.get(Tree::State, KEY).unwrap().unwrap();
        // The earlier unsigned "not frozen", a record signed with another
        // master key, a tag changed, and the record deleted: each keeps the
        // replica frozen.
        let other = key(2).record(99, false);
        let mut bent = k.record(99, false);
        let last = bent.len() - 2;
        bent[last] ^= 1;
        for forged in [b"0".to_vec(), other, bent] {
            s.put(Tree::State, KEY, &forged).unwrap();
            assert_eq!(
                replica.judge(read(&s, &k).unwrap()),
                Some(true),
                "{}",
                String::from_utf8_lossy(&forged)
            );
        }
        s.delete(Tree::State, KEY).unwrap();
        assert_eq!(replica.judge(read(&s, &k).unwrap()), Some(true));
        // Positive control: the operator's own lift, signed, is followed.
        s.put(Tree::State, KEY, &signed_freeze).unwrap();
        write(&s, &k, &Seen::default(), false).unwrap();
        assert_eq!(replica.judge(read(&s, &k).unwrap()), Some(false));
    }

    #[test]
    fn an_older_signed_record_put_back_changes_nothing() {
        let (_d, s) = store();
        let k = key(1);
        let replica = Seen::default();
        write(&s, &k, &Seen::default(), false).unwrap();
        let lifted = s.get(Tree::State, KEY).unwrap().unwrap();
        assert_eq!(replica.judge(read(&s, &k).unwrap()), Some(false));
        write(&s, &k, &Seen::default(), true).unwrap();
        assert_eq!(replica.judge(read(&s, &k).unwrap()), Some(true));
        // The old "not frozen" put back: still a valid tag, an older epoch.
        s.put(Tree::State, KEY, &lifted).unwrap();
        assert_eq!(replica.judge(read(&s, &k).unwrap()), None);
        // The next change by an instance that saw the freeze goes past both.
        let seen = Seen::default();
        seen.judge(Stored::Signed {
            epoch: replica.epoch(),
            frozen: true,
        });
        let epoch = write(&s, &k, &seen, false).unwrap();
        assert_eq!(epoch, replica.epoch() + 1);
        assert_eq!(replica.judge(read(&s, &k).unwrap()), Some(false));
    }

    #[test]
    fn an_unsigned_record_of_the_earlier_form_is_signed_at_start_unless_it_freezes() {
        let (_d, s) = store();
        let k = key(1);
        s.put(Tree::State, KEY, b"0").unwrap();
        let seen = Seen::default();
        assert!(!at_start(&s, &k, &seen).unwrap());
        assert_eq!(
            read(&s, &k).unwrap(),
            Stored::Signed {
                epoch: 1,
                frozen: false
            }
        );
        // From then on the unsigned "not frozen" is refused.
        s.put(Tree::State, KEY, b"0").unwrap();
        assert_eq!(seen.judge(read(&s, &k).unwrap()), Some(true));
        // An unsigned freeze stays as it is (replicas of the earlier
        // release read it too), and freezes.
        let (_d, s) = store();
        s.put(Tree::State, KEY, b"1").unwrap();
        assert!(at_start(&s, &k, &Seen::default()).unwrap());
        assert_eq!(read(&s, &k).unwrap(), Stored::Unsigned(true));
        // A fresh store: no record, not frozen, nothing written.
        let (_d, s) = store();
        assert!(!at_start(&s, &k, &Seen::default()).unwrap());
        assert_eq!(read(&s, &k).unwrap(), Stored::Absent);
    }
}
