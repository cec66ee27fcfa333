//! Doctor (0x05) and DoctorReport (0x86): `copier doctor` asking intercept to check its side of
//! the path, and the findings. Sent only on a doctor's own connection, never by a running copier.
//!
//! Both carry peer-chosen counts and strings: never reserve more than the body could hold, and
//! never accept more ARP targets, checks or longer details than the limits below.

use std::net::Ipv4Addr;

use super::codec::{check_len, truncate_utf8, Reader};
use super::frame::frame;
use super::{ty, DecodeError, EncodeError};

/// Most addresses one Doctor query asks intercept to ARP for.
pub const MAX_DOCTOR_ARP: usize = 1024;
/// Most checks in one DoctorReport.
pub const MAX_DOCTOR_CHECKS: usize = 256;
/// Longest check name, in bytes of UTF-8.
pub const MAX_CHECK_NAME_LEN: usize = 255;
/// Longest check detail, in bytes of UTF-8.
pub const MAX_CHECK_DETAIL_LEN: usize = 4096;

/// `copier doctor` asks intercept to check its side of the path (never sent by a running
/// copier). intercept answers with a [`DoctorReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorQuery {
    /// The test server: intercept checks the segment it reaches it on.
    pub target: Ipv4Addr,
    /// Mirrored client addresses to ask ARP for on that segment (at most [`MAX_DOCTOR_ARP`]).
    pub arp: Vec<ArpTarget>,
}

/// An address the doctor wants ARP-checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpTarget {
    pub addr: Ipv4Addr,
    /// From `--client-ip-pool`: no host should own it. Otherwise a real client's address,
    /// which the client itself may rightly answer for.
    pub pool: bool,
}

impl DoctorQuery {
    /// target(4) count(2) (addr(4) kind(1)) × count
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let target = Ipv4Addr::from(r.array::<4>()?);
        let count = usize::from(r.u16()?);
        if count > MAX_DOCTOR_ARP {
            return Err(r.invalid("more ARP targets than a Doctor query may carry"));
        }
        let mut arp = Vec::with_capacity(count.min(r.remaining() / 5));
        for _ in 0..count {
            let addr = Ipv4Addr::from(r.array::<4>()?);
            let pool = r.bool("ARP target kind is not 0 or 1")?;
            arp.push(ArpTarget { addr, pool });
        }
        Ok(DoctorQuery { target, arp })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        check_len("ARP target list", self.arp.len(), MAX_DOCTOR_ARP)?;
        o.extend_from_slice(&self.target.octets());
        o.extend_from_slice(&(self.arp.len() as u16).to_be_bytes());
        for a in &self.arp {
            o.extend_from_slice(&a.addr.octets());
            o.push(u8::from(a.pool));
        }
        Ok(())
    }
}

/// Appends a Doctor frame; at most [`MAX_DOCTOR_ARP`] ARP targets.
pub fn encode_doctor(q: &DoctorQuery, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::DOCTOR, |o| q.emit(o))
}

/// One finding of intercept's doctor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorCheck {
    /// 0 ok, 1 warn, 2 fail.
    pub level: u8,
    /// At most [`MAX_CHECK_NAME_LEN`] bytes.
    pub name: String,
    /// At most [`MAX_CHECK_DETAIL_LEN`] bytes.
    pub detail: String,
}

impl DoctorCheck {
    /// A check; name and detail are cut to their limits so that it always encodes.
    pub fn new(level: u8, name: &str, detail: &str) -> Self {
        DoctorCheck {
            level: level.min(2),
            name: truncate_utf8(name, MAX_CHECK_NAME_LEN).to_owned(),
            detail: truncate_utf8(detail, MAX_CHECK_DETAIL_LEN).to_owned(),
        }
    }
}

/// intercept's answer to a [`DoctorQuery`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorReport {
    /// intercept's wall clock, milliseconds since the Unix epoch (for a clock-skew check).
    pub unix_ms: u64,
    /// At most [`MAX_DOCTOR_CHECKS`].
    pub checks: Vec<DoctorCheck>,
}

impl DoctorReport {
    /// unix_ms(8) count(2) (level(1) name_len(1) name detail_len(2) detail) × count
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let unix_ms = r.u64()?;
        let count = usize::from(r.u16()?);
        if count > MAX_DOCTOR_CHECKS {
            return Err(r.invalid("more checks than a DoctorReport may carry"));
        }
        let mut checks = Vec::with_capacity(count.min(r.remaining() / 4));
        for _ in 0..count {
            let level = r.u8()?;
            if level > 2 {
                return Err(r.invalid("check level is not 0, 1 or 2"));
            }
            let name_len = usize::from(r.u8()?);
            let name = r.string(name_len)?;
            let detail_len = usize::from(r.u16()?);
            if detail_len > MAX_CHECK_DETAIL_LEN {
                return Err(r.invalid("check detail longer than 4096 bytes"));
            }
            let detail = r.string(detail_len)?;
            checks.push(DoctorCheck {
                level,
                name,
                detail,
            });
        }
        Ok(DoctorReport { unix_ms, checks })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        check_len("check list", self.checks.len(), MAX_DOCTOR_CHECKS)?;
        for c in &self.checks {
            check_len("check name", c.name.len(), MAX_CHECK_NAME_LEN)?;
            check_len("check detail", c.detail.len(), MAX_CHECK_DETAIL_LEN)?;
            check_len("check level", usize::from(c.level), 2)?;
        }
        o.extend_from_slice(&self.unix_ms.to_be_bytes());
        o.extend_from_slice(&(self.checks.len() as u16).to_be_bytes());
        for c in &self.checks {
            o.push(c.level);
            o.push(c.name.len() as u8);
            o.extend_from_slice(c.name.as_bytes());
            o.extend_from_slice(&(c.detail.len() as u16).to_be_bytes());
            o.extend_from_slice(c.detail.as_bytes());
        }
        Ok(())
    }
}

/// Appends a DoctorReport frame.
pub fn encode_doctor_report(d: &DoctorReport, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::DOCTOR_REPORT, |o| d.emit(o))
}

#[cfg(test)]
mod tests {
    use super::super::tests::decode_all;
    use super::super::{CopierMessage, InterceptMessage};
    use super::*;

    #[test]
    fn doctor_layouts_are_as_documented() {
        let mut out = Vec::new();
        let q = DoctorQuery {
            target: Ipv4Addr::new(198, 18, 0, 3),
            arp: vec![ArpTarget {
                addr: Ipv4Addr::new(198, 19, 0, 7),
                pool: true,
            }],
        };
        encode_doctor(&q, &mut out).unwrap();
        assert_eq!(
            out,
            [0, 0, 0, 12, 0x05, 198, 18, 0, 3, 0, 1, 198, 19, 0, 7, 1]
        );
        assert_eq!(
            decode_all::<CopierMessage>(&out).unwrap(),
            [CopierMessage::Doctor(q)]
        );
        let mut out = Vec::new();
        let r = DoctorReport {
            unix_ms: 1,
            checks: vec![DoctorCheck::new(2, "ip", "x")],
        };
        encode_doctor_report(&r, &mut out).unwrap();
        assert_eq!(
            out,
            [0, 0, 0, 18, 0x86, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 2, 2, b'i', b'p', 0, 1, b'x']
        );
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::DoctorReport(r)]
        );
        let bad_level = DoctorReport {
            unix_ms: 0,
            checks: vec![DoctorCheck {
                level: 3,
                name: String::new(),
                detail: String::new(),
            }],
        };
        assert!(encode_doctor_report(&bad_level, &mut Vec::new()).is_err());
        // A check too long for the wire is cut, not refused.
        let long = DoctorCheck::new(9, &"n".repeat(300), &"é".repeat(3000));
        assert_eq!((long.level, long.name.len()), (2, MAX_CHECK_NAME_LEN));
        assert!(long.detail.len() <= MAX_CHECK_DETAIL_LEN);
    }
}
