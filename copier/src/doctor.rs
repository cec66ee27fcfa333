//! `copier doctor`: checks the whole mirror path from the production host and explains each
//! failure with its likely cause and fix.
//!
//! It takes the live copier's flags and config file, so it checks exactly what the daemon
//! would run with. Local checks (capabilities, target, route MTU, rp_filter, conntrack, clock)
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

mod clients;

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use common::control::{
    ArpTarget, CopierMessage, DoctorCheck, DoctorQuery, FrameDecoder, Hello, InterceptMessage,
    WireMessage, PROTOCOL_VERSION,
};
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};
use ops::check::{Check, Level, Report};
use ops::host;

use crate::cli::{validate_target, Args};
use crate::send::RawSender;
use crate::settings::{Protocol, Route};

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

/// Whether raw sockets can be opened.
fn capabilities(r: &mut Report) -> bool {
    let Some(caps) = host::effective_caps() else {
        r.add(Check::warn("capabilities", "cannot read /proc/self/status"));
        return true;
    };
    let raw = host::has_cap(caps, host::CAP_NET_RAW);
    let admin = host::has_cap(caps, host::CAP_NET_ADMIN);
    let fix = "fix: run as root, or with AmbientCapabilities=CAP_NET_RAW CAP_NET_ADMIN \
               (deploy/systemd/tcpshadow-copier.service)";
    match (raw, admin) {
        (true, true) => r.add(Check::ok("capabilities", "CAP_NET_RAW and CAP_NET_ADMIN")),
        (true, false) => r.add(Check::warn(
            "capabilities",
            format!(
                "CAP_NET_RAW but not CAP_NET_ADMIN: capture works, but capture buffers beyond \
                 net.core.rmem_max and promiscuous mode on some drivers need it; {fix}"
            ),
        )),
        (false, _) => r.add(Check::fail(
            "capabilities",
            format!(
                "no CAP_NET_RAW: the copier can neither capture nor send mirrored packets; {fix}"
            ),
        )),
    }
    raw
}

/// The route's MTU must carry `--mss` plus 40 bytes of headers.
fn path_mtu(r: &mut Report, route: &Route, mss: u16) {
    let ip = *route.target.ip();
    match host::route_to(ip) {
        Ok(rt) => {
            let dev = rt.iface.clone().unwrap_or_else(|| "?".into());
            match rt.mtu {
                Some(mtu) if u32::from(mss) + 40 > mtu => r.add(Check::fail(
                    "mtu",
                    format!(
                        "the route to {ip} (dev {dev}) has MTU {mtu}, but --mss {mss} makes \
                         {}-byte packets: they are dropped (the copier sets DF); fix: --mss {}",
                        u32::from(mss) + 40,
                        mtu.saturating_sub(40)
                    ),
                )),
                Some(mtu) => r.add(Check::ok(
                    "mtu",
                    format!(
                        "route to {ip}: dev {dev}, from {}, MTU {mtu} carries --mss {mss} + 40",
                        rt.src
                    ),
                )),
                None => r.add(Check::warn(
                    "mtu",
                    format!("cannot read the MTU of the route to {ip} (dev {dev})"),
                )),
            }
        }
        Err(e) => r.add(Check::fail(
            "mtu",
            format!("no route from this host to the target {ip}: {e}; fix: add one"),
        )),
    }
}

/// rp_filter filters what a host receives; the production host only sends mirrored packets,
/// so its value is shown, not judged (the test server's is what matters: see the probe).
fn rp_filter(r: &mut Report, routes: &[Route]) {
    let mut ifaces: Vec<String> = routes
        .iter()
        .filter_map(|rt| host::route_to(*rt.target.ip()).ok()?.iface)
        .collect();
    ifaces.sort();
    ifaces.dedup();
    let shown: Vec<String> = ifaces
        .iter()
        .filter_map(|i| {
            host::effective_rp_filter(i).map(|v| format!("{i}={}", host::rp_filter_name(v)))
        })
        .collect();
    r.add(Check::ok(
        "rp_filter",
        format!(
            "{} on this host (it only sends mirrored packets, so rp_filter here does not \
             matter; the test server's matters, see the probe SYN)",
            if shown.is_empty() {
                "?".into()
            } else {
                shown.join(" ")
            }
        ),
    ));
}

/// Every mirrored connection adds a conntrack entry here (the raw packets pass netfilter), so
/// mirroring roughly doubles the table's use.
fn conntrack(r: &mut Report) {
    match host::conntrack() {
        None => r.add(Check::ok(
            "conntrack",
            "connection tracking is not loaded on this host",
        )),
        Some((count, max)) if max > 0 && count * 10 >= max * 9 => r.add(Check::fail(
            "conntrack",
            format!(
                "{count} of {max} entries in use: the table is nearly full, new connections \
                 (production's too) get dropped; fix: raise net.netfilter.nf_conntrack_max"
            ),
        )),
        Some((count, max)) if max > 0 && count * 2 >= max => r.add(Check::warn(
            "conntrack",
            format!(
                "{count} of {max} entries in use: mirroring adds one per mirrored connection, \
                 so it may fill up; fix: raise net.netfilter.nf_conntrack_max (to at least {})",
                count * 3
            ),
        )),
        Some((count, max)) => r.add(Check::ok(
            "conntrack",
            format!("{count} of {max} entries in use: room for mirroring"),
        )),
    }
}

fn clock(r: &mut Report) {
    let a = Instant::now();
    let b = Instant::now();
    if b < a {
        r.add(Check::fail(
            "clock",
            "the monotonic clock goes backwards: timers and pacing break; fix: the kernel's \
             clocksource (/sys/devices/system/clocksource)",
        ));
        return;
    }
    match host::clock_state() {
        Some(s) if s.synchronized => r.add(Check::ok(
            "clock",
            format!("synchronised (estimated error {} us)", s.est_error_us),
        )),
        Some(_) => r.add(Check::warn(
            "clock",
            "the kernel says the clock is not synchronised: logs and reports of the two hosts \
             will not line up (mirroring itself uses the monotonic clock); fix: run an NTP \
             client (chrony or systemd-timesyncd)",
        )),
        None => r.add(Check::warn("clock", "adjtimex(2) failed")),
    }
}

/// A control connection of our own.
struct Link {
    stream: TcpStream,
    dec: FrameDecoder<InterceptMessage>,
    buf: Vec<u8>,
    /// intercept's ports, from its name (`intercept@host port 3306,3307`), when readable.
    ports: Option<Vec<u16>>,
}

impl Link {
    fn send(&mut self, m: &CopierMessage) -> io::Result<()> {
        let mut out = Vec::new();
        m.encode(&mut out)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&out)
    }

    /// The next frame other than a Pong, or `None` at the deadline.
    fn recv_until(&mut self, deadline: Instant) -> io::Result<Option<InterceptMessage>> {
        loop {
            match self.dec.next_message() {
                Ok(Some(InterceptMessage::Pong(_))) => continue,
                Ok(Some(m)) => return Ok(Some(m)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "intercept closed the connection",
                    ))
                }
                Ok(n) => self.dec.feed(&self.buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a Ping and waits for its Pong: everything sent before has been read by intercept.
    fn sync(&mut self, nonce: u64, wait: Duration) -> io::Result<bool> {
        self.send(&CopierMessage::Ping(nonce))?;
        let deadline = Instant::now() + wait;
        loop {
            match self.dec.next_message() {
                Ok(Some(InterceptMessage::Pong(n))) if n == nonce => return Ok(true),
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => return Ok(false),
                Ok(n) => self.dec.feed(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Ok(false),
            }
        }
    }
}

/// Hello, Challenge, Auth, Welcome: intercept reachable, same version, each side holding the
/// same secret (or neither).
fn intercept_link(
    r: &mut Report,
    addr: SocketAddr,
    hello: Hello,
    secret: Option<&common::auth::Secret>,
    protocol: Protocol,
) -> Option<Link> {
    let stream = match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "nothing listens on {addr} (connection refused): intercept is not running on \
                     the assistant, or listens elsewhere; fix: start it there (`systemctl start \
                     tcpshadow-intercept`), and check its --listen against this --intercept"
                ),
            ));
            return None;
        }
        Err(e) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "cannot reach {addr}: {e}; fix: check the address, and that no firewall \
                     drops the control port between this host and the assistant"
                ),
            ));
            return None;
        }
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(3)));
    let mut link = Link {
        stream,
        dec: FrameDecoder::new(),
        buf: vec![0; 64 * 1024],
        ports: None,
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut answer = link
        .send(&CopierMessage::Hello(hello))
        .and_then(|()| link.recv_until(deadline));
    if let Ok(Some(InterceptMessage::Challenge(ch))) = &answer {
        let ch = ch.clone();
        let auth = match crate::control_client::answer_challenge(&ch, secret) {
            Ok(a) => a,
            Err(why) => {
                r.add(Check::fail("intercept", format!("{addr}: {why}")));
                return None;
            }
        };
        answer = link
            .send(&CopierMessage::Auth(auth.clone()))
            .and_then(|()| link.recv_until(deadline));
        if let Ok(Some(InterceptMessage::Welcome(w))) = &answer {
            if let Err(why) = crate::control_client::check_welcome(w, &ch, &auth, secret) {
                r.add(Check::fail("intercept", format!("{addr}: {why}")));
                return None;
            }
        }
    }
    match answer {
        Ok(Some(InterceptMessage::Welcome(w))) => {
            link.ports = w
                .name
                .rsplit_once(" port ")
                .map(|(_, p)| p.split(',').filter_map(|x| x.trim().parse().ok()).collect());
            let framing = match (w.mysql_head, protocol) {
                (Some(_), _) => "frames MySQL",
                (None, Protocol::Tcp) => "TCP feedback only",
                (None, Protocol::Mysql) => {
                    r.add(Check::fail(
                        "intercept",
                        format!(
                            "{addr} ({}) runs with --protocol tcp, but this copier mirrors \
                             MySQL: mirrored sessions cannot log in to the test server; fix: \
                             the same --protocol on both",
                            w.name
                        ),
                    ));
                    return Some(link);
                }
            };
            r.add(Check::ok(
                "intercept",
                format!(
                    "{addr} answers: {}, control protocol {PROTOCOL_VERSION}, {framing}, {}",
                    w.name,
                    if secret.is_some() {
                        "both hold the same secret"
                    } else {
                        "open control channel (no --secret-file on either side)"
                    }
                ),
            ));
            Some(link)
        }
        Ok(Some(InterceptMessage::Reject(j))) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "{addr} refused this copier (its protocol version {}): {}",
                    j.version, j.reason
                ),
            ));
            None
        }
        Ok(Some(other)) => {
            r.add(Check::fail(
                "intercept",
                format!("{addr} sent {other:?} instead of a Welcome: not a tcpshadow intercept?"),
            ));
            None
        }
        Ok(None) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "{addr} accepted the connection but did not answer the Hello within 5 s: \
                     not an intercept (another service on that port?)"
                ),
            ));
            None
        }
        Err(e) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "{addr}: {e} (a different tcpshadow release? run the same release on both \
                     hosts)"
                ),
            ));
            None
        }
    }
}

/// The probe's client address: the last of the pool (a running copier starts from hashes of
/// its clients, so it is as unlikely to be in use as any), or --probe-client.
fn probe_address(args: &DoctorArgs) -> Option<Ipv4Addr> {
    match args.daemon.mirror.client_ip_pool {
        Some((base, prefix)) => {
            let size = 1u64 << (32 - u32::from(prefix.min(32)));
            // The broadcast address is never a client's: the one before it.
            let offset = size.saturating_sub(2);
            Some(Ipv4Addr::from((u64::from(u32::from(base)) + offset) as u32))
        }
        None => args.probe_client,
    }
}

/// Asks intercept to check the assistant, and who answers ARP for our client addresses.
fn assistant_checks(
    r: &mut Report,
    link: &mut Link,
    args: &DoctorArgs,
    route: Route,
    probe_ip: Option<Ipv4Addr>,
) {
    let mut arp: Vec<ArpTarget> = Vec::new();
    if let Some((base, prefix)) = args.daemon.mirror.client_ip_pool {
        let always: Vec<Ipv4Addr> = probe_ip.into_iter().collect();
        arp.extend(
            ops::arp::sample_pool(base, prefix, 256, &always)
                .into_iter()
                .map(|addr| ArpTarget { addr, pool: true }),
        );
    } else if let Some(ip) = args.probe_client {
        arp.push(ArpTarget {
            addr: ip,
            pool: false,
        });
    }
    let asked = Instant::now();
    let q = DoctorQuery {
        target: *route.target.ip(),
        arp,
    };
    let answer = link
        .send(&CopierMessage::Doctor(q))
        .and_then(|()| link.recv_until(Instant::now() + Duration::from_secs(10)));
    match answer {
        Ok(Some(InterceptMessage::DoctorReport(rep))) => {
            let rtt = asked.elapsed();
            for c in &rep.checks {
                r.add(Check::new(
                    Level::from_u8(c.level),
                    format!("assistant {}", c.name),
                    c.detail.clone(),
                ));
            }
            // The report was stamped between asking and now; the ARP wait is in there too,
            // so only a skew well beyond the round trip is reported.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let skew = now - rep.unix_ms as i64;
            let slack = rtt.as_millis() as i64 + 1000;
            if rep.unix_ms != 0 && skew.abs() > slack {
                r.add(Check::warn(
                    "clock skew",
                    format!(
                        "the assistant's clock is {:.1} s {} this host's: logs of the two hosts \
                         will not line up; fix: NTP on both",
                        skew.abs() as f64 / 1000.0,
                        if skew > 0 { "behind" } else { "ahead of" }
                    ),
                ));
            }
        }
        Ok(Some(other)) => r.add(Check::warn(
            "assistant",
            format!("intercept answered the doctor query with {other:?}"),
        )),
        Ok(None) => r.add(Check::warn(
            "assistant",
            "intercept did not answer the doctor query within 10 s",
        )),
        Err(e) => r.add(Check::warn(
            "assistant",
            format!(
                "intercept did not take the doctor query ({e}): it predates `copier doctor`; \
                 upgrade it to this release (run `intercept doctor` on the assistant meanwhile)"
            ),
        )),
    }
}

/// Most live clients the probe SYNs go from: a handful shows a route missing for some of them
/// without flooding the test server or the output.
const MAX_LIVE_PROBES: usize = 4;

/// What the watch of the production ports found.
enum Live {
    /// The clients seen, busiest first (maybe none).
    Seen(Vec<clients::Client>),
    /// Not watched, and why.
    NotWatched(String),
}

/// Watches the production ports for `--client-watch-ms` and reports who queries them.
fn live_clients(r: &mut Report, args: &DoctorArgs, routes: &[Route], raw_ok: bool) -> Live {
    if routes.is_empty() {
        return Live::NotWatched("no valid --target".into());
    }
    if args.client_watch_ms == 0 {
        return Live::NotWatched("--client-watch-ms 0".into());
    }
    if !raw_ok {
        r.add(Check::warn(
            "live clients",
            "not watched: capturing needs CAP_NET_RAW (see the capabilities check)",
        ));
        return Live::NotWatched("no CAP_NET_RAW".into());
    }
    let iface = &args.daemon.interface;
    let mut ports: Vec<u16> = routes.iter().map(|r| r.prod_port).collect();
    ports.sort_unstable();
    ports.dedup();
    let ports = join(&ports);
    let window = Duration::from_millis(args.client_watch_ms);
    let tally = match clients::watch(iface, routes, window) {
        Ok(t) => t,
        Err(e) => {
            r.add(Check::warn(
                "live clients",
                format!("cannot watch port {ports} on {iface}: {e:#}"),
            ));
            return Live::NotWatched("the capture failed".into());
        }
    };
    let secs = tally.elapsed.as_secs_f64();
    let seen = tally.busiest();
    let pool = args.daemon.mirror.client_ip_pool;
    if seen.is_empty() {
        r.add(Check::warn(
            "live clients",
            format!(
                "no client sent anything to port {ports} on {iface} in {secs:.1} s: production \
                 is idle right now, or --port/--map/--interface miss its traffic{}",
                match (pool, args.probe_client) {
                    (Some(_), _) => " (the probe SYN uses a pool address anyway)",
                    (None, Some(_)) => " (the probe SYN uses --probe-client)",
                    (None, None) => "",
                }
            ),
        ));
        return Live::Seen(seen);
    }
    let shown: Vec<String> = seen
        .iter()
        .take(MAX_LIVE_PROBES)
        .map(|c| format!("{} {} packets", c.addr, c.packets))
        .collect();
    let more = seen.len().saturating_sub(shown.len());
    let use_of_them = match pool {
        Some((a, l)) => format!(
            "they are mirrored from --client-ip-pool {a}/{l}, so the test server needs no \
             route for them (the probe SYN uses a pool address)"
        ),
        None if seen.len() == 1 => "the probe SYN goes from it, as its mirrored sessions' \
                                    will"
            .to_string(),
        None if seen.len() == shown.len() => format!(
            "the probe SYNs go from all {}, as their mirrored sessions' will",
            seen.len()
        ),
        None => format!(
            "the probe SYNs go from the {} busiest, as their mirrored sessions' will",
            shown.len()
        ),
    };
    let who = match (seen.len(), more, tally.untracked) {
        (1, _, 0) => format!("1 client address, {},", seen[0].addr),
        (n, 0, 0) => format!("{n} client addresses ({})", shown.join(", ")),
        (n, m, 0) => format!(
            "{n} client addresses (busiest first: {}, and {m} more)",
            shown.join(", ")
        ),
        (n, m, _) => format!(
            "more than {n} client addresses (busiest first: {}, and over {m} more)",
            shown.join(", ")
        ),
    };
    r.add(Check::ok(
        "live clients",
        format!(
            "{who} sent {} packets to port {ports} on {iface} in {secs:.1} s: {use_of_them}",
            tally.packets
        ),
    ));
    Live::Seen(seen)
}

/// Where a probe's client address comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The last address of `--client-ip-pool`.
    Pool,
    /// `--probe-client`.
    Given,
    /// A client seen querying production.
    Live,
}

/// The probe's SYN-ACK (or other answer) as intercept relayed it.
#[derive(Clone, Copy, Debug)]
struct Answer {
    flags: TcpFlags,
    /// 0: the first SYN; 1: the retry.
    attempt: u32,
    took: Duration,
}

impl Answer {
    fn is_syn_ack(&self) -> bool {
        self.flags.syn() && self.flags.ack()
    }
}

/// One probe SYN: from `me` to the route's target.
#[derive(Clone, Debug)]
struct Probe {
    source: Source,
    route: Route,
    me: SocketAddrV4,
    isn: u32,
    answer: Option<Answer>,
    /// How long the probes waited in all.
    waited: Duration,
}

impl Probe {
    fn label(&self) -> String {
        match self.source {
            Source::Pool => format!("mirrored client {}", self.me),
            Source::Given => format!("--probe-client {}", self.me),
            Source::Live => format!("live client {}", self.me),
        }
    }

    fn segment(&self, flags: u8, seq: u32, mss: u16) -> SegmentRepr {
        SegmentRepr {
            src: *self.me.ip(),
            dst: *self.route.target.ip(),
            src_port: self.me.port(),
            dst_port: self.route.target.port(),
            seq,
            ack: 0,
            flags: TcpFlags(flags),
            window: if flags & TcpFlags::RST != 0 { 0 } else { 64240 },
            options: TcpOptions {
                mss: (flags & TcpFlags::SYN != 0).then_some(mss),
                ..TcpOptions::default()
            },
            ip_id: (self.isn & 0xffff) as u16,
            ttl: 64,
        }
    }
}

/// The probes: from the pool's address with `--client-ip-pool` (the real clients' addresses
/// never reach the test server then), else from `--probe-client` and the busiest live clients,
/// each to every route that mirrors it.
fn plan_probes(args: &DoctorArgs, routes: &[Route], live: &Live) -> Vec<Probe> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let seed = nanos ^ std::process::id();
    let mut out: Vec<Probe> = Vec::new();
    let none = BTreeSet::new();
    if let (Some(_), Some(ip)) = (args.daemon.mirror.client_ip_pool, probe_address(args)) {
        for route in routes {
            push_probe(&mut out, seed, ip, Source::Pool, *route, &none);
        }
        return out;
    }
    if let Some(ip) = args.probe_client {
        for route in routes {
            push_probe(&mut out, seed, ip, Source::Given, *route, &none);
        }
    }
    if let Live::Seen(seen) = live {
        let picked = seen
            .iter()
            .filter(|c| Some(c.addr) != args.probe_client)
            .take(MAX_LIVE_PROBES);
        for c in picked {
            for route in routes
                .iter()
                .filter(|r| c.prod_ports.contains(&r.prod_port))
            {
                push_probe(&mut out, seed, c.addr, Source::Live, *route, &c.ports);
            }
        }
    }
    out
}

/// Adds a probe from `client`, on a port of the ephemeral range that `avoid` (the client's
/// ports seen in use) and the other probes from `client` do not hold: a live client's own
/// connections, and the mirrored sessions a running copier holds for them, keep theirs.
fn push_probe(
    out: &mut Vec<Probe>,
    seed: u32,
    client: Ipv4Addr,
    source: Source,
    route: Route,
    avoid: &BTreeSet<u16>,
) {
    let taken: Vec<u16> = out
        .iter()
        .filter(|p| *p.me.ip() == client)
        .map(|p| p.me.port())
        .collect();
    let port = probe_port(seed ^ u32::from(client), avoid, &taken);
    let isn = (seed ^ u32::from(client) ^ u32::from(port)).wrapping_mul(2_654_435_761);
    out.push(Probe {
        source,
        route,
        me: SocketAddrV4::new(client, port),
        isn,
        answer: None,
        waited: Duration::ZERO,
    });
}

/// A port of 49152..=65535 in neither `avoid` nor `taken`, starting from `seed`.
fn probe_port(seed: u32, avoid: &BTreeSet<u16>, taken: &[u16]) -> u16 {
    const FIRST: u32 = 49152;
    const COUNT: u32 = 65536 - FIRST;
    // An odd step walks every port of the range once.
    (0..COUNT)
        .map(|i| (FIRST + seed.wrapping_add(i.wrapping_mul(7919)) % COUNT) as u16)
        .find(|p| !avoid.contains(p) && !taken.contains(p))
        .unwrap_or(FIRST as u16)
}

/// Sends every probe SYN at once and collects what intercept relays back, so the probes take
/// `--probe-wait-ms` however many there are. Returns false (after a FAIL) if they could not be
/// sent.
fn send_probes(r: &mut Report, link: &mut Link, probes: &mut [Probe], args: &DoctorArgs) -> bool {
    let mut sender = match RawSender::open() {
        Ok(s) => s,
        Err(e) => {
            r.add(Check::fail("probe SYN", format!("{e:#}")));
            return false;
        }
    };
    let claims: Vec<SocketAddrV4> = probes.iter().map(|p| p.me).collect();
    let claimed = link
        .send(&CopierMessage::Claim(claims.clone()))
        .and_then(|()| link.sync(1, Duration::from_secs(3)));
    if !matches!(claimed, Ok(true)) {
        r.add(Check::fail(
            "probe SYN",
            "intercept did not confirm the probes' Claim: the control connection broke",
        ));
        return false;
    }
    let mss = args.daemon.mirror.mss;
    let mut buf = [0u8; 128];
    let mut send = |sender: &mut RawSender, repr: SegmentRepr| {
        if let Ok(n) = emit_ipv4_tcp(&repr, &[], &mut buf) {
            sender.send(&buf[..n], repr.dst);
        }
    };
    let started = Instant::now();
    let wait = Duration::from_millis(args.probe_wait_ms);
    // Two tries: one lost SYN on a busy network must not fail the doctor.
    'tries: for attempt in 0..2u32 {
        for p in probes.iter().filter(|p| p.answer.is_none()) {
            send(&mut sender, p.segment(TcpFlags::SYN, p.isn, mss));
        }
        let deadline = Instant::now() + wait / 2;
        loop {
            if probes.iter().all(|p| p.answer.is_some()) {
                break 'tries;
            }
            match link.recv_until(deadline) {
                Ok(Some(InterceptMessage::Feedback(items))) => {
                    for fb in items {
                        let hit = probes
                            .iter_mut()
                            .find(|p| p.me == fb.client && p.answer.is_none());
                        if let Some(p) = hit {
                            p.answer = Some(Answer {
                                flags: fb.flags,
                                attempt,
                                took: started.elapsed(),
                            });
                        }
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    r.add(Check::fail(
                        "probe SYN",
                        format!("the control connection broke while waiting: {e}"),
                    ));
                    return false;
                }
            }
        }
    }
    let waited = started.elapsed();
    let _ = link.send(&CopierMessage::Release(claims));
    for p in probes.iter_mut() {
        p.waited = waited;
        // Reset it: the test server must not keep a half-open connection for us, also when
        // its SYN-ACK went elsewhere (a lost one would keep it in SYN-RECV for a minute).
        if !p.answer.is_some_and(|a| a.flags.rst()) {
            send(
                &mut sender,
                p.segment(TcpFlags::RST, p.isn.wrapping_add(1), mss),
            );
        }
    }
    if sender.stats.errors > 0 {
        let from: Vec<String> = probes.iter().map(|p| p.me.ip().to_string()).collect();
        r.add(Check::fail(
            "probe SYN",
            format!(
                "sending the probes from {} failed ({} errors): see the log line above",
                from.join(", "),
                sender.stats.errors
            ),
        ));
        return false;
    }
    true
}

/// Reports the probes to `route`: one ok line for all that got their SYN-ACK, a FAIL for each
/// whose reply path is broken (naming its client address), or one for a test server that
/// answers nothing at all.
fn judge_probes(
    r: &mut Report,
    link: &mut Link,
    arp: &mut ArpAsker,
    probes: &[Probe],
    route: &Route,
    args: &DoctorArgs,
) {
    let target = route.target;
    let mine: Vec<&Probe> = probes.iter().filter(|p| p.route == *route).collect();
    let synack = |p: &&Probe| p.answer.is_some_and(|a| a.is_syn_ack());
    let good: Vec<&Probe> = mine.iter().copied().filter(synack).collect();
    if !good.is_empty() {
        let ms: Vec<u128> = good
            .iter()
            .filter_map(|p| p.answer.map(|a| a.took.as_millis()))
            .collect();
        let (lo, hi) = (
            ms.iter().min().copied().unwrap_or(0),
            ms.iter().max().copied().unwrap_or(0),
        );
        let retried = good.iter().any(|p| p.answer.is_some_and(|a| a.attempt > 0));
        let labels: Vec<String> = good.iter().map(|p| p.label()).collect();
        r.add(Check::ok(
            "probe SYN",
            if good.len() == 1 {
                format!(
                    "{target} answered a SYN from {} with a SYN-ACK that reached intercept in \
                     {lo} ms{} (then reset)",
                    labels.join(""),
                    if retried { ", after one retry" } else { "" }
                )
            } else {
                format!(
                    "{target} answered the SYNs from {} with SYN-ACKs that reached intercept in \
                     {lo}-{hi} ms{} (then reset)",
                    labels.join(", "),
                    if retried {
                        ", some after one retry"
                    } else {
                        ""
                    }
                )
            },
        ));
    }
    if mine.iter().any(|p| p.answer.is_some_and(|a| a.flags.rst())) {
        r.add(Check::fail(
            "probe SYN",
            format!(
                "{target} answered the probe with a reset: nothing listens on port {} there, or \
                 a firewall rejects it; fix: start the test server, or correct --target",
                target.port()
            ),
        ));
    }
    for p in &mine {
        if let Some(a) = p.answer.filter(|a| !(a.flags.rst() || a.is_syn_ack())) {
            r.add(Check::warn(
                "probe SYN",
                format!(
                    "{target} answered the probe from {} with flags {:#04x}, not a SYN-ACK",
                    p.label(),
                    a.flags.0
                ),
            ));
        }
    }
    let silent: Vec<&Probe> = mine
        .iter()
        .copied()
        .filter(|p| p.answer.is_none())
        .collect();
    if silent.is_empty() {
        return;
    }
    // A plain connection from this host tells a dead or firewalled server from a routing
    // problem (it opens and closes one connection on the test server).
    match TcpStream::connect_timeout(&SocketAddr::V4(target), Duration::from_secs(2)) {
        Ok(s) => {
            let _ = s.shutdown(Shutdown::Both);
            let answered: BTreeSet<Ipv4Addr> = good.iter().map(|p| *p.me.ip()).collect();
            for p in silent {
                let check = match p.source {
                    Source::Pool => pool_unreached(p, args),
                    Source::Given | Source::Live => {
                        let seen = arp.ask(link, *target.ip(), *p.me.ip());
                        client_unreached(p, args, answered.len(), &seen)
                    }
                };
                r.add(check);
            }
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => r.add(Check::fail(
            "probe SYN",
            format!(
                "{target} refuses connections even from this host: nothing listens on port {} \
                 there (no answer to the probe from {} reached intercept either); fix: start the \
                 test server, or correct --target",
                target.port(),
                labels_of(&silent)
            ),
        )),
        Err(e) => r.add(Check::fail(
            "probe SYN",
            format!(
                "{target} answers neither the probe from {} nor a direct connection from this \
                 host ({e}): it is down, or a firewall drops port {}; fix: start it, or let port \
                 {} through to it",
                labels_of(&silent),
                target.port(),
                target.port()
            ),
        )),
    }
}

fn labels_of(probes: &[&Probe]) -> String {
    probes
        .iter()
        .map(|p| p.label())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The assistant's address as the copier knows it (its control address), for the fixes.
fn assistant_ip(args: &DoctorArgs) -> String {
    match args.daemon.mirror.first_intercept() {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => a.ip().to_string(),
    }
}

/// The pool's probe got no SYN-ACK though the test server accepts connections: its reply path
/// for the pool is broken.
fn pool_unreached(p: &Probe, args: &DoctorArgs) -> Check {
    let target = p.route.target;
    let client = *p.me.ip();
    let range = match args.daemon.mirror.client_ip_pool {
        Some((a, l)) => format!("{a}/{l}"),
        None => format!("{client}/32"),
    };
    let assist = assistant_ip(args);
    Check::fail(
        "probe SYN",
        format!(
            "{target} accepts connections from this host, but its SYN-ACK to the mirrored \
             client {client} did not reach intercept within {} ms. Likely causes, most common \
             first: (1) the test server has no route for {range} via the assistant, so its \
             replies go elsewhere (or nowhere); (2) strict rp_filter on the test server drops \
             the mirrored packets because it routes their source addresses out of another \
             interface than they arrive on; (3) a firewall on the test server drops packets \
             from {range}; (4) the route points at a host other than intercept's, or intercept \
             captures on the wrong interface; fix: on the test server, `deploy/routes.sh \
             test-host add --pool {range} --via {assist}` adds the route and sets rp_filter \
             loose (by hand: `ip route replace {range} via {assist}`, and `sysctl -w \
             net.ipv4.conf.all.rp_filter=2` and the same for the interface the mirrored packets \
             arrive on); `deploy/routes.sh test-host status --pool {range} --via {assist}` \
             there tells which",
            p.waited.as_millis()
        ),
    )
}

/// Who answers ARP for a client address on the test server's segment, as intercept saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ArpSeen {
    /// A host, by hardware address, on the assistant's interface.
    Host { mac: String, iface: String },
    /// Nobody, on the assistant's interface.
    Nobody { iface: String },
    /// intercept could not tell (no ARP socket, no answer to the query).
    Unknown,
}

/// Asks intercept who answers ARP for a client address on the test server's segment: it tells
/// what the test server does with replies that do not go via the assistant. Each address is
/// asked once; once intercept fails to answer, it is not asked again (each try waits 5 s).
#[derive(Default)]
struct ArpAsker {
    seen: HashMap<(Ipv4Addr, Ipv4Addr), ArpSeen>,
    silent: bool,
}

impl ArpAsker {
    fn ask(&mut self, link: &mut Link, target: Ipv4Addr, client: Ipv4Addr) -> ArpSeen {
        if self.silent {
            return ArpSeen::Unknown;
        }
        if let Some(s) = self.seen.get(&(target, client)) {
            return s.clone();
        }
        let q = DoctorQuery {
            target,
            arp: vec![ArpTarget {
                addr: client,
                pool: false,
            }],
        };
        let mut answer = None;
        if link.send(&CopierMessage::Doctor(q)).is_ok() {
            // intercept waits a second for ARP answers; late Feedback may come first.
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Ok(Some(m)) = link.recv_until(deadline) {
                if let InterceptMessage::DoctorReport(rep) = m {
                    answer = Some(arp_seen(&rep.checks));
                    break;
                }
            }
        }
        let Some(seen) = answer else {
            self.silent = true;
            return ArpSeen::Unknown;
        };
        self.seen.insert((target, client), seen.clone());
        seen
    }
}

/// Reads intercept's `arp` check (see `intercept::doctor::arp_checks`) for one client address.
fn arp_seen(checks: &[DoctorCheck]) -> ArpSeen {
    let iface_after = |rest: &str| rest.split_whitespace().next().map(str::to_owned);
    for c in checks.iter().filter(|c| c.name == "arp") {
        if let Some((mac, rest)) = c.detail.split_once(" answers ARP on ") {
            let is_mac = mac.len() == 17 && mac.split(':').count() == 6;
            if let (true, Some(iface)) = (is_mac, iface_after(rest)) {
                return ArpSeen::Host {
                    mac: mac.to_owned(),
                    iface,
                };
            }
        }
        if let Some(rest) = c.detail.strip_prefix("no host answers ARP on ") {
            if let Some(iface) = iface_after(rest) {
                return ArpSeen::Nobody { iface };
            }
        }
    }
    ArpSeen::Unknown
}

/// A real client's probe got no SYN-ACK though the test server accepts connections: the test
/// server does not route that client via the assistant. Names the client, what the test server
/// does with its replies instead, and the route that fixes it.
fn client_unreached(p: &Probe, args: &DoctorArgs, others_ok: usize, arp: &ArpSeen) -> Check {
    let target = p.route.target;
    let c = *p.me.ip();
    let assist = assistant_ip(args);
    let who = match p.source {
        Source::Live => format!(
            "live client {c} (seen sending to port {})",
            p.route.prod_port
        ),
        Source::Given => format!("--probe-client {c}"),
        Source::Pool => format!("mirrored client {c}"),
    };
    let does = match arp {
        ArpSeen::Host { mac, iface } => format!(
            "{c} is on the test server's segment ({mac} answers ARP for it there, on the \
             assistant's {iface}), so without a host route for {c} via the assistant the test \
             server hands its replies straight to that host, whose kernel resets them"
        ),
        ArpSeen::Nobody { iface } => format!(
            "no host answers ARP for {c} on the test server's segment (the assistant's {iface}), \
             so the test server sends its replies through a gateway (its default route) toward \
             the real client, which resets them, or drops them if it has no route for {c} at all"
        ),
        ArpSeen::Unknown => format!(
            "its route for {c} leads to the real client (which resets the replies), a gateway, \
             or nowhere (intercept could not tell who answers ARP for {c} on that segment)"
        ),
    };
    let others = match others_ok {
        0 => String::new(),
        1 => ", while the one to another client address did".into(),
        n => format!(", while those to {n} other client addresses did"),
    };
    Check::fail(
        "probe SYN",
        format!(
            "{who}: the test server {target} does not route its replies for {c} to the \
             assistant {assist}: no SYN-ACK to a probe SYN from {} reached intercept within {} \
             ms{others}, though {target} accepts connections from this host. What the test \
             server does with {c} instead: {does}. Every session mirrored from {c} would get no \
             replies (rarer causes: strict rp_filter or a firewall on the test server for this \
             source address); fix: on the test server, `deploy/routes.sh test-host add --pool \
             {c}/32 --via {assist}` (or `ip route replace {c}/32 via {assist}`)",
            p.me,
            p.waited.as_millis()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn doctor_cli_is_consistent() {
        DoctorArgs::command().debug_assert();
        let d = DoctorArgs::try_parse_from([
            "copier doctor",
            "--intercept",
            "198.18.0.4:36524",
            "--target",
            "198.18.0.3:3306",
            "--probe-client",
            "198.18.0.10",
        ])
        .unwrap();
        assert_eq!(probe_address(&d), Some(Ipv4Addr::new(198, 18, 0, 10)));
        let d = DoctorArgs::try_parse_from([
            "copier doctor",
            "--intercept",
            "198.18.0.4:36524",
            "--client-ip-pool",
            "198.19.0.0/24",
        ])
        .unwrap();
        assert_eq!(probe_address(&d), Some(Ipv4Addr::new(198, 19, 0, 254)));
    }

    fn doctor(extra: &[&str]) -> DoctorArgs {
        let mut argv = vec![
            "copier doctor",
            "--intercept",
            "198.18.0.4:36524",
            "--target",
            "198.18.0.3:3306",
        ];
        argv.extend(extra);
        DoctorArgs::try_parse_from(argv).unwrap()
    }

    fn client(addr: [u8; 4], packets: u64, ports: &[u16]) -> clients::Client {
        clients::Client {
            addr: Ipv4Addr::from(addr),
            packets,
            prod_ports: BTreeSet::from([3306]),
            ports: ports.iter().copied().collect(),
        }
    }

    #[test]
    fn probe_ports_avoid_the_clients_own() {
        let avoid: BTreeSet<u16> = (49152..65535).collect();
        assert_eq!(probe_port(7, &avoid, &[]), 65535);
        assert_eq!(probe_port(7, &avoid, &[65535]), 49152, "nothing left: any");
        let p = probe_port(12345, &BTreeSet::new(), &[]);
        assert!(p >= 49152);
        assert_ne!(probe_port(12345, &BTreeSet::from([p]), &[]), p);
        assert_ne!(probe_port(12345, &BTreeSet::new(), &[p]), p);
    }

    #[test]
    fn without_a_pool_the_busiest_live_clients_are_probed() {
        let routes = doctor(&[]).daemon.routes().unwrap();
        let seen: Vec<clients::Client> = (10..16)
            .map(|i| client([198, 18, 0, i], 100 - u64::from(i), &[50000, 50001]))
            .collect();
        let live = Live::Seen(seen);
        let probes = plan_probes(&doctor(&[]), &routes, &live);
        assert_eq!(probes.len(), MAX_LIVE_PROBES);
        assert!(probes.iter().all(|p| p.source == Source::Live));
        let ips: Vec<Ipv4Addr> = probes.iter().map(|p| *p.me.ip()).collect();
        assert_eq!(ips[0], Ipv4Addr::new(198, 18, 0, 10));
        assert!(probes
            .iter()
            .all(|p| ![50000, 50001].contains(&p.me.port())));

        // --probe-client comes on top, once even when it is live too.
        let given = doctor(&["--probe-client", "198.18.0.11"]);
        let probes = plan_probes(&given, &routes, &live);
        assert_eq!(probes.len(), MAX_LIVE_PROBES + 1);
        assert_eq!(probes[0].source, Source::Given);
        assert_eq!(
            probes
                .iter()
                .filter(|p| *p.me.ip() == Ipv4Addr::new(198, 18, 0, 11))
                .count(),
            1
        );

        // A client of another production port is not mirrored to this route.
        let mut other = client([198, 18, 0, 20], 1, &[]);
        other.prod_ports = BTreeSet::from([3307]);
        assert!(plan_probes(&doctor(&[]), &routes, &Live::Seen(vec![other])).is_empty());
        assert!(plan_probes(&doctor(&[]), &routes, &Live::NotWatched("x".into())).is_empty());
    }

    #[test]
    fn with_a_pool_only_the_pool_is_probed() {
        let d = doctor(&["--client-ip-pool", "198.19.0.0/24"]);
        let routes = d.daemon.routes().unwrap();
        let live = Live::Seen(vec![client([198, 18, 0, 10], 5, &[])]);
        let probes = plan_probes(&d, &routes, &live);
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].source, Source::Pool);
        assert_eq!(*probes[0].me.ip(), Ipv4Addr::new(198, 19, 0, 254));
    }

    #[test]
    fn intercepts_arp_answer_is_read() {
        // The wording of intercept::doctor::arp_checks (the lab test checks the two agree).
        let host = DoctorCheck::new(
            1,
            "arp",
            "02:54:53:44:00:0a answers ARP on eth0 for client address 198.18.0.10: a real \
             client on the test server's segment; ...",
        );
        assert_eq!(
            arp_seen(&[DoctorCheck::new(0, "ip_forward", "0"), host]),
            ArpSeen::Host {
                mac: "02:54:53:44:00:0a".into(),
                iface: "eth0".into()
            }
        );
        let nobody = DoctorCheck::new(
            0,
            "arp",
            "no host answers ARP on eth0 for the 1 mirrored client address(es) asked",
        );
        assert_eq!(
            arp_seen(&[nobody]),
            ArpSeen::Nobody {
                iface: "eth0".into()
            }
        );
        let cannot = DoctorCheck::new(1, "arp", "cannot send ARP requests on eth0: denied");
        assert_eq!(arp_seen(&[cannot]), ArpSeen::Unknown);
        assert_eq!(arp_seen(&[]), ArpSeen::Unknown);
        let odd = DoctorCheck::new(1, "arp", "garbage answers ARP on ");
        assert_eq!(arp_seen(&[odd]), ArpSeen::Unknown);
    }

    #[test]
    fn a_client_without_a_reply_path_is_named_with_its_route_and_fix() {
        let d = doctor(&[]);
        let route = d.daemon.routes().unwrap()[0];
        let mut probes = Vec::new();
        push_probe(
            &mut probes,
            1,
            Ipv4Addr::new(198, 18, 0, 10),
            Source::Live,
            route,
            &BTreeSet::new(),
        );
        probes[0].waited = Duration::from_millis(2000);
        let arp = ArpSeen::Host {
            mac: "02:54:53:44:00:0a".into(),
            iface: "eth0".into(),
        };
        let c = client_unreached(&probes[0], &d, 1, &arp);
        assert_eq!(c.level, Level::Fail);
        let (message, fix) = c.message_and_fix();
        for words in [
            "live client 198.18.0.10 (seen sending to port 3306)",
            "does not route its replies for 198.18.0.10 to the assistant 198.18.0.4",
            "within 2000 ms, while the one to another client address did",
            "02:54:53:44:00:0a answers ARP for it",
        ] {
            assert!(message.contains(words), "{words:?} not in {message}");
        }
        assert_eq!(
            fix,
            Some(
                "on the test server, `deploy/routes.sh test-host add --pool 198.18.0.10/32 \
                 --via 198.18.0.4` (or `ip route replace 198.18.0.10/32 via 198.18.0.4`)"
            )
        );
    }

    #[test]
    fn the_json_report_holds_every_check_and_the_summary() {
        let d = doctor(&["--json"]);
        let mut r = Report::default();
        r.add(Check::ok("clock", "synchronised"));
        r.add(Check::fail("mtu", "too small; fix: --mss 1360"));
        let v: serde_json::Value = serde_json::from_str(&json(&d, &r)).unwrap();
        assert_eq!(v["schema"], "tcpshadow.doctor/1");
        assert_eq!(v["failed"], true);
        assert_eq!(v["summary"]["checks"], 2);
        assert_eq!(v["summary"]["fail"], 1);
        assert_eq!(v["summary"]["line"], "2 checks: 1 ok, 0 warn, 1 FAIL");
        assert_eq!(v["routes"][0]["target"], "198.18.0.3:3306");
        let checks = v["checks"].as_array().unwrap();
        assert_eq!(checks[0]["status"], "ok");
        assert_eq!(checks[0]["fix"], serde_json::Value::Null);
        assert_eq!(checks[1]["name"], "mtu");
        assert_eq!(checks[1]["status"], "fail");
        assert_eq!(checks[1]["message"], "too small");
        assert_eq!(checks[1]["fix"], "--mss 1360");
    }

    #[test]
    fn every_flag_is_a_config_key_with_its_environment_variable() {
        let bad = ops::config::env_inconsistencies(&Args::command(), &[]);
        assert!(bad.is_empty(), "{bad:#?}");
    }

    #[test]
    fn the_example_config_file_loads_and_documents_every_key() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/copier.toml");
        let cfg = ops::config::ConfigFile::load(&path, &Args::command()).unwrap();
        let m = cfg
            .apply(Args::command())
            .try_get_matches_from(["copier"])
            .unwrap();
        let a = <Args as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        assert_eq!(a.port(), 3306);
        assert_eq!(
            a.mirror.client_ip_pool,
            Some((Ipv4Addr::new(198, 19, 0, 0), 24))
        );
        let text = std::fs::read_to_string(&path).unwrap();
        for arg in ops::config::config_keys(&Args::command()) {
            let key = arg.get_long().unwrap_or_default();
            assert!(
                text.lines().any(|l| l
                    .trim_start_matches(['#', ' '])
                    .starts_with(&format!("{key} ="))),
                "deploy/copier.toml does not document `{key}`: add it (commented out if it has \
                 no sensible example value)"
            );
        }
    }

    #[test]
    fn a_doctor_takes_the_daemons_config_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/copier.toml");
        let argv = vec![
            "copier doctor".into(),
            "--config".into(),
            path.into_os_string(),
            "--probe-wait-ms".into(),
            "500".into(),
        ];
        let p = ops::config::parse::<DoctorArgs>(DoctorArgs::command(), &Args::command(), argv)
            .unwrap();
        assert_eq!(p.args.probe_wait_ms, 500);
        assert_eq!(
            p.args.daemon.mirror.first_intercept(),
            "198.18.0.4:36524".parse().unwrap()
        );
    }
}
