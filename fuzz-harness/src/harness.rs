//! The fuzz harnesses: one function per parser of untrusted input, each taking the fuzzer's raw
//! bytes. Shared, as the crate tcpshadow-fuzz-harness, by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`, nightly, coverage-guided) and by `intercept/tests/fuzz_corpus.rs`
//! (stable), which replays every committed corpus file through the very same functions in the
//! ordinary `cargo test`.
//!
//! A harness must panic only when the code under test misbehaves: every error a parser returns
//! is an expected outcome of hostile input and is ignored. The few assertions check properties
//! that hold for any input (a decoded control frame re-encodes to the same message; a packet the
//! copier emits is a valid IPv4/TCP packet).
//!
//! It must never do I/O, read a clock or depend on anything but its input: a crash has to
//! reproduce from the input file alone.

use common::seq::SeqNumber;
use std::collections::HashMap;
use std::io::Cursor;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::clock::Instant;
use common::control::{
    CopierMessage, FrameDecoder, InterceptMessage, MysqlEvent, MysqlPacket, TestFeedback,
    WireMessage,
};
use common::mysql::auth::{AuthPlugin, Nonce, ServerPublicKey};
use common::mysql::classify::{classify, classify_with, Rules};
use common::mysql::command::{statement_id, ChangeUser, Command, PrepareOk};
use common::mysql::digest::{fingerprint, mask_literals, traits};
use common::mysql::handshake::{
    AuthMoreData, AuthSwitchRequest, Capabilities, ClientLogin, EofPacket, ErrPacket, Greeting,
    HandshakeResponse, OkPacket, ReplyPhase, ServerReply,
};
use common::mysql::packet::{
    FrameScanner, Oversize, PacketHeader, PacketSplitter, ScanSink, ScannedPacket,
};
use common::mysql::stmt::PrepareAnswer;
use common::mysql::{read_lenenc_bytes, read_lenenc_int};
use common::wire::{
    parse_frame, parse_frame_headers, parse_ipv4_tcp, tcp_checksum_ok, LinkType, TcpFlags,
    TcpOptions, TcpPacket,
};

/// A harness: runs one input through the parser under test; panics only on a bug.
pub type Harness = fn(&[u8]);

/// Every harness, by target name (the directory names under `fuzz/corpus/`).
pub const TARGETS: &[(&str, Harness)] = &[
    ("wire", wire),
    ("control", control),
    ("mysql_framing", mysql_framing),
    ("mysql_messages", mysql_messages),
    ("mysql_sql", mysql_sql),
    ("pcap_reader", pcap_reader),
    ("copier_engine", copier_engine),
    ("intercept_sessions", intercept_sessions),
    ("config", config),
    ("tls_event", tls_event),
];

/// Reads the fuzzer's bytes as a stream of small decisions; past the end everything is zero,
/// so any input is a complete program.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(usize::MAX)
    }
}

// ------------------------------------------------------------------------- captured packets

/// `common::wire`: a captured frame of any link type down to its TCP segment (Ethernet with
/// VLAN tags, Linux cooked v1/v2, raw IP, BSD loopback), fragments and TCP options included.
/// First byte: the link type; the rest: the frame.
pub fn wire(data: &[u8]) {
    let mut r = Input::new(data);
    let sel = r.u8();
    let frame = r.rest();
    let link = match sel % 6 {
        0 => LinkType::Ethernet,
        1 => LinkType::LinuxSll,
        2 => LinkType::LinuxSll2,
        3 => LinkType::RawIp,
        4 => LinkType::Null,
        _ => {
            let _ = tcp_checksum_ok(frame);
            if let Some(b) = frame.get(..4) {
                let _ = LinkType::from_dlt(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
            if let Ok(p) = parse_ipv4_tcp(frame) {
                assert_eq!(p.payload.len() as u64, u64::from(p.payload_len));
            }
            return;
        }
    };
    if let Ok(p) = parse_frame(link, frame) {
        assert_eq!(p.payload.len() as u64, u64::from(p.payload_len));
    }
    if let Ok(p) = parse_frame_headers(link, frame) {
        assert!(p.payload.len() as u64 <= u64::from(p.payload_len));
    }
}

// ------------------------------------------------------------------------- control channel

/// `common::control`: the frame decoder of either direction, fed in chunks. First byte: bit 0
/// picks the direction (0: what intercept decodes from a copier, 1: what a copier decodes from
/// intercept), the other bits the chunk size. Every message decoded must re-encode and decode to
/// itself.
pub fn control(data: &[u8]) {
    let mut r = Input::new(data);
    let sel = r.u8();
    let chunk = usize::from(sel >> 1) + 1;
    let stream = r.rest();
    if sel & 1 == 0 {
        decode_all::<CopierMessage>(stream, chunk);
    } else {
        decode_all::<InterceptMessage>(stream, chunk);
    }
}

fn decode_all<M: WireMessage + PartialEq + std::fmt::Debug>(stream: &[u8], chunk: usize) {
    let mut dec = FrameDecoder::<M>::new();
    for piece in stream.chunks(chunk) {
        dec.feed(piece);
        loop {
            match dec.next_message() {
                Ok(Some(m)) => round_trip(&m),
                Ok(None) => break,
                Err(_) => {
                    // Poisoned for good: more input must not revive it.
                    dec.feed(piece);
                    assert!(dec.next_message().is_err());
                    return;
                }
            }
        }
    }
}

fn round_trip<M: WireMessage + PartialEq + std::fmt::Debug>(m: &M) {
    let mut buf = Vec::new();
    m.encode(&mut buf)
        .expect("a decoded message always re-encodes");
    let mut dec = FrameDecoder::<M>::new();
    dec.feed(&buf);
    let again = dec.next_message().expect("re-encoded message decodes");
    assert_eq!(again.as_ref(), Some(m));
    assert_eq!(dec.buffered(), 0);
}

// ------------------------------------------------------------------------- MySQL

/// `common::mysql::packet` and the length-encoded integers: the physical/logical packet framing
/// of a MySQL byte stream fed in chunks. First byte: which framer and the chunk size.
pub fn mysql_framing(data: &[u8]) {
    let mut r = Input::new(data);
    let sel = r.u8();
    let arg = r.u8();
    let chunk = usize::from(sel >> 2) + 1;
    let stream = r.rest();
    match sel & 3 {
        0 => {
            let mut s = FrameScanner::new(usize::from(arg));
            let mut last_end = 0u64;
            for piece in stream.chunks(chunk) {
                s.feed(piece, |p| {
                    assert!(p.prefix.len() <= usize::from(arg));
                    assert!(p.header.payload_offset() >= last_end);
                    last_end = p.header.payload_offset();
                });
            }
            assert_eq!(s.position(), stream.len() as u64);
            let _ = s.at_boundary();
            // The same stream skimmed: packets whose first byte is odd are passed over, the
            // rest reported as above, and the walk ends in the same place.
            struct Odd(usize);
            impl ScanSink for Odd {
                fn skim(&mut self, _: u8, len: u32, head: &[u8]) -> bool {
                    assert_eq!(head.len(), (len as usize).min(FrameScanner::SKIM_HEAD));
                    head.first().is_some_and(|b| b & 1 == 1)
                }
                fn packet(&mut self, p: ScannedPacket<'_>) {
                    assert!(p.prefix.len() <= self.0);
                }
            }
            let mut k = FrameScanner::new(usize::from(arg));
            for piece in stream.chunks(chunk) {
                k.feed_skimming(piece, &mut Odd(usize::from(arg)));
            }
            assert_eq!(k.position(), stream.len() as u64);
            assert_eq!(k.at_boundary(), s.at_boundary());
        }
        1 => {
            let mut s = FrameScanner::with_hashes(usize::from(arg));
            for piece in stream.chunks(chunk) {
                s.feed(piece, |p| assert!(p.hash.is_some()));
            }
        }
        2 => {
            let oversize = if arg & 1 == 0 {
                Oversize::Fail
            } else {
                Oversize::Skip
            };
            let max_len = usize::from(arg >> 1) * 16;
            let mut s = PacketSplitter::new(max_len, oversize);
            for piece in stream.chunks(chunk) {
                let res = s.feed(piece, |p| {
                    if let Some(payload) = p.payload() {
                        assert_eq!(payload.len() as u64, p.len);
                        assert!(payload.len() <= max_len);
                    }
                    let _ = p.end_offset();
                });
                assert!(s.buffered() <= max_len);
                if res.is_err() {
                    break;
                }
            }
        }
        _ => {
            if let Some(h) = PacketHeader::parse(stream) {
                assert_eq!(&h.to_bytes()[..], &stream[..4]);
                let _ = h.is_continued();
            }
            let _ = read_lenenc_int(stream);
            if let Ok((b, n)) = read_lenenc_bytes(stream) {
                assert!(b.len() <= n && n <= stream.len());
            }
        }
    }
}

/// The MySQL message parsers of `common::mysql::{handshake, command, stmt, auth}`: greeting,
/// login (HandshakeResponse, SSLRequest), auth switch and more-data (an RSA key), OK/ERR/EOF,
/// commands (COM_CHANGE_USER, COM_STMT_*), PREPARE_OK. First byte: which parser; next four:
/// the capabilities; the rest: the payload. Writers are run on what parsed.
pub fn mysql_messages(data: &[u8]) {
    let mut r = Input::new(data);
    let sel = r.u8();
    let caps = Capabilities(r.u32());
    let p = r.rest();
    match sel % 12 {
        0 => {
            if let Ok(g) = Greeting::parse(p) {
                let _ = g.mariadb_capabilities();
                let _ = g.nonce();
                let _ = format!("{g:?}");
                let _ = g.write(&mut Vec::new());
            }
        }
        1 => {
            if let Ok(login) = ClientLogin::parse(p) {
                let _ = login.capabilities();
                let _ = login.not_mirrorable();
            }
            if let Ok(h) = HandshakeResponse::parse(p) {
                let _ = h.mariadb_capabilities();
                for _ in h.attributes() {}
                let _ = format!("{h:?}");
                let _ = h.write(&mut Vec::new());
            }
        }
        2 => {
            if let Ok(a) = AuthSwitchRequest::parse(p) {
                let _ = AuthPlugin::from_name(a.plugin);
                let _ = Nonce::from_auth_data(a.data);
                let _ = a.write(&mut Vec::new());
            }
        }
        3 => {
            if let Ok(m) = AuthMoreData::parse(p) {
                let _ = m.fast_auth_result();
                // The test server's RSA public key (caching_sha2_password full auth).
                let _ = ServerPublicKey::from_pem(m.data);
            }
        }
        4 => {
            if let Ok(ok) = OkPacket::parse(p, caps) {
                let _ = ok.tracked_schema();
            }
        }
        5 => {
            if let Ok(e) = ErrPacket::parse(p) {
                let _ = e.is_progress_report();
                e.write(&mut Vec::new());
            }
            if let Ok(e) = EofPacket::parse(p) {
                e.write(&mut Vec::new());
            }
            let _ = EofPacket::is_eof(p);
        }
        6 => {
            let _ = ServerReply::classify(p, ReplyPhase::Auth);
            let _ = ServerReply::classify(p, ReplyPhase::Command);
        }
        7 => {
            if let Ok(c) = Command::parse(p, caps) {
                let _ = c.code();
                let _ = c.statement_id();
                let _ = c.expects_reply();
                let _ = c.drops_statements();
            }
            let _ = statement_id(p);
        }
        8 => {
            if let Ok(c) = ChangeUser::parse(p, caps) {
                let _ = format!("{c:?}");
                let _ = c.write(caps, &mut Vec::new());
            }
        }
        9 => {
            if let Ok(ok) = PrepareOk::parse(p) {
                let _ = ok.following_packets(caps);
                ok.write(&mut Vec::new());
            }
            let _ = PrepareAnswer::parse(p);
        }
        10 => {
            let mut payload = p.to_vec();
            let _ = common::mysql::command::set_statement_id(&mut payload, 7);
        }
        _ => {
            let _ = ServerPublicKey::from_pem(p);
        }
    }
}

/// `common::mysql::{classify, digest}`: the SQL lexers that judge writes (`--read-only`) and
/// make report fingerprints. First byte: options; the rest: the statement text.
pub fn mysql_sql(data: &[u8]) {
    let mut r = Input::new(data);
    let sel = r.u8();
    let sql = r.rest();
    let _ = classify(sql);
    if sel & 1 != 0 {
        let rules = Rules::default();
        let _ = classify_with(sql, &rules);
    }
    let (fp, _) = fingerprint(sql);
    // A fingerprint is a fixed point: normalising it again changes nothing.
    if sel & 2 != 0 {
        let _ = fingerprint(fp.as_bytes());
    }
    let _ = mask_literals(sql);
    let _ = traits(sql);
}

// ------------------------------------------------------------------------- capture files

/// `copier::pcapfile::reader`: a pcap or pcapng file (`copier replay`), every frame of it then
/// parsed as the replay does.
pub fn pcap_reader(data: &[u8]) {
    let Ok(mut reader) = copier::pcapfile::CaptureReader::new(Cursor::new(data)) else {
        return;
    };
    let _ = reader.format();
    while let Ok(Some(frame)) = reader.next_frame() {
        assert!(frame.data.len() <= data.len());
        if let Some(link) = LinkType::from_dlt(i32::from(frame.link_type)) {
            let _ = parse_frame_headers(link, frame.data);
        }
    }
    let _ = reader.offset();
}

// ------------------------------------------------------------------------- configuration

/// `ops::config`: a TOML config file checked against the copier's flags, then applied.
pub fn config(data: &[u8]) {
    use clap::CommandFactory;
    static CMD: OnceLock<clap::Command> = OnceLock::new();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cmd = CMD.get_or_init(copier::cli::Args::command);
    // Only the file's own checks: applying it to the command line is clap's business, and
    // cloning clap's command per input would cost more than the parse under test.
    if let Ok(file) = ops::config::ConfigFile::parse(text, Path::new("fuzz.toml"), cmd) {
        let _ = file.get("target");
    }
}

/// The TLS plaintext probe's ring records (`common::tls_event`, issue 21): written by a BPF
/// program from another process's memory, so untrusted. What decodes must say what it holds
/// (its data is the record's tail) and decode the same once written again.
pub fn tls_event(data: &[u8]) {
    use common::tls_event::{decode, encode, HEADER_LEN};
    let Ok(e) = decode(data) else {
        return;
    };
    assert_eq!(e.data.len() + HEADER_LEN, data.len());
    assert!(e.offset.checked_add(e.data.len() as u64).is_some());
    let mut again = Vec::new();
    encode(&e, &mut again);
    assert_eq!(decode(&again), Ok(e));
}

// ------------------------------------------------------------------------- copier engine

const PROD: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PROD_PORT: u16 = 3306;
const TARGET: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 3306);
const CLIENT_ISN: u32 = 1_000_000;
const PROD_ISN: u32 = 5_000_000;
const TEST_ISN: u32 = 9_000_000;

fn client(i: u8) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(198, 18, 1, 1 + i % 3),
        40_000 + u16::from(i % 3),
    )
}

fn options(r: &mut Input<'_>, flags: TcpFlags) -> TcpOptions {
    if !flags.syn() {
        return TcpOptions::default();
    }
    let o = r.u8();
    TcpOptions {
        mss: (o & 1 != 0).then(|| r.u16()),
        window_scale: (o & 2 != 0).then(|| r.u8()),
        sack_permitted: o & 4 != 0,
        timestamps: (o & 8 != 0).then(|| (r.u32(), r.u32())),
    }
}

/// `tcpshadow_core::engine` (with the MySQL transform or without): a session engine fed captured
/// client and production packets, the test server's feedback, intercept's MySQL packet
/// summaries and a fake clock, as a little program in the fuzzer's bytes (see
/// [`EngineOp`]). Every packet the engine sends must be a valid IPv4/TCP packet.
pub fn copier_engine(data: &[u8]) {
    use tcpshadow_core::engine::{Engine, EngineConfig, TestEvent, MAX_HEADER_LEN};

    let mut r = Input::new(data);
    let setup = r.u8();
    let mut cfg = EngineConfig::new(PROD_PORT, TARGET);
    cfg.pickup_midstream = setup & 1 != 0;
    if setup & 2 != 0 {
        cfg.client_ip_pool = Some((Ipv4Addr::new(198, 19, 0, 0), 30));
    }
    cfg.mss = if setup & 4 != 0 { 64 } else { 1460 };
    cfg.max_session_buffer = if setup & 8 != 0 { 2048 } else { 1 << 20 };
    cfg.max_sessions = 1 + usize::from((setup >> 4) & 1);
    let mut engine = if setup & 0x20 != 0 {
        Engine::with_transform(cfg, Box::new(mysql_factory(setup & 0x40 != 0)))
    } else {
        Engine::new(cfg)
    };
    let mut now = Instant::from_nanos(1_000_000_000);
    // What the test server has been sent per mirrored address (next sequence number), so
    // feedback can acknowledge real bytes; and the next MySQL stream offset of its replies.
    let mut our_next: HashMap<SocketAddrV4, u32> = HashMap::new();
    let mut test_offset: HashMap<SocketAddrV4, u64> = HashMap::new();
    let mut mirrored: Vec<SocketAddrV4> = Vec::new();
    let mut buf = vec![0u8; 65_535 + MAX_HEADER_LEN];

    let mut steps = 0;
    while !r.is_empty() && steps < 1000 {
        steps += 1;
        let op = r.u8();
        match EngineOp::from(op) {
            EngineOp::Client | EngineOp::Prod => {
                let from_client = EngineOp::from(op) == EngineOp::Client;
                let c = client(r.u8());
                let flags = TcpFlags(r.u8());
                let far = op & 0x80 != 0;
                let (seq_base, ack_base) = if from_client {
                    (CLIENT_ISN, PROD_ISN)
                } else {
                    (PROD_ISN, CLIENT_ISN)
                };
                let seq = if far {
                    r.u32()
                } else {
                    seq_base.wrapping_add(u32::from(r.u16()))
                };
                let ack = ack_base.wrapping_add(u32::from(r.u16()));
                let options = options(&mut r, flags);
                let len = if far {
                    usize::from(r.u16())
                } else {
                    usize::from(r.u8())
                };
                let payload = r.take(len);
                let (src, dst) = if from_client {
                    (c, SocketAddrV4::new(PROD, PROD_PORT))
                } else {
                    (SocketAddrV4::new(PROD, PROD_PORT), c)
                };
                let pkt = TcpPacket {
                    src: *src.ip(),
                    dst: *dst.ip(),
                    src_port: src.port(),
                    dst_port: dst.port(),
                    seq: SeqNumber(seq),
                    ack: SeqNumber(ack),
                    flags,
                    window: r.u16(),
                    options,
                    ip_id: 0,
                    ttl: 64,
                    payload,
                    payload_len: payload.len() as u32,
                };
                engine.on_captured(now, &pkt);
            }
            EngineOp::Feedback => {
                let m = pick(&mirrored, r.u8());
                let flags = TcpFlags(r.u8());
                let seq = TEST_ISN.wrapping_add(u32::from(r.u16()));
                let back = u32::from(r.u8());
                let ack = our_next.get(&m).map_or(back, |n| n.wrapping_sub(back));
                let options = options(&mut r, flags);
                let len = usize::from(r.u8());
                let prefix = r.take(len).to_vec();
                let extra = if op & 0x80 != 0 {
                    u32::from(r.u16())
                } else {
                    0
                };
                let fb = TestFeedback {
                    client: m,
                    server: TARGET,
                    seq,
                    ack,
                    flags,
                    window: r.u16(),
                    options,
                    payload_len: prefix.len() as u32 + extra,
                    payload_prefix: prefix,
                };
                engine.on_feedback(now, &fb);
            }
            EngineOp::Mysql => {
                let m = pick(&mirrored, r.u8());
                let ev = if op & 0xc0 == 0xc0 {
                    // A run of folded rows: continuing the stream, or anywhere.
                    let offset = test_offset.entry(m).or_insert(0);
                    let count = u32::from(r.u8()).max(1);
                    let bytes = 4 * u64::from(count) + u64::from(r.u16());
                    let rows = common::control::MysqlRows {
                        stream_offset: if r.u8() & 1 == 0 {
                            *offset
                        } else {
                            u64::from(r.u32())
                        },
                        seq_id: r.u8(),
                        count,
                        bytes,
                        framed_at_us: 0,
                        eof: count & 1 == 0,
                    };
                    *offset += bytes;
                    MysqlEvent::Rows { client: m, rows }
                } else if op & 0x80 != 0 {
                    MysqlEvent::FramingLost {
                        client: m,
                        at_seq: r.u32(),
                    }
                } else {
                    let head_len = usize::from(r.u8());
                    let head = r.take(head_len).to_vec();
                    let len = if op & 0x40 != 0 {
                        u32::from(r.u16()) + head.len() as u32
                    } else {
                        head.len() as u32
                    };
                    let offset = test_offset.entry(m).or_insert(0);
                    let packet = MysqlPacket {
                        stream_offset: *offset,
                        tcp_seq: 0,
                        seq_id: r.u8(),
                        len,
                        head: head.into(),
                        hash: None,
                        framed_at_us: 0,
                    };
                    *offset += 4 + u64::from(len);
                    MysqlEvent::Packet { client: m, packet }
                };
                engine.on_test_event(now, m, &TestEvent::Mysql(&ev));
            }
            EngineOp::Tick => {
                now = now + Duration::from_millis(u64::from(r.u16()));
                engine.on_timeout(now);
            }
            EngineOp::Deadline => {
                if let Some(d) = engine.next_deadline() {
                    now = now.max(d);
                    engine.on_timeout(now);
                }
            }
        }
        drain(&mut engine, now, &mut buf, &mut our_next, &mut mirrored);
    }
    engine.shutdown(now);
    drain(&mut engine, now, &mut buf, &mut our_next, &mut mirrored);
    let _ = engine.stats();
    let _ = engine.queued_bytes();
}

/// The operations of [`copier_engine`]'s little language, from the low bits of a byte (the
/// high bits are per-operation variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineOp {
    /// A captured client->production segment.
    Client,
    /// A captured production->client segment.
    Prod,
    /// The test server's segment relayed by intercept.
    Feedback,
    /// A MySQL packet summary (or framing loss) relayed by intercept.
    Mysql,
    /// The clock moves on by up to 65 s; timers run.
    Tick,
    /// The clock jumps to the engine's next deadline; timers run.
    Deadline,
}

impl From<u8> for EngineOp {
    fn from(b: u8) -> Self {
        match b & 0x0f {
            0..=3 => EngineOp::Client,
            4..=5 => EngineOp::Prod,
            6..=8 => EngineOp::Feedback,
            9..=11 => EngineOp::Mysql,
            12..=13 => EngineOp::Tick,
            _ => EngineOp::Deadline,
        }
    }
}

fn pick(known: &[SocketAddrV4], i: u8) -> SocketAddrV4 {
    if known.is_empty() || i == 0xff {
        client(i)
    } else {
        known[usize::from(i) % known.len()]
    }
}

fn drain(
    engine: &mut tcpshadow_core::engine::Engine,
    now: Instant,
    buf: &mut [u8],
    our_next: &mut HashMap<SocketAddrV4, u32>,
    mirrored: &mut Vec<SocketAddrV4>,
) {
    while let Some(n) = engine.poll_transmit(now, buf) {
        let ip = &buf[..n];
        let p = parse_ipv4_tcp(ip).expect("the engine emits valid IPv4/TCP");
        assert!(tcp_checksum_ok(ip), "the engine emits correct checksums");
        assert_eq!(SocketAddrV4::new(p.dst, p.dst_port), TARGET);
        let mut end = p.seq + p.payload_len;
        if p.flags.syn() {
            end += 1u32;
        }
        if p.flags.fin() {
            end += 1u32;
        }
        our_next.insert(SocketAddrV4::new(p.src, p.src_port), end.0);
    }
    while let Some(ev) = engine.poll_event() {
        if let tcpshadow_core::engine::EngineEvent::SessionOpened { mirrored: m, .. } = ev {
            if !mirrored.contains(&m) {
                mirrored.push(m);
            }
        }
    }
}

fn mysql_factory(read_only: bool) -> tcpshadow_core::mysql::MysqlFactory {
    use tcpshadow_core::mysql::{MysqlConfig, MysqlFactory};
    let creds =
        tcpshadow_core::credentials::Credentials::parse("sb:sbpass\nsbtest:sbtest\nroot:\n")
            .expect("fixed credentials parse");
    let config = MysqlConfig {
        default_user: Some("sbtest".into()),
        read_only,
        max_held_bytes: 64 << 10,
        ..MysqlConfig::default()
    };
    // Fixed "randomness": a crash must reproduce from the input alone.
    MysqlFactory::new(
        config,
        Arc::new(creds),
        Arc::new(|b: &mut [u8]| {
            b.fill(0x5a);
            true
        }),
    )
}

// ------------------------------------------------------------------------- intercept

/// `intercept::{sessions, reassembly, framer}`: the test server's reply segments as intercept
/// captures them (SYN-ACKs, data in any order, snapped payloads, FIN/RST), reassembled and
/// framed into MySQL packet summaries, with a fake clock for expiry. First byte: the
/// configuration; then operations.
pub fn intercept_sessions(data: &[u8]) {
    use intercept::reassembly::HoldLimits;
    use intercept::sessions::{MysqlSessions, SessionConfig};

    let mut r = Input::new(data);
    let setup = r.u8();
    let cfg = SessionConfig {
        head: usize::from(setup & 0x1f),
        max_sessions: 1 + usize::from((setup >> 5) & 3),
        hold: HoldLimits {
            segments: 8,
            bytes: 4096,
        },
        ..SessionConfig::default()
    };
    let mut sessions = MysqlSessions::new(cfg);
    sessions.set_hashing(setup & 0x80 != 0);
    let mut now = Instant::from_nanos(1_000_000_000);
    let mut out = Vec::new();
    let mut steps = 0;
    while !r.is_empty() && steps < 1000 {
        steps += 1;
        let op = r.u8();
        match op & 7 {
            0..=4 => {
                let c = client(r.u8());
                let flags = match op & 7 {
                    0 => TcpFlags(TcpFlags::SYN | TcpFlags::ACK),
                    4 => TcpFlags(r.u8()),
                    _ => TcpFlags(TcpFlags::ACK | TcpFlags::PSH),
                };
                let seq = if op & 0x80 != 0 {
                    r.u32()
                } else {
                    let off = u32::from(r.u16());
                    if flags.syn() {
                        TEST_ISN.wrapping_add(off & 1)
                    } else {
                        TEST_ISN.wrapping_add(1).wrapping_add(off)
                    }
                };
                let len = usize::from(r.u8());
                let payload = r.take(len);
                let snapped = if op & 0x40 != 0 { u32::from(r.u8()) } else { 0 };
                let pkt = TcpPacket {
                    src: *TARGET.ip(),
                    dst: *c.ip(),
                    src_port: TARGET.port(),
                    dst_port: c.port(),
                    seq: SeqNumber(seq),
                    ack: SeqNumber(0),
                    flags,
                    window: 65535,
                    options: TcpOptions::default(),
                    ip_id: 0,
                    ttl: 64,
                    payload,
                    payload_len: payload.len() as u32 + snapped,
                };
                sessions.on_segment(now, &pkt, &mut out);
            }
            5 => {
                now = now + Duration::from_secs(u64::from(r.u16()));
                sessions.sweep(now);
            }
            6 => {
                sessions.set_hashing(op & 0x80 != 0);
                sessions.set_folding(op & 0x40 != 0);
            }
            _ => out.clear(),
        }
        for ev in &out {
            if let MysqlEvent::Packet { packet, .. } = ev {
                assert!(packet.head.len() <= common::control::MAX_MYSQL_HEAD);
                assert!(packet.head.len() as u64 <= u64::from(packet.len));
                assert!(packet.len <= common::control::MYSQL_MAX_PAYLOAD);
            }
        }
        // Whatever intercept frames must fit a control frame.
        if !out.is_empty() && out.len() <= common::control::MAX_MYSQL_EVENTS_PER_FRAME {
            let mut buf = Vec::new();
            common::control::encode_mysql(0, &out, &mut buf).expect("framed events encode");
        }
        if out.len() > 4096 {
            out.clear();
        }
    }
    let _ = sessions.stats();
    let _ = sessions.len();
}
