//! `copier record`: writes the client<->server traffic of a production port to pcapng files, to
//! replay later (`copier replay`) against as many candidate test servers as needed.
//!
//! # What this room is for
//!
//! It captures both directions of `--port` (full frames, nanosecond timestamps) and writes them
//! with [`PcapngWriter`], rotating files by size and keeping disk use bounded. Every file is a
//! valid capture up to its last complete block at all times that matter: on rotation, at exit,
//! and after a failed write (a full disk), where the file is cut back to the last block that
//! was written whole.
//!
//! # What it must never do
//!
//! * Send anything, or touch the traffic: it only observes.
//! * Overwrite an existing file (a previous capture may be all a user has of an incident).
//! * Grow past `--max-disk` / `--max-files`, or hold more than about a megabyte of frames in
//!   memory.
//!
//! # File names
//!
//! Without `--rotate-size`, everything goes to `--output` exactly. With it, files are numbered
//! from 0 before the extension: `cap.pcapng` gives `cap.000000.pcapng`, `cap.000001.pcapng`,
//! ... so that `copier replay cap.*.pcapng` (a shell glob sorts by name) replays them in order.
//! `--max-files` / `--max-disk` delete the oldest files of this run, never other files.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::clock::MonotonicClock;

use crate::capture::{CaptureStats, LiveCapture};
use crate::pcapfile::{PcapngWriter, WriteFailure};
use crate::signals;
use crate::waker::wait_readable;

/// Records the client<->server traffic of a production port to pcapng files.
///
/// Runs on the production host (needs root or CAP_NET_RAW + CAP_NET_ADMIN to capture). Stops on
/// SIGINT/SIGTERM (Ctrl-C), after --duration, at --max-disk without rotation, or when the disk
/// is full; in every case the files written are valid captures that `copier replay`, tcpdump and
/// Wireshark read.
///
/// With --rotate-size, files are numbered before the extension: --output cap.pcapng writes
/// cap.000000.pcapng, cap.000001.pcapng, ... (replay them in order with
/// `copier replay cap.*.pcapng`).
#[derive(Parser, Debug, Clone)]
#[command(name = "copier record", bin_name = "copier record", version)]
pub struct RecordArgs {
    /// Production port whose traffic (both directions) is recorded.
    #[arg(long, default_value_t = 3306)]
    pub port: u16,

    /// The pcapng file to write; it must not exist yet (with --rotate-size: the name the
    /// numbered files are derived from).
    #[arg(long, short = 'o')]
    pub output: PathBuf,

    /// Capture interface ("any" captures on all interfaces of this host).
    #[arg(long, default_value = "any")]
    pub interface: String,

    /// Start a new file when the current one reaches this size, e.g. 100M or 1G (K, M, G, T:
    /// powers of 1024; at least 1M).
    #[arg(long, value_parser = parse_size)]
    pub rotate_size: Option<u64>,

    /// With --rotate-size: keep at most this many files, deleting the oldest of this run.
    #[arg(long, requires = "rotate_size", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_files: Option<u32>,

    /// Most disk space the files of this run may use, e.g. 10G. With --rotate-size the oldest
    /// files are deleted to stay under it; without, recording stops when the file reaches it.
    #[arg(long, value_parser = parse_size)]
    pub max_disk: Option<u64>,

    /// Stop after this many seconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,

    /// Seconds between status lines (0: none).
    #[arg(long, default_value_t = 5)]
    pub status_interval: u64,

    /// Kernel capture buffer, in MiB.
    #[arg(long, default_value_t = 64)]
    pub capture_buffer_mb: u32,
}

impl RecordArgs {
    pub fn validate(&self) -> Result<()> {
        if let Some(size) = self.rotate_size {
            if size < 1 << 20 {
                bail!("--rotate-size {size} is below the 1M minimum (one frame can be 256 KiB)");
            }
            if self.max_disk.is_some_and(|d| d < size) {
                bail!("--max-disk must be at least --rotate-size (a whole file has to fit)");
            }
        }
        if self.max_disk.is_some_and(|d| d < 1 << 20) {
            bail!("--max-disk is below the 1M minimum");
        }
        if self.output.as_os_str().is_empty() || self.output.file_name().is_none() {
            bail!("--output needs a file name, e.g. /var/tmp/peak.pcapng");
        }
        Ok(())
    }

    /// Both directions of the port, as the live copier captures it (there is no target to
    /// exclude: record sends nothing).
    pub fn capture_filter(&self) -> String {
        format!("tcp and (dst port {p} or src port {p})", p = self.port)
    }
}

/// Parses `100M`, `1G`, `512K`, `1048576` (bytes); K, M, G, T are powers of 1024, an optional
/// trailing `B` or `iB` is accepted.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s:?}: unknown unit {c:?} (use K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 100M, 1G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Why recording ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
    /// `--max-disk` reached without rotation.
    MaxDisk,
}

/// What a recording did, for the summary.
#[derive(Debug, Default)]
pub struct RecordSummary {
    /// Frames in the files written (kept or since deleted).
    pub frames: u64,
    /// Bytes of the files written (kept or since deleted).
    pub bytes: u64,
    pub capture: CaptureStats,
    /// Files kept, oldest first, with their size and frame count.
    pub files: Vec<(PathBuf, u64, u64)>,
    pub files_deleted: u64,
    pub elapsed: Duration,
    pub stop: Option<StopReason>,
}

impl RecordSummary {
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "copier record summary after {:.1} s{}",
            self.elapsed.as_secs_f64(),
            match self.stop {
                Some(StopReason::Signal) => " (stopped by signal)",
                Some(StopReason::Duration) => " (--duration reached)",
                Some(StopReason::MaxDisk) => " (--max-disk reached)",
                None => "",
            }
        );
        let _ = writeln!(
            out,
            "  captured: {} frames, {} written ({}); {} kernel drops; {} frames longer than the snap length",
            self.capture.frames,
            self.frames,
            human(self.bytes),
            self.capture.kernel_dropped + self.capture.if_dropped,
            self.capture.snapped
        );
        let _ = writeln!(
            out,
            "  files ({} kept{}):",
            self.files.len(),
            if self.files_deleted > 0 {
                format!(
                    ", {} oldest deleted for --max-files/--max-disk",
                    self.files_deleted
                )
            } else {
                String::new()
            }
        );
        for (path, size, frames) in &self.files {
            let _ = writeln!(
                out,
                "    {}  {}  {frames} frames",
                path.display(),
                human(*size)
            );
        }
        out
    }
}

/// `12.3 MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The name of file number `seq` when rotating: the sequence goes before the extension.
pub fn rotated_name(base: &Path, seq: u64) -> PathBuf {
    let stem = base.file_stem().map(|s| s.to_string_lossy().into_owned());
    let ext = base.extension().map(|e| e.to_string_lossy().into_owned());
    let name = match (stem, ext) {
        (Some(stem), Some(ext)) => format!("{stem}.{seq:06}.{ext}"),
        (Some(stem), None) => format!("{stem}.{seq:06}"),
        _ => format!("capture.{seq:06}.pcapng"),
    };
    base.with_file_name(name)
}

/// The files of one recording: the one being written and those kept from before.
struct Files {
    base: PathBuf,
    rotate_size: Option<u64>,
    max_files: Option<u32>,
    max_disk: Option<u64>,
    seq: u64,
    current: Option<(PathBuf, PcapngWriter<File>)>,
    /// Closed files of this run, oldest first: (path, size, frames).
    closed: VecDeque<(PathBuf, u64, u64)>,
    deleted: u64,
    /// Frames and bytes of the files deleted.
    deleted_frames: u64,
    deleted_bytes: u64,
    /// Frames handed to the writer, for the status line.
    frames: u64,
    bytes: u64,
}

/// What writing one frame led to.
enum Written {
    Ok,
    /// `--max-disk` without rotation: the frame was not written, recording ends.
    MaxDisk,
}

impl Files {
    fn new(args: &RecordArgs) -> Self {
        Self {
            base: args.output.clone(),
            rotate_size: args.rotate_size,
            max_files: args.max_files,
            max_disk: args.max_disk,
            seq: 0,
            current: None,
            closed: VecDeque::new(),
            deleted: 0,
            deleted_frames: 0,
            deleted_bytes: 0,
            frames: 0,
            bytes: 0,
        }
    }

    fn open_next(&mut self) -> Result<()> {
        let path = match self.rotate_size {
            Some(_) => rotated_name(&self.base, self.seq),
            None => self.base.clone(),
        };
        self.seq += 1;
        self.make_room()?;
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    anyhow::anyhow!(
                        "{} already exists: record never overwrites a capture; move it away or \
                         choose another --output",
                        path.display()
                    )
                } else {
                    anyhow::anyhow!("cannot create {}: {e}", path.display())
                }
            })?;
        tracing::info!("writing {}", path.display());
        self.current = Some((path, PcapngWriter::new(file)));
        Ok(())
    }

    /// Deletes the oldest files of this run so that one more file fits the limits.
    fn make_room(&mut self) -> Result<()> {
        loop {
            let kept: u64 = self.closed.iter().map(|(_, size, _)| size).sum();
            let too_many = self
                .max_files
                .is_some_and(|m| self.closed.len() + 1 > m as usize);
            let too_big = match (self.max_disk, self.rotate_size) {
                (Some(max), Some(size)) => kept + size > max,
                _ => false,
            };
            if !(too_many || too_big) {
                return Ok(());
            }
            let Some((path, size, frames)) = self.closed.pop_front() else {
                return Ok(());
            };
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot delete the oldest file {}", path.display()))?;
            self.deleted += 1;
            self.deleted_frames += frames;
            self.deleted_bytes += size;
            tracing::info!("deleted {} (beyond --max-files/--max-disk)", path.display());
        }
    }

    fn write(&mut self, ts_ns: u64, link: u16, data: &[u8], orig_len: u32) -> Result<Written> {
        // EPB: 32 bytes of header and trailer plus the padded data.
        let block = 32 + ((data.len().min(crate::pcapfile::SNAPLEN as usize) as u64 + 3) & !3);
        if self.current.is_none() {
            self.open_next()?;
        }
        let len = self.current.as_ref().map_or(0, |(_, w)| w.len());
        if self.rotate_size.is_none() && self.max_disk.is_some_and(|m| len + block > m) {
            return Ok(Written::MaxDisk);
        }
        if let Some(size) = self.rotate_size {
            let has_frames = self.current.as_ref().is_some_and(|(_, w)| w.frames() > 0);
            if has_frames && len + block > size {
                self.close_current()?;
                self.open_next()?;
            }
        }
        let Some((path, w)) = self.current.as_mut() else {
            bail!("no output file open");
        };
        if let Err(e) = w.write_frame(ts_ns, link, data, orig_len) {
            return Err(cut_back(path, w, e));
        }
        self.frames += 1;
        self.bytes += block;
        Ok(Written::Ok)
    }

    /// Hands pending blocks to the kernel, so a crash loses at most the last second.
    fn flush(&mut self) -> Result<()> {
        if let Some((path, w)) = self.current.as_mut() {
            if let Err(e) = w.flush() {
                return Err(cut_back(path, w, e));
            }
        }
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        let Some((path, mut w)) = self.current.take() else {
            return Ok(());
        };
        if let Err(e) = w.flush() {
            let err = cut_back(&path, &w, e);
            self.closed.push_back((path, w.committed(), w.frames()));
            return Err(err);
        }
        // Durable before the next file starts: rotation is where a user may pick files up.
        let _ = w.get_ref().sync_data();
        self.closed.push_back((path, w.committed(), w.frames()));
        Ok(())
    }

    fn current_name(&self) -> String {
        self.current.as_ref().map_or_else(
            || "(none yet)".into(),
            |(p, w)| format!("{} ({})", p.display(), human(w.len())),
        )
    }
}

/// After a failed write: cuts the file back to its last complete block so it stays a valid
/// capture, and explains what happened and what to do.
fn cut_back(path: &Path, w: &PcapngWriter<File>, e: WriteFailure) -> anyhow::Error {
    let cut = w.get_ref().set_len(e.committed);
    let full = e.source.raw_os_error() == Some(libc::ENOSPC)
        || e.source.raw_os_error() == Some(libc::EDQUOT);
    let what = if full {
        "the disk is full".to_string()
    } else {
        format!("write failed: {}", e.source)
    };
    let kept = match cut {
        Ok(()) => format!(
            "it keeps {} frames ({}) and ends at its last complete block",
            w.frames(),
            human(e.committed)
        ),
        Err(c) => format!(
            "cutting it back to its last complete block ({} bytes) failed too ({c}); readers stop at the damaged tail",
            e.committed
        ),
    };
    let fix = if full {
        "free space (or record with --rotate-size and --max-disk) and start again"
    } else {
        "check the file system and start again"
    };
    anyhow::anyhow!(
        "{what} writing {}: {kept}; {} frames were not written. Recording stopped; {fix}",
        path.display(),
        e.frames_lost
    )
}

/// Frames read from the capture before the loop looks at the clock again.
const CAPTURE_BUDGET: usize = 1024;
/// Pending frames reach the kernel at least this often.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Longest sleep, so a signal or --duration is noticed in time.
const MAX_SLEEP: Duration = Duration::from_millis(200);

/// Records until a stop condition. On a write error the files are left valid and the error
/// (after the summary is printed) is returned.
pub fn run(args: &RecordArgs) -> Result<RecordSummary> {
    let clock = MonotonicClock::new();
    let started = clock.now();
    let filter = args.capture_filter();
    let buffer = i32::try_from(u64::from(args.capture_buffer_mb) << 20).unwrap_or(i32::MAX);
    let mut capture = LiveCapture::open_nanos(&args.interface, &filter, buffer)?;
    let link = capture.link_type_number();
    let mut files = Files::new(args);
    // Created now, so a bad path or an existing file fails before anything is captured.
    files.open_next()?;
    tracing::info!(
        "recording port {} on {} (link type {link}), filter: {filter}",
        args.port,
        args.interface
    );
    let status_every =
        (args.status_interval > 0).then(|| Duration::from_secs(args.status_interval));
    let mut next_status = status_every.map(|i| started + i);
    let mut next_flush = started + FLUSH_EVERY;
    let deadline = args.duration.map(|s| started + Duration::from_secs(s));
    let mut last_status = (started, 0u64);

    let stop = loop {
        let now = clock.now();
        if signals::stop_requested() {
            break StopReason::Signal;
        }
        if deadline.is_some_and(|d| now >= d) {
            break StopReason::Duration;
        }
        match drain(&mut capture, &mut files, link, CAPTURE_BUDGET) {
            Ok((_, Some(stop))) => break stop,
            Ok((_, None)) => {}
            Err(e) => return Err(fail(files, &mut capture, clock.now() - started, e)),
        }
        if now >= next_flush {
            if let Err(e) = files.flush() {
                return Err(fail(files, &mut capture, now - started, e));
            }
            next_flush = now + FLUSH_EVERY;
        }
        if let (Some(due), Some(every)) = (next_status, status_every) {
            if now >= due {
                capture.refresh_kernel_stats();
                let secs = (now - last_status.0).as_secs_f64().max(1e-3);
                tracing::info!(
                    "recorded {} frames ({:.0}/s), {}; kernel drops {}; file {}",
                    files.frames,
                    (files.frames - last_status.1) as f64 / secs,
                    human(files.bytes),
                    capture.stats.kernel_dropped + capture.stats.if_dropped,
                    files.current_name()
                );
                last_status = (now, files.frames);
                next_status = Some(now + every);
            }
        }
        let mut sleep = MAX_SLEEP.min(next_flush.saturating_since(clock.now()));
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_since(clock.now()));
        }
        wait_readable(&[capture.as_raw_fd()], sleep);
    };
    // What the kernel already holds was captured before the stop: keep it (bounded, so a
    // flood cannot keep us from exiting).
    if stop != StopReason::MaxDisk {
        for _ in 0..64 {
            match drain(&mut capture, &mut files, link, CAPTURE_BUDGET) {
                Ok((n, None)) if n > 0 => {}
                Ok(_) => break,
                Err(e) => return Err(fail(files, &mut capture, clock.now() - started, e)),
            }
        }
    }
    if let Err(e) = files.close_current() {
        return Err(fail(files, &mut capture, clock.now() - started, e));
    }
    capture.refresh_kernel_stats();
    if stop == StopReason::MaxDisk {
        tracing::warn!(
            "--max-disk reached: recording stopped (use --rotate-size to keep recording into \
             rotated files, oldest deleted)"
        );
    }
    Ok(summary(&files, &capture, clock.now() - started, Some(stop)))
}

/// Writes what the capture holds (at most `budget` frames): how many were read, and `Some`
/// when recording must stop.
fn drain(
    capture: &mut LiveCapture,
    files: &mut Files,
    link: u16,
    budget: usize,
) -> Result<(usize, Option<StopReason>)> {
    let mut stop = None;
    let n = capture.drain_frames(budget, |f| {
        if stop.is_some() {
            return Ok(());
        }
        if let Written::MaxDisk = files.write(f.ts_ns, link, f.data, f.orig_len)? {
            stop = Some(StopReason::MaxDisk);
        }
        Ok(())
    })?;
    Ok((n, stop))
}

fn summary(
    files: &Files,
    capture: &LiveCapture,
    elapsed: Duration,
    stop: Option<StopReason>,
) -> RecordSummary {
    let mut kept: Vec<(PathBuf, u64, u64)> = files.closed.iter().cloned().collect();
    if let Some((p, w)) = &files.current {
        kept.push((p.clone(), w.committed(), w.frames()));
    }
    RecordSummary {
        frames: files.deleted_frames + kept.iter().map(|k| k.2).sum::<u64>(),
        bytes: files.deleted_bytes + kept.iter().map(|k| k.1).sum::<u64>(),
        capture: capture.stats,
        files: kept,
        files_deleted: files.deleted,
        elapsed,
        stop,
    }
}

/// Prints the summary of what was kept, then hands back the error.
fn fail(
    mut files: Files,
    capture: &mut LiveCapture,
    elapsed: Duration,
    e: anyhow::Error,
) -> anyhow::Error {
    // The file that failed was already cut back; other errors (capture) still close it cleanly.
    if let Some((path, w)) = files.current.take() {
        let _ = w.get_ref().set_len(w.committed());
        files.closed.push_back((path, w.committed(), w.frames()));
    }
    capture.refresh_kernel_stats();
    eprint!("{}", summary(&files, capture, elapsed, None).render());
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        assert!(parse_size("10X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn rotated_names_sort_in_order() {
        let base = Path::new("/var/tmp/peak.pcapng");
        assert_eq!(
            rotated_name(base, 0),
            Path::new("/var/tmp/peak.000000.pcapng")
        );
        assert_eq!(
            rotated_name(base, 12),
            Path::new("/var/tmp/peak.000012.pcapng")
        );
        assert_eq!(rotated_name(Path::new("cap"), 3), Path::new("cap.000003"));
        assert!(rotated_name(base, 9) < rotated_name(base, 10));
    }

    fn args(dir: &Path, extra: &[&str]) -> RecordArgs {
        let out = dir.join("cap.pcapng");
        let mut argv = vec!["copier record", "--output", out.to_str().unwrap()];
        argv.extend(extra);
        RecordArgs::parse_from(argv)
    }

    fn tempdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("tcpshadow-record-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn read_frames(path: &Path) -> Vec<u64> {
        let f = std::io::BufReader::new(File::open(path).unwrap());
        let mut r = crate::pcapfile::CaptureReader::new(f).unwrap();
        let mut ts = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            ts.push(f.ts_ns);
        }
        ts
    }

    #[test]
    fn rotation_keeps_the_newest_files_within_max_files() {
        let dir = tempdir("rotate");
        let a = args(&dir, &["--rotate-size", "1M", "--max-files", "2"]);
        a.validate().unwrap();
        let mut files = Files::new(&a);
        let frame = vec![0u8; 100_000];
        for i in 0..40u64 {
            assert!(matches!(
                files.write(i, 113, &frame, 100_000).unwrap(),
                Written::Ok
            ));
        }
        files.close_current().unwrap();
        let kept: Vec<PathBuf> = files.closed.iter().map(|(p, _, _)| p.clone()).collect();
        assert_eq!(kept.len(), 2);
        assert_eq!(files.deleted, 2, "40 frames of 100 kB: 4 files of 1 MiB");
        assert!(!rotated_name(&a.output, 0).exists());
        assert_eq!(kept[1], rotated_name(&a.output, 3));
        let mut all = read_frames(&kept[0]);
        all.extend(read_frames(&kept[1]));
        assert_eq!(all, (20..40).collect::<Vec<_>>());
        for (path, size, _) in &files.closed {
            assert!(*size <= 1 << 20);
            assert_eq!(std::fs::metadata(path).unwrap().len(), *size);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn max_disk_without_rotation_stops_and_existing_files_are_kept() {
        let dir = tempdir("maxdisk");
        let a = args(&dir, &["--max-disk", "1M"]);
        let mut files = Files::new(&a);
        let frame = vec![0u8; 100_000];
        let mut written = 0;
        while let Written::Ok = files.write(written, 1, &frame, 100_000).unwrap() {
            written += 1;
        }
        assert_eq!(written, 10);
        files.close_current().unwrap();
        assert_eq!(read_frames(&a.output).len(), 10);
        assert!(std::fs::metadata(&a.output).unwrap().len() <= 1 << 20);
        let mut again = Files::new(&a);
        let err = again.open_next().unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn validation() {
        let dir = std::env::temp_dir();
        assert!(args(&dir, &["--rotate-size", "10K"]).validate().is_err());
        assert!(args(&dir, &["--rotate-size", "10M", "--max-disk", "5M"])
            .validate()
            .is_err());
        assert!(
            RecordArgs::try_parse_from(["copier record", "-o", "x", "--max-files", "3"]).is_err()
        );
        assert_eq!(
            args(&dir, &["--port", "3307"]).capture_filter(),
            "tcp and (dst port 3307 or src port 3307)"
        );
    }
}
