//! The session engine's per-packet path allocates nothing in steady state: a counting global
//! allocator wraps the system one while scripted sysbench-like traffic (`benches/traffic.rs`)
//! runs through the engine, with and without the MySQL layer.
//!
//! Steady state means every session already exists and its buffers have grown to the
//! traffic's size (one warm-up round); opening a session allocates (its buffers, its
//! transform), and that is per connection, not per packet.

use common::alloc_count::{allocations, CountingAlloc};

#[allow(dead_code)] // the script serves the benchmark too; only part of it is used here
#[path = "../benches/traffic.rs"]
mod traffic;
use traffic::{Layer, Traffic};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Allocations while every one of `sessions` sessions does `rounds` rounds, after a warm-up
/// round; and the input packets of those rounds. With `prepared`, every round executes a
/// prepared statement (`Traffic::prepared`), as the lab's sysbench does.
fn steady_state(layer: Layer, sessions: usize, rounds: usize, prepared: bool) -> (u64, u64) {
    let mut t = Traffic::new(layer, sessions);
    if prepared {
        t.prepared();
    }
    t.check().unwrap();
    t.round();
    let (a0, p0) = (allocations(), t.packets_in);
    for _ in 0..rounds {
        t.round();
    }
    let (a1, p1) = (allocations(), t.packets_in);
    t.check().unwrap();
    (a1 - a0, p1 - p0)
}

/// The same with every round a batch of `k` rounds of every session (`Traffic::block`).
fn steady_blocks(
    layer: Layer,
    sessions: usize,
    blocks: usize,
    k: usize,
    prepared: bool,
) -> (u64, u64) {
    let mut t = Traffic::new(layer, sessions);
    if prepared {
        t.prepared();
    }
    t.block(k);
    let (a0, p0) = (allocations(), t.packets_in);
    for _ in 0..blocks {
        t.block(k);
    }
    let (a1, p1) = (allocations(), t.packets_in);
    t.check().unwrap();
    (a1 - a0, p1 - p0)
}

// One test function: the counter is global, and tests run on parallel threads.
#[test]
fn no_allocation_per_packet_in_steady_state() {
    let shapes = [
        (Layer::Tcp, false),
        (Layer::Mysql, false),
        (Layer::MysqlCredentials, false),
        (Layer::Mysql, true),
        (Layer::MysqlCredentials, true),
    ];
    for (layer, prepared) in shapes {
        let (allocs, packets) = steady_state(layer, 200, 20, prepared);
        assert_eq!(packets, 200 * 20 * Traffic::PACKETS_PER_ROUND);
        assert_eq!(
            allocs, 0,
            "{layer:?} (prepared: {prepared}): {allocs} allocations for {packets} input packets"
        );
        let (allocs, packets) = steady_blocks(layer, 8, 20, 10, prepared);
        assert_eq!(packets, 8 * 20 * 10 * Traffic::PACKETS_PER_ROUND);
        assert_eq!(
            allocs, 0,
            "{layer:?} (prepared: {prepared}) in batches: {allocs} allocations for {packets} \
             input packets"
        );
    }
}
