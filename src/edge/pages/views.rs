//! The pages' HTML: askama templates (in `templates/`, escaped by default),
//! one struct per page. No page carries script; the stylesheet is served
//! from `/assets/credbroker.css` so the CSP can forbid inline styles too.

use askama::Template;

/// The stylesheet.
pub(crate) const CSS: &str = include_str!("templates/credbroker.css");

/// The signed-in person shown in the header, with the sign-out form's
/// CSRF token.
#[derive(Debug, Clone)]
pub struct Who {
    /// Name to show.
    pub display: String,
    /// Where they signed in: the sign-in source's `display_name` (by
    /// default the issuer's host).
    pub issuer: String,
    /// CSRF token for the sign-out form.
    pub csrf: String,
    /// The page to offer again after signing out (a connect link or an
    /// approval's link, or the account page), sent with the sign-out form
    /// and checked there against the `return_to` allow-list.
    pub return_to: Option<String>,
}

impl Who {
    /// The header of a page that signing out should lead back to.
    pub(crate) fn returning_to(mut self, path: &str) -> Who {
        self.return_to = Some(path.to_string());
        self
    }
}

/// The one page for every link that does not resolve. Rendered once: its
/// bytes are the same whatever the code and whoever asks.
#[derive(Template)]
#[template(path = "not_found.html")]
pub(crate) struct NotFound {
    /// Always `None`: the page must not vary.
    pub who: Option<Who>,
}

/// A page of text: errors, confirmations.
#[derive(Template)]
#[template(path = "message.html")]
pub(crate) struct Message {
    /// Header.
    pub who: Option<Who>,
    /// Title and heading.
    pub title: String,
    /// Paragraphs.
    pub paragraphs: Vec<String>,
    /// A correlation id for unexpected errors.
    pub reference: Option<String>,
    /// A link onward (href, label).
    pub next: Option<(String, String)>,
}

/// One way to sign in at an OIDC IdP.
#[derive(Debug, Clone)]
pub(crate) struct OidcChoice {
    /// The IdP, as shown.
    pub label: String,
    /// `/signin/oidc?...`.
    pub href: String,
}

/// The sign-in page.
#[derive(Template)]
#[template(path = "signin.html")]
pub(crate) struct SignIn {
    /// Header (normally `None`; set on re-authentication).
    pub who: Option<Who>,
    /// The broker's issuer, so people see where they sign in.
    pub broker: String,
    /// CSRF token of the (anonymous) session.
    pub csrf: String,
    /// Allow-listed path to return to.
    pub return_to: String,
    /// Re-authentication (the 15-minute rule).
    pub reauth: bool,
    /// Whether local accounts are offered.
    pub local: bool,
    /// On re-authentication, the local name (not editable).
    pub fixed_name: Option<String>,
    /// After a failed attempt, the name typed (kept in the field).
    pub typed_name: Option<String>,
    /// OIDC IdPs offered.
    pub oidc: Vec<OidcChoice>,
    /// A failure to show.
    pub error: Option<String>,
}

/// Shown when the signed-in person is not the link's person.
#[derive(Template)]
#[template(path = "other_person.html")]
pub(crate) struct OtherPerson {
    /// Header.
    pub who: Option<Who>,
    /// The signed-in person (never the link's person).
    pub you: String,
}

/// An account to choose on an `allow` page.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    /// Account id at the provider.
    pub id: String,
    /// Its name at the provider.
    pub display: String,
}

/// The page behind a link, after the five checks.
#[derive(Template)]
#[template(path = "connect.html")]
pub(crate) struct Connect {
    /// Header.
    pub who: Option<Who>,
    /// Title.
    pub heading: String,
    /// `connect`, `allow` or `reconnect`.
    pub kind: &'static str,
    /// The agent.
    pub agent: String,
    /// The service's name (`GitHub`).
    pub service_name: String,
    /// The signed-in person.
    pub you: String,
    /// Scopes asked for.
    pub scopes: Vec<String>,
    /// For `allow`: the person's accounts at the service.
    pub accounts: Vec<Choice>,
    /// The link code (it is already in the URL; the form posts back to it).
    pub code: String,
    /// CSRF token.
    pub csrf: String,
}

/// One value of a detail field, split for display (see
/// [`super::approvals::pieces`]).
#[derive(Debug, Clone)]
pub(crate) struct ShownValue {
    /// Text and named code points.
    pub pieces: Vec<super::approvals::Piece>,
    /// Its length in characters.
    pub chars: usize,
    /// Whether it is long enough to say its length.
    pub long: bool,
}

/// One detail field on the approval page.
#[derive(Debug, Clone)]
pub(crate) struct ShownFieldView {
    /// The policy's label.
    pub label: String,
    /// The values.
    pub values: Vec<ShownValue>,
}

/// One detail entry on the approval page.
#[derive(Debug, Clone)]
pub(crate) struct ShownEntryView {
    /// Its `type`.
    pub kind: String,
    /// Its fields.
    pub fields: Vec<ShownFieldView>,
}

/// The bound request on the approval page.
#[derive(Debug, Clone)]
pub(crate) struct RequestView {
    /// The method.
    pub method: String,
    /// Where it goes (`api_base` + path + query).
    pub url: ShownValue,
    /// The `Content-Type` (empty: none).
    pub content_type: ShownValue,
    /// The body's members the policy labels.
    pub fields: Vec<ShownFieldView>,
    /// The body's other members, by name.
    pub other_fields: Vec<ShownFieldView>,
    /// A body that is not a JSON object, whole.
    pub text: Option<ShownValue>,
    /// Whether the request has no body.
    pub no_body: bool,
}

/// The page behind an approval link, after the five checks.
#[derive(Template)]
#[template(path = "approval.html")]
pub(crate) struct ApprovalPage {
    /// Header.
    pub who: Option<Who>,
    /// The agent.
    pub agent: String,
    /// The tool.
    pub tool: String,
    /// The resource.
    pub resource: String,
    /// The step.
    pub step: String,
    /// Scopes of the token.
    pub scopes: Vec<String>,
    /// What one approval covers, in words.
    pub covers: String,
    /// The signed-in person.
    pub you: String,
    /// The details.
    pub entries: Vec<ShownEntryView>,
    /// The bound request, when the call carries one.
    pub request: Option<RequestView>,
    /// The code (the form posts back to it).
    pub code: String,
    /// CSRF token.
    pub csrf: String,
    /// Frozen: nothing is offered.
    pub frozen: bool,
    /// Whether a value has a code point shown by name (the footnote
    /// about them shows only then).
    pub named_any: bool,
    /// Whether a value has marked text (the footnote about marks shows
    /// only then).
    pub marked_any: bool,
}

/// One allowance row on the account page.
#[derive(Debug, Clone)]
pub(crate) struct AllowanceRow {
    /// Agent.
    pub agent: String,
    /// Scopes.
    pub scopes: Vec<String>,
}

/// One account on the account page.
#[derive(Debug, Clone)]
pub(crate) struct AccountRow {
    /// Service key (form field).
    pub service: String,
    /// Provider name (`GitHub`).
    pub provider: String,
    /// Account id (form field).
    pub account_id: String,
    /// Name at the provider.
    pub display_name: String,
    /// Whether it needs reconnecting.
    pub needs_reconnect: bool,
    /// Agents allowed.
    pub allowances: Vec<AllowanceRow>,
}

/// The account page.
#[derive(Template)]
#[template(path = "account.html")]
pub(crate) struct Account {
    /// Header.
    pub who: Option<Who>,
    /// Accounts.
    pub accounts: Vec<AccountRow>,
    /// CSRF token.
    pub csrf: String,
}

/// Asks before an account is disconnected.
#[derive(Template)]
#[template(path = "confirm_disconnect.html")]
pub(crate) struct ConfirmDisconnect {
    /// Header.
    pub who: Option<Who>,
    /// Provider name (`GitHub`).
    pub provider: String,
    /// The account's name at the provider.
    pub display_name: String,
    /// Service key (form field).
    pub service: String,
    /// Account id (form field).
    pub account_id: String,
    /// CSRF token.
    pub csrf: String,
}

/// Renders a template; a template that fails to render (it cannot, short of
/// a formatting bug) becomes a fixed text rather than a panic.
pub(crate) fn render(t: &impl Template) -> String {
    t.render().unwrap_or_else(|_| {
        "<!doctype html><title>Error</title><p>The page could not be shown.</p>".into()
    })
}
