//! The OAuth 2.0 client side towards third-party providers (GitHub, any
//! OpenID Connect provider): authorization URLs with PKCE (S256) and
//! `state`, code exchange, refresh, RFC 7009 revocation, the account's name,
//! and RFC 8414 / OpenID Connect discovery.

use crate::secret::SecretString;

/// Tokens from a provider's token endpoint.
#[derive(Debug)]
pub struct TokenSet {
    /// The access token.
    pub access_token: SecretString,
    /// `token_type` as the provider said it (`bearer`, `Bearer`, ...).
    pub token_type: String,
    /// Lifetime in seconds, when the provider said.
    pub expires_in: Option<i64>,
    /// A refresh token (a new one when the provider rotates them).
    pub refresh_token: Option<SecretString>,
    /// The granted scopes, when the provider said.
    pub scope: Option<Vec<String>>,
}

/// The person's account at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountInfo {
    /// The provider's stable id for the account.
    pub id: String,
    /// The name people know it by (login, e-mail).
    pub name: String,
}
