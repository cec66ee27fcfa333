//! The client's stream as it arrives: only packet starts and command bytes, to know which of
//! production's replies answers which command, and to number the commands.
//!
//! # What this room is for
//!
//! Production answers the client's commands as they were sent, not as we forward them (the
//! forwarding reader may hold them for the test server). This reader runs ahead of it over
//! the same bytes and tells production's side what it owes: each command awaiting a reply,
//! with its serial number. Both readers number the same commands the same way (packets with
//! id 0 after the login, except those without a reply): the serial ties production's reply,
//! the forwarding decision and the test server's reply to one command.
//!
//! # What it must never do
//!
//! * Wait, hold or copy the stream: it keeps a few bytes of each packet (its command byte, or
//!   more for the report and a picked-up session's `USE`/`SET @`), nothing else.
//! * Take bytes that are not a packet start for a command: continuations, auth packets and
//!   LOCAL INFILE data are told by framing and sequence ids, never by their content.

use std::collections::VecDeque;
use std::mem;

use common::mysql::packet::FrameScanner;

use super::super::observe::Observer;
use super::super::replies::ReplyKind;
use super::pickup::PickupState;
use super::{expects_reply, MysqlTransform, MAX_IN_FLIGHT};
use crate::engine::TransformOutput;

/// Command starts remembered at most: twice what the test server may owe.
const MAX_STARTS: usize = 4 * MAX_IN_FLIGHT;

/// Emptied command-start lists kept per thread (as `engine/session/replay.rs` keeps its
/// logs): a session holds one only while the test server owes it a command.
const SPARES: usize = 64;

/// Where commands start in the client's stream: (serial, offset), oldest first.
#[derive(Default)]
pub(super) struct Starts(VecDeque<(u64, u64)>);

/// Spare lists, boxed as sessions hold them (handing one over moves a pointer).
#[allow(clippy::vec_box)]
#[derive(Default)]
struct SpareStarts(Vec<Box<Starts>>);

thread_local! {
    static SPARE_STARTS: std::cell::RefCell<SpareStarts> =
        std::cell::RefCell::new(SpareStarts::default());
}

/// Lists filled and emptied within one call (the packets of one captured chunk). They live
/// with the thread, not the session: thousands of idle sessions would otherwise each keep
/// the capacity their busiest chunk needed, while one thread only ever uses one at a time.
/// Taken out for the call and put back, so a nested call finds an empty list (it then
/// allocates its own, which is correct, only not free).
#[derive(Default)]
struct Scratch {
    /// What arrived in a chunk: commands and their continuations.
    arrived: Vec<Arrived>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// What the arrival reader saw in the client's stream, in order.
#[derive(Clone, Copy, Debug)]
enum Arrived {
    /// A command awaiting a reply: its command byte and serial number.
    Command { code: Option<u8>, serial: u64 },
    /// A continuation packet of that command (with this id): the command is 16 MiB or more.
    Continued(u8),
}

/// The arrival reader.
pub(super) struct Arrival {
    scanner: FrameScanner,
    /// Serial number of the next client command awaiting a reply, as it arrives.
    serial: u64,
    /// The next logical packet is the client's login (a session whose SYN we saw).
    skip_login: bool,
    /// The last logical packet that arrived was a command awaiting a reply: its continuation
    /// packets move the id its reply starts at.
    in_command: bool,
    /// Where each command the test server may still need starts in the stream (serial,
    /// offset), oldest first: a replay starts at one (`replay_from`). Trimmed as the test
    /// server answers. Boxed: an idle session keeps none, and every session carries this.
    starts: Option<Box<Starts>>,
}

impl Arrival {
    /// `prefix`: bytes kept of each packet; `picked_up`: no login will come.
    pub(super) fn new(prefix: usize, picked_up: bool) -> Self {
        Self {
            scanner: FrameScanner::new(prefix),
            serial: 0,
            skip_login: !picked_up,
            in_command: false,
            starts: None,
        }
    }

    /// Where the command numbered `serial` starts, forgetting every earlier one; a command
    /// not arrived yet starts where the stream stands, if it stands between two packets.
    pub(super) fn start_of(&mut self, serial: u64) -> Option<u64> {
        if let Some(Starts(starts)) = self.starts.as_deref_mut() {
            while starts.front().is_some_and(|&(s, _)| s < serial) {
                starts.pop_front();
            }
            match starts.front() {
                Some(&(s, offset)) if s == serial => return Some(offset),
                Some(_) => return None,
                // All answered: an idle session keeps none.
                None => {
                    if let Some(spare) = self.starts.take().filter(|s| s.0.capacity() <= 256) {
                        SPARE_STARTS.with(|s| {
                            let spares = &mut s.borrow_mut().0;
                            if spares.len() < SPARES {
                                spares.push(spare);
                            }
                        });
                    }
                }
            }
        }
        self.at_boundary().then(|| self.scanner.position())
    }

    pub(super) fn memory_len(&self) -> usize {
        self.starts.as_ref().map_or(0, |s| {
            mem::size_of::<Starts>() + s.0.capacity() * mem::size_of::<(u64, u64)>()
        })
    }

    /// Whether the reader stands between two packets.
    pub(super) fn at_boundary(&self) -> bool {
        self.scanner.at_boundary()
    }

    /// Nothing of the client's stream has arrived yet.
    pub(super) fn at_start(&self) -> bool {
        self.scanner.position() == 0
    }

    /// The serial the next command will have.
    pub(super) fn next_serial(&self) -> u64 {
        self.serial
    }

    /// Commands were lost whole (a capture gap): the next packet starts a command of its own.
    pub(super) fn gap(&mut self) {
        self.in_command = false;
    }

    /// Reads `data`, noting in `pkts` what arrived; the report and a picked-up session's
    /// bookkeeping (`changes`) hear of each command too.
    fn feed(
        &mut self,
        data: &[u8],
        mut observer: Option<&mut Observer>,
        mut changes: Option<&mut PickupState>,
        pkts: &mut Vec<Arrived>,
    ) {
        let skip_login = &mut self.skip_login;
        let in_command = &mut self.in_command;
        let serial = &mut self.serial;
        let starts = &mut self.starts;
        self.scanner.feed(data, |p| {
            if p.header.part != 0 {
                if *in_command {
                    pkts.push(Arrived::Continued(p.header.seq));
                }
                return;
            }
            *in_command = false;
            if mem::take(skip_login) {
                return;
            }
            // Other ids are auth continuations and LOCAL INFILE data, never commands.
            if p.header.seq != 0 {
                return;
            }
            let code = p.prefix.first().copied();
            if code.is_some_and(|c| !expects_reply(c)) {
                if let Some(o) = observer.as_deref_mut() {
                    o.no_reply_command(p.prefix);
                }
                return;
            }
            let n = *serial;
            *serial += 1;
            let Starts(starts) = &mut **starts.get_or_insert_with(|| {
                SPARE_STARTS
                    .with(|s| s.borrow_mut().0.pop())
                    .unwrap_or_default()
            });
            if starts.len() >= MAX_STARTS {
                // Nobody asked for a while (a TLS session's engine keeps no replay): the
                // oldest cannot be replayed any more.
                starts.pop_front();
            }
            starts.push_back((n, p.header.offset));
            if let Some(c) = changes.as_deref_mut() {
                c.note_arrival(n, p.prefix);
            }
            if let Some(o) = observer.as_deref_mut() {
                let end = p.header.payload_offset() + u64::from(p.header.len);
                o.arrived(n, p.prefix, end);
            }
            *in_command = true;
            pkts.push(Arrived::Command { code, serial: n });
        });
    }
}

impl MysqlTransform {
    /// Notes the commands production will answer, as they arrive, and numbers them.
    pub(super) fn arrive(&mut self, data: &[u8], out: &mut TransformOutput<'_>) {
        let mut pkts = SCRATCH.with(|s| mem::take(&mut s.borrow_mut().arrived));
        pkts.clear();
        self.arrival.feed(
            data,
            self.observer.as_deref_mut(),
            self.pickup.arrival_notes(),
            &mut pkts,
        );
        if let Some(o) = &mut self.observer {
            o.arrival_progress(self.arrival.scanner.position(), self.captured);
        }
        for &a in &pkts {
            match a {
                Arrived::Command { code, serial } => {
                    self.prod_expects(ReplyKind::of_command(code), serial, out)
                }
                Arrived::Continued(seq) => self.prod.continued(seq),
            }
        }
        pkts.clear();
        if pkts.capacity() > 1024 {
            pkts = Vec::new();
        }
        SCRATCH.with(|s| s.borrow_mut().arrived = pkts);
    }
}
