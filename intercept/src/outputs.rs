//! intercept's outputs: the status line and `--metrics`, set up and fed the same way whether
//! one capture thread reports through `pump::run`'s callback or a coordinator sums the capture
//! threads of `--workers N` (both wired in `daemon`).
//!
//! # What this room is for
//!
//! [`Metrics::bind`] opens the `--metrics` listener (at start, before the control server: a
//! taken port is a start-up mistake to fix now); [`Outputs::new`] starts the status line's
//! and the metrics' clocks when the loop starts; [`Outputs::observe`] publishes the metrics
//! and logs the status line, each when due, from a [`Status`] its owner built (one pump's, or
//! the workers' sum); [`Outputs::finish`] publishes the final counters and logs the summary.
//!
//! # What it must never do
//!
//! * Count anything itself: the status comes from the pump(s) and the control server.
//! * Sleep or pace a loop: its owner calls it, a pump every [`Outputs::report_interval`] or a
//!   coordinator every tick ([`Pacing`]).
//!
//! Its log lines keep the binary's target (`intercept`), as when this wiring was in main.rs.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tcpshadow_metrics::{MetricsServer, Published};

use crate::metrics::render_intercept_metrics;
use crate::pump::Status;
use crate::signals;

/// How often `--metrics` is refreshed.
pub const METRICS_INTERVAL: Duration = Duration::from_secs(1);
/// A report a few milliseconds early still prints its status line (reports come every
/// second, so without slack a 5 s line could slip to 6 s).
const LINE_SLACK: Duration = Duration::from_millis(100);

/// The `--metrics` responder, serving what [`Outputs`] publishes.
pub struct Metrics {
    published: Published,
    /// Kept for as long as the responder thread must serve.
    _server: MetricsServer,
}

impl Metrics {
    /// Binds `--metrics` (`None`: not asked for) and says where it serves.
    pub fn bind(addr: Option<SocketAddr>) -> anyhow::Result<Option<Self>> {
        let Some(addr) = addr else {
            return Ok(None);
        };
        let published = Published::new();
        let server = tcpshadow_metrics::serve(addr, published.clone(), "intercept-metrics")
            .with_context(|| format!("--metrics {addr}: cannot listen"))?;
        tracing::info!(target: "intercept", "metrics on http://{}/metrics", server.local_addr());
        Ok(Some(Self {
            published,
            _server: server,
        }))
    }

    fn publish(&self, status: &Status) {
        self.published.set(render_intercept_metrics(status));
    }
}

/// Who calls [`Outputs::observe`], and so how often the metrics are published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pacing {
    /// The one capture thread's pump, every [`Outputs::report_interval`]: each call publishes
    /// the metrics (the interval is theirs when they are served).
    Pump,
    /// A coordinator's tick, more often than the metrics: they are published every
    /// [`METRICS_INTERVAL`].
    Tick,
}

/// See the module documentation.
pub struct Outputs {
    metrics: Option<Metrics>,
    /// `--status-interval` (`None`: no status line).
    status_interval: Option<Duration>,
    pacing: Pacing,
    last_line: Instant,
    last_metrics: Instant,
}

impl Outputs {
    /// The outputs from now: `metrics` as bound at start, a status line every
    /// `status_interval_secs` (0: none), observed as `pacing` says.
    pub fn new(metrics: Option<Metrics>, status_interval_secs: u64, pacing: Pacing) -> Self {
        let now = Instant::now();
        Self {
            metrics,
            status_interval: (status_interval_secs > 0)
                .then(|| Duration::from_secs(status_interval_secs)),
            pacing,
            last_line: now,
            last_metrics: now,
        }
    }

    /// How often a pump paced by these outputs must report: with `--metrics` every second
    /// (each report publishes them and logs the status line only when its own interval has
    /// passed), else at the status line's interval.
    pub fn report_interval(&self) -> Option<Duration> {
        match (&self.metrics, self.status_interval) {
            (Some(_), Some(i)) => Some(i.min(METRICS_INTERVAL)),
            (Some(_), None) => Some(METRICS_INTERVAL),
            (None, i) => i,
        }
    }

    /// Whether `--metrics` is served.
    pub fn serves_metrics(&self) -> bool {
        self.metrics.is_some()
    }

    /// Publishes `status` as the metrics now (e.g. before the first report: a scrape then
    /// sees zeros, not an empty page).
    pub fn publish_metrics(&self, status: &Status) {
        if let Some(m) = &self.metrics {
            m.publish(status);
        }
    }

    /// The counters now: published as the metrics and logged as the status line, each when
    /// due.
    pub fn observe(&mut self, status: &Status) {
        if let Some(m) = &self.metrics {
            let due = match self.pacing {
                Pacing::Pump => true,
                Pacing::Tick => self.last_metrics.elapsed() >= METRICS_INTERVAL,
            };
            if due {
                m.publish(status);
                self.last_metrics = Instant::now();
            }
        }
        if self
            .status_interval
            .is_some_and(|i| self.last_line.elapsed() + LINE_SLACK >= i)
        {
            tracing::info!(target: "intercept", "status: {status}");
            self.last_line = Instant::now();
        }
    }

    /// The end: the final counters published (a scrape racing the exit sees them) and logged,
    /// and whether a signal stopped the daemon.
    pub fn finish(&self, summary: &Status) {
        self.publish_metrics(summary);
        tracing::info!(target: "intercept", "final: {summary}");
        if signals::STOP.load(Ordering::Relaxed) {
            tracing::info!(target: "intercept", "stopped by signal");
        }
    }
}
