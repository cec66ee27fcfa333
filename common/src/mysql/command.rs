//! Client commands (the command phase): the first payload byte names the command, the rest are
//! its fields. Parsing borrows from the payload; the statement id of the prepared-statement
//! commands can be read and rewritten in place.

use std::fmt;

use super::codec::{write_lenenc_bytes, write_nul_str, ProtocolError, Reader};
use super::handshake::{read_auth_response, write_auth_response, Capabilities, Redacted};

/// Command bytes.
pub mod com {
    pub const SLEEP: u8 = 0x00;
    pub const QUIT: u8 = 0x01;
    pub const INIT_DB: u8 = 0x02;
    pub const QUERY: u8 = 0x03;
    pub const FIELD_LIST: u8 = 0x04;
    pub const STATISTICS: u8 = 0x09;
    pub const PROCESS_KILL: u8 = 0x0c;
    pub const PING: u8 = 0x0e;
    pub const CHANGE_USER: u8 = 0x11;
    pub const BINLOG_DUMP: u8 = 0x12;
    pub const STMT_PREPARE: u8 = 0x16;
    pub const STMT_EXECUTE: u8 = 0x17;
    pub const STMT_SEND_LONG_DATA: u8 = 0x18;
    pub const STMT_CLOSE: u8 = 0x19;
    pub const STMT_RESET: u8 = 0x1a;
    pub const SET_OPTION: u8 = 0x1b;
    pub const STMT_FETCH: u8 = 0x1c;
    pub const RESET_CONNECTION: u8 = 0x1f;
    /// MariaDB: execute a prepared statement over an array of parameter sets.
    pub const STMT_BULK_EXECUTE: u8 = 0xfa;
    /// MariaDB: several commands in one packet (only when the server offers COM_MULTI).
    pub const MULTI: u8 = 0xfe;
}

/// Whether commands with this first byte carry a statement id in payload bytes 1..5.
pub fn carries_statement_id(code: u8) -> bool {
    matches!(
        code,
        com::STMT_EXECUTE
            | com::STMT_SEND_LONG_DATA
            | com::STMT_CLOSE
            | com::STMT_RESET
            | com::STMT_FETCH
            | com::STMT_BULK_EXECUTE
    )
}

/// The statement id of a command payload (or its first 5 bytes, as a [`super::packet::FrameScanner`]
/// prefix gives them); `None` for commands without one or a payload too short to hold it.
pub fn statement_id(payload: &[u8]) -> Option<u32> {
    match payload {
        [code, a, b, c, d, ..] if carries_statement_id(*code) => {
            Some(u32::from_le_bytes([*a, *b, *c, *d]))
        }
        _ => None,
    }
}

/// Rewrites the statement id of a command payload in place (its length does not change).
pub fn set_statement_id(payload: &mut [u8], id: u32) -> Result<(), ProtocolError> {
    match payload {
        [code, ..] if !carries_statement_id(*code) => Err(ProtocolError::UnexpectedByte {
            what: "command without statement id",
            byte: *code,
        }),
        [_, id_bytes @ ..] if id_bytes.len() >= 4 => {
            id_bytes[..4].copy_from_slice(&id.to_le_bytes());
            Ok(())
        }
        _ => Err(ProtocolError::Truncated("statement id")),
    }
}

/// A parsed client command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    Quit,
    InitDb {
        schema: &'a [u8],
    },
    Query {
        sql: &'a [u8],
    },
    FieldList {
        table: &'a [u8],
        wildcard: &'a [u8],
    },
    Ping,
    ChangeUser(ChangeUser<'a>),
    StmtPrepare {
        sql: &'a [u8],
    },
    StmtExecute(StmtExecute<'a>),
    StmtSendLongData {
        statement_id: u32,
        param_id: u16,
        data: &'a [u8],
    },
    StmtClose {
        statement_id: u32,
    },
    StmtReset {
        statement_id: u32,
    },
    StmtFetch {
        statement_id: u32,
        rows: u32,
    },
    /// MariaDB COM_STMT_BULK_EXECUTE; the rest is kept raw.
    StmtBulkExecute {
        statement_id: u32,
        body: &'a [u8],
    },
    ResetConnection,
    SetOption {
        option: u16,
    },
    /// Any other command, kept raw.
    Other {
        code: u8,
        body: &'a [u8],
    },
}

/// COM_STMT_EXECUTE's fixed head; the parameter block needs the statement's parameter count to be
/// read and is kept raw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StmtExecute<'a> {
    pub statement_id: u32,
    /// Cursor type and flags.
    pub flags: u8,
    /// Always 1 from real clients.
    pub iterations: u32,
    /// NULL bitmap, new-params-bound flag, types and values.
    pub params: &'a [u8],
}

impl<'a> Command<'a> {
    /// `caps` are the session's negotiated capabilities (COM_CHANGE_USER's layout depends on them;
    /// with QUERY_ATTRIBUTES a COM_QUERY starts with a parameter block).
    pub fn parse(payload: &'a [u8], caps: Capabilities) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "command");
        let code = r.u8()?;
        Ok(match code {
            com::QUIT => Self::Quit,
            com::INIT_DB => Self::InitDb { schema: r.rest() },
            com::QUERY => Self::Query {
                sql: query_text(&mut r, caps)?,
            },
            com::FIELD_LIST => {
                let mut r = Reader::new(&payload[1..], "COM_FIELD_LIST");
                Self::FieldList {
                    table: r.nul_str()?,
                    wildcard: r.rest(),
                }
            }
            com::PING => Self::Ping,
            com::CHANGE_USER => Self::ChangeUser(ChangeUser::parse(payload, caps)?),
            com::STMT_PREPARE => Self::StmtPrepare { sql: r.rest() },
            com::STMT_EXECUTE => {
                let mut r = Reader::new(&payload[1..], "COM_STMT_EXECUTE");
                Self::StmtExecute(StmtExecute {
                    statement_id: r.u32()?,
                    flags: r.u8()?,
                    iterations: r.u32()?,
                    params: r.rest(),
                })
            }
            com::STMT_SEND_LONG_DATA => {
                let mut r = Reader::new(&payload[1..], "COM_STMT_SEND_LONG_DATA");
                Self::StmtSendLongData {
                    statement_id: r.u32()?,
                    param_id: r.u16()?,
                    data: r.rest(),
                }
            }
            com::STMT_CLOSE => Self::StmtClose {
                statement_id: stmt_id(&mut r)?,
            },
            com::STMT_RESET => Self::StmtReset {
                statement_id: stmt_id(&mut r)?,
            },
            com::STMT_FETCH => {
                let mut r = Reader::new(&payload[1..], "COM_STMT_FETCH");
                Self::StmtFetch {
                    statement_id: r.u32()?,
                    rows: r.u32()?,
                }
            }
            com::STMT_BULK_EXECUTE => Self::StmtBulkExecute {
                statement_id: stmt_id(&mut r)?,
                body: r.rest(),
            },
            com::RESET_CONNECTION => Self::ResetConnection,
            com::SET_OPTION => {
                let mut r = Reader::new(&payload[1..], "COM_SET_OPTION");
                Self::SetOption { option: r.u16()? }
            }
            _ => Self::Other {
                code,
                body: r.rest(),
            },
        })
    }

    pub fn code(&self) -> u8 {
        match self {
            Self::Quit => com::QUIT,
            Self::InitDb { .. } => com::INIT_DB,
            Self::Query { .. } => com::QUERY,
            Self::FieldList { .. } => com::FIELD_LIST,
            Self::Ping => com::PING,
            Self::ChangeUser(_) => com::CHANGE_USER,
            Self::StmtPrepare { .. } => com::STMT_PREPARE,
            Self::StmtExecute(_) => com::STMT_EXECUTE,
            Self::StmtSendLongData { .. } => com::STMT_SEND_LONG_DATA,
            Self::StmtClose { .. } => com::STMT_CLOSE,
            Self::StmtReset { .. } => com::STMT_RESET,
            Self::StmtFetch { .. } => com::STMT_FETCH,
            Self::StmtBulkExecute { .. } => com::STMT_BULK_EXECUTE,
            Self::ResetConnection => com::RESET_CONNECTION,
            Self::SetOption { .. } => com::SET_OPTION,
            Self::Other { code, .. } => *code,
        }
    }

    pub fn statement_id(&self) -> Option<u32> {
        match *self {
            Self::StmtExecute(StmtExecute { statement_id, .. })
            | Self::StmtSendLongData { statement_id, .. }
            | Self::StmtClose { statement_id }
            | Self::StmtReset { statement_id }
            | Self::StmtFetch { statement_id, .. }
            | Self::StmtBulkExecute { statement_id, .. } => Some(statement_id),
            _ => None,
        }
    }

    /// Whether the server answers this command. COM_QUIT, COM_STMT_CLOSE and
    /// COM_STMT_SEND_LONG_DATA get no reply, which matters when pairing replies with commands.
    pub fn expects_reply(&self) -> bool {
        !matches!(
            self,
            Self::Quit | Self::StmtClose { .. } | Self::StmtSendLongData { .. }
        )
    }

    /// Whether the command drops every prepared statement of the session (on success).
    pub fn drops_statements(&self) -> bool {
        matches!(self, Self::ChangeUser(_) | Self::ResetConnection)
    }
}

fn stmt_id(r: &mut Reader<'_>) -> Result<u32, ProtocolError> {
    r.u32()
}

fn query_text<'a>(r: &mut Reader<'a>, caps: Capabilities) -> Result<&'a [u8], ProtocolError> {
    if !caps.contains(Capabilities::QUERY_ATTRIBUTES) {
        return Ok(r.rest());
    }
    // MySQL 8 query attributes: parameter count, parameter-set count, then (for a non-zero count)
    // binary values whose sizes depend on their types. Only the attribute-free form is read.
    let count = r.lenenc_int()?;
    let _sets = r.lenenc_int()?;
    if count != 0 {
        return Err(ProtocolError::Unsupported(
            "COM_QUERY with query attributes",
        ));
    }
    Ok(r.rest())
}

/// COM_CHANGE_USER: log in again as another user on the same connection.
///
/// The trailing fields are optional on the wire (older clients stop after the schema), so each is
/// an `Option` and `write` emits them in order up to the first absent one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ChangeUser<'a> {
    pub user: &'a [u8],
    /// Secret material: redacted in Debug output.
    pub auth_response: &'a [u8],
    pub database: &'a [u8],
    pub charset: Option<u16>,
    pub auth_plugin: Option<&'a [u8]>,
    /// Connection attributes' key/value area, without its total-length prefix.
    pub attributes: Option<&'a [u8]>,
}

impl<'a> ChangeUser<'a> {
    /// `caps` are the session's negotiated capabilities, as for the login. The auth response
    /// follows the login's length rules; for responses under 251 bytes (every plugin we support)
    /// MariaDB's 1-byte length and a length-encoded one are the same bytes.
    pub fn parse(payload: &'a [u8], caps: Capabilities) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "COM_CHANGE_USER");
        let code = r.u8()?;
        if code != com::CHANGE_USER {
            return Err(ProtocolError::UnexpectedByte {
                what: "COM_CHANGE_USER",
                byte: code,
            });
        }
        let user = r.nul_str()?;
        let auth_response = read_auth_response(&mut r, caps)?;
        let database = r.nul_str()?;
        let mut cu = Self {
            user,
            auth_response,
            database,
            charset: None,
            auth_plugin: None,
            attributes: None,
        };
        if r.remaining() < 2 {
            return Ok(cu);
        }
        cu.charset = Some(r.u16()?);
        if caps.contains(Capabilities::PLUGIN_AUTH) {
            if r.is_empty() {
                return Ok(cu);
            }
            cu.auth_plugin = Some(r.nul_str()?);
        }
        if caps.contains(Capabilities::CONNECT_ATTRS) && !r.is_empty() {
            cu.attributes = Some(r.lenenc_bytes()?);
        }
        Ok(cu)
    }

    pub fn write(&self, caps: Capabilities, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        // Fields are positional: a later one cannot be sent without the earlier ones.
        let plugin_ok = self.auth_plugin.is_none()
            || (self.charset.is_some() && caps.contains(Capabilities::PLUGIN_AUTH));
        let attrs_ok = self.attributes.is_none()
            || (self.charset.is_some()
                && caps.contains(Capabilities::CONNECT_ATTRS)
                && (self.auth_plugin.is_some() || !caps.contains(Capabilities::PLUGIN_AUTH)));
        if !plugin_ok || !attrs_ok {
            return Err(ProtocolError::Unencodable(
                "COM_CHANGE_USER optional fields",
            ));
        }
        out.push(com::CHANGE_USER);
        write_nul_str(self.user, "COM_CHANGE_USER user", out)?;
        write_auth_response(
            self.auth_response,
            caps,
            "COM_CHANGE_USER auth response",
            out,
        )?;
        write_nul_str(self.database, "COM_CHANGE_USER database", out)?;
        if let Some(cs) = self.charset {
            out.extend_from_slice(&cs.to_le_bytes());
        }
        if let Some(p) = self.auth_plugin {
            write_nul_str(p, "COM_CHANGE_USER auth plugin", out)?;
        }
        if let Some(a) = self.attributes {
            write_lenenc_bytes(a, out);
        }
        Ok(())
    }
}

impl fmt::Debug for ChangeUser<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeUser")
            .field("user", &String::from_utf8_lossy(self.user))
            .field("auth_response", &Redacted(self.auth_response.len()))
            .field("database", &String::from_utf8_lossy(self.database))
            .field("charset", &self.charset)
            .field(
                "auth_plugin",
                &self.auth_plugin.map(String::from_utf8_lossy),
            )
            .field("attributes_len", &self.attributes.map(<[u8]>::len))
            .finish()
    }
}

/// The server's answer to a successful COM_STMT_PREPARE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrepareOk {
    pub statement_id: u32,
    pub num_columns: u16,
    pub num_params: u16,
    pub warnings: u16,
}

impl PrepareOk {
    pub const LEN: usize = 12;

    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "PREPARE_OK");
        let h = r.u8()?;
        if h != 0x00 {
            return Err(ProtocolError::UnexpectedByte {
                what: "PREPARE_OK",
                byte: h,
            });
        }
        let statement_id = r.u32()?;
        let num_columns = r.u16()?;
        let num_params = r.u16()?;
        let _reserved = r.u8()?;
        // Servers before 4.1.? stop before the warning count.
        let warnings = if r.remaining() >= 2 { r.u16()? } else { 0 };
        Ok(Self {
            statement_id,
            num_columns,
            num_params,
            warnings,
        })
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(0x00);
        out.extend_from_slice(&self.statement_id.to_le_bytes());
        out.extend_from_slice(&self.num_columns.to_le_bytes());
        out.extend_from_slice(&self.num_params.to_le_bytes());
        out.push(0);
        out.extend_from_slice(&self.warnings.to_le_bytes());
    }

    /// Packets the server sends after this one for the same prepare: a definition per parameter
    /// and per column, each group closed by an EOF unless CLIENT_DEPRECATE_EOF was negotiated.
    pub fn following_packets(&self, caps: Capabilities) -> u32 {
        let eof = u32::from(!caps.contains(Capabilities::DEPRECATE_EOF));
        let group = |n: u16| if n == 0 { 0 } else { u32::from(n) + eof };
        group(self.num_params) + group(self.num_columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::fixtures::{self, hex};
    use crate::mysql::handshake::tests::arb_caps;
    use crate::mysql::handshake::HandshakeResponse;
    use proptest::prelude::*;

    fn session_caps() -> Capabilities {
        let login = hex(fixtures::CAPI_RESPONSE);
        HandshakeResponse::parse(&login).unwrap().capabilities
    }

    #[test]
    fn parses_real_commands() {
        let caps = session_caps();
        let q = hex(fixtures::CLI_QUERY);
        assert_eq!(
            Command::parse(&q, caps),
            Ok(Command::Query { sql: b"SELECT 1" })
        );
        let q = hex(fixtures::CLI_INIT_DB);
        assert_eq!(
            Command::parse(&q, caps),
            Ok(Command::InitDb { schema: b"mysql" })
        );
        assert_eq!(
            Command::parse(&hex(fixtures::CLI_QUIT), caps),
            Ok(Command::Quit)
        );
        let r = hex(fixtures::CAPI_RESET_CONNECTION);
        let r = Command::parse(&r, caps).unwrap();
        assert_eq!(r, Command::ResetConnection);
        assert!(r.drops_statements());

        let p = hex(fixtures::SB_PREPARE);
        assert_eq!(
            Command::parse(&p, caps),
            Ok(Command::StmtPrepare {
                sql: b"SELECT c FROM sbtest1 WHERE id=?"
            })
        );

        let e = hex(fixtures::SB_EXECUTE_PARAMS);
        let Ok(Command::StmtExecute(x)) = Command::parse(&e, caps) else {
            panic!("not an execute");
        };
        assert_eq!((x.statement_id, x.flags, x.iterations), (1, 0, 1));
        assert_eq!(x.params, &hex("000108003300000000000000")[..]);
        let e = hex(fixtures::SB_EXECUTE_NO_PARAMS);
        let cmd = Command::parse(&e, caps).unwrap();
        assert_eq!(cmd.statement_id(), Some(2));
        assert_eq!(statement_id(&e[..5]), Some(2));
    }

    #[test]
    fn rewrites_statement_ids_in_place() {
        let mut e = hex(fixtures::SB_EXECUTE_PARAMS);
        let before = e.clone();
        set_statement_id(&mut e, 0x0102_0304).unwrap();
        assert_eq!(&e[1..5], &[4, 3, 2, 1]);
        assert_eq!(&e[5..], &before[5..]);
        assert_eq!(statement_id(&e), Some(0x0102_0304));

        for code in [
            com::STMT_SEND_LONG_DATA,
            com::STMT_CLOSE,
            com::STMT_RESET,
            com::STMT_FETCH,
            com::STMT_BULK_EXECUTE,
        ] {
            let mut p = vec![code, 9, 0, 0, 0, 0, 0, 0, 0];
            set_statement_id(&mut p, 77).unwrap();
            let cmd = Command::parse(&p, Capabilities::default()).unwrap();
            assert_eq!(cmd.statement_id(), Some(77), "{code:#x}");
        }
        let mut q = hex(fixtures::CLI_QUERY);
        assert!(set_statement_id(&mut q, 1).is_err());
        assert_eq!(statement_id(&q), None);
        assert_eq!(
            set_statement_id(&mut [com::STMT_CLOSE, 1, 2], 1),
            Err(ProtocolError::Truncated("statement id"))
        );
        assert!(set_statement_id(&mut [], 1).is_err());
    }

    #[test]
    fn real_change_user_parses_and_re_emits_exactly() {
        let caps = session_caps();
        for (fx, user, db, auth_len) in [
            (fixtures::CAPI_CHANGE_USER, &b"other"[..], &b"mysql"[..], 20),
            (fixtures::CAPI_CHANGE_USER_NOPW, b"nopw", b"", 0),
        ] {
            let p = hex(fx);
            let Ok(Command::ChangeUser(cu)) = Command::parse(&p, caps) else {
                panic!("not a change user");
            };
            assert_eq!((cu.user, cu.database), (user, db));
            assert_eq!(cu.auth_response.len(), auth_len);
            assert_eq!(cu.charset, Some(45));
            assert_eq!(cu.auth_plugin, Some(&b"mysql_native_password"[..]));
            assert!(cu.attributes.is_some());
            let mut out = Vec::new();
            cu.write(caps, &mut out).unwrap();
            assert_eq!(out, p);
            let dbg = format!("{cu:?}");
            assert!(
                dbg.contains(&format!("<{auth_len} bytes redacted>")),
                "{dbg}"
            );
        }
    }

    #[test]
    fn prepare_ok_and_what_follows_it() {
        let ok = PrepareOk::parse(&hex(fixtures::SB_PREPARE_OK_1)).unwrap();
        assert_eq!(
            ok,
            PrepareOk {
                statement_id: 1,
                num_columns: 1,
                num_params: 1,
                warnings: 0
            }
        );
        let caps = session_caps();
        // Captured: param def, EOF, column def, EOF.
        assert_eq!(ok.following_packets(caps), 4);
        assert_eq!(ok.following_packets(caps | Capabilities::DEPRECATE_EOF), 2);
        let ok2 = PrepareOk::parse(&hex(fixtures::SB_PREPARE_OK_2)).unwrap();
        assert_eq!((ok2.statement_id, ok2.following_packets(caps)), (2, 0));
        let ok4 = PrepareOk::parse(&hex(fixtures::SB_PREPARE_OK_4)).unwrap();
        assert_eq!(
            (
                ok4.statement_id,
                ok4.num_params,
                ok4.following_packets(caps)
            ),
            (4, 2, 5)
        );
        let mut out = Vec::new();
        ok4.write(&mut out);
        assert_eq!(out, hex(fixtures::SB_PREPARE_OK_4));
        assert!(PrepareOk::parse(&hex(fixtures::WRONG_PW_ERR)).is_err());
    }

    #[test]
    fn query_attributes_prefix() {
        let caps = Capabilities::PROTOCOL_41 | Capabilities::QUERY_ATTRIBUTES;
        assert_eq!(
            Command::parse(b"\x03\x00\x01SELECT 1", caps),
            Ok(Command::Query { sql: b"SELECT 1" })
        );
        assert!(Command::parse(b"\x03\x01\x01\x00\x01", caps).is_err());
    }

    #[test]
    fn replyless_commands() {
        let caps = Capabilities::default();
        for p in [
            &[com::QUIT][..],
            &[com::STMT_CLOSE, 1, 0, 0, 0],
            &[com::STMT_SEND_LONG_DATA, 1, 0, 0, 0, 0, 0],
        ] {
            assert!(!Command::parse(p, caps).unwrap().expects_reply());
        }
        assert!(Command::parse(&[com::PING], caps).unwrap().expects_reply());
    }

    fn no_nul(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(1u8..=255, 0..max)
    }

    proptest! {
        #[test]
        fn change_user_round_trips(
            caps in arb_caps(),
            user in no_nul(30),
            auth_any in proptest::collection::vec(any::<u8>(), 0..300),
            auth_no_nul in no_nul(30),
            db in no_nul(30),
            charset in proptest::option::of(any::<u16>()),
            plugin in proptest::option::of(no_nul(30)),
            attrs in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        ) {
            let auth = if caps.contains(Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA) {
                &auth_any[..]
            } else if caps.contains(Capabilities::SECURE_CONNECTION) {
                &auth_any[..auth_any.len().min(255)]
            } else {
                &auth_no_nul[..]
            };
            let plugin_on = caps.contains(Capabilities::PLUGIN_AUTH);
            let auth_plugin = plugin.as_deref().filter(|_| charset.is_some() && plugin_on);
            let attributes = attrs.as_deref().filter(|_| {
                charset.is_some()
                    && caps.contains(Capabilities::CONNECT_ATTRS)
                    && (auth_plugin.is_some() || !plugin_on)
            });
            let cu = ChangeUser {
                user: &user,
                auth_response: auth,
                database: &db,
                charset,
                auth_plugin,
                attributes,
            };
            let mut out = Vec::new();
            cu.write(caps, &mut out).unwrap();
            prop_assert_eq!(Command::parse(&out, caps), Ok(Command::ChangeUser(cu)));
        }

        #[test]
        fn command_parsers_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..200),
            caps in any::<u32>(),
            id in any::<u32>(),
        ) {
            let caps = Capabilities(caps);
            if let Ok(c) = Command::parse(&payload, caps) {
                let _ = (c.code(), c.statement_id(), c.expects_reply(), format!("{c:?}"));
            }
            let _ = ChangeUser::parse(&payload, caps);
            let _ = PrepareOk::parse(&payload).map(|p| p.following_packets(caps));
            let _ = statement_id(&payload);
            let mut p = payload.clone();
            if set_statement_id(&mut p, id).is_ok() {
                prop_assert_eq!(statement_id(&p), Some(id));
                prop_assert_eq!(&p[5..], &payload[5..]);
            } else {
                prop_assert_eq!(p, payload);
            }
        }

        #[test]
        fn command_code_matches_first_byte(payload in proptest::collection::vec(any::<u8>(), 1..40)) {
            if let Ok(c) = Command::parse(&payload, Capabilities::default()) {
                prop_assert_eq!(c.code(), payload[0]);
            }
        }
    }
}
