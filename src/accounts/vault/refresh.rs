//! A usable provider token for a connected account, refreshed first when it
//! expires within [`REFRESH_MARGIN`] seconds.
//!
//! One refresh at a time per account, on two levels:
//! - **in this process**, a per-account async mutex. Derives that find the
//!   token expiring queue on it; the first refreshes, and the others, once
//!   they hold the mutex, re-read the record and use the token it saved (the
//!   record's generation changed). When the refresh they waited for failed
//!   for lack of the provider, they share that failure instead of trying
//!   again one by one;
//! - **across instances sharing the store** (replicas on PostgreSQL), a
//!   lease in [`Tree::Leases`], taken by the mutex's holder before it reads
//!   the record it may refresh. Its value names this instance and a fresh
//!   random fencing token; its expiry is the store's clock (the database's),
//!   and it lives [`lease_lifetime`]: longer than the provider's whole
//!   timeout, so a holder that is alive finishes (or gives up) before it
//!   lapses, and a holder that died leaves a lease that lapses on its own
//!   and is then taken by the next caller. An instance that finds the lease
//!   held polls the record until the holder's tokens appear (and uses them)
//!   or the lease is free, never longer than one lease lifetime.
//!
//! A rotated refresh token is saved (durably) before any access token is
//! returned, by [`Store::replace_fenced`]: a compare-and-swap on the record
//! that also requires the lease to be still held with this fencing token.
//! A holder whose lease lapsed (paused, partitioned) therefore cannot
//! overwrite what its successor saved; it returns nothing. If the tokens
//! cannot be saved, nothing is returned. If the provider refuses the
//! refresh (`invalid_grant`), the account is marked for reconnection, so
//! later derives answer `reconnect_required` without calling the provider
//! again (no retry loop).
//!
//! On a store of one instance (sled) the lease costs a local write and is
//! always free when the mutex is held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::{account_key, scope_key, AccessEntry, AccountRead, AccountStatus, Vault, VaultError};
use crate::accounts::subject::Person;
use crate::accounts::upstream::Provider;
use crate::base::clock::Clock;
use crate::base::secret::SecretString;
use crate::infra::store::{Fenced, Lease, Store, Tree};

/// Refresh when the token expires within this many seconds.
pub(super) const REFRESH_MARGIN: i64 = 60;

/// The shortest refresh lease, whatever the provider's timeout.
const MIN_LEASE: Duration = Duration::from_secs(1);

/// How often an instance waiting for another instance's refresh of the
/// same account looks at the record again.
const LEASE_POLL: Duration = Duration::from_millis(25);

/// How long a refresh lease lasts: twice the provider's `timeout` (at least
/// `MIN_LEASE`, 1 s). The holder's provider call is bounded by `timeout` as a
/// whole (connect, send, the answer), and the second `timeout` covers the
/// store's reads and the fenced save around it, so a live holder is done
/// before its lease lapses. One that is slower anyway (a pause, a stalled
/// store) finds its save refused by the fence and returns nothing.
pub fn lease_lifetime(provider_timeout: Duration) -> Duration {
    provider_timeout.saturating_mul(2).max(MIN_LEASE)
}

/// A held refresh lease; released when dropped (a failed release only
/// means it lapses at its expiry).
struct HeldLease<'a> {
    store: &'a dyn Store,
    key: &'a [u8],
    holder: Vec<u8>,
}

impl HeldLease<'_> {
    fn lease(&self) -> Lease<'_> {
        Lease {
            tree: Tree::Leases,
            key: self.key,
            holder: &self.holder,
        }
    }
}

impl Drop for HeldLease<'_> {
    fn drop(&mut self) {
        if let Err(e) = self
            .store
            .replace_expiring(Tree::Leases, self.key, &self.holder, None)
        {
            tracing::warn!(error = %e, "a refresh lease was not released; it lapses at its expiry");
        }
    }
}

/// A lease value: this instance (`<host name>/<pid>`) and 16 random bytes,
/// the fencing token that tells this holding from every other.
fn lease_holder() -> Result<Vec<u8>, VaultError> {
    let mut token = [0u8; 16];
    aws_lc_rs::rand::fill(&mut token)
        .map_err(|_| VaultError::Keys("the system random generator failed".into()))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    Ok(format!(
        "{}/{} {}",
        host.trim(),
        std::process::id(),
        hex::encode(token)
    )
    .into_bytes())
}

/// A provider token ready to hand over.
#[derive(Debug)]
pub struct ServiceToken {
    /// The provider's access token.
    pub access_token: SecretString,
    /// The provider's `token_type`.
    pub token_type: String,
    /// Unix time it expires, when known.
    pub expires_at: Option<i64>,
    /// Whether it was narrowed to the requested scopes on refresh.
    pub narrowed: bool,
    /// Whether this call refreshed it.
    pub refreshed: bool,
    /// The account's refresh token, when it has one: never handed out; the
    /// egress proxy's echo guard scans answers for it.
    pub refresh_token: Option<SecretString>,
}

/// The outcome of asking for a token.
#[derive(Debug)]
pub enum TokenOutcome {
    /// A token.
    Token(ServiceToken),
    /// No account (it was deleted meanwhile).
    NoAccount,
    /// The account must be connected again.
    Reconnect,
    /// The provider could not be reached or answered unusably; nothing is
    /// returned (never a stale token). The text holds no secret.
    Unavailable(String),
}

/// What to get a token for.
#[derive(Debug, Clone, Copy)]
pub struct TokenRequest<'a> {
    /// The person.
    pub person: &'a Person,
    /// The service.
    pub service: &'a str,
    /// The scopes the tool needs (narrowed to where the provider allows).
    pub scopes: &'a [String],
}

#[derive(Debug, Default)]
pub(super) struct LockState {
    /// When the last refresh failed for lack of the provider, and why.
    last_failure: Option<(Instant, String)>,
}

/// The per-account refresh mutexes.
#[derive(Debug, Default)]
pub(super) struct Locks {
    map: DashMap<Vec<u8>, Arc<tokio::sync::Mutex<LockState>>>,
}

impl Locks {
    fn get(&self, key: &[u8]) -> Arc<tokio::sync::Mutex<LockState>> {
        self.map.entry(key.to_vec()).or_default().clone()
    }

    /// Drops mutexes nobody holds or waits for.
    pub(super) fn housekeeping(&self) {
        self.map.retain(|_, m| Arc::strong_count(m) > 1);
    }
}

/// Whether a stored token may be served without asking the provider: one
/// with a lifetime until `REFRESH_MARGIN` before it ends; one without
/// (no `expires_in`) for `recheck` seconds after it was obtained or last
/// checked.
fn fresh(e: &AccessEntry, now: i64, recheck: i64) -> bool {
    match e.expires_at {
        Some(t) => t > now + REFRESH_MARGIN,
        None => e
            .checked_at
            .is_some_and(|c| c <= now.saturating_add(60) && now - c < recheck),
    }
}

fn token(
    e: &AccessEntry,
    refresh_token: &Option<String>,
    narrowed: bool,
    refreshed: bool,
) -> ServiceToken {
    ServiceToken {
        access_token: SecretString::new(e.access_token.clone()),
        token_type: e.token_type.clone(),
        expires_at: e.expires_at,
        narrowed,
        refreshed,
        refresh_token: refresh_token.clone().map(SecretString::new),
    }
}

impl Vault {
    /// Writes `rec` if the stored bytes are still `expected` and `lease` is
    /// still held (see [`Store::replace_fenced`]).
    fn swap_fenced(
        &self,
        key: &[u8],
        expected: &[u8],
        rec: &super::AccountRecord,
        lease: &HeldLease<'_>,
    ) -> Result<Fenced, VaultError> {
        let v = serde_json::to_vec(rec).map_err(|_| VaultError::Corrupt("encode".into()))?;
        Ok(self
            .store
            .replace_fenced(Tree::Accounts, key, expected, &v, lease.lease())?)
    }

    /// Drops refresh mutexes that are not in use (call periodically).
    pub fn housekeeping(&self) {
        self.refresh.housekeeping();
    }

    /// The provider token for the person's account at `r.service`,
    /// refreshed first if needed. The caller has checked the account and
    /// the allowance; this only deals with tokens.
    pub async fn provider_token(
        &self,
        provider: &Provider,
        r: &TokenRequest<'_>,
        clock: &dyn Clock,
    ) -> Result<TokenOutcome, VaultError> {
        self.provider_token_refusing(provider, r, None, clock).await
    }

    /// [`Vault::provider_token`], treating `refused` (an access token the
    /// provider has just answered 401 to) as expired: if the stored token is
    /// still that one, it is refreshed (one at a time, as always); if another
    /// caller refreshed meanwhile, the new token is returned. The egress
    /// proxy's one retry after a 401.
    pub async fn provider_token_refusing(
        &self,
        provider: &Provider,
        r: &TokenRequest<'_>,
        refused: Option<&str>,
        clock: &dyn Clock,
    ) -> Result<TokenOutcome, VaultError> {
        let key = account_key(r.person, r.service);
        let Some((_, rec)) = self.read(&key)? else {
            return Ok(TokenOutcome::NoAccount);
        };
        self.token_from(provider, r, refused, clock, key, &rec)
            .await
    }

    /// [`Vault::provider_token_refusing`] starting from the record the
    /// caller has just read with [`Vault::account_read`] for its own checks,
    /// instead of reading it again: a derive then reads the account once
    /// when its token is fresh. Only that first look trusts `read`; a
    /// refresh, and the wait for another instance's, read the record again
    /// (under the lock and the lease), as always. A `read` of another
    /// account than `r` names is not used (the record is read afresh).
    pub async fn provider_token_after(
        &self,
        provider: &Provider,
        r: &TokenRequest<'_>,
        read: AccountRead,
        refused: Option<&str>,
        clock: &dyn Clock,
    ) -> Result<TokenOutcome, VaultError> {
        let key = account_key(r.person, r.service);
        if read.key != key {
            return self
                .provider_token_refusing(provider, r, refused, clock)
                .await;
        }
        self.token_from(provider, r, refused, clock, key, &read.parsed.1)
            .await
    }

    /// The token logic after the first read of the account's record `rec`
    /// (stored under `key`): the stored token when it is fresh; else, one
    /// refresh at a time (this process's mutex, then the lease across
    /// instances), the tokens another holder saved meanwhile, the check of
    /// a token without a lifetime, or a refresh saved before it is served.
    async fn token_from(
        &self,
        provider: &Provider,
        r: &TokenRequest<'_>,
        refused: Option<&str>,
        clock: &dyn Clock,
        key: Vec<u8>,
        rec: &super::AccountRecord,
    ) -> Result<TokenOutcome, VaultError> {
        let now = clock.now();
        if rec.status == AccountStatus::ReconnectRequired {
            return Ok(TokenOutcome::Reconnect);
        }
        let want = Want::new(provider, r, refused, key, rec);
        {
            let tokens = self.open_tokens_kept(&want.key, rec)?;
            if let Some(e) = tokens.entry(&want.skey).filter(|e| want.fresh(e, now)) {
                return Ok(TokenOutcome::Token(token(
                    e,
                    &tokens.refresh_token,
                    want.narrow,
                    false,
                )));
            }
        }

        // Slow path: one refresh at a time for this account.
        let lock = self.refresh.get(&want.key);
        let waiting_since = Instant::now();
        let Ok(mut guard) = tokio::time::timeout(provider.config().timeout, lock.lock()).await
        else {
            return Ok(TokenOutcome::Unavailable(
                "waited too long for another refresh of this account".into(),
            ));
        };
        let lease = match self.take_lease(provider, &want, clock).await? {
            Ok(lease) => lease,
            Err(outcome) => return Ok(outcome),
        };
        crate::infra::failpoint::pause("vault.refresh.lease_taken");

        // Under the lease: read what the previous holder left.
        let now = clock.now();
        let held = match self.read_held(&want, now)? {
            Ok(held) => held,
            Err(outcome) => return Ok(outcome),
        };
        if let Some((at, why)) = &guard.last_failure {
            if *at >= waiting_since {
                return Ok(TokenOutcome::Unavailable(why.clone()));
            }
        }
        let mut held = held;
        if held.tokens.refresh_token.is_none() {
            let checked = self
                .check_unexpiring(
                    provider,
                    r,
                    clock,
                    &want,
                    &mut held,
                    &mut guard.last_failure,
                )
                .await?;
            if let Some(outcome) = checked {
                return Ok(outcome);
            }
        }
        let Some(refresh_token) = held.tokens.refresh_token.clone().map(SecretString::new) else {
            // Expired (or about to) and nothing to refresh with.
            self.mark_reconnect(r.person, r.service, now)?;
            return Ok(TokenOutcome::Reconnect);
        };
        let answer = provider
            .refresh(refresh_token.expose(), want.narrow.then_some(r.scopes))
            .await;
        let set = match answer {
            Ok(set) => set,
            Err(e) if e.is_invalid_grant() => {
                guard.last_failure = None;
                tracing::warn!(service = %r.service, "the provider refused the refresh token; the account needs reconnecting");
                self.mark_reconnect(r.person, r.service, clock.now())?;
                return Ok(TokenOutcome::Reconnect);
            }
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(service = %r.service, error = %why, "refresh failed");
                guard.last_failure = Some((Instant::now(), why.clone()));
                return Ok(TokenOutcome::Unavailable(why));
            }
        };
        let now = clock.now();
        if set.expires_in.is_some_and(|s| s <= 0) {
            return Ok(TokenOutcome::Unavailable(
                "the provider issued an already expired token".into(),
            ));
        }
        let tokens = match self.save_refreshed(r, &want, held, &set, now, &lease)? {
            Ok(tokens) => tokens,
            Err(outcome) => return Ok(outcome),
        };
        guard.last_failure = None;
        match tokens.entry(&want.skey) {
            Some(e) => Ok(TokenOutcome::Token(token(
                e,
                &tokens.refresh_token,
                want.narrow,
                true,
            ))),
            None => Ok(TokenOutcome::Unavailable(
                "the refreshed token was not stored".into(),
            )),
        }
    }

    /// Across instances: takes the account's lease, or else serves the
    /// tokens its holder saves (`Err`: that outcome). Waiting is bounded by
    /// one lease lifetime: by then the holder has released it or it has
    /// lapsed.
    async fn take_lease<'a>(
        &'a self,
        provider: &Provider,
        want: &'a Want<'_>,
        clock: &dyn Clock,
    ) -> Result<Result<HeldLease<'a>, TokenOutcome>, VaultError> {
        let key = want.key.as_slice();
        let ttl = lease_lifetime(provider.config().timeout);
        let holder = lease_holder()?;
        let give_up = Instant::now() + ttl + LEASE_POLL;
        loop {
            if self
                .store
                .insert_expiring(Tree::Leases, key, &holder, ttl)?
            {
                return Ok(Ok(HeldLease {
                    store: self.store.as_ref(),
                    key,
                    holder,
                }));
            }
            let now = clock.now();
            let Some((_, rec)) = self.read(key)? else {
                return Ok(Err(TokenOutcome::NoAccount));
            };
            if rec.status == AccountStatus::ReconnectRequired {
                return Ok(Err(TokenOutcome::Reconnect));
            }
            let tokens = self.open_tokens(key, &rec)?;
            if let Some(e) = tokens
                .entry(&want.skey)
                .filter(|e| want.usable(e, rec.generation, now))
            {
                return Ok(Err(TokenOutcome::Token(token(
                    e,
                    &tokens.refresh_token,
                    want.narrow,
                    false,
                ))));
            }
            if Instant::now() >= give_up {
                return Ok(Err(TokenOutcome::Unavailable(
                    "waited too long for another instance's refresh of this account".into(),
                )));
            }
            tokio::time::sleep(LEASE_POLL).await;
        }
    }

    /// The account's record as it is now, under the lease, with its tokens
    /// opened; `Err` when that settles the request: no account, one to
    /// reconnect, or the tokens the previous holder saved.
    fn read_held(
        &self,
        want: &Want<'_>,
        now: i64,
    ) -> Result<Result<Held, TokenOutcome>, VaultError> {
        let Some((raw, rec)) = self.read(&want.key)? else {
            return Ok(Err(TokenOutcome::NoAccount));
        };
        if rec.status == AccountStatus::ReconnectRequired {
            return Ok(Err(TokenOutcome::Reconnect));
        }
        let tokens = self.open_tokens(&want.key, &rec)?;
        if let Some(e) = tokens
            .entry(&want.skey)
            .filter(|e| want.usable(e, rec.generation, now))
        {
            return Ok(Err(TokenOutcome::Token(token(
                e,
                &tokens.refresh_token,
                want.narrow,
                false,
            ))));
        }
        Ok(Ok(Held { raw, rec, tokens }))
    }

    /// A token without a lifetime and nothing to refresh it with: the
    /// fresh check is the account look-up with the token itself (`None`
    /// when there is no such token). Still the same account: served, and
    /// the check's time saved; refused by the provider, or another account:
    /// the account needs reconnecting.
    async fn check_unexpiring(
        &self,
        provider: &Provider,
        r: &TokenRequest<'_>,
        clock: &dyn Clock,
        want: &Want<'_>,
        held: &mut Held,
        last_failure: &mut Option<(Instant, String)>,
    ) -> Result<Option<TokenOutcome>, VaultError> {
        let unexpiring = held
            .tokens
            .entry(&want.skey)
            .filter(|e| e.expires_at.is_none())
            .map(|e| {
                (
                    SecretString::new(e.access_token.clone()),
                    e.token_type.clone(),
                )
            });
        let Some((access, token_type)) = unexpiring else {
            return Ok(None);
        };
        let outcome = match provider.account_info(access.expose()).await {
            Ok(who) if who.id == held.rec.account_id => {
                let now = clock.now();
                let skey = &want.skey;
                if let Some(e) = held.tokens.access.iter_mut().find(|e| &e.scope_key == skey) {
                    e.checked_at = Some(now);
                }
                let mut next = held.rec.clone();
                next.sealed = self.seal(&want.key, &held.tokens)?;
                next.generation = held.rec.generation + 1;
                next.updated = now;
                // Losing the race to another write only means the next use
                // checks again.
                let _ = self.swap(&want.key, Some(&held.raw), &next)?;
                *last_failure = None;
                TokenOutcome::Token(ServiceToken {
                    access_token: access,
                    token_type,
                    expires_at: None,
                    narrowed: want.narrow,
                    refreshed: false,
                    refresh_token: None,
                })
            }
            Ok(_) | Err(crate::accounts::upstream::UpstreamError::Rejected { .. }) => {
                tracing::warn!(service = %r.service, "the provider no longer accepts the token (it has no lifetime); the account needs reconnecting");
                self.mark_reconnect(r.person, r.service, clock.now())?;
                TokenOutcome::Reconnect
            }
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(service = %r.service, error = %why, "the check of a token without a lifetime failed");
                *last_failure = Some((Instant::now(), why.clone()));
                TokenOutcome::Unavailable(why)
            }
        };
        Ok(Some(outcome))
    }

    /// Saves the refreshed tokens before any leaves this function: the
    /// rotated refresh token is durable first. A record changed under us (a
    /// re-wrap by a rotation) is merged into if it is still the same
    /// account; a lease lost meanwhile drops the tokens (`Err`: that
    /// outcome).
    fn save_refreshed(
        &self,
        r: &TokenRequest<'_>,
        want: &Want<'_>,
        held: Held,
        set: &crate::accounts::upstream::TokenSet,
        now: i64,
        lease: &HeldLease<'_>,
    ) -> Result<Result<super::Tokens, TokenOutcome>, VaultError> {
        let Held {
            mut raw,
            mut rec,
            mut tokens,
        } = held;
        let key = want.key.as_slice();
        loop {
            tokens.absorb(&want.skey, set, now);
            let mut next = rec.clone();
            next.sealed = self.seal(key, &tokens)?;
            next.generation = rec.generation + 1;
            next.updated = now;
            match self.swap_fenced(key, &raw, &next, lease)? {
                Fenced::Swapped => return Ok(Ok(tokens)),
                Fenced::LeaseLost => {
                    // Another instance may hold the lease now and spend
                    // the refresh token itself: ours must not be saved
                    // over its tokens, and nothing is handed out.
                    tracing::warn!(service = %r.service, "the refresh lease lapsed before the new tokens were saved; they are dropped");
                    return Ok(Err(TokenOutcome::Unavailable(
                        "the refresh took longer than its lease".into(),
                    )));
                }
                Fenced::Changed => {}
            }
            let Some((raw2, rec2)) = self.read(key)? else {
                return Ok(Err(TokenOutcome::NoAccount));
            };
            if rec2.account_id != rec.account_id || rec2.status != AccountStatus::Active {
                return Ok(Err(TokenOutcome::Unavailable(
                    "the account changed during the refresh".into(),
                )));
            }
            tokens = self.open_tokens(key, &rec2)?;
            (raw, rec) = (raw2, rec2);
        }
    }
}

/// What one token request takes from an account's stored tokens.
struct Want<'r> {
    /// The account's store key.
    key: Vec<u8>,
    /// The scope key of the entry it takes (empty: the account's own).
    skey: String,
    /// Whether it asks for the tool's narrower scopes.
    narrow: bool,
    /// Seconds a token without a lifetime is served before a check.
    recheck: i64,
    /// A token the provider has just refused (never served again).
    refused: Option<&'r str>,
    /// The record's generation at the first read.
    seen_generation: u64,
}

impl<'r> Want<'r> {
    fn new(
        provider: &Provider,
        r: &TokenRequest<'_>,
        refused: Option<&'r str>,
        key: Vec<u8>,
        rec: &super::AccountRecord,
    ) -> Want<'r> {
        let recheck = i64::try_from(provider.config().recheck_unexpiring_token_after.as_secs())
            .unwrap_or(3600);
        let narrow =
            provider.config().narrow_on_refresh && scope_key(r.scopes) != scope_key(&rec.scopes);
        Want {
            key,
            skey: if narrow {
                scope_key(r.scopes)
            } else {
                String::new()
            },
            narrow,
            recheck,
            refused,
            seen_generation: rec.generation,
        }
    }

    fn not_refused(&self, e: &AccessEntry) -> bool {
        self.refused.is_none_or(|t| t != e.access_token)
    }

    /// Served on the first look without asking anyone.
    fn fresh(&self, e: &AccessEntry, now: i64) -> bool {
        fresh(e, now, self.recheck) && self.not_refused(e)
    }

    /// Served after waiting: fresh, or saved since the first look (by this
    /// process or another instance) and not expired.
    fn usable(&self, e: &AccessEntry, generation: u64, now: i64) -> bool {
        let refreshed_meanwhile =
            generation != self.seen_generation && e.expires_at.is_none_or(|t| t > now);
        (fresh(e, now, self.recheck) || refreshed_meanwhile) && self.not_refused(e)
    }
}

/// The account's record as read under the lease, with its tokens opened.
struct Held {
    raw: Vec<u8>,
    rec: super::AccountRecord,
    tokens: super::Tokens,
}
