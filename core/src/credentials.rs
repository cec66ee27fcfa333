//! The passwords valid on the test server, one `user:password` per line. The MySQL layer needs
//! them to recompute each login against the test server's own scramble; reading them from a
//! file (and refusing one others may read) is the copier's edge (`copier::credentials::load`).
//!
//! Passwords never leave this room in a printable form: `Debug` redacts them, errors never
//! quote a line, and nothing here logs.

use std::collections::HashMap;
use std::fmt;

/// Why a credentials file was refused. Never quotes the line: it may be a password pasted
/// without its user.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    #[error("line {0} is not `user:password`")]
    NotUserPassword(usize),
    #[error("line {0} has an empty user name")]
    EmptyUser(usize),
    #[error("user {user:?} appears twice (line {line})")]
    Duplicate { user: String, line: usize },
}

/// Users and their test-server passwords.
#[derive(Clone, Default)]
pub struct Credentials {
    by_user: HashMap<String, Vec<u8>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut users: Vec<&str> = self.by_user.keys().map(String::as_str).collect();
        users.sort_unstable();
        f.debug_struct("Credentials")
            .field("users", &users)
            .field("passwords", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Parses `user:password` lines; blank lines and lines starting with `#` are skipped. The
    /// password is everything after the first colon (it may contain colons).
    pub fn parse(text: &str) -> Result<Self, CredentialsError> {
        let mut by_user = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let Some((user, password)) = line.split_once(':') else {
                return Err(CredentialsError::NotUserPassword(n + 1));
            };
            // MySQL user names never carry edge spaces, so ` sbtest :pw` means `sbtest`; a
            // password is kept exactly as written (it may contain spaces).
            let user = user.trim();
            if user.is_empty() {
                return Err(CredentialsError::EmptyUser(n + 1));
            }
            if by_user
                .insert(user.to_string(), password.as_bytes().to_vec())
                .is_some()
            {
                return Err(CredentialsError::Duplicate {
                    user: user.to_string(),
                    line: n + 1,
                });
            }
        }
        Ok(Self { by_user })
    }

    pub fn password(&self, user: &str) -> Option<&[u8]> {
        self.by_user.get(user).map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.by_user.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_user.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_users_and_keeps_colons_in_passwords() {
        let c =
            Credentials::parse("# test server\n sbtest :sbtest\n\napp:a:b:c\nempty:\n").unwrap();
        assert_eq!(c.password("sbtest"), Some(&b"sbtest"[..]));
        assert_eq!(c.password("app"), Some(&b"a:b:c"[..]));
        assert_eq!(c.password("empty"), Some(&b""[..]));
        assert_eq!(c.password("nobody"), None);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn bad_lines_are_errors_that_do_not_echo_them() {
        let e = Credentials::parse("sbtest:x\nhunter2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && !e.contains("hunter2"), "{e}");
        assert!(Credentials::parse(":pw\n").is_err());
        assert!(Credentials::parse("a:1\na:2\n").is_err());
    }

    #[test]
    fn debug_redacts_passwords() {
        let c = Credentials::parse("sbtest:s3cret\n").unwrap();
        let d = format!("{c:?}");
        assert!(d.contains("sbtest") && !d.contains("s3cret"), "{d}");
    }
}
