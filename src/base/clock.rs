//! The injected clock: the embedder crate's [`credbroker_verify::clock`]
//! (the verifier takes the same one).

pub use credbroker_verify::clock::*;
