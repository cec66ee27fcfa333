//! Issue #9's memory target, without a lab: an idle mirrored MySQL session (scripted login with
//! `--mysql-credentials`, one query and its reply; `benches/traffic.rs`) takes at most 2 KiB of
//! the copier's memory, and the `--max-memory` budget charges it at least what it takes.
//!
//! Deterministic: what is measured is the heap the sessions hold (a global allocator counts the
//! live bytes, with glibc's 8-byte headers and 16-byte rounding) plus the engine's fixed part
//! per session (its slot, index and timer entries), never a time or an RSS. The lab's figure
//! (`bench/idle.sh`, docs/BENCHMARKS.md) checks the same thing on the real process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

#[path = "../benches/traffic.rs"]
#[allow(dead_code)] // the script serves the benchmark too; only part of it is used here
mod traffic;
use traffic::{Layer, Traffic};

struct Counting;

/// Live heap bytes as glibc's malloc takes them.
static CHUNKS: AtomicI64 = AtomicI64::new(0);

/// 8 bytes of header, rounded up to 16, at least 32.
fn chunk(size: usize) -> i64 {
    ((size + 8 + 15) & !15).max(32) as i64
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        CHUNKS.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CHUNKS.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        CHUNKS.fetch_add(chunk(new_size) - chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// One test function: the counter is global, and tests run on parallel threads.
#[test]
fn an_idle_mysql_session_takes_at_most_2_kib_and_is_charged_for_it() {
    const N: usize = 2000;
    // Tables pre-sized as the copier's defaults size them (`--max-sessions 100000`); the
    // sessions' slots are in that allocation, so they are counted by their fixed size below.
    let mut t = Traffic::with_limit(Layer::MysqlCredentials, 0, 100_000);
    let before = CHUNKS.load(Ordering::Relaxed);
    t.open_sessions(N);
    t.round();
    t.check().unwrap();
    while t.engine.poll_event().is_some() {}
    let heap = (CHUNKS.load(Ordering::Relaxed) - before) as usize / N;
    let per_session = heap + tcpshadow_core::engine::SESSION_FIXED_BYTES;
    let charged = t.engine.memory_used() / N;
    println!(
        "idle MySQL session: {heap} B of heap + {} B fixed = {per_session} B; charged {charged} B",
        tcpshadow_core::engine::SESSION_FIXED_BYTES
    );
    assert!(per_session <= 2048, "{per_session} bytes per idle session");
    assert!(
        charged >= per_session,
        "--max-memory charges {charged} bytes for a session that takes {per_session}"
    );
}
