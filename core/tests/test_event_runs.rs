//! A run of one session's test events handed over at once (`Engine::on_test_events_at`, how
//! the copier's driver relays a reply's MySQL packets) does what the same events one at a
//! time do: the same bytes sent to the test server, the same counters, the same memory
//! charge. Driven by the engine benchmark's scripted sysbench-like traffic.

#[allow(dead_code)] // the script serves the benchmark too; only part of it is used here
#[path = "../benches/traffic.rs"]
mod traffic;
use tcpshadow_core::observation::Observation;
use traffic::{Layer, Relay, Traffic};

const SESSIONS: usize = 50;

fn run(layer: Layer, relay: Relay, block: Option<usize>) -> Traffic {
    let mut t = Traffic::new(layer, SESSIONS);
    t.relay = relay;
    t.sent_hash = Some(0xcbf2_9ce4_8422_2325);
    for _ in 0..20 {
        match block {
            Some(k) => t.block(k),
            None => t.round(),
        }
    }
    t.check().unwrap();
    t
}

#[test]
fn a_run_of_test_events_does_what_the_events_one_by_one_do() {
    for layer in [Layer::Mysql, Layer::MysqlCredentials] {
        // One reply a round; then ten rounds of every session in a batch, each session's ten
        // replies relayed as one run, a run a reply, or one by one.
        for block in [None, Some(10)] {
            let single = run(layer, Relay::OneByOne, block);
            let rounds = 20 * block.unwrap_or(1) as u64;
            assert!(single.packets_in >= SESSIONS as u64 * rounds * Traffic::PACKETS_PER_ROUND);
            assert!(single.packets_out > 0);
            for relay in [Relay::Reply, Relay::Session] {
                let runs = run(layer, relay, block);
                let what = format!("{layer:?}, {relay:?}, batches of {block:?}");
                assert_eq!(runs.packets_in, single.packets_in, "{what}");
                assert_eq!(runs.packets_out, single.packets_out, "{what}");
                assert_eq!(runs.bytes_out, single.bytes_out, "{what}");
                assert_eq!(runs.sent_hash, single.sent_hash, "{what}");
                // The same counters. Memory may differ by the report's outbox alone: a run's
                // observations wait in it until the run is settled, one by one each leaves at
                // once, and the charge counts the buffer's capacity (a few observations a
                // session, gone with the session).
                let (mut r, s) = (runs.engine.stats().clone(), single.engine.stats());
                let slack = (SESSIONS * 16 * std::mem::size_of::<Observation>()) as u64;
                for (run, one) in [
                    (r.memory_bytes, s.memory_bytes),
                    (r.memory_peak_bytes, s.memory_peak_bytes),
                    (
                        runs.engine.memory_used() as u64,
                        single.engine.memory_used() as u64,
                    ),
                ] {
                    assert!(
                        one <= run && run <= one + slack,
                        "{what}: memory {run} in runs, {one} one by one"
                    );
                }
                (r.memory_bytes, r.memory_peak_bytes) = (s.memory_bytes, s.memory_peak_bytes);
                assert_eq!(&r, s, "{what}");
            }
        }
    }
}
