//! The documents that cite tests (`docs/SECURITY-CASES.md`,
//! `docs/THREAT-MODEL.md`) name only tests that exist: a moved or renamed
//! test must take its citations along, or a reader following one finds
//! nothing.
//!
//! A citation is a code span (in backquotes) that is a path to a Rust file in
//! the repository, optionally followed by `::` and a test function's name; a
//! name ending in `*` stands for every test whose name starts with what comes
//! before it.
//!
//! Every relative link in `README.md` and `docs/**/*.md` resolves, anchors
//! included, `docs/README.md` names every page of `docs/`, and
//! `docs/PERFORMANCE.md` stays a short reference (its dated sittings live in
//! `docs/performance/`).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The documents whose citations are checked.
const DOCS: [&str; 2] = ["docs/SECURITY-CASES.md", "docs/THREAT-MODEL.md"];

/// Where a cited file may live.
const ROOTS: [&str; 6] = [
    "src/",
    "tests/",
    "examples/",
    "benches/",
    "fuzz/",
    "crates/",
];

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

// ---- Links ----------------------------------------------------------------
//
// Every relative link in `README.md` and `docs/**/*.md` resolves: to a file
// or folder of the repository, and, when it names an anchor in a Markdown
// file, to a heading of that file (GitHub's anchors). `docs/README.md` is
// the entry point, so it names every page of `docs/`, and the index of the
// performance sittings names every sitting.

/// The Markdown files whose links are checked, relative to the root.
fn linked_documents(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if path.is_dir() {
                walk(&path, &format!("{rel}{name}/"), out);
            } else if name.ends_with(".md") {
                out.push(format!("{rel}{name}"));
            }
        }
    }
    let mut out = vec!["README.md".to_string()];
    walk(&root.join("docs"), "docs/", &mut out);
    out
}

/// `text` without its fenced code blocks and code spans, whose brackets
/// are code, not links.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the inline links (`[text](target)`, images too) in
/// `text`, in order, without a title.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_string());
        rest = &rest[end..];
    }
    out
}

/// GitHub's anchor of each heading of Markdown `text`: lowercased, spaces
/// as `-`, punctuation other than `-` and `_` dropped, a repeated anchor
/// numbered `-1`, `-2`, ...
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if fenced || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let seen = out
            .iter()
            .filter(|a| {
                **a == slug
                    || a.strip_prefix(&slug)
                        .and_then(|n| n.strip_prefix('-'))
                        .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        out.push(if seen == 0 {
            slug
        } else {
            format!("{slug}-{seen}")
        });
    }
    out
}

/// What is wrong with each relative link of `doc` (a path relative to
/// `root`, whose text is `text`), one line each.
fn broken_links(doc: &str, text: &str, root: &Path) -> Vec<String> {
    let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for target in link_targets(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let headings = if path.is_empty() {
            // An anchor in the page itself.
            anchors(text)
        } else {
            let file = root.join(dir).join(path);
            // A link may not leave the repository.
            let inside = file
                .canonicalize()
                .is_ok_and(|f| f.starts_with(root.canonicalize().unwrap()));
            if !inside {
                out.push(format!("{doc}: ({target}): no such file"));
                continue;
            }
            match file.extension() {
                Some(e) if e == "md" && anchor.is_some() => {
                    anchors(&std::fs::read_to_string(&file).unwrap())
                }
                _ => Vec::new(),
            }
        };
        let Some(anchor) = anchor else { continue };
        if !headings.iter().any(|h| h == anchor) {
            out.push(format!("{doc}: ({target}): no such heading"));
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in linked_documents(&root) {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        checked += link_targets(&text)
            .iter()
            .filter(|t| !t.contains("://"))
            .count();
        problems.extend(broken_links(&doc, &text, &root));
    }
    // Positive control: the links are found (a reader that found none
    // would pass vacuously).
    assert!(checked >= 100, "only {checked} relative links found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_link_check_finds_links_and_reports_broken_ones() {
    let root = root();
    let text = "See [design](DESIGN.md), [its model](DESIGN.md#8-performance-model), \
        [the index](performance/README.md#where-the-old-sections-went), [the code](../src/lib.rs), \
        [here](#a-heading) and ![a picture](screenshots/connect.png \"title\"); \
        [gone](NOPE.md), [no heading](DESIGN.md#no-such-heading), [out](../../etc/passwd), \
        [no anchor here](../src/lib.rs#x), [not here](#nowhere), [web](https://example.com/x.md). \
        Not links: `[code](NOPE.md)` and\n```\n[fenced](NOPE.md)\n```\n## A heading\n";
    assert_eq!(link_targets(text).len(), 12, "{:?}", link_targets(text));
    assert_eq!(
        broken_links("docs/t.md", text, &root),
        [
            "docs/t.md: (NOPE.md): no such file",
            "docs/t.md: (DESIGN.md#no-such-heading): no such heading",
            "docs/t.md: (../../etc/passwd): no such file",
            "docs/t.md: (../src/lib.rs#x): no such heading",
            "docs/t.md: (#nowhere): no such heading",
        ]
    );
    // GitHub's anchors: punctuation dropped, repeats numbered.
    assert_eq!(
        anchors("# A `code` title: (x)\n## Dup\n### Dup\n#no\n## 8. Performance model\n"),
        ["a-code-title-x", "dup", "dup-1", "8-performance-model"]
    );
}

/// The relative link targets of `text`, without anchors.
fn linked_paths(text: &str) -> Vec<String> {
    link_targets(text)
        .into_iter()
        .map(|t| t.split('#').next().unwrap_or("").to_string())
        .collect()
}

/// The entries (name, whether a folder) that `readme` does not link to:
/// a file by its name, a folder by anything under `name/`.
fn unnamed(entries: &[(String, bool)], readme: &str) -> Vec<String> {
    let linked = linked_paths(readme);
    let mut out: Vec<String> = entries
        .iter()
        .filter(|(name, dir)| {
            name != "README.md" && {
                if *dir {
                    !linked.iter().any(|l| l.starts_with(&format!("{name}/")))
                } else {
                    !linked.contains(name)
                }
            }
        })
        .map(|(name, _)| name.clone())
        .collect();
    out.sort();
    out
}

/// Every entry of the folder `dir` that its `README.md` does not link to.
fn unnamed_entries(root: &Path, dir: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(root.join(dir).join("README.md")).unwrap();
    let entries: Vec<(String, bool)> = std::fs::read_dir(root.join(dir))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            (name, path.is_dir())
        })
        .collect();
    unnamed(&entries, &readme)
        .into_iter()
        .map(|name| format!("{dir}/README.md does not link to {name}"))
        .collect()
}

#[test]
fn the_docs_entry_point_names_every_page_and_the_index_every_sitting() {
    let root = root();
    let mut problems = unnamed_entries(&root, "docs");
    problems.extend(unnamed_entries(&root, "docs/performance"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Positive control: the pages are there to be named (a folder read
    // as empty would pass vacuously), and an entry a README does not link
    // to is reported.
    let pages = std::fs::read_dir(root.join("docs")).unwrap().count();
    assert!(pages >= 14, "docs/ has {pages} entries");
    let sittings = std::fs::read_dir(root.join("docs/performance"))
        .unwrap()
        .count();
    assert!(sittings >= 20, "docs/performance/ has {sittings} entries");
    let entries = [
        ("README.md".to_string(), false),
        ("A.md".to_string(), false),
        ("B.md".to_string(), false),
        ("shots".to_string(), true),
        ("more".to_string(), true),
    ];
    let readme = "[a](A.md#x), [shots](shots/README.md), `[b](B.md)`, [more](more.md)";
    assert_eq!(unnamed(&entries, readme), ["B.md", "more"]);
}

#[test]
fn the_performance_reference_stays_short_and_the_readme_points_to_the_docs() {
    let root = root();
    let lines = std::fs::read_to_string(root.join("docs/PERFORMANCE.md"))
        .unwrap()
        .lines()
        .count();
    // The dated sittings go to docs/performance/, one file each.
    assert!(
        (100..260).contains(&lines),
        "docs/PERFORMANCE.md has {lines} lines"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let first = readme
        .find("](docs/README.md)")
        .expect("README links docs/README.md");
    assert!(
        first < readme.find("## Set-up").expect("README has its set-up"),
        "the README points to docs/README.md before its set-up"
    );
}
