//! Where the copier's memory per idle mirrored session goes, without a lab: builds N sessions
//! in the sans-IO engine (scripted TCP handshakes, MySQL greeting and login with
//! `--mysql-credentials`, one query and its reply; `benches/traffic.rs`), leaves them idle, and
//! reports per session: the heap bytes the program asked for, glibc's estimate of what that
//! takes (chunk headers and rounding), the number of live allocations, the process's RSS
//! growth, what the `--max-memory` budget charges, and the in-line sizes of the parts.
//!
//!     cargo run --release -p tcpshadow-core --example idle_memory -- [SESSIONS] [tcp|mysql|credentials]
//!
//! The engine is configured as the copier's defaults configure it (`--max-sessions 100000`:
//! tables pre-sized for 65,536 sessions). The lab's figure (`bench/idle.sh`) adds what lies
//! outside the engine (the control channel's claimed set, allocator arenas of other threads).
//! This program must never do I/O beyond reading its own `/proc/self/status`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

#[path = "../benches/traffic.rs"]
#[allow(dead_code)] // the script serves the benchmark too; only part of it is used here
mod traffic;
use traffic::{Layer, Traffic};

/// Live allocations by requested size: 16-byte classes up to 4 KiB, then one for the rest.
const CLASSES: usize = 257;

struct Counting;

static BYTES: AtomicI64 = AtomicI64::new(0);
static CHUNKS: AtomicI64 = AtomicI64::new(0);
static COUNT: AtomicI64 = AtomicI64::new(0);
static BY_CLASS: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];
static BYTES_BY_CLASS: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];

/// What glibc's malloc takes for `size` bytes: 8 bytes of header, rounded up to 16, at least
/// 32 (large requests are mmap'ed whole pages; their touched pages show in the RSS instead).
fn chunk(size: usize) -> usize {
    ((size + 8 + 15) & !15).max(32)
}

fn class(size: usize) -> usize {
    (size.div_ceil(16)).min(CLASSES - 1)
}

fn note(size: usize, sign: i64) {
    BYTES.fetch_add(sign * size as i64, Ordering::Relaxed);
    CHUNKS.fetch_add(sign * chunk(size) as i64, Ordering::Relaxed);
    COUNT.fetch_add(sign, Ordering::Relaxed);
    BY_CLASS[class(size)].fetch_add(sign, Ordering::Relaxed);
    BYTES_BY_CLASS[class(size)].fetch_add(sign * size as i64, Ordering::Relaxed);
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 1);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(layout.size(), -1);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(layout.size(), -1);
        note(new_size, 1);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Snapshot {
    bytes: i64,
    chunks: i64,
    count: i64,
    classes: Vec<i64>,
    class_bytes: Vec<i64>,
    rss_kib: i64,
}

fn snapshot() -> Snapshot {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Snapshot {
        bytes: BYTES.load(Ordering::Relaxed),
        chunks: CHUNKS.load(Ordering::Relaxed),
        count: COUNT.load(Ordering::Relaxed),
        classes: BY_CLASS.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        class_bytes: BYTES_BY_CLASS
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect(),
        rss_kib,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let layer = match args.next().as_deref() {
        Some("tcp") => Layer::Tcp,
        Some("mysql") => Layer::Mysql,
        _ => Layer::MysqlCredentials,
    };
    let mut t = Traffic::with_limit(layer, 0, 100_000);
    let a = snapshot();
    t.open_sessions(n);
    t.round();
    // Idle: nothing for a few seconds, as the lab measures (bench/idle.sh: 5 s after the last
    // login).
    t.wait(std::time::Duration::from_secs(5));
    t.check().expect("every session live");
    while t.engine.poll_event().is_some() {}
    let b = snapshot();
    let per = |x: i64| x as f64 / n as f64;
    println!("{n} idle sessions, {layer:?}, tables sized for --max-sessions 100000");
    println!(
        "heap asked for   {:8.0} B/session in {:.2} allocations",
        per(b.bytes - a.bytes),
        per(b.count - a.count)
    );
    println!(
        "heap with glibc  {:8.0} B/session (8-byte headers, 16-byte rounding, 32 minimum)",
        per(b.chunks - a.chunks)
    );
    println!(
        "RSS growth       {:8.0} B/session (includes the engine's pre-sized tables as they are touched, and the script's 32 B/session)",
        per((b.rss_kib - a.rss_kib) * 1024)
    );
    println!(
        "budget charges   {:8.0} B/session (--max-memory accounting)",
        per(t.engine.memory_used() as i64)
    );
    println!("live allocations per session by requested size:");
    let mut rows: Vec<(usize, i64, i64)> = (0..CLASSES)
        .map(|c| {
            (
                c,
                b.classes[c] - a.classes[c],
                b.class_bytes[c] - a.class_bytes[c],
            )
        })
        .filter(|&(_, k, _)| k != 0)
        .collect();
    rows.sort_by_key(|&(_, _, bytes)| std::cmp::Reverse(bytes));
    for (c, k, bytes) in rows.iter().take(20) {
        let range = if *c == CLASSES - 1 {
            "> 4096".to_string()
        } else {
            format!("{:4}..={:4}", (c * 16).saturating_sub(15), c * 16)
        };
        println!(
            "  {range:>12} B: {:6.2} allocations, {:7.1} B/session",
            per(*k),
            per(*bytes)
        );
    }
    println!("in-line sizes:");
    for (name, size) in tcpshadow_core::engine::session_layout()
        .into_iter()
        .chain(tcpshadow_core::mysql::session_layout())
    {
        println!("  {name:32} {size:6} B");
    }
}
