//! Stage 9, the answer: the provider's answer streams back to the tool
//! with bounded memory whatever its size, through the echo guard
//! ([`EchoGuard`]), with an allowlist of response headers. The status and
//! headers go out only once the first chunk (or the whole answer, when
//! shorter) has been scanned: a token there is a 502 `echo_blocked`; a
//! later one cuts the answer. The end of the answer, however it ends, is
//! recorded (`proxy.completed`, the metrics) and frees the call's slots.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use http_body_util::{BodyExt, Either};

use super::echo::{Echo, EchoGuard};
use super::refusal::{Refusal, UpstreamFailure};
use super::upstream::Sent;
use super::{Call, Proxy, Slots};
use crate::base::http::Body;

/// Response headers passed back to the tool; never `Set-Cookie`.
const RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-disposition",
    "etag",
    "last-modified",
    "location",
    "link",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-used",
    "x-github-request-id",
];

/// The body of the proxy's answers: a whole JSON refusal, or the
/// provider's answer through the echo guard.
pub(crate) type ProxyBody = Either<Body, GuardedBody>;

/// How a streamed answer ended, for `proxy.completed` and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The whole answer went out.
    Completed,
    /// Cut: it carried a provider token.
    EchoBlocked,
    /// Cut: the provider failed or was too slow mid-answer.
    UpstreamFailed,
    /// The tool went away (or its connection failed) mid-answer.
    ClientGone,
    /// Cut: the call's person was stopped mid-answer.
    PersonRevoked,
}

impl Outcome {
    /// The name in the event's `reason` and the metrics' `outcome` label.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::EchoBlocked => "echo_blocked",
            Outcome::UpstreamFailed => "upstream_failed",
            Outcome::ClientGone => "client_gone",
            Outcome::PersonRevoked => "person_revoked",
        }
    }
}

/// Why a streamed answer was cut short (the tool sees the connection end
/// before the body does).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Abort {
    /// The provider's answer echoed a provider token.
    #[error("the answer was cut: it carried a provider token")]
    Echo,
    /// The provider failed or was too slow mid-answer.
    #[error("the provider's answer failed")]
    Upstream,
    /// The call's person was stopped mid-answer.
    #[error("the answer was cut: the person's access was stopped")]
    PersonRevoked,
}

/// A future that ends when the person stop list changes, giving back its
/// receiver to wait again.
type ListChanged = std::pin::Pin<
    Box<dyn std::future::Future<Output = tokio::sync::watch::Receiver<u64>> + Send + Sync>,
>;

fn list_changed(mut rx: tokio::sync::watch::Receiver<u64>) -> ListChanged {
    Box::pin(async move {
        // A closed sender (the broker gone) never moves again.
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        rx
    })
}

/// The provider's answer as it streams back: each poll reads the upstream
/// body and passes what it gives through the echo guard in place, so memory
/// stays bounded (one upstream chunk and the guard's tail) whatever the
/// size, with no task or channel between the provider and the tool, and
/// no copy of a chunk's bulk (only the guard's short tail is copied).
///
/// When the answer ends (whole, cut, or dropped because the tool went
/// away) it writes `proxy.completed` and the metrics, once.
pub(crate) struct GuardedBody {
    upstream: hyper::body::Incoming,
    guard: EchoGuard,
    /// Bytes released by the guard and not yet handed to hyper, in order:
    /// what the last chunk released, then the guard's tail at the end.
    queued: [Bytes; 3],
    /// The call's total timeout (`proxy.timeout`), from before the send.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    sent: u64,
    /// What the end of the answer records; taken when it is recorded.
    end: Option<Completion>,
    /// The answer's outcome, set once known (the first one stands).
    outcome: Option<Outcome>,
    /// Moves when the person stop list changes: the call's person is then
    /// checked again, and a stopped person's answer is cut.
    stops: ListChanged,
}

impl std::fmt::Debug for GuardedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedBody")
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

/// What the completion of a streamed answer records, and the slots it
/// holds until then.
struct Completion {
    proxy: Arc<Proxy>,
    call: Call,
    status: u16,
    bytes_up: u64,
    started: Instant,
    /// The answer's span (streaming), a child of the call's.
    span: crate::infra::telemetry::Span,
    _slots: Slots,
}

impl GuardedBody {
    fn next_queued(&mut self) -> Option<Bytes> {
        self.queued
            .iter_mut()
            .find(|b| !b.is_empty())
            .map(std::mem::take)
    }

    /// Records the outcome (the first one wins) and releases the slots.
    fn finish(&mut self, outcome: Outcome) {
        self.outcome.get_or_insert(outcome);
        if let Some(mut c) = self.end.take() {
            let outcome = self.outcome.unwrap_or(outcome);
            c.proxy
                .completed(&c.call, c.status, outcome, c.bytes_up, self.sent, c.started);
            // The answer's span ends first, then the call's (dropped with
            // `c`).
            c.span.set("credbroker.bytes_down", self.sent);
            if outcome != Outcome::Completed {
                c.span.fail();
            }
            drop(std::mem::take(&mut c.span));
            c.call.span.set("http.response.status_code", c.status);
            c.call.span.set("credbroker.bytes_up", c.bytes_up);
            let reason = (outcome != Outcome::Completed).then_some(outcome.as_str());
            c.call.end_span(
                if reason.is_none() {
                    "completed"
                } else {
                    "aborted"
                },
                reason,
            );
            let m = &c.proxy.broker.metrics;
            // The call passed the checks, so its service and tool are
            // ones its policy declares: bounded labels.
            let tool = c.proxy.tool_label(&c.call.policy, &c.call.who.tool);
            m.proxy_requests
                .with_label_values(&[&c.call.service, tool, outcome.as_str()])
                .inc();
            m.proxy_latency
                .with_label_values(&[&c.call.service])
                .observe(c.started.elapsed().as_secs_f64());
        }
    }

    /// Takes the next upstream chunk through the guard.
    fn take(&mut self, chunk: Bytes) -> Result<(), Abort> {
        match self.guard.push(chunk) {
            Ok([a, b]) => {
                self.sent += (a.len() + b.len()) as u64;
                self.queued = [a, b, Bytes::new()];
                Ok(())
            }
            Err(Echo) => {
                self.finish(Outcome::EchoBlocked);
                Err(Abort::Echo)
            }
        }
    }

    /// The upstream answer is whole: the guard's tail goes out last.
    fn upstream_ended(&mut self) {
        let rest = std::mem::replace(&mut self.guard, EchoGuard::new(&[])).finish();
        self.sent += rest.len() as u64;
        self.queued[2] = rest;
        self.finish(Outcome::Completed);
    }
}

impl hyper::body::Body for GuardedBody {
    type Data = Bytes;
    type Error = Abort;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Abort>>> {
        use std::task::Poll;
        let this = &mut *self;
        // First, whatever the provider sends: a stop of the call's person
        // stored meanwhile (on any replica) cuts the answer.
        if this.outcome.is_none() {
            if let Poll::Ready(rx) = this.stops.as_mut().poll(cx) {
                this.stops = list_changed(rx);
                if let Some(c) = &this.end {
                    if c.proxy.person_check(&c.call.who).is_err() {
                        this.queued = Default::default();
                        this.finish(Outcome::PersonRevoked);
                        return Poll::Ready(Some(Err(Abort::PersonRevoked)));
                    }
                }
            }
        }
        loop {
            if let Some(b) = this.next_queued() {
                return Poll::Ready(Some(Ok(hyper::body::Frame::data(b))));
            }
            if this.outcome.is_some() {
                return Poll::Ready(None);
            }
            match std::pin::Pin::new(&mut this.upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are not passed on (none is on the allowlist).
                    if let Ok(data) = frame.into_data() {
                        this.take(data)?;
                    }
                    // A body of known length may not be polled to its end:
                    // the last chunk ends it.
                    if hyper::body::Body::is_end_stream(&this.upstream) {
                        this.upstream_ended();
                    }
                }
                Poll::Ready(None) => this.upstream_ended(),
                Poll::Ready(Some(Err(_))) => {
                    this.finish(Outcome::UpstreamFailed);
                    return Poll::Ready(Some(Err(Abort::Upstream)));
                }
                Poll::Pending => {
                    if std::future::Future::poll(this.deadline.as_mut(), cx).is_ready() {
                        this.finish(Outcome::UpstreamFailed);
                        return Poll::Ready(Some(Err(Abort::Upstream)));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.outcome.is_some() && self.queued.iter().all(Bytes::is_empty)
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        // Dropped before its end: the tool went away (or the connection
        // failed) mid-answer.
        self.finish(Outcome::ClientGone);
    }
}

impl Proxy {
    /// The answer's head, once its first chunk has passed the echo guard;
    /// the rest streams as the tool reads it ([`GuardedBody`]).
    pub(super) async fn answer(
        self: &Arc<Self>,
        call: Call,
        sent: Sent,
        started: Instant,
    ) -> Result<Response<ProxyBody>, (Call, Refusal)> {
        let Sent {
            resp,
            tokens,
            deadline,
            bytes_up,
            slots,
        } = sent;
        let status = resp.status();
        let span = call
            .span
            .child("proxy.answer", crate::infra::telemetry::Kind::Internal);
        let secrets: Vec<&str> = tokens
            .iter()
            .flat_map(|t| std::iter::once(&t.access_token).chain(&t.refresh_token))
            .map(|s| s.expose().as_str())
            .collect();
        let mut guard = EchoGuard::new(&secrets);
        let headers = match response_headers(resp.headers(), &guard) {
            Ok(h) => h,
            Err(Echo) => return Err((call, Refusal::Upstream(UpstreamFailure::Echo))),
        };
        // The status and headers go out only once the first chunk (or the
        // whole answer, when shorter) has been scanned.
        let mut upstream = resp.into_body();
        let stops = list_changed(self.broker.stops.subscribe());
        // Watched from here on; a stop stored since the last gate ends it.
        if let Err(r) = self.person_check(&call.who) {
            return Err((call, r));
        }
        let mut first_out = [Bytes::new(), Bytes::new(), Bytes::new()];
        let ended = loop {
            match tokio::time::timeout_at(deadline, upstream.frame()).await {
                Err(_) => return Err((call, Refusal::Timeout)),
                Ok(Some(Err(_))) => return Err((call, Refusal::Upstream(UpstreamFailure::Failed))),
                Ok(None) => break true,
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    match guard.push(data) {
                        Ok([a, b]) => first_out = [a, b, Bytes::new()],
                        Err(Echo) => return Err((call, Refusal::Upstream(UpstreamFailure::Echo))),
                    }
                    break hyper::body::Body::is_end_stream(&upstream);
                }
            }
        };
        // The rest is read as the tool reads it: the event and metrics at
        // its end need owned copies of the call.
        let mut answer = GuardedBody {
            upstream,
            guard,
            sent: first_out.iter().map(|b| b.len() as u64).sum(),
            queued: first_out,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            end: Some(Completion {
                proxy: self.clone(),
                call,
                status: status.as_u16(),
                bytes_up,
                started,
                span,
                _slots: slots,
            }),
            outcome: None,
            stops,
        };
        if ended {
            answer.upstream_ended();
        }
        let mut r = Response::new(Either::Right(answer));
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        Ok(r)
    }
}

/// The allowlisted headers of the provider's answer, none carrying a
/// provider token, and the proxy's own.
fn response_headers(upstream: &HeaderMap, guard: &EchoGuard) -> Result<HeaderMap, Echo> {
    let mut headers = HeaderMap::new();
    for name in RESPONSE_HEADERS {
        for v in upstream.get_all(*name) {
            if guard.contains(v.as_bytes()) {
                return Err(Echo);
            }
            headers.append(HeaderName::from_static(name), v.clone());
        }
    }
    // Served on the pages' origin: never script, never sniffed.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(headers)
}
