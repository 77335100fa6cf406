//! docs/SECURITY-CASES.md group X: the token-exchange request, against the running
//! binary, on both `POST /token` (RFC 8693 form) and `POST /v1/derive`.
//! Each negative is followed by the positive control.
// Test code panics loudly on a broken fixture: clippy.toml allows unwrap and
// expect in #[test] functions, and these helpers are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;
use credbroker::internals::api::{ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE, TOKEN_EXCHANGE};
use credbroker::internals::dpop::make_proof;
use credbroker::verify::{Presented, Verifier};
use serde_json::json;

fn token_proof(b: &TestBroker, k: &credbroker::internals::jose::Es256Key) -> String {
    make_proof(k, "POST", &format!("{}/token", b.issuer), now(), None, None).unwrap()
}

/// A complete, valid RFC 8693 form for alice's notes.read.
fn good_form(subject: &str) -> Vec<(&'static str, String)> {
    vec![
        ("grant_type", TOKEN_EXCHANGE.to_string()),
        ("subject_token", subject.to_string()),
        ("subject_token_type", ACCESS_TOKEN_TYPE.to_string()),
        ("resource", RESOURCE.to_string()),
        ("step", "summarize".to_string()),
        ("tool", "notes.read".to_string()),
    ]
}

fn post_form(b: &TestBroker, f: &[(&str, String)], proof: &str) -> HttpAnswer {
    let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
    b.post_token(&pairs, Some(proof))
}

fn without(f: &[(&'static str, String)], name: &str) -> Vec<(&'static str, String)> {
    f.iter().filter(|(k, _)| *k != name).cloned().collect()
}

fn with(
    f: &[(&'static str, String)],
    name: &'static str,
    value: &str,
) -> Vec<(&'static str, String)> {
    let mut f = without(f, name);
    f.push((name, value.to_string()));
    f
}

fn issued_count(b: &TestBroker) -> usize {
    b.audit_lines()
        .iter()
        .filter(|e| e["event"] == "derive.issued")
        .count()
}

#[tokio::test]
async fn token_exchange_missing_or_unknown_token_types() {
    let b = TestBroker::start();
    let k = key();
    let good = good_form(&b.subject_token("alice"));
    let repeated = {
        let mut f = good.clone();
        f.push(("subject_token", b.subject_token("bob")));
        f
    };
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("missing subject_token", without(&good, "subject_token")),
        (
            "missing subject_token_type",
            without(&good, "subject_token_type"),
        ),
        (
            "unknown subject_token_type",
            with(&good, "subject_token_type", "urn:example:unknown"),
        ),
        (
            "id_token subject_token_type",
            with(
                &good,
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:id_token",
            ),
        ),
        (
            "refresh_token subject_token_type",
            with(
                &good,
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:refresh_token",
            ),
        ),
        (
            "unknown requested_token_type",
            with(&good, "requested_token_type", "urn:example:unknown"),
        ),
        (
            "refresh_token requested",
            with(
                &good,
                "requested_token_type",
                "urn:ietf:params:oauth:token-type:refresh_token",
            ),
        ),
        ("missing grant_type", without(&good, "grant_type")),
        (
            "another grant_type",
            with(&good, "grant_type", "client_credentials"),
        ),
        ("repeated subject_token", repeated),
        (
            "actor_token",
            with(&good, "actor_token", &b.subject_token("mallory")),
        ),
        (
            "audience instead of resource",
            with(&without(&good, "resource"), "audience", RESOURCE),
        ),
        ("missing step", without(&good, "step")),
        ("missing tool", without(&good, "tool")),
    ];
    for (what, f) in cases {
        post_form(&b, &f, &token_proof(&b, &k)).assert_refused(400, "invalid_request", what);
    }
    // The JSON endpoint: a missing field, an unknown one, a wrong type.
    let mut body = b.good_body(&b.subject_token("alice"));
    body.as_object_mut().unwrap().remove("subject_token");
    b.post_derive(&body, Some(&b.proof(&k))).assert_refused(
        400,
        "invalid_request",
        "JSON without subject_token",
    );
    let mut body = b.good_body(&b.subject_token("alice"));
    body["subject_token_type"] = json!("urn:example:unknown");
    b.post_derive(&body, Some(&b.proof(&k))).assert_refused(
        400,
        "invalid_request",
        "JSON with an unknown member",
    );
    let mut body = b.good_body(&b.subject_token("alice"));
    body["step"] = json!(["summarize"]);
    b.post_derive(&body, Some(&b.proof(&k))).assert_refused(
        400,
        "invalid_request",
        "JSON step as an array",
    );
    assert_eq!(issued_count(&b), 0, "nothing was issued");

    // Positive controls: both token types, and the explicit requested type.
    post_form(&b, &good, &token_proof(&b, &k)).assert_issued("access_token subject type");
    let jwt_type = with(
        &good_form(&b.subject_token("alice")),
        "subject_token_type",
        JWT_TOKEN_TYPE,
    );
    post_form(&b, &jwt_type, &token_proof(&b, &k)).assert_issued("jwt subject type");
    let explicit = with(
        &good_form(&b.subject_token("alice")),
        "requested_token_type",
        ACCESS_TOKEN_TYPE,
    );
    let r = post_form(&b, &explicit, &token_proof(&b, &k));
    r.assert_issued("explicit requested_token_type");
    assert_eq!(r.json()["issued_token_type"], ACCESS_TOKEN_TYPE);
    assert_eq!(r.json()["token_type"], "DPoP");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn subject_token_expired_forged_untrusted_or_revoked() {
    let mut b = TestBroker::start();
    let k = key();
    let derive = |b: &TestBroker, st: &str| b.post_derive(&b.good_body(st), Some(&b.proof(&k)));
    let mut expired = b.subject_claims("alice");
    expired["exp"] = json!(now() - 120);
    let mut not_yet = b.subject_claims("alice");
    not_yet["nbf"] = json!(now() + 600);
    let mut untrusted = b.subject_claims("alice");
    untrusted["iss"] = json!("http://evil.example");
    let mut trailing_slash = b.subject_claims("alice");
    trailing_slash["iss"] = json!(format!("{}/", b.issuer));
    let good = b.subject_token("alice");
    let mut sig = good.rsplit('.').next().unwrap().to_string();
    let flip = if sig.starts_with('A') { "B" } else { "A" };
    sig.replace_range(0..1, flip);
    let bad_sig = format!("{}.{sig}", good.rsplit_once('.').unwrap().0);
    let mut other_payload: Vec<&str> = good.split('.').collect();
    let bob = b.subject_token("bob");
    other_payload[1] = bob.split('.').nth(1).unwrap();
    let spliced = other_payload.join(".");
    // A credbroker token presented as a subject token.
    let minted = b.derive_ok(&k).await.access_token.expose().clone();
    let before = issued_count(&b);
    for (what, st) in [
        ("expired two minutes ago", b.subject_with(&expired)),
        (
            "not valid before ten minutes from now",
            b.subject_with(&not_yet),
        ),
        ("untrusted issuer", b.subject_with(&untrusted)),
        (
            "issuer with a trailing slash",
            b.subject_with(&trailing_slash),
        ),
        ("bad signature", bad_sig),
        ("payload of another token under this signature", spliced),
        ("a token minted by credbroker", minted),
        (
            "typ JWT",
            b.sign_as_dev_issuer(json!({"typ": "JWT"}), &b.subject_claims("alice")),
        ),
        (
            "typ dpop+jwt",
            b.sign_as_dev_issuer(json!({"typ": "dpop+jwt"}), &b.subject_claims("alice")),
        ),
        (
            "no typ",
            b.sign_as_dev_issuer(json!({}), &b.subject_claims("alice")),
        ),
    ] {
        derive(&b, &st).assert_refused(400, "invalid_request", what);
    }
    assert_eq!(
        issued_count(&b),
        before,
        "nothing issued for refused subject tokens"
    );

    // Revoked: the issuer's key is taken out of the pinned JWKS (the only
    // revocation a self-contained JWT has); a token it signed is refused.
    let old_token = b.subject_token("alice");
    derive(&b, &old_token).assert_issued("before the key is revoked");
    let (new_key, pkcs8) = credbroker::internals::jose::Es256Key::generate().unwrap();
    std::fs::remove_file(b.path("keys/dev-issuer.pem")).unwrap();
    credbroker::internals::config::write_secret_file(
        &b.path("keys/dev-issuer.pem"),
        credbroker::internals::cli::pem_pkcs8(pkcs8.expose()).as_bytes(),
    )
    .unwrap();
    std::fs::write(
        b.path("dev-issuer-jwks.json"),
        json!({"keys": [new_key.public_jwk]}).to_string(),
    )
    .unwrap();
    b.restart();
    let before = issued_count(&b);
    derive(&b, &old_token).assert_refused(400, "invalid_request", "token of the revoked key");
    assert_eq!(issued_count(&b), before);
    // Positive control: a token from the issuer's current key.
    derive(&b, &b.subject_token("alice")).assert_issued("token of the current key");
    b.derive_ok(&k).await;
}

/// A subject token living longer than `revocation.max_subject_token_lifetime`
/// (`exp - iat`, or `exp` minus now without `iat`) is refused, naming the
/// key: a person stop is kept only that long (plus margins), so a longer
/// token could outlive the stop of its session. Controls: tokens within
/// the bound, with and without `iat`, are served.
#[tokio::test]
async fn subject_token_living_longer_than_the_configured_bound() {
    let b = TestBroker::start_with(Opts {
        extra_config: "\n[revocation]\nmax_subject_token_lifetime = \"10m\"\n".into(),
        ..Default::default()
    });
    let k = key();
    let derive = |st: &str| b.post_derive(&b.good_body(st), Some(&b.proof(&k)));
    let n = now();
    let claims = |iat: Option<i64>, exp: i64| {
        let mut c = b.subject_claims("alice");
        c["exp"] = json!(exp);
        match iat {
            Some(i) => c["iat"] = json!(i),
            None => {
                c.as_object_mut().unwrap().remove("iat");
            }
        }
        c
    };
    let before = issued_count(&b);
    for (what, c) in [
        (
            "an hour, the quick start's default",
            claims(Some(n), n + 3600),
        ),
        ("ten minutes and a second", claims(Some(n), n + 601)),
        (
            "issued an hour ago, five minutes left",
            claims(Some(n - 3600), n + 300),
        ),
        ("no iat, an hour left", claims(None, n + 3600)),
    ] {
        let r = derive(&b.subject_with(&c));
        r.assert_refused(400, "invalid_request", what);
        let why = r.json()["error_description"].as_str().unwrap().to_string();
        assert!(
            why.contains("revocation.max_subject_token_lifetime") && why.contains("600 s"),
            "{what}: {why}"
        );
    }
    assert_eq!(issued_count(&b), before, "nothing issued");
    // Within the bound: served.
    for (what, c) in [
        ("ten minutes exactly", claims(Some(n), n + 600)),
        (
            "issued five minutes ago, five minutes left",
            claims(Some(n - 300), n + 300),
        ),
        ("no iat, five minutes left", claims(None, n + 300)),
    ] {
        derive(&b.subject_with(&c)).assert_issued(what);
    }
    assert_eq!(issued_count(&b), before + 3);
}

#[tokio::test]
async fn resource_relative_with_fragment_or_two_resources() {
    let b = TestBroker::start();
    let k = key();
    for resource in [
        "/notes",
        "notes",
        "//127.0.0.1:9090/notes",
        "http://127.0.0.1:9090/notes#top",
        "http://127.0.0.1:9090/notes#",
        "http://127.0.0.1:9090/notes?all=1",
        "http://alice@127.0.0.1:9090/notes",
        "ftp://127.0.0.1:9090/notes",
        "http://api.example/notes",
        "",
    ] {
        let mut body = b.good_body(&b.subject_token("alice"));
        body["resource"] = json!(resource);
        b.post_derive(&body, Some(&b.proof(&k))).assert_refused(
            400,
            "invalid_target",
            &format!("resource {resource:?}"),
        );
    }
    // Two resources on the form: one allowed, one not; and the same twice.
    let good = good_form(&b.subject_token("alice"));
    let mut two = good.clone();
    two.push(("resource", "http://127.0.0.1:9090/admin".into()));
    post_form(&b, &two, &token_proof(&b, &k)).assert_refused(
        400,
        "invalid_target",
        "two resources, one disallowed",
    );
    let mut twice = good.clone();
    twice.push(("resource", RESOURCE.into()));
    post_form(&b, &twice, &token_proof(&b, &k)).assert_refused(
        400,
        "invalid_target",
        "the same resource twice",
    );
    assert_eq!(issued_count(&b), 0);
    post_form(&b, &good, &token_proof(&b, &k)).assert_issued("one resource");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn derived_token_lifetime_is_min_of_policy_ttl_300s_and_subject_life() {
    let b = TestBroker::start_with(Opts {
        policy: Some(policy_without_approval()),
        ..Opts::default()
    });
    let k = key();
    let lifetime = |t: &str| {
        let c = claims_of(t);
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap()
    };
    // Policy ttl 300 s (also the hard cap), subject valid for an hour.
    let t = b.derive_ok(&k).await;
    assert_eq!(lifetime(t.access_token.expose()), 300);
    // The sensitive tool's own ttl (60 s).
    let body = json!({"subject_token": b.subject_token("alice"), "step": "cleanup_confirmed",
        "tool": "notes.delete", "resource": RESOURCE});
    let t = b
        .post_derive(&body, Some(&b.proof(&k)))
        .assert_issued("notes.delete");
    assert_eq!(lifetime(&t), 60);
    // A subject token with 100 s left: the derived token ends with it.
    let mut c = b.subject_claims("alice");
    let subject_exp = now() + 100;
    c["exp"] = json!(subject_exp);
    let r = b.post_derive(&b.good_body(&b.subject_with(&c)), Some(&b.proof(&k)));
    let t = r.assert_issued("subject with 100 s left");
    assert_eq!(claims_of(&t)["exp"].as_i64().unwrap(), subject_exp);
    assert!(
        (98..=100).contains(&lifetime(&t)),
        "exp - iat = {}",
        lifetime(&t)
    );
    let expires_in = r.json()["expires_in"].as_i64().unwrap();
    assert!(
        (98..=100).contains(&expires_in),
        "expires_in = {expires_in}"
    );
    // A subject token expired 5 s ago is inside the issuer's clock skew but
    // leaves no life to give: refused, never a zero-length or negative token.
    let mut c = b.subject_claims("alice");
    c["exp"] = json!(now() - 5);
    b.post_derive(&b.good_body(&b.subject_with(&c)), Some(&b.proof(&k)))
        .assert_refused(400, "invalid_request", "subject expired 5 s ago");
    b.derive_ok(&k).await;
}

#[tokio::test]
async fn issued_token_claims_are_exact() {
    let b = TestBroker::start();
    let k = key();
    let jwks: serde_json::Value = serde_json::from_slice(&b.jwks().await).unwrap();
    let mut jtis = std::collections::HashSet::new();
    // The resource as the policy writes it, and two spellings that are
    // canonically the same: aud is always the policy's identifier.
    for resource in [
        RESOURCE,
        "HTTP://127.0.0.1:9090/notes",
        "http://127.0.0.1:9090/notes",
    ] {
        for _ in 0..2 {
            let mut body = b.good_body(&b.subject_token("alice"));
            body["resource"] = json!(resource);
            let t = b
                .post_derive(&body, Some(&b.proof(&k)))
                .assert_issued(resource);
            let h = header_of(&t);
            assert_eq!(h["alg"], "ES256");
            assert_eq!(h["typ"], "at+jwt");
            assert!(
                jwks["keys"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|j| j["kid"] == h["kid"]),
                "kid {} not in the JWKS",
                h["kid"]
            );
            let c = claims_of(&t);
            assert_eq!(c["iss"], b.issuer.as_str());
            assert_eq!(
                c["aud"],
                json!(RESOURCE),
                "aud is exactly the resource, one string"
            );
            assert_eq!(c["sub"], "alice");
            assert_eq!(c["scope"], "notes.read");
            assert_eq!(c["cnf"], json!({"jkt": ec_thumbprint(&k.public_jwk)}));
            assert_eq!(c["act"]["sub"], "repo-helper");
            assert_eq!(c["act"]["tool"], "notes.read");
            assert_eq!(c["act"]["step"], "summarize", "the step is in act");
            assert_eq!(c["client_id"], "repo-helper");
            assert!(c["exp"].as_i64().unwrap() > c["iat"].as_i64().unwrap());
            let jti = c["jti"].as_str().unwrap().to_string();
            assert!(jti.len() >= 16, "jti has at least 96 bits");
            assert!(jtis.insert(jti), "jti repeated");
            // The token verifies on the published keys.
            let rs = Verifier::from_jwks(&b.issuer, RESOURCE, &b.jwks().await).unwrap();
            let url = "http://127.0.0.1:9090/notes/1";
            let p = make_proof(&k, "GET", url, now(), Some(&t), None).unwrap();
            let auth = format!("DPoP {t}");
            rs.verify(&Presented {
                method: "GET",
                url,
                authorization: Some(&auth),
                dpop: &[&p],
            })
            .expect("verifies");
        }
    }
    // A resource server for another audience refuses it (negative, after
    // the positives above, which are this test's controls).
    let t = b.derive_ok(&k).await.access_token.expose().clone();
    let other =
        Verifier::from_jwks(&b.issuer, "http://127.0.0.1:9090/admin", &b.jwks().await).unwrap();
    let url = "http://127.0.0.1:9090/admin";
    let p = make_proof(&k, "GET", url, now(), Some(&t), None).unwrap();
    let auth = format!("DPoP {t}");
    assert_eq!(
        other.verify(&Presented {
            method: "GET",
            url,
            authorization: Some(&auth),
            dpop: &[&p]
        }),
        Err(credbroker::verify::VerifyError::Audience)
    );
}

fn allow_only_another_uid(text: String) -> String {
    let me = credbroker::internals::unix::current_uid();
    let other = if me == 65534 { 65533 } else { 65534 };
    text.replacen(
        "[socket]\n",
        &format!("[socket]\nallowed_uids = [{other}]\n"),
        1,
    )
}

#[tokio::test]
async fn peer_uid_not_in_allow_list_refused_before_parsing() {
    let b = TestBroker::start_with(Opts {
        edit_config: Some(allow_only_another_uid),
        ..Opts::default()
    });
    let k = key();
    let body = b.good_body(&b.subject_token("alice")).to_string();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a valid derive", http_derive(&body, Some(&b.proof(&k)), "")),
        (
            "bytes that are not HTTP",
            b"\x00\x01\x02 not http at all\r\n\r\n".to_vec(),
        ),
        ("a body that is not JSON", http_derive("{{{", Some("x"), "")),
        ("nothing at all", Vec::new()),
    ];
    for (what, bytes) in cases {
        let r = b.http(&bytes);
        r.assert_refused(403, "access_denied", what);
        assert!(r.body.contains("peer uid"), "{what}: {}", r.raw);
    }
    // Nothing reached the pipeline: no event, no derive counted.
    assert!(b.audit_lines().is_empty(), "{:?}", b.audit_lines());
    assert!(
        !b.metrics().contains("derives_total{"),
        "a derive was counted"
    );
    assert!(b.log_text().contains("peer uid not in the allow-list"));
    // Positive control: the same request on a broker that allows our uid.
    let ok = TestBroker::start();
    ok.post_derive(
        &ok.good_body(&ok.subject_token("alice")),
        Some(&ok.proof(&k)),
    )
    .assert_issued("allowed uid");
    ok.derive_ok(&k).await;
}

#[tokio::test]
async fn request_with_origin_header_refused_before_parsing() {
    let b = TestBroker::start();
    let k = key();
    let body = b.good_body(&b.subject_token("alice")).to_string();
    let proof = b.proof(&k);
    for origin in ["http://evil.example", "null", "http://127.0.0.1:0", ""] {
        let r = b.http(&http_derive(
            &body,
            Some(&proof),
            &format!("origin: {origin}\r\n"),
        ));
        r.assert_refused(403, "access_denied", &format!("Origin {origin:?}"));
        // A body that would not even parse gets the same answer.
        let r = b.http(&http_derive(
            "not json",
            None,
            &format!("origin: {origin}\r\n"),
        ));
        r.assert_refused(
            403,
            "access_denied",
            &format!("Origin {origin:?} with a bad body"),
        );
    }
    // The proof was never looked at: no event, and it still works once.
    assert!(b.audit_lines().is_empty(), "{:?}", b.audit_lines());
    b.http(&http_derive(&body, Some(&proof), ""))
        .assert_issued("the same request without Origin");
    b.derive_ok(&k).await;
}
