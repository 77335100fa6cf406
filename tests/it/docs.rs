//! The documents that cite tests (`docs/SECURITY-CASES.md`,
//! `docs/THREAT-MODEL.md`) name only tests that exist: a moved or renamed
//! test must take its citations along, or a reader following one finds
//! nothing.
//!
//! A citation is a code span (in backquotes) that is a path to a Rust file in
//! the repository, optionally followed by `::` and a test function's name; a
//! name ending in `*` stands for every test whose name starts with what comes
//! before it.

use std::path::{Path, PathBuf};

/// The documents whose citations are checked.
const DOCS: [&str; 2] = ["docs/SECURITY-CASES.md", "docs/THREAT-MODEL.md"];

/// Where a cited file may live.
const ROOTS: [&str; 5] = ["src/", "tests/", "examples/", "benches/", "fuzz/"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A cited file, and the test in it if one is named.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Citation {
    file: String,
    test: Option<String>,
}

/// Every citation in `text`, in order.
fn citations(text: &str) -> Vec<Citation> {
    // Code spans: the text between a backquote and the next one.
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (file, test) = match span.split_once("::") {
                Some((f, t)) => (f, Some(t)),
                None => (span, None),
            };
            let is_path = ROOTS.iter().any(|r| file.starts_with(r))
                && file.ends_with(".rs")
                && file
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_/.-".contains(c));
            let test_ok = test.is_none_or(|t| {
                let t = t.strip_suffix('*').unwrap_or(t);
                !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            (is_path && test_ok).then(|| Citation {
                file: file.to_string(),
                test: test.map(str::to_string),
            })
        })
        .collect()
}

/// The names of the test functions in Rust `source`: functions whose
/// attributes just above them include `#[test]` or `#[tokio::test...]`.
fn test_functions(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut is_test = false;
    for line in source.lines().map(str::trim) {
        if line.starts_with("#[") {
            is_test |= line == "#[test]" || line.starts_with("#[tokio::test");
            continue;
        }
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        if is_test {
            let name = line
                .split_once("fn ")
                .map(|(_, rest)| rest)
                .and_then(|rest| rest.split(['(', '<']).next());
            if let Some(name) = name {
                out.push(name.trim().to_string());
            }
        }
        is_test = false;
    }
    out
}

/// What is wrong with each citation of `text` that does not resolve under
/// `root`, one line each.
fn unresolved(doc: &str, text: &str, root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for c in citations(text) {
        let Ok(source) = std::fs::read_to_string(root.join(&c.file)) else {
            out.push(format!("{doc}: `{}`: no such file", c.file));
            continue;
        };
        let Some(test) = &c.test else { continue };
        let tests = test_functions(&source);
        let found = match test.strip_suffix('*') {
            Some(prefix) => tests.iter().any(|t| t.starts_with(prefix)),
            None => tests.iter().any(|t| t == test),
        };
        if !found {
            out.push(format!("{doc}: `{}::{test}`: no such test", c.file));
        }
    }
    out
}

#[test]
fn every_test_the_docs_name_exists() {
    let root = root();
    let mut problems = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let cited = citations(&text);
        // Positive control: the reader finds the citations (a change of
        // format that hid them all would pass the check vacuously).
        assert!(
            cited.iter().filter(|c| c.test.is_some()).count() >= 10,
            "{doc}: found only {cited:?}"
        );
        problems.extend(unresolved(doc, &text, &root));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_finds_tests_and_reports_missing_ones() {
    let root = root();
    let text = "Covered by `tests/it/docs.rs::every_test_the_docs_name_exists`, \
        `tests/it/docs.rs::every_test_*`, `src/lib.rs`; not by \
        `tests/it/docs.rs::no_such_test`, `tests/it/docs.rs::citations` (not a \
        test), `tests/it/nowhere.rs` or `tests/it/nowhere.rs::x`. Not \
        citations: `cargo test`, `docs/DESIGN.md`, `a::b`.";
    assert_eq!(citations(text).len(), 7, "{:?}", citations(text));
    assert_eq!(
        unresolved("t", text, &root),
        [
            "t: `tests/it/docs.rs::no_such_test`: no such test",
            "t: `tests/it/docs.rs::citations`: no such test",
            "t: `tests/it/nowhere.rs`: no such file",
            "t: `tests/it/nowhere.rs`: no such file",
        ]
    );
    // Tests of every flavour are found, and helpers are not tests.
    let source = "#[test]\nfn a() {}\n\n#[tokio::test(flavor = \"multi_thread\")]\n\
        #[ignore]\nasync fn b() {}\n\nfn helper() {}\n\n/// Doc.\n#[test]\n// why\npub fn c<T>() {}\n";
    assert_eq!(test_functions(source), ["a", "b", "c"]);
}
