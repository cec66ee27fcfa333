//! What the resource flags ask for (`--target-metrics`, `--target-sql-metrics`): their checks
//! across flags and the sampler they start, from the settings.
//!
//! # What this room is for
//!
//! The wiring between `settings` and `resources`, so that neither reads the other's
//! concerns: `resources` samples what it is given, `settings` declares the flags.
//!
//! # What it must never do
//!
//! * Sample or parse anything itself (that is `resources`).

use anyhow::{bail, Result};

use crate::resources::{Sampler, SqlMetrics};
use crate::settings::{MirrorSettings, Protocol};

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
                Some(crate::resources::sql::SqlAccount {
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
        .map(|(i, t)| crate::resources::sampler::TargetSpec {
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
}
