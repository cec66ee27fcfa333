//! A blind session's probe (`resync.rs`): after intercept lost the test server's replies, a
//! COM_STATISTICS in front of the next command lets them be followed again, so statements
//! prepared later are paired and the comparison goes on.

use super::*;
use crate::mysql::resync::RESYNC_WAIT;

const STATS: &[u8] = b"Uptime: 84  Threads: 9  Questions: 2811  Slow queries: 0  Opens: 17";

fn logged_in_with_statement() -> Harness {
    let mut h = Harness::new(MysqlConfig::default(), false);
    h.login(&hex(CAPI_RESPONSE));
    h.client_packet(0, &prepare("A"));
    h.prod_reply(&prepare_reply(1, 0));
    h.test_reply(&prepare_reply(11, 0));
    h.received();
    h
}

fn payloads(h: &mut Harness) -> Vec<Vec<u8>> {
    h.received().into_iter().map(|g| g.1).collect()
}

fn framing_lost(h: &mut Harness) {
    h.test_event(MysqlEvent::FramingLost {
        client: session(false).mirrored,
        at_seq: 12345,
    });
}

fn framing_resumed(h: &mut Harness) {
    h.test_event(MysqlEvent::FramingResumed {
        client: session(false).mirrored,
        at_seq: 777,
    });
    h.test = TestStream::new(16);
}

fn timeout(h: &mut Harness) {
    h.call(|t, now, out| t.on_timeout(now, out));
}

#[test]
fn a_blind_session_follows_its_replies_again_from_the_probes_answer() {
    let mut h = logged_in_with_statement();
    framing_lost(&mut h);
    assert_eq!(h.count(Counter::FramingLost), 1);
    h.client_packet(0, &execute(1));
    assert_eq!(payloads(&mut h), vec![vec![0x09], execute(11)]);
    assert_eq!(h.count(Counter::ResyncProbes), 1);
    // A statement prepared while the probe is out is paired once its answer is seen.
    h.client_packet(0, &prepare("B"));
    h.prod_reply(&result_set(1, 1, false, 0));
    h.prod_reply(&prepare_reply(2, 0));
    framing_resumed(&mut h);
    assert_eq!(h.count(Counter::TestFramingResumed), 1);
    h.test_reply(&result_set(1, 1, false, 0));
    h.test_reply(&prepare_reply(12, 0));
    h.client_packet(0, &execute(2));
    assert_eq!(payloads(&mut h), vec![prepare("B"), execute(12)]);
    assert_eq!(h.count(Counter::ExecutesDroppedUntracked), 0);
    assert_eq!(h.count(Counter::ResyncsFailed), 0);
    assert_eq!(h.abandoned, None);
    // One probe per loss: the next commands go as they are.
    h.client_packet(0, &execute(1));
    assert_eq!(payloads(&mut h), vec![execute(11)]);
    assert_eq!(h.count(Counter::ResyncProbes), 1);
}

#[test]
fn the_probes_answer_is_found_among_the_packets_when_intercept_kept_framing() {
    let mut h = logged_in_with_statement();
    // Events lost between intercept and us: intercept still frames, we lost our place.
    let mut gap = h.test.summarize(1, OK);
    gap.stream_offset += 10;
    h.call(|t, now, out| t.on_test_packet(now, &gap, out));
    assert_eq!(h.count(Counter::FramingLost), 1);
    h.test.offset = gap.stream_offset + 4 + u64::from(gap.len);
    h.client_packet(0, &prepare("B"));
    h.prod_reply(&prepare_reply(2, 0));
    assert_eq!(payloads(&mut h), vec![vec![0x09], prepare("B")]);
    // The rest of a reply owed from before, another gap, then the probe's answer.
    h.test_packet(2, &[0xfe, 0, 0, 2, 0]);
    h.test.offset += 100;
    h.test_packet(1, STATS);
    assert_eq!(h.count(Counter::TestFramingResumed), 1);
    h.test_reply(&prepare_reply(12, 0));
    h.client_packet(0, &execute(2));
    assert_eq!(payloads(&mut h), vec![execute(12)]);
    assert_eq!(h.abandoned, None);
}

#[test]
fn a_probe_unanswered_in_time_leaves_the_session_blind_until_framing_is_lost_again() {
    let mut h = logged_in_with_statement();
    framing_lost(&mut h);
    h.client_packet(0, &execute(1));
    assert_eq!(payloads(&mut h), vec![vec![0x09], execute(11)]);
    h.prod_reply(&result_set(1, 1, false, 0));
    assert!(h.t.next_deadline().is_some());
    h.now = h.now + RESYNC_WAIT;
    timeout(&mut h);
    assert_eq!(h.count(Counter::ResyncsFailed), 1);
    // Blind again: a statement prepared now cannot be paired, and no second probe goes.
    h.client_packet(0, &prepare("C"));
    h.prod_reply(&prepare_reply(3, 0));
    h.client_packet(0, &execute(3));
    assert_eq!(payloads(&mut h), vec![prepare("C")]);
    assert_eq!(h.count(Counter::ExecutesDroppedUnknownStatement), 1);
    // A late answer to the probe given up on is not taken.
    framing_resumed(&mut h);
    assert_eq!(h.count(Counter::TestFramingResumed), 0);
    // intercept lost the stream again (restarted): a new probe may find it.
    framing_lost(&mut h);
    h.client_packet(0, &execute(1));
    assert_eq!(payloads(&mut h), vec![vec![0x09], execute(11)]);
    assert_eq!(h.count(Counter::ResyncProbes), 2);
    assert_eq!(h.abandoned, None);
}

#[test]
fn a_clients_own_statistics_request_spends_the_probe() {
    // Sent while blind: its answer could be taken for the probe's.
    let mut h = logged_in_with_statement();
    framing_lost(&mut h);
    h.client_packet(0, &[0x09]);
    h.client_packet(0, &execute(1));
    assert_eq!(payloads(&mut h), vec![vec![0x09], execute(11)]);
    assert_eq!(h.count(Counter::ResyncProbes), 0);

    // Sent while the probe is out: two answers on their way, the probe is given up.
    let mut h = logged_in_with_statement();
    framing_lost(&mut h);
    h.client_packet(0, &execute(1));
    h.client_packet(0, &[0x09]);
    assert_eq!(payloads(&mut h), vec![vec![0x09], execute(11), vec![0x09]]);
    assert_eq!(h.count(Counter::ResyncsFailed), 1);
    framing_resumed(&mut h);
    assert_eq!(h.count(Counter::TestFramingResumed), 0);
    assert_eq!(h.abandoned, None);
}
