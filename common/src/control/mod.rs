//! The control channel between intercept and copier: message types and their codec.
//!
//! Intercept sees the test server's replies; the copier needs a few fields of each segment to play
//! the client side of the mirrored connection ([`TestFeedback`]), and a summary of each MySQL
//! packet to log in and map statement ids ([`MysqlEvent`]). This module turns those messages into
//! length-prefixed binary frames and back (the byte-by-byte layout is in `docs/protocol.md`,
//! which `doc_check` holds to the code).
//!
//! Layout: this file holds what every message shares (protocol version, feature bits, type
//! codes, the two direction enums and their dispatch, the error types); `frame` the frame header
//! and the stream decoder; `codec` the bounds-checked reader and the field helpers; then one file
//! per message or small family, each with its struct, its `parse` and `emit` side by side and its
//! wire-layout test. Changing a message's layout should touch its file, this file's
//! [`PROTOCOL_VERSION`] and `docs/protocol.md`, nothing else.
//!
//! It must never do I/O, never panic on what it decodes and never allocate more than the frame it
//! was given: every received byte is untrusted input, and a frame larger than [`MAX_FRAME_LEN`]
//! is refused from its 4-byte header alone, before any of its body is buffered.

mod claim;
mod codec;
mod doctor;
mod feedback;
mod frame;
mod handshake;
mod hello;
mod mysql;
mod ping;
mod prompt;
mod welcome;

#[cfg(test)]
mod doc_check;
#[cfg(test)]
mod tests;

pub use claim::{encode_claim, encode_release, MAX_ADDRS_PER_FRAME};
pub use doctor::{
    encode_doctor, encode_doctor_report, ArpTarget, DoctorCheck, DoctorQuery, DoctorReport,
    MAX_CHECK_DETAIL_LEN, MAX_CHECK_NAME_LEN, MAX_DOCTOR_ARP, MAX_DOCTOR_CHECKS,
};
pub use feedback::{encode_feedback, TestFeedback, MAX_FEEDBACK_PER_FRAME, MAX_PAYLOAD_PREFIX};
pub use frame::{FrameDecoder, FRAME_HEADER_LEN, MAX_FRAME_LEN};
pub use handshake::{encode_auth, encode_challenge, Auth, Challenge};
pub use hello::{encode_hello, encode_reject, Hello, Reject, MAGIC, MAX_REASON_LEN};
pub use mysql::{
    encode_mysql, MysqlEvent, MysqlHead, MysqlPacket, MysqlRows, MAX_MYSQL_EVENTS_PER_FRAME,
    MAX_MYSQL_HEAD, MYSQL_FULL_HEAD_PACKETS, MYSQL_HEAD_INLINE, MYSQL_MAX_PAYLOAD,
};
pub use ping::{encode_ping, encode_pong};
pub use prompt::encode_prompt;
pub use welcome::{encode_welcome, Welcome};

use std::net::SocketAddrV4;

use codec::Reader;

/// Bumped on any change to the layout of any message. Peers require equality.
/// Version 2 added the Mysql message and the Welcome's framing fields. Version 3 added feature
/// bits to Hello and Welcome and MySQL packet summaries carrying a payload hash. Version 4
/// replaced the Hello's cleartext token with a challenge-response (Challenge, Auth and the
/// Welcome's proof; see [`crate::auth`]). Version 5 added the Mysql message's `sent_at_us`,
/// so the copier can date replies that waited in intercept's capture blocks. Version 6 added
/// the FramingResumed item.
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
/// Feature bit: while a connection claims no address, neither side sends heartbeats nor times
/// it out for silence; both ends keep TCP keepalive on it instead ([`IDLE_KEEPALIVE`]), which
/// the kernels answer without waking a thread. An idle copier otherwise wakes for a Ping and
/// its Pong every `idle_ping_interval`, and intercept's reader for each (issue 20: "idle
/// copier: no wakeups beyond its status timer"). A dead peer is still found: by keepalive,
/// which stays on (within 30 s), and by the heartbeat while addresses are claimed.
pub const FEATURE_QUIET_IDLE: u32 = 8;
/// Feature bit: the copier says, with [`CopierMessage::Prompt`], while one of its sessions
/// waits on the test server (a login for its greeting, an execute for its PREPARE_OK);
/// intercept then gathers what it relays to it for at most 1 ms, and for `--relay-flush-us`
/// only while none does. Gathering halves both daemons' wakeups under load, and costs a
/// session with nothing held no time: its commands are already with the test server.
pub const FEATURE_PROMPT_ON_DEMAND: u32 = 16;
/// Every feature bit this build knows; a peer's other bits are ignored.
pub const KNOWN_FEATURES: u32 = FEATURE_PAYLOAD_HASHES
    | FEATURE_PROMPT_REPLIES
    | FEATURE_ROW_RUNS
    | FEATURE_QUIET_IDLE
    | FEATURE_PROMPT_ON_DEMAND;
/// TCP keepalive of a [`FEATURE_QUIET_IDLE`] connection: first probe after 10 s of silence,
/// then every 5 s, dead after 4 unanswered: a vanished peer is found within 30 s, as the
/// heartbeat's read timeouts find one.
pub const IDLE_KEEPALIVE: IdleKeepalive = IdleKeepalive {
    idle: std::time::Duration::from_secs(10),
    interval: std::time::Duration::from_secs(5),
    probes: 4,
};

/// See [`IDLE_KEEPALIVE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleKeepalive {
    pub idle: std::time::Duration,
    pub interval: std::time::Duration,
    pub probes: u32,
}
/// Longest copier or intercept name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;

/// Message type codes, in one table because the two dispatches below and the doc's type table
/// must agree on all of them at once. Hello and Reject keep their codes and layouts in every
/// version, so that peers of different versions can still tell each other why they cannot talk.
mod ty {
    pub const HELLO: u8 = 0x01;
    pub const CLAIM: u8 = 0x02;
    pub const RELEASE: u8 = 0x03;
    pub const PING: u8 = 0x04;
    pub const DOCTOR: u8 = 0x05;
    pub const AUTH: u8 = 0x06;
    pub const PROMPT: u8 = 0x07;
    pub const WELCOME: u8 = 0x81;
    pub const REJECT: u8 = 0x82;
    pub const FEEDBACK: u8 = 0x83;
    pub const PONG: u8 = 0x84;
    pub const MYSQL: u8 = 0x85;
    pub const DOCTOR_REPORT: u8 = 0x86;
    pub const CHALLENGE: u8 = 0x87;
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
    /// Whether one of this copier's sessions waits on the test server: relays gathered for
    /// at most 1 ms while true, for `--relay-flush-us` while false
    /// ([`FEATURE_PROMPT_ON_DEMAND`] only).
    Prompt(bool),
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
            CopierMessage::Ping(n) => encode_ping(*n, out),
            CopierMessage::Doctor(q) => encode_doctor(q, out),
            CopierMessage::Prompt(on) => encode_prompt(*on, out),
        }
    }

    fn decode(t: u8, body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(t, body);
        let msg = match t {
            ty::HELLO => CopierMessage::Hello(Hello::parse(&mut r)?),
            ty::AUTH => CopierMessage::Auth(Auth::parse(&mut r)?),
            ty::CLAIM => CopierMessage::Claim(claim::parse_addrs(&mut r)?),
            ty::RELEASE => CopierMessage::Release(claim::parse_addrs(&mut r)?),
            ty::PING => CopierMessage::Ping(ping::parse_nonce(&mut r)?),
            ty::DOCTOR => CopierMessage::Doctor(DoctorQuery::parse(&mut r)?),
            ty::PROMPT => CopierMessage::Prompt(prompt::parse_prompt(&mut r)?),
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
        let mut r = Reader::new(t, body);
        let msg = match t {
            ty::CHALLENGE => InterceptMessage::Challenge(Challenge::parse(&mut r)?),
            ty::WELCOME => InterceptMessage::Welcome(Welcome::parse(&mut r)?),
            ty::REJECT => InterceptMessage::Reject(Reject::parse(&mut r)?),
            ty::FEEDBACK => InterceptMessage::Feedback(feedback::parse_batch(&mut r)?),
            ty::PONG => InterceptMessage::Pong(ping::parse_nonce(&mut r)?),
            ty::MYSQL => {
                let (sent_at_us, events) = mysql::parse_batch(&mut r)?;
                InterceptMessage::Mysql { sent_at_us, events }
            }
            ty::DOCTOR_REPORT => InterceptMessage::DoctorReport(DoctorReport::parse(&mut r)?),
            _ => return Err(DecodeError::UnexpectedType { ty: t }),
        };
        r.finish()?;
        Ok(msg)
    }
}
