//! What the pages need from the connected-services side (the `connect`,
//! `vault` and `upstream` modules): three small traits, so that the browser
//! routes do not depend on how link records, the vault or the provider client
//! are built.
//!
//! - [`LinkRecords`]: resolve a code to its open link; close or decline it.
//! - [`AccountVault`]: a person's connected accounts and the agents allowed to
//!   use them; store an account, allow an agent, revoke, disconnect.
//! - [`ProviderFlow`]: the provider's authorization URL and the code exchange.
//!
//! [`ConnectedServices::none`] is what an instance has when no connected service is
//! configured: no code resolves (every link gets the 404 page) and the
//! account page lists nothing. It is a real state, not a stub: an instance
//! without `service` resources has no links to serve.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::accounts::subject::Person;
use crate::accounts::vault::AccountStatus;
use crate::base::secret::SecretString;

/// A boxed, sendable future (the traits are used as trait objects).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a link asks the person to do (docs/DESIGN.md section 5). It is the
/// link records' own type, so the pages and the records cannot disagree.
//
// The one import from `connect`, and the graph runs this way on purpose:
// the kind is part of a stored link record (it is serialised with it), so
// `connect` owns it, and the pages, a layer above the records, read it.
// `connect` knows nothing of the pages: the adapter that implements these
// traits on the real records is wiring (`app::backend`).
pub use crate::accounts::connect::LinkKind;

/// An open connect link, as the pages see it. The code is not in here: the
/// record is found by the code's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The link id (`connect_id` in refusals and events).
    pub id: String,
    /// The person the link was made for.
    pub person: Person,
    /// The agent asking.
    pub agent: String,
    /// The service (`github`), a key of the provider config.
    pub service: String,
    /// What the link is for.
    pub kind: LinkKind,
    /// The scopes asked for.
    pub scopes: Vec<String>,
    /// Unix time after which the code no longer resolves.
    pub expires: i64,
}

/// Failures of the connected-services side, as the pages need to tell them
/// apart. They carry no secrets.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The record asked for does not exist (or no longer).
    #[error("not found")]
    NotFound,
    /// The provider refused (bad code, revoked grant, `invalid_grant`).
    #[error("the provider refused: {0}")]
    Refused(String),
    /// The store or the provider is unavailable; nothing was changed.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// Link records (issue "connected services", `connect` module).
pub trait LinkRecords: Send + Sync + Debug {
    /// The open link whose code is `code`, looked up by the code's hash.
    /// Unknown, expired, declined, completed and replaced codes are all
    /// `None`, and should cost comparable time.
    fn resolve(&self, code: &SecretString, now: i64) -> Result<Option<Link>, BackendError>;
    /// The open link with this id (the provider callback re-checks it).
    fn get(&self, id: &str, now: i64) -> Result<Option<Link>, BackendError>;
    /// Closes a link after it was used: its code stops resolving.
    fn close(&self, id: &str, now: i64) -> Result<(), BackendError>;
    /// Closes a link the person declined.
    fn decline(&self, id: &str, now: i64) -> Result<(), BackendError>;
}

/// One agent allowed to use an account, with its scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowanceView {
    /// The agent.
    pub agent: String,
    /// The scopes it may use.
    pub scopes: Vec<String>,
}

/// A connected account, without its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountView {
    /// The service (`github`).
    pub service: String,
    /// The account's id at the provider.
    pub account_id: String,
    /// The account's name at the provider, as the person knows it.
    pub display_name: String,
    /// Whether it works (the vault's status, the one name for it).
    pub status: AccountStatus,
    /// The agents allowed to use it.
    pub allowances: Vec<AllowanceView>,
}

/// What a disconnect did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disconnected {
    /// Revoked at the provider (RFC 7009), then deleted.
    Revoked,
    /// Deleted here; the provider has no revocation endpoint (or it failed),
    /// so the person should also revoke it there.
    DeletedOnly,
}

/// The result of a code exchange at a provider. Tokens are secrets and go
/// straight into the vault.
#[derive(Debug)]
pub struct ProviderGrant {
    /// The account's id at the provider.
    pub account_id: String,
    /// The account's name at the provider.
    pub display_name: String,
    /// Scopes granted.
    pub scopes: Vec<String>,
    /// Access token.
    pub access_token: SecretString,
    /// The provider's `token_type` (`bearer`, `Bearer`, ...).
    pub token_type: String,
    /// Refresh token, if any.
    pub refresh_token: Option<SecretString>,
    /// Unix time the access token expires, if known.
    pub expires_at: Option<i64>,
}

/// The vault of connected accounts and allowances (`vault` module).
pub trait AccountVault: Send + Sync + Debug {
    /// The person's connected accounts, with the agents allowed on each.
    fn accounts(&self, person: &Person) -> Result<Vec<AccountView>, BackendError>;
    /// Stores (or replaces) the person's account from a provider grant and
    /// returns its id.
    fn store_account(
        &self,
        person: &Person,
        service: &str,
        grant: ProviderGrant,
        now: i64,
    ) -> Result<String, BackendError>;
    /// Allows `agent` to use the account with `scopes`.
    fn allow(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
        agent: &str,
        scopes: &[String],
        now: i64,
    ) -> Result<(), BackendError>;
    /// Revokes one agent's allowance on one account.
    fn revoke_allowance(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
        agent: &str,
    ) -> Result<(), BackendError>;
    /// Disconnects an account: revokes at the provider where possible, then
    /// deletes it and its allowances.
    fn disconnect<'a>(
        &'a self,
        person: &'a Person,
        service: &'a str,
        account_id: &'a str,
    ) -> BoxFuture<'a, Result<Disconnected, BackendError>>;
}

/// What the pages show and check about a provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The name people know it by (`GitHub`).
    pub display_name: String,
    /// The authorization endpoint (its origin goes into the CSP's
    /// `form-action`, since the connect button's answer redirects there).
    pub authorization_endpoint: url::Url,
    /// The provider's issuer identifier, for the RFC 9207 `iss` check.
    pub issuer: Option<String>,
    /// Whether the provider always sends `iss` on its redirect (RFC 9207
    /// `authorization_response_iss_parameter_supported`).
    pub sends_iss: bool,
}

/// The parameters of an authorization request at a provider.
#[derive(Debug)]
pub struct AuthorizationRequest<'a> {
    /// The service.
    pub service: &'a str,
    /// This provider's own redirect URI (one per provider).
    pub redirect_uri: &'a str,
    /// The single-use `state`.
    pub state: &'a SecretString,
    /// PKCE S256 challenge.
    pub code_challenge: &'a str,
    /// Scopes to ask for.
    pub scopes: &'a [String],
}

/// The provider client (`upstream` module): authorization URL and code
/// exchange.
pub trait ProviderFlow: Send + Sync + Debug {
    /// The provider behind `service`, if configured.
    fn provider(&self, service: &str) -> Option<ProviderInfo>;
    /// The URL to send the browser to (authorization code, PKCE S256,
    /// `state`).
    fn authorization_url(&self, req: &AuthorizationRequest<'_>) -> Result<url::Url, BackendError>;
    /// Exchanges an authorization code (with the PKCE verifier) for tokens
    /// and looks up the account's id and name.
    fn exchange_code<'a>(
        &'a self,
        service: &'a str,
        code: SecretString,
        verifier: SecretString,
        redirect_uri: &'a str,
    ) -> BoxFuture<'a, Result<ProviderGrant, BackendError>>;
    /// Revokes the tokens of a grant that will not be stored (RFC 7009,
    /// refresh token first): a connection refused after the code exchange
    /// must not leave a live grant behind. `Ok(false)`: the provider has
    /// no revocation endpoint.
    fn revoke_grant<'a>(
        &'a self,
        service: &'a str,
        grant: ProviderGrant,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;
}

/// The connected-services side as the pages use it.
#[derive(Debug, Clone)]
pub struct ConnectedServices {
    /// Link records.
    pub links: Arc<dyn LinkRecords>,
    /// The vault.
    pub vault: Arc<dyn AccountVault>,
    /// Provider clients.
    pub providers: Arc<dyn ProviderFlow>,
}

impl ConnectedServices {
    /// No connected service configured: no link resolves, no account exists.
    pub fn none() -> ConnectedServices {
        let n = Arc::new(NoServices);
        ConnectedServices {
            links: n.clone(),
            vault: n.clone(),
            providers: n,
        }
    }
}

/// The state of an instance without connected services (see the module doc).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoServices;

impl LinkRecords for NoServices {
    fn resolve(&self, _code: &SecretString, _now: i64) -> Result<Option<Link>, BackendError> {
        Ok(None)
    }
    fn get(&self, _id: &str, _now: i64) -> Result<Option<Link>, BackendError> {
        Ok(None)
    }
    fn close(&self, _id: &str, _now: i64) -> Result<(), BackendError> {
        Err(BackendError::NotFound)
    }
    fn decline(&self, _id: &str, _now: i64) -> Result<(), BackendError> {
        Err(BackendError::NotFound)
    }
}

impl AccountVault for NoServices {
    fn accounts(&self, _person: &Person) -> Result<Vec<AccountView>, BackendError> {
        Ok(Vec::new())
    }
    fn store_account(
        &self,
        _person: &Person,
        _service: &str,
        _grant: ProviderGrant,
        _now: i64,
    ) -> Result<String, BackendError> {
        Err(BackendError::NotFound)
    }
    fn allow(
        &self,
        _person: &Person,
        _service: &str,
        _account_id: &str,
        _agent: &str,
        _scopes: &[String],
        _now: i64,
    ) -> Result<(), BackendError> {
        Err(BackendError::NotFound)
    }
    fn revoke_allowance(
        &self,
        _person: &Person,
        _service: &str,
        _account_id: &str,
        _agent: &str,
    ) -> Result<(), BackendError> {
        Err(BackendError::NotFound)
    }
    fn disconnect<'a>(
        &'a self,
        _person: &'a Person,
        _service: &'a str,
        _account_id: &'a str,
    ) -> BoxFuture<'a, Result<Disconnected, BackendError>> {
        Box::pin(async { Err(BackendError::NotFound) })
    }
}

impl ProviderFlow for NoServices {
    fn provider(&self, _service: &str) -> Option<ProviderInfo> {
        None
    }
    fn authorization_url(&self, _req: &AuthorizationRequest<'_>) -> Result<url::Url, BackendError> {
        Err(BackendError::NotFound)
    }
    fn exchange_code<'a>(
        &'a self,
        _service: &'a str,
        _code: SecretString,
        _verifier: SecretString,
        _redirect_uri: &'a str,
    ) -> BoxFuture<'a, Result<ProviderGrant, BackendError>> {
        Box::pin(async { Err(BackendError::NotFound) })
    }
    fn revoke_grant<'a>(
        &'a self,
        _service: &'a str,
        _grant: ProviderGrant,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async { Err(BackendError::NotFound) })
    }
}
