//! Strict JOSE building blocks (JWS, JWK, base64url, signing): the embedder
//! crate's [`credbroker_verify::jose`], re-exported so that the broker's
//! paths stay `crate::base::jose`. One copy serves the broker (subject
//! tokens, DPoP proofs, minted tokens) and resource servers alike.

pub use credbroker_verify::jose::*;
