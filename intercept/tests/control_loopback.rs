//! The control channel end to end on 127.0.0.1: the copier's `ControlClient` against intercept's
//! control server, relay and MySQL framing, with reply packets injected through a channel
//! instead of pcap (no root, no capture). Only loopback addresses are ever contacted.

use common::seq::SeqNumber;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::auth::Secret;
use common::control::{
    encode_auth, encode_hello, Auth, FrameDecoder, Hello, InterceptMessage, MysqlEvent,
    TestFeedback,
};
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};
use copier::control_client::{
    ClientConfig, ControlClient, ControlHandle, Relayed, RelayedReceiver,
};
use intercept::pump::{self, ChannelSource, PumpConfig, ReplyPath};
use intercept::relay::Relay;
use intercept::server::{ControlServer, ServerConfig};
use intercept::sessions::SessionConfig;

const WAIT: Duration = Duration::from_secs(10);

/// A control server and a running capture loop fed by `feed`.
struct Intercept {
    server: ControlServer,
    /// Raw IPv4 reply packets, as the capture would see them.
    feed: Sender<Vec<u8>>,
    stop: Arc<AtomicBool>,
    pump: Option<JoinHandle<()>>,
}

impl Intercept {
    /// `--protocol tcp`: feedback only.
    fn start(config: ServerConfig) -> Self {
        Self::start_with(config, None)
    }

    /// `--protocol mysql`, with the default framing settings.
    fn start_mysql() -> Self {
        Self::start_with(
            ServerConfig {
                payload_prefix: 0,
                mysql_head: Some(16),
                ..ServerConfig::default()
            },
            Some(SessionConfig::default()),
        )
    }

    fn start_with(config: ServerConfig, mysql: Option<SessionConfig>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (events_tx, events_rx) = mpsc::channel();
        let prefix = usize::from(config.payload_prefix);
        let server = ControlServer::start(listener, config, events_tx).unwrap();
        let (feed, feed_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let pump = {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut source = ChannelSource::new(feed_rx);
                let mut path = ReplyPath::new(Relay::new(64), prefix, mysql);
                let config = PumpConfig {
                    idle_wait: Duration::from_millis(10),
                    status_interval: None,
                    gather: Duration::ZERO,
                };
                let _ = pump::run(&mut source, &mut path, &events_rx, &stop, config, |_, _| {});
            })
        };
        Intercept {
            server,
            feed,
            stop,
            pump: Some(pump),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn send(&self, client: SocketAddrV4, seq: u32) {
        let fb = feedback(client, seq);
        self.feed.send(packet_of(&fb, &fb.payload_prefix)).unwrap();
    }

    /// One reply segment from the test server to `client`.
    fn reply(&self, client: SocketAddrV4, seq: u32, flags: u8, payload: &[u8]) {
        let fb = TestFeedback {
            seq,
            flags: TcpFlags(flags),
            payload_len: payload.len() as u32,
            ..feedback(client, 0)
        };
        self.feed.send(packet_of(&fb, payload)).unwrap();
    }

    /// Waits until `n` claimed addresses have reached the relay's queue: feedback sent after
    /// this is routed with those claims applied.
    fn await_claims(&self, n: u64) {
        wait_for(
            || self.server.stats().claimed_addrs >= n,
            "claims to arrive",
        );
    }

    fn await_releases(&self, n: u64) {
        wait_for(
            || self.server.stats().released_addrs >= n,
            "releases to arrive",
        );
    }
}

impl Drop for Intercept {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(p) = self.pump.take() {
            let _ = p.join();
        }
    }
}

fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

fn client_addr(n: u8) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, n), 40000)
}

fn feedback(client: SocketAddrV4, seq: u32) -> TestFeedback {
    TestFeedback {
        client,
        server: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306),
        seq,
        ack: 1,
        flags: TcpFlags(TcpFlags::ACK | TcpFlags::PSH),
        window: 502,
        options: TcpOptions {
            timestamps: Some((5, 6)),
            ..TcpOptions::default()
        },
        payload_len: 5,
        payload_prefix: b"hello".to_vec(),
    }
}

/// The IPv4 packet whose capture yields `fb` (with `payload` as its whole payload).
fn packet_of(fb: &TestFeedback, payload: &[u8]) -> Vec<u8> {
    let repr = SegmentRepr {
        src: *fb.server.ip(),
        dst: *fb.client.ip(),
        src_port: fb.server.port(),
        dst_port: fb.client.port(),
        seq: SeqNumber(fb.seq),
        ack: SeqNumber(fb.ack),
        flags: fb.flags,
        window: fb.window,
        options: fb.options,
        ip_id: 0,
        ttl: 64,
    };
    let mut buf = vec![0u8; 65_536];
    let n = emit_ipv4_tcp(&repr, payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// A copier's control client plus what its engine would see.
struct Copier {
    handle: ControlHandle,
    rx: Engine,
    wakes: Arc<AtomicUsize>,
}

/// What a copier's engine thread does with its receiver: it reads the connection (and so
/// notices its end), here on a thread of its own that passes each batch on, in order.
struct Engine {
    relayed: mpsc::Receiver<Relayed>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    fn start(mut rx: RelayedReceiver) -> Self {
        let (tx, relayed) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(r) => {
                        if tx.send(r).is_err() {
                            break;
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
        });
        Engine {
            relayed,
            stop,
            thread: Some(thread),
        }
    }

    fn recv_timeout(&self, d: Duration) -> Result<Relayed, mpsc::RecvTimeoutError> {
        self.relayed.recv_timeout(d)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Copier {
    fn connect(addr: SocketAddr, name: &str) -> Self {
        Self::connect_with(ClientConfig {
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(200),
            ..ClientConfig::new(addr, Hello::new(name), None)
        })
    }

    fn connect_with(config: ClientConfig) -> Self {
        let wakes = Arc::new(AtomicUsize::new(0));
        let w = wakes.clone();
        let (handle, rx) = ControlClient::spawn_with(config, move || {
            w.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let c = Copier {
            handle,
            rx: Engine::start(rx),
            wakes,
        };
        wait_for(|| c.handle.stats().connected, "the copier to connect");
        c
    }

    /// The next `n` feedback items, in order.
    fn recv(&self, n: usize) -> Vec<(SocketAddrV4, u32)> {
        let mut got = Vec::new();
        let deadline = Instant::now() + WAIT;
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Relayed::Feedback(batch)) => got.extend(batch.iter().map(|f| (f.client, f.seq))),
                Ok(Relayed::Mysql(..)) => {}
                Err(_) => panic!("timed out: got {got:?}, wanted {n} items"),
            }
        }
        got
    }
}

#[test]
fn claimed_feedback_reaches_its_owner_and_unclaimed_reaches_everyone() {
    let icpt = Intercept::start(ServerConfig::default());
    let a = Copier::connect(icpt.addr(), "copier-a");
    let b = Copier::connect(icpt.addr(), "copier-b");
    assert_eq!(
        a.handle.welcome().map(|w| w.payload_prefix),
        Some(64),
        "the Welcome tells the prefix length"
    );

    a.handle.claim(client_addr(10));
    b.handle.claim(client_addr(11));
    icpt.await_claims(2);

    icpt.send(client_addr(10), 1);
    icpt.send(client_addr(11), 2);
    // Unclaimed (a SYN-ACK racing its Claim): everyone gets it. Sent last, it also proves
    // that nothing for the other copier's address arrived before it.
    icpt.send(client_addr(99), 3);

    assert_eq!(a.recv(2), [(client_addr(10), 1), (client_addr(99), 3)]);
    assert_eq!(b.recv(2), [(client_addr(11), 2), (client_addr(99), 3)]);
    // The engine was woken for the connection it reads.
    wait_for(
        || a.wakes.load(Ordering::SeqCst) > 0,
        "the engine to be woken",
    );

    let sa = a.handle.stats();
    assert_eq!(sa.feedback_received, 2);
    assert_eq!(sa.claimed, 1);
    assert_eq!(sa.reconnects, 0);
}

#[test]
fn the_full_feedback_survives_the_trip() {
    let icpt = Intercept::start(ServerConfig::default());
    let a = Copier::connect(icpt.addr(), "copier-a");
    a.handle.claim(client_addr(10));
    icpt.await_claims(1);
    icpt.send(client_addr(10), 77);
    let batch = a.rx.recv_timeout(WAIT).unwrap();
    assert_eq!(
        batch,
        Relayed::Feedback(vec![feedback(client_addr(10), 77)])
    );
}

/// What a copier's engine thread sees, in order.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Segment(SocketAddrV4, u32),
    Packet(SocketAddrV4, u64, u8, Vec<u8>),
    Lost(SocketAddrV4, u32),
}

fn seen(rx: &Engine, until: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !until(&got) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Relayed::Feedback(b)) => {
                got.extend(b.iter().map(|f| Seen::Segment(f.client, f.seq)))
            }
            Ok(Relayed::Mysql(b, _, _, _)) => got.extend(b.into_iter().map(|e| match e {
                MysqlEvent::Packet { client, packet: p } => {
                    Seen::Packet(client, p.stream_offset, p.seq_id, p.head.to_vec())
                }
                MysqlEvent::FramingLost { client, at_seq } => Seen::Lost(client, at_seq),
                MysqlEvent::FramingResumed { .. } => unreachable!("no stream here is resumed"),
                MysqlEvent::Rows { .. } => unreachable!("these copiers do not ask for runs"),
            })),
            Err(_) => panic!("timed out; so far: {got:#?}"),
        }
    }
    got
}

fn mysql_packet(seq_id: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    v.push(seq_id);
    v.extend_from_slice(payload);
    v
}

#[test]
fn mysql_events_reach_the_claiming_copier_after_their_segments_feedback() {
    let icpt = Intercept::start_mysql();
    let a = Copier::connect(icpt.addr(), "copier-a");
    let b = Copier::connect(icpt.addr(), "copier-b");
    let w = a.handle.welcome().unwrap();
    assert_eq!((w.payload_prefix, w.mysql_head), (0, Some(16)));

    let c = client_addr(10);
    a.handle.claim(c);
    icpt.await_claims(1);

    const ISN: u32 = 0xffff_fff0; // the stream wraps the sequence space
    let greeting = mysql_packet(0, &[0x0a; 90]);
    let ok = mysql_packet(2, b"\0\0\0\x02\0\0\0");
    let col_count = mysql_packet(1, b"\x01");
    let row = mysql_packet(3, &[7; 40]);
    // Segments as a busy server sends them: the second one carries the auth OK, the column
    // count and the first two bytes of the next header, which straddles into the third.
    let rest = [ok.as_slice(), &col_count, &row].concat();
    let cut = ok.len() + col_count.len() + 2;
    let segs: [(u32, u8, &[u8]); 4] = [
        (ISN, (TcpFlags::SYN | TcpFlags::ACK), b""),
        (
            ISN.wrapping_add(1),
            TcpFlags::ACK | TcpFlags::PSH,
            &greeting,
        ),
        (
            ISN.wrapping_add(1 + greeting.len() as u32),
            TcpFlags::ACK | TcpFlags::PSH,
            &rest[..cut],
        ),
        (
            ISN.wrapping_add(1 + (greeting.len() + cut) as u32),
            TcpFlags::ACK | TcpFlags::PSH,
            &rest[cut..],
        ),
    ];
    for (seq, flags, payload) in segs {
        icpt.reply(c, seq, flags, payload);
    }
    // Data of a connection intercept never saw open (nobody claims it): broadcast to both.
    let other = client_addr(99);
    icpt.reply(other, 5000, TcpFlags::ACK, b"midstream");

    let got = seen(&a.rx, |g| g.iter().any(|s| matches!(s, Seen::Lost(..))));
    let off_ok = greeting.len() as u64;
    let off_cc = off_ok + ok.len() as u64;
    let off_row = off_cc + col_count.len() as u64;
    let want_packets = [
        Seen::Packet(c, 0, 0, greeting[4..].to_vec()),
        Seen::Packet(c, off_ok, 2, ok[4..].to_vec()),
        Seen::Packet(c, off_cc, 1, col_count[4..].to_vec()),
        Seen::Packet(c, off_row, 3, row[4..].to_vec()),
    ];
    let packets: Vec<_> = got
        .iter()
        .filter(|s| matches!(s, Seen::Packet(..)))
        .collect();
    assert_eq!(packets, want_packets.iter().collect::<Vec<_>>());
    // Each packet comes after the feedback of the segment that completed it.
    let pos = |x: &Seen| got.iter().position(|s| s == x).unwrap();
    let seg = |i: usize| pos(&Seen::Segment(c, segs[i].0));
    for (packet, segment) in want_packets.iter().zip([1, 2, 2, 3]) {
        assert!(
            seg(segment) < pos(packet),
            "{packet:?} before its segment: {got:#?}"
        );
    }
    assert!(seg(0) < seg(1) && seg(1) < seg(2) && seg(2) < seg(3));
    assert_eq!(pos(&Seen::Lost(other, 5000)), got.len() - 1);

    // The other copier saw nothing of the claimed session, only the broadcast.
    let got_b = seen(&b.rx, |g| g.iter().any(|s| matches!(s, Seen::Lost(..))));
    assert_eq!(got_b, [Seen::Segment(other, 5000), Seen::Lost(other, 5000)]);
    let s = a.handle.stats();
    assert_eq!(s.mysql_received, 5);
}

#[test]
fn release_and_disconnect_give_addresses_back_to_broadcast() {
    let icpt = Intercept::start(ServerConfig::default());
    let a = Copier::connect(icpt.addr(), "copier-a");
    let b = Copier::connect(icpt.addr(), "copier-b");
    a.handle.claim(client_addr(10));
    a.handle.claim(client_addr(12));
    icpt.await_claims(2);

    a.handle.release(client_addr(10));
    icpt.await_releases(1);
    icpt.send(client_addr(10), 1);
    assert_eq!(b.recv(1), [(client_addr(10), 1)], "released: broadcast");
    assert_eq!(a.recv(1), [(client_addr(10), 1)]);

    // A's remaining claim dies with its connection.
    a.handle.shutdown();
    drop(a.rx);
    wait_for(
        || icpt.server.stats().closed >= 1,
        "the disconnect to reach the relay",
    );
    icpt.send(client_addr(12), 2);
    assert_eq!(b.recv(1), [(client_addr(12), 2)]);
}

#[test]
fn a_garbage_frame_closes_only_that_connection() {
    let icpt = Intercept::start(ServerConfig::default());
    let a = Copier::connect(icpt.addr(), "copier-a");
    a.handle.claim(client_addr(10));
    icpt.await_claims(1);

    let mut bad = TcpStream::connect(icpt.addr()).unwrap();
    bad.set_read_timeout(Some(WAIT)).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = bad.read(&mut buf).unwrap_or(0);
    assert_eq!(
        n, 0,
        "the server closed the garbage connection without a reply"
    );
    wait_for(
        || icpt.server.stats().garbage >= 1,
        "the bad frame to be counted",
    );

    // A welcomed copier that later sends garbage is cut off too, and only it.
    let mut rogue = TcpStream::connect(icpt.addr()).unwrap();
    rogue.set_read_timeout(Some(WAIT)).unwrap();
    let mut dec = FrameDecoder::<InterceptMessage>::new();
    let welcome = handshake_raw(&mut rogue, &mut dec, "rogue", None);
    assert!(matches!(welcome, Some(InterceptMessage::Welcome(_))));
    rogue.write_all(&[0, 0, 0, 1, 0x77]).unwrap();
    wait_for(
        || icpt.server.stats().garbage >= 2,
        "the rogue frame to be counted",
    );

    icpt.send(client_addr(10), 5);
    assert_eq!(a.recv(1), [(client_addr(10), 5)]);
    assert!(a.handle.stats().connected);
    assert_eq!(a.handle.stats().reconnects, 0);
}

/// Hello, then an Auth answering the Challenge (with `secret`'s proof); the answer to that.
fn handshake_raw(
    s: &mut TcpStream,
    dec: &mut FrameDecoder<InterceptMessage>,
    name: &str,
    secret: Option<&Secret>,
) -> Option<InterceptMessage> {
    let mut out = Vec::new();
    encode_hello(&Hello::new(name), &mut out).unwrap();
    s.write_all(&out).unwrap();
    let ch = match read_one(s, dec)? {
        InterceptMessage::Challenge(c) => c,
        other => return Some(other),
    };
    let nonce = [9u8; common::auth::NONCE_LEN];
    let auth = Auth {
        nonce,
        proof: secret.map(|k| k.copier_proof(&ch.nonce, &nonce)),
    };
    out.clear();
    encode_auth(&auth, &mut out).unwrap();
    s.write_all(&out).unwrap();
    read_one(s, dec)
}

fn read_one(
    s: &mut TcpStream,
    dec: &mut FrameDecoder<InterceptMessage>,
) -> Option<InterceptMessage> {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(m) = dec.next_message().unwrap() {
            return Some(m);
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => dec.feed(&buf[..n]),
        }
    }
}

#[test]
fn wrong_version_and_wrong_secret_are_rejected_with_a_reason() {
    let key = Secret::new(b"s3cret-s3cret-s3cret").unwrap();
    let icpt = Intercept::start(ServerConfig {
        secret: Some(key.clone()),
        ..ServerConfig::default()
    });

    let mut old = TcpStream::connect(icpt.addr()).unwrap();
    old.set_read_timeout(Some(WAIT)).unwrap();
    let mut out = Vec::new();
    let hello = Hello {
        version: 0,
        ..Hello::new("old-copier")
    };
    encode_hello(&hello, &mut out).unwrap();
    old.write_all(&out).unwrap();
    let mut dec = FrameDecoder::<InterceptMessage>::new();
    match read_one(&mut old, &mut dec) {
        Some(InterceptMessage::Reject(r)) => {
            assert!(
                r.reason.contains("version 0") && r.reason.contains("same tcpshadow release"),
                "{}",
                r.reason
            )
        }
        other => panic!("expected a Reject, got {other:?}"),
    }

    let wrong = ClientConfig {
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..ClientConfig::new(
            icpt.addr(),
            Hello::new("c"),
            Some(Secret::new(b"a guess of a secret").unwrap()),
        )
    };
    let (handle, _rx) = ControlClient::spawn_with(wrong, || {}).unwrap();
    wait_for(|| handle.stats().rejects >= 2, "rejections");
    assert!(!handle.stats().connected);
    let why = handle.refused_before_welcome().unwrap();
    assert!(why.contains("bad secret"), "{why}");
    handle.shutdown();

    let none = ClientConfig {
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..ClientConfig::new(icpt.addr(), Hello::new("c"), None)
    };
    let (handle, _rx) = ControlClient::spawn_with(none, || {}).unwrap();
    wait_for(|| handle.stats().rejects >= 1, "rejection");
    let why = handle.refused_before_welcome().unwrap();
    assert!(why.contains("--secret-file"), "{why}");
    handle.shutdown();

    let right = Copier::connect_with(ClientConfig::new(icpt.addr(), Hello::new("c"), Some(key)));
    assert!(right.handle.stats().connected);
    let st = icpt.server.stats();
    assert_eq!(st.refused_version, 1);
    assert!(
        st.refused_bad_secret >= 2 && st.refused_no_secret >= 1,
        "{st:?}"
    );
}

#[test]
fn a_copier_with_a_secret_refuses_an_intercept_without_one() {
    let icpt = Intercept::start(ServerConfig::default());
    let cfg = ClientConfig {
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..ClientConfig::new(
            icpt.addr(),
            Hello::new("c"),
            Some(Secret::new(b"only the copier has it").unwrap()),
        )
    };
    let (handle, _rx) = ControlClient::spawn_with(cfg, || {}).unwrap();
    wait_for(|| handle.stats().rejects >= 1, "refusal");
    let why = handle.refused_before_welcome().unwrap();
    assert!(why.contains("does not check a secret"), "{why}");
    handle.shutdown();
}

/// Forwards TCP between the client and the server so a test can cut connections.
struct Proxy {
    addr: SocketAddr,
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let live = Arc::new(Mutex::new(Vec::new()));
        let l = live.clone();
        thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { return };
                let Ok(outbound) = TcpStream::connect(target) else {
                    continue;
                };
                {
                    let mut l = l.lock().unwrap();
                    l.push(inbound.try_clone().unwrap());
                    l.push(outbound.try_clone().unwrap());
                }
                for (mut from, mut to) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { addr, live }
    }

    fn cut(&self) {
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[test]
fn a_reconnecting_copier_resumes_its_claims() {
    let icpt = Intercept::start(ServerConfig::default());
    let proxy = Proxy::start(icpt.addr());
    let a = Copier::connect(proxy.addr, "copier-a");
    let b = Copier::connect(icpt.addr(), "copier-b");
    a.handle.claim(client_addr(10));
    a.handle.claim(client_addr(11));
    icpt.await_claims(2);

    proxy.cut();
    wait_for(
        || a.handle.stats().reconnects >= 1,
        "the copier to reconnect",
    );
    wait_for(|| a.handle.stats().connected, "the copier to be up again");
    // The two claims again, re-sent by the client on its own.
    icpt.await_claims(4);

    icpt.send(client_addr(10), 1);
    icpt.send(client_addr(11), 2);
    icpt.send(client_addr(50), 3);
    assert_eq!(
        a.recv(3),
        [
            (client_addr(10), 1),
            (client_addr(11), 2),
            (client_addr(50), 3)
        ]
    );
    assert_eq!(
        b.recv(1),
        [(client_addr(50), 3)],
        "claims were routed to their owner again, not broadcast"
    );

    // Claims made while disconnected are sent on the next connection too.
    proxy.cut();
    a.handle.claim(client_addr(12));
    wait_for(|| a.handle.stats().reconnects >= 2, "the second reconnect");
    icpt.await_claims(7);
    icpt.send(client_addr(12), 4);
    icpt.send(client_addr(51), 5);
    assert_eq!(a.recv(2), [(client_addr(12), 4), (client_addr(51), 5)]);
    assert_eq!(b.recv(1), [(client_addr(51), 5)]);
}

#[test]
fn a_copier_that_comes_up_before_intercept_connects_when_it_appears() {
    // Reserve a port, close it, and point the client at it before anything listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let config = ClientConfig {
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        ..ClientConfig::new(addr, Hello::new("early"), None)
    };
    let (handle, rx) = ControlClient::spawn_with(config, || {}).unwrap();
    handle.claim(client_addr(10));
    wait_for(|| handle.stats().connect_failures >= 2, "failed attempts");

    let Ok(listener) = TcpListener::bind(addr) else {
        // Someone else took the port meanwhile; nothing to test on this run.
        return;
    };
    let (events_tx, events_rx) = mpsc::channel();
    let server = ControlServer::start(listener, ServerConfig::default(), events_tx).unwrap();
    wait_for(|| handle.stats().connected, "the late connect");
    wait_for(|| server.stats().claimed_addrs >= 1, "the early claim");
    match events_rx.recv_timeout(WAIT).unwrap() {
        intercept::relay::RelayEvent::Connected { name, .. } => assert_eq!(name, "early"),
        other => panic!("unexpected {other:?}"),
    }
    match events_rx.recv_timeout(WAIT).unwrap() {
        intercept::relay::RelayEvent::Claim { addrs, .. } => assert_eq!(addrs, [client_addr(10)]),
        other => panic!("unexpected {other:?}"),
    }
    drop(rx);
    handle.shutdown();
}

#[test]
fn pings_keep_a_quiet_connection_alive() {
    let icpt = Intercept::start(ServerConfig {
        idle_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    // Nothing is claimed: the idle period is the one that must keep the connection alive.
    let a = Copier::connect_with(ClientConfig {
        ping_interval: Duration::from_millis(50),
        idle_ping_interval: Duration::from_millis(100),
        ..ClientConfig::new(icpt.addr(), Hello::new("quiet"), None)
    });
    thread::sleep(Duration::from_millis(800));
    let s = a.handle.stats();
    assert!(s.connected);
    assert_eq!(s.reconnects, 0);
    assert!(s.frames_in >= 5, "pongs came back: {s:?}");

    // A peer that says Hello and then nothing is closed after the idle timeout.
    let mut silent = TcpStream::connect(icpt.addr()).unwrap();
    silent.set_read_timeout(Some(WAIT)).unwrap();
    let mut dec = FrameDecoder::<InterceptMessage>::new();
    assert!(matches!(
        handshake_raw(&mut silent, &mut dec, "silent", None),
        Some(InterceptMessage::Welcome(_))
    ));
    assert_eq!(read_one(&mut silent, &mut dec), None, "closed");
    wait_for(
        || icpt.server.stats().timeouts == 1,
        "the timeout to be counted",
    );
}

/// Issue 8, intercept restarted: the test server's replies that arrive before any copier is
/// back must not use up the one `FramingLost` of a session intercept now sees mid-stream, or
/// the copier would wait for answers that never come.
#[test]
fn a_restarted_intercept_tells_the_returning_copier_that_framing_is_lost() {
    let icpt = Intercept::start_mysql();
    let c = client_addr(20);
    // Replies of a session that was open before this intercept started; nobody connected.
    icpt.reply(c, 7000, TcpFlags::ACK | TcpFlags::PSH, b"mid-reply");
    // Give the pump time to handle it before the copier is there (if it has not, the copier
    // hears about the first reply instead, which is as good).
    thread::sleep(Duration::from_millis(100));
    let a = Copier::connect(icpt.addr(), "copier-a");
    a.handle.claim(c);
    icpt.await_claims(1);
    icpt.reply(c, 7009, TcpFlags::ACK | TcpFlags::PSH, b"more");
    let got = seen(&a.rx, |g| g.iter().any(|s| matches!(s, Seen::Lost(..))));
    assert!(
        got.iter().any(|s| matches!(s, Seen::Lost(x, _) if *x == c)),
        "the copier must hear that framing is lost: {got:#?}"
    );
}
