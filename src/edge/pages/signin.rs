//! Sign-in and sign-out routes: the sign-in page, local accounts, the OIDC
//! redirect and callback.
//!
//! Every successful sign-in creates a fresh session (a new id) and deletes
//! the one the browser had, then sends the browser to an allow-listed
//! relative `return_to`. Failures all read the same to the browser.

use http::{HeaderMap, Response, StatusCode};

use super::http::{redirect, safe_return_to, Form};
use super::session::{Method, Record, Session};
use super::{flows, views, Ctx, Pages};
use crate::accounts::users;
use crate::base::http::Body;
use crate::base::secret::SecretString;

const SIGNIN_FAILED: &str = "The user name or password is not right. After several failed attempts an account is locked for 15 minutes.";

/// The sign-in path that returns to `return_to`.
pub(crate) fn signin_path(return_to: &str, reauth: bool) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    s.append_pair("return_to", return_to);
    if reauth {
        s.append_pair("reauth", "1");
    }
    format!("/signin?{}", s.finish())
}

fn return_to_of(q: &Form) -> String {
    q.get("return_to")
        .and_then(safe_return_to)
        .unwrap_or_else(|| "/account".to_string())
}

/// The session of this browser, or a new anonymous one (then `true`).
fn session_or_new(p: &Pages, ctx: Ctx, h: &HeaderMap) -> Result<(Session, bool), Response<Body>> {
    match p.session(h, ctx.now) {
        Ok(Some(s)) => Ok((s, false)),
        Ok(None) => {
            // Creating a session is a durable write: limit it per address
            // (a limit of its own: page views are not code look-ups).
            if let Err(wait) = p.limiters.new_session(ctx.client) {
                return Err(p.too_many(wait));
            }
            p.sessions
                .create_anonymous(p.deps.store.as_ref(), ctx.now)
                .map(|s| (s, true))
                .map_err(|e| p.store_failed("session", &e))
        }
        Err(e) => Err(p.store_failed("session", &e)),
    }
}

// reason: the page's inputs (session, status, where to return, the
// re-authentication flag, the error and the name typed so far); a private
// renderer whose callers each pass a different mix.
#[allow(clippy::too_many_arguments)]
fn render_page(
    p: &Pages,
    s: &Session,
    status: StatusCode,
    return_to: &str,
    reauth: bool,
    error: Option<&str>,
    typed_name: Option<&str>,
) -> Response<Body> {
    let person = s.record.person();
    // Signing in again: offer only the way this person signed in.
    let (local, fixed_name, oidc_issuers): (bool, Option<String>, Vec<String>) =
        match (&person, reauth) {
            (Some(pp), true) if Some(&pp.iss) == p.local_issuer.as_ref() => {
                (true, Some(pp.sub.clone()), vec![])
            }
            (Some(pp), true) if p.oidc.has(&pp.iss) => (false, None, vec![pp.iss.clone()]),
            _ => (
                p.local_issuer.is_some(),
                None,
                p.deps
                    .trusted_issuers
                    .iter()
                    .filter(|i| p.oidc.has(&i.issuer))
                    .map(|i| i.issuer.clone())
                    .collect(),
            ),
        };
    let oidc = oidc_issuers
        .into_iter()
        .map(|iss| {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("issuer", &iss)
                .append_pair("return_to", return_to);
            if reauth {
                q.append_pair("reauth", "1");
            }
            let label = p.source_name(&iss);
            views::OidcChoice {
                label,
                href: format!("/signin/oidc?{}", q.finish()),
            }
        })
        .collect();
    let page = views::SignIn {
        who: if reauth { p.who(s) } else { None },
        broker: p.base.clone(),
        csrf: s.csrf().expose().clone(),
        return_to: return_to.to_string(),
        reauth,
        local,
        typed_name: typed_name
            .filter(|n| fixed_name.is_none() && users::valid_name(n))
            .map(str::to_owned),
        fixed_name,
        oidc,
        error: error.map(str::to_owned),
    };
    let mut r = super::http::html(status, views::render(&page));
    p.set_cookie(&mut r, s);
    r
}

/// `GET /signin?return_to=...&reauth=1`.
pub(crate) async fn page(p: &Pages, ctx: Ctx, h: &HeaderMap, q: &Form) -> Response<Body> {
    let return_to = return_to_of(q);
    let reauth = q.get("reauth") == Some("1");
    let (s, _) = match session_or_new(p, ctx, h) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if s.record.person().is_some() && !reauth {
        return redirect(&return_to);
    }
    render_page(p, &s, StatusCode::OK, &return_to, reauth, None, None)
}

/// Replaces the browser's session with a fresh signed-in one.
fn sign_in(p: &Pages, old: &Session, record: Record, return_to: &str) -> Response<Body> {
    let store = p.deps.store.as_ref();
    let fresh = match p.sessions.create(store, record) {
        Ok(s) => s,
        Err(e) => return p.store_failed("session", &e),
    };
    if let Err(e) = p.sessions.delete(store, old) {
        // The old id stays valid until it expires; refuse rather than keep
        // two live sessions for one sign-in.
        let _ = p.sessions.delete(store, &fresh);
        return p.store_failed("session", &e);
    }
    let mut r = redirect(return_to);
    p.set_cookie(&mut r, &fresh);
    r
}

/// `POST /signin`: local accounts.
pub(crate) async fn local(p: &Pages, ctx: Ctx, h: &HeaderMap, mut form: Form) -> Response<Body> {
    if let Err(wait) = p.limiters.signin(ctx.client) {
        let mut e = p.event(&ctx, crate::infra::events::Kind::SigninFailed);
        e.reason = Some("rate_limited");
        p.signin_failed(&e);
        return p.too_many(wait);
    }
    let s = match p.session(h, ctx.now) {
        Ok(Some(s)) => s,
        Ok(None) => return p.bad_csrf(),
        Err(e) => return p.store_failed("session", &e),
    };
    if !s.check_csrf(form.get("csrf")) {
        return p.bad_csrf();
    }
    let Some(issuer) = p.local_issuer.clone() else {
        return p.not_found();
    };
    let return_to = return_to_of(&form);
    let reauth = form.get("reauth") == Some("1");
    let name = form.get("username").unwrap_or("").trim().to_string();
    let password = SecretString::new(form.take("password").unwrap_or_default());
    let verdict = {
        let Ok(_slot) = p.hashing.acquire().await else {
            return p.internal("hashing", &"semaphore closed");
        };
        let store = p.deps.store.clone();
        let sealer = p.sealer.clone();
        let n = name.clone();
        let now = ctx.now;
        match tokio::task::spawn_blocking(move || {
            users::verify(store.as_ref(), &sealer, &n, &password, now)
        })
        .await
        {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return p.store_failed("users", &e),
            Err(e) => return p.internal("users", &e),
        }
    };
    let known = !matches!(verdict, users::Verdict::Unknown);
    if verdict != users::Verdict::Ok {
        let mut e = p.event(&ctx, crate::infra::events::Kind::SigninFailed);
        e.person_iss = Some(&issuer);
        // An unknown name is not a person: it is not recorded.
        e.person_sub = known.then_some(name.as_str());
        e.reason = Some(match verdict {
            users::Verdict::Locked => "locked",
            users::Verdict::NowLocked => "now_locked",
            users::Verdict::Unknown => "unknown_user",
            _ => "wrong_password",
        });
        p.signin_failed(&e);
        return render_page(
            p,
            &s,
            StatusCode::FORBIDDEN,
            &return_to,
            reauth,
            Some(SIGNIN_FAILED),
            Some(&name),
        );
    }
    let mut e = p.event(&ctx, crate::infra::events::Kind::SigninSucceeded);
    e.person_iss = Some(&issuer);
    e.person_sub = Some(&name);
    e.reason = Some("local");
    p.audit(&e);
    let record = Record {
        iss: Some(issuer.clone()),
        sub: Some(name.clone()),
        display: Some(name.clone()),
        method: Some(Method::Local),
        auth_time: Some(ctx.now),
        created: ctx.now,
        last_seen: ctx.now,
    };
    sign_in(p, &s, record, &return_to)
}

fn redirect_uri(p: &Pages) -> String {
    format!("{}/signin/callback", p.base)
}

/// `GET /signin/oidc?issuer=...&return_to=...&reauth=1`: starts the
/// authorization code flow at the IdP.
pub(crate) async fn oidc_start(p: &Pages, ctx: Ctx, h: &HeaderMap, q: &Form) -> Response<Body> {
    if let Err(wait) = p.limiters.signin(ctx.client) {
        return p.too_many(wait);
    }
    let Some(issuer) = q.get("issuer").filter(|i| p.oidc.has(i)).map(str::to_owned) else {
        return p.not_found();
    };
    let return_to = return_to_of(q);
    let reauth = q.get("reauth") == Some("1");
    // A sign-in that leads to a link sends `max_age`: the link's page needs
    // a sign-in within it (check 4 of `connect`), and an IdP asked for
    // `max_age` must send `auth_time` (OpenID Connect Core 3.1.2.1). Without
    // it an IdP that leaves `auth_time` out by default (oidc-provider) would
    // have the person sign in twice in a row.
    let max_age = reauth || leads_to_link(&return_to);
    let (s, new) = match session_or_new(p, ctx, h) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (nonce, pkce) = match (super::session::random_token(), flows::pkce()) {
        (Ok(n), Ok(pk)) => (n, pk),
        _ => return p.internal("random", &"no randomness"),
    };
    let (verifier, challenge) = pkce;
    let flow = flows::Flow::SignIn {
        issuer: issuer.clone(),
        nonce: nonce.expose().clone(),
        verifier: verifier.expose().clone(),
        return_to,
        reauth,
        max_age,
    };
    let state = match flows::start(
        p.deps.store.as_ref(),
        &p.sealer,
        &s.key_hex(),
        flow,
        ctx.now,
    ) {
        Ok(st) => st,
        Err(e) => return p.store_failed("flow", &e),
    };
    let url = match p
        .oidc
        .authorization_url(
            &issuer,
            &redirect_uri(p),
            &state,
            &nonce,
            &challenge,
            max_age,
            reauth,
        )
        .await
    {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(issuer = %issuer, error = %e, "pages: OIDC discovery failed");
            return p.message(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "Sign-in is unavailable",
                &["The sign-in service of your organisation cannot be reached right now. Try again in a moment."],
            );
        }
    };
    let mut r = redirect(url.as_str());
    if new {
        p.set_cookie(&mut r, &s);
    }
    r
}

/// Whether a sign-in that returns to `return_to` leads to a link's page.
pub(crate) fn leads_to_link(return_to: &str) -> bool {
    return_to.starts_with("/connect/")
}

/// A refused sign-in callback whose flow is unknown (no `state`, a spent or
/// expired one, one started in another browser): recorded (rate-limited),
/// logged, and answered with a way to start again.
fn expired_flow(p: &Pages, ctx: &Ctx, reason: &'static str) -> Response<Body> {
    let mut e = p.event(ctx, crate::infra::events::Kind::SigninFailed);
    e.reason = Some(reason);
    p.signin_failed(&e);
    p.message_next(
        StatusCode::BAD_REQUEST,
        None,
        "This sign-in has expired",
        &["It was already used, took too long, or was started in another browser. Nothing was changed."],
        ("/signin", "Start again"),
    )
}

/// The IdP signed the person in without saying when (no `auth_time`)
/// although `max_age` was sent. Not a sign-in loop: sending the person back
/// would ask the same IdP the same way and get the same answer.
fn no_auth_time(p: &Pages, ctx: &Ctx, issuer: &str, source: &str, again: &str) -> Response<Body> {
    tracing::warn!(issuer = %issuer, "pages: OIDC sign-in refused: max_age was sent and the ID token has no auth_time (OpenID Connect Core 3.1.2.1); the IdP client must allow max_age");
    let mut e = p.event(ctx, crate::infra::events::Kind::SigninFailed);
    e.person_iss = Some(issuer);
    e.reason = Some("auth_time_missing");
    p.signin_failed(&e);
    let text = format!("{source} signed you in but did not say when (its answer has no auth_time), and this page needs a sign-in from the last 15 minutes. Nothing was changed.");
    p.message_next(
        StatusCode::BAD_GATEWAY,
        None,
        "Your sign-in service sent an incomplete answer",
        &[
            text.as_str(),
            "Signing in again will not help. Tell your administrator: the sign-in service must send auth_time when max_age is asked for (OpenID Connect Core 3.1.2.1).",
        ],
        (again, "Start again"),
    )
}

/// `GET /signin/callback?code=...&state=...[&iss=...]`.
pub(crate) async fn oidc_callback(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    mut q: Form,
) -> Response<Body> {
    if let Err(wait) = p.limiters.signin(ctx.client) {
        return p.too_many(wait);
    }
    let store = p.deps.store.as_ref();
    let Some(state) = q.get("state").map(str::to_owned) else {
        return expired_flow(p, &ctx, "no_state");
    };
    // Taking the state spends it, whatever happens next.
    let taken = match flows::take(store, &p.sealer, &state, ctx.now) {
        Ok(Some(t)) => t,
        // Unknown, expired or already used (a replayed callback).
        Ok(None) => return expired_flow(p, &ctx, "state_unknown"),
        Err(e) => return p.store_failed("flow", &e),
    };
    let s = match p.session(h, ctx.now) {
        Ok(Some(s)) if s.key_hex() == taken.session => s,
        // Another browser's callback: the login-CSRF shape (someone makes
        // this browser finish a sign-in they started).
        Ok(_) => return expired_flow(p, &ctx, "state_of_another_session"),
        Err(e) => return p.store_failed("session", &e),
    };
    let flows::Flow::SignIn {
        issuer,
        nonce,
        verifier,
        return_to,
        reauth,
        max_age,
    } = &taken.flow
    else {
        return expired_flow(p, &ctx, "state_of_another_flow");
    };
    // Starting again goes back to the same page (the flow's `return_to`
    // was allow-listed when the flow began).
    let again = signin_path(return_to, false);
    let source = p.source_name(issuer);
    let fail = |reason: &'static str| {
        let mut e = p.event(&ctx, crate::infra::events::Kind::SigninFailed);
        e.person_iss = Some(issuer);
        e.reason = Some(reason);
        p.signin_failed(&e);
        let text = format!("{source} did not confirm who you are. Nothing was changed.");
        p.message_next(
            StatusCode::BAD_REQUEST,
            None,
            "Sign-in failed",
            &[text.as_str()],
            (again.as_str(), "Start again"),
        )
    };
    if q.get("error").is_some() {
        return fail("idp_error");
    }
    if p.oidc
        .check_callback_iss(issuer, q.get("iss"))
        .await
        .is_err()
    {
        return fail("callback_iss");
    }
    let Some(code) = q.take("code").map(SecretString::new) else {
        return fail("no_code");
    };
    let identity = match p
        .oidc
        .redeem(
            issuer,
            &code,
            &SecretString::new(verifier.clone()),
            &redirect_uri(p),
            &SecretString::new(nonce.clone()),
            *max_age,
            *reauth,
            ctx.now,
        )
        .await
    {
        Ok(i) => i,
        Err(super::oidc::OidcError::NoAuthTime) => {
            return no_auth_time(p, &ctx, issuer, &source, &again)
        }
        Err(e) => {
            tracing::warn!(issuer = %issuer, error = %e, "pages: OIDC sign-in refused");
            return fail(match e {
                super::oidc::OidcError::IdToken(_) => "id_token",
                _ => "token_request",
            });
        }
    };
    let mut e = p.event(&ctx, crate::infra::events::Kind::SigninSucceeded);
    e.person_iss = Some(issuer);
    e.person_sub = Some(&identity.sub);
    e.reason = Some("oidc");
    p.audit(&e);
    let record = Record {
        iss: Some(issuer.clone()),
        sub: Some(identity.sub.clone()),
        display: Some(identity.display.clone()),
        method: Some(Method::Oidc),
        auth_time: identity.auth_time,
        created: ctx.now,
        last_seen: ctx.now,
    };
    // The redirect also takes the code out of the address bar and history.
    sign_in(p, &s, record, return_to)
}

/// `POST /signout`.
pub(crate) async fn signout(p: &Pages, ctx: Ctx, h: &HeaderMap, form: &Form) -> Response<Body> {
    let s = match p.session(h, ctx.now) {
        Ok(Some(s)) => s,
        Ok(None) => return redirect("/signin"),
        Err(e) => return p.store_failed("session", &e),
    };
    if !s.check_csrf(form.get("csrf")) {
        return p.bad_csrf();
    }
    if let Err(e) = p.sessions.delete(p.deps.store.as_ref(), &s) {
        return p.store_failed("session", &e);
    }
    if let Some(person) = s.record.person() {
        let mut e = p.event(&ctx, crate::infra::events::Kind::Signout);
        e.person_iss = Some(&person.iss);
        e.person_sub = Some(&person.sub);
        p.audit(&e);
    }
    // The way back: the page signed out of (a link, the account page),
    // through the sign-in, which returns there; without one, the sign-in
    // alone (it leads to the account page).
    let back = form.get("return_to").and_then(safe_return_to);
    let (text, next) = match back.as_deref() {
        Some(path) if path.starts_with("/connect/") => (
            "To use the link again, sign in as the person it was made for; you come back to it. Otherwise you can close this page.",
            (signin_path(path, false), "Sign in and open the link again"),
        ),
        Some(path) => (
            "You can sign in again, or close this page.",
            (signin_path(path, false), "Sign in again"),
        ),
        None => (
            "You can sign in again, or close this page.",
            ("/signin".to_string(), "Sign in again"),
        ),
    };
    let mut r = p.message_next(
        StatusCode::OK,
        None,
        "You are signed out",
        &[text],
        (&next.0, next.1),
    );
    p.clear_cookie(&mut r);
    r
}
