//! The Prometheus text exposition format, version 0.0.4: `# HELP`, `# TYPE`, then samples
//! `name{label="value",...} value`, every family's samples together.

use std::fmt::Write as _;

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Builds one exposition. Call [`family`](Self::family) once per metric name, then its
/// samples; the caller keeps a family's samples together (the format requires it).
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// `# HELP` and `# TYPE` lines of a family.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of an integer value (counters, most gauges).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.name_labels(name, labels);
        let _ = writeln!(self.out, " {value}");
    }

    /// One sample of a real value (seconds, ratios); NaN and infinities as the format spells
    /// them.
    pub fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.name_labels(name, labels);
        if value.is_nan() {
            self.out.push_str(" NaN\n");
        } else if value.is_infinite() {
            self.out
                .push_str(if value > 0.0 { " +Inf\n" } else { " -Inf\n" });
        } else {
            let _ = writeln!(self.out, " {value}");
        }
    }

    /// A family with a single unlabelled counter.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, Kind::Counter, help);
        self.sample(name, &[], value);
    }

    /// A family with a single unlabelled gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, Kind::Gauge, help);
        self.sample(name, &[], value);
    }

    /// A family of counters, one per label set.
    pub fn counters<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, u64)>,
    ) {
        self.family(name, Kind::Counter, help);
        for (labels, v) in samples {
            self.sample(name, &labels, v);
        }
    }

    pub fn finish(self) -> String {
        self.out
    }

    fn name_labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.out.push_str(name);
        if labels.is_empty() {
            return;
        }
        self.out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(k);
            self.out.push_str("=\"");
            escape_label_into(&mut self.out, v);
            self.out.push('"');
        }
        self.out.push('}');
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Label values may hold anything (a query fingerprint): backslash, quote and newline are
/// escaped as the format says; other control characters become spaces so a line stays a line.
fn escape_label_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
}

/// One parsed sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses an exposition (comments skipped; no timestamps expected). For tests and tools: it
/// accepts what [`Exposition`] writes and the format's label escapes, and says which line it
/// could not read.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).ok_or_else(|| format!("line {}: {line:?}", no + 1))?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let consumed;
        loop {
            // key
            let start = chars.peek()?.0;
            let mut end = start;
            while let Some(&(i, c)) = chars.peek() {
                if c == '=' || c == '}' {
                    end = i;
                    break;
                }
                chars.next();
            }
            let (i, c) = chars.next()?;
            if c == '}' {
                consumed = i + 1;
                break;
            }
            let key = r[start..end].trim_start_matches(',').trim().to_string();
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut val = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => val.push('\n'),
                        c => val.push(c),
                    },
                    c => val.push(c),
                }
            }
            labels.push((key, val));
            match chars.peek()?.1 {
                ',' => {
                    chars.next();
                }
                '}' => {}
                _ => return None,
            }
        }
        rest = &r[consumed..];
    }
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_parses_back() {
        let mut e = Exposition::new();
        e.counter("x_total", "Things.\nMore", 7);
        e.family("y", Kind::Gauge, "Y");
        e.sample("y", &[("a", "q\"u\\o\nte"), ("b", "")], 3);
        e.sample_f64("y", &[("a", "inf")], f64::INFINITY);
        e.sample_f64("y", &[("a", "half")], 0.5);
        let text = e.finish();
        assert!(text.contains("# HELP x_total Things.\\nMore\n# TYPE x_total counter\nx_total 7\n"));
        assert!(
            text.contains("y{a=\"q\\\"u\\\\o\\nte\",b=\"\"} 3\n"),
            "{text}"
        );
        let s = parse(&text).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "x_total");
        assert_eq!(s[0].value, 7.0);
        assert_eq!(s[1].label("a"), Some("q\"u\\o\nte"));
        assert_eq!(s[1].label("b"), Some(""));
        assert_eq!(s[2].value, f64::INFINITY);
        assert_eq!(s[3].value, 0.5);
    }

    #[test]
    fn control_characters_do_not_break_lines() {
        let mut e = Exposition::new();
        e.family("z", Kind::Gauge, "Z");
        e.sample("z", &[("q", "a\rb\u{1b}c")], 1);
        let text = e.finish();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert_eq!(parse(&text).unwrap()[0].label("q"), Some("a b c"));
    }

    #[test]
    fn bad_lines_are_reported() {
        assert!(parse("x{a=\"b\" 1").is_err());
        assert!(parse("x notanumber").is_err());
        assert!(parse("{a=\"b\"} 1").is_err());
        assert!(parse("# only a comment\n\n").unwrap().is_empty());
    }
}
