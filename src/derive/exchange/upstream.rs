//! The `exchange` source (step 6 of the pipeline, [`super`]): one RFC 8693
//! token exchange at the organisation's authorization server
//! ([`crate::derive::upstreams`]), or the two legs of an ID-JAG derive,
//! after every check of a `self` derive. Kept apart from the `self` hot
//! path, which never reaches it.

use crate::accounts::subject::{Subject, SubjectError};
use crate::base::dpop::ValidProof;
use crate::derive::policy::{self, DenyReason, Grant, Policy};
use crate::derive::upstreams::{
    ExchangeInput, ReuseKey, UpstreamError, ACCESS_TOKEN_TYPE, ID_TOKEN_TYPE,
};

use super::{Broker, Ctx, DeriveError, DeriveRequest, Issued, SubjectTokenType};

impl Broker {
    /// The subject of a derive whose subject token is an ID token: only
    /// for an `exchange` resource, validated as an ID token for its
    /// upstream (issuer the upstream's, `aud` the broker's client id
    /// there; [`crate::accounts::subject::Validator::validate_id_token`]).
    /// Any other resource refuses it, before it is read.
    pub(super) async fn id_token_subject(
        &self,
        req: &DeriveRequest,
        policy: &Policy,
        now: i64,
    ) -> Result<Subject, DeriveError> {
        let upstream = policy
            .declared_resource(&req.resource)
            .and_then(|r| policy.resources.get(r))
            .and_then(|r| match &r.source {
                policy::Source::Exchange { upstream } => Some(upstream.as_str()),
                _ => None,
            })
            .ok_or(DeriveError::Subject(SubjectError::IdToken(
                "the resource is not an exchange resource",
            )))?;
        let cfg = self
            .upstreams
            .as_ref()
            .and_then(|u| u.config(upstream))
            .ok_or_else(|| DeriveError::Upstream {
                upstream: upstream.to_owned(),
                error: UpstreamError::NotConfigured,
            })?;
        Ok(self
            .subjects
            .validate_id_token(req.subject_token.expose(), now, &cfg.issuer, &cfg.client_id)
            .await?)
    }

    /// The exchange at `upstream` for this derive: the person's subject
    /// token, the resource, exactly the granted scopes, and the tool's
    /// relayed proofs (one per leg for an `id_jag` upstream); the answer
    /// checked before it is handed over.
    ///
    /// Or, when the upstream has a `reuse_margin` and `reusable` (the tool
    /// has no approval and the call no details), a token it issued before
    /// for the very same derive ([`crate::derive::upstreams::ReuseKey`]:
    /// person, agent, tool, step, resource, scopes, key, policy hash), with
    /// the margin left and ending no later than this subject token. That
    /// needs no call to the AS, so the relayed proof is neither required
    /// nor read (it is dropped, sent nowhere): the derive proof, checked
    /// in full before this step, already proves possession of the key the
    /// token is bound to, whose thumbprint is part of the reuse key.
    // reason: the pipeline's parts this step reads, each borrowed; one
    // caller (`pipeline::run`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn derive_upstream(
        &self,
        req: &DeriveRequest,
        subject: &Subject,
        proof: &ValidProof,
        policy: &Policy,
        grant: &Grant,
        upstream: &str,
        reusable: bool,
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
        let reuse_key = ReuseKey {
            upstream,
            resource: &grant.resource.canonical,
            person_iss: &subject.person.iss,
            person_sub: &subject.person.sub,
            agent: &self.config.agent,
            tool: &req.tool,
            step: &req.step,
            scopes: &grant.scopes,
            jkt: &proof.jkt,
            policy_hash: &policy.hash,
        };
        // The margin only when this derive may share a token at all.
        let margin = ups.reuse_margin(upstream).filter(|_| reusable);
        if let Some(margin) = margin {
            // An entry exists only for a subject issuer listed for this
            // upstream (it was exchanged), and the config is not reloaded.
            if let Some(t) = ups.reuse().get(&reuse_key, margin, now, subject.exp) {
                self.metrics
                    .upstream_exchanges
                    .with_label_values(&[upstream, "reused"])
                    .inc();
                ctx.expires_at = Some(t.exp);
                ctx.reused = Some(true);
                return Ok((issued(t.access_token, t.exp - now, grant), t.id));
            }
        }
        let ticket = ups.reuse().ticket();
        let input = ExchangeInput {
            upstream,
            resource: &grant.resource.canonical,
            subject_token: req.subject_token.expose(),
            subject_token_type: match req.subject_token_type {
                SubjectTokenType::Access => ACCESS_TOKEN_TYPE,
                SubjectTokenType::Id => ID_TOKEN_TYPE,
            },
            subject_iss: &subject.person.iss,
            subject_sub: &subject.person.sub,
            subject_exp: subject.exp,
            scopes: &grant.scopes,
            jkt: &proof.jkt,
            tool: &req.tool,
            step: &req.step,
            proofs: &req.upstream_proofs,
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
        let mut withdrawn = None;
        let between = || match self.still_allowed(req, subject, grant) {
            Ok(()) => true,
            Err(e) => {
                withdrawn = Some(e);
                false
            }
        };
        let t = match ups.exchange(&input, between, observe).await {
            Ok(t) => t,
            Err(e) if e.error == UpstreamError::Withdrawn => {
                return Err(withdrawn.unwrap_or(DeriveError::Denied(DenyReason::ToolNotAllowed)))
            }
            Err(e) => {
                return Err(DeriveError::Upstream {
                    upstream: e.upstream,
                    error: e.error,
                })
            }
        };
        ctx.expires_at = Some(t.exp);
        ctx.reused = Some(false);
        let after = self.clock.now();
        let expires_in = t.exp - after;
        if expires_in <= 0 {
            return Err(fail(UpstreamError::TokenRejected("it expired on its way")));
        }
        if let Some(margin) = margin {
            ups.reuse().put(
                ticket,
                &reuse_key,
                &t.access_token,
                t.exp,
                &t.id,
                margin,
                after,
            );
        }
        Ok((issued(t.access_token, expires_in, grant), t.id))
    }

    /// Between the legs of an ID-JAG derive: the freeze, the person stop
    /// list (a stop meanwhile), and the current policy (reloaded meanwhile,
    /// perhaps) still giving this derive exactly `grant`; otherwise its
    /// refusal (the stop's, the policy's reason, or `tool_not_allowed`
    /// when it would now grant something else).
    fn still_allowed(
        &self,
        req: &DeriveRequest,
        subject: &Subject,
        grant: &Grant,
    ) -> Result<(), DeriveError> {
        self.stops
            .check_derive(&subject.person, subject.auth_time)
            .map_err(DeriveError::from)?;
        let current = self.policy.load();
        let checked = current
            .prelude(self.freeze.is_set(), &req.resource, req.scope.as_deref())
            .map_err(|r| match r {
                policy::Refusal::Frozen => DeriveError::Denied(DenyReason::Frozen),
                _ => DeriveError::Denied(DenyReason::ToolNotAllowed),
            })?;
        match current.decide(&checked.request(&req.step, &req.tool)) {
            policy::Decision::Allow(g) if &g == grant => Ok(()),
            policy::Decision::Allow(_) => Err(DeriveError::Denied(DenyReason::ToolNotAllowed)),
            policy::Decision::Deny(r) => Err(DeriveError::Denied(r)),
        }
    }

    /// Drops every exchanged token kept for reuse for the person (`iss`,
    /// `sub`); returns how many. The person-level stop (issue 43) calls it
    /// when it stops a person, so no token of theirs is given again (their
    /// derives are refused by the stop itself; this makes sure a lifted
    /// stop does not bring back a token issued before it).
    pub fn drop_exchanged_tokens_of(&self, iss: &str, sub: &str) -> usize {
        self.upstreams
            .as_ref()
            .map_or(0, |u| u.reuse().drop_person(iss, sub))
    }

    /// Drops every exchanged token kept for reuse: on a freeze and on a
    /// policy reload.
    pub(crate) fn drop_exchanged_tokens(&self) {
        if let Some(u) = &self.upstreams {
            u.reuse().clear();
        }
    }
}

/// The answer for an exchanged (or reused) token.
fn issued(
    access_token: crate::base::secret::SecretString,
    expires_in: i64,
    grant: &Grant,
) -> Issued {
    Issued {
        access_token,
        expires_in: Some(expires_in),
        scope: grant.scopes.join(" "),
        token_type: std::borrow::Cow::Borrowed("DPoP"),
        sender_constrained: true,
        authorization_details: None,
    }
}
