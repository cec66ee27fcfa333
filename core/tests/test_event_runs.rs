//! A run of one session's test events handed over at once (`Engine::on_test_events_at`, how
//! the copier's driver relays a reply's MySQL packets) does what the same events one at a
//! time do: the same bytes sent to the test server, the same counters, the same memory
//! charge. Driven by the engine benchmark's scripted sysbench-like traffic.

#[path = "../benches/traffic.rs"]
mod traffic;
use traffic::{Layer, Relay, Traffic};

fn run(layer: Layer, relay: Relay, block: Option<usize>) -> Traffic {
    let mut t = Traffic::new(layer, 50);
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
            assert!(single.packets_in >= 50 * rounds * Traffic::PACKETS_PER_ROUND);
            assert!(single.packets_out > 0);
            for relay in [Relay::Reply, Relay::Session] {
                let runs = run(layer, relay, block);
                let what = format!("{layer:?}, {relay:?}, batches of {block:?}");
                assert_eq!(runs.packets_in, single.packets_in, "{what}");
                assert_eq!(runs.packets_out, single.packets_out, "{what}");
                assert_eq!(runs.bytes_out, single.bytes_out, "{what}");
                assert_eq!(runs.sent_hash, single.sent_hash, "{what}");
                assert_eq!(runs.engine.stats(), single.engine.stats(), "{what}");
                assert_eq!(
                    runs.engine.memory_used(),
                    single.engine.memory_used(),
                    "{what}"
                );
            }
        }
    }
}
