//! Acceptance of the report's resource section (issue 22): with `--target-metrics`, the
//! copier's per-second timeline of the test host agrees with node_exporter's own counters
//! over the same window.
//!
//! node_exporter runs in the test host's namespace with a small collector set. The lab's
//! namespaces share one kernel, so it reports the whole machine's CPU: fine here, the test
//! compares two readers of the same counters, not a host's own load.
//!
//! How the window is matched: while the copier runs, this test scrapes node_exporter itself
//! from the production host (the copier's vantage point) every ~100 ms, each scrape stamped with the wall clock before and
//! after (`ip netns exec ... curl`, a few ms). The report's points cover
//! `[started_unix_ms + t_s, + dt_s)` on the same clock (one kernel), so the report's sums are
//! compared with the difference of our two scrapes nearest the report's first and last edge.
//! Tolerance, per edge: the machine's CPU count times the time we cannot place the kernel's
//! reading to (our scrape's own span, plus up to 60 ms between the copier's timestamp and
//! node_exporter reading /proc/stat, plus /proc/stat's 10 ms tick); context switches get the
//! same times their measured rate. Before the copier starts and after it stops, one scrape
//! each bounds the report from above (the report covers whole intervals inside that window).

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use copier::report::read_report;
use copier::resources::node::{parse, NodeSample};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::{Host, Lab, Load};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One scrape of ours: wall clock before and after, and what it read.
struct Scrape {
    before_ms: u64,
    after_ms: u64,
    sample: NodeSample,
}

fn scrape(lab: &Lab, url: &str) -> Result<Scrape> {
    let before_ms = unix_ms();
    let out = Command::new("ip")
        .args(["netns", "exec", lab.netns(Host::Prod)])
        .args(["curl", "-sS", "--fail", "--max-time", "2", url])
        .output()
        .context("cannot run curl")?;
    let after_ms = unix_ms();
    if !out.status.success() {
        bail!("curl {url}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let sample = parse(&out.stdout);
    ensure!(sample.cpu.is_some(), "no node_cpu_seconds_total in {url}");
    Ok(Scrape {
        before_ms,
        after_ms,
        sample,
    })
}

/// user+nice+system+irq+softirq seconds, as the report counts user and system.
fn busy(s: &NodeSample) -> f64 {
    let c = s.cpu.unwrap_or_default();
    c[0] + c[1] + c[2] + c[4] + c[5]
}

fn ctx(s: &NodeSample) -> f64 {
    s.context_switches.unwrap_or(0.0)
}

/// Our scrape whose midpoint is nearest `at_ms`.
fn nearest(scrapes: &[Scrape], at_ms: u64) -> &Scrape {
    scrapes
        .iter()
        .min_by_key(|s| ((s.before_ms + s.after_ms) / 2).abs_diff(at_ms))
        .expect("scrapes")
}

#[test]
fn the_resource_section_matches_node_exporter_over_the_same_window() -> Result<()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("res")?;
    let listen = format!("{}:9100", lab.ip(Host::Test));
    let url = format!("http://{listen}/metrics");
    let exporter = lab.spawn(
        Host::Test,
        &[
            "prometheus-node-exporter",
            &format!("--web.listen-address={listen}"),
            "--collector.disable-defaults",
            "--collector.cpu",
            "--collector.stat",
            "--collector.loadavg",
            "--collector.meminfo",
        ],
    )?;
    let mut up = Err(anyhow::anyhow!("never tried"));
    for _ in 0..50 {
        up = scrape(&lab, &url);
        if up.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let first =
        up.with_context(|| format!("node_exporter did not come up: {:?}", exporter.output()))?;
    let cpus = f64::from(first.sample.cpus.max(1));

    let dir = PathBuf::from(lab.var("LAB_DIR")).join("report-resources");
    let mut copier_args = lab.pickup_args()?;
    copier_args.extend([
        "--report".into(),
        dir.to_string_lossy().into_owned(),
        "--target-metrics".into(),
        url.clone(),
    ]);
    let opts = MirrorOptions {
        copier_args,
        ..Default::default()
    };
    let secs = 8;
    let before = scrape(&lab, &url)?;
    let mirror = Mirror::start(&lab, &opts)?;
    let stop = AtomicBool::new(false);
    let (ours, load) = std::thread::scope(|s| -> Result<_> {
        let poller = s.spawn(|| {
            let mut v = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(x) = scrape(&lab, &url) {
                    v.push(x);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            v
        });
        // A second of quiet, the load, and a second more: the timeline sees both.
        std::thread::sleep(Duration::from_secs(1));
        let load = lab.load(&Load {
            test: "oltp_read_only".into(),
            threads: 4,
            time_secs: secs,
            ..Load::default()
        });
        std::thread::sleep(Duration::from_secs(1));
        let stopped = mirror.stop();
        // Before any `?`: the scope waits for the poller.
        stop.store(true, Ordering::Relaxed);
        let ours = poller.join().expect("poller");
        let (copier, _) = stopped?;
        let load = load?;
        println!("{}", copier.stderr);
        Ok((ours, load))
    })?;
    let after = scrape(&lab, &url)?;
    drop(exporter);
    println!(
        "sysbench oltp_read_only 4 threads {secs} s: {} transactions",
        load.transactions
    );

    let report = read_report(&dir.join("report.json"))?;
    ensure!(report.resources.len() == 1, "{:?}", report.resources);
    let r = &report.resources[0];
    let txt = std::fs::read_to_string(dir.join("report.txt"))?;
    println!("{}", txt.lines().take(40).collect::<Vec<_>>().join("\n"));
    ensure!(
        r.scrape_failures == 0 && r.sql_failures == 0,
        "failures: {} scrapes, {} sql",
        r.scrape_failures,
        r.sql_failures
    );
    ensure!(r.sql_sampled, "SHOW GLOBAL STATUS was not sampled");
    ensure!(
        r.notes.iter().any(|n| n.contains("MariaDB")),
        "no note that the lab's MariaDB has no digest CPU: {:?}",
        r.notes
    );
    ensure!(
        r.summary.series.contains_key("questions_per_s")
            && r.summary.series.contains_key("threads_running"),
        "no SQL series: {:?}",
        r.summary.series.keys()
    );
    let pts = &r.points;
    ensure!(pts.len() >= secs as usize, "{} points", pts.len());
    // Contiguous: each point starts where the previous ended.
    for w in pts.windows(2) {
        ensure!(
            (w[0].t_s + w[0].dt_s - w[1].t_s).abs() < 0.002,
            "gap between points at {} s",
            w[0].t_s
        );
    }
    ensure!(
        pts.iter()
            .all(|p| p.cpu.is_some() && p.context_switches.is_some()),
        "a point without CPU or context switches"
    );
    let start_ms = report.started_unix_ms + (pts[0].t_s * 1e3).round() as u64;
    let last = &pts[pts.len() - 1];
    let end_ms = report.started_unix_ms + ((last.t_s + last.dt_s) * 1e3).round() as u64;
    let rep_busy = r.summary.cpu_user_s + r.summary.cpu_system_s;
    let rep_ctx = r.summary.context_switches;

    // 1. Bounded by the scrapes before the copier started and after it stopped.
    let outer_busy = busy(&after.sample) - busy(&before.sample);
    let outer_ctx = ctx(&after.sample) - ctx(&before.sample);
    println!(
        "outer window {:.2} s: node_exporter busy {outer_busy:.2} cpu-s, {outer_ctx:.0} ctx \
         switches; report over {:.2} s: busy {rep_busy:.2} cpu-s, {rep_ctx:.0} ctx switches",
        (after.after_ms - before.before_ms) as f64 / 1e3,
        r.summary.covered_s
    );
    ensure!(
        rep_busy <= outer_busy + 0.05 * cpus && rep_ctx <= outer_ctx,
        "the report counts more than node_exporter over a window containing it"
    );

    // 2. Equal, within the edges' uncertainty, to our scrapes at the report's edges.
    let (a, b) = (nearest(&ours, start_ms), nearest(&ours, end_ms));
    let edge_s = |s: &Scrape, at: u64| {
        let mid = (s.before_ms + s.after_ms) / 2;
        (mid.abs_diff(at) + (s.after_ms - s.before_ms) / 2) as f64 / 1e3 + 0.06 + 0.01
    };
    let uncertain_s = edge_s(a, start_ms) + edge_s(b, end_ms);
    let win_s = (end_ms - start_ms) as f64 / 1e3;
    let node_busy = busy(&b.sample) - busy(&a.sample);
    let node_ctx = ctx(&b.sample) - ctx(&a.sample);
    let busy_tol = cpus * uncertain_s;
    let ctx_tol = node_ctx / win_s * uncertain_s + 50.0;
    println!(
        "report window {win_s:.3} s ({} points, {} of our scrapes, edges within {:.0} ms): \
         busy report {rep_busy:.3} vs node_exporter {node_busy:.3} cpu-s (tolerance {busy_tol:.3}, \
         {cpus} cpus); context switches report {rep_ctx:.0} vs node_exporter {node_ctx:.0} \
         (tolerance {ctx_tol:.0})",
        pts.len(),
        ours.len(),
        uncertain_s * 1e3
    );
    ensure!(
        (rep_busy - node_busy).abs() <= busy_tol,
        "CPU busy seconds: report {rep_busy:.3}, node_exporter {node_busy:.3}"
    );
    ensure!(
        (rep_ctx - node_ctx).abs() <= ctx_tol,
        "context switches: report {rep_ctx:.0}, node_exporter {node_ctx:.0}"
    );
    lab.down()?;
    Ok(())
}
