//! COM_STMT_EXECUTE's parameter block, read and written side by side, and a guesser of the
//! parameter types a client sent once and never again.
//!
//! After the command's fixed head (code, statement id, flags, iteration count) a statement with
//! `n > 0` parameters has: a NULL bitmap of `(n + 7) / 8` bytes (bit `i` set: parameter `i` is
//! NULL and has no value), the new-params-bound flag, then only if that flag is set two bytes
//! per parameter (type, flags: [`UNSIGNED`]), then the values of the non-NULL parameters in
//! order, each encoded by its type. libmariadb and most drivers send the types with the first
//! execute of a statement only; a server that never got them refuses every later execute
//! (error 1210).
//!
//! [`guess`] finds types consistent with an execute's own bytes, for a statement the server was
//! never given types for. The values carry no types, so a guess can be wrong even when every
//! byte fits: callers verify it (`core/src/mysql/param_types.rs`). The order candidates come
//! in, for each value from left to right (the first parameter's first reading, then the
//! second's, ...):
//!
//! 1. a length-encoded string whose content is text (no ASCII control characters but tab and
//!    line ends; bytes above 0x7f pass, as UTF-8 text has them): a length byte that matches
//!    and printable bytes after it rarely happen by chance, while an integer reading fits any
//!    bytes of its width;
//! 2. integers of the value's exact width, signed: LONGLONG, LONG, SHORT, TINY (LONGLONG first:
//!    libmariadb's sysbench, Connector/J's `setLong`, PHP and Go bind 64-bit integers);
//! 3. the same widths unsigned, where the top bit is set (elsewhere they read the same);
//! 4. DOUBLE, FLOAT, only zero or normal: the bytes of an integer below 2^52 (2^23) read as a
//!    float are denormal;
//! 5. other length-encoded strings (BLOB; the empty string as VAR_STRING);
//! 6. DATETIME and TIME, only with a valid length byte (0, 4, 7, 11 and 0, 8, 12) and fields in
//!    range.
//!
//! Of the first 64 candidates in that order, those that read fewer numbers from bytes that are
//! all printable text come first: such bytes are most likely the rest of a string an earlier
//! reading cut short.
//!
//! Every candidate reads exactly the bytes there are. NULL parameters get [`field_type::NULL`]:
//! their type is unknown, and the caller re-guesses once one of them has a value. The search is
//! a depth-first walk with a memo of positions that lead nowhere and a budget linear in the
//! number of values ([`GUESS_BUDGET`]), so no input makes it exponential.

use std::collections::HashSet;
use std::ops::ControlFlow;

use super::codec::{ProtocolError, Reader};
use super::command::com;
use super::read_lenenc_int;

/// Column and parameter types (`enum_field_types`).
pub mod field_type {
    pub const DECIMAL: u8 = 0x00;
    pub const TINY: u8 = 0x01;
    pub const SHORT: u8 = 0x02;
    pub const LONG: u8 = 0x03;
    pub const FLOAT: u8 = 0x04;
    pub const DOUBLE: u8 = 0x05;
    pub const NULL: u8 = 0x06;
    pub const TIMESTAMP: u8 = 0x07;
    pub const LONGLONG: u8 = 0x08;
    pub const INT24: u8 = 0x09;
    pub const DATE: u8 = 0x0a;
    pub const TIME: u8 = 0x0b;
    pub const DATETIME: u8 = 0x0c;
    pub const YEAR: u8 = 0x0d;
    pub const NEWDATE: u8 = 0x0e;
    pub const VARCHAR: u8 = 0x0f;
    pub const BIT: u8 = 0x10;
    pub const JSON: u8 = 0xf5;
    pub const NEWDECIMAL: u8 = 0xf6;
    pub const ENUM: u8 = 0xf7;
    pub const SET: u8 = 0xf8;
    pub const TINY_BLOB: u8 = 0xf9;
    pub const MEDIUM_BLOB: u8 = 0xfa;
    pub const LONG_BLOB: u8 = 0xfb;
    pub const BLOB: u8 = 0xfc;
    pub const VAR_STRING: u8 = 0xfd;
    pub const STRING: u8 = 0xfe;
    pub const GEOMETRY: u8 = 0xff;
}

/// A parameter's flags byte: the integer is unsigned.
pub const UNSIGNED: u8 = 0x80;

/// Payload bytes before the NULL bitmap: code, statement id, flags, iteration count.
pub const EXECUTE_HEAD_LEN: usize = 10;

/// Readings a guess tries at most: this, plus [`GUESS_BUDGET_PER_VALUE`] per non-NULL value.
/// A real execute needs a few per value, unless an early wrong reading leads into a long text
/// or binary string, where readings at every offset stay plausible for a while: random mixes
/// of a dozen integers, doubles and strings of up to 300 bytes all decode within it. A whole
/// budget spent costs a few milliseconds (1.5 to 4 ms measured), so callers stop guessing for a
/// statement that keeps failing.
pub const GUESS_BUDGET: usize = 1 << 17;
pub const GUESS_BUDGET_PER_VALUE: usize = 16;
/// Non-NULL values a guess takes on at most (the walk keeps a frame per value).
pub const MAX_GUESSED_VALUES: usize = 4096;
/// Dead ends remembered per guess (the memo stops growing there; the budget still bounds).
const DEAD_ENDS_KEPT: usize = 8192;

/// Where the new-params-bound flag sits in the payload of an execute of a statement with
/// `num_params` parameters.
pub fn bound_flag_offset(num_params: u16) -> usize {
    EXECUTE_HEAD_LEN + usize::from(num_params).div_ceil(8)
}

/// Payload bytes up to the end of the types block, when the flag is set.
pub fn types_end(num_params: u16) -> usize {
    bound_flag_offset(num_params) + 1 + 2 * usize::from(num_params)
}

/// The parameter block of a COM_STMT_EXECUTE payload of a statement with parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecuteParams<'a> {
    /// Code, statement id, flags, iteration count: written back as they are.
    pub head: &'a [u8],
    pub null_bitmap: &'a [u8],
    /// The types block (2 bytes per parameter) when the new-params-bound flag is set.
    pub types: Option<&'a [u8]>,
    /// The values of the non-NULL parameters (what the payload has of them).
    pub values: &'a [u8],
    num_params: u16,
}

impl<'a> ExecuteParams<'a> {
    /// `payload` is the whole COM_STMT_EXECUTE payload; a prefix parses too, with `values` then
    /// a prefix of the values. `num_params` comes from the statement's PREPARE_OK.
    pub fn parse(payload: &'a [u8], num_params: u16) -> Result<Self, ProtocolError> {
        let mut r = Reader::new(payload, "COM_STMT_EXECUTE parameters");
        if num_params == 0 {
            return Err(ProtocolError::Unsupported(
                "COM_STMT_EXECUTE parameters of a statement without any",
            ));
        }
        let head = r.bytes(EXECUTE_HEAD_LEN)?;
        if head[0] != com::STMT_EXECUTE {
            return Err(ProtocolError::UnexpectedByte {
                what: "COM_STMT_EXECUTE",
                byte: head[0],
            });
        }
        let n = usize::from(num_params);
        let null_bitmap = r.bytes(n.div_ceil(8))?;
        // Servers read any non-zero byte as "types follow".
        let types = if r.u8()? != 0 {
            Some(r.bytes(2 * n)?)
        } else {
            None
        };
        Ok(Self {
            head,
            null_bitmap,
            types,
            values: r.rest(),
            num_params,
        })
    }

    pub fn num_params(&self) -> u16 {
        self.num_params
    }

    pub fn is_null(&self, i: usize) -> bool {
        self.null_bitmap
            .get(i / 8)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    /// The same execute carrying `types` (2 bytes per parameter); `None` if the length is wrong.
    pub fn with_types(self, types: &'a [u8]) -> Option<Self> {
        (types.len() == 2 * usize::from(self.num_params)).then_some(Self {
            types: Some(types),
            ..self
        })
    }

    /// Bytes [`Self::write`] emits.
    pub fn encoded_len(&self) -> usize {
        self.head.len()
            + self.null_bitmap.len()
            + 1
            + self.types.map_or(0, <[u8]>::len)
            + self.values.len()
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.extend_from_slice(self.head);
        out.extend_from_slice(self.null_bitmap);
        out.push(u8::from(self.types.is_some()));
        if let Some(t) = self.types {
            out.extend_from_slice(t);
        }
        out.extend_from_slice(self.values);
    }

    /// Whether `types` read the values exactly: each non-NULL parameter's value where its type
    /// says it ends, the last one at the payload's end.
    pub fn fits(&self, types: &[u8]) -> bool {
        if types.len() != 2 * usize::from(self.num_params) {
            return false;
        }
        let mut at = 0;
        for i in 0..usize::from(self.num_params) {
            if self.is_null(i) {
                continue;
            }
            match value_len(types[2 * i], &self.values[at..]) {
                Some(n) => at += n,
                None => return false,
            }
        }
        at == self.values.len()
    }

    /// Whether a non-NULL parameter has [`field_type::NULL`] in `types`: a type a guess left
    /// unknown because the parameter had no value then.
    pub fn has_unknown(&self, types: &[u8]) -> bool {
        (0..usize::from(self.num_params))
            .any(|i| !self.is_null(i) && types.get(2 * i) == Some(&field_type::NULL))
    }
}

/// Bytes one value of type `ty` takes at the start of `b`, as a server reads it; `None` when
/// `b` is too short for it or the type has no binary encoding a server accepts.
pub fn value_len(ty: u8, b: &[u8]) -> Option<usize> {
    use field_type::*;
    let n = match ty {
        TINY => 1,
        SHORT | YEAR => 2,
        LONG | INT24 | FLOAT => 4,
        LONGLONG | DOUBLE => 8,
        DATE | DATETIME | TIMESTAMP | TIME | NEWDATE => 1 + usize::from(*b.first()?),
        DECIMAL | VARCHAR | BIT | JSON | NEWDECIMAL | ENUM | SET | TINY_BLOB | MEDIUM_BLOB
        | LONG_BLOB | BLOB | VAR_STRING | STRING | GEOMETRY => {
            let (len, hdr) = read_lenenc_int(b).ok()?;
            hdr.checked_add(usize::try_from(len).ok()?)?
        }
        _ => return None,
    };
    (n <= b.len()).then_some(n)
}

/// The first assignment of types, in the order of the module documentation, that reads the
/// execute's values exactly and that `accept` takes: 2 bytes per parameter. `None` when there
/// is none, or none within the budget.
pub fn guess(exec: &ExecuteParams<'_>, mut accept: impl FnMut(&[u8]) -> bool) -> Option<Vec<u8>> {
    let mut best: Option<(u32, Vec<u8>)> = None;
    let mut seen = 0;
    search(exec, &mut |t, cost| {
        seen += 1;
        if best.as_ref().is_none_or(|b| cost < b.0) && accept(t) {
            best = Some((cost, t.to_vec()));
        }
        // Nothing ranks before an accepted candidate of cost 0 found first.
        if best.as_ref().is_some_and(|b| b.0 == 0) || seen >= RANKED {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    best.map(|b| b.1)
}

/// Up to `max` assignments, best first: the ranking [`guess`] picks from.
pub fn guesses(exec: &ExecuteParams<'_>, max: usize) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    search(exec, &mut |t, cost| {
        all.push((cost, t.to_vec()));
        if all.len() >= RANKED {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    all.sort_by_key(|c| c.0);
    all.into_iter().take(max).map(|c| c.1).collect()
}

/// Complete assignments ranked per guess: the first found in walk order.
const RANKED: usize = 64;

/// What ranks a reading after others: a number read from bytes that are all printable text.
/// Such bytes are most likely the middle of a string an earlier reading cut in the wrong place
/// (a LONG and an 11-character string also read as two LONGLONGs, the second all digits).
fn reading_cost(r: &Reading, b: &[u8]) -> u32 {
    use field_type::*;
    let numeric = matches!(r.ty, TINY | SHORT | LONG | LONGLONG | FLOAT | DOUBLE);
    let texty = b
        .get(..r.len)
        .is_some_and(|v| v.iter().all(|c| (0x20..=0x7e).contains(c)));
    u32::from(numeric && r.len >= 2 && texty)
}

/// One way to read the value at some position: its type, flags and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reading {
    ty: u8,
    flags: u8,
    len: usize,
}

/// Ways to read a value, in order of preference (module documentation): [`reading`]'s slots.
const SLOTS: usize = 14;

/// A length-encoded string at some position: its total length, and whether its content is
/// text and whether it is empty.
#[derive(Clone, Copy, Debug)]
struct StringAt {
    len: usize,
    text: bool,
    empty: bool,
}

/// Where each position's next control byte is (or the end): whether a string's content holds
/// one is then known without reading it, so a reading costs the same at any length.
fn next_controls(values: &[u8]) -> Vec<u32> {
    let mut next = vec![values.len() as u32; values.len() + 1];
    for i in (0..values.len()).rev() {
        next[i] = if is_control(values[i]) {
            i as u32
        } else {
            next[i + 1]
        };
    }
    next
}

/// ASCII control characters other than tab, newline and carriage return.
fn is_control(b: u8) -> bool {
    (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || b == 0x7f
}

fn string_at(values: &[u8], controls: &[u32], off: usize) -> Option<StringAt> {
    let (len, hdr) = read_lenenc_int(&values[off..]).ok()?;
    if hdr != super::lenenc_int_len(len) {
        return None;
    }
    let len = usize::try_from(len).ok()?;
    let end = (off + hdr).checked_add(len)?;
    if end > values.len() {
        return None;
    }
    Some(StringAt {
        len: hdr + len,
        text: len > 0 && controls[off + hdr] as usize >= end,
        empty: len == 0,
    })
}

/// Reading number `slot` of the value at the start of `b`, if it applies there.
fn reading(b: &[u8], string: Option<StringAt>, slot: usize) -> Option<Reading> {
    use field_type::*;
    let fixed =
        |len: usize, ty: u8, flags: u8| (b.len() >= len).then_some(Reading { ty, flags, len });
    let unsigned = |len: usize, ty: u8| {
        b.get(len - 1)
            .filter(|&&top| top & 0x80 != 0)
            .map(|_| Reading {
                ty,
                flags: UNSIGNED,
                len,
            })
    };
    let prefixed = |ty: u8, len: Option<usize>| len.map(|len| Reading { ty, flags: 0, len });
    match slot {
        0 => prefixed(VAR_STRING, string.filter(|s| s.text).map(|s| s.len)),
        1 => fixed(8, LONGLONG, 0),
        2 => fixed(4, LONG, 0),
        3 => fixed(2, SHORT, 0),
        4 => fixed(1, TINY, 0),
        5 => unsigned(8, LONGLONG),
        6 => unsigned(4, LONG),
        7 => unsigned(2, SHORT),
        8 => unsigned(1, TINY),
        9 => b
            .get(..8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(f64::from_le_bytes)
            .filter(|v| *v == 0.0 || v.is_normal())
            .and_then(|_| fixed(8, DOUBLE, 0)),
        10 => b
            .get(..4)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(f32::from_le_bytes)
            .filter(|v| *v == 0.0 || v.is_normal())
            .and_then(|_| fixed(4, FLOAT, 0)),
        11 => string.map(|s| Reading {
            ty: if s.empty { VAR_STRING } else { BLOB },
            flags: 0,
            len: s.len,
        }),
        12 => prefixed(DATETIME, valid_datetime(b)),
        13 => prefixed(TIME, valid_time(b)),
        _ => None,
    }
}

/// DATETIME/DATE/TIMESTAMP: length 0, 4 (date), 7 (+ time), 11 (+ microseconds).
fn valid_datetime(b: &[u8]) -> Option<usize> {
    let len = usize::from(*b.first()?);
    let f = b.get(1..1 + len)?;
    let ok = match len {
        0 => true,
        4 | 7 | 11 => {
            let year = u16::from_le_bytes([f[0], f[1]]);
            let (month, day) = (f[2], f[3]);
            let date = year <= 9999
                && ((1..=12).contains(&month) && (1..=31).contains(&day)
                    || (year, month, day) == (0, 0, 0));
            let time = len < 7 || (f[4] <= 23 && f[5] <= 59 && f[6] <= 59);
            let micro = len < 11 || u32::from_le_bytes([f[7], f[8], f[9], f[10]]) < 1_000_000;
            date && time && micro
        }
        _ => false,
    };
    ok.then_some(1 + len)
}

/// TIME: length 0, 8 (sign, days, h, m, s), 12 (+ microseconds); within ±838:59:59.
fn valid_time(b: &[u8]) -> Option<usize> {
    let len = usize::from(*b.first()?);
    let f = b.get(1..1 + len)?;
    let ok = match len {
        0 => true,
        8 | 12 => {
            let days = u32::from_le_bytes([f[1], f[2], f[3], f[4]]);
            let micro = len < 12 || u32::from_le_bytes([f[8], f[9], f[10], f[11]]) < 1_000_000;
            f[0] <= 1 && days <= 34 && f[5] <= 23 && f[6] <= 59 && f[7] <= 59 && micro
        }
        _ => false,
    };
    ok.then_some(1 + len)
}

/// A value being read in [`search`]: where it starts, the next reading to try, whether any
/// complete assignment was found below it, the string that may start there, and the cost of
/// the readings before it.
struct Frame {
    off: usize,
    slot: usize,
    any: bool,
    string: Option<StringAt>,
    cost: u32,
}

impl Frame {
    fn at(values: &[u8], controls: &[u32], off: usize, cost: u32) -> Self {
        Self {
            off,
            slot: 0,
            any: false,
            string: string_at(values, controls, off),
            cost,
        }
    }
}

/// The depth-first walk over readings: calls `visit` with each complete assignment and its
/// cost, in walk order, until it breaks or the budget runs out. Iterative: a statement may have
/// 65,535 parameters.
fn search(exec: &ExecuteParams<'_>, visit: &mut dyn FnMut(&[u8], u32) -> ControlFlow<()>) {
    let n = usize::from(exec.num_params);
    let mut present = Vec::new();
    for i in 0..n {
        if !exec.is_null(i) {
            present.push(i);
        }
    }
    let values = exec.values;
    // Every value takes at least a byte; offsets are kept as u32.
    if present.len() > values.len()
        || present.len() > MAX_GUESSED_VALUES
        || u32::try_from(values.len()).is_err()
    {
        return;
    }
    let mut types = vec![0u8; 2 * n];
    for i in 0..n {
        if exec.is_null(i) {
            types[2 * i] = field_type::NULL;
        }
    }
    if present.is_empty() {
        if values.is_empty() {
            let _ = visit(&types, 0);
        }
        return;
    }
    let mut budget =
        GUESS_BUDGET.saturating_add(GUESS_BUDGET_PER_VALUE.saturating_mul(present.len()));
    // (value index, offset) from which no assignment reads the rest exactly: the same whatever
    // was chosen before, so each is explored once.
    let mut dead: HashSet<(usize, usize)> = HashSet::new();
    let controls = next_controls(values);
    let mut stack = Vec::with_capacity(present.len().min(1024));
    stack.push(Frame::at(values, &controls, 0, 0));
    while let Some(k) = stack.len().checked_sub(1) {
        let top = &mut stack[k];
        let off = top.off;
        let rest = &values[off..];
        let mut found = None;
        if top.slot > 0 || !dead.contains(&(k, off)) {
            while top.slot < SLOTS && found.is_none() {
                if budget == 0 {
                    return;
                }
                budget -= 1;
                found = reading(rest, top.string, top.slot);
                top.slot += 1;
            }
        }
        let Some(r) = found else {
            let any = stack.pop().is_some_and(|f| f.any);
            match stack.last_mut() {
                Some(parent) if any => parent.any = true,
                _ if !any && dead.len() < DEAD_ENDS_KEPT => {
                    dead.insert((k, off));
                }
                _ => {}
            }
            continue;
        };
        // The values after this one need a byte each.
        let after = present.len() - k - 1;
        if rest.len() - r.len < after {
            continue;
        }
        let i = present[k];
        types[2 * i] = r.ty;
        types[2 * i + 1] = r.flags;
        let end = off + r.len;
        let cost = top.cost + reading_cost(&r, rest);
        if after > 0 {
            stack.push(Frame::at(values, &controls, end, cost));
        } else if end == values.len() {
            stack[k].any = true;
            if visit(&types, cost).is_break() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::field_type::*;
    use super::*;
    use crate::mysql::fixtures::{self, hex};
    use crate::mysql::write_lenenc_bytes;
    use proptest::prelude::*;

    /// An execute of statement 1 with `bitmap`, no types, and `values`.
    fn execute(bitmap: &[u8], values: &[u8]) -> Vec<u8> {
        let mut p = vec![com::STMT_EXECUTE, 1, 0, 0, 0, 0, 1, 0, 0, 0];
        p.extend_from_slice(bitmap);
        p.push(0);
        p.extend_from_slice(values);
        p
    }

    fn types(t: &[(u8, u8)]) -> Vec<u8> {
        t.iter().flat_map(|&(a, b)| [a, b]).collect()
    }

    #[test]
    fn parses_and_emits_sysbench_executes() {
        // With types: LONGLONG 51.
        let typed = hex(fixtures::SB_EXECUTE_PARAMS);
        let e = ExecuteParams::parse(&typed, 1).unwrap();
        assert_eq!(e.types, Some(&[LONGLONG, 0][..]));
        assert_eq!(e.values, &51u64.to_le_bytes()[..]);
        assert!(e.fits(&[LONGLONG, 0]));
        assert!(!e.fits(&[LONG, 0]));
        let mut out = Vec::new();
        e.write(&mut out);
        assert_eq!(out, typed);
        assert_eq!(e.encoded_len(), typed.len());

        // The same statement's later executes: no types.
        let bare = execute(&[0], &51u64.to_le_bytes());
        let e = ExecuteParams::parse(&bare, 1).unwrap();
        assert_eq!(e.types, None);
        let mut out = Vec::new();
        e.with_types(&[LONGLONG, 0]).unwrap().write(&mut out);
        assert_eq!(out[..], typed[..]);
        assert!(e.with_types(&[LONGLONG]).is_none());
        assert_eq!(guess(&e, |_| true), Some(vec![LONGLONG, 0]));
    }

    #[test]
    fn refuses_what_is_not_a_parameter_block() {
        assert!(ExecuteParams::parse(&execute(&[0], &[]), 0).is_err());
        assert!(ExecuteParams::parse(&[com::STMT_EXECUTE, 1, 0, 0, 0], 1).is_err());
        assert!(
            ExecuteParams::parse(&execute(&[], &[]), 9).is_err(),
            "bitmap of 2 bytes"
        );
        let mut q = execute(&[0], &[]);
        q[0] = com::QUERY;
        assert!(ExecuteParams::parse(&q, 1).is_err());
        // The flag says types follow, and they do not.
        let mut t = execute(&[0], &[]);
        *t.last_mut().unwrap() = 1;
        t.push(LONG);
        assert!(ExecuteParams::parse(&t, 1).is_err());
    }

    #[test]
    fn value_lengths_by_type() {
        assert_eq!(value_len(TINY, &[1, 2]), Some(1));
        assert_eq!(value_len(YEAR, &[1, 2]), Some(2));
        assert_eq!(value_len(LONG, &[1, 2]), None);
        assert_eq!(value_len(DOUBLE, &[0; 8]), Some(8));
        assert_eq!(value_len(DATETIME, &[4, 0xe8, 7, 1, 2]), Some(5));
        assert_eq!(value_len(TIME, &[8, 0]), None);
        assert_eq!(value_len(VAR_STRING, b"\x03abcd"), Some(4));
        assert_eq!(value_len(NEWDECIMAL, b"\x041.50"), Some(5));
        assert_eq!(value_len(BLOB, &[0xfc, 0x00, 0x01]), None);
        assert_eq!(value_len(NULL, &[0]), None);
        assert_eq!(value_len(0x42, &[0]), None);
    }

    #[test]
    fn guesses_integers_of_the_exact_width() {
        let long = execute(&[0], &7u32.to_le_bytes());
        let e = ExecuteParams::parse(&long, 1).unwrap();
        let all = guesses(&e, 10);
        assert_eq!(all[0], vec![LONG, 0]);
        // A float of integer bits is denormal: not a reading.
        assert!(!all.contains(&vec![FLOAT, 0]));

        // BETWEEN ? AND ? with two LONGLONGs: 16 bytes read only as 8 + 8.
        let mut v = 5000u64.to_le_bytes().to_vec();
        v.extend_from_slice(&5099u64.to_le_bytes());
        let b = execute(&[0], &v);
        let e = ExecuteParams::parse(&b, 2).unwrap();
        assert_eq!(
            guess(&e, |_| true),
            Some(types(&[(LONGLONG, 0), (LONGLONG, 0)]))
        );

        // Unsigned only where the top bit makes a difference.
        let big = execute(&[0], &u32::MAX.to_le_bytes());
        let e = ExecuteParams::parse(&big, 1).unwrap();
        let all = guesses(&e, 10);
        assert_eq!(all[0], vec![LONG, 0]);
        assert!(all.contains(&vec![LONG, UNSIGNED]));
        assert!(
            !guesses(&ExecuteParams::parse(&long, 1).unwrap(), 20).contains(&vec![LONG, UNSIGNED])
        );
    }

    #[test]
    fn guesses_text_strings_before_integers_and_mixes() {
        // id = 5, c = 'abc': the text is self-describing, the integer fits any 4 bytes.
        let mut v = 5u32.to_le_bytes().to_vec();
        write_lenenc_bytes(b"abc", &mut v);
        let b = execute(&[0], &v);
        let e = ExecuteParams::parse(&b, 2).unwrap();
        assert_eq!(
            guess(&e, |_| true),
            Some(types(&[(LONG, 0), (VAR_STRING, 0)]))
        );

        // A 120-character sysbench `c` then an id.
        let mut v = Vec::new();
        write_lenenc_bytes(&[b'7'; 120], &mut v);
        v.extend_from_slice(&42u64.to_le_bytes());
        let b = execute(&[0], &v);
        let e = ExecuteParams::parse(&b, 2).unwrap();
        assert_eq!(
            guess(&e, |_| true),
            Some(types(&[(VAR_STRING, 0), (LONGLONG, 0)]))
        );

        // id = 42, c = '83868-70364': also two LONGLONGs, the second of digits only.
        let mut v = 42u32.to_le_bytes().to_vec();
        write_lenenc_bytes(b"83868-70364", &mut v);
        let b = execute(&[0], &v);
        let e = ExecuteParams::parse(&b, 2).unwrap();
        let all = guesses(&e, 10);
        assert!(all.contains(&types(&[(LONGLONG, 0), (LONGLONG, 0)])));
        assert_eq!(all[0], types(&[(LONG, 0), (VAR_STRING, 0)]));
        assert_eq!(guess(&e, |_| true), Some(all[0].clone()));
        assert_eq!(guess(&e, |t| t != all[0]), Some(all[1].clone()));

        // Binary content is a BLOB; a 300-byte string has a 3-byte length.
        let mut v = Vec::new();
        write_lenenc_bytes(&[0x01; 300], &mut v);
        let b = execute(&[0], &v);
        let e = ExecuteParams::parse(&b, 1).unwrap();
        assert_eq!(guess(&e, |_| true), Some(vec![BLOB, 0]));
    }

    #[test]
    fn nulls_take_no_bytes_and_stay_unknown() {
        // Parameters 0 and 2 of 3 NULL; parameter 1 a LONG.
        let b = execute(&[0b101], &9u32.to_le_bytes());
        let e = ExecuteParams::parse(&b, 3).unwrap();
        let g = guess(&e, |_| true).unwrap();
        assert_eq!(g, types(&[(NULL, 0), (LONG, 0), (NULL, 0)]));
        assert!(e.fits(&g));
        assert!(!e.has_unknown(&g));
        // The next execute has a value for parameter 0.
        let mut v = 1u32.to_le_bytes().to_vec();
        v.extend_from_slice(&9u32.to_le_bytes());
        let b2 = execute(&[0b100], &v);
        let e2 = ExecuteParams::parse(&b2, 3).unwrap();
        assert!(e2.has_unknown(&g));
        assert!(!e2.fits(&g));
        // All NULL: one assignment, no bytes.
        let b = execute(&[0b11], &[]);
        let e = ExecuteParams::parse(&b, 2).unwrap();
        assert_eq!(guesses(&e, 5), vec![types(&[(NULL, 0), (NULL, 0)])]);
    }

    #[test]
    fn temporal_readings_need_valid_fields() {
        // 2024-03-15 12:30:45.
        let dt = [7, 0xe8, 0x07, 3, 15, 12, 30, 45];
        let b = execute(&[0], &dt);
        let e = ExecuteParams::parse(&b, 1).unwrap();
        let all = guesses(&e, 50);
        assert!(all.contains(&vec![DATETIME, 0]), "{all:?}");
        assert!(!all.contains(&vec![TIME, 0]));
        // Month 13 is no date.
        let bad = [7, 0xe8, 0x07, 13, 15, 12, 30, 45];
        let b = execute(&[0], &bad);
        let e = ExecuteParams::parse(&b, 1).unwrap();
        assert!(!guesses(&e, 50).contains(&vec![DATETIME, 0]));
        // -01:02:03 as TIME.
        let t = [8, 1, 0, 0, 0, 0, 1, 2, 3];
        let b = execute(&[0], &t);
        let e = ExecuteParams::parse(&b, 1).unwrap();
        assert!(guesses(&e, 50).contains(&vec![TIME, 0]));
    }

    #[test]
    fn accept_moves_on_to_the_next_candidate() {
        // LONG 1667391747 is "\x03abc": text first, then the integer, the float, the BLOB.
        let b = execute(&[0], b"\x03abc");
        let e = ExecuteParams::parse(&b, 1).unwrap();
        let all = guesses(&e, 10);
        assert_eq!(
            all,
            vec![
                vec![VAR_STRING, 0],
                vec![LONG, 0],
                vec![FLOAT, 0],
                vec![BLOB, 0]
            ]
        );
        let second = guess(&e, |t| t != all[0]).unwrap();
        assert_eq!(second, all[1]);
        assert_eq!(guess(&e, |_| false), None);
        // A small integer has one reading.
        let b = execute(&[0], &7u32.to_le_bytes());
        let e = ExecuteParams::parse(&b, 1).unwrap();
        assert_eq!(guesses(&e, 10), vec![vec![LONG, 0]]);
    }

    #[test]
    fn nothing_fits_bytes_no_reading_explains() {
        // Two parameters, one byte.
        let b = execute(&[0], &[1]);
        assert_eq!(guess(&ExecuteParams::parse(&b, 2).unwrap(), |_| true), None);
        // A string longer than the packet.
        let b = execute(&[0], &[0xfc, 0xff, 0xff, 1, 2]);
        let e = ExecuteParams::parse(&b, 1).unwrap();
        assert_eq!(guess(&e, |_| true), None);
    }

    #[test]
    fn a_hostile_execute_costs_a_bounded_search() {
        // 2,000 values of 0x02 bytes, one short of 8 each: they read as 1, 2, 3, 4 or 8 bytes,
        // so one would have to be 7 long. Without a bound the walk is exponential.
        let n = 2000u16;
        let bitmap = vec![0u8; usize::from(n).div_ceil(8)];
        let b = execute(&bitmap, &vec![0x02; 8 * usize::from(n) - 1]);
        let e = ExecuteParams::parse(&b, n).unwrap();
        assert_eq!(guess(&e, |_| true), None);
        // A long run of plain values still decodes.
        let b = execute(&bitmap, &vec![0x00; usize::from(n)]);
        let e = ExecuteParams::parse(&b, n).unwrap();
        let g = guess(&e, |_| true).unwrap();
        assert!(e.fits(&g));
    }

    proptest! {
        #[test]
        fn arbitrary_executes_never_panic_and_guesses_read_them_exactly(
            n in 1u16..12,
            bitmap in proptest::collection::vec(any::<u8>(), 2),
            values in proptest::collection::vec(any::<u8>(), 0..80),
            flag in any::<bool>(),
            max in 0usize..6,
        ) {
            let mut payload = vec![com::STMT_EXECUTE, 1, 0, 0, 0, 0, 1, 0, 0, 0];
            payload.extend_from_slice(&bitmap[..usize::from(n).div_ceil(8)]);
            payload.push(u8::from(flag));
            payload.extend_from_slice(&values);
            let Ok(e) = ExecuteParams::parse(&payload, n) else {
                return Ok(());
            };
            let mut out = Vec::new();
            e.write(&mut out);
            prop_assert_eq!(&out, &payload);
            let bare = ExecuteParams { types: None, ..e };
            prop_assert_eq!(guess(&bare, |_| true), guesses(&bare, 1).into_iter().next());
            for g in guesses(&bare, max) {
                prop_assert_eq!(g.len(), 2 * usize::from(n));
                prop_assert!(bare.fits(&g));
                let typed = bare.with_types(&g).unwrap();
                let mut out = Vec::new();
                typed.write(&mut out);
                prop_assert_eq!(out.len(), bare.encoded_len() + g.len());
                let back = ExecuteParams::parse(&out, n).unwrap();
                prop_assert_eq!(back.types, Some(&g[..]));
                prop_assert_eq!(back.values, bare.values);
            }
        }

        #[test]
        fn executes_a_client_could_send_always_decode(
            params in proptest::collection::vec(
                (0u8..8, any::<u64>(), "[ -~]{0,300}", proptest::collection::vec(any::<u8>(), 0..8)),
                1..12,
            ),
        ) {
            // What a client binds: integers of each width, doubles, text, short binary strings;
            // some NULL. (Long binary strings among many values can outlast the budget.)
            let n = params.len();
            let mut bitmap = vec![0u8; n.div_ceil(8)];
            let mut values = Vec::new();
            for (i, (kind, v, text, bin)) in params.iter().enumerate() {
                match kind {
                    0 => bitmap[i / 8] |= 1 << (i % 8),
                    1 => values.push(*v as u8),
                    2 => values.extend_from_slice(&(*v as u16).to_le_bytes()),
                    3 => values.extend_from_slice(&(*v as u32).to_le_bytes()),
                    4 => values.extend_from_slice(&v.to_le_bytes()),
                    5 => values.extend_from_slice(&(*v as f64 / 7.0).to_le_bytes()),
                    6 => write_lenenc_bytes(text.as_bytes(), &mut values),
                    _ => write_lenenc_bytes(bin, &mut values),
                }
            }
            let payload = execute(&bitmap, &values);
            let e = ExecuteParams::parse(&payload, n as u16).unwrap();
            let g = guess(&e, |_| true);
            prop_assert!(g.as_ref().is_some_and(|g| e.fits(g)), "{:?}", g);
        }

        #[test]
        fn parse_of_any_bytes_never_panics(
            payload in proptest::collection::vec(any::<u8>(), 0..60),
            n in any::<u16>(),
        ) {
            if let Ok(e) = ExecuteParams::parse(&payload, n) {
                let _ = (e.encoded_len(), e.is_null(3), e.has_unknown(&[0; 4]), e.fits(&[0; 4]));
                prop_assert_eq!(e.encoded_len(), payload.len());
            }
            for ty in 0..=255u8 {
                if let Some(l) = value_len(ty, &payload) {
                    prop_assert!(l <= payload.len());
                }
            }
        }
    }
}
