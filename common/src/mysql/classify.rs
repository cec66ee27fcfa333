//! Whether a SQL text changes the server it runs on, for `--read-only` mirroring.
//!
//! The copier must keep writes away from a test server while the reads of the same sessions still
//! reach it. It sees SQL only as bytes (COM_QUERY, COM_STMT_PREPARE), in any character set, maybe
//! truncated, maybe hostile, so this is a small lexer and a keyword table, not a parser: it
//! decides from the statement's leading keywords and a few token sequences anywhere in it, and
//! when it does not know, it says "write" ([`WriteKind::Other`]), because a read that is not
//! mirrored costs fidelity while a write that is mirrored changes the test server.
//!
//! # What counts as a write
//!
//! * Data changes: INSERT, UPDATE, DELETE, REPLACE, LOAD DATA/XML, `WITH … UPDATE|DELETE`.
//! * DDL: CREATE, ALTER, DROP, RENAME, TRUNCATE (temporary tables included: they are a write as
//!   far as the statement can tell, and a session that relies on one fails on the test server
//!   instead of writing there).
//! * Reads that lock or leave the database: `… FOR UPDATE`, `FOR SHARE`, `LOCK IN SHARE MODE`
//!   (locking reads, which the issue asks to keep off), `INTO OUTFILE|DUMPFILE` (writes a file on
//!   the test host). `SELECT … INTO @var` only sets a session variable and stays a read.
//! * Sequences: `NEXTVAL(…)`, `SETVAL(…)`, `NEXT VALUE FOR` advance a MariaDB sequence.
//! * CALL (stored procedures may write), unless [`Rules::allow_calls`].
//! * Administration: GRANT, REVOKE, FLUSH, KILL (a thread id means another connection on the test
//!   server), LOCK TABLES, OPTIMIZE/ANALYZE/REPAIR/CHECK TABLE, INSTALL/UNINSTALL, RESET, PURGE,
//!   CHANGE MASTER, START/STOP SLAVE, SHUTDOWN, `SET GLOBAL|PERSIST|PASSWORD|DEFAULT ROLE`, ….
//! * Anything not recognised, including compound statements (`BEGIN NOT ATOMIC`, IF, …),
//!   `PREPARE … FROM @var` and `EXECUTE IMMEDIATE` of anything but a literal.
//!
//! Reads: SELECT, TABLE, VALUES, `WITH … SELECT`, SHOW, DESCRIBE/DESC/EXPLAIN (which do not run
//! the statement, except `EXPLAIN ANALYZE` and MariaDB's `ANALYZE <statement>`, which do and are
//! judged by that statement), session SET (including `SET STATEMENT … FOR <statement>`, judged by
//! the statement), USE, transaction control (BEGIN, START TRANSACTION in any mode, COMMIT,
//! ROLLBACK, SAVEPOINT, RELEASE SAVEPOINT, the XA statements: the writes inside are what is kept
//! off), UNLOCK TABLES, HELP, DO (evaluates expressions like SELECT without a result),
//! CHECKSUM TABLE, HANDLER (it has no writing form), GET DIAGNOSTICS, and the SQL-level prepared
//! statements (see below). A text of several statements writes if any of them does.
//!
//! What no lexer can see: a stored function called from a SELECT, SET or DO that writes. Run
//! the test server's account without write privileges on the tables if that matters.
//!
//! # Comments and quoting
//!
//! Comments are skipped (`/* */`, `-- `, `#`). Executable comments (`/*! … */`, `/*!50100 … */`,
//! `/*M! … */`) run on the server when their version is not above its own, which the lexer cannot
//! know: a text holding one is judged both ways (content as code, content as comment) and writes
//! if either reading does. The same for backslashes in string literals, which escape unless the
//! session runs with NO_BACKSLASH_ESCAPES: `'a\'; DELETE …` hides a DELETE in one reading only.
//!
//! # SQL-level prepared statements
//!
//! `PREPARE name FROM '<literal>'` is judged by the literal (a write is not mirrored, so the test
//! server only ever holds read statements under any name); any other source (`FROM @var`) is
//! [`WriteKind::Other`]. `EXECUTE name` is a read unless the caller says that `name`'s PREPARE was
//! not mirrored ([`classify_with`]'s `skipped`), in which case it writes like that statement;
//! [`Classified::names`] reports which names a text prepares or deallocates so the caller can keep
//! that record. `DEALLOCATE PREPARE` / `DROP PREPARE` are reads.
//!
//! Nothing here panics, allocates by input lengths except to unescape a PREPARE literal, or
//! recurses without a bound.

use std::fmt;

/// Why a statement is not a read: how the transform counts what it keeps off the test server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    Insert,
    Update,
    Delete,
    Replace,
    /// CREATE, ALTER, DROP, RENAME, TRUNCATE.
    Ddl,
    /// LOAD DATA and LOAD XML.
    LoadData,
    /// `SELECT … FOR UPDATE | FOR SHARE | LOCK IN SHARE MODE`.
    LockingRead,
    /// CALL of a stored procedure.
    Call,
    /// `SELECT … INTO OUTFILE | DUMPFILE`.
    SelectInto,
    /// Server administration (grants, FLUSH, KILL, LOCK TABLES, `SET GLOBAL`, …).
    Admin,
    /// Not recognised as a read; kept off to be safe.
    Other,
}

impl WriteKind {
    pub const ALL: [WriteKind; 11] = [
        WriteKind::Insert,
        WriteKind::Update,
        WriteKind::Delete,
        WriteKind::Replace,
        WriteKind::Ddl,
        WriteKind::LoadData,
        WriteKind::LockingRead,
        WriteKind::Call,
        WriteKind::SelectInto,
        WriteKind::Admin,
        WriteKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WriteKind::Insert => "insert",
            WriteKind::Update => "update",
            WriteKind::Delete => "delete",
            WriteKind::Replace => "replace",
            WriteKind::Ddl => "ddl",
            WriteKind::LoadData => "load_data",
            WriteKind::LockingRead => "locking_read",
            WriteKind::Call => "call",
            WriteKind::SelectInto => "select_into",
            WriteKind::Admin => "admin",
            WriteKind::Other => "other",
        }
    }
}

impl fmt::Display for WriteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What running a SQL text would do to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Read,
    Write(WriteKind),
}

impl Effect {
    pub fn is_read(self) -> bool {
        self == Effect::Read
    }

    /// The first write wins: it names the text in counters.
    fn and(self, other: Effect) -> Effect {
        match self {
            Effect::Read => other,
            w => w,
        }
    }
}

/// A SQL-level prepared statement name the text defines or drops, in text order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameUse {
    /// `PREPARE name FROM …`, with what the prepared statement does.
    Prepare { name: Vec<u8>, effect: Effect },
    /// `DEALLOCATE PREPARE name` / `DROP PREPARE name`.
    Deallocate { name: Vec<u8> },
}

/// The verdict on a SQL text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    pub effect: Effect,
    /// Prepared statement names the text prepares or deallocates (empty for almost every text).
    pub names: Vec<NameUse>,
}

/// Statements nested in statements (`EXPLAIN ANALYZE`, `SET STATEMENT … FOR`, PREPARE literals)
/// deeper than this are not followed.
const MAX_DEPTH: u8 = 8;

/// What the caller allows and remembers.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    /// CALL is a read: the operator vouches that the procedures do not write.
    pub allow_calls: bool,
    /// For a (lowercased) SQL-level prepared statement name: the kind of its PREPARE if that was
    /// not mirrored, so `EXECUTE name` is not either.
    pub skipped: &'a dyn Fn(&[u8]) -> Option<WriteKind>,
}

fn nothing_skipped(_: &[u8]) -> Option<WriteKind> {
    None
}

impl Default for Rules<'_> {
    fn default() -> Self {
        Self {
            allow_calls: false,
            skipped: &nothing_skipped,
        }
    }
}

impl fmt::Debug for Rules<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("allow_calls", &self.allow_calls)
            .finish_non_exhaustive()
    }
}

/// Classifies `sql` with the default [`Rules`] (CALL writes, no name was kept off).
pub fn classify(sql: &[u8]) -> Classified {
    classify_with(sql, &Rules::default())
}

/// Classifies `sql`.
pub fn classify_with(sql: &[u8], rules: &Rules<'_>) -> Classified {
    classify_at(sql, rules, 0)
}

/// Whether `sql` opens a transaction explicitly: `BEGIN [WORK]`, `START TRANSACTION …` or
/// `XA START|BEGIN …` as its first statement. A picked-up connection whose production reply
/// says "in a transaction" began that transaction here, not before the copier saw it.
/// `BEGIN NOT ATOMIC` (a compound statement) is not one. Executable comments are read as code.
pub fn starts_transaction(sql: &[u8]) -> bool {
    let mut lx = Lexer::new(
        sql,
        Reading {
            exec_comments: true,
            backslash_escapes: true,
        },
    );
    lx.next_statement();
    let first = lx.next();
    if is(first, "BEGIN") {
        let next = lx.next();
        return matches!(next, Tok::End) || is(next, "WORK");
    }
    if is(first, "START") {
        return is(lx.next(), "TRANSACTION");
    }
    is(first, "XA") && is_any(lx.next(), &["START", "BEGIN"])
}

fn classify_at(sql: &[u8], rules: &Rules<'_>, depth: u8) -> Classified {
    if depth > MAX_DEPTH {
        return Classified {
            effect: Effect::Write(WriteKind::Other),
            names: Vec::new(),
        };
    }
    let first = Reading {
        exec_comments: true,
        backslash_escapes: true,
    };
    let (mut out, seen) = classify_once(sql, first, rules, depth);
    if !out.effect.is_read() {
        return out;
    }
    // Other readings of the same bytes, only when the text has what makes them differ.
    for exec_comments in [true, false] {
        for backslash_escapes in [true, false] {
            let r = Reading {
                exec_comments,
                backslash_escapes,
            };
            if r == first
                || (!exec_comments && !seen.exec_comment)
                || (!backslash_escapes && !seen.backslash_in_string)
            {
                continue;
            }
            let (other, _) = classify_once(sql, r, rules, depth);
            if !other.effect.is_read() {
                out.effect = other.effect;
                return out;
            }
        }
    }
    out
}

fn classify_once(sql: &[u8], reading: Reading, rules: &Rules<'_>, depth: u8) -> (Classified, Seen) {
    let mut c = Classifier {
        lx: Lexer::new(sql, reading),
        rules,
        names: Vec::new(),
        depth,
    };
    let mut effect = Effect::Read;
    while !c.lx.at_end() {
        c.lx.next_statement();
        effect = effect.and(c.statement(0));
    }
    (
        Classified {
            effect,
            names: c.names,
        },
        c.lx.seen,
    )
}

// ------------------------------------------------------------------ lexer

/// How the server may read the text (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reading {
    exec_comments: bool,
    backslash_escapes: bool,
}

/// What the lexer met that another [`Reading`] would see differently.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    exec_comment: bool,
    backslash_in_string: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok<'a> {
    /// A keyword, identifier, number or variable (`@v`, `@@global.v`), as written.
    Word(&'a [u8]),
    /// A string literal's raw contents (escapes not undone), and its quote.
    Str(&'a [u8], u8),
    /// A backquoted identifier's raw contents.
    Ident(&'a [u8]),
    Punct(u8),
    /// `;` or the end of the text.
    End,
}

#[derive(Clone, Copy, Debug)]
struct Lexer<'a> {
    sql: &'a [u8],
    pos: usize,
    reading: Reading,
    /// Inside `/*! … */` read as code: its `*/` is skipped.
    in_exec: bool,
    /// The current statement's end was returned: every later [`Lexer::next`] returns
    /// [`Tok::End`] again until [`Lexer::next_statement`], so no reader can run into the next
    /// statement by reading one token too many.
    ended: bool,
    seen: Seen,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

impl<'a> Lexer<'a> {
    fn new(sql: &'a [u8], reading: Reading) -> Self {
        Self {
            sql,
            pos: 0,
            reading,
            in_exec: false,
            ended: false,
            seen: Seen::default(),
        }
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.sql.get(at).copied()
    }

    /// Moves on to the statement after the current one's end.
    fn next_statement(&mut self) {
        self.ended = false;
    }

    fn at_end(&mut self) -> bool {
        self.skip_space();
        self.pos >= self.sql.len()
    }

    /// Skips whitespace and comments.
    fn skip_space(&mut self) {
        while let Some(b) = self.byte(self.pos) {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => self.pos += 1,
                b'#' => self.skip_line(),
                b'-' if self.byte(self.pos + 1) == Some(b'-')
                    && self.byte(self.pos + 2).is_none_or(|c| c <= b' ') =>
                {
                    self.skip_line()
                }
                b'*' if self.in_exec && self.byte(self.pos + 1) == Some(b'/') => {
                    self.in_exec = false;
                    self.pos += 2;
                }
                b'/' if self.byte(self.pos + 1) == Some(b'*') => {
                    if !self.exec_comment_start() {
                        self.skip_block_comment();
                    }
                }
                _ => return,
            }
        }
    }

    fn skip_line(&mut self) {
        while let Some(b) = self.byte(self.pos) {
            self.pos += 1;
            if b == b'\n' {
                return;
            }
        }
    }

    fn skip_block_comment(&mut self) {
        let body = self.pos + 2;
        match self.sql.get(body..).and_then(|r| find(r, b"*/")) {
            Some(i) => self.pos = body + i + 2,
            None => self.pos = self.sql.len(),
        }
    }

    /// At `/*`: enters an executable comment if it is one and this reading runs them.
    fn exec_comment_start(&mut self) -> bool {
        let mut p = self.pos + 2;
        if self.byte(p) == Some(b'M') && self.byte(p + 1) == Some(b'!') {
            p += 1;
        }
        if self.byte(p) != Some(b'!') {
            return false;
        }
        self.seen.exec_comment = true;
        if !self.reading.exec_comments || self.in_exec {
            return false;
        }
        p += 1;
        // The version number (5 or 6 digits) is not code.
        while self.byte(p).is_some_and(|b| b.is_ascii_digit()) {
            p += 1;
        }
        self.pos = p;
        self.in_exec = true;
        true
    }

    /// The next token; [`Tok::End`] at `;` (consumed) and at the end of the text.
    fn next(&mut self) -> Tok<'a> {
        if self.ended {
            return Tok::End;
        }
        self.skip_space();
        let start = self.pos;
        let Some(b) = self.byte(start) else {
            self.ended = true;
            return Tok::End;
        };
        self.pos += 1;
        match b {
            b';' => {
                self.ended = true;
                Tok::End
            }
            b'\'' | b'"' => {
                let end = self.string_end(b);
                let body = self.sql.get(start + 1..end).unwrap_or(&[]);
                self.pos = (end + 1).min(self.sql.len());
                Tok::Str(body, b)
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
                let body = self.sql.get(start + 1..p).unwrap_or(&[]);
                self.pos = (p + 1).min(self.sql.len());
                Tok::Ident(body)
            }
            b'@' => {
                let mut p = start + 1;
                if self.byte(p) == Some(b'@') {
                    p += 1;
                }
                while self.byte(p).is_some_and(|c| is_word_byte(c) || c == b'.') {
                    p += 1;
                }
                self.pos = p;
                Tok::Word(&self.sql[start..p])
            }
            _ if is_word_byte(b) => {
                let mut p = start + 1;
                while self.byte(p).is_some_and(is_word_byte) {
                    p += 1;
                }
                self.pos = p;
                Tok::Word(&self.sql[start..p])
            }
            _ => Tok::Punct(b),
        }
    }

    /// The index of the quote closing a string opened at `pos - 1` (the text's length if none).
    fn string_end(&mut self, quote: u8) -> usize {
        let mut p = self.pos;
        while let Some(c) = self.byte(p) {
            if c == b'\\' {
                self.seen.backslash_in_string = true;
                if self.reading.backslash_escapes {
                    p += 2;
                    continue;
                }
            }
            if c == quote {
                if self.byte(p + 1) == Some(quote) {
                    p += 2;
                    continue;
                }
                return p;
            }
            p += 1;
        }
        self.sql.len()
    }

    fn peek(&self) -> Tok<'a> {
        self.clone().next()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn is(tok: Tok<'_>, kw: &str) -> bool {
    matches!(tok, Tok::Word(w) if w.eq_ignore_ascii_case(kw.as_bytes()))
}

fn is_any(tok: Tok<'_>, kws: &[&str]) -> bool {
    kws.iter().any(|k| is(tok, k))
}

// ------------------------------------------------------------------ statements

struct Classifier<'a, 'r> {
    lx: Lexer<'a>,
    rules: &'r Rules<'r>,
    names: Vec<NameUse>,
    depth: u8,
}

/// What a statement's tokens hold beyond its leading keywords.
#[derive(Clone, Copy, Debug, Default)]
struct Tail<'a> {
    locking: bool,
    into_file: bool,
    sequence: bool,
    /// `GLOBAL`, `PERSIST`, `@@global.x`: a SET that reaches beyond the session.
    global: bool,
    /// The first statement keyword outside parentheses (the main statement of a WITH).
    main: Option<&'a [u8]>,
}

impl Tail<'_> {
    /// A SELECT-like statement with this tail.
    fn select_effect(&self) -> Effect {
        if self.into_file {
            Effect::Write(WriteKind::SelectInto)
        } else if self.locking {
            Effect::Write(WriteKind::LockingRead)
        } else if self.sequence {
            Effect::Write(WriteKind::Other)
        } else {
            Effect::Read
        }
    }
}

const WRITE: fn(WriteKind) -> Effect = Effect::Write;

impl<'a> Classifier<'a, '_> {
    /// Skips the rest of the statement.
    fn finish(&mut self) {
        while self.lx.next() != Tok::End {}
    }

    /// Reads the rest of the statement for what [`Tail`] tracks.
    fn tail(&mut self) -> Tail<'a> {
        let mut t = Tail::default();
        let mut depth = 0u32;
        // The two tokens before the current one (None: not a word).
        let mut w2: Option<&[u8]> = None;
        let mut w1: Option<&[u8]> = None;
        loop {
            let tok = self.lx.next();
            let word = match tok {
                Tok::End => return t,
                Tok::Punct(b'(') => {
                    depth = depth.saturating_add(1);
                    None
                }
                Tok::Punct(b')') => {
                    depth = depth.saturating_sub(1);
                    None
                }
                Tok::Word(w) => Some(w),
                _ => None,
            };
            if let Some(w) = word {
                let kw = |k: &str| w.eq_ignore_ascii_case(k.as_bytes());
                let prev = |p: Option<&[u8]>, k: &str| {
                    p.is_some_and(|p| p.eq_ignore_ascii_case(k.as_bytes()))
                };
                if (kw("UPDATE") || kw("SHARE")) && prev(w1, "FOR") {
                    t.locking = true;
                }
                if kw("MODE") && prev(w1, "SHARE") && prev(w2, "IN") {
                    t.locking = true;
                }
                if (kw("OUTFILE") || kw("DUMPFILE")) && prev(w1, "INTO") {
                    t.into_file = true;
                }
                if kw("NEXTVAL")
                    || kw("SETVAL")
                    || (kw("FOR") && prev(w1, "VALUE") && prev(w2, "NEXT"))
                {
                    t.sequence = true;
                }
                if kw("GLOBAL") || kw("PERSIST") || kw("PERSIST_ONLY") {
                    t.global = true;
                }
                if starts_with_ci(w, b"@@global") || starts_with_ci(w, b"@@persist") {
                    t.global = true;
                }
                if depth == 0
                    && t.main.is_none()
                    && is_any(
                        tok,
                        &[
                            "SELECT", "TABLE", "VALUES", "INSERT", "UPDATE", "DELETE", "REPLACE",
                        ],
                    )
                {
                    t.main = Some(w);
                }
            }
            w2 = w1;
            w1 = word;
        }
    }

    /// One statement, up to and including its `;`.
    fn statement(&mut self, depth: u8) -> Effect {
        loop {
            match self.lx.next() {
                Tok::Punct(b'(') => continue,
                Tok::End => return Effect::Read,
                Tok::Word(w) => return self.statement_from(w, depth),
                _ => {
                    self.finish();
                    return WRITE(WriteKind::Other);
                }
            }
        }
    }

    /// A statement whose first keyword `first` was read.
    fn statement_from(&mut self, first: &'a [u8], depth: u8) -> Effect {
        if depth > MAX_DEPTH {
            self.finish();
            return WRITE(WriteKind::Other);
        }
        let tok = Tok::Word(first);
        let k = |kws: &[&str]| is_any(tok, kws);
        if k(&["SELECT", "TABLE", "VALUES", "DO"]) {
            return self.tail().select_effect();
        }
        if k(&["WITH"]) {
            let t = self.tail();
            let base = match t.main {
                Some(m) if is(Tok::Word(m), "INSERT") => WRITE(WriteKind::Insert),
                Some(m) if is(Tok::Word(m), "UPDATE") => WRITE(WriteKind::Update),
                Some(m) if is(Tok::Word(m), "DELETE") => WRITE(WriteKind::Delete),
                Some(m) if is(Tok::Word(m), "REPLACE") => WRITE(WriteKind::Replace),
                Some(_) => Effect::Read,
                None => WRITE(WriteKind::Other),
            };
            return base.and(t.select_effect());
        }
        let simple = if k(&["INSERT"]) {
            Some(WRITE(WriteKind::Insert))
        } else if k(&["UPDATE"]) {
            Some(WRITE(WriteKind::Update))
        } else if k(&["DELETE"]) {
            Some(WRITE(WriteKind::Delete))
        } else if k(&["REPLACE"]) {
            Some(WRITE(WriteKind::Replace))
        } else if k(&["CALL"]) {
            Some(if self.rules.allow_calls {
                Effect::Read
            } else {
                WRITE(WriteKind::Call)
            })
        } else if k(&["CREATE", "ALTER", "RENAME", "TRUNCATE"]) {
            Some(WRITE(WriteKind::Ddl))
        } else if k(&[
            "SHOW",
            "USE",
            "HELP",
            "COMMIT",
            "ROLLBACK",
            "SAVEPOINT",
            "RELEASE",
            "XA",
            "UNLOCK",
            "CHECKSUM",
            "HANDLER",
        ]) {
            Some(Effect::Read)
        } else if k(&[
            "GRANT",
            "REVOKE",
            "FLUSH",
            "KILL",
            "LOCK",
            "OPTIMIZE",
            "REPAIR",
            "CHECK",
            "INSTALL",
            "UNINSTALL",
            "RESET",
            "PURGE",
            "CHANGE",
            "STOP",
            "SHUTDOWN",
            "BINLOG",
            "CACHE",
            "BACKUP",
            "RESTART",
            "CLONE",
            "IMPORT",
        ]) {
            Some(WRITE(WriteKind::Admin))
        } else {
            None
        };
        if let Some(e) = simple {
            self.finish();
            return e;
        }
        let next = self.lx.peek();
        if k(&["DROP"]) {
            if is(next, "PREPARE") {
                return self.deallocate();
            }
            self.finish();
            return WRITE(WriteKind::Ddl);
        }
        if k(&["DEALLOCATE"]) {
            return self.deallocate();
        }
        if k(&["LOAD"]) {
            self.finish();
            return if is_any(next, &["DATA", "XML"]) {
                WRITE(WriteKind::LoadData)
            } else {
                WRITE(WriteKind::Admin)
            };
        }
        if k(&["BEGIN"]) {
            // BEGIN [WORK] starts a transaction; BEGIN NOT ATOMIC … is a compound statement.
            let plain = next == Tok::End || is(next, "WORK");
            self.finish();
            return if plain {
                Effect::Read
            } else {
                WRITE(WriteKind::Other)
            };
        }
        if k(&["START"]) {
            self.finish();
            return if is(next, "TRANSACTION") {
                Effect::Read
            } else if is_any(next, &["SLAVE", "REPLICA", "ALL"]) {
                WRITE(WriteKind::Admin)
            } else {
                WRITE(WriteKind::Other)
            };
        }
        if k(&["GET"]) {
            self.finish();
            return if is_any(next, &["DIAGNOSTICS", "CURRENT", "STACKED"]) {
                Effect::Read
            } else {
                WRITE(WriteKind::Other)
            };
        }
        if k(&["EXPLAIN", "DESCRIBE", "DESC"]) {
            // EXPLAIN [FORMAT=…] ANALYZE runs the statement (MySQL 8).
            loop {
                match self.lx.next() {
                    Tok::End => return Effect::Read,
                    Tok::Word(w) if is(Tok::Word(w), "ANALYZE") => {
                        self.skip_format();
                        return self.statement(depth + 1);
                    }
                    Tok::Word(w) if is(Tok::Word(w), "FORMAT") => {
                        if self.lx.peek() == Tok::Punct(b'=') {
                            self.lx.next();
                        }
                        self.lx.next();
                    }
                    _ => {
                        self.finish();
                        return Effect::Read;
                    }
                }
            }
        }
        if k(&["ANALYZE"]) {
            // MariaDB: ANALYZE [FORMAT=JSON] <statement> runs it; ANALYZE TABLE updates statistics.
            if is_any(next, &["TABLE", "TABLES", "NO_WRITE_TO_BINLOG", "LOCAL"]) {
                self.finish();
                return WRITE(WriteKind::Admin);
            }
            self.skip_format();
            return self.statement(depth + 1);
        }
        if k(&["SET"]) {
            return self.set(depth);
        }
        if k(&["PREPARE"]) {
            return self.prepare();
        }
        if k(&["EXECUTE"]) {
            return self.execute();
        }
        self.finish();
        WRITE(WriteKind::Other)
    }

    /// `FORMAT = word` after ANALYZE, if present.
    fn skip_format(&mut self) {
        if is(self.lx.peek(), "FORMAT") {
            self.lx.next();
            if self.lx.peek() == Tok::Punct(b'=') {
                self.lx.next();
            }
            if matches!(self.lx.peek(), Tok::Word(_)) {
                self.lx.next();
            }
        }
    }

    fn set(&mut self, depth: u8) -> Effect {
        let next = self.lx.peek();
        if is(next, "STATEMENT") {
            // SET STATEMENT var=value [, …] FOR <statement>: judged by the statement.
            self.lx.next();
            let mut parens = 0u32;
            loop {
                match self.lx.next() {
                    Tok::End => return WRITE(WriteKind::Other),
                    Tok::Punct(b'(') => parens = parens.saturating_add(1),
                    Tok::Punct(b')') => parens = parens.saturating_sub(1),
                    t if parens == 0 && is(t, "FOR") => return self.statement(depth + 1),
                    _ => {}
                }
            }
        }
        if is_any(next, &["PASSWORD", "DEFAULT"]) {
            self.finish();
            return WRITE(WriteKind::Admin);
        }
        let t = self.tail();
        if t.global {
            WRITE(WriteKind::Admin)
        } else {
            t.select_effect()
        }
    }

    /// A prepared statement name token, lowercased (names are case-insensitive).
    fn name(tok: Tok<'_>) -> Option<Vec<u8>> {
        match tok {
            Tok::Word(w) if w.first() != Some(&b'@') => Some(w.to_ascii_lowercase()),
            Tok::Ident(w) => {
                let mut v = w.to_ascii_lowercase();
                // `` inside a backquoted name is one backquote.
                let mut i = 0;
                while i + 1 < v.len() {
                    if v[i] == b'`' && v[i + 1] == b'`' {
                        v.remove(i + 1);
                    }
                    i += 1;
                }
                Some(v)
            }
            _ => None,
        }
    }

    fn deallocate(&mut self) -> Effect {
        // DEALLOCATE|DROP PREPARE name
        self.lx.next();
        if let Some(name) = Self::name(self.lx.next()) {
            self.names.push(NameUse::Deallocate { name });
        }
        self.finish();
        Effect::Read
    }

    fn prepare(&mut self) -> Effect {
        let Some(name) = Self::name(self.lx.next()) else {
            self.finish();
            return WRITE(WriteKind::Other);
        };
        let effect = if is(self.lx.next(), "FROM") {
            match (self.lx.next(), self.lx.next()) {
                (Tok::Str(body, quote), Tok::End) => self.literal(body, quote),
                _ => WRITE(WriteKind::Other),
            }
        } else {
            WRITE(WriteKind::Other)
        };
        self.finish();
        self.names.push(NameUse::Prepare { name, effect });
        effect
    }

    fn execute(&mut self) -> Effect {
        let tok = self.lx.next();
        if is(tok, "IMMEDIATE") {
            let effect = match (self.lx.next(), self.lx.next()) {
                (Tok::Str(body, quote), t) if t == Tok::End || is(t, "USING") => {
                    self.literal(body, quote)
                }
                _ => WRITE(WriteKind::Other),
            };
            self.finish();
            return effect;
        }
        let effect = match Self::name(tok) {
            Some(name) => self.executed(&name),
            None => WRITE(WriteKind::Other),
        };
        self.finish();
        effect
    }

    /// What `EXECUTE name` does: the latest PREPARE of `name` in this text, else the caller's
    /// record. A name never prepared through us can only hold a read on the test server.
    fn executed(&self, name: &[u8]) -> Effect {
        for u in self.names.iter().rev() {
            match u {
                NameUse::Prepare { name: n, effect } if n == name => return *effect,
                NameUse::Deallocate { name: n } if n == name => return Effect::Read,
                _ => {}
            }
        }
        match (self.rules.skipped)(name) {
            Some(kind) => WRITE(kind),
            None => Effect::Read,
        }
    }

    /// A string literal holding SQL, judged as a text of its own.
    fn literal(&self, body: &[u8], quote: u8) -> Effect {
        let sql = unescape(body, quote, self.lx.reading.backslash_escapes);
        let inner = classify_at(&sql, self.rules, self.depth + 1);
        inner.effect
    }
}

/// A string literal's contents with its escapes undone (as far as they matter for lexing SQL).
fn unescape(body: &[u8], quote: u8, backslash_escapes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while let Some(&c) = body.get(i) {
        if c == b'\\' && backslash_escapes {
            if let Some(&n) = body.get(i + 1) {
                let c = match n {
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'r' => b'\r',
                    b'0' => 0,
                    b'Z' => 0x1a,
                    // \% and \_ keep their backslash (LIKE patterns).
                    b'%' | b'_' => {
                        out.push(b'\\');
                        n
                    }
                    other => other,
                };
                out.push(c);
                i += 2;
                continue;
            }
        }
        if c == quote && body.get(i + 1) == Some(&quote) {
            out.push(quote);
            i += 2;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

fn starts_with_ci(w: &[u8], prefix: &[u8]) -> bool {
    w.get(..prefix.len())
        .is_some_and(|h| h.eq_ignore_ascii_case(prefix))
}

#[cfg(test)]
mod tests;
