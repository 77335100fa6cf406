//! The token's fast path's two reads (a derive for a service, each proxied
//! call): the person's account at the service and their allowance for the
//! agent, each one store read, and what was worked out from the same bytes
//! before served again ([`super::kept`]).
//!
//! Each has a blocking form and an async one. The async one reads with
//! [`Store::get_async`]: on PostgreSQL, called on one of the `per_core` API
//! threads, the statement goes out and its answer comes back on the thread
//! serving the request, instead of handing off to the store's runtime and
//! back (each hand-off is a thread woken and one put to sleep).
//!
//! [`Store::get_async`]: crate::infra::store::Store::get_async

use std::sync::Arc;

use super::{account_key, allowance_key, AccountRead, AccountRecord, Allowance, Vault, VaultError};
use crate::accounts::subject::Person;
use crate::infra::store::Tree;

impl Vault {
    /// The person's account at `service` as read once, for a caller that
    /// checks the account and then needs its token: pass it on to
    /// [`Vault::provider_token_after`], which then does not read the same
    /// record again.
    pub fn account_read(
        &self,
        person: &Person,
        service: &str,
    ) -> Result<Option<AccountRead>, VaultError> {
        let key = account_key(person, service);
        let raw = self.store.get(Tree::Accounts, &key)?;
        self.account_from(key, raw)
    }

    /// [`Vault::account_read`], reading with [`Store::get_async`].
    ///
    /// [`Store::get_async`]: crate::infra::store::Store::get_async
    pub async fn account_read_async(
        &self,
        person: &Person,
        service: &str,
    ) -> Result<Option<AccountRead>, VaultError> {
        let key = account_key(person, service);
        let raw = self.store.get_async(Tree::Accounts, &key).await?;
        self.account_from(key, raw)
    }

    fn account_from(
        &self,
        key: Vec<u8>,
        raw: Option<Vec<u8>>,
    ) -> Result<Option<AccountRead>, VaultError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        let parsed = match self.parsed.get(&key, &raw) {
            Some(p) => p,
            None => {
                let rec = AccountRecord::parse(&raw)?;
                let p = Arc::new((rec.summary(), rec));
                self.parsed.put(&key, &raw, p.clone());
                p
            }
        };
        Ok(Some(AccountRead { key, parsed }))
    }

    /// The person's allowance for `agent` at `service`.
    pub fn allowance(
        &self,
        person: &Person,
        agent: &str,
        service: &str,
    ) -> Result<Option<Allowance>, VaultError> {
        let key = allowance_key(person, service, agent);
        let sealed = self.store.get(Tree::Allowances, &key)?;
        self.allowance_from(&key, sealed)
    }

    /// [`Vault::allowance`], reading with [`Store::get_async`].
    ///
    /// [`Store::get_async`]: crate::infra::store::Store::get_async
    pub async fn allowance_async(
        &self,
        person: &Person,
        agent: &str,
        service: &str,
    ) -> Result<Option<Allowance>, VaultError> {
        let key = allowance_key(person, service, agent);
        let sealed = self.store.get_async(Tree::Allowances, &key).await?;
        self.allowance_from(&key, sealed)
    }

    fn allowance_from(
        &self,
        key: &[u8],
        sealed: Option<Vec<u8>>,
    ) -> Result<Option<Allowance>, VaultError> {
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        if let Some(a) = self.allowed.get(key, &sealed) {
            return Ok(Some(a));
        }
        let opened = self.open_allowance(key, &sealed)?;
        if let Some(a) = &opened {
            self.allowed.put(key, &sealed, a.clone());
        }
        Ok(opened)
    }
}
