//! Operator actions, each written once: freeze, signing-key rotation, vault
//! rotation, adding, listing and removing local users, disconnecting an account, listing
//! accounts. Each function makes its store change and records its audit
//! event together, so the admin socket (a running instance) and the command
//! line (no instance runs, [`Offline`]) cannot drift apart: an action that
//! changes state is audited whichever way it ran.
//!
//! An action on a stopped instance opens the store itself, and refuses to
//! run as anyone but the store directory's owner ([`check_owner`]): run as
//! root it would create an audit file, store files and lock files that the
//! broker's user can no longer open.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::accounts::subject::Person;
use crate::accounts::vault::Vault;
use crate::base::clock::Clock;
use crate::derive::exchange::Broker;
use crate::infra::config::Config;
use crate::infra::events::{Audit, Event, Kind};
use crate::infra::seal::Sealer;
use crate::infra::store::Store;

/// Errors of an operator action.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::infra::store::StoreError),
    /// Signing keys.
    #[error("signing keys: {0}")]
    Mint(#[from] crate::derive::mint::MintError),
    /// The vault (keys, records).
    #[error("vault: {0}")]
    Vault(#[from] crate::accounts::vault::VaultError),
    /// A local user was refused (bad name or password, or it exists).
    #[error(transparent)]
    User(#[from] crate::accounts::users::UserError),
    /// Disconnecting an account failed.
    #[error(transparent)]
    Disconnect(#[from] crate::accounts::connect::DisconnectError),
    /// The blocking task running the action failed.
    #[error("the {0} task failed")]
    Task(&'static str),
    /// Run by another user than the store's owner (see [`check_owner`]).
    #[error("{0}")]
    NotOwner(String),
    /// Opening the store, the audit log or a key file with no instance.
    #[error("{what} {}: {source}", path.display())]
    Open {
        /// What was opened.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Error.
        source: std::io::Error,
    },
    /// The sealing key.
    #[error("master key: {0}")]
    Seal(#[from] crate::infra::seal::SealError),
    /// Ending what the store holds for a stopped person failed (links,
    /// approvals).
    #[error("ending the stopped person's links and approvals: {0}")]
    Stop(String),
    /// A freeze with no instance running, asked for without the key that
    /// signs its record.
    #[error("the freeze record cannot be signed: the master key was not loaded")]
    NoFreezeKey,
}

/// Where an action's audit event goes: the running broker's sink, or the
/// audit file opened by [`Offline`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recorder<'a> {
    /// The audit sink.
    pub audit: &'a Audit,
    /// The agent this instance serves (every event names it).
    pub agent: &'a str,
    /// The clock.
    pub clock: &'a dyn Clock,
}

impl<'a> Recorder<'a> {
    /// The running broker's recorder.
    pub(crate) fn of(broker: &'a Broker) -> Recorder<'a> {
        Recorder {
            audit: &broker.audit,
            agent: &broker.config.agent,
            clock: broker.clock.as_ref(),
        }
    }

    /// Records one event. The store change it reports has already happened
    /// and cannot be undone, so a failing sink is logged, not returned (as
    /// the admin socket always did).
    fn record<'e>(&self, event: Kind, fill: impl FnOnce(&mut Event<'e>))
    where
        'a: 'e,
    {
        let mut e = Event::new(self.clock.now(), event, self.agent);
        fill(&mut e);
        if let Err(err) = self.audit.record(&e) {
            tracing::error!(error = %err, event = event.as_str(), "the audit event was not written");
        }
    }
}

/// The state an action changes: a running instance's broker (which also
/// holds it in memory), or the store of an instance that is not running.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// A running instance.
    Running(&'a Broker),
    /// No instance runs: the store itself.
    Stopped(&'a dyn Store),
}

/// Sets or lifts the emergency freeze. Returns whether derives are frozen
/// afterwards (a running instance may also be frozen by its policy).
/// `key` signs the record when no instance runs (a running one has its own).
pub(crate) fn freeze(
    target: Target<'_>,
    key: Option<&crate::derive::freeze::FreezeKey>,
    rec: Recorder<'_>,
    on: bool,
) -> Result<bool, OpError> {
    let frozen = match (target, key) {
        (Target::Running(b), _) => {
            b.set_frozen(on)?;
            tracing::warn!(frozen = on, "emergency freeze changed by the admin socket");
            b.is_frozen()
        }
        (Target::Stopped(store), Some(key)) => {
            crate::derive::freeze::write(store, key, &crate::derive::freeze::Seen::default(), on)?;
            on
        }
        (Target::Stopped(_), None) => return Err(OpError::NoFreezeKey),
    };
    rec.record(
        if on {
            Kind::AdminFrozen
        } else {
            Kind::AdminUnfrozen
        },
        |e| {
            e.outcome = Some(if on { "frozen" } else { "unfrozen" });
        },
    );
    Ok(frozen)
}

/// Rotates the signing key with one compare-and-swap of the key ring
/// ([`crate::derive::mint::rotate`]): a scheduled rotation publishes the new key now
/// and activates it after its delay (a second call while one is pending adds
/// nothing and reports the pending key); an emergency rotation activates it
/// at once and withdraws every other key. Logs the new `kid`, and its audit
/// event names it.
pub(crate) fn rotate_keys(
    target: Target<'_>,
    sealer: &Sealer,
    rec: Recorder<'_>,
    kind: crate::derive::mint::RotationKind,
) -> Result<crate::derive::mint::Rotation, OpError> {
    let r = match target {
        Target::Running(b) => b
            .minter
            // The database's time: the activation time is everyone's.
            .rotate(b.store.as_ref(), sealer, b.shared_now(), kind)?,
        Target::Stopped(store) => {
            crate::derive::mint::rotate(store, sealer, rec.clock.now(), kind)?
        }
    };
    tracing::info!(
        kid = %r.kid,
        added = r.added,
        activates_at = r.activates_at,
        emergency = r.emergency,
        withdrawn = ?r.withdrawn,
        "signing key rotated"
    );
    let outcome = if !r.added {
        "already_pending"
    } else if r.emergency {
        "emergency"
    } else {
        "scheduled"
    };
    rec.record(Kind::KeysRotated, |e| {
        e.outcome = Some(outcome);
        e.kid = Some(r.kid.clone());
    });
    Ok(r)
}

/// Rotates the client key (`derive::client_keys`: client assertions and
/// actor tokens at upstream authorization servers) as [`rotate_keys`] does
/// the signing key: one compare-and-swap of its own ring, the new key
/// published at `{issuer}/.well-known/client-jwks.json` now and signing
/// after the delay (an emergency rotation: at once, every other key
/// withdrawn). Its audit event, `client_keys.rotated`, names the new key
/// and the one it replaces.
pub(crate) fn rotate_client_keys(
    target: Target<'_>,
    sealer: &Sealer,
    rec: Recorder<'_>,
    kind: crate::derive::mint::RotationKind,
) -> Result<crate::derive::mint::Rotation, OpError> {
    use crate::derive::client_keys;
    let r = match target {
        Target::Running(b) => {
            let now = b.shared_now();
            let retired = client_keys::active_kid(b.store.as_ref(), sealer, now)?;
            let r = match b.client_keys() {
                Some(k) => k.rotate(b.store.as_ref(), sealer, now, kind)?,
                None => client_keys::rotate(b.store.as_ref(), sealer, now, kind)?,
            };
            (retired, r)
        }
        Target::Stopped(store) => {
            let now = rec.clock.now();
            let retired = client_keys::active_kid(store, sealer, now)?;
            (retired, client_keys::rotate(store, sealer, now, kind)?)
        }
    };
    let (retired, r) = r;
    tracing::info!(
        kid = %r.kid,
        retired_kid = %retired,
        added = r.added,
        activates_at = r.activates_at,
        emergency = r.emergency,
        "client key rotated"
    );
    let outcome = if !r.added {
        "already_pending"
    } else if r.emergency {
        "emergency"
    } else {
        "scheduled"
    };
    rec.record(Kind::ClientKeysRotated, |e| {
        e.outcome = Some(outcome);
        e.kid = Some(r.kid.clone());
        e.retired_kid = Some(retired.clone());
    });
    Ok(r)
}

/// Re-wraps up to `limit` vault records under the current vault key
/// (resumable: run again until the report says done).
pub(crate) fn rotate_vault(
    vault: &Vault,
    limit: Option<usize>,
    rec: Recorder<'_>,
) -> Result<crate::accounts::vault::RotationReport, OpError> {
    let report = vault.rotate(limit)?;
    rec.record(Kind::VaultRotated, |e| {
        e.outcome = Some(if report.done { "done" } else { "in_progress" });
    });
    Ok(report)
}

/// Adds (or, with `replace`, resets) a local account for the pages.
pub(crate) fn add_user(
    store: &dyn Store,
    sealer: &Sealer,
    name: &str,
    password: &crate::base::secret::SecretString,
    replace: bool,
    rec: Recorder<'_>,
) -> Result<(), OpError> {
    crate::accounts::users::add(store, sealer, name, password, replace, rec.clock.now())?;
    rec.record(Kind::UsersAdded, |e| {
        e.person_sub = Some(name);
        e.outcome = Some(if replace { "replaced" } else { "added" });
    });
    Ok(())
}

/// The local accounts (names, creation times, locks; never a hash) and
/// the names whose records do not open.
pub(crate) fn list_users(
    store: &dyn Store,
    sealer: &Sealer,
    now: i64,
) -> Result<serde_json::Value, OpError> {
    let (users, unreadable) = crate::accounts::users::list(store, sealer, now)?;
    Ok(serde_json::json!({"users": users, "unreadable": unreadable}))
}

/// What `users remove` did.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Removed {
    /// Whether there was an account of that name.
    pub removed: bool,
    /// How many page sessions signed in as it were ended.
    pub sessions_ended: usize,
}

/// Removes the local account `name`, then ends every page session signed
/// in with it (`end_sessions`: the pages' own, handed in from above, as
/// the pages are a layer above), also when there was no account (a session
/// may outlive an account deleted another way). The account goes first, so
/// no new sign-in starts once its sessions are being ended.
pub(crate) fn remove_user(
    store: &dyn Store,
    name: &str,
    end_sessions: impl FnOnce(&dyn Store, &str) -> Result<usize, crate::infra::store::StoreError>,
    rec: Recorder<'_>,
) -> Result<Removed, OpError> {
    let removed = crate::accounts::users::remove(store, name)?;
    let sessions_ended = end_sessions(store, name)?;
    rec.record(Kind::UsersRemoved, |e| {
        e.person_sub = Some(name);
        e.outcome = Some(if removed { "removed" } else { "not_found" });
    });
    Ok(Removed {
        removed,
        sessions_ended,
    })
}

/// Revokes an account's tokens at its provider (RFC 7009) where it can,
/// and deletes the account with its allowances (even if revocation failed
/// when `force`).
pub(crate) async fn disconnect(
    vault: &Vault,
    providers: &crate::accounts::upstream::Providers,
    person: &Person,
    service: &str,
    force: bool,
    rec: Recorder<'_>,
) -> Result<crate::accounts::connect::DisconnectReport, OpError> {
    let provider = providers.get(service).map(|p| p.as_ref());
    let report =
        crate::accounts::connect::disconnect_account(vault, provider, person, service, force)
            .await?;
    rec.record(Kind::AccountDisconnected, |e| {
        e.person_iss = Some(&person.iss);
        e.person_sub = Some(&person.sub);
        e.service = Some(service);
        e.outcome = Some(if report.deleted { "deleted" } else { "kept" });
        e.reason = Some(report.revocation);
    });
    Ok(report)
}

/// The connected accounts (one person's, or all) with their allowances,
/// and the records that do not open (reported, never served). No token.
/// A read: no event.
pub(crate) fn list_accounts(
    vault: &Vault,
    person: Option<&Person>,
) -> Result<serde_json::Value, OpError> {
    let mut list = Vec::new();
    for a in vault.accounts(person)? {
        let p = Person {
            iss: a.person_iss.clone(),
            sub: a.person_sub.clone(),
        };
        let allowances = vault.allowances(&p, &a.service)?;
        let mut v = serde_json::to_value(&a).unwrap_or_default();
        v["allowances"] = serde_json::to_value(allowances).unwrap_or_default();
        list.push(v);
    }
    let unreadable: Vec<serde_json::Value> = vault
        .verify_all()?
        .into_iter()
        .filter(|(iss, sub, _, _)| person.is_none_or(|p| p.iss == *iss && p.sub == *sub))
        .map(|(iss, sub, service, problem)| {
            serde_json::json!({"person_iss": iss, "person_sub": sub, "service": service, "problem": problem})
        })
        .collect();
    Ok(serde_json::json!({"accounts": list, "unreadable": unreadable}))
}

/// What `persons revoke` (or a Shared Signals event) did.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Revoked {
    /// The stop as stored now (merged into an earlier one of the person's).
    pub stop: crate::derive::persons::Stop,
    /// What it ended in the store (a running instance; none offline).
    pub ended: Ended,
}

/// What a stop ended in the store, once for every replica.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Ended {
    /// Page sessions signed in as the person.
    pub sessions: usize,
    /// Open connect links.
    pub links: usize,
    /// Pending approvals, declined.
    pub approvals_declined: usize,
    /// Granted approvals, ended.
    pub approvals_ended: usize,
    /// Cached subject tokens dropped on this instance (each replica drops
    /// its own when it reads the stop).
    pub subject_cache_entries: usize,
    /// Exchanged tokens kept for reuse dropped on this instance (the same).
    pub exchanged_tokens: usize,
}

/// Stops a person (`derive::persons`): the stop is stored first (durable
/// when this returns: a Shared Signals receiver acknowledges the event
/// only then), then applied in this instance's memory at once (every other
/// instance reads it within `revocation.watch_bound`), then recorded
/// (`person.revoked`). On a running instance it then ends what the store
/// holds for the person ([`Ended`]): page sessions, open connect links,
/// pending approvals (declined, each recorded) and granted ones. The
/// revocation time is the receipt time by the store's clock (a running
/// instance's database time), narrowed by `req.event_time` within
/// `revocation.max_event_age`; `revocation.revoke_at_providers` turns
/// `req.revoke_at_providers` on, and the caller then runs
/// [`revoke_person_at_providers`] (network calls; a Shared Signals
/// receiver runs it after acknowledging).
pub(crate) async fn revoke_person(
    target: Target<'_>,
    rec: Recorder<'_>,
    mut req: crate::derive::persons::StopRequest,
) -> Result<Revoked, OpError> {
    use crate::derive::persons;
    let (store, received, cfg) = match target {
        Target::Running(b) => (
            b.store.as_ref(),
            b.shared_now(),
            b.config.revocation.clone(),
        ),
        Target::Stopped(store) => (
            store,
            store_now(store, rec.clock),
            crate::infra::config::RevocationConfig::default(),
        ),
    };
    req.revoke_at_providers |= cfg.revoke_at_providers;
    let max_age = i64::try_from(cfg.max_event_age.as_secs()).unwrap_or(i64::MAX);
    let stop = persons::write(store, &persons::Stop::new(&req, received, max_age))?;
    if let Target::Running(b) = target {
        b.stops.apply(stop.clone());
        b.metrics.persons_revoked.set(b.stops.len() as i64);
    }
    tracing::warn!(
        source = stop.source.as_str(),
        lift = ?stop.lift,
        "a person was stopped"
    );
    rec.record(Kind::PersonRevoked, |e| {
        e.person_iss = Some(&req.person.iss);
        e.person_sub = Some(&req.person.sub);
        e.reason = Some(&req.reason);
        e.source = Some(req.source.as_str());
        e.ssf_event_type = req.ssf_event_type.as_deref();
        e.revoke_at_providers = Some(stop.revoke_at_providers);
        e.effective_time = Some(stop.revocation_time);
    });
    let ended = match target {
        Target::Running(b) => end_for_person(b, rec, &req.person, received)?,
        Target::Stopped(_) => Ended::default(),
    };
    Ok(Revoked { stop, ended })
}

/// Ends what the store holds for a stopped person (see [`Ended`]).
fn end_for_person(
    b: &Broker,
    rec: Recorder<'_>,
    person: &Person,
    now: i64,
) -> Result<Ended, OpError> {
    let mut ended = Ended {
        subject_cache_entries: b.subjects.drop_person(person),
        exchanged_tokens: b.drop_exchanged_tokens_of(&person.iss, &person.sub),
        ..Ended::default()
    };
    if let Some(end) = b.end_sessions.get() {
        ended.sessions = end(b.store.as_ref(), person)?;
    }
    if let Some(c) = b.connected_services() {
        ended.links = c
            .links
            .close_for_person(person)
            .map_err(|e| OpError::Stop(e.to_string()))?;
    }
    if let Some(a) = b.approvals() {
        let (declined, granted) = a
            .end_for_person(person, now)
            .map_err(|e| OpError::Stop(e.to_string()))?;
        for d in &declined {
            rec.record(Kind::ApprovalDeclined, |e| {
                e.person_iss = Some(&person.iss);
                e.person_sub = Some(&person.sub);
                e.approval_id = Some(&d.id);
                e.tool = Some(&d.tool);
                e.outcome = Some("declined");
                e.reason = Some("person_revoked");
            });
        }
        ended.approvals_declined = declined.len();
        ended.approvals_ended = granted;
    }
    Ok(ended)
}

/// One connected account's revocation at its provider, for a stop.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct AccountRevoked {
    /// The service.
    pub service: String,
    /// `revoked`, `not_supported`, `failed` or `unreadable`
    /// ([`crate::accounts::connect::DisconnectReport::revocation`]).
    pub revocation: &'static str,
    /// A sentence for the operator.
    pub message: String,
}

/// Revokes every connected account of a stopped person at its provider
/// (RFC 7009 where the provider has a revocation endpoint, GitHub's grant
/// API for the GitHub preset) and marks each for reconnection, so it serves
/// no derive until the person connects it again. Each is recorded as
/// `account.disconnected` with outcome `kept` (the account stays, marked)
/// and the revocation's outcome as its reason.
pub(crate) async fn revoke_person_at_providers(
    b: &Broker,
    rec: Recorder<'_>,
    person: &Person,
) -> Result<Vec<AccountRevoked>, OpError> {
    let Some(c) = b.connected_services() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for a in c.vault.accounts(Some(person))? {
        let provider = c.providers.get(&a.service).map(|p| p.as_ref());
        let mut outcome =
            crate::accounts::connect::revoke_at_provider(&c.vault, provider, person, &a.service)
                .await?;
        // Revocation is idempotent (RFC 7009 section 2.2): a failed one is
        // tried once more before it is reported.
        if outcome.0 == "failed" {
            outcome = crate::accounts::connect::revoke_at_provider(
                &c.vault, provider, person, &a.service,
            )
            .await?;
        }
        let (revocation, message) = outcome;
        c.vault.mark_reconnect(person, &a.service, b.shared_now())?;
        tracing::warn!(service = %a.service, revocation, "a stopped person's account was revoked at its provider");
        rec.record(Kind::AccountDisconnected, |e| {
            e.person_iss = Some(&person.iss);
            e.person_sub = Some(&person.sub);
            e.service = Some(&a.service);
            e.outcome = Some("kept");
            e.reason = Some(revocation);
        });
        out.push(AccountRevoked {
            service: a.service.clone(),
            revocation,
            message,
        });
    }
    Ok(out)
}

/// Lifts a person's stop, whatever its kind (`persons restore`); returns
/// the stop lifted (`None`: the person was not stopped, and nothing is
/// recorded).
pub(crate) fn restore_person(
    target: Target<'_>,
    rec: Recorder<'_>,
    person: &Person,
) -> Result<Option<crate::derive::persons::Stop>, OpError> {
    let store = match target {
        Target::Running(b) => b.store.as_ref(),
        Target::Stopped(store) => store,
    };
    let removed = crate::derive::persons::remove(store, person)?;
    if let Target::Running(b) = target {
        b.stops.forget(person);
        b.metrics.persons_revoked.set(b.stops.len() as i64);
    }
    if let Some(stop) = &removed {
        tracing::warn!(source = "manual", "a person's stop was lifted");
        rec.record(Kind::PersonRestored, |e| {
            e.person_iss = Some(&person.iss);
            e.person_sub = Some(&person.sub);
            e.source = Some("manual");
            e.revocation_time = Some(stop.revocation_time);
        });
    }
    Ok(removed)
}

/// The stopped persons, as the store holds them now (ordered by revocation
/// time). A read: no event.
pub(crate) fn list_persons(
    target: Target<'_>,
) -> Result<Vec<crate::derive::persons::Stop>, OpError> {
    let store = match target {
        Target::Running(b) => b.store.as_ref(),
        Target::Stopped(store) => store,
    };
    let mut v = crate::derive::persons::read_all(store)?;
    v.sort_by_key(|s| s.revocation_time);
    Ok(v)
}

/// The store's time where it has a clock (PostgreSQL), else `clock`'s.
fn store_now(store: &dyn Store, clock: &dyn Clock) -> i64 {
    let local: crate::base::clock::SharedClock = Arc::new(crate::base::clock::SystemClock);
    match store.clock_sample(&local) {
        Ok(Some(sample)) => sample.store_ms.div_euclid(1000),
        _ => clock.now(),
    }
}

/// What an action needs when no instance runs: the store and the audit
/// file, opened by the store's owner only.
#[derive(Debug)]
pub(crate) struct Offline {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The audit file.
    pub audit: Audit,
    /// The agent (for the events).
    pub agent: String,
    clock: crate::base::clock::SystemClock,
}

impl Offline {
    /// Checks that this process runs as the store's owner, then opens the
    /// store and the audit file.
    pub(crate) fn open(cfg: &Config) -> Result<Offline, OpError> {
        // A shared store has no owner on this machine: the database's own
        // access control (its user and password) decides.
        if let Some(dir) = cfg.store.sled_dir() {
            check_owner(dir, crate::base::unix::current_uid())?;
        }
        let store: Arc<dyn Store> = cfg.store.open()?;
        let audit = Audit::open(&cfg.audit_log).map_err(|source| OpError::Open {
            what: "audit log",
            path: cfg.audit_log.clone(),
            source,
        })?;
        let clock = crate::base::clock::SystemClock;
        audit
            .record_repair(crate::base::clock::Clock::now(&clock), &cfg.agent)
            .map_err(|e| OpError::Open {
                what: "audit log",
                path: cfg.audit_log.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
        Ok(Offline {
            store,
            audit,
            agent: cfg.agent.clone(),
            clock: crate::base::clock::SystemClock,
        })
    }

    /// The recorder for this run's events.
    pub(crate) fn recorder(&self) -> Recorder<'_> {
        Recorder {
            audit: &self.audit,
            agent: &self.agent,
            clock: &self.clock,
        }
    }

    /// The store as an action's target.
    pub(crate) fn target(&self) -> Target<'_> {
        Target::Stopped(self.store.as_ref())
    }

    /// Opens the vault on this store.
    pub(crate) fn vault(&self, cfg: &Config) -> Result<Vault, OpError> {
        let master = Arc::new(self.sealer(cfg)?);
        Ok(Vault::open(self.store.clone(), master, &cfg.vault_key_dir)?)
    }

    /// The key that signs the freeze record (from the master key file).
    pub(crate) fn freeze_key(
        &self,
        cfg: &Config,
    ) -> Result<crate::derive::freeze::FreezeKey, OpError> {
        Ok(crate::derive::freeze::FreezeKey::derive(&self.master(cfg)?))
    }

    /// The sealer of the signing keys at rest (from the master key file).
    pub(crate) fn sealer(&self, cfg: &Config) -> Result<Sealer, OpError> {
        Ok(Sealer::new(&self.master(cfg)?, &[])?)
    }

    fn master(&self, cfg: &Config) -> Result<crate::base::secret::SecretBytes, OpError> {
        crate::infra::config::read_secret_file(&cfg.master_key_file).map_err(|source| {
            OpError::Open {
                what: "master key file",
                path: cfg.master_key_file.clone(),
                source,
            }
        })
    }
}

/// Refuses unless `uid` owns the store directory (or, before the store
/// exists, the nearest directory above it that does: the one the store
/// would be created in).
pub(crate) fn check_owner(store_dir: &Path, uid: u32) -> Result<(), OpError> {
    use std::os::unix::fs::MetadataExt;
    let mut dir = store_dir.to_path_buf();
    let meta = loop {
        match std::fs::metadata(&dir) {
            Ok(m) => break m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // An empty parent is the current directory.
                dir = match dir.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                };
            }
            Err(source) => {
                return Err(OpError::Open {
                    what: "store directory",
                    path: dir,
                    source,
                })
            }
        }
    };
    match owner_mismatch(&dir, meta.uid(), uid) {
        Some(message) => Err(OpError::NotOwner(message)),
        None => Ok(()),
    }
}

/// The refusal's sentence when `current` is not `owner` (names the
/// directory, its owner and the current user, by name where known).
fn owner_mismatch(dir: &Path, owner: u32, current: u32) -> Option<String> {
    if owner == current {
        return None;
    }
    Some(format!(
        "the store directory {} belongs to {}, but this command runs as {}: run it as the store's owner \
         (an offline action run as another user would leave files the broker cannot open)",
        dir.display(),
        user_name(owner),
        user_name(current),
    ))
}

/// `name (uid N)`, or `uid N` when no user has that uid.
pub(crate) fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("{} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offline_action_by_another_user_than_the_stores_owner_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let me = crate::base::unix::current_uid();
        let other = me.wrapping_add(4242);
        let Err(OpError::NotOwner(message)) = check_owner(dir.path(), other) else {
            panic!("another user was let through");
        };
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(
            message.contains(&format!("uid {me}")),
            "names the owner: {message}"
        );
        assert!(
            message.contains(&format!("uid {other}")),
            "names the user: {message}"
        );
        // Before the store exists, the directory it would be created in counts.
        assert!(matches!(
            check_owner(&dir.path().join("data/store"), other),
            Err(OpError::NotOwner(_))
        ));
        // Positive control: the owner may.
        check_owner(dir.path(), me).unwrap();
        check_owner(&dir.path().join("data/store"), me).unwrap();
    }

    fn offline(dir: &Path) -> (Arc<dyn Store>, Audit) {
        let store: Arc<dyn Store> =
            Arc::new(crate::infra::store::SledStore::open(&dir.join("data")).unwrap());
        (store, Audit::open(&dir.join("audit.jsonl")).unwrap())
    }

    fn events(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn offline_freeze_rotation_and_users_are_audited() {
        let dir = tempfile::tempdir().unwrap();
        let (store, audit) = offline(dir.path());
        let clock = crate::base::clock::SystemClock;
        let rec = Recorder {
            audit: &audit,
            agent: "a",
            clock: &clock,
        };
        let key = crate::derive::freeze::FreezeKey::derive(&crate::base::secret::SecretBytes::new(
            vec![7u8; 32],
        ));
        let target = Target::Stopped(store.as_ref());
        assert!(freeze(target, Some(&key), rec, true).unwrap());
        // One owner of the flag: what the offline freeze wrote is what the
        // broker reads at start-up.
        let at_start = |s: &dyn crate::infra::store::Store| {
            crate::derive::freeze::at_start(s, &key, &crate::derive::freeze::Seen::default())
                .unwrap()
        };
        assert!(at_start(store.as_ref()));
        assert!(!freeze(target, Some(&key), rec, false).unwrap());
        assert!(!at_start(store.as_ref()));
        assert!(matches!(
            freeze(target, None, rec, true),
            Err(OpError::NoFreezeKey)
        ));
        let sealer =
            Sealer::new(&crate::base::secret::SecretBytes::new(vec![7u8; 32]), &[]).unwrap();
        crate::derive::mint::load_or_create(store.as_ref(), &sealer, clock.now()).unwrap();
        let kind =
            crate::derive::mint::RotationKind::new(false, crate::infra::config::ACTIVATION_DELAY);
        let r = rotate_keys(Target::Stopped(store.as_ref()), &sealer, rec, kind).unwrap();
        assert!(r.added && !r.kid.is_empty());
        let pw = crate::base::secret::SecretString::new("a long enough password".into());
        add_user(store.as_ref(), &sealer, "alice", &pw, false, rec).unwrap();
        // A refused action writes no event.
        assert!(add_user(store.as_ref(), &sealer, "alice", &pw, false, rec).is_err());
        assert_eq!(
            events(dir.path()),
            [
                "admin.frozen",
                "admin.unfrozen",
                "keys.rotated",
                "users.added"
            ]
        );
    }
}
