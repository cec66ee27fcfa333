//! Issue #9's memory target, without a lab: an idle mirrored MySQL session (scripted login with
//! `--mysql-credentials`, one query and its reply, then a few idle seconds; `benches/traffic.rs`)
//! takes at most [`BOUND`] of the copier's memory, and the `--max-memory` budget charges it at
//! least what it takes.
//!
//! The target was 2 KiB, and this test held it for a session without the report's observer.
//! But the copier in MySQL mode always runs one (a command the test server failed or never
//! answered is a loss, so both answers of every command are followed), and the script did not
//! until issue 20's thirteenth session: an idle session took 4.5 KiB here, 4.37 KiB in the lab
//! (`bench/idle.sh`). The observer's queues now start at one and give their room back once idle:
//! 2.7 KiB. [`BOUND`] is that figure, not the target; the rest is the observer's own (its
//! 416-byte box, its own copy of each statement shape), docs/BENCHMARKS.md.
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

/// Bytes per idle mirrored MySQL session, report observer included (see the module docs).
const BOUND: usize = 2816;

// One test function: the counter is global, and tests run on parallel threads.
#[test]
fn an_idle_mysql_session_takes_at_most_its_bound_and_is_charged_for_it() {
    const N: usize = 2000;
    // Tables pre-sized as the copier's defaults size them (`--max-sessions 100000`); the
    // sessions' slots are in that allocation, so they are counted by their fixed size below.
    let mut t = Traffic::with_limit(Layer::MysqlCredentials, 0, 100_000);
    let before = CHUNKS.load(Ordering::Relaxed);
    t.open_sessions(N);
    t.round();
    // Idle: nothing for a few seconds (the lab measures 5 s after the last login).
    t.wait(std::time::Duration::from_secs(5));
    t.check().unwrap();
    while t.engine.poll_event().is_some() {}
    let heap = (CHUNKS.load(Ordering::Relaxed) - before) as usize / N;
    let per_session = heap + tcpshadow_core::engine::SESSION_FIXED_BYTES;
    let charged = t.engine.memory_used() / N;
    println!(
        "idle MySQL session: {heap} B of heap + {} B fixed = {per_session} B; charged {charged} B",
        tcpshadow_core::engine::SESSION_FIXED_BYTES
    );
    assert!(per_session <= BOUND, "{per_session} bytes per idle session");
    assert!(
        charged >= per_session,
        "--max-memory charges {charged} bytes for a session that takes {per_session}"
    );
}
