//! What the message files' tests share (sample addresses, whole-stream decoding, proptest
//! strategies for every message), and the properties of the codec as a whole: every message
//! round-trips through any split of the stream, and no input makes a decoder panic.

use std::net::{Ipv4Addr, SocketAddrV4};

use proptest::prelude::*;

use super::codec::truncate_utf8;
use super::*;
use crate::auth::{NONCE_LEN, PROOF_LEN};
use crate::wire::{TcpFlags, TcpOptions};

pub(super) fn addr(a: u8, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, a), port)
}

/// Every message in `bytes`, which must end on a frame boundary.
pub(super) fn decode_all<M: WireMessage>(bytes: &[u8]) -> Result<Vec<M>, DecodeError> {
    let mut d = FrameDecoder::<M>::new();
    d.feed(bytes);
    let mut out = Vec::new();
    while let Some(m) = d.next_message()? {
        out.push(m);
    }
    assert_eq!(d.buffered(), 0, "leftover bytes");
    Ok(out)
}

fn decode_all_lenient<M: WireMessage>(bytes: &[u8]) -> Vec<M> {
    let mut d = FrameDecoder::<M>::new();
    d.feed(bytes);
    let mut out = Vec::new();
    while let Ok(Some(m)) = d.next_message() {
        out.push(m);
    }
    out
}

fn arb_addr() -> impl Strategy<Value = SocketAddrV4> {
    (any::<u32>(), any::<u16>()).prop_map(|(ip, p)| SocketAddrV4::new(Ipv4Addr::from(ip), p))
}

fn arb_feedback() -> impl Strategy<Value = TestFeedback> {
    (
        (arb_addr(), arb_addr(), any::<u32>(), any::<u32>()),
        (any::<u8>(), any::<u16>()),
        (
            any::<Option<u16>>(),
            any::<Option<u8>>(),
            any::<bool>(),
            any::<Option<(u32, u32)>>(),
        ),
        proptest::collection::vec(any::<u8>(), 0..80),
        0u32..100_000,
    )
        .prop_map(
            |((client, server, seq, ack), (flags, window), (mss, ws, sp, ts), prefix, extra)| {
                TestFeedback {
                    client,
                    server,
                    seq,
                    ack,
                    flags: TcpFlags(flags),
                    window,
                    options: TcpOptions {
                        mss,
                        window_scale: ws,
                        sack_permitted: sp,
                        timestamps: ts,
                    },
                    payload_len: prefix.len() as u32 + extra,
                    payload_prefix: prefix,
                }
            },
        )
}

pub(super) fn arb_mysql_event() -> impl Strategy<Value = MysqlEvent> {
    prop_oneof![
        (
            arb_addr(),
            (any::<u64>(), any::<u32>(), any::<u8>()),
            proptest::collection::vec(any::<u8>(), 0..80),
            (0u32..100_000, any::<Option<u64>>(), any::<u32>()),
        )
            .prop_map(
                |(client, (stream_offset, tcp_seq, seq_id), head, (extra, hash, framed_at_us))| {
                    MysqlEvent::Packet {
                        client,
                        packet: MysqlPacket {
                            stream_offset,
                            tcp_seq,
                            seq_id,
                            len: head.len() as u32 + extra,
                            head: head.into(),
                            hash,
                            framed_at_us,
                        },
                    }
                }
            ),
        (arb_addr(), any::<u32>())
            .prop_map(|(client, at_seq)| MysqlEvent::FramingLost { client, at_seq }),
        (arb_addr(), any::<u32>())
            .prop_map(|(client, at_seq)| MysqlEvent::FramingResumed { client, at_seq }),
        (
            arb_addr(),
            (any::<u64>(), any::<u8>(), 1u32..1_000_000),
            (0u64..1 << 40, any::<u32>(), any::<bool>())
        )
            .prop_map(
                |(client, (stream_offset, seq_id, count), (extra, framed_at_us, eof))| {
                    MysqlEvent::Rows {
                        client,
                        rows: MysqlRows {
                            stream_offset,
                            seq_id,
                            count,
                            bytes: 4 * u64::from(count) + extra,
                            framed_at_us,
                            eof,
                        },
                    }
                }
            ),
    ]
}

fn arb_copier_message() -> impl Strategy<Value = CopierMessage> {
    let addrs = || proptest::collection::vec(arb_addr(), 0..40);
    prop_oneof![
        ("\\PC{0,40}", any::<u32>(),).prop_map(|(name, features)| {
            CopierMessage::Hello(Hello::new(&name).with_features(features))
        }),
        (any::<[u8; NONCE_LEN]>(), any::<Option<[u8; PROOF_LEN]>>())
            .prop_map(|(nonce, proof)| CopierMessage::Auth(Auth { nonce, proof })),
        addrs().prop_map(CopierMessage::Claim),
        addrs().prop_map(CopierMessage::Release),
        any::<u64>().prop_map(CopierMessage::Ping),
        (
            any::<[u8; 4]>(),
            proptest::collection::vec((any::<[u8; 4]>(), any::<bool>()), 0..20)
        )
            .prop_map(|(t, arp)| CopierMessage::Doctor(DoctorQuery {
                target: Ipv4Addr::from(t),
                arp: arp
                    .into_iter()
                    .map(|(a, pool)| ArpTarget {
                        addr: Ipv4Addr::from(a),
                        pool
                    })
                    .collect(),
            })),
    ]
}

fn arb_intercept_message() -> impl Strategy<Value = InterceptMessage> {
    prop_oneof![
        (
            "\\PC{0,40}",
            any::<u16>(),
            proptest::option::of(0..=MAX_MYSQL_HEAD as u16),
            any::<u32>(),
            any::<Option<[u8; PROOF_LEN]>>(),
        )
            .prop_map(|(name, payload_prefix, mysql_head, features, proof)| {
                InterceptMessage::Welcome(Welcome {
                    version: PROTOCOL_VERSION,
                    name: truncate_utf8(&name, MAX_NAME_LEN).to_owned(),
                    payload_prefix,
                    mysql_head,
                    features,
                    proof,
                })
            }),
        (any::<[u8; NONCE_LEN]>(), any::<bool>()).prop_map(|(nonce, secret_required)| {
            InterceptMessage::Challenge(Challenge {
                nonce,
                secret_required,
            })
        }),
        ("\\PC{0,80}", any::<u16>()).prop_map(|(reason, version)| {
            InterceptMessage::Reject(Reject {
                version,
                ..Reject::new(&reason)
            })
        }),
        proptest::collection::vec(arb_feedback(), 0..20).prop_map(InterceptMessage::Feedback),
        any::<u64>().prop_map(InterceptMessage::Pong),
        (
            any::<u32>(),
            proptest::collection::vec(arb_mysql_event(), 0..20)
        )
            .prop_map(|(sent_at_us, events)| InterceptMessage::Mysql { sent_at_us, events }),
        (
            any::<u64>(),
            proptest::collection::vec((0u8..=2, "\\PC{0,20}", "\\PC{0,80}"), 0..8)
        )
            .prop_map(|(unix_ms, checks)| {
                InterceptMessage::DoctorReport(DoctorReport {
                    unix_ms,
                    checks: checks
                        .into_iter()
                        .map(|(l, n, d)| DoctorCheck::new(l, &n, &d))
                        .collect(),
                })
            }),
    ]
}

proptest! {
    #[test]
    fn copier_messages_round_trip(msgs in proptest::collection::vec(arb_copier_message(), 0..8),
                                  cut in any::<prop::sample::Index>()) {
        let mut out = Vec::new();
        for m in &msgs {
            m.encode(&mut out).unwrap();
        }
        // Delivered in two arbitrary pieces, as TCP may.
        let cut = if out.is_empty() { 0 } else { cut.index(out.len()) };
        let mut d = FrameDecoder::<CopierMessage>::new();
        let mut got = Vec::new();
        for piece in [&out[..cut], &out[cut..]] {
            d.feed(piece);
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn intercept_messages_round_trip(msgs in proptest::collection::vec(arb_intercept_message(), 0..6)) {
        let mut out = Vec::new();
        for m in &msgs {
            m.encode(&mut out).unwrap();
        }
        prop_assert_eq!(decode_all::<InterceptMessage>(&out).unwrap(), msgs);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut a = FrameDecoder::<CopierMessage>::new();
        let mut b = FrameDecoder::<InterceptMessage>::new();
        a.feed(&bytes);
        b.feed(&bytes);
        while let Ok(Some(_)) = a.next_message() {}
        while let Ok(Some(_)) = b.next_message() {}
    }

    #[test]
    fn arbitrary_bodies_behind_valid_headers_never_panic(t in any::<u8>(),
                                                         body in proptest::collection::vec(any::<u8>(), 0..600)) {
        // Random bytes rarely form a plausible header; this reaches every body decoder.
        let _ = CopierMessage::decode(t, &body);
        let _ = InterceptMessage::decode(t, &body);
    }

    #[test]
    fn corrupted_frames_never_panic(msg in arb_intercept_message(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut out = Vec::new();
        msg.encode(&mut out).unwrap();
        let i = pos.index(out.len());
        out[i] = byte;
        let _ = decode_all_lenient::<InterceptMessage>(&out);
    }
}
