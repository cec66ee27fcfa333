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

use std::mem;

use common::mysql::packet::FrameScanner;

use super::super::observe::Observer;
use super::super::replies::ReplyKind;
use super::pickup::PickupState;
use super::{expects_reply, MysqlTransform};
use crate::engine::TransformOutput;

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
}

impl Arrival {
    /// `prefix`: bytes kept of each packet; `picked_up`: no login will come.
    pub(super) fn new(prefix: usize, picked_up: bool) -> Self {
        Self {
            scanner: FrameScanner::new(prefix),
            serial: 0,
            skip_login: !picked_up,
            in_command: false,
        }
    }

    /// Whether the reader stands between two packets.
    pub(super) fn at_boundary(&self) -> bool {
        self.scanner.at_boundary()
    }

    /// Bytes of the client's stream that arrived so far.
    pub(super) fn position(&self) -> u64 {
        self.scanner.position()
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
