//! The pipeline's steps, one method each, in the order of the module doc
//! ([`super`]); [`Broker::run`] calls them in that order.

use crate::accounts::subject::{Subject, SubjectError};
use crate::base::dpop::{self, DpopError, ValidProof};
use crate::derive::approve;
use crate::derive::mint;
use crate::derive::policy::{self, Checked, DenyReason, Grant, Policy, Tool};

use super::approval::Approved;
use super::{Broker, Ctx, DeriveError, DeriveRequest, Issued, SubjectTokenType};

/// What the policy step allows: the grant, the tool, and the call's
/// details as checked against the tool's declarations.
pub(super) struct Allowed<'p> {
    grant: Grant,
    tool: &'p Tool,
    details: Option<serde_json::Value>,
    /// The request the token is for, when the derive carried it.
    bound: Option<super::bind::BoundCall>,
}

impl Broker {
    /// The derive's decision: every step in order; the first that refuses
    /// ends it. Returns the token and the id its event records.
    pub(super) async fn run(
        &self,
        req: &DeriveRequest,
        now: i64,
        policy: &Policy,
        ctx: &mut Ctx,
    ) -> Result<(Issued, String), DeriveError> {
        let checked = self.request_step(req, policy)?;
        let subject = {
            let _span = self.span("derive.subject");
            self.subject_step(req, now, policy, ctx).await?
        };
        let allowed = {
            let _span = self.span("derive.policy");
            self.policy_step(req, policy, &checked, ctx)?
        };
        let proof = self.proof_step(req, now)?;
        if let policy::Source::Service { service, delivery } = &allowed.grant.resource.source {
            // The service source reads and writes times other replicas
            // act on (links, provider token expiries): the database's time.
            let shared = self.shared_now();
            let mut span = self.span("derive.service");
            span.set("credbroker.service", service.as_str());
            let served = self
                .derive_service(policy, &subject, &allowed.grant, service, shared, ctx)
                .await?;
            drop(span);
            match delivery {
                policy::Delivery::ProviderToken => return Ok(served),
                // The egress proxy: every check of the service source has
                // passed (account, allowance, a live provider token,
                // refreshed if it was near expiry), and the provider's token
                // stays here (dropped, so zeroized). The tool gets an
                // ordinary credbroker token for the proxy address, minted
                // below exactly like a `self` token.
                policy::Delivery::Proxy => {
                    drop(served);
                    ctx.narrowed = None;
                }
            }
        }
        if let policy::Source::Exchange { upstream } = &allowed.grant.resource.source {
            // The loader refuses approvals and details on an exchange
            // resource: the AS's token could carry neither. Fail closed.
            if allowed.tool.approval.is_some() || allowed.details.is_some() {
                return Err(DeriveError::Unavailable(
                    "an exchange resource cannot serve a tool with approvals or details",
                ));
            }
            // Never shared between derives when the tool has approvals or
            // the call has details (refused just above today; kept as the
            // rule should that refusal be relaxed).
            let reusable = allowed.tool.approval.is_none() && allowed.details.is_none();
            let mut span = self.span("derive.exchange");
            span.set("credbroker.upstream", upstream.as_str());
            let r = self
                .derive_upstream(
                    req,
                    &subject,
                    &proof,
                    policy,
                    &allowed.grant,
                    upstream,
                    reusable,
                    now,
                    ctx,
                )
                .await;
            if r.is_err() {
                span.fail();
            }
            return r;
        }
        let approved = match allowed.tool.approval {
            Some(mode) => {
                let call = approve::Call {
                    person: &subject.person,
                    agent: &self.config.agent,
                    step: &req.step,
                    tool: &req.tool,
                    resource: &allowed.grant.resource.id,
                    scopes: &allowed.grant.scopes,
                    jkt: &proof.jkt,
                    details: allowed.details.as_ref(),
                    request: allowed
                        .bound
                        .as_ref()
                        .map(|b| (b.sha256.as_str(), &b.shown)),
                };
                Some(self.approval_step(policy, allowed.tool, mode, &call, now, ctx)?)
            }
            None => None,
        };
        ctx.approval_id = approved.as_ref().map(|a| a.id.clone());
        let _span = self.span("derive.mint");
        self.mint_step(req, now, &subject, &proof, allowed, approved)
    }

    /// A child span of the derive's, when telemetry is on (one branch
    /// otherwise).
    fn span(&self, name: &'static str) -> crate::infra::telemetry::Guard {
        if self.telemetry.is_some() {
            crate::infra::telemetry::child(name)
        } else {
            crate::infra::telemetry::Guard::none()
        }
    }

    /// Step 2, the request's limits and prelude: the global and per-peer
    /// limits, then the freeze, the scope's syntax, the resource (the same
    /// prelude as `policy evaluate`; the file's freeze flag is read from
    /// this derive's snapshot, like everything else).
    fn request_step(&self, req: &DeriveRequest, policy: &Policy) -> Result<Checked, DeriveError> {
        if let Err(retry_after) = self.limits.check_global() {
            self.metrics
                .rate_limited
                .with_label_values(&["global"])
                .inc();
            return Err(DeriveError::RateLimited { retry_after });
        }
        if let Err(retry_after) = self.limits.check_peer(req.peer_uid) {
            self.metrics.rate_limited.with_label_values(&["peer"]).inc();
            return Err(DeriveError::RateLimited { retry_after });
        }
        let checked = policy
            .prelude(self.freeze.is_set(), &req.resource, req.scope.as_deref())
            .map_err(|r| match r {
                policy::Refusal::Frozen => DeriveError::Denied(DenyReason::Frozen),
                policy::Refusal::InvalidScope => {
                    DeriveError::BadRequest("scope must be space-separated scope tokens".into())
                }
                policy::Refusal::InvalidTarget(e) => DeriveError::Target(e),
            })?;
        // A clock too far off the database's would mint tokens every
        // verifier sees shifted: refused, from the last measured offset
        // (memory only: no store call on any path).
        self.skew.check().map_err(DeriveError::ClockSkew)?;
        // A replica that has not read the person stop list within its
        // bound refuses (unless `revocation.watch_failure = "serve"`).
        self.stops.check_watch()?;
        Ok(checked)
    }

    /// Step 3, the subject: the token, then the proof's nonce, then the
    /// per-(person, tool) limit.
    async fn subject_step(
        &self,
        req: &DeriveRequest,
        now: i64,
        policy: &Policy,
        ctx: &mut Ctx,
    ) -> Result<Subject, DeriveError> {
        let (subject, cached) = match req.subject_token_type {
            SubjectTokenType::Access => {
                self.subjects
                    .validate(req.subject_token.expose(), now)
                    .await?
            }
            // Only for an exchange resource (`upstream`), never cached.
            SubjectTokenType::Id => (self.id_token_subject(req, policy, now).await?, false),
        };
        if cached {
            self.metrics.subject_cache_hits.inc();
        } else {
            self.metrics.subject_cache_misses.inc();
        }
        ctx.person = Some(subject.person.clone());
        // A memory look-up; a new or changed address is queued for a
        // background write (no store call on this path).
        if let (Some(emails), Some(email)) = (&self.emails, &subject.email) {
            emails.observe(&subject.person, email);
        }
        ctx.auth_time = subject.auth_time;
        // The person stop list (memory only): a stopped person gets
        // nothing; a new sign-in lifts a sign-in stop.
        if let Some(lifting) = self
            .stops
            .check_derive(&subject.person, subject.auth_time)?
        {
            self.lift_stop(lifting, now);
        }
        // A proof without a current nonce is refused before the person's
        // and tool's limit is charged, so following `use_dpop_nonce` costs
        // no rate token. Only the nonce is read here; the whole proof is
        // checked in step 5, and a forged one gains nothing but a nonce,
        // which any caller is handed anyway.
        if let Some(proof) = req.dpop.as_ref() {
            if self.proofs.lacks_fresh_nonce(proof.expose(), now) {
                return Err(DeriveError::Proof(
                    DpopError::UseNonce,
                    self.proofs.fresh_nonce(now),
                ));
            }
        }
        let person = &subject.person;
        if let Err(retry_after) = self
            .limits
            .check_person_tool(&person.iss, &person.sub, &req.tool)
        {
            self.metrics
                .rate_limited
                .with_label_values(&["person_tool"])
                .inc();
            return Err(DeriveError::RateLimited { retry_after });
        }
        Ok(subject)
    }

    /// Step 4, the policy: the decision, then the call's details against
    /// the tool's declarations, refused before any approval link exists,
    /// so nothing undeclared is ever shown for approval or put in a token.
    fn policy_step<'p>(
        &self,
        req: &DeriveRequest,
        policy: &'p Policy,
        checked: &Checked,
        ctx: &mut Ctx,
    ) -> Result<Allowed<'p>, DeriveError> {
        let grant = match policy.decide(&checked.request(&req.step, &req.tool)) {
            policy::Decision::Allow(g) => g,
            policy::Decision::Deny(r) => return Err(DeriveError::Denied(r)),
        };
        let tool = policy
            .tools
            .get(&req.tool)
            .ok_or(DeriveError::Denied(DenyReason::ToolNotAllowed))?;
        let details = policy::details::check(tool, req.authorization_details.as_ref())
            .map_err(|e| DeriveError::InvalidDetails(e.to_string()))?;
        if details.is_some() || tool.approval.is_some() {
            ctx.details_sha256 = Some(approve::details_sha256(details.as_ref()));
        }
        let bound = self.bind_step(req, policy, tool, &grant)?;
        ctx.request_sha256 = bound.as_ref().map(|b| b.sha256.clone());
        Ok(Allowed {
            grant,
            tool,
            details,
            bound,
        })
    }

    /// Step 5, the proof: every check of RFC 9449 section 4.3, then the
    /// replay cache, then its date against this process's start.
    fn proof_step(&self, req: &DeriveRequest, now: i64) -> Result<ValidProof, DeriveError> {
        let proof = req
            .dpop
            .as_ref()
            .ok_or(DeriveError::Proof(DpopError::Missing, None))?;
        let expect = dpop::Expect {
            method: "POST",
            htu: self.htu(req.endpoint),
            access_token: None,
            jkt: None,
            now,
        };
        let valid = self.proofs.validate(proof.expose(), &expect).map_err(|e| {
            let nonce = match e {
                DpopError::UseNonce => self.proofs.fresh_nonce(now),
                _ => None,
            };
            DeriveError::Proof(e, nonce)
        })?;
        // A proof made before this process started may have been accepted
        // by the process before it, whose replay cache is gone (a crash, a
        // restart under the same instance name): refused. Without nonces
        // (the default on sled) this is what stops that replay; with them
        // the boot id in the nonce does too.
        if valid.iat < self.started.saturating_sub(super::START_SKEW) {
            return Err(DeriveError::Proof(DpopError::Iat, None));
        }
        Ok(valid)
    }

    /// Step 8, the mint (for `self` and the proxy): the lifetime is
    /// min(policy ttl, 300 s, the subject token's life, the approval's end).
    fn mint_step(
        &self,
        req: &DeriveRequest,
        now: i64,
        subject: &Subject,
        proof: &ValidProof,
        allowed: Allowed<'_>,
        approved: Option<Approved>,
    ) -> Result<(Issued, String), DeriveError> {
        let Allowed {
            grant,
            details,
            bound,
            ..
        } = allowed;
        let mut exp = (now + grant.ttl.as_secs() as i64).min(subject.exp);
        if let Some(a) = &approved {
            exp = exp.min(a.exp_cap);
        }
        if exp <= now {
            return Err(DeriveError::Subject(SubjectError::Expired));
        }
        let minted = self.minter.mint(&mint::Claims {
            sub: &subject.person.sub,
            subject_iss: &subject.person.iss,
            aud: &grant.resource.id,
            scopes: &grant.scopes,
            tool: &req.tool,
            step: Some(&req.step),
            jkt: &proof.jkt,
            iat: now,
            exp,
            authorization_details: details.as_ref(),
            approval_id: approved.as_ref().map(|a| a.id.as_str()),
            single_use: approved.as_ref().is_some_and(|a| a.single_use),
            req_sha256: bound.as_ref().map(|b| b.sha256.as_str()),
        })?;
        Ok((
            Issued {
                access_token: minted.token,
                expires_in: Some(exp - now),
                scope: grant.scopes.join(" "),
                token_type: std::borrow::Cow::Borrowed("DPoP"),
                sender_constrained: true,
                authorization_details: details,
            },
            minted.jti,
        ))
    }
}
