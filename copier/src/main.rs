use std::process::ExitCode;

use clap::Parser;
use copier::cli::Args;
use copier::{run, signals, status};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TCPSHADOW_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = args.validate() {
        eprintln!("copier: {e:#}");
        return ExitCode::from(2);
    }
    signals::install();
    let started = std::time::Instant::now();
    match run::run(&args) {
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
