//! The `service` source (step 6 of the pipeline, [`super`]): the person's
//! connected account at a third-party service, their allowance for this
//! agent, and the provider's token. The egress proxy calls
//! [`Broker::service_token`] for every proxied call, so a proxied call and
//! a derive decide alike.

use std::sync::Arc;

use crate::accounts::connect::{LinkKind, LinkRequest, Links};
use crate::accounts::subject;
use crate::accounts::upstream::{Provider, Providers};
use crate::accounts::vault::{AccountStatus, ServiceToken, TokenOutcome, TokenRequest, Vault};
use crate::base::secret::SecretString;
use crate::derive::policy::{self, Policy};
use crate::infra::events::{Event, Kind};

use super::error::{link_error, vault_error};
use super::{Broker, Ctx, DeriveError, Issued, LinkRefusal};

/// Connected services: what the `service` source needs.
#[derive(Debug)]
pub struct ConnectedServices {
    /// Accounts and allowances.
    pub vault: Arc<Vault>,
    /// Connect links.
    pub links: Arc<Links>,
    /// Providers by service name.
    pub providers: Arc<Providers>,
}

/// Whether `have` holds every scope of `want`.
fn covers(have: &[String], want: &[String]) -> bool {
    want.iter().all(|w| have.contains(w))
}

impl Broker {
    /// The `service` source (step 6 of the pipeline, [`super`]): the person's
    /// connected account and their allowance for this agent; the stored
    /// provider token, refreshed first when near expiry. Decides, in
    /// order: no account -> `connect_required`; an account that must be
    /// renewed (refresh refused, connected at another provider, fewer
    /// scopes granted than needed) -> `reconnect_required`; no allowance
    /// for this agent and these scopes -> `allow_required`. Kept apart from
    /// the `self` hot path.
    pub(super) async fn derive_service(
        &self,
        policy: &Policy,
        subject: &subject::Subject,
        grant: &policy::Grant,
        service: &str,
        now: i64,
        ctx: &mut Ctx,
    ) -> Result<(Issued, String), DeriveError> {
        let t = self
            .service_token(
                &policy.hash,
                &subject.person,
                service,
                &grant.scopes,
                None,
                now,
            )
            .await?;
        ctx.narrowed = Some(t.narrowed);
        // The stored expiry is in the database's time (`now` is).
        let expires_in = t.expires_at.map(|e| e - now);
        if expires_in.is_some_and(|s| s <= 0) {
            // Never an expired token.
            return Err(DeriveError::UpstreamUnavailable {
                service: service.to_string(),
            });
        }
        // Provider tokens have no jti: the event carries a hash of a hash
        // of the token, enough to correlate, never the token.
        let id = format!(
            "provider:{}",
            crate::base::jose::sha256_hex(t.access_token.expose().as_bytes())
        );
        Ok((
            Issued {
                access_token: t.access_token,
                expires_in,
                scope: grant.scopes.join(" "),
                token_type: std::borrow::Cow::Owned(t.token_type),
                sender_constrained: false,
                authorization_details: None,
            },
            id,
        ))
    }

    /// The service source's checks and token, for a derive and for each
    /// proxied call (step 6 of the pipeline, [`super`]): the person's account
    /// at `service` and their allowance for this agent and `scopes`, then the
    /// stored provider token, refreshed first when near expiry (or when it is
    /// `refused`, the token the provider just answered 401 to). Decides, in
    /// order: no account -> `connect_required`; an account that must be
    /// renewed (refresh refused, connected at another provider, fewer scopes
    /// granted than needed) -> `reconnect_required`; no allowance for this
    /// agent and these scopes -> `allow_required`. `policy_hash` is the
    /// caller's snapshot: a reload since it began must not make the link
    /// event name a policy that did not decide this request.
    pub async fn service_token(
        &self,
        policy_hash: &str,
        person: &subject::Person,
        service: &str,
        scopes: &[String],
        refused: Option<&str>,
        now: i64,
    ) -> Result<ServiceToken, DeriveError> {
        let Some(conn) = self.connected_services.as_ref() else {
            return Err(DeriveError::Unavailable(
                "connected services are not configured on this instance",
            ));
        };
        let Some(provider) = conn.providers.get(service) else {
            // The loader and start-up check this; a reload could still
            // name an unknown service. Fail closed.
            return Err(DeriveError::Unavailable(
                "the policy names a service that has no provider in the config",
            ));
        };
        let agent = self.config.agent.as_str();
        let refuse = |kind| {
            self.link_refusal(
                conn,
                provider,
                person,
                service,
                kind,
                scopes,
                policy_hash,
                now,
            )
        };
        // Read once: the token below starts from this same record.
        // Both reads async: on PostgreSQL their I/O stays on the thread
        // serving this request (`Store::get_async`).
        let read = conn
            .vault
            .account_read_async(person, service)
            .await
            .map_err(vault_error)?;
        let Some(read) = read else {
            return Err(refuse(LinkKind::Connect));
        };
        let a = read.account();
        if a.status == AccountStatus::ReconnectRequired
            || a.provider != provider.id()
            || !covers(&a.scopes, scopes)
        {
            return Err(refuse(LinkKind::Reconnect));
        }
        match conn
            .vault
            .allowance_async(person, agent, service)
            .await
            .map_err(vault_error)?
        {
            Some(al) if covers(&al.scopes, scopes) => {}
            _ => return Err(refuse(LinkKind::Allow)),
        }
        let request = TokenRequest {
            person,
            service,
            scopes,
        };
        let outcome = conn
            .vault
            .provider_token_after(provider, &request, read, refused, self.clock.as_ref())
            .await
            .map_err(vault_error)?;
        match outcome {
            TokenOutcome::Token(t) => Ok(t),
            TokenOutcome::NoAccount => Err(refuse(LinkKind::Connect)),
            TokenOutcome::Reconnect => Err(refuse(LinkKind::Reconnect)),
            TokenOutcome::Unavailable(_) => Err(DeriveError::UpstreamUnavailable {
                service: service.to_string(),
            }),
        }
    }

    /// Opens (or finds) the link and builds the refusal that carries it.
    // reason: what the link record needs, each from a different step of the
    // derive; a private helper with call sites in this file only.
    #[allow(clippy::too_many_arguments)]
    fn link_refusal(
        &self,
        conn: &ConnectedServices,
        provider: &Provider,
        person: &subject::Person,
        service: &str,
        kind: LinkKind,
        scopes: &[String],
        policy_hash: &str,
        now: i64,
    ) -> DeriveError {
        let agent = self.config.agent.as_str();
        let issued = match conn.links.open_link(
            &LinkRequest {
                person,
                agent,
                service,
                kind,
                scopes,
                policy_hash,
            },
            now,
        ) {
            Ok(l) => l,
            Err(e) => return link_error(e),
        };
        if issued.fresh {
            let mut e = Event::new(now, Kind::ConnectLinkIssued, agent);
            e.person_iss = Some(&person.iss);
            e.person_sub = Some(&person.sub);
            e.service = Some(service);
            e.connect_id = Some(&issued.link.id);
            e.reason = Some(kind.reason());
            let scope = issued.link.scopes.join(" ");
            e.scope = Some(&scope);
            e.policy_hash = Some(policy_hash);
            // No record, no link: a link nobody can trace is not handed out.
            // Closing it lets the next ask make (and record) a new one.
            if let Err(err) = self.audit.record(&e) {
                if let Err(close) = conn.links.close(&issued.link) {
                    tracing::error!(error = %close, "an unrecorded connect link could not be closed");
                }
                return err.into();
            }
        }
        let name = provider.display_name();
        let message = match kind {
            LinkKind::Connect => format!(
                "The agent \"{agent}\" wants to use your {name} account. Open the link to connect {name} and allow \"{agent}\" to use it, then ask the agent to try again."
            ),
            LinkKind::Allow => format!(
                "The agent \"{agent}\" wants to use your connected {name} account ({}). Open the link to allow it, then ask the agent to try again.",
                scopes.join(", ")
            ),
            LinkKind::Reconnect => format!(
                "Your {name} connection must be renewed before the agent \"{agent}\" can use it. Open the link to connect {name} again, then ask the agent to try again."
            ),
        };
        DeriveError::LinkRequired(Box::new(LinkRefusal {
            kind,
            uri: SecretString::new(conn.links.uri(&issued.code)),
            id: issued.link.id.clone(),
            expires_in: issued.link.expires - now,
            message,
        }))
    }
}
