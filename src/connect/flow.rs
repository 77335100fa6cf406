//! What the pages do once a link's checks have passed (DESIGN section 5,
//! check 5 and the provider callback): store the account, allow the agent,
//! close the link. The browser routes (sign-in, sessions, CSRF, `state`
//! storage) belong to the pages; these functions are the part below them.

use super::{ConnectError, Link, LinkKind, Links};
use crate::upstream::{Provider, UpstreamError};
use crate::vault::{Account, Vault, VaultError};

/// Errors finishing a link.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    /// The provider refused or failed.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The vault failed.
    #[error(transparent)]
    Vault(#[from] VaultError),
    /// The link store failed.
    #[error(transparent)]
    Links(#[from] ConnectError),
    /// A reconnect signed in to another account at the provider than the
    /// one connected: nothing is changed.
    #[error("the account at the provider is not the one that was connected")]
    DifferentAccount,
    /// The link is not of a kind this function finishes.
    #[error("the link is of another kind")]
    WrongKind,
}

/// The scopes to ask the provider for: the provider's default scopes and
/// the link's, without duplicates.
pub fn scopes_to_request(provider: &Provider, link: &Link) -> Vec<String> {
    let mut v: Vec<String> = provider.config().scopes.clone();
    for s in &link.scopes {
        if !v.contains(s) {
            v.push(s.clone());
        }
    }
    v
}

/// Finishes a `connect` or `reconnect` link after the provider callback:
/// exchanges the code (with its PKCE verifier), reads the account's name,
/// stores the account, allows the link's agent its scopes, and closes the
/// link. A reconnect must come back with the same provider account.
pub async fn complete_connect(
    vault: &Vault,
    links: &Links,
    provider: &Provider,
    link: &Link,
    code: &str,
    verifier: &str,
    now: i64,
) -> Result<Account, CompleteError> {
    if link.kind == LinkKind::Allow {
        return Err(CompleteError::WrongKind);
    }
    let person = link.person();
    let tokens = provider.exchange_code(code, verifier).await?;
    let who = provider.account_info(tokens.access_token.expose()).await?;
    if link.kind == LinkKind::Reconnect {
        if let Some(old) = vault.account(&person, &link.service)? {
            if old.account_id != who.id {
                return Err(CompleteError::DifferentAccount);
            }
        }
    }
    let requested = scopes_to_request(provider, link);
    vault.connect_account(&person, &link.service, &provider.id(), &who, &tokens, &requested, now)?;
    vault.allow(&person, &link.agent, &link.service, &link.scopes, now)?;
    links.close(link)?;
    vault.account(&person, &link.service)?.ok_or(CompleteError::Vault(VaultError::NoAccount))
}

/// Finishes an `allow` link: the person allowed the agent.
pub fn complete_allow(vault: &Vault, links: &Links, link: &Link, now: i64) -> Result<(), CompleteError> {
    if link.kind != LinkKind::Allow {
        return Err(CompleteError::WrongKind);
    }
    vault.allow(&link.person(), &link.agent, &link.service, &link.scopes, now)?;
    links.close(link)?;
    Ok(())
}
