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
