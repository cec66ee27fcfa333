//! Capture gaps gone past (`StreamTransform::on_client_gap` / `on_prod_gap`): the commands in
//! the gap are missing on the test server, every other command reaches it with its statement
//! ids translated, and production's replies are paired with their commands again from the next
//! command on.

use super::*;

fn logged_in() -> Harness {
    let mut h = Harness::new(MysqlConfig::default(), false);
    h.login(&hex(CAPI_RESPONSE));
    h
}

fn payloads(h: &mut Harness) -> Vec<Vec<u8>> {
    h.received().into_iter().map(|g| g.1).collect()
}

fn client_gap(h: &mut Harness) -> bool {
    h.call(|t, now, out| t.on_client_gap(now, out))
}

#[test]
fn the_session_goes_on_after_commands_lost_whole() {
    let mut h = logged_in();
    h.client_packet(0, &prepare("SELECT c FROM t WHERE id=?"));
    h.prod_reply(&prepare_reply(1, 1));
    h.test_reply(&prepare_reply(11, 1));
    h.client_packet(0, &execute(1));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.test_reply(&result_set(1, 1, false, 0));
    assert_eq!(
        payloads(&mut h),
        vec![prepare("SELECT c FROM t WHERE id=?"), execute(11)]
    );

    // Lost by the capture: an execute of statement 1, and the prepare of statement 2.
    assert!(client_gap(&mut h));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.prod_reply(&prepare_reply(2, 0));
    // Not a command start: the engine asks before it gives the transform anything.
    assert!(!h.t.starts_command(b"ROM t WHERE"));
    assert!(h.t.starts_command(&framed(0, &query("SELECT 2"))));

    h.client_packet(0, &query("SELECT 2"));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.test_reply(&result_set(1, 1, false, 0));
    h.client_packet(0, &execute(1));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.test_reply(&result_set(1, 1, false, 0));
    h.client_packet(0, &execute(2));
    h.prod_reply(&result_set(1, 1, false, 0));
    assert_eq!(
        payloads(&mut h),
        vec![query("SELECT 2"), execute(11)],
        "statement 1 is still known; statement 2 was prepared in the gap"
    );
    assert_eq!(h.count(Counter::ExecutesDroppedPreparedInCaptureGap), 1);
    assert_eq!(h.count(Counter::ProdResyncs), 1);

    // New statements are paired with production's answers as before the gap.
    h.client_packet(0, &prepare("SELECT 3"));
    h.prod_reply(&prepare_reply(3, 0));
    h.client_packet(0, &execute(3));
    h.test_reply(&prepare_reply(13, 0));
    assert_eq!(payloads(&mut h), vec![prepare("SELECT 3"), execute(13)]);
    assert_eq!(h.abandoned, None);
    assert_eq!(h.count(Counter::CaptureGapsInsideCommand), 0);
}

#[test]
fn commands_held_for_the_test_server_still_go_out_after_a_gap() {
    let mut h = logged_in();
    h.client_packet(0, &prepare("SELECT ?"));
    h.prod_reply(&prepare_reply(1, 1));
    // The execute waits for the test server's PREPARE_OK; the gap comes meanwhile.
    h.client_packet(0, &execute(1));
    assert!(client_gap(&mut h));
    h.client_packet(0, &query("SELECT 2"));
    h.test_reply(&prepare_reply(11, 1));
    assert_eq!(
        payloads(&mut h),
        vec![prepare("SELECT ?"), execute(11), query("SELECT 2")]
    );
    assert_eq!(h.abandoned, None);
}

#[test]
fn a_gap_cutting_a_command_or_the_login_cannot_be_gone_past() {
    let mut h = logged_in();
    let q = framed(0, &query("SELECT a long statement"));
    h.client(&q[..10]);
    assert!(!client_gap(&mut h));
    assert_eq!(h.count(Counter::CaptureGapsInsideCommand), 1);

    let mut h = Harness::new(MysqlConfig::default(), false);
    h.prod_packet(0, &hex(SB_GREETING));
    assert!(!client_gap(&mut h), "the login is not over");
    assert!(!h.t.starts_command(&framed(0, &query("SELECT 1"))));
}

#[test]
fn a_hole_in_productions_replies_costs_only_their_pairing() {
    let mut h = logged_in();
    h.client_packet(0, &prepare("SELECT ?"));
    // Production's PREPARE_OK is in the hole.
    assert!(h.call(|t, now, out| t.on_prod_gap(now, out)));
    h.test_reply(&prepare_reply(11, 1));
    h.client_packet(0, &execute(1));
    h.client_packet(0, &query("SELECT 2"));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.test_reply(&result_set(1, 1, false, 0));
    assert_eq!(
        payloads(&mut h),
        vec![prepare("SELECT ?"), close(11), query("SELECT 2")],
        "production's id is unknown: the statement is closed on test, its executes dropped"
    );
    assert_eq!(h.count(Counter::ProdAnswersLost), 1);
    assert_eq!(h.abandoned, None);
}

#[test]
fn the_tail_of_a_transaction_a_gap_cut_is_not_written() {
    use common::mysql::handshake::status::{AUTOCOMMIT, IN_TRANS};
    let mut h = logged_in();
    h.client_packet(0, &query("BEGIN"));
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    h.test_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    h.client_packet(0, &query("UPDATE t SET k=k+1 WHERE id=7"));
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    h.test_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    assert_eq!(payloads(&mut h).len(), 2, "before the gap nothing waits");

    // The gap lost the DELETE of id 7: its INSERT would fail on the test server (1062).
    assert!(client_gap(&mut h));
    h.client_packet(0, &query("INSERT INTO t VALUES (7, 1)"));
    assert!(
        h.t.pending(),
        "a write after a gap waits for production's proof"
    );
    assert!(h.t.next_deadline().is_some(), "and that wait is bounded");
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    assert!(payloads(&mut h).is_empty(), "still inside: the tail");
    // Its reads and its COMMIT go; after the COMMIT writes go at once, the gate gone.
    h.client_packet(0, &query("SELECT c FROM t WHERE id=3"));
    h.prod_reply(&result_set(1, 1, false, IN_TRANS));
    h.client_packet(0, &query("COMMIT"));
    h.prod_packet(1, &ok(AUTOCOMMIT));
    h.client_packet(0, &query("DELETE FROM t WHERE id=9"));
    assert!(!h.t.pending());
    assert_eq!(
        payloads(&mut h),
        vec![
            query("SELECT c FROM t WHERE id=3"),
            query("COMMIT"),
            query("DELETE FROM t WHERE id=9"),
        ]
    );
    assert_eq!(h.count(Counter::CommandsDroppedInTransactionCutByGap), 1);
    assert_eq!(
        h.count(Counter::CommandsDroppedBeforeTransactionBoundary),
        0
    );
    assert_eq!(h.count(Counter::TransactionBoundaryUnproven), 0);
    assert_eq!(h.abandoned, None);
}

#[test]
fn an_autocommit_write_after_a_gap_goes_once_production_answers_it() {
    use common::mysql::handshake::status::AUTOCOMMIT;
    let mut h = logged_in();
    assert!(client_gap(&mut h));
    h.client_packet(0, &query("INSERT INTO t VALUES (1)"));
    assert!(h.t.pending());
    h.prod_packet(1, &ok(AUTOCOMMIT));
    assert_eq!(payloads(&mut h), vec![query("INSERT INTO t VALUES (1)")]);
    assert_eq!(h.count(Counter::CommandsDroppedInTransactionCutByGap), 0);

    // Under --read-only every write is kept off anyway: a gap gates nothing.
    let mut h = Harness::new(
        MysqlConfig {
            read_only: true,
            ..MysqlConfig::default()
        },
        false,
    );
    h.login(&hex(CAPI_RESPONSE));
    assert!(client_gap(&mut h));
    h.client_packet(0, &query("INSERT INTO t VALUES (1)"));
    assert!(!h.t.pending(), "kept off by design, at once");
    assert_eq!(h.count(Counter::ReadOnlySkippedInsert), 1);
    assert_eq!(h.count(Counter::CommandsDroppedInTransactionCutByGap), 0);
}

#[test]
fn commands_held_from_before_a_gap_are_not_gated_by_it() {
    use common::mysql::handshake::status::{AUTOCOMMIT, IN_TRANS};
    let mut h = logged_in();
    h.client_packet(0, &prepare("UPDATE t SET k=? WHERE id=1"));
    h.prod_reply(&prepare_reply(1, 1));
    // The write waits for the test server's PREPARE_OK; the gap comes meanwhile, and a write
    // after it.
    h.client_packet(0, &execute(1));
    assert!(client_gap(&mut h));
    h.client_packet(0, &query("INSERT INTO t VALUES (2)"));
    h.test_reply(&prepare_reply(11, 1));
    assert_eq!(
        payloads(&mut h),
        vec![prepare("UPDATE t SET k=? WHERE id=1"), execute(11)],
        "the execute before the gap goes; the write after it waits"
    );
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    h.test_packet(1, &ok(AUTOCOMMIT));
    assert!(payloads(&mut h).is_empty());
    assert_eq!(h.count(Counter::CommandsDroppedInTransactionCutByGap), 1);
    assert_eq!(h.abandoned, None);
}

#[test]
fn a_write_whose_reply_production_lost_after_a_gap_is_not_sent_unproven() {
    let mut h = logged_in();
    assert!(client_gap(&mut h));
    h.client_packet(0, &query("INSERT INTO t VALUES (7, 1)"));
    assert!(h.t.pending());
    // Production's reply to it is in a hole of its own: what it ran in is unknowable, and a
    // tail sent unproven fails on test (1062), so it is dropped at once, not after the wait.
    assert!(h.call(|t, now, out| t.on_prod_gap(now, out)));
    assert!(!h.t.pending());
    assert!(payloads(&mut h).is_empty());
    assert_eq!(h.count(Counter::CommandsDroppedInTransactionCutByGap), 1);
    assert_eq!(h.count(Counter::TransactionBoundaryUnproven), 0);
    assert_eq!(h.abandoned, None);
}
