//! The doctor's look at the live clients: a short, bounded capture of the production ports, so
//! that the reply path is probed from the addresses the mirror will really send from (without
//! `--client-ip-pool`, the real clients' own) instead of one the user has to know and type.
//!
//! Only packets *to* a production port count (what clients send); the capture holds nothing
//! else worth keeping: the copier's own mirrored packets go to a target host, which the filter
//! leaves out, and this host's addresses are not clients a test server would ever see.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::Result;
use common::wire::TcpPacket;

use ops::check::{Check, Report};

use super::{join, DoctorArgs};
use crate::capture::LiveCapture;
use crate::settings::{filter_any, filter_terms, Route};

/// Distinct client addresses kept; more are counted, not kept (the doctor probes a handful).
const MAX_TRACKED: usize = 1024;
/// Source ports remembered per client: the probe's must not be one of them.
const MAX_PORTS: usize = 256;
/// Frames read before the watch stops early: on a very busy port a fraction of a second shows
/// the busy clients, and the doctor runs on production.
const MAX_FRAMES: u64 = 100_000;
/// The capture ring: some packets of every busy client is all the watch needs.
const BUFFER_BYTES: i32 = 1 << 20;

/// One client address seen sending to a production port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Client {
    pub addr: Ipv4Addr,
    pub packets: u64,
    /// The production ports it sent to (which routes mirror it).
    pub prod_ports: BTreeSet<u16>,
    /// Its source ports seen, at most [`MAX_PORTS`].
    pub ports: BTreeSet<u16>,
}

/// What a watch saw.
#[derive(Debug, Default)]
pub struct Tally {
    clients: HashMap<Ipv4Addr, Client>,
    /// Packets from clients past [`MAX_TRACKED`].
    pub untracked: u64,
    /// Packets from clients.
    pub packets: u64,
    pub elapsed: Duration,
}

impl Tally {
    /// Counts `p` if a client sent it to one of `routes`' production ports. `local` holds this
    /// host's addresses.
    pub fn add(&mut self, p: &TcpPacket<'_>, routes: &[Route], local: &[Ipv4Addr]) {
        let to_prod = routes.iter().any(|r| r.prod_port == p.dst_port);
        let from_target = routes.iter().any(|r| *r.target.ip() == p.src);
        let to_target = routes.iter().any(|r| *r.target.ip() == p.dst);
        if !to_prod || from_target || to_target || !is_client(p.src) || local.contains(&p.src) {
            return;
        }
        let kept = self.clients.len();
        let c = match self.clients.entry(p.src) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) if kept < MAX_TRACKED => e.insert(Client {
                addr: p.src,
                packets: 0,
                prod_ports: BTreeSet::new(),
                ports: BTreeSet::new(),
            }),
            Entry::Vacant(_) => {
                self.untracked += 1;
                self.packets += 1;
                return;
            }
        };
        self.packets += 1;
        c.packets += 1;
        c.prod_ports.insert(p.dst_port);
        if c.ports.len() < MAX_PORTS {
            c.ports.insert(p.src_port);
        }
    }

    /// The clients, busiest first; ties by address, so that a run is repeatable.
    pub fn busiest(&self) -> Vec<Client> {
        let mut all: Vec<Client> = self.clients.values().cloned().collect();
        all.sort_by(|a, b| b.packets.cmp(&a.packets).then(a.addr.cmp(&b.addr)));
        all
    }
}

/// Addresses a client may have: a test server can route them (not this host's own, checked
/// apart, nor loopback, multicast, broadcast or 0.0.0.0).
fn is_client(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast())
}

/// What clients send to the production ports, minus what goes to a target host (the
/// copier's own output, when a target port equals a production port).
pub fn filter(routes: &[Route]) -> String {
    let (ports, hosts) = filter_terms(routes);
    // libpcap gives `and` and `or` the same precedence: every group is bracketed.
    format!(
        "tcp and ({}) and not ({})",
        filter_any("dst port", &ports),
        filter_any("dst host", &hosts),
    )
}

/// Captures `routes`' production ports on `interface` for `window` (or until [`MAX_FRAMES`]
/// frames) and tallies the clients. Needs CAP_NET_RAW.
pub fn watch(interface: &str, routes: &[Route], window: Duration) -> Result<Tally> {
    let mut cap = LiveCapture::open(interface, &filter(routes), BUFFER_BYTES)?;
    let local: Vec<Ipv4Addr> = ops::host::ipv4_addrs()
        .into_iter()
        .map(|a| a.addr)
        .collect();
    let mut tally = Tally::default();
    let started = Instant::now();
    let until = started + window;
    loop {
        let n = cap.drain(4096, |_, p| tally.add(p, routes, &local))?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || cap.stats.frames >= MAX_FRAMES {
            break;
        }
        if n == 0 {
            crate::waker::wait_readable(&[cap.as_raw_fd()], left.min(Duration::from_millis(100)));
        }
    }
    tally.elapsed = started.elapsed();
    Ok(tally)
}

/// Most live clients the probe SYNs go from: a handful shows a route missing for some of them
/// without flooding the test server or the output.
pub(super) const MAX_LIVE_PROBES: usize = 4;

/// What the watch of the production ports found.
pub(super) enum Live {
    /// The clients seen, busiest first (maybe none).
    Seen(Vec<Client>),
    /// Not watched, and why.
    NotWatched(String),
}

/// Watches the production ports for `--client-watch-ms` and reports who queries them.
pub(super) fn live_clients(
    r: &mut Report,
    args: &DoctorArgs,
    routes: &[Route],
    raw_ok: bool,
) -> Live {
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
    let tally = match watch(iface, routes, window) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use common::seq::SeqNumber;
    use common::wire::{TcpFlags, TcpOptions};
    use std::net::SocketAddrV4;

    fn pkt(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> TcpPacket<'static> {
        TcpPacket {
            src: Ipv4Addr::from(src),
            dst: Ipv4Addr::from(dst),
            src_port: sport,
            dst_port: dport,
            seq: SeqNumber(1),
            ack: SeqNumber(0),
            flags: TcpFlags(TcpFlags::ACK),
            window: 100,
            options: TcpOptions::default(),
            ip_id: 0,
            ttl: 64,
            payload: &[],
            payload_len: 0,
        }
    }

    fn routes() -> Vec<Route> {
        vec![Route {
            prod_port: 3306,
            target: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306),
        }]
    }

    #[test]
    fn only_clients_sending_to_a_production_port_count() {
        let routes = routes();
        let local = [Ipv4Addr::new(198, 18, 0, 2)];
        let mut t = Tally::default();
        for port in [40000, 40001, 40000] {
            t.add(
                &pkt([198, 18, 0, 10], port, [198, 18, 0, 2], 3306),
                &routes,
                &local,
            );
        }
        t.add(
            &pkt([198, 18, 0, 11], 5000, [198, 18, 0, 2], 3306),
            &routes,
            &local,
        );
        // Production's own replies, another port, the copier's own output to the target,
        // this host as a client, the target, loopback and broadcast: none of them.
        t.add(
            &pkt([198, 18, 0, 2], 3306, [198, 18, 0, 10], 40000),
            &routes,
            &local,
        );
        t.add(
            &pkt([198, 18, 0, 12], 5000, [198, 18, 0, 2], 22),
            &routes,
            &local,
        );
        t.add(
            &pkt([198, 18, 0, 13], 5000, [198, 18, 0, 3], 3306),
            &routes,
            &local,
        );
        t.add(
            &pkt([198, 18, 0, 2], 5000, [198, 18, 0, 2], 3306),
            &routes,
            &local,
        );
        t.add(
            &pkt([198, 18, 0, 3], 5000, [198, 18, 0, 2], 3306),
            &routes,
            &local,
        );
        t.add(
            &pkt([127, 0, 0, 1], 5000, [127, 0, 0, 1], 3306),
            &routes,
            &local,
        );
        t.add(
            &pkt([255, 255, 255, 255], 5000, [198, 18, 0, 2], 3306),
            &routes,
            &local,
        );
        assert_eq!(t.packets, 4);
        let b = t.busiest();
        assert_eq!(
            b.iter().map(|c| (c.addr, c.packets)).collect::<Vec<_>>(),
            [
                (Ipv4Addr::new(198, 18, 0, 10), 3),
                (Ipv4Addr::new(198, 18, 0, 11), 1)
            ]
        );
        assert_eq!(b[0].ports, BTreeSet::from([40000, 40001]));
        assert_eq!(b[0].prod_ports, BTreeSet::from([3306]));
    }

    #[test]
    fn the_tally_is_bounded() {
        let routes = routes();
        let mut t = Tally::default();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            let src = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + i);
            t.add(&pkt(src.octets(), 1, [198, 18, 0, 2], 3306), &routes, &[]);
        }
        for port in 0..(MAX_PORTS as u16 + 10) {
            t.add(
                &pkt([10, 0, 0, 0], port, [198, 18, 0, 2], 3306),
                &routes,
                &[],
            );
        }
        assert_eq!(t.busiest().len(), MAX_TRACKED);
        assert_eq!(t.untracked, 10);
        assert_eq!(t.busiest()[0].ports.len(), MAX_PORTS);
    }

    #[test]
    fn the_filter_takes_what_clients_send_and_leaves_out_the_targets() {
        assert_eq!(
            filter(&routes()),
            "tcp and (dst port 3306) and not (dst host 198.18.0.3)"
        );
        let two = vec![
            Route {
                prod_port: 3307,
                target: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 5), 3307),
            },
            routes()[0],
        ];
        assert_eq!(
            filter(&two),
            "tcp and (dst port 3306 or dst port 3307) and not (dst host 198.18.0.3 or dst host \
             198.18.0.5)"
        );
    }
}
