//! A picked-up connection's writes start at a transaction boundary production's replies prove
//! (`txn_gate.rs`): the tail of a transaction begun before the pickup is not sent, its reads
//! and its COMMIT are, and every command after the boundary goes as usual.

use super::*;
use common::mysql::handshake::status::{AUTOCOMMIT, IN_TRANS};

/// A picked-up session logged in on the test server, production's stream unframed so far.
fn picked_up() -> Harness {
    let mut h = Harness::new(pickup_config(), true);
    // Production's stream starts in the middle of a result set: not framable.
    h.prod(&[0x37, 0x00, 0x00, 0x05, 0x01, 0x02]);
    h.test_packet(0, &test_greeting(NATIVE));
    h.test_packet(2, OK);
    let got = h.received();
    assert_eq!(got.len(), 1, "our login only");
    h
}

fn payloads(h: &mut Harness) -> Vec<Vec<u8>> {
    h.received().into_iter().map(|g| g.1).collect()
}

#[test]
fn the_tail_of_a_transaction_begun_before_the_pickup_is_not_written() {
    let mut h = picked_up();
    // sysbench's DELETE then INSERT of one id, production inside a transaction begun before.
    h.client_packet(0, &query("DELETE FROM sbtest1 WHERE id=7"));
    assert!(h.t.pending(), "a write waits for production's proof");
    assert!(h.t.next_deadline().is_some(), "and that wait is bounded");
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    assert!(
        payloads(&mut h).is_empty(),
        "inside a transaction after it: its tail"
    );
    // Known to be inside now: the next write is dropped at once.
    h.client_packet(0, &query("INSERT INTO sbtest1 VALUES (7, 1, 'c', 'p')"));
    assert!(!h.t.pending());
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    // A read of the tail goes: it changes nothing on the test server.
    h.client_packet(0, &query("SELECT c FROM sbtest1 WHERE id=3"));
    h.prod_reply(&result_set(1, 1, false, IN_TRANS));
    // The COMMIT ends it; what follows is the test server's from its start.
    h.client_packet(0, &query("COMMIT"));
    h.prod_packet(1, &ok(AUTOCOMMIT));
    h.client_packet(0, &query("UPDATE sbtest1 SET k=k+1 WHERE id=9"));
    assert!(
        !h.t.pending(),
        "outside a transaction: the boundary is proven"
    );
    assert_eq!(
        payloads(&mut h),
        vec![
            query("SELECT c FROM sbtest1 WHERE id=3"),
            query("COMMIT"),
            query("UPDATE sbtest1 SET k=k+1 WHERE id=9"),
        ]
    );
    assert_eq!(
        h.count(Counter::CommandsDroppedBeforeTransactionBoundary),
        2
    );
    assert_eq!(h.count(Counter::TransactionBoundaryUnproven), 0);
    // The gate is gone: a write inside the next transaction is sent without waiting.
    h.prod_packet(1, &ok(AUTOCOMMIT));
    h.client_packet(0, &query("BEGIN"));
    h.client_packet(0, &query("DELETE FROM sbtest1 WHERE id=8"));
    assert_eq!(payloads(&mut h).len(), 2);
    assert_eq!(h.abandoned, None);
}

#[test]
fn an_autocommit_write_and_a_begin_are_boundaries() {
    let mut h = picked_up();
    h.client_packet(0, &query("INSERT INTO t VALUES (1)"));
    h.prod_packet(1, &ok(AUTOCOMMIT));
    assert_eq!(payloads(&mut h), vec![query("INSERT INTO t VALUES (1)")]);

    let mut h = picked_up();
    h.client_packet(0, &query("begin"));
    h.client_packet(0, &query("DELETE FROM t WHERE id=1"));
    assert!(
        !h.t.pending(),
        "a BEGIN seen opens the transaction on both servers"
    );
    assert_eq!(payloads(&mut h).len(), 2);
    assert_eq!(
        h.count(Counter::CommandsDroppedBeforeTransactionBoundary),
        0
    );
}

#[test]
fn a_write_production_does_not_answer_in_time_goes_unproven() {
    let mut h = picked_up();
    h.client_packet(0, &query("UPDATE t SET x=1"));
    let deadline = h.t.next_deadline().expect("bounded");
    h.now = deadline;
    h.call(|t, now, out| t.on_timeout(now, out));
    assert_eq!(payloads(&mut h), vec![query("UPDATE t SET x=1")]);
    assert_eq!(h.count(Counter::TransactionBoundaryUnproven), 1);
    assert_eq!(h.t.next_deadline(), None);
}

#[test]
fn an_error_leaves_the_state_unknown() {
    let mut h = picked_up();
    h.client_packet(0, &query("UPDATE t SET x=1"));
    h.prod_packet(1, &hex(WRONG_PW_ERR));
    assert!(payloads(&mut h).is_empty(), "an ERR proves no boundary");
    h.client_packet(0, &query("UPDATE t SET x=2"));
    assert!(h.t.pending(), "unknown again: it waits for its own reply");
    h.prod_packet(1, &ok(AUTOCOMMIT));
    assert_eq!(payloads(&mut h), vec![query("UPDATE t SET x=2")]);
    assert_eq!(
        h.count(Counter::CommandsDroppedBeforeTransactionBoundary),
        1
    );
}

/// A picked-up session waiting for production's state (the test server greeted it).
fn awaiting_recovery() -> Harness {
    let config = MysqlConfig {
        recovery_wait: Some(Duration::from_millis(200)),
        ..pickup_config()
    };
    let mut h = Harness::new(config, true);
    h.test_packet(0, &test_greeting(NATIVE));
    h
}

/// Production's state of an `sb` connection in `sbtest` with these statements.
fn recovered(statements: &[(u32, &str)]) -> RecoveredState {
    RecoveredState {
        user: "sb".into(),
        db: Some("sbtest".into()),
        statements: statements
            .iter()
            .map(|(id, sql)| (*id, sql.as_bytes().to_vec()))
            .collect(),
        variables: vec![],
        variables_dropped: 0,
        variables_at: None,
        variables_again: None,
    }
}

#[test]
fn a_recovered_statement_prepared_at_first_use_waits_at_the_gate_too() {
    let mut h = awaiting_recovery();
    // sysbench's DELETE of a transaction begun before the pickup.
    h.client_packet(0, &execute(5));
    let state = recovered(&[(5, "DELETE FROM sbtest1 WHERE id=?")]);
    h.call(|t, now, out| t.recover(now, state, out));
    assert_eq!(h.received().len(), 1, "the login");
    h.prod_packet(1, &ok(IN_TRANS | AUTOCOMMIT));
    h.test_packet(2, OK);
    let got = payloads(&mut h);
    assert_eq!(got, vec![prepare("DELETE FROM sbtest1 WHERE id=?")]);
    h.test_reply(&prepare_reply(1, 1));
    assert!(payloads(&mut h).is_empty(), "the tail's DELETE is not sent");
    assert_eq!(
        h.count(Counter::CommandsDroppedBeforeTransactionBoundary),
        1
    );
    assert_eq!(h.count(Counter::TransactionBoundaryUnproven), 0);
}

#[test]
fn a_statement_known_to_no_one_is_one_loss_however_the_client_resets_and_closes_it() {
    // mysql-connector-python: RESET, EXECUTE, later CLOSE, of a statement prepared before the
    // copier saw the connection (no --prod-dsn here).
    let mut h = picked_up();
    h.client_packet(0, &[com::STMT_RESET, 3, 0, 0, 0]);
    h.client_packet(0, &execute(3));
    h.client_packet(0, &close(3));
    assert!(payloads(&mut h).is_empty());
    assert_eq!(h.count(Counter::ExecutesDroppedPreparedBeforePickup), 1);
    assert_eq!(h.count(Counter::StmtResetsOfStatementsBeforePickup), 1);
    assert_eq!(h.count(Counter::RecoveredClosedUnused), 1);
    assert_eq!(h.count(Counter::StmtCommandsDropped), 0);
    assert!(!crate::mysql::is_protocol_loss(
        "stmt_resets_of_statements_before_pickup"
    ));
}

#[test]
fn a_recovered_statement_is_not_prepared_for_a_reset() {
    // mysql-connector-python at the end of a pooled use: the statement was prepared in
    // `tsd_other`, the code went back to `sbtest`, then the cursor resets and closes it. The
    // start snapshot read the connection in between: preparing it for the reset would prepare
    // it in `sbtest`, where its table does not exist.
    let mut h = awaiting_recovery();
    let state = recovered(&[
        (5, "SELECT COUNT(*) FROM marks WHERE x < ?"),
        (6, "SELECT c FROM sbtest1 WHERE id = ?"),
    ]);
    h.call(|t, now, out| t.recover(now, state, out));
    assert_eq!(h.received().len(), 1, "the login");
    h.test_packet(2, OK);
    assert!(payloads(&mut h).is_empty());
    h.client_packet(0, &[com::STMT_RESET, 5, 0, 0, 0]);
    h.prod_packet(1, &ok(AUTOCOMMIT));
    h.client_packet(0, &close(5));
    assert!(
        payloads(&mut h).is_empty(),
        "neither reaches the test server"
    );
    assert_eq!(h.count(Counter::StmtResetsOfStatementsBeforePickup), 1);
    assert_eq!(h.count(Counter::RecoveredClosedUnused), 1);
    assert_eq!(h.count(Counter::RecoveredPreparedAtFirstUse), 0);
    // The connector resets before every execute too: the execute prepares it.
    h.client_packet(0, &[com::STMT_RESET, 6, 0, 0, 0]);
    h.prod_packet(1, &ok(AUTOCOMMIT));
    assert!(payloads(&mut h).is_empty());
    h.client_packet(0, &execute(6));
    assert_eq!(
        payloads(&mut h),
        vec![prepare("SELECT c FROM sbtest1 WHERE id = ?")]
    );
    h.test_reply(&prepare_reply(1, 1));
    assert_eq!(payloads(&mut h), vec![execute(1)]);
    assert_eq!(h.count(Counter::StmtResetsOfStatementsBeforePickup), 2);
    assert_eq!(h.count(Counter::RecoveredPreparedAtFirstUse), 1);
    assert_eq!(h.count(Counter::StmtCommandsDropped), 0);
}
