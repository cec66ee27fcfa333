//! Fault recovery with a fake clock: sessions that lost only their test-side connection come
//! back through the pickup path, paced while the test server is away; a test server still
//! holding an older connection on our 4-tuple has it reset.

use std::net::SocketAddrV4;
use std::time::Duration;

use common::wire::{TcpFlags, TcpOptions};

use super::recovery::{HOLD_MIN, PROBE_MAX, PROBE_MIN};
use super::tests::{cat, cfg, ms, Sent, C, CLIENT, H, T};
use super::{CloseReason, EngineConfig, EngineEvent};

const SYN: u8 = TcpFlags::SYN;
const ACK: u8 = TcpFlags::ACK;
const FIN: u8 = TcpFlags::FIN;
const RST: u8 = TcpFlags::RST;
const PSH: u8 = TcpFlags::PSH;

fn pickup_cfg() -> EngineConfig {
    let mut c = cfg();
    c.pickup_midstream = true;
    c
}

fn syns(sent: &[Sent]) -> Vec<&Sent> {
    sent.iter().filter(|s| s.flags == SYN).collect()
}

/// An established session that sent "abc" and then was reset by the test server.
fn reset_by_test(h: &mut H) {
    h.establish();
    h.client(C.wrapping_add(1), ACK | PSH, b"abc");
    h.drain();
    h.fb(T + 1, C.wrapping_add(4), ACK, 65535, 0);
    h.fb(T + 1, 0, RST, 0, 0);
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert!(h.drain().is_empty(), "no answer to the test server's RST");
}

fn reestablished(h: &H, reason: CloseReason) -> u64 {
    h.e.stats().sessions_reestablished[reason.index()]
}

#[test]
fn a_session_reset_by_the_test_server_comes_back_on_the_clients_next_data() {
    let mut h = H::new(pickup_cfg());
    reset_by_test(&mut h);
    assert_eq!(h.e.stats().sessions_awaiting_reestablish, 1);
    // A pure ACK does not bring it back: there is nothing to start a stream from.
    h.client(C.wrapping_add(4), ACK, b"");
    assert!(h.drain().is_empty());
    assert_eq!(reestablished(&h, CloseReason::TestReset), 0);

    h.client(C.wrapping_add(4), ACK | PSH, b"def");
    assert_eq!(
        h.events(),
        vec![
            EngineEvent::SessionReleased { mirrored: CLIENT },
            EngineEvent::SessionOpened {
                client: CLIENT,
                mirrored: CLIENT,
                picked_up: true
            },
        ]
    );
    let syn = h.drain();
    assert_eq!(syn.len(), 1);
    assert_eq!((syn[0].flags, syn[0].seq), (SYN, C.wrapping_add(3)));
    assert_eq!(reestablished(&h, CloseReason::TestReset), 1);
    assert_eq!(h.e.stats().sessions_awaiting_reestablish, 0);
    assert_eq!(h.e.stats().sessions_picked_up, 1);

    // The new session carries on from the packet that brought it back.
    h.fb(T + 500, C.wrapping_add(4), SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out[0].payload, b"def");
    assert_eq!(out[0].seq, C.wrapping_add(4));
}

#[test]
fn sessions_that_ended_on_the_client_side_stay_closed() {
    for ending in ["client rst", "prod rst", "client fin"] {
        let mut h = H::new(pickup_cfg());
        h.establish();
        let s = C.wrapping_add(1);
        match ending {
            "client rst" => h.client(s, RST, b""),
            "prod rst" => h.prod(s, RST | ACK),
            _ => {
                h.client(s, ACK | FIN, b"");
                h.drain();
                // The test server resets instead of closing.
                h.fb(T + 1, 0, RST, 0, 0);
            }
        }
        h.drain();
        h.client(s.wrapping_add(1), ACK | PSH, b"late");
        assert!(syns(&h.drain()).is_empty(), "{ending}: no new SYN");
        assert_eq!(h.e.stats().reestablished_total(), 0, "{ending}");
        assert_eq!(h.e.stats().sessions_awaiting_reestablish, 0, "{ending}");
    }
}

#[test]
fn without_pickup_nothing_is_reestablished() {
    let mut h = H::default();
    reset_by_test(&mut h);
    h.client(C.wrapping_add(4), ACK | PSH, b"def");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().reestablished_total(), 0);
    assert_eq!(h.e.stats().sessions_awaiting_reestablish, 0);
}

#[test]
fn a_handshake_timeout_of_a_client_that_never_finished_its_own_is_not_reestablished() {
    let mut h = H::new(pickup_cfg());
    h.client(C, SYN, b"");
    h.drain();
    // The test server answers, the client never acknowledges production's SYN-ACK.
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    h.run_for(Duration::from_secs(11));
    assert_eq!(h.closed_reason(), Some(CloseReason::HandshakeTimeout));
    assert_eq!(h.e.stats().sessions_awaiting_reestablish, 0);
}

/// `n` established sessions (client ports 40000..), each reset by the test server.
fn many_reset(h: &mut H, n: u16) -> Vec<SocketAddrV4> {
    let clients: Vec<_> = (0..n)
        .map(|i| SocketAddrV4::new(*CLIENT.ip(), 40000 + i))
        .collect();
    for &c in &clients {
        h.mirrored = c;
        h.client_from(c, C, SYN, b"", TcpOptions::default());
        h.drain();
        h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
        h.client_from(c, C.wrapping_add(1), ACK, b"", TcpOptions::default());
        h.drain();
        h.fb(T + 1, 0, RST, 0, 0);
    }
    h.events();
    assert_eq!(u64::from(n), h.e.stats().sessions_awaiting_reestablish);
    clients
}

fn client_data(h: &mut H, clients: &[SocketAddrV4], seq: u32) -> Vec<Sent> {
    for &c in clients {
        h.client_from(c, seq, ACK | PSH, b"q", TcpOptions::default());
    }
    h.drain()
}

#[test]
fn while_the_test_server_refuses_one_probe_per_interval_then_all_come_back() {
    let mut h = H::new(pickup_cfg());
    let clients = many_reset(&mut h, 50);
    let mut seq = C.wrapping_add(1);
    // The first to send data tries at once and is refused (the server is restarting).
    h.client_from(clients[0], seq, ACK | PSH, b"q", TcpOptions::default());
    let syn = h.drain();
    assert_eq!(syns(&syn).len(), 1);
    h.mirrored = clients[0];
    h.fb(0, syn[0].seq.wrapping_add(1), RST | ACK, 0, 0);
    assert_eq!(h.e.stats().closed(CloseReason::TestRefused), 1);

    // Every client keeps sending: at most one SYN per probe interval, whatever their number.
    let mut probes = 0;
    let mut elapsed = Duration::ZERO;
    while elapsed < Duration::from_secs(2) {
        seq = seq.wrapping_add(1);
        let sent = client_data(&mut h, &clients, seq);
        let out = syns(&sent);
        assert!(out.len() <= 1, "{} SYNs at once", out.len());
        if let Some(probe) = out.first() {
            probes += 1;
            h.mirrored = probe.src;
            h.fb(0, probe.seq.wrapping_add(1), RST | ACK, 0, 0);
        }
        h.advance(ms(5));
        elapsed += ms(5);
    }
    let most = (2000 / PROBE_MIN.as_millis()) as u32;
    let least = (2000 / PROBE_MAX.as_millis()) as u32 / 2;
    assert!(
        probes >= least && probes <= most,
        "{probes} probes in 2 s (interval {PROBE_MIN:?}..{PROBE_MAX:?})"
    );
    assert!(h.e.stats().reestablish_deferred > 1000);

    // The server is back: the next probe is accepted, and then every session returns at once.
    let mut back = None;
    for _ in 0..100 {
        seq = seq.wrapping_add(1);
        let sent = client_data(&mut h, &clients, seq);
        if let Some(probe) = syns(&sent).first() {
            back = Some((probe.src, probe.seq));
            break;
        }
        h.advance(ms(5));
    }
    let (probe, iss) = back.expect("a probe within PROBE_MAX");
    h.mirrored = probe;
    h.fb(T, iss.wrapping_add(1), SYN | ACK, 65535, 0);
    h.drain();
    seq = seq.wrapping_add(1);
    let sent = client_data(&mut h, &clients, seq);
    assert_eq!(syns(&sent).len(), 49, "all the others come back together");
    assert_eq!(h.e.stats().sessions_awaiting_reestablish, 0);
    assert!(h.e.stats().reestablished_total() >= 50);
}

#[test]
fn a_session_reset_again_right_after_coming_back_waits_longer_each_time() {
    let mut h = H::new(pickup_cfg());
    reset_by_test(&mut h);
    let mut seq = C.wrapping_add(4);
    let mut waits = Vec::new();
    for _ in 0..4 {
        // Comes back on the first data it is allowed to.
        let start = h.now;
        let syn = loop {
            h.client(seq, ACK | PSH, b"x");
            seq = seq.wrapping_add(1);
            if let Some(s) = h.drain().into_iter().find(|s| s.flags == SYN) {
                break s;
            }
            h.advance(ms(10));
        };
        waits.push(h.now - start);
        // Accepted, then reset at once (say the test server refuses the login).
        h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
        h.drain();
        h.fb(T + 1, 0, RST, 0, 0);
        h.drain();
    }
    assert_eq!(
        waits[0],
        Duration::ZERO,
        "the first loss comes back at once"
    );
    assert!(waits[1] >= HOLD_MIN, "{waits:?}");
    assert!(waits[2] >= HOLD_MIN * 2, "{waits:?}");
    assert!(waits[3] >= HOLD_MIN * 4, "{waits:?}");
}

#[test]
fn what_the_client_sent_while_the_test_server_was_away_is_replayed_first() {
    let mut h = H::new(pickup_cfg());
    reset_by_test(&mut h);
    // The client's next command brings the session back at once, but the test server is
    // restarting: refused.
    h.client(C.wrapping_add(4), ACK | PSH, b"def");
    let syn = syns(&h.drain())[0].clone();
    h.fb(0, syn.seq.wrapping_add(1), RST | ACK, 0, 0);
    assert_eq!(h.e.stats().closed(CloseReason::TestRefused), 1);
    // The next one waits for the gate's probe interval: held, with the refused one's.
    h.client(C.wrapping_add(7), ACK | PSH, b"ghi");
    assert!(h.drain().is_empty());
    h.advance(PROBE_MIN * 2);
    h.client(C.wrapping_add(10), ACK | PSH, b"jkl");
    let syn = syns(&h.drain())[0].clone();
    assert_eq!(
        syn.seq,
        C.wrapping_add(3),
        "the new stream starts at the first held byte"
    );
    h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
    let out = h.drain();
    let data: Vec<u8> = out.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(data, b"defghijkl");
    assert_eq!(out[0].seq, C.wrapping_add(4));
    let st = h.e.stats();
    assert_eq!((st.held_bytes_replayed, st.held_bytes_lost), (6, 0));
    // Once the test server has it, nothing stays held: later bytes are not kept.
    h.client(C.wrapping_add(13), ACK | PSH, b"mno");
    assert_eq!(cat(&h.drain()), b"mno");
    h.fb(T + 1, C.wrapping_add(16), ACK, 65535, 0);
    assert_eq!(h.e.queued_bytes(), 0);
}

#[test]
fn a_run_longer_than_an_ip_packet_is_replayed_whole() {
    let mut h = H::new(pickup_cfg());
    reset_by_test(&mut h);
    let mut seq = C.wrapping_add(4);
    let mut sent = Vec::new();
    h.client(seq, ACK | PSH, &[1]);
    sent.push(1u8);
    seq = seq.wrapping_add(1);
    let syn = syns(&h.drain())[0].clone();
    h.fb(0, syn.seq.wrapping_add(1), RST | ACK, 0, 0);
    // 200 KB while the gate waits (one 1000-byte command at a time).
    for i in 0..200u32 {
        let cmd = vec![(i % 251) as u8; 1000];
        h.client(seq, ACK | PSH, &cmd);
        seq = seq.wrapping_add(1000);
        sent.extend_from_slice(&cmd);
    }
    assert!(syns(&h.drain()).is_empty());
    h.advance(PROBE_MIN * 2);
    h.client(seq, ACK | PSH, b"z");
    sent.push(b'z');
    let syn = syns(&h.drain())[0].clone();
    h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
    let mut got = cat(&h.drain());
    // The window of 65535 lets part go; each ACK lets more.
    let mut acked = C.wrapping_add(4).wrapping_add(got.len() as u32);
    while got.len() < sent.len() {
        h.fb(T + 1, acked, ACK, 65535, 0);
        let more = cat(&h.drain());
        assert!(
            !more.is_empty(),
            "stalled at {} of {}",
            got.len(),
            sent.len()
        );
        acked = acked.wrapping_add(more.len() as u32);
        got.extend(more);
    }
    assert_eq!(got, sent);
    assert_eq!(h.e.stats().client_segments_dropped, 0);
    assert_eq!(h.e.stats().held_bytes_replayed, 200_001);
}

#[test]
fn a_hold_beyond_the_session_buffer_is_lost_and_counted() {
    let mut c = pickup_cfg();
    c.max_session_buffer = 4;
    let mut h = H::new(c);
    reset_by_test(&mut h);
    h.client(C.wrapping_add(4), ACK | PSH, b"def");
    let syn = syns(&h.drain())[0].clone();
    h.fb(0, syn.seq.wrapping_add(1), RST | ACK, 0, 0);
    h.client(C.wrapping_add(7), ACK | PSH, b"ghi"); // 6 bytes: over the bound
    assert_eq!(h.e.stats().held_bytes_lost, 6);
    h.advance(PROBE_MIN * 2);
    h.client(C.wrapping_add(10), ACK | PSH, b"jkl");
    let syn = syns(&h.drain())[0].clone();
    assert_eq!(
        syn.seq,
        C.wrapping_add(9),
        "starts again from what came after"
    );
}

#[test]
fn a_quiet_waiting_session_holds_no_bytes_and_is_forgotten() {
    let mut h = H::new(pickup_cfg());
    reset_by_test(&mut h);
    assert_eq!(h.e.queued_bytes(), 0);
    h.run_for(Duration::from_secs(11));
    assert!(h
        .events()
        .contains(&EngineEvent::SessionReleased { mirrored: CLIENT }));
    assert_eq!(h.e.stats().sessions_awaiting_reestablish, 0);
    assert_eq!(h.e.stats().sessions_lingering, 0);
}

#[test]
fn an_older_connection_on_our_tuple_is_drained_then_reset_and_our_syn_repeated() {
    use super::session::STALE_QUIET;
    let mut h = H::new(pickup_cfg());
    let s = 123_456;
    h.client(s, ACK | PSH, b"SELECT 1");
    let syn = h.drain();
    assert_eq!((syn[0].flags, syn[0].seq), (SYN, s - 1));
    // The test server still has the connection the killed copier left: challenge ACK. It is
    // acknowledged in its own sequence space, not reset yet.
    h.fb(T + 77, 999_999, ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].flags, out[0].seq, out[0].ack),
        (ACK, 999_999, T + 77)
    );
    // What intercept frames of its replies meanwhile is not ours: dropped, counted.
    let ev = common::control::MysqlEvent::FramingLost {
        client: h.mirrored,
        at_seq: T + 77,
    };
    h.e.on_test_event(h.now, h.mirrored, &super::TestEvent::Mysql(&ev));
    assert_eq!(h.e.stats().stale_test_events, 1);
    // It still runs the killed copier's commands: each reply is acknowledged, and keeps it
    // alive.
    h.advance(STALE_QUIET / 2);
    h.fb(T + 77, 999_999, ACK | PSH, 65535, 40);
    let out = h.drain();
    assert_eq!((out[0].flags, out[0].ack), (ACK, T + 117));
    h.advance(STALE_QUIET / 2 + ms(1));
    assert!(h.drain().is_empty(), "reset while it still answers");
    assert_eq!(h.e.stats().stale_test_connections_reset, 0);
    // Quiet: the RST (exactly in its window), then our SYN at once.
    h.advance(STALE_QUIET);
    let out = h.drain();
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!((out[0].flags, out[0].seq), (RST, 999_999));
    assert_eq!((out[1].flags, out[1].seq), (SYN, s - 1));
    assert_eq!(h.e.stats().stale_test_connections_reset, 1);
    assert_eq!(h.e.stats().stale_replies_drained, 1);
    // Then the handshake completes as usual and the data flows.
    h.fb(T, s, SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out[0].payload, b"SELECT 1");
    // A RST, or the ACK of our own SYN, is never answered that way.
    assert_eq!(h.e.stats().stale_test_connections_reset, 1);
}

#[test]
fn an_older_connection_that_never_goes_quiet_is_reset_after_a_bound() {
    use super::session::{STALE_MAX, STALE_QUIET};
    let mut h = H::new(pickup_cfg());
    let s = 5_000;
    h.client(s, ACK | PSH, b"SELECT 1");
    h.drain();
    let mut seq = T;
    let start = h.now;
    let mut reset_at = None;
    while h.now - start < STALE_MAX + STALE_QUIET * 2 {
        h.fb(seq, 42, ACK | PSH, 65535, 10);
        seq += 10;
        if h.drain().iter().any(|o| o.flags == RST) {
            reset_at = Some(h.now - start);
            break;
        }
        h.advance(STALE_QUIET / 5);
    }
    let at = reset_at.expect("never reset");
    assert!(at >= STALE_MAX && at <= STALE_MAX + STALE_QUIET, "{at:?}");
}

#[test]
fn a_long_outage_slows_the_probes_down_to_one_a_second() {
    use super::recovery::{PROBE_PATIENT_AFTER, PROBE_SLOW_MAX};
    let mut h = H::new(pickup_cfg());
    let clients = many_reset(&mut h, 10);
    let mut seq = C.wrapping_add(1);
    let mut probes_at = Vec::new();
    let start = h.now;
    while h.now - start < PROBE_PATIENT_AFTER + Duration::from_secs(10) {
        seq = seq.wrapping_add(1);
        let sent = client_data(&mut h, &clients, seq);
        for probe in syns(&sent) {
            probes_at.push(h.now - start);
            h.mirrored = probe.src;
            h.fb(0, probe.seq.wrapping_add(1), RST | ACK, 0, 0);
        }
        h.advance(ms(10));
    }
    let late = probes_at
        .iter()
        .filter(|t| **t > PROBE_PATIENT_AFTER + PROBE_SLOW_MAX)
        .count();
    assert!(late <= 10, "{late} probes in the last 9 s: {probes_at:?}");
    assert!(late >= 7, "probing goes on: {probes_at:?}");
}

/// A line protocol for the replay tests: every `\n`-ended line is a request, every segment of
/// the test server's with data answers the oldest one.
struct Lines {
    fed: u64,
    /// Where each request not answered yet starts.
    unanswered: std::collections::VecDeque<u64>,
    at_line_start: bool,
    calls: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl super::StreamTransform for Lines {
    fn on_client_data(
        &mut self,
        _: common::clock::Instant,
        data: &[u8],
        out: &mut super::TransformOutput<'_>,
    ) {
        for &b in data {
            if self.at_line_start {
                self.unanswered.push_back(self.fed);
            }
            self.fed += 1;
            self.at_line_start = b == b'\n';
        }
        out.push(data);
    }

    fn on_test_event(
        &mut self,
        _: common::clock::Instant,
        ev: &super::TestEvent<'_>,
        out: &mut super::TransformOutput<'_>,
    ) {
        if ev.segment().is_some_and(|s| s.in_order_payload().is_some()) {
            self.unanswered.pop_front();
            out.settled();
        }
    }

    fn replays(&self) -> bool {
        true
    }

    fn client_offset(&self) -> u64 {
        self.fed
    }

    fn replay_from(&self) -> Option<u64> {
        match self.unanswered.front() {
            Some(&at) => Some(at),
            None => self.at_line_start.then_some(self.fed),
        }
    }

    fn carried_over(&mut self) {
        self.calls.lock().unwrap().push("carried_over");
    }

    fn on_replayed(&mut self, _: common::clock::Instant, _: &mut super::TransformOutput<'_>) {
        self.calls.lock().unwrap().push("replayed");
    }
}

fn lines_engine() -> (H, std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>) {
    lines_engine_with(pickup_cfg())
}

fn lines_engine_with(
    cfg: EngineConfig,
) -> (H, std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>) {
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let c = calls.clone();
    let factory = move |_: common::clock::Instant, _: &super::SessionInfo| {
        Some(Box::new(Lines {
            fed: 0,
            unanswered: Default::default(),
            at_line_start: true,
            calls: c.clone(),
        }) as Box<dyn super::StreamTransform>)
    };
    (H::with_factory(cfg, Box::new(factory)), calls)
}

#[test]
fn what_the_lost_connection_had_not_answered_is_replayed_ahead_of_the_rest() {
    let (mut h, calls) = lines_engine();
    h.establish();
    h.client(C.wrapping_add(1), ACK | PSH, b"a\nbb\nc\n");
    assert_eq!(cat(&h.drain()), b"a\nbb\nc\n");
    // The test server has all of it, answers the first request, then restarts.
    h.fb(T + 1, C.wrapping_add(8), ACK | PSH, 65535, 5);
    h.fb(T + 6, 0, RST, 0, 0);
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert_eq!(*calls.lock().unwrap(), ["carried_over"]);
    assert_eq!(h.e.stats().held_bytes_carried, 5, "bb and c, unanswered");
    // The client's next request brings it back: the unanswered ones go first.
    h.client(C.wrapping_add(8), ACK | PSH, b"d\n");
    let syn = syns(&h.drain())[0].clone();
    assert_eq!(syn.seq, C.wrapping_add(2), "the stream starts before `bb`");
    h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
    assert_eq!(cat(&h.drain()), b"bb\nc\nd\n");
    assert_eq!(*calls.lock().unwrap(), ["carried_over", "replayed"]);
    let st = h.e.stats();
    assert_eq!((st.held_bytes_replayed, st.held_bytes_lost), (5, 0));
}

/// Established, one request sent and answered, then the test server resets the connection.
fn answered_then_reset(h: &mut H) {
    h.establish();
    h.client(C.wrapping_add(1), ACK | PSH, b"a\n");
    h.drain();
    h.fb(T + 1, C.wrapping_add(3), ACK | PSH, 65535, 5);
    h.fb(T + 6, 0, RST, 0, 0);
}

#[test]
fn a_connection_lost_with_everything_answered_replays_nothing_of_its_own() {
    let (mut h, calls) = lines_engine();
    answered_then_reset(&mut h);
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert!(calls.lock().unwrap().is_empty());
    h.client(C.wrapping_add(3), ACK | PSH, b"b\n");
    let syn = syns(&h.drain())[0].clone();
    assert_eq!(syn.seq, C.wrapping_add(2));
    h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
    assert_eq!(cat(&h.drain()), b"b\n");
    assert!(calls.lock().unwrap().is_empty(), "nothing was replayed");
    assert_eq!(h.e.stats().held_bytes_carried, 0);
}

#[test]
fn near_the_memory_budget_a_replay_log_stops_growing_and_nothing_partial_is_carried() {
    // The same script twice: once to learn what the session is charged with its first
    // request unanswered, then with a budget that leaves the log no room to grow past it.
    fn script(h: &mut H) {
        h.establish();
        h.client(C.wrapping_add(1), ACK | PSH, b"a\n");
        h.drain();
    }
    let (mut probe, _) = lines_engine();
    script(&mut probe);
    let used = probe.e.memory_used();
    let mut c = pickup_cfg();
    // The log may keep what it has and 10 bytes more (admission stops at 15/16).
    c.max_memory = (used + 10) * 16 / 15 + 1;
    let (mut h, calls) = lines_engine_with(c);
    script(&mut h);
    h.client(C.wrapping_add(3), ACK | PSH, b"bbbbbbbbbbbbbbbbbbbb\n");
    h.drain();
    h.fb(T + 1, 0, RST, 0, 0);
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert!(
        calls.lock().unwrap().is_empty(),
        "the oldest unanswered bytes went: no replay"
    );
    assert_eq!(h.e.stats().held_bytes_carried, 0);
    assert_eq!(
        h.e.stats().sessions_closed[CloseReason::ShedMemory.index()],
        0
    );
}

#[test]
fn a_replay_the_test_server_did_not_answer_is_carried_again() {
    let (mut h, _) = lines_engine();
    answered_then_reset(&mut h);
    // Back on the next request, which the new connection is sent and does not answer...
    h.client(C.wrapping_add(3), ACK | PSH, b"b\n");
    let syn = syns(&h.drain())[0].clone();
    h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
    assert_eq!(cat(&h.drain()), b"b\n");
    h.fb(T + 1, 0, RST, 0, 0);
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert_eq!(h.e.stats().held_bytes_carried, 2, "its replay, now its log");
    // ...so the next one replays it again, ahead of what came since.
    h.advance(HOLD_MIN * 2);
    h.client(C.wrapping_add(5), ACK | PSH, b"c\n");
    let syn = syns(&h.drain())[0].clone();
    assert_eq!(syn.seq, C.wrapping_add(2));
    h.fb(T, syn.seq.wrapping_add(1), SYN | ACK, 65535, 0);
    assert_eq!(cat(&h.drain()), b"b\nc\n");
}
