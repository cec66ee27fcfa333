//! The feedback path coming back after an outage (intercept stalled, restarted or away):
//! sessions that waited on it are resynced at once, not on their backed-off timers.

use std::net::SocketAddrV4;
use std::time::Duration;

use common::wire::{TcpFlags, TcpOptions};

use super::tests::{cfg, ms, Sent, C, CLIENT, H, T};
use super::FEEDBACK_SILENCE;

const ACK: u8 = TcpFlags::ACK;
const SYN: u8 = TcpFlags::SYN;

const OTHER: SocketAddrV4 = SocketAddrV4::new(*CLIENT.ip(), 40001);
/// The other session's client ISN.
const C2: u32 = 5_000;

/// A second established session, from `OTHER`.
fn establish_other(h: &mut H) {
    h.client_from(OTHER, C2, SYN, b"", TcpOptions::default());
    assert_eq!(h.drain().len(), 1);
    fb_as(h, OTHER, T, C2 + 1, TcpFlags::SYN | ACK);
    h.drain();
    h.client_from(OTHER, C2 + 1, ACK, b"", TcpOptions::default());
}

fn fb_as(h: &mut H, who: SocketAddrV4, seq: u32, ack: u32, flags: u8) {
    let keep = h.mirrored;
    h.mirrored = who;
    h.fb_opts(
        seq,
        ack,
        flags,
        65535,
        0,
        TcpOptions {
            mss: Some(1460),
            ..Default::default()
        },
    );
    h.mirrored = keep;
}

fn to(sent: &[(Duration, Sent)], port: u16) -> Vec<(Duration, Sent)> {
    sent.iter()
        .filter(|(_, s)| s.src.port() == port)
        .cloned()
        .collect()
}

#[test]
fn feedback_after_an_outage_resyncs_the_sessions_that_waited() {
    let mut h = H::default();
    h.establish();
    establish_other(&mut h);
    let (a, b) = (C.wrapping_add(1), C2 + 1);
    h.client(a, ACK, b"query a");
    h.client_from(OTHER, b, ACK, b"query b", TcpOptions::default());
    assert_eq!(h.drain().len(), 2);
    // The outage: no feedback at all. Both back off: 200, 600, 1400, 3000 ms.
    let out = h.run_for(ms(3100));
    assert_eq!(to(&out, CLIENT.port()).len(), 4);
    assert_eq!(h.e.stats().retransmit_timeouts, 8);
    // The path is back: the first feedback (b's ACK) is applied, and a, which waited too,
    // is probed at once instead of at 6.2 s.
    fb_as(&mut h, OTHER, T + 1, b + 7, ACK);
    let now = h.drain();
    assert_eq!(now.len(), 1, "{now:?}");
    let probe = &now[0];
    assert_eq!(probe.src, CLIENT);
    assert_eq!((probe.seq, probe.payload.len()), (a.wrapping_sub(1), 0));
    let st = h.e.stats();
    assert_eq!((st.feedback_resumed, st.sessions_resynced), (1, 1));
    assert_eq!(
        st.zero_window_probes, 0,
        "a resync probe is not a window probe"
    );
    // Its answer says the test server had it all along: nothing more to send, ever.
    h.fb(T + 1, a.wrapping_add(7), ACK, 65535, 0);
    assert!(h.run_for(Duration::from_secs(30)).is_empty());
}

#[test]
fn a_resynced_session_the_test_server_lacks_retransmits_after_one_plain_rto() {
    let mut h = H::default();
    h.establish();
    establish_other(&mut h);
    let (a, b) = (C.wrapping_add(1), C2 + 1);
    h.client(a, ACK, b"query a");
    h.client_from(OTHER, b, ACK, b"query b", TcpOptions::default());
    h.drain();
    h.run_for(ms(3100));
    fb_as(&mut h, OTHER, T + 1, b + 7, ACK);
    assert_eq!(h.drain().len(), 1);
    // The probe's answer acknowledges nothing new: the query never arrived.
    h.fb(T + 1, a, ACK, 65535, 0);
    let out = h.run_for(ms(500));
    let resent: Vec<_> = out
        .iter()
        .map(|(t, s)| (*t, s.seq, s.payload.clone()))
        .collect();
    assert_eq!(resent, vec![(ms(200), a, b"query a".to_vec())]);
}

#[test]
fn the_retries_an_outage_cost_do_not_abandon_a_session() {
    let mut c = cfg();
    c.max_retransmits = 4;
    let mut h = H::new(c);
    h.establish();
    establish_other(&mut h);
    let (a, b) = (C.wrapping_add(1), C2 + 1);
    h.client(a, ACK, b"query a");
    h.client_from(OTHER, b, ACK, b"query b", TcpOptions::default());
    h.drain();
    h.run_for(ms(3100)); // 4 timeouts each: one more would abandon them
    fb_as(&mut h, OTHER, T + 1, b + 7, ACK);
    h.drain();
    h.fb(T + 1, a, ACK, 65535, 0);
    h.run_for(ms(1000)); // one plain retransmission, well within the limit again
    h.fb(T + 1, a.wrapping_add(7), ACK, 65535, 0);
    assert_eq!(h.e.stats().sessions_active, 2);
    assert_eq!(h.closed_reason(), None);
}

#[test]
fn a_syn_that_waited_is_sent_again_at_once() {
    let mut h = H::default();
    establish_other(&mut h);
    h.client_from(OTHER, C2 + 1, ACK, b"q", TcpOptions::default());
    h.drain();
    h.client(C, SYN, b"");
    assert_eq!(h.drain().len(), 1);
    // SYN retransmitted at 1 s and 3 s (initial RTO 1 s); the next would be at 7 s.
    let out = h.run_for(ms(3500));
    assert_eq!(to(&out, CLIENT.port()).len(), 2);
    fb_as(&mut h, OTHER, T + 1, C2 + 2, ACK);
    let now = h.drain();
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(now[0].has(SYN) && now[0].seq == C);
    assert_eq!(h.e.stats().sessions_resynced, 1);
}

#[test]
fn feedback_after_a_quiet_time_resyncs_nobody() {
    let mut h = H::default();
    h.establish();
    let a = C.wrapping_add(1);
    h.client(a, ACK, b"query");
    h.drain();
    h.fb(T + 1, a.wrapping_add(5), ACK, 65535, 0);
    h.advance(FEEDBACK_SILENCE * 4);
    // The client's next command, answered at once: feedback after a silence, but nothing
    // waited, so nothing extra is sent.
    h.client(a.wrapping_add(5), ACK, b"next");
    assert_eq!(h.drain().len(), 1);
    h.fb(T + 1, a.wrapping_add(9), ACK, 65535, 0);
    assert!(h.drain().is_empty());
    let st = h.e.stats();
    assert_eq!((st.feedback_resumed, st.sessions_resynced), (1, 0));
}
