//! Bytes of our own for the test server: the schema and variables of a picked-up connection,
//! recovered statements prepared again, closes of statements no client command will name.
//!
//! # What this room is for
//!
//! Holding what we have to say to the test server until the stream has room for it, and
//! sending it there with what it will owe in return, so that the replies to ours are not taken
//! for the client's.
//!
//! # What it must never do
//!
//! * Send in the middle of a client packet or of a LOCAL INFILE transfer: ours go only
//!   between two client commands (or right after our login), or they would be read as the
//!   client's bytes.
//! * Hold more than `max_held_bytes`: an injection past it is not queued (and counted as
//!   `held_overflow`), the session lives on.

use std::collections::VecDeque;

use common::mysql::command::com;
use common::mysql::packet::{write_packet, HEADER_LEN};

use super::super::Counter;
use super::test_side::TestExpect;
use super::{Abandon, MysqlTransform};
use crate::engine::TransformOutput;

/// A recovered statement to give the statement map once its prepare is sent.
pub(super) struct Register {
    /// Production's id of the statement.
    prod_id: u32,
    /// Its SQL (the first `SQL_KEPT` bytes).
    sql: Vec<u8>,
}

impl Register {
    pub(super) fn new(prod_id: u32, sql: Vec<u8>) -> Self {
        Self { prod_id, sql }
    }
}

/// Bytes of our own to send before the client's next command.
pub(super) struct Injection {
    bytes: Vec<u8>,
    expect: Option<TestExpect>,
    /// A recovered statement, registered when sent.
    register: Option<Register>,
}

impl Injection {
    /// `payload` as one packet, and what the test server will owe for it.
    pub(super) fn packet(
        payload: &[u8],
        expect: Option<TestExpect>,
        register: Option<Register>,
    ) -> Self {
        let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
        write_packet(0, payload, &mut bytes);
        Self {
            bytes,
            expect,
            register,
        }
    }
}

/// Ours, oldest first, and their bytes.
pub(super) struct Injections {
    queue: VecDeque<Injection>,
    bytes: usize,
}

impl Injections {
    pub(super) fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Ahead of everything queued, and unbounded: only our own login's schema goes there.
    pub(super) fn push_front(&mut self, inj: Injection) {
        self.bytes += inj.bytes.len();
        self.queue.push_front(inj);
    }

    /// The test server's replies are no longer read: a re-prepare would never be paired.
    pub(super) fn drop_reprepares(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|i| i.register.is_none());
        if self.queue.len() != before {
            self.bytes = self.queue.iter().map(|i| i.bytes.len()).sum();
        }
    }

    /// The session is given up.
    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn memory_len(&self) -> usize {
        self.bytes + self.queue.capacity() * std::mem::size_of::<Injection>()
    }
}

impl MysqlTransform {
    /// Queues `inj`; false (counted as `held_overflow`) when it would exceed the held-bytes
    /// bound.
    pub(super) fn queue_injection(
        &mut self,
        inj: Injection,
        out: &mut TransformOutput<'_>,
    ) -> bool {
        let queued = &mut self.inject;
        if queued.bytes + inj.bytes.len() > self.shared.config.max_held_bytes {
            out.count(Counter::HeldOverflow as usize);
            return false;
        }
        queued.bytes += inj.bytes.len();
        queued.queue.push_back(inj);
        true
    }

    /// Sends what we queued. Only between two client commands (or right after our login): in
    /// the middle of a LOCAL INFILE transfer our bytes would be taken for file contents.
    pub(super) fn flush_injections(
        &mut self,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        while let Some(inj) = self.inject.queue.pop_front() {
            self.inject.bytes = self.inject.bytes.saturating_sub(inj.bytes.len());
            if let Some(r) = &inj.register {
                if self.test.blind() || self.stmts.tracking_lost() {
                    continue;
                }
                self.stmts
                    .map(&self.shared)
                    .register_known(r.prod_id, &r.sql);
            }
            if let Some(e) = inj.expect {
                self.test_owes_ours(e)?;
            }
            out.push(&inj.bytes);
        }
        if self.inject.queue.capacity() > 64 {
            self.inject.queue = VecDeque::new();
        }
        Ok(())
    }

    /// Closes a statement the test server prepared and no client command will name.
    pub(super) fn close_on_test(&mut self, test_id: u32, out: &mut TransformOutput<'_>) {
        let mut payload = [0u8; 5];
        payload[0] = com::STMT_CLOSE;
        payload[1..].copy_from_slice(&test_id.to_le_bytes());
        self.queue_injection(Injection::packet(&payload, None, None), out);
    }
}

/// Our own COM_INIT_DB of `db`.
pub(super) fn init_db(db: &[u8]) -> Injection {
    let mut payload = Vec::with_capacity(1 + db.len());
    payload.push(com::INIT_DB);
    payload.extend_from_slice(db);
    Injection::packet(&payload, Some(TestExpect::InitDb), None)
}
