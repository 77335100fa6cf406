//! Step 7 of the pipeline ([`super`]): the person's approval of this very
//! call, when the policy marks the tool `approval` (docs/APPROVALS.md):
//! found and used, or the refusal that asks for it through a link.

use crate::base::secret::SecretString;
use crate::derive::approve::{self, Approval, ApproveError, Call, Lookup, Mode};
use crate::derive::policy::{self, Policy};
use crate::infra::events::{Event, Kind};

use super::error::approval_error;
use super::{ApprovalRefusal, Broker, Ctx, DeriveError};

/// What an approval allows the token minted on it.
pub(super) struct Approved {
    /// The latest `exp` the token may have: the approval's end, and for an
    /// each_call approval [`approve::EACH_CALL_TOKEN_TTL`] from now.
    pub(super) exp_cap: i64,
    /// An each_call token is single-use.
    pub(super) single_use: bool,
    /// The approval's id, which the token carries.
    pub(super) id: String,
}

impl Broker {
    /// The approval in force for `call` under `mode`, and what it allows
    /// the token: a token never outlives the approval it was minted on.
    pub(super) fn approval_step(
        &self,
        policy: &Policy,
        tool: &policy::Tool,
        mode: policy::Approval,
        call: &Call<'_>,
        now: i64,
        ctx: &mut Ctx,
    ) -> Result<Approved, DeriveError> {
        // Approvals are shared with every replica: looked up and made in
        // the database's time; the token's cap back in ours (`now`).
        let shared = self.shared_now();
        let a = self.approved(policy, tool, mode, call, shared, ctx)?;
        let each_call = a.mode == Mode::EachCall;
        let mut exp_cap = (a.expires + (now - shared)).max(now + 1);
        if each_call {
            exp_cap = exp_cap.min(now + approve::EACH_CALL_TOKEN_TTL);
        }
        Ok(Approved {
            exp_cap,
            single_use: each_call,
            id: a.id,
        })
    }

    /// An `approval.*` event about `a`, for the call of this derive.
    fn approval_event<'a>(
        &'a self,
        now: i64,
        name: Kind,
        call: &Call<'a>,
        policy: &'a Policy,
        a: &'a Approval,
    ) -> Event<'a> {
        let mut e = Event::new(now, name, &self.config.agent);
        e.person_iss = Some(call.person.iss.as_str());
        e.person_sub = Some(call.person.sub.as_str());
        e.step = Some(call.step);
        e.tool = Some(call.tool);
        e.resource = Some(call.resource);
        e.policy_hash = Some(&policy.hash);
        e.approval_id = Some(&a.id);
        e.details_sha256 = Some(&a.details_sha256);
        e.request_sha256 = a.request_sha256.as_deref();
        e.reason = Some(a.mode.as_str());
        e.approval_ttl = a.mode.approval_ttl();
        e
    }

    /// The approval in force for `call`, or the refusal that asks for it
    /// (recording `approval.requested` for a new link, `approval.redeemed`
    /// for an each_call grant this derive uses up).
    fn approved(
        &self,
        policy: &Policy,
        tool: &policy::Tool,
        mode: policy::Approval,
        call: &Call<'_>,
        now: i64,
        ctx: &mut Ctx,
    ) -> Result<Approval, DeriveError> {
        let Some(approvals) = self.approvals.as_ref() else {
            return Err(DeriveError::Unavailable(
                "approvals are not configured on this instance",
            ));
        };
        let mode = match mode {
            policy::Approval::EachCall => Mode::EachCall,
            policy::Approval::PerStep { ttl, unit } => Mode::PerStep {
                ttl: ttl.as_secs() as i64,
                unit,
            },
        };
        let shown = approve::shown(tool, call.details);
        let found = approvals
            .lookup(call, mode, shown, &policy.hash, now)
            .map_err(|e| match e {
                ApproveError::TooManyOpen | ApproveError::RateLimited => {
                    self.metrics
                        .rate_limited
                        .with_label_values(&["approvals"])
                        .inc();
                    DeriveError::TooManyApprovals
                }
                e => approval_error(e),
            })?;
        let in_clear = call
            .details
            .map(|d| policy::details::loggable(tool, d))
            .filter(|m| !m.is_empty());
        match found {
            Lookup::Granted(a) => {
                if a.mode == Mode::EachCall {
                    let e = self.approval_event(now, Kind::ApprovalRedeemed, call, policy, &a);
                    // No record, no token: the grant is already used up,
                    // so a failure here fails closed.
                    self.audit.record(&e)?;
                }
                Ok(*a)
            }
            Lookup::Declined(a) => {
                ctx.approval_id = Some(a.id.clone());
                Err(DeriveError::ApprovalDeclined)
            }
            Lookup::Pending(issued) => {
                let a = &issued.approval;
                ctx.approval_id = Some(a.id.clone());
                if issued.fresh {
                    let mut e = self.approval_event(now, Kind::ApprovalRequested, call, policy, a);
                    let scope = a.scopes.join(" ");
                    e.scope = Some(&scope);
                    e.details_in_clear = in_clear;
                    // No record, no link.
                    if let Err(err) = self.audit.record(&e) {
                        if let Err(d) = approvals.discard(a) {
                            tracing::error!(error = %d, "an unrecorded approval could not be discarded");
                        }
                        return Err(err.into());
                    }
                }
                let agent = &self.config.agent;
                Err(DeriveError::ApprovalRequired(Box::new(ApprovalRefusal {
                    uri: SecretString::new(approvals.uri(&issued.code)),
                    id: a.id.clone(),
                    expires_in: a.expires - now,
                    message: format!(
                        "The agent \"{agent}\" asks to use the tool \"{}\" on {} with the details shown on the page. Open the link to see exactly what it will do, and approve or decline it; then ask the agent to try again.",
                        a.tool, a.resource
                    ),
                })))
            }
        }
    }
}
