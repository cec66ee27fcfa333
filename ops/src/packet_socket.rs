//! A plain `AF_PACKET` socket, read in batches: intercept's default capture of the test
//! server's replies, and the copier's capture while its libpcap ring is being allocated.
//!
//! Why not libpcap for intercept. Delivery must be immediate (a wakeup per reply: the copier's latency
//! report dates the test server's replies by them, docs/BENCHMARKS.md "Defaults taken back"),
//! and libpcap 1.10 serves immediate mode with a TPACKET_V2 ring of fixed-size frames, each
//! sized for the largest packet the interface can hand over. With the kernel's default offloads
//! (GSO/GRO) that is 64 KiB, one frame per 128 KiB block: a 32 MiB ring held about 500 replies,
//! a few milliseconds of a busy test server while intercept waited for a CPU, after which the
//! kernel dropped replies and sessions lost their MySQL framing. A socket's receive queue is
//! bounded by what each packet really occupies (its buffer's truesize), so the same budget
//! holds tens of thousands of short replies, and the kernel still wakes us per reply.
//!
//! Why the copier opens one first. The kernel allocates and zeroes a TPACKET ring before
//! libpcap binds it (about 20 ms for 64 MiB here), and a restarted copier captures nothing
//! until then. This socket has no ring to allocate: it captures from its bind on, and its
//! queue is charged per packet as packets arrive.
//!
//! The socket is `SOCK_DGRAM`: every frame starts at its IPv4 header whatever the link (an
//! Ethernet interface, `any`, a tunnel), and the BPF filter is compiled for raw IP.
//!
//! This room only reads. It never sends, and never blocks except in [`PacketSocket::wait`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{bail, Context};
use pcap::{Capture, Direction, Linktype};

use crate::sockopt;

/// Bytes one received frame may have: the largest IPv4 packet. Longer ones (BIG TCP GRO,
/// off by default) are counted as truncated and skipped.
const SLOT_BYTES: usize = 65_536;
/// Frames one `recvmmsg` call takes at most.
const SLOTS: usize = 32;
/// `DLT_RAW` on Linux: the filter sees the packet from its IP header, as a datagram socket does.
const DLT_RAW: i32 = 12;

// From <linux/if_packet.h>; not exported by the libc crate on every target.
const SOL_PACKET: libc::c_int = 263;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_OUTGOING: u8 = 4;

/// `struct tpacket_stats`.
#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

/// One received frame, as [`PacketSocket::next_frame`] hands it over.
pub struct Frame<'a> {
    /// From the IPv4 header on.
    pub bytes: &'a [u8],
    /// The kernel's receive time, nanoseconds since the Unix epoch (`SO_TIMESTAMPNS`); `None`
    /// if the kernel attached none.
    pub ts_ns: Option<u64>,
}

/// The kernel's counters since the socket opened (`PACKET_STATISTICS`): `received` includes
/// what was dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub received: u64,
    pub dropped: u64,
}

pub struct PacketSocket {
    fd: OwnedFd,
    direction: Direction,
    /// The loopback interface's index: there every packet shows twice, leaving and arriving.
    loopback: Option<i32>,
    buf: Vec<u8>,
    /// Each frame's link-layer address, read only to tell the frames this host sent from those
    /// it received: not asked of the kernel (a copy and a check per frame) where only
    /// arriving frames can come.
    addrs: Option<Vec<libc::sockaddr_ll>>,
    ctrl: Vec<[u64; 8]>,
    /// Per frame of the last batch: its real length and receive time.
    meta: Vec<(usize, Option<u64>)>,
    /// Frames of the last batch, and the next one to hand over.
    filled: usize,
    next: usize,
    /// The last batch was short: the kernel held no more then, so the next call says so
    /// instead of asking again (a `recvmmsg` that would only find the queue empty).
    short: bool,
    /// Longer than [`SLOT_BYTES`]: skipped, never parsed half.
    truncated: u64,
    /// The kernel's counters reset when read; these are their sums.
    received: u64,
    dropped: u64,
}

impl PacketSocket {
    /// A socket on `interface` (`any`: every interface) that receives only what `filter` (pcap
    /// syntax) accepts, in `direction`, with a receive queue of `buffer_bytes`.
    pub fn open(
        interface: &str,
        filter: &str,
        direction: Direction,
        buffer_bytes: usize,
    ) -> anyhow::Result<Self> {
        let ifindex = if interface == "any" {
            0
        } else {
            let name = std::ffi::CString::new(interface)
                .with_context(|| format!("interface name {interface:?}"))?;
            // SAFETY: a valid NUL-terminated string for the duration of the call.
            let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if i == 0 {
                bail!(
                    "cannot open capture on {interface}: no such interface — check `ip link`, \
                     or use --interface any"
                );
            }
            i as libc::c_int
        };
        // Protocol 0: the socket receives nothing until the bind below, so no frame can slip
        // in before the filter is attached.
        // SAFETY: plain syscall; the result is checked.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EPERM) {
                bail!(
                    "cannot open capture on {interface}: permission denied — run as root or \
                     give the binary CAP_NET_RAW and CAP_NET_ADMIN (setcap \
                     cap_net_raw,cap_net_admin+ep on it) ({e})"
                );
            }
            bail!("cannot open capture on {interface}: {e}");
        }
        // SAFETY: `raw` is a socket we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        attach_filter(fd.as_raw_fd(), filter)
            .with_context(|| format!("cannot set capture filter `{filter}` on {interface}"))?;
        // Saves the kernel a clone of every packet this host sends; where it is missing
        // (before Linux 4.20) `next_frame` reads each frame's address and skips them instead.
        let only_arriving = direction == Direction::In
            && sockopt::set_int(fd.as_raw_fd(), SOL_PACKET, PACKET_IGNORE_OUTGOING, 1).is_ok();
        set_receive_buffer(fd.as_raw_fd(), interface, buffer_bytes);
        sockopt::set_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
            .with_context(|| format!("cannot ask for receive timestamps on {interface}"))?;
        // SAFETY: zeroed is a valid sockaddr_ll; the fields set are plain integers.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        // A socket bound to one protocol gets only what arrives: the kernel hands packets this
        // host sends only to ETH_P_ALL sockets (`dev_queue_xmit_nit`). The filter, compiled for
        // raw IP, turns away the rest.
        let protocol = match direction {
            Direction::In => libc::ETH_P_IP,
            Direction::Out | Direction::InOut => libc::ETH_P_ALL,
        };
        sll.sll_protocol = (protocol as u16).to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` lives across the call and its size is passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!(
                "cannot capture on {interface}: {} (is it up? `ip link`)",
                io::Error::last_os_error()
            );
        }
        // SAFETY: a valid NUL-terminated string; 0 (no such interface) is mapped to None.
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        Ok(PacketSocket {
            fd,
            direction,
            loopback: (lo != 0).then_some(lo as i32),
            buf: vec![0; SLOTS * SLOT_BYTES],
            // SAFETY: all-zero is a valid value of this plain C struct.
            addrs: (!only_arriving).then(|| vec![unsafe { std::mem::zeroed() }; SLOTS]),
            ctrl: vec![[0; 8]; SLOTS],
            meta: Vec::with_capacity(SLOTS),
            filled: 0,
            next: 0,
            short: false,
            truncated: 0,
            received: 0,
            dropped: 0,
        })
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The next frame in `direction`, reading a batch when the last one is used up; `None`
    /// when the kernel holds none now, or held none more when the last batch was read (it was
    /// short): the call after that reads again.
    pub fn next_frame(&mut self) -> anyhow::Result<Option<Frame<'_>>> {
        loop {
            if self.next == self.filled
                && (std::mem::take(&mut self.short) || !self.read_batch()?)
            {
                return Ok(None);
            }
            let i = self.next;
            self.next += 1;
            let (len, at) = self.meta[i];
            if len > SLOT_BYTES {
                self.truncated += 1;
                continue;
            }
            // On `lo` each packet shows twice, leaving and arriving: either direction keeps one,
            // and both directions keep the arriving one, as libpcap does.
            let wanted = match self.addrs.as_ref().map(|a| &a[i]) {
                None => true,
                Some(addr) => {
                    let outgoing = addr.sll_pkttype == PACKET_OUTGOING;
                    match self.direction {
                        Direction::In => !outgoing,
                        Direction::Out => outgoing,
                        Direction::InOut => !(outgoing && Some(addr.sll_ifindex) == self.loopback),
                    }
                }
            };
            if !wanted {
                continue;
            }
            let start = i * SLOT_BYTES;
            return Ok(Some(Frame {
                bytes: &self.buf[start..start + len],
                ts_ns: at,
            }));
        }
    }

    /// One `recvmmsg` without waiting; whether it brought anything.
    fn read_batch(&mut self) -> anyhow::Result<bool> {
        self.filled = 0;
        self.next = 0;
        self.meta.clear();
        // The headers point into our own buffers and live on the stack for the call only, so
        // the socket holds no raw pointer (and may move to another thread).
        // SAFETY: all-zero is a valid iovec and mmsghdr.
        let mut iov: [libc::iovec; SLOTS] = unsafe { std::mem::zeroed() };
        let mut hdrs: [libc::mmsghdr; SLOTS] = unsafe { std::mem::zeroed() };
        let base = self.buf.as_mut_ptr();
        for i in 0..SLOTS {
            // SAFETY: slot `i` lies inside `buf` (SLOTS * SLOT_BYTES long).
            iov[i].iov_base = unsafe { base.add(i * SLOT_BYTES) }.cast();
            iov[i].iov_len = SLOT_BYTES;
            let h = &mut hdrs[i].msg_hdr;
            if let Some(addrs) = self.addrs.as_mut() {
                h.msg_name = std::ptr::from_mut(&mut addrs[i]).cast();
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            }
            h.msg_iov = std::ptr::from_mut(&mut iov[i]);
            h.msg_iovlen = 1;
            h.msg_control = self.ctrl[i].as_mut_ptr().cast();
            h.msg_controllen = std::mem::size_of::<[u64; 8]>();
        }
        // MSG_TRUNC: `msg_len` is the frame's real length, so a longer one is seen, not cut.
        // SAFETY: SLOTS initialised headers whose buffers stay valid for the call.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                SLOTS as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(false),
                _ => Err(anyhow::anyhow!(
                    "capture failed: {e} (did the interface go away?)"
                )),
            };
        }
        let n = n as usize;
        for h in &hdrs[..n] {
            self.meta.push((h.msg_len as usize, timestamp(&h.msg_hdr)));
        }
        self.filled = n;
        self.short = n > 0 && n < SLOTS;
        Ok(n > 0)
    }

    /// Sleeps until a frame may be ready or `timeout` passes (a signal may end it early).
    pub fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one initialised pollfd, valid for the call. EINTR and timeouts both send the
        // caller round its loop again.
        unsafe {
            libc::poll(&mut pfd, 1, ms);
        }
    }

    /// Frames skipped for being longer than a slot.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    /// The kernel's counters since the socket opened (the kernel resets them when read).
    pub fn kernel_stats(&mut self) -> Option<KernelCounters> {
        let mut st = TpacketStats::default();
        let mut len = std::mem::size_of::<TpacketStats>() as libc::socklen_t;
        // SAFETY: `st` and `len` live across the call; `len` holds `st`'s size.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                SOL_PACKET,
                PACKET_STATISTICS,
                std::ptr::from_mut(&mut st).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return None;
        }
        self.received += u64::from(st.tp_packets);
        self.dropped += u64::from(st.tp_drops);
        Some(KernelCounters {
            received: self.received,
            dropped: self.dropped,
        })
    }
}

/// The receive time the kernel attached (`SO_TIMESTAMPNS`), in nanoseconds since the epoch.
fn timestamp(h: &libc::msghdr) -> Option<u64> {
    // SAFETY: `h` is a header recvmmsg filled: its control buffer and length are the kernel's,
    // and the CMSG macros stay within them.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                let secs = u64::try_from(ts.tv_sec).ok()?;
                let nanos = u64::try_from(ts.tv_nsec).ok()?;
                return Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos));
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// Compiles `filter` for raw IP with libpcap and attaches it to the socket.
fn attach_filter(fd: RawFd, filter: &str) -> anyhow::Result<()> {
    let dead = Capture::dead(Linktype(DLT_RAW)).context("libpcap could not make a dead capture")?;
    let program = dead.compile(filter, true)?;
    let insns = program.get_instructions();
    let prog = libc::sock_fprog {
        len: u16::try_from(insns.len()).context("filter too long")?,
        // `BpfInstruction` is a transparent `bpf_insn`, laid out as the kernel's `sock_filter`.
        filter: insns.as_ptr().cast_mut().cast(),
    };
    // SAFETY: `prog` points at `insns`, alive across the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            std::ptr::from_ref(&prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("SO_ATTACH_FILTER: {}", io::Error::last_os_error());
    }
    Ok(())
}

/// A receive queue of `bytes` (the kernel counts each frame at its truesize, and doubles what
/// is asked for its bookkeeping, so half is asked). `SO_RCVBUFFORCE` passes
/// `net.core.rmem_max` and needs CAP_NET_ADMIN; without it the capture runs with what
/// `SO_RCVBUF` allows, and says so.
fn set_receive_buffer(fd: RawFd, interface: &str, bytes: usize) {
    match sockopt::set_receive_buffer(fd, bytes / 2) {
        Ok(got) if got >= bytes => {}
        got => tracing::warn!(
            interface,
            asked_mib = bytes >> 20,
            got_kib = got.map(|g| g >> 10).unwrap_or(0),
            "the capture's receive queue is smaller than asked (no CAP_NET_ADMIN): raise \
             net.core.rmem_max or run with CAP_NET_ADMIN, or packets may be dropped in bursts"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_for_raw_ip() {
        let dead = Capture::dead(Linktype(DLT_RAW)).unwrap();
        let p = dead
            .compile(
                "tcp and (src port 3306 or src port 3307) and src host 198.18.0.3",
                true,
            )
            .unwrap();
        assert!(!p.get_instructions().is_empty());
        // A raw IPv4/TCP packet from 198.18.0.3:3306 passes, one from another port does not.
        let mut pkt = [0u8; 40];
        pkt[0] = 0x45;
        pkt[3] = 40;
        pkt[8] = 64;
        pkt[9] = 6;
        pkt[12..16].copy_from_slice(&[198, 18, 0, 3]);
        pkt[16..20].copy_from_slice(&[198, 18, 0, 4]);
        pkt[20..22].copy_from_slice(&3306u16.to_be_bytes());
        pkt[32] = 0x50;
        assert!(p.filter(&pkt));
        pkt[20..22].copy_from_slice(&3308u16.to_be_bytes());
        assert!(!p.filter(&pkt));
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = PacketSocket::open("no-such-if0", "tcp", Direction::In, 1 << 20)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("no such interface") || e.contains("permission"),
            "{e}"
        );
    }
}
