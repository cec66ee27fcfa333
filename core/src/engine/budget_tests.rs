//! The memory budget (`budget.rs`) with a fake clock: what is charged, when new sessions are
//! refused, which sessions are shed, and that the total never stays over the bound.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use common::clock::Instant;
use common::control::TestFeedback;
use common::wire::{parse_ipv4_tcp, TcpFlags, TcpOptions};

use super::tests::{packet, parse_sent, Sent, C, PROD, T, TARGET};
use super::{CloseReason, Engine, EngineConfig, EngineEvent, MemoryBudget, SESSION_FIXED_BYTES};

const SYN: u8 = TcpFlags::SYN;
const ACK: u8 = TcpFlags::ACK;
const PSH: u8 = TcpFlags::PSH;
const FIN: u8 = TcpFlags::FIN;
const RST: u8 = TcpFlags::RST;

fn client(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), port)
}

struct B {
    e: Engine,
    now: Instant,
}

impl B {
    fn new(max_memory: usize) -> Self {
        let mut cfg = EngineConfig::new(3306, TARGET);
        cfg.max_memory = max_memory;
        Self {
            e: Engine::new(cfg),
            now: Instant::from_nanos(1_000_000_000),
        }
    }

    fn capture(&mut self, bytes: &[u8]) {
        self.e
            .on_captured(self.now, &parse_ipv4_tcp(bytes).unwrap());
        self.check_bound();
    }

    fn check_bound(&self) {
        let used = self.e.memory_used();
        assert!(
            used <= self.e.config().max_memory,
            "{used} charged, budget {}",
            self.e.config().max_memory
        );
        assert_eq!(self.e.stats().memory_bytes, used as u64);
    }

    fn drain(&mut self) -> Vec<Sent> {
        let mut buf = vec![0u8; self.e.transmit_buffer_len()];
        let mut out = Vec::new();
        while let Some(n) = self.e.poll_transmit(self.now, &mut buf) {
            out.push(parse_sent(&buf[..n]));
        }
        out
    }

    /// Client SYN, test SYN-ACK (window `window`), client ACK: an established session.
    fn open(&mut self, port: u16, window: u16) {
        let c = client(port);
        self.capture(&packet(c, PROD, C, 0, SYN, b"", Default::default()));
        self.drain();
        self.e.on_feedback(
            self.now,
            &TestFeedback {
                client: c,
                server: TARGET,
                seq: T,
                ack: C.wrapping_add(1),
                flags: TcpFlags(SYN | ACK),
                window,
                options: TcpOptions {
                    mss: Some(1460),
                    ..Default::default()
                },
                payload_len: 0,
                payload_prefix: Vec::new(),
            },
        );
        self.check_bound();
        self.capture(&packet(c, PROD, C + 1, 1, ACK, b"", Default::default()));
        self.drain();
    }

    /// `n` bytes from the client of `port`, starting `at` bytes into its stream.
    fn data(&mut self, port: u16, at: u32, n: usize) {
        let seg = vec![b'x'; n];
        self.capture(&packet(
            client(port),
            PROD,
            C.wrapping_add(1).wrapping_add(at),
            1,
            ACK | PSH,
            &seg,
            Default::default(),
        ));
    }

    fn events(&mut self) -> Vec<EngineEvent> {
        std::iter::from_fn(|| self.e.poll_event()).collect()
    }
}

#[test]
fn fixed_size_and_buffers_are_charged_and_given_back() {
    let mut b = B::new(256 << 20);
    assert_eq!(b.e.memory_used(), 0);
    b.open(40000, 65535);
    let idle = b.e.memory_used();
    assert!(
        (SESSION_FIXED_BYTES..SESSION_FIXED_BYTES + 1024).contains(&idle),
        "an idle session costs its fixed size: {idle}"
    );
    b.open(40001, 65535);
    assert_eq!(b.e.memory_used(), 2 * idle);
    // Bytes sent but not acknowledged stay in the send queue: charged by capacity.
    b.data(40000, 0, 1000);
    b.data(40000, 1000, 1000);
    let busy = b.e.memory_used();
    assert!(busy >= 2 * idle + 2000, "{busy}");
    // The session is aborted (a client reset with a byte missing before it): its buffers go
    // at once, its fixed size when it is forgotten.
    b.capture(&packet(
        client(40000),
        PROD,
        C.wrapping_add(2002),
        1,
        RST,
        b"",
        Default::default(),
    ));
    assert_eq!(b.e.memory_used(), 2 * idle);
    b.now = b.now + Duration::from_secs(11);
    b.e.on_timeout(b.now);
    assert_eq!(b.e.memory_used(), idle);
    assert_eq!(b.e.stats().memory_peak_bytes, busy as u64);
}

#[test]
fn new_sessions_are_refused_when_their_fixed_size_does_not_fit() {
    let per = {
        let mut b = B::new(256 << 20);
        b.open(40000, 65535);
        b.e.memory_used()
    };
    // Room for three idle sessions and a half.
    let mut b = B::new(per * 7 / 2);
    for port in 40000..40010 {
        b.capture(&packet(
            client(port),
            PROD,
            C,
            0,
            SYN,
            b"",
            Default::default(),
        ));
    }
    let syns = b.drain();
    assert_eq!(syns.len(), 3, "only three SYNs reach the test server");
    let st = b.e.stats();
    assert_eq!(st.sessions_opened, 3);
    assert_eq!(st.sessions_refused_memory, 7);
    assert_eq!(
        st.closed(CloseReason::ShedMemory),
        0,
        "nobody live is shed for them"
    );
    // A refused connection's later packets do not open it mid-stream either (pickup is off),
    // and once a session is forgotten there is room again (one aborted by a client reset
    // with a byte missing before it).
    b.capture(&packet(
        client(40000),
        PROD,
        C + 2,
        0,
        RST,
        b"",
        Default::default(),
    ));
    b.now = b.now + Duration::from_secs(11);
    b.e.on_timeout(b.now);
    b.capture(&packet(
        client(40020),
        PROD,
        C,
        0,
        SYN,
        b"",
        Default::default(),
    ));
    let new: Vec<_> = b
        .drain()
        .into_iter()
        .filter(|s| s.src == client(40020))
        .collect();
    assert_eq!(new.len(), 1);
    assert_eq!(b.e.stats().sessions_refused_memory, 7);
}

#[test]
fn the_session_furthest_behind_is_shed_whole_and_reset() {
    // Budget: three idle sessions plus 48 KiB of queued bytes.
    let per = {
        let mut b = B::new(256 << 20);
        b.open(40000, 65535);
        b.e.memory_used()
    };
    let mut b = B::new(3 * per + (48 << 10));
    for port in [40000, 40001, 40002] {
        b.open(port, 65535);
    }
    b.events();
    // 40001 keeps sending, the test server acknowledges nothing: it falls behind.
    b.data(40000, 0, 1000);
    let mut at = 0;
    for _ in 0..100 {
        b.data(40001, at, 1400);
        at += 1400;
        b.drain();
        if b.e.stats().closed(CloseReason::ShedMemory) > 0 {
            break;
        }
    }
    let st = b.e.stats().clone();
    assert_eq!(st.closed(CloseReason::ShedMemory), 1, "{st:?}");
    assert_eq!(st.sessions_active, 2);
    let closed: Vec<_> = b
        .events()
        .into_iter()
        .filter_map(|e| match e {
            EngineEvent::SessionClosed { client, reason, .. } => Some((client, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![(client(40001), CloseReason::ShedMemory)]);
    // The RST for it went out (the test server frees the connection).
    b.data(40001, at, 10);
    let sent = b.drain();
    assert!(sent.is_empty(), "a shed session stays shed: {sent:?}");
    assert!(b.e.memory_used() <= 3 * per + 1000 + 4096);
    // The others go on.
    b.data(40002, 0, 100);
    let sent = b.drain();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].src, client(40002));
    assert_eq!(sent[0].payload.len(), 100);
}

#[test]
fn the_shed_session_gets_a_reset() {
    let mut b = B::new(SESSION_FIXED_BYTES * 4 + (16 << 10));
    b.open(40000, 65535);
    let mut rst = Vec::new();
    for k in 0..40u32 {
        b.data(40000, k * 1400, 1400);
        rst.extend(b.drain().into_iter().filter(|s| s.has(RST)));
        if !rst.is_empty() {
            break;
        }
    }
    assert_eq!(rst.len(), 1, "one RST toward the test server");
    assert_eq!(rst[0].dst, TARGET);
    assert_eq!(b.e.stats().closed(CloseReason::ShedMemory), 1);
    assert_eq!(b.e.stats().rsts_sent, 1);
}

#[test]
fn many_sessions_under_random_load_never_pass_the_bound() {
    let budget = 64 << 10;
    let mut b = B::new(budget);
    let mut next = [0u32; 64];
    let mut x: u32 = 12345;
    for round in 0..4000u32 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let k = (x % 64) as usize;
        let port = 40000 + k as u16;
        match round % 7 {
            0 => b.open(port, if x & 1 == 0 { 0 } else { 65535 }),
            6 if x & 8 == 0 => {
                b.capture(&packet(
                    client(port),
                    PROD,
                    C.wrapping_add(1).wrapping_add(next[k]),
                    1,
                    ACK | FIN,
                    b"",
                    Default::default(),
                ));
                next[k] = 0;
            }
            _ => {
                let n = 1 + (x >> 8) as usize % 1400;
                b.data(port, next[k], n);
                next[k] += n as u32;
            }
        }
        b.drain();
        if round % 50 == 0 {
            b.now = b.now + Duration::from_millis(300);
            b.e.on_timeout(b.now);
            b.check_bound();
        }
    }
    let st = b.e.stats();
    assert!(st.closed(CloseReason::ShedMemory) > 0, "{st:?}");
    // The peak includes what one event added before the shedding it triggered (a send queue
    // doubling its capacity at most).
    assert!(st.memory_peak_bytes <= 2 * budget as u64, "{st:?}");
}

#[test]
fn the_budget_is_shared_out_in_fixed_parts() {
    let m = MemoryBudget::from_mib(64);
    assert_eq!(m.sessions(), 24 << 20);
    assert_eq!(m.capture(), 16 << 20);
    assert_eq!(m.report(), 8 << 20);
    assert_eq!(m.control(), 4 << 20);
    assert!(m.sessions() + m.capture() + m.report() + m.control() < m.total);
    assert_eq!(m.session_buffer(1), 6 << 20);
    assert_eq!(MemoryBudget::from_mib(256).session_buffer(1), 24 << 20);
    assert_eq!(MemoryBudget::from_mib(65536).session_buffer(1), 1 << 30);
    assert_eq!(MemoryBudget::from_mib(256).capture(), 64 << 20);
    assert_eq!(MemoryBudget::from_mib(1).session_buffer(4), 64 << 10);
}

#[test]
fn fixed_size_per_session_is_small() {
    // Issue #9: at most 2 KiB of copier memory per idle mirrored session.
    const { assert!(SESSION_FIXED_BYTES <= 2048) };
}

#[test]
fn a_session_in_line_stays_small() {
    // Issue #9 (docs/BENCHMARKS.md, memory per idle mirrored session): every session carries
    // these in line, idle or not, so a new field here is paid 10,000 times over. Rare state
    // (out-of-order bytes, a transform's read-only or statement bookkeeping, the client bytes
    // held for a replay after a test server's restart, an older test connection being
    // drained) is boxed; the last one's pointer took the bound from 608 to 616.
    use std::mem::size_of;
    assert!(
        size_of::<super::Slot>() <= 616,
        "{}",
        size_of::<super::Slot>()
    );
    assert!(
        size_of::<super::reassembly::Reassembly>() <= 32,
        "{}",
        size_of::<super::reassembly::Reassembly>()
    );
}
