//! The vault: people's connected accounts at third-party services and the
//! allowances they gave this broker's agents.
//!
//! An account record holds, in clear, what the account page and
//! `credbroker accounts list` show (the account's id and name at the
//! provider, granted scopes, status) and, sealed with AES-256-GCM
//! ([`crate::infra::seal`]), the tokens: a fresh random nonce per write, the
//! record's own store key as associated data (a ciphertext copied into
//! another record does not open), and the sealing key's id, so keys rotate
//! ([`Vault::rotate`]). Allowances hold no secret and are stored in clear.
//!
//! Records are keyed by length-prefixed tuples ([`crate::infra::store::tuple_key`]):
//! accounts by (person `iss`, person `sub`, service), allowances by
//! (`iss`, `sub`, service, agent).

mod fast;
mod kept;
pub(crate) mod keys;
mod refresh;

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

use kept::Kept;
pub(crate) use keys::{VaultKeys, DEFAULT_SEAL_CAP};
pub(crate) use refresh::ServiceToken;
pub use refresh::{lease_lifetime, TokenOutcome, TokenRequest};

use crate::accounts::subject::Person;
use crate::accounts::upstream::{AccountInfo, TokenSet};
use crate::base::secret::SecretString;
use crate::infra::seal::{SealError, Sealer};
use crate::infra::store::{split_tuple_key, tuple_key, Store, StoreError, Tree};

/// Vault errors. None carries a token or a key.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record's tokens do not decrypt: tampered with, truncated, copied
    /// from another record, or sealed with a key that is not loaded. The
    /// record is reported and never served.
    #[error("the vault record for service {service} cannot be opened: {reason}")]
    Unreadable {
        /// The service.
        service: String,
        /// Why (no secret in it).
        reason: String,
    },
    /// The current key is not among the loaded keys.
    #[error("vault key {0} is missing (not in the vault key record, nor in the key directory as {0}.key)")]
    KeyMissing(String),
    /// Key files or key state are unusable.
    #[error("{0}")]
    Keys(String),
    /// The current key has sealed as many records as it may.
    #[error("vault key {0} reached its encryption cap; run `credbroker keys rotate-vault`")]
    KeyExhausted(String),
    /// A record in the store is not what the vault wrote.
    #[error("a vault record is malformed: {0}")]
    Corrupt(String),
    /// There is no such account.
    #[error("no connected account for this person and service")]
    NoAccount,
}

/// An account's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountStatus {
    /// Usable.
    Active,
    /// The provider refused a refresh (or the tokens cannot be used): the
    /// person must connect again.
    ReconnectRequired,
}

impl AccountStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AccountStatus::Active => "active",
            AccountStatus::ReconnectRequired => "reconnect_required",
        }
    }
}

/// A connected account, without its tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Account {
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject.
    pub person_sub: String,
    /// The service (provider name).
    pub service: String,
    /// The provider it was connected at (issuer or token endpoint).
    pub provider: String,
    /// The provider's id for the account.
    pub account_id: String,
    /// The account's name at the provider.
    pub account_name: String,
    /// Scopes the provider granted.
    pub scopes: Vec<String>,
    /// Status.
    pub status: AccountStatus,
    /// Unix time connected.
    pub created: i64,
    /// Unix time last written.
    pub updated: i64,
    /// Id of the key that sealed its tokens.
    pub key_id: Option<String>,
}

/// A person's allowance for one agent to use one service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allowance {
    /// The agent.
    pub agent: String,
    /// The service.
    pub service: String,
    /// Scopes the agent may use.
    pub scopes: Vec<String>,
    /// Unix time given.
    pub created: i64,
    /// Unix time last changed.
    pub updated: i64,
}

/// An account record as one read found it (see [`Vault::account_read`]).
pub struct AccountRead {
    key: Vec<u8>,
    /// The record's summary, and the record.
    parsed: Arc<(Account, AccountRecord)>,
}

impl AccountRead {
    /// The account, without tokens.
    pub fn account(&self) -> &Account {
        &self.parsed.0
    }
}

impl std::fmt::Debug for AccountRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountRead")
            .field("account", &self.parsed.0)
            .finish_non_exhaustive()
    }
}

/// The stored account record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AccountRecord {
    v: u8,
    person_iss: String,
    person_sub: String,
    service: String,
    provider: String,
    account_id: String,
    account_name: String,
    scopes: Vec<String>,
    status: AccountStatus,
    created: i64,
    updated: i64,
    /// Bumped on every write; waiters on a refresh compare it.
    generation: u64,
    /// base64url of the sealed [`Tokens`].
    sealed: String,
}

impl AccountRecord {
    /// A stored record's bytes, parsed.
    fn parse(raw: &[u8]) -> Result<AccountRecord, VaultError> {
        serde_json::from_slice(raw).map_err(|_| VaultError::Corrupt("account record".into()))
    }

    fn summary(&self) -> Account {
        // The key id sits in the sealed record's first bytes: only the
        // first 16 characters (12 bytes) are decoded, not the whole record
        // (the proxy reads an account on every call). A sealed record is
        // at least 37 bytes, so a shorter field names no key.
        let key_id = self
            .sealed
            .get(..16)
            .and_then(|head| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(head)
                    .ok()
            })
            .and_then(|b| Sealer::record_key_id(&b));
        Account {
            person_iss: self.person_iss.clone(),
            person_sub: self.person_sub.clone(),
            service: self.service.clone(),
            provider: self.provider.clone(),
            account_id: self.account_id.clone(),
            account_name: self.account_name.clone(),
            scopes: self.scopes.clone(),
            status: self.status,
            created: self.created,
            updated: self.updated,
            key_id,
        }
    }
}

/// One access token, for one scope set.
#[derive(Clone, Serialize, Deserialize, Zeroize)]
struct AccessEntry {
    /// Sorted scopes, space-separated; empty = the whole grant.
    scope_key: String,
    access_token: String,
    token_type: String,
    /// Unix time it expires, when the provider said.
    expires_at: Option<i64>,
    /// Unix time it was obtained or last checked with the provider (what
    /// caps a token without `expires_at`). Records written before the
    /// field existed have none: their token is checked on next use.
    #[serde(default)]
    checked_at: Option<i64>,
}

/// The sealed part of an account record. Plain strings only inside this
/// module, zeroized on drop.
#[derive(Clone, Default, Serialize, Deserialize, Zeroize)]
#[zeroize(drop)]
struct Tokens {
    refresh_token: Option<String>,
    access: Vec<AccessEntry>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens([REDACTED])")
    }
}

impl Tokens {
    fn entry(&self, scope_key: &str) -> Option<&AccessEntry> {
        self.access.iter().find(|e| e.scope_key == scope_key)
    }

    /// Puts a token set in: its access token under `scope_key`, its refresh
    /// token (if the provider rotated it) replacing the old one.
    fn absorb(&mut self, scope_key: &str, t: &TokenSet, now: i64) {
        if let Some(r) = &t.refresh_token {
            self.refresh_token = Some(r.expose().clone());
        }
        self.access.retain(|e| e.scope_key != scope_key);
        self.access.push(AccessEntry {
            scope_key: scope_key.to_string(),
            access_token: t.access_token.expose().clone(),
            token_type: t.token_type.clone(),
            expires_at: t.expires_in.map(|s| now.saturating_add(s)),
            checked_at: Some(now),
        });
    }
}

/// A key for a scope set: sorted, space-separated.
pub(crate) fn scope_key(scopes: &[String]) -> String {
    let mut v: Vec<&str> = scopes.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.dedup();
    v.join(" ")
}

fn account_key(person: &Person, service: &str) -> Vec<u8> {
    tuple_key(&[&person.iss, &person.sub, service])
}

fn allowance_key(person: &Person, service: &str, agent: &str) -> Vec<u8> {
    tuple_key(&[&person.iss, &person.sub, service, agent])
}

/// The associated data of a sealed record: a label, the tree and the
/// record's own key. Moving a ciphertext anywhere else makes it fail.
fn aad(tree: Tree, key: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(32 + key.len());
    a.extend_from_slice(b"credbroker vault v1\0");
    a.extend_from_slice(tree.name().as_bytes());
    a.push(0);
    a.extend_from_slice(key);
    a
}

/// What a re-wrap pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RotationReport {
    /// The key every record is (being) re-wrapped under.
    pub current_key: String,
    /// Records re-wrapped by this pass.
    pub rewrapped: usize,
    /// Records still under another key (0 when done).
    pub remaining: usize,
    /// Records that could not be opened (reported, left as they are).
    pub unreadable: Vec<String>,
    /// Allowance records that did not open (written in clear by an earlier
    /// release, or without the vault's key): they allowed nothing, and are
    /// removed so that nothing is left under a retired key.
    pub dropped_allowances: usize,
    /// Whether the rotation is finished.
    pub done: bool,
    /// Key ids that sealed nothing any more once done: their files may go.
    pub retired_keys: Vec<String>,
}

/// Token sets opened on the token's fast path, each kept with the sealed
/// text it came from. A record whose sealed text is byte for byte the one
/// opened before holds the same tokens: the text is bound to the account's
/// key (the sealing's associated data) and every sealing draws a fresh
/// nonce, so a refresh, a reconnect or a forged or copied text never
/// matches. A hit skips the base64url, the decryption and the JSON.
/// Served shared, not copied; tokens are zeroized once the map and the
/// last caller have let them go.
type Opened = Kept<Arc<Tokens>>;

/// Account records parsed on the token's fast path, each kept with the
/// stored bytes it was parsed from, and its summary: a hit skips the JSON
/// and the copies. It holds no token in clear (the tokens are sealed).
type Parsed = Kept<Arc<(Account, AccountRecord)>>;

/// Allowances opened on the token's fast path, each kept with the sealed
/// bytes it came from (bound to its store key like the tokens): a hit
/// skips the decryption and the JSON. One that does not open is not kept.
type Allowed = Kept<Allowance>;

/// The vault.
#[derive(Debug)]
pub struct Vault {
    store: Arc<dyn Store>,
    keys: VaultKeys,
    refresh: refresh::Locks,
    opened: Opened,
    parsed: Parsed,
    allowed: Allowed,
}

impl Vault {
    /// Opens the vault over `store`, its keys sealed under `master` (the
    /// keys of an older install are imported from `key_dir`).
    pub fn open(
        store: Arc<dyn Store>,
        master: Arc<Sealer>,
        key_dir: &Path,
    ) -> Result<Vault, VaultError> {
        Vault::open_with_cap(store, master, key_dir, DEFAULT_SEAL_CAP)
    }

    /// Like [`Vault::open`], but with `providers_configured` false no key
    /// is created: a broker without providers never seals.
    pub fn open_for(
        store: Arc<dyn Store>,
        master: Arc<Sealer>,
        key_dir: &Path,
        providers_configured: bool,
    ) -> Result<Vault, VaultError> {
        Vault::open_inner(
            store,
            master,
            key_dir,
            DEFAULT_SEAL_CAP,
            providers_configured,
        )
    }

    /// Like [`Vault::open`] with a custom per-key encryption cap (tests).
    pub fn open_with_cap(
        store: Arc<dyn Store>,
        master: Arc<Sealer>,
        key_dir: &Path,
        cap: u64,
    ) -> Result<Vault, VaultError> {
        Vault::open_inner(store, master, key_dir, cap, true)
    }

    fn open_inner(
        store: Arc<dyn Store>,
        master: Arc<Sealer>,
        key_dir: &Path,
        cap: u64,
        create: bool,
    ) -> Result<Vault, VaultError> {
        let empty = store.scan_prefix(Tree::Accounts, b"")?.is_empty();
        let keys = VaultKeys::load(store.as_ref(), master, key_dir, empty, cap, create)?;
        Ok(Vault {
            store,
            keys,
            refresh: refresh::Locks::default(),
            opened: Opened::default(),
            parsed: Parsed::default(),
            allowed: Allowed::default(),
        })
    }

    /// The keys.
    pub fn keys(&self) -> &VaultKeys {
        &self.keys
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn seal(&self, key: &[u8], tokens: &Tokens) -> Result<String, VaultError> {
        // A rotation another replica made is taken in before sealing.
        let sealer = self.keys.fresh_sealer(self.store.as_ref())?;
        self.keys.count_seal(self.store.as_ref())?;
        let mut plain =
            serde_json::to_vec(tokens).map_err(|_| VaultError::Corrupt("encode".into()))?;
        let sealed = sealer.seal(&aad(Tree::Accounts, key), &plain);
        plain.zeroize();
        let sealed = sealed.map_err(|_| VaultError::Keys("encryption failed".into()))?;
        Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sealed))
    }

    /// [`Vault::open_tokens`] through [`Opened`]: for the token's fast
    /// path only, so that listing or checking every record keeps no
    /// tokens in memory.
    fn open_tokens_kept(&self, key: &[u8], rec: &AccountRecord) -> Result<Arc<Tokens>, VaultError> {
        if let Some(t) = self.opened.get(key, rec.sealed.as_bytes()) {
            return Ok(t);
        }
        let tokens = Arc::new(self.open_tokens(key, rec)?);
        self.opened.put(key, rec.sealed.as_bytes(), tokens.clone());
        Ok(tokens)
    }

    fn open_tokens(&self, key: &[u8], rec: &AccountRecord) -> Result<Tokens, VaultError> {
        let unreadable = |reason: String| VaultError::Unreadable {
            service: rec.service.clone(),
            reason,
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&rec.sealed)
            .map_err(|_| unreadable("the sealed field is not base64url".into()))?;
        let plain = self
            .open_sealed(Tree::Accounts, key, &bytes)?
            .map_err(|e| match e {
                SealError::UnknownKey(id) => unreadable(format!(
                    "it was sealed with key {id}, which is not in the vault key record (store tree state, record vault/keyring/v1)"
                )),
                _ => unreadable(
                    "it does not decrypt (tampered with, truncated, or copied from another record)"
                        .into(),
                ),
            })?;
        serde_json::from_slice(plain.expose())
            .map_err(|_| unreadable("the decrypted tokens are malformed".into()))
    }

    /// Opens `sealed`, stored under `key` in `tree`, with the vault's keys;
    /// a key another replica added since this one loaded the key record is
    /// taken in first. The outer error is the store's; the inner one says
    /// why the record does not open.
    fn open_sealed(
        &self,
        tree: Tree,
        key: &[u8],
        sealed: &[u8],
    ) -> Result<Result<crate::base::secret::SecretBytes, SealError>, VaultError> {
        let open = |s: &Sealer| s.open(&aad(tree, key), sealed);
        let opened = open(&self.keys.sealer());
        if matches!(opened, Err(SealError::UnknownKey(_)))
            && self.keys.reload(self.store.as_ref())?
        {
            return Ok(open(&self.keys.sealer()));
        }
        Ok(opened)
    }

    /// An allowance as stored: the [`Allowance`] sealed under the vault's
    /// current key and bound to its store key, so that a record written
    /// without the key (by an earlier release, which stored them in clear,
    /// or by anyone else who can write the store) or moved from another
    /// person, agent or service never opens.
    fn seal_allowance(&self, key: &[u8], a: &Allowance) -> Result<Vec<u8>, VaultError> {
        let sealer = self.keys.fresh_sealer(self.store.as_ref())?;
        self.keys.count_seal(self.store.as_ref())?;
        let plain = serde_json::to_vec(a).map_err(|_| VaultError::Corrupt("encode".into()))?;
        sealer
            .seal(&aad(Tree::Allowances, key), &plain)
            .map_err(|_| VaultError::Keys("encryption failed".into()))
    }

    /// The allowance stored as `sealed` under `key`, or `None` when it
    /// does not open: such a record allows nothing (the person is asked to
    /// allow again, and [`Vault::allow`] writes over it).
    fn open_allowance(&self, key: &[u8], sealed: &[u8]) -> Result<Option<Allowance>, VaultError> {
        let opened = self
            .open_sealed(Tree::Allowances, key, sealed)?
            .ok()
            .and_then(|plain| serde_json::from_slice::<Allowance>(plain.expose()).ok());
        if opened.is_none() {
            // Once a process: after an upgrade every derive of a person who
            // has not allowed again would find one.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "an allowance record does not open (stored in clear by an earlier release, or written without the vault's key): it allows nothing, the person is asked to allow again, and `credbroker keys rotate-vault` removes such records; said once"
                );
            } else {
                tracing::debug!("an allowance record does not open: it allows nothing");
            }
        }
        Ok(opened)
    }

    fn read(&self, key: &[u8]) -> Result<Option<(Vec<u8>, AccountRecord)>, VaultError> {
        match self.store.get(Tree::Accounts, key)? {
            None => Ok(None),
            Some(raw) => {
                let rec = AccountRecord::parse(&raw)?;
                Ok(Some((raw, rec)))
            }
        }
    }

    /// Writes `rec` if the stored bytes are still `expected`.
    fn swap(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        rec: &AccountRecord,
    ) -> Result<bool, VaultError> {
        let v = serde_json::to_vec(rec).map_err(|_| VaultError::Corrupt("encode".into()))?;
        Ok(self
            .store
            .compare_and_swap(Tree::Accounts, key, expected, Some(&v))?)
    }

    /// Stores (or replaces) the person's account at `service` with fresh
    /// tokens from a code exchange. `provider` names the provider it was
    /// connected at (so a changed provider config is noticed).
    /// `requested_scopes` is what was asked for, used when the provider does
    /// not say what it granted. Returns the previous account id, if any, so
    /// a caller can tell a reconnect to another account.
    // reason: each argument is a distinct fact of one connection (who,
    // which service and provider, the account, its tokens, the scopes
    // asked for, when); the callers have them from different places.
    #[allow(clippy::too_many_arguments)]
    pub fn connect_account(
        &self,
        person: &Person,
        service: &str,
        provider: &str,
        account: &AccountInfo,
        tokens: &TokenSet,
        requested_scopes: &[String],
        now: i64,
    ) -> Result<Option<String>, VaultError> {
        let key = account_key(person, service);
        let mut granted = tokens
            .scope
            .clone()
            .unwrap_or_else(|| requested_scopes.to_vec());
        granted.sort();
        granted.dedup();
        let mut t = Tokens::default();
        t.absorb("", tokens, now);
        loop {
            let old = self.read(&key)?;
            let rec = AccountRecord {
                v: 1,
                person_iss: person.iss.clone(),
                person_sub: person.sub.clone(),
                service: service.to_string(),
                provider: provider.to_string(),
                account_id: account.id.clone(),
                account_name: account.name.clone(),
                scopes: granted.clone(),
                status: AccountStatus::Active,
                created: old.as_ref().map_or(now, |(_, r)| r.created),
                updated: now,
                generation: old.as_ref().map_or(0, |(_, r)| r.generation + 1),
                sealed: self.seal(&key, &t)?,
            };
            if self.swap(&key, old.as_ref().map(|(raw, _)| raw.as_slice()), &rec)? {
                return Ok(old.map(|(_, r)| r.account_id));
            }
        }
    }

    /// The person's account at `service`, without tokens.
    pub fn account(&self, person: &Person, service: &str) -> Result<Option<Account>, VaultError> {
        Ok(self
            .read(&account_key(person, service))?
            .map(|(_, r)| r.summary()))
    }

    /// Every account, or one person's.
    pub fn accounts(&self, person: Option<&Person>) -> Result<Vec<Account>, VaultError> {
        let prefix = person.map_or_else(Vec::new, |p| tuple_key(&[&p.iss, &p.sub]));
        let mut out = Vec::new();
        for (_, v) in self.store.scan_prefix(Tree::Accounts, &prefix)? {
            out.push(AccountRecord::parse(&v)?.summary());
        }
        Ok(out)
    }

    /// Marks the account for reconnection (the provider refused a refresh).
    pub fn mark_reconnect(
        &self,
        person: &Person,
        service: &str,
        now: i64,
    ) -> Result<(), VaultError> {
        let key = account_key(person, service);
        loop {
            let Some((raw, mut rec)) = self.read(&key)? else {
                return Ok(());
            };
            if rec.status == AccountStatus::ReconnectRequired {
                return Ok(());
            }
            rec.status = AccountStatus::ReconnectRequired;
            rec.updated = now;
            rec.generation += 1;
            if self.swap(&key, Some(&raw), &rec)? {
                return Ok(());
            }
        }
    }

    /// Gives (or widens) the person's allowance for `agent` to use `service`
    /// with `scopes`. Scopes already allowed stay allowed.
    pub fn allow(
        &self,
        person: &Person,
        agent: &str,
        service: &str,
        scopes: &[String],
        now: i64,
    ) -> Result<Allowance, VaultError> {
        let key = allowance_key(person, service, agent);
        loop {
            let old = self.store.get(Tree::Allowances, &key)?;
            // A record that does not open allowed nothing: this one
            // replaces it.
            let prev: Option<Allowance> = match &old {
                Some(v) => self.open_allowance(&key, v)?,
                None => None,
            };
            let mut all: Vec<String> = prev.as_ref().map(|a| a.scopes.clone()).unwrap_or_default();
            all.extend(scopes.iter().cloned());
            all.sort();
            all.dedup();
            let a = Allowance {
                agent: agent.to_string(),
                service: service.to_string(),
                scopes: all,
                created: prev.as_ref().map_or(now, |p| p.created),
                updated: now,
            };
            let v = self.seal_allowance(&key, &a)?;
            if self
                .store
                .compare_and_swap(Tree::Allowances, &key, old.as_deref(), Some(&v))?
            {
                return Ok(a);
            }
        }
    }

    /// Every allowance of the person at `service`.
    pub fn allowances(&self, person: &Person, service: &str) -> Result<Vec<Allowance>, VaultError> {
        let prefix = tuple_key(&[&person.iss, &person.sub, service]);
        let mut out = Vec::new();
        for (k, v) in self.store.scan_prefix(Tree::Allowances, &prefix)? {
            out.extend(self.open_allowance(&k, &v)?);
        }
        Ok(out)
    }

    /// Withdraws the allowance of `agent`.
    pub fn disallow(&self, person: &Person, agent: &str, service: &str) -> Result<(), VaultError> {
        let key = allowance_key(person, service, agent);
        self.store.delete(Tree::Allowances, &key)?;
        self.allowed.forget(&key);
        Ok(())
    }

    /// The tokens to revoke before deleting an account: the refresh token
    /// (revoking it ends the grant at most providers) and access tokens.
    /// An unreadable record yields the error, so a caller can say it could
    /// not revoke.
    pub fn tokens_to_revoke(
        &self,
        person: &Person,
        service: &str,
    ) -> Result<Vec<(SecretString, &'static str)>, VaultError> {
        let key = account_key(person, service);
        let (_, rec) = self.read(&key)?.ok_or(VaultError::NoAccount)?;
        let t = self.open_tokens(&key, &rec)?;
        let mut out = Vec::new();
        if let Some(r) = &t.refresh_token {
            out.push((SecretString::new(r.clone()), "refresh_token"));
        }
        for e in &t.access {
            out.push((SecretString::new(e.access_token.clone()), "access_token"));
        }
        Ok(out)
    }

    /// Deletes the account and every allowance at that service. Returns
    /// whether there was an account.
    pub fn delete_account(&self, person: &Person, service: &str) -> Result<bool, VaultError> {
        let key = account_key(person, service);
        let existed = self.store.get(Tree::Accounts, &key)?.is_some();
        // Every allowance record at the service, also one that does not open.
        let prefix = tuple_key(&[&person.iss, &person.sub, service]);
        for (k, _) in self.store.scan_prefix(Tree::Allowances, &prefix)? {
            self.store.delete(Tree::Allowances, &k)?;
            self.allowed.forget(&k);
        }
        self.store.delete(Tree::Accounts, &key)?;
        self.opened.forget(&key);
        self.parsed.forget(&key);
        Ok(existed)
    }

    /// Checks that every account record opens; returns the ones that do not
    /// (person iss, person sub, service, reason). For `accounts list` and
    /// readiness reports.
    pub fn verify_all(&self) -> Result<Vec<(String, String, String, String)>, VaultError> {
        let mut bad = Vec::new();
        for (k, v) in self.store.scan_prefix(Tree::Accounts, b"")? {
            let parts = split_tuple_key(&k).unwrap_or_default();
            let problem = match serde_json::from_slice::<AccountRecord>(&v) {
                Err(_) => Some("malformed record".to_string()),
                Ok(rec) => self.open_tokens(&k, &rec).err().map(|e| e.to_string()),
            };
            if let (Some(p), [iss, sub, service]) = (problem, parts.as_slice()) {
                bad.push((iss.clone(), sub.clone(), service.clone(), p));
            }
        }
        Ok(bad)
    }

    /// Re-wraps records (accounts' tokens and allowances) under the current
    /// key. With no rotation in progress
    /// this first creates a new key and makes it current; with one in
    /// progress (an earlier run was interrupted) it resumes. `limit` caps
    /// the records re-wrapped by this call (`None` = all). Each record is
    /// re-wrapped by compare-and-swap, so a concurrent refresh is never
    /// overwritten and an interruption leaves every record whole, under the
    /// old key or the new one.
    pub fn rotate(&self, limit: Option<usize>) -> Result<RotationReport, VaultError> {
        let state = self.keys.begin_rotation(self.store.as_ref())?;
        let current = state.current;
        let mut report = RotationReport {
            current_key: current.clone(),
            ..RotationReport::default()
        };
        for (k, _) in self.store.scan_prefix(Tree::Accounts, b"")? {
            while let Some((raw, mut rec)) = self.read(&k)? {
                let under = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(&rec.sealed)
                    .ok()
                    .and_then(|b| Sealer::record_key_id(&b));
                if under.as_deref() == Some(current.as_str()) {
                    break;
                }
                if limit.is_some_and(|l| report.rewrapped >= l) {
                    report.remaining += 1;
                    break;
                }
                let tokens = match self.open_tokens(&k, &rec) {
                    Ok(t) => t,
                    Err(e) => {
                        report.unreadable.push(format!(
                            "{}/{}/{}: {e}",
                            rec.person_iss, rec.person_sub, rec.service
                        ));
                        break;
                    }
                };
                rec.sealed = self.seal(&k, &tokens)?;
                rec.generation += 1;
                if self.swap(&k, Some(&raw), &rec)? {
                    report.rewrapped += 1;
                    break;
                }
                // Changed under us (a refresh): read again; it is probably
                // under the new key already.
            }
        }
        for (k, _) in self.store.scan_prefix(Tree::Allowances, b"")? {
            while let Some(raw) = self.store.get(Tree::Allowances, &k)? {
                if Sealer::record_key_id(&raw).as_deref() == Some(current.as_str()) {
                    break;
                }
                if limit.is_some_and(|l| report.rewrapped >= l) {
                    report.remaining += 1;
                    break;
                }
                let new = match self.open_allowance(&k, &raw)? {
                    Some(a) => Some(self.seal_allowance(&k, &a)?),
                    None => None,
                };
                if self
                    .store
                    .compare_and_swap(Tree::Allowances, &k, Some(&raw), new.as_deref())?
                {
                    match new {
                        Some(_) => report.rewrapped += 1,
                        None => report.dropped_allowances += 1,
                    }
                    break;
                }
                // Changed under us (allowed again meanwhile): read again.
            }
        }
        if report.remaining == 0 && report.unreadable.is_empty() {
            self.keys.finish_rotation(self.store.as_ref(), &current)?;
            report.done = true;
            report.retired_keys = self
                .keys
                .loaded()
                .into_iter()
                .filter(|id| *id != current)
                .collect();
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
