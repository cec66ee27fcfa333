//! Folds the rows and column definitions of a result set into runs ([`MysqlRows`]).
//!
//! A result set of a hundred rows used to cost a hundred summaries: framed, encoded, written,
//! decoded and walked by the copier one by one, although the copier reads nothing of a row but
//! "not 0xFE, not 0xFF" (see `core/src/mysql/replies.rs`). The folder lets such packets
//! through as one run per captured segment; everything else still goes out as a summary with
//! its head.
//!
//! intercept runs one per connection (`intercept/src/sessions.rs`); the copier's tests use it
//! to check that folded replies teach the copier what unfolded ones do.
//!
//! What it must never do: fold a packet whose head the copier reads. It does not know which
//! command a reply answers, so it folds only inside a structure that no other reply has:
//!
//! * a reply's first packet (id 1) that is a one-byte column count (1..=250), alone or with
//!   MariaDB's metadata flag byte, opens the result;
//! * then exactly that many definitions (each starting with the catalog "def"), unless the
//!   flag said they are left out, an optional 5-byte EOF, then rows;
//! * every folded packet has the next sequence id, is shorter than 16 MiB and starts with
//!   neither 0xFE nor 0xFF. The packet that ends the rows (EOF, OK, ERR) is never folded, and
//!   the folder closes on it: what follows (a next result, the next reply) goes out whole.
//!
//! Replies that are not result sets (PREPARE_OK, fetched rows, COM_FIELD_LIST, auth exchanges,
//! LOCAL INFILE) never open one: their first packet is 0x00, 0xFE, 0xFF, 0xFB or longer than a
//! column count, or their ids do not run on. Should a client's data still look like one, the
//! copier checks each run against its own structure and loses the structure (counted) rather
//! than misread it.

use crate::control::{MysqlPacket, MysqlRows, MYSQL_MAX_PAYLOAD};
use crate::mysql::handshake::status;

/// Where the folder is in a result set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not inside a result set it understands: nothing is folded.
    Closed,
    /// Column definitions still to come.
    Definitions(u8),
    /// After the definitions: an EOF, or already rows.
    AfterDefinitions,
    /// Rows until the packet that ends them.
    Rows,
}

/// What to do with one framed packet.
pub enum Folded {
    /// Folded into the pending run: nothing to send yet.
    Kept,
    /// Send these, in order: the run folded so far (if any), then the packet.
    Send(Option<MysqlRows>, MysqlPacket),
}

/// The folding state of one connection's reply stream.
#[derive(Debug)]
pub struct RowFolder {
    state: State,
    /// The previous packet's sequence id.
    prev_seq: Option<u8>,
    /// The previous packet was 16 MiB long: this one continues its payload.
    continues: bool,
    run: Option<MysqlRows>,
    /// Packets folded so far.
    folded: u64,
}

impl Default for RowFolder {
    fn default() -> Self {
        Self::new()
    }
}

impl RowFolder {
    pub fn new() -> Self {
        RowFolder {
            state: State::Closed,
            prev_seq: None,
            continues: false,
            run: None,
            folded: 0,
        }
    }

    /// Packets folded into runs since the connection began.
    pub fn folded(&self) -> u64 {
        self.folded
    }

    /// Head bytes [`Self::try_fold`] needs to decide: `min(len, SKIM_HEAD)`.
    pub const SKIM_HEAD: usize = 5;

    /// Folds a packet if it can, from its header and its first payload bytes (at least
    /// `min(len, SKIM_HEAD)` of them), before any summary of it is built; false leaves the
    /// folder as it was, and the packet must then be [`offered`](Self::offer). `on` as there.
    pub fn try_fold(
        &mut self,
        seq_id: u8,
        len: u32,
        head: &[u8],
        stream_offset: u64,
        framed_at_us: u32,
        on: bool,
    ) -> bool {
        if !on
            || self.continues
            || len >= MYSQL_MAX_PAYLOAD
            || self.prev_seq.map(|s| s.wrapping_add(1)) != Some(seq_id)
        {
            return false;
        }
        let row = head.first().is_some_and(|&b| b != 0xfe && b != 0xff);
        let eof = self.state == State::AfterDefinitions && is_plain_eof(len, head);
        let fits = match self.state {
            State::Closed => false,
            State::Definitions(_) => head.starts_with(b"\x03def"),
            State::AfterDefinitions => row || eof,
            State::Rows => row,
        };
        if !fits {
            return false;
        }
        self.prev_seq = Some(seq_id);
        self.state = match self.state {
            State::Definitions(n) if n > 1 => State::Definitions(n - 1),
            State::Definitions(_) => State::AfterDefinitions,
            _ => State::Rows,
        };
        self.folded += 1;
        let bytes = 4 + u64::from(len);
        match &mut self.run {
            Some(r) => {
                r.count += 1;
                r.bytes += bytes;
                r.framed_at_us = framed_at_us;
                r.eof |= eof;
            }
            None => {
                self.run = Some(MysqlRows {
                    stream_offset,
                    seq_id,
                    count: 1,
                    bytes,
                    framed_at_us,
                    eof,
                })
            }
        }
        true
    }

    /// One framed packet, in stream order; `on` is false while folding is off (a copier that
    /// does not know runs, or payload hashes: each row's hash must travel).
    pub fn offer(&mut self, p: MysqlPacket, on: bool) -> Folded {
        let on = on && p.hash.is_none();
        if self.try_fold(
            p.seq_id,
            p.len,
            &p.head,
            p.stream_offset,
            p.framed_at_us,
            on,
        ) {
            return Folded::Kept;
        }
        let follows = self.prev_seq.map(|s| s.wrapping_add(1)) == Some(p.seq_id);
        let big = p.len >= MYSQL_MAX_PAYLOAD || self.continues;
        self.prev_seq = Some(p.seq_id);
        self.continues = p.len >= MYSQL_MAX_PAYLOAD;
        self.state = if big {
            State::Closed
        } else if self.state == State::AfterDefinitions
            && follows
            && p.len == 5
            && p.head.first() == Some(&0xfe)
        {
            State::Rows
        } else {
            opens(&p)
        };
        Folded::Send(self.run.take(), p)
    }

    /// The run folded so far, to send now (at the end of a segment, before a `FramingLost`).
    pub fn flush(&mut self) -> Option<MysqlRows> {
        self.run.take()
    }
}

/// The EOF after a result set's definitions, when the copier reads nothing of it: rows follow
/// (with SERVER_STATUS_CURSOR_EXISTS they come with COM_STMT_FETCH instead, and the copier
/// ends the reply there).
fn is_plain_eof(len: u32, head: &[u8]) -> bool {
    len == 5
        && head.len() >= 5
        && head[0] == 0xfe
        && u16::from_le_bytes([head[3], head[4]]) & status::CURSOR_EXISTS == 0
}

/// The state after a packet that was sent whole: a result set opens on a reply's column count.
fn opens(p: &MysqlPacket) -> State {
    let count = match p.head.first() {
        Some(&c @ 1..=250) if p.seq_id == 1 => c,
        _ => return State::Closed,
    };
    match (p.len, p.head.get(1)) {
        (1, _) => State::Definitions(count),
        // MariaDB CACHE_METADATA: 0 says the definitions are left out.
        (2, Some(0)) => State::AfterDefinitions,
        (2, Some(_)) => State::Definitions(count),
        _ => State::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::MysqlHead;

    struct Stream {
        offset: u64,
        seq: u8,
        folder: RowFolder,
        on: bool,
    }

    /// What the copier would receive: a packet's first byte, or a run's count.
    #[derive(Debug, PartialEq, Eq)]
    enum Got {
        P(u8),
        Run(u32),
    }

    impl Stream {
        fn new() -> Self {
            Stream {
                offset: 0,
                seq: 0,
                folder: RowFolder::new(),
                on: true,
            }
        }

        fn packet(&mut self, seq: u8, payload: &[u8], got: &mut Vec<Got>) {
            let p = MysqlPacket {
                stream_offset: self.offset,
                tcp_seq: 0,
                seq_id: seq,
                len: payload.len() as u32,
                head: MysqlHead::from_slice(&payload[..payload.len().min(16)]),
                hash: None,
                framed_at_us: 0,
            };
            self.offset += 4 + payload.len() as u64;
            if let Folded::Send(run, p) = self.folder.offer(p, self.on) {
                if let Some(r) = run {
                    got.push(Got::Run(r.count));
                }
                got.push(Got::P(p.head.first().copied().unwrap_or(0)));
            }
        }

        /// The next packet of the current reply (ids counted from the last `reply`).
        fn next(&mut self, payload: &[u8], got: &mut Vec<Got>) {
            self.seq = self.seq.wrapping_add(1);
            self.packet(self.seq, payload, got);
        }

        fn reply(&mut self, payload: &[u8], got: &mut Vec<Got>) {
            self.seq = 0;
            self.next(payload, got);
        }

        fn end(&mut self, got: &mut Vec<Got>) {
            if let Some(r) = self.folder.flush() {
                got.push(Got::Run(r.count));
            }
        }
    }

    const EOF: &[u8] = &[0xfe, 0, 0, 2, 0];
    const OK_FE: &[u8] = &[0xfe, 0, 0, 2, 0, 0, 0];
    const DEF: &[u8] = b"\x03def\x06sbtest\x07sbtest1\x07sbtest1\x01c\x01c\x0c";

    #[test]
    fn a_result_sets_definitions_and_rows_fold_and_its_ends_do_not() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        s.reply(&[2], &mut got);
        s.next(DEF, &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        for _ in 0..100 {
            s.next(b"\x00\x00\x05hello", &mut got);
        }
        s.next(EOF, &mut got);
        s.reply(&[0, 0, 0, 2, 0, 0, 0], &mut got);
        s.end(&mut got);
        assert_eq!(got, vec![Got::P(2), Got::Run(103), Got::P(0xfe), Got::P(0)]);
        assert_eq!(s.folder.folded(), 103);
    }

    #[test]
    fn deprecate_eof_and_omitted_metadata_fold_definitions_and_rows_together() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        s.reply(&[1], &mut got);
        s.next(DEF, &mut got);
        s.next(b"\x01a", &mut got);
        s.next(b"\x01b", &mut got);
        s.next(OK_FE, &mut got);
        s.reply(&[1, 0], &mut got);
        s.next(b"\x00\x00\x01", &mut got);
        s.next(OK_FE, &mut got);
        s.end(&mut got);
        assert_eq!(
            got,
            vec![
                Got::P(1),
                Got::Run(3),
                Got::P(0xfe),
                Got::P(1),
                Got::Run(1),
                Got::P(0xfe)
            ]
        );
    }

    #[test]
    fn a_run_is_cut_at_each_flush_and_rows_past_id_255_go_on_folding() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        s.reply(&[1], &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        for i in 0..300 {
            s.next(b"\x01x", &mut got);
            if i == 99 {
                s.end(&mut got);
            }
        }
        s.next(EOF, &mut got);
        assert_eq!(
            got,
            vec![Got::P(1), Got::Run(102), Got::Run(200), Got::P(0xfe)]
        );
    }

    #[test]
    fn replies_that_are_not_result_sets_are_never_folded() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        // PREPARE_OK with a parameter and a column.
        s.reply(&[0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0], &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        // Fetched binary rows.
        s.reply(b"\x00\x00\x01", &mut got);
        s.next(b"\x00\x00\x02", &mut got);
        s.next(EOF, &mut got);
        // COM_FIELD_LIST: definitions from the first packet.
        s.reply(DEF, &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        // A column count whose definitions do not follow (ids jump: an auth exchange).
        s.reply(&[1, 3], &mut got);
        s.packet(3, DEF, &mut got);
        // A column count of 251 or more.
        s.reply(&[0xfc, 0x00, 0x01], &mut got);
        s.next(DEF, &mut got);
        s.end(&mut got);
        assert!(got.iter().all(|g| matches!(g, Got::P(_))), "{got:?}");
        assert_eq!(got.len(), 15);
    }

    #[test]
    fn what_follows_a_result_set_is_sent_whole() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        s.reply(&[1], &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        s.next(b"\x01x", &mut got);
        // EOF with MORE_RESULTS, then a second result and the final OK.
        s.next(&[0xfe, 0, 0, 0x0a, 0], &mut got);
        s.next(&[1], &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        s.next(b"\x01y", &mut got);
        s.next(EOF, &mut got);
        s.end(&mut got);
        assert_eq!(
            got,
            vec![
                Got::P(1),
                Got::Run(3),
                Got::P(0xfe),
                Got::P(1),
                Got::P(3),
                Got::P(0xfe),
                Got::P(1),
                Got::P(0xfe)
            ]
        );
    }

    #[test]
    fn a_16_mib_row_and_its_continuation_are_sent_whole_and_folding_stops() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        s.reply(&[1], &mut got);
        s.next(DEF, &mut got);
        s.next(EOF, &mut got);
        let p = MysqlPacket {
            stream_offset: s.offset,
            tcp_seq: 0,
            seq_id: 4,
            len: MYSQL_MAX_PAYLOAD,
            head: MysqlHead::from_slice(b"\x01x"),
            hash: None,
            framed_at_us: 0,
        };
        s.seq = 4;
        s.offset += 4 + u64::from(MYSQL_MAX_PAYLOAD);
        match s.folder.offer(p, true) {
            Folded::Send(Some(run), _) => {
                got.push(Got::Run(run.count));
                got.push(Got::P(1));
            }
            _ => panic!("a 16 MiB packet is sent"),
        }
        s.next(b"\x01x", &mut got);
        s.next(b"\x01y", &mut got);
        s.next(EOF, &mut got);
        assert_eq!(
            got,
            vec![
                Got::P(1),
                Got::Run(2),
                Got::P(1),
                Got::P(1),
                Got::P(1),
                Got::P(0xfe)
            ]
        );
    }

    #[test]
    fn the_eof_of_a_cursor_is_sent_whole() {
        let mut s = Stream::new();
        let mut got = Vec::new();
        s.reply(&[1], &mut got);
        s.next(DEF, &mut got);
        // SERVER_STATUS_CURSOR_EXISTS: the rows come with COM_STMT_FETCH.
        s.next(&[0xfe, 0, 0, 0x42, 0], &mut got);
        s.reply(b"\x00\x00\x01", &mut got);
        s.next(EOF, &mut got);
        s.end(&mut got);
        assert_eq!(
            got,
            vec![
                Got::P(1),
                Got::Run(1),
                Got::P(0xfe),
                Got::P(0),
                Got::P(0xfe)
            ]
        );
    }

    #[test]
    fn nothing_is_folded_while_folding_is_off() {
        let mut s = Stream::new();
        s.on = false;
        let mut got = Vec::new();
        s.reply(&[1], &mut got);
        s.next(DEF, &mut got);
        s.next(b"\x01x", &mut got);
        s.next(OK_FE, &mut got);
        s.end(&mut got);
        assert_eq!(got.len(), 4);
        assert_eq!(s.folder.folded(), 0);
    }
}
