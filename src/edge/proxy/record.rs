//! Stage 7, the record: the `proxy.request` audit event, written before
//! anything goes upstream (no event, no call); and what every call leaves
//! behind however it ends: `proxy.completed` (denied, completed or
//! aborted) and the metrics, with labels from the policy.

use std::time::Instant;

use http::Response;
use http_body_util::Either;

use super::answer::Outcome;
use super::refusal::Refusal;
use super::{Call, Proxy, ProxyBody};
use crate::derive::policy::Policy;
use crate::infra::events::{Event, ProxyCall, PROXY_COMPLETED, PROXY_REQUEST};

impl Proxy {
    /// Writes `proxy.request`: a call whose event cannot be written is
    /// not sent.
    pub(super) fn record_request(&self, call: &Call) -> Result<(), Refusal> {
        let e = self.event(call, PROXY_REQUEST);
        if let Err(err) = self.broker.audit.record(&e) {
            tracing::error!(error = %err, "audit write failed; proxied call not sent");
            return Err(Refusal::AuditUnavailable);
        }
        Ok(())
    }

    /// Records a refusal (metrics; the event when the token was valid) and
    /// builds its answer.
    pub(super) fn refused(
        &self,
        call: Option<&Call>,
        service: &str,
        r: &Refusal,
    ) -> Response<ProxyBody> {
        let tool = call.map_or("other", |c| self.tool_label(&c.policy, &c.who.tool));
        self.broker
            .metrics
            .proxy_requests
            .with_label_values(&[service, tool, r.reason()])
            .inc();
        if let Some(c) = call {
            let mut e = self.event(c, PROXY_COMPLETED);
            e.outcome = Some("denied");
            e.reason = Some(r.reason());
            if let Err(err) = self.broker.audit.record(&e) {
                tracing::error!(error = %err, "audit write failed for a proxy refusal");
            }
        }
        r.response(&self.broker.config.dpop.algs).map(Either::Left)
    }

    pub(super) fn tool_label<'p>(&self, policy: &'p Policy, tool: &str) -> &'p str {
        policy
            .tools
            .get_key_value(tool)
            .map_or("other", |(k, _)| k.as_str())
    }

    fn event<'c>(&'c self, c: &'c Call, kind: crate::infra::events::Kind) -> Event<'c> {
        let b = &self.broker;
        let mut e = Event::new(b.clock.now(), kind, &b.config.agent);
        e.person_iss = c.who.subject_iss.as_deref();
        e.person_sub = Some(&c.who.sub);
        // Step and tool come from our own token; still, only names the
        // policy declares go in clear.
        if let Some(step) = c.who.step.as_deref() {
            if c.policy.declares_step(step) {
                e.step = Some(step);
            }
        }
        e.tool = c
            .policy
            .tools
            .get_key_value(&c.who.tool)
            .map(|(k, _)| k.as_str());
        e.resource = Some(&c.resource);
        e.service = Some(&c.service);
        e.policy_hash = Some(&c.policy.hash);
        e.jti_sha256 = Some(std::borrow::Cow::Borrowed(&c.jti_sha256));
        e.trace_id = c.trace_id.as_deref();
        e.proxy = Some(ProxyCall {
            method: c.method.as_str(),
            route: c.route.as_deref(),
            path_sha256: &c.path_sha256,
            request_sha256: c.request_sha256.as_deref(),
            ..ProxyCall::default()
        });
        e
    }

    /// Writes `proxy.completed` for an answer that went out (whole, or
    /// cut short: `outcome` says which).
    pub(super) fn completed(
        &self,
        c: &Call,
        status: u16,
        outcome: Outcome,
        up: u64,
        down: u64,
        started: Instant,
    ) {
        let mut e = self.event(c, PROXY_COMPLETED);
        let whole = outcome == Outcome::Completed;
        e.outcome = Some(if whole { "completed" } else { "aborted" });
        e.reason = (!whole).then_some(outcome.as_str());
        if let Some(p) = e.proxy.as_mut() {
            p.upstream_status = Some(status);
            p.bytes_up = Some(up);
            p.bytes_down = Some(down);
            p.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        }
        if let Err(err) = self.broker.audit.record(&e) {
            tracing::error!(error = %err, "audit write failed for proxy.completed");
        }
    }
}
