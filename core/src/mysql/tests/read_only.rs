//! `--read-only`: scripted sessions where writes are kept off the test server while the
//! session's reads still reach it, and both servers' replies stay matched with their commands.

use super::*;

fn read_only() -> MysqlConfig {
    MysqlConfig {
        read_only: true,
        ..MysqlConfig::default()
    }
}

fn logged_in(config: MysqlConfig) -> Harness {
    let mut h = Harness::new(config, false);
    h.login(&hex(CAPI_RESPONSE));
    h
}

fn payloads(h: &mut Harness) -> Vec<Vec<u8>> {
    h.received().into_iter().map(|g| g.1).collect()
}

fn one_row() -> Vec<(u8, Vec<u8>)> {
    result_set(1, 1, false, 0)
}

#[test]
fn writes_are_not_sent_nor_awaited_and_reads_follow() {
    let mut h = logged_in(read_only());
    // A transaction with a write in it, text protocol.
    for sql in [
        "BEGIN",
        "SELECT c FROM t WHERE id = 1 FOR UPDATE",
        "UPDATE t SET k = k + 1 WHERE id = 1",
        "/* app:42 */ SELECT c FROM t WHERE id = 1",
        "COMMIT",
    ] {
        h.client_packet(0, &query(sql));
    }
    assert_eq!(
        payloads(&mut h),
        vec![
            query("BEGIN"),
            query("/* app:42 */ SELECT c FROM t WHERE id = 1"),
            query("COMMIT")
        ]
    );
    // Production answers all five; the test server the three it got.
    h.prod_packet(1, OK);
    h.prod_reply(&one_row());
    h.prod_packet(1, OK);
    h.prod_reply(&one_row());
    h.prod_packet(1, OK);
    h.test_packet(1, OK);
    h.test_reply(&one_row());
    h.test_packet(1, OK);

    // Prepared statements: a write's prepare is not sent, nor its executes or close; the read
    // prepared after it is mapped to the test server's first id.
    h.client_packet(0, &prepare("INSERT INTO t (k, c) VALUES (?, ?)"));
    h.prod_reply(&prepare_reply(7, 2));
    h.client_packet(0, &prepare("SELECT c FROM t WHERE id = ?"));
    h.prod_reply(&prepare_reply(8, 1));
    h.test_reply(&prepare_reply(100, 1));
    h.client_packet(0, &execute(7));
    h.prod_packet(1, OK);
    h.client_packet(0, &execute(8));
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    h.client_packet(0, &close(7));
    h.client_packet(0, &execute(7));
    h.prod_packet(1, &hex(WRONG_PW_ERR));
    h.client_packet(0, &close(8));
    assert_eq!(
        payloads(&mut h),
        vec![
            prepare("SELECT c FROM t WHERE id = ?"),
            execute(100),
            close(100)
        ]
    );

    // MariaDB's direct execution: execute "the last prepared" right after a write's prepare.
    h.client_packet(0, &prepare("DELETE FROM t WHERE id = ?"));
    h.client_packet(0, &execute(u32::MAX));
    h.prod_reply(&prepare_reply(9, 1));
    h.prod_packet(1, OK);
    h.client_packet(0, &prepare("SELECT 1"));
    h.client_packet(0, &execute(u32::MAX));
    h.prod_reply(&prepare_reply(10, 0));
    h.prod_reply(&one_row());
    h.test_reply(&prepare_reply(101, 0));
    h.test_reply(&one_row());
    assert_eq!(
        payloads(&mut h),
        vec![prepare("SELECT 1"), execute(u32::MAX)]
    );

    h.client_packet(0, &[com::PING]);
    h.client_packet(0, &[com::QUIT]);
    h.prod_packet(1, OK);
    h.test_packet(1, OK);
    assert_eq!(payloads(&mut h), vec![vec![com::PING], vec![com::QUIT]]);
    assert!(!h.t.pending());
    assert_eq!(h.abandoned, None);
    assert_eq!(h.count(Counter::ReadOnlySkippedLockingRead), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedUpdate), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedInsert), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedDelete), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedStmtExecute), 2);
    // Executing a closed statement: production refused it, and the test server never had it.
    assert_eq!(h.count(Counter::ExecutesDroppedUnknownStatement), 1);
    assert_eq!(h.count(Counter::StatementsMapped), 2);
    for c in [
        Counter::RepliesUnmatched,
        Counter::ProtocolErrors,
        Counter::ReplySeqMismatches,
        Counter::ReplyStructureLost,
        Counter::StmtCommandsDropped,
        Counter::CommandsHeldAwaitingPrepare,
    ] {
        assert_eq!(h.count(c), 0, "{c:?}");
    }
}

#[test]
fn without_read_only_writes_pass() {
    let mut h = logged_in(MysqlConfig::default());
    h.client_packet(0, &query("DELETE FROM t"));
    h.client_packet(0, &prepare("INSERT INTO t VALUES (?)"));
    assert_eq!(
        payloads(&mut h),
        vec![query("DELETE FROM t"), prepare("INSERT INTO t VALUES (?)")]
    );
}

#[test]
fn local_infile_contents_of_a_skipped_load_are_not_sent() {
    let mut h = logged_in(read_only());
    h.client_packet(
        0,
        &query("LOAD DATA LOCAL INFILE '/tmp/x.csv' INTO TABLE t"),
    );
    // Production asks for the file; the client sends it (ids 2, 3) and an empty packet.
    h.prod_packet(1, b"\xfb/tmp/x.csv");
    h.client_packet(2, b"1,one\n2,two\n");
    h.client_packet(3, b"3,three\n");
    h.client_packet(4, b"");
    h.prod_packet(5, OK);
    h.client_packet(0, &query("SELECT COUNT(*) FROM t"));
    assert_eq!(payloads(&mut h), vec![query("SELECT COUNT(*) FROM t")]);
    assert_eq!(h.count(Counter::ReadOnlySkippedLoadData), 1);

    // A forwarded LOCAL INFILE read (there is none) is not affected: the flag ends with the
    // next command.
    h.prod_reply(&one_row());
    h.test_reply(&one_row());
    h.client_packet(0, &query("SELECT 2"));
    assert_eq!(payloads(&mut h), vec![query("SELECT 2")]);
    assert_eq!(h.abandoned, None);
}

#[test]
fn long_texts_are_judged_whole_or_kept_off() {
    let mut h = logged_in(read_only());
    // A 300 KiB read is collected whole, judged, and sent.
    let mut long_read = "SELECT id FROM t WHERE id IN (0".to_string();
    while long_read.len() < 300 << 10 {
        long_read.push_str(",123456");
    }
    long_read.push(')');
    h.client_packet(0, &query(&long_read));
    assert_eq!(payloads(&mut h), vec![query(&long_read)]);
    h.prod_reply(&one_row());
    h.test_reply(&one_row());

    // A multi-packet (16 MiB+) INSERT is skipped whole, continuation included.
    let mut big = query("INSERT INTO t VALUES ('");
    big.extend((0..MAX_PAYLOAD_LEN + 1000).map(|i| b'a' + (i % 26) as u8));
    big.extend_from_slice(b"')");
    for chunk in framed(0, &big).chunks(1 << 20) {
        h.client(chunk);
        assert!(h.t.buffered_len() <= (1 << 20) + 16);
    }
    // So is a SELECT too long to be seen whole: its tail could lock or write.
    let mut big_read = query("SELECT '");
    big_read.extend((0..(2 << 20)).map(|i| b'a' + (i % 26) as u8));
    big_read.extend_from_slice(b"' FOR UPDATE");
    h.client_packet(0, &big_read);
    h.client_packet(0, &query("SELECT 1"));
    assert_eq!(payloads(&mut h), vec![query("SELECT 1")]);
    assert_eq!(h.count(Counter::ReadOnlySkippedInsert), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedOther), 1);
    assert_eq!(h.abandoned, None);
}

#[test]
fn sql_level_prepared_statements_follow_their_text() {
    let mut h = logged_in(read_only());
    for sql in [
        "PREPARE w FROM 'DELETE FROM t WHERE id = ?'",
        "EXECUTE w USING @id",
        "PREPARE r FROM 'SELECT c FROM t WHERE id = ?'",
        "EXECUTE r USING @id",
        // Re-prepared as a read: the test server gets it, and its executes.
        "PREPARE w FROM 'SELECT 1'",
        "EXECUTE w",
        // A read prepared in a text that also writes was not sent either.
        "PREPARE r2 FROM 'SELECT 2'; INSERT INTO t VALUES (1)",
        "EXECUTE r2",
        "DEALLOCATE PREPARE r2",
        "EXECUTE r2",
    ] {
        h.client_packet(0, &query(sql));
    }
    assert_eq!(
        payloads(&mut h),
        vec![
            query("PREPARE r FROM 'SELECT c FROM t WHERE id = ?'"),
            query("EXECUTE r USING @id"),
            query("PREPARE w FROM 'SELECT 1'"),
            query("EXECUTE w"),
            query("DEALLOCATE PREPARE r2"),
            query("EXECUTE r2"),
        ]
    );
    assert_eq!(h.count(Counter::ReadOnlySkippedDelete), 2);
    assert_eq!(h.count(Counter::ReadOnlySkippedInsert), 2);
}

#[test]
fn commands_other_than_queries() {
    let mut h = logged_in(read_only());
    let mut kill = vec![com::PROCESS_KILL];
    kill.extend_from_slice(&5u32.to_le_bytes());
    h.client_packet(0, &kill);
    h.client_packet(0, &[0x07, 0x01]); // COM_REFRESH
    h.client_packet(0, b"\x05newdb"); // COM_CREATE_DB
    h.client_packet(0, &[0x20]); // unknown
    h.client_packet(0, b"\x02sbtest"); // COM_INIT_DB
    h.client_packet(0, &[com::STATISTICS]);
    h.client_packet(0, b"\x04t\x00"); // COM_FIELD_LIST
    h.client_packet(0, &[com::SET_OPTION, 0, 0]);
    assert_eq!(
        payloads(&mut h),
        vec![
            b"\x02sbtest".to_vec(),
            vec![com::STATISTICS],
            b"\x04t\x00".to_vec(),
            vec![com::SET_OPTION, 0, 0]
        ]
    );
    assert_eq!(h.count(Counter::ReadOnlySkippedAdmin), 2);
    assert_eq!(h.count(Counter::ReadOnlySkippedDdl), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedOther), 1);
}

#[test]
fn calls_are_kept_off_unless_allowed() {
    let mut h = logged_in(read_only());
    h.client_packet(0, &query("CALL report(1)"));
    assert!(payloads(&mut h).is_empty());
    assert_eq!(h.count(Counter::ReadOnlySkippedCall), 1);

    let mut h = logged_in(MysqlConfig {
        allow_calls: true,
        ..read_only()
    });
    h.client_packet(0, &query("CALL report(1)"));
    h.client_packet(0, &query("CALL report(1); DELETE FROM t"));
    assert_eq!(payloads(&mut h), vec![query("CALL report(1)")]);
    assert_eq!(h.count(Counter::ReadOnlySkippedDelete), 1);
}

#[test]
fn reset_forgets_skipped_statements() {
    let mut h = logged_in(read_only());
    h.client_packet(0, &prepare("INSERT INTO t VALUES (?)"));
    h.prod_reply(&prepare_reply(1, 1));
    // A skipped prepare whose answer comes after the reset: its id means nothing then.
    h.client_packet(0, &prepare("UPDATE t SET k = ?"));
    h.client_packet(0, &hex(CAPI_RESET_CONNECTION));
    h.prod_reply(&prepare_reply(2, 1));
    h.prod_packet(1, OK);
    h.test_packet(1, OK);
    // Production numbers on; were an id reused, it would name the new (read) statement.
    h.client_packet(0, &prepare("SELECT ?"));
    h.prod_reply(&prepare_reply(1, 1));
    h.test_reply(&prepare_reply(50, 1));
    h.client_packet(0, &execute(1));
    h.client_packet(0, &execute(2));
    assert_eq!(
        payloads(&mut h),
        vec![hex(CAPI_RESET_CONNECTION), prepare("SELECT ?"), execute(50)]
    );
    assert_eq!(h.count(Counter::ReadOnlySkippedStmtExecute), 0);
    assert_eq!(h.count(Counter::ExecutesDroppedUnknownStatement), 1);
}

#[test]
fn recovered_write_statements_are_not_prepared_again() {
    let config = MysqlConfig {
        recovery_wait: Some(Duration::from_millis(200)),
        read_only: true,
        ..pickup_config()
    };
    let mut h = Harness::new(config, true);
    h.test_packet(0, &test_greeting(NATIVE));
    h.client_packet(0, &execute(6));
    h.client_packet(0, &execute(5));
    let state = RecoveredState {
        user: "sb".into(),
        db: Some("sbtest".into()),
        statements: vec![
            (5, b"SELECT c FROM sbtest1 WHERE id=?".to_vec()),
            (6, b"UPDATE sbtest1 SET k=k+1 WHERE id=?".to_vec()),
        ],
        ..Default::default()
    };
    h.call(|t, now, out| t.recover(now, state, out));
    assert_eq!(h.received().len(), 1, "the login");
    h.test_packet(2, OK);
    assert_eq!(
        payloads(&mut h),
        vec![prepare("SELECT c FROM sbtest1 WHERE id=?")]
    );
    h.test_reply(&prepare_reply(1, 1));
    assert_eq!(payloads(&mut h), vec![execute(1)]);
    assert_eq!(h.count(Counter::RecoveredStatements), 1);
    assert_eq!(h.count(Counter::ReadOnlySkippedStmtExecute), 1);
    assert_eq!(h.count(Counter::ExecutesDroppedPreparedBeforePickup), 0);
}

// ------------------------------------------------------------------ property

#[derive(Clone, Debug)]
enum RoOp {
    Read,
    Write,
    BigRead(u32, bool),
    PrepareRead,
    PrepareWrite,
    Execute(usize),
    Close(usize),
}

fn arb_ro_op() -> impl Strategy<Value = RoOp> {
    prop_oneof![
        2 => Just(RoOp::Read),
        2 => Just(RoOp::Write),
        1 => (0u32..600, any::<bool>()).prop_map(|(r, d)| RoOp::BigRead(r, d)),
        2 => Just(RoOp::PrepareRead),
        2 => Just(RoOp::PrepareWrite),
        5 => any::<usize>().prop_map(RoOp::Execute),
        1 => any::<usize>().prop_map(RoOp::Close),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever mix of reads and writes, in whatever pieces, with the servers answering at
    /// whatever pace: the test server receives exactly the reads (ids mapped), and every reply
    /// of both servers is matched with its command.
    #[test]
    fn the_test_server_receives_exactly_the_reads(
        ops in proptest::collection::vec(arb_ro_op(), 0..30),
        prod_ids in distinct_ids(),
        test_ids in distinct_ids(),
        chunk in 1usize..40,
        lags in proptest::collection::vec(0usize..6, 30),
        test_first in proptest::collection::vec(any::<bool>(), 30),
    ) {
        let mut h = Harness::new(read_only(), false);
        let mut prod = FakeServer::new(prod_ids.clone());
        let mut test = FakeServer::new(test_ids.clone());
        fn pump(h: &mut Harness, test: &mut FakeServer, mut budget: usize) {
            loop {
                let sent: Vec<u8> = h.sent.drain(..).collect();
                test.feed(&sent);
                if budget == 0 {
                    return;
                }
                let Some((s, p)) = test.replies.pop_front() else { return };
                h.test_packet(s, &p);
                budget -= 1;
            }
        }
        fn answer_prod(h: &mut Harness, prod: &mut FakeServer) {
            let bytes: Vec<u8> = prod.replies.drain(..).flat_map(|(s, p)| framed(s, &p)).collect();
            for c in bytes.chunks(7) {
                h.prod(c);
            }
        }
        h.prod_packet(0, &hex(SB_GREETING));
        h.test_packet(0, &test_greeting(NATIVE));
        let login = framed(1, &hex(CAPI_RESPONSE));
        for c in login.chunks(chunk) {
            h.client(c);
        }
        prod.feed(&login);
        pump(&mut h, &mut test, 0);
        answer_prod(&mut h, &mut prod);

        // Per statement the client holds: production's id and the test server's, if it got it.
        let mut live: Vec<(u32, Option<u32>)> = Vec::new();
        let (mut prod_prepares, mut test_prepares) = (0usize, 0usize);
        let mut expected: Vec<Vec<u8>> = Vec::new();
        let mut skipped_executes = 0u64;
        for (i, op) in ops.iter().enumerate() {
            let (payload, want) = match op {
                RoOp::Read => (query("SELECT 1"), Some(query("SELECT 1"))),
                RoOp::Write => (query("UPDATE t SET k = 1"), None),
                RoOp::BigRead(rows, d) => {
                    let q = query(&format!("SELECT BIG {rows} {}", u8::from(*d)));
                    (q.clone(), Some(q))
                }
                RoOp::PrepareRead | RoOp::PrepareWrite => {
                    let write = matches!(op, RoOp::PrepareWrite);
                    let test_id = (!write).then(|| {
                        test_prepares += 1;
                        test_ids[test_prepares - 1]
                    });
                    live.push((prod_ids[prod_prepares], test_id));
                    prod_prepares += 1;
                    if write {
                        (prepare("INSERT INTO t VALUES (?)"), None)
                    } else {
                        (prepare("SELECT ?"), Some(prepare("SELECT ?")))
                    }
                }
                RoOp::Execute(k) | RoOp::Close(k) => {
                    if live.is_empty() {
                        continue;
                    }
                    let idx = *k % live.len();
                    let (p, t) = live[idx];
                    if matches!(op, RoOp::Close(_)) {
                        live.remove(idx);
                        (close(p), t.map(close))
                    } else {
                        if t.is_none() {
                            skipped_executes += 1;
                        }
                        (execute(p), t.map(execute))
                    }
                }
            };
            expected.extend(want);
            let bytes = framed(0, &payload);
            for c in bytes.chunks(chunk) {
                h.client(c);
            }
            prod.feed(&bytes);
            if test_first[i] {
                pump(&mut h, &mut test, lags[i]);
                answer_prod(&mut h, &mut prod);
            } else {
                answer_prod(&mut h, &mut prod);
                pump(&mut h, &mut test, lags[i]);
            }
        }
        pump(&mut h, &mut test, usize::MAX);
        prop_assert_eq!(h.abandoned, None);
        prop_assert!(!h.t.pending());
        prop_assert_eq!(&test.commands, &expected);
        prop_assert_eq!(h.count(Counter::RepliesUnmatched), 0);
        prop_assert_eq!(h.count(Counter::ProtocolErrors), 0);
        prop_assert_eq!(h.count(Counter::ReplySeqMismatches), 0);
        prop_assert_eq!(h.count(Counter::ReplyStructureLost), 0);
        prop_assert_eq!(h.count(Counter::StatementsMapped), test_prepares as u64);
        prop_assert_eq!(h.count(Counter::ReadOnlySkippedStmtExecute), skipped_executes);
        prop_assert_eq!(h.count(Counter::ExecutesDroppedUnknownStatement), 0);
    }
}
