//! Storage: a small key-value [`Store`] trait with named trees, so that the
//! embedded sled backend and a later PostgreSQL backend (a table of
//! `(tree, key, value)` with compare-and-swap by `UPDATE ... WHERE value =`)
//! serve the same callers. Callers above this layer never touch sled.
//!
//! Every write returns only once it is durable (the sled backend flushes),
//! so an acknowledged write survives a crash.

mod sled_store;

pub use sled_store::SledStore;

/// The trees (tables) of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tree {
    /// Signing keys (sealed PKCS#8) and their metadata.
    SigningKeys,
    /// Small broker state: the freeze flag and similar.
    State,
    /// Connected accounts (tokens sealed), by person and service.
    Accounts,
    /// Allowances, by person, service and agent.
    Allowances,
    /// Connect-link records, by SHA-256 of the link code.
    Links,
    /// The open link per (person, agent, service): its link id.
    LinkIndex,
    /// Browser sessions of the pages, keyed by SHA-256 of the session id
    /// (the id itself is never stored).
    Sessions,
    /// Local accounts (argon2id hashes, failure counters), keyed by name.
    LocalUsers,
    /// Single-use `state` records of sign-in and provider flows, keyed by
    /// SHA-256 of the `state`, sealed.
    PageFlows,
    /// Step-up approval records, by SHA-256 of the approval code.
    Approvals,
    /// The approval of each call: call hash (hex) -> approval id.
    ApprovalIndex,
    /// Approvals per (person, agent), to cap the open ones.
    ApprovalPerson,
}

impl Tree {
    /// The tree's name in the backend.
    pub fn name(self) -> &'static str {
        match self {
            Tree::SigningKeys => "signing_keys",
            Tree::State => "state",
            Tree::Accounts => "accounts",
            Tree::Allowances => "allowances",
            Tree::Links => "links",
            Tree::LinkIndex => "link_index",
            Tree::Sessions => "sessions",
            Tree::LocalUsers => "local_users",
            Tree::PageFlows => "page_flows",
            Tree::Approvals => "approvals",
            Tree::ApprovalIndex => "approval_index",
            Tree::ApprovalPerson => "approval_person",
        }
    }
}

/// Storage errors. They never carry record values.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend failed (I/O, corruption, full disk).
    #[error("store backend error: {0}")]
    Backend(String),
    /// The store is held by another process.
    #[error("the store at {0} is in use by another process (is an instance running? use the admin socket)")]
    Locked(String),
}

/// A record key made of length-prefixed parts (`u16` big-endian length, then
/// the bytes), so that no choice of values can make two different tuples
/// collide, and a prefix of parts is a prefix of the key (for scans).
pub fn tuple_key(parts: &[&str]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 2).sum());
    for p in parts {
        // Parts longer than the length field allows cannot reach here: they
        // come from subject tokens and names, all capped far below 64 KiB
        // before this point. Cutting (instead of panicking) keeps this total.
        let b = &p.as_bytes()[..p.len().min(u16::MAX as usize)];
        k.extend_from_slice(&(b.len() as u16).to_be_bytes());
        k.extend_from_slice(b);
    }
    k
}

/// Splits a [`tuple_key`] back into its parts (`None` if malformed).
pub fn split_tuple_key(mut key: &[u8]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    while !key.is_empty() {
        if key.len() < 2 {
            return None;
        }
        let n = u16::from_be_bytes([key[0], key[1]]) as usize;
        let part = key.get(2..2 + n)?;
        out.push(String::from_utf8(part.to_vec()).ok()?);
        key = &key[2 + n..];
    }
    Some(out)
}

/// A key and its value, as returned by scans.
pub type Entry = (Vec<u8>, Vec<u8>);

/// A durable key-value store with named trees.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Reads one value.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Writes one value durably.
    fn put(&self, tree: Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Deletes one value durably.
    fn delete(&self, tree: Tree, key: &[u8]) -> Result<(), StoreError>;
    /// All entries whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, StoreError>;
    /// Replaces `key`'s value with `new` only if it currently equals
    /// `expected` (`None` = absent). Returns whether it swapped.
    fn compare_and_swap(
        &self,
        tree: Tree,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError>;
    /// Whether the store answers (readiness).
    fn is_healthy(&self) -> bool;
}
