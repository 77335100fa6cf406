//! The admin socket (its own Unix socket, mode 0600, the broker's user only:
//! containers in a pod share TCP loopback, so loopback is no boundary).
//!
//! `GET /metrics`, `GET /readyz`, `GET /status`, `POST /freeze` (`on` or
//! `off` in the body), `POST /keys/rotate` (body empty, or `emergency`), `POST
//! /client-keys/rotate` (the same, for the client key), `POST /users` (a local account
//! for the pages: `{"name", "password", "replace"}`), `GET /users`, `POST
//! /users/remove` (`{"name"}`: the account and its page sessions), `POST /vault/rotate`
//! (optional body: the most records to re-wrap in this call), `GET /accounts`
//! (optional query `person_iss`, `person_sub`), `POST /accounts/disconnect`
//! (JSON `person_iss`, `person_sub`, `service`, optional `force`), `POST
//! /persons/revoke` (JSON `person_iss`, `person_sub`, optional `reason`,
//! `revoke_at_providers`), `POST /persons/restore` (JSON `person_iss`,
//! `person_sub`), `GET /persons` (the stopped persons), `GET /events` (the
//! live event stream, [`crate::edge::events`]), `POST /events/redeliver`
//! (optional JSON `{"subscription"}`: the webhook dead letters sent again),
//! `POST /upstreams/check-client-auth` (`{"upstream"}`: `upstream check`'s
//! client authentication test, run here with the client key in memory).
//!
//! The socket is built from narrow [`Handles`] (the way linkerd2-proxy's
//! admin server is), never from the instance itself; each command is one
//! call into [`crate::derive::ops`], which the command line also calls when no
//! instance runs. Every error becomes its answer in [`error_response`], in
//! one JSON shape: `{"error": code, "error_description": sentence}`
//! ([`crate::edge::answer::Answer`], the shape the socket and the proxy
//! answer in too).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::base::http::{json_response, Body};
use crate::derive::exchange::Broker;
use crate::derive::ops::{OpError, Recorder, Target};

/// What the admin socket works with, handed over by the composition root.
#[derive(Debug, Clone)]
pub struct Handles {
    /// The broker: freeze, keys, status, metrics, the audit sink.
    pub broker: Arc<Broker>,
    /// The sealer of the signing keys at rest (for key rotation).
    pub sealer: Arc<crate::infra::seal::Sealer>,
    /// Connected accounts and allowances.
    pub vault: Arc<crate::accounts::vault::Vault>,
    /// Third-party providers (to revoke at on disconnect).
    pub providers: Arc<crate::accounts::upstream::Providers>,
    /// The public listener's bound address, once bound (for status).
    pub public_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    /// Event delivery: webhook status, redelivery, the event stream.
    pub(crate) events: Arc<crate::infra::webhooks::Hub>,
    /// Event streams open now (under `admin.event_stream_max_connections`).
    pub streams: Arc<std::sync::atomic::AtomicUsize>,
    /// Changes when the instance stops (event streams end then).
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// An admin answer's body: a whole answer, or an event stream.
pub(crate) type AdminBody = http_body_util::Either<Body, crate::edge::events::EventBody>;

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    /// No such route.
    #[error("no such admin route")]
    NotFound,
    /// The body is too large, unreadable or not what the route takes.
    #[error("{0}")]
    BadBody(&'static str),
    /// No `[upstreams.<name>]` of that name in this instance's config.
    #[error("this instance has no [upstreams.{0}] table")]
    NoSuchUpstream(String),
    /// The instance's upstream is not the one the caller asked about.
    #[error("this instance's [upstreams.{0}] differs from the caller's in {1}: nothing was sent; restart it with that file, or check the file it runs with")]
    UpstreamDiffers(String, String),
    /// Every event-stream slot is taken.
    #[error("every event stream slot is taken (admin.event_stream_max_connections); close a stream or raise the cap")]
    StreamsFull,
    /// No webhook subscription of that name.
    #[error(transparent)]
    Redeliver(#[from] crate::infra::webhooks::RedeliverError),
    /// The action failed.
    #[error(transparent)]
    Op(#[from] OpError),
}

/// Maps every admin error to its answer, in one place.
pub(crate) fn error_response(err: &AdminError) -> Response<Body> {
    use crate::accounts::users::UserError;
    let (status, code) = match err {
        AdminError::NotFound | AdminError::NoSuchUpstream(_) => {
            (StatusCode::NOT_FOUND, "not_found")
        }
        AdminError::BadBody(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        AdminError::StreamsFull => (StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable"),
        AdminError::Redeliver(crate::infra::webhooks::RedeliverError::NoSuchSubscription) => {
            (StatusCode::NOT_FOUND, "not_found")
        }
        AdminError::Redeliver(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        AdminError::Op(OpError::User(UserError::Exists(_))) | AdminError::UpstreamDiffers(..) => {
            (StatusCode::CONFLICT, "conflict")
        }
        AdminError::Op(OpError::User(UserError::BadName | UserError::BadPassword)) => {
            (StatusCode::BAD_REQUEST, "invalid_request")
        }
        // The socket is the operator's own: the sentence names the cause.
        AdminError::Op(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
    };
    crate::edge::answer::Answer::new(status, code, err.to_string()).response()
}

/// The Prometheus text exposition, with the gauges that are computed when
/// read (replay cache entries, readiness) brought up to date first: the
/// admin socket's `/metrics`, and the metrics listener's
/// ([`crate::edge::metrics`]).
pub(crate) fn exposition(b: &Broker) -> Response<Body> {
    b.metrics
        .replay_cache_entries
        .set(b.proofs.replay_cache().len() as i64);
    b.metrics.upstream_token_cache_entries.set(
        b.upstreams()
            .map_or(0, |u| u.reuse().live(b.clock.now()) as i64),
    );
    let ready = readiness(b)["ready"] == true;
    b.metrics.ready.set(i64::from(ready));
    plain(
        StatusCode::OK,
        b.metrics.render(),
        "text/plain; version=0.0.4",
    )
}

fn plain(status: StatusCode, body: String, ctype: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Reads a body of at most `cap` bytes (the admin commands' arguments).
async fn capped_body(req: Request<hyper::body::Incoming>, cap: usize) -> Result<Bytes, AdminError> {
    let (parts, body) = req.into_parts();
    crate::base::http::read_capped(&parts.headers, body, cap)
        .await
        .map_err(|_| AdminError::BadBody("the body is unreadable or too large"))
}

/// Readiness: store answers, keys loaded, policy loaded, and the audit log
/// writable (no event, no token: a broker that cannot audit refuses every
/// derive). The audit check is the last write's outcome; after a failure it
/// tries again by recording `audit.recovered` (see [`crate::infra::events::Audit::probe`]).
pub(crate) fn readiness(b: &Broker) -> serde_json::Value {
    let store = b.store.is_healthy();
    let keys = !b.minter.ring().active.kid.is_empty();
    let policy = !b.policy.load().hash.is_empty();
    let audit = b.audit.probe(b.clock.now(), &b.config.agent);
    // A shared store that does not answer is down for every replica at
    // once: were it part of readiness, every pod would leave the Service
    // together and nothing would be served, not even `self` derives, which
    // need no store (keys and policy are in memory). Those requests that
    // need it fail closed with 503 on their own; readiness reports it.
    let store_ready = store || b.store.is_shared();
    serde_json::json!({
        "ready": store_ready && keys && policy && audit,
        "store": store,
        "keys": keys,
        "policy": policy,
        "audit": audit,
    })
}

/// The answer to a key rotation (admin socket and offline CLI alike).
pub(crate) fn rotation_json(r: &crate::derive::mint::Rotation, running: bool) -> serde_json::Value {
    serde_json::json!({
        "kid": r.kid,
        "added": r.added,
        "emergency": r.emergency,
        "activates_at": r.activates_at,
        "active_kid": r.ring.active.kid,
        "withdrawn": r.withdrawn,
        "running": running,
    })
}

/// Status for `credbroker status`.
pub(crate) fn status(h: &Handles) -> serde_json::Value {
    let b = &h.broker;
    let p = b.policy.load();
    serde_json::json!({
        "agent": b.config.agent,
        "issuer": b.config.issuer,
        "frozen": b.is_frozen(),
        "policy_hash": p.hash,
        "policy_tools": p.tools.len(),
        "active_kid": b.minter.ring().active.kid,
        "published_keys": b.minter.ring().published.len(),
        "published_kids": b.minter.ring().published_kids(b.clock.now()),
        "next_kid": b.minter.ring().next.as_ref().map(|p| p.kid.clone()),
        "next_activates_at": b.minter.ring().next.as_ref().map(|p| p.activates_at),
        "replay_cache_entries": b.proofs.replay_cache().len(),
        "subject_cache_entries": b.subjects.cache_len(),
        "ready": readiness(b)["ready"],
        "public_addr": h.public_addr.get().map(|a| a.to_string()),
        "clock": clock_status(b),
        "revocation_watch": revocation_watch(b),
        "webhooks": h.events.status(),
    })
}

/// The person stop list's watch, as `/status` shows it: whether it was
/// read within its bound, and what this instance does when not.
pub(crate) fn revocation_watch(b: &Broker) -> serde_json::Value {
    let up = b.stops.watch_up();
    b.metrics.revocation_watch_up.set(i64::from(up));
    serde_json::json!({
        "up": up,
        "last_read_seconds_ago": b.stops.since_sync().map(|d| d.as_secs_f64()),
        "bound_seconds": b.stops.config().watch_bound.as_secs_f64(),
        "on_failure": match b.stops.config().watch_failure {
            crate::infra::config::WatchFailure::Refuse => "refuse",
            crate::infra::config::WatchFailure::Serve => "serve",
        },
        "persons_revoked": b.stops.len(),
    })
}

/// The clock's offset from the database's, as `/status` shows it: `null`
/// offset while none is known (sled, or the database away).
fn clock_status(b: &crate::derive::exchange::Broker) -> serde_json::Value {
    let secs = |ms: i64| ms as f64 / 1000.0;
    serde_json::json!({
        "offset_seconds": b.skew.offset_ms().map(secs),
        "checked_at": b.skew.checked_ms().map(|ms| ms.div_euclid(1000)),
        "standing": b.skew.standing().as_str(),
        "max_skew_seconds": b.config.clock.max_skew.as_secs_f64(),
        "warn_skew_seconds": b.config.clock.warn_skew.as_secs_f64(),
    })
}

/// The body of `POST /accounts/disconnect`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DisconnectRequest {
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject.
    pub person_sub: String,
    /// The service.
    pub service: String,
    /// Delete even if revocation at the provider failed.
    #[serde(default)]
    pub force: bool,
}

fn person_from_query(query: Option<&str>) -> Option<crate::accounts::subject::Person> {
    let mut iss = None;
    let mut sub = None;
    for (k, v) in form_urlencoded::parse(query?.as_bytes()) {
        match k.as_ref() {
            "person_iss" => iss = Some(v.into_owned()),
            "person_sub" => sub = Some(v.into_owned()),
            _ => {}
        }
    }
    Some(crate::accounts::subject::Person {
        iss: iss?,
        sub: sub?,
    })
}

/// Handles one admin request.
pub(crate) async fn handle(h: Handles, req: Request<hyper::body::Incoming>) -> Response<AdminBody> {
    use http_body_util::Either;
    if req.method() == Method::GET && req.uri().path() == "/events" {
        let last = req
            .headers()
            .get("last-event-id")
            .and_then(|v| v.to_str().ok());
        return match crate::edge::events::stream(
            &h.events,
            &h.streams,
            h.broker.config.event_streams,
            last,
            h.stop.clone(),
        ) {
            Some(r) => r.map(Either::Right),
            None => error_response(&AdminError::StreamsFull).map(Either::Left),
        };
    }
    match route(&h, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
    .map(Either::Left)
}

/// `POST /events/redeliver`: optional `{"subscription"}`; answers how many
/// dead letters are being sent again.
async fn redeliver(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Redeliver {
        #[serde(default)]
        subscription: Option<String>,
    }
    let body = capped_body(req, 1024).await?;
    let r = if body.trim_ascii().is_empty() {
        Redeliver::default()
    } else {
        serde_json::from_slice::<Redeliver>(&body)
            .map_err(|_| AdminError::BadBody("expected nothing or {\"subscription\"}"))?
    };
    let hub = h.events.clone();
    let name = r.subscription.clone();
    let n = tokio::task::spawn_blocking(move || hub.redeliver(name.as_deref()))
        .await
        .map_err(|_| OpError::Task("redeliver"))??;
    Ok(ok(serde_json::json!({
        "subscription": r.subscription,
        "dead_letters": n,
    })))
}

/// The route table: one named step per command.
async fn route(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/metrics") => Ok(exposition(&h.broker)),
        (Method::GET, "/readyz") => Ok(readyz(&h.broker)),
        (Method::GET, "/status") => Ok(ok(status(h))),
        (Method::POST, "/freeze") => freeze(h, req).await,
        (Method::POST, "/keys/rotate") => rotate_keys(h, req).await,
        (Method::POST, "/client-keys/rotate") => rotate_client_keys(h, req).await,
        (Method::POST, "/vault/rotate") => rotate_vault(h, req).await,
        (Method::GET, "/accounts") => list_accounts(h, &req),
        (Method::POST, "/accounts/disconnect") => disconnect(h, req).await,
        (Method::POST, "/persons/revoke") => revoke_person(h, req).await,
        (Method::POST, "/persons/restore") => restore_person(h, req).await,
        (Method::GET, "/persons") => list_persons(h),
        (Method::POST, "/users") => add_user(h, req).await,
        (Method::GET, "/users") => list_users(h),
        (Method::POST, "/users/remove") => remove_user(h, req).await,
        (Method::POST, "/ssf/stream") => save_stream(h, req).await,
        (Method::GET, "/ssf/stream") => load_stream(h, &req),
        (Method::POST, "/events/redeliver") => redeliver(h, req).await,
        (Method::POST, "/upstreams/check-client-auth") => check_client_auth(h, req).await,
        _ => Err(AdminError::NotFound),
    }
}

/// A command's answer: 200 with its JSON.
fn ok(v: serde_json::Value) -> Response<Body> {
    json_response(StatusCode::OK, &v)
}

/// `GET /readyz`: [`readiness`], 503 when not ready.
fn readyz(b: &Broker) -> Response<Body> {
    let r = readiness(b);
    let code = if r["ready"] == true {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(code, &r)
}

/// `POST /freeze`: `on` or `off` in the body.
async fn freeze(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let b = &h.broker;
    let on = match capped_body(req, 64).await?.as_ref() {
        b"on" => true,
        b"off" => false,
        _ => return Err(AdminError::BadBody("the body must be on or off")),
    };
    let frozen = crate::derive::ops::freeze(Target::Running(b), None, Recorder::of(b), on)?;
    Ok(ok(serde_json::json!({"frozen": frozen})))
}

/// `POST /keys/rotate`: the body empty, or `emergency`.
async fn rotate_keys(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let b = &h.broker;
    let emergency = match capped_body(req, 64).await?.trim_ascii() {
        b"" => false,
        b"emergency" => true,
        _ => return Err(AdminError::BadBody("the body must be empty or emergency")),
    };
    let kind = crate::derive::mint::RotationKind::new(emergency, b.config.key_activation_delay);
    let r = crate::derive::ops::rotate_keys(Target::Running(b), &h.sealer, Recorder::of(b), kind)?;
    Ok(ok(rotation_json(&r, true)))
}

/// `POST /client-keys/rotate`: the body empty, or `emergency`.
async fn rotate_client_keys(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let b = &h.broker;
    let emergency = match capped_body(req, 64).await?.trim_ascii() {
        b"" => false,
        b"emergency" => true,
        _ => return Err(AdminError::BadBody("the body must be empty or emergency")),
    };
    let kind = crate::derive::mint::RotationKind::new(emergency, b.config.key_activation_delay);
    let r = crate::derive::ops::rotate_client_keys(
        Target::Running(b),
        &h.sealer,
        Recorder::of(b),
        kind,
    )?;
    Ok(ok(rotation_json(&r, true)))
}

/// `POST /vault/rotate`: the body empty, or the most records to re-wrap.
async fn rotate_vault(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let body = capped_body(req, 64).await?;
    let limit =
        match std::str::from_utf8(&body).map(str::trim) {
            Ok("") => None,
            Ok(n) => Some(n.parse::<usize>().map_err(|_| {
                AdminError::BadBody("the body must be empty or a number of records")
            })?),
            Err(_) => {
                return Err(AdminError::BadBody(
                    "the body must be empty or a number of records",
                ))
            }
        };
    let (vault, b) = (h.vault.clone(), h.broker.clone());
    // Re-wrapping does store I/O; keep it off the async workers.
    let report = tokio::task::spawn_blocking(move || {
        crate::derive::ops::rotate_vault(&vault, limit, Recorder::of(&b))
    })
    .await
    .map_err(|_| OpError::Task("vault rotation"))??;
    Ok(ok(serde_json::json!(report)))
}

/// `GET /accounts`: optional query `person_iss`, `person_sub`.
fn list_accounts(
    h: &Handles,
    req: &Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let person = person_from_query(req.uri().query());
    Ok(ok(crate::derive::ops::list_accounts(
        &h.vault,
        person.as_ref(),
    )?))
}

/// `POST /accounts/disconnect`: a [`DisconnectRequest`].
async fn disconnect(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let body = capped_body(req, 16 * 1024).await?;
    let d = serde_json::from_slice::<DisconnectRequest>(&body).map_err(|_| {
        AdminError::BadBody(
            "the body must be JSON with person_iss, person_sub, service and optional force",
        )
    })?;
    let person = crate::accounts::subject::Person {
        iss: d.person_iss,
        sub: d.person_sub,
    };
    let report = crate::derive::ops::disconnect(
        &h.vault,
        &h.providers,
        &person,
        &d.service,
        d.force,
        Recorder::of(&h.broker),
    )
    .await?;
    Ok(ok(serde_json::json!(report)))
}

/// The body of `POST /persons/revoke` and `POST /persons/restore`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PersonRequest {
    /// The person's issuer.
    pub person_iss: String,
    /// The person's subject.
    pub person_sub: String,
    /// Why (revoke only; default `manual`).
    #[serde(default)]
    pub reason: Option<String>,
    /// Revoke the person's accounts at their providers too (revoke only).
    #[serde(default)]
    pub revoke_at_providers: bool,
}

fn person_request(body: &[u8]) -> Result<PersonRequest, AdminError> {
    let r = serde_json::from_slice::<PersonRequest>(body).map_err(|_| {
        AdminError::BadBody(
            "the body must be JSON with person_iss, person_sub, and optional reason and revoke_at_providers",
        )
    })?;
    if r.person_iss.is_empty()
        || r.person_sub.is_empty()
        || r.reason.as_ref().is_some_and(|x| x.len() > 200)
    {
        return Err(AdminError::BadBody(
            "person_iss and person_sub must not be empty, and reason is at most 200 bytes",
        ));
    }
    Ok(r)
}

/// `POST /persons/revoke`: a [`PersonRequest`].
async fn revoke_person(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let r = person_request(&capped_body(req, 16 * 1024).await?)?;
    let b = &h.broker;
    let person = crate::accounts::subject::Person {
        iss: r.person_iss,
        sub: r.person_sub,
    };
    let stop = crate::derive::persons::StopRequest::manual(person, r.reason, r.revoke_at_providers);
    let done = crate::derive::ops::revoke_person(Target::Running(b), Recorder::of(b), stop).await?;
    let mut v = serde_json::json!(done);
    if done.stop.revoke_at_providers {
        let person = done.stop.person();
        let accounts =
            crate::derive::ops::revoke_person_at_providers(b, Recorder::of(b), &person).await?;
        v["providers"] = serde_json::json!(accounts);
    }
    Ok(ok(v))
}

/// `POST /persons/restore`: a [`PersonRequest`] (no reason).
async fn restore_person(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let r = person_request(&capped_body(req, 16 * 1024).await?)?;
    let person = crate::accounts::subject::Person {
        iss: r.person_iss,
        sub: r.person_sub,
    };
    let b = &h.broker;
    let lifted = crate::derive::ops::restore_person(Target::Running(b), Recorder::of(b), &person)?;
    Ok(ok(
        serde_json::json!({"restored": lifted.is_some(), "stop": lifted}),
    ))
}

/// `GET /persons`: the stopped persons.
fn list_persons(h: &Handles) -> Result<Response<Body>, AdminError> {
    let stops = crate::derive::ops::list_persons(Target::Running(&h.broker))?;
    Ok(ok(serde_json::json!({"persons": stops})))
}
/// `POST /ssf/stream`: `{"transmitter", "stream"}`, the stream `credbroker
/// ssf stream create` made, kept in the store.
async fn save_stream(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Save {
        transmitter: String,
        stream: crate::derive::ssf::stream::StreamRecord,
    }
    let body = capped_body(req, 8192).await?;
    let s = serde_json::from_slice::<Save>(&body)
        .map_err(|_| AdminError::BadBody("expected {\"transmitter\", \"stream\"}"))?;
    if !h.broker.config.ssf.contains_key(&s.transmitter) {
        return Err(AdminError::BadBody(
            "no such ssf.transmitters entry in the config",
        ));
    }
    crate::derive::ssf::stream::save(h.broker.store.as_ref(), &s.transmitter, &s.stream)
        .map_err(|e| AdminError::Op(OpError::Store(e)))?;
    Ok(ok(
        serde_json::json!({"transmitter": s.transmitter, "stream": s.stream, "running": true}),
    ))
}

/// `POST /upstreams/check-client-auth`: `{"upstream", "issuer",
/// "client_id", "client_auth", "token_endpoint"}` (the caller's config of
/// it); this instance runs `upstream check`'s `client_auth` test for it (one
/// token request the AS must refuse,
/// [`crate::derive::upstreams::Upstreams::check_client_auth`]) with its
/// client key, so the key never leaves it. When its own upstream differs
/// from the caller's, nothing is sent (409): the test would be of another
/// client. The answer names what it was run for and its outcome, never an
/// assertion or a secret.
async fn check_client_auth(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Check {
        upstream: String,
        issuer: String,
        client_id: String,
        client_auth: String,
        token_endpoint: Option<String>,
    }
    let body = capped_body(req, 8192).await?;
    let c = serde_json::from_slice::<Check>(&body).map_err(|_| {
        AdminError::BadBody(
            "expected {\"upstream\", \"issuer\", \"client_id\", \"client_auth\", \"token_endpoint\"}",
        )
    })?;
    let b = &h.broker;
    let no_such = || AdminError::NoSuchUpstream(c.upstream.clone());
    let ups = b.upstreams().ok_or_else(no_such)?;
    let (issuer, client_id, method) = ups.client_of(&c.upstream).ok_or_else(no_such)?;
    let ours = ups.resolved_token_endpoint(&c.upstream).await;
    let differs: Vec<&str> = [
        ("issuer", issuer == c.issuer),
        ("client_id", client_id == c.client_id),
        ("client_auth", method == c.client_auth),
        (
            "token_endpoint",
            c.token_endpoint.is_none() || ours.is_none() || c.token_endpoint == ours,
        ),
    ]
    .into_iter()
    .filter_map(|(what, same)| (!same).then_some(what))
    .collect();
    if !differs.is_empty() {
        return Err(AdminError::UpstreamDiffers(
            c.upstream.clone(),
            differs.join(", "),
        ));
    }
    let r = ups
        .check_client_auth(&c.upstream, b.clock.now())
        .await
        .ok_or_else(no_such)?;
    let outcome = match r.line.outcome {
        crate::derive::upstreams::Outcome::Ok => "ok",
        crate::derive::upstreams::Outcome::Fail => "fail",
        crate::derive::upstreams::Outcome::Skip => "skip",
    };
    tracing::info!(upstream = %c.upstream, outcome, "upstream client authentication checked (admin socket)");
    Ok(ok(serde_json::json!({
        "upstream": c.upstream,
        "issuer": r.issuer,
        "client_id": r.client_id,
        "client_auth": r.client_auth,
        "token_endpoint": r.token_endpoint,
        "outcome": outcome,
        "detail": r.line.detail,
        "running": true,
    })))
}

/// `GET /ssf/stream?transmitter=NAME`: the stream kept for it.
fn load_stream(
    h: &Handles,
    req: &Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    let name = form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "transmitter")
        .map(|(_, v)| v.into_owned())
        .ok_or(AdminError::BadBody("expected ?transmitter=NAME"))?;
    let stream = crate::derive::ssf::stream::load(h.broker.store.as_ref(), &name)
        .map_err(|e| AdminError::Op(OpError::Store(e)))?;
    Ok(ok(
        serde_json::json!({"transmitter": name, "stream": stream, "running": true}),
    ))
}

/// `GET /users`: the local accounts.
fn list_users(h: &Handles) -> Result<Response<Body>, AdminError> {
    let b = &h.broker;
    let mut v = crate::derive::ops::list_users(b.store.as_ref(), &h.sealer, b.clock.now())?;
    v["running"] = true.into();
    Ok(ok(v))
}

/// `POST /users/remove`: `{"name"}`, the account and its page sessions.
async fn remove_user(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RemoveUser {
        name: String,
    }
    let b = &h.broker;
    let body = capped_body(req, 4096).await?;
    let r = serde_json::from_slice::<RemoveUser>(&body)
        .map_err(|_| AdminError::BadBody("expected {\"name\"}"))?;
    let removed = crate::derive::ops::remove_user(
        b.store.as_ref(),
        &r.name,
        crate::edge::pages::session::end_local_sessions,
        Recorder::of(b),
    )?;
    let mut v = serde_json::json!(removed);
    v["user"] = r.name.into();
    v["running"] = true.into();
    Ok(ok(v))
}

/// `POST /users`: adds a local account while the instance holds the store.
async fn add_user(
    h: &Handles,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, AdminError> {
    #[derive(serde::Deserialize)]
    struct AddUser {
        name: String,
        password: String,
        #[serde(default)]
        replace: bool,
    }
    let bytes = capped_body(req, 4096).await?;
    let req = serde_json::from_slice::<AddUser>(&bytes)
        .map_err(|_| AdminError::BadBody("expected {\"name\", \"password\", \"replace\"}"))?;
    let password = crate::base::secret::SecretString::new(req.password);
    let (b, sealer) = (h.broker.clone(), h.sealer.clone());
    let (name, replace) = (req.name, req.replace);
    let n = name.clone();
    // Password hashing is deliberately slow: off the async workers.
    tokio::task::spawn_blocking(move || {
        crate::derive::ops::add_user(
            b.store.as_ref(),
            &sealer,
            &n,
            &password,
            replace,
            Recorder::of(&b),
        )
    })
    .await
    .map_err(|_| OpError::Task("add user"))??;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({"user": name, "running": true}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::users::UserError;
    use http_body_util::BodyExt;

    async fn answer(e: AdminError) -> (u16, serde_json::Value) {
        let r = error_response(&e);
        let status = r.status().as_u16();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn every_admin_error_has_one_json_shape() {
        for (e, status, code) in [
            (AdminError::NotFound, 404, "not_found"),
            (
                AdminError::BadBody("the body must be on or off"),
                400,
                "invalid_request",
            ),
            (
                OpError::User(UserError::Exists("alice".into())).into(),
                409,
                "conflict",
            ),
            (
                OpError::User(UserError::BadPassword).into(),
                400,
                "invalid_request",
            ),
            (OpError::Task("vault rotation").into(), 500, "server_error"),
        ] {
            let sentence = e.to_string();
            let (s, v) = answer(e).await;
            assert_eq!((s, v["error"].as_str()), (status, Some(code)));
            assert_eq!(v["error_description"], sentence.as_str());
            assert_eq!(v.as_object().unwrap().len(), 2, "no other field: {v}");
        }
    }
}
