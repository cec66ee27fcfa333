//! Feedback (0x83): what intercept saw of each segment the test server sent toward a mirrored
//! client ([`TestFeedback`]), in batches. The copier plays the client side of the mirrored
//! connection from these fields.
//!
//! Never reserve room for the claimed item count beyond what the body could hold, never accept
//! unknown option bits or a prefix longer than [`MAX_PAYLOAD_PREFIX`] or than its payload.

use std::net::SocketAddrV4;

use super::codec::{check_len, write_addr, Reader};
use super::frame::{frame, FRAME_HEADER_LEN, MAX_FRAME_LEN};
use super::{ty, DecodeError, EncodeError};
use crate::seq::SeqNumber;
use crate::wire::{TcpFlags, TcpOptions, TcpPacket};

/// Longest payload prefix one feedback may carry.
pub const MAX_PAYLOAD_PREFIX: usize = 4096;
/// A Feedback batch of at most this many items always fits in one frame, whatever the prefixes.
pub const MAX_FEEDBACK_PER_FRAME: usize = MAX_FRAME_LEN / (MAX_FEEDBACK_ITEM_LEN + 1);

// Option-presence bits of a feedback item.
const OPT_MSS: u8 = 0x01;
const OPT_WSCALE: u8 = 0x02;
const OPT_SACK_PERM: u8 = 0x04;
const OPT_TIMESTAMPS: u8 = 0x08;
const OPT_KNOWN: u8 = OPT_MSS | OPT_WSCALE | OPT_SACK_PERM | OPT_TIMESTAMPS;

/// client(6) server(6) seq(4) ack(4) flags(1) window(2) opts(1) payload_len(4) prefix_len(2)
pub(super) const FEEDBACK_FIXED_LEN: usize = 30;
const MAX_FEEDBACK_ITEM_LEN: usize = FEEDBACK_FIXED_LEN + 2 + 1 + 8 + MAX_PAYLOAD_PREFIX;

/// What intercept saw of one segment sent by the test server toward a mirrored client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestFeedback {
    /// The mirrored client address (the reply's destination).
    pub client: SocketAddrV4,
    /// The test server's address (the reply's source).
    pub server: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    /// Raw window field (unscaled).
    pub window: u16,
    pub options: TcpOptions,
    /// Length of the segment's TCP payload.
    pub payload_len: u32,
    /// The first bytes of the payload (up to the configured prefix length).
    pub payload_prefix: Vec<u8>,
}

impl TestFeedback {
    /// Heap bytes the feedback holds beyond its own size (for queues bounded in memory).
    pub fn heap_len(&self) -> usize {
        self.payload_prefix.capacity()
    }

    /// [`Self::seq`] as a [`SeqNumber`].
    #[inline]
    pub fn seq_number(&self) -> SeqNumber {
        SeqNumber(self.seq)
    }

    /// [`Self::ack`] as a [`SeqNumber`].
    #[inline]
    pub fn ack_number(&self) -> SeqNumber {
        SeqNumber(self.ack)
    }

    /// The feedback for a captured reply, keeping at most `prefix_len` payload bytes (and never
    /// more than [`MAX_PAYLOAD_PREFIX`], so that the result always encodes).
    pub fn from_packet(pkt: &TcpPacket<'_>, prefix_len: usize) -> Self {
        let keep = pkt.payload.len().min(prefix_len).min(MAX_PAYLOAD_PREFIX);
        TestFeedback {
            client: SocketAddrV4::new(pkt.dst, pkt.dst_port),
            server: SocketAddrV4::new(pkt.src, pkt.src_port),
            seq: pkt.seq.0,
            ack: pkt.ack.0,
            flags: pkt.flags,
            window: pkt.window,
            options: pkt.options,
            payload_len: pkt.payload_len,
            payload_prefix: pkt.payload[..keep].to_vec(),
        }
    }

    /// Whether the whole payload is in `payload_prefix`.
    pub fn payload_complete(&self) -> bool {
        self.payload_prefix.len() as u64 == u64::from(self.payload_len)
    }

    /// Bytes this item takes inside a Feedback frame.
    pub fn encoded_len(&self) -> usize {
        let o = &self.options;
        FEEDBACK_FIXED_LEN
            + if o.mss.is_some() { 2 } else { 0 }
            + if o.window_scale.is_some() { 1 } else { 0 }
            + if o.timestamps.is_some() { 8 } else { 0 }
            + self.payload_prefix.len()
    }

    /// One item: client(6) server(6) seq(4) ack(4) flags(1) window(2) opts(1) [mss(2)]
    /// [wscale(1)] [tsval(4) tsecr(4)] payload_len(4) prefix_len(2) prefix
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let client = r.addr()?;
        let server = r.addr()?;
        let seq = r.u32()?;
        let ack = r.u32()?;
        let flags = TcpFlags(r.u8()?);
        let window = r.u16()?;
        let present = r.u8()?;
        if present & !OPT_KNOWN != 0 {
            return Err(r.invalid("unknown option-presence bits"));
        }
        let mut options = TcpOptions {
            sack_permitted: present & OPT_SACK_PERM != 0,
            ..TcpOptions::default()
        };
        if present & OPT_MSS != 0 {
            options.mss = Some(r.u16()?);
        }
        if present & OPT_WSCALE != 0 {
            options.window_scale = Some(r.u8()?);
        }
        if present & OPT_TIMESTAMPS != 0 {
            options.timestamps = Some((r.u32()?, r.u32()?));
        }
        let payload_len = r.u32()?;
        let prefix_len = usize::from(r.u16()?);
        if prefix_len > MAX_PAYLOAD_PREFIX {
            return Err(r.invalid("payload prefix longer than 4096 bytes"));
        }
        if prefix_len as u64 > u64::from(payload_len) {
            return Err(r.invalid("payload prefix longer than the payload"));
        }
        let payload_prefix = r.bytes(prefix_len)?.to_vec();
        Ok(TestFeedback {
            client,
            server,
            seq,
            ack,
            flags,
            window,
            options,
            payload_len,
            payload_prefix,
        })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        check_len(
            "payload prefix",
            self.payload_prefix.len(),
            MAX_PAYLOAD_PREFIX,
        )?;
        if self.payload_prefix.len() as u64 > u64::from(self.payload_len) {
            return Err(EncodeError::PrefixLongerThanPayload {
                prefix: self.payload_prefix.len(),
                payload: self.payload_len,
            });
        }
        write_addr(&self.client, o);
        write_addr(&self.server, o);
        o.extend_from_slice(&self.seq.to_be_bytes());
        o.extend_from_slice(&self.ack.to_be_bytes());
        o.push(self.flags.0);
        o.extend_from_slice(&self.window.to_be_bytes());
        let opts = &self.options;
        let mut present = 0u8;
        if opts.mss.is_some() {
            present |= OPT_MSS;
        }
        if opts.window_scale.is_some() {
            present |= OPT_WSCALE;
        }
        if opts.sack_permitted {
            present |= OPT_SACK_PERM;
        }
        if opts.timestamps.is_some() {
            present |= OPT_TIMESTAMPS;
        }
        o.push(present);
        if let Some(mss) = opts.mss {
            o.extend_from_slice(&mss.to_be_bytes());
        }
        if let Some(ws) = opts.window_scale {
            o.push(ws);
        }
        if let Some((val, ecr)) = opts.timestamps {
            o.extend_from_slice(&val.to_be_bytes());
            o.extend_from_slice(&ecr.to_be_bytes());
        }
        o.extend_from_slice(&self.payload_len.to_be_bytes());
        o.extend_from_slice(&(self.payload_prefix.len() as u16).to_be_bytes());
        o.extend_from_slice(&self.payload_prefix);
        Ok(())
    }
}

/// The Feedback body: count(4) then the items back to back.
pub(super) fn parse_batch(r: &mut Reader<'_>) -> Result<Vec<TestFeedback>, DecodeError> {
    let count = r.u32()? as usize;
    // The claimed count is untrusted: never reserve more items than the body can hold.
    let mut items = Vec::with_capacity(count.min(r.remaining() / FEEDBACK_FIXED_LEN));
    for _ in 0..count {
        items.push(TestFeedback::parse(r)?);
    }
    Ok(items)
}

/// Appends one Feedback frame carrying `batch`. A batch of at most
/// [`MAX_FEEDBACK_PER_FRAME`] items always fits.
pub fn encode_feedback(batch: &[TestFeedback], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::FEEDBACK, |o| {
        let count = u32::try_from(batch.len())
            .map_err(|_| EncodeError::FrameTooLarge { len: usize::MAX })?;
        o.extend_from_slice(&count.to_be_bytes());
        for fb in batch {
            fb.emit(o)?;
            // Stop early rather than build a huge buffer only to throw it away.
            if o.len() > MAX_FRAME_LEN + FRAME_HEADER_LEN {
                return Err(EncodeError::FrameTooLarge { len: o.len() });
            }
        }
        Ok(())
    })
}

#[cfg(test)]
pub(super) mod tests {
    use std::net::Ipv4Addr;

    use super::super::tests::{addr, decode_all};
    use super::super::InterceptMessage;
    use super::*;

    pub(in super::super) fn feedback() -> TestFeedback {
        TestFeedback {
            client: addr(10, 40000),
            server: addr(3, 3306),
            seq: 1,
            ack: 2,
            flags: TcpFlags(TcpFlags::SYN | TcpFlags::ACK),
            window: 65535,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamps: Some((3, 4)),
            },
            payload_len: 10,
            payload_prefix: b"\x4a\0\0\0\x0a5.5".to_vec(),
        }
    }

    #[test]
    fn feedback_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_feedback(&[feedback()], &mut out).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 1 + 4 + 30 + 2 + 1 + 8 + 8, // length
            0x83, 0, 0, 0, 1, // type, count
            198, 18, 0, 10, 0x9c, 0x40, // client
            198, 18, 0, 3, 0x0c, 0xea, // server
            0, 0, 0, 1, 0, 0, 0, 2, // seq, ack
            0x12, 0xff, 0xff, // flags, window
            0x0f, 0x05, 0xb4, 7, // opts, mss, wscale
            0, 0, 0, 3, 0, 0, 0, 4, // tsval, tsecr
            0, 0, 0, 10, 0, 8, // payload_len, prefix_len
            0x4a, 0, 0, 0, 0x0a, b'5', b'.', b'5', // prefix
        ];
        assert_eq!(out, want);
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Feedback(vec![feedback()])]
        );
        // Option bits 4-7 are reserved: a peer setting one speaks another layout.
        let mut reserved = out.clone();
        reserved[5 + 4 + 23] |= 0x10;
        assert!(matches!(
            decode_all::<InterceptMessage>(&reserved),
            Err(DecodeError::Invalid { ty: 0x83, .. })
        ));
    }

    #[test]
    fn feedback_item_length_matches_encoding() {
        let fb = feedback();
        let mut out = Vec::new();
        encode_feedback(std::slice::from_ref(&fb), &mut out).unwrap();
        assert_eq!(out.len(), FRAME_HEADER_LEN + 1 + 4 + fb.encoded_len());
    }

    #[test]
    fn a_full_batch_of_maximal_items_fits_one_frame() {
        let fb = TestFeedback {
            payload_len: u32::MAX,
            payload_prefix: vec![7; MAX_PAYLOAD_PREFIX],
            ..feedback()
        };
        let batch = vec![fb; MAX_FEEDBACK_PER_FRAME];
        let mut out = Vec::new();
        encode_feedback(&batch, &mut out).unwrap();
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Feedback(batch)]
        );
    }

    #[test]
    fn oversized_batch_is_refused_and_leaves_the_buffer_intact() {
        let fb = TestFeedback {
            payload_len: 5000,
            payload_prefix: vec![7; MAX_PAYLOAD_PREFIX],
            ..feedback()
        };
        let mut out = b"before".to_vec();
        let err = encode_feedback(&vec![fb; 300], &mut out).unwrap_err();
        assert!(matches!(err, EncodeError::FrameTooLarge { .. }));
        assert_eq!(out, b"before");
    }

    #[test]
    fn inconsistent_feedback_is_refused() {
        let fb = TestFeedback {
            payload_len: 2,
            ..feedback()
        };
        let mut out = Vec::new();
        assert!(matches!(
            encode_feedback(&[fb], &mut out),
            Err(EncodeError::PrefixLongerThanPayload { .. })
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn from_packet_keeps_the_configured_prefix() {
        let pkt = TcpPacket {
            src: Ipv4Addr::new(198, 18, 0, 3),
            dst: Ipv4Addr::new(198, 18, 0, 10),
            src_port: 3306,
            dst_port: 40000,
            seq: SeqNumber(9),
            ack: SeqNumber(8),
            flags: TcpFlags(TcpFlags::ACK),
            window: 100,
            options: TcpOptions::default(),
            ip_id: 0,
            ttl: 64,
            payload: b"0123456789",
            payload_len: 10,
        };
        let fb = TestFeedback::from_packet(&pkt, 4);
        assert_eq!(fb.client, addr(10, 40000));
        assert_eq!(fb.server, addr(3, 3306));
        assert_eq!(fb.payload_len, 10);
        assert_eq!(fb.payload_prefix, b"0123");
        assert!(!fb.payload_complete());
        assert!(TestFeedback::from_packet(&pkt, 64).payload_complete());
    }
}
