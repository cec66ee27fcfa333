//! Logging set-up and SIGHUP.
//!
//! On SIGHUP a daemon re-reads its config file. What a running daemon can take at once is
//! applied: the log filter (`log`). Everything else is wired into capture, sessions and sockets
//! at start, so a change there is named in the log with "restart to apply" rather than half
//! applied. Being told exactly that beats a reload that silently does nothing.
//!
//! SIGHUP is blocked in every thread (call [`block_sighup`] first thing in `main`, before any
//! thread exists) and taken by one thread with sigwait(2): no async-signal-safety constraints,
//! and the packet threads never see it.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::config::{ConfigFile, Setting};

/// Changes the log filter of a running process.
#[derive(Clone)]
pub struct LogControl {
    handle: reload::Handle<EnvFilter, Registry>,
}

impl LogControl {
    pub fn set(&self, filter: &str) -> Result<(), String> {
        let f =
            EnvFilter::try_new(filter).map_err(|e| format!("bad log filter {filter:?}: {e}"))?;
        self.handle.reload(f).map_err(|e| e.to_string())
    }
}

/// Logs to stderr (journald under systemd) with `filter`; a bad filter falls back to `info`
/// and says so. `with_target`: show the module of each line.
pub fn init_logging(filter: &str, with_target: bool) -> LogControl {
    let (f, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let (layer, handle) = reload::Layer::new(f);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(with_target)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // try_init: a second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(layer)
        .with(fmt)
        .try_init();
    if let Some(e) = bad {
        tracing::warn!("log filter {filter:?} is invalid ({e}); logging at info");
    }
    LogControl { handle }
}

/// Blocks SIGHUP in the calling thread and every thread it starts later.
pub fn block_sighup() {
    // SAFETY: sigset operations on a local set, and pthread_sigmask on this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Runs `on_hup` on a background thread at every SIGHUP (which must be blocked, see
/// [`block_sighup`]).
pub fn on_sighup(mut on_hup: impl FnMut() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("sighup".into())
        .spawn(move || loop {
            // SAFETY: sigwait on a local set holding SIGHUP, blocked in every thread.
            let got = unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGHUP);
                let mut sig: libc::c_int = 0;
                libc::sigwait(&set, &mut sig) == 0 && sig == libc::SIGHUP
            };
            if got {
                on_hup();
            }
        })
        .map(|_| ())
}

/// What a daemon re-reads on SIGHUP.
pub struct Reloader {
    path: Option<PathBuf>,
    keys_from: Command,
    current: ConfigFile,
    /// Whether `--log`/TCPSHADOW_LOG was given: they outrank the file, so its `log` is moot.
    log_overridden: bool,
    log: LogControl,
    /// How to restart, for messages: e.g. `systemctl restart tcpshadow-copier`.
    restart_hint: String,
}

impl Reloader {
    pub fn new(
        config: Option<&ConfigFile>,
        keys_from: Command,
        matches: &ArgMatches,
        log: LogControl,
        restart_hint: &str,
    ) -> Self {
        Reloader {
            path: config.map(|c| c.path.clone()),
            keys_from,
            current: config.cloned().unwrap_or_default(),
            log_overridden: matches!(
                matches.value_source("log"),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            ),
            log,
            restart_hint: restart_hint.to_owned(),
        }
    }

    /// Re-reads the file and applies or names each change. Returns the lines it logged.
    pub fn reload(&mut self) -> Vec<String> {
        let mut said = Vec::new();
        let mut say = |warn: bool, s: String| {
            if warn {
                tracing::warn!("{s}");
            } else {
                tracing::info!("{s}");
            }
            said.push(s);
        };
        let Some(path) = self.path.clone() else {
            say(
                false,
                "SIGHUP: no --config file, nothing to reload".to_owned(),
            );
            return said;
        };
        let new = match ConfigFile::load(&path, &self.keys_from) {
            Ok(c) => c,
            Err(e) => {
                say(
                    true,
                    format!("SIGHUP: {e}; keeping the running configuration"),
                );
                return said;
            }
        };
        let shown = |s: Option<&Setting>| match s {
            Some(s) => s.values.join(","),
            None => "(unset)".to_owned(),
        };
        let mut keys: Vec<&str> = self
            .current
            .settings
            .iter()
            .chain(&new.settings)
            .map(|s| s.id.as_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut changed = 0;
        for id in keys {
            let (old, now) = (self.current.get(id), new.get(id));
            if old.map(|s| &s.values) == now.map(|s| &s.values) {
                continue;
            }
            changed += 1;
            let key = now.or(old).map(|s| s.key.clone()).unwrap_or_default();
            if id == "log" {
                if self.log_overridden {
                    say(false, format!("SIGHUP: `log` changed in {}, but --log or TCPSHADOW_LOG overrides the file; unchanged", path.display()));
                    continue;
                }
                let filter = now
                    .and_then(|s| s.values.first().cloned())
                    .unwrap_or_else(|| "info".into());
                match self.log.set(&filter) {
                    Ok(()) => say(false, format!("SIGHUP: log filter is now {filter:?}")),
                    Err(e) => say(true, format!("SIGHUP: {e}; log filter unchanged")),
                }
                continue;
            }
            say(
                true,
                format!(
                    "SIGHUP: `{key}` changed in {} ({} -> {}): takes effect on restart ({})",
                    path.display(),
                    crate::config::redact(&key, &shown(old)),
                    crate::config::redact(&key, &shown(now)),
                    self.restart_hint
                ),
            );
        }
        if changed == 0 {
            say(false, format!("SIGHUP: {} unchanged", path.display()));
        }
        self.current = new;
        said
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    #[test]
    fn reload_applies_the_log_filter_and_names_the_rest() {
        let cmd = Command::new("d")
            .arg(Arg::new("log").long("log").default_value("info"))
            .arg(Arg::new("mss").long("mss"))
            .arg(Arg::new("prod_dsn").long("prod-dsn"))
            .arg(Arg::new("x").long("x").action(ArgAction::SetTrue));
        let dir = std::env::temp_dir().join(format!("ops-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.toml");
        std::fs::write(
            &path,
            "log = \"info\"\nmss = 1400\nprod-dsn = \"mysql://u:pw1@h\"\n",
        )
        .unwrap();
        let cfg = ConfigFile::load(&path, &cmd).unwrap();
        let m = cfg.apply(cmd.clone()).try_get_matches_from(["d"]).unwrap();
        let log = init_logging("info", false);
        let mut r = Reloader::new(Some(&cfg), cmd.clone(), &m, log, "systemctl restart d");
        assert!(r.reload()[0].contains("unchanged"));
        std::fs::write(
            &path,
            "log = \"debug\"\nmss = 1300\nprod-dsn = \"mysql://u:pw2@h\"\n",
        )
        .unwrap();
        let said = r.reload().join("\n");
        assert!(said.contains("log filter is now \"debug\""), "{said}");
        assert!(
            said.contains("`mss` changed")
                && said.contains("1400 -> 1300")
                && said.contains("systemctl restart d"),
            "{said}"
        );
        assert!(!said.contains("pw1") && !said.contains("pw2"), "{said}");
        std::fs::write(&path, "mss = [\n").unwrap();
        let said = r.reload().join("\n");
        assert!(said.contains("keeping the running configuration"), "{said}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
