//! Diagnostics for the TOML files (config, policy, policy cases): the
//! [`Problem`] every loader reports, the one place that turns a key path,
//! a table key or a byte offset into `file:line:column`, and the redaction
//! that keeps a value written in the file out of every message.
//!
//! A leaf: the config and the policy both report through it, so neither
//! needs the other.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;

/// One problem in a config or policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `file:line:column` when known, else the file.
    pub at: String,
    /// The key path (`dpop.replay_capacity`), when known.
    pub key: Option<String>,
    /// What is wrong, without the value.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(k) => write!(f, "{}: {}: {}", self.at, k, self.message),
            None => write!(f, "{}: {}", self.at, self.message),
        }
    }
}

/// Converts a byte offset into 1-based `line:column`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Where byte `offset` of `text` is, as `file:line:column`.
pub(crate) fn offset_at(file: &Path, text: &str, offset: usize) -> String {
    let (l, c) = line_col(text, offset);
    format!("{}:{l}:{c}", file.display())
}

/// Removes quoted values from a TOML/serde message, so that an error never
/// echoes what was written in the file. serde quotes values in backticks
/// too (``invalid type: integer `5` ``, ``unknown variant `x` ``); those are
/// removed as well, except in messages that name a key (``missing field
/// `agent` ``).
pub(crate) fn redact_values(msg: &str) -> String {
    let names_a_key = [
        "missing field",
        "duplicate field",
        "duplicate key",
        "unknown field",
    ]
    .iter()
    .any(|p| msg.starts_with(p));
    let mut out = String::with_capacity(msg.len());
    let mut in_quote = None;
    let mut chars = msg.chars();
    while let Some(c) = chars.next() {
        let quote = c == '"' || (c == '`' && !names_a_key);
        match in_quote {
            // serde shows strings with Debug escapes: `\"` does not close.
            Some('"') if c == '\\' => {
                chars.next();
            }
            None if quote => {
                out.push(c);
                out.push('…');
                out.push(c);
                in_quote = Some(c);
            }
            None => out.push(c),
            Some(q) if q == c => in_quote = None,
            Some(_) => {}
        }
    }
    // Keep only the first line: toml renders a snippet of the file after it.
    out.lines().next().unwrap_or_default().trim().to_string()
}

/// Parses TOML text into `T`, collecting unknown keys and type errors as
/// problems with positions.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, Vec<Problem>> {
    let de = match toml::de::Deserializer::parse(text) {
        Ok(d) => d,
        Err(e) => return Err(vec![toml_problem(file, text, &e)]),
    };
    let mut unknown: Vec<String> = Vec::new();
    // serde_path_to_error names the key of a value of the wrong type or
    // range (`limits.max_connections`), which toml's own error leaves out.
    let parsed: Result<T, serde_path_to_error::Error<_>> = {
        let mut record = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(de, &mut record))
    };
    let mut problems: Vec<Problem> = unknown
        .into_iter()
        .map(|k| Problem {
            at: key_at(file, text, &k),
            key: Some(k),
            message: "unknown key".into(),
        })
        .collect();
    match parsed {
        Ok(v) if problems.is_empty() => Ok(v),
        Ok(_) => Err(problems),
        Err(e) => {
            let path = e.path().to_string();
            let mut problem = toml_problem(file, text, e.inner());
            // `.` is the path of the document itself (an error with no key).
            if path != "." && !path.is_empty() {
                problem.key = Some(path);
            }
            problems.push(problem);
            Err(problems)
        }
    }
}

fn toml_problem(file: &Path, text: &str, e: &toml::de::Error) -> Problem {
    let at = match e.span() {
        Some(span) => offset_at(file, text, span.start),
        None => file.display().to_string(),
    };
    Problem {
        at,
        key: None,
        message: redact_values(e.message()),
    }
}

/// A TOML key as written (`a."b.c"`) -> its dotted path (`a.b.c`), the form
/// `serde_ignored` reports.
fn dotted(key: &str) -> String {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for c in key.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '.' => parts.push(std::mem::take(&mut cur).trim().to_string()),
            None => cur.push(c),
        }
    }
    parts.push(cur.trim().to_string());
    parts.join(".")
}

/// Best-effort position of a key path (`socket.path`,
/// `trusted_issuers[1].issuer`, `trusted_issuers.1.issuer`) in the text, as
/// `file:line:column`: table headers and array-of-tables indexes are
/// followed, so a key is not confused with one of the same name in another
/// table. Falls back to the closest enclosing table or key, then to the file.
pub(crate) fn key_at(file: &Path, text: &str, path: &str) -> String {
    match find_key(text, path) {
        Some((l, c)) => format!("{}:{l}:{c}", file.display()),
        None => file.display().to_string(),
    }
}

/// Where the top-level key `key` (before any table header) starts in
/// `text`, as `file:line:column`; the start of the file if not found.
pub(crate) fn top_key_at(file: &Path, text: &str, key: &str) -> String {
    let (l, c) = find_key(text, key).unwrap_or((1, 1));
    format!("{}:{l}:{c}", file.display())
}

/// The one key finder behind [`key_at`] and [`top_key_at`]: the 1-based
/// `(line, column)` of a dotted key path, or of its closest enclosing table
/// or key.
fn find_key(text: &str, path: &str) -> Option<(usize, usize)> {
    let target = path.replace('[', ".").replace(']', "");
    let mut table = String::new();
    let mut arrays: HashMap<String, usize> = HashMap::new();
    let mut best: Option<(usize, usize, usize)> = None;
    let join = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}.{b}")
        }
    };
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let col = line.len() - t.len() + 1;
        let (found, rest) = if let Some(h) = t.strip_prefix("[[") {
            let name = dotted(h.split("]]").next().unwrap_or(""));
            let n = arrays.entry(name.clone()).or_insert(0);
            table = format!("{name}.{n}");
            *n += 1;
            (table.clone(), "")
        } else if let Some(h) = t.strip_prefix('[') {
            table = dotted(h.split(']').next().unwrap_or(""));
            (table.clone(), "")
        } else if let Some((k, rest)) = t.split_once('=').filter(|_| !t.starts_with('#')) {
            (join(&table, &dotted(k)), rest)
        } else {
            continue;
        };
        if found == target {
            return Some((i + 1, col));
        }
        let Some(sub) = target.strip_prefix(&format!("{found}.")) else {
            continue;
        };
        // A key inside an inline table on this line: `sign_in = { kind = .. }`.
        let inner = sub.split('.').next().unwrap_or(sub);
        let in_line = rest.match_indices(inner).find(|(at, _)| {
            let before = rest[..*at].trim_end();
            let after = rest[at + inner.len()..].trim_start();
            (before.ends_with('{') || before.ends_with(',')) && after.starts_with('=')
        });
        if let Some((at, _)) = in_line {
            return Some((i + 1, line.len() - rest.len() + at + 1));
        }
        if best.is_none_or(|(len, _, _)| found.len() > len) {
            best = Some((found.len(), i + 1, col));
        }
    }
    best.map(|(_, l, c)| (l, c))
}

/// The span of a table key such as `[tools."mail.read"]` (or a dotted key
/// `tools."mail.read".x`) in the text; the start of the file if not found.
/// Map keys carry no span through serde, so they are found in the text: by
/// the usual spellings first, then by parsing each table header, which also
/// finds keys written with escapes or single quotes.
pub(crate) fn key_span(text: &str, table: &str, key: &str) -> Range<usize> {
    let quoted = format!("{table}.\"{key}\"");
    let bare = format!("{table}.{key}");
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        for cand in [&quoted, &bare] {
            if let Some(rest) = t
                .strip_prefix('[')
                .and_then(|r| r.strip_prefix(cand.as_str()))
            {
                if rest.starts_with(']') || rest.starts_with('.') {
                    let start = offset + indent + 1;
                    return start..start + cand.len();
                }
            }
        }
        offset += line.len();
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if t.starts_with('[') && !t.starts_with("[[") {
            // A header line alone is a TOML document: `[a."b"]` -> {a: {b: {}}}.
            if let Ok(doc) = toml::from_str::<toml::Table>(t) {
                let found = doc
                    .get(table)
                    .and_then(toml::Value::as_table)
                    .is_some_and(|tbl| tbl.contains_key(key));
                if found {
                    let start = offset + indent + 1;
                    return start..start + 1;
                }
            }
        }
        offset += line.len();
    }
    0..0
}

/// Where `[table."key"]` starts in `text`, as `file:line:column`.
pub(crate) fn table_at(file: &Path, text: &str, table: &str, key: &str) -> String {
    offset_at(file, text, key_span(text, table, key).start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_lines_and_characters() {
        let t = "ab\ncdé\nf";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 2), (1, 3));
        assert_eq!(line_col(t, 3), (2, 1));
        assert_eq!(line_col(t, 7), (2, 4)); // after the two-byte é
        assert_eq!(line_col(t, 8), (3, 1));
        assert_eq!(line_col(t, 9), (3, 2));
        assert_eq!(line_col(t, 1000), (3, 2));
    }

    #[test]
    fn redact_values_strips_quoted_text_and_snippets() {
        let r = redact_values(
            "invalid type: string \"CANARY\", expected usize\n  |\n3 | x = \"CANARY\"",
        );
        assert_eq!(r, "invalid type: string \"…\", expected usize");
        let r = redact_values(r#"invalid type: string "a\"CANARY\\", expected usize"#);
        assert_eq!(r, "invalid type: string \"…\", expected usize");
    }
}
