//! intercept's side of the doctor: what must hold on the assistant for the test server's
//! replies to reach intercept and die there.
//!
//! [`local_checks`] serve both `intercept doctor` (run by hand on the assistant) and the
//! running daemon's answer to a copier's doctor ([`answer`]), which adds what only a host on
//! the test server's segment can see: who answers ARP for the mirrored client addresses.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::control::{
    encode_hello, DoctorCheck, DoctorQuery, DoctorReport, FrameDecoder, Hello, InterceptMessage,
};
use ops::check::{Check, Level};
use ops::host;

use crate::capture::{CaptureOptions, CaptureSource, CapturedPayload};
use crate::pump::SegmentSource;

/// How long the ARP check waits for answers.
const ARP_WAIT: Duration = Duration::from_millis(1000);

/// What intercept is set up to do (from its command line or config file).
#[derive(Clone, Debug)]
pub struct Setup {
    pub interface: String,
    pub listen: SocketAddr,
    pub ports: Vec<u16>,
    pub server: Option<Ipv4Addr>,
    pub direction: pcap::Direction,
}

/// The interfaces replies may arrive on: the capture interface, or every one but `lo` for
/// `any`.
fn reply_interfaces(setup: &Setup) -> Vec<String> {
    if setup.interface == "any" {
        host::interfaces()
            .into_iter()
            .filter(|i| i != "lo")
            .collect()
    } else {
        vec![setup.interface.clone()]
    }
}

/// Forwarding, proxy ARP and rp_filter on the assistant.
pub fn forwarding_checks(setup: &Setup) -> Vec<Check> {
    let mut out = Vec::new();
    let ifaces = reply_interfaces(setup);
    let global = host::sysctl_int("net/ipv4/ip_forward");
    let forwarding: Vec<&String> = ifaces
        .iter()
        .filter(|i| host::ipv4_conf(i, "forwarding") == Some(1))
        .collect();
    let fix = "fix: `sysctl -w net.ipv4.ip_forward=0` (and set it in /etc/sysctl.d/, or run \
               `deploy/routes.sh assist-host setup`)";
    if global == Some(1) || !forwarding.is_empty() {
        let on: Vec<String> = forwarding.iter().map(|s| s.to_string()).collect();
        out.push(Check::fail(
            "ip_forward",
            format!(
                "this host forwards IPv4 (net.ipv4.ip_forward={}, forwarding on: {}): the test \
                 server's replies are forwarded on to the clients, which reset the mirrored \
                 connections (and the test server gets ICMP redirects to bypass this host); {fix}",
                global.map_or("?".into(), |v| v.to_string()),
                if on.is_empty() {
                    "-".into()
                } else {
                    on.join(" ")
                },
            ),
        ));
    } else if global.is_none() {
        out.push(Check::warn(
            "ip_forward",
            "cannot read /proc/sys/net/ipv4/ip_forward; make sure this host does not forward",
        ));
    } else {
        out.push(Check::ok(
            "ip_forward",
            format!(
                "0 (on {}): replies to mirrored clients die here after capture",
                ifaces.join(" ")
            ),
        ));
    }
    let proxy: Vec<&String> = ifaces
        .iter()
        .filter(|i| host::ipv4_conf(i, "proxy_arp") == Some(1))
        .collect();
    if host::ipv4_conf("all", "proxy_arp") == Some(1) || !proxy.is_empty() {
        out.push(Check::warn(
            "proxy_arp",
            format!(
                "proxy_arp is on ({}): harmless while forwarding is off, but this host then \
                 answers ARP for addresses it routes elsewhere; fix: `sysctl -w \
                 net.ipv4.conf.all.proxy_arp=0` (`deploy/routes.sh assist-host setup` does it)",
                proxy
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ));
    } else {
        out.push(Check::ok("proxy_arp", "off"));
    }
    let rp: Vec<String> = ifaces
        .iter()
        .filter_map(|i| {
            host::effective_rp_filter(i).map(|v| format!("{i}={}", host::rp_filter_name(v)))
        })
        .collect();
    out.push(Check::ok(
        "rp_filter",
        format!(
            "{} (does not matter here: replies are captured before the kernel's routing \
             decision, then dropped by it either way)",
            if rp.is_empty() {
                "?".into()
            } else {
                rp.join(" ")
            }
        ),
    ));
    out
}

/// `intercept doctor`: everything this host can tell by itself.
pub fn standalone_checks(setup: &Setup, arp: &[(Ipv4Addr, bool)]) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(capability_check());
    out.extend(forwarding_checks(setup));
    if setup.interface != "any"
        && !std::path::Path::new("/sys/class/net")
            .join(&setup.interface)
            .exists()
    {
        out.push(Check::fail(
            "interface",
            format!(
                "no interface {} on this host (have: {}); fix: --interface with one of them, or `any`",
                setup.interface,
                host::interfaces().join(" ")
            ),
        ));
    }
    out.push(listen_check(setup));
    out.push(capture_check(setup));
    if !arp.is_empty() {
        let segment = match setup.server {
            Some(s) => host::route_to(s)
                .ok()
                .and_then(|r| r.iface.map(|i| (i, r.src))),
            None if setup.interface != "any" => host::ipv4_addrs()
                .into_iter()
                .find(|a| a.iface == setup.interface)
                .map(|a| (a.iface, a.addr)),
            None => None,
        };
        match segment {
            Some((iface, src)) => out.extend(arp_checks(&iface, src, arp, None)),
            None => out.push(Check::warn(
                "arp",
                "not checked: give --server (the test server) or a capture --interface, so the \
                 doctor knows which segment to ask on",
            )),
        }
    }
    out
}

fn capability_check() -> Check {
    let Some(caps) = host::effective_caps() else {
        return Check::warn("capabilities", "cannot read /proc/self/status");
    };
    if host::has_cap(caps, host::CAP_NET_RAW) {
        Check::ok(
            "capabilities",
            if host::has_cap(caps, host::CAP_NET_ADMIN) {
                "CAP_NET_RAW and CAP_NET_ADMIN"
            } else {
                "CAP_NET_RAW (CAP_NET_ADMIN missing: fine unless the capture needs promiscuous mode)"
            },
        )
    } else {
        Check::fail(
            "capabilities",
            "no CAP_NET_RAW: intercept cannot capture; fix: run as root, or with \
             AmbientCapabilities=CAP_NET_RAW CAP_NET_ADMIN (deploy/systemd/tcpshadow-intercept.service)",
        )
    }
}

/// Can the daemon listen for copiers there, or does one already?
fn listen_check(setup: &Setup) -> Check {
    let addr = setup.listen;
    if let SocketAddr::V4(a) = addr {
        if !a.ip().is_unspecified() && !host::is_local(*a.ip()) {
            return Check::fail(
                "listen",
                format!(
                    "--listen {addr}: {} is not an address of this host; fix: use one of {} or 0.0.0.0",
                    a.ip(),
                    host::ipv4_addrs()
                        .iter()
                        .map(|x| x.addr.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            );
        }
    }
    match TcpListener::bind(addr) {
        Ok(_) => Check::ok(
            "listen",
            format!("{addr} is free (no intercept listens there now)"),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match hello(addr) {
            Ok(name) => Check::ok(
                "listen",
                format!("{addr}: a running intercept answers ({name}), same protocol version"),
            ),
            Err(why) => Check::fail(
                "listen",
                format!(
                    "{addr} is taken by something that is not a working intercept ({why}); \
                     fix: stop it, or choose another --listen (and the copiers' --intercept)"
                ),
            ),
        },
        Err(e) => Check::fail(
            "listen",
            format!("cannot listen on {addr}: {e}; fix: choose another --listen"),
        ),
    }
}

/// A Hello to whatever listens at `addr`: the intercept's name, or why not.
fn hello(addr: SocketAddr) -> Result<String, String> {
    let target = match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, a.port()))
        }
        a => a,
    };
    let mut s =
        TcpStream::connect_timeout(&target, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut out = Vec::new();
    encode_hello(&Hello::new("intercept-doctor"), &mut out).map_err(|e| e.to_string())?;
    s.write_all(&out).map_err(|e| e.to_string())?;
    let mut dec = FrameDecoder::<InterceptMessage>::new();
    let mut buf = [0u8; 4096];
    loop {
        match dec.next_message() {
            // The Challenge is enough: only an intercept of our version sends one. The doctor
            // goes no further (it would need the secret, and intercept would log a refusal).
            Ok(Some(InterceptMessage::Challenge(c))) => {
                return Ok(if c.secret_required {
                    "secret required".into()
                } else {
                    "open control channel".into()
                })
            }
            Ok(Some(InterceptMessage::Welcome(w))) => return Ok(w.name),
            Ok(Some(InterceptMessage::Reject(r))) => return Err(r.reason),
            Ok(Some(_)) => return Err("unexpected first frame".into()),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        match s.read(&mut buf) {
            Ok(0) => return Err("closed the connection".into()),
            Ok(n) => dec.feed(&buf[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Opens the capture as the daemon would and watches it briefly for replies.
fn capture_check(setup: &Setup) -> Check {
    let opts = CaptureOptions {
        interface: setup.interface.clone(),
        ports: setup.ports.clone(),
        server: setup.server,
        payload: CapturedPayload::Prefix(0),
        direction: setup.direction,
        buffer_bytes: 1 << 20,
        // A reply must show up within the doctor's short watch, not wait for a block.
        block_ms: 0,
    };
    let mut source = match CaptureSource::open(&opts) {
        Ok(s) => s,
        Err(e) => return Check::fail("capture", format!("{e:#}")),
    };
    let watch = Duration::from_secs(2);
    let until = Instant::now() + watch;
    let mut seen = 0u64;
    let mut servers = BTreeMap::new();
    while Instant::now() < until {
        match source.poll_segment(|p, _| {
            *servers.entry(p.src).or_insert(0u64) += 1;
        }) {
            Ok(true) => seen += 1,
            Ok(false) => {
                let _ = source.wait(Duration::from_millis(100));
            }
            Err(e) => return Check::fail("capture", format!("{e:#}")),
        }
    }
    let ports = setup
        .ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if seen == 0 {
        Check::warn(
            "capture",
            format!(
                "capture on {} works, but no reply from port {ports} was seen in {}s: normal \
                 while no copier mirrors; otherwise the test server does not route the client \
                 addresses to this host (check its routes: `deploy/routes.sh test-host status`)",
                setup.interface,
                watch.as_secs()
            ),
        )
    } else {
        let from: Vec<String> = servers.keys().map(Ipv4Addr::to_string).collect();
        Check::ok(
            "capture",
            format!(
                "{seen} replies from port {ports} in {}s (from {})",
                watch.as_secs(),
                from.join(" ")
            ),
        )
    }
}

/// Who answers ARP for `targets` (address, whether it is a pool address) on `iface`, on `sock`
/// (opened before the daemon dropped CAP_NET_RAW) or a socket opened now.
pub fn arp_checks(
    iface: &str,
    src: Ipv4Addr,
    targets: &[(Ipv4Addr, bool)],
    sock: Option<&ops::arp::ArpSocket>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let own_pool: Vec<Ipv4Addr> = targets
        .iter()
        .filter(|(a, pool)| *pool && host::is_local(*a))
        .map(|(a, _)| *a)
        .collect();
    if !own_pool.is_empty() {
        out.push(Check::fail(
            "arp",
            format!(
                "mirrored client address {} is assigned on this host: its kernel would answer \
                 the test server's replies with resets instead of dropping them; fix: `ip addr \
                 del` it here",
                join_ips(&own_pool)
            ),
        ));
    }
    let addrs: Vec<Ipv4Addr> = targets.iter().map(|(a, _)| *a).collect();
    let probed = match sock {
        Some(s) => s.probe(iface, src, &addrs, ARP_WAIT),
        None => ops::arp::probe(iface, src, &addrs, ARP_WAIT),
    };
    let answers = match probed {
        Ok(a) => a,
        Err(e) => {
            out.push(Check::warn(
                "arp",
                format!("cannot send ARP requests on {iface}: {e} (needs CAP_NET_RAW)"),
            ));
            return out;
        }
    };
    // By answering MAC: a whole range from one host is one finding, not hundreds.
    let mut by_mac: BTreeMap<[u8; 6], (Vec<Ipv4Addr>, Vec<Ipv4Addr>)> = BTreeMap::new();
    for a in &answers {
        let pool = targets.iter().any(|(t, p)| *t == a.ip && *p);
        let e = by_mac.entry(a.mac).or_default();
        if pool {
            e.0.push(a.ip);
        } else {
            e.1.push(a.ip);
        }
    }
    for (mac, (pool, clients)) in &by_mac {
        let mac = host::format_mac(mac);
        if !pool.is_empty() {
            out.push(Check::fail(
                "arp",
                format!(
                    "{mac} answers ARP on {iface} for mirrored client address {} (from \
                     --client-ip-pool): a host other than this assistant claims them (the \
                     address configured on it, or proxy ARP on a router or switch); whenever the \
                     test server resolves them it sends its replies there, and that host resets \
                     the mirrored sessions; fix: remove the address from that host, or turn off \
                     its proxy ARP, or pick a --client-ip-pool nobody uses",
                    join_ips(pool)
                ),
            ));
        }
        if !clients.is_empty() {
            out.push(Check::warn(
                "arp",
                format!(
                    "{mac} answers ARP on {iface} for client address {}: a real client on the \
                     test server's segment; the test server must keep its host route for it via \
                     this assistant, or its replies reach the client, which resets them \
                     (`deploy/routes.sh test-host status`)",
                    join_ips(clients)
                ),
            ));
        }
    }
    if by_mac.is_empty() {
        out.push(Check::ok(
            "arp",
            format!(
                "no host answers ARP on {iface} for the {} mirrored client address(es) asked",
                addrs.len()
            ),
        ));
    }
    out
}

fn join_ips(ips: &[Ipv4Addr]) -> String {
    const SHOWN: usize = 4;
    let mut s: Vec<String> = ips.iter().take(SHOWN).map(Ipv4Addr::to_string).collect();
    if ips.len() > SHOWN {
        s.push(format!("and {} more", ips.len() - SHOWN));
    }
    s.join(", ")
}

/// The running daemon's answer to a copier's doctor; `arp` is the socket it opened for ARP
/// checks before dropping its capabilities (`None`: open one now, which needs CAP_NET_RAW).
pub fn answer(
    setup: &Setup,
    q: &DoctorQuery,
    arp: Option<&std::sync::Mutex<ops::arp::ArpSocket>>,
) -> DoctorReport {
    let mut checks = forwarding_checks(setup);
    match host::route_to(q.target) {
        Ok(r) => {
            let iface = r.iface.clone().unwrap_or_else(|| "?".into());
            if r.on_link {
                checks.push(Check::ok(
                    "segment",
                    format!(
                        "the test server {} is on this host's subnet ({iface}, from {})",
                        q.target, r.src
                    ),
                ));
            } else {
                checks.push(Check::fail(
                    "segment",
                    format!(
                        "the test server {} is not on a subnet of this host (reached from {} \
                         through a router): the test server cannot route the client addresses \
                         to this host; fix: run intercept on a host of the test server's subnet",
                        q.target, r.src
                    ),
                ));
            }
            if setup.interface != "any" && r.iface.as_deref() != Some(setup.interface.as_str()) {
                checks.push(Check::warn(
                    "interface",
                    format!(
                        "the test server is reached on {iface} but intercept captures on {}: \
                         replies arriving on {iface} are missed; fix: --interface {iface} or any",
                        setup.interface
                    ),
                ));
            }
            if !q.arp.is_empty() {
                let targets: Vec<(Ipv4Addr, bool)> =
                    q.arp.iter().map(|a| (a.addr, a.pool)).collect();
                if let Some(i) = &r.iface {
                    // One probe at a time on the shared socket: answers would mix.
                    let guard = arp.map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
                    checks.extend(arp_checks(i, r.src, &targets, guard.as_deref()));
                }
            }
        }
        Err(e) => checks.push(Check::fail(
            "segment",
            format!(
                "no route from this host to the test server {}: {e}",
                q.target
            ),
        )),
    }
    DoctorReport {
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        checks: checks
            .iter()
            .take(common::control::MAX_DOCTOR_CHECKS)
            .map(|c| DoctorCheck::new(c.level.to_u8(), &c.name, &c.detail))
            .collect(),
    }
}

/// A check received from intercept.
pub fn from_wire(c: &DoctorCheck) -> Check {
    Check::new(Level::from_u8(c.level), c.name.clone(), c.detail.clone())
}
