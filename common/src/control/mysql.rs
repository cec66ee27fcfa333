//! Mysql (0x85): intercept's summaries of the MySQL packets the test server sent on each
//! mirrored connection ([`MysqlEvent`]): one item per packet (its first bytes, optionally a hash
//! of the whole payload), per folded run of rows, or per loss or recovery of framing.
//!
//! Never trust a claimed count, head length or packet length: each is checked against its limit
//! ([`MAX_MYSQL_HEAD`], [`MYSQL_MAX_PAYLOAD`]) and against what the body still holds, so that a
//! hostile frame costs at most its own size.

use std::net::SocketAddrV4;

use super::codec::{check_len, write_addr, Reader};
use super::frame::{frame, FRAME_HEADER_LEN, MAX_FRAME_LEN};
use super::{ty, DecodeError, EncodeError};

/// Longest `head` of a [`MysqlPacket`]: a greeting, an auth switch or an RSA public key fits.
pub const MAX_MYSQL_HEAD: usize = 1024;
/// The first this-many MySQL packets of a connection carry their whole payload (up to
/// [`MAX_MYSQL_HEAD`]) whatever intercept's `--mysql-head`: greeting and auth exchange.
pub const MYSQL_FULL_HEAD_PACKETS: u64 = 8;
/// Largest MySQL packet payload; a packet of exactly this length continues in the next one.
pub const MYSQL_MAX_PAYLOAD: u32 = 0xFF_FFFF;
/// A Mysql batch of at most this many events always fits in one frame, whatever the heads.
pub const MAX_MYSQL_EVENTS_PER_FRAME: usize = MAX_FRAME_LEN / (MAX_MYSQL_ITEM_LEN + 1);
/// Inline room of a [`MysqlHead`]: intercept's default `--mysql-head` (16).
pub const MYSQL_HEAD_INLINE: usize = 16;

// Kinds of a Mysql item.
pub(super) const MYSQL_PACKET: u8 = 0x01;
pub(super) const MYSQL_FRAMING_LOST: u8 = 0x02;
/// A packet followed by its payload hash (8 bytes).
pub(super) const MYSQL_PACKET_HASHED: u8 = 0x03;
/// Consecutive packets folded into one item ([`MysqlRows`]).
pub(super) const MYSQL_ROWS: u8 = 0x04;
/// Framing found again ([`MysqlEvent::FramingResumed`]); laid out like FramingLost.
pub(super) const MYSQL_FRAMING_RESUMED: u8 = 0x05;

/// kind(1) client(6) stream_offset(8) tcp_seq(4) seq_id(1) len(4) framed_at_us(4) head_len(2)
pub(super) const MYSQL_PACKET_FIXED_LEN: usize = 30;
/// kind(1) client(6) at_seq(4)
pub(super) const MYSQL_LOST_LEN: usize = 11;
/// kind(1) client(6) stream_offset(8) seq_id(1) count(4) bytes(8) framed_at_us(4) flags(1)
pub(super) const MYSQL_ROWS_LEN: usize = 33;
/// Flag of a Rows item: [`MysqlRows::eof`].
const ROWS_EOF: u8 = 0x01;
const MAX_MYSQL_ITEM_LEN: usize = MYSQL_PACKET_FIXED_LEN + MAX_MYSQL_HEAD + 8;

/// The first payload bytes of a MySQL packet: inline up to [`MYSQL_HEAD_INLINE`] bytes (no
/// heap allocation per framed packet, on either side of the control channel), on the heap
/// beyond (greetings, auth exchanges, a larger `--mysql-head`).
pub type MysqlHead = smallvec::SmallVec<[u8; MYSQL_HEAD_INLINE]>;

/// One MySQL packet the test server sent on a mirrored connection, as intercept framed it from
/// the reassembled reply stream. The payload itself stays at intercept: only its first bytes
/// travel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MysqlPacket {
    /// Bytes of the server's stream before this packet's header (0 = first byte after the
    /// SYN-ACK). Consecutive packets satisfy `next.stream_offset == stream_offset + 4 + len`,
    /// which is how a receiver notices events it never got.
    pub stream_offset: u64,
    /// TCP sequence number of the packet's first header byte.
    pub tcp_seq: u32,
    /// The MySQL sequence id from the header.
    pub seq_id: u8,
    /// Payload length from the header (at most [`MYSQL_MAX_PAYLOAD`]).
    pub len: u32,
    /// The first payload bytes: all of them (up to [`MAX_MYSQL_HEAD`]) for the first
    /// [`MYSQL_FULL_HEAD_PACKETS`] packets, then intercept's `--mysql-head`; none for a packet
    /// that continues a [`MYSQL_MAX_PAYLOAD`]-long one.
    pub head: MysqlHead,
    /// The hash of the whole payload of this physical packet, when the copier asked for
    /// [`FEATURE_PAYLOAD_HASHES`]; `None` otherwise.
    ///
    /// [`FEATURE_PAYLOAD_HASHES`]: super::FEATURE_PAYLOAD_HASHES
    pub hash: Option<u64>,
    /// When intercept's capture received the segment that completed the packet's head (or
    /// with hashes its end): the kernel's capture timestamp, on intercept's clock in
    /// microseconds, wrapping. Only differences mean something, with other packets and with
    /// the frame's `sent_at_us`: how long a reply waited at intercept (capture block, batch)
    /// before it was relayed, and how far apart the test server sent replies relayed together.
    pub framed_at_us: u32,
}

impl MysqlPacket {
    /// Whether `head` holds the whole payload.
    pub fn complete(&self) -> bool {
        self.head.len() as u64 == u64::from(self.len)
    }
}

/// Consecutive MySQL packets of one result set (rows, column definitions) that intercept
/// folded into one item: the copier only counts such packets, so their heads need not travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MysqlRows {
    /// [`MysqlPacket::stream_offset`] of the first packet.
    pub stream_offset: u64,
    /// The first packet's sequence id; the others follow it one by one (wrapping).
    pub seq_id: u8,
    /// Packets folded, at least 1.
    pub count: u32,
    /// Bytes of the folded packets, headers included: the next item's `stream_offset` is
    /// `stream_offset + bytes`.
    pub bytes: u64,
    /// As [`MysqlPacket::framed_at_us`], for the last packet.
    pub framed_at_us: u32,
    /// One of the packets is the 5-byte EOF that follows the column definitions (without
    /// SERVER_STATUS_CURSOR_EXISTS): the packet after the last definition.
    pub eof: bool,
}

impl MysqlRows {
    /// The last packet's sequence id.
    pub fn last_seq_id(&self) -> u8 {
        // Truncation intended: ids wrap at 256.
        self.seq_id.wrapping_add(self.count.wrapping_sub(1) as u8)
    }

    /// Payload bytes of the folded packets (their headers left out).
    pub fn payload_bytes(&self) -> u64 {
        self.bytes.saturating_sub(4 * u64::from(self.count))
    }
}

/// What intercept learnt of the MySQL packets of one mirrored connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MysqlEvent {
    Packet {
        /// The mirrored client address (the replies' destination).
        client: SocketAddrV4,
        packet: MysqlPacket,
    },
    /// intercept can no longer frame this connection's replies (bytes it will never see, or
    /// the connection was picked up without its SYN-ACK): no more packets for it until a new
    /// SYN-ACK. `at_seq` is the server sequence number where framing stopped.
    FramingLost { client: SocketAddrV4, at_seq: u32 },
    /// intercept frames this connection's replies again, from server sequence number
    /// `at_seq`: the end of a COM_STATISTICS reply (the copier's resync probe) it found in a
    /// stream it had lost. The packets that follow count their `stream_offset` from `at_seq`.
    FramingResumed { client: SocketAddrV4, at_seq: u32 },
    /// Packets folded into a run ([`FEATURE_ROW_RUNS`]).
    ///
    /// [`FEATURE_ROW_RUNS`]: super::FEATURE_ROW_RUNS
    Rows {
        client: SocketAddrV4,
        rows: MysqlRows,
    },
}

impl MysqlEvent {
    /// Heap bytes the event holds beyond its own size (for queues bounded in memory).
    pub fn heap_len(&self) -> usize {
        match self {
            MysqlEvent::Packet { packet, .. } => packet.head.capacity(),
            MysqlEvent::FramingLost { .. }
            | MysqlEvent::FramingResumed { .. }
            | MysqlEvent::Rows { .. } => 0,
        }
    }

    /// The connection the event is about.
    pub fn client(&self) -> SocketAddrV4 {
        match self {
            MysqlEvent::Packet { client, .. }
            | MysqlEvent::FramingLost { client, .. }
            | MysqlEvent::FramingResumed { client, .. }
            | MysqlEvent::Rows { client, .. } => *client,
        }
    }

    /// Bytes this item takes inside a Mysql frame.
    pub fn encoded_len(&self) -> usize {
        match self {
            MysqlEvent::Packet { packet, .. } => {
                MYSQL_PACKET_FIXED_LEN
                    + packet.head.len()
                    + if packet.hash.is_some() { 8 } else { 0 }
            }
            MysqlEvent::FramingLost { .. } | MysqlEvent::FramingResumed { .. } => MYSQL_LOST_LEN,
            MysqlEvent::Rows { .. } => MYSQL_ROWS_LEN,
        }
    }

    /// One item: kind(1) client(6), then the kind's fields (see the `MYSQL_*_LEN` constants).
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let kind = r.u8()?;
        let client = r.addr()?;
        match kind {
            MYSQL_PACKET | MYSQL_PACKET_HASHED => {
                let stream_offset = r.u64()?;
                let tcp_seq = r.u32()?;
                let seq_id = r.u8()?;
                let len = r.u32()?;
                if len > MYSQL_MAX_PAYLOAD {
                    return Err(r.invalid("MySQL packet length does not fit 3 bytes"));
                }
                let framed_at_us = r.u32()?;
                let head_len = usize::from(r.u16()?);
                if head_len > MAX_MYSQL_HEAD {
                    return Err(r.invalid("MySQL packet head longer than 1024 bytes"));
                }
                if head_len as u64 > u64::from(len) {
                    return Err(r.invalid("MySQL packet head longer than its payload"));
                }
                let head = MysqlHead::from_slice(r.bytes(head_len)?);
                let hash = if kind == MYSQL_PACKET_HASHED {
                    Some(r.u64()?)
                } else {
                    None
                };
                Ok(MysqlEvent::Packet {
                    client,
                    packet: MysqlPacket {
                        stream_offset,
                        tcp_seq,
                        seq_id,
                        len,
                        head,
                        hash,
                        framed_at_us,
                    },
                })
            }
            MYSQL_FRAMING_LOST => Ok(MysqlEvent::FramingLost {
                client,
                at_seq: r.u32()?,
            }),
            MYSQL_FRAMING_RESUMED => Ok(MysqlEvent::FramingResumed {
                client,
                at_seq: r.u32()?,
            }),
            MYSQL_ROWS => {
                let rows = MysqlRows {
                    stream_offset: r.u64()?,
                    seq_id: r.u8()?,
                    count: r.u32()?,
                    bytes: r.u64()?,
                    framed_at_us: r.u32()?,
                    eof: false,
                };
                if rows.count == 0 || rows.bytes < 4 * u64::from(rows.count) {
                    return Err(r.invalid("MySQL row run shorter than its headers"));
                }
                let flags = r.u8()?;
                if flags & !ROWS_EOF != 0 {
                    return Err(r.invalid("unknown flags in a MySQL row run"));
                }
                let rows = MysqlRows {
                    eof: flags & ROWS_EOF != 0,
                    ..rows
                };
                Ok(MysqlEvent::Rows { client, rows })
            }
            _ => Err(r.invalid("unknown MySQL item kind")),
        }
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            MysqlEvent::Packet { client, packet: p } => {
                check_len("MySQL packet head", p.head.len(), MAX_MYSQL_HEAD)?;
                if p.len > MYSQL_MAX_PAYLOAD {
                    return Err(EncodeError::MysqlLengthTooLarge { len: p.len });
                }
                if p.head.len() as u64 > u64::from(p.len) {
                    return Err(EncodeError::HeadLongerThanPayload {
                        head: p.head.len(),
                        len: p.len,
                    });
                }
                o.push(if p.hash.is_some() {
                    MYSQL_PACKET_HASHED
                } else {
                    MYSQL_PACKET
                });
                write_addr(client, o);
                o.extend_from_slice(&p.stream_offset.to_be_bytes());
                o.extend_from_slice(&p.tcp_seq.to_be_bytes());
                o.push(p.seq_id);
                o.extend_from_slice(&p.len.to_be_bytes());
                o.extend_from_slice(&p.framed_at_us.to_be_bytes());
                o.extend_from_slice(&(p.head.len() as u16).to_be_bytes());
                o.extend_from_slice(&p.head);
                if let Some(h) = p.hash {
                    o.extend_from_slice(&h.to_be_bytes());
                }
            }
            MysqlEvent::FramingLost { client, at_seq } => {
                o.push(MYSQL_FRAMING_LOST);
                write_addr(client, o);
                o.extend_from_slice(&at_seq.to_be_bytes());
            }
            MysqlEvent::FramingResumed { client, at_seq } => {
                o.push(MYSQL_FRAMING_RESUMED);
                write_addr(client, o);
                o.extend_from_slice(&at_seq.to_be_bytes());
            }
            MysqlEvent::Rows { client, rows: r } => {
                if r.count == 0 || r.bytes < 4 * u64::from(r.count) {
                    return Err(EncodeError::EmptyRowRun);
                }
                o.push(MYSQL_ROWS);
                write_addr(client, o);
                o.extend_from_slice(&r.stream_offset.to_be_bytes());
                o.push(r.seq_id);
                o.extend_from_slice(&r.count.to_be_bytes());
                o.extend_from_slice(&r.bytes.to_be_bytes());
                o.extend_from_slice(&r.framed_at_us.to_be_bytes());
                o.push(if r.eof { ROWS_EOF } else { 0 });
            }
        }
        Ok(())
    }
}

/// The Mysql body: sent_at_us(4) count(4) then the items back to back.
pub(super) fn parse_batch(r: &mut Reader<'_>) -> Result<(u32, Vec<MysqlEvent>), DecodeError> {
    let sent_at_us = r.u32()?;
    let count = r.u32()? as usize;
    // The claimed count is untrusted: never reserve more items than the body can hold.
    let mut items = Vec::with_capacity(count.min(r.remaining() / MYSQL_LOST_LEN));
    for _ in 0..count {
        items.push(MysqlEvent::parse(r)?);
    }
    Ok((sent_at_us, items))
}

/// Appends one Mysql frame carrying `batch`. A batch of at most
/// [`MAX_MYSQL_EVENTS_PER_FRAME`] events always fits.
pub fn encode_mysql(
    sent_at_us: u32,
    batch: &[MysqlEvent],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    frame(out, ty::MYSQL, |o| {
        o.extend_from_slice(&sent_at_us.to_be_bytes());
        let count = u32::try_from(batch.len())
            .map_err(|_| EncodeError::FrameTooLarge { len: usize::MAX })?;
        o.extend_from_slice(&count.to_be_bytes());
        for ev in batch {
            ev.emit(o)?;
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
    use proptest::prelude::*;

    use super::super::tests::{addr, arb_mysql_event, decode_all};
    use super::super::{InterceptMessage, WireMessage};
    use super::*;

    pub(in super::super) fn mysql_packet(head: &[u8], len: u32) -> MysqlEvent {
        MysqlEvent::Packet {
            client: addr(10, 40000),
            packet: MysqlPacket {
                stream_offset: 0x0102_0304_0506_0708,
                tcp_seq: 0x0a0b_0c0d,
                seq_id: 3,
                len,
                head: head.into(),
                hash: None,
                framed_at_us: 0x0102_0304,
            },
        }
    }

    #[test]
    fn mysql_layout_is_as_documented() {
        let mut hashed = mysql_packet(&[], 0);
        if let MysqlEvent::Packet { packet, .. } = &mut hashed {
            packet.hash = Some(0x1122_3344_5566_7788);
        }
        let batch = [
            mysql_packet(&[0x00, 0x01], 7),
            MysqlEvent::FramingLost {
                client: addr(11, 2),
                at_seq: 9,
            },
            hashed,
        ];
        let mut out = Vec::new();
        encode_mysql(0x0a0b_0c0d, &batch, &mut out).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 1 + 4 + 4 + 32 + 11 + 38, // length
            0x85, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 3, // type, sent_at_us, count
            0x01, 198, 18, 0, 10, 0x9c, 0x40, // kind, client
            1, 2, 3, 4, 5, 6, 7, 8, // stream_offset
            0x0a, 0x0b, 0x0c, 0x0d, // tcp_seq
            3, 0, 0, 0, 7, // seq_id, len
            1, 2, 3, 4, // framed_at_us
            0, 2, 0x00, 0x01, // head_len, head
            0x02, 198, 18, 0, 11, 0, 2, 0, 0, 0, 9, // kind, client, at_seq
            0x03, 198, 18, 0, 10, 0x9c, 0x40, // kind (hashed), client
            1, 2, 3, 4, 5, 6, 7, 8, // stream_offset
            0x0a, 0x0b, 0x0c, 0x0d, // tcp_seq
            3, 0, 0, 0, 0, // seq_id, len
            1, 2, 3, 4, // framed_at_us
            0, 0, // head_len
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // hash
        ];
        assert_eq!(out, want);
        assert_eq!(
            out.len(),
            FRAME_HEADER_LEN + 9 + batch.iter().map(MysqlEvent::encoded_len).sum::<usize>()
        );
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Mysql {
                sent_at_us: 0x0a0b_0c0d,
                events: batch.to_vec()
            }]
        );
    }

    #[test]
    fn rows_and_resumed_layouts_are_as_documented() {
        let batch = [
            MysqlEvent::Rows {
                client: addr(10, 40000),
                rows: MysqlRows {
                    stream_offset: 0x0102_0304_0506_0708,
                    seq_id: 2,
                    count: 3,
                    bytes: 0x40,
                    framed_at_us: 0x0a0b_0c0d,
                    eof: true,
                },
            },
            MysqlEvent::FramingResumed {
                client: addr(11, 2),
                at_seq: 9,
            },
        ];
        let mut out = Vec::new();
        encode_mysql(1, &batch, &mut out).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 1 + 4 + 4 + 33 + 11, // length
            0x85, 0, 0, 0, 1, 0, 0, 0, 2, // type, sent_at_us, count
            0x04, 198, 18, 0, 10, 0x9c, 0x40, // kind, client
            1, 2, 3, 4, 5, 6, 7, 8, // stream_offset
            2, 0, 0, 0, 3, // seq_id, count
            0, 0, 0, 0, 0, 0, 0, 0x40, // bytes
            0x0a, 0x0b, 0x0c, 0x0d, 0x01, // framed_at_us, flags (eof)
            0x05, 198, 18, 0, 11, 0, 2, 0, 0, 0, 9, // kind, client, at_seq
        ];
        assert_eq!(out, want);
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Mysql {
                sent_at_us: 1,
                events: batch.to_vec()
            }]
        );
        // Unknown flag bits and runs shorter than their headers are refused on decode.
        let flags_at = 1 + 4 + 4 + 32;
        let mut bad = out[FRAME_HEADER_LEN..].to_vec();
        bad[flags_at] = 0x03;
        assert!(matches!(
            InterceptMessage::decode(0x85, &bad[1..]),
            Err(DecodeError::Invalid { .. })
        ));
        let empty = MysqlEvent::Rows {
            client: addr(10, 1),
            rows: MysqlRows {
                stream_offset: 0,
                seq_id: 0,
                count: 2,
                bytes: 7,
                framed_at_us: 0,
                eof: false,
            },
        };
        assert_eq!(
            encode_mysql(0, &[empty], &mut Vec::new()),
            Err(EncodeError::EmptyRowRun)
        );
    }

    #[test]
    fn a_full_batch_of_maximal_mysql_events_fits_one_frame() {
        let mut ev = mysql_packet(&[7; MAX_MYSQL_HEAD], MYSQL_MAX_PAYLOAD);
        if let MysqlEvent::Packet { packet, .. } = &mut ev {
            packet.hash = Some(u64::MAX);
        }
        let batch = vec![ev; MAX_MYSQL_EVENTS_PER_FRAME];
        let mut out = Vec::new();
        encode_mysql(u32::MAX, &batch, &mut out).unwrap();
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Mysql {
                sent_at_us: u32::MAX,
                events: batch
            }]
        );
    }

    #[test]
    fn inconsistent_mysql_packets_are_refused() {
        let mut out = b"x".to_vec();
        for (ev, want) in [
            (
                mysql_packet(&[1, 2, 3], 2),
                EncodeError::HeadLongerThanPayload { head: 3, len: 2 },
            ),
            (
                mysql_packet(&[], 1 << 24),
                EncodeError::MysqlLengthTooLarge { len: 1 << 24 },
            ),
            (
                mysql_packet(&[0; MAX_MYSQL_HEAD + 1], 5000),
                EncodeError::FieldTooLong {
                    what: "MySQL packet head",
                    len: MAX_MYSQL_HEAD + 1,
                    max: MAX_MYSQL_HEAD,
                },
            ),
        ] {
            assert_eq!(encode_mysql(0, &[ev], &mut out), Err(want));
            assert_eq!(out, b"x");
        }
    }

    #[test]
    fn mysql_bounds_are_checked_on_decode() {
        let mut ok = Vec::new();
        encode_mysql(0, &[mysql_packet(&[1, 2], 2)], &mut ok).unwrap();
        let body = &ok[FRAME_HEADER_LEN + 1..];
        // Offsets inside the body: sent_at(4) count(4) kind(1) client(6) off(8) seq(4) id(1)
        // len(4) at(4) hlen(2).
        let len_at = 4 + 4 + 1 + 6 + 8 + 4 + 1;
        let mut long_head = body.to_vec();
        long_head[len_at..len_at + 4].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(
            InterceptMessage::decode(0x85, &long_head),
            Err(DecodeError::Invalid { .. })
        ));
        let mut huge = body.to_vec();
        huge[len_at..len_at + 4].copy_from_slice(&(1u32 << 24).to_be_bytes());
        assert!(matches!(
            InterceptMessage::decode(0x85, &huge),
            Err(DecodeError::Invalid { .. })
        ));
        let mut kind = body.to_vec();
        kind[8] = 9;
        assert!(matches!(
            InterceptMessage::decode(0x85, &kind),
            Err(DecodeError::Invalid { .. })
        ));
        // A count larger than the body is truncation, not a huge allocation.
        let mut count = body.to_vec();
        count[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            InterceptMessage::decode(0x85, &count),
            Err(DecodeError::Truncated { ty: 0x85 })
        );
    }

    proptest! {
        #[test]
        fn mysql_item_length_matches_encoding(batch in proptest::collection::vec(arb_mysql_event(), 0..20)) {
            let mut out = Vec::new();
            encode_mysql(7, &batch, &mut out).unwrap();
            prop_assert_eq!(out.len(), FRAME_HEADER_LEN + 9 + batch.iter().map(MysqlEvent::encoded_len).sum::<usize>());
        }
    }
}
