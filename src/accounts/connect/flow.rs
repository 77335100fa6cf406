//! Disconnecting an account: revoke at the provider, then delete. (A link
//! is finished by the pages through `app::backend::Backend`.)

use crate::accounts::upstream::Provider;
use crate::accounts::vault::{Vault, VaultError};

/// Errors disconnecting an account.
#[derive(Debug, thiserror::Error)]
pub enum DisconnectError {
    /// The vault failed.
    #[error(transparent)]
    Vault(#[from] VaultError),
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
    person: &crate::accounts::subject::Person,
    service: &str,
    force: bool,
) -> Result<DisconnectReport, DisconnectError> {
    if vault.account(person, service)?.is_none() {
        return Ok(DisconnectReport {
            deleted: false,
            revocation: "not_supported",
            message: "no such account".into(),
        });
    }
    let (revocation, mut message) = revoke_at_provider(vault, provider, person, service).await?;
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

/// Revokes the account's tokens at its provider: GitHub's grant API for
/// the GitHub preset, else RFC 7009 for each stored token (refresh first)
/// where the provider has a revocation endpoint. Returns the outcome
/// (`revoked`, `not_supported`, `failed`, `unreadable`) and a sentence; the
/// account itself is left as it is.
pub(crate) async fn revoke_at_provider(
    vault: &Vault,
    provider: Option<&Provider>,
    person: &crate::accounts::subject::Person,
    service: &str,
) -> Result<(&'static str, String), DisconnectError> {
    Ok(match (vault.tokens_to_revoke(person, service), provider) {
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
                    Ok(crate::accounts::upstream::Revocation::Revoked) => (
                        "revoked",
                        format!("revoked at {name}: the application grant was deleted, so every token {name} issued to credbroker for this account (access and refresh) stopped working"),
                    ),
                    Ok(crate::accounts::upstream::Revocation::NotSupported) => (
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
                    Ok(crate::accounts::upstream::Revocation::Revoked) => {}
                    Ok(crate::accounts::upstream::Revocation::NotSupported) => {
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
    })
}
