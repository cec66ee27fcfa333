//! The send edge: a raw IPv4 socket with the header included, so packets leave with the
//! mirrored client's source address. Send failures are counted, never retried here: the
//! engine's retransmission covers them.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

#[derive(Clone, Copy, Debug, Default)]
pub struct SendStats {
    pub packets: u64,
    pub bytes: u64,
    /// ENOBUFS/EAGAIN: the local queue was full.
    pub would_block: u64,
    pub errors: u64,
}

pub struct RawSender {
    socket: Socket,
    pub stats: SendStats,
    last_error_logged: Option<std::time::Instant>,
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
        })
    }

    /// Sends one complete IPv4 packet to `dst`.
    pub fn send(&mut self, packet: &[u8], dst: Ipv4Addr) {
        let addr = SockAddr::from(SocketAddrV4::new(dst, 0));
        match self.socket.send_to(packet, &addr) {
            Ok(_) => {
                self.stats.packets += 1;
                self.stats.bytes += packet.len() as u64;
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                self.stats.would_block += 1;
            }
            Err(e) => {
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
    }
}
