//! `docs/OPERATIONS.md` against the code: the metric table against the
//! registry (names, types, labels), the event table against
//! `events::Kind::ALL`, the field table against the fields an `Event`
//! serializes, and the reload reasons against `app::reload::Refusal::ALL`,
//! each in both directions; and each log line the page quotes against the
//! `tracing` call that writes it (module, level, message, field names).

use std::collections::BTreeSet;

use credbroker::internals::app::reload::Refusal;
use credbroker::internals::events::{Event, Kind, Opaque, ProxyCall, ReservedFields};
use credbroker::internals::metrics::{MetricInfo, Metrics, RESERVED};

use super::{only_code, read_doc, table_rows};

/// The code spans of a cell (`` `a`, `b` ``), or none for `—`.
fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A metric row of the page: name, type, labels.
type DocMetric = (String, String, Vec<String>);

fn doc_metrics(text: &str) -> Vec<DocMetric> {
    table_rows(text, &["Metric", "Type", "Labels", "Meaning"])
        .into_iter()
        .map(|r| {
            let name = only_code(&r[0])
                .unwrap_or_else(|| panic!("a metric cell must be one code span: {r:?}"))
                .to_string();
            (name, r[1].clone(), spans(&r[2]))
        })
        .collect()
}

/// The first column of the tables headed `first`, each one code span.
fn doc_names(text: &str, first: &str) -> Vec<String> {
    table_rows(text, &[first])
        .into_iter()
        .map(|r| {
            only_code(&r[0])
                .unwrap_or_else(|| panic!("a {first} cell must be one code span: {r:?}"))
                .to_string()
        })
        .collect()
}

fn compare_metrics(doc: &[DocMetric], code: &[MetricInfo]) -> Vec<String> {
    let mut problems = Vec::new();
    for m in code {
        match doc.iter().find(|d| d.0 == m.name) {
            None => problems.push(format!(
                "{}: registered, missing from docs/OPERATIONS.md",
                m.name
            )),
            Some((_, kind, labels)) => {
                if kind != m.kind {
                    problems.push(format!(
                        "{}: documented as {kind}, registered as {}",
                        m.name, m.kind
                    ));
                }
                if *labels != m.labels {
                    problems.push(format!(
                        "{}: documented labels {labels:?}, registered {:?}",
                        m.name, m.labels
                    ));
                }
            }
        }
    }
    for d in doc {
        if !code.iter().any(|m| m.name == d.0) {
            problems.push(format!(
                "{}: documented, but no such metric is registered",
                d.0
            ));
        }
    }
    problems
}

fn compare_names(what: &str, doc: &[String], code: &BTreeSet<String>) -> Vec<String> {
    let doc_set: BTreeSet<String> = doc.iter().cloned().collect();
    let mut problems = Vec::new();
    for n in code.difference(&doc_set) {
        problems.push(format!(
            "{n}: in the code ({what}), missing from docs/OPERATIONS.md"
        ));
    }
    for n in doc_set.difference(code) {
        problems.push(format!("{n}: documented ({what}), not in the code"));
    }
    if doc_set.len() != doc.len() {
        problems.push(format!("a {what} is documented twice: {doc:?}"));
    }
    problems
}

/// Every field an event can carry, as serialized, and the members of
/// `proxy`. The struct literals name every field without `..`, so a field
/// added to `Event` or `ProxyCall` does not compile here until it is added
/// (and then the page must list it).
fn event_fields() -> BTreeSet<String> {
    let e = Event {
        time: 1,
        event: Kind::DeriveIssued,
        agent: "a",
        person_iss: Some("a"),
        person_sub: Some("a"),
        step: Some("a"),
        tool: Some("a"),
        resource: Some("a"),
        scope: Some("a"),
        outcome: Some("a"),
        reason: Some("a"),
        policy_hash: Some("a"),
        jti_sha256: Some("a".into()),
        peer_uid: Some(1),
        service: Some("a"),
        connect_id: Some("a"),
        opener_iss: Some("a"),
        instance: Some("a"),
        boot_id: Some("a"),
        trace_id: Some("a"),
        opener_sub: Some("a"),
        client_addr: Some("a".into()),
        narrowed: Some(true),
        upstream: Some("a"),
        expires_at: Some(1),
        reused: Some(true),
        undeclared: Some(
            [(
                "step",
                Opaque {
                    len: 1,
                    hmac_sha256: "a".into(),
                },
            )]
            .into_iter()
            .collect(),
        ),
        removed_bytes: Some(1),
        kid: Some("a".into()),
        retired_kid: Some("a".into()),
        approval_id: Some("a"),
        details_sha256: Some("a"),
        request_sha256: Some("a"),
        approval_ttl: Some("a".into()),
        details_in_clear: Some([("0.t.f".to_string(), "a".into())].into_iter().collect()),
        proxy: Some(ProxyCall {
            method: "GET",
            route: Some("a"),
            path_sha256: "a",
            upstream_status: Some(200),
            bytes_up: Some(1),
            bytes_down: Some(1),
            duration_ms: Some(1),
            request_sha256: Some("a"),
        }),
        source: Some("a"),
        ssf_event_type: Some("a"),
        revoke_at_providers: Some(true),
        effective_time: Some(1),
        revocation_time: Some(1),
        transmitter: Some("a"),
        subject_sha256: Some("a"),
        action: Some("a"),
        delay_seconds: Some(1),
        subscription: Some("a"),
        count: Some(1),
        oldest_time: Some(1),
        webhook_id: Some("a"),
        attempts: Some(1),
        seq: Some(1),
        reserved: all_reserved_fields(),
    };
    let serde_json::Value::Object(m) = serde_json::to_value(&e).unwrap() else {
        panic!("an event is an object");
    };
    let mut fields = BTreeSet::new();
    for (k, v) in m {
        // A member that is an object of fixed members lists them as
        // `field.member`; `undeclared` and `details_in_clear` are keyed by
        // request field names.
        if let (serde_json::Value::Object(inner), false) =
            (&v, k == "undeclared" || k == "details_in_clear")
        {
            fields.extend(inner.keys().map(|i| format!("{k}.{i}")));
        }
        fields.insert(k);
    }
    fields
}

/// Every reserved field set (no `..`, as above).
fn all_reserved_fields() -> ReservedFields<'static> {
    ReservedFields {
        _none: std::marker::PhantomData,
    }
}

/// The reserved event fields as serialized.
fn reserved_fields() -> BTreeSet<String> {
    let serde_json::Value::Object(m) = serde_json::to_value(all_reserved_fields()).unwrap() else {
        panic!("an object");
    };
    m.keys().cloned().collect()
}

/// The first cells of the rows of the tables headed `first` whose `col`th
/// cell starts with `mark`, each one code span.
fn marked(text: &str, first: &str, col: usize, mark: &str) -> BTreeSet<String> {
    table_rows(text, &[first])
        .into_iter()
        .filter(|r| r.get(col).is_some_and(|c| c.starts_with(mark)))
        .map(|r| only_code(&r[0]).unwrap().to_string())
        .collect()
}

/// The metrics a registry renders once every labelled metric has a value:
/// `# TYPE` lines, name and type.
fn rendered(m: &Metrics) -> BTreeSet<(String, String)> {
    m.derives
        .with_label_values(&["issued", "none", "other"])
        .inc();
    m.latency.with_label_values(&["issued"]).observe(0.001);
    m.policy_info.set_only("hash");
    m.rate_limited.with_label_values(&["peer"]).inc();
    m.connections_refused
        .with_label_values(&["api", "uid"])
        .inc();
    m.connections_shed.with_label_values(&["api"]).inc();
    m.proxy_requests
        .with_label_values(&["other", "other", "completed"])
        .inc();
    m.proxy_latency.with_label_values(&["other"]).observe(0.001);
    m.upstream_exchanges
        .with_label_values(&["org", "issued"])
        .inc();
    m.upstream_exchange_latency
        .with_label_values(&["org", "issued"])
        .observe(0.001);
    m.ssf_events
        .with_label_values(&["idp", "session-revoked", "stopped"])
        .inc();
    m.ssf_last_event.with_label_values(&["idp"]).set(1.0);
    m.ssf_unmapped.with_label_values(&["idp"]).inc();
    let w = &m.webhooks;
    w.deliveries.with_label_values(&["siem", "delivered"]).inc();
    w.backlog.with_label_values(&["siem"]).set(1);
    w.dropped.with_label_values(&["siem"]).inc();
    w.dead_letters.with_label_values(&["siem"]).set(1);
    m.render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

#[test]
fn every_metric_is_documented_and_every_documented_metric_is_registered() {
    let text = read_doc("OPERATIONS.md");
    let doc = doc_metrics(&text);
    let metrics = Metrics::new();
    let code = metrics.catalogue();
    // The catalogue is what the registry serves: the exposition, with every
    // labelled metric given a value, has exactly its names and types.
    let catalogued: BTreeSet<(String, String)> = code
        .iter()
        .map(|m| (m.name.clone(), m.kind.to_string()))
        .collect();
    assert_eq!(rendered(&metrics), catalogued);
    assert!(code.len() >= 10 && doc.len() >= 10, "{code:?} / {doc:?}");
    let problems = compare_metrics(&doc, &code);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // A page that drifted fails, one way at a time.
    let dropped: Vec<DocMetric> = doc
        .iter()
        .filter(|d| d.0 != "credbroker_connections_shed_total")
        .cloned()
        .collect();
    assert!(compare_metrics(&dropped, &code)
        .iter()
        .any(|p| p.starts_with("credbroker_connections_shed_total: registered, missing")));
    let mut extra = doc.clone();
    extra.push(("credbroker_tokens_total".into(), "counter".into(), vec![]));
    assert!(compare_metrics(&extra, &code)
        .iter()
        .any(|p| p == "credbroker_tokens_total: documented, but no such metric is registered"));
    let mut retyped = doc.clone();
    retyped
        .iter_mut()
        .find(|d| d.0 == "credbroker_frozen")
        .unwrap()
        .1 = "counter".into();
    assert!(compare_metrics(&retyped, &code)
        .iter()
        .any(|p| p.starts_with("credbroker_frozen: documented as counter")));
    let mut relabelled = doc.clone();
    relabelled
        .iter_mut()
        .find(|d| d.0 == "credbroker_derives_total")
        .unwrap()
        .2
        .pop();
    assert!(compare_metrics(&relabelled, &code)
        .iter()
        .any(|p| p.starts_with("credbroker_derives_total: documented labels")));
}

#[test]
fn every_event_type_and_field_is_documented_and_every_documented_one_exists() {
    let text = read_doc("OPERATIONS.md");
    let kinds: BTreeSet<String> = Kind::ALL.iter().map(|k| k.as_str().to_string()).collect();
    let fields = event_fields();
    let doc_kinds = doc_names(&text, "Event");
    let doc_fields = doc_names(&text, "Field");
    // Positive control: both sides were found.
    assert!(
        kinds.len() >= 20 && doc_kinds.len() >= 20,
        "{kinds:?} / {doc_kinds:?}"
    );
    assert!(
        fields.len() >= 20 && doc_fields.len() >= 20,
        "{fields:?} / {doc_fields:?}"
    );
    let mut problems = compare_names("event type", &doc_kinds, &kinds);
    problems.extend(compare_names("event field", &doc_fields, &fields));
    let rows = table_rows(&text, &["Event"]);
    problems.extend(unknown_fields_listed(&rows, &fields));
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // A page that drifted fails, one way at a time.
    let without = |names: &[String], n: &str| -> Vec<String> {
        names.iter().filter(|x| *x != n).cloned().collect()
    };
    assert!(compare_names(
        "event type",
        &without(&doc_kinds, "policy.reload_failed"),
        &kinds
    )
    .iter()
    .any(|p| p.starts_with("policy.reload_failed: in the code (event type), missing")));
    let mut extra = doc_kinds.clone();
    extra.push("token.leaked".into());
    assert!(compare_names("event type", &extra, &kinds)
        .iter()
        .any(|p| p == "token.leaked: documented (event type), not in the code"));
    assert!(
        compare_names("event field", &without(&doc_fields, "kid"), &fields)
            .iter()
            .any(|p| p.starts_with("kid: in the code (event field), missing"))
    );
    let mut listed = rows.clone();
    listed[0][1].push_str(", `access_token`");
    assert_eq!(
        unknown_fields_listed(&listed, &fields),
        [format!(
            "{}: lists access_token, which is not an event field",
            rows[0][0]
        )]
    );
    let mut extra = doc_fields.clone();
    extra.push("token".into());
    assert!(compare_names("event field", &extra, &fields)
        .iter()
        .any(|p| p == "token: documented (event field), not in the code"));
}

/// The field names an event row lists that are not fields: its second
/// cell's code spans, outside parentheses (which quote values, such as
/// `outcome` (`issued`)).
fn unknown_fields_listed(rows: &[Vec<String>], fields: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for row in rows {
        let mut outside = String::new();
        let mut depth = 0usize;
        for c in row[1].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ if depth == 0 => outside.push(c),
                _ => {}
            }
        }
        for f in spans(&outside) {
            if !fields.contains(&f) {
                problems.push(format!(
                    "{}: lists {f}, which is not an event field",
                    row[0]
                ));
            }
        }
    }
    problems
}

#[test]
fn every_policy_reload_reason_is_documented_and_every_documented_one_exists() {
    let text = read_doc("OPERATIONS.md");
    let code: BTreeSet<String> = Refusal::ALL
        .iter()
        .map(|r| r.as_str().to_string())
        .collect();
    let doc = doc_names(&text, "Reason");
    assert!(code.len() >= 5 && doc.len() >= 5, "{code:?} / {doc:?}");
    let problems = compare_names("reload reason", &doc, &code);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // A page that drifted fails, both ways.
    let dropped: Vec<String> = doc
        .iter()
        .filter(|r| *r != "unknown_service")
        .cloned()
        .collect();
    assert!(compare_names("reload reason", &dropped, &code)
        .iter()
        .any(|p| p.starts_with("unknown_service: in the code (reload reason), missing")));
    let mut extra = doc.clone();
    extra.push("busy".into());
    assert!(compare_names("reload reason", &extra, &code)
        .iter()
        .any(|p| p == "busy: documented (reload reason), not in the code"));
}

/// A log line the page quotes as `LEVEL TARGET: MESSAGE name=value ...`.
#[derive(Debug)]
struct DocLogLine {
    level: String,
    target: String,
    message: String,
    fields: Vec<String>,
}

/// The code spans of the "Logs" section (inline ones, which may wrap, and
/// each line of a fenced block) that start with a level.
fn doc_log_lines(text: &str) -> Vec<DocLogLine> {
    let start = text.find("\n## Logs\n").expect("a Logs section") + 1;
    let rest = &text[start..];
    let end = rest[1..].find("\n## ").map_or(rest.len(), |e| e + 1);
    let (mut spans, mut prose, mut fenced) = (Vec::new(), String::new(), false);
    for line in rest[..end].lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced {
            spans.push(line.trim().to_string());
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    spans.extend(
        prose
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")),
    );
    spans.iter().filter_map(|s| parse_log_line(s)).collect()
}

fn parse_log_line(span: &str) -> Option<DocLogLine> {
    let (level, rest) = span.split_once(' ')?;
    if !["INFO", "WARN", "ERROR"].contains(&level) {
        return None;
    }
    let (target, after) = rest.split_once(": ")?;
    // The message ends where the first ` name=` begins.
    let field_at = |i: usize| -> Option<usize> {
        let name: String = after[i + 1..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        (!name.is_empty() && after[i + 1 + name.len()..].starts_with('=')).then_some(name.len())
    };
    let starts: Vec<(usize, usize)> = after
        .match_indices(' ')
        .filter_map(|(i, _)| field_at(i).map(|n| (i, n)))
        .collect();
    let message = starts.first().map_or(after, |&(i, _)| &after[..i]);
    Some(DocLogLine {
        level: level.to_string(),
        target: target.to_string(),
        message: message.to_string(),
        fields: starts
            .iter()
            .map(|&(i, n)| after[i + 1..i + 1 + n].to_string())
            .collect(),
    })
}

/// `text` without the contents of its string literals.
fn without_literals(text: &str) -> String {
    let (mut out, mut inside, mut escaped) = (String::new(), false, false);
    for c in text.chars() {
        match (inside, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => inside = !inside,
            (false, _, c) => out.push(c),
            _ => {}
        }
    }
    out
}

/// The `tracing::LEVEL!(...)` calls of `source`, each up to its closing
/// parenthesis.
fn tracing_calls<'s>(source: &'s str, level: &str) -> Vec<&'s str> {
    let open = format!("tracing::{}!(", level.to_ascii_lowercase());
    source
        .match_indices(&open)
        .map(|(at, _)| {
            let mut depth = 0;
            let len = source[at..]
                .char_indices()
                .find(|&(_, c)| {
                    depth += i32::from(c == '(') - i32::from(c == ')');
                    c == ')' && depth == 0
                })
                .map_or(source.len() - at, |(i, _)| i + 1);
            &source[at..at + len]
        })
        .collect()
}

/// Whether the code logs `line`: a call at its level in its module whose
/// message starts with the quoted one and that names every quoted field.
fn check_log_line(line: &DocLogLine) -> Result<(), String> {
    let module = line
        .target
        .strip_prefix("credbroker::")
        .ok_or_else(|| format!("{line:?}: the target is not a credbroker module"))?
        .replace("::", "/");
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let source = [format!("{module}.rs"), format!("{module}/mod.rs")]
        .iter()
        .find_map(|f| std::fs::read_to_string(src.join(f)).ok())
        .ok_or_else(|| format!("{line:?}: no module src/{module}.rs"))?;
    let literal = format!("\"{}", line.message);
    let call = tracing_calls(&source, &line.level)
        .into_iter()
        .find(|c| c.contains(&literal))
        .ok_or_else(|| {
            format!(
                "{}: no tracing::{}! in src/{module} logs {:?}",
                line.target,
                line.level.to_ascii_lowercase(),
                line.message
            )
        })?;
    let code = without_literals(call);
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    for f in &line.fields {
        let named = code.match_indices(f.as_str()).any(|(i, _)| {
            !is_word(code[..i].chars().next_back()) && !is_word(code[i + f.len()..].chars().next())
        });
        if !named {
            return Err(format!("{:?}: the call has no field {f}", line.message));
        }
    }
    Ok(())
}

#[test]
fn every_quoted_log_line_is_logged_by_the_code() {
    let text = read_doc("OPERATIONS.md");
    let lines = doc_log_lines(&text);
    assert!(lines.len() >= 10, "{lines:#?}");
    let problems: Vec<String> = lines
        .iter()
        .filter_map(|l| check_log_line(l).err())
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // A page that drifted fails: a reworded message, a field the call does
    // not have, another level, another module.
    for (from, to) in [
        ("signing key rotated kid", "signing key turned kid"),
        ("peer_uid=1001", "peer=1001"),
        (
            "WARN credbroker::derive::ops: emergency",
            "INFO credbroker::derive::ops: emergency",
        ),
        (
            "ERROR credbroker::derive::freeze: the emergency freeze record was",
            "ERROR credbroker::derive::ops: the emergency freeze record was",
        ),
    ] {
        let bent = text.replacen(from, to, 1);
        assert_ne!(bent, text, "{from}");
        let failing: Vec<String> = doc_log_lines(&bent)
            .iter()
            .filter_map(|l| check_log_line(l).err())
            .collect();
        assert_eq!(failing.len(), 1, "{from} -> {to}: {failing:?}");
    }
}

/// The message of a `tracing` call: its first string literal.
fn message_of(call: &str) -> Option<&str> {
    let start = call.find('"')? + 1;
    let len = call[start..].find('"')?;
    Some(&call[start..start + len])
}

/// The log lines of the key ring (`src/derive/mint/mod.rs`, whose
/// target is `credbroker::derive::mint`) that the Logs section does not
/// quote, as `LEVEL target: message`.
fn unquoted_key_ring_lines(text: &str) -> Vec<String> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/derive/mint/mod.rs");
    let source = std::fs::read_to_string(path).unwrap();
    let quoted = doc_log_lines(text);
    let mut missing = Vec::new();
    for level in ["INFO", "WARN", "ERROR"] {
        for call in tracing_calls(&source, level) {
            let message = message_of(call).unwrap();
            let listed = quoted.iter().any(|l| {
                l.level == level
                    && l.target == "credbroker::derive::mint"
                    && message.starts_with(l.message.as_str())
            });
            if !listed {
                missing.push(format!("{level} credbroker::derive::mint: {message}"));
            }
        }
    }
    missing
}

/// Issue 40 item 7: every line the key ring logs is on the page, the one
/// a replica writes when it learns of an activation from the store too
/// (an operator watching a rotation reads them all).
#[test]
fn every_line_the_key_ring_logs_is_quoted() {
    let text = read_doc("OPERATIONS.md");
    let missing = unquoted_key_ring_lines(&text);
    assert!(
        missing.is_empty(),
        "not in docs/OPERATIONS.md, Logs: {missing:#?}"
    );
    // A page without one of them fails.
    let line = "`INFO credbroker::derive::mint: signing key activated kid=...`";
    let bent = text.replacen(line, "", 1);
    assert_ne!(bent, text, "the activation line is quoted as {line}");
    assert_eq!(
        unquoted_key_ring_lines(&bent),
        vec!["INFO credbroker::derive::mint: signing key activated".to_string()]
    );
}

#[test]
fn reserved_event_types_and_fields_are_marked_and_nothing_else_is() {
    let text = read_doc("OPERATIONS.md");
    const MARK: &str = "reserved: not yet emitted";
    let kinds: BTreeSet<String> = Kind::RESERVED
        .iter()
        .map(|k| k.as_str().to_string())
        .collect();
    let all: BTreeSet<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    assert!(kinds.iter().all(|k| all.contains(k.as_str())), "{kinds:?}");
    // Every kind named for this wave is emitted now (issue 41's
    // client_keys.rotated, issue 43's person.* and ssf.event_received,
    // issue 44's webhook.*): the list is empty, and the page marks none.
    // The event table's meaning cell, and the field table's, start with the mark.
    let doc_kinds = marked(&text, "Event", 2, MARK);
    assert_eq!(
        doc_kinds, kinds,
        "event types marked \"{MARK}\" against Kind::RESERVED"
    );
    let fields = reserved_fields();
    // A floor that shows the table was read: issues 41, 42, 43 and 44
    // emit sixteen of them since (retired_kid; request_sha256; source,
    // ssf_event_type, revoke_at_providers, effective_time, revocation_time;
    // transmitter, subject_sha256, action, delay_seconds), issue 44 all of
    // its own (trace_id; subscription, count, oldest_time, webhook_id,
    // attempts): none is left, and the page marks none.
    let doc_fields = marked(&text, "Field", 1, MARK);
    assert_eq!(
        doc_fields, fields,
        "fields marked \"{MARK}\" against ReservedFields"
    );
    // Nothing serializes them unless set: a new event carries none.
    let e = Event::new(1, Kind::DeriveIssued, "a");
    let v = serde_json::to_value(&e).unwrap();
    assert!(fields.iter().all(|f| v.get(f).is_none()), "{v}");
    // The control: the mark is read (an unmarked page finds none).
    let sample =
        "| Field | Meaning |\n|---|---|\n| `x` | reserved: not yet emitted (issue 99). |\n";
    assert_eq!(
        marked(sample, "Field", 1, MARK),
        BTreeSet::from(["x".to_string()])
    );
    let unmarked = text.replace(MARK, "emitted");
    assert!(marked(&unmarked, "Field", 1, MARK).is_empty());
}

#[test]
fn every_reserved_metric_is_documented_as_reserved_and_not_registered() {
    let text = read_doc("OPERATIONS.md");
    let doc: Vec<DocMetric> = table_rows(&text, &["Reserved metric", "Type", "Labels", "Issue"])
        .into_iter()
        .map(|r| {
            let name = only_code(&r[0])
                .unwrap_or_else(|| panic!("a metric cell must be one code span: {r:?}"))
                .to_string();
            (name, r[1].clone(), spans(&r[2]))
        })
        .collect();
    let code: Vec<MetricInfo> = RESERVED
        .iter()
        .map(|m| MetricInfo {
            name: m.name.to_string(),
            kind: m.kind,
            labels: m.labels.iter().map(|l| l.to_string()).collect(),
            help: String::new(),
        })
        .collect();
    // Issues 40 and 41 registered five of them since, issue 43 the two of
    // the person stop and the three of the SSF receiver, issue 44 the
    // dropped spans and the five of event delivery: issue 43's
    // introspection counter is left.
    let problems = compare_metrics(&doc, &code);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Reserved means not served: none is registered (a feature that
    // registers one takes it out of the list).
    let registered: BTreeSet<String> = Metrics::new()
        .catalogue()
        .into_iter()
        .map(|m| m.name)
        .collect();
    let both: Vec<&str> = RESERVED
        .iter()
        .map(|m| m.name)
        .filter(|n| registered.contains(*n))
        .collect();
    assert!(both.is_empty(), "registered and still reserved: {both:?}");
    assert!(RESERVED.iter().all(|m| m.name.starts_with("credbroker_")));
    // The control: a dropped row is caught.
    assert!(!compare_metrics(&doc[1..], &code).is_empty());
}
