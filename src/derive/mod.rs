//! The derive core: the only code that decides whether a token is issued,
//! and the operator actions that change what it decides.
//!
//! - [`exchange`]: the derive pipeline, the only place that decides.
//! - [`policy`]: the policy file and its decisions.
//! - [`approve`]: step-up approvals, a connect link for one call.
//! - [`mint`]: signing keys, minted tokens, JWKS, rotation.
//! - [`client_keys`]: the client key (its own ring): client assertions and
//!   actor tokens at upstream authorization servers.
//! - [`freeze`]: the signed freeze record every process follows.
//! - [`persons`]: the person-level stop, watched in memory as the freeze is.
//! - [`upstreams`]: the organisation's authorization servers, where an
//!   `exchange` resource's token comes from (RFC 8693).
//! - [`ssf`]: the Shared Signals receiver: Security Event Tokens checked,
//!   mapped to people and acted on.
//! - [`ops`]: the operator actions (freeze, rotations, users, accounts),
//!   each written once for the admin socket and the offline command line.

pub(crate) mod approve;
pub(crate) mod client_keys;
pub(crate) mod exchange;
pub(crate) mod freeze;
pub(crate) mod mint;
pub(crate) mod ops;
pub(crate) mod persons;
pub(crate) mod policy;
pub(crate) mod ssf;
pub(crate) mod upstreams;
