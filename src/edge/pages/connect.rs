//! `/connect/{code}`: the five checks of docs/DESIGN.md section 5, in order, then
//! the page for the link's kind and its actions; and the provider callback.
//!
//! 1. Known code, still open? Otherwise the one 404 page (the same bytes for
//!    unknown, expired, declined, used and replaced codes).
//! 2. Signed in? Otherwise sign in and come back (`return_to`).
//! 3. The link's person? Otherwise a 403 page that does not say whose link
//!    it is; nothing changes, the link stays open for its person, and
//!    `connect.opened_by_other_person` is recorded.
//! 4. Signed in within the last 15 minutes (`auth_time`)? Otherwise sign in
//!    again (`max_age=900`, `prompt=login` at an IdP).
//! 5. Only then: connect, allow or reconnect, or decline.
//!
//! A POST runs the same checks again (the link may have changed since the
//! page was shown) plus the CSRF token, before it acts. The provider
//! callback re-checks the session, the person and the link before storing
//! anything. The pages never redirect to an address the agent chose: the
//! end is a page saying to go back to the agent.

use http::{HeaderMap, Response, StatusCode};

use super::http::{html, html_with, is_code_shaped, redirect, Form};
use super::links::{AccountView, AuthorizationRequest, Link, LinkKind, ProviderInfo};
use super::session::Session;
use super::{flows, person, views, Ctx, Pages};
use crate::base::http::Body;
use crate::base::secret::SecretString;

/// The checks passed: the link and the signed-in session of its person.
struct Passed {
    link: Link,
    session: Session,
}

/// Checks 1 to 4 (and the CSRF token when `csrf` is given).
fn checks(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    code: &str,
    csrf: Option<Option<&str>>,
) -> Result<Passed, Response<Body>> {
    if let Err(wait) = p.limiters.lookup(ctx.client) {
        return Err(p.too_many(wait));
    }
    // 1. Known code, still open. A string of the wrong shape cannot be a
    // code; answering it without a look-up tells nothing the format does not.
    if !is_code_shaped(code) {
        return Err(p.not_found());
    }
    let secret = SecretString::new(code.to_string());
    let link = match p.services.links.resolve(&secret, ctx.now) {
        Ok(Some(l)) if l.expires > ctx.now => l,
        Ok(_) => return Err(p.not_found()),
        Err(e) => return Err(unavailable(p, &e)),
    };
    let session = person::checks(p, ctx, h, code, csrf, &link.person, |_, person| {
        let mut e = link_event(
            p,
            &ctx,
            crate::infra::events::Kind::ConnectOpenedByOtherPerson,
            &link,
        );
        e.opener_iss = Some(&person.iss);
        e.opener_sub = Some(&person.sub);
        p.audit(&e);
    })?;
    Ok(Passed { link, session })
}

fn unavailable(p: &Pages, e: &dyn std::fmt::Display) -> Response<Body> {
    tracing::warn!(error = %e, "pages: connected services unavailable");
    p.message(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        "Temporarily unavailable",
        &["Nothing was changed. Please try again in a moment."],
    )
}

fn service_name(p: &Pages, service: &str) -> String {
    p.services
        .providers
        .provider(service)
        .map_or_else(|| service.to_string(), |i| i.display_name)
}

/// `GET /connect/{code}`.
pub(crate) async fn open(p: &Pages, ctx: Ctx, h: &HeaderMap, code: &str) -> Response<Body> {
    let Passed { link, session } = match checks(p, ctx, h, code, None) {
        Ok(x) => x,
        Err(r) => return r,
    };
    // 5. The page for the link's kind.
    let person = link.person.clone();
    let accounts = if link.kind == LinkKind::Allow {
        match p.services.vault.accounts(&person) {
            Ok(list) => list
                .into_iter()
                .filter(|a| a.service == link.service)
                .map(|a| views::Choice {
                    id: a.account_id,
                    display: a.display_name,
                })
                .collect(),
            Err(e) => return unavailable(p, &e),
        }
    } else {
        Vec::new()
    };
    let provider = p.services.providers.provider(&link.service);
    let name = service_name(p, &link.service);
    let heading = match link.kind {
        LinkKind::Connect => format!("Connect {name} for {}", link.agent),
        LinkKind::Allow => format!("Allow {} to use {name}", link.agent),
        LinkKind::Reconnect => format!("Reconnect {name} for {}", link.agent),
    };
    let page = views::Connect {
        who: p
            .who(&session)
            .map(|w| w.returning_to(&format!("/connect/{code}"))),
        heading,
        kind: link.kind.as_str(),
        agent: link.agent.clone(),
        service_name: name,
        you: p.person_label(&session.record),
        scopes: link.scopes.clone(),
        accounts,
        code: code.to_string(),
        csrf: session.csrf().expose().clone(),
    };
    // The connect button's answer redirects to the provider: let the CSP's
    // form-action allow exactly that origin.
    let origin = provider.map(|i| i.authorization_endpoint.origin().ascii_serialization());
    html_with(StatusCode::OK, views::render(&page), origin.as_deref())
}

/// `POST /connect/{code}`: `action` = connect, allow, reconnect or decline.
pub(crate) async fn act(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    code: &str,
    form: Form,
) -> Response<Body> {
    let Passed { link, session } = match checks(p, ctx, h, code, Some(form.get("csrf"))) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let action = form.get("action").unwrap_or("");
    match (action, link.kind) {
        ("decline", _) => {
            if let Err(e) = p.services.links.decline(&link.id, ctx.now) {
                return unavailable(p, &e);
            }
            let e = link_event(p, &ctx, crate::infra::events::Kind::ConnectDeclined, &link);
            p.audit(&e);
            redirect("/done/declined")
        }
        ("allow", LinkKind::Allow) => allow(p, ctx, &link, form.get("account").unwrap_or("")),
        ("connect", LinkKind::Connect | LinkKind::Allow) | ("reconnect", LinkKind::Reconnect) => {
            start_provider_flow(p, ctx, &link, &session)
        }
        _ => p.message(
            StatusCode::BAD_REQUEST,
            p.who(&session),
            "Request not understood",
            &["Nothing was changed."],
        ),
    }
}

fn allow(p: &Pages, ctx: Ctx, link: &Link, account: &str) -> Response<Body> {
    // Only one of the person's own accounts at this service.
    let owned = match p.services.vault.accounts(&link.person) {
        Ok(list) => list
            .into_iter()
            .any(|a| a.service == link.service && a.account_id == account),
        Err(e) => return unavailable(p, &e),
    };
    if !owned {
        return p.message(
            StatusCode::BAD_REQUEST,
            None,
            "Request not understood",
            &["Nothing was changed."],
        );
    }
    if let Err(e) = p.services.vault.allow(
        &link.person,
        &link.service,
        account,
        &link.agent,
        &link.scopes,
        ctx.now,
    ) {
        return unavailable(p, &e);
    }
    completed(p, ctx, link, "allowed")
}

/// Closes the link, records `connect.completed` and sends the browser to
/// `/done/{what}/{service}`, the end page that names the service, the
/// account and the agent ([`finished`]).
fn completed(p: &Pages, ctx: Ctx, link: &Link, what: &str) -> Response<Body> {
    if let Err(e) = p.services.links.close(&link.id, ctx.now) {
        // The allowance is recorded; a link left open only expires later.
        tracing::warn!(error = %e, "pages: link not closed");
    }
    let mut e = link_event(p, &ctx, crate::infra::events::Kind::ConnectCompleted, link);
    let scope = link.scopes.join(" ");
    e.scope = Some(&scope);
    p.audit(&e);
    let seg: String = url::form_urlencoded::byte_serialize(link.service.as_bytes()).collect();
    redirect(&format!("/done/{what}/{seg}"))
}

/// This provider's own redirect URI.
pub(crate) fn provider_redirect_uri(p: &Pages, service: &str) -> String {
    let seg: String = url::form_urlencoded::byte_serialize(service.as_bytes()).collect();
    format!("{}/callback/{seg}", p.base())
}

fn start_provider_flow(p: &Pages, ctx: Ctx, link: &Link, session: &Session) -> Response<Body> {
    if p.services.providers.provider(&link.service).is_none() {
        return unavailable(p, &"provider not configured");
    }
    let (verifier, challenge) = match flows::pkce() {
        Ok(x) => x,
        Err(e) => return p.internal("random", &e),
    };
    let redirect_uri = provider_redirect_uri(p, &link.service);
    let flow = flows::Flow::Provider {
        link_id: link.id.clone(),
        kind: link.kind,
        service: link.service.clone(),
        verifier: verifier.expose().clone(),
        redirect_uri: redirect_uri.clone(),
    };
    let state = match flows::start(
        p.deps.store.as_ref(),
        &p.sealer,
        &session.key_hex(),
        flow,
        ctx.now,
    ) {
        Ok(s) => s,
        Err(e) => return p.store_failed("flow", &e),
    };
    let req = AuthorizationRequest {
        service: &link.service,
        redirect_uri: &redirect_uri,
        state: &state,
        code_challenge: &challenge,
        scopes: &link.scopes,
    };
    match p.services.providers.authorization_url(&req) {
        Ok(u) => redirect(u.as_str()),
        Err(e) => unavailable(p, &e),
    }
}

fn flow_failed(p: &Pages, who: Option<views::Who>) -> Response<Body> {
    p.message(
        StatusCode::BAD_REQUEST,
        who,
        "This connection attempt is not valid",
        &["It was already used, took too long, came back from another service, or was started in another browser. Nothing was connected. Open the link from your agent again."],
    )
}

/// `GET /callback/{service}?code=...&state=...[&iss=...]`: the provider's
/// answer. State first (single use, bound to this session), then the
/// service (mix-up), `iss` (RFC 9207), the person and the link, and only
/// then the code exchange.
pub(crate) async fn provider_callback(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    service_seg: &str,
    mut q: Form,
) -> Response<Body> {
    if let Err(wait) = p.limiters.lookup(ctx.client) {
        return p.too_many(wait);
    }
    let service: String =
        match url::form_urlencoded::parse(format!("s={service_seg}").as_bytes()).next() {
            Some((_, v)) => v.into_owned(),
            None => return p.not_found(),
        };
    let store = p.deps.store.as_ref();
    let Some(state) = q.get("state").map(str::to_owned) else {
        return flow_failed(p, None);
    };
    let taken = match flows::take(store, &p.sealer, &state, ctx.now) {
        Ok(Some(t)) => t,
        Ok(None) => return flow_failed(p, None),
        Err(e) => return p.store_failed("flow", &e),
    };
    let session = match p.session(h, ctx.now) {
        Ok(Some(s)) if s.key_hex() == taken.session && s.record.person().is_some() => s,
        Ok(_) => return flow_failed(p, None),
        Err(e) => return p.store_failed("session", &e),
    };
    let who = p.who(&session);
    let flows::Flow::Provider {
        link_id,
        kind,
        service: flow_service,
        verifier,
        redirect_uri,
    } = &taken.flow
    else {
        return flow_failed(p, who);
    };
    // Mix-up: an answer must come back on its own provider's redirect URI.
    if *flow_service != service {
        tracing::warn!(expected = %flow_service, got = %service, "pages: provider callback on the wrong redirect URI");
        return flow_failed(p, who);
    }
    let Some(info) = p.services.providers.provider(&service) else {
        return flow_failed(p, who);
    };
    if crate::base::oauth::check_callback_iss(info.issuer.as_deref(), info.sends_iss, q.get("iss"))
        .is_err()
    {
        return flow_failed(p, who);
    }
    let Some(person) = session.record.person() else {
        return flow_failed(p, who);
    };
    // The link: still open, same kind, same person.
    let link = match p.services.links.get(link_id, ctx.now) {
        Ok(Some(l))
            if l.kind == *kind
                && l.person == person
                && l.service == service
                && l.expires > ctx.now =>
        {
            l
        }
        Ok(_) => return p.not_found(),
        Err(e) => return unavailable(p, &e),
    };
    if q.get("error").is_some() {
        // The person said no at the provider: the link stays open.
        return p.message(
            StatusCode::OK,
            who,
            &format!("{} was not connected", info.display_name),
            &["You can open the link again from your agent if you change your mind."],
        );
    }
    let Some(code) = q.take("code").map(SecretString::new) else {
        return flow_failed(p, who);
    };
    let Ok(grant) = exchange(p, &service, code, verifier, redirect_uri).await else {
        return exchanged_nothing(p, who, &info.display_name);
    };
    store_grant(p, ctx, &person, &service, &link, grant).await
}

/// The code exchange at the provider (a failure is logged).
async fn exchange(
    p: &Pages,
    service: &str,
    code: SecretString,
    verifier: &str,
    redirect_uri: &str,
) -> Result<super::links::ProviderGrant, ()> {
    p.services
        .providers
        .exchange_code(
            service,
            code,
            SecretString::new(verifier.to_string()),
            redirect_uri,
        )
        .await
        .map_err(|e| {
            tracing::warn!(service = %service, error = %e, "pages: provider code exchange failed");
        })
}

/// The page of a failed code exchange: nothing was connected.
fn exchanged_nothing(p: &Pages, who: Option<views::Who>, provider: &str) -> Response<Body> {
    p.message(
        StatusCode::BAD_GATEWAY,
        who,
        &format!("{provider} did not complete the connection"),
        &["Nothing was connected. Open the link from your agent again."],
    )
}

/// Stores the account the provider granted and the link's allowance, then
/// redirects to the end page (which takes the code out of the address bar
/// and history).
async fn store_grant(
    p: &Pages,
    ctx: Ctx,
    person: &crate::accounts::subject::Person,
    service: &str,
    link: &Link,
    grant: super::links::ProviderGrant,
) -> Response<Body> {
    // The account that came back must be the one connected, if there is
    // one: storing another would silently hand every allowance on the old
    // account to a different account at the provider (a reconnect signed
    // in as someone else there, or a connect that finds an account
    // connected since the link was made). Only an allow link's "connect
    // another account" button asks for a replacement.
    if link.kind != LinkKind::Allow {
        let connected = match p.services.vault.accounts(person) {
            Ok(list) => list.into_iter().find(|a| a.service == service),
            Err(e) => return unavailable(p, &e),
        };
        if connected.is_some_and(|a| a.account_id != grant.account_id) {
            return different_account(p, ctx, link, grant).await;
        }
    }
    let account = match p
        .services
        .vault
        .store_account(person, service, grant, ctx.now)
    {
        Ok(a) => a,
        Err(e) => return unavailable(p, &e),
    };
    if let Err(e) = p.services.vault.allow(
        person,
        service,
        &account,
        &link.agent,
        &link.scopes,
        ctx.now,
    ) {
        return unavailable(p, &e);
    }
    // The redirect takes the code out of the address bar and history.
    completed(
        p,
        ctx,
        link,
        if link.kind == LinkKind::Reconnect {
            "reconnected"
        } else {
            "connected"
        },
    )
}

/// The provider signed the person in as another account than the one
/// connected: nothing is stored, the tokens just issued are revoked, and
/// the link stays open (the person can try again with the right account).
/// The answer is a redirect, which takes the code out of the address bar,
/// to a page that names the connected account.
async fn different_account(
    p: &Pages,
    ctx: Ctx,
    link: &Link,
    grant: super::links::ProviderGrant,
) -> Response<Body> {
    if let Err(e) = p
        .services
        .providers
        .revoke_grant(&link.service, grant)
        .await
    {
        tracing::warn!(service = %link.service, error = %e, "pages: the grant of a refused account was not revoked");
    }
    let e = link_event(
        p,
        &ctx,
        crate::infra::events::Kind::ConnectDifferentAccount,
        link,
    );
    p.audit(&e);
    let seg: String = url::form_urlencoded::byte_serialize(link.service.as_bytes()).collect();
    redirect(&format!("/done/other-account/{seg}"))
}

/// `GET /done/other-account/{service}`: after [`different_account`]. It
/// names only what the signed-in person's own records say (never anything
/// from the address).
fn other_account(p: &Pages, ctx: Ctx, h: &HeaderMap, service_seg: &str) -> Response<Body> {
    let Some((service, info)) = named_service(p, service_seg) else {
        return p.not_found();
    };
    let name = info.display_name;
    let session = p.session(h, ctx.now).ok().flatten();
    let connected = own_account(p, session.as_ref(), &service).map(|a| a.display_name);
    let who = session.as_ref().and_then(|s| p.who(s));
    let mut paragraphs = vec![format!(
        "At {name} you signed in with another account than the one connected for you. Nothing was changed, and credbroker did not keep the access {name} gave for that account."
    )];
    paragraphs.push(match connected {
        Some(old) => format!("Your connected {name} account is {old}. To continue with it, open the link from your agent again and sign in at {name} as {old}. To use the other account instead, first disconnect {old} on your accounts page."),
        None => "Open the link from your agent again.".to_string(),
    });
    html(
        StatusCode::CONFLICT,
        views::render(&views::Message {
            who,
            title: format!("This is not your connected {name} account"),
            paragraphs,
            reference: None,
            next: Some(("/account".into(), "See your connected accounts".into())),
        }),
    )
}

/// `GET /done/{connected,reconnected,allowed}/{service}`: the end of a link
/// that connected or allowed an account, naming the service, the account
/// and the agent. The address gives only the service; the account and
/// whether the agent may use it come from the signed-in person's own
/// records, so a crafted address cannot make the page claim anything the
/// records do not say (without a session, or without such an account, the
/// page says only what `/done/{what}` says).
fn finished(p: &Pages, ctx: Ctx, h: &HeaderMap, kind: &str, service_seg: &str) -> Response<Body> {
    let Some((service, info)) = named_service(p, service_seg) else {
        return p.not_found();
    };
    let session = p.session(h, ctx.now).ok().flatten();
    let agent = &p.deps.agent;
    let account = own_account(p, session.as_ref(), &service)
        .filter(|a| a.allowances.iter().any(|al| &al.agent == agent));
    let Some(account) = account else {
        return done(p, ctx, h, kind);
    };
    let (name, acct) = (&info.display_name, &account.display_name);
    let (title, text) = match kind {
        "reconnected" => (
            format!("{name} reconnected"),
            format!("Your {name} account {acct} works again, and {agent} may use it."),
        ),
        "allowed" => (
            format!("{agent} may use {name}"),
            format!("{agent} may now use your {name} account {acct}."),
        ),
        _ => (
            format!("{name} connected"),
            format!("Your {name} account {acct} is connected, and {agent} may use it."),
        ),
    };
    let who = session.as_ref().and_then(|s| p.who(s));
    let body = views::render(&views::Message {
        who,
        title,
        paragraphs: vec![
            text,
            format!("Go back to your agent, {agent}: it continues when it tries again. You can close this page."),
        ],
        reference: None,
        // The account page, where access can be revoked.
        next: Some(("/account".into(), "See your connected accounts".into())),
    });
    html(StatusCode::OK, body)
}

/// The service a `/done/.../{service}` address names (percent-decoded) and
/// its provider; `None` for a service this broker does not have.
fn named_service(p: &Pages, service_seg: &str) -> Option<(String, ProviderInfo)> {
    let query = format!("s={service_seg}");
    let (_, service) = url::form_urlencoded::parse(query.as_bytes()).next()?;
    let service = service.into_owned();
    let info = p.services.providers.provider(&service)?;
    Some((service, info))
}

/// The signed-in person's own account at `service`, from their records
/// (never from the address).
fn own_account(p: &Pages, session: Option<&Session>, service: &str) -> Option<AccountView> {
    let person = session?.record.person()?;
    let accounts = p.services.vault.accounts(&person).ok()?;
    accounts.into_iter().find(|a| a.service == service)
}

/// `GET /done/{what}`: the end of a link. It says to go back to the agent;
/// it never sends the browser anywhere the agent chose.
pub(crate) fn done(p: &Pages, ctx: Ctx, h: &HeaderMap, what: &str) -> Response<Body> {
    if let Some(service) = what.strip_prefix("other-account/") {
        return other_account(p, ctx, h, service);
    }
    for kind in ["connected", "reconnected", "allowed"] {
        if let Some(service) = what
            .strip_prefix(kind)
            .and_then(|rest| rest.strip_prefix('/'))
        {
            return finished(p, ctx, h, kind, service);
        }
    }
    let (title, text) = match what {
        "connected" => (
            "Connected",
            "Your account is connected and the agent may use it.",
        ),
        "reconnected" => ("Reconnected", "Your account works again."),
        "allowed" => ("Allowed", "The agent may now use your account."),
        "declined" => ("Declined", "Nothing was connected or allowed."),
        "approved" => (
            "Approved",
            "The agent may now make the call you approved, and only that call.",
        ),
        "approval-declined" => (
            "Declined",
            "The call was not approved; the agent cannot make it.",
        ),
        _ => return p.not_found(),
    };
    let who = p.session(h, ctx.now).ok().flatten().and_then(|s| p.who(&s));
    let body = views::render(&views::Message {
        who,
        title: title.into(),
        paragraphs: vec![
            text.into(),
            "Go back to your agent: it continues when it tries again. You can close this page."
                .into(),
        ],
        reference: None,
        // Offer the account page, where access can be revoked.
        next: (what != "declined" && !what.starts_with("approv"))
            .then(|| ("/account".into(), "See your connected accounts".into())),
    });
    html(StatusCode::OK, body)
}

/// An event about `link`: its person, service, id and kind.
fn link_event<'a>(
    p: &'a Pages,
    ctx: &Ctx,
    name: crate::infra::events::Kind,
    link: &'a Link,
) -> crate::infra::events::Event<'a> {
    let mut e = p.event(ctx, name);
    e.person_iss = Some(&link.person.iss);
    e.person_sub = Some(&link.person.sub);
    e.service = Some(&link.service);
    e.connect_id = Some(&link.id);
    e.reason = Some(link.kind.as_str());
    e
}
