//! A test server's own view of its load: `SHOW GLOBAL STATUS` once per interval, and, where
//! the server has it (MySQL 8.0.28+), CPU per statement digest from `performance_schema`.
//!
//! One blocking session per target ([`SqlSource`]) with the copier's [`MysqlClient`], from
//! the copier host's own address: the capture filter leaves every packet to or from a target
//! host out (`settings::capture_filter`), so this session is never mirrored.
//!
//! What it adds to the test server, and so to the figures it reads: one `SHOW GLOBAL STATUS`
//! per interval (`Com_show_status` +1, `Questions` +1), one connection (`Threads_connected`
//! +1, and `Threads_running` +1 while its statement runs: the sampler counts itself as the
//! one running thread it always sees), and with digest CPU one `SELECT` on
//! `performance_schema.events_statements_summary_by_digest` every [`DIGEST_EVERY`].
//!
//! Must never put anything but its own constant SQL on the wire, nor panic on the rows.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use common::mysql::auth::Password;

use crate::prod_state::{MysqlClient, ProdError, Row};
use crate::report::resources::DigestCpu;

/// Connect and I/O timeout: the sampler's interval is a second.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Wait before reconnecting after a failure, so a server that refuses us is not hammered
/// with logins (each failed one counts in its `Aborted_connects`).
const RECONNECT: Duration = Duration::from_secs(5);
/// How often the digest table is read (it may hold thousands of rows).
pub const DIGEST_EVERY: Duration = Duration::from_secs(10);
/// Digests kept in the report.
const DIGESTS_SHOWN: usize = 50;
/// Characters of a digest's text kept.
const DIGEST_TEXT_CHARS: usize = 300;

/// The status variables read, in the order of [`StatusSample::values`].
pub const VARIABLES: [&str; 7] = [
    "Threads_running",
    "Threads_connected",
    "Questions",
    "Com_select",
    "Innodb_row_lock_waits",
    "Innodb_row_lock_time",
    "Created_tmp_disk_tables",
];

const STATUS_SQL: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN ('Threads_running', \
     'Threads_connected', 'Questions', 'Com_select', 'Innodb_row_lock_waits', \
     'Innodb_row_lock_time', 'Created_tmp_disk_tables')";

const PROBE_SQL: &str = "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = \
     'performance_schema' AND TABLE_NAME = 'events_statements_summary_by_digest' AND \
     COLUMN_NAME = 'SUM_CPU_TIME'";

// Ordered so that, when the table is larger than the limit, what is cut is what cost least.
const DIGEST_SQL: &str = "SELECT SCHEMA_NAME, DIGEST, LEFT(DIGEST_TEXT, 300), COUNT_STAR, \
     SUM_CPU_TIME FROM performance_schema.events_statements_summary_by_digest ORDER BY \
     SUM_CPU_TIME DESC LIMIT 5000";

/// The test server's account: the `--mysql-default-user` line of `--mysql-credentials`.
#[derive(Clone, Debug)]
pub struct SqlAccount {
    pub user: String,
    pub password: Password,
}

/// One `SHOW GLOBAL STATUS`, the [`VARIABLES`] in order (`None`: absent or not a number).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusSample {
    pub values: [Option<f64>; 7],
}

impl StatusSample {
    pub fn get(&self, name: &str) -> Option<f64> {
        let i = VARIABLES.iter().position(|v| *v == name)?;
        self.values[i]
    }
}

/// `Variable_name, Value` rows into a sample; unknown names and bad values are skipped.
pub fn parse_status(rows: &[Row]) -> StatusSample {
    let mut s = StatusSample::default();
    for r in rows {
        let (Some(Some(name)), Some(Some(value))) = (r.first(), r.get(1)) else {
            continue;
        };
        let Some(i) = VARIABLES
            .iter()
            .position(|v| v.as_bytes().eq_ignore_ascii_case(name))
        else {
            continue;
        };
        s.values[i] = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite());
    }
    s
}

/// Whether the server has digest CPU, once probed.
enum DigestState {
    Unprobed,
    Absent,
    /// Readings by (schema, digest): (count, CPU picoseconds, text) at the start.
    Present {
        baseline: Option<HashMap<(String, String), (u64, u64)>>,
        next: Instant,
    },
}

/// One target's session. See the module documentation.
pub struct SqlSource {
    addr: SocketAddrV4,
    account: SqlAccount,
    client: Option<MysqlClient<TcpStream>>,
    retry_at: Option<Instant>,
    digests: DigestState,
    /// The latest CPU per digest since the first reading, most first.
    pub digest_cpu: Vec<DigestCpu>,
    /// Set once, when the probe finds the server without digest CPU.
    pub digest_note: Option<String>,
}

impl SqlSource {
    pub fn new(addr: SocketAddrV4, account: SqlAccount) -> Self {
        Self {
            addr,
            account,
            client: None,
            retry_at: None,
            digests: DigestState::Unprobed,
            digest_cpu: Vec::new(),
            digest_note: None,
        }
    }

    /// Reads the status variables (connecting first if needed); on failure the session is
    /// dropped and reopened no sooner than [`RECONNECT`] later.
    pub fn sample(&mut self, now: Instant) -> Result<StatusSample, String> {
        if self.client.is_none() {
            if self.retry_at.is_some_and(|t| now < t) {
                return Err("waiting to reconnect".into());
            }
            match self.connect() {
                Ok(c) => self.client = Some(c),
                Err(e) => {
                    self.retry_at = Some(now + RECONNECT);
                    return Err(e);
                }
            }
        }
        let Some(c) = self.client.as_mut() else {
            return Err("no session".into());
        };
        match c.query(STATUS_SQL) {
            Ok(rows) => {
                self.digests(now);
                Ok(parse_status(&rows))
            }
            Err(e) => {
                self.client = None;
                self.retry_at = Some(now + RECONNECT);
                Err(describe(&e))
            }
        }
    }

    fn connect(&self) -> Result<MysqlClient<TcpStream>, String> {
        let s = TcpStream::connect_timeout(&SocketAddr::V4(self.addr), TIMEOUT)
            .map_err(|e| format!("connect to {}: {e}", self.addr))?;
        s.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        MysqlClient::login(s, &self.account.user, &self.account.password)
            .map_err(|e| format!("login as {:?}: {}", self.account.user, describe(&e)))
    }

    /// Probes once, then reads the digest table every [`DIGEST_EVERY`]. A failure here is
    /// not the status sample's: it is noted and digest CPU given up.
    fn digests(&mut self, now: Instant) {
        let Some(c) = self.client.as_mut() else {
            return;
        };
        match &mut self.digests {
            DigestState::Absent => {}
            DigestState::Unprobed => {
                let has = c
                    .query(PROBE_SQL)
                    .ok()
                    .and_then(|rows| rows.first().and_then(|r| r.first().cloned()))
                    .flatten()
                    .is_some_and(|v| v != b"0");
                if has {
                    self.digests = DigestState::Present {
                        baseline: None,
                        next: now,
                    };
                    self.digests(now);
                } else {
                    self.digests = DigestState::Absent;
                    self.digest_note = Some(
                        "no CPU per statement digest: the server has no \
                         events_statements_summary_by_digest.SUM_CPU_TIME (MySQL 8.0.28+ only; \
                         MariaDB has none)"
                            .into(),
                    );
                }
            }
            DigestState::Present { baseline, next } => {
                if now < *next {
                    return;
                }
                *next = now + DIGEST_EVERY;
                let rows = match c.query(DIGEST_SQL) {
                    Ok(r) => r,
                    Err(e) => {
                        self.digest_note = Some(format!(
                            "CPU per statement digest given up: {}",
                            describe(&e)
                        ));
                        self.digests = DigestState::Absent;
                        return;
                    }
                };
                let read = read_digests(&rows);
                match baseline {
                    None => {
                        *baseline = Some(
                            read.into_iter()
                                .map(|d| ((d.schema, d.digest), (d.count, d.cpu_ps)))
                                .collect(),
                        );
                    }
                    Some(base) => self.digest_cpu = digest_deltas(base, read),
                }
            }
        }
    }
}

/// One row of the digest table.
#[derive(Clone, Debug, PartialEq)]
pub struct DigestRow {
    pub schema: String,
    pub digest: String,
    pub text: String,
    pub count: u64,
    pub cpu_ps: u64,
}

pub fn read_digests(rows: &[Row]) -> Vec<DigestRow> {
    let text = |v: Option<&Option<Vec<u8>>>| {
        v.and_then(Option::as_ref)
            .map(|b| {
                String::from_utf8_lossy(b)
                    .chars()
                    .take(DIGEST_TEXT_CHARS)
                    .collect()
            })
            .unwrap_or_default()
    };
    let num = |v: Option<&Option<Vec<u8>>>| {
        v.and_then(Option::as_ref)
            .and_then(|b| std::str::from_utf8(b).ok()?.trim().parse::<u64>().ok())
    };
    rows.iter()
        .filter_map(|r| {
            Some(DigestRow {
                schema: text(r.first()),
                digest: text(r.get(1)),
                text: text(r.get(2)),
                count: num(r.get(3))?,
                cpu_ps: num(r.get(4))?,
            })
        })
        .collect()
}

/// What each digest cost since the baseline, most first; a digest whose counters went
/// backwards (the table was truncated) counts from zero.
pub fn digest_deltas(
    base: &HashMap<(String, String), (u64, u64)>,
    now: Vec<DigestRow>,
) -> Vec<DigestCpu> {
    let mut out: Vec<DigestCpu> = now
        .into_iter()
        .filter_map(|d| {
            let (c0, p0) = base
                .get(&(d.schema.clone(), d.digest.clone()))
                .copied()
                .filter(|(c0, p0)| *c0 <= d.count && *p0 <= d.cpu_ps)
                .unwrap_or((0, 0));
            let count = d.count - c0;
            let ps = d.cpu_ps - p0;
            (count > 0 || ps > 0).then(|| DigestCpu {
                digest: d.digest,
                schema: d.schema,
                text: d.text,
                count,
                cpu_s: ps as f64 / 1e12,
            })
        })
        .collect();
    out.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s));
    out.truncate(DIGESTS_SHOWN);
    out
}

/// The client's errors name production (its first user); here the server is a test server.
fn describe(e: &ProdError) -> String {
    match e {
        ProdError::Connect { addr, source } => format!("cannot connect to {addr}: {source}"),
        ProdError::Io(e) => e.to_string(),
        ProdError::Server { code, message } => format!("server error {code}: {message}"),
        ProdError::Protocol(s) => format!("unexpected reply: {s}"),
        ProdError::Auth(s) => s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cols: &[&str]) -> Row {
        cols.iter().map(|c| Some(c.as_bytes().to_vec())).collect()
    }

    #[test]
    fn status_rows_by_name_whatever_the_case() {
        let rows = vec![
            row(&["Threads_running", "4"]),
            row(&["THREADS_CONNECTED", "12"]),
            row(&["Questions", "not a number"]),
            row(&["Com_select", "123456789012"]),
            row(&["Uptime", "5"]),
            vec![None, Some(b"1".to_vec())],
            vec![],
        ];
        let s = parse_status(&rows);
        assert_eq!(s.get("Threads_running"), Some(4.0));
        assert_eq!(s.get("Threads_connected"), Some(12.0));
        assert_eq!(s.get("Questions"), None);
        assert_eq!(s.get("Com_select"), Some(123_456_789_012.0));
        assert_eq!(s.get("Innodb_row_lock_waits"), None);
    }

    #[test]
    fn digest_cpu_is_counted_from_the_first_reading() {
        let first = read_digests(&[
            row(&["sbtest", "aa", "SELECT ?", "10", "5000000000000"]),
            row(&["sbtest", "bb", "UPDATE t", "3", "1000000000000"]),
            row(&["sbtest", "cc", "bad", "x", "1"]),
        ]);
        assert_eq!(first.len(), 2);
        let base = first
            .into_iter()
            .map(|d| ((d.schema, d.digest), (d.count, d.cpu_ps)))
            .collect();
        let later = read_digests(&[
            row(&["sbtest", "aa", "SELECT ?", "110", "7500000000000"]),
            row(&["sbtest", "bb", "UPDATE t", "3", "1000000000000"]),
            row(&["sbtest", "dd", "DELETE", "2", "4000000000000"]),
            // Truncated since: counts from zero.
            row(&["other", "aa", "SELECT ?", "1", "1000000000"]),
        ]);
        let d = digest_deltas(&base, later);
        let got: Vec<_> = d
            .iter()
            .map(|d| (d.digest.as_str(), d.count, d.cpu_s))
            .collect();
        assert_eq!(
            got,
            vec![("dd", 2, 4.0), ("aa", 100, 2.5), ("aa", 1, 0.001)]
        );
    }
}
