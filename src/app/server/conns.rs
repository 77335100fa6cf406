//! The live connections of one Unix listener and their cap: admitting a
//! connection, shedding an idle one to make room, and marking the ones
//! with a request in flight (docs/ARCHITECTURE.md, "Connections").

use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The live connections of one Unix listener, so that at the cap an idle
/// one can be closed to make room (docs/ARCHITECTURE.md, "Connections").
#[derive(Default)]
pub(super) struct Conns {
    inner: std::sync::Mutex<ConnsInner>,
}

#[derive(Default)]
struct ConnsInner {
    next_id: u64,
    live: std::collections::HashMap<u64, ConnEntry>,
}

struct ConnEntry {
    uid: u32,
    /// Requests in the handler right now; 0 means idle (waiting for a
    /// request's head, or between keep-alive requests).
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Told to close after the request in flight (if any).
    shed: Arc<tokio::sync::Notify>,
}

/// Why a connection could not be admitted.
pub(super) enum Admit {
    /// Admitted, possibly after shedding an idle connection.
    Yes { conn: Admitted, shed_one: bool },
    /// Every slot holds a request in flight.
    Full,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnsInner> {
        // A panic while holding this lock leaves only counters behind.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `uid`. At the cap, the oldest idle
    /// connection of the uid holding the most connections is told to close
    /// first: a flood of idle connections then sheds its own, whichever uid
    /// it comes from, and a connection with a request in flight is never
    /// closed under it.
    pub(super) fn admit(&self, uid: u32, cap: usize) -> Admit {
        let mut g = self.lock();
        let mut shed_one = false;
        if g.live.len() >= cap {
            let mut per_uid: std::collections::HashMap<u32, usize> = Default::default();
            for e in g.live.values() {
                *per_uid.entry(e.uid).or_default() += 1;
            }
            let victim = g
                .live
                .iter()
                .filter(|(_, e)| e.in_flight.load(Ordering::SeqCst) == 0)
                .max_by_key(|(id, e)| (per_uid.get(&e.uid).copied(), std::cmp::Reverse(**id)))
                .map(|(id, _)| *id);
            match victim.and_then(|id| g.live.remove(&id)) {
                Some(v) => {
                    v.shed.notify_one();
                    shed_one = true;
                }
                None => return Admit::Full,
            }
        }
        let id = g.next_id;
        g.next_id += 1;
        let shed = Arc::new(tokio::sync::Notify::new());
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        g.live.insert(
            id,
            ConnEntry {
                uid,
                in_flight: in_flight.clone(),
                shed: shed.clone(),
            },
        );
        Admit::Yes {
            conn: Admitted {
                id,
                shed,
                in_flight,
            },
            shed_one,
        }
    }

    pub(super) fn remove(&self, id: u64) {
        self.lock().live.remove(&id);
    }

    pub(super) fn len(&self) -> usize {
        self.lock().live.len()
    }
}

/// Marks a connection busy while a request is in the handler (also when
/// the request future is dropped).
pub(super) struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    pub(super) fn new(n: Arc<std::sync::atomic::AtomicUsize>) -> InFlight {
        n.fetch_add(1, Ordering::SeqCst);
        InFlight(n)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's slot in [`Conns`].
pub(super) struct Admitted {
    pub(super) id: u64,
    pub(super) shed: Arc<tokio::sync::Notify>,
    pub(super) in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

#[cfg(test)]
mod tests {
    use super::{Admit, Admitted, Conns};
    use std::sync::atomic::Ordering;

    fn id(a: Admit) -> u64 {
        match a {
            Admit::Yes { conn, .. } => conn.id,
            Admit::Full => panic!("refused"),
        }
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_of_the_busiest_uid_is_shed() {
        let c = Conns::default();
        let other = id(c.admit(2, 4)); // the other uid's idle connection, oldest of all
        let busy = c.admit(1, 4);
        let Admit::Yes {
            conn: Admitted { in_flight, .. },
            ..
        } = &busy
        else {
            panic!("refused")
        };
        in_flight.fetch_add(1, Ordering::SeqCst); // a request in the handler
        let busy = id(busy);
        let idle = id(c.admit(1, 4));
        id(c.admit(1, 4));
        // Full: uid 1 holds 3; its oldest idle one goes, not the other uid's
        // (older) one, nor the one with a request in flight.
        id(c.admit(1, 4));
        let live = |i| c.lock().live.contains_key(&i);
        assert!(!live(idle) && live(other) && live(busy));
        // Positive control: when every slot is in flight, a new one is refused.
        for e in c.lock().live.values() {
            e.in_flight.store(1, Ordering::SeqCst);
        }
        assert!(matches!(c.admit(1, 4), Admit::Full));
    }
}
