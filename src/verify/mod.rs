//! The resource-server side: verifying a credbroker token and its DPoP proof
//! on an incoming request (RFC 9449 section 7, RFC 9068).
//!
//! This is the embedder crate `credbroker-verify`
//! (`crates/credbroker-verify/`), re-exported: a resource server that does
//! not want the broker's dependencies depends on that crate alone, and code
//! written against `credbroker::verify` keeps compiling.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use credbroker::verify::{Verifier, Presented};
//! let v = Verifier::from_issuer("https://broker.example", "https://api.example/").await?;
//! let who = v.verify(&Presented {
//!     method: "GET",
//!     url: "https://api.example/items?page=2",
//!     authorization: Some("DPoP eyJ..."),
//!     dpop: &["eyJ..."],
//! })?;
//! println!("{} via tool {}", who.sub, who.tool);
//! # Ok(()) }
//! ```

/// Request binding's digest (`req_sha256`; docs/APPROVALS.md, "The request, bound").
pub use credbroker_verify::request;
pub use credbroker_verify::{
    Clock, DpopError, JoseError, ManualClock, Presented, SharedClock, SystemClock, Verified,
    Verifier, VerifyError, JWKS_REFRESH_INTERVAL, MAX_KEYS_DOCUMENT, MAX_TOKEN_LEN, SKEW,
};

#[cfg(test)]
mod tests;
