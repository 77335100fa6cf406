//! Accounts: who the person is, and what they connected.
//!
//! - [`subject`]: subject tokens from trusted issuers; who the person is.
//! - [`status`]: a subject token's status, asked of its issuer (RFC 7662
//!   introspection), where the config says so.
//! - [`emails`]: the verified email recorded per person, for Shared
//!   Signals `email` subjects.
//! - [`users`]: local accounts for the pages' sign-in (argon2id).
//! - [`connect`]: connect-link records behind a refusal's `connect_uri`.
//! - [`vault`]: connected accounts, allowances, provider tokens at rest.
//! - [`upstream`]: the third-party providers (presets, account look-up,
//!   refresh, revocation) on the one OAuth client.

pub(crate) mod connect;
pub(crate) mod emails;
pub(crate) mod status;
pub(crate) mod subject;
pub(crate) mod upstream;
pub(crate) mod users;
pub(crate) mod vault;
