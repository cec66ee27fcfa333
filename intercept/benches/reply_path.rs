//! Criterion benchmark of intercept's per-reply path, no I/O: a captured Ethernet frame of the
//! test server's reply is parsed, its session looked up, its feedback (and in MySQL mode its
//! packets' summaries) routed to the owning copier, and each flushed batch encoded into
//! control frames as the copier's writer thread does. 1000 claimed sessions, replies
//! round-robin, a flush every 64 replies (the capture running dry).
//!
//!     cargo bench -p intercept --bench reply_path
//!
//! Reports relayed replies per second (`Throughput::Elements`) and prints the heap
//! allocations per reply (a counting global allocator wraps the system one).

use common::alloc_count::{allocations, CountingAlloc};
use common::seq::SeqNumber;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::mpsc::{sync_channel, Receiver};

use common::clock::Instant;
use common::control::{encode_feedback, encode_mysql};
use common::wire::{
    emit_ipv4_tcp, parse_frame_headers, LinkType, SegmentRepr, TcpFlags, TcpOptions,
};
use criterion::{criterion_group, Criterion, Throughput};
use intercept::pump::ReplyPath;
use intercept::relay::{Outgoing, Relay, RelayEvent};
use intercept::sessions::SessionConfig;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const SESSIONS: usize = 1000;
const FLUSH_EVERY: usize = 64;
const TEST: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306);

/// A sysbench point select's result set: column count, column definition, EOF, one row of
/// 120 bytes, EOF; framed as the test server sends it.
fn reply_bytes() -> Vec<u8> {
    let mut col = Vec::new();
    for s in [&b"def"[..], b"sbtest", b"sbtest1", b"sbtest1", b"c", b"c"] {
        col.push(s.len() as u8);
        col.extend_from_slice(s);
    }
    col.extend_from_slice(&[
        0x0c, 0x21, 0x00, 0xe0, 0x01, 0, 0, 0xfe, 0x01, 0x10, 0, 0, 0,
    ]);
    let eof = vec![0xfe, 0, 0, 0x02, 0];
    let mut row = vec![120u8];
    row.extend((0..120).map(|i| b'0' + (i % 10) as u8));
    let mut out = Vec::new();
    for (i, p) in [vec![1u8], col, eof.clone(), row, eof].iter().enumerate() {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes()[..3]);
        out.push(i as u8 + 1);
        out.extend_from_slice(p);
    }
    out
}

/// An Ethernet frame of the test server's segment to `client`.
fn frame(client: SocketAddrV4, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let repr = SegmentRepr {
        src: *TEST.ip(),
        dst: *client.ip(),
        src_port: TEST.port(),
        dst_port: client.port(),
        seq: SeqNumber(seq),
        ack: SeqNumber(1),
        flags: TcpFlags(flags),
        window: 509,
        options: TcpOptions {
            timestamps: Some((1, 1)),
            ..TcpOptions::default()
        },
        ip_id: 0,
        ttl: 64,
    };
    let mut f = vec![0u8; 14 + 60 + payload.len()];
    f[12] = 0x08;
    let n = emit_ipv4_tcp(&repr, payload, &mut f[14..]).expect("fits");
    f.truncate(14 + n);
    f
}

/// Offset of the TCP sequence number in [`frame`]'s frames.
const SEQ_AT: usize = 14 + 20 + 4;

struct Bench {
    path: ReplyPath,
    rx: Receiver<Outgoing>,
    clients: Vec<SocketAddrV4>,
    /// Each session's reply frame, its sequence number patched every round.
    frames: Vec<Vec<u8>>,
    seqs: Vec<u32>,
    reply_len: u32,
    encoded: Vec<u8>,
    now: Instant,
    next: usize,
    since_flush: usize,
    pub replies: u64,
}

impl Bench {
    fn new(mysql: bool) -> Self {
        let (tx, rx) = sync_channel(1 << 16);
        // intercept's default --batch.
        let mut relay = Relay::new(64);
        relay.apply(RelayEvent::Connected {
            id: 1,
            name: "bench".into(),
            tx: tx.into(),
            features: 0,
        });
        let clients: Vec<SocketAddrV4> = (0..SESSIONS)
            .map(|i| SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 10), 10_000 + i as u16))
            .collect();
        relay.apply(RelayEvent::Claim {
            id: 1,
            addrs: clients.clone(),
        });
        // intercept's defaults: MySQL mode relays no payload prefix (the summaries carry
        // what the copier needs), TCP mode 64 bytes.
        let (prefix, sessions) = if mysql {
            (0, Some(SessionConfig::default()))
        } else {
            (64, None)
        };
        let path = ReplyPath::new(relay, prefix, sessions);
        let reply = reply_bytes();
        let mut b = Bench {
            path,
            rx,
            frames: clients
                .iter()
                .map(|c| frame(*c, 0, TcpFlags::ACK | TcpFlags::PSH, &reply))
                .collect(),
            seqs: vec![0x7000_0000; SESSIONS],
            clients,
            reply_len: reply.len() as u32,
            encoded: Vec::with_capacity(1 << 20),
            now: Instant::from_nanos(1_000_000_000),
            next: 0,
            since_flush: 0,
            replies: 0,
        };
        // Each session's SYN-ACK (framing starts there), then its greeting-sized first reply.
        for i in 0..SESSIONS {
            let f = frame(b.clients[i], b.seqs[i], TcpFlags::SYN | TcpFlags::ACK, &[]);
            b.feed(&f);
            b.seqs[i] = b.seqs[i].wrapping_add(1);
        }
        b.flush();
        b
    }

    fn feed(&mut self, f: &[u8]) {
        if let Ok(pkt) = parse_frame_headers(LinkType::Ethernet, f) {
            self.path
                .on_segment(self.now, (self.now.as_nanos() / 1000) as u32, &pkt);
        }
    }

    /// What the capture thread does when the capture runs dry, and what the copier's writer
    /// thread does with each batch.
    fn flush(&mut self) {
        self.path.relay.flush();
        self.encoded.clear();
        while let Ok(out) = self.rx.try_recv() {
            if let Outgoing::Batch(b) = out {
                if !b.feedback.is_empty() {
                    encode_feedback(&b.feedback, &mut self.encoded).expect("encodes");
                }
                if !b.mysql.is_empty() {
                    encode_mysql(0, &b.mysql, &mut self.encoded).expect("encodes");
                }
            }
        }
    }

    /// One reply of the next session.
    fn reply(&mut self) {
        let i = self.next;
        self.next = (i + 1) % SESSIONS;
        let mut f = std::mem::take(&mut self.frames[i]);
        f[SEQ_AT..SEQ_AT + 4].copy_from_slice(&self.seqs[i].to_be_bytes());
        self.seqs[i] = self.seqs[i].wrapping_add(self.reply_len);
        self.feed(&f);
        self.frames[i] = f;
        self.replies += 1;
        self.since_flush += 1;
        if self.since_flush == FLUSH_EVERY {
            self.since_flush = 0;
            self.flush();
        }
    }
}

fn reply_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("intercept");
    group.throughput(Throughput::Elements(1));
    for (mysql, name) in [(false, "tcp"), (true, "mysql")] {
        let mut b = Bench::new(mysql);
        for _ in 0..SESSIONS {
            b.reply();
        }
        let (a0, r0) = (allocations(), b.replies);
        for _ in 0..10 * SESSIONS {
            b.reply();
        }
        let (a1, r1) = (allocations(), b.replies);
        eprintln!(
            "intercept/{name}: {:.3} allocations per relayed reply",
            (a1 - a0) as f64 / (r1 - r0) as f64
        );
        group.bench_function(format!("{name}/reply"), |bench| bench.iter(|| b.reply()));
        let stats = b.path.relay.stats();
        assert_eq!(stats.dropped_queue_full, 0, "the bench drains every batch");
        if let Some((m, _)) = b.path.mysql_stats() {
            assert_eq!(m.framing_lost, 0, "every reply is framed: {m:?}");
        }
    }
    group.finish();
}

criterion_group!(benches, reply_path);

/// `REPLY_PROFILE=tcp:N` or `mysql:N`: N replies without criterion, for callgrind.
fn main() {
    if let Ok(spec) = std::env::var("REPLY_PROFILE") {
        let mut parts = spec.split(':');
        let mysql = parts.next() == Some("mysql");
        let n: usize = parts.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
        let mut b = Bench::new(mysql);
        for _ in 0..n {
            b.reply();
        }
        println!("{} replies", b.replies);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
