//! Keys reserved for features not built yet: named once (issue 38), so the
//! features of one wave fill them in without changing the lists' shape,
//! and refused by the loaders until then, with a message naming the file,
//! the key and the issue, never "unknown key" (the key is not a typo).
//!
//! Each loader keeps its own list ([`crate::infra::config::RESERVED_KEYS`],
//! [`crate::derive::policy::RESERVED_KEYS`]); a feature that implements a
//! key takes it out of its list and adds it to the raw structs (the doc
//! tests refuse a key that is both accepted and reserved).

use std::path::Path;

use crate::infra::diagnostics::{key_at, Problem};

/// One reserved key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedKey {
    /// Its dotted path as the docs write it: `clock.max_skew`,
    /// `upstreams.<name>.issuer` (`<...>`: any key of a table of tables),
    /// `trusted_issuers[].introspection_endpoint` (`[]`: any element of
    /// an array of tables).
    pub key: &'static str,
    /// Its type as the docs write it (`string`, `duration`, `boolean`, ...).
    pub doc_type: &'static str,
    /// The issue whose feature implements it.
    pub issue: u32,
}

impl ReservedKey {
    /// The loaders' message for it.
    pub fn message(&self) -> String {
        format!("reserved: not yet implemented (issue {})", self.issue)
    }
}

/// One step of a key path in the file.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// Whether `path` (a key path in the file) is `pattern` (a reserved key).
fn matches(pattern: &str, path: &[Step]) -> bool {
    let mut want: Vec<Option<&str>> = Vec::new(); // None: an array index
    for seg in pattern.split('.') {
        match seg.strip_suffix("[]") {
            Some(array) => {
                want.push(Some(array));
                want.push(None);
            }
            None => want.push(Some(seg)),
        }
    }
    want.len() == path.len()
        && want.iter().zip(path).all(|(w, p)| match (w, p) {
            (None, Step::Index(_)) => true,
            (Some(w), Step::Key(k)) => (w.starts_with('<') && w.ends_with('>')) || w == k,
            _ => false,
        })
}

/// `path` as the loaders name keys: `a.b`, `a[0].b`, `a."https://x".b`
/// (`quote`), or unquoted to find it in the text.
fn display(path: &[Step], quote: bool) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let bare = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare || !quote {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
        }
    }
    out
}

fn walk(
    value: &toml::Value,
    path: &mut Vec<Step>,
    found: &mut Vec<(String, String, ReservedKey)>,
    list: &[ReservedKey],
) {
    if !path.is_empty() {
        if let Some(r) = list.iter().find(|r| matches(r.key, path)) {
            found.push((display(path, true), display(path, false), *r));
            return;
        }
    }
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                path.push(Step::Key(k.clone()));
                walk(v, path, found, list);
                path.pop();
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                path.push(Step::Index(i));
                walk(v, path, found, list);
                path.pop();
            }
        }
        _ => {}
    }
}

/// A problem for each key of `text` that `list` reserves, placed at the
/// key. Text that is not TOML gives none (the parser reports it).
pub(crate) fn reserved_problems(file: &Path, text: &str, list: &[ReservedKey]) -> Vec<Problem> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    walk(
        &toml::Value::Table(table),
        &mut Vec::new(),
        &mut found,
        list,
    );
    found
        .into_iter()
        .map(|(key, lookup, r)| Problem {
            at: key_at(file, text, &lookup),
            key: Some(key),
            message: r.message(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &[ReservedKey] = &[
        ReservedKey {
            key: "clock.max_skew",
            doc_type: "duration",
            issue: 40,
        },
        ReservedKey {
            key: "upstreams.<name>.resources.<uri>.audience",
            doc_type: "array of strings",
            issue: 41,
        },
        ReservedKey {
            key: "trusted_issuers[].introspection_endpoint",
            doc_type: "URL",
            issue: 43,
        },
    ];

    #[test]
    fn each_reserved_key_is_found_where_it_is_and_nothing_else() {
        let text = r#"
agent = "a"
max_skew = "4s"

[clock]
max_skew = "4s"
warn_skew = "2s"

[upstreams.acme.resources."https://api.example/x"]
audience = ["x"]

[[trusted_issuers]]
issuer = "https://id.example"

[[trusted_issuers]]
issuer = "https://id2.example"
introspection_endpoint = "https://id2.example/introspect"
"#;
        let p = reserved_problems(Path::new("c.toml"), text, LIST);
        let got: Vec<(String, String, String)> = p
            .iter()
            .map(|p| (p.at.clone(), p.key.clone().unwrap(), p.message.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "c.toml:6:1".to_string(),
                    "clock.max_skew".to_string(),
                    "reserved: not yet implemented (issue 40)".to_string()
                ),
                (
                    "c.toml:17:1".to_string(),
                    "trusted_issuers[1].introspection_endpoint".to_string(),
                    "reserved: not yet implemented (issue 43)".to_string()
                ),
                (
                    "c.toml:10:1".to_string(),
                    "upstreams.acme.resources.\"https://api.example/x\".audience".to_string(),
                    "reserved: not yet implemented (issue 41)".to_string()
                ),
            ]
        );
        assert_eq!(
            p[0].to_string(),
            "c.toml:6:1: clock.max_skew: reserved: not yet implemented (issue 40)"
        );
        // The control: none of them, nothing found (and not TOML: nothing).
        let plain = "agent = \"a\"\n[clock]\nwarn_skew = \"2s\"\n";
        assert!(reserved_problems(Path::new("c.toml"), plain, LIST).is_empty());
        assert!(reserved_problems(Path::new("c.toml"), "[clock", LIST).is_empty());
    }
}
