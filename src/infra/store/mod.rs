//! Storage: a small key-value [`Store`] trait with named trees, so that the
//! embedded sled backend and the PostgreSQL backend (a table of
//! `(tree, key, value)` with compare-and-swap by `UPDATE ... WHERE value =`)
//! serve the same callers. Callers above this layer never touch sled.
//!
//! Every write returns only once it is durable (the sled backend flushes),
//! so an acknowledged write survives a crash.
//!
//! ## The shape, and why it stays synchronous
//!
//! The trait has three groups of operations:
//! - **records** (`get`, `put`, `delete`, `scan_prefix`, `compare_and_swap`,
//!   and `replace_fenced`, a compare-and-swap that also requires a lease to
//!   be held): values that live until deleted;
//! - **expiring entries** (`insert_expiring`, `get_expiring`,
//!   `replace_expiring`, `sweep_expired`), only in the trees for which
//!   [`Tree::expires`] is true: replay checks (`INSERT ... ON CONFLICT DO
//!   NOTHING` on a shared store) and leases. The expiry is computed by the
//!   **store's** clock (the database's on PostgreSQL), so replicas whose
//!   clocks differ still agree on who holds a lease;
//! - **changes** (`watch`): a counter per tree that moves when a record of
//!   that tree changes, in this process or (on a shared store) in another
//!   instance. Callers that cache a record in memory (the freeze flag, the
//!   key ring) re-read it when the counter moves, and on their own tick as a
//!   backstop, so a lost notification delays a change but never loses it.
//!
//! The trait is synchronous, and its callers (vault, links, sessions, key
//! ring) are too: every operation is one short statement, and the domain code
//! above it reads as straight-line code. A backend whose operations wait on
//! the network must therefore never park a runtime worker: the PostgreSQL
//! backend runs its queries on its own runtime and, when called from a
//! worker of a multi-thread runtime, waits inside
//! `tokio::task::block_in_place`, so the worker's other tasks (every `self`
//! derive, which needs no store) move to another thread while it waits.
//! The one exception is [`Store::get_async`], for the reads of the service
//! path (the account and the allowance, on every service derive and
//! proxied call): on PostgreSQL, awaited on a current-thread runtime (the
//! `per_core` API threads), it runs its statement on that runtime, over a
//! pool of that thread's own, so the request's thread neither blocks nor
//! hands off to another thread and back. Each
//! operation is bounded by the backend's statement timeout (waiting for a
//! pooled connection included); past it the answer is
//! [`StoreError::Unavailable`].

#[doc(hidden)]
pub(crate) mod contract;
mod copy;
#[doc(hidden)]
pub(crate) mod hooked;
mod postgres;
mod sled_store;
mod traced;

pub(crate) use copy::copy;
#[doc(hidden)]
pub use hooked::Hooked;
pub use postgres::{Migrate, PgSettings, PgStore};
pub use sled_store::SledStore;

/// `store`, wrapped so that each operation inside a traced request has a
/// span of its own when `spans` (see `traced`); as it is otherwise.
pub(crate) fn traced(store: std::sync::Arc<dyn Store>, spans: bool) -> std::sync::Arc<dyn Store> {
    if spans {
        std::sync::Arc::new(traced::Traced(store))
    } else {
        store
    }
}

/// Which backend a config selects: `store = "<dir>"` (sled, one instance)
/// or a `[postgres]` table (shared by replicas).
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded store in this directory.
    Sled(std::path::PathBuf),
    /// A PostgreSQL database.
    Postgres(PgSettings),
}

impl Backend {
    /// The sled directory, if this is sled.
    pub fn sled_dir(&self) -> Option<&std::path::Path> {
        match self {
            Backend::Sled(d) => Some(d),
            Backend::Postgres(_) => None,
        }
    }

    /// Opens the store (for PostgreSQL: checks or migrates the schema and
    /// starts listening for changes).
    pub fn open(&self) -> Result<std::sync::Arc<dyn Store>, StoreError> {
        Ok(match self {
            Backend::Sled(d) => std::sync::Arc::new(SledStore::open(d)?),
            Backend::Postgres(s) => std::sync::Arc::new(PgStore::open(s)?),
        })
    }
}

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
    /// Expiring: one entry per accepted proof where a replay must be refused
    /// on every instance sharing the store (the egress proxy's `jti`s).
    Replay,
    /// Expiring: leases (who may refresh an account now), held by one
    /// instance and lost if it stops renewing them.
    Leases,
    /// Step-up approval records, by SHA-256 of the approval code.
    Approvals,
    /// The approval of each call: call hash (hex) -> approval id.
    ApprovalIndex,
    /// Approvals per (person, agent), to cap the open ones.
    ApprovalPerson,
    /// Person-level stops (`derive::persons`), by `tuple_key([iss, sub])`.
    PersonStops,
    /// The client key ring (sealed PKCS#8): client assertions and actor
    /// tokens at upstream authorization servers (`derive::client_keys`).
    ClientKeys,
    /// The verified email recorded per person, and its index by email
    /// (`accounts::emails`): how an SSF `email` subject maps.
    PersonEmails,
    /// Shared Signals events received, by transmitter and `jti`, stored
    /// before they are acknowledged (`derive::ssf`).
    SsfEvents,
    /// Webhook delivery: each instance's cursor in its own audit file per
    /// subscription, and its dead letters.
    Webhooks,
}

/// Every tree, in a fixed order (for copies between stores and for tests).
pub(crate) const ALL_TREES: [Tree; 19] = [
    Tree::SigningKeys,
    Tree::State,
    Tree::Accounts,
    Tree::Allowances,
    Tree::Links,
    Tree::LinkIndex,
    Tree::Sessions,
    Tree::LocalUsers,
    Tree::PageFlows,
    Tree::Replay,
    Tree::Leases,
    Tree::Approvals,
    Tree::ApprovalIndex,
    Tree::ApprovalPerson,
    Tree::PersonStops,
    Tree::ClientKeys,
    Tree::PersonEmails,
    Tree::SsfEvents,
    Tree::Webhooks,
];

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
            Tree::Replay => "replay",
            Tree::Leases => "leases",
            Tree::Approvals => "approvals",
            Tree::ApprovalIndex => "approval_index",
            Tree::ApprovalPerson => "approval_person",
            Tree::PersonStops => "person_stops",
            Tree::ClientKeys => "client_keys",
            Tree::PersonEmails => "person_emails",
            Tree::SsfEvents => "ssf_events",
            Tree::Webhooks => "webhooks",
        }
    }

    /// Whether the tree holds expiring entries (written only with the
    /// `*_expiring` operations) instead of records.
    pub fn expires(self) -> bool {
        matches!(self, Tree::Replay | Tree::Leases)
    }

    /// The tree's position in [`ALL_TREES`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One reading of a shared store's clock ([`Store::clock_sample`]), in
/// milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// Ours, just before the query was sent.
    pub sent_ms: i64,
    /// Ours, just after its answer arrived.
    pub received_ms: i64,
    /// The store's, read while the query ran.
    pub store_ms: i64,
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
    /// The store cannot answer now (a shared store unreachable, slow past
    /// its statement timeout, or its pool exhausted). Callers fail closed
    /// with a temporary refusal, and retrying later may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// An operation was used on a tree of the other kind (records vs
    /// expiring entries): a programming error, refused instead of mixing
    /// encodings.
    #[error("tree {0} does not support this operation")]
    WrongTree(&'static str),
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
pub(crate) fn split_tuple_key(mut key: &[u8]) -> Option<Vec<String>> {
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
pub(crate) type Entry = (Vec<u8>, Vec<u8>);

/// A live expiring entry: its key, its value and its remaining lifetime.
pub(crate) type LiveExpiring = (Vec<u8>, Vec<u8>, std::time::Duration);

/// A lease named by its expiring tree and key, and the value its holder
/// wrote there (the holder's name and a random fencing token).
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// The expiring tree it lives in ([`Tree::Leases`]).
    pub tree: Tree,
    /// Its key.
    pub key: &'a [u8],
    /// The value the holder inserted.
    pub holder: &'a [u8],
}

/// How a [`Store::replace_fenced`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The lease was held and the record replaced.
    Swapped,
    /// The lease was held, but the record no longer equals the expected
    /// value: nothing written (read again and retry while holding it).
    Changed,
    /// The lease is not held with this value (it expired, and perhaps a
    /// successor holds it now): nothing written, and nothing may be.
    LeaseLost,
}

/// A store operation's answer to come ([`Store::get_async`]).
pub(crate) type StoreFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A durable key-value store with named trees (see the module docs for the
/// three groups of operations).
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Reads one value.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// [`Store::get`] for a caller that can wait asynchronously (the
    /// service path of a derive and of a proxied call): the same answer
    /// and the same bounds. A backend whose reads wait on the network does
    /// the I/O on the runtime that awaits this where it can (PostgreSQL on
    /// a current-thread runtime: the `per_core` API threads), instead of
    /// handing the read to its own runtime and blocking the caller's
    /// thread until it comes back. The default answers with [`Store::get`].
    fn get_async<'a>(&'a self, tree: Tree, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(std::future::ready(self.get(tree, key)))
    }
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
    /// Replaces `key`'s value with `new` only if it currently equals
    /// `expected` **and** `lease` is live and holds `lease.holder`, both in
    /// one atomic step: a lease holder whose lease lapsed (and whose
    /// successor may hold it now) cannot write, even if its write was
    /// already on its way when the lease expired. A successor taking the
    /// lease meanwhile waits for this step, so it then reads what it wrote.
    fn replace_fenced(
        &self,
        tree: Tree,
        key: &[u8],
        expected: &[u8],
        new: &[u8],
        lease: Lease<'_>,
    ) -> Result<Fenced, StoreError>;

    /// Whether the store answers (readiness).
    fn is_healthy(&self) -> bool;

    /// Whether other instances share this store (replicas on PostgreSQL):
    /// its outage is then everyone's, and readiness does not depend on it.
    fn is_shared(&self) -> bool {
        false
    }

    /// One reading of the store's clock for the clock-offset check
    /// (`infra::skew`): `local`'s time just before the query is sent and
    /// just after its answer, and the store's clock in between. `None`
    /// where the store has no clock of its own (sled: one instance, no
    /// one to disagree with).
    fn clock_sample(
        &self,
        _local: &crate::base::clock::SharedClock,
    ) -> Result<Option<ClockSample>, StoreError> {
        Ok(None)
    }

    /// Inserts an expiring entry that lives for `ttl` by the store's clock,
    /// only if `key` has no live entry (an expired one counts as absent and
    /// is replaced). Returns whether it inserted: `false` means a live entry
    /// exists (a replay; a lease someone else holds). Atomic: of two callers
    /// racing on one key, on any number of instances, exactly one inserts.
    fn insert_expiring(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError>;

    /// [`Store::insert_expiring`] with the same atomicity, but whose entry
    /// may reach disk only at the store's next flush (sled flushes every
    /// half second and when closed) instead of before this returns: for an
    /// entry whose loss in a crash costs little and whose write is on a hot
    /// path (a proxied call's proof `jti`, docs/PROXY.md). Where every write
    /// is durable anyway (PostgreSQL), it is `insert_expiring`.
    fn insert_expiring_unsynced(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.insert_expiring(tree, key, value, ttl)
    }

    /// Makes every write made before it durable: what
    /// [`Store::insert_expiring_unsynced`] left for the next flush reaches
    /// disk now (sled: a flush). Where every write is durable anyway
    /// (PostgreSQL), nothing.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Reads a live expiring entry (`None` if absent or expired).
    fn get_expiring(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Replaces a live expiring entry whose value equals `expected`: with
    /// `Some((value, ttl))` it is renewed (a lease's holder extending it),
    /// with `None` it is deleted (released). Returns whether it matched;
    /// an expired entry never matches, so a holder whose lease lapsed cannot
    /// renew what a successor may already hold.
    fn replace_expiring(
        &self,
        tree: Tree,
        key: &[u8],
        expected: &[u8],
        new: Option<(&[u8], std::time::Duration)>,
    ) -> Result<bool, StoreError>;

    /// Deletes the expired entries of `tree`; returns how many. Safe to run
    /// from several instances at once.
    fn sweep_expired(&self, tree: Tree) -> Result<usize, StoreError>;

    /// A counter that moves when a record of `tree` changes (a write by this
    /// process, or by another instance on a shared store). The value itself
    /// means nothing; callers re-read what they cache when it changes.
    fn watch(&self, tree: Tree) -> tokio::sync::watch::Receiver<u64>;
}

/// Refuses a record operation on an expiring tree, and the reverse.
pub(crate) fn check_tree(tree: Tree, expiring: bool) -> Result<(), StoreError> {
    if tree.expires() == expiring {
        Ok(())
    } else {
        Err(StoreError::WrongTree(tree.name()))
    }
}

/// The change counters of one process, one per tree (for backends whose
/// writers are all in this process, and as the local half of a shared
/// backend's notifications).
#[derive(Debug)]
pub(crate) struct Watchers {
    senders: Vec<tokio::sync::watch::Sender<u64>>,
}

impl Watchers {
    pub(crate) fn new() -> Watchers {
        Watchers {
            senders: ALL_TREES
                .iter()
                .map(|_| tokio::sync::watch::channel(0).0)
                .collect(),
        }
    }

    /// Moves `tree`'s counter.
    pub(crate) fn bump(&self, tree: Tree) {
        self.senders[tree.index()].send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(crate) fn subscribe(&self, tree: Tree) -> tokio::sync::watch::Receiver<u64> {
        self.senders[tree.index()].subscribe()
    }
}

/// Encodes an expiring entry for backends that keep it in one value: the
/// expiry (Unix milliseconds, big-endian) and then the value.
pub(crate) fn encode_expiring(expires_ms: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + value.len());
    v.extend_from_slice(&expires_ms.to_be_bytes());
    v.extend_from_slice(value);
    v
}

/// Splits [`encode_expiring`]'s form into the expiry and the value.
pub(crate) fn decode_expiring(raw: &[u8]) -> Option<(u64, &[u8])> {
    let (head, value) = raw.split_at_checked(8)?;
    Some((u64::from_be_bytes(head.try_into().ok()?), value))
}
