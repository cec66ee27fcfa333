//! `--prod-dsn`: recovers, from production itself, the state of MySQL connections the copier
//! picked up mid-stream (opened before it started, typically by a connection pool).
//!
//! # What this room is for
//!
//! An I/O edge, like the capture and the control channel. A picked-up connection's login
//! happened long ago, so the copier does not know its user, its current schema, or the
//! statements it prepared; without them the test server would reject every execute. Production
//! knows all three, and a read-only account can read them (MariaDB 10.11 and MySQL):
//!
//! * `information_schema.PROCESSLIST`: ID, USER, DB, and HOST as `ip:port`, matched against the
//!   captured client address;
//! * `performance_schema.prepared_statements_instances` (OWNER_THREAD_ID, STATEMENT_ID — the
//!   protocol statement id — and SQL_TEXT), joined with `performance_schema.threads`
//!   (THREAD_ID -> PROCESSLIST_ID). Needs `performance_schema=ON`.
//!
//! * `performance_schema.user_variables_by_thread` (MySQL and MariaDB): the connection's user
//!   variables (`@name`);
//! * `performance_schema.variables_by_thread` where the server has it (MySQL 5.7 and later; not
//!   MariaDB 10.11): the session system variables of [`SESSION_VARIABLES`] whose value differs
//!   from production's global one, i.e. those the connection changed (`time_zone`, `sql_mode`,
//!   ...).
//!
//! Variables reach the test session as `SET` statements that [`set_statement`] builds: names
//! from a fixed list or of a plain shape, values as numbers or hex literals, never as text.
//!
//! # How
//!
//! A minimal blocking MySQL client ([`MysqlClient`], text protocol only) runs on one worker
//! thread ([`StateLookup`]). The engine thread never blocks on it: requests go through a bounded
//! channel (full: counted, the session logs in with the defaults), the worker batches what
//! arrives within [`BATCH_WINDOW`] into at most four queries, and answers come back through a
//! channel plus the engine loop's waker.
//!
//! Before its first request the worker reads every connection once ([`Snapshot`]): the capture
//! is already open then, so a connection idle at that moment has its exact state ready when its
//! next command comes, instead of one read a few milliseconds after that command (what it ran
//! in between is on no known side of the read, and partly lost). The first kernel drop ends the
//! snapshot (a lost packet may have changed a connection not yet seen); so does
//! [`SNAPSHOT_TTL`].
//!
//! # What it must never do
//!
//! * Log or `Debug` the password ([`ProdDsn`] redacts it).
//! * Put anything but numbers and addresses it formatted itself into SQL: client addresses come
//!   from captured packets, so they are formatted from `SocketAddrV4`, never passed through as text.
//!   The same holds for the `SET` statements sent to the test server: production's variable
//!   values go in as hex literals or canonical numbers only.
//! * Panic or allocate without bound on production's bytes: a hostile or broken server is input
//!   too; every packet and result set has a size limit.
//! * Be mirrored: its connection is on the production port; [`OwnAddress`] lets the capture
//!   skip it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::mysql::auth::{AuthPlugin, Nonce, Password};
use common::mysql::handshake::{
    AuthMoreData, AuthSwitchRequest, Capabilities, EofPacket, ErrPacket, FastAuthResult, Greeting,
    HandshakeResponse,
};
use common::mysql::packet::{write_packet, PacketHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use common::mysql::{read_lenenc_bytes, read_lenenc_int};

use crate::mysql::RecoveredState;

/// How long requests are gathered before one lookup runs: pools reconnect in bursts, and one
/// query for many connections costs production less than many queries. Short: what a
/// connection runs between its pickup and the read of its variables is lost (their state
/// before the read is unknown), and a busy pool connection runs a command every millisecond
/// or so; a pool picked up at the copier's start shows up within a few.
pub const BATCH_WINDOW: Duration = Duration::from_millis(2);
/// Most connections looked up in one query (bounds the query's length).
pub const MAX_BATCH: usize = 256;
/// Most connections the start snapshot reads ([`Snapshot`]).
pub const SNAPSHOT_MAX: usize = 4096;
/// How long the start snapshot answers. Its entries stay exact for as long as the capture loses
/// nothing; the bound is for memory: a connection idle longer is looked up when it is seen.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(120);
/// Requests waiting for the worker; beyond, a request is dropped (counted).
pub const QUEUE_CAP: usize = 4096;
/// Connect, read and write timeout toward production.
pub const IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest logical packet accepted from production.
const MAX_PACKET: usize = 4 * MAX_PAYLOAD_LEN;
/// Largest result set accepted (all payload bytes).
const MAX_RESULT_BYTES: usize = 64 << 20;
const MAX_ROWS: usize = 1_000_000;
const MAX_COLUMNS: u64 = 4096;
/// Auth round trips before we call the exchange broken.
const MAX_AUTH_STEPS: usize = 4;

// ------------------------------------------------------------------------------------ DSN

/// `mysql://user:password@host[:port]` of a read-only account on production.
#[derive(Clone, PartialEq, Eq)]
pub struct ProdDsn {
    pub user: String,
    password: Password,
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

fn percent_decode(s: &str, what: &'static str) -> Result<Vec<u8>, DsnError> {
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

// ------------------------------------------------------------------------------------ errors

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
mod code {
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
    fn kind(&self) -> String {
        match self {
            Self::Connect { .. } => "connect".into(),
            Self::Io(e) => format!("io {:?}", e.kind()),
            Self::Server { code, .. } => format!("server {code}"),
            Self::Protocol(_) => "protocol".into(),
            Self::Auth(_) => "auth".into(),
        }
    }
}

fn grant_fix(user: &str) -> String {
    format!("on production: GRANT PROCESS, SELECT ON *.* TO '{user}'@'<copier host>'")
}

fn protocol(what: impl fmt::Display) -> ProdError {
    ProdError::Protocol(what.to_string())
}

fn server_error(payload: &[u8]) -> ProdError {
    match ErrPacket::parse(payload) {
        Ok(e) => ProdError::Server {
            code: e.code,
            message: String::from_utf8_lossy(&e.message[..e.message.len().min(512)]).into_owned(),
        },
        Err(e) => protocol(e),
    }
}

// ------------------------------------------------------------------------------------ client

/// A text-protocol row: one value per column, `None` for SQL NULL.
pub type Row = Vec<Option<Vec<u8>>>;

/// A minimal blocking MySQL client: login (mysql_native_password, caching_sha2_password fast
/// auth, AuthSwitchRequest) and COM_QUERY with text result sets. Generic over the stream so
/// scripted bytes can stand in for a server in tests.
pub struct MysqlClient<S> {
    stream: S,
    /// Bytes of the current result set, against [`MAX_RESULT_BYTES`].
    budget: usize,
}

impl<S: Read + Write> MysqlClient<S> {
    /// Reads the greeting and logs in.
    pub fn login(stream: S, user: &str, password: &Password) -> Result<Self, ProdError> {
        let mut c = Self {
            stream,
            budget: MAX_RESULT_BYTES,
        };
        let (seq, greeting) = c.read_packet()?;
        if greeting.first() == Some(&ErrPacket::HEADER) {
            // e.g. "Too many connections", "Host ... is blocked".
            return Err(server_error(&greeting));
        }
        let g = Greeting::parse(&greeting).map_err(protocol)?;
        let required = Capabilities::PROTOCOL_41 | Capabilities::SECURE_CONNECTION;
        if !g.capabilities.contains(required) {
            return Err(protocol("server without PROTOCOL_41/SECURE_CONNECTION"));
        }
        let nonce = Nonce::from_auth_data(&g.nonce()).map_err(protocol)?;
        // An unknown default plugin (e.g. ed25519) gets a native answer; the server then asks
        // for the account's plugin with an AuthSwitchRequest.
        let plugin = g
            .auth_plugin
            .and_then(|n| AuthPlugin::from_name(n).ok())
            .unwrap_or(AuthPlugin::MysqlNativePassword);
        let scramble = plugin.scramble(password.as_bytes(), &nonce);
        // CLIENT_MYSQL (long password) set: our filler carries no MariaDB capabilities. No
        // DEPRECATE_EOF: result sets end with an EOF packet, which is what we parse.
        let caps = Capabilities::MYSQL
            | Capabilities::LONG_FLAG
            | Capabilities::PROTOCOL_41
            | Capabilities::SECURE_CONNECTION
            | Capabilities::PLUGIN_AUTH
            | Capabilities::TRANSACTIONS;
        let login = HandshakeResponse {
            capabilities: caps,
            max_packet: MAX_PAYLOAD_LEN as u32,
            charset: 45, // utf8mb4_general_ci
            filler: [0; 23],
            username: user.as_bytes(),
            auth_response: scramble.as_bytes(),
            database: None,
            auth_plugin: Some(plugin.name()),
            attributes: None,
            trailing: &[],
        };
        let mut payload = Vec::with_capacity(64 + user.len());
        login.write(&mut payload).map_err(protocol)?;
        c.write_packet(seq.wrapping_add(1), &payload)?;
        for _ in 0..MAX_AUTH_STEPS {
            let (seq, reply) = c.read_packet()?;
            match reply.first() {
                Some(0x00) => return Ok(c),
                Some(&ErrPacket::HEADER) => return Err(server_error(&reply)),
                Some(&AuthSwitchRequest::HEADER) => {
                    let sw = AuthSwitchRequest::parse(&reply).map_err(protocol)?;
                    let plugin = AuthPlugin::from_name(sw.plugin).map_err(|_| {
                        ProdError::Auth(format!(
                            "the account uses auth plugin {:?}, which this client does not speak",
                            String::from_utf8_lossy(&sw.plugin[..sw.plugin.len().min(64)])
                        ))
                    })?;
                    let nonce = Nonce::from_auth_data(sw.data).map_err(protocol)?;
                    let answer = plugin.scramble(password.as_bytes(), &nonce);
                    c.write_packet(seq.wrapping_add(1), answer.as_bytes())?;
                }
                Some(&AuthMoreData::HEADER) => {
                    let more = AuthMoreData::parse(&reply).map_err(protocol)?;
                    match more.fast_auth_result() {
                        Some(FastAuthResult::Success) => {} // an OK follows
                        _ => {
                            return Err(ProdError::Auth(
                                "caching_sha2_password asks for full authentication (TLS or RSA), \
                                 which this client does not do; log in once with the mysql client \
                                 so the server caches the password, or use mysql_native_password"
                                    .into(),
                            ))
                        }
                    }
                }
                _ => return Err(protocol("unexpected packet during login")),
            }
        }
        Err(protocol("login did not finish"))
    }

    /// Runs one statement; returns its rows (none for a statement without a result set).
    pub fn query(&mut self, sql: &str) -> Result<Vec<Row>, ProdError> {
        self.budget = MAX_RESULT_BYTES;
        let mut payload = Vec::with_capacity(1 + sql.len());
        payload.push(0x03); // COM_QUERY
        payload.extend_from_slice(sql.as_bytes());
        self.write_packet(0, &payload)?;
        let (_, first) = self.read_packet()?;
        let columns = match first.first() {
            None => return Err(protocol("empty reply")),
            Some(0x00) => return Ok(Vec::new()),
            Some(&ErrPacket::HEADER) => return Err(server_error(&first)),
            Some(0xfb) => return Err(protocol("LOCAL INFILE request")),
            Some(_) => read_lenenc_int(&first).map_err(protocol)?.0,
        };
        if columns == 0 || columns > MAX_COLUMNS {
            return Err(protocol(format!("{columns} columns")));
        }
        let columns = columns as usize;
        for _ in 0..columns {
            let (_, def) = self.read_packet()?;
            if def.first() == Some(&ErrPacket::HEADER) {
                return Err(server_error(&def));
            }
        }
        let (_, eof) = self.read_packet()?;
        if !EofPacket::is_eof(&eof) {
            return Err(protocol("no EOF after the column definitions"));
        }
        let mut rows = Vec::new();
        loop {
            let (_, p) = self.read_packet()?;
            if EofPacket::is_eof(&p) {
                return Ok(rows);
            }
            if p.first() == Some(&ErrPacket::HEADER) {
                return Err(server_error(&p));
            }
            if rows.len() >= MAX_ROWS {
                return Err(protocol("more than a million rows"));
            }
            rows.push(parse_row(&p, columns)?);
        }
    }

    /// One logical packet (physical packets of 0xFFFFFF bytes continue it).
    fn read_packet(&mut self) -> Result<(u8, Vec<u8>), ProdError> {
        let mut payload = Vec::new();
        loop {
            let mut head = [0u8; HEADER_LEN];
            self.stream.read_exact(&mut head)?;
            let h = PacketHeader::parse(&head).ok_or_else(|| protocol("short header"))?;
            let len = h.len as usize;
            if payload.len() + len > MAX_PACKET || len > self.budget {
                return Err(protocol("packet or result set too large"));
            }
            self.budget -= len;
            let at = payload.len();
            payload.resize(at + len, 0);
            self.stream.read_exact(&mut payload[at..])?;
            if !h.is_continued() {
                return Ok((h.seq, payload));
            }
        }
    }

    fn write_packet(&mut self, seq: u8, payload: &[u8]) -> Result<(), ProdError> {
        let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
        write_packet(seq, payload, &mut bytes);
        self.stream.write_all(&bytes)?;
        self.stream.flush()?;
        Ok(())
    }
}

/// A text-protocol row: `columns` lenenc strings, 0xFB for NULL, nothing after.
fn parse_row(p: &[u8], columns: usize) -> Result<Row, ProdError> {
    let mut row = Vec::with_capacity(columns);
    let mut at = 0;
    for _ in 0..columns {
        let rest = p.get(at..).unwrap_or_default();
        if rest.first() == Some(&0xfb) {
            row.push(None);
            at += 1;
        } else {
            let (v, n) = read_lenenc_bytes(rest).map_err(protocol)?;
            row.push(Some(v.to_vec()));
            at += n;
        }
    }
    if at != p.len() {
        return Err(protocol("row longer than its columns"));
    }
    Ok(row)
}

// ------------------------------------------------------------------------------------ own address

/// How many of our most recent connections' local addresses [`OwnAddress`] remembers: after a
/// reconnect the old connection's last FIN/ACKs (and a TIME_WAIT retransmit) still cross the
/// capture, and must not look like a client connection to pick up.
pub const OWN_ADDRESSES_KEPT: usize = 8;

/// The local addresses of our own connections to production (the current one and the last
/// few before it), for the capture to skip: with `--interface any` (or a production address
/// reached over the network) they are on the production port like any client's, and must never
/// be mirrored.
#[derive(Clone, Debug, Default)]
pub struct OwnAddress(Arc<OwnSlots>);

/// A ring of addresses, lock-free for the capture thread that reads it per packet; one writer
/// (the thread that connects).
#[derive(Debug, Default)]
pub struct OwnSlots {
    slots: [AtomicU64; OWN_ADDRESSES_KEPT],
    next: AtomicU64,
}

impl OwnAddress {
    const SET: u64 = 1 << 48;

    fn set(&self, a: SocketAddrV4) {
        let v = Self::SET | u64::from(u32::from(*a.ip())) << 16 | u64::from(a.port());
        let i = self.0.next.fetch_add(1, Ordering::Relaxed) as usize % OWN_ADDRESSES_KEPT;
        self.0.slots[i].store(v, Ordering::Relaxed);
    }

    /// Whether the packet from `src` to `dst` belongs to one of our (recent) connections.
    pub fn matches(&self, src: SocketAddrV4, dst: SocketAddrV4) -> bool {
        self.0.slots.iter().any(|slot| {
            let v = slot.load(Ordering::Relaxed);
            if v & Self::SET == 0 {
                return false;
            }
            let ours = SocketAddrV4::new(Ipv4Addr::from((v >> 16) as u32), v as u16);
            src == ours || dst == ours
        })
    }
}

/// Connects to production from an address chosen *before* the SYN leaves, so the capture
/// already knows to skip the connection's first packet.
fn connect(addr: SocketAddrV4, own: &OwnAddress) -> Result<TcpStream, ProdError> {
    let fail = |e: io::Error| ProdError::Connect {
        addr: addr.to_string(),
        source: e,
    };
    // The source address the kernel would pick for this destination.
    let probe = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(fail)?;
    probe.connect(addr).map_err(fail)?;
    let local = match probe.local_addr().map_err(fail)? {
        SocketAddr::V4(a) => *a.ip(),
        SocketAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    let sock = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(fail)?;
    sock.bind(&SocketAddr::new(IpAddr::V4(local), 0).into())
        .map_err(fail)?;
    if let Some(SocketAddr::V4(a)) = sock.local_addr().map_err(fail)?.as_socket() {
        own.set(a);
    }
    sock.connect_timeout(&SocketAddr::V4(addr).into(), IO_TIMEOUT)
        .map_err(fail)?;
    let stream: TcpStream = sock.into();
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
    stream.set_nodelay(true).map_err(fail)?;
    Ok(stream)
}

fn open(dsn: &ProdDsn, own: &OwnAddress) -> Result<MysqlClient<TcpStream>, ProdError> {
    let addr = dsn.resolve()?;
    MysqlClient::login(connect(addr, own)?, &dsn.user, &dsn.password)
}

/// What the start-up check found that does not stop the copier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// `performance_schema` is off: users and schemas are recovered, prepared statements and
    /// variables not.
    pub performance_schema_off: bool,
    /// `performance_schema.variables_by_thread` exists (MySQL): session variables are recovered.
    pub session_variables: bool,
    /// `performance_schema.user_variables_by_thread` exists: user variables are recovered.
    pub user_variables: bool,
}

/// Checks that the account can do its job: PROCESS (else PROCESSLIST shows only its own
/// connections, silently) and SELECT on performance_schema.
fn check(c: &mut MysqlClient<impl Read + Write>, user: &str) -> Result<Readiness, ProdError> {
    let rows = c.query(
        "SELECT @@performance_schema, (SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES \
         WHERE PRIVILEGE_TYPE = 'PROCESS')",
    )?;
    let (ps, process) = match rows.first().map(Vec::as_slice) {
        Some([ps, process]) => (text(ps), text(process)),
        _ => return Err(protocol("start-up check: unexpected result")),
    };
    if process.as_deref() == Some("0") {
        return Err(ProdError::Server {
            code: code::SPECIFIC_ACCESS_DENIED,
            message: format!(
                "'{user}' lacks the PROCESS privilege, so PROCESSLIST would show only its own \
                 connection"
            ),
        });
    }
    let performance_schema_off = ps.as_deref() != Some("1");
    let mut ready = Readiness {
        performance_schema_off,
        ..Readiness::default()
    };
    if !performance_schema_off {
        c.query("SELECT THREAD_ID FROM performance_schema.threads LIMIT 1")?;
        c.query(
            "SELECT STATEMENT_ID FROM performance_schema.prepared_statements_instances LIMIT 1",
        )?;
        let tables = c.query(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = \
             'performance_schema' AND TABLE_NAME IN ('variables_by_thread', \
             'user_variables_by_thread')",
        )?;
        for t in tables.iter().filter_map(|r| r.first().and_then(text)) {
            match t.to_ascii_lowercase().as_str() {
                "variables_by_thread" => ready.session_variables = true,
                "user_variables_by_thread" => ready.user_variables = true,
                _ => {}
            }
        }
        if ready.session_variables {
            c.query("SELECT VARIABLE_NAME FROM performance_schema.variables_by_thread LIMIT 1")?;
        }
        if ready.user_variables {
            c.query(
                "SELECT VARIABLE_NAME FROM performance_schema.user_variables_by_thread LIMIT 1",
            )?;
        }
    }
    Ok(ready)
}

fn text(v: &Option<Vec<u8>>) -> Option<String> {
    v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned())
}

// ------------------------------------------------------------------------------------ queries

/// One picked-up connection to look up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupRequest {
    /// The client as production sees it (PROCESSLIST.HOST).
    pub client: SocketAddrV4,
    /// The session's address toward the test server (the engine's key).
    pub mirrored: SocketAddrV4,
}

/// What the worker is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    Lookup(LookupRequest),
    /// A session of this client opened from its SYN: the start snapshot's entry for the address
    /// (an earlier connection on the same port) must never describe it.
    Seen(SocketAddrV4),
}

/// What production knew about one session; `None`: nothing (not found, or the lookup failed).
#[derive(Clone, Debug)]
pub struct LookupAnswer {
    pub mirrored: SocketAddrV4,
    pub state: Option<RecoveredState>,
    /// When production read the variables (those queries' round trips); the driver puts them
    /// on the engine's clock ([`RecoveredState::variables_at`], `variables_again`).
    pub variables_read: Reads,
}

/// The PROCESSLIST query for these clients. Only addresses we format ourselves go in.
pub fn processlist_query(clients: &[SocketAddrV4]) -> String {
    let mut q = String::from(
        "SELECT ID, USER, HOST, DB FROM information_schema.PROCESSLIST WHERE HOST IN (",
    );
    for (i, c) in clients.iter().enumerate() {
        if i > 0 {
            q.push_str(", ");
        }
        // Digits, dots and a colon only: nothing to escape.
        q.push_str(&format!("'{}:{}'", c.ip(), c.port()));
    }
    q.push(')');
    q
}

/// The prepared-statements query for these connection ids (numbers only).
pub fn statements_query(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!(
        "SELECT t.PROCESSLIST_ID, p.STATEMENT_ID, p.SQL_TEXT \
         FROM performance_schema.prepared_statements_instances p \
         JOIN performance_schema.threads t ON t.THREAD_ID = p.OWNER_THREAD_ID \
         WHERE t.PROCESSLIST_ID IN ({})",
        list.join(", ")
    )
}

fn number(v: Option<&Option<Vec<u8>>>) -> Option<u64> {
    std::str::from_utf8(v?.as_deref()?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// PROCESSLIST rows (ID, USER, HOST, DB) matched to the batch: client -> (id, state without
/// statements). Rows that do not parse or match no client are ignored.
pub fn match_processlist(
    batch: &[LookupRequest],
    rows: &[Row],
) -> HashMap<SocketAddrV4, (u64, RecoveredState)> {
    let wanted: HashMap<String, SocketAddrV4> = batch
        .iter()
        .map(|r| (format!("{}:{}", r.client.ip(), r.client.port()), r.client))
        .collect();
    rows.iter()
        .filter_map(processlist_row)
        .filter_map(|(host, id, state)| Some((*wanted.get(&host)?, (id, state))))
        .collect()
}

/// The query of [`Snapshot::read`]: every TCP client's connection but ours (HOST `ip:port`;
/// local socket connections show `localhost`), at most [`SNAPSHOT_MAX`].
pub fn snapshot_query() -> String {
    format!(
        "SELECT ID, USER, HOST, DB FROM information_schema.PROCESSLIST \
         WHERE HOST LIKE '%:%' AND ID <> CONNECTION_ID() LIMIT {SNAPSHOT_MAX}"
    )
}

/// PROCESSLIST rows of [`snapshot_query`]: every client whose HOST is an IPv4 `ip:port` ->
/// (id, state without statements). Other rows (IPv6 clients, unparsable) are ignored.
pub fn match_all_processlist(rows: &[Row]) -> HashMap<SocketAddrV4, (u64, RecoveredState)> {
    rows.iter()
        .filter_map(processlist_row)
        .filter_map(|(host, id, state)| Some((host.parse().ok()?, (id, state))))
        .take(SNAPSHOT_MAX)
        .collect()
}

/// One PROCESSLIST row (ID, USER, HOST, DB): its HOST as production wrote it, its id, and the
/// state it gives (user and schema).
fn processlist_row(row: &Row) -> Option<(String, u64, RecoveredState)> {
    let [id, user, host, db] = row.as_slice() else {
        return None;
    };
    let state = RecoveredState {
        user: text(user)?,
        db: text(db).filter(|d| !d.is_empty()),
        statements: Vec::new(),
        variables: Vec::new(),
        variables_dropped: 0,
        variables_at: None,
        variables_again: None,
    };
    Some((text(host)?, number(Some(id))?, state))
}

/// Adds statement rows (PROCESSLIST_ID, STATEMENT_ID, SQL_TEXT) to the states they belong to.
pub fn add_statements(found: &mut HashMap<SocketAddrV4, (u64, RecoveredState)>, rows: &[Row]) {
    let by_id: HashMap<u64, SocketAddrV4> = found.iter().map(|(c, (id, _))| (*id, *c)).collect();
    for row in rows {
        let [pid, sid, sql] = row.as_slice() else {
            continue;
        };
        let (Some(pid), Some(sid), Some(sql)) = (number(Some(pid)), number(Some(sid)), sql) else {
            continue;
        };
        let (Some(client), Ok(sid)) = (by_id.get(&pid), u32::try_from(sid)) else {
            continue;
        };
        if let Some((_, state)) = found.get_mut(client) {
            state.statements.push((sid, sql.clone()));
        }
    }
}

// ------------------------------------------------------------------------------------ variables

/// Session system variables recovered where the server exposes them: those that change what a
/// statement returns or how it is parsed, locks and limits. Anything else a connection set keeps
/// the test server's value. Only these names (ours, not production's) reach the `SET`.
pub const SESSION_VARIABLES: &[&str] = &[
    "auto_increment_increment",
    "auto_increment_offset",
    "autocommit",
    "big_tables",
    "character_set_client",
    "character_set_connection",
    "character_set_results",
    "collation_connection",
    "cte_max_recursion_depth",
    "default_storage_engine",
    "default_tmp_storage_engine",
    "default_week_format",
    "div_precision_increment",
    "explicit_defaults_for_timestamp",
    "foreign_key_checks",
    "group_concat_max_len",
    "innodb_lock_wait_timeout",
    "lc_time_names",
    "lock_wait_timeout",
    "max_execution_time",
    "max_join_size",
    "max_sort_length",
    "optimizer_switch",
    "sql_auto_is_null",
    "sql_big_selects",
    "sql_mode",
    "sql_safe_updates",
    "sql_select_limit",
    "time_zone",
    "transaction_isolation",
    "transaction_read_only",
    "unique_checks",
    "updatable_views_with_limit",
];

/// Longest variable value carried (bytes); a longer one is dropped and counted.
pub const MAX_VARIABLE_VALUE: usize = 64 << 10;

/// Which kind of variable a [`set_statement`] sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variable {
    /// A session system variable (`SET SESSION name = value`); names outside
    /// [`SESSION_VARIABLES`] are refused.
    Session,
    /// A user variable (`SET @name = value`).
    User,
}

/// The `SET` statement that gives a test session the variable production reported.
/// `Ok(None)`: nothing to set (a NULL user variable reads the same as an unset one).
/// `Err(())`: the name or the value cannot be carried safely; the caller counts it.
///
/// Production's bytes never go into the SQL as text: a name must be one of ours (session) or
/// of the plain unquoted shape `[A-Za-z0-9_$.]{1,64}` (user); a value is a canonical integer, or
/// (session variables) a word of `[A-Za-z0-9_,.+:/=-]` the way `SHOW VARIABLES` prints
/// enumerations, time zones and switches, or (user variables) a hex literal.
#[allow(clippy::result_unit_err)]
pub fn set_statement(
    kind: Variable,
    name: &[u8],
    value: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, ()> {
    let value = match (kind, value) {
        (Variable::User, None) => return Ok(None),
        (Variable::Session, None) => return Err(()),
        (_, Some(v)) if v.len() > MAX_VARIABLE_VALUE => return Err(()),
        (_, Some(v)) => v,
    };
    let mut sql = match kind {
        Variable::Session => {
            let name = SESSION_VARIABLES
                .iter()
                .find(|n| n.as_bytes().eq_ignore_ascii_case(name))
                .ok_or(())?;
            format!("SET SESSION {name} = ").into_bytes()
        }
        Variable::User => {
            let plain = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.');
            if name.is_empty() || name.len() > 64 || !name.iter().all(plain) {
                return Err(());
            }
            let mut sql = b"SET @`".to_vec();
            sql.extend_from_slice(name);
            sql.extend_from_slice(b"` = ");
            sql
        }
    };
    if canonical_integer(value) {
        sql.extend_from_slice(value);
        return Ok(Some(sql));
    }
    match kind {
        Variable::Session => {
            let word = |c: &u8| c.is_ascii_alphanumeric() || b"_,.+:/=-".contains(c);
            if !value.iter().all(word) {
                return Err(());
            }
            sql.push(b'\'');
            sql.extend_from_slice(value);
            sql.push(b'\'');
        }
        Variable::User => {
            // Text stays text in the connection's usual collation; other bytes stay binary.
            let utf8 = std::str::from_utf8(value).is_ok();
            if utf8 {
                sql.extend_from_slice(b"CONVERT(");
            }
            sql.extend_from_slice(b"X'");
            for b in value {
                sql.extend_from_slice(format!("{b:02X}").as_bytes());
            }
            sql.push(b'\'');
            if utf8 {
                sql.extend_from_slice(b" USING utf8mb4)");
            }
        }
    }
    Ok(Some(sql))
}

/// `0`, or an optional minus and up to 18 digits without a leading zero: what a number prints
/// as, and safely an integer on both sides. "007" is text, and stays so.
fn canonical_integer(v: &[u8]) -> bool {
    let digits = v.strip_prefix(b"-").unwrap_or(v);
    match digits {
        [b'0'] => v.len() == 1,
        [first, rest @ ..] => {
            (b'1'..=b'9').contains(first) && rest.len() < 18 && rest.iter().all(u8::is_ascii_digit)
        }
        [] => false,
    }
}

/// The session-variables query for these connection ids (numbers only): the listed variables
/// whose session value differs from the global one.
pub fn session_variables_query(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    let names: Vec<String> = SESSION_VARIABLES.iter().map(|n| format!("'{n}'")).collect();
    format!(
        "SELECT t.PROCESSLIST_ID, v.VARIABLE_NAME, v.VARIABLE_VALUE \
         FROM performance_schema.variables_by_thread v \
         JOIN performance_schema.threads t ON t.THREAD_ID = v.THREAD_ID \
         JOIN performance_schema.global_variables g ON g.VARIABLE_NAME = v.VARIABLE_NAME \
         WHERE t.PROCESSLIST_ID IN ({}) AND v.VARIABLE_NAME IN ({}) \
         AND NOT (v.VARIABLE_VALUE <=> g.VARIABLE_VALUE)",
        list.join(", "),
        names.join(", ")
    )
}

/// The user-variables query for these connection ids (numbers only).
pub fn user_variables_query(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!(
        "SELECT t.PROCESSLIST_ID, u.VARIABLE_NAME, u.VARIABLE_VALUE \
         FROM performance_schema.user_variables_by_thread u \
         JOIN performance_schema.threads t ON t.THREAD_ID = u.THREAD_ID \
         WHERE t.PROCESSLIST_ID IN ({})",
        list.join(", ")
    )
}

/// Adds variable rows (PROCESSLIST_ID, VARIABLE_NAME, VARIABLE_VALUE) to the states they
/// belong to, as `SET` statements; what cannot be carried is counted in `variables_dropped`.
pub fn add_variables(
    found: &mut HashMap<SocketAddrV4, (u64, RecoveredState)>,
    kind: Variable,
    rows: &[Row],
) {
    let by_id: HashMap<u64, SocketAddrV4> = found.iter().map(|(c, (id, _))| (*id, *c)).collect();
    for row in rows {
        let [pid, name, value] = row.as_slice() else {
            continue;
        };
        let (Some(pid), Some(name)) = (number(Some(pid)), name) else {
            continue;
        };
        let Some((_, state)) = by_id.get(&pid).and_then(|c| found.get_mut(c)) else {
            continue;
        };
        match set_statement(kind, name, value.as_deref()) {
            Ok(Some(set)) => state.variables.push(set),
            Ok(None) => {}
            Err(()) => state.variables_dropped = state.variables_dropped.saturating_add(1),
        }
    }
}

/// What a lookup asks production besides PROCESSLIST (from the start-up [`Readiness`]).
#[derive(Clone, Copy, Debug, Default)]
struct Wanted {
    statements: bool,
    session_variables: bool,
    user_variables: bool,
}

impl From<&Readiness> for Wanted {
    fn from(r: &Readiness) -> Self {
        let ps = !r.performance_schema_off;
        Wanted {
            statements: ps,
            session_variables: ps && r.session_variables,
            user_variables: ps && r.user_variables,
        }
    }
}

/// What one lookup found, per client, and when production read the variables.
type Found = (HashMap<SocketAddrV4, (u64, RecoveredState)>, Reads);

fn lookup_batch(
    c: &mut MysqlClient<impl Read + Write>,
    batch: &[LookupRequest],
    wanted: Wanted,
    queries: &AtomicU64,
) -> Result<Found, ProdError> {
    // Each is one SELECT production runs for us, not for its clients: counted so that a
    // comparison of executed work can take them out.
    let mut c = |sql: &str| {
        queries.fetch_add(1, Ordering::Relaxed);
        c.query(sql)
    };
    let clients: Vec<SocketAddrV4> = batch
        .iter()
        .map(|r| r.client)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let rows = c(&processlist_query(&clients))?;
    read_state(&mut c, match_processlist(batch, &rows), wanted)
}

/// Rows of the state queries in a fixed order: by connection id, then by their second column
/// (a statement id as a number, a variable's name as bytes). Sorted here, not by the server:
/// an ORDER BY over a join of performance_schema tables makes production build a temporary
/// table, and MariaDB 10.11.19 crashed (NULL pointer in `ha_maria::drop_table`, freeing that
/// table) under one of these queries in the lab's faults test. The copier's queries must not
/// ask production for work it can do itself.
fn ordered(mut rows: Vec<Row>) -> Vec<Row> {
    fn key(row: &Row) -> (u64, Option<u64>, Vec<u8>) {
        let second = row.get(1);
        (
            number(row.first()).unwrap_or(u64::MAX),
            number(second),
            second.cloned().flatten().unwrap_or_default(),
        )
    }
    rows.sort_by_cached_key(key);
    rows
}

/// Reads the variables and statements of connections PROCESSLIST found (`found`, by client).
fn read_state(
    c: &mut impl FnMut(&str) -> Result<Vec<Row>, ProdError>,
    mut found: HashMap<SocketAddrV4, (u64, RecoveredState)>,
    wanted: Wanted,
) -> Result<Found, ProdError> {
    if found.is_empty() {
        return Ok((found, Reads::default()));
    }
    let ids: Vec<u64> = found.values().map(|(id, _)| *id).collect();
    // Each read's round trip: production read the variables within it (user variables change
    // with every command; session variables seldom).
    let mut reads = Reads::default();
    if wanted.session_variables {
        let t0 = Instant::now();
        let rows = ordered(c(&session_variables_query(&ids))?);
        reads.first = Some((t0, Instant::now()));
        add_variables(&mut found, Variable::Session, &rows);
    }
    if wanted.user_variables {
        let session_only: HashMap<SocketAddrV4, (Vec<Vec<u8>>, u32)> = found
            .iter()
            .map(|(a, (_, s))| (*a, (s.variables.clone(), s.variables_dropped)))
            .collect();
        let t0 = Instant::now();
        let rows = ordered(c(&user_variables_query(&ids))?);
        reads.first = Some((t0, Instant::now()));
        add_variables(&mut found, Variable::User, &rows);
        // Once more, right after: a command that writes a variable may be answered within
        // the first read's round trip, on no known side of it; the session then starts from
        // this read instead (see `RecoveredState::variables_again`).
        let mut again = found.clone();
        for (a, (_, s)) in again.iter_mut() {
            if let Some((v, d)) = session_only.get(a) {
                s.variables.clone_from(v);
                s.variables_dropped = *d;
            }
        }
        let t0 = Instant::now();
        let rows = ordered(c(&user_variables_query(&ids))?);
        reads.again = Some((t0, Instant::now()));
        add_variables(&mut again, Variable::User, &rows);
        for (a, (_, s)) in found.iter_mut() {
            s.variables_again = again.remove(a).map(|(_, g)| (g.variables, None));
        }
    }
    // After the variables: a statement is the same before and after the read, a variable not.
    if wanted.statements {
        let rows = ordered(c(&statements_query(&ids))?);
        add_statements(&mut found, &rows);
    }
    Ok((found, reads))
}

/// The round trips of a lookup's reads of the variables, on the standard clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reads {
    pub first: Option<(Instant, Instant)>,
    pub again: Option<(Instant, Instant)>,
}

// ------------------------------------------------------------------------------------ snapshot

/// Every client connection's state, read once as the copier starts, its capture already open.
///
/// A lookup made when a picked-up connection is first seen reads its state a few milliseconds
/// after the commands that made the copier ask, and what the connection ran in between is on no
/// known side of the read: some of it is dropped and counted
/// (`commands_dropped_before_state_read`). Most of a pool's connections are idle at any moment.
/// Read while idle, after the capture opened, their state is exact when their next command
/// comes: every command after the read is captured, so the first one the copier sees is the
/// first after the read. A connection busy during the read is no worse off than with a lookup:
/// its commands are placed against the read's round trip as they would be against a lookup's.
///
/// That holds while the capture loses nothing: a dropped packet may have been a command of a
/// connection not yet seen, so the driver ends the snapshot at the first kernel drop
/// ([`StateLookup::forget_snapshot`]). Each entry answers once: a later lookup of the same
/// client (a new connection on a reused port) asks production.
#[derive(Debug)]
pub struct Snapshot {
    taken: Instant,
    states: HashMap<SocketAddrV4, (RecoveredState, Reads)>,
}

impl Snapshot {
    /// Reads every connection's user, schema, variables and statements (at most
    /// [`SNAPSHOT_MAX`], [`MAX_BATCH`] to a query). Each query is counted in `queries`.
    fn read(
        c: &mut MysqlClient<impl Read + Write>,
        wanted: Wanted,
        queries: &AtomicU64,
    ) -> Result<Self, ProdError> {
        let taken = Instant::now();
        let mut q = |sql: &str| {
            queries.fetch_add(1, Ordering::Relaxed);
            c.query(sql)
        };
        let rows = q(&snapshot_query())?;
        let all: Vec<_> = match_all_processlist(&rows).into_iter().collect();
        let mut states = HashMap::with_capacity(all.len());
        for chunk in all.chunks(MAX_BATCH) {
            let (found, reads) = read_state(&mut q, chunk.iter().cloned().collect(), wanted)?;
            states.extend(
                found
                    .into_iter()
                    .map(|(client, (_, s))| (client, (s, reads))),
            );
        }
        Ok(Self { taken, states })
    }

    /// `client`'s state as read at start, once; nothing once [`SNAPSHOT_TTL`] has passed.
    fn take(&mut self, client: SocketAddrV4, now: Instant) -> Option<(RecoveredState, Reads)> {
        if now.saturating_duration_since(self.taken) > SNAPSHOT_TTL {
            self.states.clear();
        }
        self.states.remove(&client)
    }

    fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}

// ------------------------------------------------------------------------------------ worker

#[derive(Debug, Default)]
struct Counters {
    requested: AtomicU64,
    answered: AtomicU64,
    not_found: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    queries: AtomicU64,
    from_snapshot: AtomicU64,
    snapshot_connections: AtomicU64,
    snapshot_queries: AtomicU64,
}

/// Lookup counters, for the status and the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupStats {
    /// Picked-up connections asked about.
    pub requested: u64,
    /// Found on production (state recovered).
    pub answered: u64,
    /// Not in PROCESSLIST any more (or never matched).
    pub not_found: u64,
    /// The lookup failed (production unreachable, refused, broken reply).
    pub failed: u64,
    /// Not asked: the request queue was full.
    pub dropped: u64,
    /// Statements the lookups ran on production (all SELECTs; neither the start-up check's nor
    /// the start snapshot's: those run once as the copier starts, see `snapshot_queries`).
    pub queries: u64,
    /// Of `answered`, those the start snapshot answered ([`Snapshot`]).
    pub from_snapshot: u64,
    /// Connections the start snapshot read.
    pub snapshot_connections: u64,
    /// Statements the start snapshot ran on production (SELECTs).
    pub snapshot_queries: u64,
}

impl LookupStats {
    /// Adds another worker's lookups (`--workers`): each worker has its own lookup thread and
    /// reads its own start snapshot, of the same connections.
    pub fn merge(&mut self, o: &LookupStats) {
        self.requested += o.requested;
        self.answered += o.answered;
        self.not_found += o.not_found;
        self.failed += o.failed;
        self.dropped += o.dropped;
        self.queries += o.queries;
        self.from_snapshot += o.from_snapshot;
        self.snapshot_connections = self.snapshot_connections.max(o.snapshot_connections);
        self.snapshot_queries += o.snapshot_queries;
    }

    /// Picked-up connections that log in with the defaults instead of their own state.
    pub fn not_recovered(&self) -> u64 {
        self.not_found + self.failed + self.dropped
    }
}

/// The lookup worker: one thread, one connection to production, fed by the engine thread.
pub struct StateLookup {
    requests: Option<SyncSender<Job>>,
    answers: Receiver<LookupAnswer>,
    counters: Arc<Counters>,
    own: OwnAddress,
    /// Set by `Drop`: the worker abandons what is still queued instead of looking it up.
    stop: Arc<AtomicBool>,
    /// Set by [`StateLookup::forget_snapshot`]: the start snapshot answers no more.
    forget: Arc<AtomicBool>,
    started: Instant,
    worker: Option<JoinHandle<()>>,
}

impl StateLookup {
    /// Logs in once and checks the account's grants (an error here should stop the copier:
    /// the operator asked for recovery and would silently not get it), then starts the worker.
    /// `wake` wakes the engine loop when answers are ready.
    pub fn start(
        dsn: ProdDsn,
        wake: impl Fn() + Send + 'static,
    ) -> Result<(Self, Readiness), ProdError> {
        let own = OwnAddress::default();
        let mut conn = open(&dsn, &own)?;
        let ready = check(&mut conn, &dsn.user)?;
        let (req_tx, req_rx) = mpsc::sync_channel(QUEUE_CAP);
        let (ans_tx, ans_rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let forget = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            dsn,
            conn: Some(conn),
            own: own.clone(),
            stop: Arc::clone(&stop),
            forget: Arc::clone(&forget),
            snapshot: None,
            counters: Arc::clone(&counters),
            wanted: Wanted::from(&ready),
            logged: HashSet::new(),
        };
        let handle = std::thread::Builder::new()
            .name("prod-state".into())
            .spawn(move || worker.run(req_rx, ans_tx, wake))?;
        Ok((
            Self {
                requests: Some(req_tx),
                answers: ans_rx,
                counters,
                own,
                stop,
                forget,
                started: Instant::now(),
                worker: Some(handle),
            },
            ready,
        ))
    }

    /// Asks about a picked-up connection. Never blocks: a full queue drops the request
    /// (counted) and returns false; the session then logs in with the defaults.
    pub fn request(&self, client: SocketAddrV4, mirrored: SocketAddrV4) -> bool {
        self.counters.requested.fetch_add(1, Ordering::Relaxed);
        let sent = self.send(Job::Lookup(LookupRequest { client, mirrored }));
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            // Its snapshot entry (if any) stays behind, and a later session of the same
            // connection (re-established) would find it stale.
            self.forget_snapshot();
        }
        sent
    }

    /// A session of `client` opened from its SYN, not picked up: while the start snapshot may
    /// answer, its entry for that address (a connection closed since) is removed.
    pub fn seen(&self, client: SocketAddrV4) {
        if self.snapshot_may_answer() && !self.send(Job::Seen(client)) {
            self.forget_snapshot();
        }
    }

    fn send(&self, job: Job) -> bool {
        self.requests
            .as_ref()
            .is_some_and(|tx| match tx.try_send(job) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            })
    }

    /// Whether the start snapshot may still answer a request. While it may, the capture must
    /// say whether it dropped anything ([`StateLookup::forget_snapshot`]) before the driver
    /// asks about a connection it just picked up.
    pub fn snapshot_may_answer(&self) -> bool {
        !self.forget.load(Ordering::Relaxed) && self.started.elapsed() <= SNAPSHOT_TTL
    }

    /// The capture dropped packets: one may have been a command of a connection the copier
    /// has not seen yet, which the start snapshot would then describe wrongly. Requests made
    /// after this call are looked up on production.
    pub fn forget_snapshot(&self) {
        self.forget.store(true, Ordering::SeqCst);
    }

    pub fn try_answer(&self) -> Option<LookupAnswer> {
        self.answers.try_recv().ok()
    }

    /// Our own connection's address, for the capture to skip.
    pub fn own_address(&self) -> &OwnAddress {
        &self.own
    }

    pub fn stats(&self) -> LookupStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LookupStats {
            requested: get(&c.requested),
            answered: get(&c.answered),
            not_found: get(&c.not_found),
            failed: get(&c.failed),
            dropped: get(&c.dropped),
            queries: get(&c.queries),
            from_snapshot: get(&c.from_snapshot),
            snapshot_connections: get(&c.snapshot_connections),
            snapshot_queries: get(&c.snapshot_queries),
        }
    }
}

impl Drop for StateLookup {
    fn drop(&mut self) {
        // The stop flag makes the worker drop what is still queued (up to QUEUE_CAP requests:
        // with production unreachable each batch would cost a connect and a read timeout) and
        // skip any reconnect; closing the queue wakes it if idle. So shutdown waits at most for
        // the batch in flight (bounded by IO_TIMEOUT per step).
        self.stop.store(true, Ordering::SeqCst);
        self.requests = None;
        if let Some(h) = self.worker.take() {
            let _ = h.join();
        }
    }
}

struct Worker {
    dsn: ProdDsn,
    conn: Option<MysqlClient<TcpStream>>,
    own: OwnAddress,
    stop: Arc<AtomicBool>,
    forget: Arc<AtomicBool>,
    snapshot: Option<Snapshot>,
    counters: Arc<Counters>,
    wanted: Wanted,
    /// Failure kinds already logged: production being down must not flood the log.
    logged: HashSet<String>,
}

impl Worker {
    fn run(
        mut self,
        requests: Receiver<Job>,
        answers: mpsc::Sender<LookupAnswer>,
        wake: impl Fn(),
    ) {
        self.snapshot = self.read_snapshot();
        while let Some(batch) = next_batch(&requests) {
            // Checked right before the lookup, hence before any reconnect.
            if self.stopping() {
                return;
            }
            let mut misses = Vec::with_capacity(batch.len());
            for job in batch {
                let r = match job {
                    Job::Lookup(r) => r,
                    Job::Seen(client) => {
                        self.snapshot_forget_client(client);
                        continue;
                    }
                };
                let Some((state, reads)) = self.snapshot_answer(r.client) else {
                    misses.push(r);
                    continue;
                };
                self.counters.answered.fetch_add(1, Ordering::Relaxed);
                self.counters.from_snapshot.fetch_add(1, Ordering::Relaxed);
                let answer = LookupAnswer {
                    mirrored: r.mirrored,
                    state: Some(state),
                    variables_read: reads,
                };
                if answers.send(answer).is_err() {
                    return;
                }
            }
            let batch = misses;
            if batch.is_empty() {
                wake();
                continue;
            }
            let ((mut found, reads), failed) = match self.lookup(&batch) {
                Ok(found) => (found, false),
                Err(e) => {
                    self.counters
                        .failed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.report(&e);
                    // Reconnect on the next batch: the connection's state is unknown now.
                    self.conn = None;
                    ((HashMap::new(), Reads::default()), true)
                }
            };
            for r in &batch {
                let state = found.remove(&r.client).map(|(_, s)| s);
                if !failed {
                    let c = if state.is_some() {
                        &self.counters.answered
                    } else {
                        &self.counters.not_found
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                }
                if answers
                    .send(LookupAnswer {
                        mirrored: r.mirrored,
                        state,
                        variables_read: reads,
                    })
                    .is_err()
                {
                    return;
                }
            }
            wake();
        }
    }

    /// The start snapshot, on the connection `StateLookup::start` logged in with. A failure is
    /// said and costs nothing else: every picked-up connection is then looked up when seen.
    fn read_snapshot(&mut self) -> Option<Snapshot> {
        let conn = self.conn.as_mut()?;
        match Snapshot::read(conn, self.wanted, &self.counters.snapshot_queries) {
            Ok(s) if s.is_empty() => {
                self.forget.store(true, Ordering::SeqCst);
                None
            }
            Ok(s) => {
                let n = s.states.len() as u64;
                self.counters
                    .snapshot_connections
                    .store(n, Ordering::Relaxed);
                tracing::info!(
                    "--prod-dsn {}: read the state of {n} connections open on production; \
                     those picked up from now on start from it while the capture drops nothing",
                    self.dsn
                );
                Some(s)
            }
            Err(e) => {
                tracing::warn!(
                    "--prod-dsn {}: reading the connections open on production failed ({e}); \
                     each picked-up connection is looked up when it is seen",
                    self.dsn
                );
                self.conn = None;
                self.forget.store(true, Ordering::SeqCst);
                None
            }
        }
    }

    fn snapshot_answer(&mut self, client: SocketAddrV4) -> Option<(RecoveredState, Reads)> {
        if self.forget.load(Ordering::SeqCst) {
            self.snapshot = None;
        }
        let snapshot = self.snapshot.as_mut()?;
        let hit = snapshot.take(client, Instant::now());
        if snapshot.is_empty() {
            // Nothing left to answer: the driver need not watch the capture's drops for it.
            self.snapshot = None;
            self.forget.store(true, Ordering::SeqCst);
        }
        hit
    }

    fn snapshot_forget_client(&mut self, client: SocketAddrV4) {
        if let Some(s) = &mut self.snapshot {
            s.states.remove(&client);
        }
    }

    fn lookup(&mut self, batch: &[LookupRequest]) -> Result<Found, ProdError> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self.conn.insert(open(&self.dsn, &self.own)?),
        };
        lookup_batch(conn, batch, self.wanted, &self.counters.queries)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn report(&mut self, e: &ProdError) {
        if self.logged.len() < 64 && self.logged.insert(e.kind()) {
            match e.fix(&self.dsn.user) {
                Some(fix) => tracing::warn!(
                    "--prod-dsn {}: {e}; pooled connections log in with the defaults until it \
                     works again (fix: {fix}; said once per kind of failure)",
                    self.dsn
                ),
                None => tracing::warn!(
                    "--prod-dsn {}: {e}; pooled connections log in with the defaults until it \
                     works again (said once per kind of failure)",
                    self.dsn
                ),
            }
        }
    }
}

/// Waits for a request, then gathers what else arrives within [`BATCH_WINDOW`] (at most
/// [`MAX_BATCH`]). `None` once the queue is closed and empty.
fn next_batch<T>(requests: &Receiver<T>) -> Option<Vec<T>> {
    let first = requests.recv().ok()?;
    let mut batch = vec![first];
    let until = Instant::now() + BATCH_WINDOW;
    while batch.len() < MAX_BATCH {
        let left = until.saturating_duration_since(Instant::now());
        match requests.recv_timeout(left) {
            Ok(r) => batch.push(r),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    Some(batch)
}

#[cfg(test)]
mod tests;
