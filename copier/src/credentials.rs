//! The passwords valid on the test server, one `user:password` per line, read from a file that
//! only its owner may read. The copier needs them to recompute each login against the test
//! server's own scramble.
//!
//! Passwords never leave this room in a printable form: `Debug` redacts them, and nothing here
//! logs.

use std::collections::HashMap;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

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
    /// Reads `path`. Refuses a file that group or others can read or write, as ssh does for keys.
    pub fn load(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot read --mysql-credentials {}", path.display()))?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            bail!(
                "--mysql-credentials {} is accessible by group or others (mode {:o}): it holds passwords; run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --mysql-credentials {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in --mysql-credentials {}", path.display()))
    }

    /// Parses `user:password` lines; blank lines and lines starting with `#` are skipped. The
    /// password is everything after the first colon (it may contain colons).
    pub fn parse(text: &str) -> Result<Self> {
        let mut by_user = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let Some((user, password)) = line.split_once(':') else {
                // Never echo the line: it may be a password pasted without its user.
                bail!("line {} is not `user:password`", n + 1);
            };
            // MySQL user names never carry edge spaces, so ` sbtest :pw` means `sbtest`; a
            // password is kept exactly as written (it may contain spaces).
            let user = user.trim();
            if user.is_empty() {
                bail!("line {} has an empty user name", n + 1);
            }
            if by_user
                .insert(user.to_string(), password.as_bytes().to_vec())
                .is_some()
            {
                bail!("user {user:?} appears twice (line {})", n + 1);
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

    #[test]
    fn group_readable_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("tsd-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("creds");
        std::fs::write(&path, "sbtest:sbtest\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = Credentials::load(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Credentials::load(&path).unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
