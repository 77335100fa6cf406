//! Reuse of exchanged tokens (issue 41 item 8; docs/UPSTREAM.md, "Reuse"):
//! a token an upstream issued may be given again, without a call to its
//! authorization server, only to a derive that is the same in every respect
//! the token's promises depend on: the same upstream, resource, person
//! (issuer and subject), agent, tool, step, granted scopes, DPoP key
//! (`jkt`) and policy hash. Its key is a SHA-256 over those fields, each
//! length-prefixed, so no two derives that differ in one share an entry.
//!
//! What a hit must also show: the token still has its upstream's
//! `reuse_margin` left (`exp - now >= margin`), and it does not outlive the
//! subject token of the derive that asks (`exp <= subject_exp`: a newer
//! subject token of the same person may end sooner).
//!
//! Bounds: at most [`MAX_ENTRIES`] tokens. When full, the entries that can
//! no longer be given (under their margin) are dropped first; if it is
//! still full the new token is not kept (refuse-to-cache: the derive gets
//! it, the next one exchanges again). Entries live in this process's memory
//! only, never in the store; a token is a [`SecretString`], zeroized when
//! its entry is dropped.
//!
//! Dropping: [`Cache::clear`] on a freeze and on every policy reload (any
//! reload that applies changes the policy hash, so no entry could match
//! again anyway); [`Cache::drop_person`] for the person-level stop (issue
//! 43). Each bumps a generation: an exchange that was already on its way
//! when the drop happened may not put its token in afterwards
//! ([`Ticket`]), so a freeze or a stop cannot be undone by a late answer.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::base::secret::SecretString;

/// The most tokens kept at once (a few MB at most: an exchanged JWT is
/// around a kilobyte).
pub(crate) const MAX_ENTRIES: usize = 4096;

/// What makes two derives the same for reuse.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReuseKey<'a> {
    /// The upstream's name.
    pub upstream: &'a str,
    /// The resource, canonical.
    pub resource: &'a str,
    /// The person's issuer.
    pub person_iss: &'a str,
    /// The person's subject.
    pub person_sub: &'a str,
    /// This broker's agent.
    pub agent: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The step.
    pub step: &'a str,
    /// The granted scopes (order does not matter).
    pub scopes: &'a [String],
    /// The thumbprint of the tool's key.
    pub jkt: &'a str,
    /// The hash of the policy that granted them.
    pub policy_hash: &'a str,
}

type Digest = [u8; 32];

fn digest(fields: &[&[u8]]) -> Digest {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for f in fields {
        ctx.update(&(f.len() as u64).to_be_bytes());
        ctx.update(f);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

impl ReuseKey<'_> {
    fn digest(&self) -> Digest {
        let mut scopes: Vec<&str> = self.scopes.iter().map(String::as_str).collect();
        scopes.sort_unstable();
        scopes.dedup();
        // The scopes as one field: each scope is a scope token (no space),
        // so the space-joined sorted list names the set exactly.
        let scopes = scopes.join(" ");
        digest(&[
            self.upstream.as_bytes(),
            self.resource.as_bytes(),
            self.person_iss.as_bytes(),
            self.person_sub.as_bytes(),
            self.agent.as_bytes(),
            self.tool.as_bytes(),
            self.step.as_bytes(),
            scopes.as_bytes(),
            self.jkt.as_bytes(),
            self.policy_hash.as_bytes(),
        ])
    }

    fn person(&self) -> Digest {
        person_digest(self.person_iss, self.person_sub)
    }
}

fn person_digest(iss: &str, sub: &str) -> Digest {
    digest(&[iss.as_bytes(), sub.as_bytes()])
}

/// A token given again.
#[derive(Debug)]
pub(crate) struct Reused {
    /// The token (a copy; zeroized when dropped).
    pub access_token: SecretString,
    /// Its `exp`.
    pub exp: i64,
    /// Its id, as its first `derive.issued` recorded it.
    pub id: String,
}

#[derive(Debug)]
struct Entry {
    token: SecretString,
    exp: i64,
    id: String,
    /// The upstream's margin, kept to purge entries no longer given.
    margin: i64,
    person: Digest,
}

/// The generation seen before an exchange was sent; the token it brings is
/// kept only if nothing was dropped meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Digest, Entry>,
    generation: u64,
}

/// The exchanged tokens kept for reuse (one per broker process).
#[derive(Debug, Default)]
pub(crate) struct Cache {
    inner: Mutex<Inner>,
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token kept for `key`, if it still has `margin` seconds left at
    /// `now` and ends no later than `subject_exp`.
    pub(crate) fn get(
        &self,
        key: &ReuseKey<'_>,
        margin: i64,
        now: i64,
        subject_exp: i64,
    ) -> Option<Reused> {
        let d = key.digest();
        let inner = self.lock();
        let e = inner.entries.get(&d)?;
        (e.exp - now >= margin && e.exp <= subject_exp).then(|| Reused {
            access_token: e.token.clone(),
            exp: e.exp,
            id: e.id.clone(),
        })
    }

    /// Taken before an exchange is sent; [`Cache::put`] honours it.
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket(self.lock().generation)
    }

    /// Keeps `token` for `key` unless something was dropped since `ticket`,
    /// or the cache is full of tokens still given. Returns whether it kept it.
    // reason: the entry's parts, each a plain value from the exchange.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put(
        &self,
        ticket: Ticket,
        key: &ReuseKey<'_>,
        token: &SecretString,
        exp: i64,
        id: &str,
        margin: i64,
        now: i64,
    ) -> bool {
        let d = key.digest();
        let person = key.person();
        let mut inner = self.lock();
        if inner.generation != ticket.0 {
            return false;
        }
        if inner.entries.len() >= MAX_ENTRIES && !inner.entries.contains_key(&d) {
            inner.entries.retain(|_, e| e.exp - now >= e.margin);
            if inner.entries.len() >= MAX_ENTRIES {
                tracing::debug!(
                    cap = MAX_ENTRIES,
                    "the exchanged-token cache is full; this token is not kept for reuse"
                );
                return false;
            }
        }
        inner.entries.insert(
            d,
            Entry {
                token: token.clone(),
                exp,
                id: id.to_owned(),
                margin,
                person,
            },
        );
        true
    }

    /// Drops every token (freeze, policy reload).
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.entries.clear();
    }

    /// Drops every token kept for the person (`iss`, `sub`), and keeps any
    /// exchange already on its way from adding one: what the person-level
    /// stop calls. Returns how many were dropped.
    pub(crate) fn drop_person(&self, iss: &str, sub: &str) -> usize {
        let person = person_digest(iss, sub);
        let mut inner = self.lock();
        inner.generation += 1;
        let before = inner.entries.len();
        inner.entries.retain(|_, e| e.person != person);
        before - inner.entries.len()
    }

    /// The tokens that can still be given at `now` (the others are dropped
    /// first): the `credbroker_upstream_token_cache_entries` gauge.
    pub(crate) fn live(&self, now: i64) -> usize {
        let mut inner = self.lock();
        inner.entries.retain(|_, e| e.exp - now >= e.margin);
        inner.entries.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic
    use super::*;

    fn key<'a>(scopes: &'a [String], jkt: &'a str, tool: &'a str) -> ReuseKey<'a> {
        ReuseKey {
            upstream: "org",
            resource: "https://api.example/",
            person_iss: "https://idp.example",
            person_sub: "alice",
            agent: "agent",
            tool,
            step: "summarize",
            scopes,
            jkt,
            policy_hash: "h1",
        }
    }

    fn tok(s: &str) -> SecretString {
        SecretString::new(s.to_owned())
    }

    #[test]
    fn a_token_is_given_again_only_for_the_same_derive_within_its_margin() {
        let c = Cache::default();
        let s = vec!["a".to_string(), "b".to_string()];
        let k = key(&s, "jkt1", "t");
        assert!(c.put(c.ticket(), &k, &tok("T1"), 1300, "j1", 60, 1000));
        // Same derive, scopes in another order: the same set.
        let s2 = vec!["b".to_string(), "a".to_string()];
        let hit = c.get(&key(&s2, "jkt1", "t"), 60, 1000, 2000).unwrap();
        assert_eq!(hit.access_token.expose(), "T1");
        assert_eq!((hit.exp, hit.id.as_str()), (1300, "j1"));
        // Each field that differs misses.
        let one = vec!["a".to_string()];
        assert!(c.get(&key(&one, "jkt1", "t"), 60, 1000, 2000).is_none());
        assert!(c.get(&key(&s, "jkt2", "t"), 60, 1000, 2000).is_none());
        assert!(c.get(&key(&s, "jkt1", "u"), 60, 1000, 2000).is_none());
        for change in 0..7 {
            let mut k2 = k;
            match change {
                0 => k2.upstream = "other",
                1 => k2.resource = "https://api.example/x",
                2 => k2.person_iss = "https://idp2.example",
                3 => k2.person_sub = "bob",
                4 => k2.agent = "agent2",
                5 => k2.step = "other",
                _ => k2.policy_hash = "h2",
            }
            assert!(c.get(&k2, 60, 1000, 2000).is_none(), "{change}");
        }
        // Under the margin, or past the subject token's end: not given.
        assert!(c.get(&k, 60, 1241, 2000).is_none());
        assert!(c.get(&k, 60, 1000, 1299).is_none());
        // Positive control at the edges.
        assert!(c.get(&k, 60, 1240, 1300).is_some());
    }

    #[test]
    fn a_drop_empties_and_keeps_late_answers_out() {
        let c = Cache::default();
        let s = vec!["a".to_string()];
        let k = key(&s, "jkt1", "t");
        let before = c.ticket();
        c.clear();
        assert!(!c.put(before, &k, &tok("T"), 1300, "j", 60, 1000));
        assert!(c.get(&k, 60, 1000, 2000).is_none());
        assert!(c.put(c.ticket(), &k, &tok("T"), 1300, "j", 60, 1000));
        assert_eq!(c.live(1000), 1);
        // The person-level stop: only that person's tokens go.
        let mut bob = k;
        bob.person_sub = "bob";
        assert!(c.put(c.ticket(), &bob, &tok("B"), 1300, "jb", 60, 1000));
        let in_flight = c.ticket();
        assert_eq!(c.drop_person("https://idp.example", "alice"), 1);
        assert!(c.get(&k, 60, 1000, 2000).is_none());
        assert!(c.get(&bob, 60, 1000, 2000).is_some());
        assert!(!c.put(in_flight, &k, &tok("T"), 1300, "j", 60, 1000));
        c.clear();
        assert_eq!(c.live(1000), 0);
    }

    #[test]
    fn the_cache_is_bounded_and_makes_room_only_from_tokens_no_longer_given() {
        let c = Cache::default();
        let s = vec!["a".to_string()];
        let jkts: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("k{i}")).collect();
        for (i, j) in jkts.iter().take(MAX_ENTRIES).enumerate() {
            // Half of them end soon.
            let exp = if i % 2 == 0 { 1080 } else { 1300 };
            assert!(c.put(c.ticket(), &key(&s, j, "t"), &tok("T"), exp, "j", 60, 1000));
        }
        let last = key(&s, &jkts[MAX_ENTRIES], "t");
        // Full of tokens still given: refused.
        assert!(!c.put(c.ticket(), &last, &tok("T"), 1300, "j", 60, 1000));
        assert_eq!(c.live(1000), MAX_ENTRIES);
        // Later, the short ones are under their margin: room is made.
        assert!(c.put(c.ticket(), &last, &tok("T"), 1300, "j", 60, 1030));
        assert_eq!(c.live(1030), MAX_ENTRIES / 2 + 1);
    }
}
