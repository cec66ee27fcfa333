//! Scripted scenarios with small transforms of the shapes the MySQL layer will need: a login
//! that waits for the greeting, a login rewritten to another length, a prefix injected into a
//! picked-up connection, commands dropped, a session given up, production's replies read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::alloc_count::{allocations, CountingAlloc};
use common::clock::Instant;
use common::control::TestFeedback;
use common::wire::{parse_ipv4_tcp, TcpFlags, TcpOptions};

use super::tests::{
    assert_completed, cat, cfg, data, ms, packet, Sent, C, CLIENT, H, PROD, T, TARGET,
};
use super::{
    CloseReason, Engine, EngineConfig, EngineEvent, Identity, SessionInfo, StreamTransform,
    TestEvent, TransformFactory, TransformOutput,
};

const SYN: u8 = TcpFlags::SYN;
const ACK: u8 = TcpFlags::ACK;
const FIN: u8 = TcpFlags::FIN;
const RST: u8 = TcpFlags::RST;
const PSH: u8 = TcpFlags::PSH;

/// Production's ISN in these scenarios.
const P: u32 = 0xffff_fff0;

fn factory<T: StreamTransform + 'static>(
    make: impl Fn(&SessionInfo) -> T + Send + 'static,
) -> Box<dyn TransformFactory> {
    Box::new(move |_: Instant, info: &SessionInfo| {
        Some(Box::new(make(info)) as Box<dyn StreamTransform>)
    })
}

/// Test-server data relayed with its payload (as intercept does for a greeting).
fn fb_data(h: &mut H, seq: u32, ack: u32, flags: u8, payload: &[u8]) {
    let fb = TestFeedback {
        client: h.mirrored,
        server: TARGET,
        seq,
        ack,
        flags: TcpFlags(flags),
        window: 65535,
        options: TcpOptions::default(),
        payload_len: payload.len() as u32,
        payload_prefix: payload.to_vec(),
    };
    h.e.on_feedback(h.now, &fb);
}

fn prod_pkt(h: &mut H, seq: u32, ack: u32, flags: u8, payload: &[u8]) {
    let b = packet(
        PROD,
        CLIENT,
        seq,
        ack,
        flags,
        payload,
        TcpOptions::default(),
    );
    h.capture(&b);
}

fn closed(h: &mut H) -> Vec<(CloseReason, Option<&'static str>)> {
    h.events()
        .into_iter()
        .filter_map(|e| match e {
            EngineEvent::SessionClosed { reason, why, .. } => Some((reason, why)),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------- withholding

/// Holds every client byte until the test server has sent "READY" (the login that must wait
/// for the greeting's scramble).
#[derive(Default)]
struct WaitForReady {
    ready: bool,
    held: Vec<u8>,
}

impl StreamTransform for WaitForReady {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.ready {
            out.push(data);
        } else {
            self.held.extend_from_slice(data);
        }
    }
    fn on_test_event(&mut self, _: Instant, ev: &TestEvent<'_>, out: &mut TransformOutput<'_>) {
        let Some(p) = ev.segment().and_then(|s| s.in_order_payload()) else {
            return;
        };
        if !self.ready && p.windows(5).any(|w| w == b"READY") {
            self.ready = true;
            out.push(&std::mem::take(&mut self.held));
        }
    }
    fn pending(&self) -> bool {
        !self.ready
    }
    fn buffered_len(&self) -> usize {
        self.held.len()
    }
}

#[test]
fn login_waits_for_the_greeting_and_fin_waits_for_the_login() {
    let mut h = H::with_factory(cfg(), factory(|_| WaitForReady::default()));
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"LOGIN");
    h.client(s.wrapping_add(5), ACK | FIN, b"");
    assert!(h.drain().is_empty(), "withheld, and no FIN before it");
    assert_eq!(h.e.queued_bytes(), 5, "withheld bytes are queued bytes");
    // Something else first (not what it waits for): only our ACK.
    fb_data(&mut h, T + 1, s, ACK | PSH, b"HELLO");
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert!(out[0].payload.is_empty() && !out[0].has(FIN));
    assert_eq!(out[0].ack, T + 6);
    fb_data(&mut h, T + 6, s, ACK | PSH, b"READY");
    let out = h.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].payload, b"LOGIN");
    assert_eq!((out[0].seq, out[0].ack), (s, T + 11));
    assert!(
        out[0].has(FIN | PSH | ACK),
        "the FIN rides on the released bytes"
    );
    h.fb(T + 11, s.wrapping_add(6), ACK | FIN, 65535, 0);
    h.drain();
    assert_completed(&mut h);
}

#[test]
fn withheld_bytes_count_against_the_session_buffer() {
    let mut c = cfg();
    c.max_session_buffer = 1000;
    let mut h = H::with_factory(c, factory(|_| WaitForReady::default()));
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK, &data(1000));
    assert_eq!(h.e.stats().sessions_active, 1, "exactly at the limit");
    h.client(s.wrapping_add(1000), ACK, &data(1));
    assert!(h.drain().iter().any(|p| p.has(RST)));
    assert_eq!(closed(&mut h), vec![(CloseReason::BufferOverflow, None)]);
}

/// Records every test segment it is shown.
struct SegmentLog(Arc<Mutex<Vec<(u32, bool)>>>);

impl StreamTransform for SegmentLog {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn on_test_event(&mut self, _: Instant, ev: &TestEvent<'_>, _: &mut TransformOutput<'_>) {
        let Some(seg) = ev.segment() else {
            return;
        };
        if let Ok(mut log) = self.0.lock() {
            log.push((seg.feedback().seq, seg.in_order()));
        }
    }
}

#[test]
fn each_new_test_segment_is_marked_in_order_once() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let mut h = H::with_factory(cfg(), factory(move |_| SegmentLog(l.clone())));
    h.establish();
    let s = C.wrapping_add(1);
    fb_data(&mut h, T + 1, s, ACK, b"aaaaa");
    fb_data(&mut h, T + 1, s, ACK, b"aaaaa"); // duplicate
    fb_data(&mut h, T + 11, s, ACK, b"ccccc"); // beyond a hole
    fb_data(&mut h, T + 6, s, ACK, b"bbbbb"); // fills it
    h.fb(T + 16, s, ACK, 65535, 0); // pure ACK
    let got = log.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            (T, false), // the SYN-ACK
            (T + 1, true),
            (T + 1, false),
            (T + 11, false),
            (T + 6, true),
            (T + 16, false),
        ]
    );
}

/// Logs [`TransformOutput::test_stream_seen`] at each of its timers, every 10 ms.
struct SeenAtTimer {
    log: Arc<Mutex<Vec<u32>>>,
    at: Instant,
}

impl StreamTransform for SeenAtTimer {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn next_deadline(&self) -> Option<Instant> {
        Some(self.at)
    }
    fn on_timeout(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        self.log.lock().unwrap().push(out.test_stream_seen());
        self.at = now + ms(10);
    }
}

#[test]
fn a_transform_hears_how_much_of_the_test_stream_was_seen_in_order() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let mut h = H::with_factory(
        cfg(),
        factory(move |_| SeenAtTimer {
            log: l.clone(),
            at: Instant::ZERO,
        }),
    );
    h.establish();
    let s = C.wrapping_add(1);
    let seen = |h: &mut H| {
        h.advance(ms(10));
        *log.lock().unwrap().last().expect("the timer ran")
    };
    assert_eq!(seen(&mut h), 0, "the SYN-ACK is no byte of the stream");
    fb_data(&mut h, T + 1, s, ACK, b"aaaaa");
    assert_eq!(seen(&mut h), 5);
    fb_data(&mut h, T + 11, s, ACK, b"ccccc");
    assert_eq!(seen(&mut h), 5, "not past a hole");
    fb_data(&mut h, T + 6, s, ACK, b"bbbbb");
    assert_eq!(seen(&mut h), 15);
}

// ---------------------------------------------------------------------------- rewriting

/// Replaces the first `n` client bytes with `with` (the login rewrite: another length).
struct ReplacePrefix {
    n: usize,
    with: Vec<u8>,
    held: Vec<u8>,
    done: bool,
}

impl ReplacePrefix {
    fn new(n: usize, with: &[u8]) -> Self {
        Self {
            n,
            with: with.to_vec(),
            held: Vec::new(),
            done: false,
        }
    }
}

const REWRITTEN: usize = 0;

impl StreamTransform for ReplacePrefix {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.done {
            out.push(data);
            return;
        }
        let take = (self.n - self.held.len()).min(data.len());
        self.held.extend_from_slice(&data[..take]);
        if self.held.len() == self.n {
            self.done = true;
            out.push(&self.with);
            out.count(REWRITTEN);
            out.push(&data[take..]);
        }
    }
    fn on_client_fin(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        if !self.done {
            out.push(&std::mem::take(&mut self.held));
        }
    }
}

fn rewrite_shifts_every_later_sequence_number(with: &'static [u8]) {
    let mut h = H::with_factory(cfg(), factory(move |_| ReplacePrefix::new(10, with)));
    h.establish();
    let s = C.wrapping_add(1);
    let shift = (with.len() as u32).wrapping_sub(10);
    let our = |client_seq: u32| client_seq.wrapping_add(shift);
    // The login arrives in two pieces; nothing goes out before it is whole.
    h.client(s, ACK | PSH, b"01234");
    assert!(h.drain().is_empty());
    h.client(s.wrapping_add(5), ACK | PSH, b"56789ABCDEF");
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].seq, s,
        "our ISN is the client's: the stream starts where it did"
    );
    assert_eq!(out[0].payload, [with, b"ABCDEF"].concat());
    h.client(s.wrapping_add(16), ACK | PSH, b"next");
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].seq, out[0].payload.as_slice()),
        (our(s.wrapping_add(16)), &b"next"[..])
    );
    // Nothing acknowledged: the timeout resends our bytes from our snd_una.
    let out = h.run_for(ms(250));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.seq, s);
    assert_eq!(out[0].1.payload, [with, b"ABCDEFnext"].concat());
    // The test server acknowledges in our space: the first segment only.
    h.fb(T + 1, our(s.wrapping_add(16)), ACK, 65535, 0);
    assert_eq!(h.e.queued_bytes(), 4);
    let out = h.run_for(ms(250));
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].1.seq, out[0].1.payload.as_slice()),
        (our(s.wrapping_add(16)), &b"next"[..])
    );
    // The client closes; our FIN goes after our last byte.
    h.client(s.wrapping_add(20), ACK | FIN, b"");
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert!(out[0].has(FIN));
    let fin_seq = our(s.wrapping_add(20));
    assert_eq!(out[0].seq, fin_seq);
    if with.len() < 10 {
        // The client's own numbers are beyond anything we sent.
        h.fb(T + 1, s.wrapping_add(21), ACK, 65535, 0);
        assert_eq!(h.e.stats().feedback_ack_beyond_sent, 1);
    }
    h.fb(T + 1, fin_seq.wrapping_add(1), ACK | FIN, 65535, 0);
    let out = h.drain();
    assert_eq!((out[0].seq, out[0].ack), (fin_seq.wrapping_add(1), T + 2));
    assert_completed(&mut h);
    let st = h.e.stats();
    assert_eq!(st.client_bytes_reassembled, 20);
    let ours = with.len() as u64 + 10;
    assert_eq!((st.bytes_queued, st.bytes_sent), (ours, ours));
    assert_eq!(st.transform.get(REWRITTEN), 1);
}

#[test]
fn longer_rewrite_shifts_every_later_sequence_number() {
    rewrite_shifts_every_later_sequence_number(b"a much longer login packet");
}

#[test]
fn shorter_rewrite_shifts_every_later_sequence_number() {
    rewrite_shifts_every_later_sequence_number(b"tiny");
}

#[test]
fn boxed_identity_sends_exactly_what_no_transform_sends() {
    fn script(h: &mut H) -> Vec<Sent> {
        let mut all = Vec::new();
        h.establish();
        let s = C.wrapping_add(1);
        h.client(s.wrapping_add(3000), ACK, &data(500)); // held beyond a hole
        h.client(s, ACK, &data(3000));
        all.extend(h.drain());
        h.fb(T + 1, s.wrapping_add(1460), ACK, 2000, 0);
        all.extend(h.drain());
        all.extend(h.run_for(ms(700)).into_iter().map(|(_, p)| p));
        h.client(s.wrapping_add(3500), ACK | FIN, b"");
        h.fb(T + 1, s.wrapping_add(3501), ACK | FIN, 65535, 0);
        all.extend(h.drain());
        all
    }
    let mut plain = H::default();
    let mut boxed = H::with_factory(cfg(), factory(|_| Identity));
    let a = script(&mut plain);
    let b = script(&mut boxed);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    assert_eq!(plain.e.stats(), boxed.e.stats());
}

// ---------------------------------------------------------------------------- pickup

/// Injects `prefix` into a picked-up session before any client byte (the synthetic login).
struct Prefix(&'static [u8]);

impl StreamTransform for Prefix {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn on_pickup(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        out.push(self.0);
    }
}

#[test]
fn pickup_injects_bytes_before_the_captured_ones() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::with_factory(c, factory(|_| Prefix(b"LOGIN;USE db;")));
    let sq = 123_456;
    h.client(sq, ACK | PSH, b"SELECT 1");
    let syn = h.drain().remove(0);
    assert_eq!(
        (syn.flags, syn.seq),
        (SYN, sq - 1),
        "ISN still the client's"
    );
    h.fb(T, sq, SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].seq, out[0].payload.as_slice()),
        (sq, &b"LOGIN;USE db;SELECT 1"[..])
    );
    h.client(sq + 8, ACK | PSH, b"SELECT 2");
    let out = h.drain();
    assert_eq!(out[0].seq, sq + 13 + 8);
    assert_eq!(h.e.stats().bytes_queued, 13 + 16);
}

#[test]
fn pickup_from_a_keepalive_injects_then_finds_the_real_start() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::with_factory(c, factory(|_| Prefix(b"P")));
    let next = 50_000;
    h.client(next - 1, ACK, b""); // keepalive probe
    let syn = h.drain().remove(0);
    assert_eq!(syn.seq, next - 2);
    h.fb(T, next - 1, SYN | ACK, 65535, 0);
    let out = h.drain();
    assert_eq!(
        (out[0].seq, out[0].payload.as_slice()),
        (next - 1, &b"P"[..])
    );
    h.client(next, ACK | PSH, b"q");
    let out = h.drain();
    assert_eq!((out[0].seq, out[0].payload.as_slice()), (next, &b"q"[..]));
    h.run_for(Duration::from_secs(5));
    assert_eq!(h.e.stats().sessions_active, 1, "no false capture gap");
}

#[test]
fn sessions_started_from_a_syn_are_not_picked_up() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::with_factory(c, factory(|_| Prefix(b"never")));
    h.establish();
    h.client(C.wrapping_add(1), ACK, b"x");
    assert_eq!(cat(&h.drain()), b"x");
}

// ---------------------------------------------------------------------------- dropping

/// Commands framed as `[len][type][body...]`; type `W` is a write and is dropped (the
/// read-only mode's shape), counted per decision.
#[derive(Default)]
struct DropWrites {
    /// Bytes of the current command still to come, and whether they are dropped.
    left: usize,
    dropping: bool,
    /// The length byte, waiting for the type byte.
    len: Option<u8>,
}

const SEEN: usize = 0;
const FORWARDED: usize = 1;
const DROPPED: usize = 2;

impl StreamTransform for DropWrites {
    fn on_client_data(&mut self, _: Instant, mut data: &[u8], out: &mut TransformOutput<'_>) {
        while !data.is_empty() {
            if self.left > 0 {
                let k = self.left.min(data.len());
                if !self.dropping {
                    out.push(&data[..k]);
                }
                self.left -= k;
                data = &data[k..];
                continue;
            }
            match self.len.take() {
                None => {
                    self.len = Some(data[0]);
                    data = &data[1..];
                }
                Some(len) => {
                    out.count(SEEN);
                    self.dropping = data[0] == b'W';
                    if self.dropping {
                        out.count(DROPPED);
                    } else {
                        out.count(FORWARDED);
                        out.push(&[len]);
                    }
                    self.left = usize::from(len);
                }
            }
        }
    }
}

struct DropWritesFactory;

impl TransformFactory for DropWritesFactory {
    fn create(&mut self, _: Instant, _: &SessionInfo) -> Option<Box<dyn StreamTransform>> {
        Some(Box::new(DropWrites::default()))
    }
    fn counter_names(&self) -> &'static [&'static str] {
        &["commands_seen", "commands_forwarded", "commands_dropped"]
    }
}

#[test]
fn dropped_commands_leave_no_hole_in_our_stream() {
    let mut h = H::with_factory(cfg(), Box::new(DropWritesFactory));
    h.establish();
    let s = C.wrapping_add(1);
    // [3 R a b] [2 W x] [1 R], cut across segments anywhere.
    h.client(s, ACK, b"\x03Ra");
    h.client(s.wrapping_add(3), ACK, b"b\x02W");
    h.client(s.wrapping_add(6), ACK, b"x\x01R");
    h.client(s.wrapping_add(9), ACK | FIN, b"");
    let out = h.drain();
    assert_eq!(cat(&out), b"\x03Rab\x01R");
    let mut expect = s;
    for p in &out {
        assert_eq!(p.seq, expect, "contiguous in our space");
        expect = expect.wrapping_add(p.payload.len() as u32);
    }
    let fin = out.last().unwrap();
    assert!(fin.has(FIN));
    h.fb(T + 1, s.wrapping_add(7), ACK | FIN, 65535, 0);
    h.drain();
    assert_completed(&mut h);
    let names = h.e.transform_counter_names();
    let counted: Vec<_> = h.e.stats().transform.named(names).collect();
    assert_eq!(
        counted,
        vec![
            ("commands_seen", 3),
            ("commands_forwarded", 2),
            ("commands_dropped", 1)
        ]
    );
}

// ---------------------------------------------------------------------------- abandoning

/// Gives the session up when the client's first bytes say "TLS".
#[derive(Default)]
struct RefuseTls {
    checked: bool,
}

impl StreamTransform for RefuseTls {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if !self.checked && data.starts_with(b"TLS") {
            out.abandon("tls");
            out.count(0);
            return;
        }
        self.checked = true;
        out.push(data);
    }
}

#[test]
fn abandoned_session_is_reset_counted_and_stays_closed() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::with_factory(c, factory(|_| RefuseTls::default()));
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"TLS hello");
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert!(out[0].has(RST) && out[0].seq == s && out[0].payload.is_empty());
    assert_eq!(
        closed(&mut h),
        vec![(CloseReason::NotMirrorable, Some("tls"))]
    );
    let st = h.e.stats();
    assert_eq!(st.closed(CloseReason::NotMirrorable), 1);
    assert_eq!((st.bytes_sent, st.transform.get(0)), (0, 1));
    // The client keeps talking: no pickup resurrects it.
    h.client(s.wrapping_add(9), ACK | PSH, b"more");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().sessions_picked_up, 0);
}

/// Gives up at once on a picked-up connection (no credentials for it, say).
struct NoPickup;

impl StreamTransform for NoPickup {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn on_pickup(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        out.abandon("no credentials");
    }
}

#[test]
fn abandoned_before_the_syn_nothing_reaches_the_test_server() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let mut h = H::with_factory(c, factory(|_| NoPickup));
    h.client(10, ACK | PSH, b"SELECT 1");
    assert!(h.drain().is_empty(), "no SYN, no RST");
    assert_eq!(
        closed(&mut h),
        vec![(CloseReason::NotMirrorable, Some("no credentials"))]
    );
    assert_eq!(h.e.stats().rsts_sent, 0);
}

// ---------------------------------------------------------------------------- production's replies

/// Passes client bytes through and records production's replies.
struct ProdLog(Arc<Mutex<Vec<u8>>>);

impl StreamTransform for ProdLog {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn wants_prod_data(&self) -> bool {
        true
    }
    fn on_prod_data(&mut self, _: Instant, data: &[u8], _: &mut TransformOutput<'_>) {
        if let Ok(mut log) = self.0.lock() {
            log.extend_from_slice(data);
        }
    }
}

fn prod_log_engine(c: EngineConfig) -> (H, Arc<Mutex<Vec<u8>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (
        H::with_factory(c, factory(move |_| ProdLog(l.clone()))),
        log,
    )
}

#[test]
fn production_replies_reach_the_transform_in_order_once() {
    let (mut h, log) = prod_log_engine(cfg());
    h.client(C, SYN, b"");
    prod_pkt(&mut h, P, C.wrapping_add(1), SYN | ACK, b"");
    let p = P.wrapping_add(1);
    prod_pkt(&mut h, p.wrapping_add(5), C.wrapping_add(1), ACK, b"ing!");
    prod_pkt(&mut h, p, C.wrapping_add(1), ACK, b"greet");
    prod_pkt(&mut h, p, C.wrapping_add(1), ACK, b"greet");
    prod_pkt(
        &mut h,
        p.wrapping_add(7),
        C.wrapping_add(1),
        ACK | FIN,
        b"g!OK",
    );
    assert_eq!(log.lock().unwrap().as_slice(), b"greeting!OK");
    assert_eq!(h.e.stats().prod_bytes_reassembled, 11);
    // Without a transform that reads them, replies are not even reassembled.
    let mut plain = H::default();
    plain.client(C, SYN, b"");
    let b = packet(
        PROD,
        CLIENT,
        p,
        C.wrapping_add(1),
        ACK,
        b"greet",
        TcpOptions::default(),
    );
    plain.capture(&b);
    assert_eq!(plain.e.stats().prod_bytes_reassembled, 0);
}

#[test]
fn picked_up_session_reads_production_from_its_first_captured_reply() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let (mut h, log) = prod_log_engine(c);
    h.client(1000, ACK | PSH, b"SELECT 1");
    prod_pkt(&mut h, 5000, 1008, ACK, b""); // pure ACK: maybe a keepalive, says nothing
    prod_pkt(&mut h, 5001, 1008, ACK | PSH, b"result");
    assert_eq!(log.lock().unwrap().as_slice(), b"result");
}

#[test]
fn production_reply_missing_from_the_capture_is_a_gap() {
    let (mut h, _) = prod_log_engine(cfg());
    h.establish();
    // SYN-ACK captured, then a reply beyond a hole that never fills.
    prod_pkt(&mut h, P, C.wrapping_add(1), SYN | ACK, b"");
    prod_pkt(&mut h, P.wrapping_add(100), C.wrapping_add(1), ACK, b"late");
    h.run_for(Duration::from_secs(4));
    assert_eq!(h.closed_reason(), Some(CloseReason::CaptureGap));

    // The client acknowledges reply bytes the capture never had.
    let (mut h, _) = prod_log_engine(cfg());
    h.client(C, SYN, b"");
    prod_pkt(&mut h, P, C.wrapping_add(1), SYN | ACK, b"");
    h.drain();
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    h.drain();
    let b = packet(
        CLIENT,
        PROD,
        C.wrapping_add(1),
        P.wrapping_add(1),
        ACK,
        b"",
        TcpOptions::default(),
    );
    h.capture(&b);
    h.run_for(Duration::from_secs(4));
    assert_eq!(
        h.e.stats().sessions_active,
        1,
        "acking what was captured is fine"
    );
    let b = packet(
        CLIENT,
        PROD,
        C.wrapping_add(1),
        P.wrapping_add(51),
        ACK,
        b"",
        TcpOptions::default(),
    );
    h.capture(&b);
    h.run_for(Duration::from_secs(4));
    assert_eq!(h.closed_reason(), Some(CloseReason::CaptureGap));
}

// ---------------------------------------------------------------------------- timers, misuse

/// Withholds everything until `at`, then lets it through.
struct Delay {
    at: Instant,
    held: Option<Vec<u8>>,
}

impl StreamTransform for Delay {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        match &mut self.held {
            Some(h) => h.extend_from_slice(data),
            None => out.push(data),
        }
    }
    fn pending(&self) -> bool {
        self.held.is_some()
    }
    fn buffered_len(&self) -> usize {
        self.held.as_ref().map_or(0, Vec::len)
    }
    fn next_deadline(&self) -> Option<Instant> {
        self.held.is_some().then_some(self.at)
    }
    fn on_timeout(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        assert!(now >= self.at, "never called early");
        if let Some(h) = self.held.take() {
            out.push(&h);
        }
    }
}

#[test]
fn transform_timer_releases_withheld_bytes_on_time() {
    let mut h = H::with_factory(
        cfg(),
        Box::new(|now: Instant, _: &SessionInfo| {
            Some(Box::new(Delay {
                at: now + ms(5000),
                held: Some(Vec::new()),
            }) as Box<dyn StreamTransform>)
        }),
    );
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"abc");
    h.client(s.wrapping_add(3), ACK | FIN, b"");
    let out = h.run_for(ms(5100));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        out[0].0,
        ms(5000),
        "the session was created when the run started"
    );
    assert_eq!(out[0].1.payload, b"abc");
    assert!(out[0].1.has(FIN));
}

/// Leaves a past deadline in place forever and pushes after our FIN: both bugs, both harmless.
struct Misbehaving {
    fin_seen: bool,
}

impl StreamTransform for Misbehaving {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn on_client_fin(&mut self, _: Instant, _: &mut TransformOutput<'_>) {
        self.fin_seen = true;
    }
    fn next_deadline(&self) -> Option<Instant> {
        Some(Instant::from_nanos(1))
    }
    fn on_timeout(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        if self.fin_seen {
            out.push(b"late");
        }
    }
}

#[test]
fn a_stuck_deadline_does_not_spin_and_pushes_after_fin_are_refused() {
    let mut h = H::with_factory(cfg(), factory(|_| Misbehaving { fin_seen: false }));
    h.establish();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH | FIN, b"q");
    let out = h.drain();
    assert_eq!((cat(&out).as_slice(), out[0].has(FIN)), (&b"q"[..], true));
    for _ in 0..3 {
        h.advance(ms(1)); // would never return if the engine spun on the deadline
        assert_eq!(
            h.e.next_deadline(),
            Some(h.now + ms(1)),
            "retried a little later: the driver does not spin either"
        );
    }
    assert!(h.drain().iter().all(|p| p.payload.is_empty()));
    assert_eq!(h.e.stats().transform_bytes_refused, 12);
    h.fb(T + 1, s.wrapping_add(2), ACK | FIN, 65535, 0);
    h.drain();
    assert_completed(&mut h);
}

// ---------------------------------------------------------------------------- allocation

// Counts this thread's allocations, so a test can tell whether a code path allocates.
#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Reads production's replies and passes client bytes through, without allocating.
struct CountProd;

impl StreamTransform for CountProd {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
    fn wants_prod_data(&self) -> bool {
        true
    }
    fn on_prod_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.add(0, data.len() as u64);
    }
}

/// Steady traffic on an established session (client data, production replies, test ACKs):
/// after a warm-up, how many allocations the engine made.
fn steady_state_allocations(e: Engine) -> u64 {
    const WARM: u32 = 3000;
    const MEASURED: u32 = 1000;
    const LEN: u32 = 300;
    let mut h = H::new(cfg());
    h.e = e;
    h.client(C, SYN, b"");
    prod_pkt(&mut h, P, C.wrapping_add(1), SYN | ACK, b"");
    h.drain();
    h.fb(T, C.wrapping_add(1), SYN | ACK, 65535, 0);
    h.drain();
    let s = C.wrapping_add(1);
    let p = P.wrapping_add(1);
    let payload = data(LEN as usize);
    // Everything the loop feeds is built beforehand: only the engine may allocate below.
    let rounds: Vec<_> = (0..WARM + MEASURED)
        .map(|i| {
            let cs = s.wrapping_add(i * LEN);
            let ps = p.wrapping_add(i * 40);
            let client = packet(
                CLIENT,
                PROD,
                cs,
                ps,
                ACK | PSH,
                &payload,
                TcpOptions::default(),
            );
            let prod = packet(
                PROD,
                CLIENT,
                ps,
                cs.wrapping_add(LEN),
                ACK | PSH,
                &payload[..40],
                TcpOptions::default(),
            );
            let fb = TestFeedback {
                client: CLIENT,
                server: TARGET,
                seq: T + 1,
                ack: cs.wrapping_add(LEN),
                flags: TcpFlags(ACK),
                window: 65535,
                options: TcpOptions::default(),
                payload_len: 0,
                payload_prefix: Vec::new(),
            };
            (client, prod, fb)
        })
        .collect();
    let mut buf = vec![0u8; h.e.transmit_buffer_len()];
    let mut before = 0;
    for (i, (client, prod, fb)) in rounds.iter().enumerate() {
        if i == WARM as usize {
            before = allocations();
        }
        h.now = h.now + ms(1);
        let e = &mut h.e;
        e.on_timeout(h.now);
        e.on_captured(h.now, &parse_ipv4_tcp(client).unwrap());
        e.on_captured(h.now, &parse_ipv4_tcp(prod).unwrap());
        while e.poll_transmit(h.now, &mut buf).is_some() {}
        e.on_feedback(h.now, fb);
        while e.poll_transmit(h.now, &mut buf).is_some() {}
        while e.poll_event().is_some() {}
    }
    let n = allocations() - before;
    assert_eq!(h.e.stats().sessions_active, 1);
    assert_eq!(
        h.e.stats().bytes_sent,
        u64::from((WARM + MEASURED) * LEN),
        "every round went through"
    );
    n
}

#[test]
fn the_packet_path_does_not_allocate() {
    assert_eq!(steady_state_allocations(Engine::new(cfg())), 0, "identity");
    let e = Engine::with_transform(cfg(), factory(|_| Identity));
    assert_eq!(steady_state_allocations(e), 0, "boxed identity transform");
    let e = Engine::with_transform(cfg(), factory(|_| CountProd));
    assert_eq!(
        steady_state_allocations(e),
        0,
        "transform reading production"
    );
}

/// Records when each delivered chunk was captured, as the transform is told.
struct CaptureTimes(Arc<Mutex<Vec<Option<Instant>>>>);

impl StreamTransform for CaptureTimes {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if let Ok(mut log) = self.0.lock() {
            log.push(out.captured_at());
        }
        out.push(data);
    }

    fn wants_prod_data(&self) -> bool {
        true
    }

    fn on_prod_data(&mut self, _: Instant, _: &[u8], out: &mut TransformOutput<'_>) {
        if let Ok(mut log) = self.0.lock() {
            log.push(out.captured_at());
        }
    }
}

#[test]
fn transforms_learn_when_the_bytes_they_get_were_captured() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let mut h = H::with_factory(cfg(), factory(move |_| CaptureTimes(l.clone())));
    h.client(C, SYN, b"");
    prod_pkt(&mut h, P, C.wrapping_add(1), SYN | ACK, b"");
    h.client(C.wrapping_add(1), ACK | PSH, b"query");
    let at = |h: &H, back_ms: u64| Instant::from_nanos(h.now.as_nanos() - back_ms * 1_000_000);
    let captured = at(&h, 3);
    let b = packet(
        PROD,
        CLIENT,
        P.wrapping_add(1),
        C.wrapping_add(6),
        ACK | PSH,
        b"reply",
        TcpOptions::default(),
    );
    let pkt = parse_ipv4_tcp(&b).unwrap();
    h.e.on_captured_at(h.now, captured, &pkt);
    // Later than `now` (captured while a batch was drained): as it is.
    let b = packet(
        PROD,
        CLIENT,
        P.wrapping_add(6),
        C.wrapping_add(6),
        ACK | PSH,
        b"more",
        TcpOptions::default(),
    );
    let pkt = parse_ipv4_tcp(&b).unwrap();
    let late = Instant::from_nanos(h.now.as_nanos() + 5_000_000);
    h.e.on_captured_at(h.now, late, &pkt);
    assert_eq!(
        log.lock().unwrap().as_slice(),
        [None, Some(captured), Some(late)]
    );
}
