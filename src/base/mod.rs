//! Building blocks: leaf modules with no knowledge of the broker; each
//! imports only other building blocks. `dpop`, `keyset`, `jose`, `secret`
//! and `clock` are the embedder crate's (`crates/credbroker-verify`),
//! re-exported here so that the broker's paths stay `crate::base::...` and
//! one copy of the JOSE and DPoP checks serves the broker and resource
//! servers alike.
//!
//! - [`http`]: HTTP helpers every listener shares (body, JSON, body cap).
//! - [`unix`]: Unix helpers (own uid, socket binding).
//! - [`oauth`]: the one OAuth client of the sign-in and the provider
//!   connections (discovery, PKCE, code exchange, RFC 9207 `iss`).
//! - [`dpop`]: DPoP proofs, replay cache, nonces.
//! - [`keyset`]: one cached JWKS per issuer (pinned or fetched).
//! - [`jose`]: JWS, JWK and base64url building blocks.
//! - [`grammar`]: protocol grammar (scope tokens, https-or-loopback URLs).
//! - [`secret`]: secret types (redacted, zeroized).
//! - [`clock`]: the injected clock.

pub(crate) mod clock;
pub(crate) mod dpop;
pub(crate) mod grammar;
pub(crate) mod http;
pub(crate) mod jose;
pub(crate) mod keyset;
pub(crate) mod oauth;
pub(crate) mod secret;
pub(crate) mod unix;
