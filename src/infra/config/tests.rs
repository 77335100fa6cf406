use super::*;

const FILE: &str = "/etc/credbroker/credbroker.toml";

/// A canary standing for a secret pasted into the wrong place.
const CANARY: &str = "CANARY-ghp_7f3a9c";

/// A valid configuration; tests change one thing at a time.
const BASE: &str = r#"agent = "repo-helper"
issuer = "https://broker.example/"
policy = "policy.toml"
store = "data"

[socket]
path = "credbroker.sock"
allowed_uids = [1000]

[keys]
master_key_file = "keys/master.key"

[[trusted_issuers]]
issuer = "https://idp.example"
jwks_file = "idp-jwks.json"
sign_in = { kind = "oidc", client_id = "broker" }
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new(FILE), text)
}

/// The problems of a text that must be refused.
fn problems(text: &str) -> Vec<Problem> {
    match parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(ConfigError::Invalid(p)) => p,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The (first) problem reported for `key`; fails if there is none.
fn problem_for<'p>(p: &'p [Problem], key: &str) -> &'p Problem {
    p.iter()
        .find(|x| x.key.as_deref() == Some(key))
        .unwrap_or_else(|| panic!("no problem for {key} in {p:#?}"))
}

fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from}");
    text.replacen(from, to, 1)
}

/// `text` with `line` inserted after the first line equal to `after`.
fn insert_after(text: &str, after: &str, line: &str) -> String {
    let mut out = String::new();
    let mut done = false;
    for l in text.lines() {
        out.push_str(l);
        out.push('\n');
        if !done && l == after {
            out.push_str(line);
            out.push('\n');
            done = true;
        }
    }
    assert!(done, "{after}");
    out
}

/// 1-based line number of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn valid_config_parses_with_defaults() {
    let c = parse(BASE).unwrap();
    let dir = Path::new("/etc/credbroker");
    assert_eq!(c.agent, "repo-helper");
    // The trailing slash is dropped: `iss` and `htu` are built from it.
    assert_eq!(c.issuer, "https://broker.example");
    assert_eq!(c.policy, dir.join("policy.toml"));
    assert_eq!(c.store.sled_dir(), Some(dir.join("data").as_path()));
    assert_eq!(c.audit_log, dir.join("data/audit.jsonl"));
    assert_eq!(c.admin_socket, dir.join("admin.sock"));
    assert_eq!(c.master_key_file, dir.join("keys/master.key"));
    assert_eq!(c.socket.path, dir.join("credbroker.sock"));
    assert_eq!(c.socket.allowed_uids, vec![1000]);
    assert_eq!(c.socket.header_timeout, Duration::from_secs(5));
    assert_eq!(c.socket.max_connections, 512);
    assert!(c.public.is_none());
    assert!(!c.dpop.require_nonce);
    assert_eq!(c.dpop.algs, vec![crate::base::jose::Alg::ES256]);
    assert_eq!(c.dpop.replay_cache_bytes, 16 << 20);
    assert_eq!(
        c.dpop.replay_capacity,
        crate::base::dpop::ReplayCache::capacity_for_bytes(16 << 20)
    );
    assert_eq!(
        c.limits.global_per_second,
        max_derive_rate(c.dpop.replay_capacity)
    );
    let ti = &c.trusted_issuers[0];
    assert_eq!(ti.issuer, "https://idp.example");
    assert_eq!(ti.audience, "repo-helper");
    assert_eq!(ti.jwks, JwksSource::File(dir.join("idp-jwks.json")));
    assert_eq!(ti.token_types, vec!["at+jwt".to_string()]);
    assert_eq!(
        ti.sign_in,
        SignIn::Oidc {
            client_id: "broker".into(),
            client_secret_file: None
        }
    );
    // Absolute paths stay as written.
    let abs = replace(BASE, "store = \"data\"", "store = \"/var/lib/cb\"");
    assert_eq!(
        parse(&abs).unwrap().store.sled_dir(),
        Some(Path::new("/var/lib/cb"))
    );
}

// ------------------------------------------------------------ unknown keys

#[test]
fn every_unknown_key_is_reported_with_its_path_and_position() {
    let text = insert_after(BASE, "path = \"credbroker.sock\"", "pathh = \"x.sock\"");
    let text = insert_after(&text, "store = \"data\"", "stor = \"data2\"");
    let text = insert_after(
        &text,
        "master_key_file = \"keys/master.key\"",
        "master_key = 1",
    );
    let text = insert_after(
        &text,
        "jwks_file = \"idp-jwks.json\"",
        "jwks_fil = \"j.json\"",
    );
    let text = format!(
        "{text}\n[dpop]\nrequire_nonce = true\nalgz = [\"ES256\"]\n\n[limitz]\nburst = 1\n"
    );
    let p = problems(&text);
    let keys = [
        "socket.pathh",
        "stor",
        "keys.master_key",
        "trusted_issuers.0.jwks_fil",
        "dpop.algz",
        "limitz",
    ];
    for key in keys {
        let x = problem_for(&p, key);
        assert_eq!(x.message, "unknown key");
    }
    assert_eq!(p.len(), keys.len(), "{p:#?}");
    // Each names the line and column of the key itself.
    let at = |needle: &str, col: usize| format!("{FILE}:{}:{col}", line_of(&text, needle));
    assert_eq!(problem_for(&p, "socket.pathh").at, at("pathh =", 1));
    assert_eq!(problem_for(&p, "stor").at, at("stor =", 1));
    assert_eq!(problem_for(&p, "keys.master_key").at, at("master_key =", 1));
    assert_eq!(
        problem_for(&p, "trusted_issuers.0.jwks_fil").at,
        at("jwks_fil =", 1)
    );
    assert_eq!(problem_for(&p, "dpop.algz").at, at("algz", 1));
    assert_eq!(problem_for(&p, "limitz").at, at("[limitz]", 1));
    // The rendered error lists them all, one per line.
    let msg = ConfigError::Invalid(p).to_string();
    assert!(
        msg.starts_with("6 problem(s) in the configuration:"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("{}: socket.pathh: unknown key", at("pathh =", 1))),
        "{msg}"
    );
    parse(BASE).unwrap();
}

#[test]
fn unknown_key_inside_sign_in_is_reported() {
    // A misspelt client_secret_file must not be silently ignored (the client
    // would then run without its secret).
    let text = replace(
        BASE,
        "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
        "sign_in = { kind = \"oidc\", client_id = \"broker\", client_secret_fil = \"s\" }",
    );
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:#?}");
    let msg = p[0].to_string();
    assert!(msg.contains("client_secret_fil"), "{msg}");
    assert!(
        p[0].at
            .starts_with(&format!("{FILE}:{}:", line_of(&text, "client_secret_fil"))),
        "{msg}"
    );
    let local = replace(
        BASE,
        "issuer = \"https://idp.example\"",
        "issuer = \"https://broker.example\"",
    );
    let local = replace(
        &local,
        "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
        "sign_in = { kind = \"local\", client_id = \"x\" }",
    );
    assert_eq!(problems(&local).len(), 1);
    let ok = replace(
        BASE,
        "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
        "sign_in = { kind = \"oidc\", client_id = \"broker\", client_secret_file = \"s\" }",
    );
    assert_eq!(
        parse(&ok).unwrap().trusted_issuers[0].sign_in,
        SignIn::Oidc {
            client_id: "broker".into(),
            client_secret_file: Some(PathBuf::from("/etc/credbroker/s"))
        }
    );
}

// ------------------------------------------------------- values not echoed

#[test]
fn values_are_never_echoed_in_messages() {
    let q = format!("\"{CANARY}\"");
    let cases = [
        // Wrong types: the value must not be quoted back.
        replace(
            BASE,
            "allowed_uids = [1000]",
            &format!("allowed_uids = {q}"),
        ),
        replace(
            BASE,
            "allowed_uids = [1000]",
            &format!("allowed_uids = [{q}]"),
        ),
        insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("max_connections = {q}"),
        ),
        // A quote inside the value must not end the redaction early.
        insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("max_connections = \"a\\\"{CANARY}\\\\\""),
        ),
        replace(BASE, "agent = \"repo-helper\"", &format!("agent = [{q}]")),
        replace(
            BASE,
            "agent = \"repo-helper\"",
            &format!("agent = {{ secret = {q} }}"),
        ),
        format!("{BASE}\n[dpop]\nrequire_nonce = {q}\n"),
        replace(
            BASE,
            "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
            &format!("sign_in = {{ kind = {q}, client_id = \"broker\" }}"),
        ),
        replace(
            BASE,
            "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
            &format!("sign_in = {{ kind = \"oidc\", client_id = 5, client_secret = {q} }}"),
        ),
        // Values that parse but fail validation.
        replace(
            BASE,
            "issuer = \"https://broker.example/\"",
            &format!("issuer = {q}"),
        ),
        replace(
            BASE,
            "issuer = \"https://broker.example/\"",
            &format!("issuer = \"https://user:{CANARY}@broker.example\""),
        ),
        replace(
            BASE,
            "issuer = \"https://idp.example\"",
            &format!("issuer = {q}"),
        ),
        insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("header_timeout = {q}"),
        ),
        format!("{BASE}\n[public]\nlisten = {q}\n"),
        format!("{BASE}\n[dpop]\nalgs = [{q}]\n"),
        // An unknown key whose value is the secret.
        insert_after(BASE, "path = \"credbroker.sock\"", &format!("token = {q}")),
        // Syntax errors around the value.
        replace(
            BASE,
            "agent = \"repo-helper\"",
            &format!("agent = \"{CANARY}"),
        ),
        replace(
            BASE,
            "agent = \"repo-helper\"",
            &format!("agent = {CANARY}"),
        ),
        replace(
            BASE,
            "agent = \"repo-helper\"",
            &format!("agent = \"{CANARY}\\q\""),
        ),
        insert_after(BASE, "agent = \"repo-helper\"", &format!("agent = {q}")),
    ];
    for text in &cases {
        let err = match parse(text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e,
        };
        let shown = format!("{err}\n{err:?}");
        assert!(!shown.contains("CANARY"), "value echoed:\n{shown}");
        assert!(!shown.contains("ghp_"), "value echoed:\n{shown}");
    }
    // An integer in the wrong place is not echoed either.
    let text = replace(BASE, "agent = \"repo-helper\"", "agent = 987654321");
    let shown = problems(&text)[0].to_string();
    assert!(!shown.contains("987654321"), "{shown}");
    parse(BASE).unwrap();
}

#[test]
fn type_errors_carry_file_line_and_column() {
    let text = insert_after(
        BASE,
        "path = \"credbroker.sock\"",
        "max_connections = \"many\"",
    );
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:#?}");
    let line = line_of(&text, "max_connections");
    // The column points at the value.
    assert_eq!(p[0].at, format!("{FILE}:{line}:19"), "{p:#?}");
    let missing = replace(BASE, "policy = \"policy.toml\"\n", "");
    let p = problems(&missing);
    assert!(p[0].to_string().contains("policy"), "{p:#?}");
    parse(BASE).unwrap();
}

/// A value of the wrong type or range names its key (serde's own message
/// says only "invalid type ... expected usize"), with file, line and column.
#[test]
fn type_and_range_errors_name_their_key() {
    for (value, what) in [("\"many\"", "invalid type"), ("-1", "invalid value")] {
        let text = insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("max_connections = {value}"),
        );
        let p = problems(&text);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert_eq!(
            p[0].key.as_deref(),
            Some("socket.max_connections"),
            "{p:#?}"
        );
        let line = line_of(&text, "max_connections");
        assert_eq!(p[0].at, format!("{FILE}:{line}:19"), "{p:#?}");
        let shown = p[0].to_string();
        assert!(
            shown.contains("socket.max_connections") && shown.contains(what),
            "{shown}"
        );
    }
    // Positive control: a valid number is accepted under the same key.
    let text = insert_after(BASE, "path = \"credbroker.sock\"", "max_connections = 7");
    assert_eq!(parse(&text).unwrap().socket.max_connections, 7);
}

#[test]
fn validation_problems_are_all_reported_with_their_positions() {
    let text = replace(BASE, "agent = \"repo-helper\"", "agent = \"\"");
    let text = replace(
        &text,
        "issuer = \"https://broker.example/\"",
        "issuer = \"http://broker.example\"",
    );
    let text = insert_after(
        &text,
        "path = \"credbroker.sock\"",
        "header_timeout = \"0s\"",
    );
    let text = format!("{text}\n[dpop]\nreplay_capacity = 15\n");
    let p = problems(&text);
    assert_eq!(p.len(), 4, "{p:#?}");
    let at = |needle: &str| format!("{FILE}:{}:1", line_of(&text, needle));
    assert_eq!(problem_for(&p, "agent").at, at("agent ="));
    assert_eq!(problem_for(&p, "issuer").at, at("issuer = \"http://broker"));
    assert_eq!(
        problem_for(&p, "socket.header_timeout").at,
        at("header_timeout")
    );
    assert_eq!(
        problem_for(&p, "dpop.replay_capacity").at,
        at("replay_capacity")
    );
    parse(BASE).unwrap();
}

#[test]
fn trusted_issuer_problems_point_at_that_issuer() {
    // The trusted issuer's `issuer` key, not the top-level one of the same name.
    let text = replace(
        BASE,
        "issuer = \"https://idp.example\"",
        "issuer = \"http://idp.example\"",
    );
    let p = problems(&text);
    let x = problem_for(&p, "trusted_issuers[0].issuer");
    assert_eq!(
        x.at,
        format!("{FILE}:{}:1", line_of(&text, "http://idp.example"))
    );
    // The second of two issuers.
    let second = "\n[[trusted_issuers]]\nissuer = \"https://idp2.example\"\njwks_uri = \"http://idp2.example/jwks\"\nsign_in = { kind = \"oidc\", client_id = \"b\" }\n";
    let text = format!("{BASE}{second}");
    let p = problems(&text);
    let x = problem_for(&p, "trusted_issuers[1].jwks_uri");
    assert_eq!(x.at, format!("{FILE}:{}:1", line_of(&text, "jwks_uri")));
    let ok = format!("{BASE}{}", second.replace("http://idp2", "https://idp2"));
    assert_eq!(parse(&ok).unwrap().trusted_issuers.len(), 2);
}

// ----------------------------------------------------------------- sign-in

#[test]
fn trusted_issuer_without_sign_in_is_refused() {
    let text = replace(
        BASE,
        "sign_in = { kind = \"oidc\", client_id = \"broker\" }\n",
        "",
    );
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(problem_for(&p, "trusted_issuers[0].sign_in")
        .message
        .contains("sign-in"));
    parse(BASE).unwrap();
}

#[test]
fn local_sign_in_only_for_the_brokers_own_issuer() {
    let local = replace(
        BASE,
        "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
        "sign_in = { kind = \"local\" }",
    );
    // idp.example is not the broker: local accounts cannot vouch for its subs.
    let p = problems(&local);
    assert_eq!(p.len(), 1, "{p:#?}");
    problem_for(&p, "trusted_issuers[0].sign_in");
    // A look-alike of the broker's issuer is not it either.
    for other in [
        "https://broker.example.evil",
        "https://broker.example:8443",
        "http://127.0.0.1",
    ] {
        let text = replace(
            &local,
            "issuer = \"https://idp.example\"",
            &format!("issuer = \"{other}\""),
        );
        assert!(parse(&text).is_err(), "{other}");
    }
    // The broker's own issuer, with or without the trailing slash.
    for own in ["https://broker.example", "https://broker.example/"] {
        let text = replace(
            &local,
            "issuer = \"https://idp.example\"",
            &format!("issuer = \"{own}\""),
        );
        assert_eq!(
            parse(&text).unwrap().trusted_issuers[0].sign_in,
            SignIn::Local,
            "{own}"
        );
    }
}

#[test]
fn unknown_sign_in_kind_is_refused() {
    let text = replace(
        BASE,
        "sign_in = { kind = \"oidc\", client_id = \"broker\" }",
        "sign_in = { kind = \"saml\" }",
    );
    assert_eq!(problems(&text).len(), 1);
    parse(BASE).unwrap();
}

// -------------------------------------------------------- http on loopback

#[test]
fn plain_http_issuer_only_on_loopback() {
    let set = |v: &str| {
        replace(
            BASE,
            "issuer = \"https://broker.example/\"",
            &format!("issuer = \"{v}\""),
        )
    };
    for bad in [
        "http://broker.example",
        "http://127.0.0.1.nip.io",
        "http://localhost.evil.example",
        "http://10.0.0.1:8440",
        "ftp://broker.example",
        "broker.example",
        "https://broker.example/?x=1",
        "https://broker.example/#f",
        "https://user:pw@broker.example",
        "",
    ] {
        let p = problems(&set(bad));
        problem_for(&p, "issuer");
    }
    for good in [
        "http://127.0.0.1:8440",
        "http://localhost:8440",
        "http://[::1]:8440",
        "https://broker.example",
        "https://broker.example/base",
    ] {
        parse(&set(good)).unwrap();
    }
    // The same rule for trusted issuers and their JWKS URIs.
    let ti = replace(
        BASE,
        "issuer = \"https://idp.example\"",
        "issuer = \"http://idp.example\"",
    );
    problem_for(&problems(&ti), "trusted_issuers[0].issuer");
    let uri = replace(
        BASE,
        "jwks_file = \"idp-jwks.json\"",
        "jwks_uri = \"http://idp.example/jwks\"",
    );
    problem_for(&problems(&uri), "trusted_issuers[0].jwks_uri");
    let uri = replace(
        BASE,
        "jwks_file = \"idp-jwks.json\"",
        "jwks_uri = \"https://idp.example/jwks\"",
    );
    assert_eq!(
        parse(&uri).unwrap().trusted_issuers[0].jwks,
        JwksSource::Uri("https://idp.example/jwks".into())
    );
    let local = replace(
        BASE,
        "jwks_file = \"idp-jwks.json\"",
        "jwks_uri = \"http://127.0.0.1:9/jwks\"",
    );
    parse(&local).unwrap();
}

#[test]
fn metrics_listener_is_loopback_unless_allowed_and_never_the_public_port() {
    let with = |public: &str, metrics: &str| {
        format!("{BASE}\n[public]\nlisten = \"{public}\"\n\n[metrics]\n{metrics}\n")
    };
    // Beyond loopback without the dangerous-named key: refused, saying why.
    let p = problems(&with("127.0.0.1:8440", "listen = \"0.0.0.0:9464\""));
    assert!(problem_for(&p, "metrics.listen")
        .message
        .contains("allow_unauthenticated_non_loopback"));
    // The public listener's address, spelt the same or through 0.0.0.0.
    for (public, metrics) in [
        ("127.0.0.1:8440", "127.0.0.1:8440"),
        ("127.0.0.1:8440", "0.0.0.0:8440"),
    ] {
        let p = problems(&with(
            public,
            &format!("listen = \"{metrics}\"\nallow_unauthenticated_non_loopback = true"),
        ));
        assert!(
            problem_for(&p, "metrics.listen")
                .message
                .contains("public.listen"),
            "{metrics}: {p:?}"
        );
    }
    problem_for(
        &problems(&with("127.0.0.1:8440", "listen = \"9464\"")),
        "metrics.listen",
    );
    // Positive controls: loopback on its own port; the pod's address with
    // the key said out loud; no [metrics] at all (the default: none).
    let c = parse(&with("127.0.0.1:8440", "listen = \"127.0.0.1:9464\"")).unwrap();
    assert_eq!(c.metrics.unwrap().listen.to_string(), "127.0.0.1:9464");
    let c = parse(&with(
        "127.0.0.1:8440",
        "listen = \"0.0.0.0:9464\"\nallow_unauthenticated_non_loopback = true",
    ))
    .unwrap();
    assert_eq!(c.metrics.unwrap().listen.to_string(), "0.0.0.0:9464");
    assert!(parse(BASE).unwrap().metrics.is_none());
}

#[test]
fn public_listener_needs_tls_off_loopback() {
    let public = |s: &str| format!("{BASE}\n[public]\n{s}\n");
    problem_for(
        &problems(&public("listen = \"0.0.0.0:8440\"")),
        "public.listen",
    );
    problem_for(
        &problems(&public("listen = \"not an address\"")),
        "public.listen",
    );
    problem_for(
        &problems(&public("listen = \"0.0.0.0:8440\"\ntls_cert = \"c.pem\"")),
        "public.tls_cert",
    );
    let c = parse(&public("listen = \"127.0.0.1:8440\"")).unwrap();
    assert!(c.public.unwrap().tls.is_none());
    let c = parse(&public(
        "listen = \"0.0.0.0:8440\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"",
    ))
    .unwrap();
    assert_eq!(
        c.public.unwrap().tls,
        Some((
            PathBuf::from("/etc/credbroker/c.pem"),
            PathBuf::from("/etc/credbroker/k.pem")
        ))
    );
}

// --------------------------------------------------------------- durations

#[test]
fn durations_parse_strictly() {
    for (s, d) in [
        ("300s", Duration::from_secs(300)),
        ("5m", Duration::from_secs(300)),
        ("1h", Duration::from_secs(3600)),
        ("250ms", Duration::from_millis(250)),
        ("0s", Duration::ZERO),
        (" 5s ", Duration::from_secs(5)),
    ] {
        assert_eq!(parse_duration(s), Some(d), "{s}");
    }
    for bad in [
        "",
        "5",
        "s",
        "-5s",
        "+5s",
        "5 s",
        "1.5s",
        "5S",
        "5sec",
        "5d",
        "ms",
        "5s5",
        "５s",
        "99999999999999999999s",
        "18446744073709551615h",
        "18446744073709551615m",
    ] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
    assert_eq!(parse_duration("59m"), Some(Duration::from_secs(59 * 60)));
}

#[test]
fn header_timeout_must_be_a_positive_duration() {
    for bad in ["0s", "5", "five", "-1s"] {
        let text = insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("header_timeout = \"{bad}\""),
        );
        problem_for(&problems(&text), "socket.header_timeout");
    }
    let text = insert_after(
        BASE,
        "path = \"credbroker.sock\"",
        "header_timeout = \"250ms\"",
    );
    assert_eq!(
        parse(&text).unwrap().socket.header_timeout,
        Duration::from_millis(250)
    );
}

// ----------------------------------------------------------------- issuers

#[test]
fn duplicate_issuers_are_refused() {
    let again = "\n[[trusted_issuers]]\nissuer = \"https://idp.example\"\njwks_file = \"other.json\"\nsign_in = { kind = \"oidc\", client_id = \"b\" }\n";
    let text = format!("{BASE}{again}");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(p[0].message.contains("twice"), "{p:#?}");
    // It points at the second one.
    let second = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("https://idp.example"))
        .nth(1)
        .unwrap()
        .0
        + 1;
    assert!(p[0].at.starts_with(&format!("{FILE}:{second}:")), "{p:#?}");
    let other = format!("{BASE}{}", again.replace("idp.example", "idp2.example"));
    assert_eq!(parse(&other).unwrap().trusted_issuers.len(), 2);
}

#[test]
fn issuer_list_rules() {
    // None at all.
    let none = BASE
        .split("[[trusted_issuers]]")
        .next()
        .unwrap()
        .to_string();
    problem_for(&problems(&none), "trusted_issuers");
    // Both or neither of jwks_file and jwks_uri.
    let both = insert_after(
        BASE,
        "jwks_file = \"idp-jwks.json\"",
        "jwks_uri = \"https://idp.example/jwks\"",
    );
    problem_for(&problems(&both), "trusted_issuers[0].jwks_file");
    let neither = replace(BASE, "jwks_file = \"idp-jwks.json\"\n", "");
    problem_for(&problems(&neither), "trusted_issuers[0].jwks_file");
    // DPoP proofs are never subject tokens; unknown algorithms; empty lists.
    let typ = insert_after(
        BASE,
        "jwks_file = \"idp-jwks.json\"",
        "token_types = [\"DPoP+JWT\"]",
    );
    problem_for(&problems(&typ), "trusted_issuers[0].token_types");
    for algs in ["[\"HS256\"]", "[\"none\", \"ES256\"]", "[]"] {
        let text = insert_after(
            BASE,
            "jwks_file = \"idp-jwks.json\"",
            &format!("algs = {algs}"),
        );
        assert!(
            problems(&text)
                .iter()
                .all(|p| p.key.as_deref() == Some("trusted_issuers[0].algs")),
            "{algs}"
        );
    }
    let ok = insert_after(
        BASE,
        "jwks_file = \"idp-jwks.json\"",
        "algs = [\"RS256\", \"PS256\"]\naudience = \"aud-x\"",
    );
    let c = parse(&ok).unwrap();
    assert_eq!(
        c.trusted_issuers[0].algs,
        vec![crate::base::jose::Alg::RS256, crate::base::jose::Alg::PS256]
    );
    assert_eq!(c.trusted_issuers[0].audience, "aud-x");
}

#[test]
fn other_value_rules() {
    let cases = [
        (
            replace(BASE, "agent = \"repo-helper\"", "agent = \"a\\u0000b\""),
            "agent",
        ),
        (
            replace(BASE, "allowed_uids = [1000]", "allowed_uids = []"),
            "socket.allowed_uids",
        ),
        (format!("{BASE}\n[dpop]\nalgs = []\n"), "dpop.algs"),
        (format!("{BASE}\n[dpop]\nalgs = [\"HS256\"]\n"), "dpop.algs"),
        (format!("{BASE}\n[limits]\nburst = 0\n"), "limits"),
    ];
    for (text, key) in &cases {
        problem_for(&problems(text), key);
    }
    let ok = format!("{BASE}\n[dpop]\nalgs = [\"ES256\"]\nreplay_capacity = 16\nrequire_nonce = true\n\n[limits]\nburst = 1\n");
    let c = parse(&ok).unwrap();
    assert_eq!(c.dpop.replay_capacity, 16);
    assert!(c.dpop.require_nonce);
    assert_eq!(c.limits.burst, 1);
}

#[test]
fn unreadable_config_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let err = Config::load(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("nope.toml"));
    let good = dir.path().join("credbroker.toml");
    std::fs::write(&good, BASE).unwrap();
    assert_eq!(
        Config::load(&good).unwrap().store.sled_dir(),
        Some(dir.path().join("data").as_path())
    );
}

// ------------------------------------------------------------ secret files

#[test]
fn secret_files_must_be_private_regular_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    write_secret_file(&path, CANARY.as_bytes()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Never overwritten.
    assert!(write_secret_file(&path, b"other").is_err());

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = read_secret_file(&path).unwrap_err().to_string();
    assert!(err.contains("0600") && !err.contains("CANARY"), "{err}");
    // The message gives the mode found and the fix (not "readable by
    // others" for a file only its group may read).
    assert!(
        err.contains("has mode 0640") && err.contains("chmod 600") && err.contains("fsGroup"),
        "{err}"
    );
    // Symlinks are followed (Kubernetes mounts secrets as links) and the
    // target is checked: a link to a readable file is refused...
    let link = dir.path().join("link.key");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let err = read_secret_file(&link).unwrap_err().to_string();
    assert!(err.contains("0600"), "{err}");
    // ...and a link to a private file is accepted.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(read_secret_file(&link).unwrap().expose(), CANARY.as_bytes());
    let err = read_secret_file(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
    assert_eq!(read_secret_file(&path).unwrap().expose(), CANARY.as_bytes());
}

/// `BASE` on PostgreSQL instead of sled: `store` replaced by `[postgres]`
/// (with `extra` lines in it) and an `audit_log`.
fn on_postgres(extra: &str) -> String {
    let text = replace(
        BASE,
        "store = \"data\"\n",
        "audit_log = \"/var/log/credbroker/audit.jsonl\"\n",
    );
    format!("{text}\n[postgres]\nhost = \"db.internal\"\ndatabase = \"broker\"\nuser = \"credbroker\"\npassword_file = \"pg-password\"\n{extra}")
}

#[test]
fn a_postgres_table_selects_the_shared_store() {
    let c = parse(&on_postgres(
        "pool_size = 8\nstatement_timeout = \"3s\"\nmigrate = \"auto\"\n[postgres.tls]\nca_file = \"pg-ca.pem\"\n",
    ))
    .unwrap();
    let crate::infra::store::Backend::Postgres(s) = &c.store else {
        panic!("not postgres: {:?}", c.store);
    };
    assert_eq!(s.host, "db.internal");
    assert_eq!(s.port, 5432);
    assert_eq!(s.pool_size, 8);
    assert_eq!(s.statement_timeout, Duration::from_secs(3));
    assert_eq!(s.connect_timeout, Duration::from_secs(5));
    assert_eq!(s.migrate, crate::infra::store::Migrate::Auto);
    // Secret and CA files are paths, anchored at the config's directory.
    assert_eq!(
        s.password_file.as_deref(),
        Some(Path::new("/etc/credbroker/pg-password"))
    );
    assert_eq!(
        s.ca_file.as_deref(),
        Some(Path::new("/etc/credbroker/pg-ca.pem"))
    );
    assert_eq!(c.audit_log, Path::new("/var/log/credbroker/audit.jsonl"));
}

#[test]
fn postgres_mistakes_are_named_by_key() {
    // Without TLS off loopback: refused (the password would cross the
    // network in the clear).
    let p = problems(&on_postgres(""));
    assert!(problem_for(&p, "postgres.tls").message.contains("loopback"));
    // On loopback it may go without.
    let local = on_postgres("").replace("db.internal", "127.0.0.1");
    parse(&local).unwrap();
    // audit_log is required (its default lives in the sled directory).
    let p = problems(&replace(
        &local,
        "audit_log = \"/var/log/credbroker/audit.jsonl\"\n",
        "",
    ));
    problem_for(&p, "audit_log");
    // Both backends at once, or neither.
    let p = problems(&format!("store = \"data\"\n{local}"));
    problem_for(&p, "postgres");
    let p = problems(&replace(BASE, "store = \"data\"\n", ""));
    assert!(problem_for(&p, "store").message.contains("[postgres]"));
    // Values out of range, each named, none echoed.
    let p = problems(&format!(
        "{local}pool_size = 0\nstatement_timeout = \"{CANARY}\"\nmigrate = \"{CANARY}\"\n"
    ));
    problem_for(&p, "postgres.pool_size");
    problem_for(&p, "postgres.statement_timeout");
    problem_for(&p, "postgres.migrate");
    assert!(!format!("{p:?}").contains(CANARY));
    let p = problems(&format!("{local}port = 70000\n"));
    problem_for(&p, "postgres.port");
    let p = problems(&local.replace("user = \"credbroker\"\n", ""));
    problem_for(&p, "postgres.user");
    let p = problems(&format!("{local}pasword = \"x\"\n"));
    assert!(
        p.iter()
            .any(|x| x.key.as_deref().is_some_and(|k| k.ends_with("pasword"))
                && x.message == "unknown key"),
        "the misspelt key is reported: {p:?}"
    );
}

#[test]
fn replay_cache_bytes_bound_the_global_derive_limit() {
    // The default global limit is the most the cache can check; 16 MiB
    // holds over 500 000 entries, so about 3 900 derives/s.
    let c = parse(BASE).unwrap();
    let most = max_derive_rate(c.dpop.replay_capacity);
    assert!((3_500..5_000).contains(&most), "{most}");
    // A jti kept its longest, at that rate plus one second's burst, still
    // fits in the cache: it refuses (429) before the cache could (503).
    let worst = (u64::from(most) * (crate::base::dpop::MAX_JTI_LIFETIME as u64 + 1)) as usize;
    assert!(worst <= c.dpop.replay_capacity, "{worst}");

    // A global limit above what the cache can check is refused, naming the
    // key and the figures.
    let text = format!(
        "{BASE}\n[dpop]\nreplay_cache_bytes = 1048576\n\n[limits]\nglobal_per_second = 1000\n"
    );
    let p = problems(&text);
    let bad = problem_for(&p, "limits.global_per_second");
    assert!(bad.message.contains("replay cache can check"), "{bad:?}");
    assert!(bad.message.contains("dpop.replay_cache_bytes"), "{bad:?}");
    // The deprecated entry count cannot be combined with the bytes.
    let text = format!("{BASE}\n[dpop]\nreplay_cache_bytes = 1048576\nreplay_capacity = 1000\n");
    let p = problems(&text);
    assert!(problem_for(&p, "dpop.replay_capacity")
        .message
        .contains("deprecated"));
    // Positive controls: a limit within the bound, and the deprecated key
    // alone, which still sets the capacity (and the bytes from it).
    let c = parse(&format!(
        "{BASE}\n[dpop]\nreplay_cache_bytes = 1048576\n\n[limits]\nglobal_per_second = 300\n"
    ))
    .unwrap();
    assert_eq!(c.limits.global_per_second, 300);
    assert_eq!(
        c.dpop.replay_capacity,
        crate::base::dpop::ReplayCache::capacity_for_bytes(1 << 20)
    );
    let c = parse(&format!("{BASE}\n[dpop]\nreplay_capacity = 50000\n")).unwrap();
    assert_eq!(c.dpop.replay_capacity, 50_000);
    assert_eq!(
        c.dpop.replay_cache_bytes,
        crate::base::dpop::ReplayCache::new(50_000).slot_bytes()
    );
    assert_eq!(c.limits.global_per_second, max_derive_rate(50_000));
}

#[test]
fn postgres_turns_dpop_nonces_on_and_refuses_them_off() {
    let local = on_postgres("").replace("db.internal", "127.0.0.1");
    // Not given: on with a shared store, off with sled.
    assert!(parse(&local).unwrap().dpop.require_nonce);
    assert!(!parse(BASE).unwrap().dpop.require_nonce);
    // Turned off with [postgres]: refused, naming the file, the key and why.
    let off = local.replace(
        "\n[postgres]\n",
        "\n[dpop]\nrequire_nonce = false\n\n[postgres]\n",
    );
    let p = problems(&off);
    let problem = problem_for(&p, "dpop.require_nonce");
    let shown = problem.to_string();
    assert!(
        shown.contains("credbroker.toml")
            && shown.contains("dpop.require_nonce")
            && shown.contains("[postgres]")
            && shown.contains("replay"),
        "{shown}"
    );
    // Positive controls: on with [postgres], and off with sled.
    assert!(
        parse(&off.replace("require_nonce = false", "require_nonce = true"))
            .unwrap()
            .dpop
            .require_nonce
    );
    assert!(
        !parse(&format!("{BASE}\n[dpop]\nrequire_nonce = false\n"))
            .unwrap()
            .dpop
            .require_nonce
    );
}

#[test]
fn socket_runtime_is_per_core_or_shared() {
    use crate::infra::config::ApiRuntime;
    for bad in ["per-core", "multi_thread", "", "PER_CORE"] {
        let text = insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("runtime = \"{bad}\""),
        );
        let p = problems(&text);
        let shown = problem_for(&p, "socket.runtime").to_string();
        assert!(
            shown.contains("per_core") && shown.contains("shared"),
            "{shown}"
        );
    }
    // Positive controls: both names, and the default.
    assert_eq!(parse(BASE).unwrap().socket.runtime, ApiRuntime::PerCore);
    for (name, shape) in [
        ("shared", ApiRuntime::Shared),
        ("per_core", ApiRuntime::PerCore),
    ] {
        let text = insert_after(
            BASE,
            "path = \"credbroker.sock\"",
            &format!("runtime = \"{name}\""),
        );
        assert_eq!(parse(&text).unwrap().socket.runtime, shape);
    }
}

#[test]
fn subject_token_introspection_is_all_or_nothing_and_bounded() {
    let with = |lines: &str| format!("{BASE}{lines}");
    const FULL: &str = "introspection_endpoint = \"https://idp.example/introspect\"\nintrospection_client_id = \"broker-rs\"\nintrospection_client_secret_file = \"keys/idp-rs\"\n";
    // Off by default.
    assert_eq!(parse(BASE).unwrap().trusted_issuers[0].introspection, None);
    // On, with its defaults.
    let c = parse(&with(FULL)).unwrap();
    let i = c.trusted_issuers[0].introspection.clone().unwrap();
    assert_eq!(i.endpoint, "https://idp.example/introspect");
    assert_eq!(i.client_id, "broker-rs");
    assert_eq!(
        i.client_secret_file,
        Path::new("/etc/credbroker/keys/idp-rs")
    );
    assert!(!i.jwts);
    assert_eq!(i.cache_ttl, std::time::Duration::from_secs(10));
    let c = parse(&with(&format!(
        "{FULL}introspect_jwts = true\nintrospection_cache_ttl = \"0s\"\n"
    )))
    .unwrap();
    let i = c.trusted_issuers[0].introspection.clone().unwrap();
    assert!(i.jwts);
    assert!(i.cache_ttl.is_zero());
    // Refused, each naming its key.
    for (text, key) in [
        (
            with("introspect_jwts = true\n"),
            "trusted_issuers[0].introspect_jwts",
        ),
        (
            with("introspection_endpoint = \"https://idp.example/introspect\"\nintrospection_client_secret_file = \"keys/idp-rs\"\n"),
            "trusted_issuers[0].introspection_client_id",
        ),
        (
            with("introspection_endpoint = \"https://idp.example/introspect\"\nintrospection_client_id = \"broker-rs\"\n"),
            "trusted_issuers[0].introspection_client_secret_file",
        ),
        (
            with(&FULL.replace("https://idp.example", "http://idp.example")),
            "trusted_issuers[0].introspection_endpoint",
        ),
        (
            with(&format!("{FULL}introspection_cache_ttl = \"61s\"\n")),
            "trusted_issuers[0].introspection_cache_ttl",
        ),
    ] {
        problem_for(&problems(&text), key);
    }
}

#[test]
fn the_longest_subject_token_is_bounded_and_a_bad_bound_names_file_and_key() {
    // The default: 24 h.
    assert_eq!(
        parse(BASE).unwrap().revocation.max_subject_token_lifetime,
        std::time::Duration::from_secs(24 * 3600)
    );
    let with = |v: &str| format!("{BASE}\n[revocation]\nmax_subject_token_lifetime = \"{v}\"\n");
    for (v, secs) in [("1m", 60), ("2h", 7_200), ("720h", 30 * 86_400)] {
        assert_eq!(
            parse(&with(v))
                .unwrap()
                .revocation
                .max_subject_token_lifetime
                .as_secs(),
            secs,
            "{v}"
        );
    }
    for v in ["59s", "721h", "0s", "a day", "-1h"] {
        let text = with(v);
        let p = problems(&text);
        assert_eq!(p.len(), 1, "{v}: {p:#?}");
        let shown = problem_for(&p, "revocation.max_subject_token_lifetime").to_string();
        let line = line_of(&text, "max_subject_token_lifetime");
        assert!(
            shown.starts_with(&format!("{FILE}:{line}"))
                && shown.contains("revocation.max_subject_token_lifetime")
                && shown.contains("between 1m and 720h"),
            "{v}: {shown}"
        );
    }
}
