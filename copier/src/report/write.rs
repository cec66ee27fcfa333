//! Writes `report.txt`, `report.json` and `report.html` into a directory. Each file is
//! written to a temporary name in the same directory, synced, then renamed over the old one,
//! so a reader (a browser refreshing, a script polling `report.json` during a run with
//! `--report-interval`) never sees a half-written file.

use std::io::Write as _;
use std::path::Path;

use super::{html, json, text, Report, ReportError};

/// Renders `r` and writes the three files into `dir` (created if missing).
pub fn write_report(dir: &Path, r: &Report) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    write_atomic(dir, "report.json", json::to_json(r).as_bytes())?;
    write_atomic(dir, "report.txt", text::render_text(r, None).as_bytes())?;
    write_atomic(dir, "report.html", html::render_html(r).as_bytes())?;
    Ok(())
}

fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ReportError> {
    let path = dir.join(name);
    // The pid keeps two copiers writing to one directory from clobbering each other's
    // temporary file (the last rename still wins, whole).
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ReportError::Io { path: p, source }
    };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&tmp)(e));
    }
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(&path)(e)
    })
}
