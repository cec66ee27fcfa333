//! `work-compare`: the executed-work comparison for the shell scripts (`demo.sh`,
//! `bench/mirror.sh`), the same code the lab tests assert with (`tcpshadow_tests::work`).
//!
//! ```text
//! work-compare PROD_BEFORE PROD_AFTER TEST_BEFORE TEST_AFTER [--copier-log FILE]
//!              [--ratio N] [--min F] [--max F]
//! ```
//!
//! The four files are `lab.sh work prod|test` outputs. Prints the comparison; exits 1 when work
//! fidelity is outside `[--min, --max]` (default 0.99..1.01) or the test server has statement
//! errors production did not have, 2 on bad input.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use tcpshadow_tests::work::{Comparison, OwnStatements, Work, WorkSnapshot};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("work-compare: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let mut files = Vec::new();
    let mut log = None;
    let (mut ratio, mut lo, mut hi) = (1.0f64, 0.99f64, 1.01f64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().with_context(|| format!("{what} needs a value"));
        match a.as_str() {
            "--copier-log" => log = Some(value("--copier-log")?),
            "--ratio" => ratio = value("--ratio")?.parse().context("--ratio")?,
            "--min" => lo = value("--min")?.parse().context("--min")?,
            "--max" => hi = value("--max")?.parse().context("--max")?,
            "-h" | "--help" => {
                println!(
                    "usage: work-compare PROD_BEFORE PROD_AFTER TEST_BEFORE TEST_AFTER \
                     [--copier-log FILE] [--ratio N] [--min F] [--max F]\n\
                     Files: `lab.sh work prod|test` outputs. Exit 0: work fidelity within \
                     [--min, --max] (0.99..1.01) and no new statement error on test; 1: not; \
                     2: bad input."
                );
                return Ok(true);
            }
            f if !f.starts_with("--") => files.push(f.to_string()),
            other => bail!("unknown option {other} (see --help)"),
        }
    }
    let [pb, pa, tb, ta] = files.as_slice() else {
        bail!(
            "give four snapshot files: PROD_BEFORE PROD_AFTER TEST_BEFORE TEST_AFTER (see --help)"
        );
    };
    let read = |f: &String| -> Result<WorkSnapshot> {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?;
        WorkSnapshot::parse(&text).with_context(|| format!("in {f}"))
    };
    let own = match &log {
        Some(f) => OwnStatements::from_summary(
            &std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?,
        )?,
        None => OwnStatements::default(),
    };
    let c = Comparison::new(
        Work::between(&read(pb)?, &read(pa)?)?,
        Work::between(&read(tb)?, &read(ta)?)?,
    )
    .less_own(own)
    .expecting(ratio);
    println!("{c}");
    match c.check(lo, hi) {
        Ok(()) => Ok(true),
        Err(e) => {
            let first = e.to_string();
            println!("  NOT OK: {}", first.lines().next().unwrap_or_default());
            Ok(false)
        }
    }
}
