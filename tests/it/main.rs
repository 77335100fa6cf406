//! The integration tests: one binary, one folder per feature (the layout of
//! rustls's `tests/api.rs`), with the shared helpers in `support/`, split by
//! role. One binary links the crate once instead of once per file.
//!
//! Run one feature with `cargo test --test it security::`, one test with its
//! full path (`cargo test --test it security::dpop::dpop_proof_replayed_twice`).

mod approvals;
mod contract;
mod deploy;
mod docs;
mod fuzz;
mod interop;
mod mcp;
mod operations;
mod pages;
mod policy;
mod proxy;
mod quickstart;
mod reference;
mod security;
mod services;
mod ssf;
mod store;
mod support;
mod telemetry;
mod upstreams;
