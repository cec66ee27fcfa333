//! The doctor's local checks: what the production host alone can tell (capabilities, the
//! route MTU toward each target, rp_filter, conntrack, the clock, whether the TLS plaintext
//! probe attaches), before anything is sent.
//!
//! Must never send a packet or open a connection: each check reads the host's own state (the
//! TLS check attaches the probe's read-only uprobes for a moment, and detaches them).

use std::time::Instant;

use ops::check::{Check, Report};
use ops::host;

use crate::settings::Route;
use crate::tls::{NotAttachedKind, TlsProbe};

/// Whether raw sockets can be opened.
pub(super) fn capabilities(r: &mut Report) -> bool {
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
pub(super) fn path_mtu(r: &mut Report, route: &Route, mss: u16) {
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
pub(super) fn rp_filter(r: &mut Report, routes: &[Route]) {
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
pub(super) fn conntrack(r: &mut Report) {
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

pub(super) fn clock(r: &mut Report) {
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

/// Whether TLS sessions of each production port could be mirrored: the plaintext probe
/// (issue 21) is attached to the server listening on the port, then detached. Never a FAIL:
/// without it, plain sessions mirror as before and TLS sessions are only counted.
pub(super) fn tls_plaintext(r: &mut Report, ports: &[u16]) {
    for &port in ports {
        match TlsProbe::attach(port) {
            Ok(probe) => r.add(Check::ok(
                "tls-plaintext",
                format!(
                    "port {port}: TLS sessions can be mirrored (probe attached to {})",
                    probe.target()
                ),
            )),
            Err(e) => {
                let note = match e.kind {
                    NotAttachedKind::NoServer => {
                        " (run the doctor on the server's host, in its network namespace)"
                    }
                    _ => "",
                };
                r.add(Check::warn(
                    "tls-plaintext",
                    format!("port {port}: {e}{note}; plain sessions are mirrored all the same"),
                ))
            }
        }
    }
}
