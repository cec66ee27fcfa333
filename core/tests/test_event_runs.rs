//! A run of one session's test events handed over at once (`Engine::on_test_events_at`, how
//! the copier's driver relays a reply's MySQL packets) does what the same events one at a
//! time do: the same bytes sent to the test server, the same counters, the same memory
//! charge. Driven by the engine benchmark's scripted sysbench-like traffic.

#[path = "../benches/traffic.rs"]
mod traffic;
use traffic::{Layer, Traffic};

fn run(layer: Layer, one_by_one: bool) -> Traffic {
    let mut t = Traffic::new(layer, 50);
    t.one_by_one = one_by_one;
    t.sent_hash = Some(0xcbf2_9ce4_8422_2325);
    for _ in 0..20 {
        t.round();
    }
    t.check().unwrap();
    t
}

#[test]
fn a_run_of_test_events_does_what_the_events_one_by_one_do() {
    for layer in [Layer::Mysql, Layer::MysqlCredentials] {
        let (runs, single) = (run(layer, false), run(layer, true));
        assert!(runs.packets_in >= 50 * 20 * Traffic::PACKETS_PER_ROUND);
        assert_eq!(runs.packets_in, single.packets_in, "{layer:?}");
        assert!(runs.packets_out > 0);
        assert_eq!(runs.packets_out, single.packets_out, "{layer:?}");
        assert_eq!(runs.bytes_out, single.bytes_out, "{layer:?}");
        assert_eq!(runs.sent_hash, single.sent_hash, "{layer:?}");
        assert_eq!(runs.engine.stats(), single.engine.stats(), "{layer:?}");
        assert_eq!(
            runs.engine.memory_used(),
            single.engine.memory_used(),
            "{layer:?}"
        );
    }
}
