//! The committed fuzz corpus, replayed without libFuzzer.
mod corpus;
