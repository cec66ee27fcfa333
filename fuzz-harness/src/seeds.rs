//! Seed inputs for every fuzz target, built from real bytes: the MySQL payloads captured from
//! MariaDB and its clients (`common/src/mysql/fixtures.rs`), frames made by our own emitter and
//! encoders, a pcap and a pcapng file, the shipped config file. The fuzzer starts from these and
//! mutates; they are written to `fuzz/corpus/<target>/` by
//! `cargo run -p intercept --example fuzz_seeds`
//! and then minimised together with what the fuzzer found (`cargo fuzz cmin`).
//!
//! Layouts follow the harnesses in `harness.rs` (a selector byte, then the input, or a small
//! program of operations); a seed out of step with its harness is still valid input, only a
//! poorer start.

use common::seq::SeqNumber;
use std::net::Ipv4Addr;

use common::control::{
    encode_auth, encode_challenge, encode_claim, encode_doctor, encode_doctor_report,
    encode_feedback, encode_hello, encode_mysql, encode_ping, encode_pong, encode_reject,
    encode_release, encode_welcome, ArpTarget, Auth, Challenge, DoctorCheck, DoctorQuery,
    DoctorReport, Hello, MysqlEvent, MysqlPacket, Reject, TestFeedback, Welcome,
    FEATURE_PAYLOAD_HASHES, PROTOCOL_VERSION,
};
use common::mysql::packet::write_packet;
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};

use common::mysql::fixtures::{self as fx, hex};

/// `(target, seeds)` for every target.
pub fn all() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("wire", wire()),
        ("control", control()),
        ("mysql_framing", mysql_framing()),
        ("mysql_messages", mysql_messages()),
        ("mysql_sql", mysql_sql()),
        ("pcap_reader", pcap_reader()),
        ("copier_engine", copier_engine()),
        ("intercept_sessions", intercept_sessions()),
        ("config", config()),
        ("tls_event", tls_event()),
    ]
}

fn ip_packet(flags: u8, options: TcpOptions, payload: &[u8]) -> Vec<u8> {
    let repr = SegmentRepr {
        src: Ipv4Addr::new(198, 18, 1, 1),
        dst: Ipv4Addr::new(198, 18, 0, 1),
        src_port: 40000,
        dst_port: 3306,
        seq: SeqNumber(1_000_000),
        ack: SeqNumber(5_000_001),
        flags: TcpFlags(flags),
        window: 502,
        options,
        ip_id: 7,
        ttl: 64,
    };
    let mut buf = vec![0u8; 2048];
    let n = emit_ipv4_tcp(&repr, payload, &mut buf).expect("seed fits");
    buf.truncate(n);
    buf
}

fn syn_options() -> TcpOptions {
    TcpOptions {
        mss: Some(1460),
        window_scale: Some(7),
        sack_permitted: true,
        timestamps: Some((123_456, 0)),
    }
}

fn wire() -> Vec<Vec<u8>> {
    let syn = ip_packet(TcpFlags::SYN, syn_options(), &[]);
    let data = ip_packet(
        TcpFlags::ACK | TcpFlags::PSH,
        TcpOptions::default(),
        &hex(fx::CLI_QUERY),
    );
    let mut frag = data.clone();
    frag[6] = 0x20; // more fragments
    let eth = |ethertypes: &[u16], ip: &[u8]| {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        for (i, t) in ethertypes.iter().enumerate() {
            f.extend_from_slice(&t.to_be_bytes());
            if i + 1 < ethertypes.len() {
                f.extend_from_slice(&[0x00, 0x64]); // VLAN id 100
            }
        }
        f.extend_from_slice(ip);
        f
    };
    let mut out = Vec::new();
    let mut with = |sel: u8, frame: Vec<u8>| {
        let mut s = vec![sel];
        s.extend_from_slice(&frame);
        out.push(s);
    };
    with(0, eth(&[0x0800], &syn));
    with(0, eth(&[0x8100, 0x0800], &data));
    with(0, eth(&[0x88a8, 0x8100, 0x0800], &data));
    with(0, eth(&[0x0800], &frag));
    let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00];
    sll.extend_from_slice(&data);
    with(1, sll);
    let mut sll2 = vec![
        0x08, 0x00, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0,
    ];
    sll2.extend_from_slice(&syn);
    with(2, sll2);
    with(3, data.clone());
    let mut null = 2u32.to_le_bytes().to_vec();
    null.extend_from_slice(&syn);
    with(4, null);
    with(5, syn);
    out
}

fn control() -> Vec<Vec<u8>> {
    let mut from_copier = Vec::new();
    encode_hello(
        &Hello::new("copier-a").with_features(FEATURE_PAYLOAD_HASHES),
        &mut from_copier,
    )
    .unwrap();
    encode_auth(
        &Auth {
            nonce: [3; 32],
            proof: Some([9; 32]),
        },
        &mut from_copier,
    )
    .unwrap();
    let addrs = [
        "198.18.1.1:40000".parse().unwrap(),
        "198.19.0.2:40001".parse().unwrap(),
    ];
    encode_claim(&addrs, &mut from_copier).unwrap();
    encode_ping(42, &mut from_copier).unwrap();
    encode_release(&addrs[..1], &mut from_copier).unwrap();
    encode_doctor(
        &DoctorQuery {
            target: Ipv4Addr::new(198, 18, 0, 2),
            arp: vec![ArpTarget {
                addr: Ipv4Addr::new(198, 18, 0, 1),
                pool: true,
            }],
        },
        &mut from_copier,
    )
    .unwrap();

    let mut from_intercept = Vec::new();
    encode_challenge(
        &Challenge {
            nonce: [5; 32],
            secret_required: true,
        },
        &mut from_intercept,
    )
    .unwrap();
    encode_welcome(
        &Welcome {
            version: PROTOCOL_VERSION,
            name: "intercept".into(),
            payload_prefix: 64,
            mysql_head: Some(16),
            features: FEATURE_PAYLOAD_HASHES,
            proof: Some([11; 32]),
        },
        &mut from_intercept,
    )
    .unwrap();
    let fb = TestFeedback {
        client: addrs[0],
        server: "198.18.0.2:3306".parse().unwrap(),
        seq: 9_000_000,
        ack: 1_000_001,
        flags: TcpFlags(TcpFlags::SYN | TcpFlags::ACK),
        window: 65535,
        options: syn_options(),
        payload_len: 10,
        payload_prefix: b"hello".to_vec(),
    };
    encode_feedback(&[fb.clone(), fb], &mut from_intercept).unwrap();
    let packet = MysqlPacket {
        stream_offset: 0,
        tcp_seq: 9_000_001,
        seq_id: 0,
        len: hex(fx::CLI_GREETING).len() as u32,
        head: hex(fx::CLI_GREETING).into(),
        hash: Some(0x1234_5678_9abc_def0),
        framed_at_us: 17,
    };
    encode_mysql(
        40,
        &[
            MysqlEvent::Packet {
                client: addrs[0],
                packet,
            },
            MysqlEvent::FramingLost {
                client: addrs[1],
                at_seq: 77,
            },
        ],
        &mut from_intercept,
    )
    .unwrap();
    encode_pong(42, &mut from_intercept).unwrap();
    encode_doctor_report(
        &DoctorReport {
            unix_ms: 1_700_000_000_000,
            checks: vec![DoctorCheck::new(1, "arp", "198.18.0.1 answers")],
        },
        &mut from_intercept,
    )
    .unwrap();
    let mut reject = Vec::new();
    encode_reject(&Reject::new("not allowed"), &mut reject).unwrap();

    let mut out = Vec::new();
    for (sel, stream) in [
        (0xfe, &from_copier),
        (0x06, &from_copier),
        (0xff, &from_intercept),
        (0x07, &from_intercept),
        (0xff, &reject),
    ] {
        let mut s = vec![sel];
        s.extend_from_slice(stream);
        out.push(s);
    }
    out
}

/// A client's and a server's MySQL streams, as framed on the wire.
fn streams() -> (Vec<u8>, Vec<u8>) {
    let mut client = Vec::new();
    write_packet(1, &hex(fx::CLI_RESPONSE), &mut client);
    write_packet(0, &hex(fx::CLI_QUERY), &mut client);
    write_packet(0, &hex(fx::SB_PREPARE), &mut client);
    write_packet(0, &hex(fx::SB_EXECUTE_PARAMS), &mut client);
    write_packet(0, &hex(fx::CLI_QUIT), &mut client);
    let mut server = Vec::new();
    write_packet(0, &hex(fx::CLI_GREETING), &mut server);
    write_packet(2, &hex(fx::CLI_LOGIN_OK), &mut server);
    write_packet(1, &[1], &mut server);
    write_packet(2, &hex("0364656604737973"), &mut server);
    write_packet(3, &hex(fx::CLI_EOF), &mut server);
    write_packet(4, &hex("0131"), &mut server);
    write_packet(5, &hex(fx::CLI_EOF), &mut server);
    write_packet(1, &hex(fx::SB_PREPARE_OK_1), &mut server);
    write_packet(1, &hex(fx::WRONG_PW_ERR), &mut server);
    (client, server)
}

fn mysql_framing() -> Vec<Vec<u8>> {
    let (client, server) = streams();
    let mut out = Vec::new();
    for (sel, arg, stream) in [
        (0x00, 5, &client),
        (0x1c, 16, &server),
        (0x01, 5, &server),
        (0x2d, 4, &client),
        (0x02, 0xff, &client),
        (0x0e, 0x03, &server),
        (0x03, 0, &server),
    ] {
        let mut s = vec![sel, arg];
        s.extend_from_slice(stream);
        out.push(s);
    }
    let mut lenenc = vec![0x03, 0];
    lenenc.extend_from_slice(&[0xfc, 0x05, 0x00, b'h', b'e', b'l', b'l', b'o']);
    out.push(lenenc);
    out
}

fn mysql_messages() -> Vec<Vec<u8>> {
    // Capabilities sysbench's Connector/C negotiates (PROTOCOL_41, SECURE_CONNECTION,
    // PLUGIN_AUTH, SESSION_TRACK, ...).
    let caps = 0x01ff_f7ffu32.to_le_bytes();
    let pem = include_bytes!("../../common/src/mysql/testdata/rsa_public_spki.pem");
    let mut more = vec![0x01];
    more.extend_from_slice(pem);
    let cases: Vec<(u8, Vec<u8>)> = vec![
        (0, hex(fx::CLI_GREETING)),
        (0, hex(fx::SSL_GREETING)),
        (0, hex(fx::SB_GREETING)),
        (1, hex(fx::CLI_RESPONSE)),
        (1, hex(fx::CAPI_RESPONSE)),
        (1, hex(fx::NOPW_RESPONSE)),
        (1, hex(fx::SSL_REQUEST)),
        (1, hex(fx::COMPRESS_RESPONSE)),
        (2, hex(fx::CAPI_AUTH_SWITCH)),
        (3, vec![0x01, 0x03]),
        (3, more),
        (4, hex(fx::CLI_LOGIN_OK)),
        (4, hex(fx::CAPI_CHANGE_USER_OK)),
        (5, hex(fx::WRONG_PW_ERR)),
        (5, hex(fx::CLI_EOF)),
        (6, hex(fx::CLI_EOF)),
        (7, hex(fx::CLI_QUERY)),
        (7, hex(fx::CLI_INIT_DB)),
        (7, hex(fx::SB_PREPARE)),
        (7, hex(fx::SB_EXECUTE_PARAMS)),
        (7, hex(fx::SB_EXECUTE_NO_PARAMS)),
        (7, hex(fx::CAPI_RESET_CONNECTION)),
        (8, hex(fx::CAPI_CHANGE_USER)),
        (8, hex(fx::CAPI_CHANGE_USER_NOPW)),
        (9, hex(fx::SB_PREPARE_OK_1)),
        (9, hex(fx::SB_PREPARE_OK_4)),
        (10, hex(fx::SB_EXECUTE_PARAMS)),
        (11, pem.to_vec()),
    ];
    cases
        .into_iter()
        .map(|(sel, p)| {
            let mut s = vec![sel];
            s.extend_from_slice(&caps);
            s.extend_from_slice(&p);
            s
        })
        .collect()
}

fn mysql_sql() -> Vec<Vec<u8>> {
    [
        "SELECT c FROM sbtest1 WHERE id=?",
        "SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN 5 AND 105 ORDER BY c",
        "UPDATE sbtest1 SET k=k+1 WHERE id=42",
        "INSERT INTO t (a, b) VALUES (1, 'x'), (2, \"y\\\"z\")",
        "/*!40101 SET NAMES utf8mb4 */; DELETE FROM t -- comment\nWHERE a IN (1,2,3)",
        "WITH x AS (SELECT 1) SELECT * FROM x FOR UPDATE",
        "CALL p(@a, 0x1F, b'101', 1.5e3, _utf8mb4'é' COLLATE utf8mb4_bin)",
        "select `weird``name` from `db`.`t` # trailing\n",
        "LOAD DATA LOCAL INFILE '/tmp/x' INTO TABLE t",
        "BEGIN; SAVEPOINT s; ROLLBACK TO s; COMMIT",
        "CREATE TEMPORARY TABLE tmp (id INT) /* c */",
        "SET SESSION sql_mode='' , @@autocommit = 0",
    ]
    .iter()
    .enumerate()
    .map(|(i, sql)| {
        let mut s = vec![i as u8 & 3];
        s.extend_from_slice(sql.as_bytes());
        s
    })
    .collect()
}

fn pcap_reader() -> Vec<Vec<u8>> {
    let frames = [
        ip_packet(TcpFlags::SYN, syn_options(), &[]),
        ip_packet(
            TcpFlags::ACK | TcpFlags::PSH,
            TcpOptions::default(),
            &hex(fx::CLI_QUERY),
        ),
    ];
    let mut w = copier::pcapfile::PcapngWriter::new(Vec::new());
    for (i, f) in frames.iter().enumerate() {
        w.write_frame(1_700_000_000_000_000_000 + i as u64, 101, f, f.len() as u32)
            .unwrap();
    }
    let mut eth = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
    eth.extend_from_slice(&frames[1]);
    w.write_frame(1_700_000_001_000_000_000, 1, &eth, eth.len() as u32)
        .unwrap();
    let pcapng = w.finish().unwrap();

    // Classic pcap, both byte orders, micro- and nanosecond magic.
    let pcap = |big: bool, nanos: bool| {
        let u32b = |v: u32| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let u16b = |v: u16| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let mut f = Vec::new();
        f.extend_from_slice(&u32b(if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
        f.extend_from_slice(&u16b(2));
        f.extend_from_slice(&u16b(4));
        f.extend_from_slice(&u32b(0));
        f.extend_from_slice(&u32b(0));
        f.extend_from_slice(&u32b(262_144));
        f.extend_from_slice(&u32b(if nanos { 113 } else { 1 }));
        for (i, frame) in frames.iter().enumerate() {
            let data = if nanos {
                let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00];
                sll.extend_from_slice(frame);
                sll
            } else {
                let mut e = eth[..14].to_vec();
                e.extend_from_slice(frame);
                e
            };
            f.extend_from_slice(&u32b(1_700_000_000 + i as u32));
            f.extend_from_slice(&u32b(500));
            f.extend_from_slice(&u32b(data.len() as u32));
            f.extend_from_slice(&u32b(data.len() as u32 + 4));
            f.extend_from_slice(&data);
        }
        f
    };
    vec![pcapng, pcap(false, false), pcap(true, true)]
}

fn config() -> Vec<Vec<u8>> {
    let shipped = include_str!("../../deploy/copier.toml");
    vec![
        shipped.as_bytes().to_vec(),
        b"target = \"198.18.0.2:3306\"\nport = 3306\n".to_vec(),
        b"client_ip_pool = \"198.19.0.0/24\"\nmax-sessions = 100\n".to_vec(),
    ]
}

/// Records as the probe writes them: a stream start over TCP/IPv4, a HandshakeResponse chunk,
/// a server chunk of a joined stream with no fd (its socket not told), an fd close, a chunk
/// of a Unix-socket stream and one of a TCP/IPv6 stream.
fn tls_event() -> Vec<Vec<u8>> {
    use common::tls_event::{encode, EventKind, PlainDir, SockInfo, TlsEvent};
    let base = TlsEvent {
        kind: EventKind::StreamStart,
        dir: PlainDir::FromClient,
        joined_midway: false,
        fd: Some(47),
        pid: 22560,
        tid: 22601,
        ssl: 0x771c_3c02_0aa0,
        generation: 52_147_907_799_072,
        offset: 0,
        time_ns: 52_147_907_800_000,
        sock: SockInfo::Tcp {
            local: "198.18.0.1:3306".parse().expect("literal address"),
            remote: "198.18.1.2:40001".parse().expect("literal address"),
        },
        data: &[],
    };
    // sysbench's HandshakeResponse as the first packet inside TLS (sequence id 2).
    let payload = hex(fx::SB_RESPONSE);
    let mut login = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    login.push(2);
    login.extend_from_slice(&payload);
    let events = [
        base,
        TlsEvent {
            kind: EventKind::Data,
            data: &login,
            ..base
        },
        TlsEvent {
            kind: EventKind::Data,
            dir: PlainDir::FromServer,
            joined_midway: true,
            fd: None,
            offset: 123,
            sock: SockInfo::Unknown,
            data: b"\x07\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00",
            ..base
        },
        TlsEvent {
            kind: EventKind::FdClosed,
            ..base
        },
        TlsEvent {
            kind: EventKind::Data,
            sock: SockInfo::Unix,
            data: &login,
            ..base
        },
        TlsEvent {
            kind: EventKind::Data,
            dir: PlainDir::FromServer,
            sock: SockInfo::Tcp {
                local: "[2001:db8::1]:3306".parse().expect("literal address"),
                remote: "[::ffff:198.18.1.2]:40001"
                    .parse()
                    .expect("literal address"),
            },
            data: b"\x07\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00",
            ..base
        },
    ];
    events
        .iter()
        .map(|e| {
            let mut b = Vec::new();
            encode(e, &mut b);
            b
        })
        .collect()
}

// ----------------------------------------------------------------- programs for the engines

/// Writes [`copier_engine`](crate::copier_engine) programs.
struct EngineProgram(Vec<u8>);

const CLIENT: u8 = 0x00;
const PROD: u8 = 0x04;
const FEEDBACK: u8 = 0x06;
const MYSQL: u8 = 0x09;
const TICK: u8 = 0x0c;
const DEADLINE: u8 = 0x0e;

impl EngineProgram {
    fn new(setup: u8) -> Self {
        Self(vec![setup])
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn syn_options(&mut self) {
        self.0.push(0x0f);
        self.u16(1460);
        self.0.push(7);
        self.0.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    }
    /// A captured segment; `seq`/`ack` are offsets from the side's ISN. Payloads longer than
    /// 255 bytes are cut into segments.
    fn segment(&mut self, op: u8, flags: u8, seq: u16, ack: u16, payload: &[u8]) {
        let mut seq = seq;
        let chunks: Vec<&[u8]> = if payload.is_empty() {
            vec![&[]]
        } else {
            payload.chunks(255).collect()
        };
        for c in chunks {
            self.0.extend_from_slice(&[op, 0, flags]);
            self.u16(seq);
            self.u16(ack);
            if flags & TcpFlags::SYN != 0 {
                self.syn_options();
            }
            self.0.push(c.len() as u8);
            self.0.extend_from_slice(c);
            self.u16(502);
            seq += c.len() as u16;
        }
    }
    fn feedback(&mut self, flags: u8, seq: u16, payload: &[u8]) {
        self.0.extend_from_slice(&[FEEDBACK, 0, flags]);
        self.u16(seq);
        self.0.push(0);
        if flags & TcpFlags::SYN != 0 {
            self.syn_options();
        }
        self.0.push(payload.len() as u8);
        self.0.extend_from_slice(payload);
        self.u16(65535);
    }
    fn mysql(&mut self, seq_id: u8, payload: &[u8]) {
        self.0.extend_from_slice(&[MYSQL, 0, payload.len() as u8]);
        self.0.extend_from_slice(payload);
        self.0.push(seq_id);
    }
    fn op(&mut self, op: u8) {
        self.0.push(op);
    }
    fn tick(&mut self, ms: u16) {
        self.0.push(TICK);
        self.u16(ms);
    }
}

fn copier_engine() -> Vec<Vec<u8>> {
    const SA: u8 = TcpFlags::SYN | TcpFlags::ACK;
    const A: u8 = TcpFlags::ACK;
    const PA: u8 = TcpFlags::PSH | TcpFlags::ACK;
    const FA: u8 = TcpFlags::FIN | TcpFlags::ACK;
    let framed = |seq: u8, fixture: &str| {
        let mut v = Vec::new();
        write_packet(seq, &hex(fixture), &mut v);
        v
    };
    let greeting = framed(0, fx::CLI_GREETING);
    let login = framed(1, fx::CLI_RESPONSE);
    let login_ok = framed(2, fx::CLI_LOGIN_OK);
    let query = framed(0, fx::CLI_QUERY);
    let prepare = framed(0, fx::SB_PREPARE);
    let prepare_ok = framed(1, fx::SB_PREPARE_OK_1);
    let execute = framed(0, fx::SB_EXECUTE_PARAMS);

    let session = |setup: u8| {
        let mut p = EngineProgram::new(setup);
        // Handshake as captured on the production host, then the test server's SYN-ACK.
        p.segment(CLIENT, TcpFlags::SYN, 0, 0, &[]);
        p.segment(PROD, SA, 0, 1, &[]);
        p.segment(CLIENT, A, 1, 1, &[]);
        p.feedback(SA, 0, &[]);
        // Greetings from both servers, the login, both OKs.
        let g = greeting.len() as u16;
        p.segment(PROD, PA, 1, 1, &greeting);
        p.mysql(0, &hex(fx::CLI_GREETING));
        p.feedback(PA, 1, &greeting[..greeting.len().min(255)]);
        p.segment(CLIENT, PA, 1, 1 + g, &login);
        let l = login.len() as u16;
        p.feedback(A, 1 + g, &[]);
        p.segment(PROD, PA, 1 + g, 1 + l, &login_ok);
        p.mysql(2, &hex(fx::CLI_LOGIN_OK));
        p.feedback(PA, 1 + g, &login_ok);
        let mut c = 1 + l;
        let mut s = 1 + g + login_ok.len() as u16;
        for (cmd, reply, id) in [
            (&query, &login_ok, 1),
            (&prepare, &prepare_ok, 1),
            (&execute, &login_ok, 1),
        ] {
            p.segment(CLIENT, PA, c, s, cmd);
            c += cmd.len() as u16;
            p.feedback(A, s, &[]);
            p.segment(PROD, PA, s, c, reply);
            p.mysql(id, &reply[4..]);
            s += reply.len() as u16;
        }
        p.tick(200);
        p.op(DEADLINE);
        p.segment(CLIENT, FA, c, s, &[]);
        p.feedback(FA, s, &[]);
        p.segment(PROD, FA, s, c + 1, &[]);
        p.tick(1000);
        p.op(DEADLINE);
        p.0
    };
    let mut out = vec![session(0x00), session(0x20), session(0x60), session(0x2d)];
    // Mid-stream pickup: no SYN, data first.
    let mut p = EngineProgram::new(0x21);
    p.segment(CLIENT, PA, 100, 100, &query);
    p.feedback(SA, 0, &[]);
    p.mysql(0, &hex(fx::CLI_GREETING));
    p.tick(5000);
    p.op(DEADLINE);
    out.push(p.0);
    out
}

fn intercept_sessions() -> Vec<Vec<u8>> {
    let (_, server) = streams();
    let mut out = Vec::new();
    for setup in [0x10u8, 0x90, 0x00] {
        let mut p = vec![setup];
        // SYN-ACK to client 0, then the server's stream in segments of 100 bytes, the third
        // one late (held until the gap fills), then FIN.
        p.extend_from_slice(&[0x00, 0, 0, 0, 0]);
        let chunks: Vec<&[u8]> = server.chunks(100).collect();
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        if order.len() > 3 {
            order.swap(2, 3);
        }
        for i in order {
            let off = (i * 100) as u16;
            p.extend_from_slice(&[0x01, 0]);
            p.extend_from_slice(&off.to_le_bytes());
            p.push(chunks[i].len() as u8);
            p.extend_from_slice(chunks[i]);
        }
        let end = server.len() as u16;
        p.extend_from_slice(&[0x04, 0, TcpFlags::FIN | TcpFlags::ACK]);
        p.extend_from_slice(&end.to_le_bytes());
        p.push(0);
        p.extend_from_slice(&[0x05, 20, 0]);
        out.push(p);
    }
    out
}
