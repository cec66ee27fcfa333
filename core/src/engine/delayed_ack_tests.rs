//! Delayed ACKs toward the test server, on the fake clock: an ACK is held for the client's
//! next command (which carries it), sent on its timer otherwise, at once for every second
//! segment, and at once for anything that is not plain in-order data.

use super::tests::{cfg, ms, C, H, T};
use super::DEFAULT_DELAYED_ACK;
use common::wire::TcpFlags;

const ACK: u8 = TcpFlags::ACK;
const PSH: u8 = TcpFlags::PSH;
const FIN: u8 = TcpFlags::FIN;

fn established() -> H {
    let mut h = H::default();
    h.establish();
    h
}

#[test]
fn a_single_reply_segment_is_acked_by_the_next_command() {
    let mut h = established();
    let acks_before = h.e.stats().pure_acks_sent;
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 100);
    assert!(h.drain().is_empty(), "one segment: the ACK waits");
    h.advance(ms(1));
    h.client(C.wrapping_add(1), ACK | PSH, b"next query");
    let out = h.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].payload.as_slice(), out[0].ack),
        (&b"next query"[..], T + 101),
        "the command carries the ACK"
    );
    // Nothing is owed any more: the timer sends nothing.
    let later = h.run_for(DEFAULT_DELAYED_ACK * 4);
    assert!(later.is_empty(), "{later:?}");
    assert_eq!(h.e.stats().pure_acks_sent, acks_before);
}

#[test]
fn a_held_ack_goes_out_alone_when_its_timer_fires() {
    let mut h = established();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 100);
    assert!(h.drain().is_empty());
    assert!(
        h.e.next_deadline()
            .is_some_and(|d| d <= h.now + DEFAULT_DELAYED_ACK),
        "the engine's timer covers the held ACK"
    );
    let out = h.run_for(ms(50));
    assert_eq!(out.len(), 1, "{out:?}");
    let (at, ack) = &out[0];
    assert_eq!(
        *at, DEFAULT_DELAYED_ACK,
        "sent when the delay is up, not later"
    );
    assert_eq!((ack.ack, ack.flags, ack.payload.len()), (T + 101, ACK, 0));
}

#[test]
fn every_second_segment_is_acked_at_once() {
    let mut h = established();
    h.fb(T + 1, C.wrapping_add(1), ACK, 65535, 1448);
    assert!(h.drain().is_empty());
    h.fb(T + 1449, C.wrapping_add(1), ACK, 65535, 1448);
    let out = h.drain();
    assert_eq!(out.len(), 1, "second segment: ACK now");
    assert_eq!(out[0].ack, T + 2897);
    // The count starts again: a third segment waits.
    h.fb(T + 2897, C.wrapping_add(1), ACK | PSH, 65535, 10);
    assert!(h.drain().is_empty());
    let out = h.run_for(ms(50));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.ack, T + 2907);
}

#[test]
fn fin_out_of_order_repeats_and_holes_filled_are_acked_at_once() {
    // FIN, even after a held segment.
    let mut h = established();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 10);
    assert!(h.drain().is_empty());
    h.fb(T + 11, C.wrapping_add(1), ACK | FIN, 65535, 0);
    let out = h.drain();
    assert_eq!((out.len(), out[0].ack), (1, T + 12), "FIN: ACK now");
    // A single data segment carrying the FIN.
    let mut h = established();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH | FIN, 65535, 10);
    assert_eq!(h.drain()[0].ack, T + 12);

    // Out of order: a duplicate ACK at once; the segment that fills the hole: at once too.
    let mut h = established();
    h.fb(T + 101, C.wrapping_add(1), ACK, 65535, 100);
    let out = h.drain();
    assert_eq!((out.len(), out[0].ack), (1, T + 1));
    h.fb(T + 1, C.wrapping_add(1), ACK, 65535, 100);
    let out = h.drain();
    assert_eq!((out.len(), out[0].ack), (1, T + 201));

    // A repeated segment: our ACK was lost, so at once.
    let mut h = established();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 10);
    h.run_for(ms(50));
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 10);
    let out = h.drain();
    assert_eq!((out.len(), out[0].ack), (1, T + 11));
}

#[test]
fn a_closing_session_acks_at_once() {
    let mut h = established();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"q");
    h.client(s.wrapping_add(1), ACK | FIN, b"");
    let out = h.drain();
    assert!(out.iter().any(|p| p.has(FIN)), "{out:?}");
    // The test server still answers the last command before its own FIN.
    h.fb(T + 1, s.wrapping_add(2), ACK | PSH, 65535, 10);
    let out = h.drain();
    assert_eq!((out.len(), out[0].ack), (1, T + 11), "closing: no held ACK");
}

#[test]
fn zero_delay_acks_every_segment() {
    let mut c = cfg();
    c.delayed_ack = std::time::Duration::ZERO;
    let mut h = H::new(c);
    h.establish();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 10);
    let out = h.drain();
    assert_eq!((out.len(), out[0].ack), (1, T + 11));
}

#[test]
fn the_delay_never_reaches_the_test_servers_rto() {
    let mut c = cfg();
    c.delayed_ack = std::time::Duration::from_secs(5);
    let mut h = H::new(c);
    h.establish();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 10);
    assert!(h.drain().is_empty());
    let out = h.run_for(ms(500));
    assert_eq!(out.len(), 1);
    assert!(
        out[0].0 <= ms(100),
        "clamped to half the smallest RTO: {:?}",
        out[0].0
    );
}
