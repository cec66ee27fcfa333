//! `--report`: what scripted sessions tell the comparison report, command by command.

use super::*;
use crate::engine::StreamTransform;
use crate::mysql::ReportHooks;
use crate::observation::{AnswerKind, Observation, TestOutcome};

fn reporting(compare: bool, literals: bool) -> MysqlConfig {
    MysqlConfig {
        report: Some(ReportHooks {
            compare_results: compare,
            literals,
        }),
        ..MysqlConfig::default()
    }
}

fn logged_in(config: MysqlConfig) -> Harness {
    let mut h = Harness::new(config, false);
    h.test.hashes = true;
    h.login(&hex(CAPI_RESPONSE));
    h.received();
    h
}

/// What the session handed out so far, as the engine collects it after each event.
fn drained(h: &mut Harness) -> Vec<Observation> {
    std::iter::from_fn(|| h.t.poll_observation()).collect()
}

fn later(h: &mut Harness, ms: u64) {
    h.now = h.now + Duration::from_millis(ms);
}

/// A result set of one column whose rows are `rows`.
fn rows_reply(rows: &[&[u8]]) -> Vec<(u8, Vec<u8>)> {
    let mut p = vec![vec![1], COLUMN_DEF.to_vec(), eof(0x0002)];
    for r in rows {
        let mut row = vec![r.len() as u8];
        row.extend_from_slice(r);
        p.push(row);
    }
    p.push(eof(0x0002));
    numbered(p)
}

fn err(code: u16) -> Vec<u8> {
    let mut p = vec![0xff];
    p.extend_from_slice(&code.to_le_bytes());
    p.extend_from_slice(b"#42000SELECT command denied");
    p
}

#[test]
fn a_prepared_select_is_reported_with_both_answers_latencies_and_checksums() {
    let config = reporting(true, false);
    let mut h = logged_in(config);
    h.client_packet(0, &prepare("SELECT c FROM sbtest1 WHERE id=?"));
    h.prod_reply(&prepare_reply(7, 1));
    h.test_reply(&prepare_reply(70, 1));
    h.client_packet(0, &execute(7));
    assert_eq!(command::statement_id(&h.received()[1].1), Some(70));
    later(&mut h, 3);
    h.prod_reply(&rows_reply(&[b"alpha", b"beta"]));
    later(&mut h, 5);
    h.test_reply(&rows_reply(&[b"alpha", b"beta"]));

    let got = drained(&mut h);
    assert_eq!(got.len(), 2, "{got:#?}");
    let prep = &got[0];
    assert_eq!(prep.statement.command, "stmt_prepare");
    assert_eq!(prep.prod.unwrap().kind, AnswerKind::Ok);
    let exec = &got[1];
    assert_eq!(exec.statement.command, "stmt_execute");
    assert_eq!(
        &*exec.statement.fingerprint,
        "select c from sbtest1 where id=?"
    );
    let prod = exec.prod.unwrap();
    let TestOutcome::Answered(test) = exec.test else {
        panic!("{exec:?}");
    };
    assert_eq!((prod.kind, prod.rows), (AnswerKind::ResultSet, 2));
    assert_eq!((test.kind, test.rows), (AnswerKind::ResultSet, 2));
    assert_eq!(prod.latency, Duration::from_millis(3));
    assert_eq!(test.latency, Duration::from_millis(8));
    assert!(prod.bytes > 0 && prod.bytes == test.bytes);
    let (pc, tc) = (prod.checksum.unwrap(), test.checksum.unwrap());
    assert!(pc.same(&tc, false));
    assert_eq!(pc.rows, 2);
}

#[test]
fn different_rows_give_different_checksums_and_rows_in_another_order_the_same_multiset() {
    let config = reporting(true, false);
    let mut h = logged_in(config);
    for test_rows in [&[&b"b"[..], b"a"][..], &[b"a", b"x"], &[b"a"]] {
        h.client_packet(0, &query("SELECT c FROM t WHERE k = 5"));
        h.prod_reply(&rows_reply(&[b"a", b"b"]));
        h.test_reply(&rows_reply(test_rows));
    }
    let got = drained(&mut h);
    assert_eq!(got.len(), 3);
    let sums: Vec<_> = got
        .iter()
        .map(|o| {
            let TestOutcome::Answered(t) = o.test else {
                panic!()
            };
            (o.prod.unwrap().checksum.unwrap(), t.checksum.unwrap())
        })
        .collect();
    assert!(sums[0].0.same(&sums[0].1, false), "same rows, other order");
    assert!(!sums[0].0.same(&sums[0].1, true));
    assert!(!sums[1].0.same(&sums[1].1, false), "a row differs");
    assert!(!sums[2].0.same(&sums[2].1, false), "a row missing");
    assert_eq!(&*got[0].statement.example, "SELECT c FROM t WHERE k = ?");
    assert_eq!(
        &*got[0].statement.fingerprint,
        "select c from t where k = ?"
    );
    assert!(!got[0].statement.traits.ordered);
}

#[test]
fn errors_carry_their_code_and_literals_are_kept_on_request() {
    let config = reporting(false, true);
    let mut h = logged_in(config);
    h.client_packet(0, &query("SELECT c FROM sbtest2 WHERE id = 42"));
    h.prod_reply(&rows_reply(&[b"c"]));
    h.test_packet(1, &err(1142));
    let got = drained(&mut h);
    assert_eq!(got.len(), 1);
    let TestOutcome::Answered(t) = got[0].test else {
        panic!()
    };
    assert_eq!(t.kind, AnswerKind::Err(1142));
    assert_eq!(t.checksum, None, "not compared without --compare-results");
    assert_eq!(
        &*got[0].statement.example,
        "SELECT c FROM sbtest2 WHERE id = 42"
    );
}

#[test]
fn credentials_stay_masked_even_with_literals() {
    let config = reporting(false, true);
    let mut h = logged_in(config);
    h.client_packet(0, &query("CREATE USER 'app'@'%' IDENTIFIED BY 'hunter2'"));
    h.prod_packet(1, OK);
    h.test_packet(1, OK);
    h.client_packet(0, &query("SET PASSWORD FOR app = PASSWORD('hunter3')"));
    h.prod_packet(1, OK);
    h.test_packet(1, OK);
    let got = drained(&mut h);
    let examples: Vec<&str> = got.iter().map(|o| &*o.statement.example).collect();
    assert_eq!(
        examples,
        [
            "CREATE USER ?@'%' IDENTIFIED BY ?",
            "SET PASSWORD FOR app = PASSWORD(?)"
        ]
    );
}

#[test]
fn multi_results_are_one_answer_and_deprecate_eof_replies_end_on_their_ok() {
    let config = reporting(false, false);
    let mut h = logged_in(config);
    h.client_packet(0, &query("CALL p()"));
    let mut packets = result_set_packets(1, 2, true, 0x0008 | 0x0002);
    packets.extend(result_set_packets(2, 3, true, 0x0008 | 0x0002));
    packets.push(ok(0x0002));
    h.prod_reply(&numbered(packets.clone()));
    h.test_reply(&numbered(packets));
    let got = drained(&mut h);
    assert_eq!(got.len(), 1);
    let p = got[0].prod.unwrap();
    assert_eq!((p.kind, p.rows), (AnswerKind::ResultSet, 5));
    assert_eq!(&*got[0].statement.fingerprint, "call p");
}

#[test]
fn read_only_skips_are_not_answers_and_losses_are_reported_as_such() {
    let mut config = reporting(false, false);
    config.read_only = true;
    let mut h = logged_in(config);
    h.client_packet(0, &query("UPDATE t SET k = k + 1 WHERE id = 3"));
    h.prod_packet(1, OK);
    h.client_packet(0, &query("SELECT 1"));
    h.prod_reply(&rows_reply(&[b"1"]));
    // intercept lost the test server's stream before its answer to the SELECT.
    h.call(|t, now, out| t.on_test_framing_lost(now, 0, out));
    h.client_packet(0, &query("SELECT 2"));
    let got = drained(&mut h);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].test, TestOutcome::Skipped);
    assert_eq!(got[0].prod.unwrap().kind, AnswerKind::Ok);
    // The test server had it; what it answered nobody can read: unseen, not lost.
    assert_eq!(got[1].test, TestOutcome::Unseen);
    // Production's answer to the last command never comes: it leaves when the session ends.
    // Sent after the framing was lost, its test answer is unseen as well.
    h.t.end();
    let got = drained(&mut h);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].prod, got[0].test), (None, TestOutcome::Unseen));
}

#[test]
fn a_test_server_far_behind_leaves_answers_unseen_not_lost() {
    let config = reporting(false, false);
    let mut h = logged_in(config);
    // Production answers every command at once; the test server answers none yet.
    for _ in 0..=crate::mysql::observe::MAX_PENDING {
        h.client_packet(0, &query("SELECT 1"));
        h.prod_reply(&rows_reply(&[b"1"]));
    }
    let got = drained(&mut h);
    assert!(!got.is_empty());
    assert!(
        got.iter().all(|o| o.test == TestOutcome::Unseen),
        "{:?}",
        got.iter().map(|o| o.test).collect::<Vec<_>>()
    );
}

#[test]
fn our_own_commands_are_not_reported_and_recovered_statements_are_named() {
    let mut config = reporting(false, false);
    config.default_user = Some("sb".into());
    config.recovery_wait = Some(Duration::from_secs(1));
    let mut h = Harness::new(config, true);
    h.test.hashes = true;
    // A pooled connection's execute of a statement prepared before the capture started.
    h.client_packet(0, &execute(5));
    h.call(|t, now, out| {
        t.recover(
            now,
            RecoveredState {
                user: "sb".into(),
                db: Some("sbtest".into()),
                statements: vec![(5, b"SELECT c FROM sbtest1 WHERE id=?".to_vec())],
                ..Default::default()
            },
            out,
        )
    });
    h.test_packet(0, &test_greeting(NATIVE));
    h.test_packet(2, OK);
    // Our re-prepare goes first; the execute waits for its PREPARE_OK.
    h.test_reply(&prepare_reply(50, 1));
    let got = h.received();
    assert_eq!(got.len(), 3, "login, re-prepare, execute");
    assert_eq!(command::statement_id(&got[2].1), Some(50));
    h.prod_reply(&rows_reply(&[b"1"]));
    h.test_reply(&rows_reply(&[b"1"]));
    let got = drained(&mut h);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].statement.command, "stmt_execute");
    assert_eq!(
        &*got[0].statement.fingerprint,
        "select c from sbtest1 where id=?"
    );
    assert!(matches!(got[0].test, TestOutcome::Answered(a) if a.rows == 1));
    assert_eq!(got[0].prod.unwrap().rows, 1);
}

#[test]
fn a_command_decided_before_its_sql_is_in_is_still_matched() {
    // The forwarding reader decides an execute from its first 5 bytes; the report reads the
    // whole packet first. Fed 4 bytes at a time, the decision comes first.
    let config = reporting(false, false);
    let mut h = logged_in(config);
    h.client_packet(0, &prepare("SELECT ?"));
    h.prod_reply(&prepare_reply(7, 1));
    h.test_reply(&prepare_reply(70, 1));
    for c in framed(0, &execute(7)).chunks(4) {
        h.client(c);
    }
    h.test_packet(1, OK);
    h.prod_packet(1, OK);
    let got = drained(&mut h);
    assert_eq!(got.len(), 2);
    assert!(matches!(got[1].test, TestOutcome::Answered(_)), "{got:?}");
}

#[test]
fn executes_of_a_statement_the_test_server_refused_are_its_errors() {
    let config = reporting(false, false);
    let mut h = logged_in(config);
    h.client_packet(0, &prepare("SELECT c FROM sbtest2 WHERE id=?"));
    h.prod_reply(&prepare_reply(7, 1));
    h.test_packet(1, &err(1142));
    h.client_packet(0, &execute(7));
    h.prod_reply(&rows_reply(&[b"x"]));
    assert_eq!(h.received().len(), 1, "only the prepare was sent");
    let got = drained(&mut h);
    assert_eq!(got.len(), 2);
    assert!(
        matches!(got[0].test, TestOutcome::Answered(a) if a.kind == AnswerKind::Err(1142)),
        "{got:?}"
    );
    assert_eq!(got[1].statement.command, "stmt_execute");
    assert_eq!(got[1].test, TestOutcome::Refused(1142));
}

#[test]
fn a_command_queued_behind_a_slow_one_is_timed_from_when_the_server_could_start_it() {
    let config = reporting(false, false);
    let mut h = logged_in(config);
    // Production answers each at once; the client sends the next one right away.
    h.client_packet(0, &query("SELECT slow()"));
    later(&mut h, 1);
    h.prod_reply(&rows_reply(&[b"1"]));
    h.client_packet(0, &query("SELECT fast()"));
    later(&mut h, 1);
    h.prod_reply(&rows_reply(&[b"2"]));
    // The test server takes 50 ms for the first, then 1 ms for the second.
    later(&mut h, 48);
    h.test_reply(&rows_reply(&[b"1"]));
    later(&mut h, 1);
    h.test_reply(&rows_reply(&[b"2"]));
    let got = drained(&mut h);
    let latency = |o: &Observation| match o.test {
        TestOutcome::Answered(a) => a.latency,
        _ => panic!("{o:?}"),
    };
    assert_eq!(latency(&got[0]), Duration::from_millis(50));
    assert_eq!(latency(&got[1]), Duration::from_millis(1));
    assert_eq!(got[1].prod.unwrap().latency, Duration::from_millis(1));
}

#[test]
fn production_rows_passed_over_count_as_rows_read_one_by_one() {
    // Rows whose first bytes arrive in one piece are passed over unread (ProdSink); rows cut
    // anywhere else are read packet by packet. Either way the report must say the same.
    let rows: Vec<Vec<u8>> = (0..60u32)
        .map(|i| format!("row-{i}").into_bytes())
        .collect();
    let rows: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
    let mut seen = Vec::new();
    for chunk in [1, 2, 5, 9, 64, 100_000] {
        let config = reporting(false, false);
        let mut h = logged_in(config);
        h.client_packet(0, &query("SELECT c FROM sbtest1"));
        h.client_packet(0, &query("SELECT nothing"));
        let mut bytes: Vec<u8> = rows_reply(&rows)
            .iter()
            .flat_map(|(s, p)| framed(*s, p))
            .collect();
        bytes.extend(framed(1, &err(1146)));
        for piece in bytes.chunks(chunk) {
            h.prod(piece);
        }
        h.test_reply(&rows_reply(&rows));
        h.test_packet(1, &err(1146));
        let got = drained(&mut h);
        assert_eq!(got.len(), 2, "chunk {chunk}: {got:#?}");
        let (a, b) = (got[0].prod.unwrap(), got[1].prod.unwrap());
        assert_eq!(
            (a.kind, a.rows),
            (AnswerKind::ResultSet, 60),
            "chunk {chunk}"
        );
        assert_eq!(b.kind, AnswerKind::Err(1146), "chunk {chunk}");
        seen.push(a.bytes);
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

#[test]
fn what_the_test_server_did_not_answer_is_replayed_from_its_start_and_reported_resent() {
    let mut h = logged_in(reporting(false, false));
    h.client_packet(0, &query("SELECT 1"));
    h.prod_reply(&rows_reply(&[b"1"]));
    h.test_reply(&rows_reply(&[b"1"]));
    let second = h.t.replay_from().expect("between commands, all answered");
    h.client_packet(0, &query("SELECT 2"));
    h.client_packet(0, &query("SELECT 3"));
    h.prod_reply(&rows_reply(&[b"2"]));
    h.prod_reply(&rows_reply(&[b"3"]));
    // The test server is behind: neither answered when its connection is lost.
    assert_eq!(h.t.replay_from(), Some(second));
    h.test_reply(&rows_reply(&[b"2"]));
    let third = second + 4 + query("SELECT 2").len() as u64;
    assert_eq!(h.t.replay_from(), Some(third), "the oldest unanswered");
    h.t.carried_over();
    h.t.end();
    let got = drained(&mut h);
    assert_eq!(got.len(), 3, "{got:#?}");
    assert!(matches!(got[1].test, TestOutcome::Answered(_)));
    assert_eq!(got[2].test, TestOutcome::Resent, "sent again, not lost");
}

#[test]
fn a_replayed_run_is_not_paired_with_productions_next_reply() {
    let mut h = logged_in(reporting(false, false));
    // A re-established session is picked up; the logged-in harness stands in for it, with
    // production's stream framed from the next command on, as after a pickup.
    h.client_packet(0, &query("SELECT 1"));
    h.client_packet(0, &query("SELECT 2"));
    h.call(|t, now, out| t.on_replayed(now, out));
    h.client_packet(0, &query("SELECT 3"));
    h.prod_reply(&rows_reply(&[b"3", b"3"]));
    for r in [&b"1"[..], b"2", b"3"] {
        h.test_reply(&rows_reply(&[r, r]));
    }
    let got = drained(&mut h);
    assert_eq!(got.len(), 3, "{got:#?}");
    assert_eq!(got[0].prod, None, "production's answer went by before");
    assert_eq!(got[1].prod, None);
    assert_eq!(&*got[2].statement.fingerprint, "select ?");
    assert_eq!(got[2].prod.map(|p| p.rows), Some(2), "its own answer");
}

#[test]
fn an_idle_sessions_observer_gives_its_queues_room_back_and_observes_on() {
    let mut h = logged_in(reporting(false, false));
    let exchange = |h: &mut Harness, id: u32| {
        h.client_packet(0, &prepare("SELECT c FROM sbtest1 WHERE id=?"));
        h.prod_reply(&prepare_reply(id, 1));
        h.test_reply(&prepare_reply(10 * id, 1));
        let got = drained(h);
        assert_eq!(got.len(), 1, "{got:#?}");
        assert_eq!(got[0].statement.command, "stmt_prepare");
    };
    exchange(&mut h, 7);
    let at = h.t.next_deadline().expect("a trim once idle");
    assert!(at > h.now, "not before the session has been idle a while");
    // Busy again before then: the queues are kept, and the timer finds them in use.
    h.client_packet(0, &prepare("SELECT c FROM sbtest1 WHERE id=?"));
    h.now = at;
    let in_use = h.t.memory_len();
    h.call(|t, now, out| t.on_timeout(now, out));
    assert_eq!(h.t.memory_len(), in_use, "in use: kept");
    h.prod_reply(&prepare_reply(8, 1));
    h.test_reply(&prepare_reply(80, 1));
    assert_eq!(drained(&mut h).len(), 1);
    // Idle through the delay: their room goes back, and the next command is observed as ever.
    let at = h.t.next_deadline().expect("armed again once idle");
    h.now = at;
    let idle = h.t.memory_len();
    h.call(|t, now, out| t.on_timeout(now, out));
    assert!(h.t.memory_len() < idle, "{} >= {idle}", h.t.memory_len());
    assert_eq!(h.t.next_deadline(), None, "nothing left to wait for");
    exchange(&mut h, 9);
}

#[test]
fn sessions_of_one_factory_share_the_shapes_of_what_they_prepare() {
    use crate::mysql::observe::SHARED_SQL_MAX;
    let creds = Arc::new(Credentials::parse(CREDENTIALS).unwrap());
    let f = MysqlFactory::new(reporting(false, false), creds, test_random());
    let short = "SELECT c FROM sbtest1 WHERE id=?".to_string();
    let long = format!("{short} /* {} */", "x".repeat(SHARED_SQL_MAX));
    let mut seen = Vec::new();
    for _ in 0..2 {
        let mut h = Harness::with_factory(&f, false);
        h.login(&hex(CAPI_RESPONSE));
        h.received();
        for (k, sql) in [&short, &long].into_iter().enumerate() {
            h.client_packet(0, &prepare(sql));
            h.prod_reply(&prepare_reply(7 + k as u32, 1));
            h.test_reply(&prepare_reply(70 + k as u32, 1));
        }
        seen.push(drained(&mut h));
    }
    let (a, b) = (&seen[0], &seen[1]);
    assert_eq!((a.len(), b.len()), (2, 2), "{seen:#?}");
    assert_eq!(a[0].statement.command, "stmt_prepare");
    assert!(
        Arc::ptr_eq(&a[0].statement, &b[0].statement),
        "the second session's prepare takes the first one's shape"
    );
    // Too long to keep: made per session, the same shape all the same.
    assert!(!Arc::ptr_eq(&a[1].statement, &b[1].statement));
    assert_eq!(a[1].statement.id, b[1].statement.id);
    assert_eq!(a[1].statement.fingerprint, b[1].statement.fingerprint);
}

#[test]
fn the_shared_shapes_keep_at_most_their_bound() {
    use crate::mysql::observe::{PreparedShapes, SHARED_SHAPES};
    use crate::observation::Statement;
    let shapes = PreparedShapes::default();
    let shape = Arc::new(Statement {
        id: 1,
        command: "stmt_execute",
        fingerprint: "select ?".into(),
        example: "select ?".into(),
        traits: Default::default(),
    });
    for i in 0..SHARED_SHAPES + 10 {
        shapes.put(format!("SELECT {i}").as_bytes(), &shape, &shape);
    }
    assert_eq!(shapes.len(), SHARED_SHAPES);
    assert!(shapes.get(b"SELECT 0").is_none(), "the oldest went first");
    assert!(shapes
        .get(format!("SELECT {}", SHARED_SHAPES + 9).as_bytes())
        .is_some());
}
