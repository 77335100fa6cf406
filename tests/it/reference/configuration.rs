//! `docs/CONFIGURATION.md` against the config parser: every key the parser
//! accepts is documented, every documented key is accepted (by the real
//! `Config::parse`, not only by the traced field lists), with its type,
//! whether it is required, and each default written as a TOML value.

use std::path::Path;

use credbroker::internals::config::{
    accepted_keys, AcceptedKey, Config, ConfigError, RESERVED_KEYS,
};

use super::{only_code, read_doc, table_rows};

/// A config that parses, with one trusted issuer and one provider, so that
/// keys of every table can be added to it or left out of it.
const MINIMAL: &str = r#"
agent = "helper"
issuer = "https://broker.example"
policy = "policy.toml"
store = "store"

[socket]
path = "run/broker.sock"

[keys]
master_key_file = "keys/master.key"

[[trusted_issuers]]
issuer = "https://broker.example"
jwks_file = "jwks.json"
sign_in = { kind = "local" }

[providers.demo]
issuer = "https://id.example"
client_id = "demo-client"

[upstreams.demo]
issuer = "https://as.example"
client_id = "broker"
client_secret_file = "as-secret"
subject_issuers = ["https://broker.example"]

[upstreams.demo.resources."https://api.example/notes"]
audience = ["api://notes"]

[ssf.transmitters.demo]
issuer = "https://tx.example"
push_authorization_file = "ssf-push"
trusted_issuers = ["https://broker.example"]
[webhooks.demo]
url = "https://siem.example/hook"
events = ["derive.denied"]
secret_files = ["whsec"]
"#;

/// One row of the page's key tables.
#[derive(Debug, Clone)]
struct DocKey {
    key: String,
    toml_type: String,
    default: String,
    required: bool,
}

/// The key rows of the page: the tables headed `Key | Type | Default |
/// Required`.
fn doc_keys(text: &str) -> Vec<DocKey> {
    table_rows(text, &["Key", "Type", "Default", "Required"])
        .into_iter()
        .map(|row| DocKey {
            key: only_code(&row[0])
                .unwrap_or_else(|| panic!("a key cell must be one code span: {row:?}"))
                .to_string(),
            toml_type: toml_type(&row[1]),
            default: row[2].clone(),
            required: row[3] == "yes",
        })
        .collect()
}

/// The TOML type a documented type is written as: paths, URLs and
/// durations are strings.
fn toml_type(doc_type: &str) -> String {
    match doc_type {
        "path" | "URL" | "duration" => "string".into(),
        other => other.into(),
    }
}

/// The page against the traced key list: both directions, types, and the
/// required flag where the parser itself requires a key.
fn compare(doc: &[DocKey], accepted: &[AcceptedKey]) -> Vec<String> {
    let mut problems = Vec::new();
    for a in accepted {
        match doc.iter().find(|d| d.key == a.key) {
            None => problems.push(format!(
                "{}: accepted by the parser, missing from docs/CONFIGURATION.md",
                a.key
            )),
            Some(d) => {
                if d.toml_type != a.toml_type {
                    problems.push(format!(
                        "{}: documented as {}, the parser reads {}",
                        a.key, d.toml_type, a.toml_type
                    ));
                }
                if a.required && !d.required {
                    problems.push(format!(
                        "{}: the parser requires it, the page does not say yes",
                        a.key
                    ));
                }
            }
        }
    }
    for d in doc {
        if !accepted.iter().any(|a| a.key == d.key) {
            problems.push(format!("{}: documented, but the parser refuses it", d.key));
        }
    }
    problems
}

/// `key` with its placeholders (`[]`, `<name>`) as they are in [`MINIMAL`].
fn segments(key: &str) -> Vec<String> {
    key.split('.')
        .flat_map(|s| match s.strip_suffix("[]") {
            Some(array) => vec![array.to_string(), "0".to_string()],
            None if s == "<name>" => vec!["demo".to_string()],
            None if s == "<uri>" => vec!["https://api.example/notes".to_string()],
            None => vec![s.to_string()],
        })
        .collect()
}

/// The table that holds `key`'s value, created on the way when `create`.
fn parent<'t>(
    table: &'t mut toml::Table,
    key: &str,
    create: bool,
) -> Option<(&'t mut toml::Table, String)> {
    let mut segs = segments(key);
    let leaf = segs.pop()?;
    let mut cur = table;
    let mut i = 0;
    while i < segs.len() {
        let s = &segs[i];
        if segs.get(i + 1).is_some_and(|n| n == "0") {
            let arr = cur.get_mut(s)?.as_array_mut()?;
            cur = arr.get_mut(0)?.as_table_mut()?;
            i += 2;
            continue;
        }
        if create && !cur.contains_key(s) {
            cur.insert(s.clone(), toml::Value::Table(toml::Table::new()));
        }
        cur = cur.get_mut(s)?.as_table_mut()?;
        i += 1;
    }
    Some((cur, leaf))
}

fn minimal() -> toml::Table {
    toml::from_str(MINIMAL).unwrap()
}

fn parse(table: &toml::Table) -> Result<Config, ConfigError> {
    Config::parse(
        Path::new("/etc/credbroker/credbroker.toml"),
        &toml::to_string(table).unwrap(),
    )
}

/// A value of `toml_type` that the parser reads without a type error.
fn placeholder(toml_type: &str) -> toml::Value {
    match toml_type {
        "string" => toml::Value::String("x".into()),
        "integer" => toml::Value::Integer(1),
        "boolean" => toml::Value::Boolean(false),
        "array of strings" => toml::Value::Array(vec!["x".into()]),
        "array of integers" => toml::Value::Array(vec![1.into()]),
        _ => toml::Value::Table(toml::Table::new()),
    }
}

/// Checks that need the real parser: a documented key is not refused as
/// unknown; a key documented as required that the traced list calls
/// optional is required by stage two (the file without it is refused); a
/// default written as one TOML value is what the parser uses without it.
/// Returns the problems and how many defaults were compared.
fn probe(doc: &[DocKey]) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let baseline = format!(
        "{:?}",
        parse(&minimal()).expect("the minimal config parses")
    );
    let mut defaults = 0;
    for d in doc {
        let mut with = minimal();
        let present = parent(&mut with, &d.key, false).is_some_and(|(t, l)| t.contains_key(&l));
        if !present {
            if let Some((t, leaf)) = parent(&mut with, &d.key, true) {
                t.insert(leaf, placeholder(&d.toml_type));
            }
            if let Err(ConfigError::Invalid(p)) = parse(&with) {
                if p.iter().any(|p| p.message == "unknown key") {
                    problems.push(format!(
                        "{}: documented, but Config::parse says unknown key",
                        d.key
                    ));
                }
            }
        }
        if d.required {
            // Required when its table is present: the table is made if
            // the minimal config has none, and the key left out of it.
            let mut without = minimal();
            let placed = parent(&mut without, &d.key, true)
                .map(|(t, leaf)| t.remove(&leaf))
                .is_some();
            if !placed || parse(&without).is_ok() {
                problems.push(format!(
                    "{}: documented as required, but a config without it parses",
                    d.key
                ));
            }
        }
        let Some(value) = only_code(&d.default).and_then(|v| {
            toml::from_str::<toml::Table>(&format!("v = {v}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
        }) else {
            continue;
        };
        defaults += 1;
        let mut set = minimal();
        match parent(&mut set, &d.key, true) {
            Some((t, leaf)) => {
                t.insert(leaf, value);
            }
            None => {
                problems.push(format!("{}: cannot place the default", d.key));
                continue;
            }
        }
        match parse(&set) {
            Ok(c) if format!("{c:?}") == baseline => {}
            Ok(_) => problems.push(format!(
                "{}: the documented default {} is not what the parser uses without the key",
                d.key, d.default
            )),
            Err(e) => problems.push(format!(
                "{}: the documented default {} is refused: {e}",
                d.key, d.default
            )),
        }
    }
    (problems, defaults)
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_is_accepted() {
    let text = read_doc("CONFIGURATION.md");
    let doc = doc_keys(&text);
    let accepted = accepted_keys();
    // Positive control: both lists were found (an empty pair would agree).
    assert!(accepted.len() >= 60, "traced only {accepted:?}");
    assert!(doc.len() >= 60, "read only {doc:?}");
    let mut problems = compare(&doc, &accepted);
    let (probed, defaults) = probe(&doc);
    problems.extend(probed);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(defaults >= 15, "only {defaults} defaults were compared");

    // The same checks fail on a page that drifted, one way at a time.
    let without =
        |key: &str| -> Vec<DocKey> { doc.iter().filter(|d| d.key != key).cloned().collect() };
    let missing = compare(&without("socket.header_timeout"), &accepted);
    assert!(
        missing
            .iter()
            .any(|p| p.starts_with("socket.header_timeout: accepted by the parser, missing")),
        "{missing:?}"
    );
    let mut extra = doc.clone();
    extra.push(DocKey {
        key: "socket.backlog".into(),
        toml_type: "integer".into(),
        default: "`128`".into(),
        required: false,
    });
    let refused = compare(&extra, &accepted);
    assert!(
        refused
            .iter()
            .any(|p| p == "socket.backlog: documented, but the parser refuses it"),
        "{refused:?}"
    );
    let (probed, _) = probe(&extra[extra.len() - 1..]);
    assert!(
        probed.iter().any(
            |p| p.starts_with("socket.backlog: documented, but Config::parse says unknown key")
        ),
        "{probed:?}"
    );
    let mut retyped = doc.clone();
    let burst = retyped
        .iter_mut()
        .find(|d| d.key == "limits.burst")
        .unwrap();
    burst.toml_type = "string".into();
    assert!(compare(&retyped, &accepted)
        .iter()
        .any(|p| p == "limits.burst: documented as string, the parser reads integer"));
    let mut optional = doc.clone();
    optional
        .iter_mut()
        .find(|d| d.key == "agent")
        .unwrap()
        .required = false;
    assert!(compare(&optional, &accepted)
        .iter()
        .any(|p| p.starts_with("agent: the parser requires it")));
    let wrong_default = |key: &str, default: &str| {
        let mut d = doc.iter().find(|d| d.key == key).unwrap().clone();
        d.default = default.into();
        probe(&[d]).0
    };
    assert!(wrong_default("socket.max_connections", "`513`")
        .iter()
        .any(|p| p.contains("is not what the parser uses")));
    assert!(
        wrong_default("trusted_issuers[].algs", "`[\"RS256\", \"ES256\"]`")
            .iter()
            .any(|p| p.contains("is not what the parser uses"))
    );
    let mut required = doc.iter().find(|d| d.key == "dpop.algs").unwrap().clone();
    required.required = true;
    assert!(probe(&[required])
        .0
        .iter()
        .any(|p| p.starts_with("dpop.algs: documented as required")));
}

/// A value of the documented type `doc_type` for a reserved key.
fn reserved_value(doc_type: &str) -> toml::Value {
    match doc_type {
        "boolean" => toml::Value::Boolean(true),
        "integer" => toml::Value::Integer(1),
        "float" => toml::Value::Float(0.5),
        "array of strings" => toml::Value::Array(vec!["x".into()]),
        "string" | "duration" | "URL" | "path" => toml::Value::String("x".into()),
        other => panic!("{other}: give the reserved key's type a value here"),
    }
}

/// `minimal()` with the reserved key `key` set, and the key's path as the
/// loader names it.
fn with_reserved(key: &str, value: toml::Value) -> (toml::Table, String) {
    let mut table = minimal();
    let mut cur = &mut table;
    let mut shown = String::new();
    let segs: Vec<&str> = key.split('.').collect();
    for (i, seg) in segs.iter().enumerate() {
        let (name, index) = match seg.strip_suffix("[]") {
            Some(a) => (a, true),
            None => (*seg, false),
        };
        let name = match name {
            "<name>" => "demo",
            "<uri>" => "https://api.example/notes",
            n => n,
        };
        if !shown.is_empty() {
            shown.push('.');
        }
        if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            shown.push_str(name);
        } else {
            shown.push_str(&format!("{name:?}"));
        }
        if i == segs.len() - 1 {
            cur.insert(name.to_string(), value.clone());
            break;
        }
        if index {
            // The minimal config's first element of the array of tables.
            let arr = cur.get_mut(name).and_then(|v| v.as_array_mut()).unwrap();
            shown.push_str("[0]");
            cur = arr[0].as_table_mut().unwrap();
        } else {
            cur = cur
                .entry(name.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .unwrap();
        }
    }
    (table, shown)
}

#[test]
fn every_reserved_key_is_documented_and_refused_as_reserved() {
    let text = read_doc("CONFIGURATION.md");
    let doc: Vec<(String, String, String, String)> =
        table_rows(&text, &["Reserved key", "Type", "Issue", "Status"])
            .into_iter()
            .map(|r| {
                (
                    only_code(&r[0])
                        .unwrap_or_else(|| panic!("a key cell must be one code span: {r:?}"))
                        .to_string(),
                    r[1].clone(),
                    r[2].clone(),
                    r[3].clone(),
                )
            })
            .collect();
    let code: Vec<(String, String, String, String)> = RESERVED_KEYS
        .iter()
        .map(|r| {
            (
                r.key.to_string(),
                r.doc_type.to_string(),
                r.issue.to_string(),
                "reserved: not yet implemented".to_string(),
            )
        })
        .collect();
    // Both ways, with type, issue and the mark, in the same order. A
    // floor that shows the table was read: the features of the wave take
    // their keys out as they land (issue 43: `[revocation]`, 5,
    // `[ssf.transmitters.<name>]`, 12, and subject-token introspection, 5;
    // issue 41: 4; issue 44: `[telemetry]`, 11): one is left.
    assert!(!code.is_empty(), "{code:?}");
    assert_eq!(
        doc, code,
        "docs/CONFIGURATION.md \"Reserved keys\" against RESERVED_KEYS"
    );

    // None is also accepted (a feature that implements a key takes it out).
    let accepted = accepted_keys();
    let both: Vec<&str> = RESERVED_KEYS
        .iter()
        .map(|r| r.key)
        .filter(|k| accepted.iter().any(|a| a.key == *k))
        .collect();
    assert!(both.is_empty(), "accepted and still reserved: {both:?}");

    // The control: a config without them loads.
    parse(&minimal()).expect("the minimal config parses");
    // Each is refused alone, as reserved (not as an unknown key), naming
    // the file, the key and the issue.
    for r in RESERVED_KEYS {
        let (table, shown) = with_reserved(r.key, reserved_value(r.doc_type));
        let Err(ConfigError::Invalid(p)) = parse(&table) else {
            panic!("{}: the config with it parses", r.key);
        };
        let want = format!("{shown}: reserved: not yet implemented (issue {})", r.issue);
        assert_eq!(p.len(), 1, "{}: {p:?}", r.key);
        let line = p[0].to_string();
        assert!(
            line.starts_with("/etc/credbroker/credbroker.toml:") && line.ends_with(&want),
            "{}: {line}",
            r.key
        );
    }
}
