//! Scripted scenarios with a fake clock: what the test server would see for each captured
//! sequence and each pattern of feedback.

use common::seq::SeqNumber;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use common::clock::Instant;
use common::control::TestFeedback;
use common::wire::{
    emit_ipv4_tcp, parse_ipv4_tcp, tcp_checksum_ok, SegmentRepr, TcpFlags, TcpOptions,
};

use super::{CloseReason, Engine, EngineConfig, EngineEvent, TransformFactory};

pub(super) const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000);
pub(super) const PROD: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 3306);
pub(super) const TARGET: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306);

const SYN: u8 = TcpFlags::SYN;
const ACK: u8 = TcpFlags::ACK;
const FIN: u8 = TcpFlags::FIN;
const RST: u8 = TcpFlags::RST;
const PSH: u8 = TcpFlags::PSH;

/// Client ISN and test-server ISN used by the scenarios (near the wrap on purpose).
pub(super) const C: u32 = 0xffff_ff00;
pub(super) const T: u32 = 7_000_000;

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A packet the engine sent, parsed back.
#[derive(Clone, Debug)]
pub(super) struct Sent {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub options: TcpOptions,
    pub payload: Vec<u8>,
}

impl Sent {
    pub(super) fn has(&self, f: u8) -> bool {
        self.flags & f == f
    }
}

pub(super) fn packet(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
    options: TcpOptions,
) -> Vec<u8> {
    let repr = SegmentRepr {
        src: *src.ip(),
        dst: *dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
        seq: SeqNumber(seq),
        ack: SeqNumber(ack),
        flags: TcpFlags(flags),
        window: 502,
        options,
        ip_id: 1,
        ttl: 64,
    };
    let mut buf = vec![0; 80 + payload.len()];
    let n = emit_ipv4_tcp(&repr, payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

pub(super) fn parse_sent(bytes: &[u8]) -> Sent {
    assert!(tcp_checksum_ok(bytes), "engine emitted a bad checksum");
    let p = parse_ipv4_tcp(bytes).unwrap();
    Sent {
        src: SocketAddrV4::new(p.src, p.src_port),
        dst: SocketAddrV4::new(p.dst, p.dst_port),
        seq: p.seq.0,
        ack: p.ack.0,
        flags: p.flags.0,
        window: p.window,
        options: p.options,
        payload: p.payload.to_vec(),
    }
}

/// The scripted-scenario harness (shared with `transform_tests`).
pub(super) struct H {
    pub(super) e: Engine,
    pub(super) now: Instant,
    /// The address feedback is addressed to (the mirrored client).
    pub(super) mirrored: SocketAddrV4,
}

impl H {
    pub(super) fn new(cfg: EngineConfig) -> Self {
        Self::with_engine(Engine::new(cfg))
    }

    pub(super) fn with_factory(cfg: EngineConfig, factory: Box<dyn TransformFactory>) -> Self {
        Self::with_engine(Engine::with_transform(cfg, factory))
    }

    fn with_engine(e: Engine) -> Self {
        Self {
            e,
            now: Instant::from_nanos(1_000_000_000),
            mirrored: CLIENT,
        }
    }

    pub(super) fn default() -> Self {
        Self::new(cfg())
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
        self.e.on_timeout(self.now);
    }

    /// Advances in small steps so every timer fires at its time.
    pub(super) fn run_for(&mut self, d: Duration) -> Vec<(Duration, Sent)> {
        let start = self.now;
        let end = self.now + d;
        let mut out = Vec::new();
        while self.now < end {
            let step = match self.e.next_deadline() {
                Some(t) if t > self.now && t <= end => t - self.now,
                Some(t) if t <= self.now => Duration::ZERO,
                _ => end - self.now,
            };
            self.advance(step);
            for s in self.drain() {
                out.push((self.now - start, s));
            }
        }
        out
    }

    pub(super) fn capture(&mut self, bytes: &[u8]) {
        let p = parse_ipv4_tcp(bytes).unwrap();
        self.e.on_captured(self.now, &p);
    }

    pub(super) fn client(&mut self, seq: u32, flags: u8, payload: &[u8]) {
        self.client_from(CLIENT, seq, flags, payload, TcpOptions::default());
    }

    pub(super) fn client_from(
        &mut self,
        from: SocketAddrV4,
        seq: u32,
        flags: u8,
        payload: &[u8],
        opts: TcpOptions,
    ) {
        let b = packet(from, PROD, seq, 12345, flags, payload, opts);
        self.capture(&b);
    }

    pub(super) fn prod(&mut self, ack: u32, flags: u8) {
        let b = packet(PROD, CLIENT, 999, ack, flags, b"", TcpOptions::default());
        self.capture(&b);
    }

    pub(super) fn fb(&mut self, seq: u32, ack: u32, flags: u8, window: u16, len: u32) {
        self.fb_opts(seq, ack, flags, window, len, TcpOptions::default());
    }

    pub(super) fn fb_opts(
        &mut self,
        seq: u32,
        ack: u32,
        flags: u8,
        window: u16,
        len: u32,
        o: TcpOptions,
    ) {
        let fb = TestFeedback {
            client: self.mirrored,
            server: TARGET,
            seq,
            ack,
            flags: TcpFlags(flags),
            window,
            options: o,
            payload_len: len,
            payload_prefix: Vec::new(),
        };
        self.e.on_feedback(self.now, &fb);
    }

    pub(super) fn drain(&mut self) -> Vec<Sent> {
        let mut buf = vec![0u8; self.e.transmit_buffer_len()];
        let mut out = Vec::new();
        while let Some(n) = self.e.poll_transmit(self.now, &mut buf) {
            out.push(parse_sent(&buf[..n]));
            assert!(out.len() < 100_000, "poll_transmit never ends");
        }
        out
    }

    pub(super) fn events(&mut self) -> Vec<EngineEvent> {
        std::iter::from_fn(|| self.e.poll_event()).collect()
    }

    pub(super) fn closed_reason(&mut self) -> Option<CloseReason> {
        self.events().into_iter().find_map(|e| match e {
            EngineEvent::SessionClosed { reason, .. } => Some(reason),
            _ => None,
        })
    }

    /// Client SYN, test SYN-ACK (window 65535, MSS 1460), client's ACK to production. Returns
    /// our ACK of the SYN-ACK.
    pub(super) fn establish(&mut self) -> Sent {
        self.client(C, SYN, b"");
        let syn = self.drain();
        assert_eq!(syn.len(), 1);
        self.fb_opts(
            T,
            C.wrapping_add(1),
            SYN | ACK,
            65535,
            0,
            TcpOptions {
                mss: Some(1460),
                ..Default::default()
            },
        );
        let mut ack = self.drain();
        assert_eq!(ack.len(), 1, "{ack:?}");
        self.client(C.wrapping_add(1), ACK, b"");
        ack.pop().unwrap()
    }
}

pub(super) fn cfg() -> EngineConfig {
    EngineConfig::new(3306, TARGET)
}

pub(super) fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

pub(super) fn cat(sent: &[Sent]) -> Vec<u8> {
    sent.iter().flat_map(|s| s.payload.clone()).collect()
}

// ---------------------------------------------------------------------------- handshake

#[test]
fn handshake_without_options_keeps_isn_and_port() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    let ev = h.events();
    assert_eq!(
        ev,
        vec![EngineEvent::SessionOpened {
            client: CLIENT,
            mirrored: CLIENT,
            picked_up: false
        }]
    );
    let syn = h.drain();
    assert_eq!(syn.len(), 1);
    let s = &syn[0];
    assert_eq!((s.src, s.dst, s.seq, s.flags), (CLIENT, TARGET, C, SYN));
    assert_eq!(s.options.mss, Some(536), "client sent no MSS: RFC default");
    assert_eq!(s.options.window_scale, None);
    assert_eq!(s.options.timestamps, None);
    assert!(!s.options.sack_permitted);
    h.fb(T, C.wrapping_add(1), SYN | ACK, 29200, 0);
    let ack = h.drain();
    assert_eq!(ack.len(), 1);
    assert_eq!(
        (ack[0].seq, ack[0].ack, ack[0].flags),
        (C.wrapping_add(1), T + 1, ACK)
    );
    assert_eq!(ack[0].window, 65535);
    assert!(ack[0].payload.is_empty());
    assert_eq!(h.e.stats().sessions_opened, 1);
    assert_eq!(h.e.stats().sessions_active, 1);
}

#[test]
fn handshake_with_timestamps_and_window_scale() {
    let mut h = H::default();
    let opts = TcpOptions {
        mss: Some(9000),
        window_scale: Some(9),
        sack_permitted: true,
        timestamps: Some((1000, 0)),
    };
    h.client_from(CLIENT, C, SYN, b"", opts);
    let syn = h.drain().remove(0);
    assert_eq!(syn.options.mss, Some(1460), "min(client MSS, ours)");
    assert_eq!(syn.options.window_scale, Some(7), "we offer our own scale");
    assert_eq!(syn.options.timestamps, Some((1000, 0)));
    assert!(!syn.options.sack_permitted, "never SACK");
    h.fb_opts(
        T,
        C.wrapping_add(1),
        SYN | ACK,
        100,
        0,
        TcpOptions {
            mss: Some(1460),
            window_scale: Some(2),
            sack_permitted: true,
            timestamps: Some((5000, 1000)),
        },
    );
    let ack = h.drain().remove(0);
    assert_eq!(ack.options.timestamps, Some((1000, 5000)));
    assert_eq!(ack.options.window_scale, None, "options only on SYN");
    // Client data with a newer TSval; test ACK with window 100 << 2 = 400 bytes.
    h.fb_opts(
        T + 1,
        C.wrapping_add(1),
        ACK,
        100,
        0,
        TcpOptions {
            timestamps: Some((5001, 1000)),
            ..Default::default()
        },
    );
    h.client_from(
        CLIENT,
        C.wrapping_add(1),
        ACK | PSH,
        &data(1000),
        TcpOptions {
            timestamps: Some((1010, 77)),
            ..Default::default()
        },
    );
    let sent = h.drain();
    assert_eq!(cat(&sent).len(), 400, "scaled window honoured: {sent:?}");
    for s in &sent {
        assert_eq!(
            s.options.timestamps,
            Some((1010, 5001)),
            "TS on every segment"
        );
        assert!(s.payload.len() <= 1448);
    }
}

#[test]
fn timestamps_off_when_test_server_does_not_echo_them() {
    let mut h = H::default();
    let opts = TcpOptions {
        timestamps: Some((1000, 0)),
        ..Default::default()
    };
    h.client_from(CLIENT, C, SYN, b"", opts);
    assert!(h.drain()[0].options.timestamps.is_some());
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    let ack = h.drain().remove(0);
    assert_eq!(ack.options.timestamps, None);
    h.client_from(CLIENT, C.wrapping_add(1), ACK, &data(2000), opts);
    let sent = h.drain();
    assert!(sent.iter().all(|s| s.options.timestamps.is_none()));
    assert_eq!(sent[0].payload.len(), 536, "no MSS from test: 536");
}

#[test]
fn syn_is_retransmitted_with_backoff_then_handshake_times_out() {
    let mut c = cfg();
    c.handshake_timeout = Duration::from_secs(10);
    let mut h = H::new(c);
    h.client(C, SYN, b"");
    assert_eq!(h.drain().len(), 1);
    let out = h.run_for(Duration::from_secs(11));
    let syns: Vec<_> = out
        .iter()
        .filter(|(_, s)| s.has(SYN))
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(
        syns,
        vec![ms(1000), ms(3000), ms(7000)],
        "1s, 2s, 4s backoff"
    );
    let rst: Vec<_> = out.iter().filter(|(_, s)| s.has(RST)).collect();
    assert_eq!(rst.len(), 1);
    assert_eq!(rst[0].0, ms(10_000));
    assert_eq!(
        rst[0].1.seq,
        C.wrapping_add(1),
        "RST for a half-open test connection"
    );
    assert_eq!(h.closed_reason(), Some(CloseReason::HandshakeTimeout));
    assert_eq!(h.e.stats().closed(CloseReason::HandshakeTimeout), 1);
}

#[test]
fn client_syn_retransmission_is_not_a_new_session() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    h.drain();
    h.client(C, SYN, b"");
    assert!(h.drain().is_empty(), "our own timer retransmits the SYN");
    assert_eq!(h.e.stats().client_syn_retransmits, 1);
    assert_eq!(h.e.stats().sessions_opened, 1);
}

#[test]
fn new_isn_on_live_tuple_resets_the_old_session_and_starts_again() {
    let mut h = H::default();
    h.establish();
    h.client(C.wrapping_add(1), ACK | PSH, b"old");
    h.drain();
    h.events();
    h.client(5000, SYN, b"");
    let out = h.drain();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out[0].has(RST) && out[0].seq == C.wrapping_add(4),
        "old one reset first"
    );
    assert!(out[1].has(SYN) && out[1].seq == 5000);
    let ev = h.events();
    assert!(matches!(
        ev[0],
        EngineEvent::SessionClosed {
            reason: CloseReason::Reused,
            ..
        }
    ));
    assert_eq!(ev[1], EngineEvent::SessionReleased { mirrored: CLIENT });
    assert!(matches!(ev[2], EngineEvent::SessionOpened { .. }));
    assert_eq!(h.e.stats().sessions_active, 1);
}

#[test]
fn client_that_never_acks_production_is_abandoned() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    h.drain();
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    h.drain();
    // A spoofed SYN: the client never completes its handshake with production.
    let out = h.run_for(Duration::from_secs(11));
    assert!(out.iter().any(|(_, s)| s.has(RST)));
    assert_eq!(h.closed_reason(), Some(CloseReason::HandshakeTimeout));
}

#[test]
fn refused_by_test_server() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    h.drain();
    h.fb(0, C.wrapping_add(1), RST | ACK, 0, 0);
    assert!(h.drain().is_empty(), "never RST a RST");
    assert_eq!(h.closed_reason(), Some(CloseReason::TestRefused));
}

// ---------------------------------------------------------------------------- data

#[test]
fn data_goes_out_as_captured_without_waiting_for_acks() {
    let mut h = H::default();
    h.establish();
    let mut seq = C.wrapping_add(1);
    for i in 0..5u8 {
        let req = vec![i; 30];
        h.client(seq, ACK | PSH, &req);
        let sent = h.drain();
        assert_eq!(sent.len(), 1, "request {i} sent at once");
        assert_eq!(sent[0].seq, seq);
        assert_eq!(sent[0].ack, T + 1);
        assert_eq!(sent[0].payload, req);
        assert!(sent[0].has(PSH | ACK));
        seq = seq.wrapping_add(30);
    }
    // Client pure ACKs are not forwarded.
    h.client(seq, ACK, b"");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().bytes_sent, 150);
}

#[test]
fn data_captured_before_the_handshake_is_queued() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    h.drain();
    h.client(C.wrapping_add(1), ACK | PSH, b"early");
    assert!(
        h.drain().is_empty(),
        "nothing but the SYN before the SYN-ACK"
    );
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1, "the data segment carries the handshake ACK");
    assert_eq!(out[0].payload, b"early");
    assert_eq!(out[0].ack, T + 1);
}

#[test]
fn oversized_captured_segment_is_split_to_mss() {
    let mut h = H::default();
    h.establish();
    let big = data(5000);
    h.client(C.wrapping_add(1), ACK | PSH, &big);
    let sent = h.drain();
    let lens: Vec<_> = sent.iter().map(|s| s.payload.len()).collect();
    assert_eq!(lens, vec![1460, 1460, 1460, 620]);
    assert_eq!(cat(&sent), big);
    let psh: Vec<_> = sent.iter().map(|s| s.has(PSH)).collect();
    assert_eq!(psh, vec![false, false, false, true]);
    for w in sent.windows(2) {
        assert_eq!(w[1].seq, w[0].seq.wrapping_add(w[0].payload.len() as u32));
    }
}

#[test]
fn captured_retransmissions_and_overlaps_are_trimmed() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, b"hello");
    h.client(s, ACK, b"hello");
    h.client(s.wrapping_add(3), ACK, b"lo world");
    let sent = h.drain();
    assert_eq!(cat(&sent), b"hello world");
    assert_eq!(h.e.stats().client_bytes_duplicate, 5 + 2);
}

#[test]
fn reordered_capture_is_held_until_the_hole_fills() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s.wrapping_add(6), ACK, b"world");
    h.client(s.wrapping_add(11), ACK, b"!");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().client_segments_held, 2);
    h.client(s, ACK, b"hello ");
    assert_eq!(cat(&h.drain()), b"hello world!");
    // Healed before capture_gap_timeout: no abandon.
    h.run_for(Duration::from_secs(5));
    assert_eq!(h.e.stats().sessions_active, 1);
}

#[test]
fn hole_that_never_fills_is_a_capture_gap() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s.wrapping_add(100), ACK, b"later");
    let out = h.run_for(Duration::from_secs(4));
    let rst: Vec<_> = out.iter().filter(|(_, p)| p.has(RST)).collect();
    assert_eq!(rst.len(), 1);
    assert_eq!(rst[0].0, ms(3000));
    assert_eq!(h.closed_reason(), Some(CloseReason::CaptureGap));
    assert_eq!(h.e.stats().capture_gaps_suspected, 1);
}

#[test]
fn production_acking_bytes_we_never_captured_is_a_capture_gap() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, b"abc");
    h.prod(s.wrapping_add(3), ACK);
    h.run_for(Duration::from_secs(1));
    h.prod(s.wrapping_add(10), ACK); // production got 7 more bytes we missed
    h.run_for(Duration::from_secs(4));
    assert_eq!(h.closed_reason(), Some(CloseReason::CaptureGap));
}

#[test]
fn test_server_data_is_acked_once_per_batch() {
    let mut h = H::default();
    h.establish();
    h.fb(T + 1, C.wrapping_add(1), ACK | PSH, 65535, 100);
    h.fb(T + 101, C.wrapping_add(1), ACK | PSH, 65535, 50);
    h.fb(T + 151, C.wrapping_add(1), ACK | PSH, 65535, 7);
    let out = h.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].ack, out[0].flags, out[0].seq),
        (T + 158, ACK, C.wrapping_add(1))
    );
    // The same segment again (our ACK was lost): ACK again.
    h.fb(T + 151, C.wrapping_add(1), ACK | PSH, 65535, 7);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, T + 158);
    assert_eq!(h.e.stats().feedback_test_retransmits, 1);
    // A pure ACK from the test server needs no answer; a keepalive probe does.
    h.fb(T + 158, C.wrapping_add(1), ACK, 65535, 0);
    assert!(h.drain().is_empty());
    h.fb(T + 157, C.wrapping_add(1), ACK, 65535, 0);
    assert_eq!(h.drain().len(), 1);
}

#[test]
fn lost_feedback_is_not_acked_past_until_the_test_server_repeats_it() {
    let mut h = H::default();
    h.establish();
    // Feedback for [T+1, T+101) was lost; [T+101, T+201) arrives.
    h.fb(T + 101, C.wrapping_add(1), ACK, 65535, 100);
    let out = h.drain();
    assert_eq!(out[0].ack, T + 1, "duplicate ACK, never past the hole");
    assert_eq!(h.e.stats().feedback_out_of_order, 1);
    h.fb(T + 1, C.wrapping_add(1), ACK, 65535, 100);
    let out = h.drain();
    assert_eq!(
        out[0].ack,
        T + 201,
        "hole filled: the remembered range is acked too"
    );
}

#[test]
fn later_client_data_carries_the_latest_ack() {
    let mut h = H::default();
    h.establish();
    h.fb(T + 1, C.wrapping_add(1), ACK, 65535, 10);
    h.client(C.wrapping_add(1), ACK, b"q");
    let out = h.drain();
    assert_eq!(out.len(), 1, "data and ACK coalesced");
    assert_eq!((out[0].payload.as_slice(), out[0].ack), (&b"q"[..], T + 11));
}

// ---------------------------------------------------------------------------- reliability

#[test]
fn rto_retransmits_with_backoff_and_stops_when_acked() {
    let mut h = H::default();
    h.establish();
    h.client(C.wrapping_add(1), ACK, b"query");
    assert_eq!(h.drain().len(), 1);
    let out = h.run_for(ms(3500));
    let times: Vec<_> = out.iter().map(|(t, _)| *t).collect();
    // The handshake gave an RTT sample of 0: RTO = max(0 + 4*0, G) floored at min_rto 200ms.
    assert_eq!(times, vec![ms(200), ms(600), ms(1400), ms(3000)]);
    assert!(out
        .iter()
        .all(|(_, s)| s.payload == b"query" && s.seq == C.wrapping_add(1)));
    assert_eq!(h.e.stats().retransmit_timeouts, 4);
    assert_eq!(h.e.stats().segments_resent, 4);
    h.fb(T + 1, C.wrapping_add(6), ACK, 65535, 0);
    assert!(h.run_for(Duration::from_secs(10)).is_empty());
    assert_eq!(h.e.stats().bytes_sent, 5);
    assert_eq!(h.e.stats().bytes_resent, 20);
}

#[test]
fn rto_follows_measured_rtt() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    h.drain();
    h.advance(ms(400)); // slow handshake: 400ms RTT
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    h.drain();
    h.client(C.wrapping_add(1), ACK, b"x");
    h.drain();
    let out = h.run_for(ms(1300));
    // srtt 400, rttvar 200: RTO = 400 + 800 = 1200ms.
    assert_eq!(
        out.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec![ms(1200)]
    );
}

#[test]
fn too_many_retransmits_abandons() {
    let mut c = cfg();
    c.max_retransmits = 3;
    c.max_rto = Duration::from_secs(1);
    let mut h = H::new(c);
    h.establish();
    h.client(C.wrapping_add(1), ACK, b"query");
    h.drain();
    let out = h.run_for(Duration::from_secs(10));
    assert_eq!(out.iter().filter(|(_, s)| !s.has(RST)).count(), 3);
    let rst = out.iter().find(|(_, s)| s.has(RST)).unwrap();
    assert_eq!(rst.1.seq, C.wrapping_add(6));
    assert_eq!(h.closed_reason(), Some(CloseReason::TooManyRetransmits));
}

#[test]
fn fast_retransmit_after_three_duplicate_acks() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, &data(1460 * 5));
    assert_eq!(h.drain().len(), 5);
    // First segment lost: the test server ACKs s three more times for segments 2..4.
    h.fb(T + 1, s, ACK, 65535, 0); // not a dup yet: same as the handshake ack (counts)
    h.fb(T + 1, s, ACK, 65535, 0);
    assert!(h.drain().is_empty());
    h.fb(T + 1, s, ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].seq, out[0].payload.len()), (s, 1460));
    assert_eq!(h.e.stats().fast_retransmits, 1);
    // More dup ACKs don't repeat it; a partial ACK retransmits the next hole (NewReno).
    h.fb(T + 1, s, ACK, 65535, 0);
    assert!(h.drain().is_empty());
    h.fb(T + 1, s.wrapping_add(1460 * 2), ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].seq, s.wrapping_add(1460 * 2));
    h.fb(T + 1, s.wrapping_add(1460 * 5), ACK, 65535, 0);
    assert!(h.drain().is_empty());
    assert!(
        h.run_for(Duration::from_secs(5)).is_empty(),
        "all acked: no RTO"
    );
}

#[test]
fn window_is_honoured_and_zero_window_is_probed() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.fb(T + 1, s, ACK, 1000, 0);
    h.client(s, ACK, &data(3000));
    let sent = h.drain();
    assert_eq!(cat(&sent).len(), 1000);
    // Acked, but the window closed: nothing more may go.
    h.fb(T + 1, s.wrapping_add(1000), ACK, 0, 0);
    assert!(h.drain().is_empty());
    let out = h.run_for(ms(700));
    let probes: Vec<_> = out
        .iter()
        .map(|(t, p)| (*t, p.seq, p.payload.len()))
        .collect();
    assert_eq!(
        probes,
        vec![
            (ms(200), s.wrapping_add(999), 0),
            (ms(600), s.wrapping_add(999), 0)
        ],
        "probe with an old seq, backing off"
    );
    assert_eq!(h.e.stats().zero_window_probes, 2);
    // The probe's answer opens the window.
    h.fb(T + 1, s.wrapping_add(1000), ACK, 5000, 0);
    let sent = h.drain();
    assert_eq!(cat(&sent), data(3000)[1000..].to_vec());
    assert_eq!(h.e.stats().sessions_active, 1);
}

#[test]
fn reordered_old_feedback_does_not_shrink_the_window() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, &data(100));
    h.drain();
    h.fb(T + 1, s.wrapping_add(100), ACK, 4000, 0);
    // An older ACK arrives late with a zero window.
    h.fb(T + 1, s, ACK, 0, 0);
    h.client(s.wrapping_add(100), ACK, &data(100));
    assert_eq!(cat(&h.drain()).len(), 100);
}

// ---------------------------------------------------------------------------- close

pub(super) fn assert_completed(h: &mut H) {
    let ev = h.events();
    assert!(
        ev.iter().any(|e| matches!(
            e,
            EngineEvent::SessionClosed {
                reason: CloseReason::Completed,
                ..
            }
        )),
        "{ev:?}"
    );
    assert_eq!(h.e.stats().sessions_active, 0);
    assert_eq!(h.e.stats().rsts_sent, 0);
}

#[test]
fn client_closes_first() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"quit");
    h.client(s.wrapping_add(4), ACK | FIN, b"");
    let out = h.drain();
    assert_eq!(out.len(), 1, "FIN rides on the last data segment");
    assert!(out[0].has(FIN) && out[0].payload == b"quit");
    h.fb(T + 1, s.wrapping_add(5), ACK, 65535, 0);
    assert!(h.drain().is_empty());
    h.fb(T + 1, s.wrapping_add(5), ACK | FIN, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].seq, out[0].ack, out[0].flags),
        (s.wrapping_add(5), T + 2, ACK)
    );
    assert_completed(&mut h);
}

#[test]
fn test_server_closes_first_like_mysql_after_com_quit() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, &[1, 0, 0, 0, 1]); // COM_QUIT
    h.drain();
    h.fb(T + 1, s.wrapping_add(5), ACK | FIN, 65535, 0);
    let out = h.drain();
    assert_eq!((out[0].ack, out[0].flags), (T + 2, ACK));
    assert_eq!(
        h.e.stats().sessions_active,
        1,
        "half-closed: still ours to close"
    );
    h.client(s.wrapping_add(5), ACK | FIN, b"");
    let out = h.drain();
    assert_eq!(
        (out[0].seq, out[0].ack, out[0].flags),
        (s.wrapping_add(5), T + 2, ACK | FIN)
    );
    h.fb(T + 2, s.wrapping_add(6), ACK, 65535, 0);
    assert_completed(&mut h);
}

#[test]
fn fin_waits_for_queued_data_and_out_of_order_fin_waits_for_its_bytes() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.fb(T + 1, s, ACK, 1000, 0);
    // FIN captured before the data that precedes it.
    h.client(s.wrapping_add(2000), ACK | FIN, b"");
    assert!(h.drain().is_empty());
    h.client(s, ACK, &data(2000));
    let out = h.drain();
    assert_eq!(cat(&out).len(), 1000);
    assert!(
        out.iter().all(|p| !p.has(FIN)),
        "window-limited: FIN must wait"
    );
    h.fb(T + 1, s.wrapping_add(1000), ACK, 1000, 0);
    let out = h.drain();
    assert_eq!(cat(&out).len(), 1000);
    assert!(
        out.iter().all(|p| !p.has(FIN)),
        "the FIN takes a window slot too"
    );
    h.fb(T + 1, s.wrapping_add(2000), ACK, 1000, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert!(out[0].has(FIN) && out[0].payload.is_empty() && out[0].seq == s.wrapping_add(2000));
}

#[test]
fn fin_is_retransmitted_until_acked() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | FIN, b"");
    let out = h.drain();
    assert!(out[0].has(FIN));
    let out = h.run_for(ms(250));
    assert_eq!(out.len(), 1);
    assert!(out[0].1.has(FIN) && out[0].1.seq == s);
}

#[test]
fn close_timeout_resets() {
    let mut h = H::default();
    h.establish();
    h.fb(T + 1, C.wrapping_add(1), ACK | FIN, 65535, 0);
    h.drain();
    let out = h.run_for(Duration::from_secs(61));
    assert_eq!(out.len(), 1);
    assert!(out[0].1.has(RST));
    assert_eq!(out[0].0, Duration::from_secs(60));
    assert_eq!(h.closed_reason(), Some(CloseReason::CloseTimeout));
}

#[test]
fn idle_timeout_resets() {
    let mut c = cfg();
    c.idle_timeout = Duration::from_secs(30);
    let mut h = H::new(c);
    h.establish();
    h.run_for(Duration::from_secs(20));
    h.client(C.wrapping_add(1), ACK, b""); // activity
    let out = h.run_for(Duration::from_secs(31));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Duration::from_secs(30));
    assert_eq!(h.closed_reason(), Some(CloseReason::IdleTimeout));
}

/// An established session whose test server shut its window: the client's 300 bytes stay
/// queued. Returns the harness and the stream's first sequence number.
fn three_hundred_bytes_queued_behind_a_shut_window() -> (H, u32) {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.fb(T + 1, s, ACK, 0, 0);
    h.client(s, ACK, &data(300));
    assert!(h.drain().is_empty());
    (h, s)
}

#[test]
fn client_rst_after_its_whole_stream_closes_the_test_side_with_a_fin() {
    // Production answered everything the client waited for; the test server, behind, must
    // still run it: the bytes go, then a FIN, never a RST that would throw them away.
    let (mut h, s) = three_hundred_bytes_queued_behind_a_shut_window();
    h.client(s.wrapping_add(300), RST | ACK, b"");
    assert!(h.drain().is_empty(), "nothing fits the window, no RST");
    assert_eq!(h.e.stats().client_resets_closed_with_fin, 1);
    h.fb(T + 1, s, ACK, 65535, 0);
    let out = h.drain();
    assert!(out.iter().all(|p| !p.has(RST)), "{out:?}");
    assert_eq!(out.iter().map(|p| p.payload.len()).sum::<usize>(), 300);
    let last = out.last().unwrap();
    assert!(last.has(FIN));
    assert_eq!(
        last.seq.wrapping_add(last.payload.len() as u32),
        s.wrapping_add(300)
    );
    assert_eq!(h.e.stats().client_reset_bytes_lost, 0);
    assert_eq!(h.e.stats().client_resets_with_queued_data, 0);
}

#[test]
fn client_rst_with_its_stream_incomplete_is_mirrored_and_lost_bytes_counted() {
    let (mut h, s) = three_hundred_bytes_queued_behind_a_shut_window();
    // 10 client bytes before the reset never reached the capture: the stream cannot be
    // completed, so the test server's connection is reset and the queued bytes counted lost.
    h.client(s.wrapping_add(310), RST | ACK, b"");
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert!(out[0].has(RST));
    assert_eq!(out[0].seq, s, "at the test server's rcv_nxt");
    assert_eq!(h.closed_reason(), Some(CloseReason::ClientReset));
    assert_eq!(h.e.stats().client_resets_with_queued_data, 1);
    assert_eq!(h.e.stats().client_reset_bytes_lost, 300);
    assert_eq!(h.e.stats().client_resets_closed_with_fin, 0);
}

#[test]
fn client_rst_behind_the_stream_is_ignored() {
    let mut h = H::default();
    h.establish();
    h.client(C.wrapping_add(1), ACK, b"abc");
    h.drain();
    h.client(C, RST, b"");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().client_rsts_ignored, 1);
    assert_eq!(h.e.stats().sessions_active, 1);
}

#[test]
fn test_rst_ends_the_session_without_answer() {
    let mut h = H::default();
    h.establish();
    h.fb(T + 1000, 0, RST, 0, 0); // in window
    assert!(h.drain().is_empty());
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert_eq!(h.e.stats().closed(CloseReason::TestReset), 1);
}

#[test]
fn out_of_window_test_rst_is_ignored() {
    let mut h = H::default();
    h.establish();
    h.fb(T.wrapping_sub(5), 0, RST, 0, 0);
    assert_eq!(h.e.stats().sessions_active, 1);
    assert_eq!(h.e.stats().feedback_stale, 1);
}

#[test]
fn production_rst_ends_the_mirror() {
    let mut h = H::default();
    h.establish();
    h.prod(C.wrapping_add(1), RST | ACK);
    assert!(h.drain()[0].has(RST));
    assert_eq!(h.closed_reason(), Some(CloseReason::ProdReset));
}

#[test]
fn lingering_session_answers_late_packets_and_is_not_resurrected() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::new(c);
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | FIN, b"");
    h.drain();
    h.fb(T + 1, s.wrapping_add(1), ACK | FIN, 65535, 0);
    h.drain();
    assert_completed(&mut h);
    // Our last ACK was lost: the test server repeats its FIN.
    h.fb(T + 1, s.wrapping_add(1), ACK | FIN, 65535, 0);
    let out = h.drain();
    assert_eq!((out[0].flags, out[0].ack), (ACK, T + 2));
    // The client retransmits its FIN and sends a stray ACK: no new session.
    h.client(s, ACK | FIN, b"");
    h.client(s.wrapping_add(1), ACK, b"");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().sessions_picked_up, 0);
    assert_eq!(h.e.stats().captured_stale, 2);
    h.run_for(Duration::from_secs(11));
    assert_eq!(
        h.events(),
        vec![EngineEvent::SessionReleased { mirrored: CLIENT }]
    );
    assert_eq!(h.e.stats().sessions_lingering, 0);
    assert_eq!(h.e.next_deadline(), None);
}

#[test]
fn aborted_session_resets_whatever_the_test_server_still_sends() {
    let mut h = H::default();
    h.establish();
    h.client(C.wrapping_add(1), ACK, b"abc");
    h.drain();
    // A reset with a client byte missing before it: the stream cannot be finished, the
    // session is aborted.
    h.client(C.wrapping_add(5), RST, b"");
    h.drain();
    // Our RST was lost/off: the test server's data arrives, acking 2 of our bytes.
    h.fb(T + 1, C.wrapping_add(3), ACK, 65535, 10);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].flags, out[0].seq),
        (RST, C.wrapping_add(3)),
        "RST seq = its ACK"
    );
    h.fb(T + 1, 0, RST, 0, 0);
    assert!(h.drain().is_empty());
}

// ---------------------------------------------------------------------------- pickup

#[test]
fn midstream_pickup_from_data() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::new(c);
    let s = 123_456;
    h.client(s, ACK | PSH, b"SELECT 1");
    let ev = h.events();
    assert!(matches!(
        ev[0],
        EngineEvent::SessionOpened {
            picked_up: true,
            ..
        }
    ));
    let syn = h.drain().remove(0);
    assert_eq!((syn.flags, syn.seq), (SYN, s - 1));
    assert_eq!(syn.options.mss, Some(1460));
    assert_eq!(syn.options.window_scale, Some(7));
    h.fb(T, s, SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out[0].payload, b"SELECT 1");
    assert_eq!(out[0].seq, s);
    assert_eq!(h.e.stats().sessions_picked_up, 1);
    assert_eq!(h.e.stats().sessions_opened, 0);
}

#[test]
fn midstream_pickup_from_a_keepalive_finds_the_real_start() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::new(c);
    let next = 50_000;
    h.client(next - 1, ACK, b""); // keepalive probe: seq = snd_nxt - 1
    let syn = h.drain().remove(0);
    assert_eq!(syn.seq, next - 2);
    h.prod(next, ACK); // production answers the probe
    h.fb(T, next - 1, SYN | ACK, 65535, 0);
    h.drain();
    h.run_for(Duration::from_secs(5));
    assert_eq!(
        h.e.stats().sessions_active,
        1,
        "an idle picked-up connection is no gap"
    );
    h.client(next, ACK | PSH, b"q");
    let out = h.drain();
    assert_eq!(
        (out[0].seq, out[0].payload.as_slice()),
        (next - 1, &b"q"[..])
    );
    h.run_for(Duration::from_secs(5));
    assert_eq!(h.e.stats().sessions_active, 1, "no false capture gap");
}

#[test]
fn what_never_starts_a_session() {
    let mut h = H::default(); // pickup disabled
    h.client(1000, ACK | PSH, b"data");
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut p = H::new(c);
    p.client(1000, ACK | FIN, b"");
    p.client(1000, RST, b"");
    p.client(1000, SYN | ACK, b"");
    p.prod(1000, ACK | PSH);
    assert!(h.drain().is_empty() && p.drain().is_empty());
    assert_eq!(h.e.stats().captured_unknown_session, 1);
    assert_eq!(p.e.stats().captured_unknown_session, 3);
    assert_eq!(p.e.stats().captured_prod_unknown_session, 1);
    assert_eq!(p.e.stats().sessions_active, 0);
}

// ---------------------------------------------------------------------------- bounds

#[test]
fn buffer_overflow_abandons() {
    let mut c = cfg();
    c.max_session_buffer = 10_000;
    let mut h = H::new(c);
    h.establish();
    let s = C.wrapping_add(1);
    h.fb(T + 1, s, ACK, 0, 0);
    for i in 0..5u32 {
        h.client(s.wrapping_add(i * 2000), ACK, &data(2000));
    }
    assert_eq!(h.e.stats().sessions_active, 1, "exactly at the limit");
    h.client(s.wrapping_add(10_000), ACK, &data(1));
    assert!(h.drain().iter().any(|p| p.has(RST)));
    assert_eq!(h.closed_reason(), Some(CloseReason::BufferOverflow));
}

#[test]
fn max_sessions_sheds_new_connections() {
    let mut c = cfg();
    c.max_sessions = 2;
    let mut h = H::new(c);
    for port in 1..=3 {
        h.client_from(
            SocketAddrV4::new(*CLIENT.ip(), port),
            1,
            SYN,
            b"",
            TcpOptions::default(),
        );
    }
    assert_eq!(h.drain().len(), 2);
    assert_eq!(h.e.stats().sessions_active, 2);
    assert_eq!(h.e.stats().sessions_shed, 1);
}

#[test]
fn pool_maps_clients_without_collisions() {
    let mut c = cfg();
    c.client_ip_pool = Some((Ipv4Addr::new(198, 19, 0, 0), 30)); // two usable addresses
    let mut h = H::new(c);
    let a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 5555);
    let b = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 5555);
    let d = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 12), 5555);
    h.client_from(a, 1, SYN, b"", TcpOptions::default());
    h.client_from(b, 1, SYN, b"", TcpOptions::default());
    h.client_from(d, 1, SYN, b"", TcpOptions::default());
    let syns = h.drain();
    assert_eq!(syns.len(), 2);
    assert_ne!(syns[0].src, syns[1].src);
    for s in &syns {
        assert_eq!(s.src.port(), 5555);
        assert!(s.src.ip().octets()[..3] == [198, 19, 0]);
    }
    assert_eq!(h.e.stats().pool_exhausted, 1);
    // Feedback for the second pool address reaches the second session only.
    h.mirrored = syns[1].src;
    h.fb(T, 2, SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].src, syns[1].src);
    assert_eq!(out[0].dst, TARGET);
}

#[test]
fn same_client_on_two_production_addresses_collides_without_pool() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    let other_prod = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 4), 3306);
    let b = packet(CLIENT, other_prod, 9, 0, SYN, b"", TcpOptions::default());
    h.capture(&b);
    assert_eq!(h.drain().len(), 1);
    assert_eq!(h.e.stats().sessions_collided, 1);
}

// ---------------------------------------------------------------------------- garbage

#[test]
fn garbage_feedback_is_counted_and_harmless() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, b"abc");
    h.drain();
    // Acks bytes we never sent.
    h.fb(T + 1, s.wrapping_add(100_000), ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1, "answered with an ACK, like RFC 793");
    assert_eq!(h.e.stats().feedback_ack_beyond_sent, 1);
    // Our data is still unacknowledged: it is retransmitted.
    let out = h.run_for(ms(250));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.payload, b"abc");
    // Unknown session, wrong server, absurd payload length.
    let saved = h.mirrored;
    h.mirrored = SocketAddrV4::new(Ipv4Addr::new(1, 2, 3, 4), 5);
    h.fb(1, 1, ACK, 1, 0);
    h.mirrored = saved;
    let mut fb = TestFeedback {
        client: CLIENT,
        server: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 99), 3306),
        seq: T + 1,
        ack: s,
        flags: TcpFlags(ACK),
        window: 1,
        options: TcpOptions::default(),
        payload_len: 0,
        payload_prefix: vec![],
    };
    h.e.on_feedback(h.now, &fb);
    assert_eq!(h.e.stats().feedback_unknown_session, 2);
    fb.server = TARGET;
    fb.payload_len = u32::MAX;
    h.e.on_feedback(h.now, &fb);
    fb.payload_len = 0;
    fb.options.mss = Some(0);
    fb.options.window_scale = Some(255);
    fb.flags = TcpFlags(SYN | ACK | FIN | PSH);
    h.e.on_feedback(h.now, &fb);
    h.drain();
    assert_eq!(h.e.stats().sessions_active, 1);
}

#[test]
fn packets_of_the_target_itself_are_ignored() {
    let mut h = H::default();
    // Our own mirrored SYN as the capture would see it (target port == prod port here).
    let b = packet(CLIENT, TARGET, C, 0, SYN, b"", TcpOptions::default());
    h.capture(&b);
    let b = packet(TARGET, CLIENT, C, 0, SYN | ACK, b"", TcpOptions::default());
    h.capture(&b);
    let other = packet(
        CLIENT,
        SocketAddrV4::new(*PROD.ip(), 22),
        1,
        0,
        SYN,
        b"",
        TcpOptions::default(),
    );
    h.capture(&other);
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().captured_target, 2);
    assert_eq!(h.e.stats().captured_ignored, 1);
}

#[test]
fn shutdown_resets_every_live_session() {
    let mut h = H::default();
    h.establish();
    for port in 1..=3 {
        h.client_from(
            SocketAddrV4::new(*CLIENT.ip(), port),
            1,
            SYN,
            b"",
            TcpOptions::default(),
        );
    }
    h.drain();
    h.events();
    h.e.shutdown(h.now);
    let out = h.drain();
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|p| p.has(RST)));
    assert_eq!(h.e.stats().shutdown_resets, 4);
    assert_eq!(h.e.stats().closed(CloseReason::Shutdown), 4);
    assert_eq!(h.e.stats().sessions_active, 0);
    assert_eq!(h.e.stats().sessions_lingering, 0);
    assert_eq!(h.e.next_deadline(), None);
    let ev = h.events();
    assert_eq!(ev.len(), 8, "closed + released for each");
}

#[test]
fn next_deadline_is_the_earliest_timer_across_sessions() {
    let mut h = H::default();
    h.client(C, SYN, b"");
    h.drain();
    assert_eq!(
        h.e.next_deadline(),
        Some(h.now + Duration::from_secs(1)),
        "SYN RTO"
    );
    h.advance(ms(500));
    let b = SocketAddrV4::new(*CLIENT.ip(), 2);
    h.client_from(b, 1, SYN, b"", TcpOptions::default());
    h.drain();
    assert_eq!(
        h.e.next_deadline(),
        Some(h.now + ms(500)),
        "first session's RTO still first"
    );
    // Early calls are harmless.
    h.e.on_timeout(h.now);
    assert!(h.drain().is_empty());
}

#[test]
fn stale_zero_window_with_data_in_flight_still_retransmits_the_head() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, &data(3000));
    assert_eq!(h.drain().len(), 3);
    // A reordered older ACK (same seq and ack as the handshake's) shuts the window while our
    // segments are in flight, and they are all lost.
    h.fb(T + 1, s, ACK, 0, 0);
    let out = h.run_for(ms(250));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].0, out[0].1.seq, out[0].1.payload.len()),
        (ms(200), s, 1460)
    );
    // The answer carries the true window: the rest follows.
    h.fb(T + 1, s.wrapping_add(1460), ACK, 65535, 0);
    assert_eq!(cat(&h.drain()), data(3000)[1460..].to_vec());
}

#[test]
fn acks_stay_inside_a_shut_window_after_a_retransmission_beyond_it() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, &data(3000));
    assert_eq!(h.drain().len(), 3);
    // The test server took the first segment, then shut its window (its reader is blocked
    // sending us a large reply); our retransmission of the head goes out beyond it.
    h.fb(T + 1, s.wrapping_add(1460), ACK, 0, 0);
    let out = h.run_for(ms(250));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].1.seq, s.wrapping_add(1460));
    // Its reply data must be acknowledged by a segment it accepts: one starting inside its
    // window (here, at its edge), not at our snd_nxt beyond it.
    h.fb(T + 1, s.wrapping_add(1460), ACK | PSH, 0, 1000);
    h.fb(T + 1001, s.wrapping_add(1460), ACK | PSH, 0, 1000);
    let acks = h.drain();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert!(acks[0].payload.is_empty());
    assert_eq!((acks[0].seq, acks[0].ack), (s.wrapping_add(1460), T + 2001));
}

#[test]
fn pickup_carries_the_clients_timestamps() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::new(c);
    let ts = TcpOptions {
        timestamps: Some((777, 5)),
        ..Default::default()
    };
    h.client_from(CLIENT, 10, ACK | PSH, b"x", ts);
    let syn = h.drain().remove(0);
    assert_eq!(syn.options.timestamps, Some((777, 0)));
    h.fb_opts(
        T,
        10,
        SYN | ACK,
        65535,
        0,
        TcpOptions {
            timestamps: Some((9, 777)),
            ..Default::default()
        },
    );
    let out = h.drain();
    assert_eq!(out[0].options.timestamps, Some((777, 9)));
    assert_eq!(out[0].payload, b"x");
}

#[test]
fn queued_bytes_counts_what_the_test_server_has_not_acknowledged() {
    let mut h = H::default();
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, &data(1000));
    h.client(s.wrapping_add(2000), ACK, &data(10)); // held beyond a hole
    h.drain();
    assert_eq!(h.e.queued_bytes(), 1000 + 1010);
    h.fb(T + 1, s.wrapping_add(600), ACK, 65535, 0);
    assert_eq!(h.e.queued_bytes(), 400 + 1010);
}

// ---------------------------------------------------------------------------- sampling

mod sampling {
    use super::*;
    use crate::engine::Sample;
    use proptest::prelude::*;

    fn sampled_cfg(percent: f64) -> EngineConfig {
        let mut c = cfg();
        c.sample = Sample::from_percent(percent);
        c.pickup_midstream = true;
        c
    }

    /// The first client port (from 40000) that the sample leaves out, and the first it takes.
    fn ports(s: Sample) -> (SocketAddrV4, SocketAddrV4) {
        let find = |want: bool| {
            (40000..=u16::MAX)
                .map(|p| SocketAddrV4::new(*CLIENT.ip(), p))
                .find(|c| s.admits(*c) == want)
                .unwrap()
        };
        (find(false), find(true))
    }

    #[test]
    fn a_connection_left_out_creates_no_state_whatever_arrives() {
        let c = sampled_cfg(50.0);
        let (out, inn) = ports(c.sample.unwrap());
        let mut h = H::new(c);
        h.client_from(out, C, SYN, b"", TcpOptions::default());
        h.client_from(
            out,
            C.wrapping_add(1),
            ACK | PSH,
            b"select 1",
            TcpOptions::default(),
        );
        let reply = packet(
            PROD,
            out,
            9,
            C.wrapping_add(9),
            ACK,
            b"x",
            TcpOptions::default(),
        );
        h.capture(&reply);
        assert!(h.drain().is_empty());
        assert!(h.events().is_empty());
        let st = h.e.stats().clone();
        assert_eq!((st.sessions_active, st.sessions_picked_up), (0, 0));
        assert_eq!(
            st.sessions_not_sampled, 1,
            "one connection, counted at its SYN"
        );
        assert_eq!(st.packets_not_sampled, 3);
        assert_eq!(
            st.captured_unknown_session + st.captured_prod_unknown_session,
            0
        );
        assert_eq!(h.e.next_deadline(), None);

        // Its neighbour is taken, from SYN or picked up mid-stream.
        h.client_from(inn, C, ACK | PSH, b"select 2", TcpOptions::default());
        assert_eq!(h.e.stats().sessions_picked_up, 1);
    }

    proptest! {
        /// Any interleaving of packets (SYN, repeated SYN, data, replies) of many connections,
        /// half opened by a SYN and half picked up mid-stream: every packet of a connection
        /// gets the same verdict, sessions exist only for connections taken, and each one left
        /// out is counted once.
        #[test]
        fn all_or_nothing_per_connection(
            pct in 1u32..100,
            script in proptest::collection::vec((0u16..40, 0u8..3), 1..200),
        ) {
            let c = sampled_cfg(f64::from(pct));
            let mut h = H::new(c);
            let mut verdict: std::collections::HashMap<u16, bool> = Default::default();
            for (conn, mut kind) in script {
                let client = SocketAddrV4::new(*CLIENT.ip(), 50000 + conn * 2);
                let by_syn = conn % 2 == 0;
                if by_syn && !verdict.contains_key(&conn) {
                    kind = 0;
                } else if !by_syn && kind == 0 {
                    kind = 1;
                }
                let before = h.e.stats().packets_not_sampled;
                match kind {
                    0 => h.client_from(client, C, SYN, b"", TcpOptions::default()),
                    1 => h.client_from(client, C.wrapping_add(1), ACK | PSH, b"q", TcpOptions::default()),
                    _ => {
                        let b = packet(PROD, client, 9, C.wrapping_add(2), ACK, b"r", TcpOptions::default());
                        h.capture(&b);
                    }
                }
                let admitted = h.e.stats().packets_not_sampled == before;
                let first = *verdict.entry(conn).or_insert(admitted);
                prop_assert_eq!(first, admitted, "connection {} changed its verdict", conn);
                h.drain();
                for ev in h.events() {
                    if let EngineEvent::SessionOpened { client, .. } = ev {
                        let conn = (client.port() - 50000) / 2;
                        prop_assert!(verdict.get(&conn) == Some(&true), "{} opened but left out", client);
                    }
                }
            }
            let out_by_syn = verdict.iter().filter(|(k, v)| *k % 2 == 0 && !**v).count() as u64;
            prop_assert_eq!(h.e.stats().sessions_not_sampled, out_by_syn, "counted once each");
        }
    }

    /// A SYN of a connection left out, repeated by the client, is still one connection.
    #[test]
    fn a_repeated_syn_is_not_counted_twice() {
        let c = sampled_cfg(50.0);
        let (out, _) = ports(c.sample.unwrap());
        let mut h = H::new(c);
        for _ in 0..3 {
            h.client_from(out, C, SYN, b"", TcpOptions::default());
            h.advance(ms(1000));
        }
        let st = h.e.stats();
        assert_eq!((st.sessions_not_sampled, st.packets_not_sampled), (1, 3));
        assert_eq!(st.sessions_opened, 0);
    }
}

// ------------------------------------------------------------ waiting on the test server

#[test]
fn a_session_waits_on_the_test_server_only_while_it_cannot_go_on_without_it() {
    let mut h = H::default();
    assert!(!h.e.waits_on_test());
    // Our SYN is out: nothing goes on until the SYN-ACK.
    h.client(C, SYN, b"");
    h.drain();
    assert!(h.e.waits_on_test());
    h.fb_opts(
        T,
        C.wrapping_add(1),
        SYN | ACK,
        1000,
        0,
        TcpOptions {
            mss: Some(1460),
            ..Default::default()
        },
    );
    h.drain();
    h.client(C.wrapping_add(1), ACK, b"");
    assert!(!h.e.waits_on_test(), "established, nothing queued");
    let s = C.wrapping_add(1);
    // Bytes in flight within the window: the test server's ACK is not needed to go on.
    h.client(s, ACK | PSH, &data(800));
    assert_eq!(cat(&h.drain()).len(), 800);
    assert!(!h.e.waits_on_test(), "in flight, window open");
    // Bytes queued past the window: the test server holds a window of ours, work for far
    // longer than the copier takes its feedback late.
    h.client(s.wrapping_add(800), ACK | PSH, &data(700));
    assert_eq!(cat(&h.drain()).len(), 200);
    assert!(!h.e.waits_on_test(), "queued behind the window");
    h.fb(T + 1, s.wrapping_add(1000), ACK, 1000, 0);
    assert_eq!(cat(&h.drain()).len(), 500);
    // A test server that resets a session does not leave it waiting, and forgetting it
    // later keeps the count right.
    h.fb(T + 1000, 0, RST, 0, 0);
    assert_eq!(h.closed_reason(), Some(CloseReason::TestReset));
    assert!(!h.e.waits_on_test());
    h.run_for(cfg().linger + ms(1000));
    assert_eq!(
        h.e.stats().sessions_active + h.e.stats().sessions_lingering,
        0
    );
    assert!(!h.e.waits_on_test());
    // A new session in the same slot starts uncounted.
    h.client(C.wrapping_add(5000), SYN, b"");
    h.drain();
    assert!(h.e.waits_on_test());
}
