//! The egress proxy (docs/PROXY.md): a tool calls a connected service at
//! `{issuer}/proxy/{service}/...` with a credbroker token and a DPoP proof;
//! the broker checks the call against the current policy and forwards it to
//! the provider's `api_base` with the person's provider token, which never
//! leaves the broker.
//!
//! Each request goes through these checks in order, and the first failure
//! ends it with a JSON answer naming the reason (never a secret):
//! 1. the shape: no absolute-form target, no `CONNECT`, `TRACE` or
//!    `Upgrade`; the raw path under the service obeys
//!    `grammar::check_raw_path` (never decoded: the same bytes are matched,
//!    compared with the proof's `htu`, and sent upstream);
//! 2. the freeze;
//! 3. the token and its DPoP proof, with the verifier resource servers use
//!    ([`crate::verify`]), audience = the proxy address, `htu` = the
//!    configured issuer + the raw path (never `Host` or `X-Forwarded-*`);
//!    then the proof's `jti` in the store's replay tree (queued off the
//!    call where that is as safe, [`replays`]);
//! 4. no credential in the query;
//! 5. the route, the step and the resource in the *current* policy, and
//!    the route's variables bound to the token's approved details;
//! 6. the per-person-and-tool rate limit, the per-service concurrency cap,
//!    the request body cap;
//! 7. the account, the allowance and a live provider token (refreshed with
//!    the vault's single-flight refresh);
//! 8. a single-use token (an `each_call` approval's) is spent in the
//!    store's replay tree, so it serves one call on every replica;
//! 9. the `proxy.request` audit event: no event, no call.
//!
//! Then the call goes to `api_base` + path + query only (no proxy from the
//! environment, no redirect followed, an allowlist of request headers), and
//! the answer streams back through the echo guard ([`EchoGuard`]) with an
//! allowlist of response headers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use dashmap::DashMap;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::accounts::subject::Person;
use crate::base::grammar::check_raw_path;
use crate::base::http::{correlation_id, json_response, Body};
use crate::derive::exchange::{Broker, DeriveError};
use crate::derive::policy::{canonical_resource, proxy_path, Policy};
use crate::infra::events::{Event, ProxyCall, PROXY_COMPLETED, PROXY_REQUEST};
use crate::verify::{Presented, Verified, Verifier, VerifyError};

mod client;
mod replays;

/// The path prefix of proxied calls.
pub(crate) const PREFIX: &str = "/proxy/";

/// Request headers forwarded upstream, besides those a provider preset
/// names; the provider token and `Accept-Encoding: identity` are added.
const REQUEST_HEADERS: &[&str] = &["content-type", "accept", "user-agent"];
/// Request headers GitHub's API reads.
const GITHUB_REQUEST_HEADERS: &[&str] = &["x-github-api-version"];
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
    outcome: Option<&'static str>,
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
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl GuardedBody {
    fn next_queued(&mut self) -> Option<Bytes> {
        self.queued
            .iter_mut()
            .find(|b| !b.is_empty())
            .map(std::mem::take)
    }

    /// Records the outcome (the first one wins) and releases the slots.
    fn finish(&mut self, outcome: &'static str) {
        self.outcome.get_or_insert(outcome);
        if let Some(c) = self.end.take() {
            let outcome = self.outcome.unwrap_or(outcome);
            c.proxy
                .completed(&c.call, c.status, outcome, c.bytes_up, self.sent, c.started);
            let m = &c.proxy.broker.metrics;
            // The call passed the checks, so its service and tool are
            // ones its policy declares: bounded labels.
            let tool = c.proxy.tool_label(&c.call.policy, &c.call.who.tool);
            m.proxy_requests
                .with_label_values(&[&c.call.service, tool, outcome])
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
                self.finish("echo_blocked");
                Err(Abort::Echo)
            }
        }
    }

    /// The upstream answer is whole: the guard's tail goes out last.
    fn upstream_ended(&mut self) {
        let rest = std::mem::replace(&mut self.guard, EchoGuard::new(&[])).finish();
        self.sent += rest.len() as u64;
        self.queued[2] = rest;
        self.finish("completed");
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
                    this.finish("upstream_failed");
                    return Poll::Ready(Some(Err(Abort::Upstream)));
                }
                Poll::Pending => {
                    if std::future::Future::poll(this.deadline.as_mut(), cx).is_ready() {
                        this.finish("upstream_failed");
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
        self.finish("client_gone");
    }
}

/// Scans an answer for the provider's tokens across chunk boundaries: it
/// holds back the last (longest token - 1) bytes, so a token split between
/// two chunks is still seen whole before any of it is released.
///
/// Each chunk is scanned once (SIMD substring search) and copied once; only
/// the held-back tail and the few bytes across the boundary are scanned
/// again, so a large answer costs about one pass per token. A long chunk
/// is searched in blocks of [`SCAN_BLOCK`] bytes, every token in one block
/// before the next, so that only the first search reads a block from
/// memory farther than the L1 cache.
///
/// The SIMD searchers cost more to build than a short answer costs to
/// scan (about 70 000 instructions for two tokens, counted with
/// `proxy_bench --callgrind`: most of the guard's cost on a small call),
/// so they are built on the first scan of more than
/// [`SHORT_SCAN`] bytes; shorter scans compare at each place the token's
/// first byte occurs, at most `SHORT_SCAN` times the token's length.
pub(crate) struct EchoGuard {
    /// The provider's tokens: wiped when the guard goes, never printed.
    secrets: Vec<zeroize::Zeroizing<Vec<u8>>>,
    finders: std::cell::OnceCell<Vec<memchr::memmem::Finder<'static>>>,
    hold: usize,
    /// The held-back tail: at most `hold` bytes, already scanned.
    pending: Vec<u8>,
    /// Scratch for the seam between the tail and the next chunk.
    edge: Vec<u8>,
}

impl std::fmt::Debug for EchoGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoGuard")
            .field("secrets", &self.secrets.len())
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

/// The longest scan the echo guard makes without its SIMD searchers.
const SHORT_SCAN: usize = 1024;

/// The bytes of a long chunk that the echo guard searches for every token
/// before it moves on (plus the overlap): well inside a 48 KiB L1 cache.
const SCAN_BLOCK: usize = 16 * 1024;

/// Whether `needle` (not empty) occurs in the short `hay`: a comparison at
/// each place its first byte occurs.
fn short_find(hay: &[u8], needle: &[u8]) -> bool {
    let (Some(&first), Some(last)) = (needle.first(), hay.len().checked_sub(needle.len())) else {
        return false;
    };
    memchr::memchr_iter(first, &hay[..=last]).any(|i| hay[i..].starts_with(needle))
}

/// A provider token was found in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Echo;

impl EchoGuard {
    /// A guard for these secrets (empty ones are ignored).
    pub(crate) fn new(secrets: &[&str]) -> EchoGuard {
        let secrets: Vec<zeroize::Zeroizing<Vec<u8>>> = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| zeroize::Zeroizing::new(s.as_bytes().to_vec()))
            .collect();
        let hold = secrets.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        EchoGuard {
            secrets,
            finders: std::cell::OnceCell::new(),
            hold,
            pending: Vec::new(),
            edge: Vec::new(),
        }
    }

    /// Whether `bytes` holds one of the secrets.
    pub(crate) fn contains(&self, bytes: &[u8]) -> bool {
        if bytes.len() <= SHORT_SCAN {
            return self.secrets.iter().any(|s| short_find(bytes, s));
        }
        let finders = self.finders.get_or_init(|| {
            self.secrets
                .iter()
                .map(|s| memchr::memmem::Finder::new(&s[..]).into_owned())
                .collect()
        });
        // Block by block, every token's search on a block before the next
        // block: the second search reads the block from the L1 cache, not
        // the whole chunk (up to about 400 KiB, hyper's largest read) again
        // from L2. A block overlaps the next by `hold` bytes, so a token
        // that starts in a block (at most `hold + 1` long) ends in it.
        let mut start = 0;
        while start < bytes.len() {
            let block = &bytes[start..(start + SCAN_BLOCK + self.hold).min(bytes.len())];
            if finders.iter().any(|n| n.find(block).is_some()) {
                return true;
            }
            start += SCAN_BLOCK;
        }
        false
    }

    /// Takes the next chunk; returns what can be released, in order: the
    /// bulk of a long chunk is released as a slice of it, not copied.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Result<[Bytes; 2], Echo> {
        if chunk.len() <= self.hold {
            // A short chunk: join it to the tail and scan the (short) whole.
            self.pending.extend_from_slice(&chunk);
            if self.contains(&self.pending) {
                return Err(Echo);
            }
            let cut = self.pending.len().saturating_sub(self.hold);
            let out = Bytes::copy_from_slice(&self.pending[..cut]);
            self.pending.drain(..cut);
            return Ok([out, Bytes::new()]);
        }
        // A token in `pending ++ chunk` lies in `chunk`, or starts in the
        // tail (at most `hold` bytes, each token at most `hold + 1` long)
        // and so ends within the chunk's first `hold` bytes; one wholly in
        // the tail was refused when the tail was scanned.
        if self.contains(&chunk) {
            return Err(Echo);
        }
        let tail = Bytes::from(std::mem::take(&mut self.pending));
        if !tail.is_empty() {
            self.edge.clear();
            self.edge.extend_from_slice(&tail);
            self.edge.extend_from_slice(&chunk[..self.hold]);
            if self.contains(&self.edge) {
                return Err(Echo);
            }
        }
        let keep = chunk.len() - self.hold;
        self.pending.extend_from_slice(&chunk[keep..]);
        Ok([tail, chunk.slice(..keep)])
    }

    /// The end of the answer: the bytes held back.
    pub(crate) fn finish(self) -> Bytes {
        Bytes::from(self.pending)
    }
}

/// Every refusal of the proxy, mapped to HTTP once ([`Refusal::response`]).
#[derive(Debug)]
enum Refusal {
    /// 400 with a reason.
    BadRequest(&'static str, &'static str),
    /// 404: no such proxy address.
    NotFound,
    /// 401 with a DPoP challenge.
    Token(VerifyError),
    /// 401 `use_dpop_nonce` with a fresh nonce (`[dpop] require_nonce`).
    UseNonce(String),
    /// 403 with a reason (the policy).
    Forbidden(&'static str),
    /// 413: the body is over the cap.
    TooLarge(u64),
    /// 429.
    RateLimited(u64),
    /// 503 with a reason.
    Unavailable(&'static str, &'static str),
    /// 502 with a reason.
    BadGateway(&'static str, &'static str),
    /// 504.
    Timeout,
    /// 504: connecting to `api_base` took longer than `proxy.connect_timeout`.
    ConnectTimeout,
    /// A refusal of the service source (connect, allow, reconnect, ...).
    Derive(DeriveError),
}

impl Refusal {
    fn reason(&self) -> &'static str {
        match self {
            Refusal::BadRequest(r, _) => r,
            Refusal::NotFound => "not_a_proxy_address",
            Refusal::Token(VerifyError::Proof(_)) => "invalid_dpop_proof",
            Refusal::Token(VerifyError::AlreadyUsed) => "token_already_used",
            Refusal::Token(_) => "invalid_token",
            Refusal::UseNonce(_) => "use_dpop_nonce",
            Refusal::Forbidden(r) => r,
            Refusal::TooLarge(_) => "request_too_large",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::Unavailable(r, _) | Refusal::BadGateway(r, _) => r,
            Refusal::Timeout | Refusal::ConnectTimeout => "upstream_timeout",
            Refusal::Derive(e) => e.reason(),
        }
    }

    fn response(&self) -> Response<Body> {
        let reason = self.reason();
        let plain = |status, error: &str, description: String| {
            json_response(
                status,
                &serde_json::json!({
                    "error": error,
                    "reason": reason,
                    "error_description": description,
                }),
            )
        };
        match self {
            Refusal::BadRequest(_, d) => plain(StatusCode::BAD_REQUEST, "invalid_request", (*d).into()),
            Refusal::NotFound => plain(
                StatusCode::NOT_FOUND,
                "invalid_request",
                "no proxy address here: calls go to {issuer}/proxy/{service}/{path}".into(),
            ),
            Refusal::Token(e) => {
                let error = if matches!(e, VerifyError::Proof(_)) {
                    "invalid_dpop_proof"
                } else {
                    "invalid_token"
                };
                let mut r = plain(StatusCode::UNAUTHORIZED, error, e.to_string());
                if let Ok(v) = HeaderValue::from_str(&e.challenge()) {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
                }
                r
            }
            Refusal::UseNonce(nonce) => {
                let mut r = plain(
                    StatusCode::UNAUTHORIZED,
                    "use_dpop_nonce",
                    "a fresh DPoP nonce is required: sign a new proof with the DPoP-Nonce of this answer".into(),
                );
                let h = r.headers_mut();
                h.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("DPoP error=\"use_dpop_nonce\", algs=\"ES256\""),
                );
                if let Ok(v) = HeaderValue::from_str(nonce) {
                    h.insert("dpop-nonce", v);
                }
                r
            }
            Refusal::Forbidden("details_mismatch") => plain(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                "the path's variables are not the ones in the token's approved authorization_details".into(),
            ),
            Refusal::Forbidden(_) => plain(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                "the current policy does not allow this call for the token's tool and step".into(),
            ),
            Refusal::TooLarge(cap) => plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                format!("the request body is larger than the proxy's cap of {cap} bytes (proxy.max_request_body); nothing was sent"),
            ),
            Refusal::RateLimited(wait) => {
                let mut r = plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    "too many calls for this person and tool; retry later".into(),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(*wait));
                r
            }
            Refusal::Unavailable(_, d) => {
                let mut r = plain(StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable", (*d).into());
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            Refusal::BadGateway(_, d) => plain(StatusCode::BAD_GATEWAY, "bad_gateway", (*d).into()),
            Refusal::Timeout => plain(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the provider did not answer within the proxy's timeout (proxy.timeout)".into(),
            ),
            Refusal::ConnectTimeout => plain(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the provider's API could not be connected to within proxy.connect_timeout".into(),
            ),
            Refusal::Derive(DeriveError::LinkRequired(l)) => {
                json_response(StatusCode::BAD_REQUEST, &l.body())
            }
            Refusal::Derive(DeriveError::UpstreamUnavailable { .. }) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "the provider did not give a usable token in time; nothing was sent; retry later".into(),
            ),
            Refusal::Derive(e) => {
                let id = correlation_id();
                tracing::error!(correlation_id = %id, error = %e, "proxy: service source failed");
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporarily_unavailable",
                    format!("internal error; correlation id {id}"),
                )
            }
        }
    }
}

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
}

/// The verifier of one proxy address, with the address's canonical
/// resource (the policy's key for it).
#[derive(Debug)]
struct AddressVerifier {
    /// The minter's key ring the verifier's keys came from (its address).
    stamp: usize,
    verifier: Arc<Verifier>,
    resource: Arc<str>,
}

/// The proxy: shared by every connection of the public listener.
#[derive(Debug)]
pub(crate) struct Proxy {
    broker: Arc<Broker>,
    client: client::Upstream,
    /// One verifier per proxy address; its keys follow the minter's ring.
    verifiers: Mutex<HashMap<String, AddressVerifier>>,
    in_flight: Arc<Semaphore>,
    per_service: DashMap<String, Arc<Semaphore>>,
    /// Whether the configured issuer followed by a proxy path is already
    /// in the form [`crate::base::dpop::normalize_htu`] gives ([`issuer_is_normal`]):
    /// then each call's URL is compared with the proof's `htu` as built.
    issuer_is_normal: bool,
    /// When this proxy started, by the broker's clock: for
    /// [`REPLAY_WINDOW_SECS`] after it, each proof's replay entry is written
    /// and checked on its call ([`replays`]).
    started: i64,
    /// The replay entries queued for a store no other instance shares;
    /// `None` for a shared one (each entry is written on its call).
    replays: Option<Arc<replays::Batched>>,
}

/// How long a proof's replay entry is kept (seconds): either side of now
/// ([`crate::base::dpop::IAT_WINDOW`]), plus the verifier's skew.
const REPLAY_WINDOW_SECS: i64 = 2 * crate::base::dpop::IAT_WINDOW + 10;

/// The replay tree's key for a proof: its `jti` with the key it is bound to.
fn replay_key(jti: &str, jkt: &str) -> String {
    let mut key = Vec::with_capacity(jti.len() + 1 + jkt.len());
    key.extend_from_slice(jti.as_bytes());
    key.push(0);
    key.extend_from_slice(jkt.as_bytes());
    crate::base::jose::sha256_hex(&key)
}

/// Whether `issuer` followed by any proxy path that passed
/// [`check_raw_path`] is a fixed point of [`crate::base::dpop::normalize_htu`].
/// Such a path is `pchar`s and `/`, escapes in uppercase hex and no dot or
/// empty segments, none of which parsing changes; the issuer is what could
/// (an uppercase host, a default port, a dot segment), so it is tried
/// once with a path of that kind.
fn issuer_is_normal(issuer: &str) -> bool {
    let probe = format!("{issuer}{PREFIX}s/a");
    crate::base::dpop::normalize_htu(&probe).as_deref() == Some(probe.as_str())
}

impl Proxy {
    /// The proxy of `broker`, with its upstream client.
    pub(crate) fn new(broker: Arc<Broker>) -> Result<Proxy, rustls::Error> {
        let cfg = &broker.config.proxy;
        // Only api_base: never a proxy from HTTP(S)_PROXY, never where a
        // redirect points (a 3xx goes back to the tool as it is).
        let client = client::upstream(cfg.connect_timeout)?;
        let normal = issuer_is_normal(&broker.config.issuer);
        let replays = (!broker.store.is_shared())
            .then(|| {
                replays::Batched::start(
                    broker.store.clone(),
                    std::time::Duration::from_secs(REPLAY_WINDOW_SECS as u64),
                )
            })
            .flatten();
        Ok(Proxy {
            started: broker.clock.now(),
            replays,
            in_flight: Arc::new(Semaphore::new(cfg.max_in_flight as usize)),
            broker,
            client,
            verifiers: Mutex::new(HashMap::new()),
            per_service: DashMap::new(),
            issuer_is_normal: normal,
        })
    }

    /// The verifier of `service`'s proxy address, with the minter's current
    /// public keys, and the address's canonical resource (the policy's key
    /// for it). Kept by service name: the caller has checked the name is a
    /// configured provider's, so the map stays bounded by the config.
    fn verifier(&self, service: &str) -> Result<(Arc<Verifier>, Arc<str>), VerifyError> {
        let ring = self.broker.minter.ring();
        let stamp = Arc::as_ptr(&ring) as usize;
        let mut map = self
            .verifiers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(a) = map.get(service) {
            if a.stamp == stamp {
                return Ok((a.verifier.clone(), a.resource.clone()));
            }
        }
        let audience = format!("{}{}", self.broker.config.issuer, proxy_path(service));
        let audience = audience.as_str();
        let jwks = serde_json::to_vec(&ring.jwks(self.broker.clock.now()))
            .map_err(|_| VerifyError::Keys)?;
        let verifier = match map.get(service) {
            Some(a) => {
                a.verifier.set_jwks(&jwks)?;
                a.verifier.clone()
            }
            None => Arc::new(
                Verifier::from_jwks(&self.broker.config.issuer, audience, &jwks)?
                    .with_clock(self.broker.clock.clone()),
            ),
        };
        let resource: Arc<str> = canonical_resource(audience)
            .unwrap_or_else(|_| audience.to_string())
            .into();
        map.insert(
            service.to_string(),
            AddressVerifier {
                stamp,
                verifier: verifier.clone(),
                resource: resource.clone(),
            },
        );
        Ok((verifier, resource))
    }

    /// Checks the proof's nonce when nonces are required, then records the
    /// proof's `jti` (with the key it is bound to) in the store's replay
    /// tree for as long as the proof could be accepted; a second use
    /// anywhere is a replay. On a store no other instance shares, once this
    /// proxy has run for [`REPLAY_WINDOW_SECS`], the entry is queued and
    /// written within [`replays::INTERVAL`] instead (the module doc of
    /// [`replays`] says why that refuses every replay the store would). A
    /// store that cannot answer fails the call closed. `proof` is what the
    /// verifier read from the proof it checked (and recorded).
    fn first_use(&self, proof: crate::base::dpop::ValidProof, jkt: &str) -> Result<(), Refusal> {
        // The nonce rule of the socket (`[dpop] require_nonce`) holds here
        // too, with the proxy's own nonces: valid at every replica (the
        // replay check below is in the shared store), so a retry may reach
        // another replica than the challenge; the verifier resource
        // servers use knows no nonces.
        let now = self.broker.clock.now();
        if let Some(nonces) = &self.broker.proxy_nonces {
            if !proof.nonce.as_deref().is_some_and(|n| nonces.check(n, now)) {
                return Err(Refusal::UseNonce(nonces.issue(now)));
            }
        }
        let mut key = replay_key(&proof.jti, jkt);
        if now >= self.started.saturating_add(REPLAY_WINDOW_SECS) {
            if let Some(batched) = &self.replays {
                match batched.queue(key) {
                    Ok(()) => return Ok(()),
                    Err(back) => key = back,
                }
            }
        }
        let window = std::time::Duration::from_secs(REPLAY_WINDOW_SECS as u64);
        // Unsynced: on sled the entry reaches disk at the next flush (every
        // 500 ms, and at close), not before the call goes on. A flush per
        // call was half of the proxy's CPU per call; what a crash can lose is
        // said in docs/PROXY.md. PostgreSQL writes it durably either way.
        match self.broker.store.insert_expiring_unsynced(
            crate::infra::store::Tree::Replay,
            key.as_bytes(),
            b"1",
            window,
        ) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Refusal::Token(VerifyError::Proof(
                crate::base::dpop::DpopError::Replay,
            ))),
            Err(e) => {
                tracing::error!(error = %e, "the replay store failed; proxied call refused");
                Err(Refusal::Unavailable(
                    "replay_store_unavailable",
                    "the proof's replay check could not be made; retry later",
                ))
            }
        }
    }

    /// Writes the queued replay entries and closes the queue (a clean
    /// stop, after the drain): a call still running writes its own.
    pub(crate) fn close_replays(&self) {
        if let Some(b) = &self.replays {
            b.close();
        }
    }

    /// Records a single-use token's `jti` in the store's replay tree until
    /// the token expires: the first call wins, on every instance sharing
    /// the store; a second is refused with `token_already_used`. A store
    /// that cannot answer fails the call closed.
    fn spend(&self, who: &Verified) -> Result<(), Refusal> {
        let mut key = b"single_use\0".to_vec();
        key.extend_from_slice(who.jti.as_bytes());
        let key = crate::base::jose::sha256_hex(&key);
        let left = who.exp.saturating_sub(self.broker.clock.now()).max(0) + 10;
        let ttl = std::time::Duration::from_secs(u64::try_from(left).unwrap_or(10));
        match self.broker.store.insert_expiring(
            crate::infra::store::Tree::Replay,
            key.as_bytes(),
            b"1",
            ttl,
        ) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Refusal::Token(VerifyError::AlreadyUsed)),
            Err(e) => {
                tracing::error!(error = %e, "the replay store failed; single-use token not accepted");
                Err(Refusal::Unavailable(
                    "replay_store_unavailable",
                    "the token's single-use check could not be made; retry later",
                ))
            }
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
        let Ok(slot) = self.in_flight.clone().try_acquire_owned() else {
            return self.refused(
                None,
                "other",
                &Refusal::Unavailable(
                    "proxy_busy",
                    "too many proxied calls in flight; retry later",
                ),
            );
        };
        let (parts, body) = req.into_parts();
        let path = parts.uri.path();
        let service = path
            .strip_prefix(PREFIX)
            .map(|r| r.split('/').next().unwrap_or_default())
            .unwrap_or_default();
        let service_label = if self.broker.policy.load().services().contains(service) {
            service
        } else {
            "other"
        };
        match self.checks(&parts, path, service).await {
            Err((call, refusal)) => self.refused(call.as_ref(), service_label, &refusal),
            Ok(call) => match self.forward(call, &parts, body, slot, started).await {
                Ok(r) => r,
                Err((call, refusal)) => self.refused(Some(&call), service_label, &refusal),
            },
        }
    }

    /// Records a refusal (metrics; the event when the token was valid) and
    /// builds its answer.
    fn refused(&self, call: Option<&Call>, service: &str, r: &Refusal) -> Response<ProxyBody> {
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
        r.response().map(Either::Left)
    }

    fn tool_label<'p>(&self, policy: &'p Policy, tool: &str) -> &'p str {
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
        e.proxy = Some(ProxyCall {
            method: c.method.as_str(),
            route: c.route.as_deref(),
            path_sha256: &c.path_sha256,
            ..ProxyCall::default()
        });
        e
    }

    /// Checks 1 to 5 of the module doc; the call, once the token is valid.
    async fn checks(
        &self,
        parts: &http::request::Parts,
        path: &str,
        service: &str,
    ) -> Result<Call, (Option<Call>, Refusal)> {
        let b = &self.broker;
        let method = parts.method.as_str();
        if parts.method == Method::CONNECT || parts.method == Method::TRACE {
            return Err((
                None,
                Refusal::BadRequest("method_refused", "CONNECT and TRACE are never proxied"),
            ));
        }
        if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
            return Err((
                None,
                Refusal::BadRequest(
                    "absolute_form",
                    "an absolute-form request target is refused; send the path only",
                ),
            ));
        }
        let upgrade = parts.headers.contains_key(header::UPGRADE)
            || parts.headers.get_all(header::CONNECTION).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.to_ascii_lowercase().contains("upgrade"))
            });
        if upgrade {
            return Err((
                None,
                Refusal::BadRequest("upgrade_refused", "Upgrade is never proxied"),
            ));
        }
        let valid_service = !service.is_empty()
            && service
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
        // Only a configured provider has a proxy address: the set of
        // verifiers (one per address) stays bounded by the config, whatever
        // names requests carry. A service the policy no longer proxies is
        // still known here, so its callers get the policy's 403.
        let known = b
            .connected_services()
            .is_some_and(|c| c.providers.get(service).is_some());
        if !valid_service || !known {
            return Err((None, Refusal::NotFound));
        }
        let rest = &path[PREFIX.len() + service.len()..];
        if rest.is_empty() {
            return Err((None, Refusal::NotFound));
        }
        if let Err(e) = check_raw_path(rest) {
            return Err((None, Refusal::BadRequest("invalid_path", e.message())));
        }
        if b.is_frozen() {
            return Err((None, Refusal::Forbidden("frozen")));
        }

        // The token and its proof. The URL the proof must name is built
        // from the configured issuer and the raw path.
        let (verifier, resource) = self
            .verifier(service)
            .map_err(|e| (None, Refusal::Token(e)))?;
        let dpop: Vec<&str> = parts
            .headers
            .get_all("dpop")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let authorization = match parts
            .headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .collect::<Vec<_>>()[..]
        {
            [] => None,
            [one] => Some(
                one.to_str()
                    .map_err(|_| (None, Refusal::Token(VerifyError::WrongScheme)))?,
            ),
            _ => {
                return Err((
                    None,
                    Refusal::BadRequest("invalid_request", "one Authorization header only"),
                ))
            }
        };
        let url = format!("{}{path}", b.config.issuer);
        let (who, proof) = verifier
            .verify_unrecorded(
                &Presented {
                    method,
                    url: &url,
                    authorization,
                    dpop: &dpop,
                },
                // The service name is letters, digits, `-` and `_`, and the
                // rest of the path passed check_raw_path above.
                self.issuer_is_normal,
            )
            .map_err(|e| (None, Refusal::Token(e)))?;
        // The verifier's replay cache is this instance's; the store's is
        // every instance's (a replicated store): a proof is used once.
        self.first_use(proof, &who.jkt).map_err(|r| (None, r))?;
        let policy = b.policy.load_full();
        let mut call = Call {
            service: service.to_string(),
            method: parts.method.clone(),
            path_sha256: crate::base::jose::sha256_hex(path.as_bytes()),
            jti_sha256: crate::base::jose::sha256_hex(who.jti.as_bytes()),
            who,
            policy,
            resource,
            route: None,
        };

        // Credentials never travel in the query.
        if let Some(q) = parts.uri.query() {
            let token = authorization
                .and_then(|a| a.split_once(' '))
                .map(|(_, t)| t.trim())
                .unwrap_or_default();
            let carries = (!token.is_empty() && q.contains(token))
                || url::form_urlencoded::parse(q.as_bytes()).any(|(k, v)| {
                    k.eq_ignore_ascii_case("access_token") || (!token.is_empty() && v == token)
                });
            if carries {
                return Err((
                    Some(call),
                    Refusal::BadRequest("credentials_in_query", "a credential in the query is refused (send the token in Authorization only); nothing was sent"),
                ));
            }
        }

        // The current policy: a reload that removed the route stops it now.
        let step = call.who.step.clone().unwrap_or_default();
        match call
            .policy
            .proxy_route(&call.who.tool, &step, &call.resource, method, rest)
        {
            Ok(route) => {
                // Where the policy binds the route's variables to the
                // approved details, the path must be the approved one.
                let holds = route.details_hold(rest, call.who.authorization_details.as_ref());
                call.route = Some(route.text.clone());
                if !holds {
                    return Err((
                        Some(call),
                        Refusal::Forbidden(
                            crate::derive::policy::RouteDenial::DetailsMismatch.as_str(),
                        ),
                    ));
                }
            }
            Err(d) => return Err((Some(call), Refusal::Forbidden(d.as_str()))),
        }
        Ok(call)
    }

    /// Checks 6 to 9 of the module doc, then the upstream call and the
    /// answer.
    async fn forward<B>(
        self: &Arc<Self>,
        call: Call,
        parts: &http::request::Parts,
        body: B,
        slot: OwnedSemaphorePermit,
        started: Instant,
    ) -> Result<Response<ProxyBody>, (Call, Refusal)>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let b = &self.broker;
        let cfg = &b.config.proxy;
        let iss = call.who.subject_iss.clone().unwrap_or_default();
        if let Err(wait) = b
            .limits
            .check_person_tool(&iss, &call.who.sub, &call.who.tool)
        {
            b.metrics
                .rate_limited
                .with_label_values(&["person_tool"])
                .inc();
            return Err((call, Refusal::RateLimited(wait)));
        }
        // The map's key is owned: made once per service, not per call.
        let known = self.per_service.get(&call.service).map(|s| s.clone());
        let sem = known.unwrap_or_else(|| {
            self.per_service
                .entry(call.service.clone())
                .or_insert_with(|| {
                    Arc::new(Semaphore::new(cfg.max_concurrent_per_service as usize))
                })
                .clone()
        });
        let Ok(service_slot) = sem.try_acquire_owned() else {
            return Err((call, Refusal::Unavailable("service_busy", "too many calls to this service in flight (proxy.max_concurrent_per_service); retry later")));
        };
        // The whole body is read (capped) before anything goes upstream:
        // nothing is ever half-sent, and an idempotent call can be retried.
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > cfg.max_request_body) {
            return Err((call, Refusal::TooLarge(cfg.max_request_body)));
        }
        let cap = usize::try_from(cfg.max_request_body).unwrap_or(usize::MAX);
        let body = match tokio::time::timeout(cfg.timeout, Limited::new(body, cap).collect()).await
        {
            Ok(Ok(c)) => c.to_bytes(),
            Ok(Err(e))
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return Err((call, Refusal::TooLarge(cfg.max_request_body)))
            }
            Ok(Err(_)) => {
                return Err((
                    call,
                    Refusal::BadRequest("invalid_request", "the request body could not be read"),
                ))
            }
            Err(_) => return Err((call, Refusal::Timeout)),
        };

        let Some(conn) = b.connected_services() else {
            return Err((
                call,
                Refusal::Unavailable(
                    "temporarily_unavailable",
                    "connected services are not configured on this instance",
                ),
            ));
        };
        let Some(provider) = conn.providers.get(&call.service) else {
            return Err((
                call,
                Refusal::Unavailable(
                    "temporarily_unavailable",
                    "the policy names a service that has no provider in the config",
                ),
            ));
        };
        let Some(api_base) = provider.config().api_base.clone() else {
            return Err((
                call,
                Refusal::Unavailable(
                    "temporarily_unavailable",
                    "the service's provider has no api_base",
                ),
            ));
        };
        let preset_headers: &[&str] = if api_base == crate::infra::config::GITHUB_API {
            GITHUB_REQUEST_HEADERS
        } else {
            &[]
        };
        // Made before the provider's token is read and the call spent.
        let rest = &call_path(parts)[PREFIX.len() + call.service.len()..];
        let target = match parts.uri.query() {
            Some(q) => format!("{api_base}{rest}?{q}"),
            None => format!("{api_base}{rest}"),
        };
        // api_base is an origin, and the path and query passed the
        // listener's parse and the path grammar.
        let Ok(target) = http::Uri::try_from(target) else {
            return Err((
                call,
                Refusal::BadRequest(
                    "invalid_request",
                    "the request's path or query cannot be sent on",
                ),
            ));
        };
        let person = Person {
            iss: iss.clone(),
            sub: call.who.sub.clone(),
        };
        let scopes: Vec<String> = call
            .policy
            .tools
            .get(&call.who.tool)
            .map(|t| t.scopes.iter().cloned().collect())
            .unwrap_or_default();
        let now = b.clock.now();
        let mut token = match b
            .service_token(
                &call.policy.hash,
                &person,
                &call.service,
                &scopes,
                None,
                now,
            )
            .await
        {
            Ok(t) => t,
            Err(e) => return Err((call, Refusal::Derive(e))),
        };

        // A single-use token (an each_call approval's) is spent here, once
        // every check of the call passed: a refused call does not use it
        // up, and no second call (on any replica) gets past this point.
        if call.who.single_use {
            if let Err(r) = self.spend(&call.who) {
                return Err((call, r));
            }
        }

        // No event, no call.
        let e = self.event(&call, PROXY_REQUEST);
        if let Err(err) = b.audit.record(&e) {
            tracing::error!(error = %err, "audit write failed; proxied call not sent");
            return Err((
                call,
                Refusal::Unavailable(
                    "audit_unavailable",
                    "the audit log cannot be written, so nothing was sent; retry later",
                ),
            ));
        }

        let deadline = tokio::time::Instant::now() + cfg.timeout;
        let idempotent = matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
        );
        // The token a retry replaced: the echo guard looks for it too.
        let mut replaced: Option<crate::accounts::vault::ServiceToken> = None;
        let mut retried = false;
        let resp = loop {
            let scheme = if token.token_type.eq_ignore_ascii_case("bearer") {
                "Bearer"
            } else {
                token.token_type.as_str()
            };
            let Ok(mut authorization) =
                HeaderValue::try_from(format!("{scheme} {}", token.access_token.expose()))
            else {
                return Err((
                    call,
                    Refusal::BadGateway(
                        "upstream_unreachable",
                        "the provider's token cannot be sent in a header",
                    ),
                ));
            };
            authorization.set_sensitive(true);
            let mut req = Request::new(http_body_util::Full::new(body.clone()));
            *req.method_mut() = parts.method.clone();
            *req.uri_mut() = target.clone();
            let h = req.headers_mut();
            for name in REQUEST_HEADERS.iter().chain(preset_headers) {
                for v in parts.headers.get_all(*name) {
                    h.append(HeaderName::from_static(name), v.clone());
                }
            }
            h.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
            h.insert(header::AUTHORIZATION, authorization);
            // An empty GET or HEAD goes with no length; another method
            // with an empty body says `Content-Length: 0`, as clients do.
            if body.is_empty() && !matches!(parts.method, Method::GET | Method::HEAD) {
                h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
            }
            let sent = tokio::time::timeout_at(deadline, self.client.request(req)).await;
            let resp = match sent {
                Err(_) => return Err((call, Refusal::Timeout)),
                Ok(Err(e)) if client::is_connect_timeout(&e) => {
                    return Err((call, Refusal::ConnectTimeout))
                }
                Ok(Err(_)) => {
                    return Err((
                        call,
                        Refusal::BadGateway(
                            "upstream_unreachable",
                            "the provider's API could not be reached",
                        ),
                    ))
                }
                Ok(Ok(r)) => r,
            };
            if resp.status() != StatusCode::UNAUTHORIZED || !idempotent || retried {
                break resp;
            }
            // The provider refused the token: one refresh, one retry, for an
            // idempotent call whose body is all here. A grant that is gone
            // marks the account and answers reconnect_required.
            retried = true;
            let fresh = match b
                .service_token(
                    &call.policy.hash,
                    &person,
                    &call.service,
                    &scopes,
                    Some(token.access_token.expose()),
                    b.clock.now(),
                )
                .await
            {
                Ok(t) => t,
                Err(e) => return Err((call, Refusal::Derive(e))),
            };
            replaced = Some(std::mem::replace(&mut token, fresh));
        };

        let status = resp.status();
        let guard_secrets: Vec<&str> = std::iter::once(&token)
            .chain(&replaced)
            .flat_map(|t| std::iter::once(&t.access_token).chain(&t.refresh_token))
            .map(|s| s.expose().as_str())
            .collect();
        let mut guard = EchoGuard::new(&guard_secrets);
        let mut headers = HeaderMap::new();
        for name in RESPONSE_HEADERS {
            for v in resp.headers().get_all(*name) {
                if guard.contains(v.as_bytes()) {
                    return Err((
                        call,
                        Refusal::BadGateway(
                            "echo_blocked",
                            "the provider's answer carried a provider token; it was not passed on",
                        ),
                    ));
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

        // The status and headers go out only once the first chunk (or the
        // whole answer, when shorter) has been scanned.
        let mut upstream = resp.into_body();
        let mut first_out = [Bytes::new(), Bytes::new(), Bytes::new()];
        let ended = loop {
            match tokio::time::timeout_at(deadline, upstream.frame()).await {
                Err(_) => return Err((call, Refusal::Timeout)),
                Ok(Some(Err(_))) => {
                    return Err((
                        call,
                        Refusal::BadGateway("upstream_failed", "the provider's answer failed"),
                    ))
                }
                Ok(None) => break true,
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    match guard.push(data) {
                        Ok([a, b]) => first_out = [a, b, Bytes::new()],
                        Err(Echo) => {
                            return Err((
                                call,
                                Refusal::BadGateway(
                                    "echo_blocked",
                                    "the provider's answer carried a provider token; it was not passed on",
                                ),
                            ))
                        }
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
                bytes_up: body.len() as u64,
                started,
                _slots: (slot, service_slot),
            }),
            outcome: None,
        };
        if ended {
            answer.upstream_ended();
        }
        let mut r = Response::new(Either::Right(answer));
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        Ok(r)
    }

    fn completed(
        &self,
        c: &Call,
        status: u16,
        outcome: &str,
        up: u64,
        down: u64,
        started: Instant,
    ) {
        let mut e = self.event(c, PROXY_COMPLETED);
        e.outcome = Some(if outcome == "completed" {
            "completed"
        } else {
            "aborted"
        });
        e.reason = (outcome != "completed").then_some(outcome);
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

fn call_path(parts: &http::request::Parts) -> &str {
    parts.uri.path()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proof's `htu` is compared with the URL as the proxy builds it
    /// (issuer, then the raw path) when [`issuer_is_normal`] holds: that is
    /// sound only if parsing leaves every path that passes
    /// [`check_raw_path`] as it is. Tried on every byte and escape a path
    /// may hold, and on 20 000 pseudo-random paths built from them.
    #[test]
    fn a_checked_path_after_a_normal_issuer_is_already_normal() {
        let issuer = "https://broker.example.com";
        assert!(issuer_is_normal(issuer));
        let mut units: Vec<String> = (0..=255u8)
            .filter(|&b| crate::base::grammar::check_raw_path(&format!("/x{}x", b as char)).is_ok())
            .map(|b| (b as char).to_string())
            .collect();
        // Sanity: the pchar bytes (66 unreserved, 11 sub-delims, `:`, `@`)
        // and `/`.
        assert_eq!(units.len(), 80, "{units:?}");
        units.extend((0..=255u8).map(|b| format!("%{b:02X}")));
        units.retain(|u| crate::base::grammar::check_raw_path(&format!("/x{u}x")).is_ok());
        // Every escape but %00, %2E, %2F and %5C.
        assert_eq!(units.len(), 80 + 252, "{units:?}");
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut tried = 0;
        for i in 0..20_000 + units.len() {
            let mut path = String::from("/");
            if i < units.len() {
                path.push_str(&units[i]);
                path.push('x');
            } else {
                for _ in 0..1 + i % 12 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    path.push_str(&units[(x % units.len() as u64) as usize]);
                }
            }
            if crate::base::grammar::check_raw_path(&path).is_err() {
                continue;
            }
            let url = format!("{issuer}{PREFIX}svc_1-a{path}");
            assert_eq!(
                crate::base::dpop::normalize_htu(&url).as_deref(),
                Some(url.as_str()),
                "{path}"
            );
            tried += 1;
        }
        assert!(tried > 10_000, "{tried}");
        // Negative controls: paths the rules refuse do change when parsed,
        // and so do issuers that are not in normal form.
        for bad in ["/a/../b", "/a/%2e%2e/b", "/a b", "/a\\b", "/%c3%a9/./x"] {
            assert!(crate::base::grammar::check_raw_path(bad).is_err(), "{bad}");
            let url = format!("{issuer}{PREFIX}s{bad}");
            assert_ne!(
                crate::base::dpop::normalize_htu(&url).as_deref(),
                Some(url.as_str()),
                "{bad}"
            );
        }
        for issuer in [
            "https://Broker.example.com",
            "https://broker.example.com:443",
            "http://127.0.0.1:80",
            "https://broker.example.com/a/../b",
        ] {
            assert!(!issuer_is_normal(issuer), "{issuer}");
        }
        assert!(issuer_is_normal("http://127.0.0.1:8440"));
    }

    #[test]
    fn echo_guard_sees_a_token_split_across_chunks() {
        let mut g = EchoGuard::new(&["SECRET-TOKEN", "REFRESH"]);
        let a = g.push(Bytes::from_static(b"hello SECRE")).unwrap();
        // The held-back tail could start a token: it is not released.
        assert!(a.iter().all(Bytes::is_empty), "{a:?}");
        assert_eq!(g.push(Bytes::from_static(b"T-TOKEN and more")), Err(Echo));
        // Positive control: the same bytes without the token pass whole.
        let mut g = EchoGuard::new(&["SECRET-TOKEN"]);
        let mut out = Vec::new();
        for c in [&b"hello SECRE"[..], b"T-TOKEX and more", b"!"] {
            for b in g.push(Bytes::copy_from_slice(c)).unwrap() {
                out.extend_from_slice(&b);
            }
        }
        out.extend_from_slice(&g.finish());
        assert_eq!(out, b"hello SECRET-TOKEX and more!");
    }

    #[test]
    fn echo_guard_never_prints_its_secrets() {
        let mut g = EchoGuard::new(&["gho_SECRETTOKEN", "ghr_REFRESH"]);
        // Built both ways: the short scan, and the SIMD searchers.
        assert!(g.contains(b"...gho_SECRETTOKEN..."));
        assert!(g.contains(&[b"x".repeat(2000), b"ghr_REFRESH".to_vec()].concat()));
        let _ = g.push(Bytes::from_static(b"an answer"));
        // Only how many secrets it holds and how much it holds back, not
        // their bytes in any form (a derived Debug would list them).
        assert_eq!(format!("{g:?}"), "EchoGuard { secrets: 2, hold: 14, .. }");
    }

    /// Every split of an answer into chunks: the guard refuses exactly the
    /// answers that hold a token, and otherwise releases them unchanged.
    /// Short chunks and answers take the guard's short scan only.
    #[test]
    fn echo_guard_agrees_with_a_whole_answer_search_for_every_split() {
        agrees_with_a_whole_answer_search(40, 15, 3000, 0x9e37_79b9_7f4a_7c15);
    }

    /// The same with answers of up to 12 KiB in chunks of up to 3 KiB: scans
    /// on both sides of `SHORT_SCAN`, so the SIMD searchers take part.
    #[test]
    fn echo_guard_agrees_with_a_whole_answer_search_across_its_two_scans() {
        agrees_with_a_whole_answer_search(3000, 3000, 400, 0x2545_f491_4f6c_dd1d);
    }

    /// A token at every place around the blocks of a long scan, and the
    /// same scan without it: found exactly when it is there.
    #[test]
    fn echo_guard_finds_a_token_across_its_scan_blocks() {
        let secrets = ["tok-ABCDEFG", "rf-XYZ"];
        let g = EchoGuard::new(&secrets);
        let clean = vec![b'x'; 3 * SCAN_BLOCK + 100];
        assert!(!g.contains(&clean), "a scan without a token finds none");
        for secret in secrets {
            let s = secret.as_bytes();
            for seam in [SCAN_BLOCK, 2 * SCAN_BLOCK, 3 * SCAN_BLOCK] {
                for at in seam - s.len() - 2..=seam + 2 {
                    let mut hay = clean.clone();
                    hay[at..at + s.len()].copy_from_slice(s);
                    assert!(g.contains(&hay), "{secret} at {at} (seam {seam})");
                    // The token's last byte changed: no longer there.
                    hay[at + s.len() - 1] = b'x';
                    assert!(!g.contains(&hay), "{secret} cut at {at}");
                }
            }
        }
    }

    /// Answers of up to about 200 KiB in chunks of up to 80 KiB: chunks
    /// searched in several blocks.
    #[test]
    fn echo_guard_agrees_with_a_whole_answer_search_over_long_chunks() {
        agrees_with_a_whole_answer_search(50_000, 80_000, 40, 0x6a09_e667_f3bc_c908);
    }

    fn agrees_with_a_whole_answer_search(pieces: u64, chunk: u64, cases: usize, seed: u64) {
        let secrets = ["tok-ABCDEFG", "rf-XYZ"];
        let naive = |hay: &[u8]| {
            secrets
                .iter()
                .any(|s| hay.windows(s.len()).any(|w| w == s.as_bytes()))
        };
        // A small xorshift: the same cases on every run.
        let mut x: u64 = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"tok-ABCDEFGrf-XYZ ";
        let (mut found, mut clean) = (0, 0);
        let mut long_scans = 0;
        for _ in 0..cases {
            // Random bytes of the tokens' alphabet, with now and then a
            // token, or a token's beginning, planted whole.
            let mut answer: Vec<u8> = Vec::new();
            for _ in 0..(next() % pieces) {
                match next() % (30 * pieces / 40).max(30) {
                    0 => answer.extend_from_slice(secrets[(next() % 2) as usize].as_bytes()),
                    1 => {
                        let s = secrets[(next() % 2) as usize].as_bytes();
                        answer.extend_from_slice(&s[..(next() as usize % s.len())]);
                    }
                    _ => answer.push(alphabet[(next() % alphabet.len() as u64) as usize]),
                }
            }
            let mut g = EchoGuard::new(&secrets);
            let mut out = Vec::new();
            let mut refused = false;
            let mut rest = &answer[..];
            while !rest.is_empty() {
                let n = 1 + (next() % chunk) as usize;
                let (c, r) = rest.split_at(n.min(rest.len()));
                rest = r;
                match g.push(Bytes::copy_from_slice(c)) {
                    Ok(released) => {
                        for b in released {
                            out.extend_from_slice(&b);
                        }
                    }
                    Err(Echo) => {
                        refused = true;
                        break;
                    }
                }
            }
            long_scans += usize::from(g.finders.get().is_some());
            if !refused {
                out.extend_from_slice(&g.finish());
            }
            assert_eq!(
                refused,
                naive(&answer),
                "{:?}",
                String::from_utf8_lossy(&answer)
            );
            if refused {
                found += 1;
            } else {
                assert_eq!(out, answer, "released unchanged");
                clean += 1;
            }
        }
        // Both kinds of answer were drawn, and the SIMD searchers were
        // built exactly when chunks could be longer than the short scan.
        assert!(found > cases / 30 && clean > cases / 30, "{found} {clean}");
        assert_eq!(
            long_scans > cases / 4,
            chunk > SHORT_SCAN as u64,
            "{long_scans}"
        );
    }
}
