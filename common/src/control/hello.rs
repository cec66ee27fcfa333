//! Hello (0x01) and Reject (0x82): the first frame each side sends, and the two whose layouts
//! are frozen across every protocol version, so that peers of different versions can always
//! tell each other why they cannot talk. Also the magic + version prefix that Hello, Challenge,
//! Welcome and Reject bodies start with.
//!
//! Never change these layouts, and never bump anything here without bumping
//! [`PROTOCOL_VERSION`]: an old peer must still read a new peer's Reject.

use super::codec::{check_len, truncate_utf8, Reader};
use super::frame::frame;
use super::{ty, DecodeError, EncodeError, MAX_NAME_LEN, PROTOCOL_VERSION};

/// First bytes of every Hello, Welcome and Reject body: a stray client (an HTTP probe, a MySQL
/// client pointed at the wrong port) fails on them instead of being half-understood.
pub const MAGIC: [u8; 4] = *b"TSHD";
/// Longest Reject reason, in bytes of UTF-8.
pub const MAX_REASON_LEN: usize = 1024;

/// Appends magic and `version`: the first six bytes of every handshake body.
pub(super) fn emit_magic_version(version: u16, o: &mut Vec<u8>) {
    o.extend_from_slice(&MAGIC);
    o.extend_from_slice(&version.to_be_bytes());
}

/// Reads magic and a version that must be ours.
pub(super) fn parse_magic_version(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    if r.bytes(4)? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let theirs = r.u16()?;
    if theirs != PROTOCOL_VERSION {
        return Err(DecodeError::VersionMismatch {
            theirs,
            ours: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

/// Sent by a copier as its first frame. intercept answers with a [`Challenge`] (or a
/// [`Reject`] when the version differs or the copier's address is not welcome).
///
/// [`Challenge`]: super::Challenge
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    /// Who this copier is, for intercept's logs (e.g. "copier@prod-1").
    pub name: String,
    /// Feature bits the copier asks for (`FEATURE_*`); intercept grants a subset in its
    /// Welcome.
    pub features: u32,
}

impl Hello {
    /// A Hello of this build's protocol version; the name is cut to [`MAX_NAME_LEN`] bytes.
    pub fn new(name: &str) -> Self {
        Hello {
            version: PROTOCOL_VERSION,
            name: truncate_utf8(name, MAX_NAME_LEN).to_owned(),
            features: 0,
        }
    }

    /// The same Hello asking for `features` too.
    pub fn with_features(mut self, features: u32) -> Self {
        self.features |= features;
        self
    }

    /// magic(4) version(2) name_len(1) name features(4)
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        parse_magic_version(r)?;
        let name_len = usize::from(r.u8()?);
        let name = r.string(name_len)?;
        let features = r.u32()?;
        Ok(Hello {
            version: PROTOCOL_VERSION,
            name,
            features,
        })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        check_len("copier name", self.name.len(), MAX_NAME_LEN)?;
        emit_magic_version(self.version, o);
        o.push(self.name.len() as u8);
        o.extend_from_slice(self.name.as_bytes());
        o.extend_from_slice(&self.features.to_be_bytes());
        Ok(())
    }
}

/// Appends a Hello frame.
pub fn encode_hello(h: &Hello, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::HELLO, |o| h.emit(o))
}

/// Intercept's answer to a refused Hello, just before it closes the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    /// The rejecting intercept's protocol version.
    pub version: u16,
    /// What went wrong and how to fix it, for a person.
    pub reason: String,
}

impl Reject {
    /// A Reject from this build; the reason is cut to [`MAX_REASON_LEN`] bytes.
    pub fn new(reason: &str) -> Self {
        Reject {
            version: PROTOCOL_VERSION,
            reason: truncate_utf8(reason, MAX_REASON_LEN).to_owned(),
        }
    }

    /// magic(4) version(2) reason_len(2) reason
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        // Read whatever the rejecter's version is: this layout never changes.
        if r.bytes(4)? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u16()?;
        let len = usize::from(r.u16()?);
        let reason = r.string(len)?;
        Ok(Reject { version, reason })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        check_len("reject reason", self.reason.len(), MAX_REASON_LEN)?;
        emit_magic_version(self.version, o);
        o.extend_from_slice(&(self.reason.len() as u16).to_be_bytes());
        o.extend_from_slice(self.reason.as_bytes());
        Ok(())
    }
}

/// Appends a Reject frame.
pub fn encode_reject(j: &Reject, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::REJECT, |o| j.emit(o))
}

#[cfg(test)]
mod tests {
    use super::super::tests::decode_all;
    use super::super::{CopierMessage, InterceptMessage, FEATURE_PAYLOAD_HASHES};
    use super::*;

    #[test]
    fn hello_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_hello(
            &Hello::new("c1").with_features(FEATURE_PAYLOAD_HASHES),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            [
                0, 0, 0, 14, // length: type + 13-byte body
                0x01, b'T', b'S', b'H', b'D', 0, 6, // type, magic, version
                2, b'c', b'1', // name
                0, 0, 0, 1, // features
            ]
        );
        assert_eq!(
            decode_all::<CopierMessage>(&out).unwrap(),
            [CopierMessage::Hello(
                Hello::new("c1").with_features(FEATURE_PAYLOAD_HASHES)
            )]
        );
    }

    #[test]
    fn reject_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_reject(
            &Reject {
                version: 2,
                reason: "no".into(),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            [
                0, 0, 0, 11, // length: type + 10-byte body
                0x82, b'T', b'S', b'H', b'D', 0, 2, // type, magic, version
                0, 2, b'n', b'o', // reason
            ]
        );
    }

    #[test]
    fn other_versions_are_refused_with_both_numbers() {
        let mut out = Vec::new();
        let h = Hello {
            version: 7,
            ..Hello::new("old")
        };
        encode_hello(&h, &mut out).unwrap();
        let err = decode_all::<CopierMessage>(&out).unwrap_err();
        assert_eq!(
            err,
            DecodeError::VersionMismatch {
                theirs: 7,
                ours: PROTOCOL_VERSION
            }
        );
        assert!(err.to_string().contains("same tcpshadow release"));
    }

    #[test]
    fn reject_of_any_version_is_readable() {
        let mut out = Vec::new();
        let j = Reject {
            version: 9,
            reason: "bad token".into(),
        };
        encode_reject(&j, &mut out).unwrap();
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Reject(j)]
        );
    }
}
