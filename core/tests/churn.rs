//! The engine benchmark's connection churn (`Traffic::churn`: every connection closes its
//! statements, quits and closes; a new one logs in and prepares) is what it claims to be: the
//! engine ends every old session as completed, forwards every command and maps every prepared
//! statement, and releases the old sessions once they stop lingering. A benchmark of
//! connections the engine abandoned or never finished would measure the wrong path.

#[allow(dead_code)] // the script serves the benchmark too; only part of it is used here
#[path = "../benches/traffic.rs"]
mod traffic;
use traffic::{Layer, Traffic};

#[test]
fn churned_connections_complete_and_their_statements_are_mapped() {
    const SESSIONS: usize = 20;
    const ROUNDS: usize = 3;
    const PREPARES: usize = 22;
    for layer in [Layer::Tcp, Layer::Mysql, Layer::MysqlCredentials] {
        let mut t = Traffic::with_limit(layer, SESSIONS, 2 * SESSIONS);
        for _ in 0..ROUNDS {
            t.churn(PREPARES);
        }
        t.check().unwrap();
        let s = t.engine.stats();
        let ended = (SESSIONS * ROUNDS) as u64;
        assert_eq!(t.connections, ended + SESSIONS as u64, "{layer:?}");
        assert_eq!(s.sessions_active as usize, SESSIONS, "{layer:?}");
        assert_eq!(
            s.sessions_lingering, 0,
            "{layer:?}: released after the linger"
        );
        let closed: u64 = s.sessions_closed.iter().sum();
        assert_eq!(closed, ended, "{layer:?}: {:?}", s.sessions_closed);
        assert_eq!(
            s.closed(tcpshadow_core::engine::CloseReason::Completed),
            ended,
            "{layer:?}: every connection closes as completed: {:?}",
            s.sessions_closed
        );
        if layer == Layer::Tcp {
            continue;
        }
        let names = t.engine.transform_counter_names();
        let counter = |name: &str| {
            s.transform
                .named(names)
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, v)| v)
        };
        // The first connections logged in without prepares; every later one prepared.
        assert_eq!(
            counter("statements_mapped"),
            ended * PREPARES as u64,
            "{layer:?}"
        );
        // Every new connection's prepares, every ended one's COM_QUIT, and the closes of
        // those that had prepared (all but the first connections).
        let (prepares, quits) = (ended * PREPARES as u64, ended);
        let closes = (ROUNDS as u64 - 1) * SESSIONS as u64 * PREPARES as u64;
        assert_eq!(
            counter("commands_forwarded"),
            prepares + quits + closes,
            "{layer:?}"
        );
    }
}
