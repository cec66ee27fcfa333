//! The control channel between intercept and copier: message types and their codec.
//!
//! Intercept sees the test server's replies; the copier needs a few fields of each segment to play
//! the client side of the mirrored connection ([`TestFeedback`]), and a summary of each MySQL
//! packet to log in and map statement ids ([`MysqlEvent`]). This module turns those messages into
//! length-prefixed binary frames and back (the byte-by-byte layout is in `docs/protocol.md`).
//!
//! It must never do I/O, never panic on what it decodes and never allocate more than the frame it
//! was given: every received byte is untrusted input, and a frame larger than [`MAX_FRAME_LEN`]
//! is refused from its 4-byte header alone, before any of its body is buffered.

use std::fmt;
use std::marker::PhantomData;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::auth::{Nonce, Proof, NONCE_LEN, PROOF_LEN};
use crate::wire::{TcpFlags, TcpOptions, TcpPacket};

/// First bytes of every Hello, Welcome and Reject body: a stray client (an HTTP probe, a MySQL
/// client pointed at the wrong port) fails on them instead of being half-understood.
pub const MAGIC: [u8; 4] = *b"TSHD";
/// Bumped on any change to the layout of any message. Peers require equality.
/// Version 2 added the Mysql message and the Welcome's framing fields. Version 3 added feature
/// bits to Hello and Welcome and MySQL packet summaries carrying a payload hash. Version 4
/// replaced the Hello's cleartext token with a challenge-response (Challenge, Auth and the
/// Welcome's proof; see [`crate::auth`]). Version 5 added the Mysql message's `sent_at_us`,
/// so the copier can date replies that waited in intercept's capture blocks.
pub const PROTOCOL_VERSION: u16 = 6;
/// Feature bit of [`Hello::features`] / [`Welcome::features`]: intercept hashes each MySQL
/// packet's whole payload ([`MysqlPacket::hash`], with `common::mysql::digest::PayloadHasher`)
/// so the copier can compare result checksums (`--compare-results`). Summaries are then sent
/// when a packet ends rather than when its head is in.
pub const FEATURE_PAYLOAD_HASHES: u32 = 1;
/// Feature bit: the copier times the test server's replies (the comparison report), so
/// intercept writes what it relays to it at once instead of gathering it for
/// `--relay-flush-us`. Gathering costs the copier's dating nothing it can measure but moves
/// the test server's short replies in the report (see docs/BENCHMARKS.md).
pub const FEATURE_PROMPT_REPLIES: u32 = 2;
/// Feature bit: the copier understands [`MysqlEvent::Rows`], so intercept may fold the rows
/// and column definitions inside a result set into one item per captured segment instead of
/// one summary per packet. Only packets whose heads the copier never reads are folded (see
/// [`crate::mysql::fold`]); intercept folds nothing while any connected copier lacks the bit
/// or asked for payload hashes.
pub const FEATURE_ROW_RUNS: u32 = 4;
/// Every feature bit this build knows; a peer's other bits are ignored.
pub const KNOWN_FEATURES: u32 = FEATURE_PAYLOAD_HASHES | FEATURE_PROMPT_REPLIES | FEATURE_ROW_RUNS;
/// Bytes of the frame header (the big-endian length of type + body).
pub const FRAME_HEADER_LEN: usize = 4;
/// Largest accepted value of the length field (type byte + body).
pub const MAX_FRAME_LEN: usize = 1 << 20;
/// Longest copier or intercept name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;
/// Longest Reject reason, in bytes of UTF-8.
pub const MAX_REASON_LEN: usize = 1024;
/// Longest payload prefix one feedback may carry.
pub const MAX_PAYLOAD_PREFIX: usize = 4096;
/// Most addresses in one Claim or Release frame (6 bytes each: always fits a frame).
pub const MAX_ADDRS_PER_FRAME: usize = 65_536;
/// A Feedback batch of at most this many items always fits in one frame, whatever the prefixes.
pub const MAX_FEEDBACK_PER_FRAME: usize = MAX_FRAME_LEN / (MAX_FEEDBACK_ITEM_LEN + 1);
/// Longest `head` of a [`MysqlPacket`]: a greeting, an auth switch or an RSA public key fits.
pub const MAX_MYSQL_HEAD: usize = 1024;
/// The first this-many MySQL packets of a connection carry their whole payload (up to
/// [`MAX_MYSQL_HEAD`]) whatever intercept's `--mysql-head`: greeting and auth exchange.
pub const MYSQL_FULL_HEAD_PACKETS: u64 = 8;
/// Largest MySQL packet payload; a packet of exactly this length continues in the next one.
pub const MYSQL_MAX_PAYLOAD: u32 = 0xFF_FFFF;
/// A Mysql batch of at most this many events always fits in one frame, whatever the heads.
pub const MAX_MYSQL_EVENTS_PER_FRAME: usize = MAX_FRAME_LEN / (MAX_MYSQL_ITEM_LEN + 1);

/// Most addresses one Doctor query asks intercept to ARP for.
pub const MAX_DOCTOR_ARP: usize = 1024;
/// Most checks in one DoctorReport.
pub const MAX_DOCTOR_CHECKS: usize = 256;
/// Longest check name, in bytes of UTF-8.
pub const MAX_CHECK_NAME_LEN: usize = 255;
/// Longest check detail, in bytes of UTF-8.
pub const MAX_CHECK_DETAIL_LEN: usize = 4096;

/// Message type codes. Hello and Reject keep their codes and layouts in every version, so that
/// peers of different versions can still tell each other why they cannot talk.
mod ty {
    pub const HELLO: u8 = 0x01;
    pub const CLAIM: u8 = 0x02;
    pub const RELEASE: u8 = 0x03;
    pub const PING: u8 = 0x04;
    pub const DOCTOR: u8 = 0x05;
    pub const AUTH: u8 = 0x06;
    pub const WELCOME: u8 = 0x81;
    pub const REJECT: u8 = 0x82;
    pub const FEEDBACK: u8 = 0x83;
    pub const PONG: u8 = 0x84;
    pub const MYSQL: u8 = 0x85;
    pub const DOCTOR_REPORT: u8 = 0x86;
    pub const CHALLENGE: u8 = 0x87;
}

// Kinds of a Mysql item.
const MYSQL_PACKET: u8 = 0x01;
const MYSQL_FRAMING_LOST: u8 = 0x02;
/// A packet followed by its payload hash (8 bytes).
const MYSQL_PACKET_HASHED: u8 = 0x03;
/// Consecutive packets folded into one item ([`MysqlRows`]).
const MYSQL_ROWS: u8 = 0x04;
/// Framing found again ([`MysqlEvent::FramingResumed`]); laid out like FramingLost.
const MYSQL_FRAMING_RESUMED: u8 = 0x05;

// Framing announced in a Welcome.
const FRAMING_NONE: u8 = 0;
const FRAMING_MYSQL: u8 = 1;

/// kind(1) client(6) stream_offset(8) tcp_seq(4) seq_id(1) len(4) framed_at_us(4) head_len(2)
const MYSQL_PACKET_FIXED_LEN: usize = 30;
/// kind(1) client(6) at_seq(4)
const MYSQL_LOST_LEN: usize = 11;
/// kind(1) client(6) stream_offset(8) seq_id(1) count(4) bytes(8) framed_at_us(4) flags(1)
const MYSQL_ROWS_LEN: usize = 33;
/// Flag of a Rows item: [`MysqlRows::eof`].
const ROWS_EOF: u8 = 0x01;
const MAX_MYSQL_ITEM_LEN: usize = MYSQL_PACKET_FIXED_LEN + MAX_MYSQL_HEAD + 8;

// Option-presence bits of a feedback item.
const OPT_MSS: u8 = 0x01;
const OPT_WSCALE: u8 = 0x02;
const OPT_SACK_PERM: u8 = 0x04;
const OPT_TIMESTAMPS: u8 = 0x08;
const OPT_KNOWN: u8 = OPT_MSS | OPT_WSCALE | OPT_SACK_PERM | OPT_TIMESTAMPS;

/// client(6) server(6) seq(4) ack(4) flags(1) window(2) opts(1) payload_len(4) prefix_len(2)
const FEEDBACK_FIXED_LEN: usize = 30;
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
    /// The feedback for a captured reply, keeping at most `prefix_len` payload bytes (and never
    /// more than [`MAX_PAYLOAD_PREFIX`], so that the result always encodes).
    pub fn from_packet(pkt: &TcpPacket<'_>, prefix_len: usize) -> Self {
        let keep = pkt.payload.len().min(prefix_len).min(MAX_PAYLOAD_PREFIX);
        TestFeedback {
            client: SocketAddrV4::new(pkt.dst, pkt.dst_port),
            server: SocketAddrV4::new(pkt.src, pkt.src_port),
            seq: pkt.seq,
            ack: pkt.ack,
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
}

/// Inline room of a [`MysqlHead`]: intercept's default `--mysql-head` (16).
pub const MYSQL_HEAD_INLINE: usize = 16;

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
    Rows {
        client: SocketAddrV4,
        rows: MysqlRows,
    },
}

impl MysqlEvent {
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
}

/// Sent by a copier as its first frame. intercept answers with a [`Challenge`] (or a
/// [`Reject`] when the version differs or the copier's address is not welcome).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    /// Who this copier is, for intercept's logs (e.g. "copier@prod-1").
    pub name: String,
    /// Feature bits the copier asks for (`FEATURE_*`); intercept grants a subset in its
    /// Welcome.
    pub features: u32,
}

impl Hello {
    /// A Hello of this build's protocol version; the name is cut to [`MAX_NAME_LEN`] bytes.
    pub fn new(name: &str) -> Self {
        Hello {
            version: PROTOCOL_VERSION,
            name: truncate_utf8(name, MAX_NAME_LEN).to_owned(),
            features: 0,
        }
    }

    /// The same Hello asking for `features` too.
    pub fn with_features(mut self, features: u32) -> Self {
        self.features |= features;
        self
    }
}

/// intercept's answer to a Hello of the right version: prove you hold the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// Fresh random bytes for this connection.
    pub nonce: Nonce,
    /// Whether intercept was started with `--secret-file` and will check the [`Auth`]'s proof.
    /// A copier with a secret refuses an intercept without one: such an intercept cannot prove
    /// it is the one the copier was configured for.
    pub secret_required: bool,
}

/// The copier's answer to a [`Challenge`].
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    /// The copier's own fresh random bytes: intercept's proof covers them too.
    pub nonce: Nonce,
    /// `Secret::copier_proof(challenge nonce, this nonce)`; `None` for a copier without a
    /// secret (intercept then refuses it, or lets it in when it has no secret either).
    pub proof: Option<Proof>,
}

// Proofs are not secrets, but nobody needs them in a log either.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("proof", &self.proof.map(|_| "<present>"))
            .finish_non_exhaustive()
    }
}

/// Intercept's answer to an accepted Hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    /// Who this intercept is (host, port watched), for the copier's logs.
    pub name: String,
    /// How many payload bytes each feedback carries at most; the copier needs it to know
    /// whether a reply it wants to parse (a MySQL greeting) can arrive whole.
    pub payload_prefix: u16,
    /// `Some(head)` when intercept frames MySQL packets (`--protocol mysql`) and sends Mysql
    /// messages, `head` being its `--mysql-head` (≤ [`MAX_MYSQL_HEAD`]); `None` when it relays
    /// TCP segments only, so mirrored sessions cannot learn the test server's greeting.
    pub mysql_head: Option<u16>,
    /// The features of the Hello that intercept grants (`FEATURE_*`).
    pub features: u32,
    /// `Secret::intercept_proof(challenge nonce, Auth nonce)` when intercept checked the
    /// copier's proof; `None` when it has no secret.
    pub proof: Option<Proof>,
}

/// Intercept's answer to a refused Hello, just before it closes the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    /// The rejecting intercept's protocol version.
    pub version: u16,
    /// What went wrong and how to fix it, for a person.
    pub reason: String,
}

impl Reject {
    /// A Reject from this build; the reason is cut to [`MAX_REASON_LEN`] bytes.
    pub fn new(reason: &str) -> Self {
        Reject {
            version: PROTOCOL_VERSION,
            reason: truncate_utf8(reason, MAX_REASON_LEN).to_owned(),
        }
    }
}

/// `copier doctor` asks intercept to check its side of the path (never sent by a running
/// copier). intercept answers with a [`DoctorReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorQuery {
    /// The test server: intercept checks the segment it reaches it on.
    pub target: Ipv4Addr,
    /// Mirrored client addresses to ask ARP for on that segment (at most [`MAX_DOCTOR_ARP`]).
    pub arp: Vec<ArpTarget>,
}

/// An address the doctor wants ARP-checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpTarget {
    pub addr: Ipv4Addr,
    /// From `--client-ip-pool`: no host should own it. Otherwise a real client's address,
    /// which the client itself may rightly answer for.
    pub pool: bool,
}

/// One finding of intercept's doctor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorCheck {
    /// 0 ok, 1 warn, 2 fail.
    pub level: u8,
    /// At most [`MAX_CHECK_NAME_LEN`] bytes.
    pub name: String,
    /// At most [`MAX_CHECK_DETAIL_LEN`] bytes.
    pub detail: String,
}

impl DoctorCheck {
    /// A check; name and detail are cut to their limits so that it always encodes.
    pub fn new(level: u8, name: &str, detail: &str) -> Self {
        DoctorCheck {
            level: level.min(2),
            name: truncate_utf8(name, MAX_CHECK_NAME_LEN).to_owned(),
            detail: truncate_utf8(detail, MAX_CHECK_DETAIL_LEN).to_owned(),
        }
    }
}

/// intercept's answer to a [`DoctorQuery`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorReport {
    /// intercept's wall clock, milliseconds since the Unix epoch (for a clock-skew check).
    pub unix_ms: u64,
    /// At most [`MAX_DOCTOR_CHECKS`].
    pub checks: Vec<DoctorCheck>,
}

/// Frames a copier sends to intercept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopierMessage {
    Hello(Hello),
    /// The answer to intercept's Challenge; second frame of every connection.
    Auth(Auth),
    /// Mirrored client addresses whose replies this copier now wants.
    Claim(Vec<SocketAddrV4>),
    /// Addresses this copier no longer wants.
    Release(Vec<SocketAddrV4>),
    /// Keepalive; intercept answers with a Pong carrying the same nonce.
    Ping(u64),
    /// `copier doctor` only.
    Doctor(DoctorQuery),
}

/// Frames intercept sends to a copier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InterceptMessage {
    /// The answer to a Hello; the copier answers with an Auth.
    Challenge(Challenge),
    Welcome(Welcome),
    Reject(Reject),
    Feedback(Vec<TestFeedback>),
    Pong(u64),
    /// MySQL packet summaries, in stream order per connection.
    Mysql {
        /// When intercept encoded the frame, on the clock of [`MysqlPacket::framed_at_us`].
        sent_at_us: u32,
        events: Vec<MysqlEvent>,
    },
    /// The answer to a Doctor query.
    DoctorReport(DoctorReport),
}

/// Why a message could not be encoded. The output buffer is left as it was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("frame of {len} bytes exceeds the {MAX_FRAME_LEN}-byte limit; split the batch")]
    FrameTooLarge { len: usize },
    #[error("{what} is {len} bytes, more than the {max} allowed")]
    FieldTooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("feedback payload prefix ({prefix} bytes) is longer than its payload ({payload})")]
    PrefixLongerThanPayload { prefix: usize, payload: u32 },
    #[error("MySQL packet head ({head} bytes) is longer than its payload ({len})")]
    HeadLongerThanPayload { head: usize, len: u32 },
    #[error("MySQL packet length {len} does not fit the 3-byte header")]
    MysqlLengthTooLarge { len: u32 },
    #[error("MySQL row run of no packets, or shorter than its headers")]
    EmptyRowRun,
}

/// Why received bytes are not a valid message. Any of these ends the connection: after a bad
/// frame nothing that follows can be trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame length {len} exceeds the {MAX_FRAME_LEN}-byte limit (not a tcpshadow peer?)")]
    FrameTooLarge { len: usize },
    #[error("empty frame (length 0)")]
    EmptyFrame,
    #[error("message type 0x{ty:02x} is not one this peer may send")]
    UnexpectedType { ty: u8 },
    #[error("message 0x{ty:02x} is shorter than its fields")]
    Truncated { ty: u8 },
    #[error("message 0x{ty:02x} has {extra} bytes after its last field")]
    TrailingBytes { ty: u8, extra: usize },
    #[error("bad magic: the peer does not speak the tcpshadow control protocol")]
    BadMagic,
    #[error("peer speaks control protocol version {theirs}, this build speaks {ours}: run the same tcpshadow release on both hosts")]
    VersionMismatch { theirs: u16, ours: u16 },
    #[error("message 0x{ty:02x}: {what}")]
    Invalid { ty: u8, what: &'static str },
}

/// A message that travels in one frame. Implemented by [`CopierMessage`] (decoded by intercept)
/// and [`InterceptMessage`] (decoded by the copier).
pub trait WireMessage: Sized {
    /// Appends this message as one complete frame.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError>;
    /// Decodes the type byte and body of one frame.
    fn decode(ty: u8, body: &[u8]) -> Result<Self, DecodeError>;
}

impl WireMessage for CopierMessage {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            CopierMessage::Hello(h) => encode_hello(h, out),
            CopierMessage::Auth(a) => encode_auth(a, out),
            CopierMessage::Claim(a) => encode_claim(a, out),
            CopierMessage::Release(a) => encode_release(a, out),
            CopierMessage::Ping(n) => frame(out, ty::PING, |o| {
                o.extend_from_slice(&n.to_be_bytes());
                Ok(())
            }),
            CopierMessage::Doctor(q) => encode_doctor(q, out),
        }
    }

    fn decode(t: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf: body, ty: t };
        let msg = match t {
            ty::HELLO => {
                read_magic_version(&mut r)?;
                let version = PROTOCOL_VERSION;
                let name_len = usize::from(r.u8()?);
                let name = r.string(name_len)?;
                let features = r.u32()?;
                CopierMessage::Hello(Hello {
                    version,
                    name,
                    features,
                })
            }
            ty::AUTH => {
                let nonce = r.array::<NONCE_LEN>()?;
                let proof = read_proof(&mut r)?;
                CopierMessage::Auth(Auth { nonce, proof })
            }
            ty::CLAIM => CopierMessage::Claim(read_addrs(&mut r)?),
            ty::RELEASE => CopierMessage::Release(read_addrs(&mut r)?),
            ty::PING => CopierMessage::Ping(r.u64()?),
            ty::DOCTOR => {
                let target = Ipv4Addr::from(r.array::<4>()?);
                let count = usize::from(r.u16()?);
                if count > MAX_DOCTOR_ARP {
                    return Err(r.invalid("more ARP targets than a Doctor query may carry"));
                }
                let mut arp = Vec::with_capacity(count.min(r.buf.len() / 5));
                for _ in 0..count {
                    let addr = Ipv4Addr::from(r.array::<4>()?);
                    let pool = match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return Err(r.invalid("ARP target kind is not 0 or 1")),
                    };
                    arp.push(ArpTarget { addr, pool });
                }
                CopierMessage::Doctor(DoctorQuery { target, arp })
            }
            _ => return Err(DecodeError::UnexpectedType { ty: t }),
        };
        r.finish()?;
        Ok(msg)
    }
}

impl WireMessage for InterceptMessage {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            InterceptMessage::Challenge(c) => encode_challenge(c, out),
            InterceptMessage::Welcome(w) => encode_welcome(w, out),
            InterceptMessage::Reject(j) => encode_reject(j, out),
            InterceptMessage::Feedback(b) => encode_feedback(b, out),
            InterceptMessage::Pong(n) => encode_pong(*n, out),
            InterceptMessage::Mysql { sent_at_us, events } => {
                encode_mysql(*sent_at_us, events, out)
            }
            InterceptMessage::DoctorReport(d) => encode_doctor_report(d, out),
        }
    }

    fn decode(t: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf: body, ty: t };
        let msg = match t {
            ty::WELCOME => {
                read_magic_version(&mut r)?;
                let name_len = usize::from(r.u8()?);
                let name = r.string(name_len)?;
                let payload_prefix = r.u16()?;
                let mysql_head = match r.u8()? {
                    FRAMING_NONE => None,
                    FRAMING_MYSQL => {
                        let head = r.u16()?;
                        if usize::from(head) > MAX_MYSQL_HEAD {
                            return Err(r.invalid("MySQL head longer than 1024 bytes"));
                        }
                        Some(head)
                    }
                    _ => return Err(r.invalid("unknown framing")),
                };
                let features = r.u32()?;
                let proof = read_proof(&mut r)?;
                InterceptMessage::Welcome(Welcome {
                    version: PROTOCOL_VERSION,
                    name,
                    payload_prefix,
                    mysql_head,
                    features,
                    proof,
                })
            }
            ty::CHALLENGE => {
                read_magic_version(&mut r)?;
                let nonce = r.array::<NONCE_LEN>()?;
                let secret_required = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(r.invalid("secret-required flag is not 0 or 1")),
                };
                InterceptMessage::Challenge(Challenge {
                    nonce,
                    secret_required,
                })
            }
            ty::REJECT => {
                // Read whatever the rejecter's version is: this layout never changes.
                if r.bytes(4)? != MAGIC {
                    return Err(DecodeError::BadMagic);
                }
                let version = r.u16()?;
                let len = usize::from(r.u16()?);
                let reason = r.string(len)?;
                InterceptMessage::Reject(Reject { version, reason })
            }
            ty::FEEDBACK => {
                let count = r.u32()? as usize;
                // The claimed count is untrusted: never reserve more items than the body can hold.
                let mut items = Vec::with_capacity(count.min(r.buf.len() / FEEDBACK_FIXED_LEN));
                for _ in 0..count {
                    items.push(read_feedback(&mut r)?);
                }
                InterceptMessage::Feedback(items)
            }
            ty::PONG => InterceptMessage::Pong(r.u64()?),
            ty::MYSQL => {
                let sent_at_us = r.u32()?;
                let count = r.u32()? as usize;
                let mut items = Vec::with_capacity(count.min(r.buf.len() / MYSQL_LOST_LEN));
                for _ in 0..count {
                    items.push(read_mysql(&mut r)?);
                }
                InterceptMessage::Mysql {
                    sent_at_us,
                    events: items,
                }
            }
            ty::DOCTOR_REPORT => {
                let unix_ms = r.u64()?;
                let count = usize::from(r.u16()?);
                if count > MAX_DOCTOR_CHECKS {
                    return Err(r.invalid("more checks than a DoctorReport may carry"));
                }
                let mut checks = Vec::with_capacity(count.min(r.buf.len() / 4));
                for _ in 0..count {
                    let level = r.u8()?;
                    if level > 2 {
                        return Err(r.invalid("check level is not 0, 1 or 2"));
                    }
                    let name_len = usize::from(r.u8()?);
                    let name = r.string(name_len)?;
                    let detail_len = usize::from(r.u16()?);
                    if detail_len > MAX_CHECK_DETAIL_LEN {
                        return Err(r.invalid("check detail longer than 4096 bytes"));
                    }
                    let detail = r.string(detail_len)?;
                    checks.push(DoctorCheck {
                        level,
                        name,
                        detail,
                    });
                }
                InterceptMessage::DoctorReport(DoctorReport { unix_ms, checks })
            }
            _ => return Err(DecodeError::UnexpectedType { ty: t }),
        };
        r.finish()?;
        Ok(msg)
    }
}

/// Appends a Hello frame.
pub fn encode_hello(h: &Hello, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("copier name", h.name.len(), MAX_NAME_LEN)?;
    frame(out, ty::HELLO, |o| {
        o.extend_from_slice(&MAGIC);
        o.extend_from_slice(&h.version.to_be_bytes());
        o.push(h.name.len() as u8);
        o.extend_from_slice(h.name.as_bytes());
        o.extend_from_slice(&h.features.to_be_bytes());
        Ok(())
    })
}

/// Appends a Challenge frame.
pub fn encode_challenge(c: &Challenge, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::CHALLENGE, |o| {
        o.extend_from_slice(&MAGIC);
        o.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        o.extend_from_slice(&c.nonce);
        o.push(u8::from(c.secret_required));
        Ok(())
    })
}

/// Appends an Auth frame.
pub fn encode_auth(a: &Auth, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::AUTH, |o| {
        o.extend_from_slice(&a.nonce);
        write_proof(a.proof.as_ref(), o);
        Ok(())
    })
}

fn write_proof(p: Option<&Proof>, o: &mut Vec<u8>) {
    match p {
        None => o.push(0),
        Some(p) => {
            o.push(1);
            o.extend_from_slice(p);
        }
    }
}

fn read_proof(r: &mut Reader<'_>) -> Result<Option<Proof>, DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.array::<PROOF_LEN>()?)),
        _ => Err(r.invalid("proof presence flag is not 0 or 1")),
    }
}

/// Appends a Welcome frame.
pub fn encode_welcome(w: &Welcome, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("intercept name", w.name.len(), MAX_NAME_LEN)?;
    if let Some(head) = w.mysql_head {
        check_len("MySQL head", usize::from(head), MAX_MYSQL_HEAD)?;
    }
    frame(out, ty::WELCOME, |o| {
        o.extend_from_slice(&MAGIC);
        o.extend_from_slice(&w.version.to_be_bytes());
        o.push(w.name.len() as u8);
        o.extend_from_slice(w.name.as_bytes());
        o.extend_from_slice(&w.payload_prefix.to_be_bytes());
        match w.mysql_head {
            None => o.push(FRAMING_NONE),
            Some(head) => {
                o.push(FRAMING_MYSQL);
                o.extend_from_slice(&head.to_be_bytes());
            }
        }
        o.extend_from_slice(&w.features.to_be_bytes());
        write_proof(w.proof.as_ref(), o);
        Ok(())
    })
}

/// Appends a Reject frame.
pub fn encode_reject(j: &Reject, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("reject reason", j.reason.len(), MAX_REASON_LEN)?;
    frame(out, ty::REJECT, |o| {
        o.extend_from_slice(&MAGIC);
        o.extend_from_slice(&j.version.to_be_bytes());
        o.extend_from_slice(&(j.reason.len() as u16).to_be_bytes());
        o.extend_from_slice(j.reason.as_bytes());
        Ok(())
    })
}

/// Appends a Claim frame; at most [`MAX_ADDRS_PER_FRAME`] addresses.
pub fn encode_claim(addrs: &[SocketAddrV4], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode_addrs(ty::CLAIM, addrs, out)
}

/// Appends a Release frame; at most [`MAX_ADDRS_PER_FRAME`] addresses.
pub fn encode_release(addrs: &[SocketAddrV4], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode_addrs(ty::RELEASE, addrs, out)
}

/// Appends a Ping frame.
pub fn encode_ping(nonce: u64, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    CopierMessage::Ping(nonce).encode(out)
}

/// Appends a Doctor frame; at most [`MAX_DOCTOR_ARP`] ARP targets.
pub fn encode_doctor(q: &DoctorQuery, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("ARP target list", q.arp.len(), MAX_DOCTOR_ARP)?;
    frame(out, ty::DOCTOR, |o| {
        o.extend_from_slice(&q.target.octets());
        o.extend_from_slice(&(q.arp.len() as u16).to_be_bytes());
        for a in &q.arp {
            o.extend_from_slice(&a.addr.octets());
            o.push(u8::from(a.pool));
        }
        Ok(())
    })
}

/// Appends a DoctorReport frame.
pub fn encode_doctor_report(d: &DoctorReport, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("check list", d.checks.len(), MAX_DOCTOR_CHECKS)?;
    for c in &d.checks {
        check_len("check name", c.name.len(), MAX_CHECK_NAME_LEN)?;
        check_len("check detail", c.detail.len(), MAX_CHECK_DETAIL_LEN)?;
        check_len("check level", usize::from(c.level), 2)?;
    }
    frame(out, ty::DOCTOR_REPORT, |o| {
        o.extend_from_slice(&d.unix_ms.to_be_bytes());
        o.extend_from_slice(&(d.checks.len() as u16).to_be_bytes());
        for c in &d.checks {
            o.push(c.level);
            o.push(c.name.len() as u8);
            o.extend_from_slice(c.name.as_bytes());
            o.extend_from_slice(&(c.detail.len() as u16).to_be_bytes());
            o.extend_from_slice(c.detail.as_bytes());
        }
        Ok(())
    })
}

/// Appends a Pong frame.
pub fn encode_pong(nonce: u64, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::PONG, |o| {
        o.extend_from_slice(&nonce.to_be_bytes());
        Ok(())
    })
}

/// Appends one Feedback frame carrying `batch`. A batch of at most
/// [`MAX_FEEDBACK_PER_FRAME`] items always fits.
pub fn encode_feedback(batch: &[TestFeedback], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::FEEDBACK, |o| {
        let count = u32::try_from(batch.len())
            .map_err(|_| EncodeError::FrameTooLarge { len: usize::MAX })?;
        o.extend_from_slice(&count.to_be_bytes());
        for fb in batch {
            write_feedback(fb, o)?;
            // Stop early rather than build a huge buffer only to throw it away.
            if o.len() > MAX_FRAME_LEN + FRAME_HEADER_LEN {
                return Err(EncodeError::FrameTooLarge { len: o.len() });
            }
        }
        Ok(())
    })
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
            write_mysql(ev, o)?;
            if o.len() > MAX_FRAME_LEN + FRAME_HEADER_LEN {
                return Err(EncodeError::FrameTooLarge { len: o.len() });
            }
        }
        Ok(())
    })
}

fn encode_addrs(t: u8, addrs: &[SocketAddrV4], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("address list", addrs.len(), MAX_ADDRS_PER_FRAME)?;
    frame(out, t, |o| {
        o.extend_from_slice(&(addrs.len() as u32).to_be_bytes());
        for a in addrs {
            write_addr(a, o);
        }
        Ok(())
    })
}

fn write_addr(a: &SocketAddrV4, o: &mut Vec<u8>) {
    o.extend_from_slice(&a.ip().octets());
    o.extend_from_slice(&a.port().to_be_bytes());
}

fn write_feedback(fb: &TestFeedback, o: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len(
        "payload prefix",
        fb.payload_prefix.len(),
        MAX_PAYLOAD_PREFIX,
    )?;
    if fb.payload_prefix.len() as u64 > u64::from(fb.payload_len) {
        return Err(EncodeError::PrefixLongerThanPayload {
            prefix: fb.payload_prefix.len(),
            payload: fb.payload_len,
        });
    }
    write_addr(&fb.client, o);
    write_addr(&fb.server, o);
    o.extend_from_slice(&fb.seq.to_be_bytes());
    o.extend_from_slice(&fb.ack.to_be_bytes());
    o.push(fb.flags.0);
    o.extend_from_slice(&fb.window.to_be_bytes());
    let opts = &fb.options;
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
    o.extend_from_slice(&fb.payload_len.to_be_bytes());
    o.extend_from_slice(&(fb.payload_prefix.len() as u16).to_be_bytes());
    o.extend_from_slice(&fb.payload_prefix);
    Ok(())
}

fn write_mysql(ev: &MysqlEvent, o: &mut Vec<u8>) -> Result<(), EncodeError> {
    match ev {
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

fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), EncodeError> {
    if len > max {
        return Err(EncodeError::FieldTooLong { what, len, max });
    }
    Ok(())
}

/// Writes header + type + body, patching the length in afterwards; on any error `out` is
/// restored to its previous length so a caller batching several frames keeps a valid stream.
fn frame(
    out: &mut Vec<u8>,
    t: u8,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
    out.push(t);
    let res = body(out).and_then(|()| {
        let len = out.len() - start - FRAME_HEADER_LEN;
        if len > MAX_FRAME_LEN {
            return Err(EncodeError::FrameTooLarge { len });
        }
        out[start..start + FRAME_HEADER_LEN].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(())
    });
    if res.is_err() {
        out.truncate(start);
    }
    res
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Bounds-checked big-endian reads over one frame body.
struct Reader<'a> {
    buf: &'a [u8],
    ty: u8,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { ty: self.ty });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn addr(&mut self) -> Result<SocketAddrV4, DecodeError> {
        let ip: [u8; 4] = self.array()?;
        Ok(SocketAddrV4::new(Ipv4Addr::from(ip), self.u16()?))
    }
    /// Names and reasons only end up in logs: a bad byte must not cost the connection.
    fn string(&mut self, n: usize) -> Result<String, DecodeError> {
        Ok(String::from_utf8_lossy(self.bytes(n)?).into_owned())
    }
    fn invalid(&self, what: &'static str) -> DecodeError {
        DecodeError::Invalid { ty: self.ty, what }
    }
    fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                ty: self.ty,
                extra: self.buf.len(),
            })
        }
    }
}

fn read_magic_version(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    if r.bytes(4)? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let theirs = r.u16()?;
    if theirs != PROTOCOL_VERSION {
        return Err(DecodeError::VersionMismatch {
            theirs,
            ours: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

fn read_addrs(r: &mut Reader<'_>) -> Result<Vec<SocketAddrV4>, DecodeError> {
    let count = r.u32()? as usize;
    if count > MAX_ADDRS_PER_FRAME {
        return Err(r.invalid("more addresses than one frame may carry"));
    }
    if r.buf.len() != count * 6 {
        return Err(if r.buf.len() < count * 6 {
            DecodeError::Truncated { ty: r.ty }
        } else {
            DecodeError::TrailingBytes {
                ty: r.ty,
                extra: r.buf.len() - count * 6,
            }
        });
    }
    (0..count).map(|_| r.addr()).collect()
}

fn read_feedback(r: &mut Reader<'_>) -> Result<TestFeedback, DecodeError> {
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

fn read_mysql(r: &mut Reader<'_>) -> Result<MysqlEvent, DecodeError> {
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

/// Splits a byte stream into frames and decodes them as `M`.
///
/// Feed it whatever the socket returned, then call [`next_message`](Self::next_message) until it
/// yields `Ok(None)`. The buffer holds at most one partial frame plus what was fed since the
/// last drain. After an error the decoder is poisoned: it returns that error forever, because
/// the stream's framing can no longer be trusted.
pub struct FrameDecoder<M> {
    buf: Vec<u8>,
    start: usize,
    failed: Option<DecodeError>,
    _msg: PhantomData<fn() -> M>,
}

impl<M: WireMessage> FrameDecoder<M> {
    pub fn new() -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            failed: None,
            _msg: PhantomData,
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 {
            // Only the partial frame left over moves; usually a few bytes.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<M>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let res = self.next_inner();
        if let Err(e) = &res {
            self.failed = Some(e.clone());
            self.buf = Vec::new();
            self.start = 0;
        }
        res
    }

    fn next_inner(&mut self) -> Result<Option<M>, DecodeError> {
        let avail = &self.buf[self.start..];
        let Some(header) = avail.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            return Err(DecodeError::EmptyFrame);
        }
        if len > MAX_FRAME_LEN {
            return Err(DecodeError::FrameTooLarge { len });
        }
        let Some(frame) = avail.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
            return Ok(None);
        };
        let msg = M::decode(frame[0], &frame[1..])?;
        self.start += FRAME_HEADER_LEN + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(msg))
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

impl<M: WireMessage> Default for FrameDecoder<M> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(a: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, a), port)
    }

    fn feedback() -> TestFeedback {
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

    fn decode_all<M: WireMessage>(bytes: &[u8]) -> Result<Vec<M>, DecodeError> {
        let mut d = FrameDecoder::<M>::new();
        d.feed(bytes);
        let mut out = Vec::new();
        while let Some(m) = d.next_message()? {
            out.push(m);
        }
        assert_eq!(d.buffered(), 0, "leftover bytes");
        Ok(out)
    }

    #[test]
    fn hello_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_hello(
            &Hello::new("c1").with_features(FEATURE_PAYLOAD_HASHES),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            [
                0, 0, 0, 14, // length: type + 13-byte body
                0x01, b'T', b'S', b'H', b'D', 0, 6, // type, magic, version
                2, b'c', b'1', // name
                0, 0, 0, 1, // features
            ]
        );
    }

    #[test]
    fn handshake_layouts_are_as_documented() {
        let mut out = Vec::new();
        let c = Challenge {
            nonce: [0xab; NONCE_LEN],
            secret_required: true,
        };
        encode_challenge(&c, &mut out).unwrap();
        let mut want = vec![0, 0, 0, 40, 0x87, b'T', b'S', b'H', b'D', 0, 6];
        want.extend([0xab; NONCE_LEN]);
        want.push(1);
        assert_eq!(out, want);
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Challenge(c)]
        );

        for proof in [None, Some([0xcd; PROOF_LEN])] {
            let a = Auth {
                nonce: [0x11; NONCE_LEN],
                proof,
            };
            let mut out = Vec::new();
            encode_auth(&a, &mut out).unwrap();
            let body = NONCE_LEN + 1 + if proof.is_some() { PROOF_LEN } else { 0 };
            assert_eq!(out[..5], [0, 0, 0, 1 + body as u8, 0x06]);
            assert_eq!(out[5..5 + NONCE_LEN], [0x11; NONCE_LEN]);
            assert_eq!(out[5 + NONCE_LEN], u8::from(proof.is_some()));
            assert_eq!(
                decode_all::<CopierMessage>(&out).unwrap(),
                [CopierMessage::Auth(a)]
            );
        }
        // A bad presence flag or a short proof is refused, never guessed at.
        let mut bad = Vec::new();
        encode_auth(
            &Auth {
                nonce: [0; NONCE_LEN],
                proof: Some([0; PROOF_LEN]),
            },
            &mut bad,
        )
        .unwrap();
        bad[5 + NONCE_LEN] = 2;
        assert!(matches!(
            decode_all::<CopierMessage>(&bad),
            Err(DecodeError::Invalid { .. })
        ));
        let mut short = vec![0; NONCE_LEN];
        short.extend([1, 0, 0, 0, 0, 0]);
        assert_eq!(
            CopierMessage::decode(0x06, &short),
            Err(DecodeError::Truncated { ty: 0x06 })
        );
    }

    #[test]
    fn doctor_layouts_are_as_documented() {
        let mut out = Vec::new();
        let q = DoctorQuery {
            target: Ipv4Addr::new(198, 18, 0, 3),
            arp: vec![ArpTarget {
                addr: Ipv4Addr::new(198, 19, 0, 7),
                pool: true,
            }],
        };
        encode_doctor(&q, &mut out).unwrap();
        assert_eq!(
            out,
            [0, 0, 0, 12, 0x05, 198, 18, 0, 3, 0, 1, 198, 19, 0, 7, 1]
        );
        let mut out = Vec::new();
        let r = DoctorReport {
            unix_ms: 1,
            checks: vec![DoctorCheck::new(2, "ip", "x")],
        };
        encode_doctor_report(&r, &mut out).unwrap();
        assert_eq!(
            out,
            [0, 0, 0, 18, 0x86, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 2, 2, b'i', b'p', 0, 1, b'x']
        );
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::DoctorReport(r)]
        );
        let bad_level = DoctorReport {
            unix_ms: 0,
            checks: vec![DoctorCheck {
                level: 3,
                name: String::new(),
                detail: String::new(),
            }],
        };
        assert!(encode_doctor_report(&bad_level, &mut Vec::new()).is_err());
        // A check too long for the wire is cut, not refused.
        let long = DoctorCheck::new(9, &"n".repeat(300), &"é".repeat(3000));
        assert_eq!((long.level, long.name.len()), (2, MAX_CHECK_NAME_LEN));
        assert!(long.detail.len() <= MAX_CHECK_DETAIL_LEN);
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
    fn other_versions_are_refused_with_both_numbers() {
        let mut out = Vec::new();
        let h = Hello {
            version: 7,
            ..Hello::new("old")
        };
        encode_hello(&h, &mut out).unwrap();
        let err = decode_all::<CopierMessage>(&out).unwrap_err();
        assert_eq!(
            err,
            DecodeError::VersionMismatch {
                theirs: 7,
                ours: PROTOCOL_VERSION
            }
        );
        assert!(err.to_string().contains("same tcpshadow release"));
    }

    #[test]
    fn reject_of_any_version_is_readable() {
        let mut out = Vec::new();
        let j = Reject {
            version: 9,
            reason: "bad token".into(),
        };
        encode_reject(&j, &mut out).unwrap();
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Reject(j)]
        );
    }

    #[test]
    fn messages_of_the_other_direction_are_refused() {
        let mut out = Vec::new();
        encode_pong(1, &mut out).unwrap();
        assert_eq!(
            decode_all::<CopierMessage>(&out).unwrap_err(),
            DecodeError::UnexpectedType { ty: 0x84 }
        );
    }

    #[test]
    fn http_probe_is_refused_from_the_header() {
        let err = decode_all::<CopierMessage>(b"GET / HTTP/1.1\r\n").unwrap_err();
        assert!(matches!(err, DecodeError::FrameTooLarge { .. }));
    }

    #[test]
    fn decoder_is_poisoned_after_an_error() {
        let mut d = FrameDecoder::<CopierMessage>::new();
        d.feed(&[0, 0, 0, 0]);
        assert_eq!(d.next_message(), Err(DecodeError::EmptyFrame));
        let mut ok = Vec::new();
        encode_ping(1, &mut ok).unwrap();
        d.feed(&ok);
        assert_eq!(d.next_message(), Err(DecodeError::EmptyFrame));
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut out = Vec::new();
        encode_claim(&[addr(10, 1), addr(11, 2)], &mut out).unwrap();
        encode_ping(5, &mut out).unwrap();
        let mut d = FrameDecoder::<CopierMessage>::new();
        let mut got = Vec::new();
        for b in &out {
            d.feed(std::slice::from_ref(b));
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            [
                CopierMessage::Claim(vec![addr(10, 1), addr(11, 2)]),
                CopierMessage::Ping(5)
            ]
        );
    }

    #[test]
    fn from_packet_keeps_the_configured_prefix() {
        let pkt = TcpPacket {
            src: Ipv4Addr::new(198, 18, 0, 3),
            dst: Ipv4Addr::new(198, 18, 0, 10),
            src_port: 3306,
            dst_port: 40000,
            seq: 9,
            ack: 8,
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

    fn mysql_packet(head: &[u8], len: u32) -> MysqlEvent {
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

    #[test]
    fn welcome_announces_the_framing() {
        for mysql_head in [None, Some(0), Some(16), Some(MAX_MYSQL_HEAD as u16)] {
            let w = Welcome {
                version: PROTOCOL_VERSION,
                name: "i".into(),
                payload_prefix: 0,
                mysql_head,
                features: FEATURE_PAYLOAD_HASHES,
                proof: mysql_head.map(|_| [5; PROOF_LEN]),
            };
            let mut out = Vec::new();
            encode_welcome(&w, &mut out).unwrap();
            assert_eq!(
                decode_all::<InterceptMessage>(&out).unwrap(),
                [InterceptMessage::Welcome(w)]
            );
        }
        let too_long = Welcome {
            version: PROTOCOL_VERSION,
            name: "i".into(),
            payload_prefix: 0,
            mysql_head: Some(MAX_MYSQL_HEAD as u16 + 1),
            features: 0,
            proof: None,
        };
        assert!(encode_welcome(&too_long, &mut Vec::new()).is_err());
    }

    #[test]
    fn auth_debug_hides_the_proof() {
        let a = Auth {
            nonce: [0; NONCE_LEN],
            proof: Some([0x41; PROOF_LEN]),
        };
        let s = format!("{a:?}");
        assert!(!s.contains("65") && !s.contains("41"), "{s}");
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
                |(
                    (client, server, seq, ack),
                    (flags, window),
                    (mss, ws, sp, ts),
                    prefix,
                    extra,
                )| {
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

    fn arb_mysql_event() -> impl Strategy<Value = MysqlEvent> {
        prop_oneof![
            (
                arb_addr(),
                (any::<u64>(), any::<u32>(), any::<u8>()),
                proptest::collection::vec(any::<u8>(), 0..80),
                (0u32..100_000, any::<Option<u64>>(), any::<u32>()),
            )
                .prop_map(
                    |(
                        client,
                        (stream_offset, tcp_seq, seq_id),
                        head,
                        (extra, hash, framed_at_us),
                    )| {
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
        fn mysql_item_length_matches_encoding(batch in proptest::collection::vec(arb_mysql_event(), 0..20)) {
            let mut out = Vec::new();
            encode_mysql(7, &batch, &mut out).unwrap();
            prop_assert_eq!(out.len(), FRAME_HEADER_LEN + 9 + batch.iter().map(MysqlEvent::encoded_len).sum::<usize>());
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

    fn decode_all_lenient<M: WireMessage>(bytes: &[u8]) -> Vec<M> {
        let mut d = FrameDecoder::<M>::new();
        d.feed(bytes);
        let mut out = Vec::new();
        while let Ok(Some(m)) = d.next_message() {
            out.push(m);
        }
        out
    }
}
