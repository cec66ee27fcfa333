//! A mirror's outputs: the status line, `--metrics` and the comparison report (`--report`, or
//! always collected in MySQL mode), set up and fed the same way whether one driver runs the
//! mirror (`driver::Driver`, live with one capture or a replay) or a coordinator sums the
//! drivers of `--workers N` (`run`).
//!
//! # What this room is for
//!
//! [`Outputs::start`] builds the report (its endpoints named after the first route) and binds
//! the metrics listener; [`Outputs::tick`] lets the report take its observations and write
//! when due or asked (SIGUSR1); [`Outputs::publish`] prints the status line and publishes the
//! metrics, each when due, from a [`Snapshot`] the owner sums; [`Outputs::finish`] writes the
//! report one last time and publishes the final counters.
//!
//! # What it must never do
//!
//! * Count anything itself: the snapshot comes from the driver(s) that own the edges.
//! * Sleep or read packets: the owner's loop decides when to call; [`Outputs::next_due`]
//!   says when something is due.

use anyhow::Result;
use common::clock::Instant;

use crate::metrics::MetricsPublisher;
use crate::report::reporting::{ReportFeed, Reporting};
use crate::settings::{MirrorSettings, Route};
use crate::signals;
use crate::status::{Snapshot, StatusLine};

/// See the module documentation.
pub struct Outputs {
    status: StatusLine,
    /// `--metrics`: re-rendered from the status snapshot when due.
    metrics: Option<MetricsPublisher>,
    /// `--report`: the comparison of both servers' answers.
    report: Option<Reporting>,
}

impl Outputs {
    /// The outputs of the mirror of `routes` with `args`, from `now`: the report (when
    /// answers are collected) and the metrics listener (bound now: a taken port is a start-up
    /// mistake to fix now).
    pub fn start(args: &MirrorSettings, routes: &[Route], now: Instant) -> Result<Self> {
        let mut report = args.collects().then(|| {
            Reporting::new(
                now,
                args.report.clone(),
                args.report_interval(),
                args.compare_results,
                args.report_literals,
                args.memory_budget().report(),
            )
        });
        if let (Some(r), None, None) = (&mut report, &args.report, &args.metrics) {
            r.totals_only();
        }
        if let Some(r) = &mut report {
            if let Some(sampler) = crate::sampling::start(args, r.started_unix_ms())? {
                r.set_resources(Box::new(move || sampler.snapshot()));
            }
        }
        if let (Some(r), Some(first)) = (&mut report, routes.first()) {
            r.set_endpoints(
                format!("{}:{}", ops::host::hostname(), first.prod_port),
                first.target.to_string(),
            );
        }
        if let (Some(r), true) = (&mut report, args.tee) {
            let calibration = args
                .ab_calibration
                .as_deref()
                .map(crate::report::ab::Calibration::read)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--ab-calibration: {e}"))?;
            r.set_tee(
                args.target.iter().map(|t| t.to_string()).collect(),
                calibration,
            );
        }
        let metrics = args
            .metrics
            .map(|addr| MetricsPublisher::start(addr, args.metrics_top_digests, now))
            .transpose()?;
        Ok(Self {
            status: StatusLine::new(now, args.status_interval()),
            metrics,
            report,
        })
    }

    /// No output at all: a capture worker of several, whose coordinator has the outputs.
    pub fn none(now: Instant) -> Self {
        Self {
            status: StatusLine::new(now, None),
            metrics: None,
            report: None,
        }
    }

    /// How the mirror's engines observe, and where their drivers put the observations.
    pub fn feed(&self) -> Option<ReportFeed> {
        self.report.as_ref().map(Reporting::feed)
    }

    /// Whether a report is kept (and so SIGUSR1 asks for a write).
    pub fn reports(&self) -> bool {
        self.report.is_some()
    }

    /// `--compare-results` turned off (an intercept that does not hash replies).
    pub fn compare_results_off(&mut self) {
        if let Some(r) = &mut self.report {
            r.set_compare_results(false);
        }
    }

    /// The report takes the observations since the last call, and writes when its interval
    /// has passed or SIGUSR1 asked.
    pub fn tick(&mut self, now: Instant) {
        if let Some(r) = &mut self.report {
            r.drain();
            r.maybe_write(now, signals::take_report_request());
        }
    }

    /// The earliest time the status line, the metrics or a report write is due.
    pub fn next_due(&self) -> Option<Instant> {
        [
            self.status.next_due(),
            self.metrics.as_ref().map(MetricsPublisher::next_due),
            self.report.as_ref().and_then(Reporting::next_due),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the status line or the `--metrics` exposition is due.
    pub fn due(&self, now: Instant) -> bool {
        self.status.due(now) || self.metrics.as_ref().is_some_and(|m| m.due(now))
    }

    /// Prints the status line and publishes the metrics, each if due, with `snap` (the
    /// mirror's counters now) and the report's figures.
    pub fn publish(&mut self, now: Instant, mut snap: Snapshot) {
        let line_due = self.status.due(now);
        if let Some(r) = &mut self.report {
            r.drain();
            // The live figures cover one status interval: taken only when the line prints.
            snap.report = Some(r.figures(now, line_due));
        }
        if line_due {
            self.status.print(now, &snap);
        }
        self.publish_metrics(now, &snap);
    }

    /// Publishes the metrics if due (a scrape before the first packet sees zeros, not an
    /// empty page).
    pub fn publish_metrics(&mut self, now: Instant, snap: &Snapshot) {
        if let Some(m) = &mut self.metrics {
            if m.due(now) {
                let report = self.report.as_ref().map(|r| r.report(now));
                m.publish(now, snap, report.as_ref());
            }
        }
    }

    /// The `--metrics` responder's address, when serving.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(MetricsPublisher::local_addr)
    }

    /// The comparison report as of `now`.
    pub fn report(&mut self, now: Instant) -> Option<crate::report::Report> {
        let r = self.report.as_mut()?;
        r.drain();
        Some(r.report(now))
    }

    /// The source failed and every session was reset: the report is written (what they still
    /// awaited is in its queue now) and its figures added to `snap`, for the summary.
    pub fn fail(&mut self, now: Instant, snap: &mut Snapshot) {
        if let Some(r) = &mut self.report {
            r.write(now);
            snap.report = Some(r.figures(now, false));
        }
    }

    /// The end: the report written once more and its figures added to `snap`; the last
    /// exposition published equals the summary's counters (a scrape racing the exit sees the
    /// final values).
    pub fn finish(&mut self, now: Instant, snap: &mut Snapshot) {
        let mut report = None;
        if let Some(r) = &mut self.report {
            // Every session was reset by the drain: what they still awaited is in the queue.
            r.write(now);
            snap.report = Some(r.figures(now, false));
            report = Some(r.report(now));
        }
        if let Some(m) = &mut self.metrics {
            m.publish(Instant::default(), snap, report.as_ref());
        }
    }
}
