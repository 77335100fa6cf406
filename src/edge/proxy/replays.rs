//! The proxy's record of the proofs it accepted, written to a store that
//! no other instance shares (sled) in batches, off the call path.
//!
//! Why a batch is enough there (docs/PROXY.md, "A crash and the replay
//! check"): each proxy address's verifier keeps every proof it accepted in
//! memory for as long as the proof could pass its `iat` check, and refuses
//! a second use ([`crate::base::dpop::Validator`]); the verifiers live as long as
//! the process. So the store's entry only matters to a later process, after
//! a restart. A proof the earlier process accepted can pass the `iat` check
//! at most [`crate::base::dpop::MAX_JTI_LIFETIME`] seconds after it was accepted,
//! so for that long after its start the proxy writes and checks each entry
//! on the call, as before ([`Proxy::first_use`](super::Proxy)); after that
//! it queues them here. A thread writes the queue every [`INTERVAL`] and
//! makes it durable ([`Store::sync`]); a clean stop writes what is left
//! ([`Batched::close`]). A crash loses at most the last interval's entries.
//!
//! A store shared by replicas (PostgreSQL) is never batched: the entry is
//! how the other instances refuse the proof.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::infra::store::{Store, StoreError, Tree};

/// How often the queue is written.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// Queued entries beyond this are written on the call (a store that has
/// stopped keeping up must not grow the queue without bound).
const MAX_QUEUED: usize = 100_000;

/// The queue of replay entries not yet written (see the module doc).
#[derive(Debug)]
pub(crate) struct Batched {
    store: Arc<dyn Store>,
    /// The entries' lifetime in the store.
    ttl: Duration,
    /// Store keys to write; `None` once closed.
    queued: Mutex<Option<Vec<String>>>,
    /// The last write failed: calls write their own entries (and are
    /// refused while the store fails) until a batch is written again.
    failing: AtomicBool,
    /// Held while a batch is written: a close waits for the writer's batch
    /// in flight, so that a clean stop loses none.
    writing: Mutex<()>,
}

impl Batched {
    /// A queue for `store`, and its writer thread (which ends when the
    /// queue is dropped or closed). `None` when the thread cannot be
    /// started: every entry is then written on its call.
    pub(crate) fn start(store: Arc<dyn Store>, ttl: Duration) -> Option<Arc<Batched>> {
        let batched = Arc::new(Batched {
            store,
            ttl,
            queued: Mutex::new(Some(Vec::new())),
            failing: AtomicBool::new(false),
            writing: Mutex::new(()),
        });
        let weak: Weak<Batched> = Arc::downgrade(&batched);
        let started = std::thread::Builder::new()
            .name("proxy-replays".into())
            .spawn(move || {
                // Said once when writes start failing and once when they
                // work again, not every interval.
                let mut failing = false;
                loop {
                    std::thread::sleep(INTERVAL);
                    let Some(b) = weak.upgrade() else { return };
                    match b.write() {
                        Ok(None) => return,
                        Ok(Some(n)) if failing && n > 0 => {
                            failing = false;
                            tracing::info!("the proxy's replay entries are written again");
                        }
                        Ok(Some(_)) => {}
                        Err(e) if !failing => {
                            failing = true;
                            tracing::error!(error = %e, "writing the proxy's replay entries failed; proxied calls write their own until the store answers");
                        }
                        Err(_) => {}
                    }
                }
            });
        match started {
            Ok(_) => Some(batched),
            Err(e) => {
                tracing::warn!(error = %e, "the proxy's replay writer could not be started; each call writes its own entry");
                None
            }
        }
    }

    /// Queues `key`, or gives it back when the caller must write it itself:
    /// the queue is closed or full, or its last write failed.
    pub(crate) fn queue(&self, key: String) -> Result<(), String> {
        if self.failing.load(Ordering::Acquire) {
            return Err(key);
        }
        let mut q = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        match q.as_mut() {
            Some(v) if v.len() < MAX_QUEUED => {
                v.push(key);
                Ok(())
            }
            _ => Err(key),
        }
    }

    /// Writes what is queued and makes it durable; gives how many entries
    /// it wrote, `None` once the queue is closed. A failed write puts its
    /// batch back in front, and only a batch written clears the failure
    /// (the queue is never empty after one).
    pub(crate) fn write(&self) -> Result<Option<usize>, StoreError> {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = {
            let mut q = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            match q.as_mut() {
                Some(v) => std::mem::take(v),
                None => return Ok(None),
            }
        };
        if batch.is_empty() {
            return Ok(Some(0));
        }
        if let Err(e) = self.write_batch(&batch) {
            self.failing.store(true, Ordering::Release);
            let mut q = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(v) = q.as_mut() {
                let newer = std::mem::replace(v, batch);
                v.extend(newer);
            }
            return Err(e);
        }
        self.failing.store(false, Ordering::Release);
        Ok(Some(batch.len()))
    }

    fn write_batch(&self, batch: &[String]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        for key in batch {
            // `false` (a live entry already there) cannot be a proof used
            // twice in this process: its verifier refused that before.
            self.store
                .insert_expiring_unsynced(Tree::Replay, key.as_bytes(), b"1", self.ttl)?;
        }
        self.store.sync()
    }

    /// Writes what is left and closes the queue (a clean stop): later
    /// calls write their own entries.
    pub(crate) fn close(&self) {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = self
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_default();
        if let Err(e) = self.write_batch(&batch) {
            tracing::error!(error = %e, entries = batch.len(), "the proxy's last replay entries could not be written at the stop");
        }
    }
}

#[cfg(test)]
mod tests {
    // reason: test code, where a panic is the failure report.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::sync::atomic::AtomicBool;

    use crate::base::clock::Clock;
    use crate::base::dpop::{DpopError, ValidProof};
    use crate::edge::proxy::{replay_key, Proxy, Refusal, REPLAY_WINDOW_SECS};
    use crate::verify::VerifyError;

    fn sled(dir: &std::path::Path) -> Arc<dyn Store> {
        Arc::new(crate::infra::store::SledStore::open(dir).unwrap())
    }

    fn live(store: &dyn Store, key: &str) -> bool {
        store
            .get_expiring(Tree::Replay, key.as_bytes())
            .unwrap()
            .is_some()
    }

    #[test]
    fn the_writer_writes_queued_entries_and_a_close_writes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = sled(dir.path());
        let b = Batched::start(store.clone(), Duration::from_secs(130)).unwrap();
        b.queue("first".into()).unwrap();
        // The writer thread, not this test, writes it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !live(&*store, "first") {
            assert!(
                std::time::Instant::now() < deadline,
                "a queued entry was not written by the writer within 5 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Negative control for what follows: an entry never queued is not there.
        assert!(!live(&*store, "never"));
        b.queue("last".into()).unwrap();
        b.close();
        assert!(live(&*store, "last"), "close must write what is queued");
        // Closed: the caller writes its own entry.
        assert_eq!(b.queue("after".into()), Err("after".to_string()));
        assert_eq!(
            b.write().unwrap(),
            None,
            "a closed queue writes nothing more"
        );
    }

    #[test]
    fn a_failed_write_keeps_its_entries_and_sends_calls_to_write_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let inner = sled(dir.path());
        let full = Arc::new(AtomicBool::new(true));
        let f = full.clone();
        let store: Arc<dyn Store> =
            Arc::new(crate::infra::store::Hooked::new(inner.clone(), move |_| {
                if f.load(Ordering::SeqCst) {
                    Err(StoreError::Backend("no space left on device".into()))
                } else {
                    Ok(())
                }
            }));
        // No writer thread here: the test writes.
        let b = Batched {
            store,
            ttl: Duration::from_secs(130),
            queued: Mutex::new(Some(Vec::new())),
            failing: AtomicBool::new(false),
            writing: Mutex::new(()),
        };
        b.queue("a".into()).unwrap();
        assert!(b.write().is_err());
        assert!(!live(&*inner, "a"));
        // While the store fails, a call writes its own entry (and is refused
        // when that fails too), however often the writer comes round.
        assert_eq!(b.queue("b".into()), Err("b".to_string()));
        assert!(b.write().is_err());
        assert_eq!(b.queue("b".into()), Err("b".to_string()));
        // Positive control: the store answers again; the kept entry is
        // written, and calls queue again.
        full.store(false, Ordering::SeqCst);
        assert_eq!(b.write().unwrap(), Some(1));
        assert!(live(&*inner, "a"), "a failed batch must be written later");
        b.queue("c".into()).unwrap();
        assert_eq!(b.write().unwrap(), Some(1));
        assert!(live(&*inner, "c"));
    }

    /// A broker on a sled store in `d`, on `clock`.
    async fn broker(
        d: &std::path::Path,
        clock: Arc<crate::base::clock::ManualClock>,
    ) -> Arc<crate::derive::exchange::Broker> {
        let (_, config) = crate::infra::config::test_instance(d, "agent = \"repo-helper\"\n", "");
        crate::app::build(config, clock)
            .await
            .unwrap()
            .broker
            .clone()
    }

    fn is_replay(r: Result<(), Refusal>) -> bool {
        matches!(
            r,
            Err(Refusal::Token(VerifyError::Proof(DpopError::Replay)))
        )
    }

    #[tokio::test]
    async fn entries_are_written_on_the_call_until_no_earlier_proof_can_pass_then_queued() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::base::clock::ManualClock::new(1_800_000_000);
        let broker = broker(dir.path(), clock.clone()).await;
        let store = broker.store.clone();
        let proof = |jti: &str| ValidProof {
            jkt: "K".into(),
            iat: clock.now(),
            jti: jti.into(),
            nonce: None,
        };
        let client = crate::edge::proxy::upstream_client(&broker.config.proxy).unwrap();
        let proxy = Proxy::new(broker.clone(), client.clone());

        // Just started: a proof of an earlier process could still pass, so
        // the entry is checked and written on the call.
        proxy.first_use(proof("a"), "K").unwrap();
        assert!(live(&*store, &replay_key("a", "K")));
        assert!(is_replay(proxy.first_use(proof("a"), "K")));
        clock.advance(REPLAY_WINDOW_SECS - 1);
        proxy.first_use(proof("b"), "K").unwrap();
        assert!(live(&*store, &replay_key("b", "K")));
        assert!(is_replay(proxy.first_use(proof("b"), "K")));

        // Then queued: the store is not asked (in this process the proof's
        // verifier refuses a second use, before this check), so a second
        // call here passes this step.
        clock.advance(1);
        proxy.first_use(proof("c"), "K").unwrap();
        proxy.first_use(proof("c"), "K").unwrap();

        // A clean stop writes the queue; the next process, just started,
        // refuses the proof from the store...
        proxy.close_replays();
        assert!(live(&*store, &replay_key("c", "K")));
        let restarted = Proxy::new(broker.clone(), client);
        assert!(is_replay(restarted.first_use(proof("c"), "K")));
        // ...and accepts a fresh one (positive control).
        restarted.first_use(proof("d"), "K").unwrap();
        // After the stop, the closed queue sends calls the synchronous way.
        clock.advance(REPLAY_WINDOW_SECS);
        proxy.first_use(proof("e"), "K").unwrap();
        assert!(live(&*store, &replay_key("e", "K")));
        assert!(is_replay(proxy.first_use(proof("e"), "K")));
    }
}
