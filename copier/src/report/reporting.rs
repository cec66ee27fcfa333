//! The driver's side of the comparison report: drains what the transforms observed into the
//! [`Collector`], and writes the report files when asked (`--report DIR`: at the end, on
//! SIGUSR1, every `--report-interval`).
//!
//! This is an I/O edge (it writes files and reads the wall clock for the report's dates); the
//! collecting itself stays pure in [`collect`](super::collect).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::clock::Instant;

use super::ab::Calibration;
use super::collect::{Collector, CollectorConfig, LiveFigures, ReportMeta};
use super::divergence::Divergent;
use super::model::{Report, Totals};
use super::observe::Observation;
use super::sink::ObservationSink;
use crate::mysql::ReportHooks;

/// Bytes one digest group may take at most: two latency histograms grown to every bucket
/// (41 x 8 x 8 bytes each), its statement's shape and example (1 KiB), its error maps and
/// [`CollectorConfig::max_mismatch_examples`] examples of about 1 KiB each; rounded up.
const DIGEST_BYTES: usize = 12 << 10;

/// The observation queue's length and the collector's bounds that fit `memory` bytes: a
/// quarter for the queue, half for the digest groups, the rest for the series and the
/// rendering of a report. Never more than the defaults (65,536 queued, 10,000 digests).
pub fn bounds_for(memory: usize) -> (usize, CollectorConfig) {
    let per_obs = std::mem::size_of::<crate::report::observe::Observation>() + 64;
    let queue = (memory / 4 / per_obs).clamp(1024, QUEUE);
    let defaults = CollectorConfig::default();
    let config = CollectorConfig {
        max_digests: (memory / 2 / DIGEST_BYTES).clamp(64, defaults.max_digests),
        ..defaults
    };
    (queue, config)
}

/// Observations queued between two drains (the driver drains after every batch of packets;
/// at 100k commands/s that is far more than a batch).
const QUEUE: usize = 1 << 16;

/// The test servers' resource timelines as of now (see [`Reporting::set_resources`]).
pub type ResourceSource = Box<dyn Fn() -> Vec<super::resources::TargetResources> + Send>;

/// What the status line and the summary show of the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportFigures {
    /// Since the previous status line.
    pub live: LiveFigures,
    pub totals: Totals,
    /// Observations lost because the queue was full.
    pub dropped: u64,
    /// Where the report is written, if anywhere.
    pub dir: Option<PathBuf>,
    /// Commands the test server did not run as production did, by kind and reason.
    pub divergence: Vec<Divergent>,
}

/// What a driver needs to feed the report: how its transforms observe, and the queue it moves
/// its engines' observations into (`Fleet::poll_observation`) after every batch.
#[derive(Clone, Debug)]
pub struct ReportFeed {
    pub hooks: ReportHooks,
    pub sink: Arc<ObservationSink>,
}

/// See the module documentation.
pub struct Reporting {
    sink: Arc<ObservationSink>,
    hooks: ReportHooks,
    collector: Collector,
    meta: ReportMeta,
    dir: Option<PathBuf>,
    interval: Option<Duration>,
    next_write: Option<Instant>,
    scratch: Vec<Observation>,
    live: LiveFigures,
    writes: u64,
    /// `--ab-calibration`: the noise bands test A vs test B is judged against.
    calibration: Option<Calibration>,
    /// `--target-metrics`/`--target-sql-metrics`: the latest of the test servers' resource
    /// timelines (the sampler's thread fills it; this room never knows how).
    resources: Option<ResourceSource>,
}

impl Reporting {
    /// `now` is the start of the run on the driver's clock; `dir` where files go (none: the
    /// report only feeds `--metrics` and the status line).
    /// `memory`: the report's part of `--max-memory`, bytes (see [`bounds_for`]).
    pub fn new(
        now: Instant,
        dir: Option<PathBuf>,
        interval: Option<Duration>,
        compare_results: bool,
        literals: bool,
        memory: usize,
    ) -> Self {
        let (queue, config) = bounds_for(memory);
        let sink = ObservationSink::new(queue);
        let started_unix_ms = unix_ms();
        Self {
            hooks: ReportHooks {
                compare_results,
                literals,
            },
            sink,
            collector: Collector::new(config, now),
            meta: ReportMeta {
                generated_unix_ms: started_unix_ms,
                started_unix_ms,
                copier_version: env!("CARGO_PKG_VERSION").to_string(),
                prod: String::new(),
                target: String::new(),
                compare_results,
                literals,
                tee_targets: Vec::new(),
            },
            next_write: interval.filter(|_| dir.is_some()).map(|i| now + i),
            dir,
            interval,
            scratch: Vec::new(),
            live: LiveFigures::default(),
            writes: 0,
            calibration: None,
            resources: None,
        }
    }

    /// What a driver needs to make observing transforms and hand their observations in.
    pub fn feed(&self) -> ReportFeed {
        ReportFeed {
            hooks: self.hooks,
            sink: Arc::clone(&self.sink),
        }
    }

    /// Names what was mirrored where, for the report's header.
    pub fn set_endpoints(&mut self, prod: String, target: String) {
        self.meta.prod = prod;
        self.meta.target = target;
    }

    /// `--tee`: keeps each target's answers apart and compares the first two, against
    /// `calibration`'s noise bands if given.
    pub fn set_tee(&mut self, targets: Vec<String>, calibration: Option<Calibration>) {
        self.collector.set_tee(targets.len());
        self.meta.tee_targets = targets;
        self.calibration = calibration;
    }

    /// Neither a report file nor a metrics page: see [`Collector::totals_only`].
    pub fn totals_only(&mut self) {
        self.collector.totals_only();
    }

    /// When the run's timeline starts (the resource sampler's zero).
    pub fn started_unix_ms(&self) -> u64 {
        self.meta.started_unix_ms
    }

    /// Where the report takes each test server's resources from, when they are sampled.
    pub fn set_resources(&mut self, source: ResourceSource) {
        self.resources = Some(source);
    }

    /// Result checksums cannot be compared after all (intercept did not grant payload hashes).
    pub fn set_compare_results(&mut self, on: bool) {
        self.meta.compare_results = on;
    }

    /// Moves what the transforms observed into the collector.
    pub fn drain(&mut self) {
        self.sink.drain_into(&mut self.scratch);
        for o in self.scratch.drain(..) {
            self.collector.observe(&o);
        }
        if self.scratch.capacity() > QUEUE {
            self.scratch = Vec::new();
        }
    }

    /// When the next periodic write is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.next_write
    }

    /// Writes the report if `--report-interval` says so or `requested` (SIGUSR1).
    pub fn maybe_write(&mut self, now: Instant, requested: bool) {
        let due = self.next_write.is_some_and(|t| now >= t);
        if !(due || requested) {
            return;
        }
        if let Some(i) = self.interval {
            self.next_write = Some(now + i);
        }
        if self.dir.is_none() {
            tracing::info!("SIGUSR1: no --report DIR to write the report to");
            return;
        }
        self.write(now);
    }

    /// Writes the report files now (the final report at exit).
    pub fn write(&mut self, now: Instant) {
        self.drain();
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let report = self.report(now);
        match super::write_report(&dir, &report) {
            Ok(()) => {
                self.writes += 1;
                tracing::info!(
                    "report written to {} ({} digests, {} commands, {} compared, {} mismatches, \
                     {} test errors)",
                    dir.display(),
                    report.digests.len(),
                    report.totals.commands,
                    report.totals.compared,
                    report.totals.row_mismatches + report.totals.result_mismatches,
                    report.totals.test_errors
                );
            }
            Err(e) => tracing::warn!("cannot write the report: {e}"),
        }
    }

    /// The report as of `now`.
    pub fn report(&self, now: Instant) -> Report {
        let mut meta = self.meta.clone();
        meta.generated_unix_ms = unix_ms();
        let mut report = self.collector.report(now, &meta);
        report.ab = super::ab::compare(&report, 0, 1, self.calibration.as_ref());
        if let Some(source) = &self.resources {
            report.resources = source();
        }
        report
    }

    /// Figures for the status line; `live` covers the time since the previous call.
    pub fn figures(&mut self, now: Instant, take_live: bool) -> ReportFigures {
        if take_live {
            self.live = self.collector.take_live(now);
        }
        ReportFigures {
            live: self.live,
            totals: self.collector.totals().clone(),
            dropped: self.sink.dropped(),
            dir: self.dir.clone(),
            divergence: self.collector.divergence().rows(),
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
