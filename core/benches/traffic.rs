//! Scripted production traffic for the session engine, with a fake clock and no I/O: many
//! concurrent sysbench-like sessions (a small request, a result set of a few hundred bytes,
//! the client's ACK of it, the test server's reply relayed by intercept), so the engine's
//! per-packet path can be measured (`benches/engine.rs`) and checked for allocations
//! (`tests/engine_allocs.rs`).
//!
//! What a round of one session feeds the engine (the *input packets* the benchmarks count):
//! the client's request and production's reply as captured, the client's pure ACK of that
//! reply, and the test server's reply as one `TestFeedback`; with the MySQL layer also the
//! reply's MySQL packet summaries, as intercept relays them (events, not counted as
//! packets). The engine sends two packets per round: the request and a pure ACK.
//!
//! This file must never do I/O or read a clock: the figures must not depend on the machine's
//! network, only on the engine's code.

use common::seq::SeqNumber;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use common::clock::Instant;
use common::control::{MysqlEvent, MysqlPacket, TestFeedback};
use common::wire::{TcpFlags, TcpOptions, TcpPacket};
use tcpshadow_core::credentials::Credentials;
use tcpshadow_core::engine::{Engine, EngineConfig, EngineEvent, TestEvent};
use tcpshadow_core::mysql::{MysqlConfig, MysqlFactory};

const PROD: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PROD_PORT: u16 = 3306;
const TARGET: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306);

/// MariaDB 10.11's greeting to sysbench (from common/src/mysql/fixtures.rs).
const GREETING: &str = concat!(
    "0a352e352e352d31302e31312e31392d4d6172696144422d302b64656231327531000a0000006079615a21337c3a00fe",
    "f7080200ff81150000000000001d000000483d373c656a653c3c557779006d7973716c5f6e61746976655f7061737377",
    "6f726400",
);
/// sysbench's HandshakeResponse41 (MariaDB Connector/C 3.3.20), payload only.
const LOGIN: &str = concat!(
    "8ca2bf00000010002d000000000000000000000000000000000000001d00000073620014115c1b28b2b7a64e",
    "e157e2a8a7a733a3fc1eade7736274657374006d7973716c5f6e61746976655f70617373776f7264006b035f6f73054c",
    "696e75780c5f636c69656e745f6e616d650a6c69626d617269616462045f70696404343534360f5f636c69656e745f76",
    "657273696f6e06332e332e3230095f706c6174666f726d067838365f36340c5f7365727665725f686f7374093132372e",
    "302e302e31",
);
const OK: &[u8] = &[0, 0, 0, 2, 0, 0, 0];
/// What a sysbench connection prepares (oltp_common.lua, one table), cycled through by
/// [`Traffic::churn`]'s prepares: sysbench prepares 22 statements a connection.
const PREPARED: &[&str] = &[
    "SELECT c FROM sbtest1 WHERE id=?",
    "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ?",
    "SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN ? AND ?",
    "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ? ORDER BY c",
    "SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN ? AND ? ORDER BY c",
    "UPDATE sbtest1 SET k=k+1 WHERE id=?",
    "UPDATE sbtest1 SET c=? WHERE id=?",
    "DELETE FROM sbtest1 WHERE id=?",
    "INSERT INTO sbtest1 (id, k, c, pad) VALUES (?, ?, ?, ?)",
    "BEGIN",
    "COMMIT",
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn framed(seq: u8, payload: &[u8], out: &mut Vec<u8>) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_le_bytes()[..3]);
    out.push(seq);
    out.extend_from_slice(payload);
}

fn lenenc_str(s: &[u8], out: &mut Vec<u8>) {
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

/// A text-protocol result set of one VARCHAR column and `rows` rows of `width` bytes each
/// (sysbench's point select returns one row of 120 bytes): its MySQL packets, payloads only.
fn result_set(rows: usize, width: usize) -> Vec<Vec<u8>> {
    let mut col = Vec::new();
    for s in [&b"def"[..], b"sbtest", b"sbtest1", b"sbtest1", b"c", b"c"] {
        lenenc_str(s, &mut col);
    }
    col.extend_from_slice(&[
        0x0c, 0x21, 0x00, 0xe0, 0x01, 0, 0, 0xfe, 0x01, 0x10, 0, 0, 0,
    ]);
    let eof = vec![0xfe, 0, 0, 0x02, 0];
    let mut packets = vec![vec![1u8], col, eof.clone()];
    for r in 0..rows {
        let mut row = Vec::new();
        let value: Vec<u8> = (0..width).map(|i| b'0' + ((i + r) % 10) as u8).collect();
        lenenc_str(&value, &mut row);
        packets.push(row);
    }
    packets.push(eof);
    packets
}

/// The binary-protocol result set of a `COM_STMT_EXECUTE` of sysbench's point select: one
/// VARCHAR column and one row of `width` bytes, its MySQL packets, payloads only.
fn binary_result_set(width: usize) -> Vec<Vec<u8>> {
    let mut packets = result_set(1, width);
    let mut row = vec![0x00, 0x00];
    let value: Vec<u8> = (0..width).map(|i| b'0' + (i % 10) as u8).collect();
    lenenc_str(&value, &mut row);
    packets[3] = row;
    packets
}

/// A server's answer to a prepare: PREPARE_OK, the parameters' definitions and the columns',
/// each followed by an EOF (sysbench's login does not ask for CLIENT_DEPRECATE_EOF).
fn prepare_ok(id: u32, columns: u16, params: u16) -> Vec<Vec<u8>> {
    let mut ok = vec![0];
    ok.extend_from_slice(&id.to_le_bytes());
    ok.extend_from_slice(&columns.to_le_bytes());
    ok.extend_from_slice(&params.to_le_bytes());
    ok.extend_from_slice(&[0, 0, 0]);
    let definition = |name: &[u8]| {
        let mut d = Vec::new();
        for s in [&b"def"[..], b"", b"", b"", name, b""] {
            lenenc_str(s, &mut d);
        }
        d.extend_from_slice(&[0x0c, 0x3f, 0x00, 0, 0, 0, 0, 0xfd, 0x80, 0x00, 0, 0, 0]);
        d
    };
    let eof = vec![0xfe, 0, 0, 0x02, 0];
    let mut packets = vec![ok];
    for (n, name) in [(params, &b"?"[..]), (columns, b"c")] {
        if n > 0 {
            packets.extend((0..n).map(|_| definition(name)));
            packets.push(eof.clone());
        }
    }
    packets
}

/// Intercept's summaries of a reply's packets `packets` (payloads, sequence ids from 1), each
/// with at most `head` bytes of its start; their client and place in the stream are left for
/// [`Traffic::stamp`].
fn summaries(packets: &[Vec<u8>], head: usize) -> Vec<MysqlEvent> {
    packets
        .iter()
        .enumerate()
        .map(|(i, p)| MysqlEvent::Packet {
            client: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            packet: MysqlPacket {
                stream_offset: 0,
                tcp_seq: 0,
                seq_id: i as u8 + 1,
                len: p.len() as u32,
                head: p[..p.len().min(head)].into(),
                hash: None,
                framed_at_us: 0,
            },
        })
        .collect()
}

/// Which engine the traffic drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// `--protocol tcp`: bytes mirrored as they are.
    Tcp,
    /// `--protocol mysql` with logins forwarded unchanged (no credentials): the MySQL
    /// transform frames both directions and tracks every reply.
    Mysql,
    /// `--protocol mysql` with `--mysql-credentials`: every login is recomputed for the test
    /// server's nonce (what the lab's idle-session benchmark does; `examples/idle_memory.rs`).
    #[allow(dead_code)] // the engine benchmark does not use it
    MysqlCredentials,
}

struct Flow {
    client: SocketAddrV4,
    /// Next client sequence number (client -> prod and our stream toward test: the same).
    c_seq: u32,
    /// Next production sequence number (prod -> client).
    p_seq: u32,
    /// Next test-server sequence number.
    t_seq: u32,
    /// Client TSval, advancing.
    ts: u32,
    /// Intercept's stream offset of the next MySQL packet of the test server.
    t_offset: u64,
    /// How many statements this connection prepared ([`Traffic::churn`]): production's
    /// ids `100..100 + prepared`.
    prepared: usize,
}

/// How relayed MySQL summaries are handed to the engine: the copier's driver before
/// f57eeef (`OneByOne`), before f9f67f2 (`Reply`: a run where consecutive summaries share a
/// session), and since (`Session`: a relayed frame's summaries of one session as one run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relay {
    OneByOne,
    Reply,
    Session,
}

/// See the module documentation.
pub struct Traffic {
    pub engine: Engine,
    layer: Layer,
    flows: Vec<Flow>,
    now: Instant,
    buf: Vec<u8>,
    /// The request every round sends (a framed COM_QUERY), and the reply (framed).
    request: Vec<u8>,
    reply: Vec<u8>,
    /// One reusable feedback and one reusable MySQL event per reply packet: no allocation per
    /// round on the script's side (their `head`s are allocated once, here).
    feedback: TestFeedback,
    events: Vec<MysqlEvent>,
    pub packets_in: u64,
    pub packets_out: u64,
    pub bytes_out: u64,
    /// FNV-1a of every byte sent, in order, once set to `Some` (tests: two runs sent the
    /// same if these match; off in the benchmark, whose instructions it would add to).
    pub sent_hash: Option<u64>,
    /// How relayed MySQL summaries reach the engine (the copier's driver: [`Relay::Session`]).
    pub relay: Relay,
    /// [`Traffic::block`]'s summaries of a session's replies, `k` replies' worth: built once.
    block_events: Vec<MysqlEvent>,
    /// Why the first session that closed while opening did.
    closed: Option<String>,
    /// Connections opened so far: a reopened slot's client address comes from it, so that no
    /// connection reuses a lingering one's.
    pub connections: u64,
    /// [`Traffic::churn`]'s bytes and summaries, built once.
    lifecycle: Option<Lifecycle>,
    /// The greeting's payload, the framed login and production's framed OK to it: decoded
    /// once, not at every login.
    greeting: Vec<u8>,
    login: Vec<u8>,
    login_ok: Vec<u8>,
}

/// What [`Traffic::churn`] sends, built once so that the script adds few instructions of its
/// own to the engine's (the prepare `k` of every connection is [`PREPARED`]`[k % len]`).
struct Lifecycle {
    /// Framed `COM_STMT_PREPARE` `k`.
    requests: Vec<Vec<u8>>,
    /// Production's framed answer to prepare `k` (statement id `100 + k`).
    prod_replies: Vec<Vec<u8>>,
    /// The test server's answer to prepare `k` (statement id `1 + k`) as intercept
    /// summarises it, and its length on the wire.
    test_replies: Vec<(Vec<MysqlEvent>, u32)>,
    /// Framed `COM_STMT_CLOSE` of production's statement `100 + k`.
    closes: Vec<Vec<u8>>,
    quit: Vec<u8>,
}

impl Lifecycle {
    fn new(prepares: usize) -> Self {
        let mut l = Lifecycle {
            requests: Vec::new(),
            prod_replies: Vec::new(),
            test_replies: Vec::new(),
            closes: Vec::new(),
            quit: Vec::new(),
        };
        framed(0, &[0x01], &mut l.quit);
        for k in 0..prepares {
            let sql = PREPARED[k % PREPARED.len()];
            let mut request = Vec::new();
            framed(0, &[&[0x16][..], sql.as_bytes()].concat(), &mut request);
            l.requests.push(request);
            let params = sql.bytes().filter(|&b| b == b'?').count() as u16;
            let columns = u16::from(sql.starts_with("SELECT"));
            let mut prod = Vec::new();
            for (seq, p) in prepare_ok(100 + k as u32, columns, params)
                .iter()
                .enumerate()
            {
                framed(seq as u8 + 1, p, &mut prod);
            }
            l.prod_replies.push(prod);
            let test = prepare_ok(1 + k as u32, columns, params);
            let len: usize = test.iter().map(|p| 4 + p.len()).sum();
            let events = summaries(&test, common::control::MAX_MYSQL_HEAD);
            l.test_replies.push((events, len as u32));
            let mut close = Vec::new();
            let id = 100 + k as u32;
            framed(0, &[&[0x19][..], &id.to_le_bytes()].concat(), &mut close);
            l.closes.push(close);
        }
        l
    }
}

fn pkt<'a>(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    seq: u32,
    ack: u32,
    flags: u8,
    ts: Option<(u32, u32)>,
    payload: &'a [u8],
) -> TcpPacket<'a> {
    TcpPacket {
        src: *src.ip(),
        dst: *dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
        seq: SeqNumber(seq),
        ack: SeqNumber(ack),
        flags: TcpFlags(flags),
        window: 502,
        options: TcpOptions {
            timestamps: ts,
            ..TcpOptions::default()
        },
        ip_id: 0,
        ttl: 64,
        payload,
        payload_len: payload.len() as u32,
    }
}

const A: u8 = TcpFlags::ACK;
const PA: u8 = TcpFlags::ACK | TcpFlags::PSH;

impl Traffic {
    /// `sessions` connections, opened and logged in (MySQL), ready for [`Traffic::round`].
    pub fn new(layer: Layer, sessions: usize) -> Self {
        Self::with_limit(layer, sessions, sessions)
    }

    /// As [`Traffic::new`], with the engine's tables sized for `max_sessions` (the copier's
    /// `--max-sessions`) rather than for exactly `sessions`.
    pub fn with_limit(layer: Layer, sessions: usize, max_sessions: usize) -> Self {
        let mut cfg = EngineConfig::new(PROD_PORT, TARGET);
        cfg.max_sessions = max_sessions.max(sessions).max(1);
        let engine = match layer {
            Layer::Tcp => Engine::new(cfg),
            Layer::Mysql | Layer::MysqlCredentials => {
                let with_credentials = layer == Layer::MysqlCredentials;
                let config = MysqlConfig {
                    forward_without_credentials: !with_credentials,
                    report: Some(tcpshadow_core::mysql::ReportHooks::default()),
                    ..MysqlConfig::default()
                };
                let credentials = if with_credentials {
                    Credentials::parse("sb:test-password").expect("credentials")
                } else {
                    Credentials::default()
                };
                let random: tcpshadow_core::mysql::RandomBytes = Arc::new(|b: &mut [u8]| {
                    b.fill(7);
                    true
                });
                let factory = MysqlFactory::new(config, Arc::new(credentials), random);
                Engine::with_transform(cfg, Box::new(factory))
            }
        };
        let mut request = Vec::new();
        let mut query = vec![0x03];
        query.extend_from_slice(b"SELECT c FROM sbtest1 WHERE id=50321");
        framed(0, &query, &mut request);
        let reply_packets = result_set(1, 120);
        let mut reply = Vec::new();
        for (i, p) in reply_packets.iter().enumerate() {
            framed(i as u8 + 1, p, &mut reply);
        }
        let events = summaries(&reply_packets, 16);
        let buf = vec![0u8; engine.transmit_buffer_len()];
        let mut t = Traffic {
            engine,
            layer,
            flows: Vec::with_capacity(max_sessions.max(sessions)),
            now: Instant::from_nanos(1_000_000_000),
            buf,
            request,
            reply,
            feedback: TestFeedback {
                client: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
                server: TARGET,
                seq: 0,
                ack: 0,
                flags: TcpFlags(A),
                window: 509,
                options: TcpOptions::default(),
                payload_len: 0,
                payload_prefix: Vec::new(),
            },
            events,
            packets_in: 0,
            packets_out: 0,
            bytes_out: 0,
            sent_hash: None,
            relay: Relay::Session,
            block_events: Vec::new(),
            closed: None,
            connections: 0,
            lifecycle: None,
            greeting: hex(GREETING),
            login: Vec::new(),
            login_ok: Vec::new(),
        };
        framed(1, &hex(LOGIN), &mut t.login);
        framed(2, OK, &mut t.login_ok);
        t.open_sessions(sessions);
        t
    }

    /// Opens `n` more sessions (see [`Traffic::new`]).
    pub fn open_sessions(&mut self, n: usize) {
        for _ in 0..n {
            self.open(self.flows.len());
        }
        self.drain();
        while let Some(ev) = self.engine.poll_event() {
            if let EngineEvent::SessionClosed { why, reason, .. } = ev {
                self.closed.get_or_insert(format!("{reason:?} ({why:?})"));
            }
        }
    }

    /// Nothing happens for `d`: the clock moves on and the engine's timers run (an idle
    /// session gives back what it keeps only while busy).
    #[allow(dead_code)] // the engine benchmark does not use it
    pub fn wait(&mut self, d: Duration) {
        self.now = self.now + d;
        self.engine.on_timeout(self.now);
        self.drain();
    }

    /// Input packets per [`Traffic::round`] of one session.
    pub const PACKETS_PER_ROUND: u64 = 4;

    fn prod_addr() -> SocketAddrV4 {
        SocketAddrV4::new(PROD, PROD_PORT)
    }

    fn drain(&mut self) {
        while self.engine.poll_observation().is_some() {}
        while let Some(n) = self.engine.poll_transmit(self.now, &mut self.buf) {
            self.packets_out += 1;
            self.bytes_out += n as u64;
            if let Some(h) = &mut self.sent_hash {
                for &b in &self.buf[..n] {
                    *h = (*h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
                }
            }
        }
    }

    fn capture(&mut self, p: &TcpPacket<'_>) {
        self.packets_in += 1;
        self.engine.on_captured(self.now, p);
    }

    fn test_feedback(&mut self, i: usize, ack: u32, len: u32, flags: u8) {
        let f = &self.flows[i];
        let fb = &mut self.feedback;
        fb.client = f.client;
        fb.seq = f.t_seq;
        fb.ack = ack;
        fb.flags = TcpFlags(flags);
        fb.payload_len = len;
        fb.options.timestamps = Some((f.ts, f.ts));
        self.packets_in += 1;
        self.engine.on_feedback(self.now, &self.feedback);
        self.flows[i].t_seq = f.t_seq.wrapping_add(len);
    }

    /// Intercept's summaries of the test server's packets `packets` (payloads), as relayed.
    fn test_mysql(&mut self, i: usize, packets: &[&[u8]], first_seq_id: u8) {
        let client = self.flows[i].client;
        for (k, &p) in packets.iter().enumerate() {
            let offset = self.flows[i].t_offset;
            let ev = MysqlEvent::Packet {
                client,
                packet: MysqlPacket {
                    stream_offset: offset,
                    tcp_seq: offset as u32,
                    seq_id: first_seq_id + k as u8,
                    len: p.len() as u32,
                    head: p[..p.len().min(common::control::MAX_MYSQL_HEAD)].into(),
                    hash: None,
                    framed_at_us: 0,
                },
            };
            self.flows[i].t_offset += 4 + p.len() as u64;
            self.engine
                .on_test_event(self.now, client, &TestEvent::Mysql(&ev));
        }
    }

    /// Opens session `i`: both handshakes, and for MySQL the greeting and the login.
    fn open(&mut self, i: usize) {
        // The first connection of slot `i` keeps the address it always had (the figures of
        // the other shapes do not move); later ones take one of 198.19.0.0/16's.
        let n = self.connections;
        self.connections += 1;
        let client = if i == self.flows.len() {
            SocketAddrV4::new(
                Ipv4Addr::new(198, 18, 1 + (i >> 14) as u8, 10),
                10_000 + (i & 0x3fff) as u16,
            )
        } else {
            SocketAddrV4::new(
                Ipv4Addr::new(198, 19, (n >> 8) as u8, n as u8),
                10_000 + (n >> 16) as u16,
            )
        };
        let isn = 0x1000_0000u32.wrapping_mul(n as u32 + 1);
        let flow = Flow {
            client,
            c_seq: isn.wrapping_add(1),
            p_seq: 0x5000_0001u32.wrapping_add(n as u32 * 7919),
            t_seq: 0x7000_0001u32.wrapping_add(n as u32 * 104_729),
            ts: 1000,
            t_offset: 0,
            prepared: 0,
        };
        if i == self.flows.len() {
            self.flows.push(flow);
        } else {
            self.flows[i] = flow;
        }
        let prod = Self::prod_addr();
        let mut syn = pkt(client, prod, isn, 0, TcpFlags::SYN, Some((1000, 0)), &[]);
        syn.options.mss = Some(1460);
        syn.options.window_scale = Some(7);
        self.capture(&syn);
        self.drain();
        let f = &self.flows[i];
        let (p_seq, t_seq) = (f.p_seq, f.t_seq);
        self.feedback.options = TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: false,
            timestamps: Some((500, 1000)),
        };
        self.flows[i].t_seq = t_seq.wrapping_sub(1);
        self.test_feedback(i, isn.wrapping_add(1), 0, TcpFlags::SYN | A);
        self.flows[i].t_seq = t_seq;
        self.feedback.options = TcpOptions::default();
        let synack = pkt(
            prod,
            client,
            p_seq.wrapping_sub(1),
            isn.wrapping_add(1),
            TcpFlags::SYN | A,
            Some((500, 1000)),
            &[],
        );
        self.capture(&synack);
        let ack = pkt(
            client,
            prod,
            isn.wrapping_add(1),
            p_seq,
            A,
            Some((1001, 500)),
            &[],
        );
        self.capture(&ack);
        self.drain();
        if self.layer != Layer::Tcp {
            self.login(i);
        }
    }

    fn login(&mut self, i: usize) {
        let prod = Self::prod_addr();
        let client = self.flows[i].client;
        let greeting = std::mem::take(&mut self.greeting);
        let mut bytes = Vec::with_capacity(4 + greeting.len());
        framed(0, &greeting, &mut bytes);
        let (p_seq, c_seq) = (self.flows[i].p_seq, self.flows[i].c_seq);
        let g = pkt(prod, client, p_seq, c_seq, PA, Some((501, 1001)), &bytes);
        self.capture(&g);
        self.flows[i].p_seq = p_seq.wrapping_add(bytes.len() as u32);
        let c_seq = self.flows[i].c_seq;
        self.test_feedback(i, c_seq, bytes.len() as u32, PA);
        self.test_mysql(i, &[&greeting], 0);
        self.greeting = greeting;
        self.drain();
        let login = std::mem::take(&mut self.login);
        let (p_seq, c_seq) = (self.flows[i].p_seq, self.flows[i].c_seq);
        let l = pkt(client, prod, c_seq, p_seq, PA, Some((1002, 501)), &login);
        self.capture(&l);
        self.flows[i].c_seq = c_seq.wrapping_add(login.len() as u32);
        self.login = login;
        self.drain();
        let ok = std::mem::take(&mut self.login_ok);
        let (p_seq, c_seq) = (self.flows[i].p_seq, self.flows[i].c_seq);
        let o = pkt(prod, client, p_seq, c_seq, PA, Some((502, 1002)), &ok);
        self.capture(&o);
        self.flows[i].p_seq = p_seq.wrapping_add(ok.len() as u32);
        self.login_ok = ok;
        let c_seq = self.flows[i].c_seq;
        self.test_feedback(i, c_seq, OK.len() as u32 + 4, PA);
        self.test_mysql(i, &[OK], 2);
        self.drain();
    }

    /// From now on every round executes a prepared statement, as sysbench's lab load does:
    /// each session prepares [`PREPARED`]`[0]` (answered by both servers, production's id 100,
    /// the test server's 1), and its rounds are `COM_STMT_EXECUTE`s of it answered by a
    /// binary result set of one 120-byte row.
    pub fn prepared(&mut self) {
        let mut l = Lifecycle::new(1);
        for i in 0..self.flows.len() {
            if self.flows[i].prepared == 0 {
                self.prepare(i, 0, &mut l);
            }
        }
        // COM_STMT_EXECUTE: id, no cursor, one iteration, no NULL, types bound (LONG), the id.
        let mut execute = vec![0x17];
        execute.extend_from_slice(&100u32.to_le_bytes());
        execute.extend_from_slice(&[0, 1, 0, 0, 0, 0, 1, 0x03, 0x00]);
        execute.extend_from_slice(&50321u32.to_le_bytes());
        self.request.clear();
        framed(0, &execute, &mut self.request);
        let packets = binary_result_set(120);
        self.reply.clear();
        for (i, p) in packets.iter().enumerate() {
            framed(i as u8 + 1, p, &mut self.reply);
        }
        self.events = summaries(&packets, 16);
        self.block_events.clear();
    }

    /// One request/response round of every session, then what the engine sends.
    pub fn round(&mut self) {
        for i in 0..self.flows.len() {
            self.round_of(i);
        }
    }

    /// One round of session `i` (see the module documentation).
    pub fn round_of(&mut self, i: usize) {
        self.now = self.now + Duration::from_micros(20);
        self.exchange(i, true);
        let (c_next, reply_len) = (self.flows[i].c_seq, self.reply.len() as u32);
        self.test_feedback(i, c_next, reply_len, PA);
        if self.layer != Layer::Tcp {
            self.relay_reply(i);
        }
        self.drain();
    }

    /// Session `i`'s request, production's reply and the client's ACK of it, as captured;
    /// with `drain`, what the engine sends once it has the request, before the reply.
    fn exchange(&mut self, i: usize, drain: bool) {
        let prod = Self::prod_addr();
        let f = &mut self.flows[i];
        f.ts = f.ts.wrapping_add(1);
        let (client, c_seq, p_seq, ts) = (f.client, f.c_seq, f.p_seq, f.ts);
        let req_len = self.request.len() as u32;
        let reply_len = self.reply.len() as u32;
        let request = std::mem::take(&mut self.request);
        let p = pkt(client, prod, c_seq, p_seq, PA, Some((ts, ts)), &request);
        self.capture(&p);
        self.request = request;
        if drain {
            self.drain();
        }
        let c_next = c_seq.wrapping_add(req_len);
        let reply = std::mem::take(&mut self.reply);
        let r = pkt(prod, client, p_seq, c_next, PA, Some((ts, ts)), &reply);
        self.capture(&r);
        self.reply = reply;
        let p_next = p_seq.wrapping_add(reply_len);
        let a = pkt(client, prod, c_next, p_next, A, Some((ts, ts)), &[]);
        self.capture(&a);
        let f = &mut self.flows[i];
        f.c_seq = c_next;
        f.p_seq = p_next;
    }

    /// The reply's MySQL summaries, reusing the pre-built events (no allocation per round).
    fn relay_reply(&mut self, i: usize) {
        let client = self.flows[i].client;
        let mut events = std::mem::take(&mut self.events);
        self.stamp(i, &mut events);
        self.hand_over(client, &events, events.len());
        self.events = events;
    }

    /// Makes `events` session `i`'s, next in its test server's stream.
    fn stamp(&mut self, i: usize, events: &mut [MysqlEvent]) {
        let f = &mut self.flows[i];
        for ev in events {
            let MysqlEvent::Packet { client, packet } = ev else {
                continue;
            };
            *client = f.client;
            packet.stream_offset = f.t_offset;
            packet.tcp_seq = packet.stream_offset as u32;
            f.t_offset += 4 + u64::from(packet.len);
        }
    }

    /// Summaries of one session, `per_reply` a reply, as `self.relay` says the driver hands
    /// them to the engine.
    fn hand_over(&mut self, client: SocketAddrV4, events: &[MysqlEvent], per_reply: usize) {
        let now = self.now;
        match self.relay {
            Relay::OneByOne => {
                for ev in events {
                    self.engine
                        .on_test_event_at(now, now, client, &TestEvent::Mysql(ev));
                }
            }
            Relay::Reply => {
                for reply in events.chunks(per_reply.max(1)) {
                    let run = reply.iter().map(|ev| (now, TestEvent::Mysql(ev)));
                    self.engine.on_test_events_at(now, client, run);
                }
            }
            Relay::Session => {
                let run = events.iter().map(|ev| (now, TestEvent::Mysql(ev)));
                self.engine.on_test_events_at(now, client, run);
            }
        }
    }

    /// `k` rounds of every session as the copier meets them at a busy session's pace (the lab's
    /// 8 threads, ~10 commands a session in a 10 ms capture block): within one batch, `k`
    /// times each session's request, production's reply and the client's ACK; then what the
    /// engine sends (the `k` requests together); then the test server's replies as one relayed
    /// frame: `k` `TestFeedback`s per session (one a reply) and, with the MySQL layer, the
    /// replies' summaries as `self.relay` says. Input packets: `k` rounds' worth.
    pub fn block(&mut self, k: usize) {
        let (req_len, reply_len) = (self.request.len() as u32, self.reply.len() as u32);
        let n = self.flows.len();
        self.now = self.now + Duration::from_millis(10);
        for _ in 0..k {
            for i in 0..n {
                self.exchange(i, false);
            }
        }
        self.drain();
        for i in 0..n {
            // Where the block's first request started.
            let start = self.flows[i].c_seq.wrapping_sub(k as u32 * req_len);
            for r in 1..=k as u32 {
                self.test_feedback(i, start.wrapping_add(r * req_len), reply_len, PA);
            }
        }
        if self.layer != Layer::Tcp {
            let per_reply = self.events.len();
            if self.block_events.len() != k * per_reply {
                self.block_events = (0..k).flat_map(|_| self.events.clone()).collect();
            }
            let mut events = std::mem::take(&mut self.block_events);
            for i in 0..n {
                self.stamp(i, &mut events);
                self.hand_over(self.flows[i].client, &events, per_reply);
            }
            self.block_events = events;
        }
        self.drain();
    }

    /// Every session's connection ends and a new one takes its place, as sysbench's connect
    /// and disconnect (or a client that connects per request) bring them: the old one closes
    /// the statements it prepared (`COM_STMT_CLOSE`, no reply), says `COM_QUIT`, and both
    /// servers close after it; the new one has both handshakes, the greeting and login, and
    /// `prepares` prepares (cycling through [`PREPARED`]), each answered by both servers (the
    /// test server's answer relayed as `self.relay` says). Then the clock moves past the
    /// linger and the engine's timers run, so the old sessions are released too. Input
    /// packets: every captured packet and every `TestFeedback`.
    pub fn churn(&mut self, prepares: usize) {
        if self
            .lifecycle
            .as_ref()
            .is_none_or(|l| l.requests.len() != prepares)
        {
            self.lifecycle = Some(Lifecycle::new(prepares));
        }
        let Some(mut l) = self.lifecycle.take() else {
            return;
        };
        for i in 0..self.flows.len() {
            self.close(i, &l);
            self.open(i);
            for k in 0..prepares {
                self.prepare(i, k, &mut l);
            }
        }
        self.lifecycle = Some(l);
        self.now = self.now + self.engine.config().linger + Duration::from_secs(1);
        self.engine.on_timeout(self.now);
        self.drain();
        while let Some(ev) = self.engine.poll_event() {
            if let EngineEvent::SessionClosed { why, reason, .. } = ev {
                if reason != tcpshadow_core::engine::CloseReason::Completed {
                    self.closed.get_or_insert(format!("{reason:?} ({why:?})"));
                }
            }
        }
    }

    /// Session `i`'s client prepares statement `k`: production answers with statement id
    /// `100 + k`, the test server with `1 + k`.
    fn prepare(&mut self, i: usize, k: usize, l: &mut Lifecycle) {
        self.client_sends(i, &l.requests[k]);
        let prod = Self::prod_addr();
        let f = &self.flows[i];
        let (client, c_seq, p_seq, ts) = (f.client, f.c_seq, f.p_seq, f.ts);
        let reply = &l.prod_replies[k];
        self.capture(&pkt(prod, client, p_seq, c_seq, PA, Some((ts, ts)), reply));
        let f = &mut self.flows[i];
        f.p_seq = p_seq.wrapping_add(reply.len() as u32);
        f.prepared = k + 1;
        let (events, len) = &mut l.test_replies[k];
        self.test_feedback(i, c_seq, *len, PA);
        self.stamp(i, events);
        self.hand_over(client, events, events.len());
        self.drain();
    }

    /// Session `i`'s client sends `bytes` (whole MySQL packets), and the engine passes them on.
    fn client_sends(&mut self, i: usize, bytes: &[u8]) {
        let prod = Self::prod_addr();
        let f = &mut self.flows[i];
        f.ts = f.ts.wrapping_add(1);
        let (client, c_seq, p_seq, ts) = (f.client, f.c_seq, f.p_seq, f.ts);
        self.capture(&pkt(client, prod, c_seq, p_seq, PA, Some((ts, ts)), bytes));
        self.flows[i].c_seq = c_seq.wrapping_add(bytes.len() as u32);
        self.drain();
    }

    /// Session `i`'s connection ends as a client's that disconnects: its statements closed,
    /// `COM_QUIT`, then the servers' FINs (the test server's relayed) and the client's.
    fn close(&mut self, i: usize, l: &Lifecycle) {
        for k in 0..std::mem::take(&mut self.flows[i].prepared) {
            self.client_sends(i, &l.closes[k]);
        }
        self.client_sends(i, &l.quit);
        let prod = Self::prod_addr();
        let f = &self.flows[i];
        let (client, c_seq, p_seq, ts) = (f.client, f.c_seq, f.p_seq, f.ts);
        let fin = TcpFlags::FIN | A;
        self.capture(&pkt(prod, client, p_seq, c_seq, fin, Some((ts, ts)), &[]));
        self.test_feedback(i, c_seq, 0, fin);
        self.flows[i].t_seq = self.flows[i].t_seq.wrapping_add(1);
        self.drain();
        let p_next = p_seq.wrapping_add(1);
        self.capture(&pkt(client, prod, c_seq, p_next, fin, Some((ts, ts)), &[]));
        self.capture(&pkt(
            prod,
            client,
            p_next,
            c_seq.wrapping_add(1),
            A,
            Some((ts, ts)),
            &[],
        ));
        self.drain();
        self.test_feedback(i, c_seq.wrapping_add(1), 0, A);
        self.drain();
    }

    /// Whether every session is still live (nothing was abandoned): the script is only a
    /// benchmark if the engine accepts it as real traffic.
    pub fn check(&self) -> Result<(), String> {
        let s = self.engine.stats();
        // Every execute went to the test server under its statement's id there: none held
        // for a PREPARE_OK or dropped as unknown (the prepared shape measures nothing else).
        let names = self.engine.transform_counter_names();
        for (name, &n) in names.iter().zip(s.transform.as_slice()) {
            if n > 0 && (name.starts_with("executes_dropped") || name.contains("awaiting_prepare"))
            {
                return Err(format!("{name}: {n}"));
            }
        }
        if s.sessions_active as usize != self.flows.len() {
            return Err(format!(
                "{} of {} sessions live; closed: {:?}, first because {:?}",
                s.sessions_active,
                self.flows.len(),
                s.sessions_closed,
                self.closed
            ));
        }
        Ok(())
    }
}
