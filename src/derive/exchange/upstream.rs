//! The `exchange` source (step 6 of the pipeline, [`super`]): one RFC 8693
//! token exchange at the organisation's authorization server
//! ([`crate::derive::upstreams`]), after every check of a `self` derive.
//! Kept apart from the `self` hot path, which never reaches it.

use crate::accounts::subject::Subject;
use crate::base::dpop::ValidProof;
use crate::derive::policy::Grant;
use crate::derive::upstreams::{ExchangeInput, UpstreamError};

use super::{Broker, Ctx, DeriveError, DeriveRequest, Issued};

impl Broker {
    /// The exchange at `upstream` for this derive: the person's subject
    /// token, the resource, exactly the granted scopes, and the tool's
    /// relayed proof; the answer checked before it is handed over.
    // reason: the pipeline's parts this step reads, each borrowed; one
    // caller (`pipeline::run`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn derive_upstream(
        &self,
        req: &DeriveRequest,
        subject: &Subject,
        proof: &ValidProof,
        grant: &Grant,
        upstream: &str,
        now: i64,
        ctx: &mut Ctx,
    ) -> Result<(Issued, String), DeriveError> {
        ctx.upstream = Some(upstream.to_owned());
        let fail = |error| DeriveError::Upstream {
            upstream: upstream.to_owned(),
            error,
        };
        let Some(ups) = self.upstreams.as_ref() else {
            return Err(fail(UpstreamError::NotConfigured));
        };
        let input = ExchangeInput {
            upstream,
            resource: &grant.resource.canonical,
            subject_token: req.subject_token.expose(),
            subject_iss: &subject.person.iss,
            subject_exp: subject.exp,
            scopes: &grant.scopes,
            jkt: &proof.jkt,
            proof: req
                .upstream_proofs
                .get(upstream)
                .map(|p| p.expose().as_str()),
            now,
        };
        let observe = |outcome: &'static str, took: std::time::Duration| {
            self.metrics
                .upstream_exchanges
                .with_label_values(&[upstream, outcome])
                .inc();
            self.metrics
                .upstream_exchange_latency
                .with_label_values(&[upstream, outcome])
                .observe(took.as_secs_f64());
        };
        let t = ups.exchange(&input, observe).await.map_err(fail)?;
        ctx.expires_at = Some(t.exp);
        let expires_in = t.exp - self.clock.now();
        if expires_in <= 0 {
            return Err(fail(UpstreamError::TokenRejected("it expired on its way")));
        }
        Ok((
            Issued {
                access_token: t.access_token,
                expires_in: Some(expires_in),
                scope: grant.scopes.join(" "),
                token_type: std::borrow::Cow::Borrowed("DPoP"),
                sender_constrained: true,
                authorization_details: None,
            },
            t.id,
        ))
    }
}
