//! The fuzz harnesses, as a library: one function per parser of untrusted input, each taking
//! the fuzzer's raw bytes ([`TARGETS`] lists them by cargo-fuzz target name).
//!
//! Two users, one copy of the code: the cargo-fuzz targets in `fuzz/fuzz_targets/` (nightly,
//! coverage-guided; `fuzz/` depends on this crate by path and stays outside the workspace), and
//! `intercept/tests/fuzz_corpus.rs`, which replays every committed corpus file through the very
//! same functions in the ordinary stable `cargo test`. With the `seeds` feature, `seeds`
//! builds each target's seed inputs from real captured bytes.
//!
//! What a harness may and must never do is in the `harness` module's doc: panic only when the
//! code under test misbehaves, never do I/O or read a clock.

mod harness;
pub use harness::*;

#[cfg(feature = "seeds")]
pub mod seeds;
