//! `--prod-dsn`'s value: the production account's URL (`mysql://user:password@host:port`),
//! parsed and percent-decoded, and its clap argument.
//!
//! Must never show the password: `Debug` and `Display` redact it.

use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, ToSocketAddrs};

use common::mysql::auth::Password;

use super::error::ProdError;

/// `mysql://user:password@host[:port]` of a read-only account on production.
#[derive(Clone, PartialEq, Eq)]
pub struct ProdDsn {
    pub user: String,
    pub(super) password: Password,
    pub host: String,
    pub port: u16,
}

impl fmt::Debug for ProdDsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mysql://{}:***@{}:{}", self.user, self.host, self.port)
    }
}

impl fmt::Display for ProdDsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why a DSN was refused. Never quotes the password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DsnError {
    #[error("must start with mysql:// (e.g. mysql://tsd_ro:secret@10.0.0.5:3306)")]
    Scheme,
    #[error("needs user:password@ before the host (e.g. mysql://tsd_ro:secret@10.0.0.5:3306)")]
    NoUser,
    #[error("the user name is empty")]
    EmptyUser,
    #[error("bad percent-encoding in the {0} (write a literal % as %25)")]
    BadPercent(&'static str),
    #[error("the user name is not UTF-8")]
    UserNotUtf8,
    #[error("the host is empty")]
    EmptyHost,
    /// The text after the last ':' is not echoed: in `mysql://u@host:s3cret` (a forgotten
    /// user/password ':' turned around) it would be the password.
    #[error("the port (after the last ':') is not a number between 1 and 65535")]
    BadPort,
    #[error("IPv6 hosts are not supported (the mirror is IPv4 only)")]
    Ipv6,
    #[error("no path, query or options are accepted after host:port")]
    Trailing,
}

impl ProdDsn {
    pub const DEFAULT_PORT: u16 = 3306;

    pub fn parse(s: &str) -> Result<Self, DsnError> {
        let rest = s.strip_prefix("mysql://").ok_or(DsnError::Scheme)?;
        // The last '@' ends the user info: a password may hold an unencoded '@'.
        let (userinfo, hostport) = rest.rsplit_once('@').ok_or(DsnError::NoUser)?;
        let hostport = hostport.strip_suffix('/').unwrap_or(hostport);
        if hostport.contains(['/', '?', '#']) {
            return Err(DsnError::Trailing);
        }
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        let user = String::from_utf8(percent_decode(user, "user name")?)
            .map_err(|_| DsnError::UserNotUtf8)?;
        if user.is_empty() {
            return Err(DsnError::EmptyUser);
        }
        let password = Password::new(percent_decode(password, "password")?);
        if hostport.starts_with('[') {
            return Err(DsnError::Ipv6);
        }
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or(DsnError::BadPort)?,
            ),
            None => (hostport, Self::DEFAULT_PORT),
        };
        if host.is_empty() {
            return Err(DsnError::EmptyHost);
        }
        if host.contains(':') {
            return Err(DsnError::Ipv6);
        }
        Ok(Self {
            user,
            password,
            host: host.to_string(),
            port,
        })
    }

    /// The server's IPv4 address (a host name is resolved).
    pub fn resolve(&self) -> Result<SocketAddrV4, ProdError> {
        let fail = |e: io::Error| ProdError::Connect {
            addr: format!("{}:{}", self.host, self.port),
            source: e,
        };
        let addrs = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(fail)?;
        addrs
            .filter_map(|a| match a {
                SocketAddr::V4(a) => Some(a),
                SocketAddr::V6(_) => None,
            })
            .next()
            .ok_or_else(|| fail(io::Error::other("no IPv4 address")))
    }
}

/// `--prod-dsn` as given. Checked in `Args::validate`, not by clap: clap repeats an invalid
/// value in its error message, and this one holds a password.
#[derive(Clone)]
pub struct DsnArg(Result<ProdDsn, DsnError>);

impl DsnArg {
    /// `clap` value parser: never fails (see the type's documentation).
    pub fn parse_arg(s: &str) -> Result<Self, std::convert::Infallible> {
        Ok(Self(ProdDsn::parse(s)))
    }

    pub fn get(&self) -> Result<&ProdDsn, &DsnError> {
        self.0.as_ref()
    }
}

impl fmt::Debug for DsnArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Ok(d) => fmt::Debug::fmt(d, f),
            Err(e) => write!(f, "invalid ({e})"),
        }
    }
}

pub(super) fn percent_decode(s: &str, what: &'static str) -> Result<Vec<u8>, DsnError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or(DsnError::BadPercent(what))?;
            let hex = std::str::from_utf8(hex).map_err(|_| DsnError::BadPercent(what))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| DsnError::BadPercent(what))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}
