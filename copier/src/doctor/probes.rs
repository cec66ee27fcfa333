//! The doctor's probe SYNs: planned from the mirrored client addresses (the pool's, or the
//! live clients' own and `--probe-client`), sent toward the test server as a mirrored
//! session's would be, and judged by the SYN-ACKs intercept relays back; each failure is
//! explained with its likely cause and fix.
//!
//! Must never leave a half-open connection on the test server (every probe is reset), nor
//! send anywhere but the configured targets.

use common::seq::SeqNumber;
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::control::{ArpTarget, CopierMessage, DoctorCheck, DoctorQuery, InterceptMessage};
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};
use ops::check::{Check, Report};

use super::clients::{Live, MAX_LIVE_PROBES};
use super::link::Link;
use super::DoctorArgs;
use crate::send::RawSender;
use crate::settings::Route;

/// The probe's client address: the last of the pool (a running copier starts from hashes of
/// its clients, so it is as unlikely to be in use as any), or --probe-client.
pub(super) fn probe_address(args: &DoctorArgs) -> Option<Ipv4Addr> {
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

/// Where a probe's client address comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// The last address of `--client-ip-pool`.
    Pool,
    /// `--probe-client`.
    Given,
    /// A client seen querying production.
    Live,
}

/// The probe's SYN-ACK (or other answer) as intercept relayed it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Answer {
    pub(super) flags: TcpFlags,
    /// 0: the first SYN; 1: the retry.
    pub(super) attempt: u32,
    pub(super) took: Duration,
}

impl Answer {
    fn is_syn_ack(&self) -> bool {
        self.flags.syn() && self.flags.ack()
    }
}

/// One probe SYN: from `me` to the route's target.
#[derive(Clone, Debug)]
pub(super) struct Probe {
    pub(super) source: Source,
    pub(super) route: Route,
    pub(super) me: SocketAddrV4,
    pub(super) isn: u32,
    pub(super) answer: Option<Answer>,
    /// How long the probes waited in all.
    pub(super) waited: Duration,
}

impl Probe {
    pub(super) fn label(&self) -> String {
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
            seq: SeqNumber(seq),
            ack: SeqNumber(0),
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
pub(super) fn plan_probes(args: &DoctorArgs, routes: &[Route], live: &Live) -> Vec<Probe> {
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
pub(super) fn push_probe(
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
pub(super) fn probe_port(seed: u32, avoid: &BTreeSet<u16>, taken: &[u16]) -> u16 {
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
pub(super) fn send_probes(
    r: &mut Report,
    link: &mut Link,
    probes: &mut [Probe],
    args: &DoctorArgs,
) -> bool {
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
pub(super) fn judge_probes(
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

pub(super) fn labels_of(probes: &[&Probe]) -> String {
    probes
        .iter()
        .map(|p| p.label())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The assistant's address as the copier knows it (its control address), for the fixes.
pub(super) fn assistant_ip(args: &DoctorArgs) -> String {
    match args.daemon.mirror.first_intercept() {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => a.ip().to_string(),
    }
}

/// The pool's probe got no SYN-ACK though the test server accepts connections: its reply path
/// for the pool is broken.
pub(super) fn pool_unreached(p: &Probe, args: &DoctorArgs) -> Check {
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
pub(super) enum ArpSeen {
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
pub(super) struct ArpAsker {
    pub(super) seen: HashMap<(Ipv4Addr, Ipv4Addr), ArpSeen>,
    pub(super) silent: bool,
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
pub(super) fn arp_seen(checks: &[DoctorCheck]) -> ArpSeen {
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
pub(super) fn client_unreached(
    p: &Probe,
    args: &DoctorArgs,
    others_ok: usize,
    arp: &ArpSeen,
) -> Check {
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
