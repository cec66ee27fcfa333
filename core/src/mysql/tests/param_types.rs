//! Parameter types the test server was never given: a picked-up connection's statements are
//! prepared again there, and the client's executes (sent without types: libmariadb sends them
//! with a statement's first execute only) reach it with types learnt or guessed.

use common::mysql::params::field_type::{LONG, LONGLONG, VAR_STRING};

use super::*;

const BY_ID: &str = "SELECT c FROM sbtest1 WHERE id=?";

fn recovering() -> MysqlConfig {
    MysqlConfig {
        recovery_wait: Some(Duration::from_millis(200)),
        ..pickup_config()
    }
}

fn factory(config: MysqlConfig) -> MysqlFactory {
    let creds = Arc::new(Credentials::parse(CREDENTIALS).unwrap());
    MysqlFactory::new(config, creds, test_random())
}

/// COM_STMT_EXECUTE of `id` with `bitmap`, `types` (none: the new-params-bound flag is 0) and
/// `values`.
fn exec(id: u32, bitmap: &[u8], types: Option<&[u8]>, values: &[u8]) -> Vec<u8> {
    let mut p = execute(id);
    p.extend_from_slice(bitmap);
    p.push(u8::from(types.is_some()));
    p.extend_from_slice(types.unwrap_or(&[]));
    p.extend_from_slice(values);
    p
}

fn err(code: u16) -> Vec<u8> {
    let mut e = Vec::new();
    ErrPacket {
        code,
        sql_state: Some(*b"HY000"),
        message: b"Incorrect arguments to mysqld_stmt_execute",
    }
    .write(&mut e);
    e
}

fn payloads(h: &mut Harness) -> Vec<Vec<u8>> {
    h.received().into_iter().map(|g| g.1).collect()
}

fn one_row() -> Vec<(u8, Vec<u8>)> {
    result_set(1, 1, false, 0)
}

/// A connection picked up with one command on its way (`first`, which production answers at
/// once), whose state production gives: `statements` (production's id, SQL). Returns the
/// session once the test server has answered our login, with the re-prepares sent (not yet
/// answered) and `first` held for them.
fn picked_up(factory: &MysqlFactory, statements: &[(u32, &str)], first: &[u8]) -> Harness {
    let mut h = Harness::with_factory(factory, true);
    h.test_packet(0, &test_greeting(NATIVE));
    // Sent in pieces: the head is collected across them.
    for piece in framed(0, first).chunks(3) {
        h.client(piece);
    }
    h.prod_reply(&one_row());
    let state = RecoveredState {
        user: "sb".into(),
        db: Some("sbtest".into()),
        statements: statements
            .iter()
            .map(|(id, sql)| (*id, sql.as_bytes().to_vec()))
            .collect(),
        ..Default::default()
    };
    h.call(|t, now, out| t.recover(now, state, out));
    assert_eq!(h.received().len(), 1, "our login");
    h.test_packet(2, OK);
    // Only the statement `first` names is prepared, at its use.
    let named = first
        .get(1..5)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let prepares: Vec<_> = statements
        .iter()
        .filter(|(id, _)| Some(*id) == named)
        .map(|(_, sql)| prepare(sql))
        .collect();
    assert_eq!(payloads(&mut h), prepares);
    h
}

#[test]
fn a_picked_up_statements_untyped_execute_reaches_the_test_server_typed() {
    let f = factory(recovering());
    let values = 51u64.to_le_bytes();
    let mut h = picked_up(&f, &[(5, BY_ID)], &exec(5, &[0], None, &values));
    assert!(h.received().is_empty(), "held for the re-prepare's answer");
    // The test server prepares it as its statement 1, of one parameter.
    h.test_reply(&prepare_reply(1, 1));
    assert_eq!(
        payloads(&mut h),
        vec![exec(1, &[0], Some(&[LONGLONG, 0]), &values)],
        "flag set, types inserted, 2 bytes longer; the id translated"
    );
    assert_eq!(h.count(Counter::ParamTypesGuessed), 1);
    h.test_reply(&one_row());

    // The test server has types now: later executes pass as they are.
    let values = 77u64.to_le_bytes();
    h.client_packet(0, &exec(5, &[0], None, &values));
    assert_eq!(payloads(&mut h), vec![exec(1, &[0], None, &values)]);
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    assert_eq!(h.count(Counter::ParamTypesGuessed), 1);
    assert_eq!(h.count(Counter::ParamTypesCorrected), 0);
    assert_eq!(h.count(Counter::ExecutesDroppedUndecodable), 0);
    assert_eq!(h.count(Counter::RepliesUnmatched), 0);
    assert_eq!(h.count(Counter::ReplyStructureLost), 0);
    assert_eq!(h.abandoned, None);
}

#[test]
fn types_a_client_sent_on_another_session_are_used_first() {
    let f = factory(recovering());
    // A session the copier saw from its login prepares the statement and executes it typed.
    let mut a = Harness::with_factory(&f, false);
    a.login(&hex(CAPI_RESPONSE));
    a.client_packet(0, &prepare(BY_ID));
    a.prod_reply(&prepare_reply(3, 1));
    a.test_reply(&prepare_reply(30, 1));
    // A LONG whose bytes also read as the 3-character string "abc", which a guess prefers.
    let typed = exec(3, &[0], Some(&[LONG, 0]), b"\x03abc");
    a.client_packet(0, &typed);
    assert_eq!(
        payloads(&mut a),
        vec![prepare(BY_ID), exec(30, &[0], Some(&[LONG, 0]), b"\x03abc")]
    );
    assert_eq!(
        a.count(Counter::ParamTypesLearnt),
        0,
        "nothing to rewrite there"
    );

    // A pooled connection with the same statement, picked up: the types come from session a.
    let mut b = picked_up(&f, &[(8, BY_ID)], &exec(8, &[0], None, b"\x03bcd"));
    b.test_reply(&prepare_reply(2, 1));
    assert_eq!(
        payloads(&mut b),
        vec![exec(2, &[0], Some(&[LONG, 0]), b"\x03bcd")]
    );
    assert_eq!(b.count(Counter::ParamTypesLearnt), 1);
    assert_eq!(b.count(Counter::ParamTypesGuessed), 0);
    b.test_reply(&one_row());
    b.client_packet(0, &exec(8, &[0], None, b"\x03cde"));
    assert_eq!(payloads(&mut b), vec![exec(2, &[0], None, b"\x03cde")]);
    assert_eq!(b.count(Counter::ParamTypesLearnt), 1);
}

#[test]
fn guesses_for_integers_and_for_a_mix_with_a_string() {
    let f = factory(recovering());
    let between = "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ?";
    let mixed = "SELECT c FROM sbtest1 WHERE id=? AND c=?";
    let mut longs = 5000u32.to_le_bytes().to_vec();
    longs.extend_from_slice(&5099u32.to_le_bytes());
    let mut h = picked_up(
        &f,
        &[(1, between), (2, mixed)],
        &exec(1, &[0], None, &longs),
    );
    h.test_reply(&prepare_reply(11, 2));
    assert_eq!(
        payloads(&mut h),
        vec![exec(11, &[0], Some(&[LONG, 0, LONG, 0]), &longs)]
    );
    h.test_reply(&one_row());

    // id = 42, c = '83868-70364' (sysbench's c values are digits and dashes). The second
    // statement is prepared at its first use.
    let mut mix = 42u32.to_le_bytes().to_vec();
    mix.push(11);
    mix.extend_from_slice(b"83868-70364");
    h.client_packet(0, &exec(2, &[0], None, &mix));
    assert_eq!(payloads(&mut h), vec![prepare(mixed)]);
    h.test_reply(&prepare_reply(12, 2));
    assert_eq!(
        payloads(&mut h),
        vec![exec(12, &[0], Some(&[LONG, 0, VAR_STRING, 0]), &mix)]
    );
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    // c NULL this time: no bytes for it, and the types the test server has still read the rest.
    h.client_packet(0, &exec(2, &[0b10], None, &42u32.to_le_bytes()));
    assert_eq!(
        payloads(&mut h),
        vec![exec(12, &[0b10], None, &42u32.to_le_bytes())]
    );
    assert_eq!(h.count(Counter::ParamTypesGuessed), 2);
    assert_eq!(h.count(Counter::ParamTypesCorrected), 0);
}

#[test]
fn a_guess_the_test_server_refuses_where_production_ran_is_corrected() {
    let f = factory(recovering());
    // A LONG (1,667,391,747) whose bytes read first as the string "abc".
    let mut h = picked_up(&f, &[(5, BY_ID)], &exec(5, &[0], None, b"\x03abc"));
    h.test_reply(&prepare_reply(1, 1));
    assert_eq!(
        payloads(&mut h),
        vec![exec(1, &[0], Some(&[VAR_STRING, 0]), b"\x03abc")]
    );
    // Production ran it (its reply came first); the test server refuses.
    h.test_packet(1, &err(1210));
    assert_eq!(h.count(Counter::ParamTypesCorrected), 1);

    // The next execute carries the next candidate, though the client sent no types.
    h.client_packet(0, &exec(5, &[0], None, b"\x03bcd"));
    assert_eq!(
        payloads(&mut h),
        vec![exec(1, &[0], Some(&[LONG, 0]), b"\x03bcd")]
    );
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    h.client_packet(0, &exec(5, &[0], None, b"\x03cde"));
    assert_eq!(payloads(&mut h), vec![exec(1, &[0], None, b"\x03cde")]);
    assert_eq!(h.count(Counter::ParamTypesGuessed), 2);
    assert_eq!(h.count(Counter::ParamTypesCorrected), 1);

    // Refused on both sides: nothing to say about the types.
    h.prod_packet(1, &err(1062));
    h.test_packet(1, &err(1062));
    // Refused on the test server only, for its data: neither.
    h.client_packet(0, &exec(5, &[0], None, b"\x03cde"));
    h.prod_reply(&one_row());
    h.test_packet(1, &err(1062));
    assert_eq!(h.count(Counter::ParamTypesCorrected), 1);
    assert_eq!(h.count(Counter::RepliesUnmatched), 0);
    assert_eq!(h.abandoned, None);
}

#[test]
fn a_later_execute_the_guess_cannot_read_corrects_it_before_it_is_sent() {
    let f = factory(recovering());
    let mut h = picked_up(&f, &[(5, BY_ID)], &exec(5, &[0], None, &7u32.to_le_bytes()));
    h.test_reply(&prepare_reply(1, 1));
    assert_eq!(
        payloads(&mut h),
        vec![exec(1, &[0], Some(&[LONG, 0]), &7u32.to_le_bytes())]
    );
    h.test_reply(&one_row());
    // Five bytes: it was a string all along.
    h.client_packet(0, &exec(5, &[0], None, b"\x04abcd"));
    assert_eq!(
        payloads(&mut h),
        vec![exec(1, &[0], Some(&[VAR_STRING, 0]), b"\x04abcd")]
    );
    assert_eq!(h.count(Counter::ParamTypesCorrected), 1);
    assert_eq!(h.count(Counter::ParamTypesGuessed), 2);
}

#[test]
fn an_execute_that_cannot_be_typed_is_counted_and_not_sent() {
    let f = factory(recovering());
    let two = "SELECT c FROM sbtest1 WHERE id=? AND k=?";
    // Two parameters, neither NULL, in one byte: no types read that.
    let mut h = picked_up(&f, &[(5, two), (6, BY_ID)], &exec(5, &[0], None, &[1]));
    h.test_reply(&prepare_reply(1, 2));
    assert!(h.received().is_empty());
    assert_eq!(h.count(Counter::ExecutesDroppedUndecodable), 1);

    // Too long to hold whole (the transform looks at 64 KiB at most), so too long to rewrite.
    let mut big = vec![0xfd];
    big.extend_from_slice(&70_000u32.to_le_bytes()[..3]);
    big.resize(4 + 70_000, b'x');
    h.client_packet(0, &exec(6, &[0], None, &big));
    h.prod_reply(&one_row());
    assert_eq!(payloads(&mut h), vec![prepare(BY_ID)]);
    h.test_reply(&prepare_reply(2, 1));
    assert!(h.received().is_empty());
    assert_eq!(h.count(Counter::ExecutesDroppedUndecodable), 2);

    // The session goes on, each server's replies still matched with its commands.
    h.client_packet(0, &query("SELECT 1"));
    assert_eq!(payloads(&mut h), vec![query("SELECT 1")]);
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    assert_eq!(h.count(Counter::RepliesUnmatched), 0);
    assert!(crate::mysql::is_protocol_loss(
        super::super::COUNTER_NAMES[Counter::ExecutesDroppedUndecodable as usize]
    ));
    assert_eq!(h.abandoned, None);
}

#[test]
fn statements_prepared_while_the_copier_watched_are_left_as_they_are() {
    // The sysbench stream: its first execute of each statement carries the types.
    let stream = split_stream(&hex(SB_CLIENT_STREAM));
    let mut h = Harness::new(MysqlConfig::default(), false);
    h.login(payload_of(&stream[0]));
    for (i, p) in stream[1..8].iter().enumerate() {
        h.client(p);
        let params = [1, 0, 0, 2, 2, 2, 2][i];
        h.prod_reply(&prepare_reply(1 + i as u32, params));
        h.test_reply(&prepare_reply(101 + i as u32, params));
    }
    h.received();
    for p in &stream[8..12] {
        h.client(p);
        let got = payloads(&mut h);
        assert_eq!(got.len(), 1);
        assert_eq!(
            &got[0][5..],
            &payload_of(p)[5..],
            "byte for byte but the id"
        );
        h.prod_packet(1, OK);
        h.test_packet(1, OK);
    }
    for c in [
        Counter::ParamTypesLearnt,
        Counter::ParamTypesGuessed,
        Counter::ParamTypesCorrected,
        Counter::ExecutesDroppedUndecodable,
    ] {
        assert_eq!(h.count(c), 0, "{c:?}");
    }
}

#[test]
fn a_statement_first_executed_by_the_last_prepared_id_is_left_as_it_is() {
    // MariaDB's direct execution: the prepare and a typed execute naming "the statement
    // prepared last" go out together; later executes name the statement and carry no types.
    let mut h = Harness::new(recovering(), false);
    h.login(&hex(CAPI_RESPONSE));
    let values = 51u64.to_le_bytes();
    h.client_packet(0, &prepare(BY_ID));
    h.client_packet(0, &exec(u32::MAX, &[0], Some(&[LONGLONG, 0]), &values));
    h.prod_reply(&prepare_reply(4, 1));
    h.prod_reply(&one_row());
    h.test_reply(&prepare_reply(40, 1));
    h.test_reply(&one_row());
    h.client_packet(0, &exec(4, &[0], None, &values));
    assert_eq!(
        payloads(&mut h),
        vec![
            prepare(BY_ID),
            exec(u32::MAX, &[0], Some(&[LONGLONG, 0]), &values),
            exec(40, &[0], None, &values),
        ]
    );
    assert_eq!(h.count(Counter::ParamTypesGuessed), 0);
    assert_eq!(h.count(Counter::ExecutesDroppedUndecodable), 0);
}

#[test]
fn after_a_reset_the_clients_own_prepare_and_typed_execute_pass_as_they_are() {
    let f = factory(recovering());
    let values = 51u64.to_le_bytes();
    let mut h = picked_up(&f, &[(5, BY_ID)], &exec(5, &[0], None, &values));
    h.test_reply(&prepare_reply(1, 1));
    h.received();
    h.test_reply(&one_row());
    // COM_RESET_CONNECTION drops the statement on both servers; the client prepares it again
    // and executes it typed, as a client does after a reset.
    h.client_packet(0, &[com::RESET_CONNECTION]);
    h.prod_packet(1, OK);
    h.test_packet(1, OK);
    h.client_packet(0, &prepare(BY_ID));
    h.prod_reply(&prepare_reply(6, 1));
    h.test_reply(&prepare_reply(2, 1));
    h.client_packet(0, &exec(6, &[0], Some(&[LONGLONG, 0]), &values));
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    h.client_packet(0, &exec(6, &[0], None, &values));
    assert_eq!(
        payloads(&mut h),
        vec![
            vec![com::RESET_CONNECTION],
            prepare(BY_ID),
            exec(2, &[0], Some(&[LONGLONG, 0]), &values),
            exec(2, &[0], None, &values),
        ]
    );
    assert_eq!(h.count(Counter::ParamTypesGuessed), 1);
}
