//! The connection phase: the server's greeting (HandshakeV10), the client's login
//! (HandshakeResponse41 or SSLRequest), and the server packets of the auth exchange (OK, ERR,
//! AuthSwitchRequest, AuthMoreData), plus EOF and a first-byte classifier for replies.
//!
//! Parsed structures borrow from the payload; `write` methods emit payloads (without the 4-byte
//! packet header, see [`super::packet::write_packet`]).

use std::fmt;
use std::ops::{BitAnd, BitOr};

use super::codec::{write_lenenc_bytes, write_nul_str, ProtocolError, Reader};

/// Client/server capability flags (the 32 bits every MySQL flavour shares).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Capabilities(pub u32);

impl Capabilities {
    /// Also called CLIENT_LONG_PASSWORD. MariaDB servers clear it in their greeting to say
    /// "MariaDB extended capabilities follow".
    pub const MYSQL: Self = Self(1);
    pub const FOUND_ROWS: Self = Self(1 << 1);
    pub const LONG_FLAG: Self = Self(1 << 2);
    pub const CONNECT_WITH_DB: Self = Self(1 << 3);
    pub const NO_SCHEMA: Self = Self(1 << 4);
    pub const COMPRESS: Self = Self(1 << 5);
    pub const ODBC: Self = Self(1 << 6);
    pub const LOCAL_FILES: Self = Self(1 << 7);
    pub const IGNORE_SPACE: Self = Self(1 << 8);
    pub const PROTOCOL_41: Self = Self(1 << 9);
    pub const INTERACTIVE: Self = Self(1 << 10);
    pub const SSL: Self = Self(1 << 11);
    pub const IGNORE_SIGPIPE: Self = Self(1 << 12);
    pub const TRANSACTIONS: Self = Self(1 << 13);
    pub const RESERVED: Self = Self(1 << 14);
    pub const SECURE_CONNECTION: Self = Self(1 << 15);
    pub const MULTI_STATEMENTS: Self = Self(1 << 16);
    pub const MULTI_RESULTS: Self = Self(1 << 17);
    pub const PS_MULTI_RESULTS: Self = Self(1 << 18);
    pub const PLUGIN_AUTH: Self = Self(1 << 19);
    pub const CONNECT_ATTRS: Self = Self(1 << 20);
    pub const PLUGIN_AUTH_LENENC_CLIENT_DATA: Self = Self(1 << 21);
    pub const CAN_HANDLE_EXPIRED_PASSWORDS: Self = Self(1 << 22);
    pub const SESSION_TRACK: Self = Self(1 << 23);
    pub const DEPRECATE_EOF: Self = Self(1 << 24);
    pub const OPTIONAL_RESULTSET_METADATA: Self = Self(1 << 25);
    pub const ZSTD_COMPRESSION: Self = Self(1 << 26);
    pub const QUERY_ATTRIBUTES: Self = Self(1 << 27);
    pub const SSL_VERIFY_SERVER_CERT: Self = Self(1 << 30);
    pub const REMEMBER_OPTIONS: Self = Self(1 << 31);

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn with(self, other: Self, on: bool) -> Self {
        if on {
            Self(self.0 | other.0)
        } else {
            Self(self.0 & !other.0)
        }
    }
}

impl BitOr for Capabilities {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitAnd for Capabilities {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Capabilities({:#010x})", self.0)
    }
}

/// MariaDB's extended capabilities, carried where MySQL has reserved zero bytes.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MariaCapabilities(pub u32);

impl MariaCapabilities {
    pub const PROGRESS: Self = Self(1);
    pub const COM_MULTI: Self = Self(1 << 1);
    /// COM_STMT_BULK_EXECUTE (0xFA), which carries a statement id like COM_STMT_EXECUTE.
    pub const STMT_BULK_OPERATIONS: Self = Self(1 << 2);
    pub const EXTENDED_METADATA: Self = Self(1 << 3);
    /// The server may omit column definitions in COM_STMT_EXECUTE answers when unchanged.
    pub const CACHE_METADATA: Self = Self(1 << 4);

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl fmt::Debug for MariaCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MariaCapabilities({:#010x})", self.0)
    }
}

/// Server status flags of OK and EOF packets that the mirror looks at.
pub mod status {
    pub const IN_TRANS: u16 = 0x0001;
    pub const AUTOCOMMIT: u16 = 0x0002;
    pub const MORE_RESULTS_EXISTS: u16 = 0x0008;
    pub const CURSOR_EXISTS: u16 = 0x0040;
    pub const LAST_ROW_SENT: u16 = 0x0080;
    pub const SESSION_STATE_CHANGED: u16 = 0x4000;
}

/// The server's greeting (Protocol::HandshakeV10).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Greeting<'a> {
    pub server_version: &'a [u8],
    pub connection_id: u32,
    /// auth-plugin-data part 1: the first 8 nonce bytes.
    pub auth_data_1: [u8; 8],
    /// The byte after part 1 (always 0 from real servers); kept for exact re-emission.
    pub filler: u8,
    pub capabilities: Capabilities,
    pub charset: u8,
    pub status: u16,
    /// The advertised auth-plugin-data length (21 from real servers, 0 without PLUGIN_AUTH).
    pub auth_data_len: u8,
    /// The 10 reserved bytes; MariaDB puts its extended capabilities in the last four.
    pub reserved: [u8; 10],
    /// auth-plugin-data part 2 as on the wire, trailing NUL included.
    pub auth_data_2: &'a [u8],
    pub auth_plugin: Option<&'a [u8]>,
}

impl<'a> Greeting<'a> {
    pub const PROTOCOL_VERSION: u8 = 10;

    pub fn parse(payload: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "greeting");
        let version = r.u8()?;
        if version != Self::PROTOCOL_VERSION {
            // 0xFF here is an ERR packet (e.g. "Host is blocked"), anything else a protocol we
            // cannot mirror.
            return Err(ProtocolError::UnexpectedByte {
                what: "greeting protocol version",
                byte: version,
            });
        }
        let server_version = r.nul_str()?;
        let connection_id = r.u32()?;
        let auth_data_1 = r.array()?;
        let filler = r.u8()?;
        let caps_low = r.u16()?;
        let mut g = Greeting {
            server_version,
            connection_id,
            auth_data_1,
            filler,
            capabilities: Capabilities(u32::from(caps_low)),
            charset: 0,
            status: 0,
            auth_data_len: 0,
            reserved: [0; 10],
            auth_data_2: &[],
            auth_plugin: None,
        };
        // Servers before 4.1 stop here; nothing in the lab does, but a short greeting is valid.
        if r.is_empty() {
            return Ok(g);
        }
        g.charset = r.u8()?;
        g.status = r.u16()?;
        let caps_high = r.u16()?;
        g.capabilities = Capabilities(u32::from(caps_low) | u32::from(caps_high) << 16);
        g.auth_data_len = r.u8()?;
        g.reserved = r.array()?;
        if g.capabilities.contains(Capabilities::SECURE_CONNECTION) {
            let n = usize::from(g.auth_data_len).saturating_sub(8).max(13);
            // Some servers send fewer bytes than announced; take what is there.
            g.auth_data_2 = r.bytes(n.min(r.remaining()))?;
        }
        if g.capabilities.contains(Capabilities::PLUGIN_AUTH) {
            g.auth_plugin = Some(r.nul_str_or_eof().0);
        }
        Ok(g)
    }

    /// MariaDB extended capabilities, when the server cleared the CLIENT_MYSQL bit to send them.
    pub fn mariadb_capabilities(&self) -> Option<MariaCapabilities> {
        if self.capabilities.contains(Capabilities::MYSQL) {
            return None;
        }
        let r = &self.reserved;
        Some(MariaCapabilities(u32::from_le_bytes([
            r[6], r[7], r[8], r[9],
        ])))
    }

    /// The nonce ("scramble") the client must answer: part 1 and part 2 without part 2's NUL.
    /// Real servers send 20 bytes; [`super::auth::Nonce::from_auth_data`] checks that.
    pub fn nonce(&self) -> Vec<u8> {
        let part2 = self
            .auth_data_2
            .strip_suffix(&[0])
            .unwrap_or(self.auth_data_2);
        [&self.auth_data_1[..], part2].concat()
    }

    pub fn write(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        out.push(Self::PROTOCOL_VERSION);
        write_nul_str(self.server_version, "greeting server version", out)?;
        out.extend_from_slice(&self.connection_id.to_le_bytes());
        out.extend_from_slice(&self.auth_data_1);
        out.push(self.filler);
        let caps = self.capabilities.0.to_le_bytes();
        out.extend_from_slice(&caps[..2]);
        out.push(self.charset);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&caps[2..]);
        out.push(self.auth_data_len);
        out.extend_from_slice(&self.reserved);
        if self.capabilities.contains(Capabilities::SECURE_CONNECTION) {
            out.extend_from_slice(self.auth_data_2);
        }
        if let Some(p) = self.auth_plugin {
            write_nul_str(p, "greeting auth plugin", out)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Greeting<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Greeting")
            .field(
                "server_version",
                &String::from_utf8_lossy(self.server_version),
            )
            .field("connection_id", &self.connection_id)
            .field("capabilities", &self.capabilities)
            .field("mariadb_capabilities", &self.mariadb_capabilities())
            .field("charset", &self.charset)
            .field("status", &format_args!("{:#06x}", self.status))
            .field(
                "auth_plugin",
                &self.auth_plugin.map(String::from_utf8_lossy),
            )
            .finish_non_exhaustive()
    }
}

/// Bytes of an SSLRequest: the fixed head of a HandshakeResponse41 and nothing else.
pub const SSL_REQUEST_LEN: usize = 32;

/// The client's login (Protocol::HandshakeResponse41).
///
/// `write` reproduces a parsed payload byte for byte, provided its length-encoded integers were in
/// shortest form (as every real client sends them).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HandshakeResponse<'a> {
    pub capabilities: Capabilities,
    pub max_packet: u32,
    pub charset: u8,
    /// The 23 "reserved" bytes: MariaDB Connector/C (sysbench, the `mariadb` CLI) puts its extended
    /// capabilities in the last four, so they are neither required to be zero nor dropped.
    pub filler: [u8; 23],
    pub username: &'a [u8],
    /// Secret material: redacted in Debug output.
    pub auth_response: &'a [u8],
    pub database: Option<&'a [u8]>,
    pub auth_plugin: Option<&'a [u8]>,
    /// The connection attributes' key/value area (lenenc pairs), without its total-length prefix.
    pub attributes: Option<&'a [u8]>,
    /// Anything after the known fields (MySQL 8 puts a zstd level there); kept for re-emission.
    pub trailing: &'a [u8],
}

/// What a client sent as its first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientLogin<'a> {
    /// The client asks for TLS; everything after this is encrypted.
    SslRequest(SslRequest),
    Response(HandshakeResponse<'a>),
}

/// The fixed head of a login, sent alone to start TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SslRequest {
    pub capabilities: Capabilities,
    pub max_packet: u32,
    pub charset: u8,
    pub filler: [u8; 23],
}

/// Why a session cannot be mirrored at packet level, decided from its login.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotMirrorable {
    /// TLS: the commands after the login are encrypted.
    Tls,
    /// The compressed protocol frames commands inside compressed packets.
    Compression,
}

impl<'a> ClientLogin<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Self, ProtocolError> {
        let caps = Reader::new(payload, "login").u32()?;
        let caps = Capabilities(caps);
        if !caps.contains(Capabilities::PROTOCOL_41) {
            return Err(ProtocolError::Unsupported(
                "pre-4.1 login (HandshakeResponse320)",
            ));
        }
        if caps.contains(Capabilities::SSL) && payload.len() == SSL_REQUEST_LEN {
            let mut r = Reader::new(payload, "SSLRequest");
            return Ok(Self::SslRequest(SslRequest {
                capabilities: Capabilities(r.u32()?),
                max_packet: r.u32()?,
                charset: r.u8()?,
                filler: r.array()?,
            }));
        }
        HandshakeResponse::parse(payload).map(Self::Response)
    }

    pub fn capabilities(&self) -> Capabilities {
        match self {
            Self::SslRequest(s) => s.capabilities,
            Self::Response(r) => r.capabilities,
        }
    }

    /// `Some` when the session must be left alone (and counted) rather than mirrored.
    pub fn not_mirrorable(&self) -> Option<NotMirrorable> {
        let caps = self.capabilities();
        if matches!(self, Self::SslRequest(_)) || caps.contains(Capabilities::SSL) {
            Some(NotMirrorable::Tls)
        } else if caps.contains(Capabilities::COMPRESS)
            || caps.contains(Capabilities::ZSTD_COMPRESSION)
        {
            Some(NotMirrorable::Compression)
        } else {
            None
        }
    }
}

/// Reads an auth response by the rules a login and COM_CHANGE_USER share.
pub(crate) fn read_auth_response<'a>(
    r: &mut Reader<'a>,
    caps: Capabilities,
) -> Result<&'a [u8], ProtocolError> {
    if caps.contains(Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA) {
        r.lenenc_bytes()
    } else if caps.contains(Capabilities::SECURE_CONNECTION) {
        let n = r.u8()?;
        r.bytes(usize::from(n))
    } else {
        r.nul_str()
    }
}

pub(crate) fn write_auth_response(
    auth: &[u8],
    caps: Capabilities,
    what: &'static str,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    if caps.contains(Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA) {
        write_lenenc_bytes(auth, out);
    } else if caps.contains(Capabilities::SECURE_CONNECTION) {
        let n = u8::try_from(auth.len()).map_err(|_| ProtocolError::Unencodable(what))?;
        out.push(n);
        out.extend_from_slice(auth);
    } else {
        write_nul_str(auth, what, out)?;
    }
    Ok(())
}

impl<'a> HandshakeResponse<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "HandshakeResponse41");
        let capabilities = Capabilities(r.u32()?);
        if !capabilities.contains(Capabilities::PROTOCOL_41) {
            return Err(ProtocolError::Unsupported(
                "pre-4.1 login (HandshakeResponse320)",
            ));
        }
        let max_packet = r.u32()?;
        let charset = r.u8()?;
        let filler = r.array()?;
        let username = r.nul_str()?;
        let auth_response = read_auth_response(&mut r, capabilities)?;
        let database = if capabilities.contains(Capabilities::CONNECT_WITH_DB) {
            Some(r.nul_str()?)
        } else {
            None
        };
        let auth_plugin = if capabilities.contains(Capabilities::PLUGIN_AUTH) {
            Some(r.nul_str()?)
        } else {
            None
        };
        let attributes = if capabilities.contains(Capabilities::CONNECT_ATTRS) {
            Some(r.lenenc_bytes()?)
        } else {
            None
        };
        Ok(Self {
            capabilities,
            max_packet,
            charset,
            filler,
            username,
            auth_response,
            database,
            auth_plugin,
            attributes,
            trailing: r.rest(),
        })
    }

    /// MariaDB extended capabilities from the filler's last four bytes, when the client cleared
    /// CLIENT_MYSQL to say they are there.
    pub fn mariadb_capabilities(&self) -> Option<MariaCapabilities> {
        mariadb_caps_in_filler(self.capabilities, &self.filler)
    }

    /// Iterates the connection attributes; stops at the first malformed pair.
    pub fn attributes(&self) -> AttributeIter<'a> {
        AttributeIter {
            r: Reader::new(self.attributes.unwrap_or(&[]), "connection attributes"),
        }
    }

    /// Emits the payload. The optional fields must agree with the capability flags (a present
    /// field whose flag is clear, or the reverse, is refused), so that the emitted bytes parse back
    /// to the same value.
    pub fn write(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        let caps = self.capabilities;
        let agree = |flag: Capabilities, present: bool, what: &'static str| {
            if caps.contains(flag) == present {
                Ok(())
            } else {
                Err(ProtocolError::Unencodable(what))
            }
        };
        agree(Capabilities::PROTOCOL_41, true, "login without PROTOCOL_41")?;
        agree(
            Capabilities::CONNECT_WITH_DB,
            self.database.is_some(),
            "login database",
        )?;
        agree(
            Capabilities::PLUGIN_AUTH,
            self.auth_plugin.is_some(),
            "login auth plugin",
        )?;
        agree(
            Capabilities::CONNECT_ATTRS,
            self.attributes.is_some(),
            "login attributes",
        )?;
        out.extend_from_slice(&caps.0.to_le_bytes());
        out.extend_from_slice(&self.max_packet.to_le_bytes());
        out.push(self.charset);
        out.extend_from_slice(&self.filler);
        write_nul_str(self.username, "login username", out)?;
        write_auth_response(self.auth_response, caps, "login auth response", out)?;
        if let Some(db) = self.database {
            write_nul_str(db, "login database", out)?;
        }
        if let Some(p) = self.auth_plugin {
            write_nul_str(p, "login auth plugin", out)?;
        }
        if let Some(a) = self.attributes {
            write_lenenc_bytes(a, out);
        }
        out.extend_from_slice(self.trailing);
        Ok(())
    }
}

pub(crate) fn mariadb_caps_in_filler(
    caps: Capabilities,
    filler: &[u8; 23],
) -> Option<MariaCapabilities> {
    if caps.contains(Capabilities::MYSQL) {
        return None;
    }
    Some(MariaCapabilities(u32::from_le_bytes([
        filler[19], filler[20], filler[21], filler[22],
    ])))
}

impl fmt::Debug for HandshakeResponse<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandshakeResponse")
            .field("capabilities", &self.capabilities)
            .field("mariadb_capabilities", &self.mariadb_capabilities())
            .field("max_packet", &self.max_packet)
            .field("charset", &self.charset)
            .field("username", &String::from_utf8_lossy(self.username))
            .field("auth_response", &Redacted(self.auth_response.len()))
            .field("database", &self.database.map(String::from_utf8_lossy))
            .field(
                "auth_plugin",
                &self.auth_plugin.map(String::from_utf8_lossy),
            )
            .field("attributes_len", &self.attributes.map(<[u8]>::len))
            .field("trailing_len", &self.trailing.len())
            .finish()
    }
}

/// Stands in for secret bytes in Debug output: shows only their length.
pub(crate) struct Redacted(pub usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes redacted>", self.0)
    }
}

/// Key/value pairs of connection attributes (`_client_name`, `program_name`, ...).
#[derive(Clone, Debug)]
pub struct AttributeIter<'a> {
    r: Reader<'a>,
}

impl<'a> Iterator for AttributeIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.r.is_empty() {
            return None;
        }
        let pair = self
            .r
            .lenenc_bytes()
            .and_then(|k| Ok((k, self.r.lenenc_bytes()?)));
        if pair.is_err() {
            self.r.rest();
        }
        pair.ok()
    }
}

/// The client's request that the server switch auth method (0xFE, plugin name, plugin data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthSwitchRequest<'a> {
    pub plugin: &'a [u8],
    /// The new nonce for the named plugin (MariaDB and MySQL send 20 bytes and a NUL).
    pub data: &'a [u8],
}

impl<'a> AuthSwitchRequest<'a> {
    pub const HEADER: u8 = 0xfe;

    pub fn parse(payload: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "AuthSwitchRequest");
        let h = r.u8()?;
        if h != Self::HEADER {
            return Err(ProtocolError::UnexpectedByte {
                what: "AuthSwitchRequest",
                byte: h,
            });
        }
        if r.is_empty() {
            // A bare 0xFE asks for the pre-4.1 mysql_old_password, which nothing current speaks.
            return Err(ProtocolError::Unsupported("switch to mysql_old_password"));
        }
        let plugin = r.nul_str()?;
        Ok(Self {
            plugin,
            data: r.rest(),
        })
    }

    pub fn write(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        out.push(Self::HEADER);
        write_nul_str(self.plugin, "AuthSwitchRequest plugin", out)?;
        out.extend_from_slice(self.data);
        Ok(())
    }
}

/// Extra auth data from the server (0x01 + data): caching_sha2_password's fast-auth verdict or
/// its RSA public key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthMoreData<'a> {
    pub data: &'a [u8],
}

/// caching_sha2_password's answer to a fast-auth scramble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastAuthResult {
    /// The scramble matched the server's cache; an OK follows.
    Success,
    /// The server needs the password itself (over TLS, or RSA-encrypted).
    FullAuthRequired,
}

impl<'a> AuthMoreData<'a> {
    pub const HEADER: u8 = 0x01;

    pub fn parse(payload: &'a [u8]) -> Result<Self, ProtocolError> {
        match payload.split_first() {
            Some((&Self::HEADER, data)) => Ok(Self { data }),
            Some((&byte, _)) => Err(ProtocolError::UnexpectedByte {
                what: "AuthMoreData",
                byte,
            }),
            None => Err(ProtocolError::Truncated("AuthMoreData")),
        }
    }

    pub fn fast_auth_result(&self) -> Option<FastAuthResult> {
        match self.data {
            [0x03] => Some(FastAuthResult::Success),
            [0x04] => Some(FastAuthResult::FullAuthRequired),
            _ => None,
        }
    }
}

/// An OK packet (0x00; or 0xFE when it ends a result set under CLIENT_DEPRECATE_EOF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OkPacket<'a> {
    pub header: u8,
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
    pub info: &'a [u8],
    /// Session state changes, present when SESSION_TRACK was negotiated and the status says so.
    pub session_state: Option<&'a [u8]>,
}

impl<'a> OkPacket<'a> {
    /// `caps` are the capabilities both sides agreed on (they decide how `info` is framed).
    pub fn parse(payload: &'a [u8], caps: Capabilities) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "OK packet");
        let header = r.u8()?;
        if header != 0x00 && header != 0xfe {
            return Err(ProtocolError::UnexpectedByte {
                what: "OK packet",
                byte: header,
            });
        }
        let affected_rows = r.lenenc_int()?;
        let last_insert_id = r.lenenc_int()?;
        let status = r.u16()?;
        let warnings = r.u16()?;
        let mut ok = Self {
            header,
            affected_rows,
            last_insert_id,
            status,
            warnings,
            info: &[],
            session_state: None,
        };
        if !caps.contains(Capabilities::SESSION_TRACK) {
            ok.info = r.rest();
            return Ok(ok);
        }
        if !r.is_empty() {
            ok.info = r.lenenc_bytes()?;
        }
        if status & status::SESSION_STATE_CHANGED != 0 && !r.is_empty() {
            ok.session_state = Some(r.lenenc_bytes()?);
        }
        Ok(ok)
    }

    /// The schema the session switched to, when the server tracked it (SESSION_TRACK_SCHEMA). The
    /// copier learns a session's current schema from this without parsing SQL.
    pub fn tracked_schema(&self) -> Option<&'a [u8]> {
        const SESSION_TRACK_SCHEMA: u8 = 1;
        let mut r = Reader::new(self.session_state?, "session state");
        let mut schema = None;
        while !r.is_empty() {
            let kind = r.u8().ok()?;
            let data = r.lenenc_bytes().ok()?;
            if kind == SESSION_TRACK_SCHEMA {
                schema = Some(Reader::new(data, "schema change").lenenc_bytes().ok()?);
            }
        }
        schema
    }
}

/// An ERR packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrPacket<'a> {
    pub code: u16,
    /// The 5-character SQLSTATE after '#', when sent.
    pub sql_state: Option<[u8; 5]>,
    pub message: &'a [u8],
}

impl<'a> ErrPacket<'a> {
    pub const HEADER: u8 = 0xff;
    /// The code MariaDB uses for progress reports, which are not errors and do not end a reply.
    pub const PROGRESS_REPORT: u16 = 0xffff;

    pub fn parse(payload: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "ERR packet");
        let h = r.u8()?;
        if h != Self::HEADER {
            return Err(ProtocolError::UnexpectedByte {
                what: "ERR packet",
                byte: h,
            });
        }
        let code = r.u16()?;
        let sql_state = if r.peek() == Some(b'#') && r.remaining() >= 6 {
            r.u8()?;
            Some(r.array()?)
        } else {
            None
        };
        Ok(Self {
            code,
            sql_state,
            message: r.rest(),
        })
    }

    pub fn is_progress_report(&self) -> bool {
        self.code == Self::PROGRESS_REPORT
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(Self::HEADER);
        out.extend_from_slice(&self.code.to_le_bytes());
        if let Some(s) = self.sql_state {
            out.push(b'#');
            out.extend_from_slice(&s);
        }
        out.extend_from_slice(self.message);
    }
}

/// An EOF packet (0xFE, payload shorter than 9 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EofPacket {
    pub warnings: u16,
    pub status: u16,
}

impl EofPacket {
    pub const HEADER: u8 = 0xfe;

    /// Whether a packet with this payload is an EOF rather than a row or an AuthSwitchRequest.
    pub fn is_eof(payload: &[u8]) -> bool {
        payload.first() == Some(&Self::HEADER) && payload.len() < 9
    }

    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        if !Self::is_eof(payload) {
            return match payload.first() {
                Some(&byte) => Err(ProtocolError::UnexpectedByte {
                    what: "EOF packet",
                    byte,
                }),
                None => Err(ProtocolError::Truncated("EOF packet")),
            };
        }
        let mut r = Reader::new(&payload[1..], "EOF packet");
        // Pre-4.1 EOFs are the bare 0xFE; treat missing fields as zero.
        let warnings = r.u16().unwrap_or(0);
        let status = r.u16().unwrap_or(0);
        Ok(Self { warnings, status })
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(Self::HEADER);
        out.extend_from_slice(&self.warnings.to_le_bytes());
        out.extend_from_slice(&self.status.to_le_bytes());
    }
}

/// Where a reply packet sits in the conversation, which changes what its first byte means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyPhase {
    /// After the login or COM_CHANGE_USER, until OK or ERR.
    Auth,
    /// The first packet of the answer to a command.
    Command,
}

/// What a server packet is, from its first byte (and length) alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerReply {
    Ok,
    Err,
    /// An ERR-shaped MariaDB progress report (code 0xFFFF): more packets follow.
    Progress,
    Eof,
    AuthSwitch,
    AuthMoreData,
    /// LOCAL INFILE request (0xFB): the client answers with file contents.
    LocalInfile,
    /// Anything else: a result set's column count, or (inside a reply) rows and definitions.
    Data,
    Empty,
}

impl ServerReply {
    /// Classifies the *first* packet of a reply; packets inside a result set (rows, column
    /// definitions) can start with any byte and need the result-set state to be read.
    pub fn classify(payload: &[u8], phase: ReplyPhase) -> Self {
        let Some(&first) = payload.first() else {
            return Self::Empty;
        };
        match (first, phase) {
            (0xff, _) if payload.get(1..3) == Some(&[0xff, 0xff]) => Self::Progress,
            (0xff, _) => Self::Err,
            (0x00, _) => Self::Ok,
            (0xfe, ReplyPhase::Auth) => Self::AuthSwitch,
            (0x01, ReplyPhase::Auth) => Self::AuthMoreData,
            (0xfe, ReplyPhase::Command) if payload.len() < 9 => Self::Eof,
            (0xfb, ReplyPhase::Command) => Self::LocalInfile,
            _ => Self::Data,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mysql::fixtures::{self, hex};
    use proptest::prelude::*;

    #[test]
    fn parses_real_mariadb_greeting() {
        let p = hex(fixtures::CLI_GREETING);
        let g = Greeting::parse(&p).unwrap();
        assert_eq!(g.server_version, b"5.5.5-10.11.19-MariaDB-0+deb12u1");
        assert_eq!(g.connection_id, 7);
        assert_eq!(g.auth_plugin, Some(&b"mysql_native_password"[..]));
        assert_eq!(g.auth_data_len, 21);
        assert!(!g.capabilities.contains(Capabilities::MYSQL));
        assert!(!g.capabilities.contains(Capabilities::SSL));
        // Offered by the server, but Connector/C does not ask for it (see the login tests).
        assert!(g.capabilities.contains(Capabilities::DEPRECATE_EOF));
        assert!(g
            .capabilities
            .contains(Capabilities::PLUGIN_AUTH | Capabilities::SESSION_TRACK));
        assert_eq!(g.mariadb_capabilities(), Some(MariaCapabilities(0x1d)));
        assert_eq!(
            g.nonce(),
            hex("274b2576473f44774d5b5f4c3f352f28784b4a70"),
            "8 + 12 bytes, part 2's NUL dropped"
        );
        let mut out = Vec::new();
        g.write(&mut out).unwrap();
        assert_eq!(out, p);

        let ssl = hex(fixtures::SSL_GREETING);
        let g = Greeting::parse(&ssl).unwrap();
        assert!(g.capabilities.contains(Capabilities::SSL));
        let mut out = Vec::new();
        g.write(&mut out).unwrap();
        assert_eq!(out, ssl);
    }

    #[test]
    fn accepts_connector_c_logins_with_extended_capabilities_in_the_filler() {
        for (fx, user, db, charset) in [
            (fixtures::SB_RESPONSE, &b"sb"[..], Some(&b"sbtest"[..]), 45),
            (fixtures::CLI_RESPONSE, b"sb", Some(b"sbtest"), 33),
            (fixtures::CAPI_RESPONSE, b"sb", Some(b"sbtest"), 45),
            (fixtures::NOPW_RESPONSE, b"nopw", None, 33),
        ] {
            let p = hex(fx);
            let ClientLogin::Response(r) = ClientLogin::parse(&p).unwrap() else {
                panic!("not a response");
            };
            assert_eq!(r.username, user);
            assert_eq!(r.database, db);
            assert_eq!(r.charset, charset);
            assert_eq!(r.auth_plugin, Some(&b"mysql_native_password"[..]));
            assert_eq!(&r.filler[19..], &[0x1d, 0, 0, 0]);
            assert_eq!(r.mariadb_capabilities(), Some(MariaCapabilities(0x1d)));
            assert!(r.trailing.is_empty());
            assert!(ClientLogin::Response(r).not_mirrorable().is_none());
            let names: Vec<_> = r.attributes().map(|(k, _)| k).collect();
            assert!(names.contains(&&b"_client_name"[..]), "{names:?}");
            let mut out = Vec::new();
            r.write(&mut out).unwrap();
            assert_eq!(out, p, "exact re-emission");
        }
        let sb = hex(fixtures::SB_RESPONSE);
        let r = HandshakeResponse::parse(&sb).unwrap();
        assert_eq!(r.capabilities, Capabilities(0x00bf_a28c));
        assert!(!r.capabilities.contains(Capabilities::DEPRECATE_EOF));
        assert_eq!(r.auth_response.len(), 20);
        assert!(HandshakeResponse::parse(&hex(fixtures::NOPW_RESPONSE))
            .unwrap()
            .auth_response
            .is_empty());
    }

    #[test]
    fn detects_tls_and_compression() {
        let ssl = hex(fixtures::SSL_REQUEST);
        let login = ClientLogin::parse(&ssl).unwrap();
        assert!(matches!(login, ClientLogin::SslRequest(_)));
        assert_eq!(login.not_mirrorable(), Some(NotMirrorable::Tls));

        let comp = hex(fixtures::COMPRESS_RESPONSE);
        let login = ClientLogin::parse(&comp).unwrap();
        assert!(matches!(login, ClientLogin::Response(_)));
        assert_eq!(login.not_mirrorable(), Some(NotMirrorable::Compression));
    }

    #[test]
    fn debug_output_hides_the_auth_response() {
        let p = hex(fixtures::CLI_RESPONSE);
        let r = HandshakeResponse::parse(&p).unwrap();
        let dbg = format!("{r:?}");
        assert!(dbg.contains("<20 bytes redacted>"), "{dbg}");
        let secret = format!("{:?}", r.auth_response);
        assert!(!dbg.contains(secret.trim_matches(['[', ']'])), "{dbg}");
    }

    #[test]
    fn auth_exchange_packets() {
        let sw = hex(fixtures::CAPI_AUTH_SWITCH);
        let a = AuthSwitchRequest::parse(&sw).unwrap();
        assert_eq!(a.plugin, b"mysql_native_password");
        assert_eq!(
            a.data,
            &hex("7d30726f553c6c2c32584635746c3f36302d304700")[..]
        );
        let mut out = Vec::new();
        a.write(&mut out).unwrap();
        assert_eq!(out, sw);
        assert_eq!(
            ServerReply::classify(&sw, ReplyPhase::Auth),
            ServerReply::AuthSwitch
        );
        assert_eq!(
            AuthSwitchRequest::parse(&[0xfe]),
            Err(ProtocolError::Unsupported("switch to mysql_old_password"))
        );

        let more = AuthMoreData::parse(&[1, 3]).unwrap();
        assert_eq!(more.fast_auth_result(), Some(FastAuthResult::Success));
        let more = AuthMoreData::parse(&[1, 4]).unwrap();
        assert_eq!(
            more.fast_auth_result(),
            Some(FastAuthResult::FullAuthRequired)
        );
        let pem = AuthMoreData::parse(b"\x01-----BEGIN PUBLIC KEY-----\n").unwrap();
        assert_eq!(pem.fast_auth_result(), None);
        assert_eq!(
            ServerReply::classify(&[1, 3], ReplyPhase::Auth),
            ServerReply::AuthMoreData
        );
    }

    #[test]
    fn ok_err_eof_from_real_server() {
        let caps = Capabilities(0x00bf_a28c);
        let p = hex(fixtures::CLI_LOGIN_OK);
        let ok = OkPacket::parse(&p, caps).unwrap();
        assert_eq!((ok.affected_rows, ok.status, ok.warnings), (0, 0x4002, 0));
        assert_eq!(ok.tracked_schema(), Some(&b"sbtest"[..]));
        let cu_ok = hex(fixtures::CAPI_CHANGE_USER_OK);
        let ok = OkPacket::parse(&cu_ok, caps).unwrap();
        assert_eq!(ok.tracked_schema(), Some(&b"mysql"[..]));
        assert_eq!(ServerReply::classify(&p, ReplyPhase::Auth), ServerReply::Ok);

        let e = hex(fixtures::WRONG_PW_ERR);
        let err = ErrPacket::parse(&e).unwrap();
        assert_eq!(err.code, 1045);
        assert_eq!(err.sql_state, Some(*b"28000"));
        assert!(err.message.starts_with(b"Access denied for user 'sb'"));
        let mut out = Vec::new();
        err.write(&mut out);
        assert_eq!(out, e);
        assert_eq!(
            ServerReply::classify(&e, ReplyPhase::Command),
            ServerReply::Err
        );
        assert_eq!(
            ServerReply::classify(&[0xff, 0xff, 0xff, 1], ReplyPhase::Command),
            ServerReply::Progress
        );

        let eof = hex(fixtures::CLI_EOF);
        assert_eq!(
            EofPacket::parse(&eof),
            Ok(EofPacket {
                warnings: 0,
                status: 2
            })
        );
        assert_eq!(
            ServerReply::classify(&eof, ReplyPhase::Command),
            ServerReply::Eof
        );
        // A 0xFE row (a lenenc 8-byte integer) is not an EOF.
        assert_eq!(
            ServerReply::classify(&[0xfe; 9], ReplyPhase::Command),
            ServerReply::Data
        );
        assert_eq!(
            ServerReply::classify(&[0xfb, b'f'], ReplyPhase::Command),
            ServerReply::LocalInfile
        );
        assert_eq!(
            ServerReply::classify(&[1], ReplyPhase::Command),
            ServerReply::Data
        );
    }

    pub(crate) fn arb_caps() -> impl Strategy<Value = Capabilities> {
        // PROTOCOL_41 always; everything else free, so every length rule gets exercised.
        any::<u32>().prop_map(|c| Capabilities(c | Capabilities::PROTOCOL_41.0))
    }

    fn no_nul(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(1u8..=255, 0..max)
    }

    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..max)
    }

    proptest! {
        #[test]
        fn handshake_response_round_trips(
            caps in arb_caps(),
            max_packet in any::<u32>(),
            charset in any::<u8>(),
            filler in any::<[u8; 23]>(),
            user in no_nul(40),
            auth_any in bytes(300),
            auth_no_nul in no_nul(40),
            db in no_nul(40),
            plugin in no_nul(40),
            attrs in bytes(300),
            trailing in bytes(4),
        ) {
            let auth = if caps.contains(Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA) {
                &auth_any[..]
            } else if caps.contains(Capabilities::SECURE_CONNECTION) {
                &auth_any[..auth_any.len().min(255)]
            } else {
                &auth_no_nul[..]
            };
            let with_attrs = caps.contains(Capabilities::CONNECT_ATTRS);
            // Trailing bytes are only unambiguous after a length-prefixed last field.
            let trailing: &[u8] = if with_attrs { &trailing } else { &[] };
            let r = HandshakeResponse {
                capabilities: caps,
                max_packet,
                charset,
                filler,
                username: &user,
                auth_response: auth,
                database: caps.contains(Capabilities::CONNECT_WITH_DB).then_some(&db[..]),
                auth_plugin: caps.contains(Capabilities::PLUGIN_AUTH).then_some(&plugin[..]),
                attributes: with_attrs.then_some(&attrs[..]),
                trailing,
            };
            let mut out = Vec::new();
            r.write(&mut out).unwrap();
            if caps.contains(Capabilities::SSL) && out.len() == SSL_REQUEST_LEN {
                // Indistinguishable from an SSLRequest, and treated as one.
                prop_assert!(matches!(ClientLogin::parse(&out), Ok(ClientLogin::SslRequest(_))));
            } else {
                prop_assert_eq!(ClientLogin::parse(&out), Ok(ClientLogin::Response(r)));
            }
            prop_assert_eq!(HandshakeResponse::parse(&out), Ok(r));
        }

        #[test]
        fn greeting_round_trips(
            version in no_nul(40),
            connection_id in any::<u32>(),
            auth_data_1 in any::<[u8; 8]>(),
            caps in any::<u32>(),
            charset in any::<u8>(),
            status in any::<u16>(),
            auth_data_len in any::<u8>(),
            reserved in any::<[u8; 10]>(),
            part2 in proptest::collection::vec(any::<u8>(), 300),
            plugin in no_nul(30),
        ) {
            let caps = Capabilities(caps);
            let n2 = usize::from(auth_data_len).saturating_sub(8).max(13);
            let g = Greeting {
                server_version: &version,
                connection_id,
                auth_data_1,
                filler: 0,
                capabilities: caps,
                charset,
                status,
                auth_data_len,
                reserved,
                auth_data_2: if caps.contains(Capabilities::SECURE_CONNECTION) { &part2[..n2] } else { &[] },
                auth_plugin: caps.contains(Capabilities::PLUGIN_AUTH).then_some(&plugin[..]),
            };
            let mut out = Vec::new();
            g.write(&mut out).unwrap();
            prop_assert_eq!(Greeting::parse(&out), Ok(g));
        }

        #[test]
        fn parsers_never_panic(payload in bytes(400), caps in any::<u32>()) {
            let _ = Greeting::parse(&payload).map(|g| (g.nonce(), g.mariadb_capabilities()));
            let _ = ClientLogin::parse(&payload).map(|l| l.not_mirrorable());
            if let Ok(r) = HandshakeResponse::parse(&payload) {
                let _ = r.attributes().count();
                let _ = format!("{r:?}");
            }
            let _ = AuthSwitchRequest::parse(&payload);
            let _ = AuthMoreData::parse(&payload).map(|m| m.fast_auth_result());
            let _ = OkPacket::parse(&payload, Capabilities(caps)).map(|o| o.tracked_schema());
            let _ = ErrPacket::parse(&payload);
            let _ = EofPacket::parse(&payload);
            let _ = ServerReply::classify(&payload, ReplyPhase::Auth);
            let _ = ServerReply::classify(&payload, ReplyPhase::Command);
        }

        #[test]
        fn parsers_never_panic_on_mutated_real_logins(
            idx in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()
        ) {
            for fx in [fixtures::SB_RESPONSE, fixtures::CLI_RESPONSE, fixtures::CLI_GREETING] {
                let mut p = hex(fx);
                let i = idx % p.len();
                p[i] = byte;
                p.truncate(cut % (p.len() + 1));
                let _ = ClientLogin::parse(&p);
                let _ = Greeting::parse(&p);
            }
        }
    }
}
