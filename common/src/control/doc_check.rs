//! `docs/protocol.md` held to the code, so that the wire contract other implementations and
//! reviewers read cannot drift from what the encoder writes.
//!
//! What is checked, all from the encoder's and decoders' actual behaviour rather than from a
//! second copy of the layout kept here:
//! * the type table: exactly the codes each direction's decoder accepts, each named after the
//!   message that encodes to it, and every `### Name (0xNN)` heading agreeing;
//! * every field-layout table: walked over the bytes the encoder writes for a sample message,
//!   each documented offset must be where the fields before it end, each `(uN)` field N bits
//!   wide, each named field hold the sample's value, and the fields cover the whole body;
//! * the hex examples decode to the message their text describes and re-encode to themselves;
//! * the version, feature bits, Mysql item kinds and sizes, and the limits table match the
//!   constants.
//!
//! The doc's Markdown is read loosely (pipes, backticks) but any shape this cannot read fails
//! the test with the place to fix, rather than being skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use super::feedback::tests::feedback;
use super::mysql::tests::mysql_packet;
use super::mysql::{
    MYSQL_FRAMING_LOST, MYSQL_FRAMING_RESUMED, MYSQL_LOST_LEN, MYSQL_PACKET,
    MYSQL_PACKET_FIXED_LEN, MYSQL_PACKET_HASHED, MYSQL_ROWS, MYSQL_ROWS_LEN,
};
use super::tests::{addr, decode_all};
use super::*;
use crate::auth::{NONCE_LEN, PROOF_LEN};

const DOC: &str = include_str!("../../../docs/protocol.md");

/// Frame header and type byte: what to skip to reach a body.
const BODY: usize = FRAME_HEADER_LEN + 1;

/// The doc's text with every run of whitespace made one space, for prose that wraps lines.
fn flat() -> String {
    DOC.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `n` as the doc writes numbers: thousands separated by spaces from five digits on (65 536,
/// but 4096).
fn spaced(n: usize) -> String {
    let digits = n.to_string();
    if digits.len() <= 4 {
        return digits;
    }
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

/// The body rows of the first table at or after `marker`, which must occur exactly once, and
/// the table before the next heading.
fn table_after(marker: &str) -> Vec<Vec<String>> {
    let found: Vec<_> = DOC.match_indices(marker).collect();
    assert_eq!(
        found.len(),
        1,
        "docs/protocol.md: `{marker}` should occur once"
    );
    let mut rows = Vec::new();
    for (i, line) in DOC[found[0].0..].lines().enumerate() {
        let line = line.trim();
        if i == 0 && !line.starts_with('|') {
            continue;
        }
        if line.starts_with('|') {
            rows.push(cells(line));
        } else if !rows.is_empty() {
            break;
        } else if line.starts_with('#') {
            panic!("docs/protocol.md: no table after `{marker}`");
        }
    }
    assert!(
        rows.len() > 2,
        "docs/protocol.md: empty table after `{marker}`"
    );
    // The header and the `| --- |` line.
    rows.drain(..2);
    rows
}

/// The name a layout row documents: its first backticked identifier before any explanation,
/// else the words before it (`magic`, `copier name`).
fn field_key(field: &str) -> String {
    let end = [" (", ",", ":", " ×"]
        .iter()
        .filter_map(|d| field.find(d))
        .min()
        .unwrap_or(field.len());
    let head = &field[..end];
    match head.split('`').nth(1) {
        Some(token) => token.to_owned(),
        None => head.trim().to_owned(),
    }
}

/// Bytes a row's `(u8)`/`(u16)`/… type annotations add up to, if it has any.
fn typed_width(field: &str) -> Option<usize> {
    let widths: Vec<usize> = field
        .match_indices("(u")
        .filter_map(|(i, _)| {
            let digits: String = field[i + 2..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<usize>().ok().map(|bits| bits / 8)
        })
        .collect();
    (!widths.is_empty()).then(|| widths.iter().sum())
}

/// A size cell: a number, an earlier field (`name_len`), `k × field`, `field − k`, or `…`
/// (variable: the walk stops there).
fn size_of(what: &str, size: &str, values: &BTreeMap<String, u64>) -> Option<usize> {
    let s = size.replace('`', "");
    let s = s.trim();
    if s == "…" {
        return None;
    }
    if let Ok(n) = s.parse() {
        return Some(n);
    }
    let value = |name: &str| -> usize {
        let v = values.get(name.trim()).unwrap_or_else(|| {
            panic!("docs/protocol.md, {what}: size `{s}` names no earlier fixed-size field")
        });
        usize::try_from(*v).unwrap()
    };
    let number = |k: &str| -> usize {
        k.trim()
            .parse()
            .unwrap_or_else(|_| panic!("docs/protocol.md, {what}: unreadable size `{s}`"))
    };
    Some(if let Some((k, name)) = s.split_once(" × ") {
        number(k) * value(name)
    } else if let Some((name, k)) = s.split_once(" − ") {
        value(name) - number(k)
    } else {
        value(s)
    })
}

/// Walks a layout table over `bytes` (what the encoder wrote), checking offsets, widths and
/// the fields in `want`; returns each field's cell by name for further checks.
fn walk(
    what: &str,
    rows: &[Vec<String>],
    bytes: &[u8],
    want: &[(&str, &[u8])],
) -> BTreeMap<String, String> {
    let mut at = 0;
    let mut values = BTreeMap::new();
    let mut fields = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut open_ended = false;
    for row in rows {
        let [offset, size, field, notes @ ..] = &row[..] else {
            panic!("docs/protocol.md, {what}: row {row:?} is not `offset | size | field | …`");
        };
        let key = field_key(field);
        fields
            .entry(key.clone())
            .or_insert_with(|| [field.clone()].iter().chain(notes).cloned().collect());
        if offset != "…" {
            let documented: usize = offset.parse().unwrap_or_else(|_| {
                panic!("docs/protocol.md, {what}: unreadable offset `{offset}` of `{key}`")
            });
            assert_eq!(
                documented, at,
                "docs/protocol.md, {what}: `{key}` is documented at offset {documented}, but the \
                 fields before it end at {at}"
            );
        }
        let Some(n) = size_of(what, size, &values) else {
            open_ended = true;
            break;
        };
        if let Some(w) = typed_width(field) {
            assert_eq!(
                n, w,
                "docs/protocol.md, {what}: `{key}` is {n} bytes but typed as {w}"
            );
        }
        let got = bytes.get(at..at + n).unwrap_or_else(|| {
            panic!(
                "docs/protocol.md, {what}: `{key}` at {at}..{} runs past the {} bytes the \
                 encoder writes",
                at + n,
                bytes.len()
            )
        });
        if n <= 8 {
            values.insert(
                key.clone(),
                got.iter().fold(0, |v, b| v << 8 | u64::from(*b)),
            );
        }
        if let Some((_, w)) = want.iter().find(|(k, _)| *k == key) {
            assert_eq!(
                got, *w,
                "docs/protocol.md, {what}: `{key}` at offset {at} is not where the encoder puts it"
            );
            seen.insert(key.clone());
        }
        at += n;
    }
    if !open_ended {
        assert_eq!(
            at,
            bytes.len(),
            "docs/protocol.md, {what}: the documented fields cover {at} bytes, the encoder writes {}",
            bytes.len()
        );
    }
    for (k, _) in want {
        assert!(
            seen.contains(*k),
            "docs/protocol.md, {what}: no field `{k}` documented"
        );
    }
    fields
}

fn assert_cell(what: &str, fields: &BTreeMap<String, String>, key: &str, has: &str) {
    let cell = fields
        .get(key)
        .unwrap_or_else(|| panic!("docs/protocol.md, {what}: no field `{key}`"));
    assert!(
        cell.contains(has),
        "docs/protocol.md, {what}: `{key}` should say `{has}`: {cell}"
    );
}

fn body(encode: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out).unwrap();
    out.split_off(BODY)
}

/// One message of every type; the name is the doc's (and the enum variant's).
fn samples() -> Vec<(String, Vec<u8>)> {
    let copier = [
        CopierMessage::Hello(Hello::new("c1")),
        CopierMessage::Auth(Auth {
            nonce: [0; NONCE_LEN],
            proof: None,
        }),
        CopierMessage::Claim(vec![]),
        CopierMessage::Release(vec![]),
        CopierMessage::Ping(0),
        CopierMessage::Prompt(false),
        CopierMessage::Doctor(DoctorQuery {
            target: Ipv4Addr::LOCALHOST,
            arp: vec![],
        }),
    ];
    let intercept = [
        InterceptMessage::Challenge(Challenge {
            nonce: [0; NONCE_LEN],
            secret_required: false,
        }),
        InterceptMessage::Welcome(Welcome {
            version: PROTOCOL_VERSION,
            name: String::new(),
            payload_prefix: 0,
            mysql_head: None,
            features: 0,
            proof: None,
        }),
        InterceptMessage::Reject(Reject::new("")),
        InterceptMessage::Feedback(vec![]),
        InterceptMessage::Pong(0),
        InterceptMessage::Mysql {
            sent_at_us: 0,
            events: vec![],
        },
        InterceptMessage::DoctorReport(DoctorReport {
            unix_ms: 0,
            checks: vec![],
        }),
    ];
    fn named<M: WireMessage + std::fmt::Debug>(m: &M) -> (String, Vec<u8>) {
        let name = format!("{m:?}")
            .split(['(', ' '])
            .next()
            .unwrap()
            .to_owned();
        let mut out = Vec::new();
        m.encode(&mut out).unwrap();
        (name, out)
    }
    copier
        .iter()
        .map(named)
        .chain(intercept.iter().map(named))
        .collect()
}

#[test]
fn the_type_table_lists_what_each_decoder_accepts() {
    let code_of: BTreeMap<String, u8> = samples()
        .into_iter()
        .map(|(name, frame)| (name, frame[FRAME_HEADER_LEN]))
        .collect();
    let accepts =
        |decode: fn(u8) -> bool| -> BTreeSet<u8> { (0..=255).filter(|&t| decode(t)).collect() };
    // Every body has fields, so an empty one is Truncated for a known type, never accepted.
    let copier_codes = accepts(|t| {
        !matches!(
            CopierMessage::decode(t, &[]),
            Err(DecodeError::UnexpectedType { .. })
        )
    });
    let intercept_codes = accepts(|t| {
        !matches!(
            InterceptMessage::decode(t, &[]),
            Err(DecodeError::UnexpectedType { .. })
        )
    });

    let mut documented = [BTreeSet::new(), BTreeSet::new()];
    for row in table_after("| type | name | direction |") {
        let [code, name, direction] = &row[..] else {
            panic!("docs/protocol.md, type table: row {row:?}");
        };
        let code = u8::from_str_radix(code.trim_matches('`').trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("docs/protocol.md, type table: code {code}"));
        assert_eq!(
            code_of.get(name.as_str()),
            Some(&code),
            "docs/protocol.md, type table: {name} is 0x{code:02x}, the encoder says otherwise"
        );
        let side = if direction.starts_with("copier → intercept") {
            0
        } else if direction.starts_with("intercept → copier") {
            1
        } else {
            panic!("docs/protocol.md, type table: direction of {name}: {direction}");
        };
        assert!(
            documented[side].insert(code),
            "docs/protocol.md: 0x{code:02x} twice"
        );
    }
    assert_eq!(
        documented[0], copier_codes,
        "docs/protocol.md: copier → intercept types"
    );
    assert_eq!(
        documented[1], intercept_codes,
        "docs/protocol.md: intercept → copier types"
    );

    // Every message has a `### Name (0xNN)` heading with its code.
    let mut headed = BTreeSet::new();
    for line in DOC.lines().filter(|l| l.starts_with("### ")) {
        for (i, _) in line.match_indices(" (0x") {
            let name = line[..i].rsplit([' ', '#']).next().unwrap();
            let code = u8::from_str_radix(&line[i + 4..i + 6], 16).unwrap();
            assert_eq!(
                code_of.get(name),
                Some(&code),
                "docs/protocol.md, heading `{line}`"
            );
            headed.insert(name.to_owned());
        }
    }
    let all: BTreeSet<_> = code_of.keys().cloned().collect();
    assert_eq!(headed, all, "docs/protocol.md: a message without a section");
}

#[test]
fn the_frame_table_matches_the_encoder() {
    let mut ping = Vec::new();
    encode_ping(0x0102_0304_0506_0708, &mut ping).unwrap();
    let fields = walk(
        "Frame",
        &table_after("## Frame"),
        &ping,
        &[("len", &[0, 0, 0, 9]), ("type", &[0x04])],
    );
    assert_cell(
        "Frame",
        &fields,
        "len",
        &format!("`1 ≤ len ≤ {}`", spaced(MAX_FRAME_LEN)),
    );
    let magic = std::str::from_utf8(&MAGIC).unwrap();
    assert!(flat().contains(&format!("**magic** (4 bytes): ASCII `{magic}`")));
}

#[test]
fn the_handshake_tables_match_the_encoder() {
    let features = FEATURE_PAYLOAD_HASHES | FEATURE_ROW_RUNS;
    let hello = body(|o| encode_hello(&Hello::new("c1").with_features(features), o));
    let fields = walk(
        "Hello",
        &table_after("### Hello (0x01)"),
        &hello,
        &[
            ("magic", &MAGIC),
            ("version", &PROTOCOL_VERSION.to_be_bytes()),
            ("name_len", &[2]),
            ("copier name", b"c1"),
            ("features", &features.to_be_bytes()),
        ],
    );
    assert_cell(
        "Hello",
        &fields,
        "version",
        &format!("currently {PROTOCOL_VERSION}"),
    );
    assert_cell(
        "Hello",
        &fields,
        "copier name",
        &format!("≤ {MAX_NAME_LEN} bytes"),
    );
    for (name, bit) in [
        ("FEATURE_PAYLOAD_HASHES", FEATURE_PAYLOAD_HASHES),
        ("FEATURE_PROMPT_REPLIES", FEATURE_PROMPT_REPLIES),
        ("FEATURE_ROW_RUNS", FEATURE_ROW_RUNS),
        ("FEATURE_QUIET_IDLE", FEATURE_QUIET_IDLE),
        ("FEATURE_PROMPT_ON_DEMAND", FEATURE_PROMPT_ON_DEMAND),
    ] {
        assert_eq!(bit.count_ones(), 1);
        assert_cell(
            "Hello",
            &fields,
            "features",
            &format!("bit {} (`{name}`)", bit.trailing_zeros()),
        );
    }
    assert_eq!(
        FEATURE_PAYLOAD_HASHES
            | FEATURE_PROMPT_REPLIES
            | FEATURE_ROW_RUNS
            | FEATURE_QUIET_IDLE
            | FEATURE_PROMPT_ON_DEMAND,
        KNOWN_FEATURES,
        "a new feature bit: document it in the Hello table and add it above"
    );

    let nonce = [0xab; NONCE_LEN];
    let challenge = body(|o| {
        encode_challenge(
            &Challenge {
                nonce,
                secret_required: true,
            },
            o,
        )
    });
    walk(
        "Challenge",
        &table_after("### Challenge (0x87)"),
        &challenge,
        &[
            ("magic", &MAGIC),
            ("version", &PROTOCOL_VERSION.to_be_bytes()),
            ("server_nonce", &nonce),
            ("secret_required", &[1]),
        ],
    );

    let proof = [0xcd; PROOF_LEN];
    let auth = body(|o| {
        encode_auth(
            &Auth {
                nonce,
                proof: Some(proof),
            },
            o,
        )
    });
    walk(
        "Auth",
        &table_after("### Auth (0x06)"),
        &auth,
        &[
            ("client_nonce", &nonce),
            ("has_proof", &[1]),
            ("proof", &proof),
        ],
    );

    let welcome = body(|o| {
        encode_welcome(
            &Welcome {
                version: PROTOCOL_VERSION,
                name: "i".into(),
                payload_prefix: 0x0102,
                mysql_head: Some(16),
                features,
                proof: Some(proof),
            },
            o,
        )
    });
    let fields = walk(
        "Welcome",
        &table_after("### Welcome (0x81)"),
        &welcome,
        &[
            ("magic", &MAGIC),
            ("version", &PROTOCOL_VERSION.to_be_bytes()),
            ("name_len", &[1]),
            ("intercept name", b"i"),
            ("payload_prefix", &[1, 2]),
            ("framing", &[1]),
            ("mysql_head", &[0, 16]),
            ("features", &features.to_be_bytes()),
            ("has_proof", &[1]),
            ("proof", &proof),
        ],
    );
    assert_cell(
        "Welcome",
        &fields,
        "mysql_head",
        &format!("≤ {MAX_MYSQL_HEAD}"),
    );

    let reject = body(|o| {
        encode_reject(
            &Reject {
                version: 9,
                reason: "no".into(),
            },
            o,
        )
    });
    let fields = walk(
        "Reject",
        &table_after("### Reject (0x82)"),
        &reject,
        &[
            ("magic", &MAGIC),
            ("version", &[0, 9]),
            ("reason_len", &[0, 2]),
            ("reason for a person", b"no"),
        ],
    );
    assert_cell(
        "Reject",
        &fields,
        "reason_len",
        &format!("≤ {MAX_REASON_LEN}"),
    );
}

#[test]
fn the_claim_ping_and_doctor_tables_match_the_encoder() {
    let addrs = [addr(10, 40000), addr(11, 2)];
    let addr_bytes = [198, 18, 0, 10, 0x9c, 0x40, 198, 18, 0, 11, 0, 2];
    let rows = table_after("### Claim (0x02) and Release (0x03)");
    for (what, bytes) in [
        ("Claim", body(|o| encode_claim(&addrs, o))),
        ("Release", body(|o| encode_release(&addrs, o))),
    ] {
        let fields = walk(
            what,
            &rows,
            &bytes,
            &[("count", &[0, 0, 0, 2]), ("addr", &addr_bytes)],
        );
        assert_cell(
            what,
            &fields,
            "count",
            &format!("≤ {}", spaced(MAX_ADDRS_PER_FRAME)),
        );
    }

    let rows = table_after("### Ping (0x04) and Pong (0x84)");
    let nonce = 0x0102_0304_0506_0708u64.to_be_bytes();
    walk(
        "Ping",
        &rows,
        &body(|o| encode_ping(0x0102_0304_0506_0708, o)),
        &[("nonce", &nonce)],
    );
    walk(
        "Pong",
        &rows,
        &body(|o| encode_pong(0x0102_0304_0506_0708, o)),
        &[("nonce", &nonce)],
    );

    let query = DoctorQuery {
        target: Ipv4Addr::new(198, 18, 0, 3),
        arp: vec![ArpTarget {
            addr: Ipv4Addr::new(198, 19, 0, 7),
            pool: true,
        }],
    };
    let fields = walk(
        "Doctor",
        &table_after("Doctor:"),
        &body(|o| encode_doctor(&query, o)),
        &[
            ("target", &[198, 18, 0, 3]),
            ("count", &[0, 1]),
            ("per address", &[198, 19, 0, 7, 1]),
        ],
    );
    assert_cell(
        "Doctor",
        &fields,
        "count",
        &format!("≤ {}", spaced(MAX_DOCTOR_ARP)),
    );
    let report = DoctorReport {
        unix_ms: 7,
        checks: vec![DoctorCheck::new(1, "ip", "x")],
    };
    let rows = table_after("DoctorReport:");
    let fields = walk(
        "DoctorReport",
        &rows,
        &body(|o| encode_doctor_report(&report, o)),
        &[("unix_ms", &7u64.to_be_bytes()), ("count", &[0, 1])],
    );
    assert_cell(
        "DoctorReport",
        &fields,
        "count",
        &format!("≤ {MAX_DOCTOR_CHECKS}"),
    );
    let checks = &rows.last().unwrap()[2];
    for has in [
        "`level` (u8: 0 ok, 1 warn, 2 fail;".to_owned(),
        "`name_len` (u8)".to_owned(),
        format!("`detail_len` (u16, ≤ {})", spaced(MAX_CHECK_DETAIL_LEN)),
    ] {
        assert!(
            checks.contains(&has),
            "docs/protocol.md, DoctorReport checks should say {has}: {checks}"
        );
    }
    assert_eq!(MAX_CHECK_NAME_LEN, usize::from(u8::MAX));
}

#[test]
fn the_feedback_tables_match_the_encoder() {
    let frame = body(|o| encode_feedback(&[feedback()], o));
    walk(
        "Feedback",
        &table_after("### Feedback (0x83)"),
        &frame,
        &[("count", &[0, 0, 0, 1])],
    );
    let fb = feedback();
    let fields = walk(
        "Feedback item",
        &table_after("Each item, one TCP segment"),
        &frame[4..],
        &[
            ("client", &[198, 18, 0, 10, 0x9c, 0x40]),
            ("server", &[198, 18, 0, 3, 0x0c, 0xea]),
            ("seq", &fb.seq.to_be_bytes()),
            ("ack", &fb.ack.to_be_bytes()),
            ("flags", &[fb.flags.0]),
            ("window", &fb.window.to_be_bytes()),
            ("opts", &[0x0f]),
            ("MSS", &1460u16.to_be_bytes()),
            ("window scale shift", &[7]),
            ("TSval", &[0, 0, 0, 3, 0, 0, 0, 4]),
            ("payload_len", &fb.payload_len.to_be_bytes()),
            ("prefix_len", &[0, 8]),
            ("the first payload bytes", &fb.payload_prefix),
        ],
    );
    assert_cell(
        "Feedback item",
        &fields,
        "prefix_len",
        &format!("`≤ {MAX_PAYLOAD_PREFIX}`"),
    );
    let flat = flat();
    for has in [
        format!(
            "An item is {} bytes plus its options and prefix",
            super::feedback::FEEDBACK_FIXED_LEN
        ),
        format!("A batch of at most {MAX_FEEDBACK_PER_FRAME} items always fits"),
    ] {
        assert!(flat.contains(&has), "docs/protocol.md should say: {has}");
    }
}

#[test]
fn the_mysql_tables_match_the_encoder() {
    let mysql_item = |ev: MysqlEvent| -> Vec<u8> {
        let mut b = body(|o| encode_mysql(0x0a0b_0c0d, &[ev], o));
        b.split_off(8)
    };
    walk(
        "Mysql",
        &table_after("### Mysql (0x85)"),
        &body(|o| encode_mysql(0x0a0b_0c0d, &[], o)),
        &[
            ("sent_at_us", &[0x0a, 0x0b, 0x0c, 0x0d]),
            ("count", &[0; 4]),
        ],
    );
    let header = table_after("Each item starts with a `kind` byte");
    let with_header = |marker: &str| -> Vec<Vec<String>> {
        header.iter().cloned().chain(table_after(marker)).collect()
    };
    let client = [198, 18, 0, 10, 0x9c, 0x40];
    let marker = |name: &str, kind: u8| format!("**{name}** (`0x{kind:02x}`)");

    let packet = mysql_item(mysql_packet(&[0x00, 0x01], 7));
    let fields = walk(
        "Mysql Packet",
        &with_header(&marker("Packet", MYSQL_PACKET)),
        &packet,
        &[
            ("kind", &[MYSQL_PACKET]),
            ("client", &client),
            ("stream_offset", &[1, 2, 3, 4, 5, 6, 7, 8]),
            ("tcp_seq", &[0x0a, 0x0b, 0x0c, 0x0d]),
            ("seq_id", &[3]),
            ("len", &[0, 0, 0, 7]),
            ("framed_at_us", &[1, 2, 3, 4]),
            ("head_len", &[0, 2]),
            ("head", &[0x00, 0x01]),
        ],
    );
    assert_cell(
        "Mysql Packet",
        &fields,
        "len",
        &format!("`≤ 0x{MYSQL_MAX_PAYLOAD:X}`"),
    );
    assert_cell(
        "Mysql Packet",
        &fields,
        "head_len",
        &format!("`≤ {MAX_MYSQL_HEAD}"),
    );

    // HashedPacket has no table of its own: "a Packet followed by `hash` (u64, 8 bytes)".
    let mut ev = mysql_packet(&[0x00, 0x01], 7);
    if let MysqlEvent::Packet { packet, .. } = &mut ev {
        packet.hash = Some(0x1122_3344_5566_7788);
    }
    let hashed = mysql_item(ev);
    assert_eq!(hashed[0], MYSQL_PACKET_HASHED);
    assert_eq!(hashed[1..packet.len()], packet[1..]);
    assert_eq!(
        hashed[packet.len()..],
        0x1122_3344_5566_7788u64.to_be_bytes()
    );

    let rows = MysqlRows {
        stream_offset: 0x0102_0304_0506_0708,
        seq_id: 2,
        count: 3,
        bytes: 0x40,
        framed_at_us: 0x0a0b_0c0d,
        eof: true,
    };
    walk(
        "Mysql Rows",
        &with_header(&marker("Rows", MYSQL_ROWS)),
        &mysql_item(MysqlEvent::Rows {
            client: addr(10, 40000),
            rows,
        }),
        &[
            ("kind", &[MYSQL_ROWS]),
            ("client", &client),
            ("stream_offset", &[1, 2, 3, 4, 5, 6, 7, 8]),
            ("seq_id", &[2]),
            ("count", &[0, 0, 0, 3]),
            ("bytes", &[0, 0, 0, 0, 0, 0, 0, 0x40]),
            ("framed_at_us", &[0x0a, 0x0b, 0x0c, 0x0d]),
            ("flags", &[1]),
        ],
    );

    // FramingResumed is "laid out like FramingLost".
    let lost = with_header(&marker("FramingLost", MYSQL_FRAMING_LOST));
    for (what, kind, ev) in [
        (
            "Mysql FramingLost",
            MYSQL_FRAMING_LOST,
            MysqlEvent::FramingLost {
                client: addr(10, 40000),
                at_seq: 9,
            },
        ),
        (
            "Mysql FramingResumed",
            MYSQL_FRAMING_RESUMED,
            MysqlEvent::FramingResumed {
                client: addr(10, 40000),
                at_seq: 9,
            },
        ),
    ] {
        walk(
            what,
            &lost,
            &mysql_item(ev),
            &[
                ("kind", &[kind]),
                ("client", &client),
                ("at_seq", &[0, 0, 0, 9]),
            ],
        );
    }

    // The kind list, the item headings and their stated sizes.
    let flat = flat();
    let kinds = &header[0][2];
    for (name, kind, len) in [
        (
            "Packet",
            MYSQL_PACKET,
            format!("{MYSQL_PACKET_FIXED_LEN} bytes plus its head"),
        ),
        (
            "FramingLost",
            MYSQL_FRAMING_LOST,
            format!("{MYSQL_LOST_LEN} bytes"),
        ),
        ("HashedPacket", MYSQL_PACKET_HASHED, String::new()),
        ("Rows", MYSQL_ROWS, format!("{MYSQL_ROWS_LEN} bytes")),
        (
            "FramingResumed",
            MYSQL_FRAMING_RESUMED,
            format!("{MYSQL_LOST_LEN} bytes"),
        ),
    ] {
        assert!(
            kinds.contains(&format!("`0x{kind:02x}` {name}")),
            "docs/protocol.md: the kind list should have `0x{kind:02x}` {name}: {kinds}"
        );
        let heading = marker(name, kind);
        assert!(
            flat.contains(&heading),
            "docs/protocol.md: no {heading} paragraph"
        );
        // The size is stated in the paragraph's lead-in, before its colon.
        let lead = &flat[flat.find(&heading).unwrap()..];
        let lead = &lead[..lead.find(':').unwrap_or(lead.len())];
        assert!(
            lead.contains(&len),
            "docs/protocol.md: {heading} should be said to take {len}: {lead}"
        );
    }
    let has = format!("A batch of at most {MAX_MYSQL_EVENTS_PER_FRAME} items always fits");
    assert!(flat.contains(&has), "docs/protocol.md should say: {has}");
    let has = format!("the first {MYSQL_FULL_HEAD_PACKETS} packets of a connection");
    assert!(flat.contains(&has), "docs/protocol.md should say: {has}");
}

/// The hex between backticks in the paragraph that starts at `marker`.
fn example_after(marker: &str) -> Vec<u8> {
    let found: Vec<_> = DOC.match_indices(marker).collect();
    assert_eq!(
        found.len(),
        1,
        "docs/protocol.md: `{marker}` should occur once"
    );
    let paragraph = DOC[found[0].0..].split("\n\n").next().unwrap();
    let hex = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        // Frames are written with `|` between fields, which also tells them from a quoted
        // value that happens to be hex (`c1`).
        .filter(|span| {
            span.contains(" | ")
                && span
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == '|' || c.is_whitespace())
        })
        .collect::<Vec<_>>()
        .join(" ");
    let bytes: Vec<u8> = hex
        .split_whitespace()
        .filter(|t| *t != "|")
        .map(|t| u8::from_str_radix(t, 16).unwrap())
        .collect();
    assert!(!bytes.is_empty(), "docs/protocol.md: no hex in `{marker}`");
    bytes
}

#[test]
fn the_examples_decode_to_what_they_describe() {
    let hello = example_after("Example, name `c1`, asking for payload hashes:");
    assert_eq!(
        decode_all::<CopierMessage>(&hello).unwrap(),
        [CopierMessage::Hello(
            Hello::new("c1").with_features(FEATURE_PAYLOAD_HASHES)
        )]
    );
    let doctor = example_after("Example, a Doctor for target 198.18.0.3");
    let query = CopierMessage::Doctor(DoctorQuery {
        target: Ipv4Addr::new(198, 18, 0, 3),
        arp: vec![ArpTarget {
            addr: Ipv4Addr::new(198, 19, 0, 7),
            pool: true,
        }],
    });
    assert_eq!(decode_all::<CopierMessage>(&doctor).unwrap(), [query]);
    let mysql = example_after("Example, a Packet (client 198.18.0.10:40000");
    let batch = InterceptMessage::Mysql {
        sent_at_us: 0x0102_06ec,
        events: vec![
            mysql_packet(&[0x00, 0x01], 7),
            MysqlEvent::FramingLost {
                client: addr(11, 2),
                at_seq: 9,
            },
        ],
    };
    assert_eq!(decode_all::<InterceptMessage>(&mysql).unwrap(), [batch]);
    // And back: the encoder writes exactly the documented bytes.
    for (bytes, copier) in [(hello, true), (doctor, true), (mysql, false)] {
        let mut again = Vec::new();
        if copier {
            for m in decode_all::<CopierMessage>(&bytes).unwrap() {
                m.encode(&mut again).unwrap();
            }
        } else {
            for m in decode_all::<InterceptMessage>(&bytes).unwrap() {
                m.encode(&mut again).unwrap();
            }
        }
        assert_eq!(again, bytes);
    }
}

#[test]
fn the_version_and_limits_match_the_constants() {
    let flat = flat();
    for has in [
        format!("currently **{PROTOCOL_VERSION}**"),
        format!("A version other than {PROTOCOL_VERSION} is answered"),
        format!("Version {PROTOCOL_VERSION} added"),
    ] {
        assert!(flat.contains(&has), "docs/protocol.md should say: {has}");
    }

    assert_eq!(MAX_FRAME_LEN, 1 << 20, "the limits table says 1 MiB");
    let want: BTreeMap<&str, String> = [
        ("frame (type + body)", "1 MiB".to_owned()),
        ("name", format!("{MAX_NAME_LEN} bytes")),
        ("nonce, proof", format!("{NONCE_LEN} bytes each")),
        ("reject reason", format!("{MAX_REASON_LEN} bytes")),
        ("addresses per Claim/Release", spaced(MAX_ADDRS_PER_FRAME)),
        ("payload prefix", format!("{MAX_PAYLOAD_PREFIX} bytes")),
        (
            "Feedback items per frame",
            format!("≤ {MAX_FEEDBACK_PER_FRAME} always fits"),
        ),
        ("MySQL packet head", format!("{MAX_MYSQL_HEAD} bytes")),
        ("MySQL packet `len`", format!("`0x{MYSQL_MAX_PAYLOAD:X}`")),
        (
            "Mysql items per frame",
            format!("≤ {MAX_MYSQL_EVENTS_PER_FRAME} always fits"),
        ),
        (
            "whole heads",
            format!("first {MYSQL_FULL_HEAD_PACKETS} packets"),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(NONCE_LEN, PROOF_LEN);
    // Limits of intercept's sessions and of the secret file, not of this codec.
    let elsewhere = [
        "secret (`--secret-file`, trimmed)",
        "control connections",
        "held segments per session",
        "framed sessions",
    ];
    let mut checked = BTreeSet::new();
    for row in table_after("## Limits") {
        let [what, limit] = &row[..] else {
            panic!("docs/protocol.md, limits: row {row:?}");
        };
        if elsewhere.contains(&what.as_str()) {
            continue;
        }
        let has = want.get(what.as_str()).unwrap_or_else(|| {
            panic!("docs/protocol.md, limits: `{what}` is new: check it here against its constant")
        });
        assert!(
            limit.contains(has.as_str()),
            "docs/protocol.md, limits: {what} should say {has}: {limit}"
        );
        checked.insert(what.clone());
    }
    assert_eq!(
        checked.len(),
        want.len(),
        "docs/protocol.md: a limit row went missing"
    );
}
