//! The MySQL view of the test server's replies: one reassembled, framed reply stream per
//! mirrored connection, turned into [`MysqlEvent`]s for the relay.
//!
//! Owned by the capture thread and fed every captured segment after its feedback was routed;
//! sans-IO (the caller passes the time). Sessions begin at a SYN-ACK, end at FIN/RST plus a
//! linger that absorbs retransmissions, or when idle too long. Their number is bounded: past the
//! bound new connections are not framed (counted, and the copier is told).
//!
//! It must never stall on a connection it cannot frame: it says so once (`FramingLost`) and
//! ignores that connection until its next SYN-ACK, or until the connection carries the answer
//! to a COM_STATISTICS: the copier sends one to a session it lost to find a reply boundary
//! again (`FramingResumed`), since nothing else in a reply stream marks where a packet starts.

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::time::Duration;

use common::clock::Instant;
use common::control::{MysqlEvent, MysqlPacket};
use common::mysql::fold::{Folded, RowFolder};
use common::seq::SeqNumber;
use common::wire::TcpPacket;

use crate::framer::{FrameSink, HeadSizes};
use crate::reassembly::{HoldLimits, LostReason, ReassemblyStats, ReplyStream};

/// How sessions are framed and bounded.
#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    /// Head bytes per packet after the first ones (`--mysql-head`).
    pub head: usize,
    /// Most sessions tracked at once.
    pub max_sessions: usize,
    /// A session with no segment for this long is forgotten (its FIN was missed). Longer than
    /// the server's `wait_timeout`, so that idle pooled connections keep their framing.
    pub idle_timeout: Duration,
    /// How long a session stays after its FIN or RST, so retransmissions are recognised.
    pub linger: Duration,
    pub hold: HoldLimits,
    /// Bytes all sessions may hold together (out-of-order reply segments, each session at most
    /// `hold.bytes`); a session whose hold would pass it loses its framing (`lost_memory`).
    /// `--max-memory`'s part.
    pub max_held_total: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            head: 16,
            max_sessions: 65_536,
            idle_timeout: Duration::from_secs(9 * 3600),
            linger: Duration::from_secs(10),
            hold: HoldLimits::default(),
            max_held_total: usize::MAX,
        }
    }
}

/// Counters of MySQL framing, all monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MysqlStats {
    /// Sessions whose framing started at a SYN-ACK.
    pub sessions_framed: u64,
    /// MySQL packets framed (summaries emitted and packets folded).
    pub packets: u64,
    /// Of those, rows and definitions folded into runs ([`crate::fold`]).
    pub folded: u64,
    /// Runs emitted.
    pub runs: u64,
    /// `FramingLost` events emitted, for all of the reasons below.
    pub framing_lost: u64,
    /// Data for a session whose SYN-ACK was never seen (intercept started after it).
    pub lost_midstream: u64,
    /// A gap that did not fill before the session's hold overflowed.
    pub lost_gap: u64,
    /// Segments cut by the snap length.
    pub lost_snapped: u64,
    /// Sessions whose framing was given up because all sessions' held bytes reached
    /// `max_held_total` (`--max-memory`): the one whose hold grew past it.
    pub lost_memory: u64,
    /// Lost sessions framed again from the end of a COM_STATISTICS reply (the copier's probe).
    pub framing_resumed: u64,
    /// SYN-ACKs not framed because `max_sessions` were tracked.
    pub sessions_shed: u64,
    /// Sessions forgotten after `idle_timeout` without a segment.
    pub sessions_expired: u64,
    pub reassembly: ReassemblyStats,
}

#[derive(Debug)]
enum Framing {
    // Boxed: a framed stream is large, a lost one is nothing.
    Stream(Box<(ReplyStream, RowFolder)>),
    /// Told the copier once; nothing more until a new SYN-ACK.
    Lost,
}

/// Where a COM_STATISTICS reply ends in one captured segment, if the segment holds one whole.
///
/// The reply is the only MySQL packet that is a bare string beginning `Uptime: ` (no OK, ERR
/// or result-set byte before it): its header (length, sequence id 1) and a printable body of
/// that length make a false match in row data need a row whose first column is 85 bytes long
/// and starts `ptime: ` followed by as many printable bytes as the false header says. The last
/// such reply in the segment wins: framing starts after everything the probe waited on.
/// `wire_len` is the payload's length on the wire; a segment cut by the snap length is never
/// matched past what was captured.
pub fn statistics_reply_end(payload: &[u8], wire_len: u32) -> Option<usize> {
    const MARK: &[u8] = b"\x01Uptime: ";
    let data = &payload[..payload.len().min(wire_len as usize)];
    let mut found = None;
    let mut from = 0;
    while let Some(i) = data
        .get(from..)
        .and_then(|d| d.windows(MARK.len()).position(|w| w == MARK))
        .map(|i| i + from)
    {
        from = i + 1;
        let Some(start) = i.checked_sub(3) else {
            continue;
        };
        let len = usize::from(data[start])
            | usize::from(data[start + 1]) << 8
            | usize::from(data[start + 2]) << 16;
        let end = start + 4 + len;
        let body = (MARK.len() - 1 <= len && len <= 1024)
            .then(|| data.get(i + 1..end))
            .flatten();
        if body.is_some_and(|b| b.iter().all(|c| (0x20..0x7f).contains(c))) {
            found = Some(end);
        }
    }
    found
}

/// Memory one tracked session takes before it holds any out-of-order bytes: its entry in the
/// table (at most 7/8 full, one control byte) and an allowance for the framer's small
/// allocations. `--max-memory` caps `max_sessions` with it (see main.rs). Held bytes are bounded
/// per session by [`HoldLimits`], not yet by the budget as a whole.
pub const SESSION_BYTES: usize = (std::mem::size_of::<(SocketAddrV4, Session)>() + 1) * 8 / 7 + 512;

/// Takes one session's framed packets: folds what it can, summarises the rest.
struct Sink<'a> {
    client: SocketAddrV4,
    /// When the segment was captured, for the summaries' `framed_at_us`.
    at_us: u32,
    fold: bool,
    folder: &'a mut RowFolder,
    packets: &'a mut u64,
    folded: &'a mut u64,
    runs: &'a mut u64,
    out: &'a mut Vec<MysqlEvent>,
}

impl FrameSink for Sink<'_> {
    fn skim(&mut self, seq_id: u8, len: u32, stream_offset: u64, head: &[u8]) -> bool {
        let kept = self
            .folder
            .try_fold(seq_id, len, head, stream_offset, self.at_us, self.fold);
        if kept {
            *self.packets += 1;
            *self.folded += 1;
        }
        kept
    }

    fn packet(&mut self, mut packet: MysqlPacket) {
        *self.packets += 1;
        packet.framed_at_us = self.at_us;
        match self.folder.offer(packet, self.fold) {
            Folded::Kept => *self.folded += 1,
            Folded::Send(run, packet) => {
                let client = self.client;
                if let Some(rows) = run {
                    *self.runs += 1;
                    self.out.push(MysqlEvent::Rows { client, rows });
                }
                self.out.push(MysqlEvent::Packet { client, packet });
            }
        }
    }
}

#[derive(Debug)]
struct Session {
    framing: Framing,
    last_seen: Instant,
    closing_since: Option<Instant>,
}

/// Every framed session, keyed by mirrored client address (the replies' destination).
pub struct MysqlSessions {
    config: SessionConfig,
    sessions: HashMap<SocketAddrV4, Session>,
    stats: MysqlStats,
    /// Bytes held by all sessions' reassembly (see `SessionConfig::max_held_total`).
    held_total: usize,
    /// Hash every payload (a copier asked for `--compare-results`).
    hashing: bool,
    /// Fold result sets into runs (every connected copier knows them).
    folding: bool,
}

impl MysqlSessions {
    pub fn new(config: SessionConfig) -> Self {
        MysqlSessions {
            config,
            sessions: HashMap::new(),
            held_total: 0,
            stats: MysqlStats::default(),
            hashing: false,
            folding: false,
        }
    }

    /// Payload hashes on or off, for every session from its next packet on: on while any
    /// connected copier asked for them (`FEATURE_PAYLOAD_HASHES`).
    pub fn set_hashing(&mut self, on: bool) {
        self.hashing = on;
    }

    /// Folding of result sets into runs on or off, from the next packet on: on while every
    /// connected copier knows runs (`FEATURE_ROW_RUNS`) and none asked for payload hashes.
    pub fn set_folding(&mut self, on: bool) {
        self.folding = on;
    }

    /// Frames one captured reply, appending what it teaches to `out` in stream order; its
    /// packets are dated `now` (in µs, wrapping).
    pub fn on_segment(&mut self, now: Instant, pkt: &TcpPacket<'_>, out: &mut Vec<MysqlEvent>) {
        self.on_captured(now, (now.as_nanos() / 1000) as u32, pkt, out);
    }

    /// Like [`Self::on_segment`], the packets dated `captured_us`: when the capture received
    /// the segment ([`common::clock::realtime_us`] scale), which can be up to a capture block
    /// earlier than `now`.
    pub fn on_captured(
        &mut self,
        now: Instant,
        captured_us: u32,
        pkt: &TcpPacket<'_>,
        out: &mut Vec<MysqlEvent>,
    ) {
        let client = SocketAddrV4::new(pkt.dst, pkt.dst_port);
        let flags = pkt.flags;
        let mut data_seq = pkt.seq;
        if flags.syn() {
            if !flags.ack() || flags.rst() {
                // A bare SYN from the server's port is not a reply to a mirrored client.
                return;
            }
            data_seq += 1u32;
            if !self.on_syn_ack(now, client, data_seq, out) {
                return;
            }
        }
        let stats = &mut self.stats;
        let Some(s) = self.sessions.get_mut(&client) else {
            if pkt.payload_len > 0 && !flags.rst() {
                // Picked up mid-stream: no way to know where a MySQL header starts. Remember the
                // session (when there is room) so the copier is told once, not per segment.
                if self.sessions.len() < self.config.max_sessions {
                    stats.lost_midstream += 1;
                    stats.framing_lost += 1;
                    out.push(MysqlEvent::FramingLost {
                        client,
                        at_seq: pkt.seq.0,
                    });
                    self.sessions.insert(
                        client,
                        Session {
                            framing: Framing::Lost,
                            last_seen: now,
                            closing_since: flags.fin().then_some(now),
                        },
                    );
                } else {
                    stats.sessions_shed += 1;
                }
            }
            return;
        };
        s.last_seen = now;
        if matches!(s.framing, Framing::Lost) && !flags.rst() {
            // The copier's resync probe: framing starts again where its answer ends.
            if let Some(end) = statistics_reply_end(pkt.payload, pkt.payload_len) {
                let base = data_seq + end;
                stats.framing_resumed += 1;
                out.push(MysqlEvent::FramingResumed {
                    client,
                    at_seq: base.0,
                });
                let sizes = HeadSizes {
                    later: self.config.head,
                };
                s.framing = Framing::Stream(Box::new((
                    ReplyStream::new(base, sizes, self.config.hold),
                    RowFolder::new(),
                )));
            }
        }
        if let Framing::Stream(framed) = &mut s.framing {
            let (stream, folder) = &mut **framed;
            stream.set_hashing(self.hashing);
            // Only differences are read (with the frame's sent_at_us, on the same clock).
            let at_us = captured_us;
            let mut emit = Sink {
                client,
                at_us,
                fold: self.folding && !self.hashing,
                folder,
                packets: &mut stats.packets,
                folded: &mut stats.folded,
                runs: &mut stats.runs,
                out,
            };
            let before = stream.held_bytes();
            let res = stream.on_segment(
                data_seq,
                pkt.payload,
                pkt.payload_len,
                &mut stats.reassembly,
                &mut emit,
            );
            // A run goes out with the segment that ended it: the copier learns what was
            // framed as soon as with one summary per packet.
            if let Some(rows) = emit.folder.flush() {
                *emit.runs += 1;
                emit.out.push(MysqlEvent::Rows { client, rows });
            }
            let after = stream.held_bytes();
            self.held_total = self.held_total - before + after;
            if res.is_err() {
                // The stream is dropped below, its hold with it.
                self.held_total -= after;
            } else if after > before && self.held_total > self.config.max_held_total {
                // Holds are bounded as a whole too: the session whose hold just grew past the
                // bound gives its framing up (it is the one waiting on a gap), counted.
                self.held_total -= after;
                stream.discard(&mut stats.reassembly);
                stats.framing_lost += 1;
                stats.lost_memory += 1;
                out.push(MysqlEvent::FramingLost {
                    client,
                    at_seq: stream.framed_to().0,
                });
                s.framing = Framing::Lost;
            }
            if let Err(lost) = res {
                stats.framing_lost += 1;
                match lost.reason {
                    LostReason::HoldFull => stats.lost_gap += 1,
                    LostReason::Snapped => stats.lost_snapped += 1,
                }
                out.push(MysqlEvent::FramingLost {
                    client,
                    at_seq: lost.at_seq.0,
                });
                s.framing = Framing::Lost;
            }
        }
        if flags.fin() || flags.rst() {
            s.closing_since.get_or_insert(now);
        }
    }

    /// Starts (or keeps) the session a SYN-ACK opens; false when it cannot be framed.
    fn on_syn_ack(
        &mut self,
        now: Instant,
        client: SocketAddrV4,
        base_seq: SeqNumber,
        out: &mut Vec<MysqlEvent>,
    ) -> bool {
        let tracked = self.sessions.len();
        match self.sessions.get_mut(&client) {
            Some(s)
                if matches!(&s.framing, Framing::Stream(st) if st.0.base_seq() == base_seq)
                    && s.closing_since.is_none() =>
            {
                // A retransmitted SYN-ACK: the session it opened goes on.
                s.last_seen = now;
                return true;
            }
            Some(old) => {
                // The address is reused by a new connection.
                if let Framing::Stream(st) = &mut old.framing {
                    self.held_total -= st.0.held_bytes();
                    st.0.discard(&mut self.stats.reassembly);
                }
            }
            None if tracked >= self.config.max_sessions => {
                self.stats.sessions_shed += 1;
                self.stats.framing_lost += 1;
                out.push(MysqlEvent::FramingLost {
                    client,
                    at_seq: base_seq.0,
                });
                return false;
            }
            None => {}
        }
        let sizes = HeadSizes {
            later: self.config.head,
        };
        self.sessions.insert(
            client,
            Session {
                framing: Framing::Stream(Box::new((
                    ReplyStream::new(base_seq, sizes, self.config.hold),
                    RowFolder::new(),
                ))),
                last_seen: now,
                closing_since: None,
            },
        );
        self.stats.sessions_framed += 1;
        true
    }

    /// Forgets sessions that ended (after their linger) or went idle. Call it every second or so.
    pub fn sweep(&mut self, now: Instant) {
        let cfg = &self.config;
        let stats = &mut self.stats;
        let held_total = &mut self.held_total;
        self.sessions.retain(|_, s| {
            let done = s
                .closing_since
                .is_some_and(|t| now.saturating_since(t) >= cfg.linger);
            let idle = now.saturating_since(s.last_seen) >= cfg.idle_timeout;
            if !(done || idle) {
                return true;
            }
            if idle && !done {
                stats.sessions_expired += 1;
            }
            if let Framing::Stream(st) = &mut s.framing {
                *held_total -= st.0.held_bytes();
                st.0.discard(&mut stats.reassembly);
            }
            false
        });
    }

    /// Sessions tracked now (framed or lost).
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    pub fn stats(&self) -> MysqlStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::wire::{TcpFlags, TcpOptions};
    use std::net::Ipv4Addr;

    const ISN: u32 = 0xffff_fff0;

    fn client(n: u8) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, n), 40000)
    }

    fn seg(to: SocketAddrV4, seq: u32, flags: u8, payload: &[u8]) -> TcpPacket<'_> {
        TcpPacket {
            src: Ipv4Addr::new(198, 18, 0, 3),
            dst: *to.ip(),
            src_port: 3306,
            dst_port: to.port(),
            seq: SeqNumber(seq),
            ack: SeqNumber(1),
            flags: TcpFlags(flags),
            window: 100,
            options: TcpOptions::default(),
            ip_id: 0,
            ttl: 64,
            payload,
            payload_len: payload.len() as u32,
        }
    }

    const SA: u8 = TcpFlags::SYN | TcpFlags::ACK;
    const A: u8 = TcpFlags::ACK;
    const FA: u8 = TcpFlags::FIN | TcpFlags::ACK;

    fn pkt(seq_id: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as u32).to_le_bytes()[..3].to_vec();
        v.push(seq_id);
        v.extend_from_slice(payload);
        v
    }

    fn t(s: u64) -> Instant {
        Instant::from_nanos(s * 1_000_000_000)
    }

    fn packets(evs: &[MysqlEvent]) -> Vec<(u64, u8, Vec<u8>)> {
        evs.iter()
            .filter_map(|e| match e {
                MysqlEvent::Packet { packet: p, .. } => {
                    Some((p.stream_offset, p.seq_id, p.head.to_vec()))
                }
                MysqlEvent::FramingLost { .. }
                | MysqlEvent::FramingResumed { .. }
                | MysqlEvent::Rows { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_session_is_framed_from_its_syn_ack() {
        let mut m = MysqlSessions::new(SessionConfig::default());
        let mut out = Vec::new();
        m.on_segment(t(0), &seg(client(10), ISN, SA, b""), &mut out);
        let greeting = pkt(0, b"\x0a11.8.3-MariaDB\0");
        m.on_segment(
            t(0),
            &seg(client(10), ISN.wrapping_add(1), A, &greeting),
            &mut out,
        );
        // The SYN-ACK again (the client's ACK was lost): the session goes on.
        m.on_segment(t(0), &seg(client(10), ISN, SA, b""), &mut out);
        let ok = pkt(2, b"\0\0\0\x02\0\0\0");
        let next = ISN.wrapping_add(1 + greeting.len() as u32);
        m.on_segment(t(1), &seg(client(10), next, A, &ok), &mut out);
        assert_eq!(
            packets(&out),
            [
                (0, 0, greeting[4..].to_vec()),
                (greeting.len() as u64, 2, ok[4..].to_vec())
            ]
        );
        match &out[1] {
            MysqlEvent::Packet { client: c, packet } => {
                assert_eq!(*c, client(10));
                assert_eq!(packet.tcp_seq, next);
                assert_eq!(packet.framed_at_us, 1_000_000, "framed at t = 1 s");
            }
            other => panic!("{other:?}"),
        }
        let s = m.stats();
        assert_eq!((s.sessions_framed, s.packets, s.framing_lost), (1, 2, 0));
    }

    #[test]
    fn with_folding_a_segments_rows_go_out_as_one_run_before_the_packet_that_ends_them() {
        let mut m = MysqlSessions::new(SessionConfig::default());
        m.set_folding(true);
        let mut out = Vec::new();
        m.on_segment(t(0), &seg(client(10), ISN, SA, b""), &mut out);
        let mut reply = pkt(1, &[1]);
        reply.extend(pkt(2, b"\x03def\0\0\0\x01c\0\x0c\x3f\0"));
        reply.extend(pkt(3, &[0xfe, 0, 0, 2, 0]));
        let rows: Vec<u8> = (4..14).flat_map(|i| pkt(i, b"\x01x")).collect();
        let (first, second) = rows.split_at(3 * 6 + 2);
        reply.extend_from_slice(first);
        let mut seq = ISN.wrapping_add(1);
        m.on_segment(t(0), &seg(client(10), seq, A, &reply), &mut out);
        seq = seq.wrapping_add(reply.len() as u32);
        let mut tail = second.to_vec();
        tail.extend(pkt(14, &[0xfe, 0, 0, 2, 0]));
        m.on_segment(t(1), &seg(client(10), seq, A, &tail), &mut out);
        let kinds: Vec<String> = out
            .iter()
            .map(|e| match e {
                MysqlEvent::Packet { packet, .. } => format!("P{}", packet.seq_id),
                MysqlEvent::Rows { rows, .. } => format!("R{}x{}", rows.seq_id, rows.count),
                MysqlEvent::FramingLost { .. } => "L".into(),
                MysqlEvent::FramingResumed { .. } => "S".into(),
            })
            .collect();
        // The definition, the EOF after it and three rows in the first segment; the fourth
        // row's head comes with the second segment, which folds it and the last six and sends
        // the EOF that ends them.
        assert_eq!(kinds, ["P1", "R2x5", "R7x7", "P14"]);
        let s = m.stats();
        assert_eq!((s.packets, s.folded, s.runs), (14, 12, 2));
    }

    const STATS: &[u8] = b"Uptime: 84  Threads: 9  Questions: 2811  Slow queries: 0  Opens: 17  \
                            Open tables: 10  Queries per second avg: 33.464";

    #[test]
    fn a_lost_session_is_framed_again_after_the_copiers_statistics_probe() {
        let mut m = MysqlSessions::new(SessionConfig::default());
        let mut out = Vec::new();
        // Mid-stream: the tail of some result set, then (its own segment) an OK.
        m.on_segment(t(0), &seg(client(10), 5000, A, &[1; 10]), &mut out);
        // The probe's answer arrives glued to the end of an earlier reply, and the reply to the
        // command after the probe follows in the same segment.
        let mut data = vec![7u8; 9];
        data.extend(pkt(1, STATS));
        let end = data.len();
        data.extend(pkt(1, &[0, 0, 0, 2, 0, 0, 0]));
        m.on_segment(t(1), &seg(client(10), 5010, A, &data), &mut out);
        assert_eq!(
            out[..2],
            [
                MysqlEvent::FramingLost {
                    client: client(10),
                    at_seq: 5000
                },
                MysqlEvent::FramingResumed {
                    client: client(10),
                    at_seq: 5010 + end as u32
                }
            ]
        );
        // Offsets count from the probe's end.
        assert_eq!(packets(&out), [(0, 1, vec![0, 0, 0, 2, 0, 0, 0])]);
        let more = pkt(1, &[0xff, 0x10, 0x04]);
        out.clear();
        m.on_segment(
            t(2),
            &seg(client(10), 5010 + data.len() as u32, A, &more),
            &mut out,
        );
        assert_eq!(packets(&out), [(11, 1, vec![0xff, 0x10, 0x04])]);
        assert_eq!(m.stats().framing_resumed, 1);
    }

    #[test]
    fn only_a_whole_printable_statistics_reply_is_a_boundary() {
        let whole = pkt(1, STATS);
        assert_eq!(
            statistics_reply_end(&whole, whole.len() as u32),
            Some(whole.len())
        );
        // Cut short, by the segment or by the snap length.
        assert_eq!(statistics_reply_end(&whole[..whole.len() - 1], 1000), None);
        assert_eq!(statistics_reply_end(&whole, whole.len() as u32 - 1), None);
        // Another sequence id, or a header that claims more than the body can be.
        let mut other = whole.clone();
        other[3] = 2;
        assert_eq!(statistics_reply_end(&other, 1000), None);
        let mut binary = whole.clone();
        binary[20] = 0;
        assert_eq!(statistics_reply_end(&binary, 1000), None);
        // The mark with no room for a header before it.
        assert_eq!(statistics_reply_end(b"\x01Uptime: 1", 100), None);
        // Two answers: framing starts after the last.
        let mut two = whole.clone();
        two.extend_from_slice(&whole);
        assert_eq!(statistics_reply_end(&two, 1000), Some(two.len()));
    }

    #[test]
    fn a_session_picked_up_mid_stream_is_reported_once() {
        let mut m = MysqlSessions::new(SessionConfig::default());
        let mut out = Vec::new();
        for i in 0..3 {
            m.on_segment(t(0), &seg(client(10), 5000 + i * 10, A, &[1; 10]), &mut out);
        }
        assert_eq!(
            out,
            [MysqlEvent::FramingLost {
                client: client(10),
                at_seq: 5000
            }]
        );
        // A new connection from the same address is framed again.
        out.clear();
        m.on_segment(t(1), &seg(client(10), 7, SA, b""), &mut out);
        m.on_segment(t(1), &seg(client(10), 8, A, &pkt(0, b"hi")), &mut out);
        assert_eq!(packets(&out), [(0, 0, b"hi".to_vec())]);
        assert_eq!(m.stats().lost_midstream, 1);
    }

    #[test]
    fn all_sessions_holds_are_bounded_together() {
        // Each session may hold 256 KiB; together they may hold 300 bytes.
        let mut m = MysqlSessions::new(SessionConfig {
            max_held_total: 300,
            ..SessionConfig::default()
        });
        let mut out = Vec::new();
        let stream: Vec<u8> = (0..8u8).flat_map(|i| pkt(i, &[i; 60])).collect();
        for c in [10, 11] {
            m.on_segment(t(0), &seg(client(c), 99, SA, b""), &mut out);
            // Two segments after a gap: 128 bytes held.
            for k in [2u32, 3] {
                let chunk = &stream[k as usize * 64..(k as usize + 1) * 64];
                m.on_segment(t(0), &seg(client(c), 100 + k * 64, A, chunk), &mut out);
            }
        }
        assert!(out.is_empty(), "256 bytes held, under the bound: {out:?}");
        // A third session's hold passes the bound: it gives its framing up, the others keep it.
        m.on_segment(t(0), &seg(client(12), 99, SA, b""), &mut out);
        m.on_segment(
            t(0),
            &seg(client(12), 100 + 2 * 64, A, &stream[128..192]),
            &mut out,
        );
        assert_eq!(
            out,
            [MysqlEvent::FramingLost {
                client: client(12),
                at_seq: 100
            }]
        );
        assert_eq!((m.stats().lost_memory, m.stats().framing_lost), (1, 1));
        // The first session's gap fills: its held bytes are framed and given back.
        out.clear();
        m.on_segment(t(0), &seg(client(10), 100, A, &stream[..128]), &mut out);
        assert_eq!(packets(&out).len(), 4, "packets 0 to 3");
        assert_eq!(m.held_total, 128);
        m.on_segment(t(0), &seg(client(12), 99, SA, b""), &mut out);
        m.sweep(t(100_000));
        assert_eq!(m.held_total, 0);
    }

    #[test]
    fn a_gap_that_does_not_fill_stops_framing_until_a_new_syn_ack() {
        // A small hold, so a short stream overflows it (the default holds 256 KiB).
        let mut m = MysqlSessions::new(SessionConfig {
            hold: HoldLimits {
                segments: 8,
                bytes: 256 * 1024,
            },
            ..SessionConfig::default()
        });
        let mut out = Vec::new();
        m.on_segment(t(0), &seg(client(10), 99, SA, b""), &mut out);
        let stream: Vec<u8> = (0..40u8).flat_map(|i| pkt(i, &[i; 60])).collect();
        for (k, chunk) in stream.chunks(64).enumerate().filter(|(k, _)| *k != 1) {
            m.on_segment(
                t(0),
                &seg(client(10), 100 + k as u32 * 64, A, chunk),
                &mut out,
            );
        }
        let lost: Vec<_> = out
            .iter()
            .filter(|e| matches!(e, MysqlEvent::FramingLost { .. }))
            .collect();
        assert_eq!(
            lost,
            [&MysqlEvent::FramingLost {
                client: client(10),
                at_seq: 164
            }]
        );
        assert_eq!(packets(&out).len(), 1, "only the packet before the gap");
        let s = m.stats();
        assert_eq!((s.lost_gap, s.reassembly.holes), (1, 1));
    }

    #[test]
    fn sessions_end_after_fin_and_linger_and_when_idle() {
        let cfg = SessionConfig {
            idle_timeout: Duration::from_secs(100),
            linger: Duration::from_secs(5),
            ..SessionConfig::default()
        };
        let mut m = MysqlSessions::new(cfg);
        let mut out = Vec::new();
        m.on_segment(t(0), &seg(client(10), 0, SA, b""), &mut out);
        m.on_segment(t(0), &seg(client(11), 0, SA, b""), &mut out);
        m.on_segment(t(1), &seg(client(10), 1, FA, &pkt(0, b"bye")), &mut out);
        assert_eq!(packets(&out).len(), 1, "data in the FIN segment is framed");
        m.sweep(t(3));
        assert_eq!(m.len(), 2, "still lingering");
        // A retransmission during the linger is recognised, not a new mid-stream session.
        m.on_segment(t(4), &seg(client(10), 1, FA, &pkt(0, b"bye")), &mut out);
        assert_eq!(out.len(), 1);
        m.sweep(t(7));
        assert_eq!(m.len(), 1);
        m.sweep(t(101));
        assert!(m.is_empty());
        assert_eq!(m.stats().sessions_expired, 1);
    }

    #[test]
    fn the_session_count_is_bounded() {
        let mut m = MysqlSessions::new(SessionConfig {
            max_sessions: 2,
            ..SessionConfig::default()
        });
        let mut out = Vec::new();
        for n in 0..3 {
            m.on_segment(t(0), &seg(client(10 + n), 0, SA, b""), &mut out);
        }
        assert_eq!(m.len(), 2);
        assert_eq!(
            out,
            [MysqlEvent::FramingLost {
                client: client(12),
                at_seq: 1
            }]
        );
        // Data for the shed session: counted, not repeated to the copier.
        m.on_segment(t(0), &seg(client(12), 1, A, &pkt(0, b"x")), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(m.stats().sessions_shed, 2);
        // A known address reconnecting still gets a slot.
        m.on_segment(t(0), &seg(client(10), 500, SA, b""), &mut out);
        assert_eq!(m.stats().sessions_framed, 3);
    }

    mod props {
        use super::*;
        use common::control::{MAX_MYSQL_HEAD, MYSQL_FULL_HEAD_PACKETS};
        use proptest::prelude::*;

        /// MySQL packets as (seq_id, payload).
        fn arb_packets() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
            let len = prop_oneof![0usize..20, 0usize..300, 900usize..1300];
            proptest::collection::vec(
                (any::<u8>(), len, any::<u8>())
                    .prop_map(|(id, n, b)| (id, (0..n).map(|i| b.wrapping_add(i as u8)).collect())),
                0..30,
            )
        }

        /// How the stream is cut, retransmitted and reordered.
        #[derive(Debug, Clone)]
        struct Delivery {
            cuts: Vec<usize>,
            /// (segment index, position) of exact retransmissions.
            dups: Vec<(usize, usize)>,
            /// (start fraction, length, position) of re-cut retransmissions of sent bytes.
            recuts: Vec<(f64, usize, usize)>,
            /// (position) of retransmitted SYN-ACKs.
            syn_acks: Vec<usize>,
            /// Sort keys: a permutation of everything after the first SYN-ACK.
            order: Vec<u32>,
        }

        fn arb_delivery() -> impl Strategy<Value = Delivery> {
            (
                proptest::collection::vec(1usize..400, 1..60),
                proptest::collection::vec((any::<usize>(), any::<usize>()), 0..10),
                proptest::collection::vec((0.0f64..1.0, 1usize..500, any::<usize>()), 0..6),
                proptest::collection::vec(any::<usize>(), 0..3),
                proptest::collection::vec(any::<u32>(), 200),
            )
                .prop_map(|(cuts, dups, recuts, syn_acks, order)| Delivery {
                    cuts,
                    dups,
                    recuts,
                    syn_acks,
                    order,
                })
        }

        fn wire(packets: &[(u8, Vec<u8>)]) -> Vec<u8> {
            packets
                .iter()
                .flat_map(|(id, p)| {
                    let mut v = (p.len() as u32).to_le_bytes()[..3].to_vec();
                    v.push(*id);
                    v.extend_from_slice(p);
                    v
                })
                .collect()
        }

        /// Segments as (stream offset, length) in delivery order; SYN-ACKs as `None`.
        fn schedule(total: usize, d: &Delivery) -> Vec<Option<(usize, usize)>> {
            let mut segs = Vec::new();
            let mut at = 0;
            let mut cuts = d.cuts.iter().cycle();
            while at < total {
                let n = (*cuts.next().unwrap_or(&100)).min(total - at);
                segs.push((at, n));
                at += n;
            }
            let mut all: Vec<Option<(usize, usize)>> = segs.iter().copied().map(Some).collect();
            if !segs.is_empty() {
                for &(i, _) in &d.dups {
                    all.push(Some(segs[i % segs.len()]));
                }
                for &(frac, len, _) in &d.recuts {
                    let start = ((total as f64) * frac) as usize % total;
                    all.push(Some((start, len.min(total - start))));
                }
            }
            for _ in &d.syn_acks {
                all.push(None);
            }
            // Arbitrary order: every segment arrives, any number of times, in any order.
            let mut keyed: Vec<_> = all
                .into_iter()
                .enumerate()
                .map(|(i, s)| (d.order[i % d.order.len()].wrapping_add(i as u32), s))
                .collect();
            keyed.sort_by_key(|(k, _)| *k);
            keyed.into_iter().map(|(_, s)| s).collect()
        }

        proptest! {
            #[test]
            fn summaries_equal_the_packets_whatever_the_segmentation_and_order(
                packets in arb_packets(),
                d in arb_delivery(),
                isn in any::<u32>(),
                later in 0usize..40,
            ) {
                let stream = wire(&packets);
                let cfg = SessionConfig {
                    head: later,
                    // Bounds are tested elsewhere; here every reordering must be absorbed.
                    hold: HoldLimits { segments: usize::MAX, bytes: usize::MAX },
                    ..SessionConfig::default()
                };
                let mut m = MysqlSessions::new(cfg);
                let c = client(10);
                let mut out = Vec::new();
                m.on_segment(t(0), &seg(c, isn, SA, b""), &mut out);
                for s in schedule(stream.len(), &d) {
                    match s {
                        None => m.on_segment(t(0), &seg(c, isn, SA, b""), &mut out),
                        Some((at, n)) => {
                            let seq = isn.wrapping_add(1).wrapping_add(at as u32);
                            m.on_segment(t(0), &seg(c, seq, A, &stream[at..at + n]), &mut out)
                        }
                    }
                }
                let mut want = Vec::new();
                let mut offset = 0u64;
                for (i, (id, p)) in packets.iter().enumerate() {
                    let head = if (i as u64) < MYSQL_FULL_HEAD_PACKETS { MAX_MYSQL_HEAD } else { later };
                    want.push(MysqlEvent::Packet {
                        client: c,
                        packet: MysqlPacket {
                            stream_offset: offset,
                            tcp_seq: isn.wrapping_add(1).wrapping_add(offset as u32),
                            seq_id: *id,
                            len: p.len() as u32,
                            head: p[..p.len().min(head)].into(),
                            hash: None,
                            framed_at_us: 0,
                        },
                    });
                    offset += 4 + p.len() as u64;
                }
                prop_assert_eq!(m.stats().framing_lost, 0, "{:?} total {}", m.stats(), stream.len());
                prop_assert_eq!(out, want);
            }

            #[test]
            fn garbage_never_panics(
                segs in proptest::collection::vec(
                    (any::<u8>(), any::<u32>(), any::<u8>(), proptest::collection::vec(any::<u8>(), 0..300), 0u32..400),
                    0..60),
                max_sessions in 1usize..4,
            ) {
                let mut m = MysqlSessions::new(SessionConfig {
                    max_sessions,
                    hold: HoldLimits { segments: 3, bytes: 500 },
                    ..SessionConfig::default()
                });
                let mut out = Vec::new();
                for (i, (who, seq, flags, payload, extra)) in segs.iter().enumerate() {
                    let mut p = seg(client(who % 5), *seq, *flags, payload);
                    // Sometimes the capture was cut short of the wire length.
                    p.payload_len += extra % 3 * extra;
                    m.on_segment(t(i as u64), &p, &mut out);
                    if i % 7 == 0 {
                        m.sweep(t(i as u64 * 3));
                    }
                }
                for e in &out {
                    if let MysqlEvent::Packet { packet, .. } = e {
                        prop_assert!(packet.head.len() <= MAX_MYSQL_HEAD);
                        prop_assert!(packet.head.len() as u64 <= u64::from(packet.len));
                    }
                }
                prop_assert!(m.len() <= max_sessions);
            }
        }
    }
}
