//! The records the copier's TLS plaintext probe (`copier/bpf/tls_plain.bpf.c`, issue 21) writes
//! into its BPF ring buffer, and their decoding.
//!
//! What this room is for: turning one ring record into a [`TlsEvent`], checking every field a
//! record could get wrong. What it must never do: trust a record (the ring is written by a
//! program that reads another process's memory; a record is untrusted input), panic, or do I/O.
//!
//! # Wire layout
//!
//! A record is a 96-byte header, little-endian (the host's: the probe runs on x86-64), then
//! `len` bytes of plaintext. The C side is `struct tls_event_hdr`, whose size and offsets it
//! `_Static_assert`s against the same numbers; [`HEADER_LEN`] and the `OFF_*` constants below
//! are those numbers, and the unit tests hold them to each other.
//!
//! | offset | size | field        | meaning |
//! |-------:|-----:|--------------|---------|
//! | 0      | 1    | `kind`       | 1 = data chunk, 2 = stream start, 3 = the stream's fd closed |
//! | 1      | 1    | `dir`        | 0 = from the client (`SSL_read`), 1 = from the server (`SSL_write`) |
//! | 2      | 2    | `flags`      | bit 0: joined midway (no `SSL_set_fd` seen); bit 1: `fd` is known |
//! | 4      | 4    | `len`        | plaintext bytes after the header (0 but for data; at most [`CHUNK_MAX`]) |
//! | 8      | 4    | `pid`        | the server's tgid (as the kernel's initial pid namespace sees it) |
//! | 12     | 4    | `tid`        | the thread that made the call |
//! | 16     | 8    | `ssl`        | the `SSL*` (an address in the server: only an identity) |
//! | 24     | 4    | `fd`         | the socket's fd in the server, -1 when unknown |
//! | 28     | 4    | reserved     | 0 |
//! | 32     | 8    | `generation` | tells this stream of `ssl` from earlier ones at the same address |
//! | 40     | 8    | `offset`     | bytes of this direction of the stream before this chunk (emitted or lost) |
//! | 48     | 8    | `time_ns`    | `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the call's return |
//! | 56     | 1    | `sock.kind`  | what the kernel says the fd is: 0 = not told, 1 = TCP over IPv4, 2 = TCP over IPv6, 3 = Unix socket, 4 = anything else |
//! | 57     | 1    | reserved     | 0 |
//! | 58     | 2    | `sock.family`| the socket's address family (`AF_*`), 0 when not told or not a socket |
//! | 60     | 2    | `sock.local_port`  | TCP: the server's port, host order |
//! | 62     | 2    | `sock.remote_port` | TCP: the client's port, host order |
//! | 64     | 16   | `sock.local_addr`  | TCP: the server's address, network order (IPv4: the first 4 bytes) |
//! | 80     | 16   | `sock.remote_addr` | TCP: the client's address, likewise |
//! | 96     | len  | data         | the plaintext |
//!
//! The `sock` fields are told by the probe inside the kernel, from the server's fd table, when
//! it learns the stream's fd (`SSL_set_fd`, or the syscall of a stream that joined midway);
//! every record of the stream carries them from then on, so that a stream is resolved even
//! when its first records were lost or its whole life fits between two drains of the ring.
//!
//! A call that moved more than [`CHUNK_MAX`] bytes is several records with consecutive
//! offsets; bytes the probe could not emit (ring full, over its per-call cap) still advance the
//! offset, so a gap between one record's `offset + len` and the next one's `offset` is exactly
//! the bytes missing.

/// Size of a record's header.
pub const HEADER_LEN: usize = 96;
/// Most plaintext bytes in one record (`TLS_CHUNK_MAX` in the C file).
pub const CHUNK_MAX: usize = 16384;

/// Field offsets in the header (the C side asserts the same).
pub const OFF_KIND: usize = 0;
pub const OFF_DIR: usize = 1;
pub const OFF_FLAGS: usize = 2;
pub const OFF_LEN: usize = 4;
pub const OFF_PID: usize = 8;
pub const OFF_TID: usize = 12;
pub const OFF_SSL: usize = 16;
pub const OFF_FD: usize = 24;
pub const OFF_GENERATION: usize = 32;
pub const OFF_OFFSET: usize = 40;
pub const OFF_TIME_NS: usize = 48;
/// `struct tls_sock` inside the header, and its fields' offsets from the header's start.
pub const OFF_SOCK: usize = 56;
pub const OFF_SOCK_KIND: usize = OFF_SOCK;
pub const OFF_SOCK_FAMILY: usize = OFF_SOCK + 2;
pub const OFF_SOCK_LOCAL_PORT: usize = OFF_SOCK + 4;
pub const OFF_SOCK_REMOTE_PORT: usize = OFF_SOCK + 6;
pub const OFF_SOCK_LOCAL_ADDR: usize = OFF_SOCK + 8;
pub const OFF_SOCK_REMOTE_ADDR: usize = OFF_SOCK + 24;
/// Size of `struct tls_sock`.
pub const SOCK_LEN: usize = 40;

const KIND_DATA: u8 = 1;
const KIND_STREAM_START: u8 = 2;
const KIND_FD_CLOSED: u8 = 3;
const FLAG_JOINED_MIDWAY: u16 = 1;
const FLAG_FD_KNOWN: u16 = 2;
const FLAGS_ALL: u16 = FLAG_JOINED_MIDWAY | FLAG_FD_KNOWN;
const SOCK_UNKNOWN: u8 = 0;
const SOCK_TCP4: u8 = 1;
const SOCK_TCP6: u8 = 2;
const SOCK_UNIX: u8 = 3;
const SOCK_OTHER: u8 = 4;
/// `AF_*` (include/linux/socket.h), as the probe writes them in `sock.family`.
pub const AF_UNIX: u16 = 1;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// What the kernel said the stream's fd is, when the probe learnt it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockInfo {
    /// Not told: the probe has not learnt the fd yet, or its walk of the fd table failed
    /// (user space may still ask /proc).
    Unknown,
    /// A TCP connection: the server's address and the client's, as the server's socket has
    /// them (an IPv6 socket's IPv4-mapped addresses are left as the kernel keeps them).
    Tcp {
        local: SocketAddr,
        remote: SocketAddr,
    },
    /// A Unix-domain socket (a client on the server's Unix socket).
    Unix,
    /// Anything else: a socket of another family or protocol (`family`, 0 when the fd is not
    /// a socket at all).
    Other { family: u16 },
}

/// Which way the plaintext went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlainDir {
    /// Client -> server: what `SSL_read` returned in the server.
    FromClient,
    /// Server -> client: what the server gave `SSL_write`.
    FromServer,
}

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A new TLS stream of `ssl` (its `SSL_set_fd`, or its first call seen when it began
    /// before the probe: then `joined_midway`). Its offsets start at 0.
    StreamStart,
    /// Plaintext of one direction.
    Data,
    /// The server is closing the stream's fd (its `close` syscall): from here on the fd
    /// number may name another connection. `generation` is 0 when the probe no longer knew
    /// the stream.
    FdClosed,
}

/// One decoded record; `data` borrows from the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsEvent<'a> {
    pub kind: EventKind,
    /// For a stream start: [`PlainDir::FromClient`], meaningless.
    pub dir: PlainDir,
    pub joined_midway: bool,
    /// The socket's fd in the server, when the probe knows it.
    pub fd: Option<u32>,
    pub pid: u32,
    pub tid: u32,
    pub ssl: u64,
    pub generation: u64,
    pub offset: u64,
    pub time_ns: u64,
    /// The stream's socket, as the probe told it in the kernel.
    pub sock: SockInfo,
    pub data: &'a [u8],
}

/// Why a record is not a [`TlsEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    #[error("unknown record kind {0}")]
    Kind(u8),
    #[error("unknown direction {0}")]
    Direction(u8),
    #[error("unknown flags {0:#x}")]
    Flags(u16),
    #[error("record says {declared} bytes of data, carries {carried}")]
    Length { declared: u32, carried: usize },
    #[error("record of {0} data bytes is over the {CHUNK_MAX}-byte chunk limit")]
    TooLong(u32),
    #[error("stream start or fd close carries {0} data bytes")]
    StartWithData(u32),
    #[error("unknown socket kind {0}")]
    SockKind(u8),
    #[error("chunk offset {offset} + {len} bytes overflows")]
    OffsetOverflow { offset: u64, len: u32 },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    let mut a = [0; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
fn addr16_at(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

/// The `sock` part of a header (`head` is a whole header).
fn decode_sock(head: &[u8]) -> Result<SockInfo, DecodeError> {
    let family = u16_at(head, OFF_SOCK_FAMILY);
    let local_port = u16_at(head, OFF_SOCK_LOCAL_PORT);
    let remote_port = u16_at(head, OFF_SOCK_REMOTE_PORT);
    let local = addr16_at(head, OFF_SOCK_LOCAL_ADDR);
    let remote = addr16_at(head, OFF_SOCK_REMOTE_ADDR);
    Ok(match head[OFF_SOCK_KIND] {
        SOCK_UNKNOWN => SockInfo::Unknown,
        SOCK_TCP4 => {
            let v4 = |a: [u8; 16]| IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]));
            SockInfo::Tcp {
                local: SocketAddr::new(v4(local), local_port),
                remote: SocketAddr::new(v4(remote), remote_port),
            }
        }
        SOCK_TCP6 => SockInfo::Tcp {
            local: SocketAddr::new(IpAddr::V6(Ipv6Addr::from(local)), local_port),
            remote: SocketAddr::new(IpAddr::V6(Ipv6Addr::from(remote)), remote_port),
        },
        SOCK_UNIX => SockInfo::Unix,
        SOCK_OTHER => SockInfo::Other { family },
        k => return Err(DecodeError::SockKind(k)),
    })
}

/// Writes `sock` into the `sock` part of header `head`, as the probe does.
fn encode_sock(sock: &SockInfo, head: &mut [u8; HEADER_LEN]) {
    let (kind, family, local, remote) = match *sock {
        SockInfo::Unknown => (SOCK_UNKNOWN, 0, None, None),
        SockInfo::Tcp { local, remote } => {
            let family = if local.is_ipv4() { AF_INET } else { AF_INET6 };
            let kind = if local.is_ipv4() {
                SOCK_TCP4
            } else {
                SOCK_TCP6
            };
            (kind, family, Some(local), Some(remote))
        }
        SockInfo::Unix => (SOCK_UNIX, AF_UNIX, None, None),
        SockInfo::Other { family } => (SOCK_OTHER, family, None, None),
    };
    head[OFF_SOCK_KIND] = kind;
    head[OFF_SOCK_FAMILY..OFF_SOCK_FAMILY + 2].copy_from_slice(&family.to_le_bytes());
    let mut put = |at_port: usize, at_addr: usize, a: Option<SocketAddr>| {
        let Some(a) = a else { return };
        head[at_port..at_port + 2].copy_from_slice(&a.port().to_le_bytes());
        let bytes: [u8; 16] = match a.ip() {
            // A TCP4 record keeps its address in the first 4 bytes, the rest zero. A mixed
            // pair (IPv4 local, IPv6 remote) cannot come from one socket; written as the
            // local address's family says.
            IpAddr::V4(v4) => {
                let mut b = [0; 16];
                b[..4].copy_from_slice(&v4.octets());
                b
            }
            IpAddr::V6(v6) => v6.octets(),
        };
        head[at_addr..at_addr + 16].copy_from_slice(&bytes);
    };
    put(OFF_SOCK_LOCAL_PORT, OFF_SOCK_LOCAL_ADDR, local);
    put(OFF_SOCK_REMOTE_PORT, OFF_SOCK_REMOTE_ADDR, remote);
}

/// Decodes one ring record (exactly one: the ring hands records over with their size).
pub fn decode(record: &[u8]) -> Result<TlsEvent<'_>, DecodeError> {
    let Some((head, data)) = record.split_at_checked(HEADER_LEN) else {
        return Err(DecodeError::Short(record.len()));
    };
    let kind = match head[OFF_KIND] {
        KIND_DATA => EventKind::Data,
        KIND_STREAM_START => EventKind::StreamStart,
        KIND_FD_CLOSED => EventKind::FdClosed,
        k => return Err(DecodeError::Kind(k)),
    };
    let dir = match head[OFF_DIR] {
        0 => PlainDir::FromClient,
        1 => PlainDir::FromServer,
        d => return Err(DecodeError::Direction(d)),
    };
    let flags = u16_at(head, OFF_FLAGS);
    if flags & !FLAGS_ALL != 0 {
        return Err(DecodeError::Flags(flags));
    }
    let len = u32_at(head, OFF_LEN);
    if len as usize > CHUNK_MAX {
        return Err(DecodeError::TooLong(len));
    }
    if data.len() != len as usize {
        return Err(DecodeError::Length {
            declared: len,
            carried: data.len(),
        });
    }
    if kind != EventKind::Data && len != 0 {
        return Err(DecodeError::StartWithData(len));
    }
    let offset = u64_at(head, OFF_OFFSET);
    if offset.checked_add(u64::from(len)).is_none() {
        return Err(DecodeError::OffsetOverflow { offset, len });
    }
    let raw_fd = u32_at(head, OFF_FD);
    // An fd is a non-negative int; the probe writes -1 when it does not know it.
    let fd = (flags & FLAG_FD_KNOWN != 0 && raw_fd <= i32::MAX as u32).then_some(raw_fd);
    let sock = decode_sock(head)?;
    Ok(TlsEvent {
        kind,
        dir,
        joined_midway: flags & FLAG_JOINED_MIDWAY != 0,
        fd,
        pid: u32_at(head, OFF_PID),
        tid: u32_at(head, OFF_TID),
        ssl: u64_at(head, OFF_SSL),
        generation: u64_at(head, OFF_GENERATION),
        offset,
        time_ns: u64_at(head, OFF_TIME_NS),
        sock,
        data,
    })
}

/// Writes `event` as the probe would (for tests, seeds and fuzzing; the probe itself is C).
pub fn encode(event: &TlsEvent<'_>, out: &mut Vec<u8>) {
    let mut head = [0u8; HEADER_LEN];
    head[OFF_KIND] = match event.kind {
        EventKind::Data => KIND_DATA,
        EventKind::StreamStart => KIND_STREAM_START,
        EventKind::FdClosed => KIND_FD_CLOSED,
    };
    head[OFF_DIR] = match event.dir {
        PlainDir::FromClient => 0,
        PlainDir::FromServer => 1,
    };
    let mut flags = 0;
    if event.joined_midway {
        flags |= FLAG_JOINED_MIDWAY;
    }
    if event.fd.is_some() {
        flags |= FLAG_FD_KNOWN;
    }
    head[OFF_FLAGS..OFF_FLAGS + 2].copy_from_slice(&flags.to_le_bytes());
    let len = u32::try_from(event.data.len()).unwrap_or(u32::MAX);
    head[OFF_LEN..OFF_LEN + 4].copy_from_slice(&len.to_le_bytes());
    head[OFF_PID..OFF_PID + 4].copy_from_slice(&event.pid.to_le_bytes());
    head[OFF_TID..OFF_TID + 4].copy_from_slice(&event.tid.to_le_bytes());
    head[OFF_SSL..OFF_SSL + 8].copy_from_slice(&event.ssl.to_le_bytes());
    let fd = event.fd.map_or(-1i32 as u32, |f| f);
    head[OFF_FD..OFF_FD + 4].copy_from_slice(&fd.to_le_bytes());
    head[OFF_GENERATION..OFF_GENERATION + 8].copy_from_slice(&event.generation.to_le_bytes());
    head[OFF_OFFSET..OFF_OFFSET + 8].copy_from_slice(&event.offset.to_le_bytes());
    head[OFF_TIME_NS..OFF_TIME_NS + 8].copy_from_slice(&event.time_ns.to_le_bytes());
    encode_sock(&event.sock, &mut head);
    out.extend_from_slice(&head);
    out.extend_from_slice(event.data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The C file's `_Static_assert`s, read from the file itself, say the same numbers.
    #[test]
    fn layout_matches_the_c_struct() {
        let c = include_str!("../../copier/bpf/tls_plain.bpf.c");
        let has = |s: &str| assert!(c.contains(s), "tls_plain.bpf.c lacks `{s}`");
        has(&format!("sizeof(struct tls_event_hdr) == {HEADER_LEN}"));
        has(&format!("#define TLS_CHUNK_MAX {CHUNK_MAX}"));
        for (field, off) in [
            ("len", OFF_LEN),
            ("pid", OFF_PID),
            ("ssl", OFF_SSL),
            ("fd", OFF_FD),
            ("generation", OFF_GENERATION),
            ("offset", OFF_OFFSET),
            ("time_ns", OFF_TIME_NS),
            ("sock", OFF_SOCK),
        ] {
            has(&format!(
                "__builtin_offsetof(struct tls_event_hdr, {field}) == {off}"
            ));
        }
        has(&format!("sizeof(struct tls_sock) == {SOCK_LEN}"));
        for (field, off) in [
            ("family", OFF_SOCK_FAMILY),
            ("local_port", OFF_SOCK_LOCAL_PORT),
            ("remote_port", OFF_SOCK_REMOTE_PORT),
            ("local_addr", OFF_SOCK_LOCAL_ADDR),
            ("remote_addr", OFF_SOCK_REMOTE_ADDR),
        ] {
            has(&format!(
                "__builtin_offsetof(struct tls_sock, {field}) == {}",
                off - OFF_SOCK
            ));
        }
        assert_eq!(OFF_SOCK + SOCK_LEN, HEADER_LEN);
        for (name, v) in [
            ("TLS_SOCK_UNKNOWN", SOCK_UNKNOWN),
            ("TLS_SOCK_TCP4", SOCK_TCP4),
            ("TLS_SOCK_TCP6", SOCK_TCP6),
            ("TLS_SOCK_UNIX", SOCK_UNIX),
            ("TLS_SOCK_OTHER", SOCK_OTHER),
        ] {
            has(&format!("#define {name} {v}"));
        }
        has(&format!("#define TLS_AF_UNIX {AF_UNIX}"));
        has(&format!("#define TLS_AF_INET {AF_INET}"));
        has(&format!("#define TLS_AF_INET6 {AF_INET6}"));
        has(&format!("#define TLS_EVENT_DATA {KIND_DATA}"));
        has(&format!(
            "#define TLS_EVENT_STREAM_START {KIND_STREAM_START}"
        ));
        has(&format!("#define TLS_EVENT_FD_CLOSED {KIND_FD_CLOSED}"));
        has(&format!(
            "#define TLS_FLAG_JOINED_MIDWAY {FLAG_JOINED_MIDWAY}"
        ));
        has(&format!("#define TLS_FLAG_FD_KNOWN {FLAG_FD_KNOWN}"));
        has("#define TLS_DIR_FROM_CLIENT 0");
        has("#define TLS_DIR_FROM_SERVER 1");
        // The C field order is the table's: kind, dir, flags, len, pid, tid, ssl, fd,
        // reserved, generation, offset, time_ns, sock.
        assert_eq!(OFF_TID, OFF_PID + 4);
        assert_eq!(OFF_DIR, OFF_KIND + 1);
        assert_eq!(OFF_FLAGS, OFF_DIR + 1);
    }

    fn sample(data: &[u8]) -> TlsEvent<'_> {
        TlsEvent {
            kind: EventKind::Data,
            dir: PlainDir::FromServer,
            joined_midway: true,
            fd: Some(42),
            pid: 7,
            tid: 8,
            ssl: 0x5555_0000_1234,
            generation: 99,
            offset: 1000,
            time_ns: 123,
            sock: SockInfo::Tcp {
                local: "198.18.0.1:3306".parse().unwrap(),
                remote: "198.18.1.2:40001".parse().unwrap(),
            },
            data,
        }
    }

    #[test]
    fn a_written_record_decodes_to_itself() {
        let mut b = Vec::new();
        encode(&sample(b"hello"), &mut b);
        assert_eq!(b.len(), HEADER_LEN + 5);
        assert_eq!(decode(&b), Ok(sample(b"hello")));
    }

    #[test]
    fn an_unknown_fd_is_none_even_with_the_flag() {
        let mut b = Vec::new();
        encode(&sample(b""), &mut b);
        b[OFF_FD..OFF_FD + 4].copy_from_slice(&(-1i32).to_le_bytes());
        assert_eq!(decode(&b).map(|e| e.fd), Ok(None));
    }

    /// The bytes the probe writes for a TCP4 socket: ports in host order (little-endian
    /// here), addresses in network order in the first 4 of 16 bytes.
    #[test]
    fn a_tcp4_socket_is_read_as_the_probe_writes_it() {
        let mut b = Vec::new();
        encode(
            &TlsEvent {
                sock: SockInfo::Unknown,
                ..sample(b"")
            },
            &mut b,
        );
        b[OFF_SOCK_KIND] = 1;
        b[OFF_SOCK_FAMILY..OFF_SOCK_FAMILY + 2].copy_from_slice(&2u16.to_le_bytes());
        b[OFF_SOCK_LOCAL_PORT..OFF_SOCK_LOCAL_PORT + 2].copy_from_slice(&[0xea, 0x0c]);
        b[OFF_SOCK_REMOTE_PORT..OFF_SOCK_REMOTE_PORT + 2].copy_from_slice(&[0x41, 0x9c]);
        b[OFF_SOCK_LOCAL_ADDR..OFF_SOCK_LOCAL_ADDR + 4].copy_from_slice(&[198, 18, 0, 1]);
        b[OFF_SOCK_REMOTE_ADDR..OFF_SOCK_REMOTE_ADDR + 4].copy_from_slice(&[198, 18, 1, 2]);
        assert_eq!(
            decode(&b).map(|e| e.sock),
            Ok(SockInfo::Tcp {
                local: "198.18.0.1:3306".parse().unwrap(),
                remote: "198.18.1.2:40001".parse().unwrap(),
            })
        );
        // Unix and other sockets carry no address; an unknown kind is refused.
        b[OFF_SOCK_KIND] = 3;
        assert_eq!(decode(&b).map(|e| e.sock), Ok(SockInfo::Unix));
        b[OFF_SOCK_KIND] = 4;
        assert_eq!(
            decode(&b).map(|e| e.sock),
            Ok(SockInfo::Other { family: 2 })
        );
        b[OFF_SOCK_KIND] = 0;
        assert_eq!(decode(&b).map(|e| e.sock), Ok(SockInfo::Unknown));
        b[OFF_SOCK_KIND] = 5;
        assert_eq!(decode(&b), Err(DecodeError::SockKind(5)));
    }

    #[test]
    fn a_tcp6_socket_roundtrips() {
        let e = TlsEvent {
            sock: SockInfo::Tcp {
                local: "[2001:db8::1]:3306".parse().unwrap(),
                remote: "[::ffff:198.18.1.2]:40001".parse().unwrap(),
            },
            ..sample(b"x")
        };
        let mut b = Vec::new();
        encode(&e, &mut b);
        assert_eq!(b[OFF_SOCK_KIND], SOCK_TCP6);
        assert_eq!(u16_at(&b, OFF_SOCK_FAMILY), AF_INET6);
        assert_eq!(decode(&b), Ok(e));
    }

    #[test]
    fn bad_records_are_refused() {
        let mut good = Vec::new();
        encode(&sample(b"abc"), &mut good);
        assert_eq!(decode(&good[..10]), Err(DecodeError::Short(10)));
        let mut b = good.clone();
        b[OFF_KIND] = 9;
        assert_eq!(decode(&b), Err(DecodeError::Kind(9)));
        let mut b = good.clone();
        b[OFF_DIR] = 2;
        assert_eq!(decode(&b), Err(DecodeError::Direction(2)));
        let mut b = good.clone();
        b[OFF_FLAGS] = 0x80;
        assert_eq!(decode(&b), Err(DecodeError::Flags(0x80)));
        let mut b = good.clone();
        b.push(0);
        assert!(matches!(decode(&b), Err(DecodeError::Length { .. })));
        let mut b = good.clone();
        b[OFF_KIND] = KIND_STREAM_START;
        assert_eq!(decode(&b), Err(DecodeError::StartWithData(3)));
        let mut b = good.clone();
        b[OFF_OFFSET..OFF_OFFSET + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode(&b),
            Err(DecodeError::OffsetOverflow { .. })
        ));
        let mut b = good;
        b[OFF_LEN..OFF_LEN + 4].copy_from_slice(&(CHUNK_MAX as u32 + 1).to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::TooLong(_))));
    }

    /// What the probe can say about a socket: both ends of a TCP socket are of its family.
    fn any_sock() -> impl Strategy<Value = SockInfo> {
        prop_oneof![
            Just(SockInfo::Unknown),
            Just(SockInfo::Unix),
            any::<u16>().prop_map(|family| SockInfo::Other { family }),
            (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<[u16; 2]>()).prop_map(|(l, r, [lp, rp])| {
                SockInfo::Tcp {
                    local: SocketAddr::new(IpAddr::V4(l.into()), lp),
                    remote: SocketAddr::new(IpAddr::V4(r.into()), rp),
                }
            }),
            (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<[u16; 2]>()).prop_map(
                |(l, r, [lp, rp])| SockInfo::Tcp {
                    local: SocketAddr::new(IpAddr::V6(l.into()), lp),
                    remote: SocketAddr::new(IpAddr::V6(r.into()), rp),
                }
            ),
        ]
    }

    fn any_event(data: Vec<u8>) -> impl Strategy<Value = (Vec<u8>, TlsEvent<'static>)> {
        (
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u32..=i32::MAX as u32),
            any::<[u32; 2]>(),
            any::<[u64; 3]>(),
            0u64..u64::MAX / 2,
            any_sock(),
        )
            .prop_map(
                move |(
                    kind,
                    server,
                    joined,
                    fd,
                    [pid, tid],
                    [ssl, generation, time_ns],
                    offset,
                    sock,
                )| {
                    let e = TlsEvent {
                        kind: match kind {
                            0 => EventKind::Data,
                            1 => EventKind::StreamStart,
                            _ => EventKind::FdClosed,
                        },
                        dir: if server {
                            PlainDir::FromServer
                        } else {
                            PlainDir::FromClient
                        },
                        joined_midway: joined,
                        fd,
                        pid,
                        tid,
                        ssl,
                        generation,
                        offset,
                        time_ns,
                        sock,
                        data: &[],
                    };
                    (if kind == 0 { data.clone() } else { Vec::new() }, e)
                },
            )
    }

    proptest! {
        /// Whatever the probe can write decodes back to what it wrote.
        #[test]
        fn roundtrip(
            (data, e) in proptest::collection::vec(any::<u8>(), 0..300).prop_flat_map(any_event)
        ) {
            let e = TlsEvent { data: &data, ..e };
            let mut b = Vec::new();
            encode(&e, &mut b);
            prop_assert_eq!(decode(&b), Ok(e));
        }

        /// Any bytes at all: an error or an event whose data is the record's tail, never a panic.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(e) = decode(&b) {
                prop_assert_eq!(e.data.len() + HEADER_LEN, b.len());
                prop_assert!(e.offset.checked_add(e.data.len() as u64).is_some());
            }
        }

        /// A valid header with its bytes flipped one at a time still never panics.
        #[test]
        fn flipped_headers(at in 0..HEADER_LEN, bit in 0u8..8) {
            let mut b = Vec::new();
            encode(&sample(b"xyz"), &mut b);
            b[at] ^= 1 << bit;
            let _ = decode(&b);
        }
    }
}
