//! The capture edge: libpcap on the production interface, in non-blocking mode so the engine
//! loop can wait on it together with the control channel. The live copier reads a TPACKET_V3
//! mmap ring (see [`LiveCapture::open_live`]) and drains everything ready after each wakeup;
//! a plain packet socket opened first ([`bridge`]) carries the traffic while that ring is
//! allocated.
//!
//! This room only turns frames into parsed packets and counts what it cannot parse. It never
//! interprets TCP: that is the engine's job.

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::wire::{parse_frame, LinkType, TcpPacket, WireError};
use ops::packet_socket::PacketSocket;

pub mod bridge;

use bridge::{Overlap, Phase, Verdict};

/// Why captured frames were skipped before reaching the engine.
#[derive(Clone, Copy, Debug, Default)]
pub struct CaptureStats {
    pub frames: u64,
    pub parsed: u64,
    pub truncated: u64,
    pub not_ipv4: u64,
    pub not_tcp: u64,
    pub bad_header: u64,
    pub fragments: u64,
    /// Frames longer than the snap length: their payload tail is missing.
    pub snapped: u64,
    /// From the kernel (`pcap_stats`): dropped for lack of buffer space / by the interface.
    /// The bridge socket's drops are included.
    pub kernel_dropped: u64,
    pub if_dropped: u64,
    /// Frames the bridge socket carried before the ring took over, and the ring's copies of
    /// them skipped (counted in neither `frames` nor `parsed` a second time).
    pub bridged: u64,
    pub bridge_copies: u64,
}

impl CaptureStats {
    pub fn skipped(&self) -> u64 {
        self.truncated
            + self.not_ipv4
            + self.not_tcp
            + self.bad_header
            + self.fragments
            + self.snapped
    }
    /// Counts a frame skipped for `e`.
    pub fn count(&mut self, e: WireError) {
        match e {
            WireError::Truncated => self.truncated += 1,
            WireError::NotIpv4 => self.not_ipv4 += 1,
            WireError::NotTcp => self.not_tcp += 1,
            WireError::BadIpHeader | WireError::BadTcpHeader | WireError::BufferTooSmall => {
                self.bad_header += 1
            }
            WireError::Fragment => self.fragments += 1,
        }
    }
}

pub struct LiveCapture {
    cap: pcap::Capture<pcap::Active>,
    link: LinkType,
    /// The interface's LINKTYPE number, as capture files store it.
    dlt: u16,
    /// Timestamps in nanoseconds (else microseconds). Linux libpcap honours the request.
    nanos: bool,
    pub stats: CaptureStats,
    /// The bridge socket while it is open, and the handover's bookkeeping while it lasts.
    bridge: Option<Bridge>,
    overlap: Option<Overlap>,
    /// The bridge socket's kernel drops, added to the ring's.
    bridge_dropped: u64,
    /// The block timeout of a TPACKET_V3 ring; `None` in immediate mode.
    block: Option<Duration>,
}

/// The bridge socket (see [`bridge`]) and when it opened.
struct Bridge {
    sock: PacketSocket,
    opened: Instant,
}

/// One frame as captured, for `copier record`: written to a file as is.
#[derive(Clone, Copy, Debug)]
pub struct RawFrame<'a> {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    pub data: &'a [u8],
    /// Length on the wire (more than `data.len()` when the snap length cut it).
    pub orig_len: u32,
}

impl RawFrame<'_> {
    /// The snap length cut the frame: its payload tail is missing.
    pub fn snapped(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }
}

/// Large enough for GRO/TSO super-frames, which the kernel hands to the capture unsplit.
const SNAPLEN: i32 = 262_144;

impl LiveCapture {
    /// Opens `interface` with `filter` (BPF). `buffer_bytes` is the kernel ring size: the larger,
    /// the fewer drops during bursts.
    pub fn open(interface: &str, filter: &str, buffer_bytes: i32) -> Result<Self> {
        Self::open_with(interface, filter, buffer_bytes, pcap::Precision::Micro, 0)
    }

    /// Like [`LiveCapture::open`], with the kernel handing packets over in blocks retired at
    /// most `block_ms` after their first packet (`--capture-block-ms`; 0: immediate mode).
    ///
    /// libpcap 1.10 on Linux maps a TPACKET_V3 ring only without immediate mode; immediate
    /// mode falls back to TPACKET_V2, which wakes the copier for every packet. Measured in
    /// the lab (docs/BENCHMARKS.md, issue 9) a 1 ms block saves about a third of the
    /// copier's user time per packet and some system time, for at most 1 ms more delay
    /// before a captured packet is mirrored; capture timestamps (production's latencies in
    /// the report) are the kernel's and do not move.
    pub fn open_live(
        interface: &str,
        filter: &str,
        buffer_bytes: i32,
        block_ms: u16,
    ) -> Result<Self> {
        Self::open_with(
            interface,
            filter,
            buffer_bytes,
            pcap::Precision::Micro,
            i32::from(block_ms),
        )
    }

    /// Like [`LiveCapture::open_live`], capturing from before the ring is allocated: a bridge
    /// socket with the same filter is opened first and carries the traffic until the ring has
    /// it too (see [`bridge`]). Without the bridge (a filter that does not compile for raw IP,
    /// a socket refused) the capture starts with the ring, as `open_live`'s does, and says so.
    pub fn open_live_bridged(
        interface: &str,
        filter: &str,
        buffer_bytes: i32,
        block_ms: u16,
    ) -> Result<Self> {
        let opened = Instant::now();
        // Its queue lives a few tens of milliseconds and is charged per packet held.
        let queue = usize::try_from(buffer_bytes).unwrap_or(0) / 2;
        let sock = PacketSocket::open(interface, filter, pcap::Direction::InOut, queue);
        if sock.is_ok() {
            tracing::info!("capture: bridge socket open, capturing while the ring is allocated");
        }
        let mut cap = Self::open_live(interface, filter, buffer_bytes, block_ms)?;
        match sock {
            Ok(sock) => {
                cap.bridge = Some(Bridge { sock, opened });
                cap.overlap = Some(Overlap::default());
            }
            Err(e) => tracing::info!(
                "capture: no bridge socket ({e:#}); capturing from when the ring is ready"
            ),
        }
        Ok(cap)
    }

    /// The bridge socket, while it carries traffic: the loop must wait on it too.
    pub fn bridge_fd(&self) -> Option<RawFd> {
        self.bridge.as_ref().map(|b| b.sock.as_raw_fd())
    }

    /// Like [`LiveCapture::open`], with nanosecond timestamps for [`LiveCapture::drain_frames`]:
    /// a recording keeps the kernel's full timestamp resolution.
    pub fn open_nanos(interface: &str, filter: &str, buffer_bytes: i32) -> Result<Self> {
        Self::open_with(interface, filter, buffer_bytes, pcap::Precision::Nano, 0)
    }

    fn open_with(
        interface: &str,
        filter: &str,
        buffer_bytes: i32,
        precision: pcap::Precision,
        block_ms: i32,
    ) -> Result<Self> {
        let cap = pcap::Capture::from_device(interface)
            .with_context(|| format!("no capture device {interface:?} (see `ip link`)"))?
            // See `open_live`: 0 is immediate mode (TPACKET_V2 in libpcap 1.10, a wakeup per
            // packet); otherwise TPACKET_V3 blocks retired after at most `block_ms`.
            .immediate_mode(block_ms == 0)
            .timeout(block_ms)
            .precision(precision)
            .snaplen(SNAPLEN)
            .buffer_size(buffer_bytes)
            .promisc(false)
            .open()
            .map_err(|e| {
                let msg = e.to_string().to_ascii_lowercase();
                let hint = if msg.contains("permission") || msg.contains("not permitted") {
                    " — run as root or grant CAP_NET_RAW and CAP_NET_ADMIN"
                } else if msg.contains("no such device") || msg.contains("doesn't exist") {
                    " — check the name with `ip link`, or use --interface any"
                } else {
                    ""
                };
                anyhow::anyhow!("cannot open capture on {interface}: {e}{hint}")
            })?;
        let mut cap = cap
            .setnonblock()
            .context("cannot make the capture non-blocking")?;
        cap.filter(filter, true)
            .with_context(|| format!("bad capture filter {filter:?}"))?;
        let dlt = cap.get_datalink();
        let Some(link) = LinkType::from_dlt(dlt.0) else {
            bail!(
                "capture on {interface} has link type {} which tcpshadow cannot parse; use an Ethernet interface or \"any\"",
                dlt.get_name().unwrap_or_else(|_| dlt.0.to_string())
            );
        };
        Ok(Self {
            cap,
            link,
            dlt: dlt.0 as u16,
            nanos: matches!(precision, pcap::Precision::Nano),
            stats: CaptureStats::default(),
            bridge: None,
            overlap: None,
            bridge_dropped: 0,
            block: u64::try_from(block_ms)
                .ok()
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
        })
    }

    /// While packets keep coming, the longest the ring leaves the loop asleep: the kernel
    /// retires a block this long after its first packet and wakes the reader. `None` in
    /// immediate mode (a wakeup per packet, nothing to pace by).
    pub fn paced_by(&self) -> Option<Duration> {
        self.block
    }

    /// Hands at most `budget` parsed packets to `f`, returning how many frames were read. Stops
    /// early when the kernel has nothing more; the budget keeps one busy capture from starving
    /// the control channel.
    ///
    /// A read error other than "nothing more now" is returned: the interface went away or
    /// down, and a capture that keeps failing would otherwise spin (its descriptor stays
    /// readable) while mirroring nothing.
    ///
    /// `f` also gets the packet's capture timestamp, in nanoseconds since the Unix epoch (the
    /// kernel's `CLOCK_REALTIME` at capture).
    pub fn drain(
        &mut self,
        budget: usize,
        mut f: impl FnMut(u64, &TcpPacket<'_>),
    ) -> Result<usize> {
        let mut n = 0;
        if let (Some(b), Some(o)) = (&mut self.bridge, &mut self.overlap) {
            n += drain_bridge(&mut b.sock, o, &mut self.stats, budget, &mut f);
        }
        let Self {
            cap,
            link,
            nanos,
            stats,
            bridge,
            overlap,
            bridge_dropped,
            ..
        } = self;
        let link = *link;
        n += dispatch(cap, *nanos, budget.saturating_sub(n), |frame| {
            let parsed = if frame.snapped() {
                Err(None)
            } else {
                parse_frame(link, frame.data).map_err(Some)
            };
            if let Some(o) = overlap.as_mut() {
                let key = parsed.as_ref().ok().map(bridge::key);
                let mut verdict = o.ring_frame(key, frame.ts_ns);
                if verdict == Verdict::Reread {
                    if let Some(b) = bridge.as_mut() {
                        drain_bridge(&mut b.sock, o, stats, usize::MAX, &mut f);
                    }
                    verdict = o.after_reread(key, frame.ts_ns);
                }
                if verdict == Verdict::Duplicate {
                    stats.bridge_copies += 1;
                    return;
                }
            }
            stats.frames += 1;
            match parsed {
                Ok(p) => {
                    stats.parsed += 1;
                    f(frame.ts_ns, &p);
                }
                Err(None) => stats.snapped += 1,
                Err(Some(e)) => stats.count(e),
            }
            if overlap.is_some() {
                end_bridge_if_done(overlap, bridge, stats, bridge_dropped);
            }
        })?;
        self.end_bridge_if_done();
        Ok(n)
    }

    /// See [`end_bridge_if_done`].
    fn end_bridge_if_done(&mut self) {
        end_bridge_if_done(
            &mut self.overlap,
            &mut self.bridge,
            &mut self.stats,
            &mut self.bridge_dropped,
        );
    }

    /// The interface's LINKTYPE number (1 Ethernet, 113 Linux cooked for "any", ...).
    pub fn link_type_number(&self) -> u16 {
        self.dlt
    }

    /// Hands at most `budget` frames to `f` as captured, unparsed (for `copier record`);
    /// returns how many. Errors as [`LiveCapture::drain`]. Timestamps are nanoseconds only if
    /// the capture was opened with [`LiveCapture::open_nanos`].
    pub fn drain_frames(
        &mut self,
        budget: usize,
        mut f: impl FnMut(RawFrame<'_>) -> Result<()>,
    ) -> Result<usize> {
        let mut failed = None;
        let stats = &mut self.stats;
        let n = dispatch(&mut self.cap, self.nanos, budget, |frame| {
            if failed.is_some() {
                // The recording ends with this error; what the ring still hands over in this
                // call is not written.
                return;
            }
            stats.frames += 1;
            // Written anyway: the file keeps the wire length, and replay counts the cut frame.
            if frame.snapped() {
                stats.snapped += 1;
            }
            if let Err(e) = f(frame) {
                failed = Some(e);
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Refreshes the kernel's drop counters.
    pub fn refresh_kernel_stats(&mut self) {
        if let Ok(s) = self.cap.stats() {
            self.stats.kernel_dropped = u64::from(s.dropped) + self.bridge_dropped;
            self.stats.if_dropped = u64::from(s.if_dropped);
        }
    }
}

/// Hands what the bridge socket holds (at most `budget` frames) to `f`, noting each in the
/// handover's bookkeeping. A read error ends the bridge, not the capture: the ring goes on.
fn drain_bridge(
    sock: &mut PacketSocket,
    overlap: &mut Overlap,
    stats: &mut CaptureStats,
    budget: usize,
    f: &mut impl FnMut(u64, &TcpPacket<'_>),
) -> usize {
    let mut n = 0;
    while n < budget {
        let frame = match sock.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                tracing::info!("capture: the bridge socket failed ({e:#}); the ring goes on");
                overlap.close();
                break;
            }
        };
        n += 1;
        stats.frames += 1;
        stats.bridged += 1;
        let ts_ns = frame.ts_ns.unwrap_or_else(common::clock::realtime_ns);
        match parse_frame(LinkType::RawIp, frame.bytes) {
            Ok(p) => {
                overlap.bridge_frame(bridge::key(&p), ts_ns);
                stats.parsed += 1;
                f(ts_ns, &p);
            }
            Err(e) => stats.count(e),
        }
    }
    n
}
/// Closes the bridge socket once the ring has taken over (or it may remember no more), and
/// forgets the handover once it is over. Over [`LiveCapture`]'s fields: the ring's callback
/// runs while the capture itself is borrowed.
fn end_bridge_if_done(
    overlap: &mut Option<Overlap>,
    bridge: &mut Option<Bridge>,
    stats: &mut CaptureStats,
    bridge_dropped: &mut u64,
) {
    let Some(o) = overlap.as_mut() else {
        return;
    };
    if o.full() {
        o.close();
    }
    if o.phase() != Phase::Bridging {
        if let Some(mut b) = bridge.take() {
            let dropped = b.sock.kernel_stats().map_or(0, |k| k.dropped);
            *bridge_dropped = dropped;
            stats.snapped += b.sock.truncated();
            tracing::info!(
                bridged = o.bridged,
                dropped,
                "capture: the ring took over {} ms after the bridge socket opened",
                b.opened.elapsed().as_millis()
            );
        }
    }
    if o.phase() == Phase::Done {
        *overlap = None;
    }
}

/// Hands `f` at most `max` of the frames the ring holds now, returning how many; stops early
/// when the kernel has nothing more. A read error is returned: the interface went away or down
/// (see [`LiveCapture::drain`]).
///
/// `pcap_dispatch` ends where the ready blocks end; reading frame by frame with
/// `pcap_next_ex` only learns the ring is empty from one more call, a `poll` of the socket
/// each wakeup (a sixth of the copier's syscalls at 8 threads, issue 20). It also hands each
/// frame over where it lies in the ring instead of copying it out first, though the copy's
/// cost mostly moves to whoever reads the cold frame first (docs/BENCHMARKS.md).
fn dispatch(
    cap: &mut pcap::Capture<pcap::Active>,
    nanos: bool,
    max: usize,
    mut f: impl FnMut(RawFrame<'_>),
) -> Result<usize> {
    if max == 0 {
        return Ok(0);
    }
    // The crate refuses counts beyond an int; budgets are far below.
    let max = max.min(i32::MAX as usize);
    match cap.dispatch(Some(max), |p| f(raw_frame(p.header, p.data, nanos))) {
        Ok(n) => Ok(n),
        Err(e) => bail!(
            "capture failed: {e} (did the interface go down or away? start again once it is back)"
        ),
    }
}

fn raw_frame<'a>(header: &pcap::PacketHeader, data: &'a [u8], nanos: bool) -> RawFrame<'a> {
    let ts = header.ts;
    let frac = u64::try_from(ts.tv_usec).unwrap_or(0);
    let frac_ns = if nanos {
        frac
    } else {
        frac.saturating_mul(1000)
    };
    let ts_ns = u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(frac_ns);
    RawFrame {
        ts_ns,
        data,
        orig_len: header.len,
    }
}

impl AsRawFd for LiveCapture {
    fn as_raw_fd(&self) -> RawFd {
        self.cap.as_raw_fd()
    }
}

/// `--workers`: joining a kernel fan-out group, so several captures of one process share the
/// traffic flow by flow instead of each seeing all of it.
pub mod fanout {
    use std::os::fd::RawFd;

    use anyhow::{bail, Result};

    // From <linux/if_packet.h>; the libc crate does not export them on every target.
    const SOL_PACKET: libc::c_int = 263;
    const PACKET_FANOUT: libc::c_int = 18;
    const PACKET_FANOUT_HASH: u32 = 0;
    const PACKET_FANOUT_FLAG_DEFRAG: u32 = 0x8000;

    /// Joins the AF_PACKET socket `fd` to fan-out group `group`, spread by flow hash. The
    /// kernel's fan-out hash (`__skb_get_hash_symmetric`) is symmetric, so both directions of a
    /// TCP connection reach the same member; DEFRAG reassembles IP fragments first so they hash
    /// like their flow. Every member must join with the same type and flags.
    pub fn join(fd: RawFd, group: u16) -> Result<()> {
        let arg: u32 = u32::from(group) | ((PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_DEFRAG) << 16);
        // The kernel reads the option as an int: the same 32 bits.
        if let Err(e) = ops::sockopt::set_int(fd, SOL_PACKET, PACKET_FANOUT, arg as libc::c_int) {
            bail!(
                "cannot join capture fan-out group {group} (PACKET_FANOUT): {e} (needs Linux \
                 3.1+ and an AF_PACKET capture; run with --workers 1 otherwise)"
            );
        }
        Ok(())
    }

    /// A fan-out group id for this process: groups are per network namespace, so two copiers
    /// (or a copier and an intercept) on one host must not pick the same id. Derived from the
    /// process id, which is unique among live processes of the host.
    pub fn group_for_process(salt: u16) -> u16 {
        let pid = std::process::id();
        ((pid ^ (pid >> 16)) as u16) ^ salt
    }
}

impl LiveCapture {
    /// `--workers`: joins this capture to fan-out group `group` (see [`fanout::join`]).
    pub fn join_fanout(&self, group: u16) -> Result<()> {
        fanout::join(self.cap.as_raw_fd(), group)
    }

    /// Reads and forgets what the capture holds now (at most `limit` frames): after the
    /// members of a fan-out group have joined, what each captured before joining was seen by
    /// every member, and would be mirrored twice. Returns how many were dropped.
    pub fn discard_backlog(&mut self, limit: usize) -> Result<usize> {
        let mut n = 0;
        while n < limit {
            let read = dispatch(&mut self.cap, self.nanos, limit - n, |_| {})?;
            if read == 0 {
                break;
            }
            n += read;
        }
        Ok(n)
    }
}
