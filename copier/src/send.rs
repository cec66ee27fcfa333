//! The send edge: a raw IPv4 socket with the header included, so packets leave with the
//! mirrored client's source address. Send failures are counted, never retried here: the
//! engine's retransmission covers them.
//!
//! # What this room is for
//!
//! Sending, cheaply: the driver [`RawSender::queue`]s every packet one pump cycle produces and
//! [`RawSender::flush`]es once at the end of the cycle, which hands them all to the kernel in
//! one `sendmmsg` (at most [`BATCH`] per call). A pump cycle never waits for more packets, so
//! batching adds no delay: what one cycle produced leaves before the next one starts.
//! [`RawSender::send`] sends one packet at once (for `copier doctor`).
//!
//! # What it must never do
//!
//! * Allocate per packet: the queue is one arena sized at start.
//! * Block: the socket is non-blocking; a full send buffer drops (counted) what it cannot take.
//! * Hold packets across pump cycles: the driver flushes every cycle.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Packets per `sendmmsg` call: Linux's UIO_MAXIOV is 1024, and beyond a few dozen the
/// per-call cost is already amortised.
pub const BATCH: usize = 64;
/// Bytes of queued packets before a flush is forced (a batch of full-size segments at a
/// 1500-byte MTU fits; jumbo segments flush sooner).
const ARENA_BYTES: usize = 128 << 10;

#[derive(Clone, Copy, Debug, Default)]
pub struct SendStats {
    pub packets: u64,
    pub bytes: u64,
    /// ENOBUFS/EAGAIN: the local queue was full.
    pub would_block: u64,
    pub errors: u64,
    /// `sendmmsg`/`sendto` calls made: `packets / syscalls` is the batching achieved.
    pub syscalls: u64,
}

pub struct RawSender {
    socket: Socket,
    pub stats: SendStats,
    last_error_logged: Option<std::time::Instant>,
    /// Queued packets, back to back.
    arena: Vec<u8>,
    /// (start in `arena`, length, destination) of each queued packet.
    queued: Vec<(usize, usize, Ipv4Addr)>,
}

impl RawSender {
    pub fn open() -> Result<Self> {
        // IPPROTO_RAW implies IP_HDRINCL: the kernel sends our header as is (it only fills the
        // IP checksum and, if zero, the id).
        let socket = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )
        .context("cannot open a raw IPv4 socket — run as root or grant CAP_NET_RAW")?;
        socket.set_nonblocking(true)?;
        // A deep send buffer absorbs bursts (a batch of retransmits after an RTO) without ENOBUFS.
        let _ = socket.set_send_buffer_size(4 << 20);
        Ok(Self {
            socket,
            stats: SendStats::default(),
            last_error_logged: None,
            arena: Vec::with_capacity(ARENA_BYTES),
            queued: Vec::with_capacity(BATCH),
        })
    }

    /// Sends one complete IPv4 packet to `dst` now (anything queued goes first).
    pub fn send(&mut self, packet: &[u8], dst: Ipv4Addr) {
        self.flush();
        let addr = SockAddr::from(SocketAddrV4::new(dst, 0));
        self.stats.syscalls += 1;
        match self.socket.send_to(packet, &addr) {
            Ok(_) => {
                self.stats.packets += 1;
                self.stats.bytes += packet.len() as u64;
            }
            Err(e) => self.failed(&e, dst),
        }
    }

    /// Queues one complete IPv4 packet for `dst`; it leaves at the next [`RawSender::flush`]
    /// (or earlier, when the queue is full).
    pub fn queue(&mut self, packet: &[u8], dst: Ipv4Addr) {
        if self.queued.len() == BATCH || self.arena.len() + packet.len() > ARENA_BYTES {
            self.flush();
        }
        if packet.len() > ARENA_BYTES {
            // Larger than the whole arena (an MSS beyond 128 KiB cannot be, but stay safe).
            self.send(packet, dst);
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(packet);
        self.queued.push((start, packet.len(), dst));
    }

    /// Sends everything queued, in order, with as few `sendmmsg` calls as it takes.
    pub fn flush(&mut self) {
        let mut next = 0;
        while next < self.queued.len() {
            let n = self.queued.len() - next;
            // SAFETY: zeroed sockaddr_in, iovec and mmsghdr are valid (null pointers, zero
            // lengths) and every one used is filled in below.
            let mut addrs: [libc::sockaddr_in; BATCH] = unsafe { mem::zeroed() };
            let mut iovs: [libc::iovec; BATCH] = unsafe { mem::zeroed() };
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { mem::zeroed() };
            for (k, &(start, len, dst)) in self.queued[next..].iter().enumerate() {
                addrs[k].sin_family = libc::AF_INET as libc::sa_family_t;
                addrs[k].sin_addr.s_addr = u32::from_ne_bytes(dst.octets());
                iovs[k].iov_base = self.arena[start..start + len].as_ptr() as *mut libc::c_void;
                iovs[k].iov_len = len;
                let h = &mut msgs[k].msg_hdr;
                h.msg_name = (&mut addrs[k] as *mut libc::sockaddr_in).cast();
                h.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                h.msg_iov = &mut iovs[k];
                h.msg_iovlen = 1;
            }
            self.stats.syscalls += 1;
            // SAFETY: `msgs[..n]` point into `addrs`, `iovs` and `self.arena`, all alive and
            // unmoved for the call; the kernel only reads them (and writes msg_len).
            let sent =
                unsafe { libc::sendmmsg(self.socket.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
            if sent > 0 {
                let sent = sent as usize;
                for &(_, len, _) in &self.queued[next..next + sent] {
                    self.stats.packets += 1;
                    self.stats.bytes += len as u64;
                }
                next += sent;
            } else if sent == 0 {
                // Nothing taken and no error: treat the rest as a full queue, never spin.
                self.stats.would_block += (self.queued.len() - next) as u64;
                break;
            } else {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The first packet failed (a later failure only shortens the count): count
                // it and go on with the rest, as separate sends would have.
                let dst = self.queued[next].2;
                self.failed(&e, dst);
                next += 1;
            }
        }
        self.queued.clear();
        self.arena.clear();
    }

    fn failed(&mut self, e: &io::Error, dst: Ipv4Addr) {
        if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) {
            self.stats.would_block += 1;
            return;
        }
        self.stats.errors += 1;
        let now = std::time::Instant::now();
        if self
            .last_error_logged
            .is_none_or(|t| now.duration_since(t).as_secs() >= 10)
        {
            self.last_error_logged = Some(now);
            tracing::warn!(
                "raw send to {dst} failed: {e} ({} failures so far)",
                self.stats.errors
            );
        }
    }
}

impl Drop for RawSender {
    fn drop(&mut self) {
        self.flush();
    }
}
