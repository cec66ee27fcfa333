//! Config files for the daemons: `--config FILE` (TOML), where every key is a long flag name.
//!
//! The set of valid keys, their types and their checks all come from the daemon's clap
//! definition, so a new flag is a config key (and needs nothing here). A value from the file
//! becomes the argument's default, which gives the precedence users expect from clap itself:
//! flag > `TCPSHADOW_*` environment variable > config file > built-in default. Unlike setting
//! environment variables, this mutates no process state and tells, per key, where its value
//! came from (`--print-config`).
//!
//! The file is untrusted input: unknown keys, wrong types and invalid values are errors that
//! name the file, the key, what was expected, and for an unknown key the closest valid one.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// Environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "TCPSHADOW_CONFIG";
/// Largest config file read: a config is a few kilobytes; anything bigger is a mistake.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// `--config`, `--print-config` and `--log`: flattened into each daemon's command line.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// TOML file of settings, one `key = value` per flag, named like the long flag
    /// (e.g. `client-ip-pool = "198.19.0.0/16"`). Flags and TCPSHADOW_* environment variables
    /// override it. See deploy/*.toml for documented examples.
    #[arg(long, value_name = "FILE", env = CONFIG_ENV)]
    pub config: Option<PathBuf>,

    /// Print the effective configuration as TOML (each value's origin in a comment, passwords
    /// redacted) and exit.
    #[arg(long)]
    pub print_config: bool,

    /// Log filter: `error`, `warn`, `info`, `debug`, `trace`, or per module
    /// (`info,copier=debug`). Re-read from the config file on SIGHUP.
    #[arg(
        long,
        value_name = "FILTER",
        env = "TCPSHADOW_LOG",
        default_value = "info"
    )]
    pub log: String,
}

/// Argument ids that are not config keys: they choose or show the config itself.
const NOT_KEYS: &[&str] = &["config", "print_config", "help", "version"];

/// Why a config file was refused. The message names the file, the key and the fix.
#[derive(Debug, thiserror::Error)]
#[error("config {path}: {what}")]
pub struct ConfigError {
    pub path: String,
    pub what: String,
}

/// One key of a loaded config file, checked against the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The clap argument id (e.g. `client_ip_pool`).
    pub id: String,
    /// The key as documented: the long flag name (e.g. `client-ip-pool`).
    pub key: String,
    /// The value(s), as the flag would take them.
    pub values: Vec<String>,
}

/// A config file, loaded and checked against a daemon's command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub settings: Vec<Setting>,
}

/// What [`parse`] returns: the parsed arguments and what is needed to print or reload them.
pub struct Parsed<T> {
    pub args: T,
    pub matches: ArgMatches,
    pub command: Command,
    pub config: Option<ConfigFile>,
}

/// The config file named by `--config FILE` / `--config=FILE` in `argv` (program name first),
/// else by `$TCPSHADOW_CONFIG`. Scanned before clap parses, since the file's values must be
/// in the command before it does.
pub fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--" {
            break;
        }
        if s == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = s.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    std::env::var_os(CONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Parses `argv` with `cmd`, after loading the config file (if any) whose keys are checked
/// against `keys_from` (the daemon's own command; a doctor takes the daemon's file). A config
/// error is returned; clap's own errors (and `--help`) exit as clap does.
pub fn parse<T: clap::FromArgMatches>(
    cmd: Command,
    keys_from: &Command,
    argv: Vec<OsString>,
) -> Result<Parsed<T>, ConfigError> {
    let config = match config_path(&argv) {
        Some(path) => Some(ConfigFile::load(&path, keys_from)?),
        None => None,
    };
    let command = match &config {
        Some(c) => c.apply(cmd),
        None => cmd,
    };
    let matches = match command.clone().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => e.exit(),
    };
    // from_arg_matches_mut takes the values out: keep the matches whole for --print-config.
    let args = match T::from_arg_matches_mut(&mut matches.clone()) {
        Ok(a) => a,
        Err(e) => e.format(&mut command.clone()).exit(),
    };
    Ok(Parsed {
        args,
        matches,
        command,
        config,
    })
}

impl ConfigFile {
    pub fn load(path: &Path, keys_from: &Command) -> Result<ConfigFile, ConfigError> {
        let err = |what: String| ConfigError {
            path: path.display().to_string(),
            what,
        };
        let meta = std::fs::metadata(path).map_err(|e| {
            err(format!(
                "cannot read it: {e} (give an existing file to --config or ${CONFIG_ENV})"
            ))
        })?;
        if !meta.is_file() {
            return Err(err("is not a regular file".into()));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(err(format!(
                "is {} bytes; a config file is at most {MAX_CONFIG_BYTES}",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(format!("cannot read it: {e} (is it UTF-8 text?)")))?;
        Self::parse(&text, path, keys_from)
    }

    /// Checks `text` (TOML) against the arguments of `keys_from`.
    pub fn parse(text: &str, path: &Path, keys_from: &Command) -> Result<ConfigFile, ConfigError> {
        let err = |what: String| ConfigError {
            path: path.display().to_string(),
            what,
        };
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| err(format!("not valid TOML: {}", one_line(&e))))?;
        let keys = config_keys(keys_from);
        let mut settings = Vec::with_capacity(table.len());
        for (raw_key, value) in &table {
            // `client_ip_pool` is accepted for `client-ip-pool`: both are natural in TOML.
            let key = raw_key.replace('_', "-");
            let Some(arg) = keys.iter().find(|a| a.get_long() == Some(key.as_str())) else {
                let hint = match closest(&key, keys.iter().filter_map(|a| a.get_long())) {
                    Some(k) => format!("; did you mean `{k}`?"),
                    None => String::new(),
                };
                return Err(err(format!(
                    "unknown key `{raw_key}`{hint} (valid keys are the long flags listed by --help)"
                )));
            };
            let values = values_of(arg, value).map_err(|w| err(format!("key `{raw_key}`: {w}")))?;
            for v in &values {
                check_value(keys_from, arg, v).map_err(|w| err(format!("key `{raw_key}`: {w}")))?;
            }
            settings.push(Setting {
                id: arg.get_id().as_str().to_owned(),
                key,
                values,
            });
        }
        Ok(ConfigFile {
            path: path.to_owned(),
            settings,
        })
    }

    /// `cmd` with each setting as its argument's default (so flags and env still win). An
    /// argument that is required becomes optional when the file gives it.
    pub fn apply(&self, mut cmd: Command) -> Command {
        for s in &self.settings {
            let values = s.values.clone();
            // --help shows defaults, and now they come from the file: keep secrets out of it.
            let secret = values.iter().any(|v| redact(&s.key, v) != *v);
            cmd = cmd.mut_arg(s.id.as_str(), move |a| {
                // The file gives a value, so "required (unless ...)" is met whatever else is.
                let a = a
                    .required(false)
                    .required_unless_present(Resettable::Reset)
                    .hide_default_value(secret);
                if values.len() == 1 {
                    a.default_value(values[0].clone())
                } else {
                    a.default_values(values)
                }
            });
        }
        cmd
    }

    pub fn get(&self, id: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.id == id)
    }
}

/// The arguments of `cmd` that are config keys: every long flag except those choosing the
/// config itself.
pub fn config_keys(cmd: &Command) -> Vec<&Arg> {
    cmd.get_arguments()
        .filter(|a| a.get_long().is_some() && !a.is_positional())
        .filter(|a| !NOT_KEYS.contains(&a.get_id().as_str()))
        .collect()
}

/// Arguments of `cmd` (config keys) whose environment variable is missing or not named
/// `TCPSHADOW_<FLAG>`, apart from those listed in `exceptions` (flag, variable) kept for
/// compatibility. For the daemons' consistency tests.
pub fn env_inconsistencies(cmd: &Command, exceptions: &[(&str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    for a in config_keys(cmd) {
        let long = a.get_long().unwrap_or_default();
        let expected = format!("TCPSHADOW_{}", long.replace('-', "_").to_ascii_uppercase());
        let expected = exceptions
            .iter()
            .find(|(f, _)| *f == long)
            .map(|(_, e)| (*e).to_owned())
            .unwrap_or(expected);
        match a.get_env().and_then(OsStr::to_str) {
            Some(e) if e == expected => {}
            Some(e) => out.push(format!("--{long}: env {e}, expected {expected}")),
            None => out.push(format!("--{long}: no env (expected {expected})")),
        }
    }
    out
}

fn is_bool(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse)
}

fn takes_many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

/// What the flag expects, for messages: its value name, e.g. `PORT=HOST:PORT`.
fn expected(arg: &Arg) -> String {
    if is_bool(arg) {
        return "true or false".into();
    }
    let name = arg
        .get_value_names()
        .and_then(|n| n.first())
        .map(|n| n.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_ascii_uppercase());
    if takes_many(arg) {
        format!("{name} or an array of them")
    } else {
        name
    }
}

/// The flag values a TOML value stands for.
fn values_of(arg: &Arg, value: &toml::Value) -> Result<Vec<String>, String> {
    let kind = |v: &toml::Value| v.type_str();
    if is_bool(arg) {
        return match value {
            toml::Value::Boolean(b) => Ok(vec![b.to_string()]),
            v => Err(format!("expected true or false, got a {}", kind(v))),
        };
    }
    let scalar = |v: &toml::Value| -> Result<String, String> {
        match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            other => Err(format!("expected {}, got a {}", expected(arg), kind(other))),
        }
    };
    match value {
        toml::Value::Array(items) if takes_many(arg) => items.iter().map(scalar).collect(),
        toml::Value::Array(_) => Err(format!("takes one value ({}), not an array", expected(arg))),
        toml::Value::Table(_) => Err(format!(
            "expected {}, got a table (keys are flat: write `key = value` lines, no [sections])",
            expected(arg)
        )),
        v => scalar(v).map(|s| vec![s]),
    }
}

/// Runs the flag's own parser on `value`, so a bad value is refused naming the key rather than
/// the flag, and before the daemon starts.
fn check_value(cmd: &Command, arg: &Arg, value: &str) -> Result<(), String> {
    if is_bool(arg) {
        return Ok(());
    }
    let Some(long) = arg.get_long() else {
        return Ok(());
    };
    // The probe command holds this one argument: relations naming other arguments (e.g. a
    // `required_unless_present`) would point at nothing there, which clap rejects.
    let probe = arg
        .clone()
        .required(false)
        .required_unless_present(Resettable::Reset)
        .conflicts_with(Resettable::Reset)
        .requires(Resettable::Reset)
        .overrides_with(Resettable::Reset)
        .env(Resettable::Reset)
        .default_value(Resettable::Reset);
    let result = Command::new(cmd.get_name().to_owned())
        .no_binary_name(true)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(probe)
        .try_get_matches_from([format!("--{long}"), value.to_owned()]);
    match result {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "invalid value {value:?} (expected {}): {}",
            expected(arg),
            clap_reason(&e)
        )),
    }
}

/// The reason part of a clap error, on one line (clap's own text names the flag, which a
/// config file user did not write).
fn clap_reason(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // "invalid value 'x' for '--port <PORT>': REASON" -> REASON
    match first.split_once("': ") {
        Some((_, reason)) if first.starts_with("invalid value") => reason.to_owned(),
        _ => first.to_owned(),
    }
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The valid key nearest to `key` by edit distance, if near enough to be a typo.
pub fn closest<'a>(key: &str, keys: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    keys.map(|k| (edit_distance(key, k), k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 3) || k.contains(key) || key.contains(k))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(cur)
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// Whether a key's value is a secret by its name.
fn secret_key(key: &str) -> bool {
    ["password", "secret", "passwd"]
        .iter()
        .any(|w| key.contains(w))
}

/// `value` with any password hidden: a whole secret value, or the password of a
/// `scheme://user:password@host` URL.
pub fn redact(key: &str, value: &str) -> String {
    if secret_key(key) {
        return "<redacted>".into();
    }
    if let Some((scheme, rest)) = value.split_once("://") {
        if let Some((userinfo, host)) = rest.rsplit_once('@') {
            if let Some((user, _password)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:<redacted>@{host}");
            }
        }
    }
    value.to_owned()
}

/// The effective configuration as TOML: every key with its value, or commented out when it has
/// none, and where the value came from. Loadable again with --config (secrets excepted).
pub fn effective_toml(cmd: &Command, matches: &ArgMatches, config: Option<&ConfigFile>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# effective configuration of {} {}",
        cmd.get_name(),
        cmd.get_version().unwrap_or("")
    );
    if let Some(c) = config {
        let _ = writeln!(out, "# config file: {}", c.path.display());
    }
    let mut keys = config_keys(cmd);
    keys.sort_by_key(|a| a.get_long());
    for arg in keys {
        let id = arg.get_id().as_str();
        let key = arg.get_long().unwrap_or(id);
        let origin = match matches.value_source(id) {
            Some(ValueSource::CommandLine) => "flag".to_owned(),
            Some(ValueSource::EnvVariable) => format!(
                "env {}",
                arg.get_env()
                    .map(|e| e.to_string_lossy())
                    .unwrap_or_default()
            ),
            Some(ValueSource::DefaultValue) if config.and_then(|c| c.get(id)).is_some() => {
                "config file".to_owned()
            }
            Some(_) => "default".to_owned(),
            None => {
                let _ = writeln!(out, "# {key} =   (not set)");
                continue;
            }
        };
        let value = if is_bool(arg) {
            matches.get_flag(id).to_string()
        } else {
            let raw: Vec<String> = matches
                .get_raw(id)
                .map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            let items: Vec<String> = raw.iter().map(|v| toml_scalar(&redact(key, v))).collect();
            if takes_many(arg) {
                format!("[{}]", items.join(", "))
            } else {
                items.into_iter().next().unwrap_or_else(|| "\"\"".into())
            }
        };
        let _ = writeln!(out, "{key} = {value}  # {origin}");
    }
    out
}

/// A value as TOML: numbers bare (the flag takes them as text either way), the rest quoted.
fn toml_scalar(v: &str) -> String {
    // TOML forbids leading zeros and '+'-less oddities such as "0755": keep those quoted.
    let leading_zero = v.len() > 1 && v.starts_with('0') && !v.starts_with("0.");
    let number = v.parse::<i64>().is_ok() || (v.contains('.') && v.parse::<f64>().is_ok());
    let numeric = number && !leading_zero && !v.starts_with('+');
    if numeric {
        v.to_owned()
    } else {
        toml::Value::String(v.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};
    use std::net::SocketAddr;

    /// A daemon-like command line: the shapes the real ones use.
    #[derive(Parser, Debug)]
    #[command(name = "demo")]
    struct Demo {
        #[arg(long, env = "TCPSHADOW_PORT", required = true, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
        port: Vec<u16>,
        #[arg(long, env = "TCPSHADOW_INTERCEPT")]
        intercept: SocketAddr,
        #[arg(long, env = "TCPSHADOW_MSS", default_value_t = 1460)]
        mss: u16,
        #[arg(long, env = "TCPSHADOW_CLIENT_IP_POOL")]
        client_ip_pool: Option<String>,
        #[arg(long, env = "TCPSHADOW_READ_ONLY")]
        read_only: bool,
        #[arg(long, env = "TCPSHADOW_PROD_DSN")]
        prod_dsn: Option<String>,
        #[arg(long, env = "TCPSHADOW_PROTOCOL", value_enum, default_value_t = Proto::Mysql)]
        protocol: Proto,
        #[command(flatten)]
        config: ConfigArgs,
    }

    #[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
    enum Proto {
        Mysql,
        Tcp,
    }

    fn load(text: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(text, Path::new("/etc/demo.toml"), &Demo::command())
    }

    fn run(text: &str, argv: &[&str]) -> (Demo, ArgMatches, ConfigFile) {
        let cfg = load(text).unwrap();
        let cmd = cfg.apply(Demo::command());
        let mut m = cmd
            .try_get_matches_from(std::iter::once("demo").chain(argv.iter().copied()))
            .unwrap();
        let d = Demo::from_arg_matches_mut(&mut m.clone()).unwrap();
        let _ = &mut m;
        (d, m, cfg)
    }

    #[test]
    fn file_values_fill_in_and_flags_win() {
        let text = r#"
            port = [3306, 3307]
            intercept = "198.18.0.4:36524"
            client_ip_pool = "198.19.0.0/16"   # underscores are accepted too
            read-only = true
            protocol = "tcp"
            mss = 1400
        "#;
        let (d, m, _) = run(text, &["--mss", "1300"]);
        assert_eq!(d.port, vec![3306, 3307]);
        assert_eq!(d.intercept, "198.18.0.4:36524".parse().unwrap());
        assert_eq!(d.client_ip_pool.as_deref(), Some("198.19.0.0/16"));
        assert!(d.read_only);
        assert_eq!(d.protocol, Proto::Tcp);
        assert_eq!(d.mss, 1300);
        assert_eq!(m.value_source("mss"), Some(ValueSource::CommandLine));
        // A comma-separated string works where the flag takes one.
        let (d, _, _) = run("port = \"3306,3307\"\nintercept = \"1.2.3.4:5\"", &[]);
        assert_eq!(d.port, vec![3306, 3307]);
        // A required flag given by the file needs no flag.
        let (d, _, _) = run("port = 5000\nintercept = \"1.2.3.4:5\"", &[]);
        assert_eq!(d.port, vec![5000]);
        assert_eq!(d.mss, 1460);
    }

    #[test]
    fn unknown_keys_name_the_key_and_the_nearest_one() {
        let e = load("client-ip-pol = \"198.19.0.0/16\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/demo.toml"), "{e}");
        assert!(e.contains("unknown key `client-ip-pol`"), "{e}");
        assert!(e.contains("did you mean `client-ip-pool`"), "{e}");
        let e = load("zzzzzzzzzzzzzzzzzz = 1").unwrap_err().to_string();
        assert!(
            e.contains("unknown key") && !e.contains("did you mean"),
            "{e}"
        );
        // The config file cannot name another one.
        assert!(load("config = \"/x\"").is_err());
    }

    #[test]
    fn wrong_types_and_values_name_the_key_and_what_is_expected() {
        let e = load("read-only = \"yes\"").unwrap_err().to_string();
        assert!(
            e.contains("key `read-only`") && e.contains("true or false"),
            "{e}"
        );
        let e = load("mss = [1, 2]").unwrap_err().to_string();
        assert!(e.contains("key `mss`") && e.contains("not an array"), "{e}");
        let e = load("mss = \"big\"").unwrap_err().to_string();
        assert!(
            e.contains("key `mss`") && e.contains("invalid value \"big\""),
            "{e}"
        );
        let e = load("port = 0").unwrap_err().to_string();
        assert!(e.contains("key `port`"), "{e}");
        let e = load("protocol = \"udp\"").unwrap_err().to_string();
        assert!(e.contains("key `protocol`") && e.contains("udp"), "{e}");
        let e = load("[mysql]\nuser = 1").unwrap_err().to_string();
        assert!(e.contains("unknown key `mysql`"), "{e}");
        let e = load("mss = true").unwrap_err().to_string();
        assert!(e.contains("got a boolean"), "{e}");
        let e = load("mss = 1400\nmss = 1300").unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
        let e = load("intercept = 1979-05-27").unwrap_err().to_string();
        assert!(
            e.contains("key `intercept`") && e.contains("datetime"),
            "{e}"
        );
    }

    #[test]
    fn env_beats_the_file() {
        // Through a private variable name: tests run in parallel threads sharing the
        // environment. clap reads the variable when the argument is built, so set it first.
        std::env::set_var("TCPSHADOW_TEST_CONFIG_ENV_BEATS_FILE", "1300");
        let cmd = Command::new("x").arg(
            Arg::new("mss")
                .long("mss")
                .env("TCPSHADOW_TEST_CONFIG_ENV_BEATS_FILE"),
        );
        let cfg = ConfigFile::parse("mss = 1400", Path::new("f"), &cmd).unwrap();
        let m = cfg.apply(cmd).try_get_matches_from(["x"]).unwrap();
        assert_eq!(m.get_one::<String>("mss").map(String::as_str), Some("1300"));
        assert_eq!(m.value_source("mss"), Some(ValueSource::EnvVariable));
    }

    #[test]
    fn print_config_is_toml_with_origins_and_no_passwords() {
        let text = "port = 3306\nintercept = \"198.18.0.4:36524\"\nprod-dsn = \"mysql://ro:hunter2@198.18.0.2:3306\"";
        let (_, m, cfg) = run(text, &["--read-only"]);
        let out = effective_toml(&cfg.apply(Demo::command()), &m, Some(&cfg));
        assert!(!out.contains("hunter2"), "{out}");
        assert!(
            out.contains("prod-dsn = \"mysql://ro:<redacted>@198.18.0.2:3306\"  # config file"),
            "{out}"
        );
        assert!(out.contains("port = [3306]  # config file"), "{out}");
        assert!(out.contains("read-only = true  # flag"), "{out}");
        assert!(out.contains("mss = 1460  # default"), "{out}");
        assert!(out.contains("# client-ip-pool =   (not set)"), "{out}");
        assert!(!out.contains("print-config"), "{out}");
        // What it prints loads again (the redacted password aside).
        let again = load(&out).unwrap();
        assert_eq!(again.get("mss").unwrap().values, vec!["1460"]);
        assert_eq!(again.get("port").unwrap().values, vec!["3306"]);
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("mysql-password", "x"), "<redacted>");
        assert_eq!(
            redact("prod-dsn", "mysql://u:p@ss@h:1"),
            "mysql://u:<redacted>@h:1"
        );
        assert_eq!(redact("target", "198.18.0.3:3306"), "198.18.0.3:3306");
        assert_eq!(toml_scalar("3306"), "3306");
        assert_eq!(toml_scalar("12.5"), "12.5");
        assert_eq!(toml_scalar("0755"), "\"0755\"");
        assert_eq!(toml_scalar("any"), "\"any\"");
    }

    #[test]
    fn config_path_from_argv_or_env() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            config_path(&v(&["x", "--port", "1", "--config", "/a.toml"])),
            Some(PathBuf::from("/a.toml"))
        );
        assert_eq!(
            config_path(&v(&["x", "--config=/b.toml"])),
            Some(PathBuf::from("/b.toml"))
        );
        assert_eq!(
            config_path(&v(&["x", "--", "--config", "/c"])).filter(|p| p == Path::new("/c")),
            None
        );
    }

    #[test]
    fn env_names_are_checked() {
        assert!(env_inconsistencies(&Demo::command(), &[]).is_empty());
        let cmd = Command::new("x").arg(Arg::new("a").long("batch-size")).arg(
            Arg::new("b")
                .long("listen")
                .env("TCPSHADOW_INTERCEPT_LISTEN"),
        );
        let bad = env_inconsistencies(&cmd, &[]);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("TCPSHADOW_BATCH_SIZE"), "{bad:?}");
        assert!(env_inconsistencies(&cmd, &[("listen", "TCPSHADOW_INTERCEPT_LISTEN")]).len() == 1);
    }

    #[test]
    fn parse_reads_the_file_named_on_the_command_line() {
        let dir = std::env::temp_dir().join(format!("ops-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "port = 3307\nintercept = \"198.18.0.4:1\"\n").unwrap();
        let argv = ["demo", "--config", file.to_str().unwrap(), "--port", "3308"]
            .iter()
            .map(OsString::from)
            .collect();
        let p: Parsed<Demo> = parse(Demo::command(), &Demo::command(), argv).unwrap();
        assert_eq!(p.args.port, vec![3308]);
        let shown = effective_toml(&p.command, &p.matches, p.config.as_ref());
        assert!(shown.contains("port = [3308]  # flag"), "{shown}");
        assert!(
            shown.contains("intercept = \"198.18.0.4:1\"  # config file"),
            "{shown}"
        );
        assert_eq!(p.config.unwrap().settings.len(), 2);
        let missing = ["demo", "--config", "/nonexistent/x.toml"]
            .iter()
            .map(OsString::from)
            .collect();
        let e = parse::<Demo>(Demo::command(), &Demo::command(), missing)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("/nonexistent/x.toml") && e.contains("cannot read"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
