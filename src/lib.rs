//! credbroker: a credential broker that runs as a sidecar next to an AI
//! agent. The agent's orchestrator asks it, over a local Unix socket, for a
//! token for one tool call; it answers with the narrowest token its
//! deny-by-default policy allows: one audience, at most five minutes, bound to
//! the tool's DPoP key.
//!
//! Modules, in the order a request flows through them:
//!
//! - [`server`]: start-up, listeners, graceful shutdown.
//! - [`api`]: the orchestrator socket: peer checks, parsing, error mapping.
//! - [`exchange`]: the derive pipeline, the only place that decides.
//! - [`subject`]: subject tokens from trusted issuers; who the person is.
//! - [`policy`]: the policy file and its decisions.
//! - [`dpop`]: DPoP proofs, replay cache, nonces.
//! - [`mint`]: signing keys, minted tokens, JWKS, rotation.
//! - [`events`], [`metrics`]: audit events and Prometheus metrics.
//! - [`store`], [`seal`]: storage and encryption at rest.
//! - [`public`], [`admin`]: the public listener and the admin socket.
//! - [`pages`]: the browser pages on the public listener: sign-in, connect
//!   links (the five checks), the account page.
//! - [`verify`]: the resource-server side, for embedding.
//! - [`client`]: a client for the socket.
//! - [`oauth`]: the one OAuth client of the sign-in and the provider connections.
//! - [`keyset`]: one cached JWKS per issuer (pinned or fetched).
//! - [`jose`], [`secret`], [`clock`], [`config`], [`cli`]: building blocks.
//! - [`grammar`], [`diagnostics`]: leaves the config and the policy share
//!   (scope tokens and trusted URLs; TOML problems and their positions).

#![forbid(unsafe_code)]

pub mod admin;
pub mod api;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod connect;
pub mod diagnostics;
pub mod dpop;
pub mod events;
pub mod exchange;
#[doc(hidden)]
pub mod fuzzing;
pub mod grammar;
pub mod jose;
pub mod keyset;
pub mod metrics;
pub mod mint;
pub mod oauth;
pub mod pages;
pub mod policy;
pub mod public;
pub mod seal;
pub mod secret;
pub mod server;
pub mod store;
pub mod subject;
pub mod upstream;
pub mod vault;
pub mod verify;
