//! Criterion benchmark of the session engine alone: scripted sysbench-like traffic of many
//! concurrent sessions (see `traffic.rs`), fake clock, no I/O. Reports input packets per
//! second (captured packets plus relayed feedback; `Throughput::Elements`), on one core.
//!
//!     cargo bench -p copier --bench engine
//!
//! Also prints the heap allocations per input packet in steady state (a counting global
//! allocator wraps the system one), which `tests/engine_allocs.rs` asserts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, Criterion, Throughput};

#[path = "traffic.rs"]
mod traffic;
use traffic::{Layer, Traffic};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per input packet over `rounds` rounds of every session, after one warm-up round.
fn allocs_per_packet(t: &mut Traffic, rounds: usize) -> f64 {
    t.round();
    let (a0, p0) = (ALLOCS.load(Ordering::Relaxed), t.packets_in);
    for _ in 0..rounds {
        t.round();
    }
    let (a1, p1) = (ALLOCS.load(Ordering::Relaxed), t.packets_in);
    (a1 - a0) as f64 / (p1 - p0) as f64
}

fn engine(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    for (layer, name) in [(Layer::Tcp, "tcp"), (Layer::Mysql, "mysql")] {
        for sessions in [1000usize, 10] {
            let mut t = Traffic::new(layer, sessions);
            t.check().expect("the script is accepted as real traffic");
            let allocs = allocs_per_packet(&mut t, 3);
            eprintln!(
                "engine/{name}/{sessions}: {allocs:.4} allocations per input packet in steady state"
            );
            group.throughput(Throughput::Elements(Traffic::PACKETS_PER_ROUND));
            let mut i = 0usize;
            group.bench_function(format!("{name}/{sessions}_sessions"), |b| {
                b.iter(|| {
                    t.round_of(i);
                    i += 1;
                    if i == sessions {
                        i = 0;
                    }
                })
            });
            t.check().expect("still accepted after the benchmark");
        }
    }
    group.finish();
}

criterion_group!(benches, engine);

/// `ENGINE_PROFILE=LAYER:SESSIONS:ROUNDS` (e.g. `tcp:1000:20`): no criterion, just the set-up
/// and ROUNDS rounds of every session, for `valgrind --tool=callgrind`. Instructions per
/// packet = the difference of two runs with different ROUNDS over the difference of their
/// input packets (printed), which cancels the set-up.
fn profile(spec: &str) {
    let parts: Vec<&str> = spec.split(':').collect();
    let layer = match parts.first() {
        Some(&"mysql") => Layer::Mysql,
        _ => Layer::Tcp,
    };
    let sessions = parts.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rounds = parts.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut t = Traffic::new(layer, sessions);
    let before = t.packets_in;
    for _ in 0..rounds {
        t.round();
    }
    t.check().expect("the script is accepted as real traffic");
    println!(
        "{} input packets in rounds, {} packets out",
        t.packets_in - before,
        t.packets_out
    );
}

fn main() {
    if let Ok(spec) = std::env::var("ENGINE_PROFILE") {
        profile(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
