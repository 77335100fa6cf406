//! Every audit event type, in one list. [`super::Event::new`] takes a
//! [`Kind`], so an event cannot be written under a name missing here, and
//! `docs/OPERATIONS.md` is tested against [`Kind::ALL`]
//! (`tests/it/reference/`).

/// Defines [`Kind`], its wire names and [`Kind::ALL`] from one list, so the
/// three cannot disagree.
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// An audit event's type: its `event` member.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kind {
            $($(#[$doc])* $variant,)*
        }

        impl Kind {
            /// Every event type, in the order of the list.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];

            /// The name written in the `event` member.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Kind::$variant => $name,)*
                }
            }
        }
    };
}

kinds! {
    /// A derive released a token.
    DeriveIssued = "derive.issued",
    /// A derive was refused.
    DeriveDenied = "derive.denied",
    /// A derive for a service nobody connected yet handed out a connect link.
    ConnectLinkIssued = "connect.link_issued",
    /// A connect link was opened by someone other than its person.
    ConnectOpenedByOtherPerson = "connect.opened_by_other_person",
    /// The person declined on the connect page.
    ConnectDeclined = "connect.declined",
    /// The person connected the service (or approved the allowance).
    ConnectCompleted = "connect.completed",
    /// The provider's account differs from the one already connected.
    ConnectDifferentAccount = "connect.different_account",
    /// Someone signed in on the pages.
    SigninSucceeded = "signin.succeeded",
    /// A sign-in on the pages failed.
    SigninFailed = "signin.failed",
    /// Someone signed out of the pages.
    Signout = "signout",
    /// A connected account was disconnected (pages or admin).
    AccountDisconnected = "account.disconnected",
    /// An allowance was revoked on the account page.
    AllowanceRevoked = "allowance.revoked",
    /// A new policy is in force.
    PolicyReloaded = "policy.reloaded",
    /// A policy reload was refused; the last good policy stays.
    PolicyReloadFailed = "policy.reload_failed",
    /// The emergency freeze was set.
    AdminFrozen = "admin.frozen",
    /// The emergency freeze was lifted.
    AdminUnfrozen = "admin.unfrozen",
    /// A signing-key rotation was asked for.
    KeysRotated = "keys.rotated",
    /// A vault key rotation step ran.
    VaultRotated = "vault.rotated",
    /// A local account was added or replaced.
    UsersAdded = "users.added",
    /// A local account was removed and its page sessions ended.
    UsersRemoved = "users.removed",
    /// A torn tail of the audit log was cut at open.
    AuditRepaired = "audit.repaired",
    /// The audit log is writable again after a failure.
    AuditRecovered = "audit.recovered",
    /// A proxied call is about to go upstream (written before it goes).
    ProxyRequest = "proxy.request",
    /// A proxied call is over.
    ProxyCompleted = "proxy.completed",
    /// A derive for a tool that needs approval made a new approval link.
    ApprovalRequested = "approval.requested",
    /// The person approved the call.
    ApprovalGranted = "approval.granted",
    /// The person declined the call.
    ApprovalDeclined = "approval.declined",
    /// A derive used an each_call approval (before its token is released).
    ApprovalRedeemed = "approval.redeemed",
    /// An approval link was opened by someone other than its person.
    ApprovalOpenedByOtherPerson = "approval.opened_by_other_person",
    /// A person's agents were stopped (`derive::persons`).
    PersonRevoked = "person.revoked",
    /// A person's stop was lifted (`persons restore`, or a new sign-in).
    PersonRestored = "person.restored",
    /// The client key (upstream authorization servers) was rotated.
    ClientKeysRotated = "client_keys.rotated",
    /// A Shared Signals event (SET) was received and acted on, or found
    /// a repeat.
    SsfEventReceived = "ssf.event_received",
    /// A webhook subscription's backlog passed its cap: events were
    /// dropped undelivered.
    WebhookEventsDropped = "webhook.events_dropped",
    /// A webhook delivery was given up (a dead letter, kept for
    /// `credbroker events redeliver`).
    WebhookDeadLettered = "webhook.dead_lettered",
}

impl Kind {
    /// The types named for features not built yet (issue 38): nothing
    /// writes them. `docs/OPERATIONS.md` marks exactly these "reserved: not
    /// yet emitted"; a feature that writes one takes it out of this list.
    /// Every type named for this wave is written now.
    pub const RESERVED: &'static [Kind] = &[];
}

impl serde::Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
