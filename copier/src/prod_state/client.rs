//! The minimal blocking MySQL client (text protocol only) the lookup worker talks to
//! production with: connecting (its own address recorded for the capture to skip), logging in,
//! the readiness check of the account's grants, and text-protocol queries.
//!
//! Must never panic or allocate without bound on production's bytes (every packet and result
//! set has a size limit), nor be used from the engine thread: it blocks.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::mysql::auth::{AuthPlugin, Nonce, Password};
use common::mysql::handshake::{
    AuthMoreData, AuthSwitchRequest, Capabilities, EofPacket, ErrPacket, FastAuthResult, Greeting,
    HandshakeResponse,
};
use common::mysql::packet::{write_packet, PacketHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use common::mysql::{read_lenenc_bytes, read_lenenc_int};

use super::dsn::ProdDsn;
use super::error::{code, protocol, server_error, ProdError};
use super::{IO_TIMEOUT, MAX_AUTH_STEPS, MAX_COLUMNS, MAX_PACKET, MAX_RESULT_BYTES, MAX_ROWS};

/// A text-protocol row: one value per column, `None` for SQL NULL.
pub type Row = Vec<Option<Vec<u8>>>;

/// A minimal blocking MySQL client: login (mysql_native_password, caching_sha2_password fast
/// auth, AuthSwitchRequest) and COM_QUERY with text result sets. Generic over the stream so
/// scripted bytes can stand in for a server in tests.
pub struct MysqlClient<S> {
    pub(super) stream: S,
    /// Bytes of the current result set, against [`MAX_RESULT_BYTES`].
    pub(super) budget: usize,
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
pub(super) fn parse_row(p: &[u8], columns: usize) -> Result<Row, ProdError> {
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
    pub(super) slots: [AtomicU64; OWN_ADDRESSES_KEPT],
    pub(super) next: AtomicU64,
}

impl OwnAddress {
    const SET: u64 = 1 << 48;

    pub(super) fn set(&self, a: SocketAddrV4) {
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
pub(super) fn connect(addr: SocketAddrV4, own: &OwnAddress) -> Result<TcpStream, ProdError> {
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

pub(super) fn open(dsn: &ProdDsn, own: &OwnAddress) -> Result<MysqlClient<TcpStream>, ProdError> {
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
pub(super) fn check(
    c: &mut MysqlClient<impl Read + Write>,
    user: &str,
) -> Result<Readiness, ProdError> {
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

pub(super) fn text(v: &Option<Vec<u8>>) -> Option<String> {
    v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned())
}
