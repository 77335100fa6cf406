//! Browser sessions: server-side records keyed by SHA-256 of the session id;
//! the id lives only in the browser's cookie.
//!
//! - A session exists before sign-in (anonymous), to bind the sign-in form's
//!   CSRF token and the OIDC `state` to this browser.
//! - Signing in always creates a fresh session (new id) and deletes the old
//!   one, so an id planted before sign-in is worthless after it.
//! - Idle and absolute expiry; expired records are deleted when seen and
//!   swept periodically.
//! - The CSRF token is HMAC-SHA256(session id, label): bound to the session,
//!   unguessable without the cookie, and never stored.
//! - Each stored record carries an HMAC-SHA256 tag under a key derived from
//!   the master key, over its store key and its bytes: a record written by
//!   anyone else who can write the store (a forged signed-in session for a
//!   chosen id) or moved under another id is no session.
//!
//! The cookie is `__Host-credbroker` (Secure, HttpOnly, SameSite=Lax,
//! Path=/, no Domain) when the pages are served over https. The quick start
//! serves plain HTTP on loopback, where browsers refuse `Secure` cookies and
//! therefore `__Host-` names; there, and only there, the cookie is
//! `credbroker-dev` with the same attributes minus `Secure`.

use aws_lc_rs::hmac;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::accounts::subject::Person;
use crate::base::secret::{SecretBytes, SecretString};
use crate::infra::store::{Store, StoreError, Tree};

/// The cookie name over https.
pub(crate) const COOKIE_SECURE: &str = "__Host-credbroker";
/// The development fallback cookie name (plain HTTP on loopback only).
pub(crate) const COOKIE_DEV: &str = "credbroker-dev";

/// Lifetimes of sessions.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    /// A signed-in session not used for this long ends.
    pub idle: i64,
    /// A signed-in session ends this long after sign-in, used or not.
    pub absolute: i64,
    /// An anonymous session (before sign-in) ends after this long.
    pub anonymous: i64,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes {
            idle: 30 * 60,
            absolute: 12 * 3600,
            anonymous: 30 * 60,
        }
    }
}

/// How a person signed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Local account (argon2id password).
    Local,
    /// OIDC at the person's issuer.
    Oidc,
}

/// The stored part of a session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// The signed-in person's issuer (`None`: anonymous).
    pub iss: Option<String>,
    /// The signed-in person's subject.
    pub sub: Option<String>,
    /// A name to show (local name, or the IdP's `preferred_username`,
    /// `email` or `name`).
    pub display: Option<String>,
    /// How they signed in.
    pub method: Option<Method>,
    /// When they last proved who they are (`auth_time`).
    pub auth_time: Option<i64>,
    /// Created.
    pub created: i64,
    /// Last used.
    pub last_seen: i64,
}

impl Record {
    /// The signed-in person, if any.
    pub fn person(&self) -> Option<Person> {
        match (&self.iss, &self.sub) {
            (Some(iss), Some(sub)) => Some(Person {
                iss: iss.clone(),
                sub: sub.clone(),
            }),
            _ => None,
        }
    }
}

/// A loaded session: its id (a secret, from the cookie) and record.
#[derive(Debug)]
pub struct Session {
    id: SecretString,
    /// The store key: SHA-256 of the id.
    key: [u8; 32],
    /// The record.
    pub record: Record,
}

impl Session {
    /// The store key, hex (binds flows to this session without the id).
    pub fn key_hex(&self) -> String {
        hex::encode(self.key)
    }

    /// The session id, for the `Set-Cookie` header only.
    pub fn id(&self) -> &SecretString {
        &self.id
    }

    /// The CSRF token of this session.
    pub fn csrf(&self) -> SecretString {
        csrf_for(&self.id)
    }

    /// Whether `token` is this session's CSRF token (constant time).
    pub fn check_csrf(&self, token: Option<&str>) -> bool {
        let Some(token) = token else { return false };
        let expected = self.csrf();
        expected.expose().as_bytes().ct_eq(token.as_bytes()).into()
    }
}

fn csrf_for(id: &SecretString) -> SecretString {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, id.expose().as_bytes());
    let tag = aws_lc_rs::hmac::sign(&key, b"credbroker pages csrf v1");
    SecretString::new(crate::base::jose::b64e(tag.as_ref()))
}

fn key_of(id: &str) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, id.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

/// A new random token: 32 bytes from the system CSPRNG, base64url.
pub(crate) fn random_token() -> Result<SecretString, StoreError> {
    let mut b = [0u8; 32];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| StoreError::Backend("random".into()))?;
    let t = SecretString::new(crate::base::jose::b64e(&b));
    zeroize::Zeroize::zeroize(&mut b);
    Ok(t)
}

/// The session store.
#[derive(Debug, Clone)]
pub struct Sessions {
    lifetimes: Lifetimes,
    /// Authenticates the stored records.
    mac: hmac::Key,
}

/// Length of a stored record's tag (HMAC-SHA256), before its JSON.
const TAG_LEN: usize = 32;

/// Only rewrite `last_seen` when it is older than this, so that reading a
/// page is not a durable write every time.
const TOUCH_AFTER: i64 = 60;

impl Sessions {
    /// Sessions with these lifetimes, their records authenticated with
    /// `key` (replicas sharing a store must share it: [`Sessions::derive_key`]).
    pub fn new(lifetimes: Lifetimes, key: &SecretBytes) -> Sessions {
        Sessions {
            lifetimes,
            mac: hmac::Key::new(hmac::HMAC_SHA256, key.expose()),
        }
    }

    /// The key of session records, derived from the master key (so every
    /// replica that shares the master key reads the others' sessions).
    pub fn derive_key(master: &SecretBytes) -> SecretBytes {
        crate::accounts::connect::LinkCodes::derive_key(master, b"credbroker session-record key v1")
    }

    fn tag(&self, key: &[u8], json: &[u8]) -> hmac::Tag {
        let mut c = hmac::Context::with_key(&self.mac);
        c.update(key);
        c.update(json);
        c.sign()
    }

    /// The stored form of `record` under `key`: its tag, then its JSON.
    fn encode(&self, key: &[u8], record: &Record) -> Result<Vec<u8>, StoreError> {
        let json = serde_json::to_vec(record).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut out = Vec::with_capacity(TAG_LEN + json.len());
        out.extend_from_slice(self.tag(key, &json).as_ref());
        out.extend_from_slice(&json);
        Ok(out)
    }

    /// The record stored as `bytes` under `key`, if its tag is right.
    fn decode(&self, key: &[u8], bytes: &[u8]) -> Option<Record> {
        if bytes.len() < TAG_LEN {
            return None;
        }
        let (tag, json) = bytes.split_at(TAG_LEN);
        let ok: bool = self.tag(key, json).as_ref().ct_eq(tag).into();
        if !ok {
            return None;
        }
        serde_json::from_slice(json).ok()
    }

    /// The lifetimes.
    pub fn lifetimes(&self) -> Lifetimes {
        self.lifetimes
    }

    fn expired(&self, r: &Record, now: i64) -> bool {
        if r.person().is_some() {
            now - r.last_seen >= self.lifetimes.idle || now - r.created >= self.lifetimes.absolute
        } else {
            now - r.created >= self.lifetimes.anonymous
        }
    }

    /// The live session whose id is one of `ids` (the cookie values).
    pub fn load(
        &self,
        store: &dyn Store,
        ids: &[String],
        now: i64,
    ) -> Result<Option<Session>, StoreError> {
        for id in ids {
            // A cookie of the wrong shape is not looked up.
            if !super::http::is_code_shaped(id) {
                continue;
            }
            let key = key_of(id);
            let Some((bytes, mut record)) = self.read_live(store, &key, now)? else {
                continue;
            };
            if now - record.last_seen >= TOUCH_AFTER {
                record.last_seen = now;
                if let Ok(v) = self.encode(&key, &record) {
                    // Only over the record as read: a session ended (signed
                    // out) or rewritten meanwhile, by another request or
                    // replica, is never written back. Then what is there
                    // now is served, untouched, if it is still live.
                    if !store.compare_and_swap(Tree::Sessions, &key, Some(&bytes), Some(&v))? {
                        match self.read_live(store, &key, now)? {
                            Some((_, current)) => record = current,
                            None => continue,
                        }
                    }
                }
            }
            return Ok(Some(Session {
                id: SecretString::new(id.clone()),
                key,
                record,
            }));
        }
        Ok(None)
    }

    /// The stored session under `key` and its record, if it is live at
    /// `now`. An unreadable, unauthenticated or ended one is deleted, by compare-and-swap
    /// against the bytes read, so that one rewritten meanwhile (on a
    /// replica whose clock lags) is left to that replica.
    fn read_live(
        &self,
        store: &dyn Store,
        key: &[u8],
        now: i64,
    ) -> Result<Option<(Vec<u8>, Record)>, StoreError> {
        let Some(bytes) = store.get(Tree::Sessions, key)? else {
            return Ok(None);
        };
        match self.decode(key, &bytes) {
            Some(record) if !self.expired(&record, now) => Ok(Some((bytes, record))),
            _ => {
                store.compare_and_swap(Tree::Sessions, key, Some(&bytes), None)?;
                Ok(None)
            }
        }
    }

    /// Creates a session with a fresh id.
    pub fn create(&self, store: &dyn Store, record: Record) -> Result<Session, StoreError> {
        let id = random_token()?;
        let key = key_of(id.expose());
        let v = self.encode(&key, &record)?;
        store.put(Tree::Sessions, &key, &v)?;
        Ok(Session { id, key, record })
    }

    /// An anonymous session.
    pub fn create_anonymous(&self, store: &dyn Store, now: i64) -> Result<Session, StoreError> {
        self.create(
            store,
            Record {
                iss: None,
                sub: None,
                display: None,
                method: None,
                auth_time: None,
                created: now,
                last_seen: now,
            },
        )
    }

    /// Ends a session.
    pub fn delete(&self, store: &dyn Store, s: &Session) -> Result<(), StoreError> {
        store.delete(Tree::Sessions, &s.key)
    }

    /// Deletes expired sessions; returns how many. Each goes by
    /// compare-and-swap against the record as read: one used meanwhile on
    /// another replica (its clock lagging) keeps its new `last_seen`.
    pub fn sweep(&self, store: &dyn Store, now: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        for (k, v) in store.scan_prefix(Tree::Sessions, b"")? {
            let dead = self.decode(&k, &v).is_none_or(|r| self.expired(&r, now));
            if dead && store.compare_and_swap(Tree::Sessions, &k, Some(&v), None)? {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Ends every session signed in with the local account `name` (`users
/// remove`: a browser signed in as a removed account is signed out);
/// returns how many.
///
/// Needs no key: a record is read for its person without its tag being
/// checked, since deleting one that merely claims the account ends nothing
/// that was a session (a record whose tag fails is no session anyway).
pub(crate) fn end_local_sessions(store: &dyn Store, name: &str) -> Result<usize, StoreError> {
    let mut n = 0;
    for (k, v) in store.scan_prefix(Tree::Sessions, b"")? {
        let Some(json) = v.get(TAG_LEN..) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<Record>(json) else {
            continue;
        };
        if record.method == Some(Method::Local) && record.sub.as_deref() == Some(name) {
            store.delete(Tree::Sessions, &k)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Ends every session signed in as `person` (a person stopped:
/// `derive::persons`); returns how many. Reads records as
/// [`end_local_sessions`] does, without their tag.
pub(crate) fn end_person_sessions(store: &dyn Store, person: &Person) -> Result<usize, StoreError> {
    let mut n = 0;
    for (k, v) in store.scan_prefix(Tree::Sessions, b"")? {
        let Some(json) = v.get(TAG_LEN..) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<Record>(json) else {
            continue;
        };
        if record.person().as_ref() == Some(person) {
            store.delete(Tree::Sessions, &k)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The `Set-Cookie` value for a session id.
pub(crate) fn set_cookie(name: &str, secure: bool, id: &SecretString) -> String {
    format!(
        "{name}={}; Path=/; HttpOnly; SameSite=Lax{}",
        id.expose(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that removes the session cookie.
pub(crate) fn clear_cookie(name: &str, secure: bool) -> String {
    format!(
        "{name}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn test_key() -> SecretBytes {
        Sessions::derive_key(&SecretBytes::new(vec![7; 32]))
    }

    fn store() -> (tempfile::TempDir, crate::infra::store::SledStore) {
        let d = tempfile::tempdir().unwrap();
        let s = crate::infra::store::SledStore::open(d.path()).unwrap();
        (d, s)
    }

    fn signed_in(now: i64) -> Record {
        Record {
            iss: Some("http://127.0.0.1:8440".into()),
            sub: Some("alice".into()),
            display: Some("alice".into()),
            method: Some(Method::Local),
            auth_time: Some(now),
            created: now,
            last_seen: now,
        }
    }

    #[test]
    fn only_the_hash_of_the_id_is_stored() {
        let (_d, st) = store();
        let sessions = Sessions::new(Lifetimes::default(), &test_key());
        let s = sessions.create(&st, signed_in(1000)).unwrap();
        let all = st.scan_prefix(Tree::Sessions, b"").unwrap();
        assert_eq!(all.len(), 1);
        let id = s.id().expose().as_bytes();
        assert!(!all[0].0.windows(id.len()).any(|w| w == id));
        assert!(!all[0].1.windows(id.len()).any(|w| w == id));
        assert_eq!(
            format!("{s:?}").matches(s.id().expose().as_str()).count(),
            0
        );
    }

    #[test]
    fn idle_and_absolute_expiry() {
        let (_d, st) = store();
        let l = Lifetimes::default();
        let sessions = Sessions::new(l, &test_key());
        let s = sessions.create(&st, signed_in(1000)).unwrap();
        let ids = vec![s.id().expose().clone()];
        // Used every 20 minutes: alive until the absolute limit.
        let mut t = 1000;
        while t + 20 * 60 < 1000 + l.absolute {
            t += 20 * 60;
            assert!(
                sessions.load(&st, &ids, t).unwrap().is_some(),
                "alive at {t}"
            );
        }
        assert!(sessions
            .load(&st, &ids, 1000 + l.absolute)
            .unwrap()
            .is_none());
        // Idle: a fresh session not used for 30 minutes ends.
        let s = sessions.create(&st, signed_in(5000)).unwrap();
        let ids = vec![s.id().expose().clone()];
        assert!(sessions
            .load(&st, &ids, 5000 + l.idle - 1)
            .unwrap()
            .is_some());
        assert!(sessions
            .load(&st, &ids, 5000 + l.idle - 1 + l.idle)
            .unwrap()
            .is_none());
    }

    /// A store shared by two replicas, and a view of it whose first write
    /// to the sessions tree runs `between` first: what another replica
    /// does between this replica's read and its write.
    fn raced(
        between: impl Fn(&dyn Store) + Send + Sync + 'static,
    ) -> (
        tempfile::TempDir,
        Arc<dyn Store>,
        crate::infra::store::Hooked,
    ) {
        let (d, st) = store();
        let shared: Arc<dyn Store> = Arc::new(st);
        let other = shared.clone();
        let once = std::sync::atomic::AtomicBool::new(false);
        let hooked = crate::infra::store::Hooked::new(shared.clone(), move |t| {
            if t == Tree::Sessions && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                between(other.as_ref());
            }
            Ok(())
        });
        (d, shared, hooked)
    }

    #[test]
    fn a_touch_does_not_bring_back_a_session_ended_meanwhile() {
        let sessions = Sessions::new(Lifetimes::default(), &test_key());
        // Another replica signs the person out (deletes the session)
        // between this replica's read of it and its touch.
        let (_d, shared, hooked) = raced(|other| {
            for (k, _) in other.scan_prefix(Tree::Sessions, b"").unwrap() {
                other.delete(Tree::Sessions, &k).unwrap();
            }
        });
        let s = sessions.create(shared.as_ref(), signed_in(1000)).unwrap();
        let ids = vec![s.id().expose().clone()];
        let now = 1000 + TOUCH_AFTER;
        assert!(
            sessions.load(&hooked, &ids, now).unwrap().is_none(),
            "a session signed out meanwhile is not served"
        );
        assert!(
            shared.scan_prefix(Tree::Sessions, b"").unwrap().is_empty(),
            "the touch wrote the ended session back"
        );
        // Positive control: with nothing in between, the same touch
        // serves the session and stores its new `last_seen`.
        let s = sessions.create(shared.as_ref(), signed_in(1000)).unwrap();
        let ids = vec![s.id().expose().clone()];
        let loaded = sessions.load(&hooked, &ids, now).unwrap().expect("served");
        assert_eq!(loaded.record.last_seen, now);
        let stored = shared.get(Tree::Sessions, &loaded.key).unwrap().unwrap();
        let stored = sessions.decode(&loaded.key, &stored).unwrap();
        assert_eq!(stored.last_seen, now);
    }

    #[test]
    fn a_sweep_leaves_a_session_used_meanwhile_on_another_replica() {
        let l = Lifetimes::default();
        let sessions = Sessions::new(l, &test_key());
        let used = 1000 + l.idle;
        // Another replica, whose clock lags, serves the session (touches
        // it) between the sweep's read and its delete.
        let other_replica = sessions.clone();
        let (_d, shared, hooked) = raced(move |other| {
            for (k, v) in other.scan_prefix(Tree::Sessions, b"").unwrap() {
                let mut r = other_replica.decode(&k, &v).unwrap();
                r.last_seen = used;
                other
                    .put(Tree::Sessions, &k, &other_replica.encode(&k, &r).unwrap())
                    .unwrap();
            }
        });
        let s = sessions.create(shared.as_ref(), signed_in(1000)).unwrap();
        let ids = vec![s.id().expose().clone()];
        assert_eq!(sessions.sweep(&hooked, 1000 + l.idle).unwrap(), 0);
        assert!(
            sessions
                .load(shared.as_ref(), &ids, used + 1)
                .unwrap()
                .is_some(),
            "the sweep deleted a session used meanwhile"
        );
        // Positive control: once idle again, a sweep with nothing in
        // between removes it.
        assert_eq!(sessions.sweep(&hooked, used + 1 + l.idle).unwrap(), 1);
        assert!(shared.scan_prefix(Tree::Sessions, b"").unwrap().is_empty());
    }

    /// SECURITY-CASES C17: a session record written by anyone else who can
    /// write the store (a signed-in session forged for an id of their
    /// choosing), or one moved under another id, is no session.
    #[test]
    fn a_session_record_written_without_the_key_is_no_session() {
        let (_d, st) = store();
        let sessions = Sessions::new(Lifetimes::default(), &test_key());
        let now = 1000;
        // A forged signed-in session for an id the forger chose: in clear
        // (as releases before the tag stored them), and with a tag under
        // another key.
        let chosen = "f".repeat(43);
        let key = key_of(&chosen);
        let ids = vec![chosen.clone()];
        let clear = serde_json::to_vec(&signed_in(now)).unwrap();
        let other = Sessions::new(
            Lifetimes::default(),
            &Sessions::derive_key(&SecretBytes::new(vec![8; 32])),
        );
        for (what, forged) in [
            ("in clear", clear.clone()),
            (
                "under another key",
                other.encode(&key, &signed_in(now)).unwrap(),
            ),
        ] {
            st.put(Tree::Sessions, &key, &forged).unwrap();
            assert!(
                sessions.load(&st, &ids, now).unwrap().is_none(),
                "a forged session {what} was served"
            );
            assert!(
                st.get(Tree::Sessions, &key).unwrap().is_none(),
                "the forged session {what} is deleted when seen"
            );
        }
        // A real record moved under the chosen id does not serve it either.
        let real = sessions.create(&st, signed_in(now)).unwrap();
        let bytes = st.get(Tree::Sessions, &real.key).unwrap().unwrap();
        st.put(Tree::Sessions, &key, &bytes).unwrap();
        assert!(sessions.load(&st, &ids, now).unwrap().is_none());
        // Positive control: the real session, under its own id, is served.
        let own = vec![real.id().expose().clone()];
        let loaded = sessions.load(&st, &own, now).unwrap().expect("served");
        assert_eq!(loaded.record.sub.as_deref(), Some("alice"));
    }

    #[test]
    fn csrf_is_bound_to_the_session() {
        let (_d, st) = store();
        let sessions = Sessions::new(Lifetimes::default(), &test_key());
        let a = sessions.create_anonymous(&st, 0).unwrap();
        let b = sessions.create_anonymous(&st, 0).unwrap();
        assert!(!a.check_csrf(Some(b.csrf().expose())));
        assert!(!a.check_csrf(None));
        assert!(!a.check_csrf(Some("")));
        assert!(a.check_csrf(Some(a.csrf().expose())));
    }

    #[test]
    fn cookie_attributes() {
        let id = SecretString::new("x".repeat(43));
        let c = set_cookie(COOKIE_SECURE, true, &id);
        assert!(c.starts_with("__Host-credbroker="));
        for a in ["Path=/", "HttpOnly", "SameSite=Lax", "Secure"] {
            assert!(c.split("; ").any(|p| p == a), "{a} in {c}");
        }
        assert!(!c.contains("Domain"));
        assert!(!set_cookie(COOKIE_DEV, false, &id).contains("Secure"));
    }
}
