//! `/account`: the signed-in person's connected accounts, each by its name
//! at the provider, with the agents allowed to use it and their scopes;
//! disconnect (revoked at the provider where it can be) and revoke one
//! agent's allowance. Every POST carries the session's CSRF token.

use http::{HeaderMap, Response, StatusCode};

use super::http::{html, redirect, Form};
use super::links::Disconnected;
use super::session::Session;
use super::signin::signin_path;
use super::{views, Ctx, Pages};
use crate::accounts::subject::Person;
use crate::accounts::vault::AccountStatus;
use crate::base::http::Body;

fn signed_in(p: &Pages, ctx: Ctx, h: &HeaderMap) -> Result<(Session, Person), Response<Body>> {
    match p.session(h, ctx.now) {
        Ok(Some(s)) => match s.record.person() {
            Some(person) => Ok((s, person)),
            None => Err(redirect(&signin_path("/account", false))),
        },
        Ok(None) => Err(redirect(&signin_path("/account", false))),
        Err(e) => Err(p.store_failed("session", &e)),
    }
}

/// `GET /account`.
pub(crate) async fn page(p: &Pages, ctx: Ctx, h: &HeaderMap) -> Response<Body> {
    let (s, person) = match signed_in(p, ctx, h) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let accounts = match p.services.vault.accounts(&person) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "pages: vault unavailable");
            return p.message(
                StatusCode::SERVICE_UNAVAILABLE,
                p.who(&s),
                "Temporarily unavailable",
                &["Your accounts cannot be listed right now. Try again in a moment."],
            );
        }
    };
    let rows = accounts
        .into_iter()
        .map(|a| views::AccountRow {
            provider: p
                .services
                .providers
                .provider(&a.service)
                .map_or_else(|| a.service.clone(), |i| i.display_name),
            service: a.service,
            account_id: a.account_id,
            display_name: a.display_name,
            needs_reconnect: a.status == AccountStatus::ReconnectRequired,
            allowances: a
                .allowances
                .into_iter()
                .map(|al| views::AllowanceRow {
                    agent: al.agent,
                    scopes: al.scopes,
                })
                .collect(),
        })
        .collect();
    let page = views::Account {
        who: p.who(&s).map(|w| w.returning_to("/account")),
        accounts: rows,
        csrf: s.csrf().expose().clone(),
    };
    html(StatusCode::OK, views::render(&page))
}

/// Checks session and CSRF for an account POST and that the account named
/// in the form is one of the person's own.
fn own_account<'f>(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    form: &'f Form,
) -> Result<(Session, Person, &'f str, &'f str), Response<Body>> {
    let (s, person) = signed_in(p, ctx, h)?;
    if !s.check_csrf(form.get("csrf")) {
        return Err(p.bad_csrf());
    }
    let (Some(service), Some(account)) = (form.get("service"), form.get("account")) else {
        return Err(p.message(
            StatusCode::BAD_REQUEST,
            p.who(&s),
            "Request not understood",
            &["Nothing was changed."],
        ));
    };
    let owned = match p.services.vault.accounts(&person) {
        Ok(list) => list
            .iter()
            .any(|a| a.service == service && a.account_id == account),
        Err(e) => return Err(p.internal("vault", &e)),
    };
    if !owned {
        return Err(p.message(
            StatusCode::NOT_FOUND,
            p.who(&s),
            "No such account",
            &["Nothing was changed."],
        ));
    }
    Ok((s, person, service, account))
}

/// `POST /account/disconnect` (`service`, `account`): without `confirm=1`
/// a page that asks first (nothing changes); with it, disconnects and says
/// what was done (revoked at the provider, or deleted here only).
pub(crate) async fn disconnect(p: &Pages, ctx: Ctx, h: &HeaderMap, form: &Form) -> Response<Body> {
    let (s, person, service, account) = match own_account(p, ctx, h, form) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let name = p
        .services
        .providers
        .provider(service)
        .map_or_else(|| service.to_string(), |i| i.display_name);
    let account_name = match p.services.vault.accounts(&person) {
        Ok(list) => list
            .into_iter()
            .find(|a| a.service == service && a.account_id == account)
            .map_or_else(|| account.to_string(), |a| a.display_name),
        Err(e) => return p.internal("vault", &e),
    };
    if form.get("confirm") != Some("1") {
        let page = views::ConfirmDisconnect {
            who: p.who(&s),
            provider: name,
            display_name: account_name,
            service: service.to_string(),
            account_id: account.to_string(),
            csrf: s.csrf().expose().clone(),
        };
        return html(StatusCode::OK, views::render(&page));
    }
    let outcome = match p.services.vault.disconnect(&person, service, account).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "pages: disconnect failed");
            return p.message(
                StatusCode::SERVICE_UNAVAILABLE,
                p.who(&s),
                "Not disconnected",
                &["The account could not be disconnected right now. Nothing was changed. Try again in a moment."],
            );
        }
    };
    let mut e = p.event(&ctx, crate::infra::events::Kind::AccountDisconnected);
    e.person_iss = Some(&person.iss);
    e.person_sub = Some(&person.sub);
    e.service = Some(service);
    e.reason = Some(match outcome {
        Disconnected::Revoked => "revoked_at_provider",
        Disconnected::DeletedOnly => "deleted_not_revoked",
    });
    p.audit(&e);
    let paragraphs = match outcome {
        Disconnected::Revoked => vec![
            format!("{name} revoked credbroker's access to {account_name}, and credbroker deleted its tokens. No agent can use this account through credbroker any more."),
        ],
        Disconnected::DeletedOnly => vec![
            format!("credbroker deleted the tokens of {account_name}, and no agent can use it through credbroker any more."),
            format!("{name} did not revoke credbroker's access (it offers no way to, or did not answer): to be sure, also remove the access in your {name} settings."),
        ],
    };
    let page = views::Message {
        who: p.who(&s),
        title: match outcome {
            Disconnected::Revoked => format!("Disconnected, and revoked at {name}"),
            Disconnected::DeletedOnly => "Disconnected here, not revoked there".into(),
        },
        paragraphs,
        reference: None,
        next: Some(("/account".into(), "Back to your accounts".into())),
    };
    html(StatusCode::OK, views::render(&page))
}

/// `POST /account/revoke` (`service`, `account`, `agent`).
pub(crate) async fn revoke(p: &Pages, ctx: Ctx, h: &HeaderMap, form: &Form) -> Response<Body> {
    let (s, person, service, account) = match own_account(p, ctx, h, form) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(agent) = form.get("agent") else {
        return p.message(
            StatusCode::BAD_REQUEST,
            p.who(&s),
            "Request not understood",
            &["Nothing was changed."],
        );
    };
    if let Err(e) = p
        .services
        .vault
        .revoke_allowance(&person, service, account, agent)
    {
        tracing::warn!(error = %e, "pages: revoke failed");
        return p.message(
            StatusCode::SERVICE_UNAVAILABLE,
            p.who(&s),
            "Not revoked",
            &["Nothing was changed. Try again in a moment."],
        );
    }
    let mut e = p.event(&ctx, crate::infra::events::Kind::AllowanceRevoked);
    e.person_iss = Some(&person.iss);
    e.person_sub = Some(&person.sub);
    e.service = Some(service);
    // The event is about the agent whose allowance ends.
    e.agent = agent;
    p.audit(&e);
    redirect("/account")
}
