//! The probe's schedule: which load factor each step runs at, and where the knee is.
//!
//! # What this room is for
//!
//! A *load factor* f is how many times the recorded load a step asks of the test server:
//! `speed x multiply`. The ramp multiplies f by `growth` from `start` up to `max_factor`
//! (the last step is `max_factor` itself when the ramp would overshoot it); after the first
//! failing step it bisects between the last passing and the first failing factor, `narrow`
//! times, geometrically (load is multiplicative: halfway between 4x and 8x is 5.66x, not 6x).
//! With `confirm`, a failing step is run again at the same factor and fails only if that run
//! fails too: on a shared host a neighbour's build can double a p99 for one step, and a
//! search that believed it would narrow a knee that is not there.
//! [`split`] turns a factor into the speed and `--multiply` that give it.
//!
//! # What it must never do
//!
//! Measure anything or sleep: the caller's `measure` does (see [`search`]); this stays pure
//! so that the search is tested without a server.

use serde::Serialize;

/// How the factors are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// The first step's factor (the baseline every later step is judged against).
    pub start: f64,
    /// Each ramp step's factor is the previous one's times this (> 1).
    pub growth: f64,
    /// The highest factor tried: `max_speed x max_multiply`.
    pub max_factor: f64,
    /// Bisections after the first failing step.
    pub narrow: u32,
    /// Run a failing step again before believing it.
    pub confirm: bool,
}

/// Whether a step ramps up or narrows the knee.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Ramp,
    Narrow,
    /// The previous step, failed, run again at the same factor.
    Confirm,
}

/// One step to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// 1-based.
    pub number: usize,
    pub factor: f64,
    pub phase: Phase,
}

/// The ramp's factors: `start`, `start x growth`, ... up to `max_factor`, which ends it.
pub fn ramp(s: &Schedule) -> Vec<f64> {
    let mut out = Vec::new();
    if !(s.start.is_finite() && s.start > 0.0 && s.growth > 1.0 && s.growth.is_finite()) {
        return out;
    }
    let max = s.max_factor.max(s.start);
    let mut f = s.start;
    // Bounded: a pathological growth of 1.0000001 would otherwise ask for millions of steps.
    while f < max * (1.0 - 1e-9) && out.len() < MAX_RAMP_STEPS {
        out.push(f);
        f *= s.growth;
    }
    out.push(max);
    out
}

/// The longest ramp; with the smallest growth accepted on the command line (1.1) and the
/// largest factor (1000 x 16) it is about 100 steps.
pub const MAX_RAMP_STEPS: usize = 200;

/// At most how many steps a search with `s` runs (for the progress line's "n/≤N"): with
/// `confirm`, every failing step (the ramp's last and each bisection) may be run twice.
pub fn max_steps(s: &Schedule) -> usize {
    let tried = ramp(s).len() + s.narrow as usize;
    if s.confirm {
        tried + 1 + s.narrow as usize
    } else {
        tried
    }
}

/// Speed and `--multiply` for factor `f`: speed alone up to `max_speed`, then the fewest
/// copies that keep the speed at or below it (`multiply` 1-`max_multiply`).
///
/// Speed first because it adds no connections: the load keeps the recording's concurrency,
/// just with shorter pauses, which is what "the same traffic, more of it" means until a
/// connection's pauses are gone. Past that, only more connections add load.
pub fn split(f: f64, max_speed: f64, max_multiply: u32) -> (f64, u32) {
    let max_speed = if max_speed.is_finite() && max_speed > 0.0 {
        max_speed
    } else {
        1.0
    };
    if !(f.is_finite() && f > 0.0) {
        return (1.0, 1);
    }
    if f <= max_speed {
        return (f, 1);
    }
    let m = ((f / max_speed).ceil() as u32).clamp(1, max_multiply.max(1));
    (f / f64::from(m), m)
}

/// What the search found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Every step run: its factor and whether it passed, in order (a confirmation is a step
    /// of its own; a failure it did not confirm counts as passed in `knee`/`first_fail`).
    pub steps: Vec<(f64, bool)>,
    /// The highest passing factor.
    pub knee: Option<f64>,
    /// The lowest failing factor.
    pub first_fail: Option<f64>,
    /// `measure` asked to stop (interrupted, or a step could not run).
    pub stopped: bool,
}

/// Runs the ramp, then the narrowing, calling `measure(step)` for each step: `Some(true)`
/// passed, `Some(false)` crossed a limit, `None` stop now.
///
/// The first step is the baseline: when it fails there is no knee and nothing to narrow.
pub fn search(s: &Schedule, mut measure: impl FnMut(Step) -> Option<bool>) -> Outcome {
    let mut out = Outcome::default();
    let mut number = 0;
    // One factor's verdict: run, and run again when it failed and `confirm` asks.
    let mut judge = |factor: f64, phase: Phase, out: &mut Outcome| -> Option<bool> {
        number += 1;
        let passed = measure(Step {
            number,
            factor,
            phase,
        })?;
        out.steps.push((factor, passed));
        if passed || !s.confirm {
            return Some(passed);
        }
        number += 1;
        let again = measure(Step {
            number,
            factor,
            phase: Phase::Confirm,
        })?;
        out.steps.push((factor, again));
        Some(again)
    };
    for f in ramp(s) {
        let Some(passed) = judge(f, Phase::Ramp, &mut out) else {
            out.stopped = true;
            return out;
        };
        if passed {
            out.knee = Some(f);
        } else {
            out.first_fail = Some(f);
            break;
        }
    }
    let (Some(mut lo), Some(mut hi)) = (out.knee, out.first_fail) else {
        return out;
    };
    for _ in 0..s.narrow {
        let mid = (lo * hi).sqrt();
        // Nothing left to tell apart (the factors would round to the same speed).
        if !(mid > lo * (1.0 + 1e-3) && mid < hi * (1.0 - 1e-3)) {
            break;
        }
        let Some(passed) = judge(mid, Phase::Narrow, &mut out) else {
            out.stopped = true;
            break;
        };
        if passed {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    out.knee = Some(lo);
    out.first_fail = Some(hi);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(narrow: u32) -> Schedule {
        Schedule {
            start: 1.0,
            growth: 2.0,
            max_factor: 64.0,
            narrow,
            confirm: false,
        }
    }

    #[test]
    fn ramp_doubles_and_ends_at_the_maximum() {
        assert_eq!(ramp(&sched(0)), vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        let odd = Schedule {
            max_factor: 10.0,
            ..sched(0)
        };
        assert_eq!(ramp(&odd), vec![1.0, 2.0, 4.0, 8.0, 10.0]);
        let one = Schedule {
            start: 3.0,
            max_factor: 2.0,
            ..sched(0)
        };
        assert_eq!(ramp(&one), vec![3.0]);
        let bad = Schedule {
            growth: 1.0,
            ..sched(0)
        };
        assert!(ramp(&bad).is_empty());
        let tiny = Schedule {
            growth: 1.000_000_1,
            max_factor: 16_000.0,
            ..sched(0)
        };
        assert!(ramp(&tiny).len() <= MAX_RAMP_STEPS + 1);
    }

    #[test]
    fn split_prefers_speed_then_the_fewest_copies() {
        assert_eq!(split(4.0, 8.0, 16), (4.0, 1));
        assert_eq!(split(8.0, 8.0, 16), (8.0, 1));
        assert_eq!(split(16.0, 8.0, 16), (8.0, 2));
        let (s, m) = split(20.0, 8.0, 16);
        assert_eq!(m, 3);
        assert!((s * 3.0 - 20.0).abs() < 1e-9 && s <= 8.0);
        // Beyond what multiply can give, speed goes above its maximum rather than the
        // factor being silently lowered.
        assert_eq!(split(256.0, 8.0, 16), (16.0, 16));
        assert_eq!(split(f64::NAN, 8.0, 16), (1.0, 1));
    }

    /// A fake server: passes up to `limit` times the recorded load.
    fn converges_to(limit: f64, narrow: u32) {
        let s = sched(narrow);
        let mut seen = Vec::new();
        let out = search(&s, |step| {
            seen.push(step.number);
            Some(step.factor <= limit)
        });
        let (lo, hi) = (out.knee.unwrap(), out.first_fail.unwrap());
        assert!(lo <= limit && limit < hi, "{limit}: {lo}..{hi}");
        // Each bisection halves the interval in log space: one ramp step of growth 2 leaves
        // 2^(1/2^narrow) between the factors.
        let width = 2f64.powf(1.0 / f64::from(1u32 << narrow));
        assert!(hi / lo <= width * (1.0 + 1e-9), "{limit}: {lo}..{hi}");
        assert_eq!(seen, (1..=out.steps.len()).collect::<Vec<_>>());
        assert!(out.steps.len() <= max_steps(&s));
    }

    #[test]
    fn search_converges_within_one_narrowing_step_of_the_limit() {
        for limit in [1.0, 1.5, 3.3, 5.0, 7.99, 12.0, 40.0] {
            for narrow in 0..4 {
                converges_to(limit, narrow);
            }
        }
    }

    #[test]
    fn no_failure_means_the_maximum_is_the_knee_and_a_failing_baseline_has_none() {
        let out = search(&sched(3), |_| Some(true));
        assert_eq!(out.knee, Some(64.0));
        assert_eq!(out.first_fail, None);
        assert_eq!(out.steps.len(), 7);

        let out = search(&sched(3), |_| Some(false));
        assert_eq!(out.knee, None);
        assert_eq!(out.first_fail, Some(1.0));
        assert_eq!(out.steps, vec![(1.0, false)]);
    }

    #[test]
    fn a_stop_ends_the_search_with_what_was_found() {
        let out = search(&sched(3), |step| (step.number < 3).then_some(true));
        assert!(out.stopped);
        assert_eq!(out.knee, Some(2.0));
        assert_eq!(out.steps.len(), 2);
        // Stopped while narrowing: the interval found so far stands.
        let out = search(&sched(3), |step| match step.phase {
            Phase::Ramp => Some(step.factor < 10.0),
            Phase::Narrow | Phase::Confirm => None,
        });
        assert!(out.stopped);
        assert_eq!((out.knee, out.first_fail), (Some(8.0), Some(16.0)));
    }

    #[test]
    fn a_failure_is_believed_only_when_confirmed() {
        let s = Schedule {
            confirm: true,
            ..sched(1)
        };
        // A server good to 10x, with a neighbour's build spoiling the 4x step once.
        let mut spoiled = false;
        let mut phases = Vec::new();
        let out = search(&s, |step| {
            phases.push((step.factor, step.phase));
            if step.factor == 4.0 && !spoiled {
                spoiled = true;
                return Some(false);
            }
            Some(step.factor <= 10.0)
        });
        assert_eq!((out.knee, out.first_fail), (Some(8.0), Some(128f64.sqrt())));
        assert_eq!(phases[2..4], [(4.0, Phase::Ramp), (4.0, Phase::Confirm)]);
        // 16x fails twice (confirmed), then one bisection at 11.3x, failing twice too.
        let confirms = phases.iter().filter(|p| p.1 == Phase::Confirm).count();
        assert_eq!(confirms, 3);
        assert!(out.steps.len() <= max_steps(&s), "{phases:?}");
        for limit in [1.0, 3.3, 12.0, 40.0] {
            let out = search(&s, |step| Some(step.factor <= limit));
            let (lo, hi) = (out.knee.unwrap(), out.first_fail.unwrap());
            assert!(lo <= limit && limit < hi);
            assert!(out.steps.len() <= max_steps(&s));
        }
    }
}
