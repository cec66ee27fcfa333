//! The fuzz harnesses for the cargo-fuzz targets in `fuzz_targets/`. The code lives in the
//! workspace crate `tcpshadow-fuzz-harness` (`fuzz-harness/`), which the stable corpus replay
//! (`intercept/tests/fuzz_corpus.rs`) uses too; this crate only re-exports it under the name
//! the targets call (`tcpshadow_fuzz::wire`, ...).
pub use tcpshadow_fuzz_harness::*;
