//! The capture edge: the test server's replies as parsed [`TcpPacket`]s.
//!
//! Kept thin on purpose: open, filter, read without blocking, parse with `common::wire`, count
//! what does not parse. Two ways in: a packet socket read per reply (the default, see
//! [`ops::packet_socket`] for why not libpcap's immediate mode), or libpcap's TPACKET_V3
//! ring handed over in blocks (`--capture-block-ms` 1 and up). It never sends or forwards
//! anything; the kernel drops the replies because this host does not forward (ip_forward=0).

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use anyhow::{bail, Context};
use common::control::MAX_PAYLOAD_PREFIX;
use common::wire::{parse_frame_headers, LinkType, TcpPacket};
use pcap::{Active, Capture, Direction};

use crate::pump::{KernelStats, ParseErrors, SegmentSource, SourceStats};
use ops::packet_socket::PacketSocket;

/// What to capture.
#[derive(Clone, Debug)]
pub struct CaptureOptions {
    /// Interface name, or "any".
    pub interface: String,
    /// The test servers' ports: replies come from them. Sessions are told apart by the
    /// mirrored client address alone (each copier engine has its own addresses), so any
    /// number of ports share one capture.
    pub ports: Vec<u16>,
    /// Only replies from this address, when set.
    pub server: Option<Ipv4Addr>,
    /// What of each reply's payload must be captured.
    pub payload: CapturedPayload,
    pub direction: Direction,
    /// Kernel capture buffer; bigger absorbs longer bursts before the kernel drops.
    pub buffer_bytes: usize,
    /// Longest wait, in ms, before the kernel hands captured replies over (a TPACKET_V3
    /// block timeout, `--capture-block-ms`): one wakeup, one relay flush and so one control
    /// write per block instead of per reply. 0: a packet socket, a wakeup per reply.
    pub block_ms: u16,
}

/// The BPF filter for `opts`.
pub fn bpf_filter(opts: &CaptureOptions) -> String {
    let ports = match opts.ports.as_slice() {
        [one] => format!("src port {one}"),
        many => {
            let any: Vec<String> = many.iter().map(|p| format!("src port {p}")).collect();
            format!("({})", any.join(" or "))
        }
    };
    match opts.server {
        Some(ip) => format!("tcp and {ports} and src host {ip}"),
        None => format!("tcp and {ports}"),
    }
}

/// How much payload the capture keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturedPayload {
    /// The first bytes only (feedback prefixes, `--protocol tcp`).
    Prefix(usize),
    /// Every byte: MySQL framing needs the whole stream.
    Whole,
}

/// libpcap's largest snap length. A segment on `lo` (MTU 65536) or one merged by GRO can be
/// longer than 65535 bytes with its link header, so nothing less is enough for whole payloads.
pub const MAX_SNAPLEN: i32 = 262_144;

/// Enough for the largest link header we parse (Ethernet + 2 VLAN tags, or SLL2), a maximal IP
/// header and a maximal TCP header, plus the payload wanted.
pub fn snaplen(payload: CapturedPayload) -> i32 {
    match payload {
        CapturedPayload::Prefix(n) => (n.min(MAX_PAYLOAD_PREFIX) + 256) as i32,
        CapturedPayload::Whole => MAX_SNAPLEN,
    }
}

pub struct CaptureSource {
    way: Way,
    interface: String,
    captured: u64,
    parse_errors: ParseErrors,
}

enum Way {
    /// `--capture-block-ms 0`: frames from the IPv4 header on.
    Socket(PacketSocket),
    /// libpcap's TPACKET_V3 ring, in blocks.
    Ring {
        cap: Capture<Active>,
        link: LinkType,
    },
}

impl CaptureSource {
    pub fn open(opts: &CaptureOptions) -> anyhow::Result<Self> {
        let iface = &opts.interface;
        let filter = bpf_filter(opts);
        let way = if opts.block_ms == 0 {
            Way::Socket(PacketSocket::open(
                iface,
                &filter,
                opts.direction,
                opts.buffer_bytes,
            )?)
        } else {
            open_ring(opts, &filter)?
        };
        tracing::info!(interface = %iface, %filter, block_ms = opts.block_ms, "capturing the test server's replies");
        Ok(CaptureSource {
            way,
            interface: iface.clone(),
            captured: 0,
            parse_errors: ParseErrors::default(),
        })
    }

    fn fd(&self) -> RawFd {
        match &self.way {
            Way::Socket(s) => s.as_raw_fd(),
            Way::Ring { cap, .. } => cap.as_raw_fd(),
        }
    }
}

fn open_ring(opts: &CaptureOptions, filter: &str) -> anyhow::Result<Way> {
    let iface = &opts.interface;
    let cap = Capture::from_device(iface.as_str())
        .and_then(|c| {
            c.immediate_mode(false)
                .promisc(false)
                .snaplen(snaplen(opts.payload))
                .buffer_size(opts.buffer_bytes.min(i32::MAX as usize) as i32)
                .timeout(i32::from(opts.block_ms.max(1)))
                .open()
        })
        .map_err(|e| open_error(iface, e))?;
    let mut cap = cap
        .setnonblock()
        .with_context(|| format!("cannot make the capture on {iface} non-blocking"))?;
    if let Err(e) = cap.direction(opts.direction) {
        // Without it the filter on source port still holds; only replies we send ourselves
        // (none) could slip in.
        tracing::warn!(interface = %iface, "capture direction {:?} not supported here ({e}); capturing both directions", opts.direction);
    }
    cap.filter(filter, true)
        .with_context(|| format!("cannot set capture filter `{filter}` on {iface}"))?;
    let dlt = cap.get_datalink();
    let Some(link) = LinkType::from_dlt(dlt.0) else {
        bail!(
            "interface {iface} has link type {} ({}), which intercept cannot parse; \
             capture on an Ethernet interface or on `any`",
            dlt.0,
            dlt.get_name().unwrap_or_else(|_| "unknown".into())
        );
    };
    tracing::debug!(interface = %iface, ?link, snaplen = snaplen(opts.payload), "TPACKET_V3 ring");
    Ok(Way::Ring { cap, link })
}

impl CaptureSource {
    /// `--workers`: joins this capture to the process's fan-out group `group`, spread by flow
    /// hash (PACKET_FANOUT_HASH, symmetric in the kernel, with DEFRAG so fragments hash like
    /// their flow): each reply connection is read by one worker only, which keeps its MySQL
    /// framing whole. Every member joins with the same type and flags.
    pub fn join_fanout(&self, group: u16) -> anyhow::Result<()> {
        // From <linux/if_packet.h>; the libc crate does not export them on every target.
        const SOL_PACKET: libc::c_int = 263;
        const PACKET_FANOUT: libc::c_int = 18;
        const PACKET_FANOUT_HASH: u32 = 0;
        const PACKET_FANOUT_FLAG_DEFRAG: u32 = 0x8000;
        let arg: u32 = u32::from(group) | ((PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_DEFRAG) << 16);
        // SAFETY: `arg` lives across the call and its size is passed; the fd is our socket.
        let rc = unsafe {
            libc::setsockopt(
                self.fd(),
                SOL_PACKET,
                PACKET_FANOUT,
                std::ptr::from_ref(&arg).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!(
                "cannot join capture fan-out group {group} on {} (PACKET_FANOUT): {} (run with \
                 --workers 1)",
                self.interface,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Reads and forgets what the capture holds now (at most `limit` frames): what members
    /// captured before the whole fan-out group had formed, every member saw. Returns how many.
    pub fn discard_backlog(&mut self, limit: usize) -> anyhow::Result<usize> {
        let mut n = 0;
        while n < limit && self.poll_segment(|_, _| {})? {
            n += 1;
        }
        self.captured = 0;
        Ok(n)
    }
}

/// A fan-out group id for this process: groups are per network namespace, so two daemons on
/// one host must not share one. The process id is unique among the host's live processes.
pub fn fanout_group() -> u16 {
    let pid = std::process::id();
    (pid ^ (pid >> 16)) as u16
}

fn open_error(iface: &str, e: pcap::Error) -> anyhow::Error {
    let msg = e.to_string();
    let lower = msg.to_ascii_lowercase();
    if lower.contains("permission") || lower.contains("not permitted") {
        anyhow::anyhow!(
            "cannot open capture on {iface}: permission denied — run as root or give the binary \
             CAP_NET_RAW and CAP_NET_ADMIN (setcap cap_net_raw,cap_net_admin+ep intercept) ({msg})"
        )
    } else if lower.contains("no such device") || lower.contains("doesn't exist") {
        anyhow::anyhow!(
            "cannot open capture on {iface}: no such interface — check `ip link`, or use --interface any ({msg})"
        )
    } else {
        anyhow::anyhow!("cannot open capture on {iface}: {msg}")
    }
}

impl SegmentSource for CaptureSource {
    fn poll_segment(&mut self, f: impl FnOnce(&TcpPacket<'_>, u32)) -> anyhow::Result<bool> {
        loop {
            // The kernel's receive time, not ours: with block delivery a reply reaches us up
            // to a block's timeout after the test server sent it.
            let (parsed, at) = match &mut self.way {
                Way::Socket(s) => match s.next_frame()? {
                    Some(frame) => (
                        parse_frame_headers(LinkType::RawIp, frame.bytes),
                        frame
                            .ts_ns
                            .map_or_else(common::clock::realtime_us, common::clock::ns_us),
                    ),
                    None => return Ok(false),
                },
                Way::Ring { cap, link } => match cap.next_packet() {
                    Ok(p) => {
                        let ts = p.header.ts;
                        let at = common::clock::timeval_us(ts.tv_sec as u64, ts.tv_usec as u64);
                        (parse_frame_headers(*link, p.data), at)
                    }
                    Err(pcap::Error::TimeoutExpired) => return Ok(false),
                    Err(e) => {
                        return Err(anyhow::anyhow!(
                            "capture on {} failed: {e} (did the interface go away?)",
                            self.interface
                        ))
                    }
                },
            };
            self.captured += 1;
            match parsed {
                Ok(pkt) => {
                    f(&pkt, at);
                    return Ok(true);
                }
                // Counted, shown in the status line; a log line per frame would flood.
                Err(e) => self.parse_errors.count(e),
            }
        }
    }

    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one initialised pollfd, valid for the call. The result is not needed: EINTR
        // (a signal) and timeouts both just send the caller round its loop again.
        unsafe {
            libc::poll(&mut pfd, 1, ms);
        }
        Ok(())
    }

    fn stats(&mut self) -> SourceStats {
        let (kernel, truncated) = match &mut self.way {
            // 32-bit like libpcap's counters, which the status line and metrics expect.
            Way::Socket(s) => (
                s.kernel_stats().map(|k| KernelStats {
                    received: k.received as u32,
                    dropped: k.dropped as u32,
                    if_dropped: 0,
                }),
                s.truncated(),
            ),
            Way::Ring { cap, .. } => (
                cap.stats().ok().map(|s| KernelStats {
                    received: s.received,
                    dropped: s.dropped,
                    if_dropped: s.if_dropped,
                }),
                0,
            ),
        };
        let mut parse_errors = self.parse_errors;
        parse_errors.truncated += truncated;
        SourceStats {
            captured: self.captured,
            parse_errors,
            kernel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(server: Option<Ipv4Addr>) -> CaptureOptions {
        CaptureOptions {
            interface: "any".into(),
            ports: vec![3306],
            server,
            payload: CapturedPayload::Prefix(64),
            direction: Direction::In,
            buffer_bytes: 1 << 20,
            block_ms: 1,
        }
    }

    #[test]
    fn filter_names_the_source_side_only() {
        assert_eq!(bpf_filter(&opts(None)), "tcp and src port 3306");
        assert_eq!(
            bpf_filter(&opts(Some(Ipv4Addr::new(198, 18, 0, 3)))),
            "tcp and src port 3306 and src host 198.18.0.3"
        );
    }

    #[test]
    fn several_ports_are_one_bracketed_alternative() {
        let o = CaptureOptions {
            ports: vec![3306, 3307],
            ..opts(Some(Ipv4Addr::new(198, 18, 0, 3)))
        };
        let f = bpf_filter(&o);
        assert_eq!(
            f,
            "tcp and (src port 3306 or src port 3307) and src host 198.18.0.3"
        );
        let dead = Capture::dead(pcap::Linktype::ETHERNET).unwrap();
        dead.compile(&f, true).unwrap();
    }

    #[test]
    fn snaplen_covers_headers_and_prefix() {
        // Ethernet + QinQ (22) + IP (60) + TCP (60) + prefix.
        assert!(snaplen(CapturedPayload::Prefix(64)) >= 22 + 60 + 60 + 64);
        assert!(snaplen(CapturedPayload::Prefix(100_000)) <= (MAX_PAYLOAD_PREFIX + 256) as i32);
        // A maximal IP packet plus the largest link header.
        assert!(snaplen(CapturedPayload::Whole) >= 65_535 + 22);
    }

    #[test]
    fn filter_compiles() {
        // A dead capture compiles BPF without privileges or an interface.
        let dead = Capture::dead(pcap::Linktype::ETHERNET).unwrap();
        dead.compile(&bpf_filter(&opts(Some(Ipv4Addr::new(198, 18, 0, 3)))), true)
            .unwrap();
    }
}
