//! The edges: each listener or socket a request comes in on. They parse
//! their wire format, call the derive core or the accounts, and write the
//! answer; nothing here decides whether a token is issued.
//!
//! - [`api`]: the orchestrator socket: parsing and the one error mapping.
//! - [`public`]: the public listener: metadata, JWKS, then the proxy and
//!   the pages.
//! - [`proxy`]: the egress proxy on the public listener: a tool's call to
//!   a connected service, checked and forwarded with the provider's token.
//! - [`pages`]: the browser pages: sign-in, connect links, approvals, the
//!   account page.
//! - [`admin`]: the admin socket (status, freeze, key rotation, accounts).
//! - [`events`]: the admin socket's live event stream (`GET /events`).
//! - [`metrics`]: the opt-in metrics listener (`GET /metrics` on TCP).
//! - [`reserved`]: refusals named for features not built yet (issue 38).
//!
//! Beside them, [`answer`]: the one error answer of the socket, the proxy
//! and the admin socket, with the DPoP challenge written once.

pub(crate) mod admin;
pub(crate) mod answer;
pub(crate) mod api;
pub(crate) mod events;
pub(crate) mod metrics;
pub(crate) mod pages;
pub(crate) mod proxy;
pub(crate) mod public;
pub(crate) mod reserved;
pub(crate) mod ssf;
