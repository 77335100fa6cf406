//! Stage 5, the account: the person's connected account for the service,
//! the allowance for this agent, and a live provider token, from the
//! service source a derive also uses ([`Broker::service_token`]): refreshed
//! first when near expiry, one refresh at a time per account. Its refusals
//! (`connect_required`, `allow_required`, `reconnect_required`, with a
//! `connect_uri`) are the ones a derive answers.
//!
//! [`Broker::service_token`]: crate::derive::exchange::Broker::service_token

use super::refusal::Refusal;
use super::{Call, Proxy};
use crate::accounts::subject::Person;
use crate::accounts::vault::ServiceToken;

impl Proxy {
    /// The provider token for the call's person and service. `refused` is
    /// a token the provider has just refused (the upstream retry): it is
    /// refreshed rather than handed back.
    pub(super) async fn provider_token(
        &self,
        call: &Call,
        refused: Option<&str>,
    ) -> Result<ServiceToken, Refusal> {
        let b = &self.broker;
        let person = Person {
            iss: call.who.subject_iss.clone().unwrap_or_default(),
            sub: call.who.sub.clone(),
        };
        let scopes: Vec<String> = call
            .policy
            .tools
            .get(&call.who.tool)
            .map(|t| t.scopes.iter().cloned().collect())
            .unwrap_or_default();
        b.service_token(
            &call.policy.hash,
            &person,
            &call.service,
            &scopes,
            refused,
            b.clock.now(),
        )
        .await
        .map_err(Refusal::Derive)
    }
}
