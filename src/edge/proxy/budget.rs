//! Stage 4, the budgets: the per-person-and-tool rate limit (one budget
//! shared with that person's derives for the same tool), the calls in
//! flight to one service (`proxy.max_concurrent_per_service`), and the
//! request body (`proxy.max_request_body`), read whole before anything is
//! sent.

use std::sync::Arc;

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::refusal::Refusal;
use super::{Call, Proxy};

impl Proxy {
    /// The per-person-and-tool rate limit.
    pub(super) fn rate_limit(&self, call: &Call) -> Result<(), Refusal> {
        let b = &self.broker;
        let iss = call.who.subject_iss.as_deref().unwrap_or_default();
        if let Err(wait) = b
            .limits
            .check_person_tool(iss, &call.who.sub, &call.who.tool)
        {
            b.metrics
                .rate_limited
                .with_label_values(&["person_tool"])
                .inc();
            return Err(Refusal::RateLimited(wait));
        }
        Ok(())
    }

    /// A slot among the calls in flight to the call's service, held until
    /// its answer ends.
    pub(super) fn service_slot(&self, call: &Call) -> Result<OwnedSemaphorePermit, Refusal> {
        let cap = self.broker.config.proxy.max_concurrent_per_service as usize;
        // The map's key is owned: made once per service, not per call.
        let known = self.per_service.get(&call.service).map(|s| s.clone());
        let sem = known.unwrap_or_else(|| {
            self.per_service
                .entry(call.service.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(cap)))
                .clone()
        });
        sem.try_acquire_owned().map_err(|_| Refusal::ServiceBusy)
    }

    /// Reads the whole body, capped, before anything goes upstream: nothing
    /// is ever half-sent, and an idempotent call can be retried.
    pub(super) async fn read_body<B>(
        &self,
        parts: &http::request::Parts,
        body: B,
    ) -> Result<Bytes, Refusal>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let cfg = &self.broker.config.proxy;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > cfg.max_request_body) {
            return Err(Refusal::TooLarge(cfg.max_request_body));
        }
        let cap = usize::try_from(cfg.max_request_body).unwrap_or(usize::MAX);
        match tokio::time::timeout(cfg.timeout, Limited::new(body, cap).collect()).await {
            Ok(Ok(c)) => Ok(c.to_bytes()),
            Ok(Err(e))
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                Err(Refusal::TooLarge(cfg.max_request_body))
            }
            Ok(Err(_)) => Err(Refusal::BodyUnreadable),
            Err(_) => Err(Refusal::Timeout),
        }
    }
}
