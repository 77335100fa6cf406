//! Connect links (docs/DESIGN.md section 5): the records behind the `connect_uri`
//! of a refusal.
//!
//! A link's code is HMAC-SHA256(link key, link id): 32 bytes, base64url.
//! The store holds only SHA-256 of the code (the record's key) and the link
//! id (in the per-(person, agent, service) index), so the broker can hand
//! out the same link again by recomputing the code, yet nobody who reads
//! the store learns a code. There is at most one open link per (person,
//! agent, service): asking again returns it; a new kind replaces it, and the
//! replaced code stops resolving at once (the index no longer names it).
//! Links expire after 30 minutes (housekeeping, not protection) and are
//! swept.
//!
//! The browser routes that serve a link (sign-in, the five checks, the
//! provider callback) call [`Links::resolve`] and [`Links::close`].

mod flow;

use std::sync::Arc;

use aws_lc_rs::hmac;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::accounts::subject::Person;
use crate::base::secret::{SecretBytes, SecretString};
use crate::infra::store::{tuple_key, Store, StoreError, Tree};

pub use flow::disconnect_account;
pub(crate) use flow::revoke_at_provider;
pub(crate) use flow::{DisconnectError, DisconnectReport};

/// How long a link stays open.
pub const LINK_TTL: i64 = 30 * 60;

/// Errors of the link store.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record is not what this module wrote.
    #[error("a connect-link record is malformed")]
    Corrupt,
    /// No randomness.
    #[error("no randomness for a link id")]
    Random,
}

/// What a link is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// Connect the service, and allow the agent.
    Connect,
    /// Allow the agent to use an account already connected.
    Allow,
    /// Connect again (the provider refused a refresh, or more scope is
    /// needed than was granted).
    Reconnect,
}

impl LinkKind {
    /// The name used in records and events.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkKind::Connect => "connect",
            LinkKind::Allow => "allow",
            LinkKind::Reconnect => "reconnect",
        }
    }

    /// The refusal `reason` that carries a link of this kind.
    pub fn reason(self) -> &'static str {
        match self {
            LinkKind::Connect => "connect_required",
            LinkKind::Allow => "allow_required",
            LinkKind::Reconnect => "reconnect_required",
        }
    }
}

/// An open link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// The link id (public: it is the MCP elicitation id; the code cannot
    /// be computed from it without the link key).
    pub id: String,
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject.
    pub person_sub: String,
    /// The agent asking.
    pub agent: String,
    /// The service.
    pub service: String,
    /// What it is for.
    pub kind: LinkKind,
    /// Scopes asked for.
    pub scopes: Vec<String>,
    /// Hash of the policy that asked.
    pub policy_hash: String,
    /// Unix time made.
    pub created: i64,
    /// Unix time it stops resolving.
    pub expires: i64,
}

impl Link {
    /// The person the link was made for.
    pub fn person(&self) -> Person {
        Person {
            iss: self.person_iss.clone(),
            sub: self.person_sub.clone(),
        }
    }

    fn index_key(&self) -> Vec<u8> {
        tuple_key(&[
            &self.person_iss,
            &self.person_sub,
            &self.agent,
            &self.service,
        ])
    }
}

/// A link with its code, as a refusal hands it out.
#[derive(Debug)]
pub struct IssuedLink {
    /// The record.
    pub link: Link,
    /// Whether this call made the link (`false`: the open link was handed
    /// out again). A new link is what `connect.link_issued` records.
    pub fresh: bool,
    /// The code (secret: whoever has it can open the page, though the page
    /// still checks who they are).
    pub code: SecretString,
}

/// What to ask for when opening a link.
#[derive(Debug, Clone, Copy)]
pub struct LinkRequest<'a> {
    /// The person.
    pub person: &'a Person,
    /// The agent.
    pub agent: &'a str,
    /// The service.
    pub service: &'a str,
    /// The kind.
    pub kind: LinkKind,
    /// Scopes needed.
    pub scopes: &'a [String],
    /// The deciding policy's hash.
    pub policy_hash: &'a str,
}

/// The link store.
pub struct Links {
    store: Arc<dyn Store>,
    codes: LinkCodes,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Links")
            .field("base", &self.codes.base)
            .finish_non_exhaustive()
    }
}

/// The codes of links a person opens at `/connect/{code}`: an HMAC of the
/// record's id under a key derived from the master key with a label of its
/// own per kind of link (connect links, approvals), so every replica that
/// shares the master key makes and recognises the same codes, and a code of
/// one kind is never a code of the other.
pub(crate) struct LinkCodes {
    key: hmac::Key,
    base: String,
}

impl LinkCodes {
    /// `key` makes codes; `public_base` is the public issuer URL that serves
    /// `/connect/{code}`.
    pub(crate) fn new(key: &SecretBytes, public_base: &str) -> LinkCodes {
        LinkCodes {
            key: hmac::Key::new(hmac::HMAC_SHA256, key.expose()),
            base: public_base.trim_end_matches('/').to_string(),
        }
    }

    /// The key for `label`'s kind of link, derived from the master key.
    pub(crate) fn derive_key(master: &SecretBytes, label: &[u8]) -> SecretBytes {
        let k = hmac::Key::new(hmac::HMAC_SHA256, master.expose());
        SecretBytes::new(hmac::sign(&k, label).as_ref().to_vec())
    }

    /// The raw code of record `id`.
    pub(crate) fn code_bytes(&self, id: &str) -> Vec<u8> {
        hmac::sign(&self.key, id.as_bytes()).as_ref().to_vec()
    }

    /// The code of record `id`, as it appears in the URL.
    pub(crate) fn code_for(&self, id: &str) -> SecretString {
        SecretString::new(b64().encode(self.code_bytes(id)))
    }

    /// The URL the person opens.
    pub(crate) fn uri(&self, code: &SecretString) -> String {
        format!("{}/connect/{}", self.base, code.expose())
    }

    /// The public issuer URL the codes are served under.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

fn sha256(b: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b)
        .as_ref()
        .to_vec()
}

impl Links {
    /// A link store; `link_key` makes codes, `public_base` is the public
    /// issuer URL that serves `/connect/{code}`.
    pub fn new(store: Arc<dyn Store>, link_key: &SecretBytes, public_base: &str) -> Links {
        Links {
            store,
            codes: LinkCodes::new(link_key, public_base),
        }
    }

    /// The link key derived from the master key (so every replica that
    /// shares the master key makes and recognises the same codes).
    pub fn derive_key(master: &SecretBytes) -> SecretBytes {
        LinkCodes::derive_key(master, b"credbroker connect-link key v1")
    }

    fn code_bytes(&self, id: &str) -> Vec<u8> {
        self.codes.code_bytes(id)
    }

    /// The code of link `id`.
    pub fn code_for(&self, id: &str) -> SecretString {
        self.codes.code_for(id)
    }

    /// The URL the person opens.
    pub fn uri(&self, code: &SecretString) -> String {
        self.codes.uri(code)
    }

    fn get_link(&self, hash: &[u8]) -> Result<Option<Link>, ConnectError> {
        match self.store.get(Tree::Links, hash)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|_| ConnectError::Corrupt),
        }
    }

    fn new_id() -> Result<String, ConnectError> {
        let mut r = [0u8; 16];
        aws_lc_rs::rand::fill(&mut r).map_err(|_| ConnectError::Random)?;
        Ok(b64().encode(r))
    }

    /// The open link for (person, agent, service), made or replaced as
    /// needed: the same link while it is open, of the same kind and asks
    /// for at least these scopes; otherwise a new link (same kind: the
    /// union of the scopes) that replaces it.
    pub fn open_link(&self, r: &LinkRequest<'_>, now: i64) -> Result<IssuedLink, ConnectError> {
        let ikey = tuple_key(&[&r.person.iss, &r.person.sub, r.agent, r.service]);
        loop {
            let current = self.store.get(Tree::LinkIndex, &ikey)?;
            let mut scopes: Vec<String> = r.scopes.to_vec();
            let mut old_hash = None;
            if let Some(id) = current.as_deref().and_then(|v| std::str::from_utf8(v).ok()) {
                let code = self.code_for(id);
                let hash = sha256(&self.code_bytes(id));
                if let Some(link) = self.get_link(&hash)? {
                    let open = link.expires > now && link.kind == r.kind;
                    if open && r.scopes.iter().all(|s| link.scopes.contains(s)) {
                        return Ok(IssuedLink {
                            link,
                            code,
                            fresh: false,
                        });
                    }
                    if open {
                        scopes.extend(link.scopes.iter().cloned());
                    }
                }
                old_hash = Some(hash);
            }
            scopes.sort();
            scopes.dedup();
            let link = Link {
                id: Links::new_id()?,
                person_iss: r.person.iss.clone(),
                person_sub: r.person.sub.clone(),
                agent: r.agent.to_string(),
                service: r.service.to_string(),
                kind: r.kind,
                scopes,
                policy_hash: r.policy_hash.to_string(),
                created: now,
                expires: now + LINK_TTL,
            };
            let hash = sha256(&self.code_bytes(&link.id));
            let value = serde_json::to_vec(&link).map_err(|_| ConnectError::Corrupt)?;
            self.store.put(Tree::Links, &hash, &value)?;
            // The index switch is the moment of replacement: from here the
            // old code no longer resolves (resolve checks the index).
            if self.store.compare_and_swap(
                Tree::LinkIndex,
                &ikey,
                current.as_deref(),
                Some(link.id.as_bytes()),
            )? {
                if let Some(h) = old_hash {
                    self.store.delete(Tree::Links, &h)?;
                }
                let code = self.code_for(&link.id);
                return Ok(IssuedLink {
                    link,
                    code,
                    fresh: true,
                });
            }
            // Another request changed the index first: drop ours, look again.
            self.store.delete(Tree::Links, &hash)?;
        }
    }

    /// The open link behind `code`, or `None` for an unknown, malformed,
    /// expired or replaced code (callers answer all of them the same way).
    pub fn resolve(&self, code: &str, now: i64) -> Result<Option<Link>, ConnectError> {
        // 32 bytes in base64url without padding are exactly 43 characters.
        let bytes = match (code.len(), b64().decode(code)) {
            (43, Ok(b)) if b.len() == 32 => b,
            _ => return Ok(None),
        };
        let Some(link) = self.get_link(&sha256(&bytes))? else {
            return Ok(None);
        };
        // The record must be the one its code names (a record moved to
        // another key in the store does not resolve).
        let expected = self.code_bytes(&link.id);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            expected.as_slice(),
            bytes.as_slice(),
        )) {
            return Ok(None);
        }
        if link.expires <= now {
            return Ok(None);
        }
        match self.store.get(Tree::LinkIndex, &link.index_key())? {
            Some(id) if id == link.id.as_bytes() => Ok(Some(link)),
            _ => Ok(None),
        }
    }

    /// The open link with id `id` (the provider callback re-checks the link
    /// it started from), or `None` if it is closed, replaced or expired.
    pub fn get(&self, id: &str, now: i64) -> Result<Option<Link>, ConnectError> {
        let code = self.code_for(id);
        self.resolve(code.expose(), now)
    }

    /// Closes a link (done, declined): its code stops resolving.
    pub fn close(&self, link: &Link) -> Result<(), ConnectError> {
        self.store.compare_and_swap(
            Tree::LinkIndex,
            &link.index_key(),
            Some(link.id.as_bytes()),
            None,
        )?;
        self.store
            .delete(Tree::Links, &sha256(&self.code_bytes(&link.id)))?;
        Ok(())
    }

    /// Closes every open link of `person` (a person stopped:
    /// `derive::persons`), whatever the agent and service; returns how
    /// many.
    pub fn close_for_person(&self, person: &Person) -> Result<usize, ConnectError> {
        let mut n = 0;
        let prefix = tuple_key(&[&person.iss, &person.sub]);
        for (ikey, id) in self.store.scan_prefix(Tree::LinkIndex, &prefix)? {
            if self
                .store
                .compare_and_swap(Tree::LinkIndex, &ikey, Some(&id), None)?
            {
                if let Ok(id) = std::str::from_utf8(&id) {
                    self.store
                        .delete(Tree::Links, &sha256(&self.code_bytes(id)))?;
                }
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes expired links; returns how many.
    pub fn sweep(&self, now: i64) -> Result<usize, ConnectError> {
        let mut n = 0;
        for (k, v) in self.store.scan_prefix(Tree::Links, b"")? {
            let link: Link = match serde_json::from_slice(&v) {
                Ok(l) => l,
                Err(_) => {
                    // Unreadable records can never resolve; remove them.
                    self.store.delete(Tree::Links, &k)?;
                    n += 1;
                    continue;
                }
            };
            if link.expires <= now {
                self.store.compare_and_swap(
                    Tree::LinkIndex,
                    &link.index_key(),
                    Some(link.id.as_bytes()),
                    None,
                )?;
                self.store.delete(Tree::Links, &k)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
pub(crate) mod tests;
