//! Netlink messages built and read by hand, and a small socket around them: the bytes that
//! NFQUEUE ([`crate::nfqueue`]) and nf_tables ([`crate::nftables`]) speak, without
//! libmnl/libnetfilter_queue/libnftnl (a C dependency each, for ~200 lines of framing).
//!
//! What the room is for: framing (message and attribute headers, padding, nesting), reading
//! acknowledgements, and the socket calls. It knows nothing about what the attributes mean.
//! It must never panic on bytes it receives: every length is checked and a malformed message
//! ends the iteration with an error, which callers count and skip.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// `struct nlmsghdr`: length, type, flags, sequence, port id.
pub const NLMSG_HDRLEN: usize = 16;
/// `struct nlattr`: length, type.
pub const NLA_HDRLEN: usize = 4;
/// `struct nfgenmsg`: family, version, resource id (big-endian).
pub const NFGENMSG_LEN: usize = 4;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;

pub const NLMSG_NOOP: u16 = 1;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;

/// Set on nested attributes (libmnl does; newer kernel parsers insist on it).
pub const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type without the NESTED and NET_BYTEORDER flags.
pub const NLA_TYPE_MASK: u16 = 0x3fff;

/// `nfgenmsg.version`.
pub const NFNETLINK_V0: u8 = 0;

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Start of a message being built (see [`MessageBuf::begin`]).
#[must_use = "a message must be ended with MessageBuf::end"]
pub struct MsgStart(usize);

/// Start of a nested attribute being built (see [`MessageBuf::nest`]).
#[must_use = "a nest must be ended with MessageBuf::end_nest"]
pub struct NestStart(usize);

/// Netlink messages, one after the other, ready to send in one datagram.
///
/// Only our own small values go in (names, addresses, numbers): attribute payloads are far
/// below the 64 KiB an attribute length can express, so the builder does not report errors.
#[derive(Default)]
pub struct MessageBuf {
    buf: Vec<u8>,
}

impl MessageBuf {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a message; its length is filled in by [`MessageBuf::end`].
    pub fn begin(&mut self, ty: u16, flags: u16, seq: u32) -> MsgStart {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        // Port id 0: the kernel.
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        MsgStart(start)
    }

    /// The `nfgenmsg` every nfnetlink message starts with.
    pub fn nfgen(&mut self, family: u8, res_id: u16) {
        self.buf.push(family);
        self.buf.push(NFNETLINK_V0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
    }

    pub fn end(&mut self, m: MsgStart) {
        let len = (self.buf.len() - m.0) as u32;
        self.buf[m.0..m.0 + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// An attribute with `data`, padded to 4 bytes.
    pub fn put(&mut self, ty: u16, data: &[u8]) {
        let len = (NLA_HDRLEN + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    pub fn put_u16_be(&mut self, ty: u16, v: u16) {
        self.put(ty, &v.to_be_bytes());
    }

    pub fn put_u32_be(&mut self, ty: u16, v: u32) {
        self.put(ty, &v.to_be_bytes());
    }

    /// A NUL-terminated string attribute (what NLA_NUL_STRING and NLA_STRING policies accept).
    pub fn put_str(&mut self, ty: u16, s: &str) {
        let mut data = Vec::with_capacity(s.len() + 1);
        data.extend_from_slice(s.as_bytes());
        data.push(0);
        self.put(ty, &data);
    }

    pub fn nest(&mut self, ty: u16) -> NestStart {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        NestStart(start)
    }

    pub fn end_nest(&mut self, n: NestStart) {
        let len = (self.buf.len() - n.0) as u16;
        self.buf[n.0..n.0 + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// A message that does not follow the netlink framing rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("netlink message header cut short")]
    ShortHeader,
    #[error("netlink message length beyond the datagram")]
    BadLength,
    #[error("netlink attribute cut short or with a bad length")]
    BadAttribute,
}

/// The fixed part of a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub port_id: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub header: Header,
    /// What follows the header (for nfnetlink: the nfgenmsg, then attributes).
    pub payload: &'a [u8],
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The messages of a received datagram, in order. After a malformed one, it yields that error
/// once and stops: nothing after it can be framed.
pub fn messages(buf: &[u8]) -> Messages<'_> {
    Messages { rest: buf }
}

pub struct Messages<'a> {
    rest: &'a [u8],
}

impl Messages<'_> {
    /// Bytes not yet iterated over.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let buf = self.rest;
        let parsed = (|| {
            let len = ne_u32(buf, 0).ok_or(Malformed::ShortHeader)? as usize;
            let header = Header {
                ty: ne_u16(buf, 4).ok_or(Malformed::ShortHeader)?,
                flags: ne_u16(buf, 6).ok_or(Malformed::ShortHeader)?,
                seq: ne_u32(buf, 8).ok_or(Malformed::ShortHeader)?,
                port_id: ne_u32(buf, 12).ok_or(Malformed::ShortHeader)?,
            };
            if len < NLMSG_HDRLEN || len > buf.len() {
                return Err(Malformed::BadLength);
            }
            let payload = &buf[NLMSG_HDRLEN..len];
            // The last message of a datagram may lack its padding.
            let next = align4(len).min(buf.len());
            Ok((Message { header, payload }, next))
        })();
        match parsed {
            Ok((msg, next)) => {
                self.rest = &buf[next..];
                Some(Ok(msg))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// One attribute: its type (flags masked off) and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr<'a> {
    pub ty: u16,
    pub nested: bool,
    pub data: &'a [u8],
}

/// The attributes in `buf` (a message payload after its fixed header, or a nested
/// attribute's data). Like [`messages`], it stops after the first malformed one.
pub fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { rest: buf }
}

pub struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        // Fewer bytes than a header at the end is padding, not an attribute.
        if self.rest.len() < NLA_HDRLEN {
            self.rest = &[];
            return None;
        }
        let buf = self.rest;
        let (Some(len), Some(ty)) = (ne_u16(buf, 0), ne_u16(buf, 2)) else {
            self.rest = &[];
            return Some(Err(Malformed::BadAttribute));
        };
        let len = usize::from(len);
        if len < NLA_HDRLEN || len > buf.len() {
            self.rest = &[];
            return Some(Err(Malformed::BadAttribute));
        }
        self.rest = &buf[align4(len).min(buf.len())..];
        Some(Ok(Attr {
            ty: ty & NLA_TYPE_MASK,
            nested: ty & NLA_F_NESTED != 0,
            data: &buf[NLA_HDRLEN..len],
        }))
    }
}

/// The error code of an NLMSG_ERROR message: 0 for an acknowledgement, else a negative errno.
pub fn error_code(msg: &Message<'_>) -> Option<i32> {
    if msg.header.ty != NLMSG_ERROR {
        return None;
    }
    Some(i32::from_ne_bytes(msg.payload.get(..4)?.try_into().ok()?))
}

/// Strips the nfgenmsg off an nfnetlink message: (family, resource id, attributes).
pub fn nfgen(payload: &[u8]) -> Option<(u8, u16, &[u8])> {
    let res_id = u16::from_be_bytes(payload.get(2..4)?.try_into().ok()?);
    Some((*payload.first()?, res_id, &payload[NFGENMSG_LEN..]))
}

/// A bound netlink socket talking to the kernel, non-blocking.
pub struct NetlinkSocket {
    fd: OwnedFd,
}

impl NetlinkSocket {
    /// Opens and binds a socket of `protocol` (e.g. `libc::NETLINK_NETFILTER`); the kernel
    /// picks its port id.
    pub fn open(protocol: libc::c_int) -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                protocol,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_nl is plain old data; all-zero is "port id chosen by the kernel,
        // no multicast groups".
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: addr is a valid sockaddr_nl of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(NetlinkSocket { fd })
    }

    /// Asks for a receive buffer of `bytes`; beyond `rmem_max` only root (CAP_NET_ADMIN)
    /// gets it, so FORCE is tried first. Returns what the kernel granted.
    pub fn set_recv_buffer(&self, bytes: usize) -> io::Result<usize> {
        ops::sockopt::set_receive_buffer(self.fd.as_raw_fd(), bytes.min(i32::MAX as usize / 2))
    }

    /// Sends one datagram to the kernel.
    pub fn send(&self, bytes: &[u8]) -> io::Result<()> {
        // SAFETY: all-zero sockaddr_nl addresses the kernel (port id 0).
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        loop {
            // SAFETY: bytes and `to` are valid for the lengths given.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    0,
                    (&to as *const libc::sockaddr_nl).cast(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if rc >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one datagram into `buf` without blocking. Returns its full length, which is
    /// more than `buf.len()` when it was cut short (MSG_TRUNC). `WouldBlock` when none is
    /// ready; `ENOBUFS` when the kernel had to drop messages for lack of buffer space.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: buf is valid for writes of buf.len() bytes.
            let rc = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if rc >= 0 {
                return Ok(rc as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Waits until a datagram is ready or `timeout` passes (a signal may end it early).
    pub fn wait_readable(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
        // SAFETY: one initialised pollfd, valid for the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        rc > 0
    }

    /// Sends `request` and collects the answer (ack or error) to each of `seqs`, waiting at most
    /// `timeout` in all. Other messages arriving meanwhile are ignored. Returns the error codes
    /// in the order of `seqs` (0 = done).
    pub fn transact(
        &self,
        request: &[u8],
        seqs: &[u32],
        timeout: Duration,
    ) -> io::Result<Vec<i32>> {
        self.send(request)?;
        let mut codes: Vec<Option<i32>> = vec![None; seqs.len()];
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 64 * 1024];
        while codes.iter().any(Option::is_none) {
            let n = match self.recv(&mut buf) {
                Ok(n) => n.min(buf.len()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the kernel did not answer a netlink request",
                        ));
                    }
                    self.wait_readable(left);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for msg in messages(&buf[..n]).flatten() {
                let Some(code) = error_code(&msg) else {
                    continue;
                };
                if let Some(i) = seqs.iter().position(|&s| s == msg.header.seq) {
                    codes[i].get_or_insert(code);
                }
            }
        }
        Ok(codes.into_iter().map(|c| c.unwrap_or(0)).collect())
    }

    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// A sequence number source for requests: starts from the clock so that answers to an earlier
/// process's requests on a recycled port id are not mistaken for ours.
pub fn initial_seq() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_message_round_trips_with_padding_and_nesting() {
        let mut b = MessageBuf::new();
        let m = b.begin(0x0a00, NLM_F_REQUEST | NLM_F_ACK, 7);
        b.nfgen(2, 0);
        b.put_str(1, "abc"); // 4 + 4 bytes: no padding
        b.put(2, &[1, 2, 3, 4, 5]); // 4 + 5 -> padded to 12
        let n = b.nest(3);
        b.put_u32_be(1, 3);
        b.put_u16_be(2, 0x1234);
        b.end_nest(n);
        b.end(m);
        let bytes = b.as_bytes();
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );

        let msgs: Vec<_> = messages(bytes).collect();
        assert_eq!(msgs.len(), 1);
        let msg = msgs[0].unwrap();
        assert_eq!(msg.header.ty, 0x0a00);
        assert_eq!(msg.header.seq, 7);
        assert_eq!(msg.header.flags, NLM_F_REQUEST | NLM_F_ACK);
        let (family, res_id, rest) = nfgen(msg.payload).unwrap();
        assert_eq!((family, res_id), (2, 0));
        let a: Vec<_> = attrs(rest).map(Result::unwrap).collect();
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].data, b"abc\0");
        assert_eq!(a[1].data, &[1, 2, 3, 4, 5]);
        assert!(a[2].nested && a[2].ty == 3);
        let inner: Vec<_> = attrs(a[2].data).map(Result::unwrap).collect();
        assert_eq!(inner[0].data, &3u32.to_be_bytes());
        assert_eq!(inner[1].data, &0x1234u16.to_be_bytes());
    }

    #[test]
    fn acks_and_errors_are_read() {
        // An NLMSG_ERROR carrying -ENOENT, as the kernel sends it (error, then the request's header).
        let mut b = MessageBuf::new();
        let m = b.begin(NLMSG_ERROR, 0, 42);
        let mut payload = (-libc::ENOENT).to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
        b.buf.extend_from_slice(&payload);
        b.end(m);
        let msg = messages(b.as_bytes()).next().unwrap().unwrap();
        assert_eq!(error_code(&msg), Some(-libc::ENOENT));
        assert_eq!(msg.header.seq, 42);
    }

    #[test]
    fn bad_lengths_end_the_iteration_with_an_error() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&100u32.to_ne_bytes()); // longer than the datagram
        bytes.extend_from_slice(&[0u8; 12]);
        let all: Vec<_> = messages(&bytes).collect();
        assert_eq!(all, vec![Err(Malformed::BadLength)]);
        assert_eq!(
            messages(&[1, 2, 3]).collect::<Vec<_>>(),
            vec![Err(Malformed::ShortHeader)]
        );
        // An attribute claiming 2 bytes (less than its own header).
        let attr = [2u8, 0, 1, 0, 9, 9, 9, 9];
        assert_eq!(
            attrs(&attr).collect::<Vec<_>>(),
            vec![Err(Malformed::BadAttribute)]
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for msg in messages(&bytes).flatten() {
                let _ = error_code(&msg);
                if let Some((_, _, rest)) = nfgen(msg.payload) {
                    for a in attrs(rest).flatten() {
                        for inner in attrs(a.data).flatten() {
                            prop_assert!(inner.data.len() <= a.data.len());
                        }
                    }
                }
            }
            for a in attrs(&bytes).flatten() {
                prop_assert!(a.data.len() + NLA_HDRLEN <= bytes.len());
            }
        }
    }
}
