use super::clients::{Live, MAX_LIVE_PROBES};
use super::probes::{
    arp_seen, client_unreached, plan_probes, probe_address, probe_port, push_probe, ArpSeen, Source,
};
use super::*;
use clap::CommandFactory;
use common::control::DoctorCheck;
use std::collections::BTreeSet;
use std::time::Duration;

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
    let p =
        ops::config::parse::<DoctorArgs>(DoctorArgs::command(), &Args::command(), argv).unwrap();
    assert_eq!(p.args.probe_wait_ms, 500);
    assert_eq!(
        p.args.daemon.mirror.first_intercept(),
        "198.18.0.4:36524".parse().unwrap()
    );
}
