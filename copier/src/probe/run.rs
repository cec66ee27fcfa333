//! Running the probe: each step is one in-process `copier replay` of the recording at the
//! step's speed and `--multiply`, with a fresh driver, fleet and report, judged when it ends.
//!
//! # What this room is for
//!
//! Turning the plan's factors into replays ([`crate::replay::run_with`]: the recording cut or
//! looped to `--step-secs` of wall time, every step's connections new ones on the test server
//! through [`LoopBase`]), reading each step's report into a [`StepMeasure`], printing a
//! progress line per step, and writing probe.txt, probe.json and probe.html.
//!
//! # What it must never do
//!
//! * Copy replay's loop or the driver's: a step is a replay, waited for to its drain (the
//!   replay's settle already waits for the test server to finish what it was sent).
//! * Fetch resources from the test host itself: the step's report carries what the
//!   `--target-metrics` sampler read (see [`host_cpu_busy_pct`]).

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::args::ProbeArgs;
use super::limits::{self, StepMeasure};
use super::plan::{self, Step};
use super::{render, ProbeResult, StepResult, SCHEMA};
use crate::cli::MirrorArgs;
use crate::replay::{self, LoopBase, ReplayArgs, RunOptions};
use crate::settings::MirrorSettings;

/// Between two steps: the test server's last sessions close and its CPU falls idle, so that a
/// step does not start on the previous one's tail.
const PAUSE: Duration = Duration::from_secs(1);

/// Most loops of the recording in one step (a very short recording at a high speed).
const MAX_LOOPS: u32 = 100_000;

/// The test host's CPU busy percentage over a step (100 - the mean idle % of its first
/// target's node_exporter timeline in the step's report), when `--target-metrics` gave the
/// copier one to read; `None` otherwise (the report then says "host CPU: not measured").
fn host_cpu_busy_pct(report: &crate::report::Report) -> Option<f64> {
    let idle = report
        .resources
        .first()?
        .summary
        .series
        .get("cpu_idle_pct")?;
    (idle.samples > 0 && idle.mean.is_finite()).then(|| (100.0 - idle.mean).clamp(0.0, 100.0))
}

/// Runs the probe to its end (or a stop signal) and writes its files; returns what it found.
pub fn run(args: &ProbeArgs, mirror: &MirrorSettings) -> Result<ProbeResult> {
    let steps_dir = args.out.join("steps");
    std::fs::create_dir_all(&steps_dir)
        .with_context(|| format!("cannot create {}", steps_dir.display()))?;
    let span = replay::file_time(&args.from, args.port)?;
    if span < Duration::from_millis(10) {
        anyhow::bail!(
            "the recording spans {} ms: too short to replay at a pace (record at least a few \
             seconds)",
            span.as_millis()
        );
    }
    let schedule = args.schedule();
    let thresholds = args.thresholds();
    let max_steps = plan::max_steps(&schedule);
    let mut result = ProbeResult {
        schema: SCHEMA,
        recording: args.from.clone(),
        recording_secs: span.as_secs_f64(),
        target: mirror
            .target
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        step_secs: args.step_secs,
        warmup_secs: args.warmup_secs,
        max_speed: args.max_speed,
        max_multiply: args.max_multiply,
        thresholds,
        steps: Vec::new(),
        knee: None,
        first_fail: None,
        degraded: Vec::new(),
        stopped: false,
        host_cpu_measured: false,
    };
    let mut base = LoopBase::default();
    // Step 1's top digests with their counts: the latency figure's weights at every step.
    let mut top: Vec<(String, u64)> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    let warmed = warm_up(args, mirror, span, &mut base);
    let outcome = plan::search(&schedule, |step| {
        match &warmed {
            Ok(true) => {}
            // Interrupted during the warm-up: nothing to judge.
            Ok(false) => return None,
            Err(_) => return None,
        }
        if crate::signals::stop_requested() {
            return None;
        }
        if step.number > 1 || args.warmup_secs > 0 {
            std::thread::sleep(PAUSE);
        }
        match run_step(args, mirror, span, step, &mut base, &mut top, &result) {
            Ok(Some(s)) => {
                let passed = s.passed();
                println!("{}", render::progress_line(&s, max_steps));
                if passed && s.phase == plan::Phase::Confirm {
                    if let Some(spoiled) = result.steps.last_mut() {
                        spoiled.overruled = true;
                        println!(
                            "  step {}'s limit was not confirmed at the same load: taken as noise",
                            spoiled.number
                        );
                    }
                }
                let _ = std::io::stdout().flush();
                result.steps.push(s);
                Some(passed)
            }
            Ok(None) => {
                println!("step {}/≤{max_steps}: interrupted, not judged", step.number);
                None
            }
            Err(e) => {
                failure = Some(e);
                None
            }
        }
    });
    if let Err(e) = warmed {
        failure = Some(e.context("the warm-up failed"));
    }
    result.stopped = outcome.stopped;
    result.conclude();
    write_files(&args.out, &result)?;
    if let Some(e) = failure {
        if result.steps.is_empty() && args.warmup_secs > 0 {
            return Err(e);
        }
        // What ran is written: the error says why the rest did not.
        return Err(e.context(format!(
            "step {} failed (the steps before it are in {})",
            result.steps.len() + 1,
            args.out.display()
        )));
    }
    Ok(result)
}

/// `--warmup-secs` at the first step's factor, not judged; false when interrupted.
fn warm_up(
    args: &ProbeArgs,
    mirror: &MirrorSettings,
    span: Duration,
    base: &mut LoopBase,
) -> Result<bool> {
    if args.warmup_secs == 0 {
        return Ok(true);
    }
    let secs = Duration::from_secs(u64::from(args.warmup_secs));
    let dir = args.out.join("steps").join("00-warmup");
    let (speed, multiply) = plan::split(args.start, args.max_speed, args.max_multiply);
    let r = replay_at(args, mirror, span, (speed, multiply), secs, dir, base)?;
    if r.replay.interrupted {
        println!("warm-up: interrupted");
        return Ok(false);
    }
    let commands = r.report.as_ref().map_or(0, |r| r.totals.commands);
    println!(
        "warm-up: speed {speed:.2}x multiply {multiply}, {} s, {} commands mirrored (not judged)",
        args.warmup_secs,
        render::thousands(commands as f64 * f64::from(multiply))
    );
    let _ = std::io::stdout().flush();
    Ok(true)
}

/// One replay of `secs` of load at (speed, multiply), its report in `report_dir`; `base`
/// moves past the loops it used.
fn replay_at(
    args: &ProbeArgs,
    mirror: &MirrorSettings,
    span: Duration,
    (speed, multiply): (f64, u32),
    secs: Duration,
    report_dir: std::path::PathBuf,
    base: &mut LoopBase,
) -> Result<replay::Replayed> {
    let file_time = secs.mul_f64(speed);
    let loops = (file_time.as_secs_f64() / span.as_secs_f64()).ceil();
    let loops = if loops.is_finite() {
        (loops as u32).clamp(1, MAX_LOOPS)
    } else {
        1
    };
    let mut settings = mirror.clone();
    settings.multiply = multiply;
    settings.report = Some(report_dir);
    let replay_args = ReplayArgs {
        files: args.from.clone(),
        port: args.port,
        speed,
        loops,
        mirror: MirrorArgs {
            settings: settings.clone(),
            token_file: None,
        },
    };
    let opts = RunOptions {
        file_time_limit: Some(file_time),
        first_loop: Some(*base),
        quiet: true,
    };
    let r = replay::run_with(&replay_args, &settings, &opts)?;
    *base = base.after(&r.replay);
    Ok(r)
}

/// One step: a replay at `step`'s factor. `None` when interrupted (not judged).
fn run_step(
    args: &ProbeArgs,
    mirror: &MirrorSettings,
    span: Duration,
    step: Step,
    base: &mut LoopBase,
    top: &mut Vec<(String, u64)>,
    so_far: &ProbeResult,
) -> Result<Option<StepResult>> {
    let (speed, multiply) = plan::split(step.factor, args.max_speed, args.max_multiply);
    let report_dir = args
        .out
        .join("steps")
        .join(format!("{:02}-f{:.2}", step.number, step.factor));
    let wall = Duration::from_secs(u64::from(args.step_secs));
    let r = replay_at(
        args,
        mirror,
        span,
        (speed, multiply),
        wall,
        report_dir.clone(),
        base,
    )?;
    if r.replay.interrupted {
        return Ok(None);
    }
    let report = r
        .report
        .context("the replay kept no comparison report (is --protocol mysql?)")?;
    if top.is_empty() {
        *top = limits::top_digests(&report, args.top_digests as usize)
            .into_iter()
            .filter_map(|id| {
                let d = report.digests.iter().find(|d| d.id == id)?;
                Some((id, d.count))
            })
            .collect();
    }
    let schedule_secs = r.replay.file_time.as_secs_f64() / speed;
    let pace = if schedule_secs > 0.0 {
        r.replay.feeding.as_secs_f64() / schedule_secs
    } else {
        1.0
    };
    let measure = StepMeasure::from_report(
        &report,
        multiply,
        top,
        r.replay.worst_lateness.as_secs_f64() * 1000.0,
        pace,
        host_cpu_busy_pct(&report),
    );
    let baseline = so_far.steps.first().map_or(&measure, |s| &s.measure);
    let crossed = limits::judge(baseline, &measure, schedule_secs, &so_far.thresholds);
    let p99_ratio = measure.p99_ratio(baseline, so_far.thresholds.p99_floor_us);
    Ok(Some(StepResult {
        number: step.number,
        phase: step.phase,
        factor: step.factor,
        speed,
        multiply,
        measure,
        p99_ratio,
        crossed,
        report_dir,
        overruled: false,
    }))
}

fn write_files(dir: &Path, result: &ProbeResult) -> Result<()> {
    let write = |name: &str, body: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, body).with_context(|| format!("cannot write {}", path.display()))
    };
    write("probe.txt", render::text(result).as_bytes())?;
    let json = serde_json::to_vec_pretty(result).context("probe.json")?;
    write("probe.json", &json)?;
    write("probe.html", render::html(result).as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::resources::{SeriesStat, TargetResources};
    use crate::report::Report;

    #[test]
    fn host_cpu_is_what_the_first_target_was_not_idle() {
        let mut r = Report::default();
        assert_eq!(host_cpu_busy_pct(&r), None, "no --target-metrics");
        let mut t = TargetResources::default();
        t.summary.series.insert(
            "cpu_idle_pct".into(),
            SeriesStat {
                mean: 12.5,
                p95: 20.0,
                max: 30.0,
                samples: 4,
            },
        );
        r.resources.push(t);
        assert_eq!(host_cpu_busy_pct(&r), Some(87.5));
        r.resources[0]
            .summary
            .series
            .get_mut("cpu_idle_pct")
            .unwrap()
            .samples = 0;
        assert_eq!(host_cpu_busy_pct(&r), None, "no point read");
    }
}
