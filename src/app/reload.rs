//! Hot reload of the policy file in a running broker.
//!
//! The file is watched (its size, times and inode polled every
//! [`POLL_INTERVAL`]) and reloaded on `SIGHUP`. A new version must:
//! 1. read the same twice, [`SETTLE`] apart (a file still being written is
//!    left for the next poll: a half-written file can be valid TOML that
//!    grants more than the full one, e.g. a tool whose `ttl` line is not
//!    written yet);
//! 2. load and validate completely ([`Policy::parse`]);
//! 3. be for this instance's agent, and name only configured services.
//!
//! Only then is it stored into `Broker.policy` in one atomic swap; a derive
//! takes one snapshot (`load_full`) and decides everything with it. Anything
//! else keeps the last good policy, counts `policy_reload_failures`, and
//! emits `policy.reload_failed` naming the hash still in force. A good
//! version emits `policy.reloaded` with its hash and updates `policy_info`
//! and `policy_loaded_timestamp_seconds`.
//!
//! Writers should still replace the file atomically (write a temporary file,
//! then rename it over the policy): that is what the settle check cannot
//! replace for a writer that stalls longer than [`SETTLE`] in the middle.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::derive::exchange::Broker;
use crate::derive::policy::Policy;
use crate::infra::events::{Event, Kind};

/// How often the file's metadata is polled.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How long a changed file must stay the same before it is loaded.
pub const SETTLE: Duration = Duration::from_millis(200);

/// A policy larger than this is refused (a policy is a few KB; a huge file
/// is a mistake or an attack on memory).
pub(crate) const MAX_POLICY_BYTES: u64 = 1024 * 1024;

/// What asked for the reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The watcher saw the file change.
    Watch,
    /// `SIGHUP`.
    Signal,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Watch => "watch",
            Trigger::Signal => "sighup",
        }
    }
}

/// Why a reload was refused: the `reason` of `policy.reload_failed`, of
/// the WARN line and of `ReloadOutcome::Failed`. `docs/OPERATIONS.md`
/// lists each (tested against [`Refusal::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The file cannot be read.
    Unreadable,
    /// Larger than `MAX_POLICY_BYTES`.
    TooLarge,
    /// Not a valid policy.
    Invalid,
    /// Written for another agent.
    AgentMismatch,
    /// A `service` resource names a service the config does not define.
    UnknownService,
    /// A `delivery = "proxy"` resource breaks the proxy address rule, or
    /// its provider has no `api_base`.
    ProxyAddress,
}

impl Refusal {
    /// Every reason.
    pub const ALL: [Refusal; 6] = [
        Refusal::Unreadable,
        Refusal::TooLarge,
        Refusal::Invalid,
        Refusal::AgentMismatch,
        Refusal::UnknownService,
        Refusal::ProxyAddress,
    ];

    /// Its name in events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Unreadable => "unreadable",
            Refusal::TooLarge => "too_large",
            Refusal::Invalid => "invalid",
            Refusal::AgentMismatch => "agent_mismatch",
            Refusal::UnknownService => "unknown_service",
            Refusal::ProxyAddress => "proxy_address",
        }
    }
}

/// The result of one reload attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReloadOutcome {
    /// A new policy is in force.
    Reloaded {
        /// Its SHA-256.
        hash: String,
    },
    /// The file holds the policy already in force.
    Unchanged,
    /// The file changed between two reads: it is still being written.
    Changing,
    /// Refused; the last good policy stays.
    Failed {
        /// A [`Refusal`]'s name: `unreadable`, `too_large`, `invalid`,
        /// `agent_mismatch`, `unknown_service` or `proxy_address`.
        reason: &'static str,
        /// What was wrong (positions and keys, never values).
        detail: String,
    },
}

/// Reloads one broker's policy from its file.
#[derive(Debug, Clone)]
pub(crate) struct Reloader {
    broker: Arc<Broker>,
    path: PathBuf,
    settle: Duration,
}

impl Reloader {
    /// A reloader for the file named in the broker's config.
    pub(crate) fn new(broker: Arc<Broker>) -> Reloader {
        let path = broker.config.policy.clone();
        Reloader {
            broker,
            path,
            settle: SETTLE,
        }
    }

    /// Tries to load the file and swap it in; see the module docs.
    pub(crate) async fn reload(&self, trigger: Trigger) -> ReloadOutcome {
        let first = match read_capped(&self.path).await {
            Ok(b) => b,
            Err(f) => return self.fail(trigger, f),
        };
        tokio::time::sleep(self.settle).await;
        let second = match read_capped(&self.path).await {
            Ok(b) => b,
            Err(f) => return self.fail(trigger, f),
        };
        if first != second {
            tracing::info!(
                trigger = trigger.as_str(),
                "policy file is still changing; will look again"
            );
            return ReloadOutcome::Changing;
        }
        if crate::base::jose::sha256_hex(&first) == self.broker.policy.load().hash {
            tracing::debug!(trigger = trigger.as_str(), "policy file unchanged");
            return ReloadOutcome::Unchanged;
        }
        let policy = match Policy::parse(&self.path, &first) {
            Ok(p) => p,
            Err(e) => return self.fail(trigger, (Refusal::Invalid, e.to_string())),
        };
        if policy.agent != self.broker.config.agent {
            let detail = super::agent_mismatch(
                &self.path,
                &String::from_utf8_lossy(&first),
                &policy.agent,
                &self.broker.config.file.display().to_string(),
                &self.broker.config.agent,
            );
            return self.fail(trigger, (Refusal::AgentMismatch, detail));
        }
        // A `service` resource must name a configured provider (checked at
        // start-up too); otherwise its derives could never work.
        let known = |s: &str| {
            self.broker
                .connected_services()
                .is_some_and(|c| c.providers.get(s).is_some())
        };
        if let Some(missing) = policy.services().into_iter().find(|s| !known(s)) {
            let detail = format!("the policy names service {missing:?}, which has no [providers.{missing}] table in the config");
            return self.fail(trigger, (Refusal::UnknownService, detail));
        }
        let has_upstream = |u: &str| self.broker.upstreams().is_some_and(|x| x.contains(u));
        if let Some(missing) = policy.upstreams().into_iter().find(|u| !has_upstream(u)) {
            let detail = format!("the policy names upstream {missing:?}, which has no [upstreams.{missing}] table in the config");
            return self.fail(trigger, (Refusal::UnknownService, detail));
        }
        if let Some(detail) = super::proxy_problem(&policy, &self.broker.config) {
            return self.fail(trigger, (Refusal::ProxyAddress, detail));
        }
        self.apply(trigger, policy)
    }

    fn apply(&self, trigger: Trigger, policy: Policy) -> ReloadOutcome {
        let b = &self.broker;
        let hash = policy.hash.clone();
        let tools = policy.tools.len();
        // The one atomic swap: derives in flight keep the snapshot they took.
        b.policy.store(Arc::new(policy));
        // Exchanged tokens kept for reuse were granted by the policy before:
        // none is given again under this one (the reuse key names the policy
        // hash too; dropping them also frees their memory now).
        b.drop_exchanged_tokens();
        let now = b.clock.now();
        b.metrics.policy_info.set_only(&hash);
        b.metrics.policy_loaded_time.set(now as f64);
        b.metrics.frozen.set(i64::from(b.is_frozen()));
        tracing::info!(trigger = trigger.as_str(), policy_hash = %hash, tools, "policy reloaded");
        let mut e = Event::new(now, Kind::PolicyReloaded, &b.config.agent);
        e.outcome = Some("reloaded");
        e.reason = Some(trigger.as_str());
        e.policy_hash = Some(&hash);
        // The swap is not undone when the event cannot be written: a reload
        // is how an urgent narrowing arrives, and with a failing audit sink
        // the broker releases no token anyway.
        if let Err(err) = b.audit.record(&e) {
            tracing::error!(error = %err, "audit write failed for policy.reloaded");
        }
        ReloadOutcome::Reloaded { hash }
    }

    fn fail(&self, trigger: Trigger, (refusal, detail): (Refusal, String)) -> ReloadOutcome {
        let reason = refusal.as_str();
        let b = &self.broker;
        b.metrics.policy_reload_failures.inc();
        let current = b.policy.load_full();
        tracing::warn!(
            trigger = trigger.as_str(),
            reason,
            detail = %detail,
            kept_policy_hash = %current.hash,
            "policy reload failed; the last good policy stays in force"
        );
        let mut e = Event::new(b.clock.now(), Kind::PolicyReloadFailed, &b.config.agent);
        e.outcome = Some("kept_last_good");
        e.reason = Some(reason);
        // The hash of the policy that keeps deciding.
        e.policy_hash = Some(&current.hash);
        if let Err(err) = b.audit.record(&e) {
            tracing::error!(error = %err, "audit write failed for policy.reload_failed");
        }
        ReloadOutcome::Failed { reason, detail }
    }
}

/// Reads at most [`MAX_POLICY_BYTES`]; a larger file is an error.
async fn read_capped(path: &Path) -> Result<Vec<u8>, (Refusal, String)> {
    let file = tokio::fs::File::open(path).await.map_err(|e| {
        (
            Refusal::Unreadable,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let mut buf = Vec::new();
    file.take(MAX_POLICY_BYTES + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| {
            (
                Refusal::Unreadable,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
    if buf.len() as u64 > MAX_POLICY_BYTES {
        return Err((
            Refusal::TooLarge,
            format!("{} is larger than {MAX_POLICY_BYTES} bytes", path.display()),
        ));
    }
    Ok(buf)
}

/// What the watcher compares between polls: identity, size and times of the
/// file the path resolves to (a symlink swap, as Kubernetes does for config
/// maps, changes the inode), or its absence.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Signature {
    Missing,
    File {
        dev: u64,
        ino: u64,
        len: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
}

fn signature(path: &Path) -> Signature {
    match std::fs::metadata(path) {
        Ok(m) => Signature::File {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        },
        Err(_) => Signature::Missing,
    }
}

/// Starts watching the broker's policy file; stops when `shutdown` changes.
///
/// The `SIGHUP` handler is installed before this returns, so a signal sent
/// once the broker answers cannot hit the default action (which would end
/// the process).
pub(crate) fn spawn(
    broker: Arc<Broker>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; the policy file is still watched");
            None
        }
    };
    let reloader = Reloader::new(broker);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // None until the first look, so that a change made between start-up
        // and this task is not missed (an unchanged file is a no-op).
        let mut seen: Option<Signature> = None;
        loop {
            let trigger = tokio::select! {
                _ = tick.tick() => Trigger::Watch,
                Some(()) = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => Trigger::Signal,
                _ = shutdown.changed() => break,
            };
            let sig = signature(&reloader.path);
            if trigger == Trigger::Watch && seen.as_ref() == Some(&sig) {
                continue;
            }
            let outcome = reloader.reload(trigger).await;
            // A file still being written is looked at again on the next
            // poll; anything else is settled for this signature.
            if outcome != ReloadOutcome::Changing {
                seen = Some(sig);
            }
        }
    })
}
