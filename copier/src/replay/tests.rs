use common::seq::SeqNumber;
use std::net::SocketAddrV4;

use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};

use super::*;
use crate::engine::{Engine, EngineConfig, EngineEvent};
use crate::pcapfile::PcapngWriter;

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const PROD: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

fn segment(from_client: bool, flags: u8, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    let (src, dst, sp, dp) = if from_client {
        (CLIENT, PROD, 40000, 3306)
    } else {
        (PROD, CLIENT, 3306, 40000)
    };
    let repr = SegmentRepr {
        src,
        dst,
        src_port: sp,
        dst_port: dp,
        seq: SeqNumber(seq),
        ack: SeqNumber(ack),
        flags: TcpFlags(flags),
        window: 1000,
        options: TcpOptions {
            timestamps: Some((5000, 7000)),
            ..TcpOptions::default()
        },
        ip_id: 1,
        ttl: 64,
    };
    let mut buf = vec![0u8; 1600];
    let n = emit_ipv4_tcp(&repr, payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// A raw-IP (LINKTYPE 101) pcapng file of `frames` (ns timestamp, IP packet).
fn write_file(path: &std::path::Path, frames: &[(u64, Vec<u8>)]) {
    let mut w = PcapngWriter::new(File::create(path).unwrap());
    for (ts, data) in frames {
        w.write_frame(*ts, 101, data, data.len() as u32).unwrap();
    }
    w.finish().unwrap();
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcpshadow-replay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const S: u64 = 1_000_000_000;

/// Every packet the source yields: (timeline position, loop, source address after rewrite).
fn drain_source(source: &mut Source, rewrite: &mut LoopRewrite) -> Vec<(u64, u32, Ipv4Addr)> {
    let mut out = Vec::new();
    while let Some(next) = source.next {
        let index = source.shift.index;
        source.with_next(rewrite, |p| out.push((next.pos, index, p.src)));
        source.advance().unwrap();
    }
    out
}

#[test]
fn speed_divides_the_timeline() {
    let t0 = Instant::from_nanos(1000);
    assert_eq!(due_at(t0, 10 * S, 10 * S, 2.0), t0);
    assert_eq!(due_at(t0, 10 * S, 14 * S, 2.0), t0 + Duration::from_secs(2));
    assert_eq!(due_at(t0, 10 * S, 11 * S, 0.5), t0 + Duration::from_secs(2));
    // Out of order: due at once.
    assert_eq!(due_at(t0, 10 * S, 9 * S, 1.0), t0);
}

#[test]
fn files_are_one_timeline_and_loops_follow_back_to_back() {
    let dir = tempdir("timeline");
    let a = dir.join("a.pcapng");
    let b = dir.join("b.pcapng");
    write_file(
        &a,
        &[
            (100 * S, segment(true, TcpFlags::SYN, 1, 0, &[])),
            (
                101 * S,
                segment(false, TcpFlags::SYN | TcpFlags::ACK, 9, 2, &[]),
            ),
        ],
    );
    write_file(
        &b,
        &[
            // A gap forward between files is kept.
            (103 * S, segment(true, TcpFlags::ACK, 2, 10, &[])),
        ],
    );
    let mut source = Source::open(&[a, b], 3306, 2).unwrap();
    let mut rewrite = LoopRewrite::new(3306, true);
    let got = drain_source(&mut source, &mut rewrite);
    let pos: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(
        pos,
        vec![100 * S, 101 * S, 103 * S, 103 * S, 104 * S, 106 * S]
    );
    assert_eq!(source.loop_span, Some(3 * S));
    let loops: Vec<u32> = got.iter().map(|g| g.1).collect();
    assert_eq!(loops, vec![0, 0, 0, 1, 1, 1]);
    // Client packets of each loop come from one virtual address, different per loop.
    assert_eq!(got[0].2, Ipv4Addr::new(240, 0, 0, 1));
    assert_eq!(got[2].2, Ipv4Addr::new(240, 0, 0, 1));
    assert_eq!(got[3].2, Ipv4Addr::new(240, 0, 0, 2));
    assert_eq!(got[1].2, PROD, "production's packets keep their source");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_older_file_is_moved_after_the_previous_one() {
    let dir = tempdir("older");
    let a = dir.join("a.pcapng");
    let b = dir.join("b.pcapng");
    write_file(&a, &[(500 * S, segment(true, TcpFlags::SYN, 1, 0, &[]))]);
    write_file(
        &b,
        &[
            (10 * S, segment(true, TcpFlags::SYN, 1, 0, &[])),
            (12 * S, segment(true, TcpFlags::ACK, 2, 0, &[])),
        ],
    );
    let mut source = Source::open(&[a, b], 3306, 1).unwrap();
    let got = drain_source(&mut source, &mut LoopRewrite::new(3306, false));
    let pos: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(pos, vec![500 * S, 500 * S, 502 * S]);
    assert_eq!(got[0].2, CLIENT, "no rewrite without --loop");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn other_ports_unparsable_and_snapped_frames_are_skipped_and_counted() {
    let dir = tempdir("skip");
    let a = dir.join("a.pcapng");
    let mut other = segment(true, TcpFlags::SYN, 1, 0, &[]);
    other[22..24].copy_from_slice(&5432u16.to_be_bytes());
    let mut w = PcapngWriter::new(File::create(&a).unwrap());
    w.write_frame(S, 101, &other, other.len() as u32).unwrap();
    w.write_frame(S, 147, &[1, 2, 3], 3).unwrap(); // a link type replay cannot read
    let full = segment(true, TcpFlags::ACK, 2, 0, b"hello");
    w.write_frame(2 * S, 101, &full[..30], full.len() as u32)
        .unwrap();
    w.write_frame(3 * S, 101, &[0x45, 0, 0], 3).unwrap();
    w.write_frame(4 * S, 101, &full, full.len() as u32).unwrap();
    w.finish().unwrap();
    let mut source = Source::open(&[a], 3306, 1).unwrap();
    let got = drain_source(&mut source, &mut LoopRewrite::new(3306, false));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 4 * S);
    assert_eq!(source.other, 1);
    assert_eq!(source.unsupported_link, 1);
    assert_eq!(source.stats.snapped, 1);
    assert_eq!(source.stats.truncated, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_file_is_replayed_up_to_the_damage_and_the_next_file_still_is() {
    let dir = tempdir("damaged");
    let a = dir.join("a.pcapng");
    let b = dir.join("b.pcapng");
    write_file(
        &a,
        &[
            (S, segment(true, TcpFlags::SYN, 1, 0, &[])),
            (2 * S, segment(true, TcpFlags::ACK, 2, 0, b"q1")),
            (3 * S, segment(true, TcpFlags::ACK, 4, 0, b"q2")),
        ],
    );
    let full = std::fs::read(&a).unwrap();
    std::fs::write(&a, &full[..full.len() - 20]).unwrap();
    write_file(&b, &[(4 * S, segment(true, TcpFlags::ACK, 6, 0, b"q3"))]);
    let mut source = Source::open(&[a.clone(), b], 3306, 2).unwrap();
    let got = drain_source(&mut source, &mut LoopRewrite::new(3306, true));
    assert_eq!(got.len(), 6, "2 + 1 packets per loop");
    assert_eq!(source.damaged.len(), 1, "reported once, not per loop");
    let d = &source.damaged[0];
    assert_eq!(d.path, a);
    assert_eq!(d.packets_before, 2);
    let text = d.error.to_string();
    assert!(
        text.starts_with("truncated enhanced packet block at offset "),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_is_no_capture_fails_before_anything_is_replayed() {
    let dir = tempdir("nocap");
    let a = dir.join("a.pcapng");
    std::fs::write(&a, b"SELECT 1;\n").unwrap();
    let err = Source::open(std::slice::from_ref(&a), 3306, 1)
        .err()
        .unwrap();
    let text = format!("{err:#}");
    assert!(text.contains(&a.display().to_string()), "{text}");
    assert!(text.contains("not a pcap or pcapng file"), "{text}");
    let missing = Source::open(&[dir.join("nope.pcapng")], 3306, 1)
        .err()
        .unwrap();
    assert!(format!("{missing:#}").contains("cannot open"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn loop_rewrite_shifts_both_directions_consistently() {
    let mut rw = LoopRewrite::new(3306, true);
    let shift = LoopShift::new(2, 30_000);
    let syn = segment(true, TcpFlags::SYN, 100, 0, &[]);
    let mut p = parse_frame(LinkType::RawIp, &syn).unwrap();
    assert!(rw.apply(shift, &mut p));
    assert_eq!(p.src, Ipv4Addr::new(240, 0, 0, 1));
    assert_eq!(
        p.seq,
        SeqNumber(100u32.wrapping_add(2u32.wrapping_mul(0x4000_0001)))
    );
    assert_eq!(p.options.timestamps, Some((5000 + 30_000 + 2000, 7000)));
    let reply = segment(false, TcpFlags::SYN | TcpFlags::ACK, 9, 101, &[]);
    let mut r = parse_frame(LinkType::RawIp, &reply).unwrap();
    assert!(rw.apply(shift, &mut r));
    assert_eq!(r.dst, p.src);
    assert_eq!(r.ack, p.seq + 1u32);
    assert_eq!(
        r.seq,
        SeqNumber(9),
        "production's own sequence numbers are kept"
    );
    assert_eq!(r.options.timestamps, Some((5000, 7000 + 32_000)));
}

/// Feeds the same recorded handshake twice (two loops) into a real engine with a pool: each
/// loop must open its own session from a distinct mirrored address.
fn sessions_opened(rewrite_active: bool) -> (u64, Vec<SocketAddrV4>) {
    let mut cfg = EngineConfig::new(3306, SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306));
    cfg.client_ip_pool = Some((Ipv4Addr::new(198, 19, 0, 0), 24));
    cfg.pickup_midstream = true;
    let mut engine = Engine::new(cfg);
    let mut rw = LoopRewrite::new(3306, rewrite_active);
    let frames = [
        segment(true, TcpFlags::SYN, 1000, 0, &[]),
        segment(false, TcpFlags::SYN | TcpFlags::ACK, 5000, 1001, &[]),
        segment(true, TcpFlags::ACK, 1001, 5001, &[]),
        segment(true, TcpFlags::ACK | TcpFlags::PSH, 1001, 5001, b"query"),
    ];
    let mut mirrored = Vec::new();
    for index in 0..2u32 {
        let shift = LoopShift::new(index, u64::from(index) * 10_000);
        for (i, f) in frames.iter().enumerate() {
            let now = Instant::from_nanos((u64::from(index) * 10 + i as u64) * S);
            let mut p = parse_frame(LinkType::RawIp, f).unwrap();
            if rw.apply(shift, &mut p) {
                engine.on_captured(now, &p);
            }
        }
        while let Some(ev) = engine.poll_event() {
            if let EngineEvent::SessionOpened { mirrored: m, .. } = ev {
                mirrored.push(m);
            }
        }
    }
    (engine.stats().sessions_opened, mirrored)
}

#[test]
fn each_loop_is_a_new_session_from_its_own_address() {
    let (opened, mirrored) = sessions_opened(true);
    assert_eq!(opened, 2);
    assert_eq!(mirrored.len(), 2);
    assert_ne!(mirrored[0], mirrored[1]);
    // Untouched, the second loop's SYN is taken for a retransmission of the first.
    let (opened, _) = sessions_opened(false);
    assert_eq!(opened, 1);
}

#[test]
fn loop_needs_a_pool_and_speed_must_be_positive() {
    let base = [
        "copier replay",
        "x.pcapng",
        "--target",
        "198.18.0.3:3306",
        "--intercept",
        "198.18.0.4:36524",
    ];
    let with = |extra: &[&str]| {
        let mut v = base.to_vec();
        v.extend(extra);
        ReplayArgs::try_parse_from(v)
    };
    let err = with(&["--loop", "2"]).unwrap().validate().unwrap_err();
    assert!(err.to_string().contains("--client-ip-pool"), "{err}");
    with(&["--loop", "2", "--client-ip-pool", "198.19.0.0/16"])
        .unwrap()
        .validate()
        .unwrap();
    assert!(with(&["--speed", "0"]).is_err());
    assert!(with(&["--speed", "-1"]).is_err());
    assert!(with(&["--speed", "nan"]).is_err());
    assert_eq!(with(&["--speed", "2.5"]).unwrap().speed, 2.5);
    assert!(with(&["--loop", "0"]).is_err());
}

#[test]
fn settling_ends_when_sessions_closed_the_server_fell_silent_or_time_ran_out() {
    let t = |ms: u64| Instant::from_nanos(ms * 1_000_000);
    let limit = Duration::from_secs(2);
    let mut s = Settle::new(t(0));
    assert!(!s.done(t(0), 3, 10, limit));
    assert!(!s.done(t(900), 3, 20, limit), "feedback still flowing");
    assert!(!s.done(t(1800), 3, 30, limit));
    assert!(s.done(t(2000), 3, 40, limit), "--drain-secs caps the wait");
    let mut s = Settle::new(t(0));
    assert!(!s.done(t(100), 1, 5, limit));
    assert!(s.done(t(1100), 1, 5, limit), "silent for a second");
    let mut s = Settle::new(t(0));
    assert!(s.done(t(1), 0, 5, limit), "every session closed");
}

#[test]
fn a_file_time_limit_cuts_the_timeline_and_a_loop_base_continues_the_numbering() {
    let dir = tempdir("limit");
    let a = dir.join("a.pcapng");
    write_file(
        &a,
        &[
            (100 * S, segment(true, TcpFlags::SYN, 1, 0, &[])),
            (
                101 * S,
                segment(false, TcpFlags::SYN | TcpFlags::ACK, 9, 2, &[]),
            ),
            (103 * S, segment(true, TcpFlags::ACK, 2, 10, &[])),
        ],
    );
    assert_eq!(
        file_time(std::slice::from_ref(&a), 3306).unwrap(),
        Duration::from_secs(3)
    );
    // 5 s of file time over loops of 3 s: the second loop is cut after its first 2 s.
    let opts = RunOptions {
        file_time_limit: Some(Duration::from_secs(5)),
        first_loop: Some(LoopBase {
            index: 4,
            ts_ms: 10_000,
        }),
        quiet: true,
    };
    let mut source = Source::open_with(std::slice::from_ref(&a), 3306, 100, &opts).unwrap();
    let mut rewrite = LoopRewrite::new(3306, true);
    let got = drain_source(&mut source, &mut rewrite);
    let pos: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(pos, vec![100 * S, 101 * S, 103 * S, 103 * S, 104 * S]);
    let loops: Vec<u32> = got.iter().map(|g| g.1).collect();
    assert_eq!(loops, vec![4, 4, 4, 5, 5]);
    assert_eq!(source.loop_idx, 1, "stopped in the second loop");
    // The base's timestamp shift comes on top of the loop's own.
    assert_eq!(source.shift, LoopShift::new(5, 10_000 + 3_000));

    // The next replay starts past every loop and timestamp this one used.
    let report = ReplayReport {
        loops_done: 1,
        file_time: Duration::from_secs(4),
        ..ReplayReport::default()
    };
    let next = LoopBase {
        index: 4,
        ts_ms: 10_000,
    }
    .after(&report);
    assert_eq!(next.index, 6);
    let last_used = LoopShift::new(5, 10_000 + 4_000).ts;
    assert!(LoopShift::new(next.index, u64::from(next.ts_ms)).ts > last_used);
    std::fs::remove_dir_all(&dir).unwrap();
}
