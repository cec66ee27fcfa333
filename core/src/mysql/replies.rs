//! Where one server's replies end, from their structure.
//!
//! Sequence ids alone cannot cut a reply stream: ids run 1, 2, … and wrap after 255, so a
//! reply of exactly 256·k packets ends on id 0 and the next reply's first packet (id 1) looks
//! like the continuation of a wrapped one. [`ReplyTracker`] follows each reply's structure
//! instead (OK, ERR, result sets with their column definitions, EOFs and rows, PREPARE_OK and
//! its definitions, multi-result sets) from the first bytes of each packet, which both sides
//! have (production: the 16 bytes kept of each packet; the test server: intercept's 16-byte heads).
//!
//! The ids stay a consistency check: inside a reply each packet's id follows the previous one,
//! so a packet with id 1 not after id 0 starts a reply whatever the structure said, and a reply
//! the structure says starts must have id 1. A reply whose structure cannot be followed (a head
//! too short for an OK's status, a packet that fits no state) is cut by the ids alone, as before.
//!
//! Each packet is also given its [`Role`] in the reply (OK, ERR, column count, row, ...) and
//! the packet that ends a reply is marked, which is what the comparison report counts rows,
//! kinds and latencies from.
//!
//! The structure is read without the negotiated capabilities: an EOF is exactly 5 bytes, while
//! the OK that replaces it under CLIENT_DEPRECATE_EOF is at least 7, and a definition or a row
//! never starts with 0xFE unless it is a 16 MiB packet.

use common::mysql::command::com;
use common::mysql::handshake::status;
use common::mysql::packet::MAX_PAYLOAD_LEN;
use common::mysql::read_lenenc_int;

/// How the reply to a command is built, from the command byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReplyKind {
    /// OK, ERR, a LOCAL INFILE request or result sets (COM_QUERY, COM_STMT_EXECUTE, ...).
    Generic,
    /// PREPARE_OK and its definitions, or ERR.
    Prepare,
    /// Rows then EOF/OK, or ERR (COM_STMT_FETCH); COM_FIELD_LIST's definitions end the same way.
    Rows,
    /// One string packet (COM_STATISTICS).
    Single,
    /// An auth exchange ending in OK or ERR (COM_CHANGE_USER).
    Auth,
}

impl ReplyKind {
    /// `None`: an empty packet, which the servers answer with an ERR.
    pub(super) fn of_command(code: Option<u8>) -> Self {
        match code {
            Some(com::STMT_PREPARE) => Self::Prepare,
            Some(com::STMT_FETCH) | Some(com::FIELD_LIST) => Self::Rows,
            Some(com::STATISTICS) => Self::Single,
            Some(com::CHANGE_USER) => Self::Auth,
            _ => Self::Generic,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The last reply ended: the next packet starts one.
    Idle,
    /// The first packet of a result: OK, ERR, progress report, LOCAL INFILE or column count.
    First,
    /// Column definitions still to come.
    Columns(u64),
    /// After the definitions: an EOF (5 bytes), or already rows / the terminating OK.
    AfterColumns,
    /// Rows until EOF, OK (0xFE) or ERR.
    Rows,
    /// PREPARE_OK's parameter definitions still to come, then its column definitions.
    Params { left: u64, columns: u64 },
    /// PREPARE_OK's column definitions still to come.
    PrepareColumns(u64),
    /// After a group of PREPARE_OK's definitions: an EOF unless DEPRECATE_EOF, then `columns`
    /// more definitions (0: the reply ends).
    GroupEof { columns: u64 },
    /// An auth exchange: until OK or ERR.
    Auth,
    /// The structure was lost: the ids alone find the next reply.
    Unknown,
}

/// What a packet is within its reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Role {
    /// Not known (structure lost, a continuation packet, outside any reply).
    #[default]
    Unknown,
    /// An OK (or PREPARE_OK) that is the whole answer of a result.
    Ok,
    /// An ERR: the answer (or the end of a result set cut by an error).
    Err,
    /// The column count opening a result set.
    ColumnCount,
    /// A column or parameter definition, or the EOF after them.
    Definition,
    /// A row of a result set (text or binary), or a COM_FIELD_LIST definition.
    Row,
    /// The EOF or OK ending a result set's rows.
    RowsEnd,
    /// Anything else: a progress report, a LOCAL INFILE request, auth packets, statistics.
    Other,
}

/// What one packet meant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// It is the first packet of a reply (to the oldest command awaiting one).
    pub(super) start: bool,
    /// The ids disagreed with the structure.
    pub(super) mismatch: bool,
    /// The structure could not be followed: this reply is cut by ids alone.
    pub(super) lost: bool,
    /// Its role in the reply.
    pub(super) role: Role,
    /// It is the last packet of its reply (known from the structure).
    pub(super) end: bool,
}

/// Follows one server's replies. See the module documentation.
#[derive(Clone, Debug)]
pub(super) struct ReplyTracker {
    state: State,
    /// The kind of the reply in progress.
    kind: ReplyKind,
    /// CLIENT_DEPRECATE_EOF is known to be negotiated: a PREPARE_OK's definitions end without
    /// an EOF, so the reply is known to end with its last definition (otherwise that is only
    /// learnt from the next packet).
    deprecate_eof: bool,
}

impl ReplyTracker {
    pub(super) fn new() -> Self {
        Self {
            state: State::Idle,
            kind: ReplyKind::Generic,
            deprecate_eof: false,
        }
    }

    /// Whether CLIENT_DEPRECATE_EOF is known to be negotiated (see the field).
    pub(super) fn set_deprecate_eof(&mut self, on: bool) {
        self.deprecate_eof = on;
    }

    /// Packets of unknown structure come first: the next with id 1 starts a reply.
    pub(super) fn skip_to_next_reply(&mut self) {
        self.state = State::Unknown;
    }

    /// Forgets the reply in progress: the next packet starts one.
    pub(super) fn reset(&mut self) {
        self.state = State::Idle;
    }

    /// One physical packet: its id, the id of the packet before it (`None`: none seen), its
    /// length, its first bytes (at least 16, or all), whether it continues a 16 MiB one, and
    /// what the oldest command awaiting a reply expects: the kind of reply, and the id of its
    /// first packet (1, or one more than the command's last packet when the command itself
    /// took several: 16 MiB and more).
    pub(super) fn packet(
        &mut self,
        seq: u8,
        prev: Option<u8>,
        len: u32,
        head: &[u8],
        continuation: bool,
        (next, first): (ReplyKind, u8),
    ) -> Seen {
        let mut seen = Seen::default();
        if continuation {
            return seen;
        }
        if self.state == (State::GroupEof { columns: 0 })
            && !(is_eof(len, head) && Some(seq.wrapping_sub(1)) == prev)
        {
            // DEPRECATE_EOF: the prepare's reply ended with its last definition.
            self.state = State::Idle;
        }
        let by_ids = seq == first && prev != Some(first.wrapping_sub(1));
        match self.state {
            State::Idle if seq == first => self.start(next, &mut seen),
            State::Idle => {
                // The structure ended a reply the ids say goes on.
                seen.mismatch = true;
                seen.lost = true;
                self.state = State::Unknown;
                return seen;
            }
            State::Unknown => {
                if by_ids {
                    self.start(next, &mut seen);
                } else {
                    return seen;
                }
            }
            _ if by_ids => {
                // Ids run on inside a reply: the structure missed its end.
                seen.mismatch = true;
                self.start(next, &mut seen);
            }
            _ => {}
        }
        match self.step(len, head) {
            Some(role) => {
                seen.role = role;
                if self.deprecate_eof && self.state == (State::GroupEof { columns: 0 }) {
                    self.state = State::Idle;
                }
                seen.end = self.state == State::Idle;
            }
            None => {
                seen.lost = true;
                self.state = State::Unknown;
            }
        }
        seen
    }

    /// Whether a packet that is neither 0xFE nor 0xFF, with the next id, would be a row of the
    /// result set in progress (what [`Self::row_passed`] stands for).
    pub(super) fn expects_rows(&self) -> bool {
        matches!(self.state, State::AfterColumns | State::Rows)
    }

    /// A row passed over unread, where [`Self::expects_rows`] said one may come: what
    /// [`Self::packet`] does with it, for a fraction of the cost.
    pub(super) fn row_passed(&mut self) {
        self.state = State::Rows;
    }

    /// `count` packets intercept folded into a run (`MysqlEvent::Rows`): definitions, rows
    /// and, if `eof`, the EOF between them (the packet after the last definition), none of
    /// them ending anything. `follows`: the first one's id comes right after the previous
    /// packet's. Returns how many were definitions and how many rows, or `None` if the
    /// structure has no place for them (intercept folds only where it has, so this means the
    /// structure was misread): the reply is then cut by ids alone.
    pub(super) fn folded(&mut self, count: u32, eof: bool, follows: bool) -> Option<(u64, u64)> {
        let mut left = u64::from(count);
        let mut definitions = 0;
        if let (true, State::Columns(n)) = (follows, self.state) {
            definitions = n.min(left);
            left -= definitions;
            self.state = if definitions == n {
                State::AfterColumns
            } else {
                State::Columns(n - definitions)
            };
        }
        let fits = follows
            && match self.state {
                State::Columns(_) => !eof,
                State::AfterColumns => !eof || left > 0,
                State::Rows => !eof,
                _ => false,
            };
        if !fits {
            self.state = State::Unknown;
            return None;
        }
        if eof {
            left -= 1;
            self.state = State::Rows;
        }
        if left > 0 {
            self.state = State::Rows;
        }
        Some((definitions, left))
    }

    fn start(&mut self, kind: ReplyKind, seen: &mut Seen) {
        seen.start = true;
        self.state = match kind {
            ReplyKind::Generic | ReplyKind::Prepare | ReplyKind::Single => State::First,
            ReplyKind::Rows => State::Rows,
            ReplyKind::Auth => State::Auth,
        };
        self.kind = kind;
    }

    /// Moves past one packet of the current reply and says what it was; `None` if it fits no
    /// state.
    fn step(&mut self, len: u32, head: &[u8]) -> Option<Role> {
        let first = head.first().copied();
        let mut role = Role::Definition;
        self.state = match self.state {
            State::Idle | State::Unknown => return Some(Role::Unknown),
            State::First => return self.first(len, head),
            State::Columns(n) => {
                if is_eof(len, head) || first == Some(0xff) {
                    return None;
                }
                if n <= 1 {
                    State::AfterColumns
                } else {
                    State::Columns(n - 1)
                }
            }
            State::AfterColumns if is_eof(len, head) => {
                let st = eof_status(head)?;
                if st & status::CURSOR_EXISTS != 0 {
                    // COM_STMT_EXECUTE opened a cursor: rows come with COM_STMT_FETCH.
                    State::Idle
                } else {
                    State::Rows
                }
            }
            State::AfterColumns | State::Rows => return self.row(len, head),
            State::Params { left, columns } => {
                if is_terminator(len, head) || first == Some(0xff) {
                    return None;
                }
                if left <= 1 {
                    State::GroupEof { columns }
                } else {
                    State::Params {
                        left: left - 1,
                        columns,
                    }
                }
            }
            State::PrepareColumns(n) => {
                if is_terminator(len, head) || first == Some(0xff) {
                    return None;
                }
                if n <= 1 {
                    State::GroupEof { columns: 0 }
                } else {
                    State::PrepareColumns(n - 1)
                }
            }
            State::GroupEof { columns } if is_eof(len, head) => {
                if columns == 0 {
                    State::Idle
                } else {
                    State::PrepareColumns(columns)
                }
            }
            State::GroupEof { columns } => {
                // DEPRECATE_EOF: this is already the first column definition.
                self.state = State::PrepareColumns(columns);
                return self.step(len, head);
            }
            State::Auth => {
                role = match first {
                    Some(0x00) => Role::Ok,
                    Some(0xff) => Role::Err,
                    _ => Role::Other,
                };
                match first {
                    Some(0x00) | Some(0xff) => State::Idle,
                    _ => State::Auth,
                }
            }
        };
        Some(role)
    }

    /// The first packet of a result (of a command, or after MORE_RESULTS_EXISTS).
    fn first(&mut self, len: u32, head: &[u8]) -> Option<Role> {
        let &b0 = head.first()?;
        let mut role = Role::Ok;
        self.state = match b0 {
            _ if self.kind == ReplyKind::Single => {
                role = Role::Other;
                State::Idle
            }
            0x00 if self.kind == ReplyKind::Prepare => {
                // PREPARE_OK: 0x00, statement id (4), columns (2), params (2).
                let (Some(c), Some(p)) = (head.get(5..7), head.get(7..9)) else {
                    return None;
                };
                let columns = u64::from(u16::from_le_bytes([c[0], c[1]]));
                let params = u64::from(u16::from_le_bytes([p[0], p[1]]));
                if params > 0 {
                    State::Params {
                        left: params,
                        columns,
                    }
                } else if columns > 0 {
                    State::PrepareColumns(columns)
                } else {
                    State::Idle
                }
            }
            0x00 | 0xfe => after_result(ok_status(len, head)?),
            0xff if head.get(1..3) == Some(&[0xff, 0xff]) => {
                // A progress report; the result follows.
                role = Role::Other;
                State::First
            }
            0xff => {
                role = Role::Err;
                State::Idle
            }
            // LOCAL INFILE: the client sends the file, then the server's OK or ERR.
            0xfb => {
                role = Role::Other;
                State::First
            }
            _ => {
                role = Role::ColumnCount;
                let (n, used) = read_lenenc_int(head).ok()?;
                if n == 0 {
                    return None;
                }
                // MariaDB CACHE_METADATA: a flag byte after the count, 0 when the definitions
                // are omitted (COM_STMT_EXECUTE of a statement whose metadata the client has).
                if len as usize == used + 1 && head.get(used) == Some(&0) {
                    State::AfterColumns
                } else {
                    State::Columns(n)
                }
            }
        };
        Some(role)
    }

    /// A row, or the packet that ends the rows.
    fn row(&mut self, len: u32, head: &[u8]) -> Option<Role> {
        Some(match head.first() {
            Some(0xfe) if is_terminator(len, head) => {
                self.state = after_result(ok_status(len, head)?);
                Role::RowsEnd
            }
            Some(0xff) => {
                self.state = State::Idle;
                Role::Err
            }
            _ => {
                self.state = State::Rows;
                Role::Row
            }
        })
    }
}

fn after_result(st: u16) -> State {
    if st & status::MORE_RESULTS_EXISTS != 0 {
        State::First
    } else {
        State::Idle
    }
}

/// A 4.1 EOF packet: 0xFE, warnings, status.
fn is_eof(len: u32, head: &[u8]) -> bool {
    len == 5 && head.first() == Some(&0xfe)
}

/// EOF, or the OK (0xFE header) that replaces it under DEPRECATE_EOF; a row or definition
/// starting with 0xFE is a 16 MiB packet.
fn is_terminator(len: u32, head: &[u8]) -> bool {
    head.first() == Some(&0xfe) && (len as usize) < MAX_PAYLOAD_LEN
}

fn eof_status(head: &[u8]) -> Option<u16> {
    head.get(3..5).map(|s| u16::from_le_bytes([s[0], s[1]]))
}

/// The status flags of an OK (0x00 or 0xFE header) or EOF; `None` if the head is too short.
pub(super) fn ok_status(len: u32, head: &[u8]) -> Option<u16> {
    if len == 5 && head.first() == Some(&0xfe) {
        return eof_status(head);
    }
    let rest = head.get(1..)?;
    let (_, a) = read_lenenc_int(rest).ok()?;
    let (_, b) = read_lenenc_int(rest.get(a..)?).ok()?;
    let s = rest.get(a + b..a + b + 2)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}
