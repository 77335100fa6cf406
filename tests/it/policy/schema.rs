//! `proto/policy.schema.json` checked by an independent validator (Python's
//! `tomllib` and the PyPI `jsonschema` package, through
//! `tests/peers/validate_policy_schema.py`), and checked to agree with the
//! loader on what is valid: on every fixture, every example, the quick-start
//! policy, and a generated matrix of names, scopes, lifetimes and URIs.
//!
//! Needs `.venv/bin/python` (>= 3.11) with `jsonschema`, which
//! `scripts/install-test-deps` installs there (never in the system Python).
// Test helpers panic loudly, like the tests they serve (clippy.toml allows
// unwrap/expect in #[test] functions only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use credbroker::internals::policy::Policy;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

const INSTALL: &str =
    "run scripts/install-test-deps (it installs the PyPI package jsonschema into .venv, for python3 >= 3.11)";

/// The schema's verdict on each file: valid, and the errors if not.
fn schema_verdicts(files: &[PathBuf]) -> BTreeMap<PathBuf, (bool, Vec<String>)> {
    let py = crate::support::prereq::venv_python(&["jsonschema"], "");
    let out = Command::new(&py)
        .arg(repo("tests/peers/validate_policy_schema.py"))
        .arg(repo("proto/policy.schema.json"))
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): {INSTALL}", py.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(3) => panic!("the schema validator is missing a dependency: {stderr}\n{INSTALL}"),
        other => panic!("the schema validator failed ({other:?}): {stderr}"),
    }
    let mut v = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let r: serde_json::Value =
            serde_json::from_str(line).expect("validator output is JSON lines");
        let errors = r["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect();
        v.insert(
            PathBuf::from(r["file"].as_str().unwrap()),
            (r["valid"].as_bool().unwrap(), errors),
        );
    }
    assert_eq!(v.len(), files.len(), "one verdict per file");
    v
}

/// The loader's verdict on a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loader {
    Valid,
    /// Refused by the loader, with an error containing this text (the
    /// reason the fixture is named after, not just any refusal).
    Invalid(&'static str),
    /// Valid once the `service` source exists; until then refused only for
    /// it (see [`needs_connected_services`]).
    ValidWithConnectedServices,
}

/// Whether every loader problem is about the pending `service` source.
fn needs_connected_services(err: &str) -> bool {
    err.lines().all(|l| {
        l.ends_with(".service: unknown key")
            || l.ends_with(".delivery: unknown key")
            || l.contains("source \"service\" is not available yet")
    })
}

fn loader_agrees(path: &Path, expect: Loader) -> Result<(), String> {
    match (Policy::load(path), expect) {
        (Ok(_), Loader::Valid | Loader::ValidWithConnectedServices) => Ok(()),
        (Err(e), Loader::Invalid(reason)) => {
            let e = e.to_string();
            if e.contains(reason) {
                Ok(())
            } else {
                Err(format!(
                    "the loader refuses it, but not for {reason:?}: {e}"
                ))
            }
        }
        (Err(e), Loader::ValidWithConnectedServices)
            if needs_connected_services(&e.to_string()) =>
        {
            Ok(())
        }
        (Ok(_), Loader::Invalid(_)) => Err("the loader accepts it".into()),
        (Err(e), _) => Err(format!("the loader refuses it: {e}")),
    }
}

use Loader::*;

/// Every fixture: what the loader and the schema must say, and, where they
/// differ, why (a schema cannot see across keys or parse a URI for real).
const FIXTURES: &[(&str, Loader, bool, &str)] = &[
    ("declared_steps_and_ttls", Valid, true, ""),
    ("approval_tools_with_declared_details", Valid, true, ""),
    (
        "approval_per_step_without_ttl",
        Invalid("needs approval_ttl"),
        false,
        "",
    ),
    (
        "approval_detail_field_nested",
        Invalid("no nested objects"),
        false,
        "",
    ),
    (
        "approval_on_provider_token",
        Invalid("cannot apply to a resource with delivery = \"provider_token\""),
        true,
        "a schema cannot see the tool's resource's delivery from the tool",
    ),
    ("frozen_policy", Valid, true, ""),
    ("loopback_http_resource", Valid, true, ""),
    ("minimal_agent_only", Valid, true, ""),
    ("non_ascii_tool_name", Valid, true, ""),
    ("tool_resource_in_other_spelling", Valid, true, ""),
    (
        "default_allow_key_is_refused",
        Invalid("default: unknown key"),
        false,
        "",
    ),
    ("empty_file", Invalid("the policy is empty"), false, ""),
    (
        "exchange_source",
        Invalid("an exchange resource must name its authorization server"),
        false,
        "",
    ),
    ("frozen_as_string", Invalid("expected a boolean"), false, ""),
    ("missing_agent", Invalid("missing field `agent`"), false, ""),
    (
        "misspelled_scopes_key",
        Invalid("tools.t.scope: unknown key"),
        false,
        "",
    ),
    ("not_utf8", Invalid("the file is not UTF-8"), false, ""),
    (
        "plain_http_to_remote_host",
        Invalid("must be https (http only on loopback)"),
        false,
        "",
    ),
    (
        "relative_resource",
        Invalid("not an absolute URI"),
        false,
        "",
    ),
    (
        "resource_with_dot_segments",
        Invalid("contains dot segments"),
        false,
        "",
    ),
    (
        "resource_with_encoded_dots",
        Invalid("contains dot segments"),
        false,
        "",
    ),
    (
        "resource_with_fragment",
        Invalid("has a fragment"),
        false,
        "",
    ),
    ("resource_with_query", Invalid("has a query"), false, ""),
    ("resource_with_userinfo", Invalid("has userinfo"), false, ""),
    (
        "scope_listed_twice",
        Invalid("scope listed twice"),
        false,
        "",
    ),
    (
        "scope_with_space",
        Invalid("a scope must be a non-empty token"),
        false,
        "",
    ),
    (
        "self_source_with_delivery",
        Invalid("only a resource with source = \"service\" takes this key"),
        false,
        "",
    ),
    (
        "service_source_without_delivery",
        Invalid("a service resource must say how the token reaches the tool"),
        false,
        "",
    ),
    (
        "step_name_with_space",
        Invalid("step names must not contain spaces"),
        false,
        "",
    ),
    (
        "steps_declared_empty",
        Invalid("steps: declares no step"),
        false,
        "",
    ),
    (
        "tool_name_with_nul",
        Invalid("tool names must not contain spaces or control characters"),
        false,
        "",
    ),
    (
        "tool_name_with_trailing_space",
        Invalid("tool names must not contain spaces or control characters"),
        false,
        "",
    ),
    ("tool_with_empty_steps", Invalid("lists no step"), false, ""),
    (
        "tool_without_steps",
        Invalid("missing field `steps`"),
        false,
        "",
    ),
    (
        "ttl_in_hours",
        Invalid("must be a whole number of seconds or minutes"),
        false,
        "",
    ),
    (
        "ttl_longer_than_five_minutes",
        Invalid("is longer than the 300s maximum"),
        false,
        "",
    ),
    (
        "ttl_six_minutes",
        Invalid("is longer than the 300s maximum"),
        false,
        "",
    ),
    (
        "ttl_subsecond",
        Invalid("must be a whole number of seconds or minutes"),
        false,
        "",
    ),
    (
        "ttl_with_leading_zero",
        Invalid("must be a whole number of seconds or minutes"),
        false,
        "",
    ),
    (
        "ttl_zero",
        Invalid("must be a whole number of seconds or minutes"),
        false,
        "",
    ),
    (
        "unterminated_string",
        Invalid("invalid basic string"),
        false,
        "",
    ),
    (
        "tool_resource_not_declared",
        Invalid("names a resource that is not declared under [resources]"),
        true,
        "a schema cannot check that a tool's resource is declared under resources",
    ),
    (
        "resource_declared_twice_after_normalisation",
        Invalid("the same resource is declared twice"),
        true,
        "a schema cannot compare URIs after RFC 3986 normalisation",
    ),
];

#[test]
fn every_fixture_is_in_the_table() {
    let dir = repo("tests/fixtures/policy");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FIXTURES.iter().map(|f| f.0.to_string()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "each fixture needs a row in FIXTURES (and each row a file)"
    );
}

#[test]
fn loader_and_schema_agree_on_the_fixtures() {
    let files: Vec<PathBuf> = FIXTURES
        .iter()
        .map(|f| repo(&format!("tests/fixtures/policy/{}.toml", f.0)))
        .collect();
    let verdicts = schema_verdicts(&files);
    let mut wrong = Vec::new();
    for ((name, loader, schema, why), path) in FIXTURES.iter().zip(&files) {
        let (valid, errors) = &verdicts[path];
        if valid != schema {
            wrong.push(format!(
                "{name}: schema says valid={valid}, expected {schema}; {errors:?}"
            ));
        }
        if let Err(e) = loader_agrees(path, *loader) {
            wrong.push(format!("{name}: expected {loader:?}, but {e}"));
        }
        let loader_valid = !matches!(loader, Invalid(_));
        if loader_valid != *schema {
            // Differences are allowed only where the loader is the stricter
            // one, and only with a reason.
            assert!(
                *schema && !loader_valid && !why.is_empty(),
                "{name}: an unexplained difference"
            );
        } else {
            assert!(
                why.is_empty(),
                "{name}: a reason for a difference that is not there"
            );
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn examples_and_quickstart_policy_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    let quick = dir.path().join("quickstart.toml");
    std::fs::write(&quick, credbroker::internals::cli::QUICKSTART_POLICY).unwrap();
    // The policy `credbroker quickstart` writes: with the demo tool.
    let with_demo = dir.path().join("quickstart-demo.toml");
    std::fs::write(
        &with_demo,
        format!(
            "{}{}",
            credbroker::internals::cli::QUICKSTART_POLICY,
            credbroker::internals::cli::demo_policy("http://127.0.0.1:8440")
        ),
    )
    .unwrap();
    let mut files = vec![quick, with_demo];
    for e in std::fs::read_dir(repo("policy/examples")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".toml") && !name.ends_with(".cases.toml") {
            files.push(p);
        }
    }
    assert!(
        files.len() >= 5,
        "the three examples and the quick start's two: {files:?}"
    );
    let verdicts = schema_verdicts(&files);
    for f in &files {
        let (valid, errors) = &verdicts[f];
        assert!(valid, "{}: {errors:?}", f.display());
        let text = std::fs::read_to_string(f).unwrap();
        let expect = if text.contains("REQUIRES the connected-services feature") {
            ValidWithConnectedServices
        } else {
            Valid
        };
        if let Err(e) = loader_agrees(f, expect) {
            panic!("{}: {e}", f.display());
        }
    }
}

/// A TOML basic string for any text (control characters escaped).
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Generated policies, each varying one value; the loader and the schema
/// must agree on every one, except the listed URIs a schema cannot judge.
#[test]
fn loader_and_schema_agree_on_generated_values() {
    let long = |c: &str, n: usize| c.repeat(n);
    let names: Vec<String> = [
        "a",
        "mail.send",
        "github.read_repo",
        "*",
        "é",
        "mail.s\u{0435}nd",
        "a\u{200b}b",
        "",
        " a",
        "a ",
        "a\tb",
        "a\u{0}b",
        "a\u{7f}b",
        "a\u{85}b",
        "a\u{a0}b",
        "a\u{2028}b",
        "a\u{3000}b",
        "a\u{1680}b",
        "a\u{9f}b",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        long("x", 256),
        long("x", 257),
        long("é", 256),
        long("é", 257),
    ])
    .collect();
    let scopes: Vec<String> = [
        "repo",
        "mail.send",
        "read:org",
        "!",
        "~",
        "a\"b",
        "a\\b",
        "a b",
        "é",
        "",
        "a\u{0}",
        "a\u{7f}",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([long("s", 256), long("s", 257)])
    .collect();
    let ttls = [
        "1s", "9s", "10s", "99s", "100s", "299s", "300s", "1m", "5m", "301s", "400s", "999s", "0s",
        "00s", "060s", "6m", "0m", "1h", "500ms", "60", "s", "", " 60s", "60s ", "+60s", "1e2s",
        "30000s",
    ];
    let uris: Vec<String> = [
        "https://api.example/",
        "https://api.example",
        "HTTPS://API.Example:443/v1",
        "https://api.example/a/..b",
        "https://api.example/...",
        "https://api.example/%41",
        "https://[2001:db8::1]/x",
        "http://localhost:8080/x",
        "http://LOCALHOST/x",
        "http://127.0.0.1/x",
        "http://127.10.20.30:9/x",
        "http://[::1]:9/x",
        "http://api.example/",
        "http://10.0.0.1/",
        "ftp://api.example/",
        "https:api.example/",
        "https:///api.example/",
        "https://api.example/a/../b",
        "https://api.example/./b",
        "https://api.example/a/.",
        "https://api.example/%2E/b",
        "https://api.example/a%2fb",
        "https://api.example/a%5Cb",
        "https://api.example/a%00",
        "https://api.example/a\\b",
        "https://api.example/a b",
        "https://api.example/\u{e9}",
        "https://\u{430}pi.example/",
        "https://u:p@api.example/",
        "https://api.example/?q",
        "https://api.example/#f",
        "/api",
        "api.example",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("https://api.example/{}", long("a", 2100))])
    .collect();
    // URIs whose validity only a real URI parser can judge.
    let schema_cannot_judge: &[&str] = &["https://api.example:99999/"];

    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(PathBuf, String)> = Vec::new();
    let mut add = |what: String, text: String| {
        let p = dir.path().join(format!("{}.toml", cases.len()));
        std::fs::write(&p, text).unwrap();
        cases.push((p, what));
    };
    const RES: &str = "[resources.\"https://api.example/\"]\nsource = \"self\"\n";
    for n in &names {
        add(format!("agent {n:?}"), format!("agent = {}\n", toml_str(n)));
        add(
            format!("tool {n:?}"),
            format!("agent = \"a\"\n{RES}[tools.{}]\nresource = \"https://api.example/\"\nsteps = [\"s\"]\n", toml_str(n)),
        );
        add(
            format!("step {n:?}"),
            format!("agent = \"a\"\n{RES}[tools.t]\nresource = \"https://api.example/\"\nsteps = [{}]\n", toml_str(n)),
        );
        add(
            format!("declared step {n:?}"),
            format!("agent = \"a\"\nsteps = [{}]\n", toml_str(n)),
        );
    }
    for s in &scopes {
        add(
            format!("scope {s:?}"),
            format!(
                "agent = \"a\"\n{RES}[tools.t]\nresource = \"https://api.example/\"\nscopes = [{}]\nsteps = [\"s\"]\n",
                toml_str(s)
            ),
        );
    }
    for t in ttls {
        add(
            format!("resource ttl {t:?}"),
            format!("agent = \"a\"\n[resources.\"https://api.example/\"]\nsource = \"self\"\nttl = {}\n", toml_str(t)),
        );
        add(
            format!("tool ttl {t:?}"),
            format!("agent = \"a\"\n{RES}[tools.t]\nresource = \"https://api.example/\"\nsteps = [\"s\"]\nttl = {}\n", toml_str(t)),
        );
    }
    for u in uris
        .iter()
        .map(String::as_str)
        .chain(schema_cannot_judge.iter().copied())
    {
        add(
            format!("resource {u:?}"),
            format!(
                "agent = \"a\"\n[resources.{}]\nsource = \"self\"\n",
                toml_str(u)
            ),
        );
    }
    let files: Vec<PathBuf> = cases.iter().map(|c| c.0.clone()).collect();
    let verdicts = schema_verdicts(&files);
    let mut disagreements = Vec::new();
    let (mut valid, mut invalid) = (0, 0);
    for (path, what) in &cases {
        let loader = Policy::load(path);
        let (schema, errors) = &verdicts[path];
        let cannot_judge = schema_cannot_judge
            .iter()
            .any(|u| what == &format!("resource {u:?}"));
        if cannot_judge {
            assert!(
                *schema && loader.is_err(),
                "{what}: expected schema-valid, loader-invalid"
            );
            continue;
        }
        if loader.is_ok() {
            valid += 1;
        } else {
            invalid += 1;
        }
        if loader.is_ok() != *schema {
            disagreements.push(format!(
                "{what}: loader {}, schema {}",
                loader
                    .map(|_| "valid".to_string())
                    .unwrap_or_else(|e| format!("invalid ({e})")),
                if *schema {
                    "valid".to_string()
                } else {
                    format!("invalid {errors:?}")
                }
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    // The matrix exercises both sides.
    assert!(
        valid >= 30 && invalid >= 60,
        "valid {valid}, invalid {invalid}"
    );
}
