//! Spans of the page flows (docs/OPERATIONS.md, "Spans"): one server span
//! per page request, and one trace per link.
//!
//! A browser sends no trace context, so the pages make one per flow: the
//! first request that names a link (`/connect/{code}`, or a sign-in whose
//! `return_to` is that link) starts the flow's trace, and every later
//! request of the same link is a child of that first span. The redirect
//! flows come back without the link in the URL: when a request of a flow
//! answers with a redirect whose URL carries a `state` (to the IdP, to the
//! provider), that `state` is remembered for the flow, and the callback
//! that brings it back joins the trace. Both are kept in memory only, by
//! their SHA-256 (a link code and a `state` are bearer values), bounded and
//! for an hour; on another replica the flow starts a trace of its own.
//!
//! A span carries the route's template (`/connect/{code}`, never the
//! code), the method, the status and the step (`credbroker.page`):
//! nothing of the person.

use std::sync::Arc;

use ::http::{header, Method, Response};

use crate::base::http::Body;
use crate::infra::telemetry::{self, Telemetry};

use super::http::Form;

/// How long a flow's trace is continued after its first request.
const FLOW_SECS: i64 = 3600;

/// A page request, as its span needs it.
pub(super) struct PageRequest<'a> {
    pub(super) method: &'a Method,
    pub(super) path: &'a str,
    pub(super) query: &'a Form,
    pub(super) form: &'a Form,
    pub(super) now: i64,
}

/// The route's template: the fixed paths as they are, the others with
/// their variable part named; `None` for the static assets (not traced).
fn template(path: &str) -> Option<&'static str> {
    Some(match path {
        "/assets/credbroker.css" | "/favicon.ico" => return None,
        "/" => "/",
        "/signin" => "/signin",
        "/signin/oidc" => "/signin/oidc",
        "/signin/callback" => "/signin/callback",
        "/signout" => "/signout",
        "/account" => "/account",
        "/account/disconnect" => "/account/disconnect",
        "/account/revoke" => "/account/revoke",
        p if p.starts_with("/connect/") => "/connect/{code}",
        p if p.starts_with("/callback/") => "/callback/{service}",
        p if p.starts_with("/done/") => "/done/{what}",
        _ => "/{unknown}",
    })
}

/// The span's name and the step it is (`credbroker.page`).
fn step(r: &PageRequest<'_>) -> (&'static str, &'static str) {
    let p = r.path;
    if p.starts_with("/connect/") {
        if r.method != Method::POST {
            return ("page.link", "link_opened");
        }
        return match r.form.get("action") {
            Some("allow" | "approve") => ("page.allow", "allow"),
            Some("connect" | "reconnect") => ("page.connect", "connect"),
            _ => ("page.link", "link_answered"),
        };
    }
    if p.starts_with("/callback/") {
        return ("page.connect", "provider_callback");
    }
    if p.starts_with("/signin") || p == "/signout" {
        return ("page.signin", "signin");
    }
    ("page", "other")
}

fn sha(kind: &str, v: &str) -> String {
    crate::base::jose::sha256_hex(format!("{kind}\0{v}").as_bytes())
}

/// The link a request names: in its path, or as the `return_to` of a
/// sign-in (query or form).
fn link_key(r: &PageRequest<'_>) -> Option<String> {
    let code = match r.path.strip_prefix("/connect/") {
        Some(c) => c,
        None => r
            .query
            .get("return_to")
            .or_else(|| r.form.get("return_to"))?
            .strip_prefix("/connect/")?,
    };
    let code = code.split(['?', '#', '/']).next().unwrap_or_default();
    (!code.is_empty()).then(|| sha("link", code))
}

/// The `state` a redirect's URL carries.
fn redirect_state(resp: &Response<Body>) -> Option<String> {
    let loc = resp.headers().get(header::LOCATION)?.to_str().ok()?;
    let url = url::Url::parse(loc).ok()?;
    let state = url
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())?;
    Some(sha("state", &state))
}

/// What the span of a request needs of it, taken before its handler
/// consumes the form.
pub(super) struct Prepared {
    template: &'static str,
    name: &'static str,
    page: &'static str,
    method: Method,
    link: Option<String>,
    state: Option<String>,
    now: i64,
}

/// The span's inputs; `None` for a request that has no span.
pub(super) fn prepare(r: &PageRequest<'_>) -> Option<Prepared> {
    let template = template(r.path)?;
    let (name, page) = step(r);
    Some(Prepared {
        template,
        name,
        page,
        method: r.method.clone(),
        link: link_key(r),
        state: r.query.get("state").map(|s| sha("state", s)),
        now: r.now,
    })
}

/// Runs `route` under the request's span (see the module doc).
pub(super) async fn run<F>(tel: &Arc<Telemetry>, p: Prepared, route: F) -> Response<Body>
where
    F: std::future::Future<Output = Response<Body>>,
{
    let flow = p
        .link
        .as_deref()
        .and_then(|k| tel.flow(k, p.now))
        .or_else(|| p.state.as_deref().and_then(|k| tel.flow(k, p.now)));
    let mut span = tel.page_span(p.name, flow.as_ref().map(|f| f.0));
    span.set("http.route", p.template);
    span.set("http.request.method", p.method.as_str());
    span.set("credbroker.page", p.page);
    // The flow's root: the first span that named the link.
    let root = flow.as_ref().map(|f| f.0).or_else(|| span.context());
    if let (Some(k), None, Some(ctx)) = (&p.link, &flow, root) {
        tel.remember_flow(k, ctx, p.now + FLOW_SECS);
    }
    telemetry::run(span, async move {
        let resp = route.await;
        telemetry::set_root("http.response.status_code", resp.status().as_u16());
        if resp.status().is_server_error() {
            telemetry::fail_root();
        }
        if let (Some(ctx), Some(k)) = (root, redirect_state(&resp)) {
            tel.remember_flow(&k, ctx, p.now + FLOW_SECS);
        }
        resp
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_no_code() {
        assert_eq!(template("/connect/abc"), Some("/connect/{code}"));
        assert_eq!(template("/callback/acme"), Some("/callback/{service}"));
        assert_eq!(template("/signin"), Some("/signin"));
        assert_eq!(template("/whatever/x"), Some("/{unknown}"));
        assert_eq!(template("/favicon.ico"), None);
    }
}
