//! Query digests: which commands are "the same query" for the comparison report, and what about
//! a query makes its result legitimately differ between two servers.
//!
//! A report groups commands by a normalised **fingerprint**, in the spirit of pt-query-digest's
//! (so a DBA recognises the shapes), from a small lexer rather than regular expressions:
//!
//! * keywords and identifiers are lower-cased; backticks around plain identifiers are dropped
//!   (`` `c` `` and `c` are the same column), kept (lower-cased) around anything else;
//! * literals become `?`: strings (`'…'`, `"…"`, with charset introducers `_utf8mb4'…'` and
//!   `N'…'`), numbers (a sign in front of one after an operator or keyword included), hex and
//!   bit literals (`0x…`, `x'…'`, `0b…`, `b'…'`), `TRUE`/`FALSE`; dates are strings. `NULL`
//!   stays `null` (in `IS NULL` it is not a parameter) but counts as a literal inside lists;
//! * `IN (…)` of literals only becomes `in(?+)`, `VALUES (…), (…)` of literals only becomes
//!   `values(?+)` (also at the end of a text cut short), `LIMIT ?, ?` / `LIMIT ? OFFSET ?`
//!   becomes `limit ?`, `ASC` after `ORDER BY` goes, `CALL p(…)` becomes `call p`;
//! * comments go (`/* */`, `-- `, `#`, optimizer hints `/*+ */`); executable comments
//!   (`/*! … */`, `/*!40101 … */`, `/*M! … */`) are unwrapped: the server runs their content, so
//!   it is part of the query. pt-query-digest keeps them verbatim; unwrapping groups
//!   `SELECT /*!40001 SQL_NO_CACHE */ …` with its plain form's neighbours the same way;
//! * whitespace runs become one space (none is added where the text had none); a trailing `;`
//!   goes.
//!
//! Unlike pt-query-digest's default, digits inside identifiers are kept (`sbtest1` and `sbtest3`
//! are different tables: that is the point of a per-table regression), `NULL` is kept, and
//! `USE db` keeps its schema name. UNIONs of the same select are not folded.
//!
//! The digest **id** is FNV-1a 64 over the command type, a NUL and the fingerprint: stable
//! across runs, builds and hosts (no `RandomState`), shown as 16 hex digits.
//!
//! The same pass reports [`Traits`]: whether the statement's result is non-deterministic
//! (`NOW()`, `RAND()`, `UUID()`, `@@variables`, `LIMIT` without `ORDER BY`, `SHOW`, the
//! process list…), and whether it orders its rows (top-level `ORDER BY`): a result set without
//! one is compared as a multiset of rows, not marked noisy.
//!
//! [`PayloadHasher`] is the 64-bit hash both copier (production's rows) and intercept (the test
//! server's rows, `--compare-results`) compute over each packet payload, so the two sides'
//! checksums are comparable; [`RowChecksum`] combines row hashes ordered and order-independently.
//!
//! Nothing here panics, recurses, or allocates beyond its output (which is at most the input's
//! length plus a few bytes per collapsed list): texts are untrusted and may be cut anywhere.

/// FNV-1a 64 offset basis and prime.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// What a statement's text says about comparing its results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traits {
    /// The result may legitimately differ between two servers given the same data (current
    /// time, random numbers, ids of the connection, server variables, `LIMIT` without an
    /// order, server state): differences are not mismatches.
    pub nondeterministic: bool,
    /// A top-level `ORDER BY`: rows are compared in order. Without it, as a multiset.
    pub ordered: bool,
}

/// The current date and time, as a function or as a keyword by itself (`now()` and
/// `current_timestamp` alike); `lw` is the word in lower case (see [`Lowered`]).
fn clock_word(lw: &[u8]) -> bool {
    matches!(
        lw,
        b"current_timestamp"
            | b"current_date"
            | b"current_time"
            | b"localtime"
            | b"localtimestamp"
            | b"utc_timestamp"
            | b"utc_date"
            | b"utc_time"
    )
}

/// Functions (followed by `(`) whose value differs between servers or calls; `lw` is the
/// word in lower case (see [`Lowered`]).
fn nondet_function(lw: &[u8]) -> bool {
    clock_word(lw)
        || matches!(
            lw,
            b"now"
                | b"sysdate"
                | b"curdate"
                | b"curtime"
                | b"unix_timestamp"
                | b"rand"
                | b"uuid"
                | b"uuid_short"
                | b"sys_guid"
                | b"connection_id"
                | b"last_insert_id"
                | b"row_count"
                | b"found_rows"
                | b"benchmark"
                | b"master_pos_wait"
                | b"get_lock"
                | b"release_lock"
                | b"is_free_lock"
                | b"is_used_lock"
                | b"nextval"
                | b"lastval"
        )
}

/// Keywords that are a non-deterministic value by themselves (no parentheses needed); `lw` is
/// the word in lower case (see [`Lowered`]).
fn nondet_keyword(lw: &[u8]) -> bool {
    clock_word(lw) || matches!(lw, b"information_schema" | b"performance_schema")
}

/// Words after which a `-` or `+` starts a signed number rather than a subtraction.
const VALUE_EXPECTED_AFTER: &[&str] = &[
    "select",
    "where",
    "and",
    "or",
    "not",
    "by",
    "in",
    "values",
    "value",
    "set",
    "when",
    "then",
    "else",
    "return",
    "between",
    "like",
    "limit",
    "offset",
    "interval",
    "is",
    "on",
    "having",
    "div",
    "mod",
    "xor",
    "case",
    "regexp",
    "rlike",
    "escape",
    "returning",
    "if",
    "elseif",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok<'a> {
    /// Whitespace or a comment.
    Space,
    /// A keyword or unquoted identifier (maybe with a leading `1abc`-style digit).
    Word(&'a [u8]),
    /// A backtick-quoted identifier's body.
    Quoted(&'a [u8]),
    /// `@name`, `@@name`, `@@session.name`.
    Var(&'a [u8]),
    /// A string, number, hex or bit literal, or a `?` placeholder.
    Literal,
    Punct(u8),
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// A cursor over a SQL text. `Copy`, so lookahead is a copy.
#[derive(Clone, Copy, Debug)]
struct Lexer<'a> {
    sql: &'a [u8],
    pos: usize,
    /// Inside `/*! … */`: its closing `*/` is whitespace.
    in_exec: bool,
}

impl<'a> Lexer<'a> {
    fn new(sql: &'a [u8]) -> Self {
        Self {
            sql,
            pos: 0,
            in_exec: false,
        }
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.sql.get(at).copied()
    }

    /// The next token, `None` at the end.
    fn next(&mut self) -> Option<Tok<'a>> {
        let start = self.pos;
        let b = self.byte(start)?;
        let next = self.byte(start + 1);
        self.pos += 1;
        let tok = match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => {
                while self
                    .byte(self.pos)
                    .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
                {
                    self.pos += 1;
                }
                Tok::Space
            }
            b'#' => {
                self.skip_line();
                Tok::Space
            }
            b'-' if next == Some(b'-') && self.byte(start + 2).is_none_or(|c| c <= b' ') => {
                self.skip_line();
                Tok::Space
            }
            b'*' if self.in_exec && next == Some(b'/') => {
                self.in_exec = false;
                self.pos += 1;
                Tok::Space
            }
            b'/' if next == Some(b'*') => {
                self.comment();
                Tok::Space
            }
            b'\'' | b'"' => {
                self.pos = self.string_end(start + 1, b);
                Tok::Literal
            }
            b'`' => {
                let mut p = start + 1;
                loop {
                    match self.byte(p) {
                        None => break,
                        Some(b'`') if self.byte(p + 1) == Some(b'`') => p += 2,
                        Some(b'`') => break,
                        Some(_) => p += 1,
                    }
                }
                self.pos = (p + 1).min(self.sql.len());
                Tok::Quoted(self.sql.get(start + 1..p).unwrap_or(&[]))
            }
            b'@' => {
                let mut p = start + 1;
                if self.byte(p) == Some(b'@') {
                    p += 1;
                }
                match self.byte(p) {
                    Some(q @ (b'\'' | b'"' | b'`')) => p = self.string_end(p + 1, q),
                    _ => {
                        while self.byte(p).is_some_and(|c| is_word_byte(c) || c == b'.') {
                            p += 1;
                        }
                    }
                }
                self.pos = p;
                Tok::Var(&self.sql[start..p])
            }
            b'?' => Tok::Literal,
            b'.' if next.is_some_and(|c| c.is_ascii_digit()) => {
                self.pos = self.number_end(start);
                Tok::Literal
            }
            b'0'..=b'9' => {
                let end = self.number_end(start);
                if self.byte(end).is_some_and(is_word_byte) {
                    // `1abc` is an identifier.
                    self.pos = self.word_end(end);
                    Tok::Word(&self.sql[start..self.pos])
                } else {
                    self.pos = end;
                    Tok::Literal
                }
            }
            _ if is_word_byte(b) => {
                let end = self.word_end(start + 1);
                let word = &self.sql[start..end];
                match self.byte(end) {
                    // x'0A', b'01', N'text', _utf8mb4'text': one literal.
                    Some(q @ b'\'')
                        if matches!(word, [b'x' | b'X' | b'b' | b'B' | b'n' | b'N'])
                            || word.first() == Some(&b'_') =>
                    {
                        self.pos = self.string_end(end + 1, q);
                        Tok::Literal
                    }
                    Some(q @ b'"') if word.first() == Some(&b'_') => {
                        self.pos = self.string_end(end + 1, q);
                        Tok::Literal
                    }
                    _ => {
                        self.pos = end;
                        if word.eq_ignore_ascii_case(b"true") || word.eq_ignore_ascii_case(b"false")
                        {
                            Tok::Literal
                        } else {
                            Tok::Word(word)
                        }
                    }
                }
            }
            _ => Tok::Punct(b),
        };
        Some(tok)
    }

    fn word_end(&self, mut p: usize) -> usize {
        while self.byte(p).is_some_and(is_word_byte) {
            p += 1;
        }
        p
    }

    /// The end of a number starting at `start` (digits, one dot, an exponent; `0x…`, `0b…`).
    fn number_end(&self, start: usize) -> usize {
        let mut p = start;
        if self.byte(p) == Some(b'0') && matches!(self.byte(p + 1), Some(b'x' | b'X' | b'b' | b'B'))
        {
            let q = p + 2;
            let mut e = q;
            while self.byte(e).is_some_and(|c| c.is_ascii_hexdigit()) {
                e += 1;
            }
            if e > q {
                return e;
            }
        }
        while self.byte(p).is_some_and(|c| c.is_ascii_digit()) {
            p += 1;
        }
        if self.byte(p) == Some(b'.') {
            p += 1;
            while self.byte(p).is_some_and(|c| c.is_ascii_digit()) {
                p += 1;
            }
        }
        if matches!(self.byte(p), Some(b'e' | b'E')) {
            let mut q = p + 1;
            if matches!(self.byte(q), Some(b'+' | b'-')) {
                q += 1;
            }
            if self.byte(q).is_some_and(|c| c.is_ascii_digit()) {
                while self.byte(q).is_some_and(|c| c.is_ascii_digit()) {
                    q += 1;
                }
                p = q;
            }
        }
        p
    }

    /// Past the quote closing a string whose body starts at `p` (the end of the text if none).
    /// Backslashes escape (the default SQL mode); a doubled quote is one quote.
    fn string_end(&self, mut p: usize, quote: u8) -> usize {
        while let Some(c) = self.byte(p) {
            if c == b'\\' {
                p += 2;
                continue;
            }
            if c == quote {
                if self.byte(p + 1) == Some(quote) {
                    p += 2;
                    continue;
                }
                return p + 1;
            }
            p += 1;
        }
        self.sql.len()
    }

    fn skip_line(&mut self) {
        while let Some(b) = self.byte(self.pos) {
            self.pos += 1;
            if b == b'\n' {
                return;
            }
        }
    }

    /// At `/*` (already past the `/`): an executable comment is entered (its content is code),
    /// any other comment skipped whole.
    fn comment(&mut self) {
        let mut p = self.pos + 1;
        if self.byte(p) == Some(b'M') && self.byte(p + 1) == Some(b'!') {
            p += 1;
        }
        if self.byte(p) == Some(b'!') && !self.in_exec {
            p += 1;
            // The version (5 or 6 digits) is not code.
            while self.byte(p).is_some_and(|b| b.is_ascii_digit()) {
                p += 1;
            }
            self.pos = p;
            self.in_exec = true;
            return;
        }
        let body = self.pos + 1;
        self.pos = match self
            .sql
            .get(body..)
            .and_then(|r| r.windows(2).position(|w| w == b"*/"))
        {
            Some(i) => body + i + 2,
            None => self.sql.len(),
        };
    }

    /// The next token that is not whitespace.
    fn next_solid(&mut self) -> Option<Tok<'a>> {
        loop {
            match self.next()? {
                Tok::Space => continue,
                t => return Some(t),
            }
        }
    }

    /// Whether a (signed) literal comes next: where `LIMIT` swallows its arguments, `-1` must
    /// be one value, or the fingerprint of the fingerprint would swallow more than the first.
    fn next_value(&mut self) -> bool {
        match self.next_solid() {
            Some(Tok::Literal) => true,
            Some(Tok::Punct(b'-' | b'+')) => self.next_solid() == Some(Tok::Literal),
            _ => false,
        }
    }
}

/// A word in lower case, made once for every keyword test of it: testing each keyword list with
/// `eq_ignore_ascii_case`, item by item, was a third of what a fingerprint cost (issue 20: the
/// report fingerprints every text query). Words longer than any keyword are not copied (and
/// are no keyword).
struct Lowered {
    buf: [u8; Lowered::MAX],
    len: usize,
}

impl Lowered {
    /// The longest keyword the fingerprint tests ("information_schema").
    const MAX: usize = 18;

    fn new(w: &[u8]) -> Self {
        let mut l = Lowered {
            buf: [0; Lowered::MAX],
            len: 0,
        };
        if w.len() <= Self::MAX {
            for (d, s) in l.buf.iter_mut().zip(w) {
                *d = s.to_ascii_lowercase();
            }
            l.len = w.len();
        }
        l
    }

    /// The word in lower case, or empty if it is longer than any keyword.
    fn get(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn word_is(t: Option<Tok<'_>>, kw: &str) -> bool {
    matches!(t, Some(Tok::Word(w)) if w.eq_ignore_ascii_case(kw.as_bytes()))
}

fn is_null(t: Tok<'_>) -> bool {
    matches!(t, Tok::Word(w) if w.eq_ignore_ascii_case(b"null"))
}

/// After `(` (consumed): whether the list up to its `)` holds only literals, `NULL`, `-`/`+`
/// signs and commas. Returns the lexer past the `)` (or at the end of a text cut short).
fn literal_list(mut lx: Lexer<'_>) -> Option<Lexer<'_>> {
    let mut any = false;
    loop {
        let before = lx;
        match lx.next_solid() {
            None => return any.then_some(lx),
            // Cut short before trailing `;`s: the same as cut short at the end, which is what
            // the digest (trailing `;`s dropped) will look like the second time around.
            Some(Tok::Punct(b';')) => {
                let mut rest = lx;
                loop {
                    match rest.next_solid() {
                        None => return any.then_some(before),
                        Some(Tok::Punct(b';')) => {}
                        Some(_) => return None,
                    }
                }
            }
            Some(Tok::Punct(b')')) => return any.then_some(lx),
            Some(Tok::Literal) => any = true,
            Some(t) if is_null(t) => any = true,
            Some(Tok::Punct(b',' | b'-' | b'+')) => {}
            Some(_) => return None,
        }
    }
}

/// Normalised output under construction.
struct Out<'o> {
    buf: &'o mut Vec<u8>,
    space: bool,
}

impl Out<'_> {
    fn sep(&mut self) {
        if self.space && !self.buf.is_empty() {
            self.buf.push(b' ');
        }
        self.space = false;
    }
    fn lower(&mut self, w: &[u8]) {
        self.sep();
        self.buf.extend(w.iter().map(u8::to_ascii_lowercase));
    }
    fn raw(&mut self, w: &[u8]) {
        self.sep();
        self.buf.extend_from_slice(w);
    }
}

/// The fingerprint of `sql` appended to `out` (see the module documentation), and the
/// statement's [`Traits`]. Invalid UTF-8 passes through as bytes: identifiers are the only
/// input bytes kept.
pub fn fingerprint_into(sql: &[u8], out: &mut Vec<u8>) -> Traits {
    let base = out.len();
    let mut o = Out {
        buf: out,
        space: false,
    };
    let mut traits = Traits::default();
    let mut lx = Lexer::new(sql);
    // The last solid token emitted, to tell a sign from a subtraction.
    let mut prev: Option<Tok<'_>> = None;
    let mut depth: u32 = 0;
    let mut order_by = false;
    let mut in_order_by = false;
    let mut limit = false;
    let mut first_word = true;
    while let Some(t) = lx.next() {
        match t {
            Tok::Space => {
                o.space = true;
                continue;
            }
            Tok::Literal => o.raw(b"?"),
            Tok::Punct(s @ (b'-' | b'+')) if value_expected(prev) => {
                if let Some(after) = signed_literal(lx) {
                    lx = after;
                    o.raw(b"?");
                    prev = Some(Tok::Literal);
                    continue;
                }
                o.raw(&[s]);
            }
            Tok::Punct(b'(') => {
                depth = depth.saturating_add(1);
                o.raw(b"(");
            }
            Tok::Punct(b')') => {
                depth = depth.saturating_sub(1);
                o.raw(b")");
            }
            Tok::Punct(b';') => {
                // Trailing `;`s are dropped; a run of them between statements is one, so
                // that the digest of a digest is itself.
                let mut la = lx;
                let mut at_end = false;
                loop {
                    let mut peek = la;
                    match peek.next_solid() {
                        None => {
                            at_end = true;
                            break;
                        }
                        Some(Tok::Punct(b';')) => la = peek,
                        Some(_) => break,
                    }
                }
                if at_end {
                    break;
                }
                lx = la;
                o.raw(b";");
                first_word = true;
                depth = 0;
            }
            Tok::Punct(p) => o.raw(&[p]),
            Tok::Var(v) => {
                if v.starts_with(b"@@") {
                    traits.nondeterministic = true;
                }
                o.lower(v);
            }
            Tok::Quoted(q) => {
                // A quoted identifier is never a keyword, so it ends the statement's first word
                // too: "`id`call p(" must not read as a CALL the second time around.
                first_word = false;
                // Without its backticks the name must lex as the same one word next time: not
                // a number (`1e5` stays quoted), and not glued to what comes before or after
                // it (`@@v`id`` would read as `@@vid`, `` `id`values`` as `idvalues`): a space
                // keeps them apart, as the backticks did.
                let plain = q
                    .first()
                    .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_' || c == b'$')
                    && q.iter()
                        .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'$');
                let n = o.buf.len();
                let glued_before = match o.buf.get(n.wrapping_sub(1)) {
                    Some(&b'.') => o.buf.get(n.wrapping_sub(2)).is_some_and(u8::is_ascii_digit),
                    Some(&c) => is_word_byte(c) || c == b'@',
                    None => false,
                };
                let glued_after = lx
                    .byte(lx.pos)
                    .is_some_and(|c| is_word_byte(c) || matches!(c, b'`' | b'\'' | b'"'));
                if plain {
                    o.space |= glued_before;
                    o.lower(q);
                    o.space = glued_after;
                } else {
                    o.raw(b"`");
                    o.buf.extend(q.iter().map(u8::to_ascii_lowercase));
                    o.buf.push(b'`');
                }
            }
            Tok::Word(w) => {
                let lowered = Lowered::new(w);
                let word = lowered.get();
                let lw = |k: &str| word == k.as_bytes();
                if first_word {
                    first_word = false;
                    if lw("show") {
                        traits.nondeterministic = true;
                    }
                    if lw("call") {
                        // `call p(…)` -> `call p`: the arguments are values.
                        o.lower(w);
                        if let Some(Tok::Word(name) | Tok::Quoted(name)) = lx.next_solid() {
                            o.space = true;
                            o.lower(name);
                        }
                        return finish(o.buf, base, settle(traits, order_by, limit));
                    }
                }
                if nondet_keyword(word) {
                    traits.nondeterministic = true;
                }
                if nondet_function(word) {
                    let mut la = lx;
                    if la.next_solid() == Some(Tok::Punct(b'(')) {
                        traits.nondeterministic = true;
                    }
                }
                if lw("in") || lw("values") || lw("value") {
                    if let Some(after) = collapse_lists(lx, lw("in")) {
                        o.lower(w);
                        o.buf.extend_from_slice(b"(?+)");
                        lx = after;
                        prev = Some(Tok::Punct(b')'));
                        continue;
                    }
                }
                if lw("limit") {
                    limit = limit || depth == 0;
                    // `limit ?, ?` and `limit ? offset ?` -> `limit ?`.
                    let mut la = lx;
                    if la.next_value() {
                        let mut more = la;
                        match more.next_solid() {
                            Some(Tok::Punct(b',')) if more.next_value() => la = more,
                            Some(t) if word_is(Some(t), "offset") && more.next_value() => la = more,
                            _ => {}
                        }
                        // `limit 1, 2, 3` is not SQL, but its `limit ?,?` must digest the same
                        // the second time around: swallow every further `, literal`.
                        loop {
                            let mut more = la;
                            if more.next_solid() == Some(Tok::Punct(b',')) && more.next_value() {
                                la = more;
                            } else {
                                break;
                            }
                        }
                        o.lower(w);
                        o.buf.extend_from_slice(b" ?");
                        lx = la;
                        prev = Some(Tok::Literal);
                        continue;
                    }
                }
                if lw("order") {
                    let mut la = lx;
                    if word_is(la.next_solid(), "by") {
                        in_order_by = true;
                        if depth == 0 {
                            order_by = true;
                        }
                    }
                }
                if in_order_by && lw("asc") {
                    // ASC is the default: `order by c asc` is `order by c`.
                    o.space = false;
                    prev = Some(t);
                    continue;
                }
                o.lower(w);
            }
        }
        prev = Some(t);
    }
    traits = settle(traits, order_by, limit);
    finish(o.buf, base, traits)
}

/// The traits that depend on the whole statement, for every way out of the scan.
fn settle(mut traits: Traits, order_by: bool, limit: bool) -> Traits {
    traits.ordered = order_by;
    if limit && !order_by {
        // Which rows a LIMIT without ORDER BY returns is up to each server.
        traits.nondeterministic = true;
    }
    traits
}

fn finish(out: &mut Vec<u8>, base: usize, traits: Traits) -> Traits {
    while out.len() > base && out.last() == Some(&b' ') {
        out.pop();
    }
    traits
}

/// After a sign (consumed): the lexer past the literal it signs, through further signs
/// (`--1` is `-(-1)`), if one follows directly.
fn signed_literal(mut lx: Lexer<'_>) -> Option<Lexer<'_>> {
    loop {
        match lx.next()? {
            Tok::Literal => return Some(lx),
            Tok::Punct(b'-' | b'+') => continue,
            _ => return None,
        }
    }
}

/// Whether the token before a `-`/`+` makes it a sign.
fn value_expected(prev: Option<Tok<'_>>) -> bool {
    match prev {
        None => true,
        Some(Tok::Punct(b')')) => false,
        Some(Tok::Punct(_)) => true,
        Some(Tok::Word(w)) => VALUE_EXPECTED_AFTER
            .iter()
            .any(|k| w.eq_ignore_ascii_case(k.as_bytes())),
        Some(Tok::Literal | Tok::Quoted(_) | Tok::Var(_) | Tok::Space) => false,
    }
}

/// After `in` / `values` (not consumed): the lexer past `(…)` lists of literals only (one for
/// IN, one or more separated by commas for VALUES), or `None` if they are something else.
fn collapse_lists(lx: Lexer<'_>, single: bool) -> Option<Lexer<'_>> {
    let mut la = lx;
    if la.next_solid() != Some(Tok::Punct(b'(')) {
        return None;
    }
    let mut end = literal_list(la)?;
    if single {
        return Some(end);
    }
    loop {
        let mut more = end;
        if more.next_solid() != Some(Tok::Punct(b',')) {
            return Some(end);
        }
        match more.next_solid() {
            Some(Tok::Punct(b'(')) => {}
            // `values (…),` cut short.
            None => return Some(more),
            Some(_) => return Some(end),
        }
        match literal_list(more) {
            Some(after) => end = after,
            None => return Some(end),
        }
    }
}

/// [`fingerprint_into`] as a new string (invalid UTF-8 replaced).
pub fn fingerprint(sql: &[u8]) -> (String, Traits) {
    let mut out = Vec::with_capacity(sql.len().min(4096));
    let traits = fingerprint_into(sql, &mut out);
    (into_string(out), traits)
}

fn into_string(v: Vec<u8>) -> String {
    match String::from_utf8(v) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Words after which a statement's literals may be credentials or keys: `IDENTIFIED BY`,
/// `IDENTIFIED VIA .. USING`, `PASSWORD('..')`, `SET PASSWORD`, `MASTER_PASSWORD=`,
/// `CREATE SERVER .. OPTIONS (PASSWORD ..)`, and the functions that take a key.
const SECRET_WORDS: &[&[u8]] = &[
    b"IDENTIFIED",
    b"PASSWORD",
    b"OLD_PASSWORD",
    b"MASTER_PASSWORD",
    b"AES_ENCRYPT",
    b"AES_DECRYPT",
    b"DES_ENCRYPT",
    b"DES_DECRYPT",
    b"ENCODE",
    b"DECODE",
    b"ENCRYPT",
];

/// Whether `sql` may carry a password or key among its literals (see [`SECRET_WORDS`]): such
/// a statement is shown masked (by [`mask_literals`]) even when the user asked for literals,
/// since a report or a log is no place for a credential. Only keywords count, not
/// identifiers that merely look alike (`` `password` `` as a column name is quoted; an
/// unquoted column named `password` masks its statement too, on the safe side).
pub fn holds_secrets(sql: &[u8]) -> bool {
    let mut lx = Lexer::new(sql);
    while let Some(t) = lx.next() {
        if let Tok::Word(w) = t {
            if SECRET_WORDS.iter().any(|k| k.eq_ignore_ascii_case(w)) {
                return true;
            }
        }
    }
    false
}

/// `sql` with every literal value replaced by `?`, comments removed and whitespace collapsed,
/// but otherwise as written (case, lists, backticks): a report example that shows the query's
/// shape without the values, which may be personal data.
pub fn mask_literals(sql: &[u8]) -> String {
    let mut out = Vec::with_capacity(sql.len().min(4096));
    let mut lx = Lexer::new(sql);
    let mut space = false;
    let mut prev: Option<Tok<'_>> = None;
    let start = sql.as_ptr() as usize;
    while let Some(t) = lx.next() {
        let at = lx.pos;
        if t == Tok::Space {
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push(b' ');
        }
        space = false;
        match t {
            Tok::Literal => out.push(b'?'),
            Tok::Punct(s @ (b'-' | b'+')) if value_expected(prev) => {
                if let Some(after) = signed_literal(lx) {
                    lx = after;
                    out.push(b'?');
                    prev = Some(Tok::Literal);
                    continue;
                }
                out.push(s);
            }
            Tok::Punct(p) => out.push(p),
            Tok::Word(w) | Tok::Var(w) => out.extend_from_slice(w),
            Tok::Quoted(q) => {
                // The body is a slice of `sql`: take the quotes around it as written.
                let from = (q.as_ptr() as usize - start).saturating_sub(1);
                out.extend_from_slice(sql.get(from..at).unwrap_or(q));
            }
            Tok::Space => {}
        }
        prev = Some(t);
    }
    while out.last() == Some(&b' ') {
        out.pop();
    }
    into_string(out)
}

/// The statement's [`Traits`] without its fingerprint.
pub fn traits(sql: &[u8]) -> Traits {
    let mut scratch = Vec::new();
    fingerprint_into(sql, &mut scratch)
}

/// The digest id of a command type and fingerprint: FNV-1a 64 of `command`, NUL, `fingerprint`.
pub fn digest_id(command: &str, fingerprint: &[u8]) -> u64 {
    let h = fnv1a(FNV_OFFSET, command.as_bytes());
    let h = fnv1a(h, &[0]);
    fnv1a(h, fingerprint)
}

/// A digest id as shown in reports: 16 lower-case hex digits.
pub fn digest_hex(id: u64) -> String {
    format!("{id:016x}")
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

const HASH_K: u64 = 0x9e37_79b9_7f4a_7c15;

/// MurmurHash3's 64-bit finaliser: every input bit affects every output bit.
pub fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// A streaming 64-bit hash of one packet payload, fed in pieces of any size (TCP segments):
/// the result depends only on the bytes, never on how they were cut. Eight bytes per step, so
/// it costs little next to copying the bytes. Not cryptographic: it detects differences
/// between two honest servers' answers, nothing more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PayloadHasher {
    h: u64,
    tail: u64,
    tail_len: u8,
    len: u64,
}

impl PayloadHasher {
    pub fn new() -> Self {
        Self::default()
    }

    fn mix(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(HASH_K).rotate_left(31);
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len = self.len.wrapping_add(data.len() as u64);
        while self.tail_len > 0 && !data.is_empty() {
            self.tail |= u64::from(data[0]) << (8 * u32::from(self.tail_len));
            self.tail_len += 1;
            data = &data[1..];
            if self.tail_len == 8 {
                let w = self.tail;
                self.mix(w);
                self.tail = 0;
                self.tail_len = 0;
            }
        }
        if self.tail_len > 0 {
            // `data` ran out before the tail filled.
            return;
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        for (i, &b) in chunks.remainder().iter().enumerate() {
            self.tail |= u64::from(b) << (8 * i as u32);
        }
        self.tail_len = chunks.remainder().len() as u8;
    }

    pub fn finish(&self) -> u64 {
        let mut s = *self;
        if s.tail_len > 0 {
            // The marker bit keeps "ab" and "ab\0" apart (the length does too).
            let w = s.tail | (1u64 << (8 * u32::from(s.tail_len)));
            s.mix(w);
        }
        fmix64(s.h ^ s.len)
    }

    /// The hash of a whole payload.
    pub fn hash(payload: &[u8]) -> u64 {
        let mut h = Self::new();
        h.update(payload);
        h.finish()
    }
}

/// A result set's rows, combined two ways: in order, and as a multiset (the sum of the rows'
/// mixed hashes and their count), so a query without ORDER BY compares equal whatever order
/// each server returned its rows in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowChecksum {
    pub rows: u64,
    pub ordered: u64,
    pub unordered: u64,
}

impl RowChecksum {
    /// One row (or one 16 MiB piece of a row) whose payload hashed to `h`.
    pub fn add(&mut self, h: u64) {
        self.rows += 1;
        self.ordered = fmix64(self.ordered.wrapping_mul(HASH_K) ^ h);
        self.unordered = self.unordered.wrapping_add(fmix64(h));
    }

    /// A further piece of the last row (a row longer than one 16 MiB packet): it changes the
    /// checksums, not the row count.
    pub fn add_piece(&mut self, h: u64) {
        self.ordered = fmix64(self.ordered.wrapping_mul(HASH_K) ^ h);
        self.unordered = self.unordered.wrapping_add(fmix64(h ^ HASH_K));
    }

    /// Whether two results are the same: in order when `ordered`, else as multisets.
    pub fn same(&self, other: &RowChecksum, ordered: bool) -> bool {
        self.rows == other.rows
            && self.unordered == other.unordered
            && (!ordered || self.ordered == other.ordered)
    }
}

#[cfg(test)]
mod tests;
