//! `copier doctor`: checks the whole mirror path from the production host and explains each
//! failure with its likely cause and fix.
//!
//! It takes the live copier's flags and config file, so it checks exactly what the daemon
//! would run with. Local checks (capabilities, target, route MTU, rp_filter, conntrack, clock,
//! whether the TLS plaintext probe attaches to the server on each production port)
//! need nothing else. Then it watches the production ports for a moment to see which clients
//! query them ([`clients`]). Then it talks to intercept over the control channel as a copier
//! would: the Hello checks reachability, token and protocol version; a Doctor query has
//! intercept check the assistant (forwarding, the segment it shares with the test server, and
//! who answers ARP for the mirrored client addresses there); finally probe SYNs, sent from the
//! mirrored client addresses exactly as a mirrored session's would be (the pool's, or without a
//! pool the live clients' own and `--probe-client`), must each be answered by the test server
//! with a SYN-ACK that intercept captures and relays back to us (we Claim the probes'
//! addresses first, as a session does). The probes are then reset, so the test server keeps no
//! half-open connection.
//!
//! Rooms: this file (the command line, the order of the checks, the JSON output), [`local`]
//! (the host's own state), [`clients`] (the watch of the live clients), [`link`] (the control
//! connection and intercept's checks of the assistant), [`probes`] (the probe SYNs and their
//! verdicts). The doctor must never mirror anything, nor leave state behind on the test
//! server or intercept (claims are released, probes reset).

mod clients;
mod link;
mod local;
mod probes;
#[cfg(test)]
mod tests;

use clients::{live_clients, Live};
use link::{assistant_checks, intercept_link};
use local::{capabilities, clock, conntrack, path_mtu, rp_filter, tls_plaintext};
use probes::{judge_probes, plan_probes, probe_address, send_probes, ArpAsker};

use std::net::{Ipv4Addr, Shutdown};

use clap::Parser;
use common::control::Hello;
use ops::check::{Check, Level, Report};
use ops::host;

use crate::cli::{validate_target, Args};

/// `copier doctor`: the live copier's flags and config file, plus what only the doctor takes.
#[derive(Parser, Debug)]
#[command(
    name = "copier doctor",
    about = "Check the mirror path from this production host: capabilities, the target, MTU, \
             conntrack, clock, the live clients of the port, intercept (reachable, same \
             version, token), the assistant's settings, who answers ARP for the mirrored client \
             addresses, and probe SYNs (from the pool, or from the live clients seen) whose \
             SYN-ACKs must reach intercept. Takes the daemon's own flags or --config. Exit \
             status 1 if any check FAILs, else 0."
)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub daemon: Args,

    /// Without --client-ip-pool, also send a probe SYN from this client address (a real
    /// client's, which the test server must route via the assistant), whether or not it is
    /// querying now; the live clients seen are probed anyway. With a pool, the probe uses a
    /// pool address.
    #[arg(long, value_name = "IP")]
    pub probe_client: Option<Ipv4Addr>,

    /// How long to wait for the probe's SYN-ACK at intercept, in milliseconds.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub probe_wait_ms: u64,

    /// How long to watch the production port for live clients, in milliseconds (0: do not
    /// watch). Without --client-ip-pool the busiest of them are the probe's client addresses.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub client_watch_ms: u64,

    /// Print the report as one JSON document (every check's name, status, message and fix,
    /// and the summary) instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// Runs every check, printing each line as it goes (unless `--json`: then nothing is printed
/// and the caller renders the report with [`json`]); returns the report.
pub fn run(args: &DoctorArgs) -> Report {
    let mut r = if args.json {
        Report::default()
    } else {
        Report::printing()
    };
    let d = &args.daemon;
    let m = &d.mirror;
    let routes = d.routes();
    if !args.json {
        println!("{}", headline(args));
    }

    let raw_ok = capabilities(&mut r);
    let routes = match routes {
        Ok(rs) => rs,
        Err(e) => {
            r.add(Check::fail("target", format!("{e:#}")));
            Vec::new()
        }
    };
    let mut good_routes = Vec::new();
    for route in &routes {
        let shown = format!("--target {}", route.target);
        match validate_target("--target", &shown, route.target) {
            Ok(()) => {
                r.add(Check::ok(
                    "target",
                    format!(
                        "{} is not an address of this host (port {} mirrors to it)",
                        route.target, route.prod_port
                    ),
                ));
                good_routes.push(*route);
            }
            Err(e) => r.add(Check::fail("target", format!("{e:#}"))),
        }
    }
    if !good_routes.is_empty() {
        if let Err(e) = d.validate() {
            r.add(Check::fail("flags", format!("{e:#}")));
        }
    }
    for route in &good_routes {
        path_mtu(&mut r, route, m.mss);
    }
    if !good_routes.is_empty() {
        rp_filter(&mut r, &good_routes);
    }
    conntrack(&mut r);
    clock(&mut r);
    let mut ports: Vec<u16> = routes.iter().map(|r| r.prod_port).collect();
    ports.sort_unstable();
    ports.dedup();
    tls_plaintext(&mut r, &ports);
    let live = live_clients(&mut r, args, &good_routes, raw_ok);

    let secret = match m.secret() {
        Ok(t) => t,
        Err(e) => {
            r.add(Check::fail("secret", format!("{e:#}")));
            return finish(r, args);
        }
    };
    let hello = Hello::new(&format!("copier-doctor@{}", host::hostname()));
    let mut link = match intercept_link(
        &mut r,
        m.first_intercept(),
        hello,
        secret.as_ref(),
        m.protocol,
    ) {
        Some(l) => l,
        None => {
            r.add(Check::warn(
                "probe",
                "skipped: the probe SYN, the assistant's settings and the ARP check all need \
                 intercept",
            ));
            return finish(r, args);
        }
    };
    if let Some(ports) = link.ports.clone() {
        for route in &good_routes {
            if !ports.contains(&route.target.port()) {
                r.add(Check::fail(
                    "intercept port",
                    format!(
                        "intercept captures replies from port(s) {} only, not the target's port \
                         {}; fix: add it to intercept's --port (port = [...] in intercept.toml)",
                        join(&ports),
                        route.target.port()
                    ),
                ));
            }
        }
    }
    let Some(first) = good_routes.first().copied() else {
        return finish(r, args);
    };
    let probe_ip = probe_address(args);
    assistant_checks(&mut r, &mut link, args, first, probe_ip);
    let mut probes = plan_probes(args, &good_routes, &live);
    match (probes.is_empty(), raw_ok) {
        (true, _) => r.add(Check::warn(
            "probe SYN",
            format!(
                "skipped: no client address to probe the reply path from: no --client-ip-pool, \
                 no --probe-client, and {}; fix: give --probe-client IP (a real client's \
                 address, which the test server must route via the assistant), or run the \
                 doctor while clients query production",
                match &live {
                    Live::Seen(_) => "no live client seen".to_string(),
                    Live::NotWatched(why) => format!("the live clients were not watched ({why})"),
                }
            ),
        )),
        (false, false) => r.add(Check::warn(
            "probe SYN",
            "skipped: sending it needs CAP_NET_RAW (see the capabilities check)",
        )),
        (false, true) => {
            if send_probes(&mut r, &mut link, &mut probes, args) {
                let mut arp = ArpAsker::default();
                for route in &good_routes {
                    judge_probes(&mut r, &mut link, &mut arp, &probes, route, args);
                }
            }
        }
    }
    let _ = link.stream.shutdown(Shutdown::Both);
    finish(r, args)
}

/// The first line: what is checked.
fn headline(args: &DoctorArgs) -> String {
    let m = &args.daemon.mirror;
    format!(
        "copier doctor on {}: {}, intercept {}{}",
        host::hostname(),
        match args.daemon.routes() {
            Ok(rs) => rs
                .iter()
                .map(|r| format!("port {} -> {}", r.prod_port, r.target))
                .collect::<Vec<_>>()
                .join(", "),
            Err(_) => "no route".into(),
        },
        m.first_intercept(),
        m.client_ip_pool
            .map(|(a, l)| format!(", client pool {a}/{l}"))
            .unwrap_or_default()
    )
}

fn finish(r: Report, args: &DoctorArgs) -> Report {
    if !args.json {
        println!("{}", r.summary());
    }
    r
}

/// `--json`: the whole report as one document, for automation. `fix` is null when the check
/// names none; `failed` is what the exit status says.
pub fn json(args: &DoctorArgs, r: &Report) -> String {
    let checks: Vec<serde_json::Value> = r
        .checks
        .iter()
        .map(|c| {
            let (message, fix) = c.message_and_fix();
            serde_json::json!({
                "name": c.name,
                "status": c.level.word(),
                "message": message,
                "fix": fix,
            })
        })
        .collect();
    let routes: Vec<serde_json::Value> = args
        .daemon
        .routes()
        .unwrap_or_default()
        .iter()
        .map(|r| serde_json::json!({"port": r.prod_port, "target": r.target.to_string()}))
        .collect();
    let doc = serde_json::json!({
        "schema": "tcpshadow.doctor/1",
        "host": host::hostname(),
        "headline": headline(args),
        "routes": routes,
        "intercept": args.daemon.mirror.first_intercept().to_string(),
        "client_ip_pool": args.daemon.mirror.client_ip_pool.map(|(a, l)| format!("{a}/{l}")),
        "checks": checks,
        "summary": {
            "checks": r.checks.len(),
            "ok": r.count(Level::Ok),
            "warn": r.count(Level::Warn),
            "fail": r.count(Level::Fail),
            "line": r.summary(),
        },
        "failed": r.failed(),
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into())
}

fn join<T: ToString>(items: &[T]) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}
