//! Refusals reserved for this wave's features (issue 38): each reason with
//! the `error` and HTTP status it will be sent with, declared once in
//! `proto/refusal.schema.json` (its `reason` list, the rule of its `error`,
//! and `$defs/reservedReason`), so the features fill them in without
//! changing the contract's shape. Nothing sends them yet; the contract
//! test (`tests/it/contract/refusals.rs`) holds the schema's reasons to
//! exactly those the code sends plus these, and refuses a reason that is
//! both sent and still listed here: a feature that sends one takes it out.

/// One reserved refusal: a reason as one listener will send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedRefusal {
    /// The `reason` member.
    pub reason: &'static str,
    /// The `error` member it goes with.
    pub error: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// Where it is sent: `socket` (the orchestrator socket's derive) or
    /// `proxy` (the egress proxy on the public listener).
    pub at: &'static str,
    /// Members the answer adds besides `error`, `error_description` and
    /// `reason` (declared in the schema, allowed only with this reason).
    pub fields: &'static [&'static str],
    /// The issue whose feature sends it.
    pub issue: u32,
}

#[allow(
    dead_code,
    reason = "no refusal is reserved now; the next feature's reservation uses it"
)]
const fn r(
    reason: &'static str,
    error: &'static str,
    status: u16,
    at: &'static str,
    issue: u32,
) -> ReservedRefusal {
    ReservedRefusal {
        reason,
        error,
        status,
        at,
        fields: &[],
        issue,
    }
}

/// Every reserved refusal, by issue: none is left (issue 43's
/// `introspection_unavailable` is sent since subject-token status landed).
pub const RESERVED_REFUSALS: &[ReservedRefusal] = &[];
