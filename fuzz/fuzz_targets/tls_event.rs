#![no_main]
//! See `tcpshadow_fuzz::tls_event` (fuzz-harness/src/harness.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tcpshadow_fuzz::tls_event(data));
