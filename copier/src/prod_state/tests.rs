use super::client::*;
use super::dsn::*;
use super::error::*;
use super::queries::*;
use super::read::*;
use super::snapshot::*;
use super::worker::*;
use super::*;
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mysql::auth::{Nonce, Password};
use common::mysql::handshake::{Capabilities, Greeting, HandshakeResponse};
use common::mysql::packet::{write_packet, PacketHeader, HEADER_LEN};

use common::mysql::auth::native_password;
use common::mysql::write_lenenc_bytes;
use proptest::prelude::*;

// ------------------------------------------------------------------------------------ DSN

#[test]
fn dsn_with_port_and_default_port() {
    let d = ProdDsn::parse("mysql://tsd_ro:tsd_ro@198.18.0.2:3307").unwrap();
    assert_eq!(
        (d.user.as_str(), d.host.as_str(), d.port),
        ("tsd_ro", "198.18.0.2", 3307)
    );
    assert_eq!(d.password.as_bytes(), b"tsd_ro");
    let d = ProdDsn::parse("mysql://u:p@db.example/").unwrap();
    assert_eq!((d.host.as_str(), d.port), ("db.example", 3306));
}

#[test]
fn dsn_percent_decoding_and_at_in_password() {
    let d = ProdDsn::parse("mysql://r%40o:p%3Aa%25ss@h:1").unwrap();
    assert_eq!(d.user, "r@o");
    assert_eq!(d.password.as_bytes(), b"p:a%ss");
    // An unencoded '@' in the password still works: the last '@' ends the user info.
    let d = ProdDsn::parse("mysql://u:p@ss@h").unwrap();
    assert_eq!(d.password.as_bytes(), b"p@ss");
    // No password at all.
    let d = ProdDsn::parse("mysql://u@h").unwrap();
    assert_eq!(d.password.as_bytes(), b"");
}

#[test]
fn dsn_errors_are_clear() {
    let e = |s: &str| ProdDsn::parse(s).unwrap_err();
    assert_eq!(e("postgres://u:p@h"), DsnError::Scheme);
    assert_eq!(e("mysql://h:3306"), DsnError::NoUser);
    assert_eq!(e("mysql://:p@h"), DsnError::EmptyUser);
    assert_eq!(e("mysql://u:p%zz@h"), DsnError::BadPercent("password"));
    assert_eq!(e("mysql://u:p%2@h"), DsnError::BadPercent("password"));
    assert_eq!(e("mysql://u:p@h:0"), DsnError::BadPort);
    assert_eq!(e("mysql://u:p@h:99999"), DsnError::BadPort);
    assert_eq!(e("mysql://u:p@:3306"), DsnError::EmptyHost);
    assert_eq!(e("mysql://u:p@[::1]:3306"), DsnError::Ipv6);
    assert_eq!(e("mysql://u:p@h:3306/db?x=1"), DsnError::Trailing);
}

#[test]
fn dsn_never_shows_the_password() {
    let d = ProdDsn::parse("mysql://tsd_ro:s3cr3t-pw@h:3306").unwrap();
    for text in [format!("{d:?}"), format!("{d}")] {
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("tsd_ro") && text.contains("h:3306"), "{text}");
    }
    // A forgotten user name turns the password into the "port".
    let bad = ProdDsn::parse("mysql://u@h:s3cr3t").unwrap_err();
    for text in [format!("{bad:?}"), bad.to_string()] {
        assert!(!text.contains("s3cr3t"), "{text}");
    }
    assert!(bad.to_string().contains("port"), "{bad}");
    let bad = DsnArg::parse_arg("mysql://u:s3cr3t%zz@h").unwrap();
    let text = format!("{bad:?}");
    assert!(
        !text.contains("s3cr3t") && text.contains("percent"),
        "{text}"
    );
}

// ------------------------------------------------------------------------------------ client

/// A server made of scripted bytes; what the client writes is kept.
struct Scripted {
    input: io::Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Scripted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Scripted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const NONCE: [u8; 20] = *b"abcdefghijklmnopqrst";

fn greeting(plugin: &[u8]) -> Vec<u8> {
    let mut part2 = NONCE[8..].to_vec();
    part2.push(0);
    let g = Greeting {
        server_version: b"10.11.6-MariaDB",
        connection_id: 7,
        auth_data_1: NONCE[..8].try_into().unwrap(),
        filler: 0,
        capabilities: Capabilities::MYSQL
            | Capabilities::PROTOCOL_41
            | Capabilities::SECURE_CONNECTION
            | Capabilities::PLUGIN_AUTH,
        charset: 45,
        status: 2,
        auth_data_len: 21,
        reserved: [0; 10],
        auth_data_2: &part2,
        auth_plugin: Some(plugin),
    };
    let mut p = Vec::new();
    g.write(&mut p).unwrap();
    p
}

const OK: &[u8] = &[0, 0, 0, 2, 0, 0, 0];
const EOF: &[u8] = &[0xfe, 0, 0, 2, 0];

fn frame(seq: u8, payload: &[u8], out: &mut Vec<u8>) {
    write_packet(seq, payload, out);
}

fn err(code: u16, msg: &str) -> Vec<u8> {
    let mut p = vec![0xff];
    p.extend_from_slice(&code.to_le_bytes());
    p.extend_from_slice(b"#28000");
    p.extend_from_slice(msg.as_bytes());
    p
}

/// A text result set: column count, definitions, EOF, rows, EOF.
fn result_set(columns: usize, rows: &[Vec<Option<&[u8]>>], out: &mut Vec<u8>) {
    let mut seq = 1;
    let mut next = |p: &[u8], out: &mut Vec<u8>| {
        frame(seq, p, out);
        seq += 1;
    };
    next(&[columns as u8], out);
    for _ in 0..columns {
        next(b"\x03def\x00\x00\x00\x01c\x00\x0c\x21\x00", out);
    }
    next(EOF, out);
    for row in rows {
        let mut p = Vec::new();
        for v in row {
            match v {
                Some(v) => write_lenenc_bytes(v, &mut p),
                None => p.push(0xfb),
            }
        }
        next(&p, out);
    }
    next(EOF, out);
}

fn server(script: Vec<u8>) -> Scripted {
    Scripted {
        input: io::Cursor::new(script),
        output: Vec::new(),
    }
}

/// The packets the client wrote, as (seq, payload).
fn written(out: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut v = Vec::new();
    let mut at = 0;
    while let Some(h) = PacketHeader::parse(&out[at..]) {
        let end = at + HEADER_LEN + h.len as usize;
        v.push((h.seq, out[at + HEADER_LEN..end].to_vec()));
        at = end;
    }
    v
}

#[test]
fn native_login_then_query_with_nulls() {
    let mut script = Vec::new();
    frame(0, &greeting(b"mysql_native_password"), &mut script);
    frame(2, OK, &mut script);
    result_set(
        4,
        &[
            vec![
                Some(b"12"),
                Some(b"sbtest"),
                Some(b"198.18.0.10:40000"),
                Some(b"sbtest"),
            ],
            vec![Some(b"13"), Some(b"app"), Some(b"198.18.0.10:40001"), None],
        ],
        &mut script,
    );
    let pw = Password::new(b"secret".to_vec());
    let mut c = MysqlClient::login(server(script), "tsd_ro", &pw).unwrap();
    let rows = c.query("SELECT 1").unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][1].as_deref(), Some(&b"sbtest"[..]));
    assert_eq!(rows[1][3], None);

    let sent = written(&c.stream.output);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].0, 1, "the login answers the greeting");
    let login = HandshakeResponse::parse(&sent[0].1).unwrap();
    assert_eq!(login.username, b"tsd_ro");
    assert_eq!(login.auth_plugin, Some(&b"mysql_native_password"[..]));
    assert_eq!(
        login.auth_response,
        native_password(b"secret", &Nonce(NONCE)).as_bytes()
    );
    assert_eq!(sent[1], (0, b"\x03SELECT 1".to_vec()));
}

#[test]
fn auth_switch_is_answered_with_the_new_nonce() {
    let new_nonce = *b"ABCDEFGHIJKLMNOPQRST";
    let mut switch = vec![0xfe];
    switch.extend_from_slice(b"mysql_native_password\0");
    switch.extend_from_slice(&new_nonce);
    switch.push(0);
    let mut script = Vec::new();
    frame(0, &greeting(b"client_ed25519"), &mut script);
    frame(2, &switch, &mut script);
    frame(4, OK, &mut script);
    let pw = Password::new(b"pw".to_vec());
    let c = MysqlClient::login(server(script), "u", &pw).unwrap();
    let sent = written(&c.stream.output);
    assert_eq!(sent[1].0, 3);
    assert_eq!(
        sent[1].1,
        native_password(b"pw", &Nonce(new_nonce)).as_bytes()
    );
}

#[test]
fn caching_sha2_fast_auth_and_full_auth_refused() {
    let mut script = Vec::new();
    frame(0, &greeting(b"caching_sha2_password"), &mut script);
    frame(2, &[0x01, 0x03], &mut script);
    frame(3, OK, &mut script);
    let pw = Password::new(b"pw".to_vec());
    assert!(MysqlClient::login(server(script), "u", &pw).is_ok());

    let mut script = Vec::new();
    frame(0, &greeting(b"caching_sha2_password"), &mut script);
    frame(2, &[0x01, 0x04], &mut script);
    let e = MysqlClient::login(server(script), "u", &pw).err().unwrap();
    assert!(matches!(e, ProdError::Auth(_)), "{e}");
}

#[test]
fn access_denied_says_which_fix() {
    let mut script = Vec::new();
    frame(0, &greeting(b"mysql_native_password"), &mut script);
    frame(
        2,
        &err(1045, "Access denied for user 'tsd_ro'"),
        &mut script,
    );
    let e = MysqlClient::login(server(script), "tsd_ro", &Password::new(b"x".to_vec()))
        .err()
        .unwrap();
    assert!(matches!(e, ProdError::Server { code: 1045, .. }), "{e}");
    assert!(e.fix("tsd_ro").unwrap().contains("password"));
    let denied = ProdError::Server {
        code: 1142,
        message: String::new(),
    };
    assert!(denied
        .fix("tsd_ro")
        .unwrap()
        .contains("GRANT PROCESS, SELECT ON *.*"));
}

#[test]
fn query_errors_and_broken_result_sets() {
    let login = || {
        let mut s = Vec::new();
        frame(0, &greeting(b"mysql_native_password"), &mut s);
        frame(2, OK, &mut s);
        s
    };
    let run = |tail: Vec<u8>| {
        let mut s = login();
        s.extend_from_slice(&tail);
        let mut c = MysqlClient::login(server(s), "u", &Password::new(Vec::new())).unwrap();
        c.query("SELECT 1")
    };
    // ERR instead of a result set.
    let mut t = Vec::new();
    frame(1, &err(1142, "SELECT command denied"), &mut t);
    assert!(matches!(run(t), Err(ProdError::Server { code: 1142, .. })));
    // A statement without a result set.
    let mut t = Vec::new();
    frame(1, OK, &mut t);
    assert_eq!(run(t).unwrap(), Vec::<Row>::new());
    // A row with a byte too many, a row cut short, a stream that ends.
    for bad in [&b"\x01a\x01bX"[..], b"\x01a\x05b", b"\x01a"] {
        let mut t = Vec::new();
        frame(1, &[2], &mut t);
        frame(2, b"def", &mut t);
        frame(3, b"def", &mut t);
        frame(4, EOF, &mut t);
        frame(5, bad, &mut t);
        frame(6, EOF, &mut t);
        assert!(run(t).is_err(), "{bad:?}");
    }
    let mut t = Vec::new();
    frame(1, &[1], &mut t);
    assert!(matches!(run(t), Err(ProdError::Io(_))));
}

proptest! {
    /// Whatever production sends, the client returns an error or a value: it never panics.
    #[test]
    fn hostile_server_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut s = Vec::new();
        frame(0, &greeting(b"mysql_native_password"), &mut s);
        frame(2, OK, &mut s);
        s.extend_from_slice(&tail);
        let mut c = MysqlClient::login(server(s), "u", &Password::new(Vec::new())).unwrap();
        let _ = c.query("SELECT 1");
        let _ = MysqlClient::login(server(tail), "u", &Password::new(Vec::new()));
    }
}

// ------------------------------------------------------------------------------------ queries

fn req(client_port: u16, mirrored_port: u16) -> LookupRequest {
    LookupRequest {
        client: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), client_port),
        mirrored: SocketAddrV4::new(Ipv4Addr::new(198, 19, 0, 10), mirrored_port),
    }
}

#[test]
fn query_text_holds_only_formatted_addresses_and_numbers() {
    let q = processlist_query(&[req(40000, 1).client, req(40001, 2).client]);
    assert_eq!(
        q,
        "SELECT ID, USER, HOST, DB FROM information_schema.PROCESSLIST WHERE HOST IN \
         ('198.18.0.10:40000', '198.18.0.10:40001')"
    );
    let q = statements_query(&[12, 13]);
    assert!(
        q.ends_with("WHERE t.PROCESSLIST_ID IN (12, 13)") && !q.contains("ORDER BY"),
        "{q}"
    );
}

fn row(v: &[Option<&str>]) -> Row {
    v.iter().map(|s| s.map(|s| s.as_bytes().to_vec())).collect()
}

#[test]
fn processlist_and_statement_rows_become_states() {
    let batch = [req(40000, 1), req(40001, 2), req(40002, 3)];
    let rows = vec![
        row(&[
            Some("12"),
            Some("sbtest"),
            Some("198.18.0.10:40000"),
            Some("sbtest"),
        ]),
        row(&[Some("13"), Some("app"), Some("198.18.0.10:40001"), None]),
        row(&[Some("14"), Some("x"), Some("198.18.0.99:40002"), None]), // not ours
        row(&[Some("junk"), Some("x"), Some("198.18.0.10:40002"), None]), // bad id
        row(&[Some("15"), Some("x")]),                                  // short row
    ];
    let mut found = match_processlist(&batch, &rows);
    assert_eq!(found.len(), 2);
    let stmts = vec![
        row(&[
            Some("12"),
            Some("1"),
            Some("SELECT c FROM sbtest1 WHERE id=?"),
        ]),
        row(&[Some("12"), Some("2"), Some("SELECT 2")]),
        row(&[Some("13"), Some("1"), None]),
        row(&[Some("99"), Some("1"), Some("SELECT 3")]),
        row(&[Some("12"), Some("99999999999"), Some("SELECT 4")]),
    ];
    add_statements(&mut found, &stmts);
    let (_, a) = &found[&batch[0].client];
    assert_eq!(a.user, "sbtest");
    assert_eq!(a.db.as_deref(), Some("sbtest"));
    assert_eq!(
        a.statements,
        vec![
            (1, b"SELECT c FROM sbtest1 WHERE id=?".to_vec()),
            (2, b"SELECT 2".to_vec())
        ]
    );
    let (_, b) = &found[&batch[1].client];
    assert_eq!((b.user.as_str(), b.db.as_deref()), ("app", None));
    assert!(b.statements.is_empty());
}

fn set(kind: Variable, name: &str, value: Option<&[u8]>) -> Result<Option<String>, ()> {
    set_statement(kind, name.as_bytes(), value).map(|o| o.map(|v| String::from_utf8(v).unwrap()))
}

#[test]
fn session_variables_become_set_statements_of_our_names_only() {
    let s = |name: &str, v: &str| set(Variable::Session, name, Some(v.as_bytes()));
    assert_eq!(
        s("time_zone", "+08:00"),
        Ok(Some("SET SESSION time_zone = '+08:00'".into()))
    );
    assert_eq!(
        s("SQL_MODE", "STRICT_TRANS_TABLES,ANSI_QUOTES"),
        Ok(Some(
            "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,ANSI_QUOTES'".into()
        ))
    );
    assert_eq!(
        s("sql_mode", ""),
        Ok(Some("SET SESSION sql_mode = ''".into()))
    );
    assert_eq!(
        s("sql_select_limit", "100"),
        Ok(Some("SET SESSION sql_select_limit = 100".into()))
    );
    assert_eq!(
        s("transaction_isolation", "READ-COMMITTED"),
        Ok(Some(
            "SET SESSION transaction_isolation = 'READ-COMMITTED'".into()
        ))
    );
    // Not on our list, or a value that would need quoting: dropped, not escaped.
    assert_eq!(s("init_connect", "DROP TABLE t"), Err(()));
    assert_eq!(s("sql_mode", "x' OR '1"), Err(()));
    assert_eq!(s("time_zone", "a b"), Err(()));
    assert_eq!(set(Variable::Session, "time_zone", None), Err(()));
}

#[test]
fn user_variables_keep_their_bytes_as_hex_and_integers_as_numbers() {
    let u = |name: &str, v: &[u8]| set(Variable::User, name, Some(v));
    assert_eq!(u("n", b"42"), Ok(Some("SET @`n` = 42".into())));
    assert_eq!(u("neg", b"-7"), Ok(Some("SET @`neg` = -7".into())));
    assert_eq!(u("zero", b"0"), Ok(Some("SET @`zero` = 0".into())));
    // Leading zeros, decimals and huge numbers stay text, as the client may have meant them.
    assert_eq!(
        u("code", b"007"),
        Ok(Some(
            "SET @`code` = CONVERT(X'303037' USING utf8mb4)".into()
        ))
    );
    assert_eq!(
        u("f", b"1.5"),
        Ok(Some("SET @`f` = CONVERT(X'312E35' USING utf8mb4)".into()))
    );
    assert_eq!(
        u("big", b"12345678901234567890"),
        Ok(Some(
            "SET @`big` = CONVERT(X'3132333435363738393031323334353637383930' USING utf8mb4)"
                .into()
        ))
    );
    // A quote cannot end the literal: it is two hex digits.
    assert_eq!(
        u("tag", b"it's"),
        Ok(Some(
            "SET @`tag` = CONVERT(X'69742773' USING utf8mb4)".into()
        ))
    );
    assert_eq!(
        u("bin", &[0xff, 0]),
        Ok(Some("SET @`bin` = X'FF00'".into()))
    );
    assert_eq!(
        u("empty", b""),
        Ok(Some("SET @`empty` = CONVERT(X'' USING utf8mb4)".into()))
    );
    assert_eq!(u("a.b$c_1", b"1"), Ok(Some("SET @`a.b$c_1` = 1".into())));
    // NULL reads the same as unset: nothing to send.
    assert_eq!(set(Variable::User, "gone", None), Ok(None));
    // Names that would need quoting, and oversized values, are dropped.
    for bad in ["x`; DROP TABLE t; -- ", "", "a b", "é"] {
        assert_eq!(u(bad, b"1"), Err(()), "{bad:?}");
    }
    assert_eq!(u(&"n".repeat(65), b"1"), Err(()));
    assert_eq!(u("big", &vec![b'a'; MAX_VARIABLE_VALUE + 1]), Err(()));
}

/// What [`set_statement`] may produce, checked character by character: nothing production sent
/// can end a literal or an identifier, or add a statement.
fn is_safe_set(kind: Variable, sql: &str) -> bool {
    let value_ok = |v: &str| {
        let digits = v.strip_prefix('-').unwrap_or(v);
        let number = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        let hex = |h: &str| h.len().is_multiple_of(2) && h.bytes().all(|b| b.is_ascii_hexdigit());
        number
            || v.strip_prefix("CONVERT(X'")
                .and_then(|r| r.strip_suffix("' USING utf8mb4)"))
                .is_some_and(hex)
            || v.strip_prefix("X'")
                .and_then(|r| r.strip_suffix('\''))
                .is_some_and(hex)
    };
    match kind {
        Variable::User => sql
            .strip_prefix("SET @`")
            .and_then(|r| r.split_once("` = "))
            .is_some_and(|(name, v)| {
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_$.".contains(&b))
                    && value_ok(v)
            }),
        Variable::Session => sql
            .strip_prefix("SET SESSION ")
            .and_then(|r| r.split_once(" = "))
            .is_some_and(|(name, v)| {
                SESSION_VARIABLES.contains(&name)
                    && (value_ok(v)
                        || v.strip_prefix('\'')
                            .and_then(|r| r.strip_suffix('\''))
                            .is_some_and(|w| {
                                w.bytes()
                                    .all(|b| b.is_ascii_alphanumeric() || b"_,.+:/=-".contains(&b))
                            }))
            }),
    }
}

proptest! {
    /// Production's variable names and values are untrusted: whatever they are, the `SET`
    /// built from them is one of the safe shapes, or nothing.
    #[test]
    fn set_statements_hold_nothing_production_could_inject(
        session in any::<bool>(),
        name in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..70),
            proptest::sample::select(SESSION_VARIABLES).prop_map(|n| n.as_bytes().to_vec()),
            "[a-z_]{1,20}".prop_map(String::into_bytes),
        ],
        value in proptest::option::of(prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            "[-0-9a-zA-Z'`;,.+:/= ]{0,30}".prop_map(String::into_bytes),
        ]),
    ) {
        let kind = if session { Variable::Session } else { Variable::User };
        if let Ok(Some(sql)) = set_statement(kind, &name, value.as_deref()) {
            let sql = String::from_utf8(sql).expect("ASCII only");
            prop_assert!(is_safe_set(kind, &sql), "{sql}");
        }
    }
}

#[test]
fn variable_rows_become_set_statements_of_their_connection() {
    let batch = [req(40000, 1), req(40001, 2)];
    let rows = vec![
        row(&[Some("12"), Some("sbtest"), Some("198.18.0.10:40000"), None]),
        row(&[Some("13"), Some("app"), Some("198.18.0.10:40001"), None]),
    ];
    let mut found = match_processlist(&batch, &rows);
    add_variables(
        &mut found,
        Variable::Session,
        &[
            row(&[Some("12"), Some("time_zone"), Some("+08:00")]),
            row(&[Some("12"), Some("init_connect"), Some("x")]), // not ours: dropped
            row(&[Some("99"), Some("time_zone"), Some("+01:00")]), // no such connection
            row(&[Some("13")]),                                  // short row
        ],
    );
    add_variables(
        &mut found,
        Variable::User,
        &[
            row(&[Some("12"), Some("tag"), Some("a")]),
            row(&[Some("13"), Some("n"), Some("5")]),
            row(&[Some("13"), Some("unset"), None]),
        ],
    );
    let (_, a) = &found[&batch[0].client];
    assert_eq!(
        a.variables,
        vec![
            b"SET SESSION time_zone = '+08:00'".to_vec(),
            b"SET @`tag` = CONVERT(X'61' USING utf8mb4)".to_vec()
        ]
    );
    assert_eq!(a.variables_dropped, 1);
    let (_, b) = &found[&batch[1].client];
    assert_eq!(b.variables, vec![b"SET @`n` = 5".to_vec()]);
    assert_eq!(b.variables_dropped, 0);
    // Values stay out of logs.
    assert!(!format!("{a:?}").contains("08:00"), "{a:?}");
}

#[test]
fn variable_queries_hold_only_numbers_and_our_names() {
    let q = session_variables_query(&[12, 13]);
    assert!(q.contains("WHERE t.PROCESSLIST_ID IN (12, 13)"), "{q}");
    assert!(q.contains("'time_zone'") && q.contains("NOT (v.VARIABLE_VALUE <=> g.VARIABLE_VALUE)"));
    let q = user_variables_query(&[7]);
    assert!(
        q.ends_with("WHERE t.PROCESSLIST_ID IN (7)") && !q.contains("ORDER BY"),
        "{q}"
    );
}

/// The start-up check against a scripted server that has `tables` of the two variable tables.
fn readiness(tables: &[&[u8]]) -> (Readiness, Vec<(u8, Vec<u8>)>) {
    let mut script = Vec::new();
    frame(0, &greeting(b"mysql_native_password"), &mut script);
    frame(2, OK, &mut script);
    result_set(2, &[vec![Some(b"1"), Some(b"1")]], &mut script);
    result_set(1, &[vec![Some(b"1")]], &mut script); // threads
    result_set(1, &[], &mut script); // prepared_statements_instances
    let rows: Vec<_> = tables.iter().map(|t| vec![Some(*t)]).collect();
    result_set(1, &rows, &mut script);
    for _ in tables {
        result_set(1, &[], &mut script);
    }
    let pw = Password::new(b"pw".to_vec());
    let mut c = MysqlClient::login(server(script), "tsd_ro", &pw).unwrap();
    let ready = check(&mut c, "tsd_ro").unwrap();
    (ready, written(&c.stream.output))
}

#[test]
fn start_up_check_finds_which_variables_the_server_exposes() {
    // MariaDB 10.11: user variables only.
    let (ready, sent) = readiness(&[b"user_variables_by_thread"]);
    assert!(
        !ready.session_variables && ready.user_variables,
        "{ready:?}"
    );
    assert!(
        String::from_utf8_lossy(&sent.last().unwrap().1).contains("user_variables_by_thread"),
        "the table is read once, so a missing SELECT grant stops the copier at start"
    );
    let w = Wanted::from(&ready);
    assert!(w.statements && w.user_variables && !w.session_variables);
    // MySQL: both (the name's case as information_schema prints it).
    let (ready, _) = readiness(&[b"VARIABLES_BY_THREAD", b"user_variables_by_thread"]);
    assert!(ready.session_variables && ready.user_variables, "{ready:?}");
    // performance_schema off: nothing but PROCESSLIST is asked.
    let off = Readiness {
        performance_schema_off: true,
        session_variables: true,
        user_variables: true,
    };
    let w = Wanted::from(&off);
    assert!(!w.statements && !w.session_variables && !w.user_variables);
}

#[test]
fn requests_are_batched_until_the_window_closes() {
    let (tx, rx) = mpsc::sync_channel(16);
    for i in 0..3 {
        tx.send(req(40000 + i, i)).unwrap();
    }
    let started = Instant::now();
    let batch = next_batch(&rx).unwrap();
    assert_eq!(batch.len(), 3);
    assert!(started.elapsed() >= BATCH_WINDOW);
    drop(tx);
    assert!(next_batch(&rx).is_none());
}

#[test]
fn own_address_matches_either_direction() {
    let own = OwnAddress::default();
    let a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 50000);
    let prod = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 3306);
    assert!(!own.matches(a, prod));
    own.set(a);
    assert!(own.matches(a, prod) && own.matches(prod, a));
    assert!(!own.matches(
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 50000),
        prod
    ));
}

#[test]
fn own_address_remembers_the_last_few_connections() {
    let own = OwnAddress::default();
    let prod = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 5), 3306);
    let local = |p: u16| SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), p);
    for p in 0..OWN_ADDRESSES_KEPT as u16 + 2 {
        own.set(local(50000 + p));
    }
    // The two oldest were overwritten; the last OWN_ADDRESSES_KEPT still match.
    assert!(!own.matches(local(50000), prod) && !own.matches(local(50001), prod));
    for p in 2..OWN_ADDRESSES_KEPT as u16 + 2 {
        assert!(own.matches(local(50000 + p), prod) && own.matches(prod, local(50000 + p)));
    }
}

#[test]
fn drop_abandons_queued_requests_promptly() {
    // A "production" that accepts the first login's TCP connection and then never answers;
    // the worker is built directly (StateLookup::start would need a real login).
    use std::net::TcpListener;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dsn = ProdDsn::parse(&format!("mysql://u:p@{addr}")).unwrap();
    let (req_tx, req_rx) = mpsc::sync_channel(QUEUE_CAP);
    let (ans_tx, ans_rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = Worker {
        dsn,
        conn: None,
        own: OwnAddress::default(),
        stop: Arc::clone(&stop),
        forget: Arc::new(AtomicBool::new(false)),
        snapshot: None,
        counters: Arc::new(Counters::default()),
        wanted: Wanted::default(),
        logged: HashSet::new(),
    };
    let handle = std::thread::spawn(move || worker.run(req_rx, ans_tx, || {}));
    let lookup = StateLookup {
        requests: Some(req_tx),
        answers: ans_rx,
        counters: Arc::new(Counters::default()),
        own: OwnAddress::default(),
        stop,
        forget: Arc::new(AtomicBool::new(false)),
        started: Instant::now(),
        worker: Some(handle),
    };
    // Many batches' worth: each would otherwise wait for a read timeout.
    for i in 0..(4 * MAX_BATCH) as u16 {
        assert!(lookup.request(req(40000 + i, i).client, req(40000 + i, i).mirrored));
    }
    let started = Instant::now();
    drop(lookup);
    // At most the batch in flight (login read timeout), never the whole queue.
    assert!(
        started.elapsed() < IO_TIMEOUT * 2,
        "{:?}",
        started.elapsed()
    );
    drop(listener);
}

// ------------------------------------------------------------------------------------ snapshot

#[test]
fn the_start_snapshot_reads_every_tcp_client_and_answers_each_once() {
    let mut script = Vec::new();
    frame(0, &greeting(b"mysql_native_password"), &mut script);
    frame(2, OK, &mut script);
    // PROCESSLIST: two IPv4 clients, one IPv6 client and a row that does not parse.
    result_set(
        4,
        &[
            vec![
                Some(b"12"),
                Some(b"app"),
                Some(b"198.18.0.10:40000"),
                Some(b"sbtest"),
            ],
            vec![Some(b"13"), Some(b"app"), Some(b"198.18.0.11:40001"), None],
            vec![Some(b"14"), Some(b"app"), Some(b"[::1]:40002"), None],
            vec![Some(b"x"), Some(b"app"), Some(b"198.18.0.12:40003"), None],
        ],
        &mut script,
    );
    // Their statements.
    result_set(
        3,
        &[vec![Some(b"12"), Some(b"1"), Some(b"SELECT ?")]],
        &mut script,
    );
    let mut c = MysqlClient::login(server(script), "tsd_ro", &Password::new(Vec::new())).unwrap();
    let queries = AtomicU64::new(0);
    let wanted = Wanted {
        statements: true,
        ..Wanted::default()
    };
    let mut snap = Snapshot::read(&mut c, wanted, &queries).unwrap();
    assert_eq!(queries.load(Ordering::Relaxed), 2);
    let sent = written(&c.stream.output);
    let first = String::from_utf8_lossy(&sent[1].1[1..]).into_owned();
    assert_eq!(first, snapshot_query());
    assert!(first.contains("ID <> CONNECTION_ID()"), "{first}");
    let statements = String::from_utf8_lossy(&sent[2].1[1..]).into_owned();
    assert!(statements.contains("IN (12, 13)") || statements.contains("IN (13, 12)"));

    let now = Instant::now();
    let a = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000);
    let b = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 40001);
    let (state, _) = snap.take(a, now).expect("a was read");
    assert_eq!(
        (state.user.as_str(), state.db.as_deref()),
        ("app", Some("sbtest"))
    );
    assert_eq!(state.statements, vec![(1, b"SELECT ?".to_vec())]);
    // Once: a second session on the same address is a new connection, looked up anew.
    assert!(snap.take(a, now).is_none());
    assert!(!snap.is_empty());
    assert!(snap
        .take(b, now)
        .is_some_and(|(s, _)| s.statements.is_empty()));
    assert!(snap.is_empty());
}

/// A snapshot taken at `taken` that knows one client, and that client.
fn snapshot_of_one(taken: Instant) -> (SocketAddrV4, Snapshot) {
    let rows = [row(&[
        Some("7"),
        Some("app"),
        Some("198.18.0.10:40000"),
        None,
    ])];
    let states = match_all_processlist(&rows)
        .into_iter()
        .map(|(c, (_, s))| (c, (s, Reads::default())))
        .collect();
    let client = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000);
    (client, Snapshot { taken, states })
}

#[test]
fn the_start_snapshot_answers_nothing_once_it_is_too_old() {
    let taken = Instant::now();
    let (client, mut snap) = snapshot_of_one(taken);
    assert!(snap
        .take(client, taken + SNAPSHOT_TTL + Duration::from_secs(1))
        .is_none());
    assert!(snap.is_empty(), "expired entries are freed");
}

#[test]
fn a_forgotten_snapshot_answers_nothing_and_requests_go_to_production() {
    let (client, snapshot) = snapshot_of_one(Instant::now());
    let forget = Arc::new(AtomicBool::new(false));
    let mut worker = Worker {
        dsn: ProdDsn::parse("mysql://u:p@198.18.0.2:3306").unwrap(),
        conn: None,
        own: OwnAddress::default(),
        stop: Arc::new(AtomicBool::new(false)),
        forget: Arc::clone(&forget),
        snapshot: Some(snapshot),
        counters: Arc::new(Counters::default()),
        wanted: Wanted::default(),
        logged: HashSet::new(),
    };
    // A session of another client opened from its SYN: that client's entry goes.
    let other = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40001);
    let copy = worker.snapshot.as_ref().unwrap().states[&client].clone();
    worker.snapshot.as_mut().unwrap().states.insert(other, copy);
    worker.snapshot_forget_client(other);
    assert!(worker.snapshot_answer(other).is_none());
    forget.store(true, Ordering::SeqCst);
    assert!(worker.snapshot_answer(client).is_none());
    assert!(worker.snapshot.is_none(), "a forgotten snapshot is freed");
}

#[test]
fn snapshot_rows_keep_ipv4_clients_only_and_at_most_the_bound() {
    let rows: Vec<Row> = (0..SNAPSHOT_MAX + 10)
        .map(|i| {
            let host = format!("198.18.{}.{}:{}", i / 250 % 250, i % 250, 40000 + i % 20000);
            row(&[Some(&i.to_string()), Some("u"), Some(&host), None])
        })
        .chain([
            row(&[Some("1"), Some("u"), Some("localhost"), None]),
            row(&[Some("2"), Some("u"), Some("::ffff:198.18.0.1:5"), None]),
        ])
        .collect();
    let all = match_all_processlist(&rows);
    assert_eq!(all.len(), SNAPSHOT_MAX);
}

#[test]
fn workers_lookups_add_up_and_their_snapshots_count_once() {
    let one = LookupStats {
        requested: 3,
        answered: 2,
        not_found: 1,
        queries: 4,
        from_snapshot: 1,
        snapshot_connections: 10,
        snapshot_queries: 4,
        ..LookupStats::default()
    };
    let mut total = one;
    total.merge(&one);
    assert_eq!(
        (
            total.requested,
            total.answered,
            total.not_found,
            total.queries
        ),
        (6, 4, 2, 8)
    );
    assert_eq!(
        (
            total.from_snapshot,
            total.snapshot_connections,
            total.snapshot_queries
        ),
        (2, 10, 8)
    );
}

#[test]
fn state_rows_are_ordered_here_not_by_production() {
    let row = |pid: &str, second: &str| -> Row {
        vec![
            Some(pid.as_bytes().to_vec()),
            Some(second.as_bytes().to_vec()),
        ]
    };
    let got = super::read::ordered(vec![
        row("13", "10"),
        row("12", "b"),
        row("13", "9"),
        row("12", "a"),
    ]);
    assert_eq!(
        got,
        [
            row("12", "a"),
            row("12", "b"),
            row("13", "9"),
            row("13", "10")
        ]
    );
    // None of the state queries makes production sort.
    for q in [
        statements_query(&[1]),
        session_variables_query(&[1]),
        user_variables_query(&[1]),
    ] {
        assert!(!q.contains("ORDER BY"), "{q}");
    }
}
