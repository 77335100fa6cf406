//! The embedded pages: what a person sees when they open a connect link,
//! sign in, or look at their connected accounts. Served on the public
//! listener (`public` routes everything but metadata and JWKS here).
//!
//! The page behind a link finds out who opened it before it offers
//! anything (docs/DESIGN.md section 5): `connect` runs the five checks in order.
//! Thin handlers here; the protocol pieces each have their own file:
//!
//! - [`http`]: security headers on every answer, forms, cookies, `return_to`.
//! - [`session`]: server-side sessions, cookies, CSRF tokens.
//! - [`users`]: local accounts (argon2id, lockout).
//! - [`oidc`]: the OIDC relying party (discovery, code + PKCE, ID token).
//! - [`flows`]: single-use `state` records of redirect flows.
//! - [`limits`]: rate limits per client address.
//! - [`links`]: what the pages need from link records, vault and providers.
//! - [`approvals`]: what the pages need from the approval records.
//! - [`signin`], [`connect`], [`approval`], [`account`]: the routes
//!   (`/connect/{code}` serves connect links and approvals alike).
//! - [`views`]: the HTML templates.
//!
//! Routes: `GET /signin`, `POST /signin`, `GET /signin/oidc`,
//! `GET /signin/callback`, `POST /signout`, `GET|POST /connect/{code}`,
//! `GET /callback/{service}`, `GET /done/{what}`, `GET /account`,
//! `POST /account/disconnect`, `POST /account/revoke`,
//! `GET /assets/credbroker.css`.

// Handlers return early with the page to show (`Result<_, Response>`); a
// response is moved once per request, so its size does not matter here.
#![allow(clippy::result_large_err)]

pub(crate) mod account;
pub(crate) mod approval;
pub(crate) mod approvals;
pub(crate) mod confusable;
pub(crate) mod connect;
pub(crate) mod flows;
pub(crate) mod http;
pub(crate) mod limits;
pub(crate) mod links;
pub(crate) mod oidc;
pub(crate) mod person;
pub(crate) mod session;
pub(crate) mod signin;
mod traced;
pub(crate) mod views;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use ::http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use bytes::Bytes;

use crate::base::clock::SharedClock;
use crate::base::http::Body;
use crate::infra::config::{IssuerConfig, SignIn as SignInConfig};
use crate::infra::events::{Audit, Event, Kind};
use crate::infra::seal::Sealer;
use crate::infra::store::{Store, StoreError};

pub use limits::PageLimits;
pub(crate) use links::ConnectedServices;
pub(crate) use session::Lifetimes;

/// How the pages are set up (defaults suit production).
#[derive(Debug, Clone)]
pub struct Options {
    /// Rate limits per client address.
    pub limits: PageLimits,
    /// Session lifetimes.
    pub lifetimes: Lifetimes,
    /// The connected-services side.
    pub services: ConnectedServices,
    /// The step-up approvals.
    pub approvals: Arc<dyn approvals::ApprovalRecords>,
    /// The trusted issuers' key sets, by issuer (from
    /// `subject::Validator::key_sets`), so that an IdP that is both a
    /// subject-token issuer and a sign-in source has one JWKS cache. An
    /// issuer missing here gets a set of its own.
    pub key_sets: HashMap<String, Arc<crate::base::keyset::RemoteKeySet>>,
    /// The key that authenticates session records in the store. The
    /// composition root derives it from the master key
    /// ([`session::Sessions::derive_key`]) so that replicas share sessions;
    /// the default is a random key, for one instance only.
    pub session_key: crate::base::secret::SecretBytes,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: PageLimits::default(),
            lifetimes: Lifetimes::default(),
            services: ConnectedServices::none(),
            approvals: Arc::new(approvals::NoApprovals),
            key_sets: HashMap::new(),
            session_key: {
                let mut k = vec![0u8; 32];
                // aws-lc's RNG does not fail on Linux short of a broken
                // kernel; the composition root never uses this default.
                let _ = aws_lc_rs::rand::fill(&mut k);
                crate::base::secret::SecretBytes::new(k)
            },
        }
    }
}

/// What the pages use of the instance around them: these, and nothing
/// else of the broker. The composition root (`app`) cuts them out of the
/// broker, so the pages do not depend on the derive pipeline (`exchange`).
#[derive(Clone)]
pub struct Deps {
    /// The instance's public issuer URL: the pages' base URL.
    pub issuer: String,
    /// The agent this instance serves (named in the pages' audit events).
    pub agent: String,
    /// The trusted subject-token issuers (sign-in: local or OIDC).
    pub trusted_issuers: Vec<IssuerConfig>,
    /// The clock.
    pub clock: SharedClock,
    /// Sessions, flows and local users live here.
    pub store: Arc<dyn Store>,
    /// The instance's audit sink.
    pub audit: Arc<Audit>,
    /// OpenTelemetry, when its spans are on: each page request has one
    /// (`traced`).
    pub(crate) telemetry: Option<Arc<crate::infra::telemetry::Telemetry>>,
}

impl std::fmt::Debug for Deps {
    // The store and the clock are trait objects without `Debug`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps")
            .field("issuer", &self.issuer)
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// How many argon2id verifications may run at once (each takes 19 MiB).
const HASHING_SLOTS: usize = 4;
/// Sweep expired sessions and flows at most this often.
const SWEEP_EVERY: i64 = 300;

/// The pages of one instance.
pub struct Pages {
    deps: Deps,
    sealer: Arc<Sealer>,
    services: ConnectedServices,
    approvals: Arc<dyn approvals::ApprovalRecords>,
    sessions: session::Sessions,
    limiters: limits::Limiters,
    oidc: oidc::Oidc,
    hashing: tokio::sync::Semaphore,
    /// The pages' base URL: the instance's public issuer URL.
    base: String,
    /// Its origin, compared with `Origin` on every POST.
    origin: String,
    cookie_name: &'static str,
    secure_cookie: bool,
    /// The broker's own issuer when local accounts sign people in.
    local_issuer: Option<String>,
    /// Each sign-in source's name, by issuer (with and without a trailing
    /// `/`, as persons carry it either way).
    sources: HashMap<String, String>,
    /// Caps `signin.failed` events and their log lines (a flood of refused
    /// sign-ins must not fill the audit log).
    failed_budget: limits::EventBudget,
    not_found: Bytes,
    last_sweep: AtomicI64,
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("base", &self.base)
            .field("cookie", &self.cookie_name)
            .finish_non_exhaustive()
    }
}

/// What every handler gets about the request.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// The client's address.
    pub client: IpAddr,
    /// Now (the broker's clock).
    pub now: i64,
}

impl Pages {
    /// The pages of an instance, given what they use of it (the
    /// composition root makes [`Deps`] from the broker: `Deps::from`).
    pub fn new(deps: impl Into<Deps>, sealer: Arc<Sealer>, options: Options) -> Pages {
        let deps = deps.into();
        let base = deps.issuer.trim_end_matches('/').to_string();
        let origin = http::origin_of(&base).unwrap_or_default();
        // `__Host-` cookies need Secure, which browsers refuse over plain
        // HTTP; the config allows plain HTTP only on loopback (quick start).
        let secure_cookie = base.starts_with("https://");
        let local_issuer = deps
            .trusted_issuers
            .iter()
            .find(|i| i.sign_in == SignInConfig::Local)
            .map(|i| i.issuer.trim_end_matches('/').to_string());
        let not_found = Bytes::from(views::render(&views::NotFound { who: None }));
        let mut sources = HashMap::new();
        for i in &deps.trusted_issuers {
            sources.insert(i.issuer.clone(), i.display_name.clone());
            sources.insert(
                i.issuer.trim_end_matches('/').to_string(),
                i.display_name.clone(),
            );
        }
        Pages {
            oidc: oidc::Oidc::new(&deps.trusted_issuers, &options.key_sets),
            sessions: session::Sessions::new(options.lifetimes, &options.session_key),
            limiters: limits::Limiters::new(&options.limits),
            services: options.services,
            approvals: options.approvals,
            hashing: tokio::sync::Semaphore::new(HASHING_SLOTS),
            cookie_name: if secure_cookie {
                session::COOKIE_SECURE
            } else {
                session::COOKIE_DEV
            },
            secure_cookie,
            base,
            origin,
            local_issuer,
            sources,
            failed_budget: limits::EventBudget::new(limits::SIGNIN_FAILED_PER_MINUTE),
            not_found,
            last_sweep: AtomicI64::new(0),
            deps,
            sealer,
        }
    }

    /// The connected-services side these pages use.
    pub fn services(&self) -> &ConnectedServices {
        &self.services
    }

    /// The approval records these pages use.
    pub fn approvals(&self) -> &Arc<dyn approvals::ApprovalRecords> {
        &self.approvals
    }

    /// The cookie name in use (`__Host-credbroker`, or the dev fallback).
    pub fn cookie_name(&self) -> &'static str {
        self.cookie_name
    }

    /// Handles one request on the public listener.
    pub async fn handle<B>(&self, req: Request<B>, client: IpAddr) -> Response<Body>
    where
        B: hyper::body::Body + Send,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let ctx = Ctx {
            client,
            now: self.deps.clock.now(),
        };
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        if parts.method == Method::POST && !self.same_origin(&parts.headers) {
            return self.message(
                StatusCode::FORBIDDEN,
                None,
                "Request refused",
                &["This form was sent from another site, so it was refused. Nothing was changed."],
            );
        }
        let form = if parts.method == Method::POST {
            match http::read_form(&parts.headers, body).await {
                Ok(f) => f,
                Err(http::RequestError::TooLarge) => {
                    return self.message(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        None,
                        "Request too large",
                        &[],
                    )
                }
                Err(http::RequestError::Malformed) => {
                    return self.message(
                        StatusCode::BAD_REQUEST,
                        None,
                        "Request not understood",
                        &[],
                    )
                }
            }
        } else {
            http::Form::default()
        };
        let query = match http::Form::query(&parts.uri) {
            Ok(q) => q,
            Err(_) => {
                return self.message(StatusCode::BAD_REQUEST, None, "Request not understood", &[])
            }
        };
        let traced = self.deps.telemetry.as_ref().filter(|t| t.traces_on());
        let prepared = traced.and_then(|_| {
            traced::prepare(&traced::PageRequest {
                method: &parts.method,
                path: &path,
                query: &query,
                form: &form,
                now: ctx.now,
            })
        });
        match (traced, prepared) {
            (Some(tel), Some(p)) => {
                let route = self.route(ctx, &parts, &path, form, query);
                traced::run(tel, p, route).await
            }
            _ => self.route(ctx, &parts, &path, form, query).await,
        }
    }

    /// The page of one request.
    async fn route(
        &self,
        ctx: Ctx,
        parts: &::http::request::Parts,
        path: &str,
        form: http::Form,
        query: http::Form,
    ) -> Response<Body> {
        let h = &parts.headers;
        match (&parts.method, path) {
            (&Method::GET, "/") => http::redirect("/account"),
            (&Method::GET, "/assets/credbroker.css") => {
                let mut r = Response::new(http_body_util::Full::new(Bytes::from_static(
                    views::CSS.as_bytes(),
                )));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/css; charset=utf-8"),
                );
                http::secure(r.headers_mut(), None);
                r
            }
            (&Method::GET, "/favicon.ico") => {
                let mut r = Response::new(http_body_util::Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::NO_CONTENT;
                http::secure(r.headers_mut(), None);
                r
            }
            (&Method::GET, "/signin") => signin::page(self, ctx, h, &query).await,
            (&Method::POST, "/signin") => signin::local(self, ctx, h, form).await,
            (&Method::GET, "/signin/oidc") => signin::oidc_start(self, ctx, h, &query).await,
            (&Method::GET, "/signin/callback") => signin::oidc_callback(self, ctx, h, query).await,
            (&Method::POST, "/signout") => signin::signout(self, ctx, h, &form).await,
            (&Method::GET, "/account") => account::page(self, ctx, h).await,
            (&Method::POST, "/account/disconnect") => {
                account::disconnect(self, ctx, h, &form).await
            }
            (&Method::POST, "/account/revoke") => account::revoke(self, ctx, h, &form).await,
            (&Method::GET, p) if p.starts_with("/callback/") => {
                connect::provider_callback(self, ctx, h, &p["/callback/".len()..], query).await
            }
            (&Method::GET, p) if p.starts_with("/done/") => {
                connect::done(self, ctx, h, &p["/done/".len()..])
            }
            // A code is an approval's or a connect link's: the approval
            // pages answer theirs, the connect-link pages the rest.
            (&Method::GET, p) if p.starts_with("/connect/") => {
                let code = &p["/connect/".len()..];
                match approval::open(self, ctx, h, code) {
                    Some(r) => r,
                    None => connect::open(self, ctx, h, code).await,
                }
            }
            (&Method::POST, p) if p.starts_with("/connect/") => {
                let code = &p["/connect/".len()..];
                match approval::act(self, ctx, h, code, &form) {
                    Some(r) => r,
                    None => connect::act(self, ctx, h, code, form).await,
                }
            }
            _ => self.not_found(),
        }
    }

    /// The one 404 page (byte-identical whatever was asked).
    pub fn not_found(&self) -> Response<Body> {
        http::html(StatusCode::NOT_FOUND, self.not_found.clone())
    }

    /// A text page.
    pub fn message(
        &self,
        status: StatusCode,
        who: Option<views::Who>,
        title: &str,
        paragraphs: &[&str],
    ) -> Response<Body> {
        http::html(
            status,
            views::render(&views::Message {
                who,
                title: title.to_string(),
                paragraphs: paragraphs.iter().map(|p| p.to_string()).collect(),
                reference: None,
                next: None,
            }),
        )
    }

    /// A text page with a link onward (`next` = (href, label)).
    pub fn message_next(
        &self,
        status: StatusCode,
        who: Option<views::Who>,
        title: &str,
        paragraphs: &[&str],
        next: (&str, &str),
    ) -> Response<Body> {
        http::html(
            status,
            views::render(&views::Message {
                who,
                title: title.to_string(),
                paragraphs: paragraphs.iter().map(|p| p.to_string()).collect(),
                reference: None,
                next: Some((next.0.to_string(), next.1.to_string())),
            }),
        )
    }

    /// The name of the sign-in source of `issuer` (its `display_name`, by
    /// default the issuer's host).
    pub fn source_name(&self, issuer: &str) -> String {
        self.sources
            .get(issuer)
            .cloned()
            .unwrap_or_else(|| crate::infra::config::default_display_name(issuer))
    }

    /// The signed-in person as the pages name them: their name and where
    /// they signed in (two sources may each have an `alice`).
    pub fn person_label(&self, r: &session::Record) -> String {
        let name = r
            .display
            .clone()
            .or_else(|| r.sub.clone())
            .unwrap_or_default();
        match &r.iss {
            Some(iss) => format!("{name} (signed in at {})", self.source_name(iss)),
            None => name,
        }
    }

    /// Records a `signin.failed` event and logs it, within the budget: past
    /// [`limits::SIGNIN_FAILED_PER_MINUTE`] a minute, events are counted
    /// and the count is logged once the minute is over.
    pub fn signin_failed(&self, e: &Event<'_>) {
        let (admit, suppressed) = self.failed_budget.admit(e.time);
        if let Some(n) = suppressed {
            tracing::warn!(
                suppressed = n,
                "pages: {n} signin.failed events over the budget of {} a minute were not written",
                limits::SIGNIN_FAILED_PER_MINUTE
            );
        }
        if admit {
            tracing::warn!(
                reason = e.reason.unwrap_or(""),
                issuer = e.person_iss.unwrap_or(""),
                client = e.client_addr.as_deref().unwrap_or(""),
                "pages: sign-in refused"
            );
            self.audit(e);
        }
    }

    /// A 500 page with a correlation id that is also logged; the browser
    /// never sees the cause.
    pub fn internal(&self, what: &str, err: &dyn std::fmt::Display) -> Response<Body> {
        let reference = crate::base::http::correlation_id();
        tracing::error!(%reference, what, error = %err, "pages: internal error");
        http::html(
            StatusCode::INTERNAL_SERVER_ERROR,
            views::render(&views::Message {
                who: None,
                title: "Something went wrong".into(),
                paragraphs: vec!["Nothing was changed. Please try again in a moment.".into()],
                reference: Some(reference),
                next: None,
            }),
        )
    }

    /// The page for a failed store operation: while the store cannot
    /// answer ([`StoreError::Unavailable`]: a shared store unreachable,
    /// slow past its statement timeout, or its pool full) a 503 "try again"
    /// page, as the link page answers, since that is an outage to wait out
    /// and not a fault of this instance; any other store failure is an
    /// internal error ([`Pages::internal`]).
    pub fn store_failed(&self, what: &str, err: &StoreError) -> Response<Body> {
        match err {
            StoreError::Unavailable(_) => {
                tracing::warn!(what, error = %err, "pages: store unavailable");
                self.message(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    "Temporarily unavailable",
                    &["Nothing was changed. Please try again in a moment."],
                )
            }
            _ => self.internal(what, err),
        }
    }

    /// 429, with `Retry-After` = the seconds until the limiter would admit
    /// this client again.
    pub fn too_many(&self, retry_after: limits::RetryAfter) -> Response<Body> {
        let secs = retry_after.0;
        let wait = if secs == 1 {
            "Wait a second and try again.".to_string()
        } else {
            format!("Wait {secs} seconds and try again.")
        };
        let mut r = self.message(
            StatusCode::TOO_MANY_REQUESTS,
            None,
            "Too many requests",
            &[
                "Too many requests came from your network address (people who share it, as in an office, share its limit).",
                wait.as_str(),
            ],
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        r
    }

    /// The "form expired" page (CSRF token missing or wrong).
    pub fn bad_csrf(&self) -> Response<Body> {
        self.message(
            StatusCode::BAD_REQUEST,
            None,
            "This form has expired",
            &["Nothing was changed. Go back, reload the page and try again."],
        )
    }

    fn same_origin(&self, h: &HeaderMap) -> bool {
        // The CSRF token is the main defence; this refuses cross-site posts
        // before any work. Browsers that send `Sec-Fetch-Site` say exactly
        // where a request comes from. `Origin` is the fallback, but under
        // `Referrer-Policy: no-referrer` Chromium sends `Origin: null` even
        // for our own forms, so `null` is left to the CSRF token.
        if let Some(site) = h.get("sec-fetch-site") {
            return site.as_bytes() == b"same-origin";
        }
        match h.get(header::ORIGIN).map(|v| v.to_str()) {
            None | Some(Ok("null")) => true,
            Some(Ok(o)) => o == self.origin,
            Some(Err(_)) => false,
        }
    }

    /// The live session of this request, if any.
    pub fn session(
        &self,
        h: &HeaderMap,
        now: i64,
    ) -> Result<Option<session::Session>, crate::infra::store::StoreError> {
        let ids = http::cookies(h, self.cookie_name);
        self.sessions.load(self.deps.store.as_ref(), &ids, now)
    }

    /// The header line for a signed-in session.
    pub fn who(&self, s: &session::Session) -> Option<views::Who> {
        let r = &s.record;
        Some(views::Who {
            display: r.display.clone().or_else(|| r.sub.clone())?,
            issuer: self.source_name(r.iss.as_deref()?),
            csrf: s.csrf().expose().clone(),
            return_to: None,
        })
    }

    /// Adds `Set-Cookie` for a session.
    pub fn set_cookie(&self, r: &mut Response<Body>, s: &session::Session) {
        if let Ok(v) = HeaderValue::from_str(&session::set_cookie(
            self.cookie_name,
            self.secure_cookie,
            s.id(),
        )) {
            r.headers_mut().append(header::SET_COOKIE, v);
        }
    }

    /// Adds a `Set-Cookie` that removes the session cookie.
    pub fn clear_cookie(&self, r: &mut Response<Body>) {
        if let Ok(v) =
            HeaderValue::from_str(&session::clear_cookie(self.cookie_name, self.secure_cookie))
        {
            r.headers_mut().append(header::SET_COOKIE, v);
        }
    }

    /// Records an audit event; a failure is logged (the page still answers:
    /// no secret is released by a page).
    pub fn audit(&self, e: &Event<'_>) {
        if let Err(err) = self.deps.audit.record(e) {
            tracing::error!(event = e.event.as_str(), error = %err, "pages: audit event not written");
        }
    }

    /// A new event at `now` for this instance's agent.
    pub fn event(&self, ctx: &Ctx, name: Kind) -> Event<'_> {
        let mut e = Event::new(ctx.now, name, &self.deps.agent);
        e.client_addr = Some(ctx.client.to_string());
        e
    }

    /// The pages' base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Forgets idle rate-limit keys and sweeps expired sessions and flows.
    pub fn housekeeping(&self) {
        self.limiters.housekeeping();
        let now = self.deps.clock.now();
        if let Some(n) = self.failed_budget.flush(now) {
            tracing::warn!(
                suppressed = n,
                "pages: {n} signin.failed events over the budget of {} a minute were not written",
                limits::SIGNIN_FAILED_PER_MINUTE
            );
        }
        if now - self.last_sweep.load(Ordering::Relaxed) < SWEEP_EVERY {
            return;
        }
        self.last_sweep.store(now, Ordering::Relaxed);
        let store = self.deps.store.as_ref();
        if let Err(e) = self.sessions.sweep(store, now) {
            tracing::warn!(error = %e, "pages: session sweep failed");
        }
        if let Err(e) = flows::sweep(store, &self.sealer, now) {
            tracing::warn!(error = %e, "pages: flow sweep failed");
        }
    }
}
