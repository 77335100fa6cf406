//! The verified email recorded for a person, so that a Shared Signals event
//! naming an `email` subject can be mapped to the people it means
//! (docs/SSF.md, "Subjects"). Kept only when some transmitter has
//! `map_email = true`.
//!
//! Recorded from the subject token of a derive: its `email`, only when its
//! `email_verified` is `true`, for its (`iss`, `sub`). The `self` derive
//! path makes no store call, so the recording is kept off it: the last
//! email seen per person is held in memory, and only a change (a person
//! not seen since this process started, or a new address) is queued to a
//! background task that writes it. A full queue drops the change and
//! forgets the person, so the next derive queues it again. A derive never
//! waits for the store, and the cost on the request path is one map look-up.
//!
//! The store tree [`Tree::PersonEmails`] holds two kinds of record:
//! `("p", iss, sub) -> email` (what is recorded for the person) and
//! `("e", iss, email, sub) -> ""` (the index an `email` subject is looked up
//! in). Addresses are compared as given, except that the domain is
//! lower-cased (RFC 5321 section 2.4: only the local part may be
//! case-sensitive).

use std::sync::Arc;

use dashmap::DashMap;

use crate::accounts::subject::Person;
use crate::infra::store::{tuple_key, Store, StoreError, Tree};

pub(crate) use crate::accounts::subject::MAX_EMAIL;
/// People whose last email is held in memory; past it the map is cleared
/// (the cost: one more write per person).
const MEMORY_MAX: usize = 100_000;
/// Changes waiting for the writer.
const QUEUE: usize = 4096;

/// An email in the form it is recorded and looked up in: the domain
/// lower-cased; `None` if it is not a plausible address.
pub(crate) fn normalize(email: &str) -> Option<String> {
    if email.len() > MAX_EMAIL || email.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return None;
    }
    let (local, domain) = email.rsplit_once('@')?;
    if local.is_empty() || domain.is_empty() {
        return None;
    }
    Some(format!("{local}@{}", domain.to_ascii_lowercase()))
}

/// The recorded emails: the store records and the in-memory view of what
/// was last written.
#[derive(Debug)]
pub(crate) struct Emails {
    store: Arc<dyn Store>,
    seen: DashMap<Person, String>,
    queue: tokio::sync::mpsc::Sender<(Person, String)>,
}

impl Emails {
    /// The recorder, and the background task that writes what it queues
    /// (the caller spawns it on the runtime).
    pub(crate) fn new(
        store: Arc<dyn Store>,
    ) -> (Arc<Emails>, impl std::future::Future<Output = ()> + Send) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(Person, String)>(QUEUE);
        let emails = Arc::new(Emails {
            store,
            seen: DashMap::new(),
            queue: tx,
        });
        let writer = emails.clone();
        let task = async move {
            while let Some((person, email)) = rx.recv().await {
                let w = writer.clone();
                let p = person.clone();
                let r = tokio::task::spawn_blocking(move || w.record(&p, &email)).await;
                if !matches!(r, Ok(Ok(()))) {
                    // Not recorded: forget it, so the person's next derive
                    // queues it again.
                    writer.seen.remove(&person);
                    tracing::warn!("a person's verified email could not be recorded; retried on their next derive");
                }
            }
        };
        (emails, task)
    }

    /// Called on every derive with a verified email: queues a change, never
    /// waits, never touches the store.
    pub(crate) fn observe(&self, person: &Person, email: &str) {
        let Some(email) = normalize(email) else {
            return;
        };
        if self.seen.get(person).is_some_and(|e| *e == email) {
            return;
        }
        if self.seen.len() >= MEMORY_MAX {
            self.seen.clear();
        }
        self.seen.insert(person.clone(), email.clone());
        if self.queue.try_send((person.clone(), email)).is_err() {
            self.seen.remove(person);
        }
    }

    fn person_key(person: &Person) -> Vec<u8> {
        tuple_key(&["p", &person.iss, &person.sub])
    }

    fn index_key(iss: &str, email: &str, sub: &str) -> Vec<u8> {
        tuple_key(&["e", iss, email, sub])
    }

    /// Records `email` (normalised) for `person`, replacing what was
    /// recorded (blocking: the store).
    pub(crate) fn record(&self, person: &Person, email: &str) -> Result<(), StoreError> {
        let Some(email) = normalize(email) else {
            return Ok(());
        };
        let email = email.as_str();
        let old = self
            .store
            .get(Tree::PersonEmails, &Self::person_key(person))?;
        if let Some(old) = old.as_deref().and_then(|o| std::str::from_utf8(o).ok()) {
            if old == email {
                return Ok(());
            }
            self.store.delete(
                Tree::PersonEmails,
                &Self::index_key(&person.iss, old, &person.sub),
            )?;
        }
        // The index first: a crash between the two leaves an index entry
        // without its record, which a look-up checks and skips.
        self.store.put(
            Tree::PersonEmails,
            &Self::index_key(&person.iss, email, &person.sub),
            b"",
        )?;
        self.store.put(
            Tree::PersonEmails,
            &Self::person_key(person),
            email.as_bytes(),
        )
    }

    /// Drops what is recorded for `person` (blocking).
    pub(crate) fn forget(&self, person: &Person) -> Result<(), StoreError> {
        self.seen.remove(person);
        if let Some(old) = self
            .store
            .get(Tree::PersonEmails, &Self::person_key(person))?
        {
            if let Ok(old) = std::str::from_utf8(&old) {
                self.store.delete(
                    Tree::PersonEmails,
                    &Self::index_key(&person.iss, old, &person.sub),
                )?;
            }
            self.store
                .delete(Tree::PersonEmails, &Self::person_key(person))?;
        }
        Ok(())
    }

    /// The people of issuer `iss` whose recorded verified email is `email`
    /// (blocking).
    pub(crate) fn people(&self, iss: &str, email: &str) -> Result<Vec<Person>, StoreError> {
        let Some(email) = normalize(email) else {
            return Ok(Vec::new());
        };
        let prefix = tuple_key(&["e", iss, &email]);
        let mut out = Vec::new();
        for (k, _) in self.store.scan_prefix(Tree::PersonEmails, &prefix)? {
            let Some(parts) = crate::infra::store::split_tuple_key(&k) else {
                continue;
            };
            let [_, i, e, sub] = parts.as_slice() else {
                continue;
            };
            let person = Person {
                iss: i.clone(),
                sub: sub.clone(),
            };
            // Only an index entry whose record still says this email.
            let current = self
                .store
                .get(Tree::PersonEmails, &Self::person_key(&person))?;
            if i == iss && e == &email && current.as_deref() == Some(email.as_bytes()) {
                out.push(person);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let s = crate::infra::store::SledStore::open(d.path()).unwrap_or_else(|e| panic!("{e}"));
        (d, Arc::new(s))
    }

    fn alice() -> Person {
        Person {
            iss: "https://idp.example".into(),
            sub: "alice".into(),
        }
    }

    #[test]
    fn an_email_maps_only_at_its_issuer_and_follows_a_change() {
        let (_d, s) = store();
        let (emails, _task) = Emails::new(s);
        emails
            .record(&alice(), "Alice@Example.COM")
            .unwrap_or_else(|e| panic!("{e}"));
        // The domain's case does not matter; the issuer does.
        let found = emails
            .people("https://idp.example", "Alice@example.com")
            .unwrap_or_default();
        assert_eq!(found, vec![alice()]);
        assert!(emails
            .people("https://other.example", "Alice@example.com")
            .unwrap_or_default()
            .is_empty());
        // A changed address: the old one no longer maps, the new one does.
        emails
            .record(&alice(), "alice@new.example")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(emails
            .people("https://idp.example", "Alice@example.com")
            .unwrap_or_default()
            .is_empty());
        assert_eq!(
            emails
                .people("https://idp.example", "alice@new.example")
                .unwrap_or_default(),
            vec![alice()]
        );
        emails.forget(&alice()).unwrap_or_else(|e| panic!("{e}"));
        assert!(emails
            .people("https://idp.example", "alice@new.example")
            .unwrap_or_default()
            .is_empty());
    }

    #[test]
    fn observing_the_same_email_again_queues_nothing() {
        let (_d, s) = store();
        let (emails, _task) = Emails::new(s);
        emails.observe(&alice(), "alice@example.com");
        emails.observe(&alice(), "alice@example.com");
        assert_eq!(emails.queue.max_capacity() - emails.queue.capacity(), 1);
        // Positive control: a new address is queued.
        emails.observe(&alice(), "alice@new.example");
        assert_eq!(emails.queue.max_capacity() - emails.queue.capacity(), 2);
        // Not a plausible address: nothing.
        emails.observe(&alice(), "not an address");
        assert_eq!(emails.queue.max_capacity() - emails.queue.capacity(), 2);
    }
}
