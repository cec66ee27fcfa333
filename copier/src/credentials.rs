//! Reads `--mysql-credentials`: the file I/O and permission check around
//! [`tcpshadow_core::credentials::Credentials`], which parses and holds the passwords.
//!
//! Passwords never leave this room in a printable form, and nothing here logs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

pub use tcpshadow_core::credentials::Credentials;

/// Reads `path`. Refuses a file that group or others can read or write, as ssh does for keys.
pub fn load(path: &Path) -> Result<Credentials> {
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
    Credentials::parse(&text).with_context(|| format!("in --mysql-credentials {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_readable_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("tsd-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("creds");
        std::fs::write(&path, "sbtest:sbtest\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&path).unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
