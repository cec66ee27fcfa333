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
//! [`SqlMetrics`]); their checks across flags and the start from them are in
//! `crate::sampling` (settings -> sampling -> resources: this room never reads settings).
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

#[cfg(test)]
mod tests {
    use super::*;

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
