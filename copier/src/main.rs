use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use copier::cli::Args;
use copier::probe::ProbeArgs;
use copier::record::RecordArgs;
use copier::replay::ReplayArgs;
use copier::report::diff::ReportArgs;
use copier::{record, replay, run, signals, status};
use tracing_subscriber::EnvFilter;

/// Told after the live daemon's options: the subcommands are parsed apart (see `main`).
const SUBCOMMANDS: &str = "\
Subcommands (each has its own --help):
  copier record --port 3306 --output FILE.pcapng [--rotate-size 1G] ...
      write the production port's traffic to pcapng files
  copier replay FILE... --target HOST:PORT --intercept HOST:PORT [--speed 2] [--loop N] ...
      replay recorded traffic (pcap or pcapng) onto a test server
  copier probe --from FILE.pcapng --target HOST:PORT --intercept HOST:PORT --client-ip-pool CIDR ...
      replay a recording at rising load until a limit is crossed: the test server's capacity
  copier report diff A.json B.json [--top N]
      compare two runs' comparison reports digest by digest

  copier doctor [the daemon's flags or --config FILE] [--probe-client IP] [--json]
      check the whole mirror path (probing it from the live clients seen) and explain each
      failure with its fix; exit status 1 if a check FAILs";

fn main() -> ExitCode {
    // Before any thread exists, so that only the reload thread ever takes SIGHUP.
    ops::reload::block_sighup();
    // The live daemon keeps its flat command line (`copier --port ... --target ...`, as in
    // existing units and scripts); `record` and `replay` as the first word select a subcommand.
    let sub = std::env::args_os().nth(1);
    let rest = || std::env::args_os().skip(2);
    match sub.as_ref().and_then(|s| s.to_str()) {
        Some("record") => {
            let args = RecordArgs::parse_from(named("copier record", rest()));
            init_logging();
            main_record(&args)
        }
        Some("replay") => {
            let args = ReplayArgs::parse_from(named("copier replay", rest()));
            init_logging();
            main_replay(&args)
        }
        Some("probe") => {
            let args = ProbeArgs::parse_from(named("copier probe", rest()));
            init_logging();
            main_probe(&args)
        }
        Some("report") => {
            let args = ReportArgs::parse_from(named("copier report", rest()));
            main_report(&args)
        }
        Some("doctor") => main_doctor(named("copier doctor", rest())),
        _ => {
            let argv: Vec<OsString> = std::env::args_os().collect();
            let cmd = Args::command().after_help(SUBCOMMANDS);
            let parsed = match ops::config::parse::<Args>(cmd, &Args::command(), argv) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("copier: {e}");
                    return ExitCode::from(2);
                }
            };
            if parsed.args.config.print_config {
                let config = parsed.config.as_ref();
                print!(
                    "{}",
                    ops::config::effective_toml(&parsed.command, &parsed.matches, config)
                );
                return ExitCode::SUCCESS;
            }
            let log = ops::reload::init_logging(&parsed.args.config.log, false);
            let mut reloader = ops::reload::Reloader::new(
                parsed.config.as_ref(),
                Args::command(),
                &parsed.matches,
                log,
                "systemctl restart tcpshadow-copier",
            );
            if let Err(e) = ops::reload::on_sighup(move || {
                reloader.reload();
            }) {
                tracing::warn!(
                    "cannot watch for SIGHUP ({e}); the config file is read at start only"
                );
            }
            main_live(&parsed.args)
        }
    }
}

fn named(name: &str, rest: impl Iterator<Item = OsString>) -> Vec<OsString> {
    std::iter::once(OsString::from(name)).chain(rest).collect()
}

fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TCPSHADOW_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main_doctor(argv: Vec<OsString>) -> ExitCode {
    let cmd = copier::doctor::DoctorArgs::command();
    let parsed = match ops::config::parse::<copier::doctor::DoctorArgs>(cmd, &Args::command(), argv)
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("copier doctor: {e}");
            return ExitCode::from(2);
        }
    };
    if parsed.args.daemon.config.print_config {
        let config = parsed.config.as_ref();
        print!(
            "{}",
            ops::config::effective_toml(&parsed.command, &parsed.matches, config)
        );
        return ExitCode::SUCCESS;
    }
    // Only problems reach the log: the checks are the output.
    ops::reload::init_logging("warn", false);
    let report = copier::doctor::run(&parsed.args);
    if parsed.args.json {
        println!("{}", copier::doctor::json(&parsed.args, &report));
    }
    // 0 only when no check FAILed: warnings alone are not a broken path.
    if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn main_live(args: &Args) -> ExitCode {
    let live = match args.validate() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("copier: {e:#}");
            return ExitCode::from(2);
        }
    };
    signals::install();
    let started = std::time::Instant::now();
    // The capture settings may still refuse the ring's size: a run-time failure (see
    // `Args::capture_settings`).
    match args
        .capture_settings()
        .and_then(|capture| run::run(&live, &capture))
    {
        Ok(snap) => {
            eprint!("{}", status::summary(&snap, started.elapsed()));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("copier: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main_report(args: &ReportArgs) -> ExitCode {
    match copier::report::diff::run(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("copier report: {e}");
            // 2, as for a bad command line: the inputs were not what was asked for.
            ExitCode::from(2)
        }
    }
}

fn main_record(args: &RecordArgs) -> ExitCode {
    if let Err(e) = args.validate() {
        eprintln!("copier record: {e:#}");
        return ExitCode::from(2);
    }
    signals::install();
    match record::run(args) {
        Ok(summary) => {
            eprint!("{}", summary.render());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("copier record: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main_replay(args: &ReplayArgs) -> ExitCode {
    let mirror = match args.validate() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("copier replay: {e:#}");
            return ExitCode::from(2);
        }
    };
    signals::install();
    let started = std::time::Instant::now();
    match replay::run(args, &mirror) {
        Ok((snap, report)) => {
            eprint!("{}", status::summary(&snap, started.elapsed()));
            eprint!("{}", report.render());
            if report.interrupted {
                return ExitCode::from(130);
            }
            match replay::damage_error(&report) {
                Some(e) => {
                    eprintln!("copier replay: {e:#}");
                    ExitCode::FAILURE
                }
                None => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("copier replay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main_probe(args: &ProbeArgs) -> ExitCode {
    let mirror = match args.validate() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("copier probe: {e:#}");
            return ExitCode::from(2);
        }
    };
    signals::install();
    match copier::probe::run::run(args, &mirror) {
        Ok(result) => {
            print!("{}", copier::probe::render::text(&result));
            println!(
                "files: {0}/probe.txt, {0}/probe.json, {0}/probe.html, each step's report in {0}/steps/",
                args.out.display()
            );
            if result.stopped && signals::stop_requested() {
                return ExitCode::from(130);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("copier probe: {e:#}");
            ExitCode::FAILURE
        }
    }
}
