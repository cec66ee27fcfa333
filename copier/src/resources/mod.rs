//! What each test server's host and server spent during the run (issue 22: an A/B
//! experiment compares two test servers' cost, not only their answers).
//!
//! # What this room is for
//!
//! An I/O edge beside the mirror: one thread ([`sampler`]) reads, every second and per
//! `--target`, its host's node_exporter (`--target-metrics`, [`node`]) and the server's
//! `SHOW GLOBAL STATUS` (`--target-sql-metrics`, [`sql`]), turns the counters into
//! per-interval figures and hands the report a bounded timeline and its summary
//! (`report::resources`). This module holds what the flags give ([`MetricsUrl`],
//! [`SqlMetrics`]) and their checks ([`validate`]).
//!
//! # What it must never do
//!
//! * Be waited for by the mirror: the engine and driver threads never block on it; the
//!   report takes its latest snapshot from a mutex the sampler holds only to swap it.
//! * Stop or slow mirroring when a host does not answer: failures are counted, warned about
//!   once per target, and retried.
//! * Panic or grow without bound on what hosts send (pages, rows): everything is capped.
//! * Send the test server anything but its own constant statements (see [`sql`] for what
//!   they add to the server's counters).

pub mod node;
pub mod sampler;
pub mod sql;

use std::fmt;

use anyhow::{bail, Result};

use crate::settings::{MirrorSettings, Protocol};

pub use sampler::Sampler;

/// A node_exporter address, `http://HOST:PORT/PATH` (plain HTTP: the page is public figures,
/// and std has no TLS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsUrl {
    /// An IPv4 address or a host name.
    pub host: String,
    pub port: u16,
    /// Starts with `/` (`/metrics` when the URL has no path).
    pub path: String,
}

impl MetricsUrl {
    /// Parses and checks one URL; the message says what form is expected.
    pub fn parse(s: &str) -> Result<Self, String> {
        let expected = "expected http://HOST:PORT/metrics, e.g. http://198.18.0.3:9100/metrics";
        let Some(rest) = s.strip_prefix("http://") else {
            if s.starts_with("https://") {
                return Err(format!(
                    "{s:?}: https is not supported (node_exporter's page is read over plain \
                     HTTP); {expected}"
                ));
            }
            return Err(format!("{s:?} is not an http:// URL; {expected}"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        if authority.contains('@') {
            return Err(format!(
                "{s:?}: user names and passwords are not supported; {expected}"
            ));
        }
        if authority.starts_with('[') {
            return Err(format!(
                "{s:?}: IPv6 addresses are not supported; {expected}"
            ));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => {
                let port: u16 = p
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{s:?}: {p:?} is not a port; {expected}"))?;
                (h, port)
            }
            None => (authority, 80),
        };
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
            && !host.starts_with(['-', '.']);
        if !host_ok {
            return Err(format!(
                "{s:?}: {host:?} is not a host name or IPv4 address; {expected}"
            ));
        }
        if path.len() > 1024 || !path.chars().all(|c| c.is_ascii_graphic()) || path.contains('#') {
            return Err(format!(
                "{s:?}: the path must be plain ASCII without spaces; {expected}"
            ));
        }
        Ok(Self {
            host: host.to_string(),
            port,
            path: path.to_string(),
        })
    }

    /// The `Host:` header's value.
    pub fn host_header(&self) -> String {
        if self.port == 80 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for MetricsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}{}", self.host, self.port, self.path)
    }
}

/// `--target-metrics`' value parser (clap).
pub fn parse_metrics_url(s: &str) -> Result<MetricsUrl, String> {
    MetricsUrl::parse(s.trim())
}

/// `--target-sql-metrics`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlMetrics {
    On,
    Off,
}

/// Whether the test servers' `SHOW GLOBAL STATUS` is sampled: as asked, or by default
/// whenever `--target-metrics` asks for resources at all. Not by default otherwise: a plain
/// mirror adds nothing to the test server's counters but the mirrored traffic.
pub fn sql_wanted(args: &MirrorSettings) -> bool {
    match args.target_sql_metrics {
        Some(SqlMetrics::On) => true,
        Some(SqlMetrics::Off) => false,
        None => !args.target_metrics.is_empty(),
    }
}

/// The checks across flags (called by `cli`'s `MirrorArgs::validate`).
pub fn validate(args: &MirrorSettings) -> Result<()> {
    let (urls, targets) = (args.target_metrics.len(), args.target.len());
    if urls > targets {
        bail!(
            "{urls} --target-metrics for {targets} --target: they pair by order (the first \
             URL is the first --target's host); give at most one per --target, or add the \
             missing --target"
        );
    }
    let sampling = urls > 0 || args.target_sql_metrics == Some(SqlMetrics::On);
    if sampling && args.protocol != Protocol::Mysql {
        bail!("--target-metrics and --target-sql-metrics feed the MySQL report: they need --protocol mysql");
    }
    if args.target_sql_metrics == Some(SqlMetrics::On)
        && (args.mysql_credentials.is_none() || args.mysql_default_user.is_none())
    {
        bail!(
            "--target-sql-metrics on logs in on the test servers as --mysql-default-user with \
             its password from --mysql-credentials: give both (or --target-sql-metrics off)"
        );
    }
    Ok(())
}

/// Starts the sampler when any resource is asked for; `started_unix_ms` is the report's
/// start, the timeline's zero.
pub fn start(args: &MirrorSettings, started_unix_ms: u64) -> Result<Option<Sampler>> {
    let sql = sql_wanted(args);
    if args.target_metrics.is_empty() && !sql {
        return Ok(None);
    }
    let mut notes = Vec::new();
    let account = if !sql {
        None
    } else {
        match (&args.mysql_credentials, &args.mysql_default_user) {
            (Some(path), Some(user)) => {
                let creds = crate::credentials::load(path)?;
                let Some(pw) = creds.password(user) else {
                    bail!("--mysql-default-user {user:?} has no line in --mysql-credentials");
                };
                Some(sql::SqlAccount {
                    user: user.clone(),
                    password: common::mysql::auth::Password::new(pw.to_vec()),
                })
            }
            _ => {
                // Only reached by default (an explicit `on` is refused without them).
                notes.push(
                    "SHOW GLOBAL STATUS not sampled: it needs --mysql-credentials and \
                     --mysql-default-user (the account it logs in with)"
                        .to_string(),
                );
                None
            }
        }
    };
    let specs = args
        .target
        .iter()
        .enumerate()
        .map(|(i, t)| sampler::TargetSpec {
            target: *t,
            metrics: args.target_metrics.get(i).cloned(),
            sql: account.clone(),
            notes: notes.clone(),
        })
        .collect();
    Ok(Some(Sampler::start(specs, started_unix_ms)?))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Args;

    fn check(extra: &[&str]) -> Result<MirrorSettings, String> {
        let mut v = vec!["copier", "--intercept", "198.18.0.4:36524"];
        v.extend(extra);
        let a = Args::try_parse_from(v).map_err(|e| e.to_string())?;
        a.mirror.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn flags_pair_urls_with_targets_by_order() {
        let two = "198.18.0.3:3306,198.18.0.5:3306";
        let pool = ["--client-ip-pool", "198.19.0.0/16"];
        let s = check(
            &[
                &[
                    "--target",
                    two,
                    "--target-metrics",
                    "http://198.18.0.3:9100/metrics",
                ][..],
                &pool[..],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(s.target_metrics.len(), 1);
        // By default SQL is sampled with node metrics, never without.
        assert!(sql_wanted(&s));
        assert!(!sql_wanted(
            &check(&["--target", "198.18.0.3:3306"]).unwrap()
        ));
        let e = check(
            &[&[
                "--target",
                "198.18.0.3:3306",
                "--target-metrics",
                "http://a:9100/metrics,http://b:9100/metrics",
            ][..]]
            .concat(),
        )
        .unwrap_err();
        assert!(e.contains("2 --target-metrics for 1 --target"), "{e}");
        let e = check(&[
            "--target",
            "198.18.0.3:3306",
            "--target-metrics",
            "https://a/m",
        ])
        .unwrap_err();
        assert!(e.contains("https is not supported"), "{e}");
        let e = check(&["--target", "198.18.0.3:3306", "--target-sql-metrics", "on"]).unwrap_err();
        assert!(e.contains("--mysql-default-user"), "{e}");
        let off = check(&[
            "--target",
            "198.18.0.3:3306",
            "--target-metrics",
            "http://a:9100/metrics",
            "--target-sql-metrics",
            "off",
        ])
        .unwrap();
        assert!(!sql_wanted(&off));
    }

    #[test]
    fn urls_take_one_form_and_say_which() {
        let u = MetricsUrl::parse("http://198.18.0.3:9100/metrics").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("198.18.0.3", 9100, "/metrics")
        );
        assert_eq!(u.to_string(), "http://198.18.0.3:9100/metrics");
        let u = MetricsUrl::parse("http://db-test-1.example:9100").unwrap();
        assert_eq!((u.port, u.path.as_str()), (9100, "/metrics"));
        assert_eq!(MetricsUrl::parse("http://h/m").unwrap().port, 80);
        for (bad, says) in [
            ("https://198.18.0.3:9100/metrics", "https is not supported"),
            ("198.18.0.3:9100", "not an http:// URL"),
            ("http://198.18.0.3:0/metrics", "not a port"),
            ("http://198.18.0.3:99999/metrics", "not a port"),
            ("http://[::1]:9100/metrics", "IPv6"),
            ("http://u:p@h:9100/metrics", "passwords"),
            ("http://h o:9100/metrics", "not a host name"),
            ("http://:9100/metrics", "not a host name"),
            ("http://h:9100/a b", "plain ASCII"),
        ] {
            let e = MetricsUrl::parse(bad).unwrap_err();
            assert!(
                e.contains(says) && e.contains("http://HOST:PORT/metrics"),
                "{bad}: {e}"
            );
        }
    }
}
