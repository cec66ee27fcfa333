//! The intercept binary: parses the command line and the config file, sets up logging and
//! SIGHUP reloads, and hands the validated flags to the library's wiring (`daemon`).

use clap::CommandFactory;
use intercept::cli::{Args, DoctorArgs};
use intercept::daemon;

fn main() {
    // Before any thread exists, so that only the reload thread ever takes SIGHUP.
    ops::reload::block_sighup();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).and_then(|a| a.to_str()) == Some("doctor") {
        std::process::exit(doctor_main(argv));
    }
    let parsed = match ops::config::parse::<Args>(Args::command(), &Args::command(), argv) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("intercept: {e}");
            std::process::exit(2);
        }
    };
    if parsed.args.config.print_config {
        print!(
            "{}",
            ops::config::effective_toml(&parsed.command, &parsed.matches, parsed.config.as_ref())
        );
        return;
    }
    let log = ops::reload::init_logging(&parsed.args.config.log, true);
    let mut reloader = ops::reload::Reloader::new(
        parsed.config.as_ref(),
        Args::command(),
        &parsed.matches,
        log,
        "systemctl restart tcpshadow-intercept",
    );
    if let Err(e) = ops::reload::on_sighup(move || {
        reloader.reload();
    }) {
        tracing::warn!("cannot watch for SIGHUP ({e}); the config file is read at start only");
    }
    if let Err(e) = daemon::run(parsed.args) {
        tracing::error!("{e:#}");
        std::process::exit(1);
    }
}

fn doctor_main(argv: Vec<std::ffi::OsString>) -> i32 {
    let argv: Vec<std::ffi::OsString> = std::iter::once("intercept doctor".into())
        .chain(argv.into_iter().skip(2))
        .collect();
    let parsed =
        match ops::config::parse::<DoctorArgs>(DoctorArgs::command(), &Args::command(), argv) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("intercept doctor: {e}");
                return 2;
            }
        };
    if parsed.args.daemon.config.print_config {
        let config = parsed.config.as_ref();
        print!(
            "{}",
            ops::config::effective_toml(&parsed.command, &parsed.matches, config)
        );
        return 0;
    }
    daemon::doctor(&parsed.args)
}
