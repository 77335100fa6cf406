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
