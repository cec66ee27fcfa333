//! TLS sessions mirrored from their plaintext (`session/plaintext.rs`), with a transform that
//! turns the stream to TLS at "TLS!" as the MySQL layer does at an SSLRequest.

use std::sync::{Arc, Mutex};

use common::clock::Instant;
use common::wire::TcpFlags;

use super::tests::{assert_completed, cat, cfg, C, CLIENT, H, PROD, T};
use super::{
    CloseReason, EngineEvent, Plaintext, SessionInfo, StreamTransform, TransformFactory,
    TransformOutput,
};

const ACK: u8 = TcpFlags::ACK;
const FIN: u8 = TcpFlags::FIN;
const RST: u8 = TcpFlags::RST;
const PSH: u8 = TcpFlags::PSH;

/// Passes client bytes on, except a "TLS!" at the start of a delivery: it starts TLS and
/// must not see the rest of that delivery. Keeps production's bytes.
struct StartsTls {
    prod: Arc<Mutex<Vec<u8>>>,
}

impl StreamTransform for StartsTls {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if let Some(rest) = data.strip_prefix(b"TLS!") {
            assert!(!rest.starts_with(b"TLS!"));
            out.start_tls();
            return;
        }
        out.push(data);
    }
    fn wants_prod_data(&self) -> bool {
        true
    }
    fn on_prod_data(&mut self, _: Instant, data: &[u8], _: &mut TransformOutput<'_>) {
        self.prod.lock().unwrap().extend_from_slice(data);
    }
}

fn harness() -> (H, Arc<Mutex<Vec<u8>>>) {
    let prod = Arc::new(Mutex::new(Vec::new()));
    let p = prod.clone();
    let f: Box<dyn TransformFactory> = Box::new(move |_: Instant, _: &SessionInfo| {
        Some(Box::new(StartsTls { prod: p.clone() }) as Box<dyn StreamTransform>)
    });
    let mut h = H::with_factory(cfg(), f);
    h.establish();
    (h, prod)
}

fn plain(h: &mut H, from_client: bool, offset: u64, data: &[u8]) {
    let p = Plaintext {
        client: CLIENT,
        server: PROD,
        from_client,
        offset,
        data,
    };
    h.e.on_plaintext(h.now, &p);
}

fn closed(h: &mut H) -> Vec<CloseReason> {
    h.events()
        .into_iter()
        .filter_map(|e| match e {
            EngineEvent::SessionClosed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

#[test]
fn plaintext_replaces_the_ciphertext_after_the_switch() {
    let (mut h, prod) = harness();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"HELLO");
    // The probe's ring is read before the capture's block: the login comes early.
    plain(&mut h, true, 0, b"LOGIN");
    plain(&mut h, false, 0, b"OK");
    assert_eq!(cat(&h.drain()), b"HELLO", "plaintext waits for the switch");
    h.client(s.wrapping_add(5), ACK | PSH, b"TLS!\x16\x03\x01ciphertext");
    assert_eq!(cat(&h.drain()), b"LOGIN");
    assert_eq!(*prod.lock().unwrap(), b"OK");
    // Ciphertext from now on: passed over, whatever it looks like.
    h.client(
        s.wrapping_add(22),
        ACK | PSH,
        b"TLS!not for the test server",
    );
    plain(&mut h, true, 5, b"CMD1");
    plain(&mut h, true, 9, b"CMD2");
    // A repeated piece is not repeated on the test server.
    plain(&mut h, true, 5, b"CMD1CMD2CMD3");
    assert_eq!(cat(&h.drain()), b"CMD1CMD2CMD3");
    let st = h.e.stats();
    assert_eq!(st.tls_plain_client_bytes, 5 + 4 + 4 + 4);
    assert_eq!(st.tls_plain_prod_bytes, 2);
    assert_eq!(st.tls_ciphertext_bytes, 27);
    assert_eq!(st.tls_plain_bytes_lost, 0);
}

#[test]
fn the_client_stream_ends_when_production_closes_not_at_the_clients_fin() {
    let (mut h, _) = harness();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"TLS!");
    plain(&mut h, true, 0, b"LOGIN");
    h.drain();
    // The client's FIN may pass plaintext production has not read yet.
    h.client(s.wrapping_add(40), ACK | FIN, b"");
    assert!(h.drain().iter().all(|p| !p.has(FIN)));
    // Production's FIN: what it read before is here, or comes within the grace.
    h.prod(s.wrapping_add(41), ACK | FIN);
    plain(&mut h, true, 5, b"QUIT");
    let out = h.drain();
    assert_eq!(cat(&out), b"QUIT");
    assert!(out.iter().all(|p| !p.has(FIN)));
    h.advance(super::tests::ms(60));
    assert!(h.drain().last().unwrap().has(FIN));
    let end = s.wrapping_add(5 + 4);
    h.fb(T + 1, end.wrapping_add(1), ACK | FIN, 65535, 0);
    h.drain();
    assert_completed(&mut h);
}

#[test]
fn lost_client_plaintext_ends_the_session_as_a_gap_and_is_counted() {
    let (mut h, _) = harness();
    let s = C.wrapping_add(1);
    h.client(s, ACK | PSH, b"TLS!");
    plain(&mut h, true, 0, b"LOGIN");
    plain(&mut h, true, 9, b"CMD2");
    assert!(h.drain().iter().any(|p| p.has(RST)));
    assert_eq!(closed(&mut h), vec![CloseReason::CaptureGap]);
    let st = h.e.stats();
    assert_eq!(st.tls_plain_bytes_lost, 4);
    // Later plaintext of the ended session is counted, never sent.
    plain(&mut h, true, 13, b"CMD3");
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().tls_plain_bytes_unmatched, 4);
}

#[test]
fn plaintext_of_no_session_or_another_port_is_counted_and_dropped() {
    let (mut h, _) = harness();
    let other = std::net::SocketAddrV4::new(*CLIENT.ip(), CLIENT.port() + 1);
    h.e.on_plaintext(
        h.now,
        &Plaintext {
            client: other,
            server: PROD,
            from_client: true,
            offset: 0,
            data: b"abc",
        },
    );
    let wrong_port = std::net::SocketAddrV4::new(*PROD.ip(), PROD.port() + 1);
    h.e.on_plaintext(
        h.now,
        &Plaintext {
            client: CLIENT,
            server: wrong_port,
            from_client: true,
            offset: 0,
            data: b"de",
        },
    );
    assert!(h.drain().is_empty());
    assert_eq!(h.e.stats().tls_plain_bytes_unmatched, 5);
}

#[test]
fn plaintext_waiting_for_a_switch_that_never_comes_is_bounded_and_counted() {
    let mut c = cfg();
    c.max_session_buffer = 100;
    let prod = Arc::new(Mutex::new(Vec::new()));
    let f: Box<dyn TransformFactory> = Box::new(move |_: Instant, _: &SessionInfo| {
        Some(Box::new(StartsTls { prod: prod.clone() }) as Box<dyn StreamTransform>)
    });
    let mut h = H::with_factory(c, f);
    h.establish();
    plain(&mut h, true, 0, &[b'x'; 60]);
    assert!(h.e.memory_used() > 60);
    h.client(C.wrapping_add(11), ACK | RST, b""); // with bytes missing: ends it
    assert_eq!(h.e.stats().tls_plain_bytes_unused, 60);
    let (mut h2, _) = harness();
    plain(&mut h2, true, 0, &[b'x'; 60]);
    plain(&mut h2, false, 0, &[b'y'; 60]);
    assert!(
        closed(&mut h2).is_empty(),
        "the default bound is far larger"
    );
    let mut c = cfg();
    c.max_session_buffer = 100;
    let f: Box<dyn TransformFactory> = Box::new(move |_: Instant, _: &SessionInfo| {
        Some(Box::new(StartsTls {
            prod: Arc::new(Mutex::new(Vec::new())),
        }) as Box<dyn StreamTransform>)
    });
    let mut h3 = H::with_factory(c, f);
    h3.establish();
    plain(&mut h3, true, 0, &[b'x'; 60]);
    plain(&mut h3, false, 0, &[b'y'; 60]);
    assert_eq!(closed(&mut h3), vec![CloseReason::BufferOverflow]);
}

#[test]
fn plaintext_before_a_picked_up_sessions_first_packet_waits_for_it_a_moment() {
    let mut c = cfg();
    c.pickup_midstream = true;
    let f: Box<dyn TransformFactory> = Box::new(move |_: Instant, _: &SessionInfo| {
        Some(Box::new(StartsTls {
            prod: Arc::new(Mutex::new(Vec::new())),
        }) as Box<dyn StreamTransform>)
    });
    let mut h = H::with_factory(c, f);
    // A pooled connection: the probe's plaintext first, then its captured ciphertext.
    plain(&mut h, true, 0, b"CMD1");
    plain(&mut h, true, 4, b"CMD2");
    h.client(5000, ACK | PSH, b"TLS!\x17\x03\x03");
    let sent = h.drain();
    assert!(sent.iter().any(|p| p.has(TcpFlags::SYN)), "{sent:?}");
    let st = h.e.stats();
    assert_eq!(st.sessions_picked_up, 1);
    assert_eq!(st.tls_plain_client_bytes, 8);
    assert_eq!(st.tls_plain_bytes_unmatched, 0);
    // Too old: counted, not kept for ever.
    let other = std::net::SocketAddrV4::new(*CLIENT.ip(), CLIENT.port() + 1);
    h.e.on_plaintext(
        h.now,
        &Plaintext {
            client: other,
            server: PROD,
            from_client: true,
            offset: 0,
            data: b"late",
        },
    );
    h.advance(super::tests::ms(300));
    assert_eq!(h.e.stats().tls_plain_bytes_unmatched, 4);
}

#[test]
fn hostile_offsets_never_overflow() {
    let (mut h, _) = harness();
    h.client(C.wrapping_add(1), ACK | PSH, b"TLS!");
    plain(&mut h, false, u64::MAX - 1, b"abcdef");
    plain(&mut h, false, u64::MAX, b"ghi");
    plain(&mut h, false, 0, b"old");
    plain(&mut h, true, u64::MAX, b"xyz");
    assert_eq!(closed(&mut h), vec![CloseReason::CaptureGap]);
}
