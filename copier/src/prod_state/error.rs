//! What can go wrong talking to production, and the fix each error's message names (a
//! missing grant, a wrong password, performance_schema off).
//!
//! Must never carry the password or production's row data into a message.

use std::fmt;
use std::io;

use common::mysql::handshake::ErrPacket;

/// What went wrong talking to production; [`ProdError::fix`] tells the operator what to do.
#[derive(Debug, thiserror::Error)]
pub enum ProdError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("connection to production failed: {0}")]
    Io(#[from] io::Error),
    #[error("production answered error {code}: {message}")]
    Server { code: u16, message: String },
    #[error("production sent something unexpected: {0}")]
    Protocol(String),
    #[error("cannot log in: {0}")]
    Auth(String),
}

/// MariaDB/MySQL error codes we give advice for.
pub(super) mod code {
    pub const ACCESS_DENIED: u16 = 1045;
    pub const SPECIFIC_ACCESS_DENIED: u16 = 1227;
    pub const TABLE_ACCESS_DENIED: u16 = 1142;
    pub const COLUMN_ACCESS_DENIED: u16 = 1143;
    pub const DB_ACCESS_DENIED: u16 = 1044;
    pub const HOST_NOT_PRIVILEGED: u16 = 1130;
}

impl ProdError {
    /// The operator's fix, when we know it.
    pub fn fix(&self, user: &str) -> Option<String> {
        match self {
            Self::Connect { .. } | Self::Io(_) => Some(
                "check that --prod-dsn names the production server's address and port, reachable \
                 from this host"
                    .into(),
            ),
            Self::Server { code, .. } => match *code {
                code::ACCESS_DENIED => Some(format!(
                    "check the user and password in --prod-dsn (account '{user}' on production)"
                )),
                code::HOST_NOT_PRIVILEGED => Some(format!(
                    "create the account for this host: CREATE USER '{user}'@'<copier host>' ...; \
                     GRANT PROCESS, SELECT ON *.* TO it"
                )),
                code::SPECIFIC_ACCESS_DENIED
                | code::TABLE_ACCESS_DENIED
                | code::COLUMN_ACCESS_DENIED
                | code::DB_ACCESS_DENIED => Some(grant_fix(user)),
                _ => None,
            },
            Self::Auth(_) => Some(format!(
                "give '{user}' a mysql_native_password (or caching_sha2_password) password"
            )),
            Self::Protocol(_) => None,
        }
    }

    /// A short, stable name of the kind of failure (to log each kind once).
    pub(super) fn kind(&self) -> String {
        match self {
            Self::Connect { .. } => "connect".into(),
            Self::Io(e) => format!("io {:?}", e.kind()),
            Self::Server { code, .. } => format!("server {code}"),
            Self::Protocol(_) => "protocol".into(),
            Self::Auth(_) => "auth".into(),
        }
    }
}

pub(super) fn grant_fix(user: &str) -> String {
    format!("on production: GRANT PROCESS, SELECT ON *.* TO '{user}'@'<copier host>'")
}

pub(super) fn protocol(what: impl fmt::Display) -> ProdError {
    ProdError::Protocol(what.to_string())
}

pub(super) fn server_error(payload: &[u8]) -> ProdError {
    match ErrPacket::parse(payload) {
        Ok(e) => ProdError::Server {
            code: e.code,
            message: String::from_utf8_lossy(&e.message[..e.message.len().min(512)]).into_owned(),
        },
        Err(e) => protocol(e),
    }
}
