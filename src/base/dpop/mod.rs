//! DPoP proofs (RFC 9449): validation, the `jti` replay cache and server
//! nonces, from the embedder crate's [`credbroker_verify::dpop`]: the same
//! validator serves the broker's derive and resource servers' verifiers.

pub use credbroker_verify::dpop::*;
