//! The pages' person checks, in one place: signed in, as the person a
//! connect link or an approval was made for, recently. The connect-link
//! pages ([`super::connect`]) and the approval pages ([`super::approval`])
//! both run them as their checks 2 to 4.

use http::{HeaderMap, Response, StatusCode};

use super::http::{html, redirect};
use super::oidc::{MAX_AGE, SKEW};
use super::session::Session;
use super::signin::signin_path;
use super::{views, Ctx, Pages};
use crate::base::http::Body;

/// Checks 2 to 4 for a link or an approval made for `owner` (and the CSRF
/// token when `csrf` is given): signed in, as `owner`, recently. Another
/// person gets the 403 page after `other_person` recorded the event.
pub(super) fn checks(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    code: &str,
    csrf: Option<Option<&str>>,
    owner: &crate::accounts::subject::Person,
    other_person: impl FnOnce(&Session, &crate::accounts::subject::Person),
) -> Result<Session, Response<Body>> {
    let return_to = format!("/connect/{code}");
    // 2. Signed in.
    let session = match p.session(h, ctx.now) {
        Ok(Some(s)) if s.record.person().is_some() => s,
        Ok(_) => return Err(redirect(&signin_path(&return_to, false))),
        Err(e) => return Err(p.store_failed("session", &e)),
    };
    if let Some(token) = csrf {
        if !session.check_csrf(token) {
            return Err(p.bad_csrf());
        }
    }
    // 3. The owner.
    let Some(person) = session.record.person() else {
        return Err(redirect(&signin_path(&return_to, false)));
    };
    if person != *owner {
        other_person(&session, &person);
        let page = views::OtherPerson {
            // Signing out here leads back to this link, to sign in as the
            // person it was made for.
            who: p.who(&session).map(|w| w.returning_to(&return_to)),
            you: p.person_label(&session.record),
        };
        return Err(html(StatusCode::FORBIDDEN, views::render(&page)));
    }
    // 4. Signed in recently.
    let fresh = session
        .record
        .auth_time
        .is_some_and(|t| ctx.now - t <= MAX_AGE && t <= ctx.now + SKEW);
    if !fresh {
        return Err(redirect(&signin_path(&return_to, true)));
    }
    Ok(session)
}
