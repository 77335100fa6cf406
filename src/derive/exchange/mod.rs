//! The derive pipeline, the only place that decides:
//! request -> subject -> policy -> proof -> source -> audit.
//! (The peer uid check happens in `server`'s accept loop, before a request
//! is even read.)
//!
//! Every failure fails closed: nothing is issued, and there is no fallback to
//! the subject token or a broader token.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::accounts::subject::{self, SubjectError};
use crate::base::clock::SharedClock;
use crate::base::dpop::{self, DpopError};
use crate::base::secret::SecretString;
use crate::derive::mint::{self, Minter};
use crate::derive::policy::{self, DenyReason, Policy, ResourceError};
use crate::infra::config::Config;
use crate::infra::events::{Audit, Event, Kind};
use crate::infra::metrics::Metrics;
use crate::infra::store::Store;

/// The endpoint a request came in on (it is part of `htu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/derive` (JSON).
    Derive,
    /// `POST /token` (RFC 8693 form).
    Token,
}

impl Endpoint {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Derive => "/v1/derive",
            Endpoint::Token => "/token",
        }
    }
}

/// One derive request, after parsing.
#[derive(Debug)]
pub struct DeriveRequest {
    /// The subject token.
    pub subject_token: SecretString,
    /// The step the orchestrator's code is in.
    pub step: String,
    /// The tool the token is for.
    pub tool: String,
    /// The resource (raw; canonicalised here).
    pub resource: String,
    /// Requested scope (space-separated), if any.
    pub scope: Option<String>,
    /// The DPoP proof.
    pub dpop: Option<SecretString>,
    /// RFC 9396 `authorization_details` describing the call, as sent
    /// (checked against the tool's declarations in the pipeline).
    pub authorization_details: Option<serde_json::Value>,
    /// Where it came in.
    pub endpoint: Endpoint,
    /// The peer uid.
    pub peer_uid: u32,
}

/// A successful derive.
#[derive(Debug)]
pub struct Issued {
    /// The token.
    pub access_token: SecretString,
    /// Seconds until it expires (for a provider token whose provider gave
    /// no lifetime: `None`).
    pub expires_in: Option<i64>,
    /// Granted scopes, space-separated.
    pub scope: String,
    /// `DPoP` for minted tokens; the provider's `token_type` for provider
    /// tokens.
    pub token_type: std::borrow::Cow<'static, str>,
    /// Whether the token is bound to the tool's DPoP key. Provider tokens
    /// are bearer tokens: `false`.
    pub sender_constrained: bool,
    /// The details the token carries (RFC 9396 section 7: the answer
    /// repeats them).
    pub authorization_details: Option<serde_json::Value>,
}

/// A refusal that carries an approval link: the same link fields as a
/// connect refusal, so every relay works unchanged.
#[derive(Debug)]
pub struct ApprovalRefusal {
    /// The URL the person opens.
    pub uri: SecretString,
    /// The approval id.
    pub id: String,
    /// Seconds the link stays open.
    pub expires_in: i64,
    /// A sentence for the person, naming the agent and the tool.
    pub message: String,
}

impl LinkRefusal {
    /// The refusal's JSON body, the same on the socket and from the proxy.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": "invalid_grant",
            "reason": self.kind.reason(),
            "error_description": self.message,
            "connect_uri": self.uri.expose(),
            "connect_id": self.id,
            "connect_expires_in": self.expires_in,
            "connect_message": self.message,
        })
    }
}

/// A refusal that carries a connect link (docs/DESIGN.md section 4).
#[derive(Debug)]
pub struct LinkRefusal {
    /// What the link is for; its `reason()` is the refusal's reason.
    pub kind: crate::accounts::connect::LinkKind,
    /// The URL the person opens (it holds the link code).
    pub uri: SecretString,
    /// The link id (also the MCP elicitation id).
    pub id: String,
    /// Seconds the link stays open.
    pub expires_in: i64,
    /// A sentence for the person, naming the agent and the service.
    pub message: String,
}

/// Every way a derive can fail. `api::error_response` maps each to HTTP.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    /// Malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// Bad subject token.
    #[error(transparent)]
    Subject(#[from] SubjectError),
    /// Bad DPoP proof (or a nonce is needed).
    #[error("{0}")]
    Proof(DpopError, Option<String>),
    /// The resource is not acceptable.
    #[error("resource {0}")]
    Target(#[from] ResourceError),
    /// The policy denies it.
    #[error("denied: {}", .0.as_str())]
    Denied(DenyReason),
    /// A rate limit.
    #[error("rate limited")]
    RateLimited {
        /// Seconds to wait.
        retry_after: u64,
    },
    /// This instance cannot serve a service-backed grant: connected services
    /// are not configured, or the policy names a service with no provider
    /// (a reload can); nothing issued.
    #[error("temporarily unavailable: {0}")]
    Unavailable(&'static str),
    /// The person must open a link first (connect, allow, reconnect).
    #[error("{}", .0.kind.reason())]
    LinkRequired(Box<LinkRefusal>),
    /// `authorization_details` the policy does not accept (RFC 9396
    /// section 5); refused before any approval link is made.
    #[error("invalid authorization_details: {0}")]
    InvalidDetails(String),
    /// The call needs its person's approval: the link to it.
    #[error("approval_required")]
    ApprovalRequired(Box<ApprovalRefusal>),
    /// The person declined this call.
    #[error("approval_declined")]
    ApprovalDeclined,
    /// Too many approvals already wait for this person from this agent,
    /// or they are asked too fast: no new link.
    #[error("too many open approvals")]
    TooManyApprovals,
    /// A service's provider did not answer usably in time; nothing issued.
    #[error("the provider of service {service} is unavailable")]
    UpstreamUnavailable {
        /// The service.
        service: String,
    },
    /// The vault failed (a record that does not open, the store, keys).
    #[error("vault: {0}")]
    Vault(String),
    /// An internal failure (audit sink, signing).
    #[error("internal error")]
    Internal(String),
}

impl DeriveError {
    /// A short, bounded label for metrics and events.
    pub fn reason(&self) -> &'static str {
        match self {
            DeriveError::BadRequest(_) => "invalid_request",
            DeriveError::Subject(_) => "invalid_subject_token",
            DeriveError::Proof(DpopError::UseNonce, _) => "use_dpop_nonce",
            DeriveError::Proof(DpopError::ReplayCacheFull, _) => "replay_cache_full",
            DeriveError::Proof(..) => "invalid_dpop_proof",
            DeriveError::Target(_) => "invalid_target",
            DeriveError::Denied(r) => r.as_str(),
            DeriveError::RateLimited { .. } => "rate_limited",
            DeriveError::Unavailable(_) => "temporarily_unavailable",
            DeriveError::LinkRequired(l) => l.kind.reason(),
            DeriveError::InvalidDetails(_) => "invalid_authorization_details",
            DeriveError::ApprovalRequired(_) => "approval_required",
            DeriveError::ApprovalDeclined => "approval_declined",
            DeriveError::TooManyApprovals => "too_many_open_approvals",
            DeriveError::UpstreamUnavailable { .. } => "upstream_unavailable",
            DeriveError::Vault(_) => "vault_error",
            DeriveError::Internal(_) => "internal_error",
        }
    }
}

/// Rate limiters: over the whole broker, per peer and per (person, tool).
#[derive(Debug)]
pub struct Limits {
    /// Sized so that the replay cache never refuses below it
    /// ([`crate::infra::config::max_derive_rate`]): past it a derive gets 429 with
    /// `Retry-After`, checked before anything else. None when the cache is
    /// too small for any sustained rate (its own 503 is then the bound).
    global: Option<governor::DefaultDirectRateLimiter>,
    per_peer: DefaultKeyedRateLimiter<u32>,
    per_person_tool: DefaultKeyedRateLimiter<(String, String, String)>,
}

fn quota(per_second: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

impl Limits {
    /// Limiters from config.
    pub fn new(cfg: &crate::infra::config::LimitsConfig) -> Limits {
        Limits {
            global: (cfg.global_per_second > 0)
                .then(|| RateLimiter::direct(quota(cfg.global_per_second, cfg.global_per_second))),
            per_peer: RateLimiter::keyed(quota(cfg.per_peer_per_second, cfg.burst)),
            per_person_tool: RateLimiter::keyed(quota(cfg.per_person_tool_per_second, cfg.burst)),
        }
    }

    fn retry_after(nu: &governor::NotUntil<governor::clock::QuantaInstant>) -> u64 {
        let wait = nu.wait_time_from(governor::clock::Clock::now(
            &governor::clock::DefaultClock::default(),
        ));
        wait.as_secs() + 1
    }

    /// Forgets idle keys so memory stays bounded; call periodically.
    pub fn housekeeping(&self) {
        self.per_peer.retain_recent();
        self.per_person_tool.retain_recent();
        self.per_peer.shrink_to_fit();
        self.per_person_tool.shrink_to_fit();
    }

    /// Counts one call of `tool` for the person against the
    /// per-person-and-tool limit (derives and proxied calls share it);
    /// `Err` holds the seconds to wait.
    pub fn check_person_tool(&self, iss: &str, sub: &str, tool: &str) -> Result<(), u64> {
        self.per_person_tool
            .check_key(&(iss.to_string(), sub.to_string(), tool.to_string()))
            .map_err(|nu| Limits::retry_after(&nu))
    }

    /// Keys held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.per_peer.len() + self.per_person_tool.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The broker: everything a derive needs, shared by all connections.
#[derive(Debug)]
pub struct Broker {
    /// The configuration.
    pub config: Config,
    /// The current policy (an atomic snapshot per derive).
    pub policy: ArcSwap<Policy>,
    /// The emergency freeze set at run time (admin), persisted in the store.
    frozen: AtomicBool,
    /// A freeze set here whose write to the store failed: it holds until
    /// lifted here, whatever the store says (see [`Broker::reload_frozen`]).
    freeze_unpersisted: AtomicBool,
    /// The key that signs the freeze record in the store ([`crate::derive::freeze`]).
    freeze_key: crate::derive::freeze::FreezeKey,
    /// The highest epoch of the freeze record read here.
    freeze_seen: crate::derive::freeze::Seen,
    /// Subject-token validation.
    pub subjects: subject::Validator,
    /// DPoP proof validation.
    pub proofs: dpop::Validator,
    /// Minting.
    pub minter: Arc<Minter>,
    /// Audit sink (shared: the pages record their events into it too).
    pub audit: Arc<Audit>,
    /// Metrics.
    pub metrics: Metrics,
    /// Rate limits.
    pub limits: Limits,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The clock.
    pub clock: SharedClock,
    /// `issuer + "/v1/derive"` and `issuer + "/token"`, normalised for `htu`.
    htu: [String; 2],
    /// Connected services: vault, links, providers (`service` resources).
    connected_services: Option<Arc<ConnectedServices>>,
    /// Step-up approvals (tools with `approval`); without them such a
    /// tool gets nothing.
    approvals: Option<Arc<crate::derive::approve::Approvals>>,
    /// The proxy's nonces (deployment-wide), when nonces are required;
    /// the derive's own are in `proofs`.
    pub proxy_nonces: Option<dpop::Nonces>,
    /// When this broker started (its clock): a derive proof dated more than
    /// [`START_SKEW`] before it is refused, since the replay cache of the
    /// process before (a crash, a restart) is gone.
    started: i64,
}

/// How far before this process's start a derive proof's `iat` may lie
/// (seconds): the orchestrator shares the host's clock, so a few seconds
/// cover rounding and a slow start.
pub(crate) const START_SKEW: i64 = 5;

impl Broker {
    /// Assembles a broker from its parts.
    // reason: one argument per part, each named and typed; the composition
    // root (`app`) is the one caller, and a struct of the same ten fields
    // would only move the list.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: Config,
        policy: Policy,
        subjects: subject::Validator,
        proofs: dpop::Validator,
        minter: Arc<Minter>,
        audit: Audit,
        metrics: Metrics,
        store: Arc<dyn Store>,
        freeze_key: crate::derive::freeze::FreezeKey,
        clock: SharedClock,
    ) -> Broker {
        let htu = [Endpoint::Derive, Endpoint::Token].map(|e| {
            dpop::normalize_htu(&format!("{}{}", config.issuer, e.path())).unwrap_or_default()
        });
        let freeze_seen = crate::derive::freeze::Seen::default();
        // A store that does not answer at start-up fails the start elsewhere.
        let frozen = crate::derive::freeze::at_start(store.as_ref(), &freeze_key, &freeze_seen)
            .unwrap_or(false);
        metrics.policy_info.set_only(&policy.hash);
        metrics.policy_loaded_time.set(clock.now() as f64);
        metrics.frozen.set(i64::from(frozen || policy.frozen));
        metrics
            .replay_cache_capacity
            .set(proofs.replay_cache().capacity() as i64);
        Broker {
            limits: Limits::new(&config.limits),
            config,
            policy: ArcSwap::from_pointee(policy),
            frozen: AtomicBool::new(frozen),
            freeze_unpersisted: AtomicBool::new(false),
            freeze_key,
            freeze_seen,
            subjects,
            proofs,
            minter,
            audit: Arc::new(audit),
            metrics,
            store,
            htu,
            connected_services: None,
            approvals: None,
            proxy_nonces: None,
            started: clock.now(),
            clock,
        }
    }

    /// Requires proxy nonces ([`dpop::Nonces::proxy`]) on proxied calls.
    pub fn with_proxy_nonces(mut self, n: dpop::Nonces) -> Broker {
        self.proxy_nonces = Some(n);
        self
    }

    /// Adds the approval store (tools with `approval`).
    pub fn with_approvals(mut self, a: Arc<crate::derive::approve::Approvals>) -> Broker {
        self.approvals = Some(a);
        self
    }

    /// The approval store, if configured.
    pub fn approvals(&self) -> Option<&Arc<crate::derive::approve::Approvals>> {
        self.approvals.as_ref()
    }

    /// Adds connected services (the `service` source).
    pub fn with_connected_services(mut self, c: Arc<ConnectedServices>) -> Broker {
        self.connected_services = Some(c);
        self
    }

    /// The connected services, if configured.
    pub fn connected_services(&self) -> Option<&Arc<ConnectedServices>> {
        self.connected_services.as_ref()
    }

    /// The `htu` a proof must carry for `endpoint`.
    pub fn htu(&self, endpoint: Endpoint) -> &str {
        &self.htu[endpoint as usize]
    }

    /// Whether derives are frozen (admin flag or the policy's `frozen`).
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst) || self.policy.load().frozen
    }

    /// Re-reads the freeze from the store, where another instance sharing
    /// it (a replica) or an offline `credbroker freeze` may have changed
    /// it; called when the store's `State` tree changes. A store that does
    /// not answer changes nothing, and a freeze this instance could not
    /// persist is kept (it fails closed).
    pub fn reload_frozen(&self) {
        let Ok(stored) = crate::derive::freeze::read(self.store.as_ref(), &self.freeze_key) else {
            return;
        };
        let kept = self.frozen.load(Ordering::SeqCst);
        let on = self.freeze_seen.judge(stored).unwrap_or(kept)
            || self.freeze_unpersisted.load(Ordering::SeqCst);
        if self.frozen.swap(on, Ordering::SeqCst) != on {
            tracing::warn!(frozen = on, "the emergency freeze changed in the store");
        }
        self.metrics
            .frozen
            .set(i64::from(on || self.policy.load().frozen));
    }

    /// Sets or lifts the emergency freeze; persisted before it takes effect
    /// when lifting, and after it takes effect when setting (so a failing
    /// store can never keep a freeze from applying).
    pub fn set_frozen(&self, on: bool) -> Result<(), crate::infra::store::StoreError> {
        if on {
            self.frozen.store(true, Ordering::SeqCst);
            self.metrics.frozen.set(1);
            let r = self.persist_frozen(true);
            self.freeze_unpersisted.store(r.is_err(), Ordering::SeqCst);
            r
        } else {
            self.persist_frozen(false)?;
            self.freeze_unpersisted.store(false, Ordering::SeqCst);
            self.frozen.store(false, Ordering::SeqCst);
            self.metrics
                .frozen
                .set(i64::from(self.policy.load().frozen));
            Ok(())
        }
    }

    /// Writes the freeze to the store, signed, at the next epoch.
    fn persist_frozen(&self, on: bool) -> Result<(), crate::infra::store::StoreError> {
        crate::derive::freeze::write(self.store.as_ref(), &self.freeze_key, &self.freeze_seen, on)
            .map(|_| ())
    }

    /// Rotates the signing key (one compare-and-swap of the key ring, see
    /// [`mint::rotate`]) and puts the new ring in use: a scheduled rotation
    /// publishes the new key now and activates it after its delay; an
    /// emergency one activates it at once and withdraws every other key.
    pub fn rotate_keys(
        &self,
        sealer: &crate::infra::seal::Sealer,
        kind: mint::RotationKind,
    ) -> Result<mint::Rotation, mint::MintError> {
        let r = mint::rotate(self.store.as_ref(), sealer, self.clock.now(), kind)?;
        self.minter.set_ring(r.ring.clone());
        Ok(r)
    }

    /// Reloads the key ring from the store and applies a due activation
    /// (the housekeeping tick; also picks up a rotation by another process).
    pub fn refresh_keys(&self, sealer: &crate::infra::seal::Sealer) -> Result<(), mint::MintError> {
        let ring = mint::load_or_create(self.store.as_ref(), sealer, self.clock.now())?;
        if ring.active.kid != self.minter.ring().active.kid {
            tracing::info!(kid = %ring.active.kid, "signing key now active");
        }
        self.minter.set_ring(ring);
        Ok(())
    }

    /// Runs one derive and records its outcome (event, metrics).
    pub async fn derive(&self, req: DeriveRequest) -> Result<Issued, DeriveError> {
        let started = Instant::now();
        let now = self.clock.now();
        let policy = self.policy.load_full();
        let mut ctx = Ctx::default();
        let result = self.run(&req, now, &policy, &mut ctx).await;
        let (outcome, reason) = match &result {
            Ok(_) => ("issued", "none"),
            Err(e) => ("denied", e.reason()),
        };
        // Metric labels: the tool only if the policy names it.
        let tool_label = if policy.tools.contains_key(&req.tool) {
            req.tool.as_str()
        } else {
            "other"
        };
        self.metrics
            .derives
            .with_label_values(&[outcome, reason, tool_label])
            .inc();
        self.metrics
            .latency
            .with_label_values(&[outcome])
            .observe(started.elapsed().as_secs_f64());
        // The replay-cache gauge is set when /metrics is scraped: counting it
        // locks every shard, which a derive should not pay for.
        match result {
            Ok((issued, jti)) => {
                let mut e =
                    self.event(now, &req, &policy, &ctx, Kind::DeriveIssued, "issued", None);
                e.scope = Some(&issued.scope);
                e.jti_sha256 = Some(crate::base::jose::sha256_hex(jti.as_bytes()).into());
                e.narrowed = ctx.narrowed;
                // Audit before release: no event, no token.
                self.audit
                    .record(&e)
                    .map_err(|err| DeriveError::Internal(err.to_string()))?;
                Ok(issued)
            }
            Err(err) => {
                let e = self.event(
                    now,
                    &req,
                    &policy,
                    &ctx,
                    Kind::DeriveDenied,
                    "denied",
                    Some(err.reason()),
                );
                if let Err(audit_err) = self.audit.record(&e) {
                    tracing::error!(error = %audit_err, "audit write failed for a refusal");
                }
                Err(err)
            }
        }
    }

    // reason: the fields every derive event carries, borrowed from the
    // request's parts; a private helper with call sites in this file only.
    #[allow(clippy::too_many_arguments)]
    fn event<'a>(
        &'a self,
        now: i64,
        req: &'a DeriveRequest,
        policy: &'a Policy,
        ctx: &'a Ctx,
        kind: Kind,
        outcome: &'a str,
        reason: Option<&'a str>,
    ) -> Event<'a> {
        let mut e = Event::new(now, kind, &self.config.agent);
        e.person_iss = ctx.person.as_ref().map(|p| p.iss.as_str());
        e.person_sub = ctx.person.as_ref().map(|p| p.sub.as_str());
        // A request value goes in clear only when the policy declares it (a
        // secret a client put in a bad request must not reach the log).
        if policy.declares_step(&req.step) {
            e.step = Some(&req.step);
        } else {
            e.undeclared("step", self.audit.opaque(&req.step));
        }
        match policy.tools.get_key_value(&req.tool) {
            Some((name, _)) => e.tool = Some(name),
            None => e.undeclared("tool", self.audit.opaque(&req.tool)),
        }
        match policy.declared_resource(&req.resource) {
            Some(canonical) => e.resource = Some(canonical),
            None => e.undeclared("resource", self.audit.opaque(&req.resource)),
        }
        if let Some(scope) = req.scope.as_deref() {
            if policy.declares_scope(scope) {
                e.scope = Some(scope);
            } else {
                e.undeclared("scope", self.audit.opaque(scope));
            }
        }
        e.outcome = Some(outcome);
        e.reason = reason;
        e.policy_hash = Some(&policy.hash);
        e.peer_uid = Some(req.peer_uid);
        e.approval_id = ctx.approval_id.as_deref();
        e.details_sha256 = ctx.details_sha256.as_deref();
        e
    }

    async fn run(
        &self,
        req: &DeriveRequest,
        now: i64,
        policy: &Policy,
        ctx: &mut Ctx,
    ) -> Result<(Issued, String), DeriveError> {
        if let Some(Err(nu)) = self.limits.global.as_ref().map(|g| g.check()) {
            self.metrics
                .rate_limited
                .with_label_values(&["global"])
                .inc();
            return Err(DeriveError::RateLimited {
                retry_after: Limits::retry_after(&nu),
            });
        }
        if let Err(nu) = self.limits.per_peer.check_key(&req.peer_uid) {
            self.metrics.rate_limited.with_label_values(&["peer"]).inc();
            return Err(DeriveError::RateLimited {
                retry_after: Limits::retry_after(&nu),
            });
        }
        // The freeze, the scope's syntax, the resource: the same prelude
        // as `policy evaluate`. The file's freeze flag is read from this
        // derive's snapshot, like everything else.
        let checked = policy
            .prelude(
                self.frozen.load(Ordering::SeqCst),
                &req.resource,
                req.scope.as_deref(),
            )
            .map_err(|r| match r {
                policy::Refusal::Frozen => DeriveError::Denied(DenyReason::Frozen),
                policy::Refusal::InvalidScope => {
                    DeriveError::BadRequest("scope must be space-separated scope tokens".into())
                }
                policy::Refusal::InvalidTarget(e) => DeriveError::Target(e),
            })?;

        // Subject.
        let (subject, cached) = self
            .subjects
            .validate(req.subject_token.expose(), now)
            .await?;
        if cached {
            self.metrics.subject_cache_hits.inc();
        } else {
            self.metrics.subject_cache_misses.inc();
        }
        ctx.person = Some(subject.person.clone());
        let key = (
            subject.person.iss.clone(),
            subject.person.sub.clone(),
            req.tool.clone(),
        );
        // A proof without a current nonce is refused before the person's
        // and tool's limit is charged, so following `use_dpop_nonce` costs
        // no rate token. Only the nonce is read here; the whole proof is
        // checked below, and a forged one gains nothing but a nonce, which
        // any caller is handed anyway.
        if let Some(proof) = req.dpop.as_ref() {
            if self.proofs.lacks_fresh_nonce(proof.expose(), now) {
                return Err(DeriveError::Proof(
                    DpopError::UseNonce,
                    self.proofs.fresh_nonce(now),
                ));
            }
        }
        if let Err(nu) = self.limits.per_person_tool.check_key(&key) {
            self.metrics
                .rate_limited
                .with_label_values(&["person_tool"])
                .inc();
            return Err(DeriveError::RateLimited {
                retry_after: Limits::retry_after(&nu),
            });
        }

        // Policy.
        let grant = match policy.decide(&checked.request(&req.step, &req.tool)) {
            policy::Decision::Allow(g) => g,
            policy::Decision::Deny(r) => return Err(DeriveError::Denied(r)),
        };
        // The call's details, against the tool's declarations: refused
        // before any approval link exists, so nothing undeclared is ever
        // shown for approval or put in a token.
        let tool = policy
            .tools
            .get(&req.tool)
            .ok_or(DeriveError::Denied(DenyReason::ToolNotAllowed))?;
        let details = policy::details::check(tool, req.authorization_details.as_ref())
            .map_err(|e| DeriveError::InvalidDetails(e.to_string()))?;
        if details.is_some() || tool.approval.is_some() {
            ctx.details_sha256 = Some(crate::derive::approve::details_sha256(details.as_ref()));
        }

        // Proof.
        let proof = req
            .dpop
            .as_ref()
            .ok_or(DeriveError::Proof(DpopError::Missing, None))?;
        let valid = self
            .proofs
            .validate(
                proof.expose(),
                &dpop::Expect {
                    method: "POST",
                    htu: self.htu(req.endpoint),
                    access_token: None,
                    jkt: None,
                    now,
                },
            )
            .map_err(|e| {
                let nonce = match e {
                    DpopError::UseNonce => self.proofs.fresh_nonce(now),
                    _ => None,
                };
                DeriveError::Proof(e, nonce)
            })?;
        // A proof made before this process started may have been accepted
        // by the process before it, whose replay cache is gone (a crash, a
        // restart under the same instance name): refused. Without nonces
        // (the default on sled) this is what stops that replay; with them
        // the boot id in the nonce does too.
        if valid.iat < self.started.saturating_sub(START_SKEW) {
            return Err(DeriveError::Proof(DpopError::Iat, None));
        }

        if let policy::Source::Service { service, delivery } = &grant.resource.source {
            let served = self
                .derive_service(policy, &subject, &grant, service, now, ctx)
                .await?;
            match delivery {
                policy::Delivery::ProviderToken => return Ok(served),
                // The egress proxy: every check of the service source has
                // passed (account, allowance, a live provider token,
                // refreshed if it was near expiry), and the provider's token
                // stays here (dropped, so zeroized). The tool gets an
                // ordinary credbroker token for the proxy address, minted
                // below exactly like a `self` token.
                policy::Delivery::Proxy => {
                    drop(served);
                    ctx.narrowed = None;
                }
            }
        }
        // The person's approval of this very call, when the tool needs it.
        let mut exp_cap = now + grant.ttl.as_secs() as i64;
        let mut single_use = false;
        let mut approval_id = None;
        if let Some(mode) = tool.approval {
            let call = crate::derive::approve::Call {
                person: &subject.person,
                agent: &self.config.agent,
                step: &req.step,
                tool: &req.tool,
                resource: &grant.resource.id,
                scopes: &grant.scopes,
                jkt: &valid.jkt,
                details: details.as_ref(),
            };
            let a = self.approved(policy, tool, mode, &call, now, ctx)?;
            if a.mode == crate::derive::approve::Mode::EachCall {
                single_use = true;
                exp_cap = exp_cap.min(now + crate::derive::approve::EACH_CALL_TOKEN_TTL);
            }
            // A token never outlives the approval it was minted on.
            exp_cap = exp_cap.min(a.expires.max(now + 1));
            approval_id = Some(a.id);
        }
        ctx.approval_id = approval_id.clone();
        // Source: self (or the proxy). Lifetime = min(policy ttl, 300 s,
        // subject's life, the approval's end).
        let exp = exp_cap.min(subject.exp);
        if exp <= now {
            return Err(DeriveError::Subject(SubjectError::Expired));
        }
        let minted = self
            .minter
            .mint(&mint::Claims {
                sub: &subject.person.sub,
                subject_iss: &subject.person.iss,
                aud: &grant.resource.id,
                scopes: &grant.scopes,
                tool: &req.tool,
                step: Some(&req.step),
                jkt: &valid.jkt,
                iat: now,
                exp,
                authorization_details: details.as_ref(),
                approval_id: approval_id.as_deref(),
                single_use,
            })
            .map_err(|e| DeriveError::Internal(e.to_string()))?;
        Ok((
            Issued {
                access_token: minted.token,
                expires_in: Some(exp - now),
                scope: grant.scopes.join(" "),
                token_type: std::borrow::Cow::Borrowed("DPoP"),
                sender_constrained: true,
                authorization_details: details,
            },
            minted.jti,
        ))
    }

    /// An `approval.*` event about `a`, for the call of this derive.
    fn approval_event<'a>(
        &'a self,
        now: i64,
        name: Kind,
        call: &crate::derive::approve::Call<'a>,
        policy: &'a Policy,
        a: &'a crate::derive::approve::Approval,
    ) -> Event<'a> {
        let mut e = Event::new(now, name, &self.config.agent);
        e.person_iss = Some(call.person.iss.as_str());
        e.person_sub = Some(call.person.sub.as_str());
        e.step = Some(call.step);
        e.tool = Some(call.tool);
        e.resource = Some(call.resource);
        e.policy_hash = Some(&policy.hash);
        e.approval_id = Some(&a.id);
        e.details_sha256 = Some(&a.details_sha256);
        e.reason = Some(a.mode.as_str());
        e
    }

    /// The approval in force for `call`, or the refusal that asks for it
    /// (recording `approval.requested` for a new link, `approval.redeemed`
    /// for an each_call grant this derive uses up).
    fn approved(
        &self,
        policy: &Policy,
        tool: &policy::Tool,
        mode: policy::Approval,
        call: &crate::derive::approve::Call<'_>,
        now: i64,
        ctx: &mut Ctx,
    ) -> Result<crate::derive::approve::Approval, DeriveError> {
        use crate::derive::approve::{ApproveError, Lookup, Mode};
        let Some(approvals) = self.approvals.as_ref() else {
            return Err(DeriveError::Unavailable(
                "approvals are not configured on this instance",
            ));
        };
        let mode = match mode {
            policy::Approval::EachCall => Mode::EachCall,
            policy::Approval::PerStep { ttl } => Mode::PerStep {
                ttl: ttl.as_secs() as i64,
            },
        };
        let shown = crate::derive::approve::shown(tool, call.details);
        let found = approvals
            .lookup(call, mode, shown, &policy.hash, now)
            .map_err(|e| match e {
                ApproveError::TooManyOpen | ApproveError::RateLimited => {
                    self.metrics
                        .rate_limited
                        .with_label_values(&["approvals"])
                        .inc();
                    DeriveError::TooManyApprovals
                }
                e => approval_error(e),
            })?;
        let in_clear = call
            .details
            .map(|d| policy::details::loggable(tool, d))
            .filter(|m| !m.is_empty());
        match found {
            Lookup::Granted(a) => {
                if a.mode == Mode::EachCall {
                    let e = self.approval_event(now, Kind::ApprovalRedeemed, call, policy, &a);
                    // No record, no token: the grant is already used up,
                    // so a failure here fails closed.
                    self.audit
                        .record(&e)
                        .map_err(|err| DeriveError::Internal(err.to_string()))?;
                }
                Ok(*a)
            }
            Lookup::Declined(a) => {
                ctx.approval_id = Some(a.id.clone());
                Err(DeriveError::ApprovalDeclined)
            }
            Lookup::Pending(issued) => {
                let a = &issued.approval;
                ctx.approval_id = Some(a.id.clone());
                if issued.fresh {
                    let mut e = self.approval_event(now, Kind::ApprovalRequested, call, policy, a);
                    let scope = a.scopes.join(" ");
                    e.scope = Some(&scope);
                    e.details_in_clear = in_clear;
                    // No record, no link.
                    if let Err(err) = self.audit.record(&e) {
                        if let Err(d) = approvals.discard(a) {
                            tracing::error!(error = %d, "an unrecorded approval could not be discarded");
                        }
                        return Err(DeriveError::Internal(err.to_string()));
                    }
                }
                let agent = &self.config.agent;
                Err(DeriveError::ApprovalRequired(Box::new(ApprovalRefusal {
                    uri: SecretString::new(approvals.uri(&issued.code)),
                    id: a.id.clone(),
                    expires_in: a.expires - now,
                    message: format!(
                        "The agent \"{agent}\" asks to use the tool \"{}\" on {} with the details shown on the page. Open the link to see exactly what it will do, and approve or decline it; then ask the agent to try again.",
                        a.tool, a.resource
                    ),
                })))
            }
        }
    }
}

#[derive(Debug, Default)]
struct Ctx {
    person: Option<subject::Person>,
    /// The approval the derive met (redeemed, pending or declined).
    approval_id: Option<String>,
    /// SHA-256 of the call's details (JCS), when it has any or needs approval.
    details_sha256: Option<String>,
    /// For provider tokens: whether the token was narrowed to the tool's
    /// scopes (`Some(false)`: the provider's broader token was handed over).
    narrowed: Option<bool>,
}

/// Connected services: what the `service` source needs.
#[derive(Debug)]
pub struct ConnectedServices {
    /// Accounts and allowances.
    pub vault: Arc<crate::accounts::vault::Vault>,
    /// Connect links.
    pub links: Arc<crate::accounts::connect::Links>,
    /// Providers by service name.
    pub providers: Arc<crate::accounts::upstream::Providers>,
}

fn covers(have: &[String], want: &[String]) -> bool {
    want.iter().all(|w| have.contains(w))
}

fn vault_error(e: crate::accounts::vault::VaultError) -> DeriveError {
    // A shared store that does not answer (down, slow past its statement
    // timeout, its pool full): a temporary refusal, nothing issued.
    if let crate::accounts::vault::VaultError::Store(
        crate::infra::store::StoreError::Unavailable(m),
    ) = &e
    {
        tracing::warn!(error = %m, "the store is unavailable during a derive");
        return DeriveError::Unavailable("the store is unavailable; retry shortly");
    }
    // An unreadable record is reported (log and the derive event's
    // reason), never served; the text holds no secret.
    tracing::error!(error = %e, "vault failure during a derive");
    DeriveError::Vault(e.to_string())
}

/// A connect-link failure during a derive: a store that does not answer
/// is a temporary refusal, like [`vault_error`]'s.
fn link_error(e: crate::accounts::connect::ConnectError) -> DeriveError {
    if let crate::accounts::connect::ConnectError::Store(
        crate::infra::store::StoreError::Unavailable(m),
    ) = &e
    {
        tracing::warn!(error = %m, "the store is unavailable during a derive");
        return DeriveError::Unavailable("the store is unavailable; retry shortly");
    }
    DeriveError::Internal(format!("connect link: {e}"))
}

/// An approval-store failure during a derive: a store that does not
/// answer is a temporary refusal, like [`vault_error`]'s (the call is
/// neither approved nor recorded, so nothing is issued).
fn approval_error(e: crate::derive::approve::ApproveError) -> DeriveError {
    if let crate::derive::approve::ApproveError::Store(
        crate::infra::store::StoreError::Unavailable(m),
    ) = &e
    {
        tracing::warn!(error = %m, "the store is unavailable during a derive");
        return DeriveError::Unavailable("the store is unavailable; retry shortly");
    }
    DeriveError::Internal(format!("approvals: {e}"))
}

impl Broker {
    /// The `service` source (docs/DESIGN.md section 4, step 6): the person's
    /// connected account and their allowance for this agent; the stored
    /// provider token, refreshed first when near expiry. Decides, in
    /// order: no account -> `connect_required`; an account that must be
    /// renewed (refresh refused, connected at another provider, fewer
    /// scopes granted than needed) -> `reconnect_required`; no allowance
    /// for this agent and these scopes -> `allow_required`. Kept apart from
    /// the `self` hot path.
    async fn derive_service(
        &self,
        policy: &Policy,
        subject: &subject::Subject,
        grant: &policy::Grant,
        service: &str,
        now: i64,
        ctx: &mut Ctx,
    ) -> Result<(Issued, String), DeriveError> {
        let t = self
            .service_token(
                &policy.hash,
                &subject.person,
                service,
                &grant.scopes,
                None,
                now,
            )
            .await?;
        ctx.narrowed = Some(t.narrowed);
        let now = self.clock.now();
        let expires_in = t.expires_at.map(|e| e - now);
        if expires_in.is_some_and(|s| s <= 0) {
            // Never an expired token.
            return Err(DeriveError::UpstreamUnavailable {
                service: service.to_string(),
            });
        }
        // Provider tokens have no jti: the event carries a hash of a hash
        // of the token, enough to correlate, never the token.
        let id = format!(
            "provider:{}",
            crate::base::jose::sha256_hex(t.access_token.expose().as_bytes())
        );
        Ok((
            Issued {
                access_token: t.access_token,
                expires_in,
                scope: grant.scopes.join(" "),
                token_type: std::borrow::Cow::Owned(t.token_type),
                sender_constrained: false,
                authorization_details: None,
            },
            id,
        ))
    }

    /// The service source's checks and token, for a derive and for each
    /// proxied call (docs/DESIGN.md section 4, step 6): the person's account
    /// at `service` and their allowance for this agent and `scopes`, then the
    /// stored provider token, refreshed first when near expiry (or when it is
    /// `refused`, the token the provider just answered 401 to). Decides, in
    /// order: no account -> `connect_required`; an account that must be
    /// renewed (refresh refused, connected at another provider, fewer scopes
    /// granted than needed) -> `reconnect_required`; no allowance for this
    /// agent and these scopes -> `allow_required`. `policy_hash` is the
    /// caller's snapshot: a reload since it began must not make the link
    /// event name a policy that did not decide this request.
    pub async fn service_token(
        &self,
        policy_hash: &str,
        person: &subject::Person,
        service: &str,
        scopes: &[String],
        refused: Option<&str>,
        now: i64,
    ) -> Result<crate::accounts::vault::ServiceToken, DeriveError> {
        let Some(conn) = self.connected_services.as_ref() else {
            return Err(DeriveError::Unavailable(
                "connected services are not configured on this instance",
            ));
        };
        let Some(provider) = conn.providers.get(service) else {
            // The loader and start-up check this; a reload could still
            // name an unknown service. Fail closed.
            return Err(DeriveError::Unavailable(
                "the policy names a service that has no provider in the config",
            ));
        };
        let agent = self.config.agent.as_str();
        let refuse = |kind| {
            self.link_refusal(
                conn,
                provider,
                person,
                service,
                kind,
                scopes,
                policy_hash,
                now,
            )
        };
        // Read once: the token below starts from this same record.
        let read = conn
            .vault
            .account_read(person, service)
            .map_err(vault_error)?;
        let Some(read) = read else {
            return Err(refuse(crate::accounts::connect::LinkKind::Connect));
        };
        let a = read.account();
        if a.status == crate::accounts::vault::AccountStatus::ReconnectRequired
            || a.provider != provider.id()
            || !covers(&a.scopes, scopes)
        {
            return Err(refuse(crate::accounts::connect::LinkKind::Reconnect));
        }
        match conn
            .vault
            .allowance(person, agent, service)
            .map_err(vault_error)?
        {
            Some(al) if covers(&al.scopes, scopes) => {}
            _ => return Err(refuse(crate::accounts::connect::LinkKind::Allow)),
        }
        let request = crate::accounts::vault::TokenRequest {
            person,
            service,
            scopes,
        };
        let outcome = conn
            .vault
            .provider_token_after(provider, &request, read, refused, self.clock.as_ref())
            .await
            .map_err(vault_error)?;
        match outcome {
            crate::accounts::vault::TokenOutcome::Token(t) => Ok(t),
            crate::accounts::vault::TokenOutcome::NoAccount => {
                Err(refuse(crate::accounts::connect::LinkKind::Connect))
            }
            crate::accounts::vault::TokenOutcome::Reconnect => {
                Err(refuse(crate::accounts::connect::LinkKind::Reconnect))
            }
            crate::accounts::vault::TokenOutcome::Unavailable(_) => {
                Err(DeriveError::UpstreamUnavailable {
                    service: service.to_string(),
                })
            }
        }
    }

    /// Opens (or finds) the link and builds the refusal that carries it.
    // reason: what the link record needs, each from a different step of the
    // derive; a private helper with call sites in this file only.
    #[allow(clippy::too_many_arguments)]
    fn link_refusal(
        &self,
        conn: &ConnectedServices,
        provider: &crate::accounts::upstream::Provider,
        person: &subject::Person,
        service: &str,
        kind: crate::accounts::connect::LinkKind,
        scopes: &[String],
        policy_hash: &str,
        now: i64,
    ) -> DeriveError {
        let agent = self.config.agent.as_str();
        let issued = match conn.links.open_link(
            &crate::accounts::connect::LinkRequest {
                person,
                agent,
                service,
                kind,
                scopes,
                policy_hash,
            },
            now,
        ) {
            Ok(l) => l,
            Err(e) => return link_error(e),
        };
        if issued.fresh {
            let mut e = Event::new(now, Kind::ConnectLinkIssued, agent);
            e.person_iss = Some(&person.iss);
            e.person_sub = Some(&person.sub);
            e.service = Some(service);
            e.connect_id = Some(&issued.link.id);
            e.reason = Some(kind.reason());
            let scope = issued.link.scopes.join(" ");
            e.scope = Some(&scope);
            e.policy_hash = Some(policy_hash);
            // No record, no link: a link nobody can trace is not handed out.
            // Closing it lets the next ask make (and record) a new one.
            if let Err(err) = self.audit.record(&e) {
                if let Err(close) = conn.links.close(&issued.link) {
                    tracing::error!(error = %close, "an unrecorded connect link could not be closed");
                }
                return DeriveError::Internal(err.to_string());
            }
        }
        let name = provider.display_name();
        let message = match kind {
            crate::accounts::connect::LinkKind::Connect => format!(
                "The agent \"{agent}\" wants to use your {name} account. Open the link to connect {name} and allow \"{agent}\" to use it, then ask the agent to try again."
            ),
            crate::accounts::connect::LinkKind::Allow => format!(
                "The agent \"{agent}\" wants to use your connected {name} account ({}). Open the link to allow it, then ask the agent to try again.",
                scopes.join(", ")
            ),
            crate::accounts::connect::LinkKind::Reconnect => format!(
                "Your {name} connection must be renewed before the agent \"{agent}\" can use it. Open the link to connect {name} again, then ask the agent to try again."
            ),
        };
        DeriveError::LinkRequired(Box::new(LinkRefusal {
            kind,
            uri: SecretString::new(conn.links.uri(&issued.code)),
            id: issued.link.id.clone(),
            expires_in: issued.link.expires - now,
            message,
        }))
    }
}

#[cfg(test)]
mod snapshot_tests {
    //! The derive decides on one policy snapshot, and everything it
    //! records names that snapshot, even when a reload lands meanwhile.
    // reason: test code, where a panic is the failure report.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    const POLICY: &str = r#"agent = "repo-helper"

[resources."https://api.acme.example"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."acme.issues"]
resource = "https://api.acme.example"
scopes = ["repo"]
steps = ["triage"]
"#;

    fn secret(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[tokio::test]
    async fn link_event_names_the_policy_of_the_derive_not_a_later_reload() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        secret(&d.join("acme.secret"), b"client-secret");
        let (idp, config) = crate::infra::config::test_instance(
            d,
            POLICY,
            r#"
[providers.acme]
authorization_endpoint = "http://127.0.0.1:9/authorize"
token_endpoint = "http://127.0.0.1:9/token"
userinfo_endpoint = "http://127.0.0.1:9/userinfo"
client_id = "broker"
client_secret_file = "acme.secret"
"#,
        );
        let clock: crate::base::clock::SharedClock = Arc::new(crate::base::clock::SystemClock);
        let now = clock.now();
        let instance = crate::app::build(config.clone(), clock).await.unwrap();
        let broker = instance.broker.clone();

        // The derive's snapshot, and a different policy the reloader
        // stored after the derive took it.
        let snapshot = Policy::parse(Path::new("policy.toml"), POLICY.as_bytes()).unwrap();
        let reloaded = format!("{POLICY}\n# reloaded\n");
        let reloaded = Policy::parse(Path::new("policy.toml"), reloaded.as_bytes()).unwrap();
        assert_ne!(snapshot.hash, reloaded.hash);
        broker.policy.store(Arc::new(reloaded.clone()));

        let subject = idp
            .sign_jws(
                serde_json::Map::from_iter([("typ".to_string(), "at+jwt".into())]),
                &serde_json::json!({
                    "iss": "https://idp.example", "sub": "alice", "aud": "repo-helper",
                    "iat": now, "exp": now + 600, "jti": "subject-1",
                }),
            )
            .unwrap();
        let (tool_key, _) = crate::base::jose::Es256Key::generate().unwrap();
        let proof = crate::base::dpop::make_proof(
            &tool_key,
            "POST",
            broker.htu(Endpoint::Derive),
            now,
            None,
            None,
        )
        .unwrap();
        let req = DeriveRequest {
            subject_token: SecretString::new(subject),
            step: "triage".into(),
            tool: "acme.issues".into(),
            resource: "https://api.acme.example".into(),
            scope: None,
            dpop: Some(SecretString::new(proof)),
            authorization_details: None,
            endpoint: Endpoint::Derive,
            peer_uid: 1000,
        };
        let refused = broker
            .run(&req, now, &snapshot, &mut Ctx::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, DeriveError::LinkRequired(l) if l.kind == crate::accounts::connect::LinkKind::Connect),
            "{refused:?}"
        );

        let audit = std::fs::read_to_string(&config.audit_log).unwrap();
        let link = audit
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|e| e["event"] == "connect.link_issued")
            .expect("a link event");
        assert_eq!(link["policy_hash"], snapshot.hash.as_str());
        assert_ne!(link["policy_hash"], reloaded.hash.as_str());
    }
}

#[cfg(test)]
mod store_outage_tests {
    //! A shared store that does not answer fails a service derive closed
    //! with a temporary refusal (503 `temporarily_unavailable`), not a 500.
    use super::*;
    use crate::infra::store::StoreError;

    #[test]
    fn an_unavailable_store_is_a_temporary_refusal() {
        let outage = || StoreError::Unavailable("get: connection refused".into());
        let e = vault_error(crate::accounts::vault::VaultError::Store(outage()));
        assert!(matches!(e, DeriveError::Unavailable(_)), "{e:?}");
        assert_eq!(e.reason(), "temporarily_unavailable");
        let e = link_error(crate::accounts::connect::ConnectError::Store(outage()));
        assert!(matches!(e, DeriveError::Unavailable(_)), "{e:?}");
        let e = approval_error(crate::derive::approve::ApproveError::Store(outage()));
        assert!(matches!(e, DeriveError::Unavailable(_)), "{e:?}");
        let e = approval_error(crate::derive::approve::ApproveError::Corrupt);
        assert!(matches!(e, DeriveError::Internal(_)), "{e:?}");
        // Positive control: a broken record stays what it is.
        let e = vault_error(crate::accounts::vault::VaultError::Store(
            StoreError::Backend("corrupt".into()),
        ));
        assert!(matches!(e, DeriveError::Vault(_)), "{e:?}");
    }
}
