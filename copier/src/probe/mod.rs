//! `copier probe`: a capacity probe. Replays a recording onto the test server at rising load,
//! step by step, until a limit is crossed, narrows the knee, and reports the highest load the
//! test server sustained, its latencies, the limit that stopped it and the digests that
//! degraded first.
//!
//! # What this room is for
//!
//! * [`args`]: the command line and its checks.
//! * [`plan`]: which load factor each step runs at and the knee search (pure).
//! * [`limits`]: what a step measured and which limit it crossed against step 1 (pure).
//! * [`run`]: the steps themselves, each one `copier replay` run in-process
//!   ([`crate::replay::run_with`]) with a fresh driver and report.
//! * [`render`]: the progress line, probe.txt and probe.html (pure).
//!
//! # What it must never do
//!
//! * Hold its own replay loop, TCP or protocol logic: a step is a replay.
//! * Talk to the test host for its resources itself: a host CPU figure comes from the
//!   node_exporter sampler (`--target-metrics`) through [`run`]'s hook, or is "not measured".
//! * Panic on what a recording holds: the figures it reads are guarded in [`limits`].

use std::path::PathBuf;

use serde::Serialize;

pub mod args;
pub mod limits;
pub mod plan;
pub mod render;
pub mod run;

pub use args::ProbeArgs;

use limits::{Crossed, DigestStep, StepMeasure, Thresholds};
use plan::Phase;

/// One step as run and judged.
#[derive(Clone, Debug, Serialize)]
pub struct StepResult {
    /// 1-based, in the order run.
    pub number: usize,
    pub phase: Phase,
    /// speed x multiply.
    pub factor: f64,
    pub speed: f64,
    pub multiply: u32,
    pub measure: StepMeasure,
    /// The top digests' p99 over step 1's (floored: see `Thresholds::p99_floor_us`).
    pub p99_ratio: f64,
    /// The limits crossed; empty: passed.
    pub crossed: Vec<Crossed>,
    /// The step's comparison report (report.txt, .json, .html).
    pub report_dir: PathBuf,
    /// It failed, but running it again at the same factor passed: noise, not a limit.
    pub overruled: bool,
}

impl StepResult {
    pub fn passed(&self) -> bool {
        self.crossed.is_empty()
    }

    /// A limit the search believed (a failure not overruled by its confirmation).
    pub fn failed(&self) -> bool {
        !self.passed() && !self.overruled
    }
}

/// A whole probe, as written to probe.json.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeResult {
    /// `tcpshadow.probe/1`.
    pub schema: &'static str,
    pub recording: Vec<PathBuf>,
    /// File time of the recording (one pass), seconds.
    pub recording_secs: f64,
    pub target: String,
    pub step_secs: u32,
    /// Seconds at the first step's factor before step 1, not judged.
    pub warmup_secs: u32,
    pub max_speed: f64,
    pub max_multiply: u32,
    pub thresholds: Thresholds,
    pub steps: Vec<StepResult>,
    /// Index in `steps` of the highest passing factor.
    pub knee: Option<usize>,
    /// Index in `steps` of the lowest failing factor.
    pub first_fail: Option<usize>,
    /// The top digests at the first failing step, worst p99 ratio to step 1 first.
    pub degraded: Vec<(DigestStep, f64)>,
    /// Stopped before the search ended (SIGINT/SIGTERM, or a step failed to run).
    pub stopped: bool,
    /// Whether any step had a host CPU figure.
    pub host_cpu_measured: bool,
}

pub const SCHEMA: &str = "tcpshadow.probe/1";

impl ProbeResult {
    pub fn knee_step(&self) -> Option<&StepResult> {
        self.knee.and_then(|i| self.steps.get(i))
    }

    pub fn fail_step(&self) -> Option<&StepResult> {
        self.first_fail.and_then(|i| self.steps.get(i))
    }

    /// Fills `knee`, `first_fail` and `degraded` from the steps.
    pub fn conclude(&mut self) {
        let best = |pass: bool| {
            self.steps
                .iter()
                .enumerate()
                .filter(|(_, s)| if pass { s.passed() } else { s.failed() })
                .map(|(i, s)| (i, s.factor))
                .reduce(|a, b| {
                    let better = if pass { b.1 > a.1 } else { b.1 < a.1 };
                    if better {
                        b
                    } else {
                        a
                    }
                })
                .map(|(i, _)| i)
        };
        self.knee = best(true);
        self.first_fail = best(false);
        self.host_cpu_measured = self
            .steps
            .iter()
            .any(|s| s.measure.host_cpu_busy_pct.is_some());
        self.degraded = match (self.steps.first(), self.fail_step()) {
            (Some(base), Some(fail)) => {
                limits::degraded(&base.measure, &fail.measure, self.thresholds.p99_floor_us)
            }
            _ => Vec::new(),
        };
    }
}
