//! Prompt (0x07): a copier tells intercept whether one of its sessions waits on the test
//! server (`FEATURE_PROMPT_ON_DEMAND`).
//!
//! While it is on, intercept's capture gathers replies for at most 1 ms before it relays
//! them; while it is off, for `--relay-flush-us` (4 ms), which costs a copier whose
//! sessions wait on nothing (their commands are with the test server) no fidelity and saves
//! both daemons wakeups. One
//! byte, 0 or 1: anything else is refused, so a later version can give it a meaning.

use super::codec::Reader;
use super::frame::frame;
use super::{ty, DecodeError, EncodeError};

/// on(1)
pub(super) fn parse_prompt(r: &mut Reader<'_>) -> Result<bool, DecodeError> {
    r.bool("prompt is not 0 or 1")
}

/// Appends a Prompt frame.
pub fn encode_prompt(on: bool, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::PROMPT, |o| {
        o.push(u8::from(on));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::decode_all;
    use super::super::CopierMessage;
    use super::*;

    #[test]
    fn prompt_layout_is_as_documented() {
        for (on, byte) in [(false, 0), (true, 1)] {
            let mut out = Vec::new();
            encode_prompt(on, &mut out).unwrap();
            assert_eq!(out, [0, 0, 0, 2, 0x07, byte]);
            assert_eq!(
                decode_all::<CopierMessage>(&out).unwrap(),
                [CopierMessage::Prompt(on)]
            );
        }
    }

    #[test]
    fn a_prompt_neither_0_nor_1_or_of_another_length_is_refused() {
        assert!(matches!(
            decode_all::<CopierMessage>(&[0, 0, 0, 2, 0x07, 2]),
            Err(DecodeError::Invalid { ty: 0x07, .. })
        ));
        assert!(decode_all::<CopierMessage>(&[0, 0, 0, 1, 0x07]).is_err());
        assert!(matches!(
            decode_all::<CopierMessage>(&[0, 0, 0, 3, 0x07, 1, 0]),
            Err(DecodeError::TrailingBytes { ty: 0x07, extra: 1 })
        ));
    }
}
