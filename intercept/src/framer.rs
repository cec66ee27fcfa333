//! Cuts the test server's in-order reply bytes of one connection into MySQL packets and makes
//! the summaries ([`MysqlPacket`]) intercept relays to copiers.
//!
//! The cutting is not done here: [`PacketFramer`] is an adapter around the one MySQL framer,
//! [`common::mysql::packet::FrameScanner`], which the copier uses on its side too. This room
//! adds only what a summary needs: how many head bytes each packet keeps ([`HeadSizes`]), the
//! TCP sequence number of each packet, payload hashes switched on and off as copiers come and
//! go, and the stream offset a skimmed packet starts at. It must never buffer a whole payload
//! (a result row can be 16 MiB) and never interpret one: what the bytes mean is the copier's
//! business (and the [`FrameSink`]'s, which folds rows).
//!
//! With payload hashes on (a copier asked for them, `--compare-results`), every payload byte
//! also goes through a payload hasher and each packet is emitted when it *ends*, with its
//! hash, instead of when its head is in: the copier compares the rows' hashes with
//! production's. Still nothing of the payload is kept.
//!
//! It is fed bytes strictly in stream order, without gaps; the reassembly in
//! [`crate::reassembly`] guarantees that. There is no way to find a header again after a gap
//! (any byte may start one), so a gap ends framing for good.

use common::control::{MysqlHead, MysqlPacket, MAX_MYSQL_HEAD, MYSQL_FULL_HEAD_PACKETS};
use common::mysql::fold::RowFolder;
use common::mysql::packet::{FrameHeader, FrameScanner, ScanSink, ScannedPacket, HEADER_LEN};
use common::seq::SeqNumber;

/// Where framed packets go.
pub trait FrameSink {
    /// A packet whose header and first payload bytes (at least `min(len, RowFolder::SKIM_HEAD)`
    /// of them) are in one piece of input: true if the sink took it as it is (folded it into a
    /// run), so that no summary is built. Asked only while hashes are off and only at a
    /// packet's start; a packet it declines goes to [`Self::packet`] as usual.
    fn skim(&mut self, _seq_id: u8, _len: u32, _stream_offset: u64, _head: &[u8]) -> bool {
        false
    }

    /// A packet's summary, as soon as its head is complete (with hashes, at its end).
    fn packet(&mut self, p: MysqlPacket);
}

impl<F: FnMut(MysqlPacket)> FrameSink for F {
    fn packet(&mut self, p: MysqlPacket) {
        self(p)
    }
}

// The scanner shows a skimming sink its first SKIM_HEAD payload bytes; the folder decides on
// its own SKIM_HEAD. The promise to `FrameSink::skim` holds only if the first is enough.
const _: () = assert!(FrameScanner::SKIM_HEAD >= RowFolder::SKIM_HEAD);

/// Head sizes of a connection's packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadSizes {
    /// Head bytes of every packet after the first [`MYSQL_FULL_HEAD_PACKETS`].
    pub later: usize,
}

impl HeadSizes {
    /// How much of a packet's payload to keep. The first packets are the greeting and the auth
    /// exchange, which the copier needs whole (scrambles, an RSA key); afterwards a few bytes
    /// tell OK from ERR from a result set. A continuation packet's bytes are the middle of a
    /// payload: as a head they would only mislead whoever classifies packets by their first byte.
    fn for_packet(&self, index: u64, len: u32, continuation: bool) -> usize {
        let want = if continuation {
            0
        } else if index < MYSQL_FULL_HEAD_PACKETS {
            MAX_MYSQL_HEAD
        } else {
            self.later.min(MAX_MYSQL_HEAD)
        };
        want.min(len as usize)
    }
}

/// The framing state of one connection's reply stream.
#[derive(Debug)]
pub struct PacketFramer {
    scanner: FrameScanner,
    summary: Summary,
}

/// What the summaries need beside the scanner (a separate struct so that the scanner and the
/// adapter it reports to can be borrowed together).
#[derive(Debug)]
struct Summary {
    sizes: HeadSizes,
    /// Sequence number of stream offset 0 (the SYN-ACK's ISN + 1).
    base_seq: SeqNumber,
    /// Packets whose header has been read (skimmed ones included).
    packets: u64,
    /// Stream offset of the next packet's header. The scanner tells where the packets it
    /// reports start, not those it offers to skim: this follows both.
    next_header: u64,
    /// Hashes asked for, from the next packet on (the scanner switches at the same header).
    hashing: bool,
}

impl PacketFramer {
    pub fn new(base_seq: SeqNumber, sizes: HeadSizes) -> Self {
        PacketFramer {
            // The prefix is chosen per packet (`Adapter::prefix_len`), not by the scanner.
            scanner: FrameScanner::new(0),
            summary: Summary {
                sizes,
                base_seq,
                packets: 0,
                next_header: 0,
                hashing: false,
            },
        }
    }

    /// Turns payload hashes on or off, from the next packet on.
    pub fn set_hashing(&mut self, on: bool) {
        self.summary.hashing = on;
        self.scanner.set_hashing(on);
    }

    /// Stream offset of the next byte expected.
    pub fn offset(&self) -> u64 {
        self.scanner.position()
    }

    /// Packets whose header has been read so far.
    pub fn packets(&self) -> u64 {
        self.summary.packets
    }

    /// Frames the next in-order bytes, giving `sink` each packet as soon as its head is
    /// complete (a packet whose payload is still arriving is summarised before its end).
    pub fn feed(&mut self, bytes: &[u8], sink: &mut impl FrameSink) {
        let mut adapter = Adapter {
            summary: &mut self.summary,
            sink,
        };
        self.scanner.feed_skimming(bytes, &mut adapter);
    }
}

/// Turns what the scanner reports into summaries for a [`FrameSink`].
struct Adapter<'a, S> {
    summary: &'a mut Summary,
    sink: &'a mut S,
}

impl<S: FrameSink> ScanSink for Adapter<'_, S> {
    fn skim(&mut self, seq: u8, len: u32, head: &[u8]) -> bool {
        let f = &mut *self.summary;
        // The login's packets go out whole, and with hashes every payload must be hashed.
        // Rows are what is left, most of the time: the sink folds them from their first bytes
        // and nothing of them is built or copied (issue 9: framing every row cost a quarter
        // of intercept's capture thread).
        if f.hashing || f.packets < MYSQL_FULL_HEAD_PACKETS {
            return false;
        }
        if !self.sink.skim(seq, len, f.next_header, head) {
            return false;
        }
        f.packets += 1;
        f.next_header += HEADER_LEN as u64 + u64::from(len);
        true
    }

    fn prefix_len(&mut self, header: &FrameHeader, _default: usize) -> usize {
        let f = &mut *self.summary;
        let index = f.packets;
        f.packets += 1;
        f.sizes.for_packet(index, header.len, header.part > 0)
    }

    fn packet(&mut self, p: ScannedPacket<'_>) {
        let h = p.header;
        let f = &mut *self.summary;
        f.next_header = h.payload_offset() + u64::from(h.len);
        self.sink.packet(MysqlPacket {
            stream_offset: h.offset,
            // Wrapping by design: offsets grow past 4 GiB, sequence numbers wrap.
            tcp_seq: (f.base_seq + h.offset as u32).0,
            seq_id: h.seq,
            len: h.len,
            head: MysqlHead::from_slice(p.prefix),
            hash: p.hash,
            // Stamped by the caller, which has the clock.
            framed_at_us: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::control::MYSQL_MAX_PAYLOAD;
    use common::mysql::digest::PayloadHasher;

    fn pkt(seq_id: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut v = len.to_le_bytes()[..3].to_vec();
        v.push(seq_id);
        v.extend_from_slice(payload);
        v
    }

    fn frame_pieces(pieces: &[&[u8]], later: usize) -> Vec<MysqlPacket> {
        let mut f = PacketFramer::new(SeqNumber(1000), HeadSizes { later });
        let mut out = Vec::new();
        for p in pieces {
            f.feed(p, &mut |p| out.push(p));
        }
        out
    }

    #[test]
    fn a_header_may_straddle_segments() {
        let stream = [pkt(0, b"hello"), pkt(1, b"")].concat();
        for cut in 0..=stream.len() {
            let got = frame_pieces(&[&stream[..cut], &stream[cut..]], 16);
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(
                (got[0].stream_offset, got[0].tcp_seq, got[0].len),
                (0, 1000, 5)
            );
            assert_eq!(&got[0].head[..], b"hello");
            assert_eq!(
                (got[1].stream_offset, got[1].tcp_seq, got[1].seq_id),
                (9, 1009, 1)
            );
            assert!(got[1].head.is_empty());
        }
    }

    #[test]
    fn many_packets_in_one_segment() {
        let stream: Vec<u8> = (0..50u8).flat_map(|i| pkt(i, &[i; 3])).collect();
        let got = frame_pieces(&[&stream], 16);
        assert_eq!(got.len(), 50);
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p.seq_id, i as u8);
            assert_eq!(p.stream_offset, i as u64 * 7);
            assert_eq!(&p.head[..], [i as u8; 3]);
        }
    }

    #[test]
    fn first_eight_packets_are_whole_then_heads_are_cut() {
        let big = vec![0x42; 2000];
        let mid = vec![0x17; 600];
        let stream: Vec<u8> = (0..10u8)
            .flat_map(|i| pkt(i, if i == 0 { &big } else { &mid }))
            .collect();
        let got = frame_pieces(&[&stream], 16);
        assert_eq!(got[0].head.len(), MAX_MYSQL_HEAD, "capped at 1024");
        assert!(!got[0].complete());
        for p in &got[1..8] {
            assert_eq!(p.head.len(), 600);
            assert!(p.complete());
        }
        for p in &got[8..] {
            assert_eq!(&p.head[..], [0x17; 16]);
        }
        // A configured head larger than the protocol allows is capped.
        let got = frame_pieces(&[&stream], 5000);
        assert_eq!(got[9].head.len(), 600);
    }

    #[test]
    fn a_packet_is_emitted_once_its_head_is_in() {
        let stream: Vec<u8> = (0..9u8).flat_map(|i| pkt(i, &[])).collect();
        let mut f = PacketFramer::new(SeqNumber(0), HeadSizes { later: 4 });
        let mut out = Vec::new();
        f.feed(&stream, &mut |p| out.push(p));
        let row = pkt(9, &[1; 100]);
        f.feed(&row[..7], &mut |p| out.push(p));
        assert_eq!(out.len(), 9, "3 of 4 head bytes: not yet");
        f.feed(&row[7..9], &mut |p| out.push(p));
        assert_eq!(out.len(), 10, "head complete: out before the payload ends");
        assert_eq!(&out[9].head[..], [1; 4]);
        f.feed(&row[9..], &mut |p| out.push(p));
        assert_eq!(out.len(), 10);
        assert_eq!(f.offset(), stream.len() as u64 + row.len() as u64);
    }

    #[test]
    fn hashed_packets_are_emitted_at_their_end_with_their_hash() {
        let stream: Vec<u8> = [pkt(1, b"\x01"), pkt(2, b""), pkt(3, &[7; 300])].concat();
        for cut in 0..stream.len() {
            let mut f = PacketFramer::new(SeqNumber(0), HeadSizes { later: 16 });
            f.set_hashing(true);
            let mut out = Vec::new();
            f.feed(&stream[..cut], &mut |p| out.push(p));
            let before = out.len();
            f.feed(&stream[cut..], &mut |p| out.push(p));
            assert_eq!(out.len(), 3);
            assert_eq!(out[0].hash, Some(PayloadHasher::hash(b"\x01")));
            assert_eq!(out[1].hash, Some(PayloadHasher::hash(b"")));
            assert_eq!(out[2].hash, Some(PayloadHasher::hash(&[7; 300])));
            assert_eq!(
                out[2].head.len(),
                300,
                "one of the first packets: whole head"
            );
            if cut < stream.len() {
                assert!(before < 3, "the last packet ends in the second piece");
            }
        }
        // Off again: heads only, emitted early.
        let mut f = PacketFramer::new(SeqNumber(0), HeadSizes { later: 16 });
        f.set_hashing(true);
        f.set_hashing(false);
        let mut out = Vec::new();
        f.feed(&pkt(0, b"abc"), &mut |p| out.push(p));
        assert_eq!(out[0].hash, None);
    }

    #[test]
    fn continuation_packets_carry_no_head() {
        // A 16 MiB payload: one 0xFFFFFF packet, then the rest (here 3 bytes), then a new one.
        let mut stream = vec![0xff, 0xff, 0xff, 1];
        stream.extend(std::iter::repeat_n(0xAA, MYSQL_MAX_PAYLOAD as usize));
        stream.extend(pkt(2, b"end"));
        stream.extend(pkt(3, b"\xfe\0\0\x02\0"));
        let mut f = PacketFramer::new(SeqNumber(u32::MAX - 1), HeadSizes { later: 16 });
        let mut out = Vec::new();
        for chunk in stream.chunks(65_000) {
            f.feed(chunk, &mut |p| out.push(p));
        }
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].len, MYSQL_MAX_PAYLOAD);
        assert_eq!(out[0].head.len(), MAX_MYSQL_HEAD);
        assert_eq!(
            (out[1].stream_offset, out[1].len, out[1].head.len()),
            (4 + u64::from(MYSQL_MAX_PAYLOAD), 3, 0)
        );
        assert_eq!(&out[2].head[..], b"\xfe\0\0\x02\0");
        // Sequence numbers wrap; stream offsets do not.
        assert_eq!(
            out[2].tcp_seq,
            (u32::MAX - 1).wrapping_add(out[2].stream_offset as u32)
        );
    }

    /// A sink that folds like intercept's sessions, with or without skimming.
    struct Folding {
        folder: common::mysql::fold::RowFolder,
        skim: bool,
        out: Vec<(Option<u8>, u64, Vec<u8>)>,
    }

    impl FrameSink for Folding {
        fn skim(&mut self, seq_id: u8, len: u32, offset: u64, head: &[u8]) -> bool {
            self.skim && self.folder.try_fold(seq_id, len, head, offset, 0, true)
        }

        fn packet(&mut self, p: MysqlPacket) {
            if let common::mysql::fold::Folded::Send(run, p) = self.folder.offer(p, true) {
                self.run(run);
                self.out
                    .push((Some(p.seq_id), p.stream_offset, p.head.to_vec()));
            }
        }
    }

    impl Folding {
        /// Runs as (None, packets folded, []), adjacent ones merged: where a segment cut a run
        /// depends on when each packet could be decided, the packets folded do not.
        fn run(&mut self, run: Option<MysqlRows>) {
            let Some(r) = run else { return };
            match self.out.last_mut() {
                Some((None, n, _)) => *n += u64::from(r.count),
                _ => self.out.push((None, u64::from(r.count), Vec::new())),
            }
        }
    }

    use common::control::MysqlRows;
    use proptest::prelude::*;

    /// Replies as a server sends them: OKs, ERRs and result sets of every framing the folder
    /// knows (definitions or not, EOF or not, MariaDB's omitted metadata).
    fn arb_replies() -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
        let ok = Just(vec![b"\x00\x00\x00\x02\x00\x00\x00".to_vec()]);
        let err = Just(vec![b"\xff\x15\x04#28000denied".to_vec()]);
        let result_set = (
            1u8..4,
            0usize..300,
            0usize..30,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(columns, rows, width, deprecate_eof, omitted)| {
                let mut r = vec![if omitted {
                    vec![columns, 0]
                } else {
                    vec![columns]
                }];
                if !omitted {
                    for _ in 0..columns {
                        r.push(b"\x03def\x06sbtest\x07sbtest1\x01c\x01c\x0c\x3f\x00".to_vec());
                    }
                    if !deprecate_eof {
                        r.push(b"\xfe\x00\x00\x02\x00".to_vec());
                    }
                }
                for i in 0..rows {
                    let mut row = vec![if i % 3 == 0 { 0 } else { width as u8 }];
                    row.extend(std::iter::repeat_n(b'r', width));
                    r.push(row);
                }
                r.push(if deprecate_eof {
                    b"\xfe\x00\x00\x02\x00\x00\x00".to_vec()
                } else {
                    b"\xfe\x00\x00\x02\x00".to_vec()
                });
                r
            });
        proptest::collection::vec(prop_oneof![ok, err, result_set], 0..12)
    }

    proptest! {
        /// Skimming folds exactly what folding the built summaries would, however the stream
        /// is cut into segments, and every other packet still arrives with its head.
        #[test]
        fn skimming_folds_what_summaries_would(
            replies in arb_replies(),
            cuts in proptest::collection::vec(1usize..300, 1..40),
        ) {
            let mut stream = pkt(0, b"\x0a11.8.3-MariaDB\0greeting");
            stream.extend(pkt(2, b"\x00\x00\x00\x02\x00\x00\x00"));
            for reply in &replies {
                for (i, p) in reply.iter().enumerate() {
                    stream.extend(pkt((i + 1) as u8, p));
                }
            }
            let mut got = Vec::new();
            for skim in [false, true] {
                let mut f = PacketFramer::new(SeqNumber(1000), HeadSizes { later: 16 });
                let mut sink = Folding {
                    folder: common::mysql::fold::RowFolder::new(),
                    skim,
                    out: Vec::new(),
                };
                let mut rest = &stream[..];
                let mut k = 0;
                while !rest.is_empty() {
                    let n = cuts[k % cuts.len()].min(rest.len());
                    k += 1;
                    f.feed(&rest[..n], &mut sink);
                    let run = sink.folder.flush();
                    sink.run(run);
                    rest = &rest[n..];
                }
                prop_assert_eq!(f.offset(), stream.len() as u64);
                got.push(sink.out);
            }
            prop_assert_eq!(&got[0], &got[1]);
        }
    }
}
