//! `/connect/{code}` for a step-up approval (docs/APPROVALS.md): the same
//! five checks as a connect link, then the call, every declared detail with
//! its label, and Approve or Decline.
//!
//! 1. Known code of a pending approval? Otherwise the connect-link routes
//!    answer (and an unknown code gets their one 404 page).
//! 2. Signed in? 3. The approval's person? (Another person gets the 403
//!    page, nothing changes, and `approval.opened_by_other_person` is
//!    recorded.) 4. Signed in within 15 minutes?
//! 5. Only then the offer; while the broker is frozen, nothing is offered
//!    and a POST changes nothing.
//!
//! Values are shown escaped (askama), each in `<bdi>`, with invisible and
//! direction-changing code points named instead of applied, and long ones
//! wrapped by the stylesheet, never cut.

use http::{HeaderMap, Response, StatusCode};

use super::approvals::{pieces, ApprovalView};
use super::http::{html, is_code_shaped, redirect, Form};
use super::{person, views, Ctx, Pages};
use crate::base::http::Body;
use crate::base::secret::SecretString;

/// Values longer than this many characters say their length.
const LONG: usize = 200;

/// The pending approval behind `code`, if it is one (rate-limited as link
/// look-ups are); `None` lets the connect-link routes answer.
fn find(p: &Pages, ctx: Ctx, code: &str) -> Option<Result<ApprovalView, Response<Body>>> {
    if !is_code_shaped(code) {
        return None;
    }
    match p
        .approvals
        .resolve(&SecretString::new(code.to_string()), ctx.now)
    {
        Ok(Some(a)) if a.expires > ctx.now => Some(match p.limiters.lookup(ctx.client) {
            Ok(()) => Ok(a),
            Err(wait) => Err(p.too_many(wait)),
        }),
        Ok(_) => None,
        Err(e) => Some(Err(unavailable(p, &e))),
    }
}

fn unavailable(p: &Pages, e: &dyn std::fmt::Display) -> Response<Body> {
    tracing::warn!(error = %e, "pages: approvals unavailable");
    p.message(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        "Temporarily unavailable",
        &["Nothing was changed. Please try again in a moment."],
    )
}

fn event<'a>(
    p: &'a Pages,
    ctx: &Ctx,
    name: crate::infra::events::Kind,
    a: &'a ApprovalView,
) -> crate::infra::events::Event<'a> {
    let mut e = p.event(ctx, name);
    e.person_iss = Some(&a.person.iss);
    e.person_sub = Some(&a.person.sub);
    e.step = Some(&a.step);
    e.tool = Some(&a.tool);
    e.resource = Some(&a.resource);
    e.approval_id = Some(&a.id);
    e.details_sha256 = Some(&a.details_sha256);
    e.request_sha256 = a.request_sha256.as_deref();
    e.reason = Some(a.mode);
    e.approval_ttl = a.approval_ttl.clone();
    e
}

fn checked(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    code: &str,
    csrf: Option<Option<&str>>,
) -> Option<Result<(ApprovalView, super::session::Session), Response<Body>>> {
    let a = match find(p, ctx, code)? {
        Ok(a) => a,
        Err(r) => return Some(Err(r)),
    };
    let session = person::checks(p, ctx, h, code, csrf, &a.person, |_, opener| {
        let mut e = event(
            p,
            &ctx,
            crate::infra::events::Kind::ApprovalOpenedByOtherPerson,
            &a,
        );
        e.opener_iss = Some(&opener.iss);
        e.opener_sub = Some(&opener.sub);
        p.audit(&e);
    });
    Some(session.map(|s| (a, s)))
}

fn covers(a: &ApprovalView) -> String {
    match &a.covers {
        None => "this one call only; the agent must ask again for the next one".into(),
        Some(reach) => format!(
            "the same call, with the same details, from the same tool in steps named \"{}\", for {reach} from your approval",
            a.step,
        ),
    }
}

/// `GET /connect/{code}` when the code is an approval's.
pub(crate) fn open(p: &Pages, ctx: Ctx, h: &HeaderMap, code: &str) -> Option<Response<Body>> {
    let (a, session) = match checked(p, ctx, h, code, None)? {
        Ok(x) => x,
        Err(r) => return Some(r),
    };
    let entries: Vec<views::ShownEntryView> = a
        .shown
        .iter()
        .map(|e| views::ShownEntryView {
            kind: e.kind.clone(),
            fields: e.fields.iter().map(field_view).collect(),
        })
        .collect();
    let request = a.request.as_ref().map(request_view);
    let values: Vec<&views::ShownValue> = entries
        .iter()
        .flat_map(|e| &e.fields)
        .chain(
            request
                .iter()
                .flat_map(|r| r.fields.iter().chain(&r.other_fields)),
        )
        .flat_map(|f| &f.values)
        .chain(
            request
                .iter()
                .flat_map(|r| [&r.url, &r.content_type].into_iter().chain(r.text.as_ref())),
        )
        .collect();
    // A marked piece is explained by the other footnote.
    let named_any = any_piece(&values, |p| p.named && p.mark.is_empty());
    let marked_any = any_piece(&values, |p| !p.mark.is_empty());
    let page = views::ApprovalPage {
        who: p
            .who(&session)
            .map(|w| w.returning_to(&format!("/connect/{code}"))),
        agent: a.agent.clone(),
        tool: a.tool.clone(),
        resource: a.resource.clone(),
        step: a.step.clone(),
        scopes: a.scopes.clone(),
        covers: covers(&a),
        you: p.person_label(&session.record),
        code: code.to_string(),
        csrf: session.csrf().expose().clone(),
        frozen: p.approvals.frozen(),
        named_any,
        marked_any,
        entries,
        request,
    };
    Some(html(StatusCode::OK, views::render(&page)))
}

/// Whether a piece of any value passes `f`.
fn any_piece(values: &[&views::ShownValue], f: impl Fn(&super::approvals::Piece) -> bool) -> bool {
    values.iter().flat_map(|v| &v.pieces).any(f)
}

/// One value, split into pieces with its marks, and its length.
fn value_view(v: &str) -> views::ShownValue {
    let chars = v.chars().count();
    views::ShownValue {
        pieces: pieces(v),
        chars,
        long: chars > LONG,
    }
}

/// One field with its label and every value.
fn field_view(f: &crate::derive::approve::ShownField) -> views::ShownFieldView {
    views::ShownFieldView {
        label: f.label.clone(),
        values: f.values.iter().map(|v| value_view(v)).collect(),
    }
}

/// What the page shows of a bound request (docs/APPROVALS.md, "The
/// request, bound"): where it goes, its method and content type, and its
/// body whole, each value marked as the details are.
fn request_view(r: &crate::derive::approve::ShownRequest) -> views::RequestView {
    views::RequestView {
        method: r.method.clone(),
        url: value_view(&r.url),
        content_type: value_view(&r.content_type),
        fields: r.fields.iter().map(field_view).collect(),
        other_fields: r.other_fields.iter().map(field_view).collect(),
        text: r.text.as_deref().map(value_view),
        no_body: r.fields.is_empty() && r.other_fields.is_empty() && r.text.is_none(),
    }
}

/// `POST /connect/{code}` when the code is an approval's: `action` =
/// approve or decline.
pub(crate) fn act(
    p: &Pages,
    ctx: Ctx,
    h: &HeaderMap,
    code: &str,
    form: &Form,
) -> Option<Response<Body>> {
    let (a, session) = match checked(p, ctx, h, code, Some(form.get("csrf")))? {
        Ok(x) => x,
        Err(r) => return Some(r),
    };
    let approve = match form.get("action") {
        Some("approve") => true,
        Some("decline") => false,
        _ => {
            return Some(p.message(
                StatusCode::BAD_REQUEST,
                p.who(&session),
                "Request not understood",
                &["Nothing was changed."],
            ))
        }
    };
    if approve && p.approvals.frozen() {
        return Some(p.message(
            StatusCode::SERVICE_UNAVAILABLE,
            p.who(&session),
            "Nothing can be approved now",
            &["credbroker is frozen by its operators. Nothing was approved."],
        ));
    }
    match p.approvals.answer(&a.id, approve, ctx.now) {
        Ok(true) => {}
        // Answered meanwhile (another tab) or expired: nothing changed.
        Ok(false) => return Some(p.not_found()),
        Err(e) => return Some(unavailable(p, &e)),
    }
    let name = if approve {
        crate::infra::events::Kind::ApprovalGranted
    } else {
        crate::infra::events::Kind::ApprovalDeclined
    };
    p.audit(&event(p, &ctx, name, &a));
    Some(redirect(if approve {
        "/done/approved"
    } else {
        "/done/approval-declined"
    }))
}
