//! credbroker: a credential broker that runs as a sidecar next to an AI
//! agent. The agent's orchestrator asks it, over a local Unix socket, for a
//! token for one tool call; it answers with the narrowest token its
//! deny-by-default policy allows: one audience, at most five minutes, bound to
//! the tool's DPoP key.
//!
//! Modules, in groups, top-down in the order a request flows through
//! them. A group imports only the groups below it, and the modules never
//! import each other in a cycle (`scripts/module-graph` checks both and
//! prints the order: top, edge, derive, accounts, infra, embed, base).
//!
//! Top: the command line and the composition root.
//! - `cli`: the command line; starts an instance or acts on a stopped one.
//! - `demo`: the quick start's built-in demo service (a stand-in OAuth
//!   provider and its API, on loopback; `quickstart` only).
//! - `app`: the composition root: builds an instance, wires its parts, and
//!   runs it (`app::server`: binds the listeners, accept loops, shutdown;
//!   `app::housekeeping`: the background work).
//!
//! `edge`: where requests come in.
//! - `edge::api`: the orchestrator socket: parsing and the one error
//!   mapping.
//! - `edge::public`: the public listener: metadata, JWKS, then the proxy
//!   and the pages.
//! - `edge::proxy`: the egress proxy on the public listener: a tool's call
//!   to a connected service, checked and forwarded with the provider's
//!   token.
//! - `edge::pages`: the browser pages: sign-in, connect links, approvals,
//!   the account page.
//! - `edge::admin`: the admin socket (status, freeze, key rotation,
//!   accounts).
//! - `edge::metrics`: the opt-in metrics listener (`GET /metrics` on
//!   TCP, the admin socket's exposition).
//! - `edge::ssf`: Shared Signals push at `{issuer}/ssf/events`.
//!
//! `derive`: the core that decides.
//! - `derive::ops`: the operator actions (freeze, rotations, users,
//!   accounts), each written once for the admin socket and the offline
//!   command line.
//! - `derive::exchange`: the derive pipeline, the only place that decides.
//! - `derive::policy`: the policy file and its decisions.
//! - `derive::approve`: step-up approvals, a connect link for one call.
//! - `derive::mint`: signing keys, minted tokens, JWKS, rotation.
//! - `derive::freeze`: the signed freeze record every process follows.
//! - `derive::ssf`: the Shared Signals receiver: Security Event Tokens
//!   checked, mapped to people and acted on.
//!
//! `accounts`: who the person is and what they connected.
//! - `accounts::subject`: subject tokens from trusted issuers; who the
//!   person is.
//! - `accounts::emails`: the verified email recorded per person, for
//!   Shared Signals `email` subjects.
//! - `accounts::users`: local accounts for the pages' sign-in.
//! - `accounts::connect`: connect-link records behind a refusal's
//!   `connect_uri`.
//! - `accounts::vault`: connected accounts, allowances, provider tokens at
//!   rest.
//! - `accounts::upstream`: the third-party providers (presets, account
//!   look-up, refresh, revocation) on the one OAuth client.
//!
//! `infra`: config, storage, and what an instance records.
//! - `infra::config`: the validated instance config.
//! - `infra::diagnostics`: TOML problems and their positions (config and
//!   policy).
//! - `infra::store`: storage behind a small trait (sled for one instance,
//!   PostgreSQL for replicas).
//! - `infra::seal`: encryption at rest.
//! - `infra::events`: audit events.
//! - `infra::metrics`: Prometheus metrics.
//! - `infra::skew`: this instance's clock against the shared store's (the
//!   offset, the bound, the corrected clock for shared writes).
//! - `infra::telemetry`: OpenTelemetry spans and metrics over OTLP
//!   (off unless `[telemetry]` names a collector).
//! - `infra::failpoint`: crash points for fault tests (`failpoints` feature
//!   only).
//!
//! Embed: the embedding API, re-exported from the embedder crate
//! `credbroker-verify` (`crates/credbroker-verify`, which a resource server
//! can depend on alone), so every group above may use it.
//! - [`verify`]: the resource-server side, for embedding.
//! - [`client`]: a client for the socket, for embedding.
//!
//! `base`: leaf building blocks.
//! - `base::http`: HTTP helpers every listener shares (body, JSON, body
//!   cap).
//! - `base::unix`: Unix helpers (own uid, socket binding).
//! - `base::oauth`: the one OAuth client of the sign-in and the provider
//!   connections (discovery, PKCE, code exchange, RFC 9207 `iss`).
//! - `base::dpop`: DPoP proofs, replay cache, nonces (from the embedder
//!   crate).
//! - `base::keyset`: one cached JWKS per issuer, pinned or fetched (from the
//!   embedder crate).
//! - `base::jose`: JWS, JWK and base64url building blocks (from the
//!   embedder crate).
//! - `base::grammar`: protocol grammar (scope tokens, https-or-loopback
//!   URLs).
//! - `base::secret`: secret types, redacted and zeroized (the type from the
//!   embedder crate).
//! - `base::clock`: the injected clock (from the embedder crate).
//!
//! Beside them, `fuzzing` is the parsers' surface for the fuzz targets.
//! Only [`verify`] and [`client`] are public; the rest is internal, reached
//! by the tests, fuzz targets, examples and benches through one hidden
//! `internals` module that is not a stable API.

#![forbid(unsafe_code)]

mod accounts;
mod app;
mod base;
mod cli;
pub mod client;
mod demo;
mod derive;
mod edge;
mod fuzzing;
mod infra;
#[doc(hidden)]
pub mod internals;
pub mod verify;
