//! `copier doctor`: checks the whole mirror path from the production host and explains each
//! failure with its likely cause and fix.
//!
//! It takes the live copier's flags and config file, so it checks exactly what the daemon
//! would run with. Local checks (capabilities, target, route MTU, rp_filter, conntrack, clock)
//! need nothing else. Then it talks to intercept over the control channel as a copier would:
//! the Hello checks reachability, token and protocol version; a Doctor query has intercept
//! check the assistant (forwarding, the segment it shares with the test server, and who
//! answers ARP for the mirrored client addresses there); finally a probe SYN, sent from a
//! mirrored client address exactly as a mirrored session's would be, must be answered by the
//! test server with a SYN-ACK that intercept captures and relays back to us (we Claim the
//! probe's address first, as a session does). The probe is then reset, so the test server
//! keeps no half-open connection.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use common::control::{
    ArpTarget, CopierMessage, DoctorQuery, FrameDecoder, Hello, InterceptMessage, WireMessage,
    PROTOCOL_VERSION,
};
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};
use ops::check::{Check, Level, Report};
use ops::host;

use crate::cli::{validate_target, Args, Protocol, Route};
use crate::send::RawSender;

/// `copier doctor`: the live copier's flags and config file, plus what only the doctor takes.
#[derive(Parser, Debug)]
#[command(
    name = "copier doctor",
    about = "Check the mirror path from this production host: capabilities, the target, MTU, \
             conntrack, clock, intercept (reachable, same version, token), the assistant's \
             settings, who answers ARP for the mirrored client addresses, and a probe SYN whose \
             SYN-ACK must reach intercept. Takes the daemon's own flags or --config. Exit \
             status 1 if any check FAILs."
)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub daemon: Args,

    /// Client address to send the probe SYN from when there is no --client-ip-pool: a real
    /// client's address, which the test server routes via the assistant. With a pool, the
    /// probe uses a pool address.
    #[arg(long, value_name = "IP")]
    pub probe_client: Option<Ipv4Addr>,

    /// How long to wait for the probe's SYN-ACK at intercept, in milliseconds.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub probe_wait_ms: u64,
}

/// Runs every check, printing each line as it goes; returns the report.
pub fn run(args: &DoctorArgs) -> Report {
    let mut r = Report::printing();
    let d = &args.daemon;
    let m = &d.mirror;
    let routes = d.routes();
    println!(
        "copier doctor on {}: {}, intercept {}{}",
        host::hostname(),
        match &routes {
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
    );

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

    let secret = match m.secret() {
        Ok(t) => t,
        Err(e) => {
            r.add(Check::fail("secret", format!("{e:#}")));
            return finish(r);
        }
    };
    let hello = Hello::new(&format!("copier-doctor@{}", host::hostname()));
    let mut link = match intercept_link(&mut r, m.first_intercept(), hello, secret.as_ref(), m.protocol) {
        Some(l) => l,
        None => {
            r.add(Check::warn(
                "probe",
                "skipped: the probe SYN, the assistant's settings and the ARP check all need \
                 intercept",
            ));
            return finish(r);
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
        return finish(r);
    };
    let probe_ip = probe_address(args);
    assistant_checks(&mut r, &mut link, args, first, probe_ip);
    match (probe_ip, raw_ok) {
        (None, _) => r.add(Check::warn(
            "probe SYN",
            "skipped: no --client-ip-pool, so give --probe-client IP (a real client's address, \
             routed by the test server via the assistant) to test the reply path",
        )),
        (Some(_), false) => r.add(Check::warn(
            "probe SYN",
            "skipped: sending it needs CAP_NET_RAW (see the capabilities check)",
        )),
        (Some(ip), true) => {
            for route in &good_routes {
                probe(&mut r, &mut link, ip, route, args);
            }
        }
    }
    let _ = link.stream.shutdown(Shutdown::Both);
    finish(r)
}

fn finish(r: Report) -> Report {
    println!("{}", r.summary());
    r
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
            "the monotonic clock goes backwards: timers and pacing break; fix the kernel's \
             clocksource",
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

/// A SYN from `client` to the route's target; its SYN-ACK must come back through intercept.
fn probe(r: &mut Report, link: &mut Link, client: Ipv4Addr, route: &Route, args: &DoctorArgs) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // An ephemeral-range port unlikely to be a live session's at this very moment.
    let port = 49152 + ((nanos ^ std::process::id()) % 16000) as u16;
    let me = SocketAddrV4::new(client, port);
    let isn = nanos.wrapping_mul(2_654_435_761);
    let target = route.target;
    let mut sender = match RawSender::open() {
        Ok(s) => s,
        Err(e) => {
            r.add(Check::fail("probe SYN", format!("{e:#}")));
            return;
        }
    };
    let claimed = link
        .send(&CopierMessage::Claim(vec![me]))
        .and_then(|()| link.sync(1, Duration::from_secs(3)));
    if !matches!(claimed, Ok(true)) {
        r.add(Check::fail(
            "probe SYN",
            "intercept did not confirm the probe's Claim: the control connection broke",
        ));
        return;
    }
    let segment = |flags: u8, seq: u32, ack: u32| SegmentRepr {
        src: client,
        dst: *target.ip(),
        src_port: port,
        dst_port: target.port(),
        seq,
        ack,
        flags: TcpFlags(flags),
        window: if flags & TcpFlags::RST != 0 { 0 } else { 64240 },
        options: TcpOptions {
            mss: (flags & TcpFlags::SYN != 0).then_some(args.daemon.mirror.mss),
            ..TcpOptions::default()
        },
        ip_id: (nanos & 0xffff) as u16,
        ttl: 64,
    };
    let mut buf = [0u8; 128];
    let mut send = |sender: &mut RawSender, repr: SegmentRepr| {
        if let Ok(n) = emit_ipv4_tcp(&repr, &[], &mut buf) {
            sender.send(&buf[..n], *target.ip());
        }
    };
    let started = Instant::now();
    let wait = Duration::from_millis(args.probe_wait_ms);
    let mut answer = None;
    // Two tries: one lost SYN on a busy network must not fail the doctor.
    'tries: for attempt in 0..2u32 {
        send(&mut sender, segment(TcpFlags::SYN, isn, 0));
        let deadline = Instant::now() + wait / 2;
        loop {
            match link.recv_until(deadline) {
                Ok(Some(InterceptMessage::Feedback(items))) => {
                    if let Some(fb) = items.into_iter().find(|f| f.client == me) {
                        answer = Some((fb, attempt));
                        break 'tries;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    r.add(Check::fail(
                        "probe SYN",
                        format!("the control connection broke while waiting: {e}"),
                    ));
                    return;
                }
            }
        }
    }
    let took = started.elapsed();
    let _ = link.send(&CopierMessage::Release(vec![me]));
    if sender.stats.errors > 0 {
        r.add(Check::fail(
            "probe SYN",
            format!(
                "sending the probe from {client} failed ({} errors): see the log line above",
                sender.stats.errors
            ),
        ));
        return;
    }
    match answer {
        Some((fb, attempt)) if fb.flags.syn() && fb.flags.ack() => {
            // Reset it: the test server must not keep a half-open connection for us.
            send(&mut sender, segment(TcpFlags::RST, isn.wrapping_add(1), 0));
            r.add(Check::ok(
                "probe SYN",
                format!(
                    "{} answered a SYN from mirrored client {me} with a SYN-ACK that reached \
                     intercept in {} ms{} (then reset)",
                    target,
                    took.as_millis(),
                    if attempt > 0 { ", after one retry" } else { "" }
                ),
            ));
        }
        Some((fb, _)) if fb.flags.rst() => r.add(Check::fail(
            "probe SYN",
            format!(
                "{target} answered the probe with a reset: nothing listens on port {} there, or \
                 a firewall rejects it; fix: start the test server, or correct --target",
                target.port()
            ),
        )),
        Some((fb, _)) => r.add(Check::warn(
            "probe SYN",
            format!(
                "{target} answered the probe with flags {:#04x}, not a SYN-ACK",
                fb.flags.0
            ),
        )),
        None => no_syn_ack(r, client, route, args, took),
    }
}

/// No SYN-ACK at intercept: tell what we can about why.
fn no_syn_ack(r: &mut Report, client: Ipv4Addr, route: &Route, args: &DoctorArgs, took: Duration) {
    let target = route.target;
    let pool = args.daemon.mirror.client_ip_pool;
    let range = match pool {
        Some((a, l)) => format!("{a}/{l}"),
        None => format!("{client}/32"),
    };
    let assist = match args.daemon.mirror.first_intercept() {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => a.ip().to_string(),
    };
    // A plain connection from this host tells a dead or firewalled server from a routing
    // problem (it opens and closes one connection on the test server).
    let direct = TcpStream::connect_timeout(&SocketAddr::V4(target), Duration::from_secs(2));
    let what = match direct {
        Ok(s) => {
            let _ = s.shutdown(Shutdown::Both);
            format!(
                "{target} accepts connections from this host, but its SYN-ACK to the mirrored \
                 client {client} did not reach intercept within {} ms. Likely causes, most \
                 common first: (1) the test server has no route for {range} via the assistant, so \
                 its replies go elsewhere (or nowhere) — fix, on the test server: \
                 `deploy/routes.sh test-host add --pool {range} --via {assist}`; (2) strict \
                 rp_filter on the test server drops the mirrored packets because it routes their \
                 source addresses out of another interface than they arrive on — fix: \
                 `sysctl -w net.ipv4.conf.all.rp_filter=2` and the same for that interface \
                 (`deploy/routes.sh test-host add` sets loose mode); (3) a firewall on the test \
                 server drops packets from {range}; (4) the route points at a host other than \
                 intercept's, or intercept captures on the wrong interface",
                took.as_millis()
            )
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => format!(
            "{target} refuses connections even from this host: nothing listens on port {} \
             there; fix: start the test server, or correct --target",
            target.port()
        ),
        Err(e) => format!(
            "{target} answers neither the probe nor a direct connection from this host ({e}): \
             it is down, or a firewall drops port {}; fix that first",
            target.port()
        ),
    };
    r.add(Check::fail("probe SYN", what));
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
