//! `copier replay`: plays recorded traffic (pcap or pcapng) onto a test server through the same
//! [`Driver`] and session engine as the live copier, keeping each connection's timing divided by
//! `--speed`.
//!
//! # What this room is for
//!
//! It reads the files in order, one frame ahead (never a whole file in memory), keeps the TCP
//! packets of `--port` (both directions), and hands each one to the driver when its time comes:
//! `start + (t - t0) / speed`, `t` being the packet's time in the recording. The engine runs on
//! the real clock, as live, because the test server answers in real time. Around that it shows
//! progress, measures how far behind schedule it fell, and sums up.
//!
//! # What it must never do
//!
//! * Hold TCP or protocol logic (the engine's), or its own copy of the mirror loop (the driver's).
//! * Trust a file: a damaged one ends with an error naming file and offset, after what was
//!   readable before it has been replayed.
//! * Let two loops' connections meet: see [`LoopRewrite`].
//!
//! # Timeline
//!
//! Files are one timeline (rotated files of one recording). A file whose first packet is older
//! than the last packet replayed (an unrelated capture, or the next `--loop`) is moved to start
//! right after it; gaps forward are kept. Packets out of order within a file are fed as soon as
//! they are read (late, never reordered).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, IsTerminal, Write as _};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::clock::{Instant, MonotonicClock};
use common::wire::{parse_frame, LinkType, TcpPacket};

use crate::capture::CaptureStats;
use crate::cli::MirrorArgs;
use crate::driver::{Driver, Pump};
use crate::pcapfile::{CaptureReader, ReadError};
use crate::record::human;
use crate::settings::{MirrorSettings, Plan};

/// Replays recorded MySQL (or TCP) traffic onto a test server, at the recorded pace or faster.
///
/// Reads pcap or pcapng files (from `copier record`, tcpdump or Wireshark) in the order given and
/// mirrors every TCP connection of --port in them to --target exactly as the live copier would:
/// logins seen in the file are rewritten for the test server (--mysql-credentials), connections
/// already open when the recording started are picked up and log in as --mysql-default-user.
/// Needs intercept running for --target, like the live copier, and root (raw socket).
///
/// After the last packet, replay waits until every connection has closed as it did in the
/// recording, or the test server has been silent for a second (at most --drain-secs), then
/// resets the connections the recording left open.
///
/// Exit status: 0 when every file was replayed to its end, 1 when a file was damaged (what was
/// readable before the damage was replayed; the error names the file and offset) or replay
/// failed, 2 for bad arguments, 130 when stopped by SIGINT/SIGTERM.
#[derive(Parser, Debug, Clone)]
#[command(name = "copier replay", bin_name = "copier replay", version)]
pub struct ReplayArgs {
    /// Capture files, replayed in this order as one timeline (e.g. `cap.*.pcapng` from
    /// `copier record --rotate-size`).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// The production port in the recording: its TCP connections (both directions) are
    /// replayed, other packets are skipped.
    #[arg(long, default_value_t = 3306)]
    pub port: u16,

    /// Time factor: 2 replays twice as fast (each connection's pauses halved), 0.5 at half
    /// speed.
    #[arg(long, default_value_t = 1.0, value_parser = parse_speed)]
    pub speed: f64,

    /// Replay the files this many times back to back. Each loop's connections are new
    /// connections on the test server (needs --client-ip-pool, see `replay` docs).
    #[arg(long = "loop", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub loops: u32,

    #[command(flatten)]
    pub mirror: MirrorArgs,
}

fn parse_speed(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number (e.g. 2 or 0.5)"))?;
    if !(v.is_finite() && v > 0.0 && v <= 1000.0) {
        return Err(format!("--speed {s} must be above 0 and at most 1000"));
    }
    Ok(v)
}

impl ReplayArgs {
    /// Refuses what cannot be replayed; what is left is the settings the mirror runs with.
    pub fn validate(&self) -> Result<MirrorSettings> {
        let settings = self.mirror.validate()?;
        self.mirror.route(self.port)?;
        if self.loops > 1 && self.mirror.client_ip_pool.is_none() {
            bail!(
                "--loop {} needs --client-ip-pool: the recorded client addresses and ports repeat \
                 in every loop, so each loop's connections are sent from pool addresses to be new \
                 connections on the test server (e.g. --client-ip-pool 198.19.0.0/16, routed via \
                 the intercept host like the clients)",
                self.loops
            );
        }
        Ok(settings)
    }
}

// ------------------------------------------------------------------------------- loop rewrite

/// How one loop's packets are changed so that its connections are new ones everywhere.
///
/// Every loop replays the same client addresses, ports, sequence numbers and TCP timestamps.
/// Fed as they are, loop 2's SYN would be a retransmission of loop 1's connection to the engine
/// (or, for a connection open at the file's start, more data of it), and on the test server a
/// twin of a connection that may still be in TIME_WAIT. So, when looping:
///
/// * the client address becomes a *virtual* address, one per (loop, client address), taken in
///   order from 240.0.0.0/4 (reserved, never a real client). It only keys the engine's sessions:
///   --client-ip-pool (required) chooses what is sent, avoiding addresses in use.
/// * the client's sequence numbers (and production's acknowledgements of them) move by
///   `loop * 0x4000_0001`, and the client's TCP timestamps by the loop's start in the timeline
///   (milliseconds) plus one second per loop, so a test server still holding an earlier loop's
///   connection on the same pool address and port in TIME_WAIT accepts the new SYN as a new
///   connection (newer timestamp, later sequence number).
///
/// Loop 0 is rewritten the same way (with zero shifts) so that real and virtual addresses never
/// meet in one engine. Without `--loop`, packets are fed untouched.
#[derive(Debug)]
pub struct LoopRewrite {
    port: u16,
    active: bool,
    virtual_of: HashMap<(u32, Ipv4Addr), Ipv4Addr>,
    /// Packets not replayed because the virtual range ran out.
    pub exhausted: u64,
}

const VIRTUAL_BASE: u32 = 0xF000_0000;
/// 240.0.0.1 ..= 255.255.255.254.
const VIRTUAL_COUNT: u32 = 0x0FFF_FFFE;

/// Shifts of one loop (see [`LoopRewrite`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopShift {
    pub index: u32,
    pub seq: u32,
    pub ts: u32,
}

impl LoopShift {
    /// `start_ms`: where the loop starts in the timeline, relative to its beginning.
    pub fn new(index: u32, start_ms: u64) -> Self {
        Self {
            index,
            seq: index.wrapping_mul(0x4000_0001),
            ts: (start_ms as u32).wrapping_add(index.wrapping_mul(1000)),
        }
    }
}

impl LoopRewrite {
    pub fn new(port: u16, active: bool) -> Self {
        Self {
            port,
            active,
            virtual_of: HashMap::new(),
            exhausted: 0,
        }
    }

    fn virtual_ip(&mut self, index: u32, real: Ipv4Addr) -> Option<Ipv4Addr> {
        let next = self.virtual_of.len() as u32;
        if let Some(v) = self.virtual_of.get(&(index, real)) {
            return Some(*v);
        }
        if next >= VIRTUAL_COUNT {
            return None;
        }
        let v = Ipv4Addr::from(VIRTUAL_BASE + 1 + next);
        self.virtual_of.insert((index, real), v);
        Some(v)
    }

    /// Rewrites `pkt` for loop `shift`; false when it cannot be replayed (counted).
    pub fn apply(&mut self, shift: LoopShift, pkt: &mut TcpPacket<'_>) -> bool {
        if !self.active {
            return true;
        }
        // The engine's own test: toward the production port is the client's direction.
        let from_client = pkt.dst_port == self.port;
        let real = if from_client { pkt.src } else { pkt.dst };
        let Some(v) = self.virtual_ip(shift.index, real) else {
            self.exhausted += 1;
            return false;
        };
        if from_client {
            pkt.src = v;
            pkt.seq += shift.seq;
            if let Some((val, ecr)) = pkt.options.timestamps {
                pkt.options.timestamps = Some((val.wrapping_add(shift.ts), ecr));
            }
        } else {
            pkt.dst = v;
            pkt.ack += shift.seq;
            if let Some((val, ecr)) = pkt.options.timestamps {
                pkt.options.timestamps = Some((val, ecr.wrapping_add(shift.ts)));
            }
        }
        true
    }
}

// ------------------------------------------------------------------------------- the source

/// A file that could not be read to its end.
#[derive(Debug)]
pub struct Damaged {
    pub path: PathBuf,
    pub error: ReadError,
    /// Packets of --port replayed from it before the damage (first loop).
    pub packets_before: u64,
}

/// The packet to feed next, its bytes in `Source::frame`.
#[derive(Clone, Copy, Debug)]
struct Next {
    /// Position in the timeline (ns), after the file's shift.
    pos: u64,
    link: LinkType,
}

/// The frames of all files and loops, in order, one ahead.
struct Source {
    files: Vec<PathBuf>,
    sizes: Vec<u64>,
    port: u16,
    loops: u32,
    loop_idx: u32,
    file_idx: usize,
    reader: Option<CaptureReader<BufReader<File>>>,
    /// Added to the current file's timestamps (see the module's Timeline).
    shift_ns: u64,
    /// Whether the current file's first frame was seen (its shift is then fixed).
    shift_fixed: bool,
    /// Timeline position of the last frame read.
    last_pos: Option<u64>,
    /// Timeline position where each loop starts.
    loop_start: Option<u64>,
    first_pos: Option<u64>,
    frame: Vec<u8>,
    next: Option<Next>,
    shift: LoopShift,
    /// Bytes of files finished, over all loops.
    bytes_done: u64,
    packets_this_file: u64,
    pub damaged: Vec<Damaged>,
    pub stats: CaptureStats,
    /// Frames of other ports or protocols, skipped.
    pub other: u64,
    /// Frames of link types replay cannot parse, skipped.
    pub unsupported_link: u64,
    pub packets: u64,
    /// File time of one loop (ns), known once the first loop was read.
    pub loop_span: Option<u64>,
    /// [`RunOptions::file_time_limit`], ns.
    limit_ns: Option<u64>,
    /// The limit was reached: nothing more is read.
    cut: bool,
    /// [`RunOptions::first_loop`].
    base: LoopBase,
}

impl Source {
    /// Checks that every file opens and is a capture, before anything is replayed.
    fn open(files: &[PathBuf], port: u16, loops: u32) -> Result<Self> {
        Self::open_with(files, port, loops, &RunOptions::default())
    }

    fn open_with(files: &[PathBuf], port: u16, loops: u32, opts: &RunOptions) -> Result<Self> {
        let mut sizes = Vec::with_capacity(files.len());
        for path in files {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            sizes.push(file.metadata().map(|m| m.len()).unwrap_or(0));
            CaptureReader::new(BufReader::new(file))
                .with_context(|| format!("{}", path.display()))?;
        }
        let mut s = Self {
            files: files.to_vec(),
            sizes,
            port,
            loops,
            loop_idx: 0,
            file_idx: 0,
            reader: None,
            shift_ns: 0,
            shift_fixed: false,
            last_pos: None,
            loop_start: None,
            first_pos: None,
            frame: Vec::with_capacity(64 << 10),
            next: None,
            shift: LoopShift::default(),
            bytes_done: 0,
            packets_this_file: 0,
            damaged: Vec::new(),
            stats: CaptureStats::default(),
            other: 0,
            unsupported_link: 0,
            packets: 0,
            loop_span: None,
            limit_ns: opts
                .file_time_limit
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            cut: false,
            base: opts.first_loop.unwrap_or_default(),
        };
        s.advance()?;
        Ok(s)
    }

    fn total_bytes(&self) -> u64 {
        self.sizes.iter().sum::<u64>() * u64::from(self.loops)
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_done + self.reader.as_ref().map_or(0, |r| r.offset())
    }

    /// Reads up to the next packet of --port (or the end of everything).
    fn advance(&mut self) -> Result<()> {
        self.next = None;
        loop {
            if self.reader.is_none() && !self.open_next_file()? {
                return Ok(());
            }
            let Some(reader) = self.reader.as_mut() else {
                return Ok(());
            };
            let frame = match reader.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => {
                    self.close_file();
                    continue;
                }
                Err(error) => {
                    let path = self.files[self.file_idx].clone();
                    if self.loop_idx == 0 {
                        tracing::error!(
                            "{}: {error}; its {} packets before that are replayed, the rest of it \
                             cannot be",
                            path.display(),
                            self.packets_this_file
                        );
                        self.damaged.push(Damaged {
                            path,
                            error,
                            packets_before: self.packets_this_file,
                        });
                    }
                    self.close_file();
                    continue;
                }
            };
            self.stats.frames += 1;
            // The timeline advances with every frame, relevant or not, so a file's shift is
            // fixed by its first frame.
            if !self.shift_fixed {
                self.shift_fixed = true;
                if let Some(last) = self.last_pos {
                    if frame.ts_ns.saturating_add(self.shift_ns) < last {
                        self.shift_ns = last - frame.ts_ns;
                    }
                }
            }
            let pos = frame.ts_ns.saturating_add(self.shift_ns);
            if let (Some(limit), Some(first)) = (self.limit_ns, self.first_pos) {
                if pos.saturating_sub(first) > limit {
                    // Ends here as at the end of the files: the sessions still open are left
                    // to the settle and the drain, like those a recording cuts off.
                    self.cut = true;
                    self.reader = None;
                    return Ok(());
                }
            }
            if self.loop_start.is_none() {
                self.loop_start = Some(pos);
                let first = *self.first_pos.get_or_insert(pos);
                let start_ms = (pos - first) / 1_000_000;
                self.shift = LoopShift::new(
                    self.base.index.saturating_add(self.loop_idx),
                    u64::from(self.base.ts_ms).wrapping_add(start_ms),
                );
            }
            self.last_pos = Some(self.last_pos.map_or(pos, |l| l.max(pos)));
            let Some(link) = LinkType::from_dlt(i32::from(frame.link_type)) else {
                self.unsupported_link += 1;
                if self.unsupported_link == 1 {
                    tracing::warn!(
                        "{}: frames of link type {} cannot be parsed and are skipped (replay reads \
                         Ethernet, Linux cooked v1/v2, raw IP and BSD loopback captures)",
                        self.files[self.file_idx].display(),
                        frame.link_type
                    );
                }
                continue;
            };
            if (frame.data.len() as u64) < u64::from(frame.orig_len) {
                // Cut by the snap length: the payload is incomplete and cannot be mirrored.
                self.stats.snapped += 1;
                continue;
            }
            match parse_frame(link, frame.data) {
                Ok(p) if p.src_port == self.port || p.dst_port == self.port => {}
                Ok(_) => {
                    self.other += 1;
                    continue;
                }
                Err(e) => {
                    self.stats.count(e);
                    continue;
                }
            }
            self.stats.parsed += 1;
            self.frame.clear();
            self.frame.extend_from_slice(frame.data);
            self.next = Some(Next { pos, link });
            return Ok(());
        }
    }

    /// Opens the next file (or the first of the next loop); false when all are done.
    fn open_next_file(&mut self) -> Result<bool> {
        if self.cut {
            return Ok(false);
        }
        if self.file_idx >= self.files.len() {
            self.loop_idx += 1;
            self.file_idx = 0;
            if self.loop_span.is_none() {
                self.loop_span = match (self.first_pos, self.last_pos) {
                    (Some(f), Some(l)) => Some(l - f),
                    _ => Some(0),
                };
            }
            self.loop_start = None;
            if self.loop_idx >= self.loops {
                return Ok(false);
            }
        }
        let path = &self.files[self.file_idx];
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let reader = CaptureReader::new(BufReader::with_capacity(1 << 20, file))
            .with_context(|| format!("{}", path.display()))?;
        self.reader = Some(reader);
        self.shift_fixed = false;
        self.packets_this_file = 0;
        Ok(true)
    }

    fn close_file(&mut self) {
        self.reader = None;
        self.bytes_done += self.sizes[self.file_idx];
        self.file_idx += 1;
    }

    /// Parses the pending packet, rewrites it for its loop and hands it to `f`.
    fn with_next(&mut self, rewrite: &mut LoopRewrite, f: impl FnOnce(&TcpPacket<'_>)) {
        let Some(next) = self.next else { return };
        if let Ok(mut pkt) = parse_frame(next.link, &self.frame) {
            if rewrite.apply(self.shift, &mut pkt) {
                self.packets += 1;
                self.packets_this_file += 1;
                f(&pkt);
            }
        }
    }
}

// ------------------------------------------------------------------------------- schedule

/// When the packet at timeline position `pos` is due: `start + (pos - first) / speed`.
pub fn due_at(start: Instant, first: u64, pos: u64, speed: f64) -> Instant {
    let ns = pos.saturating_sub(first) as f64 / speed;
    start + Duration::from_nanos(ns.min(u64::MAX as f64) as u64)
}

/// Packets fed before the driver pumps (relayed feedback, transmission) again.
const FEED_BUDGET: usize = 512;
/// After the last packet: the test server silent this long has executed all it received.
const QUIET: Duration = Duration::from_secs(1);
/// Sleep while settling, to see sessions close promptly.
const SETTLE_SLEEP: Duration = Duration::from_millis(10);

/// The wait between the last packet and the driver's drain.
///
/// The driver's drain ends once the test server has *acknowledged* every byte, then resets what
/// is still open. Acknowledged is not executed: under load the test server's socket can hold
/// queries MySQL has not read yet, and a reset throws them away. So replay first waits until
/// every session has closed as it did in the recording, or the test server has been silent
/// for [`QUIET`] (done with what it got; sessions the recording cut off stay open), at most
/// `--drain-secs`; the drain then only resets what the recording left open.
struct Settle {
    since: Instant,
    feedback: u64,
    changed: Instant,
}

impl Settle {
    fn new(now: Instant) -> Self {
        Self {
            since: now,
            feedback: 0,
            changed: now,
        }
    }

    /// Whether the drain may start.
    fn done(&mut self, now: Instant, sessions_active: u64, feedback: u64, limit: Duration) -> bool {
        if feedback != self.feedback {
            self.feedback = feedback;
            self.changed = now;
        }
        sessions_active == 0
            || now.saturating_since(self.changed) >= QUIET
            || now.saturating_since(self.since) >= limit
    }
}
/// Progress bar refresh on a terminal.
const BAR_EVERY: Duration = Duration::from_millis(250);

/// What a replay did, beyond the driver's summary.
#[derive(Debug, Default)]
pub struct ReplayReport {
    pub packets: u64,
    pub files: usize,
    pub loops_done: u32,
    pub loops: u32,
    pub speed: f64,
    /// File time of all loops (ns).
    pub file_time: Duration,
    /// From the first packet fed to the last.
    pub feeding: Duration,
    /// From the first packet fed to the end of the drain.
    pub total: Duration,
    pub worst_lateness: Duration,
    pub interrupted: bool,
    pub damaged: Vec<Damaged>,
    pub other: u64,
    pub unsupported_link: u64,
    pub virtual_exhausted: u64,
}

impl ReplayReport {
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let sched = self.file_time.as_secs_f64() / self.speed;
        let _ = writeln!(
            out,
            "replay: {} packets from {} file(s) x {} loop(s){}; file time {:.1} s at speed {} = {:.1} s scheduled",
            self.packets,
            self.files,
            self.loops_done,
            if self.interrupted {
                format!(" (interrupted; {} loop(s) asked)", self.loops)
            } else {
                String::new()
            },
            self.file_time.as_secs_f64(),
            self.speed,
            sched,
        );
        let _ = writeln!(
            out,
            "  took {:.2} s from the first packet to the last ({:+.1}% of schedule), {:.2} s with the drain; worst lateness {:.1} ms",
            self.feeding.as_secs_f64(),
            if sched > 0.0 {
                (self.feeding.as_secs_f64() / sched - 1.0) * 100.0
            } else {
                0.0
            },
            self.total.as_secs_f64(),
            self.worst_lateness.as_secs_f64() * 1000.0
        );
        if self.other + self.unsupported_link + self.virtual_exhausted > 0 {
            let _ = writeln!(
                out,
                "  skipped: {} frames of other ports or protocols, {} of unsupported link types, {} beyond the loop address range",
                self.other, self.unsupported_link, self.virtual_exhausted
            );
        }
        for d in &self.damaged {
            let _ = writeln!(
                out,
                "  damaged: {}: {} ({} packets before it were replayed)",
                d.path.display(),
                d.error,
                d.packets_before
            );
        }
        out
    }
}

/// Progress on stderr: a bar redrawn in place on a terminal, a line per status interval
/// otherwise.
struct Progress {
    tty: bool,
    every: Option<Duration>,
    next: Option<Instant>,
    drawn: bool,
}

impl Progress {
    fn new(now: Instant, every: Option<Duration>, quiet: bool) -> Self {
        let tty = !quiet && std::io::stderr().is_terminal();
        let every = match (quiet, tty) {
            (true, _) => None,
            (false, true) => Some(BAR_EVERY),
            (false, false) => every,
        };
        Self {
            tty,
            every,
            next: every.map(|e| now + e),
            drawn: false,
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|n| now >= n)
    }

    fn next_due(&self) -> Option<Instant> {
        self.next
    }

    /// Clears the bar so a log line does not land in the middle of it.
    fn clear(&mut self) {
        if self.tty && self.drawn {
            eprint!("\r\x1b[K");
            self.drawn = false;
        }
    }

    fn show(&mut self, now: Instant, p: &ProgressFigures) {
        self.next = self.every.map(|e| now + e);
        let eta = p.eta().map_or_else(|| "?".into(), clock_text);
        let pct = p.fraction() * 100.0;
        if self.tty {
            const WIDTH: usize = 30;
            let filled = ((p.fraction() * WIDTH as f64) as usize).min(WIDTH);
            eprint!(
                "\r\x1b[K[{}{}] {pct:5.1}%  elapsed {}  ETA {eta}  loop {}/{}  {} packets  late {:.0} ms",
                "#".repeat(filled),
                ".".repeat(WIDTH - filled),
                clock_text(p.elapsed),
                p.loop_no,
                p.loops,
                p.packets,
                p.lateness.as_secs_f64() * 1000.0
            );
            let _ = std::io::stderr().flush();
            self.drawn = true;
        } else {
            tracing::info!(
                "replay {pct:.1}% (loop {}/{}, {} of {} read): {} packets, elapsed {}, ETA {eta}, worst lateness {:.1} ms",
                p.loop_no,
                p.loops,
                human(p.bytes_read),
                human(p.bytes_total),
                p.packets,
                clock_text(p.elapsed),
                p.lateness.as_secs_f64() * 1000.0
            );
        }
    }
}

/// `1:02:03` or `2:03`.
fn clock_text(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

struct ProgressFigures {
    elapsed: Duration,
    bytes_read: u64,
    bytes_total: u64,
    loop_no: u32,
    loops: u32,
    packets: u64,
    lateness: Duration,
    /// Schedule left, when known (the first loop's span is known once it was read).
    schedule_left: Option<Duration>,
}

impl ProgressFigures {
    fn fraction(&self) -> f64 {
        if self.bytes_total == 0 {
            return 1.0;
        }
        (self.bytes_read as f64 / self.bytes_total as f64).clamp(0.0, 1.0)
    }

    /// From the schedule when the span is known, else extrapolated from bytes read.
    fn eta(&self) -> Option<Duration> {
        if let Some(left) = self.schedule_left {
            return Some(left);
        }
        let f = self.fraction();
        (f > 0.0).then(|| self.elapsed.mul_f64((1.0 - f) / f))
    }
}

/// What the replay command line asks the driver for: connections open at the start of the
/// recording are picked up (their state is not recoverable from production: it has moved on).
pub fn plan(args: &ReplayArgs) -> Result<Plan> {
    Ok(Plan {
        routes: args.mirror.route(args.port)?,
        pickup_midstream: true,
        prod_dsn: None,
        prod_dsn_wait: Duration::from_secs(3),
    })
}

/// Where a replay's loop numbering starts: a caller that replays the same files several times
/// in a row (the capacity probe's steps) continues where the previous replay stopped, so its
/// connections are new ones on the test server too (see [`LoopRewrite`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopBase {
    /// The first loop's index.
    pub index: u32,
    /// Added to every loop's timestamp shift, ms.
    pub ts_ms: u32,
}

impl LoopBase {
    /// The base of the replay after one that started at `self` and reported `r`: past every
    /// loop and every timestamp it used.
    pub fn after(self, r: &ReplayReport) -> Self {
        let loops = r.loops_done.saturating_add(1);
        let span_ms = u32::try_from(r.file_time.as_millis()).unwrap_or(u32::MAX);
        Self {
            index: self.index.saturating_add(loops),
            ts_ms: self
                .ts_ms
                .wrapping_add(span_ms)
                .wrapping_add(loops.wrapping_mul(1000))
                .wrapping_add(1000),
        }
    }
}

/// What a caller other than `copier replay` changes in a replay (`copier probe`).
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Replay only this much file time from the first packet (over all loops), then end as at
    /// the end of the files.
    pub file_time_limit: Option<Duration>,
    /// Rewrite every loop as new connections, numbering loops from here, even with one loop.
    pub first_loop: Option<LoopBase>,
    /// No progress bar or progress lines: the caller reports progress its own way.
    pub quiet: bool,
}

/// Everything a replay measured.
pub struct Replayed {
    pub snapshot: crate::status::Snapshot,
    pub replay: ReplayReport,
    /// The comparison report as of the end (MySQL mode, or `--report`).
    pub report: Option<crate::report::Report>,
}

/// Replays the files; returns the driver's counters and the replay's own figures.
pub fn run(
    args: &ReplayArgs,
    mirror: &MirrorSettings,
) -> Result<(crate::status::Snapshot, ReplayReport)> {
    let r = run_with(args, mirror, &RunOptions::default())?;
    Ok((r.snapshot, r.replay))
}

/// [`run`] with `opts`, keeping the comparison report.
pub fn run_with(args: &ReplayArgs, mirror: &MirrorSettings, opts: &RunOptions) -> Result<Replayed> {
    let clock = MonotonicClock::new();
    let mut source = Source::open_with(&args.files, args.port, args.loops, opts)?;
    let mut rewrite = LoopRewrite::new(args.port, args.loops > 1 || opts.first_loop.is_some());
    let mut driver = Driver::start(mirror, plan(args)?, clock.now())?;
    tracing::info!(
        "replaying {} file(s) ({}) x {} loop(s) at speed {} to {} (intercept {})",
        args.files.len(),
        human(source.total_bytes() / u64::from(args.loops)),
        args.loops,
        args.speed,
        mirror
            .target
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        mirror.first_intercept()
    );
    let mut progress = Progress::new(clock.now(), mirror.status_interval(), opts.quiet);
    // Set when the first packet is fed: the schedule starts there, not while intercept connects.
    let mut start: Option<(Instant, u64)> = None;
    let mut last_fed: Option<Instant> = None;
    let mut lateness = Duration::ZERO;
    let mut interrupted = false;
    let mut settle: Option<Settle> = None;
    let drain_limit = Duration::from_secs(mirror.drain_secs);

    loop {
        let now = clock.now();
        if !driver.poll_stop(now) {
            let mut n = 0;
            while let Some(next) = source.next {
                let (t0, first) = *start.get_or_insert((now, next.pos));
                let due = due_at(t0, first, next.pos, args.speed);
                if due > now || n >= FEED_BUDGET {
                    break;
                }
                lateness = lateness.max(now.saturating_since(due));
                source.with_next(&mut rewrite, |pkt| driver.feed(now, pkt));
                last_fed = Some(now);
                n += 1;
                if let Err(e) = source.advance() {
                    return Err(driver.fail(now, &source.stats, e));
                }
            }
            if source.next.is_none() {
                let e = driver.snapshot(&source.stats).engine;
                let settle = settle.get_or_insert_with(|| Settle::new(now));
                if settle.done(now, e.sessions_active, e.feedback_received, drain_limit) {
                    driver.begin_drain(now);
                }
            }
        } else if source.next.is_some() && !interrupted {
            interrupted = true;
        }
        if driver.pump(now) == Pump::Done {
            break;
        }
        if driver.status_due(now) {
            progress.clear();
            driver.print_status(now, &source.stats);
        }
        if progress.due(now) {
            let figures = figures(&source, args, start, now, lateness);
            progress.show(now, &figures);
        }
        let later = clock.now();
        let mut sleep = driver.next_wake(later);
        if let Some(d) = progress.next_due() {
            sleep = sleep.min(d.saturating_since(later));
        }
        if let (false, Some(next), Some((t0, first))) = (driver.is_draining(), source.next, start) {
            sleep = sleep.min(due_at(t0, first, next.pos, args.speed).saturating_since(later));
        }
        if settle.is_some() {
            sleep = sleep.min(SETTLE_SLEEP);
        }
        driver.wait(&[], sleep, true);
    }
    progress.clear();
    let end = clock.now();
    // Taken before `finish` consumes the driver; every session was reset by the drain, so
    // what they still awaited is already in the report's queue.
    let comparison = driver.report(end);
    let snap = driver.finish(&source.stats);
    let loops_done = if interrupted {
        source.loop_idx
    } else {
        source.loop_idx.min(args.loops)
    };
    let file_time = match (source.first_pos, source.last_pos) {
        (Some(f), Some(l)) => Duration::from_nanos(l - f),
        _ => Duration::ZERO,
    };
    let report = ReplayReport {
        packets: source.packets,
        files: args.files.len(),
        loops_done,
        loops: args.loops,
        speed: args.speed,
        file_time,
        feeding: match (start, last_fed) {
            (Some((t0, _)), Some(l)) => l.saturating_since(t0),
            _ => Duration::ZERO,
        },
        total: start.map_or(Duration::ZERO, |(t0, _)| end.saturating_since(t0)),
        worst_lateness: lateness,
        interrupted,
        damaged: std::mem::take(&mut source.damaged),
        other: source.other,
        unsupported_link: source.unsupported_link,
        virtual_exhausted: rewrite.exhausted,
    };
    Ok(Replayed {
        snapshot: snap,
        replay: report,
        report: comparison,
    })
}

fn figures(
    source: &Source,
    args: &ReplayArgs,
    start: Option<(Instant, u64)>,
    now: Instant,
    lateness: Duration,
) -> ProgressFigures {
    let elapsed = start.map_or(Duration::ZERO, |(t0, _)| now.saturating_since(t0));
    let schedule_left = match (source.loop_span, start) {
        (Some(span), Some((t0, first))) => {
            let total = span.saturating_mul(u64::from(args.loops));
            Some(due_at(t0, first, first.saturating_add(total), args.speed).saturating_since(now))
        }
        _ => None,
    };
    ProgressFigures {
        elapsed,
        bytes_read: source.bytes_read(),
        bytes_total: source.total_bytes(),
        loop_no: (source.loop_idx + 1).min(args.loops),
        loops: args.loops,
        packets: source.packets,
        lateness,
        schedule_left,
    }
}

/// The file time of one pass over `files` (first frame to last of their timeline), read
/// through without replaying anything: what a caller needs to know how far one loop goes.
pub fn file_time(files: &[PathBuf], port: u16) -> Result<Duration> {
    let mut source = Source::open(files, port, 1)?;
    while source.next.is_some() {
        source.advance()?;
    }
    Ok(match (source.first_pos, source.last_pos) {
        (Some(f), Some(l)) => Duration::from_nanos(l.saturating_sub(f)),
        _ => Duration::ZERO,
    })
}

/// Files that `run` found damaged, as one error for the exit status.
pub fn damage_error(report: &ReplayReport) -> Option<anyhow::Error> {
    let first = report.damaged.first()?;
    Some(anyhow::anyhow!(
        "{}: {}; everything readable before it was replayed{}",
        first.path.display(),
        first.error,
        if report.damaged.len() > 1 {
            format!(
                " ({} damaged files in all, see above)",
                report.damaged.len()
            )
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests;
