use std::io::Cursor;

use proptest::prelude::*;

use super::*;

/// (ts_ns, link, data, orig_len) of every frame, and the error that ended the file if any.
type Frames = Vec<(u64, u16, Vec<u8>, u32)>;

fn read_all(bytes: &[u8]) -> (Frames, Option<ReadError>) {
    let mut frames = Vec::new();
    let mut r = match CaptureReader::new(Cursor::new(bytes)) {
        Ok(r) => r,
        Err(e) => return (frames, Some(e)),
    };
    loop {
        match r.next_frame() {
            Ok(Some(f)) => frames.push((f.ts_ns, f.link_type, f.data.to_vec(), f.orig_len)),
            Ok(None) => return (frames, None),
            Err(e) => {
                assert!(matches!(r.next_frame(), Ok(None)), "nothing after an error");
                return (frames, Some(e));
            }
        }
    }
}

fn sample_frames() -> Frames {
    vec![
        (1_700_000_000_123_456_789, 113, vec![1, 2, 3, 4, 5], 5),
        (1_700_000_000_223_456_000, 113, vec![9; 64], 1500),
        (1_700_000_001_000_000_001, 1, vec![7; 3], 3),
        (1_700_000_002_000_000_000, 113, Vec::new(), 0),
    ]
}

fn pcapng_of(frames: &Frames) -> Vec<u8> {
    let mut w = PcapngWriter::new(Vec::new());
    for (ts, link, data, orig) in frames {
        w.write_frame(*ts, *link, data, *orig).unwrap();
    }
    w.finish().unwrap()
}

/// A classic pcap file, as libpcap writes it on a host of either byte order.
fn classic_pcap(big: bool, nanos: bool, link: u32, frames: &[(u32, u32, &[u8], u32)]) -> Vec<u8> {
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
    let mut out = Vec::new();
    out.extend_from_slice(&u32b(if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
    out.extend_from_slice(&u16b(2));
    out.extend_from_slice(&u16b(4));
    out.extend_from_slice(&u32b(0));
    out.extend_from_slice(&u32b(0));
    out.extend_from_slice(&u32b(262_144));
    out.extend_from_slice(&u32b(link));
    for (secs, frac, data, orig) in frames {
        out.extend_from_slice(&u32b(*secs));
        out.extend_from_slice(&u32b(*frac));
        out.extend_from_slice(&u32b(data.len() as u32));
        out.extend_from_slice(&u32b(*orig));
        out.extend_from_slice(data);
    }
    out
}

/// A big-endian pcapng section as a big-endian host would write it: SHB, IDB with
/// `if_tsresol` 2^-20 (binary fractions), one EPB, one SPB, one unknown block, one obsolete PB.
fn big_endian_pcapng() -> Vec<u8> {
    fn block(out: &mut Vec<u8>, ty: u32, body: &[u8]) {
        let total = 12 + body.len() as u32;
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&total.to_be_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(&total.to_be_bytes());
    }
    let mut out = Vec::new();
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1A2B_3C4Du32.to_be_bytes());
    shb.extend_from_slice(&1u16.to_be_bytes());
    shb.extend_from_slice(&0u16.to_be_bytes());
    shb.extend_from_slice(&(-1i64).to_be_bytes());
    block(&mut out, 0x0A0D_0D0A, &shb);
    let mut idb = Vec::new();
    idb.extend_from_slice(&101u16.to_be_bytes());
    idb.extend_from_slice(&0u16.to_be_bytes());
    idb.extend_from_slice(&4u32.to_be_bytes()); // snaplen 4: cuts the SPB's data
    idb.extend_from_slice(&9u16.to_be_bytes());
    idb.extend_from_slice(&1u16.to_be_bytes());
    idb.extend_from_slice(&[0x80 | 20, 0, 0, 0]);
    idb.extend_from_slice(&[0, 0, 0, 0]);
    block(&mut out, 1, &idb);
    let mut epb = Vec::new();
    let units: u64 = 3 << 20; // 3 s
    epb.extend_from_slice(&0u32.to_be_bytes());
    epb.extend_from_slice(&((units >> 32) as u32).to_be_bytes());
    epb.extend_from_slice(&(units as u32).to_be_bytes());
    epb.extend_from_slice(&3u32.to_be_bytes());
    epb.extend_from_slice(&3u32.to_be_bytes());
    epb.extend_from_slice(&[0xaa, 0xbb, 0xcc, 0]);
    block(&mut out, 6, &epb);
    block(&mut out, 0x0BAD, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let mut spb = Vec::new();
    spb.extend_from_slice(&6u32.to_be_bytes());
    spb.extend_from_slice(&[1, 2, 3, 4, 5, 6, 0, 0]);
    block(&mut out, 3, &spb);
    let mut pb = Vec::new();
    let units: u64 = (5 << 20) + (1 << 19); // 5.5 s
    pb.extend_from_slice(&0u16.to_be_bytes());
    pb.extend_from_slice(&0u16.to_be_bytes());
    pb.extend_from_slice(&((units >> 32) as u32).to_be_bytes());
    pb.extend_from_slice(&(units as u32).to_be_bytes());
    pb.extend_from_slice(&1u32.to_be_bytes());
    pb.extend_from_slice(&1u32.to_be_bytes());
    pb.extend_from_slice(&[0x42, 0, 0, 0]);
    block(&mut out, 2, &pb);
    out
}

#[test]
fn pcapng_round_trip() {
    let frames = sample_frames();
    let bytes = pcapng_of(&frames);
    assert_eq!(bytes.len() % 4, 0);
    let (read, err) = read_all(&bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(read, frames);
    let r = CaptureReader::new(Cursor::new(&bytes)).unwrap();
    assert_eq!(r.format(), FileFormat::Pcapng);
}

#[test]
fn writer_gives_one_interface_per_link_type() {
    let bytes = pcapng_of(&sample_frames());
    let idbs = bytes
        .windows(8)
        .filter(|w| w[..4] == 1u32.to_le_bytes() && w[4..] == 32u32.to_le_bytes())
        .count();
    assert_eq!(idbs, 2, "one IDB for link 113, one for link 1");
}

#[test]
fn classic_pcap_both_byte_orders_and_resolutions() {
    let frames: [(u32, u32, &[u8], u32); 2] = [
        (1_700_000_000, 250_000, &[1, 2, 3], 60),
        (1_700_000_001, 1, &[4], 4),
    ];
    for big in [false, true] {
        let (read, err) = read_all(&classic_pcap(big, false, 113, &frames));
        assert!(err.is_none(), "{err:?}");
        assert_eq!(
            read,
            vec![
                (1_700_000_000_250_000_000, 113, vec![1, 2, 3], 60),
                (1_700_000_001_000_001_000, 113, vec![4], 4)
            ],
            "big endian: {big}, µs"
        );
        let (read, _) = read_all(&classic_pcap(big, true, 1, &frames));
        assert_eq!(read[0].0, 1_700_000_000_000_250_000, "ns resolution");
        assert_eq!(read[1].0, 1_700_000_001_000_000_001);
        assert_eq!(read[0].1, 1);
    }
}

#[test]
fn classic_pcap_link_field_ignores_fcs_bits() {
    let (read, err) = read_all(&classic_pcap(
        false,
        false,
        0x1000_0000 | 1,
        &[(1, 0, &[1], 1)],
    ));
    assert!(err.is_none());
    assert_eq!(read[0].1, 1);
}

#[test]
fn big_endian_pcapng_with_binary_resolution_spb_and_unknown_blocks() {
    let (read, err) = read_all(&big_endian_pcapng());
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        read,
        vec![
            (3_000_000_000, 101, vec![0xaa, 0xbb, 0xcc], 3),
            // SPB: cut to the interface's snap length, timestamp of the packet before it.
            (3_000_000_000, 101, vec![1, 2, 3, 4], 6),
            (5_500_000_000, 101, vec![0x42], 1),
        ]
    );
}

#[test]
fn sections_of_both_byte_orders_in_one_file() {
    let mut bytes = pcapng_of(&sample_frames()[..1].to_vec());
    bytes.extend_from_slice(&big_endian_pcapng());
    bytes.extend_from_slice(&pcapng_of(&sample_frames()[2..3].to_vec()));
    let (read, err) = read_all(&bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(read.len(), 1 + 3 + 1);
    assert_eq!(read[4].1, 1, "the third section's own interface table");
}

#[test]
fn truncation_names_the_offset_of_the_cut_block_and_keeps_what_came_before() {
    let frames = sample_frames();
    let bytes = pcapng_of(&frames);
    // Block starts: SHB, IDB(113), EPB, EPB, IDB(1), EPB, EPB.
    let mut starts = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        starts.push(at);
        at += u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    let third_epb = starts[5];
    let (read, err) = read_all(&bytes[..third_epb + 10]);
    assert_eq!(read, frames[..2].to_vec());
    let err = err.expect("an error");
    assert_eq!(err.offset(), third_epb as u64);
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "truncated enhanced packet block at offset {third_epb}:"
        )),
        "{text}"
    );
}

#[test]
fn every_truncation_is_clean() {
    let files = [
        pcapng_of(&sample_frames()),
        big_endian_pcapng(),
        classic_pcap(true, true, 1, &[(1, 2, &[1, 2, 3], 3), (3, 4, &[5; 9], 9)]),
    ];
    for full in &files {
        let (all, _) = read_all(full);
        for cut in 0..full.len() {
            let (read, err) = read_all(&full[..cut]);
            // A cut at a block boundary reads as a shorter, valid file.
            assert!(read.len() <= all.len());
            assert_eq!(read[..], all[..read.len()], "cut at {cut}: a prefix");
            if let Some(e) = err {
                assert!(e.offset() <= cut as u64, "cut at {cut}: {e}");
            }
        }
    }
}

#[test]
fn giant_length_fields_are_errors_not_allocations() {
    let mut bytes = pcapng_of(&sample_frames());
    let shb_len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    // The IDB claims 4 GiB - 4.
    bytes[shb_len + 4..shb_len + 8].copy_from_slice(&0xFFFF_FFFCu32.to_le_bytes());
    let (read, err) = read_all(&bytes);
    assert!(read.is_empty());
    let text = err.unwrap().to_string();
    assert!(
        text.contains(&format!(
            "corrupt interface description block at offset {shb_len}"
        )),
        "{text}"
    );

    let mut pcap = classic_pcap(false, false, 1, &[(1, 0, &[1], 1), (2, 0, &[2], 1)]);
    let second = 24 + 16 + 1;
    pcap[second + 8..second + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    let (read, err) = read_all(&pcap);
    assert_eq!(read.len(), 1);
    let err = err.unwrap();
    assert_eq!(err.offset(), second as u64);
    assert!(
        err.to_string().contains("captured length 4294967295"),
        "{err}"
    );
}

#[test]
fn mismatched_trailer_and_unknown_interface_are_corrupt() {
    let mut bytes = pcapng_of(&sample_frames());
    let n = bytes.len();
    bytes[n - 1] ^= 0xff;
    let (read, err) = read_all(&bytes);
    assert_eq!(read.len(), 3);
    assert!(err.unwrap().to_string().contains("closing length"));

    let mut bytes = pcapng_of(&sample_frames()[..1].to_vec());
    let n = bytes.len();
    let epb = n - 40;
    bytes[epb + 8] = 7; // interface id 7
    let (_, err) = read_all(&bytes);
    assert!(err.unwrap().to_string().contains("interface 7"));
}

#[test]
fn not_a_capture() {
    let (_, err) = read_all(b"hello world, not a capture");
    assert!(err
        .unwrap()
        .to_string()
        .contains("not a pcap or pcapng file"));
    let (_, err) = read_all(b"");
    assert!(matches!(err, Some(ReadError::Truncated { .. })));
}

#[test]
fn a_failed_flush_says_what_is_committed() {
    struct Full {
        room: usize,
        data: Vec<u8>,
    }
    impl std::io::Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = PcapngWriter::new(Full {
        room: 300,
        data: Vec::new(),
    });
    w.write_frame(1, 113, &[1; 20], 20).unwrap();
    w.flush().unwrap();
    let committed = w.committed();
    w.write_frame(2, 113, &[2; 400], 400).unwrap();
    let fail = w.flush().unwrap_err();
    assert_eq!(fail.committed, committed);
    assert_eq!(fail.frames_lost, 1);
    assert_eq!(w.frames(), 1);
    // Cut back to what is committed, the file is a valid capture of the first frame.
    let data = &w.get_ref().data[..committed as usize];
    let (read, err) = read_all(data);
    assert!(err.is_none());
    assert_eq!(read, vec![(1, 113, vec![1; 20], 20)]);
}

proptest! {
    #[test]
    fn damaged_files_never_panic(
        which in 0usize..3,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut bytes = match which {
            0 => pcapng_of(&sample_frames()),
            1 => big_endian_pcapng(),
            _ => classic_pcap(false, true, 113, &[(1, 2, &[1, 2, 3], 3), (3, 4, &[5; 9], 9)]),
        };
        for (at, v) in flips {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        bytes.truncate(cut % (bytes.len() + 1));
        let (_, err) = read_all(&bytes);
        if let Some(e) = err {
            prop_assert!(e.offset() <= bytes.len() as u64);
        }
    }
}
