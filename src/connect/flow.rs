//! What the pages do once a link's checks have passed (docs/DESIGN.md section 5,
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
    vault.connect_account(
        &person,
        &link.service,
        &provider.id(),
        &who,
        &tokens,
        &requested,
        now,
    )?;
    vault.allow(&person, &link.agent, &link.service, &link.scopes, now)?;
    links.close(link)?;
    vault
        .account(&person, &link.service)?
        .ok_or(CompleteError::Vault(VaultError::NoAccount))
}

/// Finishes an `allow` link: the person allowed the agent.
pub fn complete_allow(
    vault: &Vault,
    links: &Links,
    link: &Link,
    now: i64,
) -> Result<(), CompleteError> {
    if link.kind != LinkKind::Allow {
        return Err(CompleteError::WrongKind);
    }
    vault.allow(
        &link.person(),
        &link.agent,
        &link.service,
        &link.scopes,
        now,
    )?;
    links.close(link)?;
    Ok(())
}

/// What a disconnect did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DisconnectReport {
    /// Whether an account was deleted.
    pub deleted: bool,
    /// `revoked`, `not_supported` (the provider has no RFC 7009 endpoint),
    /// `failed` (the provider refused or could not be reached), or
    /// `unreadable` (the stored tokens do not open, so nothing to revoke).
    pub revocation: &'static str,
    /// A sentence for the operator or the person.
    pub message: String,
}

/// Disconnects the person's account at a service: revokes its tokens at
/// the provider (RFC 7009) where it can, then deletes the account and its
/// allowances. When revocation fails the account is kept (so it can be
/// tried again) unless `force`.
pub async fn disconnect_account(
    vault: &Vault,
    provider: Option<&Provider>,
    person: &crate::subject::Person,
    service: &str,
    force: bool,
) -> Result<DisconnectReport, CompleteError> {
    if vault.account(person, service)?.is_none() {
        return Ok(DisconnectReport {
            deleted: false,
            revocation: "not_supported",
            message: "no such account".into(),
        });
    }
    let (revocation, mut message) = match (vault.tokens_to_revoke(person, service), provider) {
        (Err(VaultError::Unreadable { .. }), _) => (
            "unreadable",
            "the stored tokens do not open, so they could not be revoked; revoke the grant at the provider".to_string(),
        ),
        (Err(e), _) => return Err(e.into()),
        (Ok(_), None) => (
            "not_supported",
            format!("service {service} is no longer configured, so its tokens could not be revoked; revoke the grant at the provider"),
        ),
        (Ok(tokens), Some(p)) if p.revokes_the_grant() => {
            // GitHub: one call deletes the grant, and with it every token
            // issued under it (access and refresh).
            let name = p.display_name();
            match tokens.iter().find(|(_, hint)| *hint == "access_token") {
                None => (
                    "failed",
                    format!("no access token was stored, so the grant at {name} could not be deleted; revoke it in your {name} settings"),
                ),
                Some((token, _)) => match p.delete_grant(token.expose()).await {
                    Ok(crate::upstream::Revocation::Revoked) => (
                        "revoked",
                        format!("revoked at {name}: the application grant was deleted, so every token {name} issued to credbroker for this account (access and refresh) stopped working"),
                    ),
                    Ok(crate::upstream::Revocation::NotSupported) => (
                        "not_supported",
                        format!("{name} has no grant API configured; revoke the grant in your {name} settings"),
                    ),
                    Err(e) => (
                        "failed",
                        format!("the grant at {name} was not deleted ({e}); revoke it in your {name} settings"),
                    ),
                },
            }
        }
        (Ok(tokens), Some(p)) => {
            // Which kinds were revoked (refresh first, then access tokens).
            let mut kinds: Vec<String> = tokens.iter().map(|(_, h)| h.replace('_', " ")).collect();
            kinds.dedup();
            let mut outcome = (
                "revoked",
                format!(
                    "revoked at {}: the {} (RFC 7009)",
                    p.display_name(),
                    kinds.join(" and the ")
                ),
            );
            for (token, hint) in &tokens {
                match p.revoke(token.expose(), hint).await {
                    Ok(crate::upstream::Revocation::Revoked) => {}
                    Ok(crate::upstream::Revocation::NotSupported) => {
                        outcome = (
                            "not_supported",
                            format!("{} has no revocation endpoint; revoke the grant in your {} settings", p.display_name(), p.display_name()),
                        );
                        break;
                    }
                    Err(e) => {
                        outcome = ("failed", format!("revocation at {} failed: {e}", p.display_name()));
                        break;
                    }
                }
            }
            outcome
        }
    };
    if revocation == "failed" && !force {
        message.push_str("; the account was kept (retry, or force the deletion)");
        return Ok(DisconnectReport {
            deleted: false,
            revocation,
            message,
        });
    }
    let deleted = vault.delete_account(person, service)?;
    message.push_str("; the account and its allowances were deleted");
    Ok(DisconnectReport {
        deleted,
        revocation,
        message,
    })
}
