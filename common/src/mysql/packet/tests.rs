use super::*;
use crate::mysql::fixtures;
use proptest::prelude::*;

fn collect(sp: &mut PacketSplitter, chunks: &[&[u8]]) -> Vec<(u8, Option<Vec<u8>>, u64)> {
    let mut got = Vec::new();
    for c in chunks {
        sp.feed(c, |p| {
            got.push((p.seq, p.payload().map(<[u8]>::to_vec), p.len))
        })
        .unwrap();
    }
    got
}

#[test]
fn a_scanner_stays_small() {
    // A copier keeps two per mirrored session, idle ones included (issue #9).
    assert!(std::mem::size_of::<FrameScanner>() <= 104);
}

#[test]
fn header_round_trip() {
    let h = PacketHeader {
        len: 0x12_3456,
        seq: 7,
    };
    assert_eq!(h.to_bytes(), [0x56, 0x34, 0x12, 7]);
    assert_eq!(PacketHeader::parse(&h.to_bytes()), Some(h));
    assert_eq!(PacketHeader::parse(&[1, 2, 3]), None);
}

#[test]
fn write_packet_splits_at_exact_multiples() {
    let mut out = Vec::new();
    assert_eq!(write_packet(3, b"", &mut out), 4);
    assert_eq!(out, [0, 0, 0, 3]);

    // Real split size, once: 0xFFFFFF bytes need a trailing empty packet.
    let payload = vec![0xabu8; MAX_PAYLOAD_LEN];
    let mut out = Vec::new();
    assert_eq!(write_packet(0, &payload, &mut out), 2);
    assert_eq!(out.len(), framed_len(payload.len()));
    assert_eq!(&out[..4], &[0xff, 0xff, 0xff, 0]);
    assert_eq!(&out[out.len() - 4..], &[0, 0, 0, 1]);

    let mut sp = PacketSplitter::new(2 * MAX_PAYLOAD_LEN, Oversize::Fail);
    let mut n = 0;
    sp.feed(&out, |p| {
        n += 1;
        assert_eq!((p.seq, p.last_seq, p.parts), (0, 1, 2));
        assert_eq!(p.payload().map(<[u8]>::len), Some(MAX_PAYLOAD_LEN));
        assert_eq!(p.end_offset(), out.len() as u64);
    })
    .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn real_client_stream_splits_into_its_commands() {
    let stream = fixtures::hex(fixtures::SB_CLIENT_STREAM);
    let mut sp = PacketSplitter::new(1 << 20, Oversize::Fail);
    let got = collect(&mut sp, &[&stream]);
    assert_eq!(got.len(), 12);
    assert_eq!(got[0].0, 1, "the login answers the greeting (seq 0)");
    assert_eq!(
        got[0].1.as_deref(),
        Some(&fixtures::hex(fixtures::SB_RESPONSE)[..])
    );
    assert_eq!(
        got[1].1.as_deref(),
        Some(&fixtures::hex(fixtures::SB_PREPARE)[..])
    );
    assert!(got[1..].iter().all(|g| g.0 == 0));
    assert!(sp.at_boundary());

    // Byte by byte gives the same packets.
    let mut sp = PacketSplitter::new(1 << 20, Oversize::Fail);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(collect(&mut sp, &bytes), got);
}

#[test]
fn oversize_fail_stops_and_skip_reports_length() {
    let mut s = Vec::new();
    write_packet(0, &[1; 100], &mut s);
    write_packet(0, &[2; 10], &mut s);

    let mut sp = PacketSplitter::new(50, Oversize::Fail);
    let err = sp
        .feed(&s[..30], |_| panic!("nothing complete"))
        .unwrap_err();
    assert_eq!(
        err,
        FrameError::TooLarge {
            offset: 0,
            limit: 50
        }
    );
    assert_eq!(sp.feed(&s[30..], |_| {}), Err(err));

    let mut sp = PacketSplitter::new(50, Oversize::Skip);
    let got = collect(&mut sp, &[&s[..30], &s[30..60], &s[60..]]);
    assert_eq!(got, vec![(0, None, 100), (0, Some(vec![2; 10]), 10)]);
    assert_eq!(sp.buffered(), 0);
}

#[test]
fn skip_mode_never_buffers_the_oversized_payload() {
    let mut sp = PacketSplitter::with_split(8, Oversize::Skip, 16);
    let mut s = Vec::new();
    write_packet_split(0, &[7; 40], 16, &mut s);
    for c in s.chunks(3) {
        sp.feed(c, |p| {
            assert_eq!((p.len, p.parts, p.is_skipped()), (40, 3, true))
        })
        .unwrap();
        assert!(sp.buffered() <= 8);
    }
}

#[test]
fn scanner_reports_headers_and_prefixes_across_chunks() {
    let mut s = Vec::new();
    write_packet_split(0, &[0x17, 1, 0, 0, 0, 9, 9, 9], 16, &mut s);
    write_packet_split(5, &(0..40).collect::<Vec<u8>>(), 16, &mut s);
    write_packet_split(0, b"", 16, &mut s);
    let mut sc = FrameScanner::with_split(5, 16);
    let mut got = Vec::new();
    for c in s.chunks(3) {
        sc.feed(c, |p| got.push((p.header, p.prefix.to_vec())));
    }
    let offsets: Vec<_> = got
        .iter()
        .map(|g| (g.0.offset, g.0.seq, g.0.len, g.0.part))
        .collect();
    assert_eq!(
        offsets,
        vec![
            (0, 0, 8, 0),
            (12, 5, 16, 0),
            (32, 6, 16, 1),
            (52, 7, 8, 2),
            (64, 0, 0, 0)
        ]
    );
    assert_eq!(got[0].1, vec![0x17, 1, 0, 0, 0]);
    assert_eq!(got[1].1, vec![0, 1, 2, 3, 4]);
    assert!(got[2].1.is_empty());
    assert_eq!(sc.position(), s.len() as u64);
    assert!(sc.at_boundary());
}

fn arb_payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
    // Lengths cluster around multiples of the test split (16) to hit continuation edges.
    let len = prop_oneof![0usize..4, 14usize..19, 30usize..35, 47usize..50, 0usize..70];
    proptest::collection::vec(
        len.prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n)),
        0..12,
    )
}

fn chunked(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for c in cuts.into_iter().chain([stream.len()]) {
        out.push(stream[last..c].to_vec());
        last = c;
    }
    out
}

proptest! {
    #[test]
    fn splitter_yields_exactly_the_written_packets(
        payloads in arb_payloads(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        seq0 in any::<u8>(),
    ) {
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            let seq = seq0.wrapping_add(i as u8);
            write_packet_split(seq, p, 16, &mut stream);
            want.push((seq, Some(p.clone()), p.len() as u64));
        }
        let mut sp = PacketSplitter::with_split(1000, Oversize::Fail, 16);
        let chunks = chunked(&stream, &cuts);
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(collect(&mut sp, &refs), want);
        prop_assert!(sp.at_boundary());
        prop_assert_eq!(sp.position(), stream.len() as u64);
    }

    #[test]
    fn hashing_scanner_reports_the_same_packets_with_their_hashes(
        payloads in arb_payloads(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        prefix_len in 0usize..20,
    ) {
        let mut stream = Vec::new();
        for p in &payloads {
            write_packet_split(0, p, 16, &mut stream);
        }
        let mut plain = FrameScanner::with_split(prefix_len, 16);
        let mut hashing = FrameScanner::with_split(prefix_len, 16);
        hashing.hasher = Some(Box::default());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for c in chunked(&stream, &cuts) {
            plain.feed(&c, |p| a.push((p.header, p.prefix.to_vec())));
            hashing.feed(&c, |p| b.push((p.header, p.prefix.to_vec(), p.hash)));
        }
        prop_assert_eq!(a.len(), b.len());
        for ((ha, pa), (hb, pb, hash)) in a.iter().zip(&b) {
            prop_assert_eq!(ha, hb);
            prop_assert_eq!(pa, pb);
            let at = hb.payload_offset() as usize;
            let payload = &stream[at..at + hb.len as usize];
            prop_assert_eq!(*hash, Some(crate::mysql::digest::PayloadHasher::hash(payload)));
        }
        prop_assert_eq!(hashing.position(), stream.len() as u64);
    }

    #[test]
    fn scanner_agrees_with_splitter(
        payloads in arb_payloads(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        prefix_len in 0usize..20,
    ) {
        let mut stream = Vec::new();
        for p in &payloads {
            write_packet_split(0, p, 16, &mut stream);
        }
        let mut sc = FrameScanner::with_split(prefix_len, 16);
        let mut got = Vec::new();
        for c in chunked(&stream, &cuts) {
            sc.feed(&c, |p| got.push((p.header, p.prefix.to_vec())));
        }
        let starts: Vec<_> = got.iter().filter(|g| g.0.part == 0).collect();
        prop_assert_eq!(starts.len(), payloads.len());
        for (s, p) in starts.iter().zip(&payloads) {
            let want = p.len().min(prefix_len).min(16);
            prop_assert_eq!(&s.1[..], &p[..want]);
            let at = s.0.payload_offset() as usize;
            prop_assert_eq!(&stream[at..at + want], &p[..want]);
        }
        for (h, _) in &got {
            let on_wire = PacketHeader::parse(&stream[h.offset as usize..]).unwrap();
            prop_assert_eq!((on_wire.len, on_wire.seq), (h.len, h.seq));
        }
    }

    #[test]
    fn a_skimming_scanner_reports_what_it_does_not_skim(
        payloads in arb_payloads(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        prefix_len in 0usize..20,
        take_below in any::<u8>(),
    ) {
        // Each packet is reported by `feed` or offered and taken by the sink, never both,
        // in stream order; an offered packet starts a logical one, below the split, with
        // its header and head in one chunk.
        struct Sink<'s> {
            stream: &'s [u8],
            take_below: u8,
            at: u64,
            skimmed: Vec<u64>,
            got: Vec<(FrameHeader, Vec<u8>)>,
        }
        impl ScanSink for Sink<'_> {
            fn skim(&mut self, seq: u8, len: u32, head: &[u8]) -> bool {
                let at = self.at as usize;
                let h = PacketHeader::parse(&self.stream[at..]).unwrap();
                assert_eq!((h.seq, h.len), (seq, len));
                assert!((len as usize) < 16);
                assert_eq!(head, &self.stream[at + 4..at + 4 + (len as usize).min(5)]);
                let take = head.first().is_some_and(|&b| b < self.take_below);
                if take {
                    self.skimmed.push(self.at);
                }
                take
            }
            fn packet(&mut self, p: ScannedPacket<'_>) {
                self.got.push((p.header, p.prefix.to_vec()));
            }
        }
        let mut stream = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            write_packet_split(i as u8, p, 16, &mut stream);
        }
        let mut plain = FrameScanner::with_split(prefix_len, 16);
        let mut all = Vec::new();
        let mut skimming = FrameScanner::with_split(prefix_len, 16);
        let mut sink = Sink { stream: &stream, take_below, at: 0, skimmed: Vec::new(), got: Vec::new() };
        for c in chunked(&stream, &cuts) {
            plain.feed(&c, |p| all.push((p.header, p.prefix.to_vec())));
            skimming.feed_skimming(&c, &mut SinkAt(&mut sink));
        }
        prop_assert_eq!(skimming.position(), stream.len() as u64);
        prop_assert_eq!(skimming.at_boundary(), plain.at_boundary());
        let mut expect = Vec::new();
        for (h, prefix) in &all {
            if !sink.skimmed.contains(&h.offset) {
                expect.push((*h, prefix.clone()));
            }
        }
        prop_assert_eq!(&sink.got, &expect);
        prop_assert_eq!(sink.got.len() + sink.skimmed.len(), all.len());

        // Keeps where the next packet starts, so the sink can check what it is offered.
        struct SinkAt<'a, 's>(&'a mut Sink<'s>);
        impl ScanSink for SinkAt<'_, '_> {
            fn skim(&mut self, seq: u8, len: u32, head: &[u8]) -> bool {
                let taken = self.0.skim(seq, len, head);
                if taken {
                    self.0.at += 4 + u64::from(len);
                }
                taken
            }
            fn packet(&mut self, p: ScannedPacket<'_>) {
                self.0.at = p.header.offset + 4 + u64::from(p.header.len);
                self.0.packet(p)
            }
        }
    }

    #[test]
    fn hashes_switch_at_the_next_header_and_prefixes_follow_the_sink(
        payloads in arb_payloads(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        modes in proptest::collection::vec(any::<bool>(), 21),
    ) {
        // Each packet is hashed iff hashes were last asked for before its header was whole;
        // its prefix is whatever the sink chose for it, by position in the stream.
        struct Choosing {
            asked: Vec<u64>,
            got: Vec<(FrameHeader, Vec<u8>, Option<u64>)>,
        }
        impl ScanSink for Choosing {
            fn skim(&mut self, _: u8, _: u32, _: &[u8]) -> bool {
                false
            }
            fn prefix_len(&mut self, h: &FrameHeader, default: usize) -> usize {
                assert_eq!(default, 7);
                self.asked.push(h.offset);
                (self.asked.len() % 3) * 4
            }
            fn packet(&mut self, p: ScannedPacket<'_>) {
                self.got.push((p.header, p.prefix.to_vec(), p.hash));
            }
        }
        let mut stream = Vec::new();
        for p in &payloads {
            write_packet_split(0, p, 16, &mut stream);
        }
        let chunks = chunked(&stream, &cuts);
        let mut sc = FrameScanner::with_split(7, 16);
        let mut sink = Choosing { asked: Vec::new(), got: Vec::new() };
        let mut ends = Vec::new();
        let mut at = 0;
        for (c, on) in chunks.iter().zip(&modes) {
            sc.set_hashing(*on);
            sc.feed_skimming(c, &mut sink);
            at += c.len();
            ends.push(at);
        }
        prop_assert_eq!(sc.position(), stream.len() as u64);
        let offsets: Vec<u64> = sink.got.iter().map(|g| g.0.offset).collect();
        prop_assert_eq!(&sink.asked, &offsets, "asked once per packet, in order");
        for (i, (h, prefix, hash)) in sink.got.iter().enumerate() {
            let header_end = h.offset as usize + HEADER_LEN;
            let chunk = ends.iter().position(|&e| e >= header_end).unwrap();
            let payload = &stream[h.payload_offset() as usize..][..h.len as usize];
            let want = if h.part == 0 { ((i + 1) % 3 * 4).min(payload.len()) } else { 0 };
            prop_assert_eq!(&prefix[..], &payload[..want]);
            let expect = modes[chunk].then(|| crate::mysql::digest::PayloadHasher::hash(payload));
            prop_assert_eq!(*hash, expect, "packet at {}", h.offset);
        }
    }

    #[test]
    fn splitter_and_scanner_never_panic_on_garbage(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
        max in 0usize..64,
    ) {
        // Takes every other packet it is offered, whatever its bytes.
        struct Alternate(bool);
        impl ScanSink for Alternate {
            fn skim(&mut self, _: u8, len: u32, head: &[u8]) -> bool {
                assert!(head.len() <= FrameScanner::SKIM_HEAD.min(len as usize));
                self.0 = !self.0;
                self.0
            }
            fn packet(&mut self, _: ScannedPacket<'_>) {}
        }
        for oversize in [Oversize::Fail, Oversize::Skip] {
            let mut sp = PacketSplitter::with_split(max, oversize, 16);
            let mut sc = FrameScanner::with_split(max, 16);
            let mut skimming = FrameScanner::with_split(max, 16);
            for c in chunked(&bytes, &cuts) {
                let _ = sp.feed(&c, |p| assert!(p.len <= max as u64 || p.is_skipped()));
                sc.feed(&c, |_| {});
                skimming.feed_skimming(&c, &mut Alternate(false));
                prop_assert!(sp.buffered() <= max);
            }
            prop_assert_eq!(skimming.position(), bytes.len() as u64);
        }
    }
}

#[test]
fn lengths_around_the_split_round_trip() {
    for split in [1usize, 2, 16] {
        for len in 0..4 * split + 2 {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut s = Vec::new();
            let next = write_packet_split(250, &payload, split, &mut s);
            assert_eq!(s.len(), len + HEADER_LEN * packet_count(len, split));
            assert_eq!(next, 250u8.wrapping_add(packet_count(len, split) as u8));
            let mut sp = PacketSplitter::with_split(len, Oversize::Fail, split);
            let got = collect(&mut sp, &[&s]);
            assert_eq!(got, vec![(250, Some(payload), len as u64)]);
        }
    }
}
