//! The reference pages, `docs/CONFIGURATION.md` and `docs/OPERATIONS.md`,
//! against the code they describe: the config keys the parser accepts, the
//! metrics the registry holds and the audit event types, in both directions;
//! the log lines OPERATIONS quotes against the calls that write them, and
//! its troubleshooting messages against what the binary prints.
//! Each test also mutates the page it read and shows that the check then
//! fails, so a check that cannot fail is caught here too.
// The helpers the tests call panic on a broken fixture, as the tests do
// (clippy's allow-unwrap-in-tests covers only the #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod configuration;
mod operations;
mod troubleshooting;

use std::path::PathBuf;

/// The text of `docs/NAME`.
pub(crate) fn read_doc(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of every Markdown table in `text` whose header row starts with
/// the cells `header`, each row as its trimmed cells.
pub(crate) fn table_rows(text: &str, header: &[&str]) -> Vec<Vec<String>> {
    let cells = |line: &str| -> Vec<String> {
        let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split('|').map(|c| c.trim().to_string()).collect()
    };
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if !line.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        let row = cells(line);
        if row
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        if row.len() >= header.len() && row.iter().zip(header).all(|(c, h)| c == h) {
            in_table = true;
            continue;
        }
        if in_table {
            rows.push(row);
        }
    }
    rows
}

/// The content of `cell` if it is one code span and nothing else.
pub(crate) fn only_code(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}
