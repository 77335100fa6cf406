//! The Shared Signals receiver (SSF 1.0; docs/SSF.md): Security Event
//! Tokens from the configured transmitters, pushed (RFC 8935, at
//! `{issuer}/ssf/events`, `edge::ssf`) or polled (RFC 8936, [`poll`]),
//! checked ([`set`]), mapped to people ([`subjects`]) and acted on by
//! their event type ([`types`]): a person-level stop, or a change to the
//! recorded email.
//!
//! One SET is received in this order, every step before the
//! acknowledgement:
//! 1. checked against its transmitter: its keys (its metadata's `jwks_uri`
//!    or the configured one, through the key-set cache), `iss`, `aud`,
//!    `jti`, `iat` within `revocation.max_event_age`;
//! 2. its subject parsed (malformed: refused) and its event type looked up;
//! 3. stored ([`record`]): a `jti` already done is a repeat, acknowledged
//!    with no second action; one stored but not done (a crash between
//!    storing and acting) is acted on again;
//! 4. acted on, each person's stop stored before this returns;
//! 5. marked done, and `ssf.event_received` written, with the metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::accounts::emails::Emails;
use crate::accounts::subject::Person;
use crate::base::clock::SharedClock;
use crate::base::keyset::RemoteKeySet;
use crate::base::secret::SecretString;
use crate::infra::config::SsfTransmitter;
use crate::infra::events::{Audit, Event, Kind};
use crate::infra::metrics::Metrics;
use crate::infra::store::{Store, StoreError};

pub(crate) mod poll;
mod record;
mod set;
pub(crate) mod stream;
mod subjects;
pub(crate) mod types;

pub(crate) use set::SetError;

/// A stop the receiver asks for; `app` wires it to the person-level stop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopAsk<'a> {
    /// Who.
    pub(crate) person: &'a Person,
    /// Only `persons restore` lifts it (otherwise a new sign-in does).
    pub(crate) until_restore: bool,
    /// The SET's event type URI.
    pub(crate) event_type: &'a str,
    /// The event time the SET states.
    pub(crate) event_time: Option<i64>,
    /// Revoke the person's connected accounts at the providers too (the
    /// stop adds `revocation.revoke_at_providers`).
    pub(crate) revoke_at_providers: bool,
}

/// Makes a stop durable (and applies it) before returning; blocking.
pub(crate) type Stopper = Arc<dyn Fn(&StopAsk<'_>) -> Result<(), String> + Send + Sync>;

/// Why a SET was not accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReceiveError {
    /// It failed a check: answered with its RFC 8935 code.
    #[error(transparent)]
    Set(#[from] SetError),
    /// It could not be checked or stored now (keys unreachable, store
    /// down, a stop not stored): the transmitter should send it again.
    #[error("{0}")]
    Unavailable(String),
}

impl From<StoreError> for ReceiveError {
    fn from(e: StoreError) -> Self {
        ReceiveError::Unavailable(format!("the store: {e}"))
    }
}

/// One transmitter at run time.
pub(crate) struct Transmitter {
    pub(crate) cfg: SsfTransmitter,
    /// The `Authorization` value it sends with each push.
    pub(crate) push_auth: Option<SecretString>,
    /// The bearer token of its management (and poll) API.
    pub(crate) management: Option<SecretString>,
    pub(crate) http: reqwest::Client,
    /// Its metadata, once fetched (a failure is retried by the next use).
    meta: tokio::sync::OnceCell<Arc<stream::Metadata>>,
    /// Its keys, once known.
    keys: tokio::sync::OnceCell<Arc<RemoteKeySet>>,
    /// A subject validator's key set with the same URI, to share.
    shared_keys: Vec<Arc<RemoteKeySet>>,
    /// Pushes per second.
    pub(crate) limiter: governor::DefaultDirectRateLimiter,
}

impl std::fmt::Debug for Transmitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ssf::Transmitter")
            .field("name", &self.cfg.name)
            .finish_non_exhaustive()
    }
}

/// Why the receiver could not be set up (names the key, never a secret).
#[derive(Debug, thiserror::Error)]
#[error("ssf.transmitters.{name}.{key}: {detail}")]
pub struct SetupError {
    /// The transmitter.
    pub name: String,
    /// The key.
    pub key: &'static str,
    /// What is wrong.
    pub detail: String,
}

/// Reads a one-line secret file (0600).
pub(crate) fn read_one_line(path: &std::path::Path) -> Result<SecretString, String> {
    let bytes = crate::base::secret::read_secret_file(path).map_err(|e| e.to_string())?;
    std::str::from_utf8(bytes.expose())
        .ok()
        .map(|s| s.trim_end_matches(['\n', '\r']))
        .filter(|s| !s.is_empty() && !s.contains(['\n', '\r']))
        .map(|s| SecretString::new(s.to_owned()))
        .ok_or_else(|| format!("{}: empty, several lines, or not UTF-8", path.display()))
}

impl Transmitter {
    /// Builds one transmitter, reading its secret files now.
    pub(crate) fn new(
        cfg: &SsfTransmitter,
        key_sets: &std::collections::HashMap<String, Arc<RemoteKeySet>>,
    ) -> Result<Transmitter, SetupError> {
        let bad = |key: &'static str, detail: String| SetupError {
            name: cfg.name.clone(),
            key,
            detail,
        };
        let push_auth = match &cfg.push_authorization_file {
            Some(p) => Some(read_one_line(p).map_err(|e| bad("push_authorization_file", e))?),
            None => None,
        };
        let management = match &cfg.management_credentials_file {
            Some(p) => Some(read_one_line(p).map_err(|e| bad("management_credentials_file", e))?),
            None => None,
        };
        let http = crate::base::http::outbound_client()
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(15))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| bad("issuer", format!("the HTTPS client: {e}")))?;
        let rate = std::num::NonZeroU32::new(cfg.per_second).unwrap_or(std::num::NonZeroU32::MIN);
        Ok(Transmitter {
            cfg: cfg.clone(),
            push_auth,
            management,
            http,
            meta: tokio::sync::OnceCell::new(),
            keys: tokio::sync::OnceCell::new(),
            shared_keys: key_sets.values().cloned().collect(),
            limiter: governor::RateLimiter::direct(governor::Quota::per_second(rate)),
        })
    }

    /// Its SSF metadata (fetched once; a failure is retried by the next
    /// caller).
    pub(crate) async fn metadata(&self) -> Result<Arc<stream::Metadata>, String> {
        self.meta
            .get_or_try_init(|| async { stream::discover(self).await.map(Arc::new) })
            .await
            .cloned()
    }

    /// Its key set: the configured `jwks_uri`, or its metadata's, shared
    /// with a trusted issuer's cache when the URI is the same.
    async fn key_set(&self) -> Result<Arc<RemoteKeySet>, String> {
        self.keys
            .get_or_try_init(|| async {
                let uri = match &self.cfg.jwks_uri {
                    Some(u) => u.clone(),
                    None => self.metadata().await?.jwks_uri.clone(),
                };
                if let Some(k) = self
                    .shared_keys
                    .iter()
                    .find(|k| k.uri() == Some(uri.as_str()))
                {
                    return Ok(k.clone());
                }
                let set = RemoteKeySet::remote(
                    &uri,
                    crate::base::keyset::MAX_ISSUER_JWKS,
                    crate::base::keyset::http_client(),
                );
                // The first fetch now; a failure leaves the set empty and
                // the first SET's unknown key refetches it.
                let _ = set.fetch().await;
                Ok(Arc::new(set))
            })
            .await
            .cloned()
    }
}

/// The receiver: every transmitter, and what acting needs.
pub(crate) struct Receiver {
    transmitters: BTreeMap<String, Transmitter>,
    emails: Option<Arc<Emails>>,
    store: Arc<dyn Store>,
    audit: Arc<Audit>,
    metrics: Metrics,
    /// The store's clock (receipt times are shared by replicas).
    clock: SharedClock,
    agent: String,
    /// `revocation.max_event_age`, seconds.
    max_age: i64,
    stop: Stopper,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ssf::Receiver")
            .field(
                "transmitters",
                &self.transmitters.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What building a [`Receiver`] takes.
pub(crate) struct Parts {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) audit: Arc<Audit>,
    pub(crate) metrics: Metrics,
    pub(crate) clock: SharedClock,
    pub(crate) agent: String,
    pub(crate) max_age: i64,
    pub(crate) emails: Option<Arc<Emails>>,
    pub(crate) stop: Stopper,
}

/// How a SET that was accepted ended (the event's `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// People were stopped.
    Stopped,
    /// A recorded email was changed or dropped.
    Updated,
    /// Nothing to do (an unknown or informational type, or no one to
    /// update).
    Ignored,
    /// The subject maps to no one (`credbroker_ssf_unmapped_subjects_total`).
    Unmapped,
    /// A repeat of a `jti` already acted on: acknowledged, nothing done.
    Duplicate,
}

impl Done {
    /// The event's `action`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Done::Stopped => "stopped",
            Done::Updated => "updated",
            Done::Ignored => "ignored",
            Done::Unmapped => "unmapped",
            Done::Duplicate => "duplicate",
        }
    }
}

impl Receiver {
    /// Builds the receiver of `configs`, reading their secret files now.
    pub(crate) fn new(
        configs: &BTreeMap<String, SsfTransmitter>,
        key_sets: &std::collections::HashMap<String, Arc<RemoteKeySet>>,
        parts: Parts,
    ) -> Result<Receiver, SetupError> {
        let mut transmitters = BTreeMap::new();
        for (name, cfg) in configs {
            transmitters.insert(name.clone(), Transmitter::new(cfg, key_sets)?);
        }
        Ok(Receiver {
            transmitters,
            emails: parts.emails,
            store: parts.store,
            audit: parts.audit,
            metrics: parts.metrics,
            clock: parts.clock,
            agent: parts.agent,
            max_age: parts.max_age,
            stop: parts.stop,
        })
    }

    /// Whether some transmitter pushes (the endpoint is served only then).
    pub(crate) fn has_pushers(&self) -> bool {
        self.transmitters.values().any(|t| t.push_auth.is_some())
    }

    /// The transmitters, by name.
    pub(crate) fn transmitters(&self) -> &BTreeMap<String, Transmitter> {
        &self.transmitters
    }

    /// The push transmitter whose `Authorization` value is `value`,
    /// compared in constant time against every one (so the time taken
    /// tells nothing of which, or how much, matched).
    pub(crate) fn pusher(&self, value: &[u8]) -> Option<&Transmitter> {
        use subtle::ConstantTimeEq;
        let mut found = None;
        for t in self.transmitters.values() {
            if let Some(auth) = &t.push_auth {
                let want = auth.expose().as_bytes();
                let same = want.len() == value.len() && bool::from(want.ct_eq(value));
                if same {
                    found = Some(t);
                }
            }
        }
        found
    }

    /// Learns every transmitter's metadata and keys now (start-up); a
    /// failure is logged and retried on first use.
    pub(crate) async fn resolve_all(&self) {
        for t in self.transmitters.values() {
            if let Err(e) = t.key_set().await {
                tracing::warn!(transmitter = %t.cfg.name, error = %e, "SSF transmitter's metadata or keys not available at start-up; will retry on first use");
            }
        }
    }

    /// Receives one SET from transmitter `t`: every step of the module
    /// doc; `Ok` means it is stored and acted on, and may be acknowledged.
    pub(crate) async fn receive(
        self: &Arc<Self>,
        t: &Transmitter,
        token: &str,
    ) -> Result<Done, ReceiveError> {
        let now = self.clock.now();
        let result = self.receive_at(t, token, now).await;
        let (label, outcome) = match &result {
            Ok((label, d)) => (*label, d.as_str()),
            Err(ReceiveError::Set(e)) => {
                // The reason, never the token: it names a person.
                tracing::info!(transmitter = %t.cfg.name, err = e.code(), reason = %e, "SET refused");
                ("other", e.code())
            }
            Err(ReceiveError::Unavailable(why)) => {
                tracing::warn!(transmitter = %t.cfg.name, error = %why, "SET not received now; the transmitter should send it again");
                ("other", "unavailable")
            }
        };
        self.metrics
            .ssf_events
            .with_label_values(&[t.cfg.name.as_str(), label, outcome])
            .inc();
        result.map(|(_, d)| d)
    }

    async fn receive_at(
        self: &Arc<Self>,
        t: &Transmitter,
        token: &str,
        now: i64,
    ) -> Result<(&'static str, Done), ReceiveError> {
        let keys = t
            .key_set()
            .await
            .map_err(|e| ReceiveError::Unavailable(format!("the transmitter's keys: {e}")))?;
        let expect = set::Expect {
            issuer: &t.cfg.issuer,
            audience: &t.cfg.audience,
            max_bytes: t.cfg.max_set_bytes,
            max_age: self.max_age,
        };
        let set = set::check(token, &expect, now, |refetch| {
            let keys = keys.clone();
            async move {
                if !refetch {
                    return Some(keys.keys());
                }
                match keys.refetch(now).await {
                    Ok(crate::base::keyset::Refetch::Fetched(k))
                    | Ok(crate::base::keyset::Refetch::Throttled(k)) => Some(k),
                    Ok(crate::base::keyset::Refetch::Pinned) => None,
                    Err(_) => None,
                }
            }
        })
        .await?;
        let subject = subjects::parse(&set.subject)
            .map_err(|why| ReceiveError::Set(SetError::Request(why)))?;
        let (label, action) = types::of(&set.event_type);
        let this = self.clone();
        let name = t.cfg.name.clone();
        let trusted = t.cfg.trusted_issuers.clone();
        let map_email = t.cfg.map_email;
        let done = tokio::task::spawn_blocking(move || {
            this.process(&name, &trusted, map_email, &set, &subject, action, now)
        })
        .await
        .map_err(|_| ReceiveError::Unavailable("the receiving task failed".into()))??;
        self.metrics
            .ssf_last_event
            .with_label_values(&[t.cfg.name.as_str()])
            .set(now as f64);
        Ok((label, done))
    }

    /// Steps 3 to 5 (blocking: the store).
    #[allow(clippy::too_many_arguments)] // reason: one call site, each part named
    fn process(
        &self,
        transmitter: &str,
        trusted: &[String],
        map_email: bool,
        set: &set::Set,
        subject: &subjects::SubjectId,
        action: types::Action,
        now: i64,
    ) -> Result<Done, ReceiveError> {
        let subject_sha256 = crate::base::jose::sha256_hex(set.subject.to_string().as_bytes());
        let done = match record::begin(self.store.as_ref(), transmitter, set, now)? {
            record::Begun::Repeat => Done::Duplicate,
            record::Begun::New => {
                let emails = if map_email {
                    self.emails.as_deref()
                } else {
                    None
                };
                let acted = subjects::people(subject, trusted, emails)
                    .map_err(ReceiveError::from)
                    .and_then(|people| self.act(set, action, &people));
                let done = match acted {
                    Ok(d) => d,
                    Err(e) => {
                        // Not acted on: the transmitter's retry must be.
                        let _ = record::abandon(self.store.as_ref(), transmitter, set);
                        return Err(e);
                    }
                };
                record::finish(self.store.as_ref(), transmitter, set, now, done.as_str())?;
                if done == Done::Unmapped {
                    self.metrics
                        .ssf_unmapped
                        .with_label_values(&[transmitter])
                        .inc();
                }
                done
            }
        };
        let mut e = Event::new(now, Kind::SsfEventReceived, &self.agent);
        e.ssf_event_type = Some(&set.event_type);
        e.transmitter = Some(transmitter);
        e.subject_sha256 = Some(&subject_sha256);
        e.action = Some(done.as_str());
        e.delay_seconds = set.event_time.map(|t| now - t);
        if let Err(err) = self.audit.record(&e) {
            tracing::error!(error = %err, "ssf.event_received could not be recorded");
        }
        Ok(done)
    }

    /// Step 4: what the event type does to `people`.
    fn act(
        &self,
        set: &set::Set,
        action: types::Action,
        people: &[Person],
    ) -> Result<Done, ReceiveError> {
        use types::Action;
        if action == Action::Ignore {
            return Ok(Done::Ignored);
        }
        if people.is_empty() {
            return Ok(Done::Unmapped);
        }
        match action {
            Action::StopUntilSignIn | Action::StopUntilRestore | Action::Purge => {
                let until_restore = action != Action::StopUntilSignIn;
                for person in people {
                    (self.stop)(&StopAsk {
                        person,
                        until_restore,
                        event_type: &set.event_type,
                        event_time: set.event_time,
                        // A stop only a restore lifts revokes at the
                        // providers (docs/REVOCATION.md); the others only
                        // with `revocation.revoke_at_providers`, which the
                        // stop itself adds.
                        revoke_at_providers: until_restore,
                    })
                    .map_err(|e| ReceiveError::Unavailable(format!("the stop: {e}")))?;
                    if action == Action::Purge {
                        if let Some(emails) = &self.emails {
                            emails.forget(person)?;
                        }
                    }
                }
                Ok(Done::Stopped)
            }
            Action::ChangeEmail | Action::DropEmail => {
                let Some(emails) = &self.emails else {
                    return Ok(Done::Ignored);
                };
                let new = set
                    .event
                    .get("new-value")
                    .and_then(|v| v.as_str())
                    .and_then(crate::accounts::emails::normalize);
                for person in people {
                    match (&new, action) {
                        (Some(new), Action::ChangeEmail) => emails.record(person, new)?,
                        _ => emails.forget(person)?,
                    }
                }
                Ok(Done::Updated)
            }
            Action::Ignore => Ok(Done::Ignored),
        }
    }

    /// Deletes the event records too old to matter (a repeat of them is
    /// refused by its `iat` anyway); housekeeping calls it.
    pub(crate) fn sweep(&self) -> Result<usize, StoreError> {
        record::sweep(self.store.as_ref(), self.clock.now(), self.max_age)
    }
}
