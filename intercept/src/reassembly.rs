//! Puts one connection's captured reply segments back into stream order for the framer.
//!
//! Capture sees the test server's segments as they pass: retransmitted, overlapping, now and
//! then out of order or missing (kernel drops, loss on the way to this host). This room trims
//! what was already framed, holds a few segments that arrived early, and says when a gap can no
//! longer be expected to fill. It must never hold more than its [`HoldLimits`], and never guess
//! across a gap: after one, every byte could be framed wrongly.
//!
//! A gap that fills is the normal case: the copier only acknowledges what intercept relayed, so
//! the test server retransmits what capture missed. A gap that does not fill shows up as a hold
//! that overflows (the server keeps sending past it) or as bytes cut by the snap length.
//!
//! Why this is not the copier's reassembler (`copier::engine::reassembly`, for the captured
//! client and production streams), although both trim and hold segments (issue #19 asked for
//! one where the constraints allow):
//!
//! * **Past the bound, they must do opposite things.** The copier drops the segment that does
//!   not fit and goes on (the sender retransmits, or a gap proven by the other side's ACKs or
//!   its timer is given up with `skip_to` and the stream resumes after it). Here nothing can go
//!   on after a gap: this stream is only framed, and a MySQL stream cannot be framed again from
//!   an arbitrary byte, so it stops for good ([`Lost`]) and the copier is told, to resync with
//!   its probe.
//! * **They bound different things.** The copier bounds holes (8) and how far ahead a byte
//!   may lie, holding the bytes in one boxed ring so that an idle session costs a pointer.
//!   Here the bound is held bytes and held segments ([`HoldLimits`]): one lost segment with a
//!   full window behind it must fit, the bytes count against `--max-memory` across sessions,
//!   and dropped segments are counted ([`ReassemblyStats`]). Swapping either bound changes
//!   what the other side tolerates (a flood of tiny out-of-order segments, many holes).
//! * **Their streams differ.** The copier's are in raw sequence space, with a FIN, a start
//!   that moves on a mid-stream pickup (`rebase`) and held runs it reads back to decide where
//!   a proven gap ends (`first_held_run`); this one is the test server's reply from the
//!   SYN-ACK, in 64-bit stream offsets, with segments the snap length may have cut
//!   ([`LostReason::Snapped`]).
//!
//! A generic reassembler would have a policy parameter for each of these and no code left in
//! common; what they do share, sequence arithmetic, is [`common::seq::SeqNumber`].

use std::collections::BTreeMap;

use common::seq::SeqNumber;

use crate::framer::{FrameSink, HeadSizes, PacketFramer};

/// How much one connection may hold while it waits for a gap to fill.
///
/// The bytes are the real bound: one segment missed mid-reply leaves everything the server
/// had in flight behind it (a congestion window of tens of segments is common) to hold until
/// the retransmission arrives. The segment count only bounds the bookkeeping (one map entry
/// and allocation per segment) against floods of tiny segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldLimits {
    pub segments: usize,
    pub bytes: usize,
}

impl Default for HoldLimits {
    fn default() -> Self {
        HoldLimits {
            // Above what the byte bound allows at a 1460-byte MSS (about 180 segments).
            segments: 256,
            bytes: 256 * 1024,
        }
    }
}

/// Counters of reassembly, summed over connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Segments whose bytes had all been framed already (retransmissions).
    pub duplicates: u64,
    /// Gaps opened: a segment arrived beyond the next expected byte.
    pub holes: u64,
    /// Segments put on hold until a gap before them filled.
    pub ooo_held: u64,
    /// Held segments thrown away because framing stopped or the connection went away.
    pub ooo_dropped: u64,
}

/// Why framing a connection stopped for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// A gap did not fill before the hold overflowed.
    HoldFull,
    /// The capture cut a segment short (snap length), so its tail will never be seen.
    Snapped,
}

/// Framing stopped at sequence number `at_seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lost {
    pub at_seq: SeqNumber,
    pub reason: LostReason,
}

/// One connection's reply stream, from the SYN-ACK on.
#[derive(Debug)]
pub struct ReplyStream {
    framer: PacketFramer,
    base_seq: SeqNumber,
    /// Early segments by stream offset.
    held: BTreeMap<u64, Vec<u8>>,
    held_bytes: usize,
    limits: HoldLimits,
}

impl ReplyStream {
    /// A stream whose first byte has sequence number `base_seq` (the SYN-ACK's ISN + 1).
    pub fn new(base_seq: SeqNumber, sizes: HeadSizes, limits: HoldLimits) -> Self {
        ReplyStream {
            framer: PacketFramer::new(base_seq, sizes),
            base_seq,
            held: BTreeMap::new(),
            held_bytes: 0,
            limits,
        }
    }

    pub fn base_seq(&self) -> SeqNumber {
        self.base_seq
    }

    /// Segments held right now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Payload bytes held right now (for the sessions' shared bound, `--max-memory`).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Sequence number of the next byte to frame: where framing stops if the stream is dropped.
    pub fn framed_to(&self) -> SeqNumber {
        self.next_seq()
    }

    /// Payload hashes on or off from the next packet (see [`PacketFramer::set_hashing`]).
    pub fn set_hashing(&mut self, on: bool) {
        self.framer.set_hashing(on);
    }

    /// MySQL packets whose header has been read.
    pub fn packets(&self) -> u64 {
        self.framer.packets()
    }

    fn next_seq(&self) -> SeqNumber {
        // Only the offset's low 32 bits move the number: offsets grow past 4 GiB, seqs wrap.
        self.base_seq + self.framer.offset() as u32
    }

    /// Takes one segment: `seq` numbers `data[0]`, `data` is what was captured of a payload of
    /// `wire_len` bytes. Emits the packets whose head this segment completes (or, through held
    /// segments it unblocks, later ones). After `Err`, the stream must be dropped.
    pub fn on_segment(
        &mut self,
        seq: SeqNumber,
        data: &[u8],
        wire_len: u32,
        stats: &mut ReassemblyStats,
        emit: &mut impl FrameSink,
    ) -> Result<(), Lost> {
        let wire_len = u64::from(wire_len);
        let data = &data[..data.len().min(wire_len as usize)];
        let captured = data.len() as u64;
        if wire_len == 0 {
            return Ok(());
        }
        let next = self.framer.offset();
        // Relative to the next expected byte; a TCP window never spans 2^31, so the signed
        // distance is unambiguous.
        let rel = i64::from(seq - self.next_seq());
        if rel > 0 {
            if captured < wire_len {
                return Err(self.lost(LostReason::Snapped, stats));
            }
            return self.hold(next + rel as u64, data, stats);
        }
        let skip = rel.unsigned_abs();
        if skip >= wire_len {
            stats.duplicates += 1;
            return Ok(());
        }
        if skip < captured {
            self.framer.feed(&data[skip as usize..], emit);
        }
        if captured < wire_len {
            return Err(self.lost(LostReason::Snapped, stats));
        }
        self.drain_held(stats, emit);
        Ok(())
    }

    fn hold(&mut self, start: u64, data: &[u8], stats: &mut ReassemblyStats) -> Result<(), Lost> {
        if let Some(h) = self.held.get(&start) {
            if h.len() >= data.len() {
                stats.duplicates += 1;
                return Ok(());
            }
        }
        let replaced = self.held.get(&start).map_or(0, Vec::len);
        let fits = self.held.len() - usize::from(replaced > 0) < self.limits.segments
            && self.held_bytes - replaced + data.len() <= self.limits.bytes;
        if !fits {
            return Err(self.lost(LostReason::HoldFull, stats));
        }
        if self.held.is_empty() {
            stats.holes += 1;
        }
        stats.ooo_held += 1;
        self.held_bytes = self.held_bytes - replaced + data.len();
        self.held.insert(start, data.to_vec());
        Ok(())
    }

    fn drain_held(&mut self, stats: &mut ReassemblyStats, emit: &mut impl FrameSink) {
        while let Some(entry) = self.held.first_entry() {
            let start = *entry.key();
            let next = self.framer.offset();
            if start > next {
                return;
            }
            let data = entry.remove();
            self.held_bytes -= data.len();
            let skip = next - start;
            if skip < data.len() as u64 {
                self.framer.feed(&data[skip as usize..], emit);
            } else {
                stats.duplicates += 1;
            }
        }
    }

    fn lost(&mut self, reason: LostReason, stats: &mut ReassemblyStats) -> Lost {
        self.discard(stats);
        Lost {
            at_seq: self.next_seq(),
            reason,
        }
    }

    /// Throws the held segments away (counted), e.g. when the connection ends.
    pub fn discard(&mut self, stats: &mut ReassemblyStats) {
        stats.ooo_dropped += self.held.len() as u64;
        self.held.clear();
        self.held_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::control::MysqlPacket;

    const BASE: SeqNumber = SeqNumber(u32::MAX - 10);

    fn pkt(seq_id: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as u32).to_le_bytes()[..3].to_vec();
        v.push(seq_id);
        v.extend_from_slice(payload);
        v
    }

    struct Harness {
        s: ReplyStream,
        stats: ReassemblyStats,
        out: Vec<MysqlPacket>,
    }

    impl Harness {
        fn new() -> Self {
            Harness {
                s: ReplyStream::new(BASE, HeadSizes { later: 16 }, HoldLimits::default()),
                stats: ReassemblyStats::default(),
                out: Vec::new(),
            }
        }
        /// Delivers `stream[from..to]` as one segment.
        fn seg(&mut self, stream: &[u8], from: usize, to: usize) -> Result<(), Lost> {
            let out = &mut self.out;
            self.s.on_segment(
                BASE + from,
                &stream[from..to],
                (to - from) as u32,
                &mut self.stats,
                &mut |p| out.push(p),
            )
        }
        fn ids(&self) -> Vec<u8> {
            self.out.iter().map(|p| p.seq_id).collect()
        }
    }

    fn three_packets() -> Vec<u8> {
        [pkt(0, b"greeting"), pkt(1, b"ok"), pkt(2, b"more")].concat()
    }

    #[test]
    fn retransmitted_and_overlapping_segments_are_trimmed() {
        let st = three_packets();
        let mut h = Harness::new();
        h.seg(&st, 0, 10).unwrap();
        h.seg(&st, 0, 10).unwrap(); // whole retransmission
        h.seg(&st, 5, 15).unwrap(); // overlaps the framed part
        h.seg(&st, 12, st.len()).unwrap();
        assert_eq!(h.ids(), [0, 1, 2]);
        assert_eq!(&h.out[1].head[..], b"ok");
        assert_eq!(h.stats.duplicates, 1);
        assert_eq!(h.stats.holes, 0);
    }

    #[test]
    fn out_of_order_segments_wait_for_the_gap_then_flow() {
        let st = three_packets();
        let mut h = Harness::new();
        h.seg(&st, 14, st.len()).unwrap();
        h.seg(&st, 6, 14).unwrap();
        assert!(h.out.is_empty());
        assert_eq!((h.stats.holes, h.stats.ooo_held, h.s.held()), (1, 2, 2));
        h.seg(&st, 0, 6).unwrap();
        assert_eq!(h.ids(), [0, 1, 2]);
        assert_eq!(&h.out[0].head[..], b"greeting");
        assert_eq!(h.s.held(), 0);
        assert_eq!(h.out[2].tcp_seq, (BASE + 18usize).0);
    }

    #[test]
    fn held_segments_overlapping_each_other_are_trimmed_too() {
        let st = three_packets();
        let mut h = Harness::new();
        h.seg(&st, 4, 16).unwrap();
        h.seg(&st, 8, st.len()).unwrap();
        h.seg(&st, 4, 10).unwrap(); // shorter copy at a held offset: nothing new
        h.seg(&st, 0, 5).unwrap();
        assert_eq!(h.ids(), [0, 1, 2]);
        assert_eq!(&h.out[2].head[..], b"more");
    }

    const MSS: usize = 1460;

    /// `n` MySQL packets of exactly one MSS each (header included), ids 0, 1, ...
    fn mss_packets(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| pkt(i as u8, &[i as u8; MSS - 4]))
            .collect()
    }

    #[test]
    fn a_lost_segment_with_a_large_window_in_flight_is_recovered() {
        // 64 full-size segments in flight behind one the capture missed (far more than the
        // old 8-segment hold): all are held, then the retransmission unblocks them.
        let st = mss_packets(66);
        let mut h = Harness::new();
        h.seg(&st, 0, MSS).unwrap();
        for k in 2..66 {
            h.seg(&st, k * MSS, (k + 1) * MSS).unwrap();
        }
        assert_eq!(h.s.held(), 64);
        assert_eq!(h.ids(), [0]);
        h.seg(&st, MSS, 2 * MSS).unwrap(); // the retransmission
        assert_eq!(h.ids(), (0..66u8).collect::<Vec<_>>());
        assert_eq!((h.s.held(), h.stats.holes, h.stats.ooo_dropped), (0, 1, 0));
    }

    #[test]
    fn a_gap_that_does_not_fill_overflows_the_hold() {
        let st = mss_packets(250);
        let mut h = Harness::new();
        h.seg(&st, 0, MSS).unwrap();
        // Segment [MSS, 2 MSS) is lost; the server keeps sending.
        let mut res = Ok(());
        for k in 2..250 {
            res = h.seg(&st, k * MSS, (k + 1) * MSS);
            if res.is_err() {
                break;
            }
        }
        let lost = res.unwrap_err();
        assert_eq!(lost.reason, LostReason::HoldFull);
        assert_eq!(lost.at_seq, BASE + MSS, "where framing stopped");
        // The byte bound is what overflowed: 256 KiB of full-size segments.
        let fit = (256 * 1024 / MSS) as u64;
        assert_eq!(h.stats.ooo_held, fit);
        assert_eq!(h.stats.ooo_dropped, fit);
        assert_eq!(h.s.held(), 0);
        assert_eq!(h.ids(), [0]);
    }

    #[test]
    fn the_segment_cap_bounds_floods_of_tiny_segments() {
        let st = vec![0u8; 1000];
        let mut h = Harness::new();
        let mut res = Ok(());
        for k in 1..400 {
            res = h.seg(&st, 2 * k, 2 * k + 1);
            if res.is_err() {
                break;
            }
        }
        assert_eq!(res.unwrap_err().reason, LostReason::HoldFull);
        assert_eq!(h.stats.ooo_held, HoldLimits::default().segments as u64);
    }

    #[test]
    fn the_byte_bound_counts_too() {
        let st = vec![0u8; 400 * 1024];
        let mut h = Harness::new();
        h.seg(&st, 10, 100_010).unwrap();
        h.seg(&st, 100_010, 200_010).unwrap();
        let lost = h.seg(&st, 200_010, 300_010).unwrap_err();
        assert_eq!(lost.reason, LostReason::HoldFull);
    }

    #[test]
    fn a_snapped_segment_ends_framing_where_its_capture_ends() {
        let st = three_packets();
        let mut h = Harness::new();
        let out = &mut h.out;
        let lost =
            h.s.on_segment(BASE, &st[..18], st.len() as u32, &mut h.stats, &mut |p| {
                out.push(p)
            })
            .unwrap_err();
        assert_eq!(lost.reason, LostReason::Snapped);
        assert_eq!(lost.at_seq, BASE + 18usize);
        assert_eq!(h.ids(), [0, 1]);
        // A snapped retransmission of bytes already framed is harmless.
        let mut h = Harness::new();
        h.seg(&st, 0, st.len()).unwrap();
        let out = &mut h.out;
        h.s.on_segment(BASE, &st[..3], st.len() as u32, &mut h.stats, &mut |p| {
            out.push(p)
        })
        .unwrap();
    }
}
