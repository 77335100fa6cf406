//! The connected-services side as the pages use it: the traits of
//! [`crate::edge::pages::links`] implemented on the real link store, vault and
//! provider clients.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::accounts::connect::{Link, Links};
use crate::accounts::subject::Person;
use crate::accounts::upstream::{AccountInfo, Providers, TokenSet, UpstreamError};
use crate::accounts::vault::{Vault, VaultError};
use crate::base::secret::SecretString;
use crate::edge::pages::links::{
    self as pl, AccountVault, AuthorizationRequest, BackendError, BoxFuture, ConnectedServices,
    Disconnected, LinkRecords, ProviderFlow, ProviderGrant, ProviderInfo,
};

/// How long the scopes of an authorization request are remembered for its
/// code exchange (providers may omit `scope` when they granted what was
/// asked, RFC 6749 section 5.1).
const ASKED_TTL: Duration = Duration::from_secs(15 * 60);
/// At most this many remembered requests; the oldest are dropped first.
const ASKED_MAX: usize = 10_000;

/// Whether a person is stopped (`derive::persons`): their links and
/// approval links do not resolve (404), on every replica, whatever the
/// store still holds.
#[derive(Clone)]
pub(crate) struct Stopped(Arc<dyn Fn(&Person) -> bool + Send + Sync>);

impl Stopped {
    /// From the broker's stop list; a broker that is gone stops everyone
    /// (fail closed).
    pub(crate) fn of(broker: &Arc<crate::derive::exchange::Broker>) -> Stopped {
        let weak = Arc::downgrade(broker);
        Stopped(Arc::new(move |p: &Person| {
            weak.upgrade().is_none_or(|b| b.stops.blocks_links(p))
        }))
    }

    /// No one is stopped (unit tests).
    #[cfg(test)]
    pub(crate) fn none() -> Stopped {
        Stopped(Arc::new(|_: &Person| false))
    }

    fn check(&self, p: &Person) -> bool {
        (self.0)(p)
    }
}

impl std::fmt::Debug for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stopped")
    }
}

/// The real connected-services side for the pages.
#[derive(Debug)]
pub(crate) struct Backend {
    vault: Arc<Vault>,
    links: Arc<Links>,
    providers: Arc<Providers>,
    /// PKCE challenge -> (scopes asked for, when).
    asked: DashMap<String, (Vec<String>, Instant)>,
    clock: crate::base::clock::SharedClock,
    stopped: Stopped,
}

fn unavailable(e: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable(e.to_string())
}

fn vault_err(e: VaultError) -> BackendError {
    match e {
        VaultError::NoAccount => BackendError::NotFound,
        e => unavailable(e),
    }
}

fn upstream_err(e: UpstreamError) -> BackendError {
    match e {
        UpstreamError::Rejected { error } => BackendError::Refused(error),
        e => unavailable(e),
    }
}

fn page_link(l: Link) -> pl::Link {
    pl::Link {
        person: l.person(),
        id: l.id,
        agent: l.agent,
        service: l.service,
        kind: l.kind,
        scopes: l.scopes,
        expires: l.expires,
    }
}

impl Backend {
    /// The backend over the instance's vault, links and providers.
    pub(crate) fn new(
        vault: Arc<Vault>,
        links: Arc<Links>,
        providers: Arc<Providers>,
        clock: crate::base::clock::SharedClock,
        stopped: Stopped,
    ) -> Arc<Backend> {
        Arc::new(Backend {
            vault,
            links,
            providers,
            asked: DashMap::new(),
            clock,
            stopped,
        })
    }

    /// The three trait objects the pages take.
    pub(crate) fn services(self: &Arc<Self>) -> ConnectedServices {
        ConnectedServices {
            links: self.clone(),
            vault: self.clone(),
            providers: self.clone(),
        }
    }

    fn remember(&self, challenge: &str, scopes: Vec<String>) {
        let now = Instant::now();
        self.asked
            .retain(|_, (_, at)| now.duration_since(*at) < ASKED_TTL);
        if self.asked.len() >= ASKED_MAX {
            return;
        }
        self.asked.insert(challenge.to_string(), (scopes, now));
    }

    /// Checks that `account_id` is the person's account at `service`.
    fn same_account(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
    ) -> Result<(), BackendError> {
        match self.vault.account(person, service).map_err(vault_err)? {
            Some(a) if a.account_id == account_id => Ok(()),
            _ => Err(BackendError::NotFound),
        }
    }
}

impl LinkRecords for Backend {
    fn resolve(&self, code: &SecretString, now: i64) -> Result<Option<pl::Link>, BackendError> {
        Ok(self
            .links
            .resolve(code.expose(), now)
            .map_err(unavailable)?
            .filter(|l| !self.stopped.check(&l.person()))
            .map(page_link))
    }

    fn get(&self, id: &str, now: i64) -> Result<Option<pl::Link>, BackendError> {
        Ok(self
            .links
            .get(id, now)
            .map_err(unavailable)?
            .filter(|l| !self.stopped.check(&l.person()))
            .map(page_link))
    }

    fn close(&self, id: &str, now: i64) -> Result<(), BackendError> {
        let link = self
            .links
            .get(id, now)
            .map_err(unavailable)?
            .ok_or(BackendError::NotFound)?;
        self.links.close(&link).map_err(unavailable)
    }

    fn decline(&self, id: &str, now: i64) -> Result<(), BackendError> {
        // Declining closes the link: the agent gets a new one if it asks again.
        self.close(id, now)
    }
}

impl AccountVault for Backend {
    fn accounts(&self, person: &Person) -> Result<Vec<pl::AccountView>, BackendError> {
        let mut out = Vec::new();
        for a in self.vault.accounts(Some(person)).map_err(vault_err)? {
            let allowances = self
                .vault
                .allowances(person, &a.service)
                .map_err(vault_err)?
                .into_iter()
                .map(|al| pl::AllowanceView {
                    agent: al.agent,
                    scopes: al.scopes,
                })
                .collect();
            out.push(pl::AccountView {
                display_name: a.account_name,
                account_id: a.account_id,
                status: a.status,
                service: a.service,
                allowances,
            });
        }
        Ok(out)
    }

    fn store_account(
        &self,
        person: &Person,
        service: &str,
        grant: ProviderGrant,
        now: i64,
    ) -> Result<String, BackendError> {
        let provider = self.providers.get(service).ok_or(BackendError::NotFound)?;
        let account = AccountInfo {
            id: grant.account_id.clone(),
            name: grant.display_name.clone(),
        };
        let scopes = grant.scopes.clone();
        let tokens = TokenSet {
            access_token: grant.access_token,
            token_type: grant.token_type,
            expires_in: grant.expires_at.map(|e| e - now),
            refresh_token: grant.refresh_token,
            scope: Some(scopes.clone()),
        };
        self.vault
            .connect_account(
                person,
                service,
                &provider.id(),
                &account,
                &tokens,
                &scopes,
                now,
            )
            .map_err(vault_err)?;
        Ok(account.id)
    }

    fn allow(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
        agent: &str,
        scopes: &[String],
        now: i64,
    ) -> Result<(), BackendError> {
        self.same_account(person, service, account_id)?;
        self.vault
            .allow(person, agent, service, scopes, now)
            .map(|_| ())
            .map_err(vault_err)
    }

    fn revoke_allowance(
        &self,
        person: &Person,
        service: &str,
        account_id: &str,
        agent: &str,
    ) -> Result<(), BackendError> {
        self.same_account(person, service, account_id)?;
        self.vault
            .disallow(person, agent, service)
            .map_err(vault_err)
    }

    fn disconnect<'a>(
        &'a self,
        person: &'a Person,
        service: &'a str,
        account_id: &'a str,
    ) -> BoxFuture<'a, Result<Disconnected, BackendError>> {
        Box::pin(async move {
            self.same_account(person, service, account_id)?;
            let provider = self.providers.get(service).map(|p| p.as_ref());
            // The person asked for it to go: delete even if the provider
            // could not be reached, and say it was only deleted here.
            let r = crate::accounts::connect::disconnect_account(
                &self.vault,
                provider,
                person,
                service,
                true,
            )
            .await
            .map_err(unavailable)?;
            if !r.deleted {
                return Err(BackendError::NotFound);
            }
            Ok(if r.revocation == "revoked" {
                Disconnected::Revoked
            } else {
                Disconnected::DeletedOnly
            })
        })
    }
}

impl ProviderFlow for Backend {
    fn provider(&self, service: &str) -> Option<ProviderInfo> {
        let p = self.providers.get(service)?;
        let ep = p.cached_endpoints()?;
        Some(ProviderInfo {
            display_name: p.display_name().to_string(),
            authorization_endpoint: url::Url::parse(&ep.authorization).ok()?,
            issuer: p.config().issuer.clone(),
            sends_iss: ep.sends_iss,
        })
    }

    fn authorization_url(&self, req: &AuthorizationRequest<'_>) -> Result<url::Url, BackendError> {
        let p = self
            .providers
            .get(req.service)
            .ok_or(BackendError::NotFound)?;
        if req.redirect_uri != p.config().redirect_uri {
            tracing::error!(
                service = %req.service,
                "providers.{}.redirect_uri must be the pages' callback ({}) for the pages to finish the flow",
                req.service,
                req.redirect_uri
            );
            return Err(BackendError::Unavailable(
                "the provider's redirect URI is not the pages' callback".into(),
            ));
        }
        let url = p
            .authorization_url(req.state.expose(), req.code_challenge, req.scopes, &[])
            .map_err(upstream_err)?;
        let asked: Vec<String> = url
            .query_pairs()
            .find(|(k, _)| k == "scope")
            .map(|(_, v)| v.split(' ').map(str::to_owned).collect())
            .unwrap_or_default();
        self.remember(req.code_challenge, asked);
        Ok(url)
    }

    fn exchange_code<'a>(
        &'a self,
        service: &'a str,
        code: SecretString,
        verifier: SecretString,
        redirect_uri: &'a str,
    ) -> BoxFuture<'a, Result<ProviderGrant, BackendError>> {
        Box::pin(async move {
            let p = self.providers.get(service).ok_or(BackendError::NotFound)?;
            if redirect_uri != p.config().redirect_uri {
                return Err(BackendError::Unavailable(
                    "the provider's redirect URI is not the pages' callback".into(),
                ));
            }
            let tokens = p
                .exchange_code(code.expose(), verifier.expose())
                .await
                .map_err(upstream_err)?;
            let who = p
                .account_info(tokens.access_token.expose())
                .await
                .map_err(upstream_err)?;
            let challenge = crate::accounts::upstream::pkce_challenge(verifier.expose());
            let asked = self
                .asked
                .remove(&challenge)
                .map(|(_, (s, _))| s)
                .unwrap_or_default();
            let now = self.clock.now();
            Ok(ProviderGrant {
                account_id: who.id,
                display_name: who.name,
                scopes: tokens.scope.clone().unwrap_or(asked),
                token_type: tokens.token_type,
                expires_at: tokens.expires_in.map(|s| now + s),
                access_token: tokens.access_token,
                refresh_token: tokens.refresh_token,
            })
        })
    }

    fn revoke_grant<'a>(
        &'a self,
        service: &'a str,
        grant: ProviderGrant,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let p = self.providers.get(service).ok_or(BackendError::NotFound)?;
            if p.revokes_the_grant() {
                // GitHub: deleting the grant ends every token under it.
                return match p
                    .delete_grant(grant.access_token.expose())
                    .await
                    .map_err(upstream_err)?
                {
                    crate::accounts::upstream::Revocation::Revoked => Ok(true),
                    crate::accounts::upstream::Revocation::NotSupported => Ok(false),
                };
            }
            // The refresh token first: revoking it ends the grant at most
            // providers, access tokens included.
            let tokens = grant
                .refresh_token
                .iter()
                .map(|t| (t, "refresh_token"))
                .chain(std::iter::once((&grant.access_token, "access_token")));
            for (token, hint) in tokens {
                match p.revoke(token.expose(), hint).await.map_err(upstream_err)? {
                    crate::accounts::upstream::Revocation::Revoked => {}
                    crate::accounts::upstream::Revocation::NotSupported => return Ok(false),
                }
            }
            Ok(true)
        })
    }
}

/// The approval records as the pages use them, with the broker's freeze.
pub(crate) struct ApprovalBackend {
    approvals: Arc<crate::derive::approve::Approvals>,
    frozen: Box<dyn Fn() -> bool + Send + Sync>,
    stopped: Stopped,
}

impl std::fmt::Debug for ApprovalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalBackend").finish_non_exhaustive()
    }
}

impl ApprovalBackend {
    /// The pages' view of `approvals`; `frozen` reads the broker's freeze.
    pub(crate) fn new(
        approvals: Arc<crate::derive::approve::Approvals>,
        frozen: Box<dyn Fn() -> bool + Send + Sync>,
        stopped: Stopped,
    ) -> Arc<ApprovalBackend> {
        Arc::new(ApprovalBackend {
            approvals,
            frozen,
            stopped,
        })
    }
}

impl crate::edge::pages::approvals::ApprovalRecords for ApprovalBackend {
    fn resolve(
        &self,
        code: &SecretString,
        now: i64,
    ) -> Result<Option<crate::edge::pages::approvals::ApprovalView>, BackendError> {
        let Some(a) = self
            .approvals
            .resolve(code.expose(), now)
            .map_err(unavailable)?
            .filter(|a| !self.stopped.check(&a.person()))
        else {
            return Ok(None);
        };
        Ok(Some(crate::edge::pages::approvals::ApprovalView {
            person: a.person(),
            id: a.id,
            agent: a.agent,
            step: a.step,
            tool: a.tool,
            resource: a.resource,
            scopes: a.scopes,
            mode: a.mode.as_str(),
            covers: a.mode.reach(),
            approval_ttl: a.mode.approval_ttl(),
            details_sha256: a.details_sha256,
            shown: a.shown,
            request_sha256: a.request_sha256,
            request: a.request,
            expires: a.expires,
        }))
    }

    fn answer(&self, id: &str, approve: bool, now: i64) -> Result<bool, BackendError> {
        Ok(self
            .approvals
            .answer(id, approve, now)
            .map_err(unavailable)?
            .is_some())
    }

    fn frozen(&self) -> bool {
        (self.frozen)()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::connect::tests::{alice, env, req};
    use crate::accounts::connect::LinkKind;
    use crate::edge::pages::links::{AccountVault, BackendError, LinkRecords};

    /// The pages' view of the real side: links by code and by id, accounts by
    /// their name at the provider, and allowances only on the person's own
    /// account.
    #[test]
    fn backend_serves_the_pages_traits() {
        let (dir, store, links) = env();
        let master = Arc::new(
            crate::infra::seal::Sealer::new(
                &crate::base::secret::SecretBytes::new(vec![7; 32]),
                &[],
            )
            .unwrap(),
        );
        let vault = Arc::new(
            crate::accounts::vault::Vault::open(store.clone(), master, &dir.path().join("vk"))
                .unwrap(),
        );
        let links = Arc::new(links);
        let clock: crate::base::clock::SharedClock = crate::base::clock::ManualClock::new(1000);
        let b = Backend::new(
            vault.clone(),
            links.clone(),
            Arc::new(crate::accounts::upstream::Providers::default()),
            clock,
            Stopped::none(),
        );
        let p = alice();
        let repo = vec!["repo".to_string()];
        let l = links
            .open_link(&req(&p, LinkKind::Connect, &repo), 1000)
            .unwrap();
        let seen = b.resolve(&l.code, 1001).unwrap().unwrap();
        assert_eq!(
            (seen.id.as_str(), seen.person.sub.as_str()),
            (l.link.id.as_str(), "alice")
        );
        assert_eq!(b.get(&l.link.id, 1001).unwrap().unwrap().scopes, repo);
        assert!(b.get("not-an-id", 1001).unwrap().is_none());

        // No provider named `github` here: storing refuses; the vault can still
        // be filled directly and is then listed.
        let tokens = crate::accounts::upstream::TokenSet {
            access_token: SecretString::new("at".into()),
            token_type: "Bearer".into(),
            expires_in: None,
            refresh_token: None,
            scope: Some(repo.clone()),
        };
        let grant = crate::edge::pages::links::ProviderGrant {
            account_id: "42".into(),
            display_name: "octo".into(),
            scopes: repo.clone(),
            access_token: SecretString::new("at".into()),
            token_type: "Bearer".into(),
            refresh_token: None,
            expires_at: None,
        };
        assert!(matches!(
            b.store_account(&p, "github", grant, 1000),
            Err(BackendError::NotFound)
        ));
        let who = crate::accounts::upstream::AccountInfo {
            id: "42".into(),
            name: "octo".into(),
        };
        vault
            .connect_account(&p, "github", "gh", &who, &tokens, &repo, 1000)
            .unwrap();
        assert!(matches!(
            b.allow(&p, "github", "41", "repo-helper", &repo, 1002),
            Err(BackendError::NotFound)
        ));
        b.allow(&p, "github", "42", "repo-helper", &repo, 1002)
            .unwrap();
        let accounts = b.accounts(&p).unwrap();
        assert_eq!(accounts[0].display_name, "octo");
        assert_eq!(accounts[0].allowances[0].agent, "repo-helper");

        b.close(&l.link.id, 1003).unwrap();
        assert!(b.resolve(&l.code, 1004).unwrap().is_none());
        assert!(matches!(
            b.close(&l.link.id, 1005),
            Err(BackendError::NotFound)
        ));
    }
}
