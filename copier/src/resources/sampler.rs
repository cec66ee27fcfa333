//! The sampling thread: every [`INTERVAL`], one reading per target (node_exporter page, status
//! variables), differences with the previous reading ([`interval`], pure), a bounded
//! [`Timeline`] per target, and a ready-made snapshot the report clones.
//!
//! The thread is the only one that waits on the network. The report's side
//! ([`Sampler::snapshot`]) takes a mutex the thread holds only to swap in a new snapshot.

use std::net::SocketAddrV4;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use super::node::{self, NodeSample};
use super::sql::{SqlAccount, SqlSource, StatusSample};
use super::MetricsUrl;
use crate::report::resources::{summarize, CpuSeconds, ResourcePoint, TargetResources};

/// The sampling interval.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Points kept per target before the timeline is halved: two hours at one per second, about
/// 2 MB per target; a day-long run ends with 16 s points.
pub const MAX_POINTS: usize = 7200;

/// What to sample for one `--target`.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    pub target: SocketAddrV4,
    pub metrics: Option<MetricsUrl>,
    pub sql: Option<SqlAccount>,
    /// Said in the report from the start (e.g. why SQL is not sampled).
    pub notes: Vec<String>,
}

/// One reading of one target, at `unix_ms`.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    pub unix_ms: u64,
    pub node: Option<NodeSample>,
    pub sql: Option<StatusSample>,
}

/// The interval between two readings as a report point (`t_s` relative to `zero_unix_ms`).
/// A counter that went backwards (an exporter or server restart, a 32-bit kernel counter
/// wrapping) gives no figure for this interval rather than a negative or huge one; a
/// source missing from either reading gives no counters, only the gauges it has now.
pub fn interval(prev: &Reading, cur: &Reading, zero_unix_ms: u64) -> ResourcePoint {
    let dt_s = cur.unix_ms.saturating_sub(prev.unix_ms) as f64 / 1e3;
    let mut p = ResourcePoint {
        t_s: prev.unix_ms.saturating_sub(zero_unix_ms) as f64 / 1e3,
        dt_s,
        ..ResourcePoint::default()
    };
    let diff = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b >= a => Some(b - a),
        _ => None,
    };
    if let Some(n) = &cur.node {
        p.procs_running = n.procs_running;
        p.procs_blocked = n.procs_blocked;
        p.load1 = n.load1;
        p.mem_total_bytes = n.mem_total;
        p.mem_available_bytes = n.mem_available;
        if let Some(o) = &prev.node {
            p.context_switches = diff(o.context_switches, n.context_switches);
            p.interrupts = diff(o.interrupts, n.interrupts);
            // A CPU brought on- or offline changes the sums by whole counters: not a rate.
            if o.cpus == n.cpus {
                if let (Some(a), Some(b)) = (o.cpu, n.cpu) {
                    let mut d = [0f64; 8];
                    let mut ok = true;
                    for i in 0..8 {
                        match diff(Some(a[i]), Some(b[i])) {
                            Some(x) => d[i] = x,
                            None => ok = false,
                        }
                    }
                    if ok {
                        p.cpu = Some(CpuSeconds {
                            user: d[0],
                            nice: d[1],
                            system: d[2],
                            iowait: d[3],
                            irq: d[4],
                            softirq: d[5],
                            steal: d[6],
                            idle: d[7],
                        });
                    }
                }
            }
        }
    }
    if let Some(s) = &cur.sql {
        p.threads_running = s.get("Threads_running");
        p.threads_connected = s.get("Threads_connected");
        if let Some(o) = &prev.sql {
            let d = |name: &str| diff(o.get(name), s.get(name));
            p.questions = d("Questions");
            p.com_select = d("Com_select");
            p.row_lock_waits = d("Innodb_row_lock_waits");
            p.row_lock_time_ms = d("Innodb_row_lock_time");
            p.tmp_disk_tables = d("Created_tmp_disk_tables");
        }
    }
    p
}

/// A target's points, bounded: when [`MAX_POINTS`] are held, adjacent pairs are merged
/// (each point then covers twice as long) and later points are gathered to that length
/// before they are kept. Totals stay exact; nothing is dropped.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub points: Vec<ResourcePoint>,
    pub decimations: u32,
    pending: Option<ResourcePoint>,
    max: usize,
}

impl Timeline {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(2),
            ..Self::default()
        }
    }

    pub fn push(&mut self, p: ResourcePoint) {
        let p = match self.pending.take() {
            Some(mut acc) => {
                acc.absorb(&p);
                acc
            }
            None => p,
        };
        let span = INTERVAL.as_secs_f64() * f64::from(1u32 << self.decimations.min(30));
        // Half an interval of slack: readings are not exactly a second apart.
        if p.dt_s + INTERVAL.as_secs_f64() / 2.0 < span {
            self.pending = Some(p);
            return;
        }
        self.points.push(p);
        if self.points.len() >= self.max {
            let old = std::mem::take(&mut self.points);
            for pair in old.chunks(2) {
                let mut a = pair[0].clone();
                if let Some(b) = pair.get(1) {
                    a.absorb(b);
                }
                self.points.push(a);
            }
            self.decimations += 1;
        }
    }

    /// The points, with the one being gathered.
    pub fn all(&self) -> Vec<ResourcePoint> {
        let mut v = self.points.clone();
        v.extend(self.pending.clone());
        v
    }
}

/// One target's state in the thread.
struct Target {
    spec: TargetSpec,
    sql: Option<SqlSource>,
    last: Option<Reading>,
    timeline: Timeline,
    scrape_failures: u64,
    sql_failures: u64,
    warned_node: bool,
    warned_sql: bool,
}

impl Target {
    fn read(&mut self, now: Instant) -> Reading {
        let mut r = Reading {
            unix_ms: unix_ms(),
            ..Reading::default()
        };
        if let Some(url) = self.spec.metrics.clone() {
            match node::fetch(&url) {
                Ok(page) => {
                    let s = node::parse(&page);
                    if s == NodeSample::default() {
                        self.node_failed(&url, "the page has none of the node_* series read");
                    } else {
                        r.node = Some(s);
                    }
                }
                Err(e) => self.node_failed(&url, &e),
            }
        }
        if let Some(src) = &mut self.sql {
            match src.sample(now) {
                Ok(s) => r.sql = Some(s),
                Err(e) => {
                    self.sql_failures += 1;
                    if !self.warned_sql {
                        self.warned_sql = true;
                        tracing::warn!(
                            "--target-sql-metrics: cannot sample {}: {e} (retrying every few \
                             seconds; mirroring goes on; failures are counted in the report)",
                            self.spec.target
                        );
                    }
                }
            }
        }
        r
    }

    fn node_failed(&mut self, url: &MetricsUrl, e: &str) {
        self.scrape_failures += 1;
        if !self.warned_node {
            self.warned_node = true;
            tracing::warn!(
                "--target-metrics: cannot scrape {url} for {}: {e} (retrying every second; \
                 mirroring goes on; failures are counted in the report)",
                self.spec.target
            );
        }
    }

    fn report(&self) -> TargetResources {
        let points = self.timeline.all();
        let mut notes = self.spec.notes.clone();
        if let Some(n) = self.sql.as_ref().and_then(|s| s.digest_note.clone()) {
            notes.push(n);
        }
        TargetResources {
            target: self.spec.target.to_string(),
            metrics_url: self.spec.metrics.as_ref().map(ToString::to_string),
            sql_sampled: self.sql.is_some(),
            summary: summarize(&points),
            points,
            scrape_failures: self.scrape_failures,
            sql_failures: self.sql_failures,
            decimations: self.timeline.decimations,
            digest_cpu: self
                .sql
                .as_ref()
                .map(|s| s.digest_cpu.clone())
                .unwrap_or_default(),
            notes,
        }
    }
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    snapshot: Mutex<Arc<Vec<TargetResources>>>,
}

/// The running sampler; dropping it stops the thread (within one scrape's timeout).
pub struct Sampler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts the thread. The timeline's zero is `zero_unix_ms` (the report's start).
    pub fn start(specs: Vec<TargetSpec>, zero_unix_ms: u64) -> Result<Self> {
        let mut targets: Vec<Target> = specs
            .into_iter()
            .map(|spec| Target {
                sql: spec.sql.clone().map(|a| SqlSource::new(spec.target, a)),
                spec,
                last: None,
                timeline: Timeline::new(MAX_POINTS),
                scrape_failures: 0,
                sql_failures: 0,
                warned_node: false,
                warned_sql: false,
            })
            .collect();
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            snapshot: Mutex::new(Arc::new(targets.iter().map(Target::report).collect())),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("resources".into())
            .spawn(move || run(&mut targets, &s, zero_unix_ms))
            .context("cannot start the resource sampler's thread")?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The latest figures, per target in `--target` order.
    pub fn snapshot(&self) -> Vec<TargetResources> {
        let s = self
            .shared
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(&s).as_ref().clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(targets: &mut [Target], shared: &Shared, zero_unix_ms: u64) {
    let start = Instant::now();
    let mut tick: u32 = 0;
    loop {
        let now = Instant::now();
        for t in targets.iter_mut() {
            let r = t.read(now);
            if let Some(prev) = &t.last {
                t.timeline.push(interval(prev, &r, zero_unix_ms));
            }
            t.last = Some(r);
        }
        let snap: Vec<TargetResources> = targets.iter().map(Target::report).collect();
        *shared.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(snap);
        // The next whole interval since the start; ticks missed by a slow scrape are skipped.
        let elapsed = start.elapsed();
        let next_tick = (elapsed.as_millis() / INTERVAL.as_millis()) as u32 + 1;
        tick = next_tick.max(tick + 1);
        let due = start + INTERVAL * tick;
        let mut stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *stop {
                return;
            }
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stop = shared
                .wake
                .wait_timeout(stop, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ms: u64, user: f64, system: f64, idle: f64, ctx: f64) -> Reading {
        let mut cpu = [0f64; 8];
        cpu[0] = user;
        cpu[2] = system;
        cpu[7] = idle;
        Reading {
            unix_ms: ms,
            node: Some(NodeSample {
                cpu: Some(cpu),
                cpus: 2,
                context_switches: Some(ctx),
                procs_running: Some(3.0),
                ..NodeSample::default()
            }),
            sql: None,
        }
    }

    #[test]
    fn rates_from_two_readings() {
        let a = node(10_000, 100.0, 50.0, 1000.0, 1_000_000.0);
        let b = node(11_000, 100.5, 50.25, 1001.25, 1_004_000.0);
        let p = interval(&a, &b, 9_000);
        assert_eq!((p.t_s, p.dt_s), (1.0, 1.0));
        let c = p.cpu.unwrap();
        assert_eq!((c.user, c.system, c.idle), (0.5, 0.25, 1.25));
        assert_eq!(p.context_switches, Some(4000.0));
        assert_eq!(p.procs_running, Some(3.0));
        let s = summarize(&[p]);
        assert!((s.series["cpu_user_pct"].mean - 25.0).abs() < 1e-9);
        assert_eq!(s.series["context_switches_per_s"].mean, 4000.0);
    }

    #[test]
    fn a_reset_or_wrap_gives_no_figure_for_that_interval_only() {
        let a = node(0, 100.0, 50.0, 1000.0, 4_294_967_000.0);
        // The exporter restarted (CPU counters are the kernel's: they did not move back),
        // and the 32-bit context switch counter wrapped.
        let b = node(1_000, 101.0, 50.0, 1001.0, 200.0);
        let p = interval(&a, &b, 0);
        assert_eq!(p.context_switches, None);
        assert_eq!(p.cpu.unwrap().user, 1.0);
        let c = node(2_000, 100.5, 50.0, 1002.0, 300.0);
        let p = interval(&b, &c, 0);
        assert_eq!(p.cpu, None, "a CPU counter moved back");
        assert_eq!(p.context_switches, Some(100.0));
    }

    #[test]
    fn a_missing_series_or_source_is_missing_not_zero() {
        let a = node(0, 1.0, 1.0, 1.0, 10.0);
        let mut b = node(1_000, 2.0, 1.0, 1.0, 20.0);
        if let Some(n) = &mut b.node {
            n.context_switches = None;
        }
        b.sql = Some(StatusSample::default());
        let p = interval(&a, &b, 0);
        assert_eq!((p.context_switches, p.questions), (None, None));
        assert!(p.cpu.is_some());
        // A failed scrape: no node figures at all in the next interval either.
        let failed = Reading {
            unix_ms: 2_000,
            ..Reading::default()
        };
        let p = interval(&b, &failed, 0);
        assert_eq!((p.cpu, p.procs_running), (None, None));
        let p = interval(&failed, &node(3_000, 3.0, 1.0, 1.0, 30.0), 0);
        assert!(p.cpu.is_none() && p.procs_running == Some(3.0));
    }

    #[test]
    fn sql_counters_become_interval_counts() {
        let sample = |q: f64, running: f64| {
            let mut s = StatusSample::default();
            s.values[0] = Some(running);
            s.values[2] = Some(q);
            s.values[4] = Some(7.0);
            s
        };
        let a = Reading {
            unix_ms: 0,
            node: None,
            sql: Some(sample(100.0, 1.0)),
        };
        let b = Reading {
            unix_ms: 2_000,
            node: None,
            sql: Some(sample(300.0, 5.0)),
        };
        let p = interval(&a, &b, 0);
        assert_eq!(p.questions, Some(200.0));
        assert_eq!(p.threads_running, Some(5.0));
        assert_eq!(p.row_lock_waits, Some(0.0));
        let s = summarize(&[p]);
        assert_eq!(s.series["questions_per_s"].mean, 100.0);
    }

    #[test]
    fn the_timeline_halves_itself_and_keeps_totals() {
        let mut t = Timeline::new(8);
        for i in 0..100u32 {
            t.push(ResourcePoint {
                t_s: f64::from(i),
                dt_s: 1.0,
                context_switches: Some(10.0),
                ..ResourcePoint::default()
            });
        }
        let all = t.all();
        assert!(all.len() <= 8, "{}", all.len());
        assert!(t.decimations >= 3);
        let s = summarize(&all);
        assert_eq!(s.context_switches, 1000.0);
        assert_eq!(s.covered_s, 100.0);
        assert!(all.windows(2).all(|w| w[0].t_s < w[1].t_s));
    }

    #[test]
    fn a_host_that_does_not_answer_is_counted_not_fatal() {
        // A closed port on this host: connect is refused at once.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let url = MetricsUrl::parse(&format!("http://127.0.0.1:{port}/metrics")).unwrap();
        let s = Sampler::start(
            vec![TargetSpec {
                target: "127.0.0.1:3306".parse().unwrap(),
                metrics: Some(url),
                sql: None,
                notes: vec!["n".into()],
            }],
            unix_ms(),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(1300));
        let snap = s.snapshot();
        drop(s);
        assert_eq!(snap.len(), 1);
        assert!(snap[0].scrape_failures >= 2, "{:?}", snap[0]);
        assert!(snap[0].points.iter().all(|p| p.cpu.is_none()));
        assert_eq!(snap[0].notes, vec!["n".to_string()]);
    }
}
