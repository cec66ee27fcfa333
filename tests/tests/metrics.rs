//! Issue 6's observability acceptance: `--metrics` on both daemons while sysbench runs through
//! the mirror. Scraped during and after the run: counters never go backwards, and once the
//! load is over the last scrape agrees with each daemon's own final summary.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use tcpshadow_metrics::Sample;
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::OwnStatements;
use tcpshadow_tests::{Host, Lab, Load};

const COPIER_METRICS: &str = "127.0.0.1:9631";
const INTERCEPT_METRICS: &str = "127.0.0.1:9632";

/// One scrape: `name{labels}` -> value.
type Scrape = BTreeMap<String, f64>;

fn key(s: &Sample) -> String {
    let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{}{{{}}}", s.name, labels.join(","))
}

/// `curl` inside the host's namespace (the endpoints listen on its loopback).
fn scrape(lab: &Lab, host: Host, addr: &str) -> Result<Scrape> {
    let samples = lab.scrape(host, addr)?;
    ensure!(!samples.is_empty(), "{addr} in {host} served nothing");
    Ok(samples.iter().map(|s| (key(s), s.value)).collect())
}

fn get(s: &Scrape, k: &str) -> Result<u64> {
    s.get(k)
        .map(|v| *v as u64)
        .with_context(|| format!("no {k} in the scrape"))
}

/// Every counter (and histogram series) of `later` is at least its value in `earlier`.
fn check_monotonic(what: &str, earlier: &Scrape, later: &Scrape) -> Result<()> {
    for (k, v) in earlier {
        let name = k.split('{').next().unwrap_or("");
        let counter =
            name.ends_with("_total") || name.ends_with("_bucket") || name.ends_with("_count");
        if !counter {
            continue;
        }
        // Per-digest series follow the top N digests by count, so one may leave the export
        // when another overtakes it; every other series must stay.
        let Some(now) = later.get(k) else {
            if k.contains("digest=\"") {
                continue;
            }
            bail!("{what}: {k} disappeared");
        };
        ensure!(now >= v, "{what}: {k} went backwards: {v} -> {now}");
    }
    Ok(())
}

/// The numbers after `label` in the summary line that contains it, e.g.
/// `numbers_after(text, "captured:")`.
fn numbers_after(text: &str, label: &str) -> Result<Vec<u64>> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .with_context(|| format!("no {label:?} line in:\n{text}"))?;
    Ok(line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect())
}

/// `key=value` pairs of intercept's `final:` line.
fn intercept_final(stderr: &str) -> Result<BTreeMap<String, u64>> {
    let line = stderr
        .lines()
        .find(|l| l.contains("final: "))
        .with_context(|| format!("intercept printed no final line:\n{stderr}"))?;
    let rest = &line[line.find("final: ").unwrap_or(0) + 7..];
    Ok(rest
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect())
}

#[test]
fn metrics_endpoints_agree_with_the_final_summaries() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("rrm")?;
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            creds,
            "--metrics".into(),
            COPIER_METRICS.into(),
        ],
        intercept_args: vec!["--metrics".into(), INTERCEPT_METRICS.into()],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let Mirror { intercept, copier } = mirror;

    let before = lab.work_both()?;
    let load = lab.spawn_load(&Load::default())?;
    let mut load = Some(load);
    let mut copier_scrapes = Vec::new();
    let mut intercept_scrapes = Vec::new();
    let mut max_active = 0;
    let started = Instant::now();
    while let Some(child) = load.as_mut() {
        if let Some(status) = child.try_wait()? {
            let out = load.take().context("load")?.wait_with_output()?;
            ensure!(
                status.success(),
                "sysbench failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("sysbench did not finish within 60 s");
        }
        let c = scrape(&lab, Host::Prod, COPIER_METRICS)?;
        max_active = max_active.max(get(&c, "tcpshadow_copier_sessions_active{}")?);
        copier_scrapes.push(c);
        intercept_scrapes.push(scrape(&lab, Host::Assist, INTERCEPT_METRICS)?);
        std::thread::sleep(Duration::from_millis(700));
    }
    // The load itself is mirrored as every other: by executed work (no pickup, no statement
    // of the copier's own).
    let window = lab.work_window(before, Duration::from_secs(10))?;
    let figures = window.check(&OwnStatements::default());
    let figures =
        tcpshadow_tests::work::shown("oltp_read_only 8 threads, scraped every 0.7 s", figures);
    figures?;
    ensure!(
        copier_scrapes.len() >= 5,
        "only {} scrapes during the run",
        copier_scrapes.len()
    );
    ensure!(
        max_active >= 8,
        "sessions_active peaked at {max_active} with 8 sysbench threads"
    );

    // After the load: wait until the copier has closed every session and its counters hold
    // still for two publishes in a row (they are republished every second).
    let quiet_deadline = Instant::now() + Duration::from_secs(20);
    let watched = [
        "tcpshadow_copier_capture_frames_total{}",
        "tcpshadow_copier_segments_transmitted_total{}",
        "tcpshadow_copier_sessions_active{}",
    ];
    loop {
        std::thread::sleep(Duration::from_millis(2200));
        let c = scrape(&lab, Host::Prod, COPIER_METRICS)?;
        let prev = copier_scrapes.last().context("no scrape")?;
        let still = watched.iter().all(|k| prev.get(*k) == c.get(*k));
        let idle = get(&c, "tcpshadow_copier_sessions_active{}")? == 0;
        copier_scrapes.push(c);
        if still && idle {
            break;
        }
        ensure!(
            Instant::now() < quiet_deadline,
            "the copier's counters never settled"
        );
    }
    for w in copier_scrapes.windows(2) {
        check_monotonic("copier", &w[0], &w[1])?;
    }
    let last = copier_scrapes.last().context("no scrape")?.clone();

    let copier_run = copier.finish(Duration::ZERO)?;
    let summary = &copier_run.stderr;
    println!("{summary}");
    // `sessions: N opened from SYN, M picked up mid-stream, ...`
    let sessions = numbers_after(summary, "sessions:")?;
    // `captured: F frames (A client->prod, B prod->client packets); K kernel drops`
    let captured = numbers_after(summary, "captured:")?;
    // `to test: Q bytes queued, S sent, R resent; P packets (...), N RST`
    let to_test = numbers_after(summary, "to test:")?;
    let pairs = [
        (
            "sessions opened from SYN",
            sessions[0],
            "tcpshadow_copier_sessions_opened_total{how=\"syn\"}",
        ),
        (
            "sessions picked up",
            sessions[1],
            "tcpshadow_copier_sessions_opened_total{how=\"picked_up\"}",
        ),
        (
            "frames captured",
            captured[0],
            "tcpshadow_copier_capture_frames_total{}",
        ),
        (
            "client->prod packets",
            captured[1],
            "tcpshadow_copier_captured_packets_total{direction=\"client_to_prod\"}",
        ),
        (
            "prod->client packets",
            captured[2],
            "tcpshadow_copier_captured_packets_total{direction=\"prod_to_client\"}",
        ),
        (
            "bytes queued",
            to_test[0],
            "tcpshadow_copier_payload_bytes_total{stage=\"queued\"}",
        ),
        (
            "bytes sent",
            to_test[1],
            "tcpshadow_copier_payload_bytes_total{stage=\"sent\"}",
        ),
        (
            "packets sent",
            to_test[3],
            "tcpshadow_copier_segments_transmitted_total{}",
        ),
        ("RSTs", to_test[7], "tcpshadow_copier_rsts_sent_total{}"),
    ];
    for (what, in_summary, metric) in pairs {
        let scraped = get(&last, metric)?;
        println!("copier {what}: summary {in_summary}, scraped {scraped}");
        ensure!(
            scraped == in_summary,
            "copier {what}: the summary says {in_summary}, the last scrape {metric} = {scraped}"
        );
    }
    ensure!(sessions[0] >= 8, "{} sessions opened", sessions[0]);

    // intercept: its copier has gone, so nothing moves any more; scrape, then stop it.
    std::thread::sleep(Duration::from_millis(2200));
    let ilast = scrape(&lab, Host::Assist, INTERCEPT_METRICS)?;
    intercept_scrapes.push(ilast.clone());
    for w in intercept_scrapes.windows(2) {
        check_monotonic("intercept", &w[0], &w[1])?;
    }
    let intercept_run = intercept.finish(Duration::ZERO)?;
    let fin = intercept_final(&intercept_run.stderr)?;
    println!("intercept final: {fin:?}");
    let ipairs = [
        ("captured", "tcpshadow_intercept_captured_frames_total{}"),
        ("relayed", "tcpshadow_intercept_feedback_relayed_total{}"),
        (
            "routed",
            "tcpshadow_intercept_feedback_total{route=\"routed\"}",
        ),
        (
            "unclaimed_broadcast",
            "tcpshadow_intercept_feedback_total{route=\"unclaimed_broadcast\"}",
        ),
        (
            "packets_framed",
            "tcpshadow_intercept_mysql_packets_framed_total{}",
        ),
        (
            "sessions_framed",
            "tcpshadow_intercept_mysql_sessions_framed_total{}",
        ),
        (
            "events_relayed",
            "tcpshadow_intercept_mysql_events_relayed_total{}",
        ),
        (
            "accepted",
            "tcpshadow_intercept_control_connections_total{result=\"accepted\"}",
        ),
    ];
    for (name, metric) in ipairs {
        let in_summary = *fin
            .get(name)
            .with_context(|| format!("no {name}= in the final line"))?;
        let scraped = get(&ilast, metric)?;
        println!("intercept {name}: summary {in_summary}, scraped {scraped}");
        ensure!(
            scraped == in_summary,
            "intercept {name}: the final line says {in_summary}, the last scrape {metric} = {scraped}"
        );
    }
    ensure!(
        fin["captured"] > 1000,
        "intercept captured only {}",
        fin["captured"]
    );
    println!(
        "scrapes: copier {}, intercept {}; peak active sessions {max_active}",
        copier_scrapes.len(),
        intercept_scrapes.len()
    );
    lab.down()
}
