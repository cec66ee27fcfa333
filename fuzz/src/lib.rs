//! The fuzz harnesses, as a library for the cargo-fuzz targets in `fuzz_targets/`. The code is
//! in `harness.rs`, which `intercept/tests/fuzz_corpus.rs` also includes on stable.
mod harness;
pub use harness::*;
