//! Approvals where the clock must move: the pages in-process on a manual
//! clock (tests/it/support/pages.rs) with the real approval store, local
//! accounts for sign-in, and derives through the real pipeline.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
