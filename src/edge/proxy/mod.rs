//! The egress proxy (docs/PROXY.md): a tool calls a connected service at
//! `{issuer}/proxy/{service}/...` with a credbroker token and a DPoP proof;
//! the broker checks the call against the current policy and forwards it to
//! the provider's `api_base` with the person's provider token, which never
//! leaves the broker.
//!
//! A call goes through stages in the order of the check table of
//! docs/PROXY.md ("How each call is checked"), one file each; the first
//! failure ends it with a [`Refusal`] (`refusal`), answered once, in
//! JSON, naming the reason and never a secret. [`Proxy::forward`] is that
//! order, written once:
//! 1. `admit`: the proxy's budget of calls in flight; the shape (no
//!    absolute-form target, no `CONNECT`, `TRACE` or `Upgrade`); a
//!    configured service's address; the raw path under it obeys
//!    `grammar::check_raw_path` (never decoded: the same bytes are matched,
//!    compared with the proof's `htu`, and sent upstream); the freeze;
//! 2. `token`: the token and its DPoP proof, with the verifier resource
//!    servers use ([`crate::verify`]), audience = the proxy address, `htu`
//!    = the configured issuer + the raw path (never `Host` or
//!    `X-Forwarded-*`); the nonce; the proof's `jti` in the store's replay
//!    tree (queued off the call where that is as safe, `replays`); the
//!    person stop list (`derive::persons`: `person_revoked`); then no
//!    credential in the query;
//! 3. `route`: the route, the step and the resource in the *current*
//!    policy, and the route's variables bound to the token's approved
//!    details;
//! 4. `budget`: the per-person-and-tool rate limit, the per-service
//!    concurrency cap, the request body cap; then `bind`: on a route with
//!    `bind_request`, the request is the approved one (its digest is the
//!    token's `req_sha256`), and its hashed body is what is sent;
//! 5. `account`: the account, the allowance and a live provider token
//!    (refreshed with the vault's single-flight refresh);
//! 6. `token` again: a single-use token (an `each_call` approval's) is
//!    spent in the store's replay tree, so it serves one call on every
//!    replica;
//! 7. `record`: the `proxy.request` audit event: no event, no call; then
//!    the person stop list once more, the last gate before the send;
//! 8. `upstream`: the call goes to `api_base` + path + query only (no
//!    proxy from the environment, no redirect followed, an allowlist of
//!    request headers; `client`), retried once after a refresh when the
//!    provider refuses an idempotent call's token;
//! 9. `answer`: the answer streams back through the echo guard (`echo`)
//!    with an allowlist of response headers, and its end is recorded; a
//!    stop of its person stored meanwhile cuts it (`person_revoked`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dashmap::DashMap;
use http::{Method, Request, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::derive::exchange::Broker;
use crate::derive::policy::Policy;
use crate::verify::Verified;

mod account;
mod admit;
mod answer;
mod bind;
mod budget;
mod client;
mod echo;
mod record;
mod refusal;
mod replays;
mod route;
mod token;
mod upstream;

pub(crate) use answer::ProxyBody;
use refusal::Refusal;
#[cfg(test)]
use token::{replay_key, REPLAY_WINDOW_SECS};

pub(crate) use client::Upstream;

/// The proxy's HTTP client to the providers' APIs, for [`Proxy::new`]:
/// built by the composition root before the rest of the instance, so that
/// a proxy that cannot start stops the start. It fails when the platform's
/// certificate authorities cannot be loaded.
pub(crate) fn upstream_client(
    cfg: &crate::infra::config::ProxyConfig,
) -> Result<Upstream, rustls::Error> {
    // Only api_base: never a proxy from HTTP(S)_PROXY, never where a
    // redirect points (a 3xx goes back to the tool as it is).
    client::upstream(cfg.connect_timeout)
}

/// The path prefix of proxied calls.
pub(crate) const PREFIX: &str = "/proxy/";

/// What is known about a call once its token is verified, for the events
/// (owned: the answer streams, and its completion is recorded, after the
/// handler returned).
struct Call {
    service: String,
    method: Method,
    path_sha256: String,
    /// SHA-256 (hex) of the token's `jti`, for both events.
    jti_sha256: String,
    who: Verified,
    policy: Arc<Policy>,
    resource: Arc<str>,
    route: Option<String>,
    /// Whether the matched route binds the request (`bind_request`).
    binds: bool,
    /// The `req_sha256` of the request sent, on a bound route.
    request_sha256: Option<String>,
    /// The call's root span (none without telemetry): a child of the
    /// derive's span when this instance issued the token, the tool's
    /// `traceparent` only linked. Ended with the call (`Completion`).
    span: crate::infra::telemetry::Span,
    /// Its trace id (hex), for the call's events.
    trace_id: Option<String>,
}

impl Call {
    /// Puts what the call came to on its span: the route template (never
    /// the path), and the outcome.
    fn end_span(&mut self, outcome: &str, reason: Option<&str>) {
        if let Some(route) = &self.route {
            // The policy writes `METHOD /template`: the template alone.
            let template = route.split_once(' ').map_or(route.as_str(), |(_, t)| t);
            self.span
                .set("http.route", format!("/proxy/{}{template}", self.service));
        }
        self.span.set("credbroker.outcome", outcome);
        if let Some(r) = reason {
            self.span.set("credbroker.reason", r);
            self.span.fail();
        }
    }

    /// The raw path under the service's address (checked by `admit`).
    fn rest<'p>(&self, parts: &'p http::request::Parts) -> &'p str {
        &parts.uri.path()[PREFIX.len() + self.service.len()..]
    }
}

/// The slots a call holds until its answer ends: one of the proxy's
/// (`proxy.max_in_flight`) and one of its service's
/// (`proxy.max_concurrent_per_service`).
type Slots = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// The proxy: shared by every connection of the public listener.
#[derive(Debug)]
pub(crate) struct Proxy {
    broker: Arc<Broker>,
    client: client::Upstream,
    /// One verifier per proxy address; its keys follow the minter's ring.
    verifiers: Mutex<HashMap<String, token::AddressVerifier>>,
    in_flight: Arc<Semaphore>,
    per_service: DashMap<String, Arc<Semaphore>>,
    /// Whether the configured issuer followed by a proxy path is already
    /// in the form [`crate::base::dpop::normalize_htu`] gives
    /// (`token::issuer_is_normal`): then each call's URL is compared with
    /// the proof's `htu` as built.
    issuer_is_normal: bool,
    /// When this proxy started, by the broker's clock: for
    /// `REPLAY_WINDOW_SECS` after it, each proof's replay entry is written
    /// and checked on its call (`replays`).
    started: i64,
    /// The replay entries queued for a store no other instance shares;
    /// `None` for a shared one (each entry is written on its call).
    replays: Option<Arc<replays::Batched>>,
}

impl Proxy {
    /// The proxy of `broker`, with its upstream client
    /// ([`upstream_client`]).
    pub(crate) fn new(broker: Arc<Broker>, client: Upstream) -> Proxy {
        let cfg = &broker.config.proxy;
        let normal = token::issuer_is_normal(&broker.config.issuer);
        let replays = (!broker.store.is_shared())
            .then(|| {
                replays::Batched::start(
                    broker.store.clone(),
                    std::time::Duration::from_secs(token::REPLAY_WINDOW_SECS as u64),
                )
            })
            .flatten();
        Proxy {
            started: broker.clock.now(),
            replays,
            in_flight: Arc::new(Semaphore::new(cfg.max_in_flight as usize)),
            broker,
            client,
            verifiers: Mutex::new(HashMap::new()),
            per_service: DashMap::new(),
            issuer_is_normal: normal,
        }
    }

    /// Writes the queued replay entries and closes the queue (a clean
    /// stop, after the drain): a call still running writes its own.
    pub(crate) fn close_replays(&self) {
        if let Some(b) = &self.replays {
            b.close();
        }
    }

    /// Handles one request under `/proxy/`.
    pub(crate) async fn handle<B>(self: &Arc<Self>, req: Request<B>) -> Response<ProxyBody>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let started = Instant::now();
        let wall = self
            .broker
            .telemetry
            .is_some()
            .then(std::time::SystemTime::now);
        let Ok(slot) = self.in_flight.clone().try_acquire_owned() else {
            return self.refused(None, "other", &Refusal::ProxyBusy);
        };
        let (parts, body) = req.into_parts();
        let service = admit::service_of(parts.uri.path());
        let service_label = if self.broker.policy.load().services().contains(service) {
            service
        } else {
            "other"
        };
        match self.forward(&parts, body, slot, (started, wall)).await {
            Ok(r) => r,
            Err((mut call, refusal)) => {
                if let Some(c) = call.as_mut() {
                    c.end_span("denied", Some(refusal.reason()));
                }
                self.refused(call.as_ref(), service_label, &refusal)
            }
        }
    }

    /// The stages of a call, in the order of the check table (the module
    /// doc): each step is one stage's check, and the first refusal ends
    /// the call. A refusal carries the call once its token is verified, so
    /// that it is recorded against the call.
    async fn forward<B>(
        self: &Arc<Self>,
        parts: &http::request::Parts,
        body: B,
        slot: OwnedSemaphorePermit,
        (started, wall): (Instant, Option<std::time::SystemTime>),
    ) -> Result<Response<ProxyBody>, (Option<Call>, Refusal)>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // Nothing is known of the caller until its token is verified.
        let service = self.admit(parts).map_err(|r| (None, r))?;
        let mut call = self.authenticate(parts, service).map_err(|r| (None, r))?;
        if let Err(r) = self.person_check(&call.who) {
            return Err((Some(call), r));
        }
        if let (Some(t), Some(wall)) = (&self.broker.telemetry, wall) {
            call.span = self.call_span(t, &call, parts, wall);
            call.trace_id = call.span.context().map(|c| c.trace_hex());
        }
        let checked = match &self.broker.telemetry {
            None => self.checked_call(&mut call, parts, body, slot).await,
            Some(_) => {
                // Its store calls and the upstream request nest under the
                // call's span (the call itself keeps it, and ends it when
                // the answer does).
                let root = call.span.context_copy();
                let fut = self.checked_call(&mut call, parts, body, slot);
                crate::infra::telemetry::within(&root, fut).await
            }
        };
        let sent = match checked {
            Ok(sent) => sent,
            Err(r) => return Err((Some(call), r)),
        };
        self.answer(call, sent, started)
            .await
            .map_err(|(call, r)| (Some(call), r))
    }

    /// The stages between a verified token and the provider's answer.
    async fn checked_call<B>(
        &self,
        call: &mut Call,
        parts: &http::request::Parts,
        body: B,
        slot: OwnedSemaphorePermit,
    ) -> Result<upstream::Sent, Refusal>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut checks = self.span("proxy.checks", &call.span);
        token::no_credential_in_query(parts)?;
        route::check(call, parts)?;
        self.rate_limit(call)?;
        let service_slot = self.service_slot(call)?;
        let body = self.read_body(parts, body).await?;
        let body = bind::check(call, parts, body)?;
        let target = self.target(call, parts)?;
        let token = self.provider_token(call, None).await?;
        if call.who.single_use {
            self.spend(&call.who)?;
        }
        self.record_request(call)?;
        // The last gate: a stop stored while the call was checked (its
        // token read, its body received, the provider's token refreshed)
        // keeps it from going out.
        self.person_check(&call.who)?;
        checks.set("credbroker.outcome", "passed");
        drop(checks);
        let mut up = self.span("proxy.upstream", &call.span);
        let sent = self
            .send(call, parts, body, target, token, (slot, service_slot))
            .await;
        match &sent {
            Ok(s) => up.set("http.response.status_code", s.resp.status().as_u16()),
            Err(_) => up.fail(),
        }
        sent
    }

    /// A child span of the call's (one branch without telemetry); the
    /// checks' span starts with the call, before its token was verified.
    fn span(
        &self,
        name: &'static str,
        call_span: &crate::infra::telemetry::Span,
    ) -> crate::infra::telemetry::Guard {
        use crate::infra::telemetry::{child, child_kind, Guard, Kind};
        if self.broker.telemetry.is_none() {
            return Guard::none();
        }
        if name == "proxy.upstream" {
            return child_kind(name, Kind::Client);
        }
        let mut g = child(name);
        g.start_with(call_span);
        g
    }

    /// The call's root span: the derive's trace continued when this
    /// instance issued the token (and the trace was recorded), else a new
    /// trace; the tool's `traceparent` is only linked, and its `tracestate`
    /// and `baggage` are never read.
    fn call_span(
        &self,
        t: &Arc<crate::infra::telemetry::Telemetry>,
        call: &Call,
        parts: &http::request::Parts,
        wall: std::time::SystemTime,
    ) -> crate::infra::telemetry::Span {
        let derive = t.recall(&call.jti_sha256, self.broker.clock.now());
        let tool = crate::infra::telemetry::incoming(&parts.headers);
        let mut span = t.call_span("proxy", derive, tool).started_at(wall);
        span.set("http.request.method", call.method.as_str());
        span.set("credbroker.service", call.service.as_str());
        if let Some((name, _)) = call.policy.tools.get_key_value(&call.who.tool) {
            span.set("credbroker.tool", name.as_str());
        }
        span
    }
}
