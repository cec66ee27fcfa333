//! Criterion benchmark of the session engine alone: scripted sysbench-like traffic of many
//! concurrent sessions (see `traffic.rs`), fake clock, no I/O. Reports input packets per
//! second (captured packets plus relayed feedback; `Throughput::Elements`), on one core.
//!
//!     cargo bench -p tcpshadow-core --bench engine
//!
//! Also prints the heap allocations per input packet in steady state (a counting global
//! allocator wraps the system one), which `tests/engine_allocs.rs` asserts.

use common::alloc_count::{allocations, CountingAlloc};

use criterion::{criterion_group, Criterion, Throughput};

#[path = "traffic.rs"]
mod traffic;
use traffic::{Layer, Relay, Traffic};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Allocations per input packet over `rounds` rounds of every session, after one warm-up round.
fn allocs_per_packet(t: &mut Traffic, rounds: usize) -> f64 {
    t.round();
    let (a0, p0) = (allocations(), t.packets_in);
    for _ in 0..rounds {
        t.round();
    }
    let (a1, p1) = (allocations(), t.packets_in);
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

/// `--workers N` in miniature: N threads, each with its own engine and its own sessions (as the
/// kernel's flow-hash fan-out gives each worker its own connections), all driven at once.
/// Throughput is the sum over workers, so the figure shows how the engine scales with cores
/// (nothing is shared between workers but the allocator, which the steady state does not use).
fn workers(c: &mut Criterion) {
    let mut group = c.benchmark_group("workers");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for n in [1usize, 2, 4].into_iter().filter(|&n| n <= cores.max(2)) {
        let mut fleet: Vec<Traffic> = (0..n).map(|_| Traffic::new(Layer::Tcp, 1000)).collect();
        group.throughput(Throughput::Elements(Traffic::PACKETS_PER_ROUND * n as u64));
        group.bench_function(format!("tcp/1000_sessions_x{n}"), |b| {
            b.iter_custom(|iters| {
                let start = std::sync::Barrier::new(n);
                let began = std::time::Instant::now();
                std::thread::scope(|scope| {
                    for t in fleet.iter_mut() {
                        let start = &start;
                        scope.spawn(move || {
                            start.wait();
                            for i in 0..iters as usize {
                                t.round_of(i % 1000);
                            }
                        });
                    }
                });
                began.elapsed()
            })
        });
        for t in &fleet {
            t.check().expect("still accepted after the benchmark");
        }
    }
    group.finish();
}

criterion_group!(benches, engine, workers);

/// `ENGINE_PROFILE=LAYER:SESSIONS:ROUNDS` (e.g. `tcp:1000:20`): no criterion, just the set-up
/// and ROUNDS rounds of every session, for `valgrind --tool=callgrind`. Instructions per
/// packet = the difference of two runs with different ROUNDS over the difference of their
/// input packets (printed), which cancels the set-up. Further parts: `one-by-one` or
/// `per-reply` (how relayed summaries reach the engine, see `traffic::Relay`; default a
/// session's as one run, as the copier's driver does), `block=K` (each of ROUNDS is
/// `Traffic::block(K)`: K rounds of every session in one batch, as at a busy session's pace),
/// `ps` (every round a `COM_STMT_EXECUTE` of a prepared point select, as sysbench's lab load;
/// default a `COM_QUERY`), `churn=P` (each of ROUNDS is `Traffic::churn(P)`: every session's
/// connection closes and a new one logs in and prepares P statements; instructions per
/// *connection* = the difference of two runs over the difference of their connections,
/// printed).
fn profile(spec: &str) {
    let parts: Vec<&str> = spec.split(':').collect();
    let layer = match parts.first() {
        Some(&"mysql") => Layer::Mysql,
        _ => Layer::Tcp,
    };
    let sessions = parts.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rounds = parts.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let opts = &parts[parts.len().min(3)..];
    let option = |name: &str| {
        opts.iter()
            .find_map(|o| o.strip_prefix(name))
            .and_then(|k| k.parse::<usize>().ok())
    };
    let (block, churn) = (option("block="), option("churn="));
    // The old connections linger (10 s of the fake clock) while the new ones open.
    let limit = if churn.is_some() {
        2 * sessions
    } else {
        sessions
    };
    let mut t = Traffic::with_limit(layer, sessions, limit);
    t.relay = if opts.contains(&"one-by-one") {
        Relay::OneByOne
    } else if opts.contains(&"per-reply") {
        Relay::Reply
    } else {
        Relay::Session
    };
    if opts.contains(&"ps") {
        t.prepared();
    }
    let (before, connections) = (t.packets_in, t.connections);
    for _ in 0..rounds {
        match (block, churn) {
            (_, Some(p)) => t.churn(p),
            (Some(k), None) => t.block(k),
            (None, None) => t.round(),
        }
    }
    t.check().expect("the script is accepted as real traffic");
    println!(
        "{} input packets in rounds, {} packets out, {} connections opened in rounds",
        t.packets_in - before,
        t.packets_out,
        t.connections - connections
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
