//! `copier probe`'s command line, and the checks that refuse what cannot be probed before
//! anything is sent.
//!
//! It must never start anything: validation only reads the arguments (and, for the mirror
//! flags, the files they name, as `copier replay` does).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Parser;

use super::limits::Thresholds;
use super::plan::Schedule;
use crate::cli::MirrorArgs;
use crate::settings::MirrorSettings;

/// Finds the load a test server sustains: replays a recording at rising load, in steps,
/// until a limit is crossed, then narrows the knee.
///
/// Each step replays --step-secs of the recording (looped when shorter) at load factor f =
/// speed x multiply: f = --start, then x --growth per step; speed alone up to --max-speed,
/// then --multiply copies of each connection (up to --max-multiply). Each step is judged
/// against step 1: the top digests' p99 above --max-p99-ratio x step 1's, new test errors
/// above --max-new-errors-pct of the commands, the test server answering less than
/// --min-answered-pct of what was sent per second, the replay missing its own schedule, or
/// the test host's CPU above --max-cpu-pct (when measured). After the first failing step,
/// the factor is bisected --narrow times. One progress line per step on stdout; probe.txt,
/// probe.json and probe.html in --out, with each step's comparison report under steps/.
///
/// Needs intercept running for --target and root (raw socket), like `copier replay`, and
/// --client-ip-pool: every step (and loop, and copy) is new connections on the test server.
///
/// Exit status: 0 when the probe ran (whether or not a limit was found), 1 when it failed,
/// 2 for bad arguments, 130 when stopped by SIGINT/SIGTERM (the steps run so far are
/// reported).
#[derive(Parser, Debug, Clone)]
#[command(name = "copier probe", bin_name = "copier probe", version)]
pub struct ProbeArgs {
    /// The recording (pcap or pcapng, e.g. from `copier record`); repeat for rotated files,
    /// in order.
    #[arg(long = "from", required = true, value_name = "CAPTURE")]
    pub from: Vec<PathBuf>,

    /// The production port in the recording.
    #[arg(long, default_value_t = 3306)]
    pub port: u16,

    /// Where probe.txt, probe.json, probe.html and steps/ (each step's report) go; created
    /// if missing.
    #[arg(long, value_name = "DIR", default_value = "probe")]
    pub out: PathBuf,

    /// Seconds of load per step (at each step's speed, the recording is cut or looped to
    /// last this long).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(2..=3600))]
    pub step_secs: u32,

    /// Load factor of the first step, the baseline later steps are judged against.
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive)]
    pub start: f64,

    /// Each step's load factor is the previous one's times this (1.1 to 10).
    #[arg(long, default_value_t = 2.0, value_parser = parse_growth)]
    pub growth: f64,

    /// Highest replay speed; beyond it, load grows by --multiply.
    #[arg(long, default_value_t = 8.0, value_parser = parse_speed)]
    pub max_speed: f64,

    /// Highest --multiply (copies of each connection, 1 to 16). 1: speed only.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub max_multiply: u32,

    /// Bisections of the knee after the first failing step (0 to 6).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=6))]
    pub narrow: u32,

    /// Believe a failing step at once. By default it is run again at the same factor and
    /// fails only if that run fails too (a neighbour's burst can spoil one step).
    #[arg(long)]
    pub no_confirm: bool,

    /// How many of the busiest digests (at step 1) are judged by latency.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub top_digests: u32,

    /// Limit: the top digests' weighted p99 over step 1's.
    #[arg(long, default_value_t = 2.0, value_parser = parse_ratio)]
    pub max_p99_ratio: f64,

    /// p99s below this many milliseconds count as this in the latency limit: a capacity knee
    /// is queueing, not 0.3 ms becoming 0.6 ms (0.1 to 10000).
    #[arg(long, default_value_t = 1.0, value_parser = parse_floor_ms)]
    pub p99_floor_ms: f64,

    /// Seconds of load at the first step's factor before step 1, not judged: the test server's
    /// caches, the intercept link and the first logins warm up outside the baseline (0: none).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=600))]
    pub warmup_secs: u32,

    /// Limit: test errors production did not have, percent of the commands.
    #[arg(long, default_value_t = 0.1, value_parser = parse_pct)]
    pub max_new_errors_pct: f64,

    /// Limit: commands answered per second, percent of those sent.
    #[arg(long, default_value_t = 90.0, value_parser = parse_pct)]
    pub min_answered_pct: f64,

    /// Limit: the test host's CPU busy, percent (judged only when measured).
    #[arg(long, default_value_t = 90.0, value_parser = parse_pct)]
    pub max_cpu_pct: f64,

    #[command(flatten)]
    pub mirror: MirrorArgs,
}

fn parse_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !v.is_finite() {
        return Err(format!("{s:?} is not a finite number"));
    }
    Ok(v)
}

fn parse_positive(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(v > 0.0 && v <= 1000.0) {
        return Err(format!("{s} must be above 0 and at most 1000"));
    }
    Ok(v)
}

fn parse_growth(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(1.1..=10.0).contains(&v) {
        return Err(format!("{s} must be between 1.1 and 10"));
    }
    Ok(v)
}

fn parse_speed(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(v > 0.0 && v <= 1000.0) {
        return Err(format!(
            "{s} must be above 0 and at most 1000 (copier replay's --speed)"
        ));
    }
    Ok(v)
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(v > 1.0 && v <= 1000.0) {
        return Err(format!("{s} must be above 1 and at most 1000"));
    }
    Ok(v)
}

fn parse_floor_ms(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(0.1..=10_000.0).contains(&v) {
        return Err(format!("{s} must be between 0.1 and 10000 (milliseconds)"));
    }
    Ok(v)
}

fn parse_pct(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s} must be a percentage, 0 to 100"));
    }
    Ok(v)
}

impl ProbeArgs {
    /// Refuses what cannot be probed; what is left is the mirror's settings (each step
    /// changes only --multiply and where its report goes).
    pub fn validate(&self) -> Result<MirrorSettings> {
        if self.mirror.multiply != 1 {
            bail!(
                "--multiply is chosen per step by the probe (speed x multiply = the load factor): \
                 use --max-multiply to bound it"
            );
        }
        if self.mirror.report.is_some() || self.mirror.report_interval > 0 {
            bail!(
                "--report: the probe writes each step's comparison report under --out DIR/steps/ \
                 itself"
            );
        }
        if self.mirror.sample.is_some() {
            bail!(
                "--sample: the probe's load factor is a multiple of the whole recording; a sample \
                 would make every step a fraction of it"
            );
        }
        if self.mirror.tee {
            bail!("--tee: the probe measures one test server's capacity; probe each one apart");
        }
        if self.mirror.client_ip_pool.is_none() {
            bail!(
                "--client-ip-pool is required: the probe replays the recording once per step \
                 (looped and multiplied), each time as new connections on the test server, sent \
                 from pool addresses (e.g. --client-ip-pool 198.19.0.0/16, routed via the \
                 intercept host like the clients)"
            );
        }
        if self.start > self.max_factor() {
            bail!(
                "--start {} is above the highest load factor --max-speed x --max-multiply = {}",
                self.start,
                self.max_factor()
            );
        }
        let settings = self.mirror.validate()?;
        if settings.protocol != crate::settings::Protocol::Mysql {
            bail!(
                "copier probe judges latencies and errors per MySQL digest: it needs --protocol \
                 mysql"
            );
        }
        self.mirror.route(self.port)?;
        // The most copies any step uses must fit the pool.
        let mut most = self.mirror.clone();
        most.settings.multiply = self.max_multiply;
        most.validate_routes(&most.route(self.port)?)?;
        Ok(settings)
    }

    pub fn max_factor(&self) -> f64 {
        self.max_speed * f64::from(self.max_multiply)
    }

    pub fn schedule(&self) -> Schedule {
        Schedule {
            start: self.start,
            growth: self.growth,
            max_factor: self.max_factor(),
            narrow: self.narrow,
            confirm: !self.no_confirm,
        }
    }

    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            p99_ratio: self.max_p99_ratio,
            p99_floor_us: (self.p99_floor_ms * 1000.0).round() as u64,
            new_errors_pct: self.max_new_errors_pct,
            answered_pct: self.min_answered_pct,
            cpu_pct: self.max_cpu_pct,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<ProbeArgs, clap::Error> {
        let mut argv = vec![
            "copier probe",
            "--from",
            "cap.pcapng",
            "--target",
            "198.18.0.3:3306",
            "--intercept",
            "198.18.0.4:36524",
        ];
        argv.extend(extra);
        ProbeArgs::try_parse_from(argv)
    }

    #[test]
    fn bad_numbers_are_refused_by_the_parser() {
        for bad in [
            &["--growth", "1"][..],
            &["--growth", "nan"],
            &["--start", "0"],
            &["--start", "-1"],
            &["--max-speed", "inf"],
            &["--max-multiply", "17"],
            &["--narrow", "7"],
            &["--max-p99-ratio", "1"],
            &["--min-answered-pct", "101"],
            &["--step-secs", "1"],
            &["--p99-floor-ms", "0"],
            &["--warmup-secs", "601"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        let a = parse(&[]).unwrap();
        assert_eq!(a.schedule().max_factor, 128.0);
        assert_eq!(a.thresholds(), Thresholds::default());
    }

    #[test]
    fn validation_says_what_the_probe_needs() {
        let err = |extra: &[&str]| format!("{:#}", parse(extra).unwrap().validate().unwrap_err());
        assert!(err(&[]).contains("--client-ip-pool"));
        let pool = ["--client-ip-pool", "198.19.0.0/16"];
        assert!(err(&[&pool[..], &["--multiply", "2"]].concat()).contains("--max-multiply"));
        assert!(err(&[&pool[..], &["--report", "/tmp/x"]].concat()).contains("steps/"));
        assert!(err(&[&pool[..], &["--start", "500"]].concat()).contains("--start 500"));
        assert!(err(&[&pool[..], &["--protocol", "tcp"]].concat()).contains("mysql"));
        // Sixteen copies from a /30 (two addresses) cannot be.
        assert!(err(&["--client-ip-pool", "198.19.0.0/30"]).contains("multiply"));
        parse(&pool).unwrap().validate().unwrap();
    }
}
