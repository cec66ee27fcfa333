//! Property tests: the engine against a simulated test server through a hostile network.
//!
//! The simulated test server is a plain TCP receiver (in-order only, cumulative ACKs, a finite
//! receive buffer drained by a slow "application", a few reply bytes now and then, its own
//! retransmissions, FIN first or second). Between it and the engine: loss, reordering and
//! duplication in both directions (our packets toward it; its segments as feedback). The
//! capture feeds the client's stream in arbitrary chunks, reordered and duplicated but never
//! lost (a lost capture is a gap, tested elsewhere). Property: the test server receives exactly
//! the client's bytes, in order, and the session closes cleanly; with a transform that rewrites
//! the stream (a pure function of it: chunks replaced, inserted, deleted anywhere, a prefix
//! injected on pickup, a trailer at FIN, everything withheld for a while), exactly the
//! rewritten stream; and a transform that reads production's replies sees them in order.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;

use common::clock::Instant;
use common::control::TestFeedback;
use common::wire::{parse_ipv4_tcp, TcpFlags, TcpOptions};

use super::tests::{cfg, packet, parse_sent, Sent, CLIENT, PROD, TARGET};
use super::{
    CloseReason, Engine, EngineConfig, EngineEvent, Identity, SessionInfo, StreamTransform,
    TestEvent, TransformFactory, TransformOutput,
};

/// The simulated test server's own sequence arithmetic on raw `u32`s: a TCP written apart
/// from the engine's (these are the `common::wire::seq` helpers the engine used before
/// `SeqNumber`), so the two do not share a mistake.
mod seq {
    pub(super) fn lt(a: u32, b: u32) -> bool {
        (a.wrapping_sub(b) as i32) < 0
    }
    pub(super) fn le(a: u32, b: u32) -> bool {
        (a.wrapping_sub(b) as i32) <= 0
    }
    pub(super) fn gt(a: u32, b: u32) -> bool {
        lt(b, a)
    }
    pub(super) fn ge(a: u32, b: u32) -> bool {
        le(b, a)
    }
    pub(super) fn max(a: u32, b: u32) -> u32 {
        if lt(a, b) {
            b
        } else {
            a
        }
    }
}

const SYN: u8 = TcpFlags::SYN;
const ACK: u8 = TcpFlags::ACK;
const FIN: u8 = TcpFlags::FIN;
const RST: u8 = TcpFlags::RST;
const PSH: u8 = TcpFlags::PSH;

/// Deterministic generator for the network's coin flips (seeded by proptest).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// True with probability pct/100.
    fn pct(&mut self, pct: u8) -> bool {
        self.below(100) < u64::from(pct)
    }
}

/// One direction of the network: packets with delivery times.
struct Link<T> {
    in_flight: Vec<(Instant, u64, T)>,
    loss: u8,
    dup: u8,
    max_delay_ms: u64,
    counter: u64,
}

impl<T: Clone> Link<T> {
    fn new(loss: u8, dup: u8, max_delay_ms: u64) -> Self {
        Self {
            in_flight: Vec::new(),
            loss,
            dup,
            max_delay_ms,
            counter: 0,
        }
    }
    fn send(&mut self, now: Instant, rng: &mut Rng, item: T) {
        if rng.pct(self.loss) {
            return;
        }
        let copies = if rng.pct(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = Duration::from_micros(rng.below(self.max_delay_ms * 1000 + 1));
            self.counter += 1;
            self.in_flight
                .push((now + delay, self.counter, item.clone()));
        }
    }
    fn next_time(&self) -> Option<Instant> {
        self.in_flight.iter().map(|(t, _, _)| *t).min()
    }
    fn due(&mut self, now: Instant) -> Vec<T> {
        let mut due: Vec<_> = Vec::new();
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now {
                due.push(self.in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|(t, c, _)| (*t, *c));
        due.into_iter().map(|(_, _, x)| x).collect()
    }
}

#[derive(Clone, Debug)]
struct SrvSeg {
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    options: TcpOptions,
    len: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SrvState {
    Listen,
    SynRcvd,
    Established,
    Reset,
}

#[derive(Clone, Debug)]
struct ServerParams {
    mss: u16,
    wscale: Option<u8>,
    timestamps: bool,
    capacity: u32,
    read_pct: u8,
    reply_pct: u8,
    close_first: bool,
}

/// A minimal, strict TCP receiver with a tiny sender for its replies.
struct Server {
    p: ServerParams,
    isn: u32,
    state: SrvState,
    ws: u8,
    ts_on: bool,
    ts_recent: u32,
    rcv_nxt: u32,
    received: Vec<u8>,
    unread: u32,
    got_fin: bool,
    snd_una: u32,
    snd_nxt: u32,
    snd_max: u32,
    reply_len: u32,
    fin_queued: bool,
    rto_at: Option<Instant>,
    last_adv: u32,
    total_client: usize,
    out: Vec<SrvSeg>,
}

impl Server {
    fn new(p: ServerParams, total_client: usize) -> Self {
        let isn = 0xfff0_0000;
        Self {
            p,
            isn,
            state: SrvState::Listen,
            ws: 0,
            ts_on: false,
            ts_recent: 0,
            rcv_nxt: 0,
            received: Vec::new(),
            unread: 0,
            got_fin: false,
            snd_una: isn,
            snd_nxt: isn,
            snd_max: isn,
            reply_len: 0,
            fin_queued: false,
            rto_at: None,
            last_adv: 0,
            total_client,
            out: Vec::new(),
        }
    }

    fn data_end(&self) -> u32 {
        self.isn.wrapping_add(1).wrapping_add(self.reply_len)
    }

    fn fin_seq_end(&self) -> u32 {
        self.data_end().wrapping_add(1)
    }

    fn done(&self) -> bool {
        self.state == SrvState::Established
            && self.got_fin
            && self.fin_queued
            && self.snd_una == self.fin_seq_end()
    }

    fn window(&self) -> u32 {
        self.p.capacity - self.unread
    }

    fn seg(&mut self, seq: u32, flags: u8, len: u32, now: Instant) {
        let syn = flags & SYN != 0;
        let window = if syn {
            self.p.capacity.min(65535) as u16
        } else {
            (self.window() >> self.ws).min(65535) as u16
        };
        self.last_adv = u32::from(window) << if syn { 0 } else { self.ws };
        let mut options = TcpOptions::default();
        if syn {
            options.mss = Some(self.p.mss);
            options.window_scale = if self.ws > 0 || self.p.wscale == Some(0) {
                self.p.wscale
            } else {
                None
            };
        }
        if self.ts_on {
            options.timestamps = Some(((now.as_nanos() / 1_000_000) as u32, self.ts_recent));
        }
        self.out.push(SrvSeg {
            seq,
            ack: self.rcv_nxt,
            flags,
            window,
            options,
            len,
        });
    }

    fn send_synack(&mut self, now: Instant) {
        self.seg(self.isn, SYN | ACK, 0, now);
    }

    fn send_ack(&mut self, now: Instant) {
        self.seg(self.snd_nxt, ACK, 0, now);
    }

    fn send_data(&mut self, now: Instant) {
        let mss = u32::from(self.p.mss);
        while seq::lt(self.snd_nxt, self.data_end()) {
            let len = self.data_end().wrapping_sub(self.snd_nxt).min(mss);
            let end = self.snd_nxt.wrapping_add(len);
            let fin = self.fin_queued && end == self.data_end();
            self.seg(
                self.snd_nxt,
                ACK | PSH | if fin { FIN } else { 0 },
                len,
                now,
            );
            self.snd_nxt = end.wrapping_add(u32::from(fin));
        }
        if self.fin_queued && self.snd_nxt == self.data_end() {
            self.seg(self.snd_nxt, ACK | FIN, 0, now);
            self.snd_nxt = self.fin_seq_end();
        }
        self.snd_max = seq::max(self.snd_max, self.snd_nxt);
        if self.snd_una != self.snd_max && self.rto_at.is_none() {
            self.rto_at = Some(now + Duration::from_millis(300));
        }
    }

    fn on_packet(&mut self, now: Instant, p: &Sent, rng: &mut Rng) {
        assert_eq!(p.dst, TARGET);
        assert_eq!(p.src, CLIENT);
        if p.flags & RST != 0 {
            self.state = SrvState::Reset;
            return;
        }
        match self.state {
            SrvState::Reset => return,
            SrvState::Listen => {
                if p.flags & SYN != 0 && p.flags & ACK == 0 {
                    self.rcv_nxt = p.seq.wrapping_add(1);
                    if let (Some(_), Some(ws)) = (p.options.window_scale, self.p.wscale) {
                        self.ws = ws;
                    }
                    self.ts_on = self.p.timestamps && p.options.timestamps.is_some();
                    if let Some((v, _)) = p.options.timestamps {
                        self.ts_recent = v;
                    }
                    self.state = SrvState::SynRcvd;
                    self.send_synack(now);
                    self.rto_at = Some(now + Duration::from_secs(1));
                }
                return;
            }
            SrvState::SynRcvd => {
                if p.flags & SYN != 0 {
                    assert_eq!(p.seq.wrapping_add(1), self.rcv_nxt, "SYN with another ISN");
                    self.send_synack(now);
                    return;
                }
                if p.flags & ACK == 0 || p.ack != self.isn.wrapping_add(1) {
                    return;
                }
                self.state = SrvState::Established;
                self.snd_una = self.isn.wrapping_add(1);
                self.snd_nxt = self.snd_una;
                self.snd_max = self.snd_una;
                self.rto_at = None;
            }
            SrvState::Established => {
                if p.flags & SYN != 0 {
                    self.send_ack(now);
                    return;
                }
            }
        }
        if p.flags & ACK == 0 {
            return;
        }
        if self.ts_on {
            let (v, _) = p
                .options
                .timestamps
                .expect("timestamps on every segment once negotiated");
            self.ts_recent = seq::max(v, self.ts_recent);
        } else {
            assert!(p.options.timestamps.is_none(), "timestamps not negotiated");
        }
        assert!(
            seq::le(p.ack, self.snd_max),
            "engine acked server bytes never sent"
        );
        if seq::gt(p.ack, self.snd_una) {
            self.snd_una = p.ack;
            if seq::lt(self.snd_nxt, self.snd_una) {
                self.snd_nxt = self.snd_una;
            }
            self.rto_at = (self.snd_una != self.snd_max).then(|| now + Duration::from_millis(300));
        }
        let len = p.payload.len() as u32;
        let fin = p.flags & FIN != 0;
        if len == 0 && !fin {
            if p.seq == self.rcv_nxt.wrapping_sub(1) {
                self.send_ack(now); // window probe
            }
            return;
        }
        let end = p.seq.wrapping_add(len);
        let mut took = 0;
        if seq::le(p.seq, self.rcv_nxt) && seq::gt(end.wrapping_add(u32::from(fin)), self.rcv_nxt) {
            let off = self.rcv_nxt.wrapping_sub(p.seq);
            if off < len {
                took = (len - off).min(self.window());
                let from = off as usize;
                self.received
                    .extend_from_slice(&p.payload[from..from + took as usize]);
                self.unread += took;
                self.rcv_nxt = self.rcv_nxt.wrapping_add(took);
            }
            if fin && self.rcv_nxt == end && !self.got_fin {
                self.got_fin = true;
                self.rcv_nxt = self.rcv_nxt.wrapping_add(1);
            }
        }
        if took > 0 && !self.fin_queued && rng.pct(self.p.reply_pct) {
            self.reply_len += 1 + rng.below(300) as u32;
        }
        let all_in = self.received.len() == self.total_client;
        if (self.got_fin || (self.p.close_first && all_in)) && !self.fin_queued {
            self.fin_queued = true;
        }
        self.send_ack(now);
        self.send_data(now);
    }

    fn tick(&mut self, now: Instant, rng: &mut Rng) {
        match self.state {
            SrvState::SynRcvd => {
                if self.rto_at.is_some_and(|t| t <= now) {
                    self.send_synack(now);
                    self.rto_at = Some(now + Duration::from_secs(1));
                }
                return;
            }
            SrvState::Established => {}
            _ => return,
        }
        if self.rto_at.is_some_and(|t| t <= now) {
            self.rto_at = None;
            self.snd_nxt = self.snd_una;
            self.send_data(now);
            self.rto_at = Some(now + Duration::from_millis(300));
        }
        if self.unread > 0 && rng.pct(self.p.read_pct) {
            self.unread = 0;
            // Window update when the window opened from small to large (like Linux).
            if self.last_adv < self.p.capacity / 2 {
                self.send_ack(now);
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Scenario {
    stream_len: usize,
    chunks: Vec<usize>,
    swaps: Vec<(usize, usize)>,
    dups: Vec<usize>,
    fin_with_data: bool,
    client_ts: bool,
    client_ws: bool,
    server: ServerParams,
    loss_out: u8,
    loss_back: u8,
    dup_pct: u8,
    max_delay_ms: u64,
    seed: u64,
    isn: u32,
    /// Start mid-stream (no SYN captured): the first captured packet starts the session.
    pickup: bool,
    /// Bytes production sends the client (interleaved with the client's chunks).
    prod_len: usize,
    transform: SimTransform,
}

// ---------------------------------------------------------------------------- transforms

/// Replace `delete` client bytes at client offset `at` with `insert`.
#[derive(Clone, Debug)]
struct Edit {
    at: usize,
    delete: usize,
    insert: Vec<u8>,
}

#[derive(Clone, Debug)]
struct RewritePlan {
    /// Sorted, non-overlapping.
    edits: Vec<Edit>,
    pickup_prefix: Vec<u8>,
    fin_trailer: Vec<u8>,
    /// Withhold everything for this long after the session starts.
    hold_ms: Option<u64>,
    read_prod: bool,
}

impl RewritePlan {
    /// What the test server must receive: the plan applied to the whole stream at once.
    fn apply(&self, stream: &[u8], pickup: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if pickup {
            out.extend_from_slice(&self.pickup_prefix);
        }
        let mut cur = 0;
        for e in &self.edits {
            let at = e.at.clamp(cur, stream.len());
            out.extend_from_slice(&stream[cur..at]);
            out.extend_from_slice(&e.insert);
            cur = (at + e.delete).min(stream.len());
        }
        out.extend_from_slice(&stream[cur..]);
        out.extend_from_slice(&self.fin_trailer);
        out
    }
}

#[derive(Clone, Debug)]
enum SimTransform {
    None,
    Identity,
    Rewrite(RewritePlan),
}

fn rewrite_plan() -> impl Strategy<Value = RewritePlan> {
    let edit = (
        prop_oneof![0usize..4, 0usize..6000],
        prop_oneof![Just(0usize), 0usize..50, 0usize..3000],
        proptest::collection::vec(any::<u8>(), 0..400),
    );
    (
        proptest::collection::vec(edit, 0..8),
        proptest::collection::vec(any::<u8>(), 0..300),
        proptest::collection::vec(any::<u8>(), 0..50),
        proptest::option::of(prop_oneof![0u64..20, 0u64..3000]),
        any::<bool>(),
    )
        .prop_map(|(raw, pickup_prefix, fin_trailer, hold_ms, read_prod)| {
            let mut at = 0;
            let edits = raw
                .into_iter()
                .map(|(gap, delete, insert)| {
                    at += gap;
                    let e = Edit { at, delete, insert };
                    at += delete;
                    e
                })
                .collect();
            RewritePlan {
                edits,
                pickup_prefix,
                fin_trailer,
                hold_ms,
                read_prod,
            }
        })
}

fn sim_transform() -> impl Strategy<Value = SimTransform> {
    prop_oneof![
        2 => Just(SimTransform::None),
        1 => Just(SimTransform::Identity),
        4 => rewrite_plan().prop_map(SimTransform::Rewrite),
    ]
}

/// Bytes go to the test server now, or to the hold buffer while it exists.
fn emit(hold: &mut Option<(Instant, Vec<u8>)>, bytes: &[u8], out: &mut TransformOutput<'_>) {
    match hold {
        Some((_, held)) => held.extend_from_slice(bytes),
        None => out.push(bytes),
    }
}

/// `RewritePlan` applied as the bytes arrive, in whatever pieces the engine delivers.
struct StreamingRewrite {
    plan: RewritePlan,
    next_edit: usize,
    pos: usize,
    skip: usize,
    hold: Option<(Instant, Vec<u8>)>,
    prod_seen: Arc<Mutex<Vec<u8>>>,
}

impl StreamTransform for StreamingRewrite {
    fn on_client_data(&mut self, _: Instant, mut data: &[u8], out: &mut TransformOutput<'_>) {
        while !data.is_empty() {
            if self.skip > 0 {
                let k = self.skip.min(data.len());
                self.skip -= k;
                self.pos += k;
                data = &data[k..];
                continue;
            }
            match self.plan.edits.get(self.next_edit) {
                Some(e) if e.at <= self.pos => {
                    emit(&mut self.hold, &e.insert, out);
                    self.skip = e.delete;
                    self.next_edit += 1;
                }
                next => {
                    let until = next.map_or(data.len(), |e| (e.at - self.pos).min(data.len()));
                    emit(&mut self.hold, &data[..until], out);
                    self.pos += until;
                    data = &data[until..];
                }
            }
        }
    }
    fn on_client_fin(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        for e in &self.plan.edits[self.next_edit..] {
            emit(&mut self.hold, &e.insert, out);
        }
        self.next_edit = self.plan.edits.len();
        emit(&mut self.hold, &self.plan.fin_trailer, out);
    }
    fn on_pickup(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        emit(&mut self.hold, &self.plan.pickup_prefix, out);
    }
    fn wants_prod_data(&self) -> bool {
        self.plan.read_prod
    }
    fn on_prod_data(&mut self, _: Instant, data: &[u8], _: &mut TransformOutput<'_>) {
        if let Ok(mut seen) = self.prod_seen.lock() {
            seen.extend_from_slice(data);
        }
    }
    fn pending(&self) -> bool {
        self.hold.is_some()
    }
    fn buffered_len(&self) -> usize {
        self.hold.as_ref().map_or(0, |(_, h)| h.len())
    }
    fn next_deadline(&self) -> Option<Instant> {
        self.hold.as_ref().map(|(at, _)| *at)
    }
    fn on_timeout(&mut self, _: Instant, out: &mut TransformOutput<'_>) {
        if let Some((_, held)) = self.hold.take() {
            out.push(&held);
        }
    }
}

fn sim_factory(t: &SimTransform, prod_seen: Arc<Mutex<Vec<u8>>>) -> Box<dyn TransformFactory> {
    let t = t.clone();
    Box::new(
        move |now: Instant, _: &SessionInfo| -> Option<Box<dyn StreamTransform>> {
            match &t {
                SimTransform::None => None,
                SimTransform::Identity => Some(Box::new(Identity)),
                SimTransform::Rewrite(plan) => Some(Box::new(StreamingRewrite {
                    plan: plan.clone(),
                    next_edit: 0,
                    pos: 0,
                    skip: 0,
                    hold: plan
                        .hold_ms
                        .map(|ms| (now + Duration::from_millis(ms), Vec::new())),
                    prod_seen: prod_seen.clone(),
                })),
            }
        },
    )
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let server = (
        prop_oneof![Just(536u16), Just(1460u16), 100u16..2000],
        prop_oneof![Just(None), (0u8..=8).prop_map(Some)],
        any::<bool>(),
        prop_oneof![500u32..4000, 4000u32..70000],
        5u8..=100,
        0u8..=60,
        any::<bool>(),
    )
        .prop_map(
            |(mss, wscale, timestamps, capacity, read_pct, reply_pct, close_first)| ServerParams {
                mss,
                wscale,
                timestamps,
                capacity,
                read_pct,
                reply_pct,
                close_first,
            },
        );
    let base = (
        prop_oneof![1 => Just(0usize), 3 => 1usize..200, 6 => 200usize..30_000],
        proptest::collection::vec(
            prop_oneof![1usize..100, 100usize..3000, 3000usize..9000],
            1..40,
        ),
        proptest::collection::vec((0usize..64, 1usize..4), 0..12),
        proptest::collection::vec(0usize..64, 0..6),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        server,
        (0u8..=20, 0u8..=20, 0u8..=10, 0u64..40),
        any::<u64>(),
        any::<u32>(),
        prop::bool::weighted(0.25),
    );
    let extra = (prop_oneof![Just(0usize), 1usize..4000], sim_transform());
    (base, extra).prop_map(
        |(
            (
                stream_len,
                chunks,
                swaps,
                dups,
                fin_with_data,
                client_ts,
                client_ws,
                server,
                net,
                seed,
                isn,
                pickup,
            ),
            (prod_len, transform),
        )| {
            Scenario {
                stream_len,
                chunks,
                swaps,
                dups,
                fin_with_data,
                client_ts,
                client_ws,
                server,
                loss_out: net.0,
                loss_back: net.1,
                dup_pct: net.2,
                max_delay_ms: net.3,
                seed: seed | 1,
                isn,
                pickup,
                prod_len,
                transform,
            }
        },
    )
}

/// The captured packets: the client's SYN, production's SYN-ACK, the client's ACK, then the
/// client's stream in chunks with production's ACKs and replies interleaved (all of it
/// reordered and duplicated), FINs.
fn capture_plan(sc: &Scenario, stream: &[u8], prod: &[u8]) -> Vec<Vec<u8>> {
    let isn = sc.isn;
    let pisn = prod_isn(sc);
    let opts = |tsval: u32| TcpOptions {
        timestamps: sc.client_ts.then_some((tsval, 0)),
        ..Default::default()
    };
    let syn_opts = TcpOptions {
        mss: Some(1460),
        window_scale: sc.client_ws.then_some(7),
        sack_permitted: true,
        timestamps: sc.client_ts.then_some((100, 0)),
    };
    // A FIN never starts a session, so a pickup needs its first packet without one.
    let fin_with_data = sc.fin_with_data && !sc.pickup;
    let mut pkts = Vec::new();
    let mut off = 0;
    let mut poff = 0;
    let mut i = 0;
    // Production's next reply chunk, acknowledging `acked` client bytes.
    let prod_chunk = |pkts: &mut Vec<Vec<u8>>, poff: &mut usize, i: usize, acked: u32| {
        let n = sc.chunks[(i * 7 + 3) % sc.chunks.len()].min(prod.len() - *poff);
        pkts.push(packet(
            PROD,
            CLIENT,
            pisn.wrapping_add(1).wrapping_add(*poff as u32),
            acked,
            ACK | PSH,
            &prod[*poff..*poff + n],
            TcpOptions::default(),
        ));
        *poff += n;
    };
    while off < stream.len() {
        let n = sc.chunks[i % sc.chunks.len()].min(stream.len() - off);
        let last = off + n == stream.len();
        let flags = ACK | PSH | if last && fin_with_data { FIN } else { 0 };
        let seq = isn.wrapping_add(1).wrapping_add(off as u32);
        pkts.push(packet(
            CLIENT,
            PROD,
            seq,
            pisn.wrapping_add(1).wrapping_add(poff as u32),
            flags,
            &stream[off..off + n],
            opts(200 + i as u32),
        ));
        off += n;
        i += 1;
        // Production acknowledges what it got (the engine watches this for capture gaps).
        let acked = seq
            .wrapping_add(n as u32)
            .wrapping_add(u32::from(flags & FIN != 0));
        pkts.push(packet(
            PROD,
            CLIENT,
            pisn.wrapping_add(1).wrapping_add(poff as u32),
            acked,
            ACK,
            b"",
            TcpOptions::default(),
        ));
        if poff < prod.len() {
            prod_chunk(&mut pkts, &mut poff, i, acked);
        }
    }
    let client_end = isn
        .wrapping_add(1)
        .wrapping_add(stream.len() as u32)
        .wrapping_add(u32::from(fin_with_data && !stream.is_empty()));
    while poff < prod.len() {
        i += 1;
        prod_chunk(&mut pkts, &mut poff, i, client_end);
    }
    let prod_end = pisn.wrapping_add(1).wrapping_add(prod.len() as u32);
    if !fin_with_data || stream.is_empty() {
        let seq = isn.wrapping_add(1).wrapping_add(stream.len() as u32);
        pkts.push(packet(
            CLIENT,
            PROD,
            seq,
            prod_end,
            ACK | FIN,
            b"",
            opts(200 + i as u32),
        ));
        pkts.push(packet(
            PROD,
            CLIENT,
            prod_end,
            seq.wrapping_add(1),
            ACK | FIN,
            b"",
            TcpOptions::default(),
        ));
    }
    if sc.pickup && stream.is_empty() {
        // Nothing to start from but the client's keepalive-like pure ACK.
        pkts.insert(
            0,
            packet(
                CLIENT,
                PROD,
                isn.wrapping_add(1),
                pisn.wrapping_add(1),
                ACK,
                b"",
                opts(150),
            ),
        );
    }
    // A mid-stream pickup starts at the first packet captured: keep it first so the test
    // server is expected to get the whole stream.
    let fixed = usize::from(sc.pickup);
    let movable = pkts.len() - fixed;
    if movable > 0 {
        for &(a, d) in &sc.swaps {
            let a = fixed + a % movable;
            let b = (a + d).min(pkts.len() - 1);
            pkts.swap(a, b);
        }
        for &d in &sc.dups {
            let a = fixed + d % movable;
            let copy = pkts[a].clone();
            let at = (a + 2).min(pkts.len());
            pkts.insert(at, copy);
        }
    }
    if sc.pickup {
        return pkts;
    }
    let mut all = vec![
        packet(CLIENT, PROD, isn, 0, SYN, b"", syn_opts),
        packet(
            PROD,
            CLIENT,
            pisn,
            isn.wrapping_add(1),
            SYN | ACK,
            b"",
            TcpOptions::default(),
        ),
        packet(
            CLIENT,
            PROD,
            isn.wrapping_add(1),
            pisn.wrapping_add(1),
            ACK,
            b"",
            opts(150),
        ),
    ];
    all.extend(pkts);
    all
}

fn prod_isn(sc: &Scenario) -> u32 {
    sc.isn ^ 0x5a5a_5a5a
}

fn to_feedback(s: &SrvSeg) -> TestFeedback {
    TestFeedback {
        client: CLIENT,
        server: TARGET,
        seq: s.seq,
        ack: s.ack,
        flags: TcpFlags(s.flags),
        window: s.window,
        options: s.options,
        payload_len: s.len,
        payload_prefix: Vec::new(),
    }
}

/// `PROPTEST_CASES` raises the case count for a soak run.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn trace() -> bool {
    std::env::var_os("SIM_TRACE").is_some()
}

fn sim_config() -> EngineConfig {
    let mut c = cfg();
    c.pickup_midstream = true;
    // Heavy simulated loss must slow the session down, not kill it.
    c.max_retransmits = 60;
    c.max_rto = Duration::from_secs(4);
    c.handshake_timeout = Duration::from_secs(600);
    c.close_timeout = Duration::from_secs(1200);
    c.max_session_buffer = 1 << 20;
    c
}

fn run_scenario(sc: &Scenario) -> Result<(), TestCaseError> {
    let stream: Vec<u8> = (0..sc.stream_len)
        .map(|i| (i as u64).wrapping_mul(sc.seed) as u8 ^ (i >> 8) as u8)
        .collect();
    let prod: Vec<u8> = (0..sc.prod_len)
        .map(|i| (i as u64).wrapping_mul(sc.seed >> 7) as u8 ^ 0x5a)
        .collect();
    let expected = match &sc.transform {
        SimTransform::Rewrite(plan) => plan.apply(&stream, sc.pickup),
        SimTransform::None | SimTransform::Identity => stream.clone(),
    };
    if trace() {
        eprintln!("=== run {sc:?}");
    }
    let mut captures = capture_plan(sc, &stream, &prod).into_iter().peekable();
    let mut rng = Rng(sc.seed);
    let prod_seen = Arc::new(Mutex::new(Vec::new()));
    let mut engine =
        Engine::with_transform(sim_config(), sim_factory(&sc.transform, prod_seen.clone()));
    let mut server = Server::new(sc.server.clone(), expected.len());
    let mut to_server: Link<Sent> = Link::new(sc.loss_out, sc.dup_pct, sc.max_delay_ms);
    let mut to_engine: Link<TestFeedback> = Link::new(sc.loss_back, sc.dup_pct, sc.max_delay_ms);
    let mut buf = vec![0u8; engine.transmit_buffer_len()];
    let start = Instant::from_nanos(5_000_000_000);
    let mut now = start;
    let mut next_capture = now;
    let mut completed = false;
    let mut captured_all_before_close = false;
    let mut last_tsval: Option<u32> = None;
    let limit = start + Duration::from_secs(3000);
    while now < limit {
        // Capture: one packet every 0-3 ms.
        while captures.peek().is_some() && next_capture <= now {
            let bytes = captures.next().unwrap_or_default();
            let p = parse_ipv4_tcp(&bytes).expect("test packet");
            engine.on_captured(now, &p);
            next_capture = now + Duration::from_micros(rng.below(3000));
        }
        for fb in to_engine.due(now) {
            engine.on_feedback(now, &fb);
        }
        if engine.next_deadline().is_some_and(|t| t <= now) {
            engine.on_timeout(now);
        }
        while let Some(n) = engine.poll_transmit(now, &mut buf) {
            let p = parse_sent(&buf[..n]);
            prop_assert!(
                p.flags & RST == 0,
                "engine reset the session: {:?}",
                engine.stats()
            );
            if let Some((v, _)) = p.options.timestamps {
                // PAWS at the test server drops segments whose TSval went backwards.
                prop_assert!(
                    last_tsval.is_none_or(|l| seq::ge(v, l)),
                    "TSval went backwards"
                );
                last_tsval = Some(v);
            }
            if trace() {
                eprintln!(
                    "{:>8}ms E> seq={} ack={} fl={:02x} win={} len={}",
                    (now - start).as_millis(),
                    p.seq,
                    p.ack,
                    p.flags,
                    p.window,
                    p.payload.len()
                );
            }
            to_server.send(now, &mut rng, p);
        }
        while let Some(ev) = engine.poll_event() {
            if let EngineEvent::SessionClosed { reason, .. } = ev {
                prop_assert_eq!(reason, CloseReason::Completed, "{:?}", engine.stats());
                completed = true;
                captured_all_before_close = captures.peek().is_none();
            }
        }
        for p in to_server.due(now) {
            server.on_packet(now, &p, &mut rng);
        }
        server.tick(now, &mut rng);
        for s in std::mem::take(&mut server.out) {
            if trace() {
                eprintln!(
                    "{:>8}ms <S seq={} ack={} fl={:02x} win={} len={}",
                    (now - start).as_millis(),
                    s.seq,
                    s.ack,
                    s.flags,
                    s.window,
                    s.len
                );
            }
            to_engine.send(now, &mut rng, to_feedback(&s));
        }
        prop_assert!(server.state != SrvState::Reset);
        prop_assert!(
            expected.starts_with(&server.received),
            "server got bytes out of order"
        );
        if completed && server.done() {
            break;
        }
        // Next step: the earliest pending thing, but never more than a random 0-50 ms, so the
        // server's application reads and timers interleave arbitrarily.
        let cap = now + Duration::from_micros(rng.below(50_000) + 1);
        let mut next = cap;
        for t in [
            captures.peek().map(|_| next_capture),
            to_engine.next_time(),
            to_server.next_time(),
            engine.next_deadline(),
            server.rto_at,
        ]
        .into_iter()
        .flatten()
        {
            next = next.min(t.max(now));
        }
        now = if next == now {
            now + Duration::from_micros(1)
        } else {
            next
        };
    }
    if std::env::var_os("SIM_SUMMARY").is_some() {
        let st = engine.stats();
        eprintln!(
            "len={} t={}ms loss={}/{} rto={} fast={} probes={} resent={} fb_ooo={} held={} dup={}",
            stream.len(),
            (now - start).as_millis(),
            sc.loss_out,
            sc.loss_back,
            st.retransmit_timeouts,
            st.fast_retransmits,
            st.zero_window_probes,
            st.segments_resent,
            st.feedback_out_of_order,
            st.client_segments_held,
            st.client_bytes_duplicate
        );
    }
    prop_assert!(completed, "session never completed: {:?}", engine.stats());
    prop_assert!(server.done(), "server not done");
    prop_assert_eq!(server.received.len(), expected.len());
    prop_assert!(
        server.received == expected,
        "server received different bytes"
    );
    let st = engine.stats();
    prop_assert_eq!(st.closed(CloseReason::Completed), 1);
    prop_assert_eq!(st.sessions_picked_up, u64::from(sc.pickup));
    prop_assert_eq!(st.closed_total(), 1);
    prop_assert_eq!(st.sessions_active, 0);
    prop_assert_eq!(st.bytes_queued, expected.len() as u64);
    prop_assert_eq!(st.client_bytes_reassembled, stream.len() as u64);
    let reads_prod = matches!(&sc.transform, SimTransform::Rewrite(p) if p.read_prod);
    let seen = prod_seen.lock().map(|v| v.clone()).unwrap_or_default();
    if reads_prod {
        // A picked-up session reads from the first reply captured (they may be reordered);
        // one that saw the SYN-ACK reads from the start. Replies captured after the session
        // completed are not read at all.
        if sc.pickup {
            prop_assert!(
                seen.is_empty() || prod.windows(seen.len()).any(|w| w == seen),
                "production's replies out of order"
            );
        } else {
            prop_assert!(prod.starts_with(&seen), "production's replies out of order");
            if captured_all_before_close {
                prop_assert_eq!(seen.len(), prod.len());
            }
        }
        prop_assert_eq!(st.prod_bytes_reassembled, seen.len() as u64);
    } else {
        prop_assert!(seen.is_empty());
        prop_assert_eq!(st.prod_bytes_reassembled, 0);
    }
    prop_assert_eq!(st.rsts_sent, 0);
    // After the linger, nothing remains.
    engine.on_timeout(now + Duration::from_secs(60));
    prop_assert_eq!(engine.stats().sessions_lingering, 0);
    prop_assert!(engine.next_deadline().is_none());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(256)))]

    #[test]
    fn test_server_receives_exactly_the_client_stream(sc in scenario()) {
        run_scenario(&sc)?;
    }
}

// ---------------------------------------------------------------------------- fuzz

#[derive(Clone, Debug)]
enum Op {
    Capture {
        to_prod: bool,
        client: u8,
        seq: u32,
        ack: u32,
        flags: u8,
        len: usize,
        opts: TcpOptions,
    },
    Feedback {
        client: u8,
        seq: u32,
        ack: u32,
        flags: u8,
        window: u16,
        len: u32,
        opts: TcpOptions,
    },
    Advance(u64),
    Shutdown,
}

const BASE_C: u32 = 0xffff_fff0;
const BASE_T: u32 = 1000;

fn near(base: u32) -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => (0u32..6000).prop_map(move |d| base.wrapping_add(d)),
        1 => any::<u32>(),
    ]
}

fn opts() -> impl Strategy<Value = TcpOptions> {
    (
        proptest::option::of(any::<u16>()),
        proptest::option::of(any::<u8>()),
        any::<bool>(),
        proptest::option::of((any::<u32>(), any::<u32>())),
    )
        .prop_map(
            |(mss, window_scale, sack_permitted, timestamps)| TcpOptions {
                mss,
                window_scale,
                sack_permitted,
                timestamps,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    let flags = prop_oneof![
        Just(SYN),
        Just(ACK),
        Just(ACK | PSH),
        Just(ACK | FIN),
        Just(SYN | ACK),
        Just(RST),
        any::<u8>()
    ];
    prop_oneof![
        4 => (any::<bool>(), 0u8..3, near(BASE_C), near(BASE_T), flags.clone(),
              prop_oneof![Just(0usize), 1usize..3000], opts())
            .prop_map(|(to_prod, client, seq, ack, flags, len, opts)| Op::Capture {
                to_prod, client, seq, ack, flags, len, opts
            }),
        4 => (0u8..3, near(BASE_T), near(BASE_C), flags, any::<u16>(),
              prop_oneof![Just(0u32), 1u32..3000, any::<u32>()], opts())
            .prop_map(|(client, seq, ack, flags, window, len, opts)| Op::Feedback {
                client, seq, ack, flags, window, len, opts
            }),
        2 => prop_oneof![0u64..50, 50u64..5000, 5000u64..200_000].prop_map(Op::Advance),
        1 => Just(Op::Shutdown),
    ]
}

/// A transform that does anything at any call: passes, withholds, releases, drops, injects,
/// flips `pending`, sets deadlines (some left in the past), abandons, bumps any counter id.
struct Chaos {
    rng: Rng,
    held: Vec<u8>,
    pending: bool,
    deadline: Option<Instant>,
    wants_prod: bool,
}

impl Chaos {
    fn act(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        const JUNK: [u8; 700] = [0x5a; 700];
        match self.rng.below(12) {
            0..=3 => out.push(data),
            4 => self.held.extend_from_slice(data),
            5 => {
                out.push(&std::mem::take(&mut self.held));
                out.push(data);
            }
            6 => {}
            7 => out.push(&JUNK[..self.rng.below(700) as usize]),
            8 => self.pending = !self.pending,
            9 => {
                self.deadline = Some(now + Duration::from_millis(self.rng.below(3000)));
            }
            10 => out.count(self.rng.below(80) as usize),
            _ => {
                if self.rng.pct(20) {
                    out.abandon("chaos");
                }
            }
        }
    }
}

impl StreamTransform for Chaos {
    fn on_client_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        self.act(now, data, out);
    }
    fn on_client_fin(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        self.act(now, b"", out);
    }
    fn on_pickup(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        self.act(now, b"pickup", out);
    }
    fn wants_prod_data(&self) -> bool {
        self.wants_prod
    }
    fn on_prod_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        self.act(now, data, out);
    }
    fn on_test_event(&mut self, now: Instant, ev: &TestEvent<'_>, out: &mut TransformOutput<'_>) {
        let payload = ev.segment().and_then(|s| s.in_order_payload());
        self.act(now, payload.unwrap_or_default(), out);
    }
    fn pending(&self) -> bool {
        self.pending
    }
    fn buffered_len(&self) -> usize {
        self.held.len()
    }
    fn next_deadline(&self) -> Option<Instant> {
        self.deadline
    }
    fn on_timeout(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.rng.pct(70) {
            self.deadline = None;
        }
        self.act(now, b"timer", out);
    }
}

fn chaos_factory(seed: u64) -> Box<dyn TransformFactory> {
    let mut rng = Rng(seed | 1);
    Box::new(
        move |_: Instant, _: &SessionInfo| -> Option<Box<dyn StreamTransform>> {
            if rng.pct(20) {
                return None;
            }
            Some(Box::new(Chaos {
                rng: Rng(rng.next() | 1),
                held: Vec::new(),
                pending: rng.pct(30),
                deadline: None,
                wants_prod: rng.pct(50),
            }))
        },
    )
}

fn fuzz_client(i: u8) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(198, 18, 0, 10 + i % 2),
        40000 + u16::from(i / 2),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(512)))]

    #[test]
    fn engine_never_panics_and_stays_bounded(ops in proptest::collection::vec(op(), 1..120),
                                             pool in any::<bool>(), pickup in any::<bool>(),
                                             chaos in proptest::option::of(any::<u64>())) {
        let mut c = cfg();
        c.max_sessions = 2;
        c.max_session_buffer = 5000;
        c.pickup_midstream = pickup;
        c.mss = 700;
        c.close_timeout = Duration::from_secs(5);
        c.idle_timeout = Duration::from_secs(60);
        if pool {
            c.client_ip_pool = Some((Ipv4Addr::new(198, 19, 0, 0), 31));
        }
        let mut e = match chaos {
            Some(seed) => Engine::with_transform(c, chaos_factory(seed)),
            None => Engine::new(c),
        };
        let mut now = Instant::from_nanos(1);
        let mut buf = vec![0u8; e.transmit_buffer_len()];
        let payload = vec![0xabu8; 3000];
        let mut mirrored = std::collections::HashSet::new();
        for op in ops {
            match op {
                Op::Capture { to_prod, client, seq, ack, flags, len, opts } => {
                    let c = fuzz_client(client);
                    let (src, dst) = if to_prod { (c, PROD) } else { (PROD, c) };
                    let b = packet(src, dst, seq, ack, flags, &payload[..len], opts);
                    let p = parse_ipv4_tcp(&b).unwrap();
                    e.on_captured(now, &p);
                }
                Op::Feedback { client, seq, ack, flags, window, len, opts } => {
                    let target_client = mirrored
                        .iter()
                        .nth(usize::from(client))
                        .copied()
                        .unwrap_or_else(|| fuzz_client(client));
                    let fb = TestFeedback {
                        client: target_client,
                        server: TARGET,
                        seq, ack, flags: TcpFlags(flags), window, options: opts,
                        payload_len: len, payload_prefix: Vec::new(),
                    };
                    e.on_feedback(now, &fb);
                }
                Op::Advance(ms) => {
                    now = now + Duration::from_millis(ms);
                    e.on_timeout(now);
                }
                Op::Shutdown => e.shutdown(now),
            }
            let mut sent = 0;
            while let Some(n) = e.poll_transmit(now, &mut buf) {
                let p = parse_sent(&buf[..n]);
                prop_assert_eq!(p.dst, TARGET);
                prop_assert!(p.payload.len() <= 700);
                sent += 1;
                prop_assert!(sent < 10_000, "poll_transmit does not terminate");
            }
            while let Some(ev) = e.poll_event() {
                match ev {
                    EngineEvent::SessionOpened { mirrored: m, .. } => {
                        prop_assert!(mirrored.insert(m), "mirrored address reused while owned");
                    }
                    EngineEvent::SessionReleased { mirrored: m } => {
                        prop_assert!(mirrored.remove(&m));
                    }
                    EngineEvent::SessionClosed { .. } => {}
                }
            }
            let st = e.stats();
            prop_assert!(st.sessions_active <= 2);
            prop_assert!(
                e.queued_bytes() as u64 <= 5000 * st.sessions_active,
                "a session holds more than max_session_buffer"
            );
            prop_assert_eq!(
                st.sessions_opened + st.sessions_picked_up,
                st.sessions_active + st.closed_total()
            );
            prop_assert_eq!(mirrored.len() as u64, st.sessions_active + st.sessions_lingering);
            if st.sessions_active + st.sessions_lingering > 0 {
                prop_assert!(e.next_deadline().is_some(), "a session without a timer");
            }
        }
    }
}
