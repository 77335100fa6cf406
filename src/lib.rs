//! credbroker: a credential broker that runs as a sidecar next to an AI
//! agent. The agent's orchestrator asks it, over a local Unix socket, for a
//! token for one tool call; it answers with the narrowest token its
//! deny-by-default policy allows: one audience, at most five minutes, bound to
//! the tool's DPoP key.
//!
//! Modules, top-down in the order a request flows through them. Imports
//! between them run one way, never in a cycle (`scripts/module-graph`
//! checks it); the embedding modules (`verify`, `client`) use the
//! building blocks above them.
//!
//! - `cli`: the command line; starts an instance or acts on a stopped one.
//! - `demo`: the quick start's built-in demo service (a stand-in OAuth
//!   provider and its API, on loopback; `quickstart` only).
//! - `app`: the composition root: builds an instance and wires its parts.
//! - `server`: binds the listeners, runs the accept loops, shuts down.
//! - `admin`: the admin socket (status, freeze, key rotation, accounts).
//! - `ops`: the operator actions (freeze, rotations, users, accounts),
//!   each written once for the admin socket and the offline command line.
//! - `public`: the public listener: metadata, JWKS, then the pages.
//! - `proxy`: the egress proxy on the public listener: a tool's call to a
//!   connected service, checked and forwarded with the provider's token.
//! - `pages`: the browser pages: sign-in, connect links, the account page.
//! - `api`: the orchestrator socket: parsing and the one error mapping.
//! - `exchange`: the derive pipeline, the only place that decides.
//! - `subject`: subject tokens from trusted issuers; who the person is.
//! - `policy`: the policy file and its decisions.
//! - `dpop`: DPoP proofs, replay cache, nonces.
//! - `mint`: signing keys, minted tokens, JWKS, rotation.
//! - `connect`: connect-link records behind a refusal's `connect_uri`.
//! - `approve`: step-up approvals, a connect link for one call.
//! - `vault`: connected accounts, allowances, provider tokens at rest.
//! - `upstream`: the third-party providers (presets, account look-up,
//!   refresh, revocation) on the one OAuth client.
//! - `oauth`: the one OAuth client of the sign-in and the provider
//!   connections (discovery, PKCE, code exchange, RFC 9207 `iss`).
//! - `keyset`: one cached JWKS per issuer (pinned or fetched).
//! - `events`: audit events.
//! - `metrics`: Prometheus metrics.
//! - `store`: storage behind a small trait (sled for one instance,
//!   PostgreSQL for replicas).
//! - `seal`: encryption at rest.
//! - `config`: the validated instance config.
//! - `diagnostics`: TOML problems and their positions (config and policy).
//! - `grammar`: protocol grammar (scope tokens, https-or-loopback URLs).
//! - `http`: HTTP helpers every listener shares (body, JSON, body cap).
//! - `unix`: Unix helpers (own uid, socket binding).
//! - `jose`: JWS, JWK and base64url building blocks.
//! - `secret`: secret types (redacted, zeroized).
//! - `clock`: the injected clock.
//! - [`verify`]: the resource-server side, for embedding.
//! - [`client`]: a client for the socket, for embedding.
//! - `fuzzing`: the parsers' surface for the fuzz targets.
//! - `failpoint`: crash points for fault tests (`failpoints` feature only).
//!
//! Only [`verify`] and [`client`] are public; the rest is internal, reached
//! by the tests, fuzz targets, examples and benches through one hidden
//! `internals` module that is not a stable API.

#![forbid(unsafe_code)]

mod admin;
mod api;
mod app;
mod approve;
mod cli;
pub mod client;
mod clock;
mod config;
mod connect;
mod demo;
mod diagnostics;
mod dpop;
mod events;
mod exchange;
mod failpoint;
mod freeze;
mod fuzzing;
mod grammar;
mod http;
#[doc(hidden)]
pub mod internals;
mod jose;
mod keyset;
mod metrics;
mod mint;
mod oauth;
mod ops;
mod pages;
mod policy;
mod proxy;
mod public;
mod seal;
mod secret;
mod server;
mod store;
mod subject;
mod unix;
mod upstream;
mod vault;
pub mod verify;
