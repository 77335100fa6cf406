//! docs/SECURITY-CASES.md L1 and L2: secrets never reach a log line (at debug level),
//! an audit event, a metric, an error body, the store's files, or a `Debug`
//! rendering.
//!
//! Canaries are planted where secrets live: inside subject tokens (claims
//! and header), as a bogus subject token, as DPoP proof `jti`s and `htu`,
//! as the master key's bytes and in the config; the dev issuer's private key
//! and every token and proof exchanged are checked too. Names that are
//! legitimately recorded (the person's `sub`, step, tool, resource) carry no
//! canary.
// Test code panics loudly on a broken fixture: clippy.toml allows unwrap and
// expect in #[test] functions, and these helpers are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;
use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::b64e;
use credbroker::internals::secret::{SecretBytes, SecretString};
use serde_json::json;

/// Every canary starts with this; no legitimate output contains it.
const MARK: &str = "CANARY";
const CLAIM: &str = "CANARYsubjectclaim5f1e9a";
const BOGUS: &str = "CANARY-bogus-subject-token-8d2c41";
const JTI: &str = "CANARYproofjti3b7e0d";
const KID: &str = "CANARY-kid-77a1";
const FIELD: &str = "CANARY-unknown-field-c0ffee";
const HTU: &str = "http://canary-host.example/CANARY-htu";
const MASTER: &[u8] = b"CANARY-master-key-bytes-9a4c2e71";

/// Collects what must never appear, and what came back in refusals.
#[derive(Default)]
struct Watch {
    secrets: Vec<String>,
    error_bodies: Vec<String>,
}

impl Watch {
    fn secret(&mut self, s: &str) {
        self.secrets.push(s.to_string());
    }

    #[track_caller]
    fn refused(&mut self, r: HttpAnswer, what: &str) {
        assert!(r.status >= 400, "{what}: expected a refusal, got {}", r.raw);
        assert!(r.json().get("access_token").is_none(), "{what}");
        self.error_bodies.push(r.raw);
    }

    /// Asserts that no canary and no recorded secret (nor the signature
    /// part of one, a partial leak) occurs in `haystack`.
    #[track_caller]
    fn assert_clean(&self, name: &str, haystack: &[u8]) {
        let text = String::from_utf8_lossy(haystack);
        if let Some(i) = text.find(MARK) {
            let from = i.saturating_sub(80);
            panic!(
                "{name} contains a canary: ...{}...",
                &text[from..(i + 80).min(text.len())]
            );
        }
        for s in &self.secrets {
            assert!(
                !text.contains(s.as_str()),
                "{name} contains a secret ({} bytes)",
                s.len()
            );
            if let Some(sig) = s
                .rsplit('.')
                .next()
                .filter(|sig| sig.len() >= 40 && s.contains('.'))
            {
                assert!(!text.contains(sig), "{name} contains a token's signature");
            }
        }
        for needle in [hex::encode(MASTER), b64e(MASTER)] {
            assert!(
                !text.contains(&needle),
                "{name} contains the master key, encoded"
            );
        }
        assert!(
            !haystack.windows(MASTER.len()).any(|w| w == MASTER),
            "{name} contains the master key"
        );
    }
}

/// The base64 body lines and the DER of a PEM private key.
fn pem_secrets(pem: &str) -> Vec<String> {
    use base64::Engine;
    let lines: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(lines.concat())
        .unwrap();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    out.push(hex::encode(&der));
    out.push(b64e(&der));
    out
}

fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[tokio::test]
async fn no_secret_in_logs_events_metrics_error_bodies_or_store() {
    assert_eq!(MASTER.len(), 32, "the master key is 32 bytes");
    let (dir, config) = prepare(&Opts::default());
    let master = dir.path().join("keys/master.key");
    std::fs::remove_file(&master).unwrap();
    credbroker::internals::config::write_secret_file(&master, MASTER).unwrap();
    let mut b = TestBroker::spawn(dir, config, Some("debug"));
    let mut w = Watch::default();
    for s in pem_secrets(&std::fs::read_to_string(b.path("keys/dev-issuer.pem")).unwrap()) {
        w.secret(&s);
    }
    let dev = credbroker::internals::cli::load_pem_key(&b.path("keys/dev-issuer.pem")).unwrap();
    let k = key();

    // Good derives: canaries in the subject token's claims and in the
    // proofs' jti; each token, subject and proof recorded as a secret.
    let mut issued = Vec::new();
    for i in 0..3 {
        let mut c = b.subject_claims("alice");
        c["jti"] = json!(format!("{CLAIM}-{i}"));
        c["canary"] = json!(CLAIM);
        let subject = b.subject_with(&c);
        let mut pc = b.proof_claims();
        pc["jti"] = json!(format!("{JTI}-{i}"));
        let proof = proof_with(&k, json!({}), &pc);
        let r = b.post_derive(&b.good_body(&subject), Some(&proof));
        let token = r.assert_issued("derive with canaries in subject and proof");
        w.secret(&subject);
        w.secret(&proof);
        w.secret(&token);
        issued.push(token);
        // The same proof again: a replay refusal that knows the jti.
        w.refused(
            b.post_derive(&b.good_body(&subject), Some(&proof)),
            "replayed proof",
        );
    }
    // The /token endpoint, once good.
    let canary_subject = {
        let mut c = b.subject_claims("alice");
        c["canary"] = json!(CLAIM);
        b.subject_with(&c)
    };
    w.secret(&canary_subject);
    let token_htu = format!("{}/token", b.issuer);
    let p = make_proof(&k, "POST", &token_htu, now(), None, None).unwrap();
    w.secret(&p);
    let base_form = |st: &str| {
        vec![
            (
                "grant_type",
                credbroker::internals::api::TOKEN_EXCHANGE.to_string(),
            ),
            ("subject_token", st.to_string()),
            (
                "subject_token_type",
                credbroker::internals::api::ACCESS_TOKEN_TYPE.to_string(),
            ),
            ("resource", RESOURCE.to_string()),
            ("step", "summarize".to_string()),
            ("tool", "notes.read".to_string()),
        ]
    };
    let send_form = |f: &[(&str, String)], proof: &str| {
        let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
        b.post_token(&pairs, Some(proof))
    };
    let t = send_form(&base_form(&canary_subject), &p).assert_issued("/token");
    w.secret(&t);
    issued.push(t);

    // Refusals, each carrying canaries in what it refuses.
    let fresh = |b: &TestBroker, w: &mut Watch| {
        let p = b.proof(&k);
        w.secret(&p);
        p
    };
    let expired = {
        let mut c = b.subject_claims("alice");
        c["canary"] = json!(CLAIM);
        c["exp"] = json!(now() - 3600);
        b.subject_with(&c)
    };
    let wrong_aud = {
        let mut c = b.subject_claims("alice");
        c["canary"] = json!(CLAIM);
        c["aud"] = json!(CLAIM);
        b.subject_with(&c)
    };
    let unknown_kid = {
        let mut c = b.subject_claims("alice");
        c["canary"] = json!(CLAIM);
        let h = json!({"alg": "ES256", "typ": "at+jwt", "kid": KID});
        jws_with(&h, &c, |i| dev.sign_raw(i).unwrap())
    };
    let bad_sig = {
        let mut c = b.subject_claims("alice");
        c["canary"] = json!(CLAIM);
        let t = b.subject_with(&c);
        format!("{}.{}", t.rsplit_once('.').unwrap().0, b64e(&[7u8; 64]))
    };
    let untrusted = {
        let mut c = b.subject_claims("alice");
        c["iss"] = json!(format!("http://{MARK}-issuer.example"));
        b.subject_with(&c)
    };
    for (what, st) in [
        ("bogus subject token", BOGUS.to_string()),
        ("expired subject token", expired),
        ("subject token for another audience", wrong_aud),
        ("subject token with an unknown kid", unknown_kid),
        ("subject token with a bad signature", bad_sig),
        ("subject token of an untrusted issuer", untrusted),
        ("an issued token as subject token", issued[0].clone()),
        (
            "a proof as subject token",
            w.secrets[w.secrets.len() - 2].clone(),
        ),
    ] {
        w.secret(&st);
        let p = fresh(&b, &mut w);
        w.refused(b.post_derive(&b.good_body(&st), Some(&p)), what);
    }
    // A valid canary subject asking for what the policy denies.
    let p = fresh(&b, &mut w);
    let body = json!({"subject_token": canary_subject, "step": "summarize", "tool": "notes.delete", "resource": RESOURCE});
    w.refused(b.post_derive(&body, Some(&p)), "policy denial");
    // Bad proofs carrying canaries.
    let mut bad_proofs = Vec::new();
    let mut pc = b.proof_claims();
    pc["htu"] = json!(HTU);
    pc["jti"] = json!(format!("{JTI}-htu"));
    bad_proofs.push(("proof for another htu", proof_with(&k, json!({}), &pc)));
    let mut pc = b.proof_claims();
    pc["jti"] = json!(format!("{JTI}-htm"));
    pc["htm"] = json!(MARK);
    bad_proofs.push(("proof with a canary htm", proof_with(&k, json!({}), &pc)));
    let mut pc = b.proof_claims();
    pc["jti"] = json!(format!("{JTI}-{}", "x".repeat(300)));
    bad_proofs.push((
        "proof with an oversized canary jti",
        proof_with(&k, json!({}), &pc),
    ));
    bad_proofs.push((
        "proof with a canary typ",
        proof_with(&k, json!({"typ": format!("{MARK}+jwt")}), &b.proof_claims()),
    ));
    bad_proofs.push(("canary as the proof", format!("{MARK}.{MARK}.{MARK}")));
    bad_proofs.push(("a subject token as proof", canary_subject.clone()));
    bad_proofs.push(("an issued token as proof", issued[1].clone()));
    for (what, proof) in bad_proofs {
        w.secret(&proof);
        w.refused(
            b.post_derive(&b.good_body(&b.subject_token("alice")), Some(&proof)),
            what,
        );
    }
    // Malformed requests quoting canaries.
    let p = fresh(&b, &mut w);
    let mut body = b.good_body(&canary_subject);
    body[FIELD] = json!(FIELD);
    w.refused(b.post_derive(&body, Some(&p)), "unknown JSON member");
    let p = fresh(&b, &mut w);
    let broken = format!(r#"{{"subject_token": "{BOGUS}", "step": {FIELD}}}"#);
    w.refused(b.http(&http_derive(&broken, Some(&p), "")), "invalid JSON");
    let p = fresh(&b, &mut w);
    let mut body = b.good_body(&canary_subject);
    // (The scope asked for is recorded in events, so it carries no canary.)
    body["scope"] = json!("notes\"read");
    w.refused(b.post_derive(&body, Some(&p)), "malformed scope");
    let p = make_proof(&k, "POST", &token_htu, now(), None, None).unwrap();
    w.secret(&p);
    let mut f = base_form(BOGUS);
    f.push(("subject_token", canary_subject.clone()));
    w.refused(send_form(&f, &p), "/token with two subject tokens");
    let p = make_proof(&k, "POST", &token_htu, now(), None, None).unwrap();
    w.secret(&p);
    let mut f = base_form(&canary_subject);
    f.retain(|(k, _)| *k != "subject_token_type");
    f.push(("subject_token_type", format!("urn:{MARK}")));
    w.refused(
        send_form(&f, &p),
        "/token with an unknown subject_token_type",
    );
    let p = make_proof(&k, "POST", &token_htu, now(), None, None).unwrap();
    w.secret(&p);
    let mut f = base_form(&canary_subject);
    f.push(("actor_token", BOGUS.to_string()));
    w.refused(send_form(&f, &p), "/token with an actor_token");

    // What the broker recorded: sanity checks that we look at real output.
    let metrics = b.metrics();
    assert!(metrics.contains("derives_total"), "{metrics}");
    let audit = std::fs::read(b.path("data/audit.jsonl")).unwrap();
    let events = b.audit_lines();
    assert_eq!(
        events
            .iter()
            .filter(|e| e["event"] == "derive.issued")
            .count(),
        4
    );
    assert!(
        events
            .iter()
            .filter(|e| e["event"] == "derive.denied")
            .count()
            >= 20
    );
    assert!(events
        .iter()
        .all(|e| e.get("jti_sha256").is_none() || e["jti_sha256"].as_str().unwrap().len() == 64));
    b.stop();
    let log = b.log_text();
    assert!(
        log.contains("credbroker is serving") && log.contains("shutting down"),
        "{log}"
    );

    // The level really was debug (sled's debug lines come through).
    assert!(log.contains("DEBUG"), "no debug line in the log");
    w.assert_clean("the log (RUST_LOG=debug)", log.as_bytes());
    w.assert_clean("the audit file", &audit);
    w.assert_clean("/metrics", metrics.as_bytes());
    for body in &w.error_bodies {
        w.assert_clean("an error body", body.as_bytes());
    }
    let mut files = Vec::new();
    files_under(&b.path("data"), &mut files);
    assert!(files.len() > 1, "the store has files");
    for f in files {
        w.assert_clean(
            &format!("store file {}", f.display()),
            &std::fs::read(&f).unwrap(),
        );
    }
}

#[tokio::test]
async fn config_errors_never_echo_a_misplaced_secret() {
    let (dir, config) = prepare(&Opts::default());
    let good = std::fs::read_to_string(&config).unwrap();
    for (what, text) in [
        (
            "a secret under an unknown key",
            good.replacen(
                "[keys]\n",
                &format!("[keys]\nmaster_key = \"{CLAIM}\"\n"),
                1,
            ),
        ),
        (
            "a secret as a value of the wrong type",
            good.replacen(
                "agent = \"repo-helper\"",
                &format!("agent = [\"{CLAIM}\"]"),
                1,
            ),
        ),
        (
            "a secret in an unterminated string",
            good.replacen(
                "agent = \"repo-helper\"",
                &format!("agent = \"repo-helper\"\nclient_secret = \"{CLAIM}"),
                1,
            ),
        ),
        (
            "a secret as the issuer",
            good.replacen(
                "issuer = \"http://127.0.0.1:0\"",
                &format!("issuer = \"{CLAIM}\""),
                1,
            ),
        ),
    ] {
        std::fs::write(&config, &text).unwrap();
        let (status, stderr) = serve_expect_exit(&config, std::time::Duration::from_secs(20));
        assert!(!status.success(), "{what}: started");
        assert!(
            stderr.contains("credbroker.toml:"),
            "{what}: the error names the place: {stderr}"
        );
        assert!(
            !stderr.contains(MARK),
            "{what}: the value was echoed: {stderr}"
        );
        let err = credbroker::internals::config::Config::parse(&config, &text).unwrap_err();
        assert!(!format!("{err} {err:?}").contains(MARK), "{what}: {err:?}");
    }
    // Positive control: the original config serves.
    std::fs::write(&config, good).unwrap();
    let b = TestBroker::spawn(dir, config, None);
    b.derive_ok(&key()).await;
}

#[tokio::test]
async fn debug_of_requests_tokens_keys_and_errors_is_redacted() {
    let assert_redacted = |what: &str, rendered: String| {
        assert!(
            !rendered.contains(MARK),
            "{what} shows a secret: {rendered}"
        );
    };
    // Requests, parsed the way the socket parses them.
    let subject = format!("{CLAIM}.{CLAIM}.{CLAIM}");
    let body = json!({"subject_token": subject, "step": "s", "tool": "t", "resource": RESOURCE});
    let req = credbroker::internals::api::parse_json(
        body.to_string().as_bytes(),
        Some(SecretString::new(JTI.into())),
        0,
    )
    .unwrap();
    let rendered = format!("{req:?}");
    assert_redacted("DeriveRequest (JSON)", rendered.clone());
    assert!(
        rendered.contains("[REDACTED]") && rendered.contains("resource"),
        "{rendered}"
    );
    let form = form(&[
        ("grant_type", credbroker::internals::api::TOKEN_EXCHANGE),
        ("subject_token", &subject),
        (
            "subject_token_type",
            credbroker::internals::api::ACCESS_TOKEN_TYPE,
        ),
        ("resource", RESOURCE),
        ("step", "s"),
        ("tool", "t"),
    ]);
    let req = credbroker::internals::api::parse_form(
        form.as_bytes(),
        Some(SecretString::new(JTI.into())),
        0,
    )
    .unwrap();
    assert_redacted("DeriveRequest (form)", format!("{req:?}"));
    // Errors of the request parsers, quoting nothing they were given.
    let mut bad = body.clone();
    bad[FIELD] = json!(FIELD);
    let e =
        credbroker::internals::api::parse_json(bad.to_string().as_bytes(), None, 0).unwrap_err();
    assert_redacted("DeriveError (unknown member)", format!("{e} {e:?}"));
    let e =
        credbroker::internals::api::parse_form(format!("grant_type={FIELD}").as_bytes(), None, 0)
            .unwrap_err();
    assert_redacted("DeriveError (grant_type)", format!("{e} {e:?}"));
    let e =
        credbroker::internals::api::error_response(&e, &[credbroker::internals::jose::Alg::ES256]);
    assert_redacted("error response", format!("{e:?}"));

    // Answers and tokens.
    let token: credbroker::client::Token = serde_json::from_value(json!({
        "access_token": CLAIM, "token_type": "DPoP", "issued_token_type": credbroker::internals::api::ACCESS_TOKEN_TYPE,
        "expires_in": 300, "scope": "s",
    }))
    .unwrap();
    assert_redacted("client::Token", format!("{token:?}"));
    let issued = credbroker::internals::exchange::Issued {
        access_token: SecretString::new(CLAIM.into()),
        expires_in: Some(1),
        scope: "s".into(),
        token_type: "Bearer".into(),
        sender_constrained: false,
        authorization_details: None,
    };
    assert_redacted("exchange::Issued", format!("{issued:?}"));
    let minted = credbroker::internals::mint::Minted {
        token: SecretString::new(CLAIM.into()),
        jti: "j".into(),
    };
    assert_redacted("mint::Minted", format!("{minted:?}"));
    assert_eq!(
        format!("{:?}", SecretString::new(CLAIM.into())),
        "[REDACTED]"
    );
    assert_eq!(
        format!("{:?}", SecretBytes::new(MASTER.to_vec())),
        "[REDACTED]"
    );

    // Keys.
    let (es, pkcs8) = credbroker::internals::jose::Es256Key::generate().unwrap();
    let rendered = format!("{es:?}");
    for enc in [hex::encode(pkcs8.expose()), b64e(pkcs8.expose())] {
        assert!(
            !rendered.contains(&enc[enc.len() - 40..]),
            "Es256Key shows its private key: {rendered}"
        );
    }
    assert!(rendered.contains(&es.kid));
    let sealer =
        credbroker::internals::seal::Sealer::new(&SecretBytes::new(MASTER.to_vec()), &[]).unwrap();
    let rendered = format!("{sealer:?}");
    assert_redacted("Sealer", rendered.clone());
    assert!(
        !rendered.contains(&hex::encode(MASTER)) && !rendered.contains(&b64e(MASTER)),
        "{rendered}"
    );
    let nonces =
        credbroker::internals::dpop::Nonces::new(&SecretBytes::new(MASTER.to_vec()), "host/1");
    assert_redacted("Nonces", format!("{nonces:?}"));

    // Errors of the JOSE, DPoP and resource-server layers, fed canaries.
    let e = credbroker::internals::jose::parse(&subject, 16 * 1024).unwrap_err();
    assert_redacted("JoseError", format!("{e} {e:?}"));
    let k = key();
    let v = credbroker::internals::dpop::Validator::new(
        vec![credbroker::internals::jose::Alg::ES256],
        64,
        None,
    );
    let mut pc = json!({"jti": JTI, "htm": "POST", "htu": HTU, "iat": now()});
    let expect = credbroker::internals::dpop::Expect {
        method: "POST",
        htu: "http://b.example/v1/derive",
        access_token: None,
        jkt: None,
        now: now(),
    };
    let e = v
        .validate(&proof_with(&k, json!({}), &pc), &expect)
        .unwrap_err();
    assert_redacted("DpopError (htu)", format!("{e} {e:?}"));
    pc["htu"] = json!("http://b.example/v1/derive");
    let p = proof_with(&k, json!({}), &pc);
    v.validate(&p, &expect)
        .expect("positive control: the proof is valid");
    let e = v.validate(&p, &expect).unwrap_err();
    assert_redacted("DpopError (replay)", format!("{e} {e:?}"));
    let d = credbroker::internals::exchange::DeriveError::Proof(e, None);
    assert_redacted("DeriveError::Proof", format!("{d} {d:?}"));
    let rs = credbroker::verify::Verifier::from_jwks(
        "http://b.example",
        RESOURCE,
        json!({"keys": [k.public_jwk]}).to_string().as_bytes(),
    )
    .unwrap();
    let auth = format!("DPoP {subject}");
    let e = rs
        .verify(&credbroker::verify::Presented {
            method: "GET",
            url: RESOURCE,
            authorization: Some(&auth),
            dpop: &[JTI],
        })
        .unwrap_err();
    assert_redacted("VerifyError", format!("{e} {e:?} {}", e.challenge()));
    let auth = format!("Bearer {CLAIM}");
    let e = rs
        .verify(&credbroker::verify::Presented {
            method: "GET",
            url: RESOURCE,
            authorization: Some(&auth),
            dpop: &[],
        })
        .unwrap_err();
    assert_redacted("VerifyError (Bearer)", format!("{e} {e:?}"));

    // Subject-token errors, from the validator the binary uses.
    let (dir, config) = prepare(&Opts::default());
    let cfg = credbroker::internals::config::Config::load(&config).unwrap();
    let subjects =
        credbroker::internals::subject::Validator::new(&cfg.trusted_issuers, Box::new(|_| false))
            .await
            .unwrap();
    let dev =
        credbroker::internals::cli::load_pem_key(&dir.path().join("keys/dev-issuer.pem")).unwrap();
    let claims = json!({"iss": cfg.issuer, "sub": "alice", "aud": CLAIM, "exp": now() + 60, "canary": CLAIM});
    let h = json!({"alg": "ES256", "typ": "at+jwt", "kid": dev.kid});
    for st in [
        subject.clone(),
        BOGUS.to_string(),
        jws_with(&h, &claims, |i| dev.sign_raw(i).unwrap()),
    ] {
        let e = subjects.validate(&st, now()).await.unwrap_err();
        assert_redacted("SubjectError", format!("{e} {e:?}"));
        let d = credbroker::internals::exchange::DeriveError::Subject(e);
        assert_redacted("DeriveError::Subject", format!("{d} {d:?}"));
    }
    // Positive control: the validator accepts a good token from that issuer.
    let good = credbroker::internals::cli::dev_subject_token(dir.path(), "alice", 60).unwrap();
    assert_eq!(
        subjects.validate(&good, now()).await.unwrap().0.person.sub,
        "alice"
    );
}

/// docs/SECURITY-CASES.md L3b and L3c: a secret a client puts in a request's
/// `resource`, `step`, `tool` or `scope` is not copied into the audit log;
/// such a value is recorded as its length and a keyed HMAC, and a Unicode
/// line separator in it is escaped. Declared names stay in clear.
#[tokio::test]
async fn secrets_in_step_tool_resource_and_scope_stay_out_of_the_audit_log() {
    use credbroker::client::Answer;
    let b = TestBroker::start();
    let k = key();
    let subject = b.subject_token("alice");
    let in_query = format!("{RESOURCE}?access_token={MARK}-resource-query");
    let cases: [(&str, &str, &str, String, Option<&str>); 6] = [
        (
            "resource",
            "summarize",
            "notes.read",
            in_query.clone(),
            None,
        ),
        (
            "resource",
            "summarize",
            "notes.read",
            format!("https://{MARK}-host.example/notes"),
            None,
        ),
        (
            "step",
            "CANARY-step\u{2028}{\"event\":\"derive.issued\"}",
            "notes.read",
            RESOURCE.to_string(),
            None,
        ),
        (
            "tool",
            "summarize",
            "CANARY-tool\u{2029}\u{85}",
            RESOURCE.to_string(),
            None,
        ),
        (
            "scope",
            "summarize",
            "notes.read",
            RESOURCE.to_string(),
            Some("notes.read CANARY-scope"),
        ),
        // The same secret again: the same HMAC, so a repeat is visible.
        (
            "resource",
            "summarize",
            "notes.read",
            in_query.clone(),
            None,
        ),
    ];
    let mut seen = Vec::new();
    for (field, step, tool, resource, scope) in &cases {
        let before = b.audit_lines().len();
        let r = b.derive(&k, &subject, step, tool, resource, *scope).await;
        assert!(matches!(r, Answer::Refused(_)), "{field}: not refused");
        let lines = b.audit_lines();
        assert_eq!(lines.len(), before + 1, "{field}: one event per refusal");
        let e = lines.last().unwrap().clone();
        assert_eq!(e["event"], "derive.denied", "{e}");
        assert!(e.get(*field).is_none(), "{field} written in clear: {e}");
        let value = match *field {
            "resource" => resource.as_str(),
            "step" => step,
            "tool" => tool,
            _ => scope.unwrap(),
        };
        let o = &e["undeclared"][*field];
        assert_eq!(o["len"], value.len(), "{e}");
        assert_eq!(o["hmac_sha256"].as_str().unwrap().len(), 64, "{e}");
        // The declared fields of the same request are still in clear.
        if *field != "tool" {
            assert_eq!(e["tool"], "notes.read", "{e}");
        }
        if *field != "step" {
            assert_eq!(e["step"], "summarize", "{e}");
        }
        if *field != "resource" {
            assert_eq!(e["resource"], RESOURCE, "{e}");
        }
        seen.push(o["hmac_sha256"].clone());
    }
    assert_eq!(seen[0], seen[5], "the same value, the same HMAC");
    assert_ne!(seen[0], seen[1]);
    // Positive control: a good derive names its declared fields in clear.
    b.derive_ok(&k).await;
    let last = b.audit_lines().pop().unwrap();
    assert_eq!(last["event"], "derive.issued");
    assert_eq!(
        (
            &last["step"],
            &last["tool"],
            &last["resource"],
            &last["scope"]
        ),
        (
            &json!("summarize"),
            &json!("notes.read"),
            &json!(RESOURCE),
            &json!("notes.read")
        )
    );
    assert!(last.get("undeclared").is_none(), "{last}");
    let raw = std::fs::read_to_string(b.path("data/audit.jsonl")).unwrap();
    assert!(!raw.contains(MARK), "a canary reached the audit log: {raw}");
    for c in ['\u{2028}', '\u{2029}', '\u{85}'] {
        assert!(!raw.contains(c), "{c:?} written raw");
    }
    assert_eq!(raw.lines().count(), cases.len() + 1, "no forged line");
}
