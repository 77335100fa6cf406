//! `approval`, `approval_ttl` and `authorization_details` declarations:
//! what loads, what `policy check` refuses (with file, key and cause), and
//! what a request's details must look like.

use serde_json::json;

use super::*;

const FILE: &str = "/etc/credbroker/policy.toml";

const MAIL: &str = r#"agent = "mail-agent"

[resources."https://mail.example/api"]
source = "self"

[resources."https://api.acme.example"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."mail.send"]
resource = "https://mail.example/api"
scopes = ["mail.send"]
steps = ["send_reply"]
approval = "each_call"
require_authorization_details = true

[tools."mail.send".authorization_details.mail]
to = { kind = "strings", required = true, label = "Recipients" }
subject = { kind = "string", label = "Subject", log_in_clear = true }
size = { kind = "integer", label = "Size in bytes" }
"#;

fn load(text: &str) -> Result<Policy, PolicyError> {
    Policy::parse(Path::new(FILE), text.as_bytes())
}

fn refused(text: &str, key: &str) -> String {
    match load(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(PolicyError::Invalid(p)) => {
            let found = p
                .iter()
                .find(|x| x.key.as_deref() == Some(key))
                .unwrap_or_else(|| panic!("no problem for {key} in {p:#?}"));
            let shown = found.to_string();
            assert!(shown.starts_with(FILE), "{shown}");
            shown
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn an_approval_tool_loads_with_its_declared_fields() {
    let p = load(MAIL).unwrap();
    let t = &p.tools["mail.send"];
    assert_eq!(t.approval, Some(Approval::EachCall));
    assert!(t.require_details);
    let mail = &t.details["mail"];
    // The file's order, not the names' (size, subject, to).
    let order: Vec<&str> = mail.ordered().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order, ["to", "subject", "size"]);
    assert_eq!(mail.fields["to"].kind, FieldKind::Strings);
    assert!(mail.fields["to"].required);
    assert_eq!(mail.fields["subject"].label, "Subject");
    assert!(mail.fields["subject"].log_in_clear);
    assert!(!mail.fields["to"].log_in_clear);

    let per_step = MAIL.replace(
        "approval = \"each_call\"",
        "approval = \"per_step\"\napproval_ttl = \"15m\"",
    );
    let p = load(&per_step).unwrap();
    assert_eq!(
        p.tools["mail.send"].approval,
        Some(Approval::PerStep {
            ttl: Duration::from_secs(900),
            unit: TtlUnit::Minutes,
        })
    );
    // The unit is the one written: 60 s stays seconds, 1 m minutes.
    for (written, secs, unit) in [
        ("4s", 4, TtlUnit::Seconds),
        ("60s", 60, TtlUnit::Seconds),
        ("1m", 60, TtlUnit::Minutes),
    ] {
        let p = load(&MAIL.replace(
            "approval = \"each_call\"",
            &format!("approval = \"per_step\"\napproval_ttl = \"{written}\""),
        ))
        .unwrap();
        assert_eq!(
            p.tools["mail.send"].approval,
            Some(Approval::PerStep {
                ttl: Duration::from_secs(secs),
                unit
            }),
            "{written}"
        );
    }
}

#[test]
fn a_per_step_reach_is_stated_in_the_unit_it_was_written_in() {
    let cases = [
        (TtlUnit::Seconds, 4, "4 seconds", "4s"),
        (TtlUnit::Seconds, 1, "1 second", "1s"),
        (TtlUnit::Seconds, 90, "90 seconds", "90s"),
        (TtlUnit::Seconds, 60, "60 seconds", "60s"),
        (TtlUnit::Seconds, 900, "900 seconds", "900s"),
        (TtlUnit::Minutes, 300, "5 minutes", "5m"),
        (TtlUnit::Minutes, 60, "1 minute", "1m"),
        // Not whole minutes (no policy writes it): seconds, never rounded.
        (TtlUnit::Minutes, 90, "90 seconds", "90s"),
    ];
    for (unit, secs, words, spelled) in cases {
        assert_eq!(unit.words(secs), words);
        assert_eq!(unit.spelled(secs), spelled);
    }
    // A record written before the unit was kept reads as seconds.
    assert_eq!(TtlUnit::default(), TtlUnit::Seconds);
}

#[test]
fn bad_approval_declarations_name_file_key_and_cause() {
    let on_provider_token = MAIL.replace(
        "[tools.\"mail.send\"]\nresource = \"https://mail.example/api\"",
        "[tools.\"mail.send\"]\nresource = \"https://api.acme.example\"",
    );
    let m = refused(&on_provider_token, "tools.\"mail.send\".approval");
    assert!(m.contains("provider_token"), "{m}");

    let too_long = MAIL.replace(
        "approval = \"each_call\"",
        "approval = \"per_step\"\napproval_ttl = \"16m\"",
    );
    assert!(refused(&too_long, "tools.\"mail.send\".approval_ttl").contains("15m"));
    let no_ttl = MAIL.replace("approval = \"each_call\"", "approval = \"per_step\"");
    assert!(refused(&no_ttl, "tools.\"mail.send\".approval_ttl").contains("needs approval_ttl"));
    let ttl_on_each = MAIL.replace(
        "approval = \"each_call\"",
        "approval = \"each_call\"\napproval_ttl = \"5m\"",
    );
    refused(&ttl_on_each, "tools.\"mail.send\".approval_ttl");
    let unknown = MAIL.replace("\"each_call\"", "\"always\"");
    assert!(refused(&unknown, "tools.\"mail.send\".approval").contains("each_call"));
    let nested = MAIL.replace("kind = \"integer\"", "kind = \"object\"");
    assert!(refused(
        &nested,
        "tools.\"mail.send\".authorization_details.\"mail\".\"size\".kind"
    )
    .contains("no nested objects"));
    let type_field = MAIL.replace("size = {", "type = {");
    refused(
        &type_field,
        "tools.\"mail.send\".authorization_details.\"mail\".\"type\"",
    );
    let no_label = MAIL.replace("label = \"Subject\"", "label = \" \"");
    refused(
        &no_label,
        "tools.\"mail.send\".authorization_details.\"mail\".\"subject\".label",
    );
    let required_without_types = MAIL
        .split("[tools.\"mail.send\".authorization_details.mail]")
        .next()
        .unwrap()
        .to_string();
    refused(
        &required_without_types,
        "tools.\"mail.send\".require_authorization_details",
    );
    // Positive control: the unchanged file loads.
    load(MAIL).unwrap();
}

#[test]
fn details_are_checked_against_the_declarations() {
    let p = load(MAIL).unwrap();
    let t = &p.tools["mail.send"];
    let good = json!([{"type": "mail", "to": ["bob@example.com"], "subject": "Hi", "size": 12}]);
    assert_eq!(details::check(t, Some(&good)).unwrap(), Some(good.clone()));
    // A hidden `bcc` is refused, not dropped.
    let bcc = json!([{"type": "mail", "to": ["bob@example.com"], "bcc": ["eve@example.com"]}]);
    assert!(matches!(
        details::check(t, Some(&bcc)),
        Err(details::DetailsError::Undeclared { index: 0, .. })
    ));
    let nested = json!([{"type": "mail", "to": [{"a": 1}]}]);
    assert!(matches!(
        details::check(t, Some(&nested)),
        Err(details::DetailsError::Kind { .. })
    ));
    let float = json!([{"type": "mail", "to": ["b"], "size": 1.5}]);
    assert!(matches!(
        details::check(t, Some(&float)),
        Err(details::DetailsError::Kind { .. })
    ));
    let missing = json!([{"type": "mail", "subject": "Hi"}]);
    assert!(matches!(
        details::check(t, Some(&missing)),
        Err(details::DetailsError::Required { .. })
    ));
    let other_type = json!([{"type": "payment", "to": ["b"]}]);
    assert_eq!(
        details::check(t, Some(&other_type)),
        Err(details::DetailsError::Type(0))
    );
    assert_eq!(
        details::check(t, Some(&json!({"type": "mail"}))),
        Err(details::DetailsError::Shape)
    );
    assert_eq!(
        details::check(t, Some(&json!([]))),
        Err(details::DetailsError::Shape)
    );
    assert_eq!(details::check(t, None), Err(details::DetailsError::Missing));
    // Only the fields marked log_in_clear are loggable.
    let logged = details::loggable(t, &good);
    assert_eq!(logged.len(), 1);
    assert_eq!(logged["0.mail.subject"], "Hi");
    // Positive control again after the refusals.
    assert!(details::check(t, Some(&good)).unwrap().is_some());
}

#[test]
fn diff_shows_a_dropped_approval_as_access_gained() {
    let old = load(MAIL).unwrap();
    let dropped = load(&MAIL.replace("approval = \"each_call\"\n", "")).unwrap();
    let r = diff::diff(&old, &dropped);
    assert!(
        r.gained
            .iter()
            .any(|g| g.contains("`each_call` approval -> no approval")),
        "{r:?}"
    );
    let back = diff::diff(&dropped, &old);
    assert!(
        back.lost
            .iter()
            .any(|l| l.contains("no approval -> `each_call` approval")),
        "{back:?}"
    );
    let bcc = MAIL.replace(
        "size = {",
        "bcc = { kind = \"strings\", label = \"Hidden copies\" }\nsize = {",
    );
    let r = diff::diff(&old, &load(&bcc).unwrap());
    assert!(r.gained.iter().any(|g| g.contains("`bcc`")), "{r:?}");
    // Positive control: the same file shows no change of access.
    assert!(diff::diff(&old, &load(MAIL).unwrap()).access_unchanged());
}

#[test]
fn check_warns_about_an_approval_without_required_details() {
    let text = MAIL.replace("require_authorization_details = true\n", "");
    let p = load(&text).unwrap();
    let w = lint::lint(Path::new(FILE), &text, &p);
    assert!(
        w.iter()
            .any(|w| w.key == "tools.\"mail.send\""
                && w.message.contains("without seeing what it does")),
        "{w:?}"
    );
    // Positive control: with required details, no such warning.
    let p = load(MAIL).unwrap();
    assert!(!lint::lint(Path::new(FILE), MAIL, &p)
        .iter()
        .any(|w| w.message.contains("without seeing what it does")));
}

/// A proxy tool that needs approval, its one route given by `route`.
fn proxied(route: &str) -> String {
    format!(
        r#"agent = "repo-agent"

[resources."https://broker.example/proxy/github"]
source = "service"
service = "github"
delivery = "proxy"

[tools."repo.delete"]
resource = "https://broker.example/proxy/github"
scopes = ["repo"]
steps = ["cleanup"]
approval = "each_call"
require_authorization_details = true
routes = [{route}]

[tools."repo.delete".authorization_details."git.repository"]
owner = {{ kind = "string", required = true, label = "Owner" }}
"name.full" = {{ kind = "string", required = true, label = "Repository" }}
topics = {{ kind = "strings", label = "Topics" }}
"#
    )
}

#[test]
fn route_variables_bind_to_declared_detail_fields() {
    let p = load(&proxied(
        r#"{ route = "DELETE /repos/{owner}/{repo}", details = { owner = "git.repository.owner", repo = "git.repository.name.full" } }"#,
    ))
    .unwrap();
    let r = &p.tools["repo.delete"].routes[0];
    let b: Vec<(&str, &str, &str)> = r
        .details
        .iter()
        .map(|b| (b.var.as_str(), b.ty.as_str(), b.field.as_str()))
        .collect();
    assert_eq!(
        b,
        [
            ("owner", "git.repository", "owner"),
            ("repo", "git.repository", "name.full")
        ]
    );
    let at = "tools.\"repo.delete\".routes[0].details";
    for (details, key, cause) in [
        (
            r#"{ nope = "git.repository.owner" }"#,
            "nope",
            "names no variable of the route",
        ),
        (
            r#"{ owner = "git.repository.bcc" }"#,
            "owner",
            "is not a declared field",
        ),
        (
            r#"{ owner = "mail.owner" }"#,
            "owner",
            "is not a declared field",
        ),
        (
            r#"{ owner = "git.repository.topics" }"#,
            "owner",
            "binds a list field",
        ),
        (r#"{ owner = 3 }"#, "owner", "must be a string"),
    ] {
        let text = proxied(&format!(
            r#"{{ route = "DELETE /repos/{{owner}}/{{repo}}", details = {details} }}"#
        ));
        let shown = refused(&text, &format!("{at}.{key}"));
        assert!(shown.contains(cause), "{shown}");
    }
    let shown = refused(
        &proxied(r#"{ route = "DELETE /repos/{owner}/{repo}", details = {} }"#),
        at,
    );
    assert!(shown.contains("at least one variable"), "{shown}");

    // policy diff: dropping the binding is access gained (the route now
    // takes any repository), adding it back access lost.
    let unbound = load(&proxied(r#""DELETE /repos/{owner}/{repo}""#)).unwrap();
    let r = diff::diff(&p, &unbound);
    assert!(
        r.gained.iter().any(|g| g.contains("routes added")
            && g.contains("DELETE /repos/{owner}/{repo}")
            && !g.contains("bound")),
        "{r:?}"
    );
    assert!(
        r.lost.iter().any(|l| l.contains("routes removed")
            && l.contains("bound to details: owner = git.repository.owner")),
        "{r:?}"
    );
    // The other way the unbound route is listed as removed (the bound one
    // as added: diff compares routes as written).
    let back = diff::diff(&unbound, &p);
    assert!(
        back.lost
            .iter()
            .any(|l| l.contains("routes removed") && !l.contains("bound")),
        "{back:?}"
    );
    // Positive control: the same file is no change.
    assert!(diff::diff(&p, &p).access_unchanged());
}

#[test]
fn bind_request_needs_an_each_call_approval() {
    // Control: on an each_call tool it loads, and marks its route only.
    let p = load(&proxied(
        r#"{ route = "POST /repos/{owner}/{repo}/issues", bind_request = true }, "GET /user""#,
    ))
    .unwrap();
    let routes = &p.tools["repo.delete"].routes;
    assert!(routes[0].bind_request);
    assert!(!routes[1].bind_request);
    let key = "tools.\"repo.delete\".routes[0].bind_request";
    let route = r#"{ route = "POST /repos/{owner}/{repo}/issues", bind_request = true }"#;
    for (approval, cause) in [
        (
            "approval = \"per_step\"\napproval_ttl = \"90s\"",
            "needs approval = \"each_call\"",
        ),
        ("", "needs approval = \"each_call\""),
    ] {
        let text = proxied(route).replace("approval = \"each_call\"", approval);
        let shown = refused(&text, key);
        assert!(shown.contains(cause), "{shown}");
    }
    let shown = refused(
        &proxied(r#"{ route = "POST /x", bind_request = "yes" }"#),
        key,
    );
    assert!(shown.contains("must be a boolean"), "{shown}");
}
