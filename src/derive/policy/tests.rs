use super::*;
use crate::base::grammar::valid_scope_token;
use crate::infra::diagnostics::line_col;

const FILE: &str = "/etc/credbroker/policy.toml";

/// A valid policy; tests change one thing at a time.
const BASE: &str = r#"agent = "repo-helper"

[resources."https://api.example/notes"]
source = "self"
ttl = "120s"

[resources."https://mail.example/"]
source = "self"

[tools."notes.read"]
resource = "https://api.example/notes"
scopes = ["notes:read", "notes:list"]
steps = ["answer_question", "summarize"]

[tools."mail.send"]
resource = "https://mail.example/"
scopes = ["mail:send"]
steps = ["send_report"]
ttl = "60s"
"#;

const NOTES: &str = "https://api.example/notes";
const MAIL: &str = "https://mail.example/";

fn load(text: &str) -> Result<Policy, PolicyError> {
    Policy::parse(Path::new(FILE), text.as_bytes())
}

fn policy() -> Policy {
    load(BASE).unwrap()
}

/// The problems of a policy that must be refused.
fn problems(bytes: &[u8]) -> Vec<Problem> {
    match Policy::parse(Path::new(FILE), bytes) {
        Ok(_) => panic!("accepted:\n{}", String::from_utf8_lossy(bytes)),
        Err(PolicyError::Invalid(p)) => p,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn problem_for<'p>(p: &'p [Problem], key: &str) -> &'p Problem {
    p.iter()
        .find(|x| x.key.as_deref() == Some(key))
        .unwrap_or_else(|| panic!("no problem for {key} in {p:#?}"))
}

fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from}");
    text.replacen(from, to, 1)
}

/// `file:line:col` of the first occurrence of `needle` in `text`.
fn at(text: &str, needle: &str) -> String {
    let offset = text.find(needle).unwrap_or_else(|| panic!("{needle}"));
    let (l, c) = line_col(text, offset);
    format!("{FILE}:{l}:{c}")
}

/// Decides a request whose resource is given raw, as on the wire: it goes
/// through `canonical_resource` first, as the exchange does. `None` if the
/// resource itself is refused.
fn decide_raw(
    p: &Policy,
    step: &str,
    tool: &str,
    resource: &str,
    scope: Option<&[&str]>,
) -> Option<Decision> {
    let canonical = canonical_resource(resource).ok()?;
    let scope: Option<Vec<String>> = scope.map(|s| s.iter().map(|x| x.to_string()).collect());
    Some(p.decide(&Request {
        step,
        tool,
        resource: &canonical,
        scope: scope.as_deref(),
    }))
}

fn decide(p: &Policy, step: &str, tool: &str, resource: &str) -> Decision {
    decide_raw(p, step, tool, resource, None).expect("resource is canonicalisable")
}

fn allowed(d: Decision) -> Grant {
    match d {
        Decision::Allow(g) => g,
        Decision::Deny(r) => panic!("denied: {}", r.as_str()),
    }
}

fn assert_allowed(p: &Policy, step: &str, tool: &str, resource: &str) -> Grant {
    allowed(decide(p, step, tool, resource))
}

// ----------------------------------------------------------------- loader

#[test]
fn valid_policy_loads() {
    let p = policy();
    assert_eq!(p.agent, "repo-helper");
    assert!(!p.frozen);
    assert_eq!(p.hash, crate::base::jose::sha256_hex(BASE.as_bytes()));
    assert_eq!(p.resources.len(), 2);
    assert_eq!(p.tools.len(), 2);
    let r = &p.resources[NOTES];
    assert_eq!(
        (r.id.as_str(), r.source.clone(), r.ttl),
        (NOTES, Source::SelfIssued, Duration::from_secs(120))
    );
    assert_eq!(p.resources[MAIL].ttl, MAX_TTL);
    let t = &p.tools["notes.read"];
    assert_eq!(t.resource, NOTES);
    assert_eq!(
        t.scopes.iter().collect::<Vec<_>>(),
        ["notes:list", "notes:read"]
    );
    assert_eq!(
        t.steps.iter().collect::<Vec<_>>(),
        ["answer_question", "summarize"]
    );
    assert_eq!(t.ttl, None);
    assert_eq!(p.tools["mail.send"].ttl, Some(Duration::from_secs(60)));
}

#[test]
fn bad_ttl_is_reported_at_its_value() {
    for (ttl, message) in [
        ("5 minutes", "must be a whole number"),
        ("0s", "must be a whole number"),
        ("300", "must be a whole number"),
        ("301s", "longer than the 300s maximum"),
        ("6m", "longer than the 300s maximum"),
    ] {
        let text = replace(BASE, "ttl = \"120s\"", &format!("ttl = \"{ttl}\""));
        let p = problems(text.as_bytes());
        assert_eq!(p.len(), 1, "{p:#?}");
        let x = problem_for(&p, "resources.\"https://api.example/notes\".ttl");
        assert!(x.message.contains(message), "{ttl}: {x:?}");
        assert_eq!(x.at, at(&text, &format!("\"{ttl}\"")), "{ttl}");
        // The same rule for a tool's ttl.
        let text = replace(BASE, "ttl = \"60s\"", &format!("ttl = \"{ttl}\""));
        let p = problems(text.as_bytes());
        let x = problem_for(&p, "tools.\"mail.send\".ttl");
        assert_eq!(x.at, at(&text, &format!("\"{ttl}\"")), "{ttl}");
    }
    let text = replace(BASE, "ttl = \"120s\"", "ttl = \"300s\"");
    assert_eq!(load(&text).unwrap().resources[NOTES].ttl, MAX_TTL);
}

#[test]
fn tool_naming_an_undeclared_resource_is_reported() {
    let text = replace(
        BASE,
        "resource = \"https://mail.example/\"",
        "resource = \"https://mail.example/other\"",
    );
    let p = problems(text.as_bytes());
    assert_eq!(p.len(), 1, "{p:#?}");
    let x = problem_for(&p, "tools.\"mail.send\".resource");
    assert!(x.message.contains("not declared"), "{x:?}");
    assert_eq!(x.at, at(&text, "\"https://mail.example/other\""));
    // Naming it in another spelling of the same canonical URI is fine.
    let text = replace(
        BASE,
        "resource = \"https://mail.example/\"",
        "resource = \"HTTPS://Mail.Example:443\"",
    );
    assert_eq!(load(&text).unwrap().tools["mail.send"].resource, MAIL);
}

#[test]
fn unusable_resource_uri_is_reported_at_its_key() {
    for bad in [
        "http://api.example/notes",
        "https://api.example/notes?x=1",
        "https://api.example/../notes",
    ] {
        let text = BASE.replace("https://api.example/notes", bad);
        let p = problems(text.as_bytes());
        let x = problem_for(&p, &format!("resources.\"{bad}\""));
        assert!(x.message.contains("not a usable resource URI"), "{x:?}");
        assert_eq!(x.at, at(&text, &format!("resources.\"{bad}\"")), "{bad}");
    }
    // Declared twice after normalisation.
    let text =
        format!("{BASE}\n[resources.\"HTTPS://API.example:443/notes\"]\nsource = \"self\"\n");
    let p = problems(text.as_bytes());
    assert!(
        p.iter().any(|x| x.message.contains("declared twice")),
        "{p:#?}"
    );
    policy();
}

#[test]
fn bad_scope_tokens_are_reported() {
    for (scopes, message) in [
        (r#"["notes read"]"#, "scope must be"),
        (r#"[""]"#, "scope must be"),
        (r#"["notes\"read"]"#, "scope must be"),
        (r#"["notes\\read"]"#, "scope must be"),
        (r#"["notés"]"#, "scope must be"),
        (r#"["notes:read", "notes:read"]"#, "listed twice"),
    ] {
        let text = replace(BASE, r#"["notes:read", "notes:list"]"#, scopes);
        let p = problems(text.as_bytes());
        let x = problem_for(&p, "tools.\"notes.read\".scopes");
        assert!(x.message.contains(message), "{scopes}: {x:?}");
        assert!(x.at.starts_with(&format!("{FILE}:12:")), "{scopes}: {x:?}");
    }
    policy();
}

#[test]
fn tool_with_no_step_is_reported() {
    let text = replace(BASE, r#"steps = ["send_report"]"#, "steps = []");
    let p = problems(text.as_bytes());
    let x = problem_for(&p, "tools.\"mail.send\".steps");
    assert!(x.message.contains("lists no step"), "{x:?}");
    assert_eq!(x.at, at(&text, "[]"));
    for bad in [
        r#"["send report"]"#,
        r#"["send_report\n"]"#,
        r#"[""]"#,
        r#"["a", "a"]"#,
    ] {
        let text = replace(BASE, r#"["send_report"]"#, bad);
        problem_for(&problems(text.as_bytes()), "tools.\"mail.send\".steps");
    }
    // No `steps` at all is a type error, not an empty list.
    let text = replace(BASE, "steps = [\"send_report\"]\n", "");
    assert!(problems(text.as_bytes())[0].message.contains("steps"));
    policy();
}

#[test]
fn invalid_tool_and_agent_names_are_reported() {
    let text = replace(BASE, "[tools.\"mail.send\"]", "[tools.\"mail send\"]");
    let p = problems(text.as_bytes());
    let x = problem_for(&p, "tools.\"mail send\"");
    assert_eq!(x.at, at(&text, "tools.\"mail send\""));
    let text = replace(BASE, "agent = \"repo-helper\"", "agent = \"repo helper\"");
    let x = &problems(text.as_bytes())[0];
    assert_eq!(x.key.as_deref(), Some("agent"));
    assert_eq!(x.at, at(&text, "\"repo helper\""));
    policy();
}

#[test]
fn unknown_keys_are_all_reported_with_positions() {
    let text = replace(
        BASE,
        "agent = \"repo-helper\"",
        "agent = \"repo-helper\"\nfrozn = true",
    );
    let text = replace(
        &text,
        "source = \"self\"\nttl = \"120s\"",
        "source = \"self\"\nttll = \"120s\"",
    );
    let text = replace(
        &text,
        r#"scopes = ["mail:send"]"#,
        r#"scope = ["mail:send"]"#,
    );
    let p = problems(text.as_bytes());
    assert_eq!(p.len(), 3, "{p:#?}");
    for (key, needle) in [
        ("frozn", "frozn"),
        ("resources.https://api.example/notes.ttll", "ttll"),
        ("tools.mail.send.scope", "scope ="),
    ] {
        let x = problem_for(&p, key);
        assert_eq!(x.message, "unknown key");
        assert_eq!(x.at, at(&text, needle), "{key}");
    }
    policy();
}

#[test]
fn misspelt_sources_and_sources_without_their_keys_are_rejected() {
    // `service` and `exchange` are accepted only with their own keys (see
    // service_tests.rs, exchange_tests.rs); without `service = ...` or
    // `upstream = ...` they are refused at the same place, under the key
    // that is missing.
    for (source, key) in [("service", "service"), ("exchange", "upstream")] {
        let text = replace(
            BASE,
            "source = \"self\"\nttl",
            &format!("source = \"{source}\"\nttl"),
        );
        let p = problems(text.as_bytes());
        let x = problem_for(
            &p,
            &format!("resources.\"https://api.example/notes\".{key}"),
        );
        assert_eq!(x.at, at(&text, &format!("\"{source}\"\nttl")));
    }
    for source in ["Self", "", "self ", "Exchange"] {
        let text = replace(
            BASE,
            "source = \"self\"\nttl",
            &format!("source = \"{source}\"\nttl"),
        );
        let p = problems(text.as_bytes());
        let x = problem_for(&p, "resources.\"https://api.example/notes\".source");
        assert_eq!(x.at, at(&text, &format!("\"{source}\"\nttl")), "{source}");
    }
    policy();
}

#[test]
fn empty_or_comment_only_policy_is_refused() {
    for empty in ["", "   \n\n\t", "# only a comment\n"] {
        let p = problems(empty.as_bytes());
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].at.starts_with(FILE), "{p:#?}");
    }
    assert!(problems(b"")[0].message.contains("empty"));
    // A policy with an agent and no tools is valid (it denies everything).
    let nothing = load("agent = \"repo-helper\"\n").unwrap();
    assert_eq!(
        nothing.decide(&Request {
            step: "s",
            tool: "t",
            resource: NOTES,
            scope: None
        }),
        Decision::Deny(DenyReason::ToolNotAllowed)
    );
    policy();
}

#[test]
fn non_utf8_policy_is_refused_with_its_position() {
    let mut bytes = BASE.as_bytes().to_vec();
    // Line 3 is `[resources."https://api.example/notes"]`; break its 5th byte.
    let offset = BASE.find("[resources").unwrap() + 4;
    bytes[offset] = 0xff;
    let p = problems(&bytes);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].at, format!("{FILE}:3:5"));
    assert!(p[0].message.contains("UTF-8"));
    // Multi-byte characters before the bad byte count as one column each.
    let text = "agent = \"é\"\n# ééé\u{0}".as_bytes().to_vec();
    let mut text = text;
    let n = text.len();
    text[n - 1] = 0xc3; // a truncated two-byte sequence at the end
    assert_eq!(problems(&text)[0].at, format!("{FILE}:2:6"));
    policy();
}

#[test]
fn missing_file_is_a_read_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Policy::load(&dir.path().join("nope.toml")).unwrap_err();
    assert!(matches!(err, PolicyError::Read { .. }), "{err}");
    let good = dir.path().join("policy.toml");
    std::fs::write(&good, BASE).unwrap();
    assert_eq!(Policy::load(&good).unwrap().tools.len(), 2);
}

// -------------------------------------------------------------- decisions

#[test]
fn p2_tool_names_match_byte_for_byte() {
    let p = policy();
    for tool in [
        "notes.write",
        "Notes.Read",
        "NOTES.READ",
        "nоtes.read", // Cyrillic о
        "notes.reаd", // Cyrillic а
        "notes.read ",
        " notes.read",
        "notes.read\0",
        "notes.read\n",
        "notes\u{200b}.read",
        "notes.read\u{feff}",
        "",
    ] {
        assert_eq!(
            decide(&p, "answer_question", tool, NOTES),
            Decision::Deny(DenyReason::ToolNotAllowed),
            "{tool:?}"
        );
    }
    assert_allowed(&p, "answer_question", "notes.read", NOTES);
}

#[test]
fn p2_step_names_match_byte_for_byte() {
    let p = policy();
    for step in [
        "Answer_Question",
        "answer_question ",
        "answer_question\0",
        "answer-question",
        "аnswer_question",
        "",
    ] {
        assert_eq!(
            decide(&p, step, "notes.read", NOTES),
            Decision::Deny(DenyReason::StepNotAllowed),
            "{step:?}"
        );
    }
    assert_allowed(&p, "answer_question", "notes.read", NOTES);
}

#[test]
fn p3_wildcards_and_path_tricks_in_tool_or_step_are_denied() {
    let p = policy();
    for tool in [
        "*",
        "notes.*",
        "notes.rea?",
        "notes.[r]ead",
        "**",
        "../notes.read",
        "notes%2eread",
        "notes.read/../mail.send",
        "./notes.read",
        "notes.read%00",
    ] {
        assert_eq!(
            decide(&p, "answer_question", tool, NOTES),
            Decision::Deny(DenyReason::ToolNotAllowed),
            "{tool}"
        );
    }
    for step in [
        "*",
        "answer_*",
        "answer_question*",
        "../answer_question",
        "answer%5fquestion",
        "summar?ze",
    ] {
        assert_eq!(
            decide(&p, step, "notes.read", NOTES),
            Decision::Deny(DenyReason::StepNotAllowed),
            "{step}"
        );
    }
    assert_allowed(&p, "summarize", "notes.read", NOTES);
}

#[test]
fn p3_wildcards_and_path_tricks_in_resource_are_denied() {
    let p = policy();
    for resource in [
        "https://api.example/notes/../notes",
        "https://api.example/x/../notes",
        "https://api.example/./notes",
        "https://api.example/%2e%2e/notes",
        "https://api.example/%2E/notes",
        "https://api.example/notes%2f..",
        "https://api.example/notes%00",
        "https://api.example\\notes",
        "https://api.example/*",
        "https://api.example/not*",
        "https://*.example/notes",
        "https://api.example/notes/",
        "https://api.example/notes/*",
        "https://api.example/notes#x",
        "https://api.example/notes?x",
        "https://user@api.example/notes",
        "http://api.example/notes",
        "https://api.example/Notes",
        "https://аpi.example/notes",
        "//api.example/notes",
        "api.example/notes",
        "*",
    ] {
        // Either refused as a resource before any comparison, or it does not
        // match the tool's resource.
        match decide_raw(&p, "answer_question", "notes.read", resource, None) {
            None | Some(Decision::Deny(DenyReason::ResourceMismatch)) => {}
            Some(d) => panic!("{resource}: {d:?}"),
        }
    }
    // Syntax-based normalisation is not a trick: case of scheme and host and
    // the default port.
    for same in [
        NOTES,
        "HTTPS://API.EXAMPLE/notes",
        "https://api.example:443/notes",
    ] {
        assert_allowed(&p, "answer_question", "notes.read", same);
    }
}

#[test]
fn resource_of_another_tool_is_a_mismatch() {
    let p = policy();
    assert_eq!(
        decide(&p, "answer_question", "notes.read", MAIL),
        Decision::Deny(DenyReason::ResourceMismatch)
    );
    assert_eq!(
        decide(
            &p,
            "answer_question",
            "notes.read",
            "https://unknown.example/"
        ),
        Decision::Deny(DenyReason::ResourceMismatch)
    );
    assert_allowed(&p, "answer_question", "notes.read", NOTES);
}

#[test]
fn p4_tool_in_a_step_it_does_not_list_is_denied() {
    let p = policy();
    assert_eq!(
        decide(&p, "answer_question", "mail.send", MAIL),
        Decision::Deny(DenyReason::StepNotAllowed)
    );
    assert_eq!(DenyReason::StepNotAllowed.as_str(), "step_not_allowed");
    // A step listed by another tool does not carry over.
    assert_eq!(
        decide(&p, "send_report", "notes.read", NOTES),
        Decision::Deny(DenyReason::StepNotAllowed)
    );
    assert_allowed(&p, "send_report", "mail.send", MAIL);
}

#[test]
fn p5_more_scope_than_allowed_is_denied_whole() {
    let p = policy();
    for asked in [
        &["notes:read", "notes:write"][..],
        &["notes:write"],
        &["notes:read", "notes:list", "mail:send"],
        &["Notes:Read"],
        &["notes:read "],
        &["notes:*"],
        &["*"],
        &[""],
    ] {
        assert_eq!(
            decide_raw(&p, "answer_question", "notes.read", NOTES, Some(asked)),
            Some(Decision::Deny(DenyReason::ScopeNotAllowed)),
            "{asked:?}"
        );
    }
    // A subset is granted exactly, sorted and without duplicates.
    let g = allowed(
        decide_raw(
            &p,
            "answer_question",
            "notes.read",
            NOTES,
            Some(&["notes:read"]),
        )
        .unwrap(),
    );
    assert_eq!(g.scopes, ["notes:read"]);
    let g = allowed(
        decide_raw(
            &p,
            "answer_question",
            "notes.read",
            NOTES,
            Some(&["notes:read", "notes:list", "notes:read"]),
        )
        .unwrap(),
    );
    assert_eq!(g.scopes, ["notes:list", "notes:read"]);
    // No scope asked: the tool's scopes.
    let g = assert_allowed(&p, "answer_question", "notes.read", NOTES);
    assert_eq!(g.scopes, ["notes:list", "notes:read"]);
    assert_eq!(g.resource.id, NOTES);
}

#[test]
fn scope_strings_are_split_strictly() {
    assert_eq!(
        parse_scope("notes:read notes:list").unwrap(),
        ["notes:read", "notes:list"]
    );
    assert_eq!(parse_scope("a").unwrap(), ["a"]);
    for bad in [
        "", " ", "a  b", " a", "a ", "a\tb", "a\"b", "a\\b", "é", "a\nb",
    ] {
        assert!(parse_scope(bad).is_err(), "{bad:?}");
    }
    assert!(valid_scope_token("!#[]~"));
    assert!(!valid_scope_token(&"a".repeat(257)));
    assert!(valid_scope_token(&"a".repeat(256)));
}

#[test]
fn ttl_is_the_minimum_of_tool_resource_and_300s() {
    let p = policy();
    // Resource 120 s, no tool ttl.
    assert_eq!(
        assert_allowed(&p, "summarize", "notes.read", NOTES).ttl,
        Duration::from_secs(120)
    );
    // Resource without ttl (300 s), tool 60 s.
    assert_eq!(
        assert_allowed(&p, "send_report", "mail.send", MAIL).ttl,
        Duration::from_secs(60)
    );
    // Tool longer than its resource: the resource wins.
    let text = replace(
        BASE,
        "steps = [\"answer_question\", \"summarize\"]",
        "steps = [\"answer_question\", \"summarize\"]\nttl = \"200s\"",
    );
    let p = load(&text).unwrap();
    assert_eq!(
        assert_allowed(&p, "summarize", "notes.read", NOTES).ttl,
        Duration::from_secs(120)
    );
    // Tool shorter than its resource: the tool wins.
    let text = text.replace("ttl = \"200s\"", "ttl = \"30s\"");
    let p = load(&text).unwrap();
    assert_eq!(
        assert_allowed(&p, "summarize", "notes.read", NOTES).ttl,
        Duration::from_secs(30)
    );
    // Neither says anything: 300 s.
    let text = BASE.replace("ttl = \"60s\"\n", "");
    let p = load(&text).unwrap();
    assert_eq!(
        assert_allowed(&p, "send_report", "mail.send", MAIL).ttl,
        MAX_TTL
    );
}

#[test]
fn frozen_policy_denies_everything_and_says_so() {
    let text = replace(
        BASE,
        "agent = \"repo-helper\"",
        "agent = \"repo-helper\"\nfrozen = true",
    );
    let p = load(&text).unwrap();
    assert!(p.frozen);
    for (step, tool, resource) in [
        ("answer_question", "notes.read", NOTES),
        ("send_report", "mail.send", MAIL),
        ("answer_question", "unknown", NOTES),
        ("nope", "notes.read", NOTES),
    ] {
        assert_eq!(
            decide(&p, step, tool, resource),
            Decision::Deny(DenyReason::Frozen),
            "{tool}"
        );
    }
    assert_eq!(DenyReason::Frozen.as_str(), "frozen");
    let text = text.replace("frozen = true", "frozen = false");
    assert_allowed(
        &load(&text).unwrap(),
        "answer_question",
        "notes.read",
        NOTES,
    );
}

#[test]
fn deny_reasons_have_stable_wire_names() {
    let names: Vec<&str> = [
        DenyReason::ToolNotAllowed,
        DenyReason::StepNotAllowed,
        DenyReason::ScopeNotAllowed,
        DenyReason::ResourceMismatch,
        DenyReason::Frozen,
    ]
    .iter()
    .map(|r| r.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "tool_not_allowed",
            "step_not_allowed",
            "scope_not_allowed",
            "resource_mismatch",
            "frozen"
        ]
    );
}

#[test]
fn percent_escapes_compare_case_insensitively() {
    // RFC 3986 section 6.2.2.1: %7e and %7E are the same octet.
    let text = BASE.replace("https://api.example/notes", "https://api.example/n%7eotes");
    let p = load(&text).unwrap();
    assert_allowed(
        &p,
        "summarize",
        "notes.read",
        "https://api.example/n%7Eotes",
    );
    assert_allowed(
        &p,
        "summarize",
        "notes.read",
        "https://api.example/n%7eotes",
    );
    assert_eq!(
        decide(
            &p,
            "summarize",
            "notes.read",
            "https://api.example/n%7Fotes"
        ),
        Decision::Deny(DenyReason::ResourceMismatch)
    );
    assert_allowed(
        &p,
        "summarize",
        "notes.read",
        "https://api.example/n%7Eotes",
    );
}

/// Tests that came with the policy tooling (ttl syntax, steps, evaluation order).
mod tooling {
    use super::*;

    use std::path::Path;

    fn load(text: &str) -> Result<Policy, String> {
        Policy::parse(Path::new("p.toml"), text.as_bytes()).map_err(|e| e.to_string())
    }

    const BASE: &str = r#"agent = "a"
    [resources."https://api.example/"]
    source = "self"
    "#;

    #[test]
    fn ttl_accepts_whole_seconds_and_minutes_up_to_five_minutes() {
        for (t, secs) in [
            ("1s", 1),
            ("60s", 60),
            ("300s", 300),
            ("5m", 300),
            ("1m", 60),
        ] {
            assert_eq!(parse_policy_ttl(t), Ok(Duration::from_secs(secs)), "{t}");
        }
        for t in [
            "0s",
            "060s",
            "301s",
            "6m",
            "1h",
            "500ms",
            "",
            "s",
            "60",
            " 60s",
            "60 s",
            "99999999999999999999s",
            "+5s",
        ] {
            assert!(parse_policy_ttl(t).is_err(), "{t:?} was accepted");
        }
    }

    #[test]
    fn declared_steps_close_the_world() {
        let p = load(&format!(
            "agent = \"a\"\nsteps = [\"triage\"]\n{}[tools.t]\nresource = \"https://api.example/\"\nsteps = [\"triage\", \"traige\"]\n",
            &BASE[12..]
        ))
        .unwrap();
        let req = |step| Request {
            step,
            tool: "t",
            resource: "https://api.example/",
            scope: None,
        };
        // The tool lists "traige" (a typo), but the declared steps do not have it.
        assert_eq!(
            p.decide(&req("traige")),
            Decision::Deny(DenyReason::StepNotAllowed)
        );
        // Positive control: the declared step works.
        assert!(matches!(p.decide(&req("triage")), Decision::Allow(_)));
    }

    #[test]
    fn tool_key_with_escape_is_located_and_printed_escaped() {
        let text = format!("{BASE}\n[tools.\"mail.send\\u0000\"]\nresource = \"https://api.example/\"\nsteps = [\"s\"]\n");
        let err = load(&text).unwrap_err();
        assert_eq!(
            err,
            "p.toml:5:2: tools.\"mail.send\\0\": tool names must not contain spaces or control characters"
        );
    }

    #[test]
    fn evaluate_follows_the_pipeline_order() {
        let p = load(&format!(
            "{BASE}[tools.t]\nresource = \"https://api.example/\"\nscopes = [\"r\"]\nsteps = [\"s\"]\n"
        ))
        .unwrap();
        assert_eq!(
            p.evaluate("s", "t", "https://api.example/#x", None)
                .reason(),
            "invalid_target"
        );
        assert_eq!(
            p.evaluate("s", "t", "https://api.example/", Some("r  w"))
                .reason(),
            "invalid_request"
        );
        assert_eq!(
            p.evaluate("s", "nope", "https://api.example/", None)
                .reason(),
            "tool_not_allowed"
        );
        assert_eq!(
            p.evaluate("x", "t", "https://api.example/", None).reason(),
            "step_not_allowed"
        );
        assert_eq!(
            p.evaluate("s", "t", "https://other.example/", None)
                .reason(),
            "resource_mismatch"
        );
        assert_eq!(
            p.evaluate("s", "t", "https://api.example/", Some("r w"))
                .reason(),
            "scope_not_allowed"
        );
        // Positive control.
        assert_eq!(
            p.evaluate("s", "t", "HTTPS://API.example:443", Some("r"))
                .decision(),
            "allow"
        );
    }
}

/// The prelude takes a declared resource as it is (it is canonical
/// already) and canonicalises anything else, as before.
#[test]
fn a_declared_resource_is_taken_as_it_is_and_others_are_canonicalised() {
    let p = policy();
    assert_eq!(p.resources.len(), 2);
    for k in p.resources.keys() {
        assert_eq!(canonical_resource(k).as_deref(), Ok(k.as_str()));
        assert_eq!(p.prelude(false, k, None).unwrap().resource, *k);
        assert_eq!(p.declared_resource(k), Some(k.as_str()));
    }
    // Other spellings of a declared resource go through the parse and
    // still find it; what is not a resource URI is refused.
    assert_eq!(
        p.prelude(false, "HTTPS://API.example:443/notes", None)
            .unwrap()
            .resource,
        NOTES
    );
    assert_eq!(p.declared_resource("https://MAIL.example"), Some(MAIL));
    assert_eq!(p.declared_resource("https://api.example/other"), None);
    assert!(matches!(
        p.prelude(false, "https://api.example/notes#f", None),
        Err(Refusal::InvalidTarget(_))
    ));
}
