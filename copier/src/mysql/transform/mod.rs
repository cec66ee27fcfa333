//! One mirrored MySQL session: the client's stream in, the test server's stream out, and the
//! knowledge of both servers' replies that decides what goes through (see `mod.rs`).
//!
//! Three readers of three streams:
//!
//! * **The client's stream, as it arrives** (`arrive`): only packet starts and command bytes,
//!   to know which of production's replies answers which command. It never waits.
//! * **The client's stream, as it is forwarded** (`run`/`decide`): each packet's header and
//!   first bytes are collected (at most [`MAX_HEAD`]), a verdict is reached (forward, possibly
//!   rewritten; drop; or hold until the test server catches up), then the rest of the packet
//!   streams through or is skipped as it arrives. While a packet is held, later client bytes
//!   wait in `backlog`, so the order toward the test server never changes.
//! * **Production's replies** (`on_prod_data`) and **the test server's** (`on_test_packet`,
//!   summaries from intercept): both are cut into replies the same way, by following each
//!   reply's structure to its end ([`ReplyTracker`]: sequence ids alone cannot tell a reply of
//!   256·k packets, which ends on id 0, from a longer one), and matched in order with the
//!   commands each server was sent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::mem;
use std::sync::Arc;
use std::time::Duration;

use common::clock::Instant;
use common::control::{MysqlEvent, MysqlPacket, MysqlRows};
use common::mysql::auth::{
    encrypt_password, rand_core, AuthPlugin, Nonce, Password, ServerPublicKey, REQUEST_PUBLIC_KEY,
};
use common::mysql::classify::{self, Effect, NameUse, Rules, WriteKind};
use common::mysql::command::{self, com, ChangeUser, PrepareOk};
use common::mysql::handshake::{
    AuthMoreData, AuthSwitchRequest, Capabilities, ClientLogin, FastAuthResult, Greeting,
    HandshakeResponse, MariaCapabilities, NotMirrorable, ReplyPhase, ServerReply,
};
use common::mysql::packet::{
    write_packet, FrameScanner, PacketHeader, ScanSink, ScannedPacket, HEADER_LEN, MAX_PAYLOAD_LEN,
};
use common::mysql::stmt::{
    PrepareAnswer, Resolution, StatementMap, UnmappedReason, LAST_PREPARED, SQL_KEPT,
};

use super::observe::{Decision, Observer, SQL_LOOKED_AT};
use super::param_types::{Exec, Execute, SessionTypes};
use super::replies::{ok_status, ReplyKind, ReplyTracker, Role, Seen};
use super::resync::{self, RESYNC_WAIT};
use super::txn_gate::{Cause, Gate, Gates, ReplyStatus};
use super::{read_only_counter, Counter, NotRecovered, RecoveredState, Shared};
use crate::engine::{SessionInfo, StreamTransform, TestEvent, TransformOutput};

/// Payload bytes of one client packet looked at before its verdict. Logins and COM_CHANGE_USER
/// must fit whole (real ones are a few hundred bytes); other commands need at most a statement
/// id or [`SQL_KEPT`] bytes of SQL.
const MAX_HEAD: usize = 64 * 1024;
/// Bytes kept of each of production's reply packets: PREPARE_OK is 12, an ERR code 3.
const PROD_PREFIX: usize = 16;
/// Commands awaiting a reply from one server, and prepare answers waiting for their partner.
/// Real clients keep a handful in flight. The test server may fall this far behind production
/// (a slower build, a starved CPU): further commands then wait in the session's backlog
/// (bounded by `max_held_bytes`) until it catches up, rather than the session being given up.
pub(super) const MAX_IN_FLIGHT: usize = 4096;
/// What the test server may owe at most, our own injected commands included: a hard bound on
/// the bookkeeping, reached only if the backpressure above failed.
const MAX_TEST_OWED: usize = 2 * MAX_IN_FLIGHT;
/// Commands held for a test server behind go out again once it owes no more than this: in
/// batches, since each resume moves the rest of the backlog to its front (megabytes, when the
/// test server stalled for seconds), which once per answer would cost the copier its capture.
const RESUME_BEHIND: usize = MAX_IN_FLIGHT - MAX_IN_FLIGHT / 4;
/// Buffers grown beyond this are released once empty, so one big packet does not pin memory.
const KEEP_CAPACITY: usize = 64 * 1024;
/// Stands in for production's answer to a prepare whose reply was never seen: the map then
/// treats the statement as unusable (and closes it on the test server).
const LOST_ANSWER: PrepareAnswer = PrepareAnswer::Err { code: 0 };
/// utf8mb4_general_ci, what MariaDB Connector/C (sysbench) asks for.
const SYNTHETIC_CHARSET: u8 = 45;
/// How long a command may wait for the test server's PREPARE_OK without a word from the test
/// server. intercept drops summaries when its relay queue is full; a lost PREPARE_OK would
/// otherwise hold the session (and its FIN) until the backlog overflows or the session idles out.
/// As long as the probe's wait ([`RESYNC_WAIT`]), for the same reason: a test server that is
/// only slow must not be taken for a lost answer. At 2 s, a 1,000-connection run on the lab's
/// two cores (test threads waiting seconds for a CPU, nothing dropped anywhere) lost the
/// framing of 18 sessions and dropped 8,604 of their executes (work fidelity 0.961).
const HELD_TIMEOUT: Duration = RESYNC_WAIT;
/// SQL bytes of a COM_QUERY or COM_STMT_PREPARE collected to classify it under `--read-only`
/// (at most `max_held_bytes`). A longer text is judged by this prefix, and is not mirrored unless
/// the prefix already shows a write (its unseen rest could hold `FOR UPDATE` or `; DELETE`).
const MAX_SQL_HEAD: usize = 1 << 20;
/// What Connector/C announces as its largest packet.
const SYNTHETIC_MAX_PACKET: u32 = 1 << 28;

/// What a synthetic login asks for: the capabilities every client of a pooled connection can
/// be assumed to have used, so its captured commands read the same on the test server.
const SYNTHETIC_CAPS: Capabilities = Capabilities(
    Capabilities::PROTOCOL_41.0
        | Capabilities::SECURE_CONNECTION.0
        | Capabilities::PLUGIN_AUTH.0
        | Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA.0
        | Capabilities::MYSQL.0
        | Capabilities::LONG_FLAG.0
        | Capabilities::TRANSACTIONS.0
        | Capabilities::MULTI_RESULTS.0
        | Capabilities::PS_MULTI_RESULTS.0
        | Capabilities::MULTI_STATEMENTS.0,
);

/// How a picked-up client's COM_CHANGE_USER is read: its real capabilities are unknown, these
/// are what every current client negotiates with a current server.
const PICKUP_CLIENT_CAPS: Capabilities = Capabilities(
    Capabilities::PROTOCOL_41.0
        | Capabilities::SECURE_CONNECTION.0
        | Capabilities::PLUGIN_AUTH.0
        | Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA.0
        | Capabilities::CONNECT_ATTRS.0
        | Capabilities::CONNECT_WITH_DB.0,
);

/// Mirrors `Command::expects_reply` from the command byte alone: the reply queues are kept from
/// packet heads, which may be too short for `Command::parse`.
pub(super) fn expects_reply(code: u8) -> bool {
    !matches!(code, com::QUIT | com::STMT_CLOSE | com::STMT_SEND_LONG_DATA)
}

/// Whether the first captured packet of a picked-up connection looks like a command a client
/// sends (a capture that starts mid-packet almost never passes this).
fn plausible_command(head: &[u8]) -> bool {
    let (Some(h), Some(&code)) = (PacketHeader::parse(head), head.get(HEADER_LEN)) else {
        return false;
    };
    if h.seq != 0 {
        return false;
    }
    let len = h.len;
    match code {
        com::QUIT | com::STATISTICS | com::PING | com::RESET_CONNECTION => len == 1,
        // COM_PROCESS_INFO, COM_DEBUG
        0x0a | 0x0d => len == 1,
        // COM_REFRESH
        0x07 => len == 2,
        com::QUERY => len >= 1,
        com::INIT_DB | com::FIELD_LIST | com::STMT_PREPARE | com::CHANGE_USER => len >= 2,
        com::PROCESS_KILL | com::STMT_CLOSE | com::STMT_RESET => len == 5,
        com::SET_OPTION => len == 3,
        com::STMT_FETCH => len == 9,
        com::STMT_SEND_LONG_DATA | com::STMT_BULK_EXECUTE => len >= 7,
        com::STMT_EXECUTE => len >= 10,
        _ => false,
    }
}

/// Why a session is given up: the counter to bump and the reason for the close event.
#[derive(Clone, Copy, Debug)]
struct Abandon {
    counter: Counter,
    why: &'static str,
}

fn abandon(counter: Counter, why: &'static str) -> Abandon {
    Abandon { counter, why }
}

const NO_CREDENTIALS: Abandon = Abandon {
    counter: Counter::NoCredentials,
    why: "no_credentials",
};

fn protocol(why: &'static str) -> Abandon {
    abandon(Counter::ProtocolErrors, why)
}

/// The caller's random source, in the shape RSA padding wants.
struct CallerRng<'a>(&'a (dyn Fn(&mut [u8]) -> bool + Send + Sync));

#[derive(Debug, thiserror::Error)]
#[error("the random source failed")]
struct RandomSourceFailed;

impl rand_core::TryRng for CallerRng<'_> {
    type Error = RandomSourceFailed;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        if (self.0)(dst) {
            Ok(())
        } else {
            Err(RandomSourceFailed)
        }
    }
}

impl rand_core::TryCryptoRng for CallerRng<'_> {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientStage {
    /// The next packet is the login (a session whose SYN we saw).
    Login,
    Commands,
}

/// Where the forwarding reader is in the client's stream.
#[derive(Clone, Copy, Debug)]
enum Fwd {
    /// Collecting the header and first bytes of a logical packet into `head`.
    Head,
    /// The rest of a physical packet: `left` bytes, passed on or skipped.
    Body {
        left: u32,
        more: bool,
        forward: bool,
    },
    /// The header of a continuation packet (the previous one was 0xFFFFFF long).
    ContHeader {
        hdr: [u8; HEADER_LEN],
        have: u8,
        forward: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Forward,
    Drop,
    /// Wait: the test server must answer something first.
    Block,
}

/// What became of a client's COM_STMT_PREPARE, for pairing production's answer with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Sent to the test server and given to the statement map.
    Tracked,
    /// Sent, not tracked (framing or tracking lost): production's answer is not needed.
    Untracked,
    /// Not sent (`--read-only`): production's id is remembered so its executes are not sent.
    Skipped,
    /// Not sent: a picked-up connection prepared it in a schema nobody read
    /// (`variables_first`). Like `Skipped`, its executes are lost with it, and counted.
    Lost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TestPhase {
    Greeting,
    /// Greeting known, our login not sent yet (no client login, or waiting for recovery).
    Login,
    /// Our login sent; following the auth exchange.
    Auth,
    Commands,
    /// intercept lost framing after the login: no more replies will be seen.
    Blind,
    /// Blind, and our COM_STATISTICS sent to find a reply boundary again (`resync.rs`):
    /// commands are expected as in `Commands`, their replies seen once the probe's is.
    Resyncing,
}

/// What the test server owes for something we sent it.
enum TestExpect {
    Reply(ReplyKind),
    /// A COM_STMT_PREPARE tracked in the statement map; `recovered`: ours, of a statement
    /// production had before we saw the connection.
    Prepare {
        recovered: bool,
    },
    /// Our own COM_INIT_DB (recovered or default schema).
    InitDb,
    /// Our own `SET` of a recovered variable.
    SetVariable,
    /// A COM_CHANGE_USER, whose reply is an auth exchange.
    ChangeUser(Box<AuthExchange>),
}

impl TestExpect {
    fn kind(&self) -> ReplyKind {
        match self {
            Self::Reply(k) => *k,
            Self::Prepare { .. } => ReplyKind::Prepare,
            Self::InitDb | Self::SetVariable => ReplyKind::Generic,
            Self::ChangeUser(_) => ReplyKind::Auth,
        }
    }
}

/// An auth exchange with the test server in progress (login or COM_CHANGE_USER).
struct AuthExchange {
    /// `None`: the login passed unchanged (no credentials, and configured to allow that).
    password: Option<Password>,
    plugin: AuthPlugin,
    nonce: Nonce,
    /// We asked for the RSA key (caching_sha2_password full auth).
    awaiting_key: bool,
    change_user: bool,
}

/// What the test server's greeting said.
#[derive(Clone, Copy, Debug)]
struct TestServer {
    caps: Capabilities,
    /// MariaDB offers COM_STMT_BULK_EXECUTE (an extended capability). One flag, not the
    /// whole set: every session carries this struct (`a_session_in_line_stays_small`).
    bulk_operations: bool,
    plugin: AuthPlugin,
    nonce: Nonce,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProdPhase {
    Greeting,
    Auth,
    Commands,
    /// Production refused the login: the client will go away.
    Failed,
    /// A picked-up connection: replies cannot be framed until the client sends a command.
    Unsynced,
    /// A command went out while unsynced: the next bytes start its reply.
    Armed,
    /// Reading the first packet after arming; it must be a reply start.
    Resyncing,
}

/// One of production's packets as the scanner reported it.
#[derive(Clone, Copy)]
struct ProdPacket {
    seq: u8,
    part: u32,
    len: u32,
    prefix: [u8; PROD_PREFIX],
    prefix_len: u8,
    /// The payload's hash (`--compare-results`).
    hash: Option<u64>,
}

impl ProdPacket {
    fn new(p: &ScannedPacket<'_>) -> Self {
        let mut prefix = [0; PROD_PREFIX];
        let n = p.prefix.len().min(PROD_PREFIX);
        prefix[..n].copy_from_slice(&p.prefix[..n]);
        Self {
            seq: p.header.seq,
            part: p.header.part,
            len: p.header.len,
            prefix,
            prefix_len: n as u8,
            hash: p.hash,
        }
    }

    fn prefix(&self) -> &[u8] {
        &self.prefix[..usize::from(self.prefix_len)]
    }
}

/// What the allocator's own headers and rounding add to the sizes `memory_len` sums (glibc:
/// 8 bytes and up to 15 of rounding per allocation; an idle session holds about five: this
/// struct, the engine's send queue, the two reply queues, a packet head), and the small
/// allocations of a login that come and go. Calibrated in the lab (`bench/idle.sh --conns
/// 10000`, docs/BENCHMARKS.md): the copier's RSS grew 1.78 KiB per idle mirrored MySQL
/// session while the sizes the budget sums (engine's fixed part included) came to 1.70 KiB;
/// with this the charge is 1.96 KiB, a little above what a session really takes, so many idle
/// sessions stay within `--max-memory`.
const SMALL_ALLOCATIONS: usize = 256;

/// `--read-only`: what was kept off the test server and must stay off.
#[derive(Default)]
struct Skipped {
    /// Production's ids of statements whose prepare was not sent to the test server.
    statements: HashSet<u32>,
    /// SQL-level prepared statement names whose PREPARE was not sent, with its kind.
    names: HashMap<Box<[u8]>, WriteKind>,
    /// Those of `statements` not sent for want of a picked-up connection's state ([`Fate::Lost`]):
    /// what they would have run is lost, not kept off by design.
    lost: HashSet<u32>,
}

fn new_map(shared: &Shared) -> Box<StatementMap> {
    Box::new(StatementMap::new(shared.config.max_statements))
}

/// Who a picked-up connection logs in as, what its login said (recovery compares it), and how
/// long it waits for recovered state.
struct PickupLogin {
    /// The user and schema to log in with: the defaults, or what recovery learnt.
    user: Option<String>,
    db: Option<String>,
    /// What our synthetic login used.
    login_user: Option<String>,
    login_db: Option<Vec<u8>>,
    /// Until when the login waits for recovered state (`recovery_wait`).
    recovery_deadline: Option<Instant>,
    /// When production answered the client's commands (serial, capture time), from the pickup
    /// until the recovered variables are placed.
    answered: VecDeque<(u64, Instant)>,
    /// Recovered variables' `SET`s, due before the first held command production answered
    /// after it read them.
    variables: Option<Snapshot>,
    /// The same from production's second read, used instead when a command writing a
    /// variable was answered within the first read's round trip.
    variables_again: Option<Snapshot>,
    /// How long a held command waits for production's answer to tell which side it is on.
    variables_deadline: Option<Instant>,
    /// That wait is over: what is still not known goes after the variables. (The deadline
    /// is cleared then, so that a session idle until its next command sets no past timer.)
    variables_expired: bool,
    /// Serials of the schema changes (COM_INIT_DB, `USE`) that arrived meanwhile: a query
    /// production ran before one of them and before its lookup ran in a schema nobody
    /// read.
    schema_changes: Vec<u64>,
    /// Serials of the queries that may write a user variable ([`writes_user_variable`]).
    variable_writes: Vec<u64>,
}

/// Production's answers remembered per picked-up connection to place its variables.
const ANSWERS_KEPT: usize = 1024;
/// A held command whose production answer is not seen within this goes after the variables.
const VARIABLES_WAIT: Duration = Duration::from_millis(100);

/// The first bytes of a picked-up session's commands looked at as they arrive: enough for a
/// `USE` and for most `SET @...` of a user variable.
const VARIABLE_PREFIX: usize = 64;

/// A query that may write a user variable, judged by its first bytes: a `SET` naming one, or
/// an assignment (`:=`, `INTO @`).
fn writes_user_variable(prefix: &[u8]) -> bool {
    let [com::QUERY, sql @ ..] = prefix else {
        return false;
    };
    let sql = sql.trim_ascii_start();
    let has = |needle: &[u8]| {
        sql.windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
    };
    sql.contains(&b'@')
        && (sql.get(..3).is_some_and(|w| w.eq_ignore_ascii_case(b"SET"))
            || has(b":=")
            || has(b"INTO @"))
}

/// Whether a query's text may name a table (so depends on the current schema): all but
/// transaction control and a `SET` without a subquery, by their first bytes.
fn names_tables(sql: &[u8]) -> bool {
    let sql = sql.trim_ascii_start();
    let starts = |w: &[u8]| {
        sql.get(..w.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(w))
    };
    let has_select = sql.windows(6).any(|w| w.eq_ignore_ascii_case(b"SELECT"));
    let control = [
        &b"COMMIT"[..],
        b"ROLLBACK",
        b"BEGIN",
        b"START TRANSACTION",
        b"SAVEPOINT",
        b"RELEASE",
        b"USE",
    ];
    !(control.iter().any(|w| starts(w)) || (starts(b"SET") && !has_select))
}

/// COM_INIT_DB, or a query that starts with `USE` (the first bytes of a command).
fn is_schema_change(prefix: &[u8]) -> bool {
    match prefix {
        [com::INIT_DB, ..] => true,
        [com::QUERY, u, s, e, sep, ..] => {
            [*u, *s, *e].eq_ignore_ascii_case(b"USE") && (sep.is_ascii_whitespace() || *sep == b'`')
        }
        _ => false,
    }
}

/// Recovered variables and the round trip of the read that gave them (capture clock).
struct Snapshot {
    read: (Instant, Instant),
    sets: Vec<Injection>,
}

impl Snapshot {
    /// When production read them, give or take half the round trip.
    fn at(&self) -> Instant {
        let (a, b) = self.read;
        a + (b - a) / 2
    }
}

/// Where a held command goes relative to the recovered variables.
enum Side {
    Before,
    After,
    Unknown,
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
    Command(Option<u8>, u64),
    /// A continuation packet of that command (with this id): the command is 16 MiB or more.
    Continued(u8),
}

/// The id of the first packet of the reply to a command whose last packet had id `last`:
/// replies go on counting where the command stopped, so a command of 16 MiB or more (two
/// packets and up) is answered from id 3 on, not 1.
fn first_reply_id(last: u8) -> u8 {
    last.wrapping_add(1)
}

/// Bytes of our own to send before the client's next command.
struct Injection {
    bytes: Vec<u8>,
    expect: Option<TestExpect>,
    /// A recovered statement: production's id and its SQL, registered when sent.
    register: Option<(u32, Vec<u8>)>,
}

/// In-line sizes of the parts of a [`MysqlTransform`] (see `mod.rs`'s `session_layout`).
pub(super) fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::size_of;
    vec![
        ("mysql MysqlTransform", size_of::<MysqlTransform>()),
        ("mysql FrameScanner", size_of::<FrameScanner>()),
        ("mysql ReplyTracker", size_of::<ReplyTracker>()),
        ("mysql StatementMap", size_of::<StatementMap>()),
        ("mysql SessionTypes", size_of::<SessionTypes>()),
        ("mysql AuthExchange", size_of::<AuthExchange>()),
        ("mysql ProdPacket", size_of::<ProdPacket>()),
        ("mysql Injection", size_of::<Injection>()),
        (
            "mysql test_fifo item",
            size_of::<(TestExpect, Option<u64>, u8)>(),
        ),
        ("mysql prod_fifo item", size_of::<(ReplyKind, u64, u8)>()),
    ]
}

/// Recovered statements not prepared on the test server yet (production's id, its whole
/// SQL): each is, right before the first client command that names it.
#[derive(Default)]
struct Deferred {
    sql: HashMap<u32, Box<[u8]>>,
    bytes: usize,
}

impl Deferred {
    fn insert(&mut self, prod_id: u32, sql: Vec<u8>) {
        self.bytes += sql.len();
        if let Some(old) = self.sql.insert(prod_id, sql.into_boxed_slice()) {
            self.bytes -= old.len();
        }
    }

    fn holds(&self, prod_id: u32) -> bool {
        self.sql.contains_key(&prod_id)
    }

    fn remove(&mut self, prod_id: u32) -> Option<Box<[u8]>> {
        let sql = self.sql.remove(&prod_id)?;
        self.bytes -= sql.len();
        Some(sql)
    }

    fn memory_len(&self) -> usize {
        use std::mem::size_of;
        size_of::<Self>() + self.sql.capacity() * (size_of::<(u32, Box<[u8]>)>() + 1) + self.bytes
    }
}

/// The [`StreamTransform`] of one MySQL session. See the module documentation.
pub struct MysqlTransform {
    shared: Arc<Shared>,
    picked_up: bool,
    /// Given up: every later call does nothing.
    dead: bool,

    // The client's stream as it arrives.
    arrival: FrameScanner,
    arrival_skip_login: bool,
    /// The last logical packet that arrived was a command awaiting a reply: its continuation
    /// packets move the id its reply starts at.
    arrival_in_command: bool,
    /// Serial number of the next client command awaiting a reply, as it arrives. Both
    /// readers number the same commands the same way (packets with id 0 after the login,
    /// except those without a reply): the serial ties production's reply, the forwarding
    /// decision and the test server's reply to one command.
    arrival_serial: u64,
    /// Serial of the next client command the forwarding reader decides.
    fwd_serial: u64,
    /// The logical packet being forwarded is a client command the test server owes a reply
    /// (the newest entry of `test_fifo`): its continuation packets move that reply's first id.
    fwd_owed: bool,
    /// The command just dropped was kept off by `--read-only` (not a loss).
    dropped_by_design: bool,
    /// The command just dropped names a statement the test server refused (its error code).
    dropped_refused: Option<u16>,
    /// `--report`: what the comparison report learns of this session.
    observer: Option<Box<Observer>>,

    // The client's stream as forwarded.
    stage: ClientStage,
    fwd: Fwd,
    head: Vec<u8>,
    blocked: bool,
    held_counted: bool,
    /// The current command was counted as waiting for the test server to catch up.
    behind_counted: bool,
    /// When a command held for the test server's PREPARE_OK stops waiting ([`HELD_TIMEOUT`]).
    held_deadline: Option<Instant>,
    /// The latest time the engine gave us (deadlines are set where no `now` is passed).
    now: Instant,
    /// When the captured bytes being handled were captured (the engine's `now` when it did not
    /// say): production's latencies are measured between capture times.
    captured: Instant,
    backlog: Vec<u8>,
    /// The client's own auth continuation (answers to production's auth switch) is not ours
    /// to send: swallowed until its next command.
    swallow_client_auth: bool,
    first_checked: bool,
    /// The capabilities the client's packets are encoded with.
    client_caps: Capabilities,
    /// The capabilities of our session on the test server (how it reads what we send).
    session_caps: Capabilities,

    // Our login on the test server.
    login: Option<Vec<u8>>,
    login_sent: bool,
    /// A picked-up connection's login (`None` for every other: it is only read by recovery,
    /// and a session whose login we saw has nothing to recover, so it keeps no strings).
    pickup: Option<Box<PickupLogin>>,
    recovered: bool,
    deferred: Option<Box<Deferred>>,

    // The test server.
    test_phase: TestPhase,
    test_server: Option<TestServer>,
    session_nonce: Option<Nonce>,
    test_auth: Option<Box<AuthExchange>>,
    change_user_in_flight: bool,
    /// What the test server owes, with the serial of the client command it answers (`None`
    /// for our own commands).
    /// What the test server owes, oldest first: the expectation, the client command's serial
    /// (`None`: our own), and the id of the reply's first packet (see [`first_reply_id`]).
    test_fifo: VecDeque<(TestExpect, Option<u64>, u8)>,
    test_next_offset: u64,
    test_prev_len: u32,
    test_prev_seq: Option<u8>,
    test_replies: ReplyTracker,
    /// While `Resyncing`: when the probe is given up.
    resync_until: Option<Instant>,
    /// The waits for a transaction boundary before writes go, after a pickup or a capture
    /// gap (`txn_gate.rs`); gone once each is proven.
    gates: Option<Box<Gates>>,
    /// The probe for this loss of framing was tried (or cannot work): no other until intercept
    /// says it lost the stream again.
    resync_spent: bool,

    // Production.
    prod_phase: ProdPhase,
    prod_scanner: FrameScanner,
    /// Per command awaiting production's reply: how the reply is built, and its serial.
    /// Commands production owes a reply, oldest first: kind, serial, first reply id.
    prod_fifo: VecDeque<(ReplyKind, u64, u8)>,
    prod_prev_seq: Option<u8>,
    prod_replies: ReplyTracker,

    // Prepared statements.
    /// `None` until the first statement command: a session that never prepares one (most
    /// text-protocol clients) does not carry an empty map's 104 bytes.
    map: Option<Box<StatementMap>>,
    /// Production's answers to prepares the forwarding reader has not reached yet.
    prod_answers: VecDeque<PrepareAnswer>,
    /// Prepares passed (forwarded or skipped) before production's answer was seen.
    unanswered_prepares: VecDeque<Fate>,
    /// Statement pairing gave up (too many answers in flight): every id is untranslatable.
    tracking_lost: bool,
    /// Statements may exist that were prepared before we saw the connection.
    stmts_predate_us: bool,
    /// Statements may exist whose prepare the capture lost (a gap was gone past).
    stmts_in_gap: bool,
    /// Which statements the test server has parameter types for; `None` until one with
    /// parameters is prepared there.
    types: Option<Box<SessionTypes>>,

    inject: VecDeque<Injection>,
    inject_bytes: usize,

    // `--read-only`.
    /// Statements whose prepare was not sent to the test server; `None` until there is one
    /// (most sessions never have any, and two empty hash tables take 96 bytes in line).
    skipped: Option<Box<Skipped>>,
    /// The client's latest COM_STMT_PREPARE was not sent: MariaDB's "last prepared" id
    /// ([`LAST_PREPARED`]) names it.
    last_prepare_skipped: bool,
    /// The last prepare was not sent for want of a picked-up connection's state ([`Fate::Lost`]).
    last_prepare_lost: bool,
    /// The packets after a command that was not sent (LOCAL INFILE contents) are not sent either.
    skip_data: bool,
}

impl Drop for MysqlTransform {
    fn drop(&mut self) {
        if self.test_phase == TestPhase::Resyncing {
            // The test server's answers to what went after the probe were never readable:
            // unseen, as in a blind session, not lost.
            if let Some(o) = &mut self.observer {
                o.test_lost_all();
            }
        }
    }
}

impl fmt::Debug for MysqlTransform {
    // Phases and sizes only: the state holds passwords during auth exchanges.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlTransform")
            .field("picked_up", &self.picked_up)
            .field("dead", &self.dead)
            .field("stage", &self.stage)
            .field("test_phase", &self.test_phase)
            .field("prod_phase", &self.prod_phase)
            .field("blocked", &self.blocked)
            .field("backlog", &self.backlog.len())
            .field("statements", &self.map.as_ref().map_or(0, |m| m.len()))
            .finish_non_exhaustive()
    }
}

impl MysqlTransform {
    pub(super) fn new(now: Instant, session: &SessionInfo, shared: Arc<Shared>, copy: u32) -> Self {
        let picked_up = session.picked_up;
        let pickup = picked_up.then(|| {
            Box::new(PickupLogin {
                user: shared.config.default_user.clone(),
                db: shared.config.default_db.clone(),
                login_user: None,
                login_db: None,
                recovery_deadline: None,
                answered: VecDeque::new(),
                variables: None,
                variables_again: None,
                variables_deadline: None,
                variables_expired: false,
                schema_changes: Vec::new(),
                variable_writes: Vec::new(),
            })
        });
        let observer = shared
            .config
            .report
            .clone()
            .map(|h| Box::new(Observer::new(h, copy, shared.config.max_statements)));
        // The report fingerprints each command's SQL: the arrival reader then keeps that much
        // of each packet (only packets split across segments are copied).
        // A picked-up session tells `USE` from other queries as they arrive (see
        // `PickupLogin::schema_changes`).
        let arrival_prefix = if observer.is_some() {
            SQL_LOOKED_AT
        } else if picked_up {
            VARIABLE_PREFIX
        } else {
            1
        };
        let compare = observer.as_ref().is_some_and(|o| o.compare_results());
        // A picked-up session's statements are prepared again without types (`--prod-dsn`),
        // and production answers the executes held for them before the test server can: those
        // answers verify the first guesses, so they are kept from the start.
        let types = (picked_up && shared.config.recovery_wait.is_some())
            .then(|| Box::new(SessionTypes::new(shared.config.max_statements)));
        Self {
            shared,
            picked_up,
            dead: false,
            arrival: FrameScanner::new(arrival_prefix),
            arrival_skip_login: !picked_up,
            arrival_in_command: false,
            arrival_serial: 0,
            fwd_serial: 0,
            fwd_owed: false,
            dropped_by_design: false,
            dropped_refused: None,
            observer,
            stage: if picked_up {
                ClientStage::Commands
            } else {
                ClientStage::Login
            },
            fwd: Fwd::Head,
            head: Vec::new(),
            blocked: false,
            held_counted: false,
            behind_counted: false,
            held_deadline: None,
            now,
            captured: now,
            backlog: Vec::new(),
            swallow_client_auth: false,
            first_checked: !picked_up,
            client_caps: Capabilities::default(),
            login: None,
            login_sent: false,
            pickup,
            recovered: false,
            deferred: None,
            test_phase: TestPhase::Greeting,
            test_server: None,
            session_caps: Capabilities::default(),
            session_nonce: None,
            test_auth: None,
            change_user_in_flight: false,
            test_fifo: VecDeque::new(),
            test_next_offset: 0,
            test_prev_len: 0,
            test_prev_seq: None,
            test_replies: ReplyTracker::new(),
            resync_until: None,
            gates: picked_up.then(|| Box::new(Gates::new(Cause::Pickup, 0))),
            resync_spent: false,
            prod_phase: if picked_up {
                ProdPhase::Unsynced
            } else {
                ProdPhase::Greeting
            },
            prod_scanner: prod_scanner(compare),
            prod_fifo: VecDeque::new(),
            prod_prev_seq: None,
            prod_replies: ReplyTracker::new(),
            map: None,
            prod_answers: VecDeque::new(),
            unanswered_prepares: VecDeque::new(),
            tracking_lost: false,
            stmts_predate_us: picked_up,
            stmts_in_gap: false,
            types,
            inject: VecDeque::new(),
            inject_bytes: 0,
            skipped: None,
            last_prepare_skipped: false,
            last_prepare_lost: false,
            skip_data: false,
        }
    }

    // ------------------------------------------------------------------ the test server

    /// One MySQL packet of the test server's reply stream, as intercept summarised it (in
    /// stream order; a copy of one already seen is ignored, a gap ends framing).
    pub fn on_test_packet(
        &mut self,
        now: Instant,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) {
        self.test_packet_at(now, now, pkt, out);
    }

    /// What every summary or run of the test server's stream goes through first: `bytes` of
    /// the stream from `stream_offset`, received at `received`. False when there is nothing
    /// more to do with it: the session is dead, it was seen already, or events were lost
    /// before it (the framing is then lost).
    fn test_in_order(
        &mut self,
        now: Instant,
        received: Instant,
        stream_offset: u64,
        bytes: u64,
        out: &mut TransformOutput<'_>,
    ) -> bool {
        if self.dead {
            return false;
        }
        self.now = now;
        self.captured = received;
        if self.held_deadline.is_some() {
            // The test server is making progress (slow commands before the prepare).
            self.held_deadline = Some(now + HELD_TIMEOUT);
        }
        if stream_offset < self.test_next_offset {
            return false;
        }
        if stream_offset > self.test_next_offset && self.test_phase != TestPhase::Resyncing {
            self.lose_framing(out);
            self.resume(out);
            return false;
        }
        self.test_next_offset = stream_offset.saturating_add(bytes);
        true
    }

    /// A packet summary received from intercept at `received` (the report's test latencies
    /// end there).
    fn test_packet_at(
        &mut self,
        now: Instant,
        received: Instant,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) {
        let bytes = HEADER_LEN as u64 + u64::from(pkt.len);
        if !self.test_in_order(now, received, pkt.stream_offset, bytes, out) {
            return;
        }
        let continuation = self.test_prev_len as usize == MAX_PAYLOAD_LEN;
        let prev = self.test_prev_seq.replace(pkt.seq_id);
        self.test_prev_len = pkt.len;
        let seen = (self.test_phase == TestPhase::Commands).then(|| {
            let next = self
                .test_fifo
                .front()
                .map_or((ReplyKind::Generic, 1), |(e, _, first)| (e.kind(), *first));
            let seen =
                self.test_replies
                    .packet(pkt.seq_id, prev, pkt.len, &pkt.head, continuation, next);
            count_seen(seen, out);
            seen
        });
        let starts_reply = seen.is_some_and(|s| s.start);
        let r = match self.test_phase {
            TestPhase::Greeting => self.test_greeting(pkt, continuation, out),
            TestPhase::Login => Err(protocol("test_server_spoke_first")),
            TestPhase::Auth if continuation => Err(protocol("auth_packet_too_long")),
            TestPhase::Auth => self.auth_packet(pkt, out),
            TestPhase::Commands if self.test_auth.is_some() => {
                if continuation {
                    Ok(())
                } else {
                    self.auth_packet(pkt, out)
                }
            }
            TestPhase::Commands if starts_reply => self.test_reply(pkt, out),
            TestPhase::Resyncing => {
                if resync::is_probe_answer(pkt.seq_id, pkt.len, &pkt.head, continuation) {
                    self.resynced(out);
                }
                Ok(())
            }
            TestPhase::Commands | TestPhase::Blind => Ok(()),
        };
        if let (Some(seen), Some(o)) = (seen, &mut self.observer) {
            o.test_packet(&seen, pkt.len, &pkt.head, pkt.hash, continuation, received);
        }
        if let Err(a) = r {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    /// Rows and definitions intercept folded into a run: only counted, and checked against
    /// the structure followed so far.
    fn test_rows_at(
        &mut self,
        now: Instant,
        received: Instant,
        run: &MysqlRows,
        out: &mut TransformOutput<'_>,
    ) {
        if !self.test_in_order(now, received, run.stream_offset, run.bytes, out) {
            return;
        }
        let prev = self.test_prev_seq.replace(run.last_seq_id());
        // Runs never hold a 16 MiB packet: the next packet starts a payload.
        self.test_prev_len = 0;
        if self.test_phase != TestPhase::Commands || self.test_auth.is_some() {
            // intercept folds only result sets; nothing here reads them.
            return;
        }
        let follows = prev.map(|p| p.wrapping_add(1)) == Some(run.seq_id);
        let folded = self.test_replies.folded(run.count, run.eof, follows);
        if folded.is_none() {
            out.count(Counter::ReplyStructureLost as usize);
        }
        if let Some(o) = &mut self.observer {
            o.test_folded(folded.map(|f| f.1), run.payload_bytes());
        }
        self.resume(out);
    }

    /// intercept can no longer frame the test server's replies of this session.
    pub fn on_test_framing_lost(
        &mut self,
        now: Instant,
        _at_seq: u32,
        out: &mut TransformOutput<'_>,
    ) {
        if self.dead || self.test_phase == TestPhase::Resyncing {
            // A restarted intercept finds our probe's answer as well as the one before it,
            // if the test server has not sent it yet; if it has, the wait runs out.
            return;
        }
        self.now = now;
        self.lose_framing(out);
        // intercept holds the stream as lost from now on: a probe of ours can find it again.
        self.resync_spent = false;
        self.resume(out);
    }

    fn lose_framing(&mut self, out: &mut TransformOutput<'_>) {
        match self.test_phase {
            TestPhase::Blind => return,
            _ if !self.test_ready() || self.test_auth.is_some() => {
                // Without the test server's answers the login cannot be completed.
                self.give_up(abandon(Counter::FramingLost, "framing_lost"), out);
                return;
            }
            TestPhase::Resyncing => {
                // The probe did not find the stream again: its wait ends blind, as before it.
                out.count(Counter::ResyncsFailed as usize);
                self.resync_until = None;
                self.resync_spent = true;
            }
            _ => {
                out.count(Counter::FramingLost as usize);
                self.resync_spent = false;
            }
        }
        self.test_phase = TestPhase::Blind;
        self.test_fifo.clear();
        if let Some(m) = &mut self.map {
            // Otherwise a later prepare would be paired with an answer owed from before.
            m.test_answers_lost();
        }
        if let Some(t) = &mut self.types {
            t.test_lost();
        }
        if let Some(o) = &mut self.observer {
            o.test_lost_all();
        }
        // Re-prepares would never be paired: not worth sending.
        let before = self.inject.len();
        self.inject.retain(|i| i.register.is_none());
        if self.inject.len() != before {
            self.inject_bytes = self.inject.iter().map(|i| i.bytes.len()).sum();
        }
    }

    /// intercept frames the test server's replies again from the end of our probe's answer:
    /// stream offsets count from there.
    fn on_test_framing_resumed(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead {
            return;
        }
        self.now = now;
        if self.test_phase != TestPhase::Resyncing {
            // The answer to a probe given up on: the replies that follow belong to commands
            // this session no longer expects.
            return;
        }
        self.test_next_offset = 0;
        self.resynced(out);
        self.resume(out);
    }

    /// The probe's answer is behind us: the next reply is the first command's after it.
    fn resynced(&mut self, out: &mut TransformOutput<'_>) {
        out.count(Counter::TestFramingResumed as usize);
        self.test_phase = TestPhase::Commands;
        self.resync_until = None;
        self.test_prev_seq = None;
        self.test_prev_len = 0;
        self.test_replies.reset();
    }

    /// A blind session sends its probe in front of the client command about to go, the
    /// one place (with `flush_injections`) where bytes of ours cannot split a command.
    fn probe_before_command(&mut self, out: &mut TransformOutput<'_>) {
        let client_asks = self.head.get(HEADER_LEN) == Some(&com::STATISTICS);
        match self.test_phase {
            TestPhase::Resyncing if client_asks => {
                // Two answers would then be on their way; which one intercept finds is a
                // guess, and a wrong guess shifts every reply after it.
                self.lose_framing(out);
            }
            TestPhase::Blind if client_asks => self.resync_spent = true,
            TestPhase::Blind if !self.resync_spent && self.test_auth.is_none() => {
                out.count(Counter::ResyncProbes as usize);
                out.push(&resync::PROBE);
                self.test_phase = TestPhase::Resyncing;
                self.resync_until = Some(self.now + RESYNC_WAIT);
                self.resync_spent = true;
            }
            _ => {}
        }
    }

    fn test_greeting(
        &mut self,
        pkt: &MysqlPacket,
        continuation: bool,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        if pkt.head.first() == Some(&0xff) {
            // "Too many connections", "Host is blocked": the test server refused us.
            return Err(abandon(Counter::TestRefused, "test_refused"));
        }
        if continuation || pkt.seq_id != 0 || !pkt.complete() {
            return Err(protocol("test_greeting_unreadable"));
        }
        let g = Greeting::parse(&pkt.head).map_err(|_| protocol("test_greeting_unreadable"))?;
        let nonce =
            Nonce::from_auth_data(&g.nonce()).map_err(|_| protocol("test_greeting_unreadable"))?;
        // A plugin we cannot answer for: offer native; the server switches us if it must.
        let plugin = g
            .auth_plugin
            .and_then(|p| AuthPlugin::from_name(p).ok())
            .unwrap_or(AuthPlugin::MysqlNativePassword);
        self.test_server = Some(TestServer {
            caps: g.capabilities,
            bulk_operations: g
                .mariadb_capabilities()
                .is_some_and(|m| m.contains(MariaCapabilities::STMT_BULK_OPERATIONS)),
            plugin,
            nonce,
        });
        self.test_phase = TestPhase::Login;
        self.try_login(out)
    }

    /// A packet of an auth exchange (login or COM_CHANGE_USER).
    fn auth_packet(
        &mut self,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Some(mut ex) = self.test_auth.take() else {
            return Ok(());
        };
        let reply_seq = pkt.seq_id.wrapping_add(1);
        match ServerReply::classify(&pkt.head, ReplyPhase::Auth) {
            ServerReply::Ok => {
                if ex.change_user {
                    self.change_user_in_flight = false;
                } else {
                    self.test_phase = TestPhase::Commands;
                    self.flush_injections(out)?;
                }
                Ok(())
            }
            ServerReply::Err => Err(abandon(Counter::AuthFailedOnTest, "auth_failed")),
            ServerReply::AuthSwitch => {
                let reply = self.auth_switch(&mut ex, pkt, out)?;
                push_packet(reply_seq, reply.as_bytes(), out);
                out.count(Counter::AuthSwitches as usize);
                self.test_auth = Some(ex);
                Ok(())
            }
            ServerReply::AuthMoreData => {
                self.auth_more_data(&mut ex, pkt, reply_seq, out)?;
                self.test_auth = Some(ex);
                Ok(())
            }
            _ => Err(protocol("auth_exchange_unreadable")),
        }
    }

    fn auth_switch(
        &mut self,
        ex: &mut AuthExchange,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) -> Result<common::mysql::auth::AuthResponse, Abandon> {
        let unsupported = || abandon(Counter::UnsupportedAuthPlugin, "unsupported_auth_plugin");
        let (plugin, data) = if pkt.complete() {
            let sw = AuthSwitchRequest::parse(&pkt.head).map_err(|_| unsupported())?;
            (
                AuthPlugin::from_name(sw.plugin).map_err(|_| unsupported())?,
                Some(sw.data),
            )
        } else {
            // intercept cut the packet (its --mysql-head, after a connection's first packets):
            // name the plugin from what is shown; MariaDB and MySQL switch with the session's
            // nonce, so assume it.
            let shown = pkt.head.get(1..).unwrap_or(&[]);
            let name = shown.split(|&b| b == 0).next().unwrap_or(&[]);
            let named_whole = name.len() < shown.len();
            let mut candidates = [
                AuthPlugin::MysqlNativePassword,
                AuthPlugin::CachingSha2Password,
            ]
            .into_iter()
            .filter(|p| {
                if named_whole {
                    p.name() == name
                } else {
                    p.name().starts_with(name)
                }
            });
            let plugin = match (candidates.next(), candidates.next()) {
                (Some(p), None) if !name.is_empty() => p,
                _ => return Err(unsupported()),
            };
            out.count(Counter::AuthSwitchNonceAssumed as usize);
            (plugin, None)
        };
        let nonce = match data {
            Some(d) => Nonce::from_auth_data(d).map_err(|_| protocol("auth_switch_unreadable"))?,
            None => self.session_nonce.unwrap_or(ex.nonce),
        };
        ex.plugin = plugin;
        ex.nonce = nonce;
        ex.awaiting_key = false;
        self.session_nonce = Some(nonce);
        let password = ex.password.as_ref().ok_or(NO_CREDENTIALS)?;
        Ok(plugin.scramble(password.as_bytes(), &nonce))
    }

    fn auth_more_data(
        &mut self,
        ex: &mut AuthExchange,
        pkt: &MysqlPacket,
        reply_seq: u8,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        if ex.plugin != AuthPlugin::CachingSha2Password {
            return Err(protocol("auth_more_data_unexpected"));
        }
        let more =
            AuthMoreData::parse(&pkt.head).map_err(|_| protocol("auth_more_data_unexpected"))?;
        if !ex.awaiting_key {
            return match more.fast_auth_result() {
                // An OK follows.
                Some(FastAuthResult::Success) => Ok(()),
                Some(FastAuthResult::FullAuthRequired) => {
                    push_packet(reply_seq, &[REQUEST_PUBLIC_KEY], out);
                    ex.awaiting_key = true;
                    out.count(Counter::FullAuthRsa as usize);
                    Ok(())
                }
                None => Err(protocol("auth_more_data_unexpected")),
            };
        }
        let failed = |why| abandon(Counter::FullAuthFailed, why);
        if !pkt.complete() {
            return Err(failed("rsa_key_cut"));
        }
        let key = ServerPublicKey::from_pem(more.data).map_err(|_| failed("rsa_key_unreadable"))?;
        let mut rng = CallerRng(&*self.shared.random);
        let password = ex.password.as_ref().ok_or(NO_CREDENTIALS)?;
        let sealed = encrypt_password(password.as_bytes(), &ex.nonce, &key, &mut rng)
            .map_err(|_| failed("rsa_encrypt_failed"))?;
        push_packet(reply_seq, &sealed, out);
        ex.awaiting_key = false;
        Ok(())
    }

    /// The first packet of the test server's reply to the oldest command it owes one.
    fn test_reply(
        &mut self,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Some((expect, serial, _)) = self.test_fifo.pop_front() else {
            out.count(Counter::RepliesUnmatched as usize);
            return Ok(());
        };
        if let (Some(serial), Some(o)) = (serial, &mut self.observer) {
            o.test_start(serial, self.captured);
        }
        match expect {
            TestExpect::Reply(_) => {
                if let (Some(serial), Some(t)) = (serial, self.types.as_deref_mut()) {
                    let refused = (pkt.head.first() == Some(&0xff)).then(|| {
                        pkt.head
                            .get(1..3)
                            .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]))
                    });
                    if t.test_answered(serial, refused) {
                        out.count(Counter::ParamTypesCorrected as usize);
                    }
                }
            }
            TestExpect::Prepare { recovered } => {
                let answer = PrepareAnswer::parse(&pkt.head).unwrap_or_else(|_| {
                    out.count(Counter::ProtocolErrors as usize);
                    LOST_ANSWER
                });
                if let PrepareAnswer::Ok { statement_id } = answer {
                    self.test_prepared(statement_id, &pkt.head, recovered);
                }
                let r = self
                    .map
                    .get_or_insert_with(|| new_map(&self.shared))
                    .test_answer(answer);
                self.resolved(r, out);
            }
            TestExpect::InitDb => {
                if pkt.head.first() == Some(&0xff) {
                    out.count(Counter::RecoveryInitDbFailed as usize);
                }
            }
            TestExpect::SetVariable => {
                if pkt.head.first() == Some(&0xff) {
                    out.count(Counter::RecoverySetFailed as usize);
                }
            }
            TestExpect::ChangeUser(ex) => {
                self.test_auth = Some(ex);
                return self.auth_packet(pkt, out);
            }
        }
        Ok(())
    }

    /// The test server prepared `test_id` (`recovered`: for a statement production had before
    /// we saw the connection): the parameter count its executes need types for.
    fn test_prepared(&mut self, test_id: u32, head: &[u8], recovered: bool) {
        let Ok(ok) = PrepareOk::parse(head) else {
            return;
        };
        // With MySQL's query attributes an execute carries parameter names and a count too:
        // a layout the type bookkeeping does not read. Its executes pass as they are.
        if (self.client_caps | self.session_caps).contains(Capabilities::QUERY_ATTRIBUTES) {
            return;
        }
        if ok.num_params == 0 && self.types.is_none() {
            return;
        }
        let limit = self.shared.config.max_statements;
        self.types
            .get_or_insert_with(|| Box::new(SessionTypes::new(limit)))
            .prepared(test_id, ok.num_params, recovered);
    }

    fn test_ready(&self) -> bool {
        matches!(
            self.test_phase,
            TestPhase::Commands | TestPhase::Blind | TestPhase::Resyncing
        ) && !self.change_user_in_flight
    }

    fn test_blind(&self) -> bool {
        self.test_phase == TestPhase::Blind
    }

    /// The test server owes an answer to something of ours.
    fn expect_test(&mut self, e: TestExpect) -> Result<(), Abandon> {
        self.expect(e, None)
    }

    /// The test server owes an answer to the client command being decided.
    fn expect_client(&mut self, e: TestExpect) -> Result<(), Abandon> {
        self.expect(e, Some(self.fwd_serial))
    }

    fn expect(&mut self, e: TestExpect, serial: Option<u64>) -> Result<(), Abandon> {
        if self.test_blind() {
            return Ok(());
        }
        if self.test_fifo.len() >= MAX_TEST_OWED {
            return Err(protocol("test_server_not_answering"));
        }
        self.test_fifo.push_back((e, serial, 1));
        Ok(())
    }

    // ------------------------------------------------------------------ logins

    fn password_for(&self, user: &[u8]) -> Option<Password> {
        let user = std::str::from_utf8(user).ok()?;
        self.shared
            .credentials
            .password(user)
            .map(|p| Password::new(p.to_vec()))
    }

    /// The password `user` has on the test server. Without one the session is given up,
    /// unless configured to let such logins pass unchanged (`Ok(None)`): a test server that
    /// does not check passwords (`--skip-grant-tables`) accepts them anyway.
    fn credentials(
        &self,
        user: &[u8],
        out: &mut TransformOutput<'_>,
    ) -> Result<Option<Password>, Abandon> {
        match self.password_for(user) {
            Some(p) => Ok(Some(p)),
            None if self.shared.config.forward_without_credentials => {
                out.count(Counter::AuthForwardedUnchanged as usize);
                Ok(None)
            }
            None => Err(NO_CREDENTIALS),
        }
    }

    /// Sends our login once everything it needs is known.
    fn try_login(&mut self, out: &mut TransformOutput<'_>) -> Result<(), Abandon> {
        if self.login_sent || self.dead {
            return Ok(());
        }
        let Some(server) = self.test_server else {
            return Ok(());
        };
        if self.picked_up {
            if self.recovery_deadline().is_some() {
                return Ok(());
            }
            return self.synthetic_login(server, out);
        }
        match self.login.take() {
            Some(login) => self.rewrite_login(&login, server, out),
            None => Ok(()),
        }
    }

    /// The client's login with the auth response recomputed for the test server.
    fn rewrite_login(
        &mut self,
        login: &[u8],
        server: TestServer,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Ok(ClientLogin::Response(r)) = ClientLogin::parse(login) else {
            return Err(protocol("login_unreadable"));
        };
        let password = self.credentials(r.username, out)?;
        // Without PLUGIN_AUTH the server assumes native and cannot switch.
        let plugin = if r.capabilities.contains(Capabilities::PLUGIN_AUTH) {
            server.plugin
        } else {
            AuthPlugin::MysqlNativePassword
        };
        let mut payload = Vec::with_capacity(login.len() + 16);
        match &password {
            Some(password) => {
                let scramble = plugin.scramble(password.as_bytes(), &server.nonce);
                let rewritten = HandshakeResponse {
                    auth_response: scramble.as_bytes(),
                    auth_plugin: r.auth_plugin.map(|_| plugin.name()),
                    ..r
                };
                rewritten
                    .write(&mut payload)
                    .map_err(|_| protocol("login_unencodable"))?;
                out.count(Counter::LoginsRewritten as usize);
            }
            None => payload.extend_from_slice(login),
        }
        // What both sides agreed on decides how the server reads COM_CHANGE_USER.
        self.client_caps = r.capabilities & server.caps;
        self.session_caps = self.client_caps;
        // Where a PREPARE_OK ends depends on DEPRECATE_EOF. Production's greeting is not read
        // whole: assumed to offer what the test server offers (both are current servers).
        let deprecate_eof = self.session_caps.contains(Capabilities::DEPRECATE_EOF);
        self.test_replies.set_deprecate_eof(deprecate_eof);
        self.prod_replies.set_deprecate_eof(deprecate_eof);
        self.send_login(&payload, plugin, server.nonce, password, out);
        Ok(())
    }

    /// A login of our own for a connection whose login we never saw.
    fn synthetic_login(
        &mut self,
        server: TestServer,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Some(user) = self.pickup.as_ref().and_then(|p| p.user.clone()) else {
            return Err(abandon(
                Counter::PickupNoDefaultUser,
                "pickup_no_default_user",
            ));
        };
        let password = self.credentials(user.as_bytes(), out)?;
        let db = self.pickup.as_ref().and_then(|p| p.db.clone());
        let want = if db.is_some() {
            SYNTHETIC_CAPS | Capabilities::CONNECT_WITH_DB
        } else {
            SYNTHETIC_CAPS
        };
        let mut caps = want & server.caps;
        if !caps.contains(Capabilities::PROTOCOL_41) {
            return Err(protocol("test_server_too_old"));
        }
        // MariaDB's COM_STMT_BULK_EXECUTE (Connector/J's and Connector/C's batches) is refused
        // on a session that did not ask for it. Asking changes nothing else on the wire, unlike
        // the other extended capabilities (metadata caching, progress reports), which a pooled
        // client may not have had.
        let mut filler = [0; 23];
        if server.bulk_operations {
            caps = Capabilities(caps.0 & !Capabilities::MYSQL.0);
            filler[19..].copy_from_slice(&MariaCapabilities::STMT_BULK_OPERATIONS.0.to_le_bytes());
        }
        let plugin = if caps.contains(Capabilities::PLUGIN_AUTH) {
            server.plugin
        } else {
            AuthPlugin::MysqlNativePassword
        };
        let scramble = password
            .as_ref()
            .map(|p| plugin.scramble(p.as_bytes(), &server.nonce));
        let with_db = caps.contains(Capabilities::CONNECT_WITH_DB);
        let r = HandshakeResponse {
            capabilities: caps,
            max_packet: SYNTHETIC_MAX_PACKET,
            charset: SYNTHETIC_CHARSET,
            filler,
            username: user.as_bytes(),
            auth_response: scramble.as_ref().map_or(&[][..], |s| s.as_bytes()),
            database: db.as_deref().filter(|_| with_db).map(str::as_bytes),
            auth_plugin: caps
                .contains(Capabilities::PLUGIN_AUTH)
                .then_some(plugin.name()),
            attributes: None,
            trailing: &[],
        };
        let mut payload = Vec::new();
        r.write(&mut payload)
            .map_err(|_| protocol("login_unencodable"))?;
        if let Some(db) = db.as_deref().filter(|_| !with_db) {
            // Before any recovered re-prepare: they may name tables of this schema.
            let inj = init_db(db.as_bytes());
            self.inject_bytes += inj.bytes.len();
            self.inject.push_front(inj);
            out.count(Counter::InjectedInitDb as usize);
        }
        self.session_caps = caps;
        self.client_caps = server.caps & PICKUP_CLIENT_CAPS;
        self.send_login(&payload, plugin, server.nonce, password, out);
        if let Some(p) = &mut self.pickup {
            p.login_db = db.filter(|_| with_db).map(String::into_bytes);
            p.login_user = Some(user);
        }
        out.count(Counter::PickupLogins as usize);
        Ok(())
    }

    fn send_login(
        &mut self,
        payload: &[u8],
        plugin: AuthPlugin,
        nonce: Nonce,
        password: Option<Password>,
        out: &mut TransformOutput<'_>,
    ) {
        // The login answers the greeting (seq 0).
        push_packet(1, payload, out);
        self.login_sent = true;
        self.session_nonce = Some(nonce);
        self.test_auth = Some(Box::new(AuthExchange {
            password,
            plugin,
            nonce,
            awaiting_key: false,
            change_user: false,
        }));
        self.test_phase = TestPhase::Auth;
    }

    // ------------------------------------------------------------------ pickup and recovery

    /// State of a picked-up connection recovered from production (`--prod-dsn`). Before our
    /// login it decides who we log in as; after it, the schema is selected with COM_INIT_DB.
    /// Either way each statement is prepared again on the test server before the client's next
    /// command, and executes of it are translated once the test server answered.
    pub fn recover(&mut self, now: Instant, state: RecoveredState, out: &mut TransformOutput<'_>) {
        if self.dead || !self.picked_up || self.recovered {
            return;
        }
        self.now = now;
        self.recovered = true;
        out.count(Counter::RecoveredSessions as usize);
        let RecoveredState {
            user,
            db,
            statements,
            variables,
            variables_dropped,
            variables_at,
            variables_again,
        } = state;
        let Some(pickup) = self.pickup.as_deref_mut() else {
            return;
        };
        if self.login_sent {
            if pickup.login_user.as_deref() != Some(user.as_str()) {
                // Not worth a COM_CHANGE_USER: statements the other user cannot run are
                // rejected by the test server and counted.
                out.count(Counter::RecoveryUserMismatch as usize);
            }
            if let Some(db) = db.filter(|d| pickup.login_db.as_deref() != Some(d.as_bytes())) {
                if self.queue_injection(init_db(db.as_bytes()), out) {
                    out.count(Counter::InjectedInitDb as usize);
                }
            }
        } else {
            pickup.user = Some(user);
            pickup.db = db;
            pickup.recovery_deadline = None;
        }
        out.add(
            Counter::RecoveryVariablesDropped as usize,
            u64::from(variables_dropped),
        );
        // Before the re-prepares (at first use): sql_mode (ANSI_QUOTES) and the character set
        // change how the test server parses them.
        let injections = |variables: Vec<Vec<u8>>| -> Vec<Injection> {
            variables
                .into_iter()
                .map(|set| {
                    let mut payload = Vec::with_capacity(1 + set.len());
                    payload.push(com::QUERY);
                    payload.extend_from_slice(&set);
                    let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
                    write_packet(0, &payload, &mut bytes);
                    Injection {
                        bytes,
                        expect: Some(TestExpect::SetVariable),
                        register: None,
                    }
                })
                .collect()
        };
        let sets = injections(variables);
        match (variables_at, self.pickup.as_deref_mut()) {
            // Also without variables: the schema production reported has the same boundary.
            (Some(read), Some(p)) => {
                p.variables = Some(Snapshot { read, sets });
                p.variables_again = variables_again.and_then(|(v, read)| {
                    read.map(|read| Snapshot {
                        read,
                        sets: injections(v),
                    })
                });
            }
            _ => self.queue_variables(sets, out),
        }
        if !self.test_blind() {
            for (prod_id, sql) in statements
                .into_iter()
                .take(self.shared.config.max_statements)
            {
                if let Some(o) = &mut self.observer {
                    o.recovered(prod_id, &sql);
                }
                if self.read_only_write(&sql).is_some() {
                    // Its executes are not sent either, and counted as such.
                    self.skip_statement(prod_id, out);
                    continue;
                }
                // Prepared at its first use, not now: production does not say which schema a
                // statement was prepared in, and the test server resolves its tables in the
                // schema current at the prepare. A statement is used where it was prepared far
                // more often than not (a pool's `setCatalog` and its cache of statements).
                self.deferred
                    .get_or_insert_with(Box::default)
                    .insert(prod_id, sql);
                out.count(Counter::RecoveredStatements as usize);
            }
        }
        if let Err(a) = self.try_login(out) {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    /// Production had nothing for this connection (gone already, lookup failed or refused):
    /// log in with the defaults now instead of holding its commands until `recovery_wait`.
    fn recovery_unavailable(&mut self, out: &mut TransformOutput<'_>) {
        if self.dead || !self.picked_up || self.recovered || self.recovery_deadline().is_none() {
            return;
        }
        self.stop_waiting_for_recovery();
        if let Err(a) = self.try_login(out) {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    fn recovery_deadline(&self) -> Option<Instant> {
        self.pickup.as_ref().and_then(|p| p.recovery_deadline)
    }

    fn stop_waiting_for_recovery(&mut self) {
        if let Some(p) = &mut self.pickup {
            p.recovery_deadline = None;
        }
    }

    /// Sends the test server a recovered statement's PREPARE now, between two client commands
    /// (the one naming it waits for the answer, as after a client's own prepare).
    fn prepare_recovered(
        &mut self,
        prod_id: u32,
        sql: &[u8],
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let mut payload = Vec::with_capacity(1 + sql.len());
        payload.push(com::STMT_PREPARE);
        payload.extend_from_slice(sql);
        let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
        write_packet(0, &payload, &mut bytes);
        let queued = self.queue_injection(
            Injection {
                bytes,
                expect: Some(TestExpect::Prepare { recovered: true }),
                register: Some((prod_id, sql[..sql.len().min(SQL_KEPT)].to_vec())),
            },
            out,
        );
        if queued {
            out.count(Counter::RecoveredPreparedAtFirstUse as usize);
        }
        self.flush_injections(out)
    }

    fn queue_variables(&mut self, sets: Vec<Injection>, out: &mut TransformOutput<'_>) {
        for inj in sets {
            if self.queue_injection(inj, out) {
                out.count(Counter::RecoveredVariables as usize);
            }
        }
    }

    /// Which side of the recovered variables' snapshot the held command `serial` is on: before
    /// it when production answered it (by the capture's clock) before it read them.
    fn variables_side(&self, serial: u64) -> Side {
        let Some(p) = self.pickup.as_deref() else {
            return Side::After;
        };
        let Some(snap) = &p.variables else {
            return Side::After;
        };
        let at = snap.at();
        match p.answered.iter().find(|(s, _)| *s == serial) {
            Some((_, answered)) if *answered <= at => Side::Before,
            Some(_) => Side::After,
            // Its answer went by unframed, or will never come.
            None if p.answered.back().is_some_and(|(s, _)| *s > serial) => Side::After,
            None if p.variables_expired || p.variables_deadline.is_some_and(|d| self.now >= d) => {
                Side::After
            }
            None if matches!(self.prod_phase, ProdPhase::Failed | ProdPhase::Unsynced) => {
                Side::After
            }
            None => Side::Unknown,
        }
    }

    /// The recovered variables go out now, ahead of the command being decided.
    fn place_variables(&mut self, out: &mut TransformOutput<'_>) {
        let Some(p) = self.pickup.as_deref_mut() else {
            return;
        };
        let sets = p.variables.take().map(|s| s.sets).unwrap_or_default();
        p.variables_again = None;
        p.answered = VecDeque::new();
        p.schema_changes = Vec::new();
        p.variable_writes = Vec::new();
        p.variables_deadline = None;
        p.variables_expired = false;
        self.queue_variables(sets, out);
    }

    /// Whether the held commands still wait for the recovered variables' place.
    fn variables_pending(&self) -> bool {
        self.pickup
            .as_deref()
            .is_some_and(|p| p.variables.is_some())
    }

    /// Whether the query or execute being decided may read or write a user variable: its SQL
    /// holds an `@`, or is not all known.
    fn names_user_variable(&self, code: u8) -> bool {
        let payload = &self.head[HEADER_LEN..];
        let sql = match code {
            com::QUERY => {
                let whole = PacketHeader::parse(&self.head)
                    .is_some_and(|h| h.len as usize == payload.len());
                if !whole {
                    return true;
                }
                payload.get(1..)
            }
            _ => {
                let Some(id) = command::statement_id(payload) else {
                    return true;
                };
                if let Some(sql) = self.deferred.as_ref().and_then(|d| d.sql.get(&id)) {
                    Some(&sql[..])
                } else {
                    // The map keeps the first SQL_KEPT bytes: a text that long may go on.
                    self.map
                        .as_deref()
                        .and_then(|m| m.sql(id))
                        .filter(|s| s.len() < SQL_KEPT)
                }
            }
        };
        sql.is_none_or(|s| s.contains(&b'@'))
    }

    /// Whether the command `serial` (production ran it before its lookup) depends on a schema
    /// nobody read: a later command that production also ran before the lookup changed the
    /// schema, so the one production reported is not the one this command ran in. Executes of
    /// statements already prepared do not depend on it (the statement keeps its schema).
    fn schema_unknown(&self, code: u8, serial: u64) -> bool {
        let depends = match code {
            com::QUERY => names_tables(&self.head[HEADER_LEN + 1..]),
            com::STMT_PREPARE => true,
            _ => command::statement_id(&self.head[HEADER_LEN..]).is_some_and(|id| {
                self.deferred
                    .as_ref()
                    .is_some_and(|d| d.sql.contains_key(&id))
            }),
        };
        depends && self.later_before(serial, |p| &p.schema_changes)
    }

    /// Whether one of `list`'s commands after `serial` also ran before production's lookup.
    fn later_before(&self, serial: u64, list: impl Fn(&PickupLogin) -> &Vec<u64>) -> bool {
        self.pickup.as_deref().is_some_and(|p| {
            list(p)
                .iter()
                .any(|&c| c > serial && matches!(self.variables_side(c), Side::Before))
        })
    }

    /// Which read the session starts from: the first, unless a command writing a variable
    /// was answered within its round trip (it may be in that read or not) and there is a
    /// second. False while production's answers up to the read's end are not all in (capture
    /// lag), for at most [`VARIABLES_WAIT`].
    fn settle_snapshot(&mut self, out: &mut TransformOutput<'_>) -> bool {
        let now = self.now;
        let unframed = matches!(self.prod_phase, ProdPhase::Failed | ProdPhase::Unsynced);
        let Some(p) = self.pickup.as_deref_mut() else {
            return true;
        };
        loop {
            let Some(snap) = &p.variables else {
                return true;
            };
            let (a, b) = snap.read;
            let settled = unframed
                || p.answered.back().is_some_and(|(_, t)| *t > b)
                || p.variables_expired
                || p.variables_deadline.is_some_and(|d| now >= d);
            if !settled {
                p.variables_deadline.get_or_insert(now + VARIABLES_WAIT);
                return false;
            }
            let ambiguous = p.variable_writes.iter().any(|w| {
                p.answered
                    .iter()
                    .any(|(s, t)| s == w && (a..=b).contains(t))
            });
            if !ambiguous || p.variables_again.is_none() {
                return true;
            }
            p.variables = p.variables_again.take();
            out.count(Counter::RecoveryVariablesReadAgain as usize);
        }
    }

    /// Whether the command `fwd_serial` (or one after it) may be held at a transaction gate.
    fn gated(&self) -> bool {
        self.gates
            .as_ref()
            .is_some_and(|g| g.any_from(self.fwd_serial))
    }

    /// The stretch holding `serial` has its boundary proven.
    fn open_gate(&mut self, serial: u64) {
        if let Some(g) = &mut self.gates {
            g.open(serial);
            if g.passed(serial) {
                self.gates = None;
            }
        }
    }

    /// Before the client command `fwd_serial` of a picked-up connection, or one after a
    /// capture gap: `Some(Drop)` for a query or an execute inside a transaction that began
    /// before the copier saw the connection (or that the gap cut), `Some(Block)` while
    /// production's replies have not told yet (bounded by `GATE_WAIT`), `None` once a
    /// boundary is proven (that stretch's gate is then gone). See `txn_gate.rs`.
    fn transaction_first(&mut self, out: &mut TransformOutput<'_>) -> Option<Verdict> {
        let serial = self.fwd_serial;
        let gates = self.gates.as_deref_mut()?;
        if gates.passed(serial) {
            self.gates = None;
            return None;
        }
        if !gates.gates(serial) {
            return None;
        }
        let code = self.head.get(HEADER_LEN).copied()?;
        let body = self.head.get(HEADER_LEN + 1..).unwrap_or(&[]);
        let sql = match code {
            com::QUERY => body,
            com::STMT_EXECUTE | com::STMT_BULK_EXECUTE => {
                let id = command::statement_id(&self.head[HEADER_LEN..])?;
                // An unknown statement is dropped further on anyway.
                self.map.as_deref()?.sql(id)?
            }
            // Prepares, closes, pings, schema changes: no row is changed by them.
            _ => return None,
        };
        if classify::starts_transaction(sql) {
            // A transaction the test server sees from its start (a BEGIN inside one commits
            // it first): the boundary.
            self.open_gate(serial);
            return None;
        }
        if classify::classify(sql).effect.is_read() {
            // A read, a COMMIT, a SET: inside a tail it runs on the test server outside the
            // transaction, and changes nothing there. Only writes wait for the proof.
            return None;
        }
        if self.prod_phase == ProdPhase::Failed {
            // Production's replies will not be read: nothing can be proven.
            self.gates = None;
            out.count(Counter::TransactionBoundaryUnproven as usize);
            return None;
        }
        let pending = self.prod_fifo.front().is_some_and(|f| f.1 < serial);
        let now = self.now;
        let gates = self.gates.as_deref_mut()?;
        let earlier_pending = pending || gates.replying.is_some_and(|s| s < serial);
        let (gate, cause) = gates.gate_mut(serial)?;
        let unproven = gate.timed_out(serial, now);
        match gate.decide(serial, earlier_pending, now) {
            Gate::Open => {
                if unproven {
                    out.count(Counter::TransactionBoundaryUnproven as usize);
                }
                self.open_gate(serial);
                None
            }
            Gate::Drop => {
                out.count(match cause {
                    Cause::Pickup => Counter::CommandsDroppedBeforeTransactionBoundary,
                    Cause::CaptureGap => Counter::CommandsDroppedInTransactionCutByGap,
                } as usize);
                Some(Verdict::Drop)
            }
            Gate::Wait => Some(Verdict::Block),
        }
    }

    /// Before the client command `fwd_serial`: `Some(Block)` while it is not known whether
    /// production ran it before reading the recovered variables, `Some(Drop)` for a query or
    /// an execute it ran before and that depends on what it could not read (see
    /// [`Counter::CommandsDroppedBeforeStateRead`]).
    fn variables_first(&mut self, out: &mut TransformOutput<'_>) -> Option<Verdict> {
        if !self.variables_pending() {
            return None;
        }
        if !self.settle_snapshot(out) {
            return Some(Verdict::Block);
        }
        let code = self.head.get(HEADER_LEN).copied()?;
        if !expects_reply(code) {
            return None;
        }
        match self.variables_side(self.fwd_serial) {
            // A prepare, a schema change, a close: no variable in them, and the statements and
            // schema the client has after them are what recovery gives anyway. (A prepare is
            // never dropped here: the statement map pairs every prepare with both answers.)
            Side::Before if code == com::STMT_PREPARE => {
                if !self.schema_unknown(code, self.fwd_serial) {
                    return None;
                }
                // Its answer is paired like any prepare's; its executes are lost with it.
                self.last_prepare_skipped = false;
                self.last_prepare_lost = true;
                self.prepare_passed(Fate::Lost, out);
                out.count(Counter::CommandsDroppedBeforeStateRead as usize);
                Some(Verdict::Drop)
            }
            Side::Before if !matches!(code, com::QUERY | com::STMT_EXECUTE) => None,
            Side::Before => {
                let serial = self.fwd_serial;
                let later_write = self.later_before(serial, |p| &p.variable_writes);
                let own_write = self
                    .pickup
                    .as_deref()
                    .is_some_and(|p| p.variable_writes.contains(&serial));
                let drop = if self.schema_unknown(code, serial) || own_write {
                    // It ran in a schema nobody read, or sent after the recovered values it
                    // would apply twice (`SET @n = @n + 1`).
                    true
                } else if self.names_user_variable(code) {
                    // It read the variables as production read them unless a later command
                    // of this stretch wrote them; if so it saw older values, else the SETs go
                    // ahead of it (before any, it would read none on the test server).
                    if !later_write {
                        self.place_variables(out);
                    }
                    later_write
                } else {
                    // It runs the same in any state of the variables.
                    false
                };
                if drop {
                    out.count(Counter::CommandsDroppedBeforeStateRead as usize);
                    return Some(Verdict::Drop);
                }
                None
            }
            Side::After => {
                self.place_variables(out);
                None
            }
            Side::Unknown => {
                if let Some(p) = self.pickup.as_deref_mut() {
                    p.variables_deadline
                        .get_or_insert(self.now + VARIABLES_WAIT);
                }
                Some(Verdict::Block)
            }
        }
    }

    /// Queues `inj`; false (counted as `held_overflow`) when it would exceed the held-bytes
    /// bound.
    fn queue_injection(&mut self, inj: Injection, out: &mut TransformOutput<'_>) -> bool {
        if self.inject_bytes + inj.bytes.len() > self.shared.config.max_held_bytes {
            out.count(Counter::HeldOverflow as usize);
            return false;
        }
        self.inject_bytes += inj.bytes.len();
        self.inject.push_back(inj);
        true
    }

    /// Sends what we queued. Only between two client commands (or right after our login): in
    /// the middle of a LOCAL INFILE transfer our bytes would be taken for file contents.
    fn flush_injections(&mut self, out: &mut TransformOutput<'_>) -> Result<(), Abandon> {
        while let Some(inj) = self.inject.pop_front() {
            self.inject_bytes = self.inject_bytes.saturating_sub(inj.bytes.len());
            if let Some((prod_id, sql)) = &inj.register {
                if self.test_blind() || self.tracking_lost {
                    continue;
                }
                self.map
                    .get_or_insert_with(|| new_map(&self.shared))
                    .register_known(*prod_id, sql);
            }
            if let Some(e) = inj.expect {
                self.expect_test(e)?;
            }
            out.push(&inj.bytes);
        }
        if self.inject.capacity() > 64 {
            self.inject = VecDeque::new();
        }
        Ok(())
    }

    fn close_on_test(&mut self, test_id: u32, out: &mut TransformOutput<'_>) {
        let mut payload = [0u8; 5];
        payload[0] = com::STMT_CLOSE;
        payload[1..].copy_from_slice(&test_id.to_le_bytes());
        let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
        write_packet(0, &payload, &mut bytes);
        self.queue_injection(
            Injection {
                bytes,
                expect: None,
                register: None,
            },
            out,
        );
    }

    // ------------------------------------------------------------------ production

    fn prod_packet(&mut self, p: &ProdPacket, out: &mut TransformOutput<'_>) {
        let prev = self.prod_prev_seq.replace(p.seq);
        if p.part > 0 {
            if let Some(o) = &mut self.observer {
                o.prod_packet(&Seen::default(), p.len, &[], p.hash, true, self.captured);
            }
            return;
        }
        match self.prod_phase {
            ProdPhase::Greeting => {
                self.prod_phase = if p.prefix().first() == Some(&0xff) {
                    ProdPhase::Failed
                } else {
                    ProdPhase::Auth
                };
            }
            ProdPhase::Auth => match ServerReply::classify(p.prefix(), ReplyPhase::Auth) {
                ServerReply::Ok => self.prod_phase = ProdPhase::Commands,
                ServerReply::Err => self.prod_phase = ProdPhase::Failed,
                _ => {}
            },
            ProdPhase::Commands => {
                let next = self.prod_next();
                let seen = self
                    .prod_replies
                    .packet(p.seq, prev, p.len, p.prefix(), false, next);
                count_seen(seen, out);
                if seen.start {
                    self.prod_reply(p, out);
                }
                self.observe_prod(&seen, p);
                if seen.end {
                    self.prod_reply_ended(&seen, p, out);
                }
            }
            ProdPhase::Resyncing => {
                if p.seq == self.prod_next().1 {
                    // The reply to the latest command; the earlier ones were answered in bytes
                    // we could not frame.
                    while self.prod_fifo.len() > 1 {
                        if let Some((kind, serial, _)) = self.prod_fifo.pop_front() {
                            self.lose_prod_reply(kind, serial, out);
                        }
                    }
                    out.count(Counter::ProdResyncs as usize);
                    self.prod_phase = ProdPhase::Commands;
                    self.prod_replies.reset();
                    let next = self.prod_next();
                    let seen =
                        self.prod_replies
                            .packet(p.seq, None, p.len, p.prefix(), false, next);
                    count_seen(seen, out);
                    self.prod_reply(p, out);
                    self.observe_prod(&seen, p);
                    if seen.end {
                        self.prod_reply_ended(&seen, p, out);
                    }
                } else {
                    self.lose_all_prod(out);
                    self.prod_phase = ProdPhase::Unsynced;
                }
            }
            ProdPhase::Failed | ProdPhase::Unsynced | ProdPhase::Armed => {}
        }
    }

    fn observe_prod(&mut self, seen: &Seen, p: &ProdPacket) {
        if let Some(o) = &mut self.observer {
            o.prod_packet(seen, p.len, p.prefix(), p.hash, false, self.captured);
        }
    }

    /// What the oldest command production owes expects: its reply's kind and first id.
    fn prod_next(&self) -> (ReplyKind, u8) {
        self.prod_fifo
            .front()
            .map_or((ReplyKind::Generic, 1), |f| (f.0, f.2))
    }

    /// The last packet of production's reply to the command `prod_replying`: the transaction
    /// gates (a picked-up connection's, or after a capture gap) learn what the reply said of
    /// its transaction.
    fn prod_reply_ended(&mut self, seen: &Seen, p: &ProdPacket, out: &mut TransformOutput<'_>) {
        let Some(gates) = self.gates.as_deref_mut() else {
            return;
        };
        let Some(serial) = gates.replying.take() else {
            return;
        };
        let st = match seen.role {
            Role::Ok | Role::RowsEnd => {
                ok_status(p.len, p.prefix()).map_or(ReplyStatus::Err, ReplyStatus::Status)
            }
            Role::Err => ReplyStatus::Err,
            _ => ReplyStatus::None,
        };
        gates.replied(serial, st);
        // A command held for this answer may now go.
        self.resume(out);
    }

    fn prod_reply(&mut self, p: &ProdPacket, out: &mut TransformOutput<'_>) {
        let popped = self.prod_fifo.pop_front();
        if let Some(gates) = self.gates.as_deref_mut() {
            gates.replying = popped.map(|f| f.1);
        }
        let recovering = !self.recovered;
        if let (Some((_, serial, _)), Some(pk)) = (popped, self.pickup.as_deref_mut()) {
            if recovering || pk.variables.is_some() {
                if pk.answered.len() >= ANSWERS_KEPT {
                    pk.answered.pop_front();
                }
                pk.answered.push_back((serial, self.captured));
                if pk.variables.is_some() {
                    // A command held for this answer may now go.
                    self.resume(out);
                }
            }
        }
        if let (Some((_, serial, _)), Some(o)) = (popped, &mut self.observer) {
            o.prod_start(serial, self.captured);
        }
        if let (Some((ReplyKind::Generic, serial, _)), Some(t)) = (popped, &mut self.types) {
            let ran = p.prefix().first() != Some(&0xff);
            if t.prod_answered(serial, ran, serial < self.fwd_serial) {
                out.count(Counter::ParamTypesCorrected as usize);
            }
        }
        match popped.map(|f| f.0) {
            None => out.count(Counter::RepliesUnmatched as usize),
            Some(ReplyKind::Prepare) => {
                let answer = PrepareAnswer::parse(p.prefix()).unwrap_or_else(|_| {
                    out.count(Counter::ProtocolErrors as usize);
                    LOST_ANSWER
                });
                self.prod_prepare_answer(answer, out);
            }
            Some(_) => {}
        }
    }

    fn lose_prod_answer(&mut self, out: &mut TransformOutput<'_>) {
        out.count(Counter::ProdAnswersLost as usize);
        self.prod_prepare_answer(LOST_ANSWER, out);
    }

    /// Production's replies cannot be framed until the client's next command arms a resync.
    fn unsync_prod(&mut self) {
        if self.prod_phase != ProdPhase::Failed {
            self.prod_phase = ProdPhase::Unsynced;
        }
    }

    fn lose_all_prod(&mut self, out: &mut TransformOutput<'_>) {
        self.prod_replies.reset();
        if let Some(g) = &mut self.gates {
            // The reply being read will not end where it can be seen either.
            if let Some(serial) = g.replying.take() {
                g.replied(serial, ReplyStatus::Err);
            }
        }
        while let Some((kind, serial, _)) = self.prod_fifo.pop_front() {
            self.lose_prod_reply(kind, serial, out);
        }
    }

    /// Production's reply to command `serial` will not be seen.
    fn lose_prod_reply(&mut self, kind: ReplyKind, serial: u64, out: &mut TransformOutput<'_>) {
        if kind == ReplyKind::Prepare {
            self.lose_prod_answer(out);
        }
        if let Some(g) = &mut self.gates {
            // What the command ran in cannot be told any more: a write waiting for this reply
            // is dropped (a tail sent unproven fails on test), and what follows waits for a
            // reply of its own.
            g.replied(serial, ReplyStatus::Err);
        }
        if let Some(t) = &mut self.types {
            t.prod_lost(serial);
        }
        if let Some(o) = &mut self.observer {
            o.prod_lost(serial);
        }
    }

    /// A client command production will answer (seen as it arrives), numbered `serial`.
    fn prod_expects(&mut self, kind: ReplyKind, serial: u64, out: &mut TransformOutput<'_>) {
        if self.prod_fifo.len() >= MAX_IN_FLIGHT {
            // Production's replies are not being seen: start over from the next command.
            self.lose_all_prod(out);
            self.prod_phase = ProdPhase::Unsynced;
        }
        self.prod_fifo.push_back((kind, serial, 1));
        match self.prod_phase {
            // The client only sends commands once logged in; its OK may not have been read.
            ProdPhase::Greeting | ProdPhase::Auth => {
                self.prod_phase = ProdPhase::Commands;
                // The rest of the auth exchange, if any, ends before the reply (id 1).
                self.prod_replies.skip_to_next_reply();
            }
            ProdPhase::Unsynced => self.prod_phase = ProdPhase::Armed,
            _ => {}
        }
    }

    /// Production's answer to the oldest prepare it had not answered. Its partner in the map
    /// is the oldest prepare forwarded without one, which the forwarding reader may not have
    /// reached yet (commands held while the test server logs in).
    fn prod_prepare_answer(&mut self, answer: PrepareAnswer, out: &mut TransformOutput<'_>) {
        match self.unanswered_prepares.pop_front() {
            Some(fate) => self.prepare_answered(fate, answer, out),
            None if self.prod_answers.len() >= MAX_IN_FLIGHT => self.lose_tracking(out),
            None => self.prod_answers.push_back(answer),
        }
    }

    /// A client's COM_STMT_PREPARE was forwarded (and given to the map if tracked) or skipped.
    fn prepare_passed(&mut self, fate: Fate, out: &mut TransformOutput<'_>) {
        match self.prod_answers.pop_front() {
            Some(answer) => self.prepare_answered(fate, answer, out),
            None if self.unanswered_prepares.len() >= MAX_IN_FLIGHT => self.lose_tracking(out),
            None => self.unanswered_prepares.push_back(fate),
        }
    }

    /// Production's answer paired with the prepare it answers.
    fn prepare_answered(
        &mut self,
        fate: Fate,
        answer: PrepareAnswer,
        out: &mut TransformOutput<'_>,
    ) {
        match (fate, answer) {
            (Fate::Tracked, _) => {
                let r = self
                    .map
                    .get_or_insert_with(|| new_map(&self.shared))
                    .prod_answer(answer);
                self.resolved(r, out);
            }
            (Fate::Skipped, PrepareAnswer::Ok { statement_id }) => {
                self.skip_statement(statement_id, out)
            }
            (Fate::Lost, PrepareAnswer::Ok { statement_id }) => {
                self.skip_statement(statement_id, out);
                if let Some(k) = &mut self.skipped {
                    if k.statements.contains(&statement_id) {
                        k.lost.insert(statement_id);
                    }
                }
            }
            (Fate::Skipped | Fate::Lost, PrepareAnswer::Err { .. }) | (Fate::Untracked, _) => {}
        }
    }

    /// Production's statement `prod_id` was not prepared on the test server (`--read-only`).
    fn skip_statement(&mut self, prod_id: u32, out: &mut TransformOutput<'_>) {
        if self.skipped.as_ref().map_or(0, |k| k.statements.len())
            >= self.shared.config.max_statements
        {
            // Its executes then find no statement and are dropped as unknown ones.
            out.count(Counter::StatementsOverLimit as usize);
            return;
        }
        self.skipped
            .get_or_insert_with(Box::default)
            .statements
            .insert(prod_id);
    }

    fn lose_tracking(&mut self, out: &mut TransformOutput<'_>) {
        if !self.tracking_lost {
            out.count(Counter::StatementTrackingLost as usize);
        }
        self.tracking_lost = true;
        self.prod_answers.clear();
        self.unanswered_prepares.clear();
    }

    fn resolved(&mut self, r: Resolution, out: &mut TransformOutput<'_>) {
        match r {
            Resolution::Waiting
            | Resolution::BothRejected
            | Resolution::Discarded
            | Resolution::TestAnswerLost => {}
            Resolution::Mapped { prod_id, .. } => {
                // A reused id names the new statement.
                if let Some(k) = &mut self.skipped {
                    k.statements.remove(&prod_id);
                }
                // Prepared by the client itself between the pickup and production's lookup:
                // its own prepare is the one to use.
                if let Some(d) = &mut self.deferred {
                    d.remove(prod_id);
                }
                out.count(Counter::StatementsMapped as usize)
            }
            Resolution::TestRejected { .. } => {
                out.count(Counter::StatementsRejectedOnTest as usize)
            }
            Resolution::Orphaned { test_id } => {
                // No client command will name it; the test server would keep it until the
                // session ends (and count it against max_prepared_stmt_count).
                out.count(Counter::StatementsOrphanedClosed as usize);
                if let Some(t) = &mut self.types {
                    t.closed(test_id);
                }
                self.close_on_test(test_id, out);
            }
            Resolution::Dropped { test_id, .. } => {
                out.count(Counter::StatementsOverLimit as usize);
                if let Some(t) = test_id {
                    if let Some(types) = &mut self.types {
                        types.closed(t);
                    }
                    self.close_on_test(t, out);
                }
            }
            Resolution::Unexpected => out.count(Counter::StatementTrackingLost as usize),
        }
    }

    // ------------------------------------------------------------------ the client's stream

    /// Notes the commands production will answer, as they arrive, and numbers them.
    fn arrive(&mut self, data: &[u8], out: &mut TransformOutput<'_>) {
        let mut pkts = SCRATCH.with(|s| mem::take(&mut s.borrow_mut().arrived));
        pkts.clear();
        let skip_login = &mut self.arrival_skip_login;
        let in_command = &mut self.arrival_in_command;
        let serial = &mut self.arrival_serial;
        let mut observer = self.observer.as_deref_mut();
        let mut changes = self
            .pickup
            .as_deref_mut()
            .filter(|p| !self.recovered || p.variables.is_some());
        self.arrival.feed(data, |p| {
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
                if is_schema_change(p.prefix) && c.schema_changes.len() < ANSWERS_KEPT {
                    c.schema_changes.push(n);
                }
                if writes_user_variable(p.prefix) && c.variable_writes.len() < ANSWERS_KEPT {
                    c.variable_writes.push(n);
                }
            }
            if let Some(o) = observer.as_deref_mut() {
                let end = p.header.payload_offset() + u64::from(p.header.len);
                o.arrived(n, p.prefix, end);
            }
            *in_command = true;
            pkts.push(Arrived::Command(code, n));
        });
        if let Some(o) = &mut self.observer {
            o.arrival_progress(self.arrival.position(), self.captured);
        }
        for &a in &pkts {
            match a {
                Arrived::Command(code, n) => self.prod_expects(ReplyKind::of_command(code), n, out),
                Arrived::Continued(seq) => {
                    if let Some(owed) = self.prod_fifo.back_mut() {
                        owed.2 = first_reply_id(seq);
                    }
                }
            }
        }
        pkts.clear();
        if pkts.capacity() > 1024 {
            pkts = Vec::new();
        }
        SCRATCH.with(|s| s.borrow_mut().arrived = pkts);
    }

    fn hold(&mut self, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.dead || data.is_empty() {
            return;
        }
        if self.backlog.len() + self.head.len() + data.len() > self.shared.config.max_held_bytes {
            self.give_up(abandon(Counter::HeldOverflow, "held_overflow"), out);
            return;
        }
        self.backlog.extend_from_slice(data);
    }

    /// Carries on after whatever held the current packet may have changed.
    fn resume(&mut self, out: &mut TransformOutput<'_>) {
        if self.dead || !self.blocked {
            return;
        }
        if self.behind_counted && self.test_fifo.len() > RESUME_BEHIND {
            return;
        }
        self.blocked = false;
        let mut backlog = mem::take(&mut self.backlog);
        let n = self.run(&backlog, out);
        if self.dead {
            return;
        }
        backlog.drain(..n.min(backlog.len()));
        if backlog.is_empty() && backlog.capacity() > KEEP_CAPACITY {
            backlog = Vec::new();
        }
        self.backlog = backlog;
    }

    /// Total bytes of the current packet's head to collect before its verdict.
    fn head_needed(&self) -> usize {
        let Some(h) = PacketHeader::parse(&self.head) else {
            return HEADER_LEN;
        };
        let want = if self.stage == ClientStage::Login {
            MAX_HEAD
        } else if h.seq != 0 {
            0
        } else {
            match self.head.get(HEADER_LEN) {
                None => 1,
                Some(&com::CHANGE_USER) => MAX_HEAD,
                Some(&(com::QUERY | com::STMT_PREPARE)) if self.shared.config.read_only => {
                    1 + MAX_SQL_HEAD.min(self.shared.config.max_held_bytes)
                }
                Some(&com::STMT_PREPARE) => 1 + SQL_KEPT,
                // Whether it names a user variable (`variables_first`), or writes inside a
                // transaction begun before the pickup or cut by a gap (`transaction_first`).
                Some(&com::QUERY) if self.variables_pending() || self.gated() => 1 + SQL_KEPT,
                Some(&com::STMT_EXECUTE) => self.execute_head(),
                Some(&c) if command::carries_statement_id(c) => 5,
                Some(_) => 1,
            }
        };
        HEADER_LEN + (h.len as usize).min(want)
    }

    /// Payload bytes of a COM_STMT_EXECUTE to collect: its statement id, then what the
    /// parameter types of its statement need seen (see `param_types.rs`).
    fn execute_head(&self) -> usize {
        const ID: usize = 5;
        let payload = &self.head[HEADER_LEN..];
        let (Some(types), Some(map)) = (self.types.as_deref(), self.map.as_deref()) else {
            return ID;
        };
        match command::statement_id(payload).map(|id| map.lookup(id)) {
            Some(Ok(test_id)) => types.wanted(test_id, payload).clamp(ID, MAX_HEAD),
            _ => ID,
        }
    }

    /// Forwards `data` as far as verdicts allow; returns the bytes consumed (fewer only when a
    /// packet is held).
    fn run(&mut self, data: &[u8], out: &mut TransformOutput<'_>) -> usize {
        let mut rest = data;
        while !self.dead {
            match self.fwd {
                Fwd::Head => {
                    let need = self.head_needed();
                    if self.head.len() < need {
                        if rest.is_empty() {
                            break;
                        }
                        let n = (need - self.head.len()).min(rest.len());
                        self.head.extend_from_slice(&rest[..n]);
                        rest = &rest[n..];
                        continue;
                    }
                    let Some(h) = PacketHeader::parse(&self.head) else {
                        break;
                    };
                    let taken = (self.head.len() - HEADER_LEN) as u32;
                    // Judged before the verdict, which may end the login stage.
                    let client_command = self.stage == ClientStage::Commands
                        && h.seq == 0
                        && self.head.get(HEADER_LEN).is_none_or(|&c| expects_reply(c));
                    // A login or COM_CHANGE_USER is the one big head a session collects: its
                    // room is given back after it, so an idle session does not keep it.
                    let auth_head = self.stage == ClientStage::Login
                        || (h.seq == 0 && self.head.get(HEADER_LEN) == Some(&com::CHANGE_USER));
                    self.dropped_by_design = false;
                    self.dropped_refused = None;
                    match self.decide(h, out) {
                        Ok(Verdict::Block) => {
                            self.blocked = true;
                            break;
                        }
                        Ok(v) => {
                            self.fwd_owed = client_command
                                && v == Verdict::Forward
                                && self
                                    .test_fifo
                                    .back()
                                    .is_some_and(|b| b.1 == Some(self.fwd_serial));
                            if client_command {
                                self.client_command_decided(v == Verdict::Forward);
                            }
                            self.release_head(h.len, taken, v == Verdict::Forward, out);
                            if auth_head {
                                self.head = Vec::new();
                            }
                        }
                        Err(a) => self.give_up(a, out),
                    }
                }
                Fwd::Body {
                    left,
                    more,
                    forward,
                } => {
                    if rest.is_empty() {
                        break;
                    }
                    let n = (left as usize).min(rest.len());
                    if forward {
                        out.push(&rest[..n]);
                    }
                    rest = &rest[n..];
                    self.fwd = body(left - n as u32, more, forward);
                }
                Fwd::ContHeader {
                    mut hdr,
                    have,
                    forward,
                } => {
                    if rest.is_empty() {
                        break;
                    }
                    let have = usize::from(have);
                    let n = (HEADER_LEN - have).min(rest.len());
                    hdr[have..have + n].copy_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    if have + n < HEADER_LEN {
                        self.fwd = Fwd::ContHeader {
                            hdr,
                            have: (have + n) as u8,
                            forward,
                        };
                        continue;
                    }
                    if forward {
                        out.push(&hdr);
                    }
                    let parsed = PacketHeader::parse(&hdr);
                    if let (true, Some(h), Some(owed)) =
                        (forward && self.fwd_owed, parsed, self.test_fifo.back_mut())
                    {
                        owed.2 = first_reply_id(h.seq);
                    }
                    let len = parsed.map_or(0, |h| h.len);
                    self.fwd = body(len, len as usize == MAX_PAYLOAD_LEN, forward);
                }
            }
        }
        if self.dead {
            data.len()
        } else {
            data.len() - rest.len()
        }
    }

    /// The forwarding reader decided the client command numbered `fwd_serial`.
    fn client_command_decided(&mut self, forwarded: bool) {
        let serial = self.fwd_serial;
        self.fwd_serial += 1;
        let by_design = mem::take(&mut self.dropped_by_design);
        let refused = self.dropped_refused.take();
        if let Some(o) = &mut self.observer {
            let d = match (forwarded, by_design, refused) {
                (true, _, _) if self.test_phase == TestPhase::Blind => Decision::SentBlind,
                (true, _, _) => Decision::Sent,
                (false, true, _) => Decision::Skipped,
                (false, false, Some(code)) => Decision::Refused(code),
                (false, false, None) => Decision::Dropped,
            };
            o.decided(serial, d, self.now);
        }
    }

    /// Sends (or not) the decided head and moves on to the rest of its packet.
    fn release_head(&mut self, len: u32, taken: u32, forward: bool, out: &mut TransformOutput<'_>) {
        if forward {
            out.push(&self.head);
        }
        self.head.clear();
        if self.head.capacity() > KEEP_CAPACITY {
            self.head = Vec::new();
        }
        self.held_counted = false;
        self.behind_counted = false;
        self.held_deadline = None;
        self.fwd = body(
            len.saturating_sub(taken),
            len as usize == MAX_PAYLOAD_LEN,
            forward,
        );
    }

    /// The verdict on the packet whose head is collected.
    fn decide(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        if !self.first_checked {
            self.first_checked = true;
            if !plausible_command(&self.head) {
                return Err(abandon(Counter::PickupUnframed, "pickup_unframed"));
            }
        }
        if self.stage == ClientStage::Login {
            return self.take_login(h, out);
        }
        if h.seq != 0 {
            if self.swallow_client_auth {
                out.count(Counter::ClientAuthPacketsSwallowed as usize);
                return Ok(Verdict::Drop);
            }
            if self.skip_data {
                return Ok(Verdict::Drop);
            }
            // LOCAL INFILE contents: they follow their command as they are.
            return Ok(if self.test_ready() {
                Verdict::Forward
            } else {
                Verdict::Block
            });
        }
        self.swallow_client_auth = false;
        self.skip_data = false;
        if !self.test_ready() {
            return Ok(Verdict::Block);
        }
        if self.test_fifo.len() >= MAX_IN_FLIGHT && !self.test_blind() {
            // Backpressure, not a verdict on the server: it is answering, only later than
            // production. Each of its replies resumes the backlog one command further.
            if !self.behind_counted {
                self.behind_counted = true;
                out.count(Counter::TestBehindHolds as usize);
            }
            return Ok(Verdict::Block);
        }
        if let Some(v) = self.variables_first(out) {
            return Ok(v);
        }
        if let Some(v) = self.transaction_first(out) {
            return Ok(v);
        }
        self.probe_before_command(out);
        self.flush_injections(out)?;
        self.command(h, out)
    }

    fn take_login(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        let payload = &self.head[HEADER_LEN..];
        if h.seq != 1 || payload.len() < h.len as usize {
            return Err(protocol("login_unreadable"));
        }
        let login = ClientLogin::parse(payload).map_err(|_| protocol("login_unreadable"))?;
        match login.not_mirrorable() {
            Some(NotMirrorable::Tls) => return Err(abandon(Counter::NotMirrorableTls, "tls")),
            Some(NotMirrorable::Compression) => {
                return Err(abandon(Counter::NotMirrorableCompression, "compression"))
            }
            None => {}
        }
        if !matches!(login, ClientLogin::Response(_)) {
            return Err(protocol("login_unreadable"));
        }
        self.login = Some(payload.to_vec());
        self.stage = ClientStage::Commands;
        self.swallow_client_auth = true;
        self.try_login(out)?;
        Ok(Verdict::Drop)
    }

    /// A command (sequence id 0) while the test server is ready for one.
    fn command(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        let Some(&code) = self.head.get(HEADER_LEN) else {
            // An empty packet: the servers answer it with an error.
            out.count(Counter::ProtocolErrors as usize);
            self.expect_client(TestExpect::Reply(ReplyKind::Generic))?;
            return Ok(Verdict::Forward);
        };
        if self.shared.config.read_only {
            if let Some(kind) = self.read_only_skip(code, h) {
                out.count(read_only_counter(kind) as usize);
                self.dropped_by_design = true;
                self.skip_data = true;
                if code == com::STMT_PREPARE {
                    self.last_prepare_skipped = true;
                    self.prepare_passed(Fate::Skipped, out);
                }
                return Ok(Verdict::Drop);
            }
        }
        match code {
            com::STMT_PREPARE => {
                let tracked = !self.test_blind() && !self.tracking_lost;
                if tracked {
                    self.map
                        .get_or_insert_with(|| new_map(&self.shared))
                        .prepare_sent(&self.head[HEADER_LEN + 1..]);
                }
                self.last_prepare_skipped = false;
                self.last_prepare_lost = false;
                self.prepare_passed(
                    if tracked {
                        Fate::Tracked
                    } else {
                        Fate::Untracked
                    },
                    out,
                );
                self.expect_client(if tracked {
                    TestExpect::Prepare { recovered: false }
                } else {
                    TestExpect::Reply(ReplyKind::Prepare)
                })?;
            }
            c if command::carries_statement_id(c) => return self.statement_command(c, h, out),
            com::CHANGE_USER => return self.change_user(h, out),
            com::RESET_CONNECTION => {
                if let Some(m) = &mut self.map {
                    m.reset_all();
                }
                if let Some(t) = &mut self.types {
                    t.reset();
                }
                self.forget_skipped();
                self.forget_deferred();
                self.stmts_predate_us = false;
                self.stmts_in_gap = false;
                out.count(Counter::ResetConnection as usize);
                self.expect_client(TestExpect::Reply(ReplyKind::Generic))?;
            }
            c => {
                if expects_reply(c) {
                    self.expect_client(TestExpect::Reply(ReplyKind::of_command(Some(c))))?;
                }
            }
        }
        out.count(Counter::CommandsForwarded as usize);
        Ok(Verdict::Forward)
    }

    /// COM_STMT_EXECUTE, SEND_LONG_DATA, CLOSE, RESET, FETCH, BULK_EXECUTE: production's
    /// statement id becomes the test server's.
    fn statement_command(
        &mut self,
        code: u8,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        let Some(prod_id) = command::statement_id(&self.head[HEADER_LEN..]) else {
            // Too short to hold an id: the servers reject it alike.
            out.count(Counter::ProtocolErrors as usize);
            if expects_reply(code) {
                self.expect_client(TestExpect::Reply(ReplyKind::of_command(Some(code))))?;
            }
            out.count(Counter::CommandsForwarded as usize);
            return Ok(Verdict::Forward);
        };
        let lost = self
            .skipped
            .as_ref()
            .is_some_and(|k| k.lost.contains(&prod_id))
            || (prod_id == LAST_PREPARED && self.last_prepare_lost);
        if lost {
            if code == com::STMT_CLOSE {
                // A close runs nothing: it only ends what the test server never had.
                self.dropped_by_design = true;
                if let Some(k) = &mut self.skipped {
                    k.statements.remove(&prod_id);
                    k.lost.remove(&prod_id);
                }
            } else {
                out.count(Counter::CommandsDroppedBeforeStateRead as usize);
            }
            return Ok(Verdict::Drop);
        }
        if self.shared.config.read_only
            && (self
                .skipped
                .as_ref()
                .is_some_and(|k| k.statements.contains(&prod_id))
                || (prod_id == LAST_PREPARED && self.last_prepare_skipped))
        {
            self.dropped_by_design = true;
            match code {
                com::STMT_EXECUTE | com::STMT_BULK_EXECUTE => {
                    out.count(Counter::ReadOnlySkippedStmtExecute as usize)
                }
                com::STMT_CLOSE if prod_id != LAST_PREPARED => {
                    if let Some(k) = &mut self.skipped {
                        k.statements.remove(&prod_id);
                    }
                }
                _ => {}
            }
            return Ok(Verdict::Drop);
        }
        if self.tracking_lost {
            return Ok(self.drop_statement_command(code, UnmappedReason::Desynchronized, out));
        }
        if code == com::STMT_RESET && self.deferred.as_ref().is_some_and(|d| d.holds(prod_id)) {
            // Nothing of it exists on the test server to reset, and preparing it now would
            // prepare it in the schema current now: a pool's reset and close at the end of a
            // use often come after the code moved on (mysql-connector-python: prepare in one
            // schema, `USE` another, then reset and close the cursor; a test-only 1146). It
            // stays deferred for an execute; the reset is not lost work.
            self.dropped_by_design = true;
            out.count(Counter::StmtResetsOfStatementsBeforePickup as usize);
            return Ok(Verdict::Drop);
        }
        if let Some(sql) = self.deferred.as_mut().and_then(|d| d.remove(prod_id)) {
            if code == com::STMT_CLOSE {
                out.count(Counter::RecoveredClosedUnused as usize);
                self.dropped_by_design = true;
                return Ok(Verdict::Drop);
            }
            self.prepare_recovered(prod_id, &sql, out)?;
        }
        let found = if code == com::STMT_CLOSE {
            self.map
                .get_or_insert_with(|| new_map(&self.shared))
                .close(prod_id)
        } else {
            self.map
                .get_or_insert_with(|| new_map(&self.shared))
                .lookup(prod_id)
        };
        match found {
            Ok(test_id) => {
                if code == com::STMT_CLOSE {
                    if let Some(t) = &mut self.types {
                        t.closed(test_id);
                    }
                }
                if code == com::STMT_EXECUTE {
                    if let Some(v) = self.execute_types(prod_id, test_id, h, out) {
                        return Ok(v);
                    }
                }
                if test_id != prod_id
                    && command::set_statement_id(&mut self.head[HEADER_LEN..], test_id).is_err()
                {
                    return Err(protocol("statement_id_unwritable"));
                }
                if expects_reply(code) {
                    self.expect_client(TestExpect::Reply(ReplyKind::of_command(Some(code))))?;
                }
                out.count(Counter::CommandsForwarded as usize);
                Ok(Verdict::Forward)
            }
            Err(u) if u.reason == UnmappedReason::AwaitingTest && !self.test_blind() => {
                if !self.held_counted {
                    self.held_counted = true;
                    out.count(Counter::CommandsHeldAwaitingPrepare as usize);
                }
                if self.held_deadline.is_none() {
                    self.held_deadline = Some(self.now + HELD_TIMEOUT);
                }
                Ok(Verdict::Block)
            }
            Err(u) => Ok(self.drop_statement_command(code, u.reason, out)),
        }
    }

    /// Gives the test server the parameter types it lacks for `test_id` (`param_types.rs`),
    /// rewriting the collected head; `Some(Drop)` when this execute cannot carry them.
    fn execute_types(
        &mut self,
        prod_id: u32,
        test_id: u32,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Option<Verdict> {
        let types = self.types.as_deref_mut()?;
        let payload = &self.head[HEADER_LEN..];
        let ex = Execute {
            test_id,
            payload,
            complete: payload.len() == h.len as usize && (h.len as usize) < MAX_PAYLOAD_LEN,
            sql: self.map.as_deref().and_then(|m| m.sql(prod_id)),
            serial: self.fwd_serial,
            verify: self.test_phase != TestPhase::Blind,
        };
        let d = types.execute(&ex, &self.shared.learnt);
        if d.corrected {
            out.count(Counter::ParamTypesCorrected as usize);
        }
        match d.exec {
            Exec::AsIs => None,
            Exec::Typed { payload, learnt } => {
                out.count(if learnt {
                    Counter::ParamTypesLearnt
                } else {
                    Counter::ParamTypesGuessed
                } as usize);
                // Like a rewritten COM_CHANGE_USER: the whole packet is in `head`, which goes
                // out instead, longer by the types; our stream simply carries more bytes.
                let mut framed = Vec::with_capacity(HEADER_LEN + payload.len());
                write_packet(h.seq, &payload, &mut framed);
                self.head = framed;
                None
            }
            Exec::Undecodable => {
                out.count(Counter::ExecutesDroppedUndecodable as usize);
                Some(Verdict::Drop)
            }
        }
    }

    fn drop_statement_command(
        &mut self,
        code: u8,
        reason: UnmappedReason,
        out: &mut TransformOutput<'_>,
    ) -> Verdict {
        if let UnmappedReason::TestRejected { code } = reason {
            self.dropped_refused = Some(code);
        }
        let in_stretch = reason == UnmappedReason::Unknown && self.variables_pending();
        // A reset or close runs nothing: of a statement known to no one, the execute is the
        // loss, counted once.
        let runs_nothing = matches!(code, com::STMT_CLOSE | com::STMT_RESET);
        let counter = if in_stretch && !runs_nothing {
            // Production ran it before reading the connection's state, and closed its
            // statement before that read too: the statement is known to no one.
            Counter::CommandsDroppedBeforeStateRead
        } else if !matches!(code, com::STMT_EXECUTE | com::STMT_BULK_EXECUTE) {
            if code == com::STMT_CLOSE && reason == UnmappedReason::Unknown && self.stmts_predate_us
            {
                // Prepared before the pickup, closed before production's lookup listed it:
                // the test server never had it, and a close runs nothing.
                self.dropped_by_design = true;
                Counter::RecoveredClosedUnused
            } else if code == com::STMT_RESET
                && reason == UnmappedReason::Unknown
                && (self.stmts_predate_us || in_stretch)
            {
                // mysql-connector-python resets before every execute: the execute after it
                // is counted, the reset is not lost work.
                self.dropped_by_design = true;
                Counter::StmtResetsOfStatementsBeforePickup
            } else if let UnmappedReason::TestRejected { .. } = reason {
                // A close, reset or fetch of a statement that does not exist on the test
                // server: nothing it could have run is lost beyond its refused prepare and
                // executes, which are counted as such.
                Counter::StmtCommandsOfRejectedStatement
            } else {
                Counter::StmtCommandsDropped
            }
        } else {
            match reason {
                UnmappedReason::Unknown if self.stmts_predate_us => {
                    Counter::ExecutesDroppedPreparedBeforePickup
                }
                UnmappedReason::Unknown if self.stmts_in_gap => {
                    Counter::ExecutesDroppedPreparedInCaptureGap
                }
                UnmappedReason::Unknown => Counter::ExecutesDroppedUnknownStatement,
                UnmappedReason::TestRejected { .. } => Counter::ExecutesDroppedRejected,
                UnmappedReason::AwaitingTest
                | UnmappedReason::LimitReached
                | UnmappedReason::Desynchronized
                | UnmappedReason::TestAnswerLost => Counter::ExecutesDroppedUntracked,
            }
        };
        out.count(counter as usize);
        Verdict::Drop
    }

    /// COM_CHANGE_USER with its auth response recomputed for the test server; the test
    /// server's answer is followed like the login's, and the client's own auth continuation
    /// swallowed.
    fn change_user(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        if self.test_blind() {
            return Err(abandon(Counter::ChangeUser, "change_user_without_framing"));
        }
        let server = self
            .test_server
            .ok_or(protocol("change_user_before_login"))?;
        let payload = &self.head[HEADER_LEN..];
        if payload.len() < h.len as usize {
            return Err(protocol("change_user_too_long"));
        }
        let cu = ChangeUser::parse(payload, self.client_caps)
            .map_err(|_| protocol("change_user_unreadable"))?;
        let password = self.credentials(cu.user, out)?;
        let caps = self.session_caps;
        let plugin_auth = caps.contains(Capabilities::PLUGIN_AUTH);
        let plugin = if plugin_auth {
            cu.auth_plugin
                .and_then(|p| AuthPlugin::from_name(p).ok())
                .unwrap_or(server.plugin)
        } else {
            AuthPlugin::MysqlNativePassword
        };
        let nonce = self.session_nonce.unwrap_or(server.nonce);
        let rewritten = match &password {
            Some(password) => {
                let scramble = plugin.scramble(password.as_bytes(), &nonce);
                let rewritten = ChangeUser {
                    auth_response: scramble.as_bytes(),
                    auth_plugin: (plugin_auth && cu.charset.is_some()).then_some(plugin.name()),
                    attributes: cu
                        .attributes
                        .filter(|_| caps.contains(Capabilities::CONNECT_ATTRS)),
                    ..cu
                };
                let mut payload = Vec::with_capacity(h.len as usize + 40);
                rewritten
                    .write(caps, &mut payload)
                    .map_err(|_| protocol("change_user_unencodable"))?;
                let mut framed = Vec::with_capacity(payload.len() + HEADER_LEN);
                write_packet(0, &payload, &mut framed);
                Some(framed)
            }
            None => None,
        };
        self.expect_client(TestExpect::ChangeUser(Box::new(AuthExchange {
            password,
            plugin,
            nonce,
            awaiting_key: false,
            change_user: true,
        })))?;
        if let Some(framed) = rewritten {
            self.head = framed;
        }
        if let Some(m) = &mut self.map {
            m.reset_all();
        }
        if let Some(t) = &mut self.types {
            t.reset();
        }
        self.forget_skipped();
        self.forget_deferred();
        self.stmts_predate_us = false;
        self.stmts_in_gap = false;
        self.change_user_in_flight = true;
        self.swallow_client_auth = true;
        out.count(Counter::ChangeUser as usize);
        out.count(Counter::CommandsForwarded as usize);
        Ok(Verdict::Forward)
    }

    // ------------------------------------------------------------------ --read-only

    /// The kind of write the command whose head is collected carries, if it must not reach the
    /// test server. Statement commands are judged by their statement ([`Self::statement_command`]).
    fn read_only_skip(&mut self, code: u8, h: PacketHeader) -> Option<WriteKind> {
        match code {
            com::QUERY | com::STMT_PREPARE => {
                let head = mem::take(&mut self.head);
                let sql = head.get(HEADER_LEN + 1..).unwrap_or(&[]);
                let seen = head.len().saturating_sub(HEADER_LEN);
                let complete = seen == h.len as usize && (h.len as usize) < MAX_PAYLOAD_LEN;
                let kind = self.read_only_write_named(sql, complete, code == com::QUERY);
                self.head = head;
                kind
            }
            com::QUIT
            | com::INIT_DB
            | com::FIELD_LIST
            | com::STATISTICS
            | com::PING
            | com::CHANGE_USER
            | com::SET_OPTION
            | com::RESET_CONNECTION => None,
            c if command::carries_statement_id(c) => None,
            // COM_PROCESS_INFO: the process list.
            0x0a => None,
            // COM_CREATE_DB, COM_DROP_DB
            0x05 | 0x06 => Some(WriteKind::Ddl),
            // COM_REFRESH, COM_SHUTDOWN, COM_PROCESS_KILL (another connection's id on the test
            // server), COM_DEBUG, COM_BINLOG_DUMP, COM_REGISTER_SLAVE, COM_BINLOG_DUMP_GTID
            0x07 | 0x08 | com::PROCESS_KILL | 0x0d | com::BINLOG_DUMP | 0x15 | 0x1e => {
                Some(WriteKind::Admin)
            }
            // COM_MULTI and anything unknown: their content is not judged.
            _ => Some(WriteKind::Other),
        }
    }

    /// The kind of write a recovered statement's (whole) SQL text carries, if any.
    fn read_only_write(&self, sql: &[u8]) -> Option<WriteKind> {
        if !self.shared.config.read_only {
            return None;
        }
        let rules = Rules {
            allow_calls: self.shared.config.allow_calls,
            ..Rules::default()
        };
        verdict(classify::classify_with(sql, &rules).effect, true)
    }

    /// The kind of write `sql` carries, if any; a COM_QUERY's (`query`) SQL-level PREPAREs and
    /// DEALLOCATEs update the record of names that were not sent.
    fn read_only_write_named(
        &mut self,
        sql: &[u8],
        complete: bool,
        query: bool,
    ) -> Option<WriteKind> {
        let names = self.skipped.as_deref().map(|k| &k.names);
        let skipped = |n: &[u8]| names.and_then(|m| m.get(n).copied());
        let rules = Rules {
            allow_calls: self.shared.config.allow_calls,
            skipped: &skipped,
        };
        let c = classify::classify_with(sql, &rules);
        let kind = verdict(c.effect, complete);
        if query {
            for u in c.names {
                match u {
                    NameUse::Prepare { name, effect } => match (kind, effect) {
                        (None, _) => {
                            if let Some(k) = &mut self.skipped {
                                k.names.remove(&name[..]);
                            }
                        }
                        (Some(k), e) => {
                            let k = match e {
                                Effect::Write(w) => w,
                                Effect::Read => k,
                            };
                            let max = self.shared.config.max_statements;
                            let names = &mut self.skipped.get_or_insert_with(Box::default).names;
                            if names.len() < max {
                                names.insert(name.into_boxed_slice(), k);
                            }
                        }
                    },
                    NameUse::Deallocate { name } => {
                        if let Some(k) = &mut self.skipped {
                            k.names.remove(&name[..]);
                        }
                    }
                }
            }
        }
        kind
    }

    /// COM_RESET_CONNECTION and COM_CHANGE_USER drop production's statements: the recovered
    /// ones not prepared yet are gone with them.
    fn forget_deferred(&mut self) {
        self.deferred = None;
    }

    /// COM_RESET_CONNECTION and COM_CHANGE_USER drop every statement on both servers.
    fn forget_skipped(&mut self) {
        self.skipped = None;
        self.last_prepare_skipped = false;
        self.last_prepare_lost = false;
        for f in &mut self.unanswered_prepares {
            if matches!(*f, Fate::Skipped | Fate::Lost) {
                *f = Fate::Untracked;
            }
        }
    }

    fn give_up(&mut self, a: Abandon, out: &mut TransformOutput<'_>) {
        if self.dead {
            return;
        }
        out.count(a.counter as usize);
        out.abandon(a.why);
        self.dead = true;
        // Passwords and held bytes go now, not when the engine drops the session.
        self.test_auth = None;
        self.test_fifo.clear();
        self.login = None;
        self.head = Vec::new();
        self.backlog = Vec::new();
        self.inject.clear();
        self.inject_bytes = 0;
        self.types = None;
        self.blocked = false;
        self.held_deadline = None;
        if let Some(o) = &mut self.observer {
            o.flush();
        }
    }
}

/// Production's reply reader; with `--compare-results` it hashes every payload.
/// Production's reply stream read packet by packet, its rows passed over: a result set's rows
/// are most of the stream and nothing of them is read but "not 0xFE, not 0xFF" (the structure
/// in [`ReplyTracker`]), so a row the tracker expects, with the next id, is counted into a run
/// from its first byte, without a summary (issue 20: walking each row was a third of the
/// copier's user time). The run goes to the report before the next packet that is read.
struct ProdSink<'t, 'o, 'a> {
    t: &'t mut MysqlTransform,
    out: &'o mut TransformOutput<'a>,
    /// Rows passed over since the last packet read, and their payload bytes.
    rows: u64,
    bytes: u64,
}

impl ProdSink<'_, '_, '_> {
    fn flush(&mut self) {
        if self.rows > 0 {
            if let Some(o) = &mut self.t.observer {
                o.prod_folded(self.rows, self.bytes);
            }
            self.rows = 0;
            self.bytes = 0;
        }
    }
}

impl ScanSink for ProdSink<'_, '_, '_> {
    fn skim(&mut self, seq: u8, len: u32, head: &[u8]) -> bool {
        let t = &mut *self.t;
        let row = head.first().is_some_and(|&b| b != 0xfe && b != 0xff);
        if !row
            || t.prod_phase != ProdPhase::Commands
            || t.prod_prev_seq.map(|p| p.wrapping_add(1)) != Some(seq)
            || !t.prod_replies.expects_rows()
        {
            return false;
        }
        t.prod_prev_seq = Some(seq);
        t.prod_replies.row_passed();
        self.rows += 1;
        self.bytes += u64::from(len);
        true
    }

    fn packet(&mut self, p: ScannedPacket<'_>) {
        self.flush();
        self.t.prod_packet(&ProdPacket::new(&p), self.out);
    }
}

fn prod_scanner(hashes: bool) -> FrameScanner {
    if hashes {
        FrameScanner::with_hashes(PROD_PREFIX)
    } else {
        FrameScanner::new(PROD_PREFIX)
    }
}

fn body(left: u32, more: bool, forward: bool) -> Fwd {
    match (left, more) {
        (0, false) => Fwd::Head,
        (0, true) => Fwd::ContHeader {
            hdr: [0; HEADER_LEN],
            have: 0,
            forward,
        },
        _ => Fwd::Body {
            left,
            more,
            forward,
        },
    }
}

/// `--read-only`'s verdict on a classified text: the kind of write, if it is not to be sent. A
/// text seen only in part is a write unless its seen part already is one.
fn verdict(effect: Effect, complete: bool) -> Option<WriteKind> {
    match effect {
        Effect::Write(k) => Some(k),
        Effect::Read if complete => None,
        Effect::Read => Some(WriteKind::Other),
    }
}

fn count_seen(seen: Seen, out: &mut TransformOutput<'_>) {
    if seen.mismatch {
        out.count(Counter::ReplySeqMismatches as usize);
    }
    if seen.lost {
        out.count(Counter::ReplyStructureLost as usize);
    }
}

fn push_packet(seq: u8, payload: &[u8], out: &mut TransformOutput<'_>) {
    let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
    write_packet(seq, payload, &mut bytes);
    out.push(&bytes);
}

fn init_db(db: &[u8]) -> Injection {
    let mut payload = Vec::with_capacity(1 + db.len());
    payload.push(com::INIT_DB);
    payload.extend_from_slice(db);
    let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
    write_packet(0, &payload, &mut bytes);
    Injection {
        bytes,
        expect: Some(TestExpect::InitDb),
        register: None,
    }
}

impl StreamTransform for MysqlTransform {
    fn on_client_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.dead {
            return;
        }
        self.now = now;
        self.captured = out.captured_at().unwrap_or(now);
        self.arrive(data, out);
        if self.blocked {
            self.hold(data, out);
        } else {
            let n = self.run(data, out);
            self.hold(&data[n.min(data.len())..], out);
        }
        self.resume(out);
    }

    fn on_pickup(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead || !self.picked_up {
            return;
        }
        if let Some(wait) = self.shared.config.recovery_wait {
            if let Some(p) = &mut self.pickup {
                p.recovery_deadline = Some(now + wait);
            }
        } else if self.pickup.as_ref().is_none_or(|p| p.user.is_none()) {
            self.give_up(
                abandon(Counter::PickupNoDefaultUser, "pickup_no_default_user"),
                out,
            );
        }
    }

    fn wants_prod_data(&self) -> bool {
        true
    }

    /// Commands lost whole cost nothing else: the test server has every command before them
    /// and gets every command after. That holds only while both client readers stand between
    /// two packets (the forwarding one lags the arrival one by whole packets held in
    /// `backlog`, so the arrival reader tells for both) and the login is over; a command cut
    /// in two cannot be completed, and its start may be on the test server already.
    fn on_client_gap(&mut self, _now: Instant, out: &mut TransformOutput<'_>) -> bool {
        if self.dead {
            return false;
        }
        if self.stage != ClientStage::Commands
            || !self.arrival.at_boundary()
            || self.change_user_in_flight
        {
            out.count(Counter::CaptureGapsInsideCommand as usize);
            return false;
        }
        self.arrival_in_command = false;
        // Production answered the lost commands too, in bytes no reply can be paired with: its
        // replies are framed again from the next command on, as after a pickup.
        self.lose_all_prod(out);
        self.unsync_prod();
        self.stmts_in_gap = true;
        // The gap may hold a transaction's start, or writes of one the test server saw
        // begin: the writes after it wait for a boundary production proves. (`--read-only`
        // keeps every write off anyway.)
        if !self.shared.config.read_only {
            let at = self.arrival_serial;
            match &mut self.gates {
                Some(g) => g.gap(at),
                None => self.gates = Some(Box::new(Gates::new(Cause::CaptureGap, at))),
            }
        }
        true
    }

    fn starts_command(&self, head: &[u8]) -> bool {
        self.stage == ClientStage::Commands && plausible_command(head)
    }

    /// Production's replies have a hole: the replies owed are lost to the comparison (and a
    /// prepare's answer to the statement map), and framing starts again at the next command.
    /// Nothing changes for the test server.
    fn on_prod_gap(&mut self, _now: Instant, out: &mut TransformOutput<'_>) -> bool {
        if self.dead {
            return false;
        }
        self.lose_all_prod(out);
        self.unsync_prod();
        if self.gates.is_some() {
            // A write held for one of the lost replies is decided now.
            self.resume(out);
        }
        true
    }

    fn on_prod_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.dead {
            return;
        }
        self.now = now;
        self.captured = out.captured_at().unwrap_or(now);
        match self.prod_phase {
            ProdPhase::Unsynced | ProdPhase::Failed => return,
            ProdPhase::Armed => {
                // Replies to earlier commands ended before this command was sent (clients
                // wait for them), so these bytes start a packet.
                let compare = self.observer.as_ref().is_some_and(|o| o.compare_results());
                self.prod_scanner = prod_scanner(compare);
                self.prod_prev_seq = None;
                self.prod_phase = ProdPhase::Resyncing;
            }
            _ => {}
        }
        // The scanner is lent out for the call so that each packet is read with the state the
        // packets before it left: whether the next ones are rows to pass over depends on it.
        let mut scanner = mem::replace(&mut self.prod_scanner, FrameScanner::new(0));
        let mut sink = ProdSink {
            t: self,
            out,
            rows: 0,
            bytes: 0,
        };
        scanner.feed_skimming(data, &mut sink);
        sink.flush();
        self.prod_scanner = scanner;
    }

    /// intercept's MySQL summaries of the test server's replies. Segments are the engine's
    /// TCP business: everything MySQL needs is in the summaries.
    fn on_test_event(&mut self, now: Instant, ev: &TestEvent<'_>, out: &mut TransformOutput<'_>) {
        match ev {
            TestEvent::Mysql(MysqlEvent::Packet { packet, .. }) => {
                let received = out.captured_at().unwrap_or(now);
                self.test_packet_at(now, received, packet, out)
            }
            TestEvent::Mysql(MysqlEvent::Rows { rows, .. }) => {
                let received = out.captured_at().unwrap_or(now);
                self.test_rows_at(now, received, rows, out)
            }
            TestEvent::Mysql(MysqlEvent::FramingLost { at_seq, .. }) => {
                self.on_test_framing_lost(now, *at_seq, out)
            }
            TestEvent::Mysql(MysqlEvent::FramingResumed { .. }) => {
                self.on_test_framing_resumed(now, out)
            }
            TestEvent::App(any) => {
                if let Some(state) = any.downcast_ref::<RecoveredState>() {
                    self.recover(now, state.clone(), out);
                } else if any.is::<NotRecovered>() {
                    self.recovery_unavailable(out);
                }
            }
            _ => {}
        }
    }

    fn pending(&self) -> bool {
        !self.dead && (self.login.is_some() || self.blocked)
    }

    fn buffered_len(&self) -> usize {
        self.head.len()
            + self.backlog.len()
            + self.login.as_ref().map_or(0, Vec::len)
            + self.inject_bytes
    }

    /// Our size and everything we allocated that grows with the session: held commands, the
    /// statement map, the queues of expected replies, the report's observer. Capacities, since
    /// that is what the allocator gave out; an estimate where exact is O(n).
    fn memory_len(&self) -> usize {
        use std::mem::size_of;
        SMALL_ALLOCATIONS
            + size_of::<Self>()
            + self.head.capacity()
            + self.backlog.capacity()
            + self.login.as_ref().map_or(0, Vec::capacity)
            + self.inject_bytes
            + self.inject.capacity() * size_of::<Injection>()
            + self.deferred.as_ref().map_or(0, |d| d.memory_len())
            + self.test_fifo.capacity() * size_of::<(TestExpect, Option<u64>, u8)>()
            + self.prod_fifo.capacity() * size_of::<(ReplyKind, u64, u8)>()
            + self.prod_answers.capacity() * size_of::<PrepareAnswer>()
            + self.unanswered_prepares.capacity() * size_of::<Fate>()
            + self.skipped.as_ref().map_or(0, |k| {
                size_of::<Skipped>()
                    + k.statements.capacity() * (size_of::<u32>() + 1)
                    + k.names.len() * (size_of::<(Box<[u8]>, WriteKind)>() + 64)
            })
            + self
                .map
                .as_ref()
                .map_or(0, |m| size_of::<StatementMap>() + m.memory_len())
            + self.types.as_ref().map_or(0, |t| t.memory_len())
            + self.observer.as_ref().map_or(0, |o| o.memory_len())
    }

    fn next_deadline(&self) -> Option<Instant> {
        // The engine asks several times per packet (issue 20's profile: 3% of the copier's
        // CPU as an iterator over an array of options): plain minimums, and the picked-up
        // session's two only when there is one.
        fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, None) => a,
                (None, b) => b,
            }
        }
        if self.dead {
            return None;
        }
        let mut at = earlier(self.held_deadline, self.resync_until);
        if let Some(p) = self.pickup.as_deref() {
            at = earlier(at, earlier(p.recovery_deadline, p.variables_deadline));
        }
        if let Some(g) = self.gates.as_deref() {
            at = earlier(at, g.deadline());
        }
        at
    }

    fn on_timeout(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead {
            return;
        }
        self.now = now;
        if self.resync_until.is_some_and(|d| now >= d) {
            // The probe's answer never came (intercept missed it, or the test server is
            // further behind than we wait): blind for the rest of this loss.
            self.lose_framing(out);
            self.resume(out);
            if self.dead {
                return;
            }
        }
        if self.held_deadline.is_some_and(|d| now >= d) {
            // The PREPARE_OK was most likely dropped by intercept: nothing more will come (the
            // test server gets no new command), so stop following its replies.
            self.held_deadline = None;
            out.count(Counter::HeldTimeouts as usize);
            self.lose_framing(out);
            self.resume(out);
            if self.dead {
                return;
            }
        }
        if let Some(p) = self
            .pickup
            .as_deref_mut()
            .filter(|p| p.variables_deadline.is_some_and(|d| now >= d))
        {
            p.variables_deadline = None;
            p.variables_expired = true;
            self.resume(out);
            if self.dead {
                return;
            }
        }
        if self
            .gates
            .as_deref()
            .and_then(Gates::deadline)
            .is_some_and(|d| now >= d)
        {
            // The held command goes unproven (`transaction_first` counts it).
            self.resume(out);
            if self.dead {
                return;
            }
        }
        match self.recovery_deadline() {
            Some(d) if now >= d => {}
            _ => return,
        }
        self.stop_waiting_for_recovery();
        out.count(Counter::RecoveryTimeouts as usize);
        if let Err(a) = self.try_login(out) {
            self.give_up(a, out);
        }
        self.resume(out);
    }
}
