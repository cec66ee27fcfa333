//! `report.json`: the model pretty-printed, and read back with a schema check (for
//! `report diff` and users' tools). Reading never trusts the file: anything that is not an
//! object with our `schema` is refused with a reason, never a panic.

use std::path::Path;

use super::{Report, ReportError, SCHEMA};

/// The report as pretty-printed JSON (ends with a newline).
pub fn to_json(r: &Report) -> String {
    // Serialising plain structs of numbers, strings and maps with integer keys cannot fail;
    // the fallback only keeps this path panic-free should the model ever grow a map with
    // non-string keys serde_json refuses.
    let mut s = serde_json::to_string_pretty(r)
        .unwrap_or_else(|e| format!("{{\"schema\":\"{SCHEMA}\",\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// A report from JSON text: refuses text that is not a JSON object with a `schema` field,
/// and any schema but [`SCHEMA`].
pub fn from_json(text: &str) -> Result<Report, ReportError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| ReportError::NotAReport(format!("not valid JSON ({e})")))?;
    let Some(obj) = value.as_object() else {
        return Err(ReportError::NotAReport(
            "the JSON is not an object".to_string(),
        ));
    };
    match obj.get("schema").and_then(|s| s.as_str()) {
        None => {
            return Err(ReportError::NotAReport(
                "no \"schema\" field (is this a report.json written by the copier?)".to_string(),
            ))
        }
        Some(s) if s != SCHEMA => {
            return Err(ReportError::Schema {
                found: s.to_string(),
            })
        }
        Some(_) => {}
    }
    serde_json::from_value(value)
        .map_err(|e| ReportError::NotAReport(format!("schema {SCHEMA} but {e}")))
}

/// Reads and checks a `report.json` file.
pub fn read_report(path: &Path) -> Result<Report, ReportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_json(&text).map_err(|e| match e {
        ReportError::NotAReport(why) => {
            ReportError::NotAReport(format!("{}: {why}", path.display()))
        }
        ReportError::Schema { found } => ReportError::NotAReport(format!(
            "{}: schema {found:?}, this copier reads {SCHEMA:?}",
            path.display()
        )),
        e => e,
    })
}
