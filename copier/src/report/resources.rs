//! The report's resource section: what each test server's host (node_exporter) and server
//! (`SHOW GLOBAL STATUS`) spent during the run, sampled every second by
//! `crate::resources`, so an A/B experiment compares cost as well as answers.
//!
//! # What this room is for
//!
//! The data ([`TargetResources`], part of `report.json` schema `tcpshadow.report/1`, fields
//! only ever added, every struct `#[serde(default)]`), the pure summary of a timeline
//! ([`summarize`]), and the section's text and HTML renderings ([`render_text`],
//! [`render_html`]), called once each by `text.rs` and `html.rs`.
//!
//! # What it must never do
//!
//! * Scrape, query or read a clock: the sampler fills the points; this only reads them.
//! * Trust the file: a report read back may hold NaN, negative or huge values, empty
//!   vectors, and untrusted text (target names, notes, digest texts) that is escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::html::esc;
use super::{fmt_ratio, one_line};

/// One test server's resources over the run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct TargetResources {
    /// The test server, `"ip:port"` (a `--target`).
    pub target: String,
    /// Its host's node_exporter (`--target-metrics`), if one was given.
    pub metrics_url: Option<String>,
    /// Whether `SHOW GLOBAL STATUS` was sampled on the server (`--target-sql-metrics`).
    pub sql_sampled: bool,
    /// One point per sampling interval (nominally 1 s), ascending `t_s`. Long runs are
    /// decimated (adjacent points merged), never cut: see `decimations`.
    pub points: Vec<ResourcePoint>,
    /// Over the whole run (see [`summarize`]).
    pub summary: ResourceSummary,
    /// node_exporter scrapes that failed (connection, timeout, HTTP status, unparsable page).
    pub scrape_failures: u64,
    /// `SHOW GLOBAL STATUS` samples that failed (the session is then reopened).
    pub sql_failures: u64,
    /// Times the timeline was halved to stay bounded (each point then covers twice as long).
    pub decimations: u32,
    /// CPU per statement digest on the test server over the run, most first (MySQL 8.0.28+
    /// `performance_schema.events_statements_summary_by_digest.SUM_CPU_TIME`); empty where the
    /// server does not expose it (a note says so).
    pub digest_cpu: Vec<DigestCpu>,
    /// What a reader must know about these figures (untrusted: may quote a server's error).
    pub notes: Vec<String>,
}

/// CPU seconds by mode over one interval, summed over the host's CPUs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct CpuSeconds {
    pub user: f64,
    pub nice: f64,
    pub system: f64,
    pub iowait: f64,
    pub irq: f64,
    pub softirq: f64,
    pub steal: f64,
    pub idle: f64,
}

impl CpuSeconds {
    pub fn total(&self) -> f64 {
        self.user
            + self.nice
            + self.system
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
            + self.idle
    }

    fn add(&mut self, o: &CpuSeconds) {
        self.user += o.user;
        self.nice += o.nice;
        self.system += o.system;
        self.iowait += o.iowait;
        self.irq += o.irq;
        self.softirq += o.softirq;
        self.steal += o.steal;
        self.idle += o.idle;
    }

    /// `mode` as a percentage of all CPU time in the interval (100 = every CPU busy in it).
    fn pct(&self, mode: f64) -> Option<f64> {
        let t = self.total();
        (t > 0.0 && t.is_finite()).then(|| mode / t * 100.0)
    }
}

/// One sampling interval `[t_s, t_s + dt_s)`. Counters are what happened in the interval
/// (differences of two readings), gauges the reading at its end (a mean for merged points).
/// `None`: not sampled, or the counter went backwards (a restart) in this interval.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ResourcePoint {
    /// Seconds since `Report::started_unix_ms` (the `qps` series' clock).
    pub t_s: f64,
    /// The interval's length, seconds.
    pub dt_s: f64,
    /// node_cpu_seconds_total differences.
    pub cpu: Option<CpuSeconds>,
    /// node_context_switches_total difference.
    pub context_switches: Option<f64>,
    /// node_intr_total difference.
    pub interrupts: Option<f64>,
    /// node_procs_running (the run queue, including the running).
    pub procs_running: Option<f64>,
    /// node_procs_blocked (waiting for I/O).
    pub procs_blocked: Option<f64>,
    pub load1: Option<f64>,
    pub mem_total_bytes: Option<f64>,
    pub mem_available_bytes: Option<f64>,
    /// `Threads_running` (gauge).
    pub threads_running: Option<f64>,
    /// `Threads_connected` (gauge).
    pub threads_connected: Option<f64>,
    /// `Questions` difference (includes the sampler's own one statement per interval).
    pub questions: Option<f64>,
    /// `Com_select` difference.
    pub com_select: Option<f64>,
    /// `Innodb_row_lock_waits` difference.
    pub row_lock_waits: Option<f64>,
    /// `Innodb_row_lock_time` difference, milliseconds.
    pub row_lock_time_ms: Option<f64>,
    /// `Created_tmp_disk_tables` difference.
    pub tmp_disk_tables: Option<f64>,
}

impl ResourcePoint {
    /// Merges the next point into this one (decimation): counters add, gauges average by
    /// time. A side missing in one half stays missing only if missing in both.
    pub fn absorb(&mut self, next: &ResourcePoint) {
        let (a, b) = (self.dt_s.max(0.0), next.dt_s.max(0.0));
        let gauge = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if a + b > 0.0 => Some((x * a + y * b) / (a + b)),
            (Some(x), Some(_)) => Some(x),
            (x, y) => x.or(y),
        };
        let count = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) => Some(x + y),
            (x, y) => x.or(y),
        };
        self.cpu = match (self.cpu, next.cpu) {
            (Some(mut x), Some(y)) => {
                x.add(&y);
                Some(x)
            }
            (x, y) => x.or(y),
        };
        self.context_switches = count(self.context_switches, next.context_switches);
        self.interrupts = count(self.interrupts, next.interrupts);
        self.procs_running = gauge(self.procs_running, next.procs_running);
        self.procs_blocked = gauge(self.procs_blocked, next.procs_blocked);
        self.load1 = gauge(self.load1, next.load1);
        self.mem_total_bytes = gauge(self.mem_total_bytes, next.mem_total_bytes);
        self.mem_available_bytes = gauge(self.mem_available_bytes, next.mem_available_bytes);
        self.threads_running = gauge(self.threads_running, next.threads_running);
        self.threads_connected = gauge(self.threads_connected, next.threads_connected);
        self.questions = count(self.questions, next.questions);
        self.com_select = count(self.com_select, next.com_select);
        self.row_lock_waits = count(self.row_lock_waits, next.row_lock_waits);
        self.row_lock_time_ms = count(self.row_lock_time_ms, next.row_lock_time_ms);
        self.tmp_disk_tables = count(self.tmp_disk_tables, next.tmp_disk_tables);
        self.dt_s = a + b;
    }

    fn per_s(&self, count: Option<f64>) -> Option<f64> {
        let c = count?;
        (self.dt_s > 0.0 && self.dt_s.is_finite()).then(|| c / self.dt_s)
    }
}

/// CPU of one statement digest on the test server over the run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct DigestCpu {
    /// The server's digest (`DIGEST`), not the report's digest id.
    pub digest: String,
    /// `SCHEMA_NAME`.
    pub schema: String,
    /// `DIGEST_TEXT`, cut short. Untrusted.
    pub text: String,
    /// Statements run over the run (`COUNT_STAR` difference).
    pub count: u64,
    /// CPU seconds over the run (`SUM_CPU_TIME` difference; picoseconds on the server).
    pub cpu_s: f64,
}

/// Mean, 95th percentile and maximum of one series, each interval weighted by its length.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct SeriesStat {
    pub mean: f64,
    pub p95: f64,
    pub max: f64,
    /// Points with a value.
    pub samples: u64,
}

/// A target's run as a few numbers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ResourceSummary {
    /// Seconds covered by points (the run minus the first interval and any gaps).
    pub covered_s: f64,
    /// CPU seconds in user (+nice) mode over the covered intervals, all CPUs.
    pub cpu_user_s: f64,
    /// CPU seconds in system mode (+irq +softirq) over the covered intervals, all CPUs.
    pub cpu_system_s: f64,
    /// Context switches over the covered intervals.
    pub context_switches: f64,
    /// Per series (the keys of [`METRICS`]).
    pub series: BTreeMap<String, SeriesStat>,
}

/// How a series is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Percent,
    PerSecond,
    Count,
    Bytes,
}

/// One series of the section: its key in [`ResourceSummary::series`], its label, and how it
/// is read from a point.
pub struct Metric {
    pub key: &'static str,
    pub label: &'static str,
    pub unit: Unit,
    pub get: fn(&ResourcePoint) -> Option<f64>,
}

/// The series summarised and shown, in display order.
pub const METRICS: &[Metric] = &[
    Metric {
        key: "cpu_user_pct",
        label: "cpu usr %",
        unit: Unit::Percent,
        get: |p| p.cpu.and_then(|c| c.pct(c.user + c.nice)),
    },
    Metric {
        key: "cpu_system_pct",
        label: "cpu sys %",
        unit: Unit::Percent,
        get: |p| p.cpu.and_then(|c| c.pct(c.system + c.irq + c.softirq)),
    },
    Metric {
        key: "cpu_iowait_pct",
        label: "cpu iowait %",
        unit: Unit::Percent,
        get: |p| p.cpu.and_then(|c| c.pct(c.iowait)),
    },
    Metric {
        key: "cpu_steal_pct",
        label: "cpu steal %",
        unit: Unit::Percent,
        get: |p| p.cpu.and_then(|c| c.pct(c.steal)),
    },
    Metric {
        key: "cpu_idle_pct",
        label: "cpu idle %",
        unit: Unit::Percent,
        get: |p| p.cpu.and_then(|c| c.pct(c.idle)),
    },
    Metric {
        key: "context_switches_per_s",
        label: "ctx switches/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.context_switches),
    },
    Metric {
        key: "interrupts_per_s",
        label: "interrupts/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.interrupts),
    },
    Metric {
        key: "procs_running",
        label: "run queue",
        unit: Unit::Count,
        get: |p| p.procs_running,
    },
    Metric {
        key: "procs_blocked",
        label: "blocked on I/O",
        unit: Unit::Count,
        get: |p| p.procs_blocked,
    },
    Metric {
        key: "load1",
        label: "load1",
        unit: Unit::Count,
        get: |p| p.load1,
    },
    Metric {
        key: "mem_available_bytes",
        label: "mem available",
        unit: Unit::Bytes,
        get: |p| p.mem_available_bytes,
    },
    Metric {
        key: "threads_running",
        label: "Threads_running",
        unit: Unit::Count,
        get: |p| p.threads_running,
    },
    Metric {
        key: "threads_connected",
        label: "Threads_connected",
        unit: Unit::Count,
        get: |p| p.threads_connected,
    },
    Metric {
        key: "questions_per_s",
        label: "Questions/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.questions),
    },
    Metric {
        key: "com_select_per_s",
        label: "Com_select/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.com_select),
    },
    Metric {
        key: "row_lock_waits_per_s",
        label: "row lock waits/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.row_lock_waits),
    },
    Metric {
        key: "row_lock_time_ms_per_s",
        label: "row lock ms/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.row_lock_time_ms),
    },
    Metric {
        key: "tmp_disk_tables_per_s",
        label: "tmp disk tables/s",
        unit: Unit::PerSecond,
        get: |p| p.per_s(p.tmp_disk_tables),
    },
];

/// The summary of a timeline. Totals are sums over the points (decimation keeps them exact);
/// mean and p95 weight each point by its length (after decimation p95 is of the merged,
/// smoother points). Non-finite values are skipped.
pub fn summarize(points: &[ResourcePoint]) -> ResourceSummary {
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let mut s = ResourceSummary::default();
    for p in points {
        let dt = finite(p.dt_s).max(0.0);
        s.covered_s += dt;
        if let Some(c) = p.cpu {
            s.cpu_user_s += finite(c.user + c.nice);
            s.cpu_system_s += finite(c.system + c.irq + c.softirq);
        }
        s.context_switches += p.context_switches.map_or(0.0, finite);
    }
    for m in METRICS {
        let mut v: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| {
                let x = (m.get)(p)?;
                (x.is_finite() && p.dt_s.is_finite() && p.dt_s > 0.0).then_some((x, p.dt_s))
            })
            .collect();
        if v.is_empty() {
            continue;
        }
        let weight: f64 = v.iter().map(|(_, w)| w).sum();
        let mean = v.iter().map(|(x, w)| x * w).sum::<f64>() / weight;
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut acc = 0.0;
        let mut p95 = v[v.len() - 1].0;
        for (x, w) in &v {
            acc += w;
            if acc >= 0.95 * weight {
                p95 = *x;
                break;
            }
        }
        s.series.insert(
            m.key.to_string(),
            SeriesStat {
                mean,
                p95,
                max: v[v.len() - 1].0,
                samples: v.len() as u64,
            },
        );
    }
    s
}

/// A figure for a person, by unit: `12.3`, `4.5k`, `1.20 GiB`, `-` when unknown.
pub fn fmt_value(v: Option<f64>, unit: Unit) -> String {
    let Some(v) = v.filter(|v| v.is_finite()) else {
        return "-".to_string();
    };
    match unit {
        Unit::Bytes => {
            let gib = v / (1u64 << 30) as f64;
            if gib.abs() >= 1.0 {
                format!("{gib:.2} GiB")
            } else {
                format!("{:.0} MiB", v / (1u64 << 20) as f64)
            }
        }
        Unit::Percent => format!("{v:.1}"),
        Unit::PerSecond | Unit::Count => {
            if v.abs() >= 1e6 {
                format!("{:.2}M", v / 1e6)
            } else if v.abs() >= 1e4 {
                format!("{:.1}k", v / 1e3)
            } else if v.abs() >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        }
    }
}

/// B's figure over A's, for the two-target comparison; `None` when A is 0 or unknown.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && a.is_finite() && b.is_finite() => Some(b / a),
        _ => None,
    }
}

fn stat<'a>(t: &'a TargetResources, key: &str) -> Option<&'a SeriesStat> {
    t.summary.series.get(key)
}

/// The section of `report.txt` (nothing when no target was sampled). One column pair
/// (mean, p95) per target; with two targets, B/A of the means.
pub fn render_text(out: &mut String, targets: &[TargetResources]) {
    if targets.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nResources per target (sampled every second; mean and p95 over the run):"
    );
    for (i, t) in targets.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {} {} | node {} | sql {} | {:.0} s covered, {} points{} | scrape failures {} \
             sql failures {}",
            letter(i),
            one_line(&t.target, 64),
            t.metrics_url
                .as_deref()
                .map_or_else(|| "-".to_string(), |u| one_line(u, 80)),
            if t.sql_sampled { "on" } else { "off" },
            t.summary.covered_s,
            t.points.len(),
            if t.decimations > 0 {
                format!(" (merged {}x)", 1u64 << t.decimations.min(63))
            } else {
                String::new()
            },
            t.scrape_failures,
            t.sql_failures
        );
        let _ = writeln!(
            out,
            "    cpu seconds user {:.1} system {:.1} | context switches {:.0}",
            t.summary.cpu_user_s, t.summary.cpu_system_s, t.summary.context_switches
        );
        for n in &t.notes {
            let _ = writeln!(out, "    note: {}", one_line(n, 160));
        }
    }
    let shown: Vec<&TargetResources> = targets.iter().take(4).collect();
    let mut head = format!("  {:<18}", "");
    for i in 0..shown.len() {
        let _ = write!(
            head,
            " {:>10} {:>10}",
            format!("{} mean", letter(i)),
            format!("{} p95", letter(i))
        );
    }
    if shown.len() == 2 {
        let _ = write!(head, " {:>8}", "B/A");
    }
    let _ = writeln!(out, "{head}");
    for m in METRICS {
        if shown.iter().all(|t| stat(t, m.key).is_none()) {
            continue;
        }
        let mut line = format!("  {:<18}", m.label);
        for t in &shown {
            let s = stat(t, m.key);
            let _ = write!(
                line,
                " {:>10} {:>10}",
                fmt_value(s.map(|s| s.mean), m.unit),
                fmt_value(s.map(|s| s.p95), m.unit)
            );
        }
        if shown.len() == 2 {
            let r = ratio(
                stat(shown[0], m.key).map(|s| s.mean),
                stat(shown[1], m.key).map(|s| s.mean),
            );
            let _ = write!(line, " {:>8}", fmt_ratio(r));
        }
        let _ = writeln!(out, "{line}");
    }
    for (i, t) in targets.iter().enumerate() {
        if t.digest_cpu.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  {} CPU by statement digest (server's view):",
            letter(i)
        );
        for d in t.digest_cpu.iter().take(10) {
            let _ = writeln!(
                out,
                "    {:>9.2} s {:>10} x {}",
                d.cpu_s,
                d.count,
                one_line(&d.text, 100)
            );
        }
    }
}

fn letter(i: usize) -> String {
    match u8::try_from(i) {
        Ok(i) if i < 26 => char::from(b'A' + i).to_string(),
        _ => format!("#{}", i + 1),
    }
}

const COLORS: &[&str] = &["#1f77b4", "#e8590c", "#2b8a3e", "#862e9c"];

/// The section of `report.html`: a summary table and one small chart per series, every
/// target a line of its own colour. Nothing when no target was sampled.
pub fn render_html(o: &mut String, targets: &[TargetResources]) {
    if targets.is_empty() {
        return;
    }
    o.push_str("<h2 id=\"resources\">Resources per target</h2>\n<p class=\"meta\">");
    for (i, t) in targets.iter().enumerate() {
        let _ = write!(
            o,
            "<span class=\"sw\" style=\"background:{}\"></span><b>{}</b> {} · node {} · sql {} · \
             {:.0} s covered · scrape failures {} · sql failures {} · cpu seconds user {:.1} \
             system {:.1} · context switches {:.0}<br>",
            COLORS[i % COLORS.len()],
            letter(i),
            esc(&t.target),
            t.metrics_url.as_deref().map_or("-".into(), esc),
            if t.sql_sampled { "on" } else { "off" },
            t.summary.covered_s,
            t.scrape_failures,
            t.sql_failures,
            t.summary.cpu_user_s,
            t.summary.cpu_system_s,
            t.summary.context_switches
        );
        for n in &t.notes {
            let _ = write!(o, "<i>{}: {}</i><br>", letter(i), esc(n));
        }
    }
    o.push_str("</p>\n<table id=\"resources-table\"><tr><th>series</th>");
    for i in 0..targets.len() {
        let _ = write!(o, "<th>{0} mean</th><th>{0} p95</th>", letter(i));
    }
    if targets.len() == 2 {
        o.push_str("<th>B/A</th>");
    }
    o.push_str("</tr>\n");
    let mut charted = Vec::new();
    for m in METRICS {
        if targets.iter().all(|t| stat(t, m.key).is_none()) {
            continue;
        }
        charted.push(m);
        let _ = write!(o, "<tr><td>{}</td>", esc(m.label));
        for t in targets {
            let s = stat(t, m.key);
            let _ = write!(
                o,
                "<td class=\"n\">{}</td><td class=\"n\">{}</td>",
                fmt_value(s.map(|s| s.mean), m.unit),
                fmt_value(s.map(|s| s.p95), m.unit)
            );
        }
        if targets.len() == 2 {
            let r = ratio(
                stat(&targets[0], m.key).map(|s| s.mean),
                stat(&targets[1], m.key).map(|s| s.mean),
            );
            let _ = write!(o, "<td class=\"n\">{}</td>", fmt_ratio(r));
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</table>\n<div class=\"charts\">\n");
    for m in charted {
        chart(o, m, targets);
    }
    o.push_str("</div>\n");
    for (i, t) in targets.iter().enumerate() {
        if t.digest_cpu.is_empty() {
            continue;
        }
        let _ = write!(
            o,
            "<h3>{} CPU by statement digest</h3><table><tr><th>cpu s</th><th>count</th>\
             <th>statement</th></tr>",
            letter(i)
        );
        for d in t.digest_cpu.iter().take(20) {
            let _ = write!(
                o,
                "<tr><td class=\"n\">{:.2}</td><td class=\"n\">{}</td><td><code>{}</code></td></tr>",
                d.cpu_s,
                d.count,
                esc(&one_line(&d.text, 400))
            );
        }
        o.push_str("</table>\n");
    }
}

/// Points drawn per line; longer timelines are averaged down.
const CHART_POINTS: usize = 600;

fn chart(o: &mut String, m: &Metric, targets: &[TargetResources]) {
    const W: f64 = 540.0;
    const H: f64 = 170.0;
    const L: f64 = 56.0;
    const R: f64 = 10.0;
    const T: f64 = 10.0;
    const B: f64 = 24.0;
    let lines: Vec<Vec<(f64, f64)>> = targets
        .iter()
        .map(|t| {
            let pts: Vec<(f64, f64)> = t
                .points
                .iter()
                .filter_map(|p| {
                    let v = (m.get)(p)?;
                    (v.is_finite() && p.t_s.is_finite()).then_some((p.t_s + p.dt_s, v))
                })
                .collect();
            let group = pts.len().div_ceil(CHART_POINTS).max(1);
            pts.chunks(group)
                .map(|c| {
                    let k = c.len() as f64;
                    (c[c.len() - 1].0, c.iter().map(|p| p.1).sum::<f64>() / k)
                })
                .collect()
        })
        .collect();
    let t_max = lines.iter().flatten().map(|p| p.0).fold(1.0f64, f64::max);
    let v_max = lines.iter().flatten().map(|p| p.1).fold(0.0f64, f64::max);
    let top = super::html::nice_max(v_max);
    let (pw, ph) = (W - L - R, H - T - B);
    let x = |t: f64| L + (t / t_max).clamp(0.0, 1.0) * pw;
    let y = |v: f64| T + ph - (v / top).clamp(0.0, 1.0) * ph;
    let _ = write!(
        o,
        "<figure><figcaption>{}</figcaption><svg class=\"resource-chart\" role=\"img\" \
         aria-label=\"{}\" viewBox=\"0 0 {W} {H}\" width=\"100%\" \
         xmlns=\"http://www.w3.org/2000/svg\">",
        esc(m.label),
        esc(m.label)
    );
    for v in [0.0, top / 2.0, top] {
        let yy = y(v);
        let _ = write!(
            o,
            "<line x1=\"{L}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            L + pw,
            L - 4.0,
            yy + 4.0,
            fmt_value(Some(v), m.unit)
        );
    }
    let _ = write!(
        o,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">0 … {:.0} s since start</text>",
        L + pw / 2.0,
        H - 6.0,
        t_max
    );
    for (i, pts) in lines.iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let mut d = String::with_capacity(pts.len() * 14);
        for (j, (t, v)) in pts.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if j == 0 { "M" } else { "L" },
                x(*t),
                y(*v)
            );
        }
        if pts.len() == 1 {
            d.push_str("h2");
        }
        let _ = write!(
            o,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\"/>",
            COLORS[i % COLORS.len()]
        );
    }
    o.push_str("</svg></figure>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, user: f64, system: f64, idle: f64, ctx: f64) -> ResourcePoint {
        ResourcePoint {
            t_s: t,
            dt_s: 1.0,
            cpu: Some(CpuSeconds {
                user,
                system,
                idle,
                ..CpuSeconds::default()
            }),
            context_switches: Some(ctx),
            threads_running: Some(t),
            ..ResourcePoint::default()
        }
    }

    #[test]
    fn the_summary_sums_counters_and_weights_by_time() {
        let pts: Vec<_> = (0..20)
            .map(|i| point(f64::from(i), 0.5, 0.25, 1.25, 1000.0 + f64::from(i)))
            .collect();
        let s = summarize(&pts);
        assert_eq!(s.covered_s, 20.0);
        assert!((s.cpu_user_s - 10.0).abs() < 1e-9);
        assert!((s.cpu_system_s - 5.0).abs() < 1e-9);
        assert_eq!(s.context_switches, 20_000.0 + 190.0);
        let usr = s.series["cpu_user_pct"];
        assert!((usr.mean - 25.0).abs() < 1e-9, "{usr:?}");
        let tr = s.series["threads_running"];
        assert_eq!((tr.p95, tr.max, tr.samples), (18.0, 19.0, 20));
        // A series never sampled has no entry (not a zero).
        assert!(!s.series.contains_key("row_lock_waits_per_s"));
    }

    #[test]
    fn merging_keeps_totals_and_averages_gauges() {
        let mut a = point(0.0, 1.0, 0.5, 0.5, 100.0);
        let mut b = point(1.0, 3.0, 0.5, 0.5, 300.0);
        b.threads_running = Some(4.0);
        b.dt_s = 3.0;
        a.threads_running = Some(0.0);
        a.absorb(&b);
        assert_eq!(a.dt_s, 4.0);
        assert_eq!(a.cpu.unwrap().user, 4.0);
        assert_eq!(a.context_switches, Some(400.0));
        assert_eq!(a.threads_running, Some(3.0));
        assert_eq!(summarize(&[a]).context_switches, 400.0);
    }

    #[test]
    fn hostile_values_do_not_poison_the_summary() {
        let mut p = point(0.0, f64::NAN, 1.0, 1.0, f64::INFINITY);
        p.dt_s = f64::NAN;
        let q = ResourcePoint {
            dt_s: 0.0,
            ..ResourcePoint::default()
        };
        let s = summarize(&[p, q]);
        assert!(s.cpu_user_s.is_finite() && s.context_switches.is_finite());
        let mut out = String::new();
        render_text(&mut out, &[TargetResources::default()]);
        render_html(&mut out, &[TargetResources::default()]);
    }

    fn target(name: &str, user: f64) -> TargetResources {
        let points: Vec<_> = (0..10)
            .map(|i| point(f64::from(i), user, 0.1, 1.9 - user, 5000.0))
            .collect();
        TargetResources {
            target: name.into(),
            metrics_url: Some("http://198.18.0.3:9100/metrics".into()),
            sql_sampled: true,
            summary: summarize(&points),
            points,
            ..TargetResources::default()
        }
    }

    #[test]
    fn text_compares_two_targets_side_by_side() {
        let mut out = String::new();
        render_text(
            &mut out,
            &[target("198.18.0.3:3306", 0.2), target("b:1", 0.4)],
        );
        assert!(out.contains("B/A"), "{out}");
        let usr = out.lines().find(|l| l.contains("cpu usr %")).unwrap();
        // 10% vs 20%: B/A 2.00x.
        assert!(
            usr.contains("10.0") && usr.contains("20.0") && usr.contains("2.00x"),
            "{usr}"
        );
        let ctx = out.lines().find(|l| l.contains("ctx switches/s")).unwrap();
        assert!(ctx.contains("5000") && ctx.contains("1.00x"), "{ctx}");
        assert!(out.contains("cpu seconds user 2.0 system 1.0"), "{out}");
    }

    #[test]
    fn older_reports_read_without_resources_and_new_ones_round_trip() {
        let old = r#"{"schema":"tcpshadow.report/1","digests":[]}"#;
        let mut r = crate::report::from_json(old).unwrap();
        assert!(r.resources.is_empty());
        r.resources.push(target("198.18.0.3:3306", 0.2));
        let back = crate::report::from_json(&crate::report::to_json(&r)).unwrap();
        assert_eq!(back.resources, r.resources);
        // A partial entry (a newer writer's subset, or a hand-made file) takes defaults.
        let partial = r#"{"schema":"tcpshadow.report/1","resources":[{"target":"t",
            "points":[{"t_s":1,"dt_s":1,"cpu":{"user":0.5}}]}]}"#;
        let r = crate::report::from_json(partial).unwrap();
        assert_eq!(r.resources[0].points[0].cpu.unwrap().idle, 0.0);
        assert_eq!(r.resources[0].scrape_failures, 0);
    }

    #[test]
    fn html_escapes_everything_it_did_not_write() {
        let mut t = target("<script>x</script>", 0.2);
        t.notes.push("a \"note\" <b>".into());
        t.digest_cpu.push(DigestCpu {
            text: "SELECT '<img src=x>'".into(),
            cpu_s: 1.0,
            count: 3,
            ..DigestCpu::default()
        });
        let mut o = String::new();
        render_html(&mut o, &[t]);
        assert!(!o.contains("<script>") && !o.contains("<img"));
        assert!(o.contains("a &quot;note&quot; &lt;b&gt;"), "{o}");
        assert!(o.contains("&lt;script&gt;") && o.contains("resource-chart"));
    }
}
