//! The derive pipeline, the only place that decides whether a token is
//! issued. This is where its order is written down (docs/DESIGN.md section
//! 4 gives the reasons; the egress proxy's own order is in docs/PROXY.md).
//! Every failure fails closed: nothing is issued, and there is no fallback
//! to the subject token or a broader token. The first step that refuses
//! ends the derive, and `tests/it/security/derive_check_order.rs` pins the
//! order: a request that fails two adjacent steps gets the earlier refusal.
//!
//! 1. **Peer** (`app::server`'s accept loop and `edge::api`, before this
//!    module): the uid allow-list, then no `Origin` header.
//! 2. **Request** (`edge::api` parses it; [`pipeline`]'s `request_step`):
//!    `POST /v1/derive` (JSON) or `POST /token` (the RFC 8693 form), sizes
//!    capped before parsing, unknown token types, repeated parameters and
//!    several resources refused. Then the global derive limit (sized from
//!    the replay cache) and the per-peer limit ([`limits`], 429 with
//!    `Retry-After`), then the freeze (the operator's, [`crate::derive::freeze`],
//!    or the policy file's), the scope's syntax and the resource's
//!    canonical form.
//! 3. **Subject** (`subject_step`): the subject token from a trusted issuer
//!    ([`crate::accounts::subject`], cached by its hash for at most 60 s);
//!    then a proof without a current nonce, when nonces are required, is
//!    refused with `use_dpop_nonce`, before the per-(person, tool) limit is
//!    charged; then that limit.
//! 4. **Policy** (`policy_step`): (step, tool, resource, scope) gives a
//!    grant or a denial with its reason; then the call's
//!    `authorization_details` (RFC 9396) against the types the tool
//!    declares, before any approval link could show them.
//! 5. **Proof** (`proof_step`): the DPoP proof, every check of RFC 9449
//!    section 4.3 with `htu` = the issuer URL + the request path, then the
//!    `jti` replay cache (full: refused); then a proof dated more than
//!    [`START_SKEW`] before this process started is refused (the replay
//!    cache of the process before is gone).
//! 6. **Source**, as the policy says for the resource: `self` goes on to
//!    the mint; `service` ([`service`]) checks the person's connected
//!    account (none: `connect_required`; to renew, at another provider or
//!    with fewer scopes: `reconnect_required`), their allowance for this
//!    agent (`allow_required`), each refusal carrying a connect link, then
//!    the provider's token, refreshed first when near expiry. With
//!    `delivery = "provider_token"` that token is the answer (no approval,
//!    no mint); with `delivery = "proxy"` it stays here and the tool's
//!    token is minted as for `self`. The egress proxy runs this step,
//!    [`Broker::service_token`], for every proxied call.
//! 7. **Approval** ([`approval`]), when the tool has `approval`: the
//!    person's approval of this exact call (person, agent, step, tool,
//!    resource, scopes, DPoP key, details), asked for through a link
//!    (`approval_required`); a declined call is refused
//!    (`approval_declined`).
//! 8. **Mint** (`mint_step`, [`crate::derive::mint`]): lifetime = min(policy
//!    ttl, 300 s, the subject token's remaining life, the approval's end;
//!    an each_call token at most 60 s and single-use).
//! 9. **Audit** ([`Broker::derive`]): the event is written before the token
//!    is released; if it cannot be written, the derive fails.
//!
//! The parts: [`request`] (what a derive takes and gives), [`error`] (every
//! refusal, with its source), [`limits`] (the rate limiters), [`pipeline`]
//! (the steps), [`service`] (the service source), [`approval`] (approvals).

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::accounts::subject;
use crate::base::clock::SharedClock;
use crate::base::dpop;
use crate::derive::approve::Approvals;
use crate::derive::freeze;
use crate::derive::mint::Minter;
use crate::derive::policy::Policy;
use crate::derive::upstreams::Upstreams;
use crate::infra::config::Config;
use crate::infra::events::{Audit, Event, Kind};
use crate::infra::metrics::Metrics;
use crate::infra::skew::{Corrected, Skew};
use crate::infra::store::{Store, StoreError};

mod approval;
mod bind;
mod error;
mod limits;
mod pipeline;
mod request;
mod service;
#[cfg(test)]
mod tests;
mod upstream;

pub use error::{ApprovalRefusal, DeriveError, InternalError, LinkRefusal};
pub(crate) use limits::Limits;
pub use request::{DeriveRequest, Endpoint, IntendedRequest, Issued, SubjectTokenType};
pub(crate) use service::ConnectedServices;

/// The broker: everything a derive needs, shared by all connections.
#[derive(Debug)]
pub struct Broker {
    /// The configuration.
    pub config: Config,
    /// The current policy (an atomic snapshot per derive).
    pub policy: ArcSwap<Policy>,
    /// The emergency freeze set at run time (admin, or a replica through
    /// the store), persisted signed in the store.
    freeze: freeze::State,
    /// The person stop list, watched in memory as the freeze is.
    pub(crate) stops: crate::derive::persons::Stops,
    /// Ends a person's page sessions (the pages' own, set by the
    /// composition root, as the pages are a layer above): a person stop
    /// calls it.
    pub(crate) end_sessions: std::sync::OnceLock<crate::derive::persons::EndSessions>,
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
    /// The clock: this instance's, for what it signs and checks alone.
    pub clock: SharedClock,
    /// This instance's offset from the shared store's clock, measured in
    /// the background (`infra::skew`).
    pub skew: Arc<Skew>,
    /// The clock corrected by that offset: the database's time, for the
    /// times replicas share (key activation, link and approval expiries).
    /// The local clock where no offset is known (sled).
    pub shared_clock: SharedClock,
    /// `issuer + "/v1/derive"` and `issuer + "/token"`, normalised for `htu`.
    htu: [String; 2],
    /// Connected services: vault, links, providers (`service` resources).
    connected_services: Option<Arc<ConnectedServices>>,
    /// Step-up approvals (tools with `approval`); without them such a
    /// tool gets nothing.
    approvals: Option<Arc<Approvals>>,
    /// The organisation's authorization servers (`exchange` resources);
    /// without them such a resource gets nothing.
    upstreams: Option<Arc<Upstreams>>,
    /// The client key (`derive::client_keys`), loaded when the config has
    /// an upstream: published at `{issuer}/.well-known/client-jwks.json`.
    client_keys: Option<Arc<crate::derive::client_keys::ClientKeys>>,
    /// The verified emails recorded per person, when a Shared Signals
    /// transmitter maps `email` subjects (`accounts::emails`): observed on
    /// each derive, written off the request path.
    emails: Option<Arc<crate::accounts::emails::Emails>>,
    /// The proxy's nonces (deployment-wide), when nonces are required;
    /// the derive's own are in `proofs`.
    pub proxy_nonces: Option<dpop::Nonces>,
    /// OpenTelemetry (`[telemetry]`), when on.
    pub(crate) telemetry: Option<Arc<crate::infra::telemetry::Telemetry>>,
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
        freeze_key: freeze::FreezeKey,
        clock: SharedClock,
    ) -> Broker {
        let htu = [Endpoint::Derive, Endpoint::Token].map(|e| {
            dpop::normalize_htu(&format!("{}{}", config.issuer, e.path())).unwrap_or_default()
        });
        let freeze = freeze::State::at_start(store.as_ref(), freeze_key);
        let stops =
            crate::derive::persons::Stops::at_start(store.as_ref(), config.revocation.clone());
        metrics.policy_info.set_only(&policy.hash);
        metrics.policy_loaded_time.set(clock.now() as f64);
        metrics
            .frozen
            .set(i64::from(freeze.is_set() || policy.frozen));
        metrics
            .replay_cache_capacity
            .set(proofs.replay_cache().capacity() as i64);
        let skew = Arc::new(Skew::new(&config.clock));
        let shared_clock: SharedClock = Corrected::new(clock.clone(), skew.clone());
        Broker {
            limits: Limits::new(&config.limits),
            skew,
            shared_clock,
            config,
            policy: ArcSwap::from_pointee(policy),
            freeze,
            stops,
            end_sessions: std::sync::OnceLock::new(),
            subjects,
            proofs,
            minter,
            audit: Arc::new(audit),
            metrics,
            store,
            htu,
            connected_services: None,
            approvals: None,
            upstreams: None,
            client_keys: None,
            emails: None,
            proxy_nonces: None,
            telemetry: None,
            started: clock.now(),
            clock,
        }
    }

    /// Uses `skew` (measured before the broker was built) for the clock
    /// check and the corrected clock.
    pub(crate) fn with_skew(mut self, skew: Arc<Skew>) -> Broker {
        self.shared_clock = Corrected::new(self.clock.clone(), skew.clone());
        self.skew = skew;
        self
    }

    /// Records spans into `t` (`[telemetry]`).
    pub(crate) fn with_telemetry(
        mut self,
        t: Option<Arc<crate::infra::telemetry::Telemetry>>,
    ) -> Broker {
        self.telemetry = t;
        self
    }

    /// The database's time as this instance knows it (the local clock
    /// corrected by the measured offset): for times other replicas act on.
    pub fn shared_now(&self) -> i64 {
        self.shared_clock.now()
    }

    /// Requires proxy nonces ([`dpop::Nonces::proxy`]) on proxied calls.
    pub fn with_proxy_nonces(mut self, n: dpop::Nonces) -> Broker {
        self.proxy_nonces = Some(n);
        self
    }

    /// Adds the approval store (tools with `approval`).
    pub fn with_approvals(mut self, a: Arc<Approvals>) -> Broker {
        self.approvals = Some(a);
        self
    }

    /// Adds the upstream authorization servers (`exchange` resources).
    pub fn with_upstreams(mut self, u: Arc<Upstreams>) -> Broker {
        self.upstreams = Some(u);
        self
    }

    /// Adds the client key (loaded when the config has an upstream).
    pub fn with_client_keys(mut self, k: Arc<crate::derive::client_keys::ClientKeys>) -> Broker {
        self.client_keys = Some(k);
        self
    }

    /// The client key, when loaded.
    pub fn client_keys(&self) -> Option<&Arc<crate::derive::client_keys::ClientKeys>> {
        self.client_keys.as_ref()
    }

    /// Records the verified email of each derive's person (see
    /// [`crate::accounts::emails`]).
    pub(crate) fn with_emails(mut self, e: Arc<crate::accounts::emails::Emails>) -> Broker {
        self.emails = Some(e);
        self
    }

    /// The recorded emails, when kept.
    pub(crate) fn emails(&self) -> Option<&Arc<crate::accounts::emails::Emails>> {
        self.emails.as_ref()
    }

    /// The upstream authorization servers, if configured.
    pub fn upstreams(&self) -> Option<&Arc<Upstreams>> {
        self.upstreams.as_ref()
    }

    /// The approval store, if configured.
    pub fn approvals(&self) -> Option<&Arc<Approvals>> {
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
        self.freeze.is_set() || self.policy.load().frozen
    }

    /// Re-reads the freeze from the store ([`freeze::State::reload`]),
    /// where a replica or an offline `credbroker freeze` may have changed
    /// it; called when the store's `State` tree changes.
    pub fn reload_frozen(&self) {
        if let Some(on) = self.freeze.reload(self.store.as_ref()) {
            if on {
                self.drop_exchanged_tokens();
            }
            self.metrics
                .frozen
                .set(i64::from(on || self.policy.load().frozen));
        }
    }

    /// Re-reads the person stop list from the store (a change notified,
    /// or the poll every half of `revocation.watch_bound`); a store that
    /// does not answer keeps the list read last (the watch goes down once
    /// the bound passes). Updates the two metrics.
    pub fn reload_stops(&self) {
        match self.stops.reload(self.store.as_ref()) {
            // Stopped on another replica: this one's own caches of them go.
            Ok(fresh) => {
                for p in fresh {
                    self.subjects.drop_person(&p);
                    self.drop_exchanged_tokens_of(&p.iss, &p.sub);
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading the person stop list failed"),
        }
        self.metrics.persons_revoked.set(self.stops.len() as i64);
        self.metrics
            .revocation_watch_up
            .set(i64::from(self.stops.watch_up()));
    }

    /// A new sign-in lifts a sign-in stop ([`crate::derive::persons`]):
    /// marked here at once; written to the store, and `person.restored`
    /// recorded by the one instance whose write lifted it, off the derive's
    /// path (which makes no store call).
    pub(super) fn lift_stop(&self, lifting: crate::derive::persons::Lifting, now: i64) {
        let person = lifting.stop.person();
        let revocation_time = lifting.stop.revocation_time;
        self.stops.note_lifted(&person, revocation_time, now);
        let (store, audit, agent) = (
            self.store.clone(),
            self.audit.clone(),
            self.config.agent.clone(),
        );
        tokio::task::spawn_blocking(move || {
            match crate::derive::persons::mark_lifted(store.as_ref(), &person, revocation_time, now)
            {
                Ok(true) => {
                    tracing::warn!("a person's stop was lifted by a new sign-in");
                    let mut e = Event::new(now, Kind::PersonRestored, &agent);
                    e.person_iss = Some(&person.iss);
                    e.person_sub = Some(&person.sub);
                    e.source = Some("sign_in");
                    e.revocation_time = Some(revocation_time);
                    if let Err(err) = audit.record(&e) {
                        tracing::error!(error = %err, "the person.restored event was not written");
                    }
                }
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "marking a person's stop lifted failed; the next sign-in tries again")
                }
            }
        });
    }

    /// Sets or lifts the emergency freeze ([`freeze::State::set`]: a set
    /// freeze applies even when the store does not take it).
    pub fn set_frozen(&self, on: bool) -> Result<(), StoreError> {
        if on {
            self.drop_exchanged_tokens();
        }
        let r = self.freeze.set(self.store.as_ref(), on);
        self.metrics.frozen.set(i64::from(self.is_frozen()));
        r
    }
}

impl Broker {
    /// Runs one derive and records its outcome (event, metrics).
    pub async fn derive(&self, req: DeriveRequest) -> Result<Issued, DeriveError> {
        let started = Instant::now();
        let now = self.clock.now();
        let policy = self.policy.load_full();
        let mut ctx = Ctx::default();
        let mut result = self.run(&req, now, &policy, &mut ctx).await;
        // A stop stored while this derive ran: checked again before the
        // token is released (memory only).
        if let (Ok(_), Some(person)) = (&result, &ctx.person) {
            if let Err(r) = self.stops.check_derive(person, ctx.auth_time) {
                result = Err(r.into());
            }
        }
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
        if self.telemetry.is_some() {
            self.trace_root(&req, &policy, outcome, reason);
        }
        match result {
            Ok((issued, jti)) => {
                let mut e =
                    self.event(now, &req, &policy, &ctx, Kind::DeriveIssued, "issued", None);
                e.scope = Some(&issued.scope);
                e.jti_sha256 = Some(crate::base::jose::sha256_hex(jti.as_bytes()).into());
                e.narrowed = ctx.narrowed;
                // Audit before release: no event, no token.
                self.audit.record(&e)?;
                if self.telemetry.is_some() {
                    let until = now + issued.expires_in.unwrap_or(0);
                    if let Some(sha) = e.jti_sha256.as_deref() {
                        crate::infra::telemetry::remember_root(sha, until);
                    }
                }
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

    /// The derive's names on its root span: as the audit writes them
    /// (a value the policy does not declare as its HMAC, never in clear).
    fn trace_root(&self, req: &DeriveRequest, policy: &Policy, outcome: &str, reason: &str) {
        use crate::infra::telemetry::{fail_root, set_root};
        let hmac = |v: &str| self.audit.opaque(v).hmac_sha256;
        if policy.declares_step(&req.step) {
            set_root("credbroker.step", req.step.as_str());
        } else {
            set_root("credbroker.step_hmac", hmac(&req.step));
        }
        match policy.tools.get_key_value(&req.tool) {
            Some((name, _)) => set_root("credbroker.tool", name.as_str()),
            None => set_root("credbroker.tool_hmac", hmac(&req.tool)),
        }
        match policy.declared_resource(&req.resource) {
            Some(canonical) => set_root("credbroker.resource", canonical),
            None => set_root("credbroker.resource_hmac", hmac(&req.resource)),
        }
        set_root("credbroker.outcome", outcome);
        if outcome != "issued" {
            set_root("credbroker.reason", reason);
            fail_root();
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
        e.request_sha256 = ctx.request_sha256.as_deref();
        e.upstream = ctx.upstream.as_deref();
        e.expires_at = ctx.expires_at;
        e.reused = ctx.reused;
        e
    }
}

/// What a derive met on its way, for its event.
#[derive(Debug, Default)]
struct Ctx {
    person: Option<subject::Person>,
    /// The subject token's `auth_time` (the stop list's check is made
    /// again on it before the token is released).
    auth_time: Option<i64>,
    /// The approval the derive met (redeemed, pending or declined).
    approval_id: Option<String>,
    /// SHA-256 of the call's details (JCS), when it has any or needs approval.
    details_sha256: Option<String>,
    /// The bound request's `req_sha256`, when the derive carried one.
    request_sha256: Option<String>,
    /// For provider tokens: whether the token was narrowed to the tool's
    /// scopes (`Some(false)`: the provider's broader token was handed over).
    narrowed: Option<bool>,
    /// For an `exchange` resource: its upstream.
    upstream: Option<String>,
    /// For an exchanged token: its expiry.
    expires_at: Option<i64>,
    /// For an exchanged token: whether it was given again.
    reused: Option<bool>,
}
