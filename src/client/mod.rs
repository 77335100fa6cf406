//! A small client for the orchestrator socket (and the admin socket): the
//! embedder crate's `credbroker_verify::client` (feature `client`),
//! re-exported so that code written against `credbroker::client` keeps
//! compiling.

pub use credbroker_verify::client::*;
