//! Finding the test server's reply stream again after intercept lost it.
//!
//! intercept frames a connection's replies from its SYN-ACK; once it has lost them (it was
//! restarted, or bytes went missing that no retransmission brings back) nothing in the stream
//! says where a MySQL packet starts. Without framing a session is *blind*: its commands still
//! go to the test server, but nothing is compared, and statements prepared from then on cannot
//! be paired with the test server's ids, so their executes are lost.
//!
//! The copier ends that by asking a question whose answer is recognisable: a COM_STATISTICS,
//! sent in front of a client command. Its answer is the one MySQL reply that is a bare string
//! starting `Uptime: ` (see `intercept::sessions::statistics_reply_end`), and the server answers
//! commands in order, so the byte after it starts the reply to the first command sent after
//! the probe. intercept frames again from there (`FramingResumed`); if it never lost the
//! stream (the copier missed events on the way), the copier finds the answer among the packets
//! itself. Either way the replies owed from then on are exactly the commands expected since
//! the probe.
//!
//! One probe per loss of framing: a second one could be answered after the first, and the
//! two answers cannot be told apart. The probe costs the test server one COM_STATISTICS
//! (counted in no `Com_*` status variable) per lost session.
//!
//! What this room must never do: send a probe inside a client command (only where
//! `flush_injections` may send), or take a client's own COM_STATISTICS for the probe's answer
//! (a client that sends one while the session is blind spends the probe).

use std::time::Duration;

use common::mysql::command::com;
use common::mysql::packet::HEADER_LEN;

/// The probe: COM_STATISTICS, sequence id 0.
pub(super) const PROBE: [u8; HEADER_LEN + 1] = [1, 0, 0, 0, com::STATISTICS];

/// How long the probe's answer may take. The test server answers it after everything sent
/// before it, so this bounds how far behind it may be when intercept comes back.
pub(super) const RESYNC_WAIT: Duration = Duration::from_secs(10);

/// Whether a framed packet (id, payload length, first payload bytes) is a COM_STATISTICS
/// answer: the first packet of a reply (id 1) whose payload starts `Uptime: `. An OK, ERR,
/// EOF or result set's first packet starts with another byte, so with real packet boundaries
/// this cannot be anything else.
pub(super) fn is_probe_answer(seq_id: u8, len: u32, head: &[u8], continuation: bool) -> bool {
    const MARK: &[u8] = b"Uptime: ";
    !continuation && seq_id == 1 && len as usize >= MARK.len() && head.starts_with(MARK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_packet_of_a_statistics_answer_is_the_probes() {
        let head = b"Uptime: 84  Threads: 9";
        assert!(is_probe_answer(1, 120, head, false));
        assert!(!is_probe_answer(2, 120, head, false));
        assert!(!is_probe_answer(1, 120, head, true));
        assert!(!is_probe_answer(1, 120, b"\x00\x00\x00\x02\x00", false));
        assert!(!is_probe_answer(1, 4, b"Upti", false));
    }
}
