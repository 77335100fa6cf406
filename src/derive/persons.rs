//! The person-level stop (`credbroker persons revoke|restore|list`, and the
//! Shared Signals receiver): a person's derives and proxied calls refused
//! from the moment it is stored, on every replica.
//!
//! **The record.** One per person in [`Tree::PersonStops`], keyed by
//! `tuple_key([iss, sub])`, its value a JSON [`Stop`]. A second stop for a
//! stopped person merges into the first ([`Stop::merge`]): the later
//! revocation time, and restore-only if either was.
//!
//! **Watched as the freeze is.** Every instance holds the list in memory
//! ([`Stops`]); a derive and a proxied call read only that (no store call
//! on the `self` path). It is re-read when the store's `person_stops` tree
//! moves (PostgreSQL LISTEN/NOTIFY, `app::housekeeping::watch_store`) and
//! polled every half of `revocation.watch_bound` as the backstop. An
//! instance on a shared store that has not read the list for longer than
//! the bound reports its watch down ([`Stops::watch_up`]) and, unless
//! `revocation.watch_failure = "serve"`, refuses every derive and proxied
//! call (`revocation_watch_down`).
//!
//! **Lifting.** A stop of the [`Lift::SignIn`] kind (an IdP's revoked
//! session) lets through a subject token whose `auth_time` is later than
//! the revocation time plus `revocation.restore_skew`; a token without
//! `auth_time` never passes, and `iat` counts for nothing (a refreshed token
//! has a fresh one). The first such token marks the stop lifted
//! (`person.restored`, source `sign_in`); the record stays, so the tokens
//! of the revoked session are still refused, until [`stop_retention`]
//! after the stop was received (the longest subject token accepted, plus
//! margins). A [`Lift::Restore`] stop (manual, account disabled,
//! credential compromised) holds until `persons restore`.
//!
//! **Tokens credbroker minted.** A proxied call's token names the person
//! and its `iat`: refused under a restore-only stop; under a sign-in stop
//! refused unless the stop was lifted and the token minted at or after the
//! lift (a derive racing the stop cannot mint a token that outlives it).
//!
//! Left to a writer to the store: a stop can be deleted by anyone who can
//! write the store, as any record can (the freeze record is signed; a stop
//! list whose deletion is detectable would need a signed index, not built).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::accounts::subject::{self, Person};
use crate::infra::config::{RevocationConfig, WatchFailure};
use crate::infra::store::{split_tuple_key, tuple_key, Store, StoreError, Tree};

/// How long (seconds) a sign-in stop is kept after it was received: until
/// every subject token of the session it stopped has expired. Such a token
/// was issued before the receipt, by the issuer's clock, which may run
/// ahead of the store's by up to `restore_skew` (the allowance a new
/// sign-in must clear too); it lives at most `max_subject_token_lifetime`
/// (longer ones are refused: `accounts::subject`); it is accepted until
/// [`subject::SKEW`] past its `exp`. Plus the caches: a verified token is
/// cached at most [`subject::CACHE_TTL`] (never past its `exp`) and an
/// issuer's key set is refetched at most once a minute, so neither keeps
/// a token longer; the term is a margin, which also covers this
/// instance's clock against the store's (`clock.max_skew`, at most 5 s).
/// A restore-only stop is kept until restored. The one place the
/// retention is computed.
pub(crate) fn stop_retention(cfg: &RevocationConfig) -> i64 {
    let secs = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    secs(cfg.max_subject_token_lifetime)
        .saturating_add(secs(cfg.restore_skew))
        .saturating_add(subject::SKEW)
        .saturating_add(subject::CACHE_TTL)
}

/// Ends a person's page sessions; returns how many (the pages' function,
/// handed down by the composition root).
pub(crate) type EndSessions = fn(&dyn Store, &Person) -> Result<usize, StoreError>;

/// How a stop is lifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Lift {
    /// By a subject token whose `auth_time` is later than the revocation
    /// time plus `revocation.restore_skew` (a new sign-in), or by `persons
    /// restore`. CAEP `session-revoked`, `credential-change`,
    /// `token-claims-change`.
    SignIn,
    /// Only by `persons restore`: a manual stop, RISC `account-disabled`,
    /// `credential-compromise`, `account-purged`.
    Restore,
}

/// What stopped the person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Source {
    /// An operator (`credbroker persons revoke`, the admin socket).
    Manual,
    /// A Security Event Token from a Shared Signals transmitter.
    Ssf,
}

impl Source {
    /// The name in events and answers.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Manual => "manual",
            Source::Ssf => "ssf",
        }
    }
}

/// One stop as the store keeps it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stop {
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject at that issuer.
    pub person_sub: String,
    /// Why: the operator's `--reason`, or the SET's event type.
    pub reason: String,
    /// What stopped the person.
    pub source: Source,
    /// The SET's event type URI, for a stop from Shared Signals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssf_event_type: Option<String>,
    /// The event time the SET states, as recorded (Unix time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<i64>,
    /// When the stop was received, by the store's clock (Unix time).
    pub received_at: i64,
    /// The revocation time: the receipt time, narrowed by the event time
    /// to no earlier than receipt minus `revocation.max_event_age`.
    pub revocation_time: i64,
    /// How it is lifted.
    pub lift: Lift,
    /// Whether the person's accounts were to be revoked at the providers.
    pub revoke_at_providers: bool,
    /// For a [`Lift::SignIn`] stop: when a new sign-in lifted it (the
    /// derive's time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifted_at: Option<i64>,
}

/// What asks for a stop (the operator's command, or a SET).
#[derive(Debug, Clone)]
pub(crate) struct StopRequest {
    /// Who.
    pub person: Person,
    /// Why (the operator's `--reason`; for a SET its event type).
    pub reason: String,
    /// What asks.
    pub source: Source,
    /// The SET's event type URI.
    pub ssf_event_type: Option<String>,
    /// The event time the SET states (Unix time).
    pub event_time: Option<i64>,
    /// How the stop is lifted.
    pub lift: Lift,
    /// Revoke the person's accounts at their providers too.
    pub revoke_at_providers: bool,
}

impl StopRequest {
    /// The operator's stop (`credbroker persons revoke`, the admin
    /// socket's `POST /persons/revoke`): reason `manual` unless given,
    /// lifted only by `persons restore`.
    pub(crate) fn manual(
        person: Person,
        reason: Option<String>,
        revoke_at_providers: bool,
    ) -> StopRequest {
        StopRequest {
            person,
            reason: reason.unwrap_or_else(|| "manual".into()),
            source: Source::Manual,
            ssf_event_type: None,
            event_time: None,
            lift: Lift::Restore,
            revoke_at_providers,
        }
    }
}

impl Stop {
    /// The stop `req` asks for, received at `received_at` (the store's
    /// clock): the revocation time is the receipt time, narrowed by the
    /// event time to within [receipt - `max_event_age`, receipt].
    pub(crate) fn new(req: &StopRequest, received_at: i64, max_event_age: i64) -> Stop {
        let revocation_time = match req.event_time {
            Some(t) => t.clamp(received_at.saturating_sub(max_event_age), received_at),
            None => received_at,
        };
        Stop {
            person_iss: req.person.iss.clone(),
            person_sub: req.person.sub.clone(),
            reason: req.reason.clone(),
            source: req.source,
            ssf_event_type: req.ssf_event_type.clone(),
            event_time: req.event_time,
            received_at,
            revocation_time,
            lift: req.lift,
            revoke_at_providers: req.revoke_at_providers,
            lifted_at: None,
        }
    }

    /// The person.
    pub(crate) fn person(&self) -> Person {
        Person {
            iss: self.person_iss.clone(),
            sub: self.person_sub.clone(),
        }
    }

    /// `self` with a later stop `new` of the same person merged in: the
    /// later revocation time, restore-only if either is, the new reason,
    /// source and event, and not lifted (a new stop undoes a lift).
    pub(crate) fn merge(&self, new: &Stop) -> Stop {
        let mut m = new.clone();
        m.revocation_time = self.revocation_time.max(new.revocation_time);
        m.received_at = self.received_at.max(new.received_at);
        if self.lift == Lift::Restore {
            m.lift = Lift::Restore;
        }
        m.revoke_at_providers = self.revoke_at_providers || new.revoke_at_providers;
        m.lifted_at = None;
        m
    }

    /// Whether the record may be deleted at `now`: a sign-in stop more
    /// than `retention` ([`stop_retention`]) after its receipt. A
    /// restore-only stop never is.
    pub(crate) fn expired(&self, now: i64, retention: i64) -> bool {
        self.lift == Lift::SignIn && now > self.received_at.saturating_add(retention)
    }

    /// Whether a subject token with `auth_time` passes this stop
    /// (`restore_skew` in seconds).
    pub(crate) fn lifted_by(&self, auth_time: Option<i64>, restore_skew: i64) -> bool {
        self.lift == Lift::SignIn
            && auth_time.is_some_and(|t| t > self.revocation_time.saturating_add(restore_skew))
    }

    /// Whether a token credbroker minted at `iat` for this person passes.
    pub(crate) fn passes_minted(&self, iat: i64) -> bool {
        self.lift == Lift::SignIn && self.lifted_at.is_some_and(|l| iat >= l)
    }
}

fn key(person: &Person) -> Vec<u8> {
    tuple_key(&[&person.iss, &person.sub])
}

/// A stored value as a stop. A value that does not parse is read as a
/// restore-only stop of the person its key names (fail closed), and logged.
fn parse(k: &[u8], raw: &[u8]) -> Stop {
    if let Ok(s) = serde_json::from_slice::<Stop>(raw) {
        return s;
    }
    let parts = split_tuple_key(k).unwrap_or_default();
    tracing::error!(
        "a person stop record in the store does not parse; the person stays stopped until `credbroker persons restore`"
    );
    Stop {
        person_iss: parts.first().cloned().unwrap_or_default(),
        person_sub: parts.get(1).cloned().unwrap_or_default(),
        reason: "unreadable_record".into(),
        source: Source::Manual,
        ssf_event_type: None,
        event_time: None,
        received_at: 0,
        revocation_time: 0,
        lift: Lift::Restore,
        revoke_at_providers: false,
        lifted_at: None,
    }
}

/// Every stop in the store.
pub(crate) fn read_all(store: &dyn Store) -> Result<Vec<Stop>, StoreError> {
    Ok(store
        .scan_prefix(Tree::PersonStops, b"")?
        .into_iter()
        .map(|(k, v)| parse(&k, &v))
        .collect())
}

/// Stores `stop`, merged into the person's stop if there is one, by
/// compare-and-swap; returns what is stored now.
pub(crate) fn write(store: &dyn Store, stop: &Stop) -> Result<Stop, StoreError> {
    let k = key(&stop.person());
    loop {
        let current = store.get(Tree::PersonStops, &k)?;
        let next = match &current {
            Some(raw) => parse(&k, raw).merge(stop),
            None => stop.clone(),
        };
        let value = serde_json::to_vec(&next).map_err(|e| StoreError::Backend(e.to_string()))?;
        if store.compare_and_swap(Tree::PersonStops, &k, current.as_deref(), Some(&value))? {
            return Ok(next);
        }
    }
}

/// Deletes the person's stop; returns it (`None`: there was none).
pub(crate) fn remove(store: &dyn Store, person: &Person) -> Result<Option<Stop>, StoreError> {
    let k = key(person);
    loop {
        let Some(current) = store.get(Tree::PersonStops, &k)? else {
            return Ok(None);
        };
        if store.compare_and_swap(Tree::PersonStops, &k, Some(&current), None)? {
            return Ok(Some(parse(&k, &current)));
        }
    }
}

/// Marks the person's sign-in stop lifted at `at`, if it is still the one
/// with `revocation_time` and not lifted yet; returns whether it wrote.
pub(crate) fn mark_lifted(
    store: &dyn Store,
    person: &Person,
    revocation_time: i64,
    at: i64,
) -> Result<bool, StoreError> {
    let k = key(person);
    loop {
        let Some(current) = store.get(Tree::PersonStops, &k)? else {
            return Ok(false);
        };
        let mut stop = parse(&k, &current);
        if stop.lift != Lift::SignIn
            || stop.revocation_time != revocation_time
            || stop.lifted_at.is_some()
        {
            return Ok(false);
        }
        stop.lifted_at = Some(at);
        let value = serde_json::to_vec(&stop).map_err(|e| StoreError::Backend(e.to_string()))?;
        if store.compare_and_swap(Tree::PersonStops, &k, Some(&current), Some(&value))? {
            return Ok(true);
        }
    }
}

/// Deletes the sign-in stops past their `retention` ([`stop_retention`])
/// at `now`; returns how many.
pub(crate) fn sweep(store: &dyn Store, now: i64, retention: i64) -> Result<usize, StoreError> {
    let mut n = 0;
    for (k, v) in store.scan_prefix(Tree::PersonStops, b"")? {
        if parse(&k, &v).expired(now, retention)
            && store.compare_and_swap(Tree::PersonStops, &k, Some(&v), None)?
        {
            n += 1;
        }
    }
    Ok(n)
}

/// Why a derive or a proxied call is refused by the stop list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The person is stopped (`person_revoked`).
    Revoked,
    /// This instance has not read the stop list within the bound and
    /// `revocation.watch_failure` is `refuse` (`revocation_watch_down`).
    WatchDown,
}

/// A derive the stop list lets through because a new sign-in lifts a
/// sign-in stop: the caller marks the stop lifted ([`mark_lifted`]) and
/// records `person.restored`, off the derive's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lifting {
    /// The stop being lifted.
    pub stop: Stop,
}

type Key = (String, String);

/// The stop list as one running instance holds it.
#[derive(Debug)]
pub(crate) struct Stops {
    list: ArcSwap<HashMap<Key, Stop>>,
    /// Moves each time the list read changes (in-flight streams watch it).
    changed: tokio::sync::watch::Sender<u64>,
    /// Milliseconds since `origin` of the last successful read.
    synced_ms: AtomicI64,
    origin: Instant,
    /// Whether other instances share the store (a watch that can be down).
    shared: bool,
    /// Whether the watch was last reported up (for the log, said once).
    reported_up: AtomicBool,
    cfg: RevocationConfig,
}

impl Stops {
    /// The list at an instance's start; a store that does not answer leaves
    /// it empty and unsynced (the watch is down until a read succeeds).
    pub(crate) fn at_start(store: &dyn Store, cfg: RevocationConfig) -> Stops {
        let stops = Stops {
            list: ArcSwap::from_pointee(HashMap::new()),
            changed: tokio::sync::watch::channel(0).0,
            synced_ms: AtomicI64::new(i64::MIN),
            origin: Instant::now(),
            shared: store.is_shared(),
            reported_up: AtomicBool::new(true),
            cfg,
        };
        if let Err(e) = stops.reload(store) {
            tracing::error!(error = %e, "reading the person stop list at start failed");
        }
        stops
    }

    /// The configuration it follows.
    pub(crate) fn config(&self) -> &RevocationConfig {
        &self.cfg
    }

    /// Re-reads the list from the store (a change notified, the poll, or a
    /// change made here); returns the persons stopped since the last read
    /// (new, or stopped again), whose in-memory caches the caller drops.
    pub(crate) fn reload(&self, store: &dyn Store) -> Result<Vec<Person>, StoreError> {
        let all = read_all(store)?;
        let next: HashMap<Key, Stop> = all
            .into_iter()
            .map(|s| ((s.person_iss.clone(), s.person_sub.clone()), s))
            .collect();
        let old = self.list.load();
        let fresh: Vec<Person> = next
            .iter()
            .filter(|(k, s)| {
                old.get(*k)
                    .is_none_or(|o| o.revocation_time != s.revocation_time || o.lift != s.lift)
            })
            .map(|(_, s)| s.person())
            .collect();
        let differs = **old != next;
        self.list.store(Arc::new(next));
        self.synced_ms
            .store(self.origin.elapsed().as_millis() as i64, Ordering::SeqCst);
        if differs {
            self.changed.send_modify(|c| *c = c.wrapping_add(1));
        }
        if !self.reported_up.swap(true, Ordering::SeqCst) {
            tracing::warn!("the person stop list is read again: the revocation watch is up");
        }
        Ok(fresh)
    }

    /// Applies a stop written here at once (before any notification).
    pub(crate) fn apply(&self, stop: Stop) {
        let mut next = (**self.list.load()).clone();
        next.insert((stop.person_iss.clone(), stop.person_sub.clone()), stop);
        self.list.store(Arc::new(next));
        self.changed.send_modify(|c| *c = c.wrapping_add(1));
    }

    /// Forgets a stop removed here at once.
    pub(crate) fn forget(&self, person: &Person) {
        let mut next = (**self.list.load()).clone();
        next.remove(&(person.iss.clone(), person.sub.clone()));
        self.list.store(Arc::new(next));
        self.changed.send_modify(|c| *c = c.wrapping_add(1));
    }

    /// The person's stop, if any.
    #[cfg(test)]
    pub(crate) fn get(&self, person: &Person) -> Option<Stop> {
        self.list
            .load()
            .get(&(person.iss.clone(), person.sub.clone()))
            .cloned()
    }

    /// How many stops are held.
    pub(crate) fn len(&self) -> usize {
        self.list.load().len()
    }

    /// A receiver that moves when the list changes.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// How long ago the list was last read (`None`: never).
    pub(crate) fn since_sync(&self) -> Option<std::time::Duration> {
        let at = self.synced_ms.load(Ordering::SeqCst);
        (at != i64::MIN).then(|| {
            let now = self.origin.elapsed().as_millis() as i64;
            std::time::Duration::from_millis(now.saturating_sub(at).max(0) as u64)
        })
    }

    /// Whether the list is current within the bound: always on a store no
    /// one else writes (sled), else read within `watch_bound`.
    pub(crate) fn watch_up(&self) -> bool {
        if !self.shared {
            return true;
        }
        let up = self.since_sync().is_some_and(|d| d <= self.cfg.watch_bound);
        if !up && self.reported_up.swap(false, Ordering::SeqCst) {
            tracing::error!(
                bound_ms = self.cfg.watch_bound.as_millis() as u64,
                serving = self.cfg.watch_failure == WatchFailure::Serve,
                "the person stop list has not been read within revocation.watch_bound: a stop made on another replica may not be applied here"
            );
        }
        up
    }

    /// The watch check every derive and proxied call makes first.
    pub(crate) fn check_watch(&self) -> Result<(), Refused> {
        if self.cfg.watch_failure == WatchFailure::Refuse && !self.watch_up() {
            return Err(Refused::WatchDown);
        }
        Ok(())
    }

    /// The derive's check for `person` whose subject token has `auth_time`:
    /// `Ok(None)` not stopped, `Ok(Some(_))` a sign-in stop this token
    /// lifts (not lifted yet here), `Err` refused.
    pub(crate) fn check_derive(
        &self,
        person: &Person,
        auth_time: Option<i64>,
    ) -> Result<Option<Lifting>, Refused> {
        self.check_watch()?;
        let list = self.list.load();
        let Some(stop) = list.get(&(person.iss.clone(), person.sub.clone())) else {
            return Ok(None);
        };
        let skew = self.cfg.restore_skew.as_secs() as i64;
        if !stop.lifted_by(auth_time, skew) {
            return Err(Refused::Revoked);
        }
        Ok(stop
            .lifted_at
            .is_none()
            .then(|| Lifting { stop: stop.clone() }))
    }

    /// The proxy's check of a token credbroker minted at `iat` for
    /// `person`.
    pub(crate) fn check_minted(&self, person: &Person, iat: i64) -> Result<(), Refused> {
        self.check_watch()?;
        match self
            .list
            .load()
            .get(&(person.iss.clone(), person.sub.clone()))
        {
            Some(stop) if !stop.passes_minted(iat) => Err(Refused::Revoked),
            _ => Ok(()),
        }
    }

    /// Whether `person`'s connect and approval links are closed: stopped,
    /// and not by a sign-in stop already lifted.
    pub(crate) fn blocks_links(&self, person: &Person) -> bool {
        self.list
            .load()
            .get(&(person.iss.clone(), person.sub.clone()))
            .is_some_and(|s| !(s.lift == Lift::SignIn && s.lifted_at.is_some()))
    }

    /// Marks a stop lifted here (the caller writes it to the store).
    pub(crate) fn note_lifted(&self, person: &Person, revocation_time: i64, at: i64) {
        let list = self.list.load();
        let k = (person.iss.clone(), person.sub.clone());
        if let Some(s) = list.get(&k) {
            if s.revocation_time == revocation_time && s.lifted_at.is_none() {
                let mut next = (**list).clone();
                if let Some(s) = next.get_mut(&k) {
                    s.lifted_at = Some(at);
                }
                self.list.store(Arc::new(next));
                self.changed.send_modify(|c| *c = c.wrapping_add(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::store::SledStore;

    fn person(sub: &str) -> Person {
        Person {
            iss: "https://idp.example".into(),
            sub: sub.into(),
        }
    }

    fn request(sub: &str, lift: Lift, event_time: Option<i64>) -> StopRequest {
        StopRequest {
            person: person(sub),
            reason: "test".into(),
            source: Source::Ssf,
            ssf_event_type: None,
            event_time,
            lift,
            revoke_at_providers: false,
        }
    }

    fn store() -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(&dir.path().join("data")).unwrap();
        (dir, s)
    }

    #[test]
    fn the_revocation_time_is_the_receipt_narrowed_by_the_event_time_within_the_maximum_age() {
        let r = |t| Stop::new(&request("a", Lift::SignIn, t), 10_000, 600).revocation_time;
        assert_eq!(r(None), 10_000);
        assert_eq!(r(Some(9_900)), 9_900);
        // Older than the maximum age: no earlier than receipt - age.
        assert_eq!(r(Some(1)), 9_400);
        // In the future: no later than the receipt.
        assert_eq!(r(Some(20_000)), 10_000);
    }

    #[test]
    fn a_sign_in_stop_is_lifted_only_by_a_later_auth_time_and_a_restore_stop_never() {
        let (_d, s) = store();
        let stops = Stops::at_start(&s, RevocationConfig::default());
        let alice = person("alice");
        let bob = person("bob");
        let stop = write(
            &s,
            &Stop::new(&request("alice", Lift::SignIn, None), 1_000, 600),
        )
        .unwrap();
        stops.reload(&s).unwrap();
        // No auth_time, an old one, one within the skew: refused.
        for t in [None, Some(900), Some(1_000), Some(1_030)] {
            assert_eq!(
                stops.check_derive(&alice, t),
                Err(Refused::Revoked),
                "{t:?}"
            );
        }
        // Control: Bob is not stopped.
        assert_eq!(stops.check_derive(&bob, None), Ok(None));
        // A sign-in past the skew lifts it.
        let lifting = stops.check_derive(&alice, Some(1_031)).unwrap().unwrap();
        assert_eq!(lifting.stop, stop);
        // Minted tokens: refused until the lift, and those minted before it.
        assert_eq!(stops.check_minted(&alice, 2_000), Err(Refused::Revoked));
        assert!(mark_lifted(&s, &alice, 1_000, 1_500).unwrap());
        assert!(!mark_lifted(&s, &alice, 1_000, 1_600).unwrap(), "once");
        stops.reload(&s).unwrap();
        assert_eq!(stops.check_minted(&alice, 1_499), Err(Refused::Revoked));
        assert_eq!(stops.check_minted(&alice, 1_500), Ok(()));
        // The revoked session's tokens are still refused after the lift.
        assert_eq!(stops.check_derive(&alice, Some(900)), Err(Refused::Revoked));
        assert_eq!(stops.check_derive(&alice, Some(1_100)), Ok(None));
        // A restore-only stop merged in: nothing lifts it.
        write(
            &s,
            &Stop::new(&request("alice", Lift::Restore, None), 3_000, 600),
        )
        .unwrap();
        stops.reload(&s).unwrap();
        assert_eq!(
            stops.check_derive(&alice, Some(99_999)),
            Err(Refused::Revoked)
        );
        assert_eq!(stops.check_minted(&alice, 99_999), Err(Refused::Revoked));
        assert_eq!(stops.get(&alice).unwrap().revocation_time, 3_000);
        // Restore: gone, served again.
        assert!(remove(&s, &alice).unwrap().is_some());
        stops.reload(&s).unwrap();
        assert_eq!(stops.check_derive(&alice, None), Ok(None));
        assert!(remove(&s, &alice).unwrap().is_none());
    }

    #[test]
    fn the_retention_is_the_longest_subject_token_plus_the_skews_and_the_cache() {
        let h = std::time::Duration::from_secs;
        // The defaults: 24 h tokens, 30 s restore skew, 30 s exp skew, 60 s
        // cache.
        assert_eq!(
            stop_retention(&RevocationConfig::default()),
            24 * 3600 + 30 + 30 + 60
        );
        // It follows the lifetime bound and the restore skew, one for one.
        let cfg = RevocationConfig {
            max_subject_token_lifetime: h(600),
            restore_skew: h(0),
            ..RevocationConfig::default()
        };
        assert_eq!(
            stop_retention(&cfg),
            600 + subject::SKEW + subject::CACHE_TTL
        );
        let cfg = RevocationConfig {
            max_subject_token_lifetime: h(7_200),
            restore_skew: h(5),
            ..RevocationConfig::default()
        };
        assert_eq!(stop_retention(&cfg), 7_200 + 5 + 30 + 60);
    }

    #[test]
    fn sign_in_stops_are_swept_after_their_retention_from_receipt_and_restore_stops_are_kept() {
        let (_d, s) = store();
        let retention = 1_000;
        // Received at 5_000; its event time narrows the revocation time
        // to 4_700, but the retention counts from the receipt: a token of
        // the session issued up to the receipt lives until then.
        write(
            &s,
            &Stop::new(&request("a", Lift::SignIn, Some(4_700)), 5_000, 600),
        )
        .unwrap();
        write(
            &s,
            &Stop::new(&request("b", Lift::Restore, None), 5_000, 600),
        )
        .unwrap();
        assert_eq!(sweep(&s, 4_700 + retention + 1, retention).unwrap(), 0);
        assert_eq!(sweep(&s, 5_000 + retention, retention).unwrap(), 0);
        assert_eq!(sweep(&s, 5_001 + retention, retention).unwrap(), 1);
        let left = read_all(&s).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].person_sub, "b");
        assert_eq!(sweep(&s, i64::MAX, retention).unwrap(), 0, "restore-only");
    }

    #[test]
    fn an_unreadable_record_stops_its_person_until_restored() {
        let (_d, s) = store();
        let alice = person("alice");
        s.put(Tree::PersonStops, &key(&alice), b"{not json")
            .unwrap();
        let stops = Stops::at_start(&s, RevocationConfig::default());
        assert_eq!(
            stops.check_derive(&alice, Some(i64::MAX)),
            Err(Refused::Revoked)
        );
        assert_eq!(sweep(&s, i64::MAX / 2, 1).unwrap(), 0);
        remove(&s, &alice).unwrap();
        stops.reload(&s).unwrap();
        assert_eq!(stops.check_derive(&alice, None), Ok(None));
    }
}
