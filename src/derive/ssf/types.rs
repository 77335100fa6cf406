//! What each event type does (docs/SSF.md, "Event types"). The stop kinds
//! follow `derive::persons`: a stop a new sign-in lifts, or one only
//! `persons restore` lifts.

/// The CAEP event types' prefix.
const CAEP: &str = "https://schemas.openid.net/secevent/caep/event-type/";
/// The RISC event types' prefix.
const RISC: &str = "https://schemas.openid.net/secevent/risc/event-type/";
/// The SSF framework's own event types' prefix.
const SSF: &str = "https://schemas.openid.net/secevent/ssf/event-type/";

/// What an event does to the people its subject maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stop them; a new sign-in (a later `auth_time`) lifts it.
    StopUntilSignIn,
    /// Stop them until `persons restore`; their connected accounts are
    /// revoked at the providers when `revocation.revoke_at_providers` is on.
    StopUntilRestore,
    /// [`Action::StopUntilRestore`], and drop the recorded email.
    Purge,
    /// Their recorded email becomes the event's `new-value`.
    ChangeEmail,
    /// Drop their recorded email (the address now belongs to someone else).
    DropEmail,
    /// Nothing (recorded, counted).
    Ignore,
}

/// The event types acted on, their metric label and action, in the order
/// of docs/SSF.md's table.
pub(crate) const TABLE: &[(&str, &str, Action)] = &[
    (CAEP, "session-revoked", Action::StopUntilSignIn),
    (CAEP, "credential-change", Action::StopUntilSignIn),
    (CAEP, "token-claims-change", Action::StopUntilSignIn),
    (RISC, "account-disabled", Action::StopUntilRestore),
    (RISC, "credential-compromise", Action::StopUntilRestore),
    (RISC, "account-purged", Action::Purge),
    (RISC, "identifier-changed", Action::ChangeEmail),
    (RISC, "identifier-recycled", Action::DropEmail),
    (SSF, "verification", Action::Ignore),
];

/// The action and metric label of `event_type` (a URI): an unknown type is
/// ignored, labelled `other`.
pub(crate) fn of(event_type: &str) -> (&'static str, Action) {
    TABLE
        .iter()
        .find(|(prefix, name, _)| {
            event_type
                .strip_prefix(prefix)
                .is_some_and(|rest| rest == *name)
        })
        .map_or(("other", Action::Ignore), |(_, name, a)| (name, *a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_matched_whole() {
        assert_eq!(
            of("https://schemas.openid.net/secevent/caep/event-type/session-revoked"),
            ("session-revoked", Action::StopUntilSignIn)
        );
        assert_eq!(
            of("https://schemas.openid.net/secevent/risc/event-type/account-disabled"),
            ("account-disabled", Action::StopUntilRestore)
        );
        // A CAEP name under the RISC prefix, a suffix, another host: other.
        for t in [
            "https://schemas.openid.net/secevent/risc/event-type/session-revoked",
            "https://schemas.openid.net/secevent/caep/event-type/session-revoked2",
            "https://example.com/secevent/caep/event-type/session-revoked",
            "session-revoked",
        ] {
            assert_eq!(of(t), ("other", Action::Ignore), "{t}");
        }
    }
}
