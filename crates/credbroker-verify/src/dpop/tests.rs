use super::*;

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

use crate::jose::{b64e, Es256Key};

const NOW: i64 = 1_700_000_000;
const HTU: &str = "https://broker.example/v1/derive";

fn key() -> Es256Key {
    Es256Key::generate().unwrap().0
}

fn validator() -> Validator {
    Validator::new(vec![Alg::ES256], 1024, None)
}

fn expect(now: i64) -> Expect<'static> {
    Expect {
        method: "POST",
        htu: HTU,
        access_token: None,
        jkt: None,
        now,
    }
}

/// A `jti` never used before in this test binary.
fn jti() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("jti-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// The public JWK as a client puts it in the header.
fn header_jwk(k: &Es256Key) -> Value {
    let mut jwk = k.public_jwk.clone();
    let o = jwk.as_object_mut().unwrap();
    o.remove("kid");
    o.remove("use");
    o.remove("alg");
    jwk
}

/// The header of a correct proof (`alg` included).
fn header(k: &Es256Key) -> Map<String, Value> {
    let mut h = Map::new();
    h.insert("typ".into(), json!("dpop+jwt"));
    h.insert("alg".into(), json!("ES256"));
    h.insert("jwk".into(), header_jwk(k));
    h
}

/// The claims of a correct proof at `iat`.
fn claims(iat: i64) -> Map<String, Value> {
    json!({"jti": jti(), "htm": "POST", "htu": HTU, "iat": iat})
        .as_object()
        .unwrap()
        .clone()
}

/// Signs exactly the given header and claims (no member added or changed),
/// so malformed proofs can be built by hand.
fn sign(k: &Es256Key, header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        b64e(&serde_json::to_vec(header).unwrap()),
        b64e(&serde_json::to_vec(claims).unwrap())
    );
    let sig = k.sign_raw(input.as_bytes()).unwrap();
    format!("{input}.{}", b64e(&sig))
}

/// A correct proof at `iat` by `k`.
fn good(k: &Es256Key, iat: i64) -> String {
    sign(k, &Value::Object(header(k)), &Value::Object(claims(iat)))
}

/// A proof whose header has `name` set to `value` (or removed for `None`).
fn with_header(k: &Es256Key, name: &str, value: Option<Value>) -> String {
    let mut h = header(k);
    match value {
        Some(v) => h.insert(name.into(), v),
        None => h.remove(name),
    };
    sign(k, &Value::Object(h), &Value::Object(claims(NOW)))
}

/// A proof whose claims have `name` set to `value` (or removed for `None`).
fn with_claim(k: &Es256Key, name: &str, value: Option<Value>) -> String {
    let mut c = claims(NOW);
    match value {
        Some(v) => c.insert(name.into(), v),
        None => c.remove(name),
    };
    sign(k, &Value::Object(header(k)), &Value::Object(c))
}

#[test]
fn correct_proof_is_accepted_and_reports_its_key() {
    let k = key();
    let v = validator();
    let ok = v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
    assert_eq!(ok.jkt, k.thumbprint());
    assert_eq!(ok.iat, NOW);
    assert_eq!(v.replay_cache().len(), 1);
    // make_proof (used by the CLI and the client) builds the same thing.
    let p = make_proof(&k, "POST", HTU, NOW, None, None).unwrap();
    assert_eq!(v.validate(&p, &expect(NOW)).unwrap().jkt, k.thumbprint());
}

#[test]
fn rfc9449_example_proof_validates() {
    // RFC 9449 figure 2 (an interoperability check against the RFC's own
    // bytes); its key's thumbprint is the `jkt` the RFC publishes.
    let proof = "eyJ0eXAiOiJkcG9wK2p3dCIsImFsZyI6IkVTMjU2IiwiandrIjp7Imt0eSI6IkVDIiwieCI6Imw4dEZyaHgtMzR0VjNoUklDUkRZOXpDa0RscEJoRjQyVVFVZldWQVdCRnMiLCJ5IjoiOVZFNGpmX09rX282NHpiVFRsY3VOSmFqSG10NnY5VERWclUwQ2R2R1JEQSIsImNydiI6IlAtMjU2In19.eyJqdGkiOiItQndDM0VTYzZhY2MybFRjIiwiaHRtIjoiUE9TVCIsImh0dSI6Imh0dHBzOi8vc2VydmVyLmV4YW1wbGUuY29tL3Rva2VuIiwiaWF0IjoxNTYyMjYyNjE2fQ.2-GxA6T8lP4vfrg8v-FdWP0A0zdrj8igiMLvqRMUvwnQg4PtFLbdLXiOSsX0x7NVY-FNyJK70nfbV37xRZT3Lg";
    let v = validator();
    let e = Expect {
        method: "POST",
        htu: "https://server.example.com/token",
        access_token: None,
        jkt: Some("0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"),
        now: 1_562_262_616,
    };
    // Negative first: ten minutes later it is stale.
    let late = Expect {
        now: e.now + 600,
        ..e
    };
    assert_eq!(v.validate(proof, &late).unwrap_err(), DpopError::Iat);
    let ok = v.validate(proof, &e).unwrap();
    assert_eq!(ok.jkt, "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I");
    assert_eq!(v.validate(proof, &e).unwrap_err(), DpopError::Replay);
}

// ---------------------------------------------------------------- D1

#[test]
fn d1_two_proofs_non_jwt_and_jwe_are_refused() {
    let k = key();
    let v = validator();
    let a = good(&k, NOW);
    let b = good(&k, NOW);
    let jwe = "eyJhbGciOiJSU0EtT0FFUCIsImVuYyI6IkEyNTZHQ00ifQ.OKOawDo13gRp2ojaHV7LFpZcgV7T6DVZKTyKOMTYUmKoTCVJRgckCL9kiMT03JGeipsEdY3mx_etLbbWSrFr05kLzcSr4qKAq7YN7e9jwQRb23nfa6c9d-StnImGyFDbSv04uVuxIp5Zms1gNxKKK2Da14B8S4rzVRltdYwam_lDp5XnZAYpQdb76FdIKLaVmqgfwX7XWRxv2322i-vDxRfqNzo_tETKzpVLzfiwQyeyPGLBIO56YJ7eObdv0je81860ppamavo35UgoRdbYaBcoh9QcfylQr66oc6vFWXRcZ_ZT2LawVCWTIy3brGPi6UklfCpIMfIjf7iGdXKHzg.48V1_ALb6US04U3b.5eym8TW_c8SuK0ltJ3rpYIzOeDQz7TALvtu6UG9oMo4vpzs9tX_EFShS8iB7j6jiSdiwkIr3ajwQzaBtQD_A.XFBoMYUZodetZdvTiFvSkQ";
    for bad in [
        format!("{a},{b}"),
        format!("{a}, {b}"),
        format!("{a}.{b}"),
        "not-a-jwt".to_string(),
        String::new(),
        "Bearer abc".to_string(),
        jwe.to_string(),
    ] {
        let err = v.validate(&bad, &expect(NOW)).unwrap_err();
        assert!(matches!(err, DpopError::Jose(_)), "{err:?}");
    }
    // The JWE's 5 segments are refused as not compact, not decoded.
    assert_eq!(
        v.validate(jwe, &expect(NOW)).unwrap_err(),
        DpopError::Jose(JoseError::NotCompact)
    );
    // Nothing of the above took a cache slot; each proof alone is fine.
    assert!(v.replay_cache().is_empty());
    v.validate(&a, &expect(NOW)).unwrap();
    v.validate(&b, &expect(NOW)).unwrap();
}

// ---------------------------------------------------------------- D2

#[test]
fn d2_proof_missing_a_required_member_is_refused() {
    let k = key();
    let v = validator();
    let cases: [(&str, String, DpopError); 7] = [
        ("typ", with_header(&k, "typ", None), DpopError::Typ),
        (
            "alg",
            with_header(&k, "alg", None),
            DpopError::Jose(JoseError::Json("header")),
        ),
        ("jwk", with_header(&k, "jwk", None), DpopError::Jwk),
        ("jti", with_claim(&k, "jti", None), DpopError::Claims),
        ("htm", with_claim(&k, "htm", None), DpopError::Claims),
        ("htu", with_claim(&k, "htu", None), DpopError::Claims),
        ("iat", with_claim(&k, "iat", None), DpopError::Claims),
    ];
    for (member, proof, want) in cases {
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            want,
            "without {member}"
        );
    }
    // Wrongly typed members are refused like missing ones.
    for (name, value) in [
        ("jti", json!(5)),
        ("htm", json!(["POST"])),
        ("htu", json!({})),
        ("iat", json!(NOW.to_string())),
        ("iat", json!(true)),
        ("ath", json!(1)),
        ("nonce", json!(false)),
    ] {
        let proof = with_claim(&k, name, Some(value.clone()));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Claims,
            "{name} = {value}"
        );
    }
    // Claims that are not a JSON object.
    let h = Value::Object(header(&k));
    for c in [json!([]), json!("x"), json!(null)] {
        assert_eq!(
            v.validate(&sign(&k, &h, &c), &expect(NOW)).unwrap_err(),
            DpopError::Claims
        );
    }
    assert!(v.replay_cache().is_empty());
    v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
}

// ---------------------------------------------------------------- D3

#[test]
fn d3_wrong_typ_is_refused() {
    let k = key();
    let v = validator();
    for typ in [
        "JWT",
        "at+jwt",
        "secevent+jwt",
        "DPoP+JWT",
        "dpop+jwt ",
        "application/dpop+jwt",
        "",
    ] {
        let proof = with_header(&k, "typ", Some(json!(typ)));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Typ,
            "{typ}"
        );
    }
    let proof = with_header(&k, "typ", Some(json!(null)));
    assert_eq!(
        v.validate(&proof, &expect(NOW)).unwrap_err(),
        DpopError::Typ
    );
    let proof = with_header(&k, "typ", Some(json!(1)));
    assert_eq!(
        v.validate(&proof, &expect(NOW)).unwrap_err(),
        DpopError::Jose(JoseError::Json("header"))
    );
    v.validate(
        &with_header(&k, "typ", Some(json!("dpop+jwt"))),
        &expect(NOW),
    )
    .unwrap();
}

// ---------------------------------------------------------------- D4

#[test]
fn d4_alg_outside_the_allow_list_is_refused() {
    let k = key();
    let v = validator();
    // `none` and `HS256` still carry a (real ES256) signature: the alg alone
    // decides.
    for alg in [
        "none",
        "HS256",
        "unsupported",
        "RS256",
        "PS256",
        "es256",
        "ES384",
    ] {
        let proof = with_header(&k, "alg", Some(json!(alg)));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Alg,
            "{alg}"
        );
    }
    for alg in [json!(1), json!(true), json!(null), json!(["ES256"])] {
        let proof = with_header(&k, "alg", Some(alg.clone()));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Jose(JoseError::Json("header")),
            "{alg}"
        );
    }
    // Even where RS256 is allowed, it is refused with an EC key (alg bound to
    // the key type).
    let lenient = Validator::new(vec![Alg::ES256, Alg::RS256], 64, None);
    let proof = with_header(&k, "alg", Some(json!("RS256")));
    assert_eq!(
        lenient.validate(&proof, &expect(NOW)).unwrap_err(),
        DpopError::Alg
    );
    lenient.validate(&good(&k, NOW), &expect(NOW)).unwrap();
    v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
}

// ---------------------------------------------------------------- D5

#[test]
fn d5_unusable_jwk_is_refused() {
    let k = key();
    let v = validator();
    let mut bad_jwks = Vec::new();
    let mut private = header_jwk(&k);
    private["d"] = json!(b64e(&[3u8; 32]));
    bad_jwks.push(("private d", private));
    bad_jwks.push(("oct", json!({"kty": "oct", "k": b64e(&[3u8; 32])})));
    bad_jwks.push(("string", json!("EC")));
    bad_jwks.push(("array", json!([header_jwk(&k)])));
    bad_jwks.push(("null", json!(null)));
    let mut off_curve = header_jwk(&k);
    let mut y = crate::jose::b64d(off_curve["y"].as_str().unwrap(), "y").unwrap();
    y[31] ^= 1;
    off_curve["y"] = json!(b64e(&y));
    bad_jwks.push(("off curve", off_curve));
    let mut alg_mismatch = header_jwk(&k);
    alg_mismatch["alg"] = json!("RS256");
    bad_jwks.push(("crv/alg mismatch", alg_mismatch));
    let mut p384 = header_jwk(&k);
    p384["crv"] = json!("P-384");
    bad_jwks.push(("P-384", p384));
    for (what, jwk) in bad_jwks {
        let proof = with_header(&k, "jwk", Some(jwk));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Jwk,
            "{what}"
        );
    }
    // A valid public key that did not sign the proof.
    let proof = with_header(&k, "jwk", Some(header_jwk(&key())));
    assert_eq!(
        v.validate(&proof, &expect(NOW)).unwrap_err(),
        DpopError::Jose(JoseError::Signature)
    );
    assert!(v.replay_cache().is_empty());
    // Extra public members (kid, alg ES256, use sig) are fine.
    let proof = with_header(&k, "jwk", Some(k.public_jwk.clone()));
    v.validate(&proof, &expect(NOW)).unwrap();
}

// ---------------------------------------------------------------- D7

#[test]
fn d7_htm_must_match_the_method_case_sensitively() {
    let k = key();
    let v = validator();
    for htm in ["PUT", "post", "Post", "POST ", "GET", ""] {
        let proof = with_claim(&k, "htm", Some(json!(htm)));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Htm,
            "{htm}"
        );
    }
    v.validate(&with_claim(&k, "htm", Some(json!("POST"))), &expect(NOW))
        .unwrap();
}

// ---------------------------------------------------------------- D8

#[test]
fn d8_htu_with_another_host_or_path_is_refused() {
    let k = key();
    let v = validator();
    for htu in [
        "https://evil.example/v1/derive",
        "https://broker.example.evil/v1/derive",
        "https://broker.example/v1/derive/",
        "https://broker.example/v1/other",
        "https://broker.example/v1/Derive",
        "https://broker.example/",
        "http://broker.example/v1/derive",
        "https://broker.example:8443/v1/derive",
        "https://user@broker.example/v1/derive",
        "/v1/derive",
        "broker.example/v1/derive",
        "not a url",
        "",
    ] {
        let proof = with_claim(&k, "htu", Some(json!(htu)));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Htu,
            "{htu}"
        );
    }
    // RFC 9449 section 4.3: query and fragment are ignored, and syntax-based
    // normalisation (case of scheme and host, default port) applies.
    for htu in [
        HTU,
        "https://broker.example/v1/derive?x=1",
        "https://broker.example/v1/derive#f",
        "HTTPS://Broker.Example:443/v1/derive",
    ] {
        let proof = with_claim(&k, "htu", Some(json!(htu)));
        v.validate(&proof, &expect(NOW)).unwrap();
    }
}

#[test]
fn normalize_htu_drops_query_and_fragment_only() {
    assert_eq!(
        normalize_htu("HTTPS://A.example:443/p?q#f").as_deref(),
        Some("https://a.example/p")
    );
    assert_eq!(
        normalize_htu("https://a.example").as_deref(),
        Some("https://a.example/")
    );
    assert_eq!(normalize_htu("mailto:a@b.example"), None);
    assert_eq!(normalize_htu("relative/path"), None);
}

/// `validate` accepts a proof whose `htu` is byte for byte the expected
/// (normalised) URL without parsing it: sound only if a normalised URL
/// normalises to itself, for the URLs requests are made to.
#[test]
fn a_normalised_htu_is_a_fixed_point_of_normalising() {
    for raw in [
        HTU,
        "HTTPS://Broker.Example:443/v1/derive?x=1#f",
        "http://127.0.0.1:8080/proxy/github/repos/o/r/contents/a%20b.txt",
        "https://[::1]:8443/proxy/demo/blob/10",
        "https://broker.example/proxy/svc/a/./b/../c",
        "https://broker.example/p%7e%41/%zz/x y",
        "https://xn--bcher-kva.example/pfad",
        "https://b\u{fc}cher.example/pfad",
        "https://broker.example",
    ] {
        let once = normalize_htu(raw).expect(raw);
        assert_eq!(
            normalize_htu(&once).as_deref(),
            Some(once.as_str()),
            "{raw}"
        );
    }
}

// ----------------------------------------------------------- D10 and D11

#[test]
fn d10_iat_outside_the_window_is_refused() {
    let k = key();
    let v = validator();
    for iat in [NOW - 61, NOW + 61, NOW - 3600, NOW + 3600, 0, -1] {
        assert_eq!(
            v.validate(&good(&k, iat), &expect(NOW)).unwrap_err(),
            DpopError::Iat,
            "iat = now {:+}",
            iat - NOW
        );
    }
    // Extreme values are refused, not wrapped around (overflow).
    for iat in [i64::MAX, i64::MIN, i64::MIN + NOW, i64::MAX - 1] {
        let err = v.validate(&good(&k, iat), &expect(NOW)).unwrap_err();
        assert!(
            matches!(err, DpopError::Iat | DpopError::Claims),
            "{iat}: {err:?}"
        );
    }
    for iat in [json!(1e300), json!(-1e300), json!(u64::MAX)] {
        let proof = with_claim(&k, "iat", Some(iat));
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Claims
        );
    }
    assert!(v.replay_cache().is_empty());
    // The edges of the window are inside it.
    v.validate(&good(&k, NOW - IAT_WINDOW), &expect(NOW))
        .unwrap();
    v.validate(&good(&k, NOW + IAT_WINDOW), &expect(NOW))
        .unwrap();
}

#[test]
fn d11_iat_within_ten_seconds_is_accepted() {
    let k = key();
    let v = validator();
    for iat in [NOW - 10, NOW + 10, NOW] {
        assert_eq!(v.validate(&good(&k, iat), &expect(NOW)).unwrap().iat, iat);
    }
    // A fractional iat is floored.
    let proof = with_claim(&k, "iat", Some(json!(NOW as f64 + 0.75)));
    assert_eq!(v.validate(&proof, &expect(NOW)).unwrap().iat, NOW);
    // And the same proof is refused once the window has passed.
    let later = good(&k, NOW + 10);
    assert_eq!(
        v.validate(&later, &expect(NOW + 10 + IAT_WINDOW + 1))
            .unwrap_err(),
        DpopError::Iat
    );
    v.validate(&later, &expect(NOW + 10 + IAT_WINDOW)).unwrap();
}

// ---------------------------------------------------------------- D12

#[test]
fn d12_replayed_proof_is_refused() {
    let k = key();
    let v = validator();
    let proof = good(&k, NOW);
    v.validate(&proof, &expect(NOW)).unwrap();
    assert_eq!(
        v.validate(&proof, &expect(NOW)).unwrap_err(),
        DpopError::Replay
    );
    assert_eq!(
        v.validate(&proof, &expect(NOW + 30)).unwrap_err(),
        DpopError::Replay
    );
    // Same jti, same key, otherwise different proof: still a replay.
    let mut c = claims(NOW + 1);
    c.insert("jti".into(), json!("fixed-jti"));
    let h = Value::Object(header(&k));
    v.validate(&sign(&k, &h, &Value::Object(c.clone())), &expect(NOW))
        .unwrap();
    c.insert("iat".into(), json!(NOW + 2));
    assert_eq!(
        v.validate(&sign(&k, &h, &Value::Object(c.clone())), &expect(NOW))
            .unwrap_err(),
        DpopError::Replay
    );
    // Another key may use the same jti value: the cache is per key.
    let other = key();
    v.validate(
        &sign(&other, &Value::Object(header(&other)), &Value::Object(c)),
        &expect(NOW),
    )
    .unwrap();
    // A fresh proof from the first key still works.
    v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
}

#[test]
fn d12_oversized_or_empty_jti_is_refused() {
    let k = key();
    let v = validator();
    // 10 KB: the proof is over the size cap before anything is decoded.
    let proof = with_claim(&k, "jti", Some(json!("j".repeat(10 * 1024))));
    assert_eq!(
        v.validate(&proof, &expect(NOW)).unwrap_err(),
        DpopError::Jose(JoseError::TooLarge(MAX_PROOF_LEN))
    );
    // Within the size cap but over the jti limit, and empty.
    for bad in ["j".repeat(MAX_JTI_LEN + 1), String::new()] {
        let proof = with_claim(&k, "jti", Some(json!(bad)));
        assert!(proof.len() <= MAX_PROOF_LEN);
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::Replay
        );
    }
    assert!(v.replay_cache().is_empty());
    let proof = with_claim(&k, "jti", Some(json!("j".repeat(MAX_JTI_LEN))));
    v.validate(&proof, &expect(NOW)).unwrap();
}

// ---------------------------------------------------------------- D13

#[test]
fn d13_ath_missing_or_over_another_token_is_refused() {
    let k = key();
    let v = validator();
    let token = "access-token-bytes";
    let e = Expect {
        access_token: Some(token),
        ..expect(NOW)
    };
    let no_ath = good(&k, NOW);
    assert_eq!(v.validate(&no_ath, &e).unwrap_err(), DpopError::Ath);
    let wrong = with_claim(
        &k,
        "ath",
        Some(json!(crate::jose::sha256_b64(b"another-token"))),
    );
    assert_eq!(v.validate(&wrong, &e).unwrap_err(), DpopError::Ath);
    let right = crate::jose::sha256_b64(token.as_bytes());
    for variant in [
        format!("{right}="),
        right.to_uppercase(),
        String::new(),
        right[1..].to_string(),
    ] {
        let p = with_claim(&k, "ath", Some(json!(variant)));
        assert_eq!(v.validate(&p, &e).unwrap_err(), DpopError::Ath, "{variant}");
    }
    let p = make_proof(&k, "POST", HTU, NOW, Some("another-token"), None).unwrap();
    assert_eq!(v.validate(&p, &e).unwrap_err(), DpopError::Ath);
    assert!(v.replay_cache().is_empty());
    let p = make_proof(&k, "POST", HTU, NOW, Some(token), None).unwrap();
    v.validate(&p, &e).unwrap();
    v.validate(&with_claim(&k, "ath", Some(json!(right))), &e)
        .unwrap();
}

// ---------------------------------------------------------------- D14

#[test]
fn d14_proof_by_a_key_other_than_the_bound_one_is_refused() {
    let (bound, other) = (key(), key());
    let v = validator();
    let e = Expect {
        jkt: Some(bound.thumbprint()),
        ..expect(NOW)
    };
    assert_eq!(
        v.validate(&good(&other, NOW), &e).unwrap_err(),
        DpopError::KeyMismatch
    );
    // A prefix of the thumbprint is not the thumbprint.
    let short = &bound.thumbprint()[..20];
    let e_short = Expect {
        jkt: Some(short),
        ..expect(NOW)
    };
    assert_eq!(
        v.validate(&good(&bound, NOW), &e_short).unwrap_err(),
        DpopError::KeyMismatch
    );
    assert!(v.replay_cache().is_empty());
    let ok = v.validate(&good(&bound, NOW), &e).unwrap();
    assert_eq!(ok.jkt, bound.thumbprint());
}

// ---------------------------------------------------------------- D15

fn nonces() -> Nonces {
    Nonces::new(&SecretBytes::new(vec![42u8; 32]), "host-a/101")
}

#[test]
fn d15_nonce_required_missing_stale_or_foreign_is_refused() {
    let k = key();
    let v = Validator::new(vec![Alg::ES256], 1024, Some(nonces()));
    let proof_with = |nonce: Option<&str>, jti: &str| {
        let mut c = claims(NOW);
        c.insert("jti".into(), json!(jti));
        if let Some(n) = nonce {
            c.insert("nonce".into(), json!(n));
        }
        sign(&k, &Value::Object(header(&k)), &Value::Object(c))
    };
    // No nonce.
    assert_eq!(
        v.validate(&proof_with(None, "j1"), &expect(NOW))
            .unwrap_err(),
        DpopError::UseNonce
    );
    // A stale nonce (issued three buckets ago).
    let stale = v.fresh_nonce(NOW - 90).unwrap();
    assert_eq!(
        v.validate(&proof_with(Some(&stale), "j1"), &expect(NOW))
            .unwrap_err(),
        DpopError::UseNonce
    );
    // A nonce made under another key, one made under the same key by
    // another instance (a replica sharing the key record), and garbage.
    let foreign = Nonces::new(&SecretBytes::new(vec![7u8; 32]), "host-a/101").issue(NOW);
    let other_replica = Nonces::new(&SecretBytes::new(vec![42u8; 32]), "host-b/101").issue(NOW);
    for bad in [
        foreign.as_str(),
        other_replica.as_str(),
        "",
        "nonce",
        &stale[..stale.len() - 1],
    ] {
        assert_eq!(
            v.validate(&proof_with(Some(bad), "j1"), &expect(NOW))
                .unwrap_err(),
            DpopError::UseNonce,
            "{bad}"
        );
    }
    // The refusals did not burn the jti: the client retries with the fresh
    // nonce (the one the server would send in DPoP-Nonce) and the same jti.
    assert!(v.replay_cache().is_empty());
    let fresh = v.fresh_nonce(NOW).unwrap();
    v.validate(&proof_with(Some(&fresh), "j1"), &expect(NOW))
        .unwrap();
    // A nonce from the previous bucket is still accepted.
    let previous = v.fresh_nonce(NOW - 30).unwrap();
    v.validate(&proof_with(Some(&previous), "j2"), &expect(NOW))
        .unwrap();
}

#[test]
fn nonce_domains_never_accept_each_others_nonces() {
    let key = SecretBytes::new(vec![42u8; 32]);
    let derive = Nonces::new(&key, "host-a/1\nboot-1");
    let proxy = Nonces::proxy(&key);
    assert_eq!(derive.domain(), NonceDomain::Derive);
    assert_eq!(proxy.domain(), NonceDomain::Proxy);
    // The same key, bucket and (empty or not) binding: only the label
    // tells them apart, and it does.
    let unbound = Nonces::new(&key, "");
    for t in [NOW, NOW - 30, NOW + 30] {
        assert!(!derive.check(&proxy.issue(t), NOW), "proxy on derive, {t}");
        assert!(
            !unbound.check(&proxy.issue(t), NOW),
            "proxy on unbound derive, {t}"
        );
        assert!(!proxy.check(&derive.issue(t), NOW), "derive on proxy, {t}");
        assert!(
            !proxy.check(&unbound.issue(t), NOW),
            "unbound derive on proxy, {t}"
        );
    }
    // Proxy nonces: every holder of the key issues the same ones (every
    // replica), from the bucket before to the bucket after (clocks of
    // replicas differ); a bucket further is refused, as is another key.
    let replica_b = Nonces::proxy(&key);
    assert_eq!(replica_b.issue(NOW), proxy.issue(NOW));
    for t in [NOW - 30, NOW, NOW + 30] {
        assert!(replica_b.check(&proxy.issue(t), NOW), "{t}");
    }
    for t in [NOW - 60, NOW + 60] {
        assert!(!replica_b.check(&proxy.issue(t), NOW), "{t}");
    }
    let other_key = Nonces::proxy(&SecretBytes::new(vec![7u8; 32]));
    assert!(!other_key.check(&proxy.issue(NOW), NOW));
    // Derive nonces: one boot of one instance, this bucket and the one
    // before only.
    let next_boot = Nonces::new(&key, "host-a/1\nboot-2");
    assert!(!next_boot.check(&derive.issue(NOW), NOW));
    assert!(derive.check(&derive.issue(NOW), NOW));
    assert!(derive.check(&derive.issue(NOW - 30), NOW));
    assert!(!derive.check(&derive.issue(NOW + 30), NOW));
}

#[test]
fn lacks_fresh_nonce_reads_only_the_nonce_and_agrees_with_validate() {
    let k = key();
    let v = Validator::new(vec![Alg::ES256], 1024, Some(nonces()));
    let with = |nonce: Option<&str>| {
        let mut c = claims(NOW);
        if let Some(n) = nonce {
            c.insert("nonce".into(), json!(n));
        }
        sign(&k, &Value::Object(header(&k)), &Value::Object(c))
    };
    let stale = v.fresh_nonce(NOW - 90).unwrap();
    for (what, proof) in [
        ("no nonce", with(None)),
        ("a stale nonce", with(Some(&stale))),
    ] {
        assert!(v.lacks_fresh_nonce(&proof, NOW), "{what}");
        assert_eq!(
            v.validate(&proof, &expect(NOW)).unwrap_err(),
            DpopError::UseNonce,
            "{what}"
        );
    }
    // What does not decode is left to the full check, which names it.
    for junk in ["", "a.b", "not.base64!.sig", "e30.bm90IGpzb24.c2ln"] {
        assert!(!v.lacks_fresh_nonce(junk, NOW), "{junk}");
    }
    // Positive controls: a current nonce, and a validator that requires
    // none, whatever the proof carries.
    let fresh = with(Some(&v.fresh_nonce(NOW).unwrap()));
    assert!(!v.lacks_fresh_nonce(&fresh, NOW));
    v.validate(&fresh, &expect(NOW)).unwrap();
    assert!(!validator().lacks_fresh_nonce(&with(None), NOW));
}

#[test]
fn nonces_are_stable_within_a_bucket_and_expire_after_the_next() {
    let n = nonces();
    let base = NOW - NOW.rem_euclid(30);
    let a = n.issue(base);
    assert_eq!(n.issue(base + 29), a);
    assert_ne!(n.issue(base + 30), a);
    assert!(n.check(&a, base));
    assert!(n.check(&a, base + 59));
    assert!(!n.check(&a, base + 60));
    // A nonce from the future (next bucket) is not accepted early.
    assert!(!n.check(&n.issue(base + 30), base));
    // Nonces are not secret-bearing: no key in Debug.
    assert_eq!(format!("{n:?}"), "Nonces { domain: Derive, .. }");
    assert!(validator().fresh_nonce(NOW).is_none());
}

// --------------------------------------------------------- replay cache

#[test]
fn full_replay_cache_refuses_instead_of_letting_proofs_through() {
    let k = key();
    let v = Validator::new(vec![Alg::ES256], 1, None);
    assert_eq!(v.replay_cache().capacity(), 1);
    v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
    let second = good(&k, NOW);
    assert_eq!(
        v.validate(&second, &expect(NOW)).unwrap_err(),
        DpopError::ReplayCacheFull
    );
    assert_eq!(v.replay_cache().len(), 1);
    // Once the first entry has expired (it could no longer pass the iat
    // check), there is room again.
    let t = NOW + IAT_WINDOW + 1;
    v.validate(&good(&k, t), &expect(t)).unwrap();
}

#[test]
fn replay_entries_expire_only_when_the_proof_could_no_longer_pass() {
    let k = key();
    let v = Validator::new(vec![Alg::ES256], 16, None);
    // A proof dated at the far edge of the window stays usable for the
    // longest; its cache entry must last as long.
    let future = good(&k, NOW + IAT_WINDOW);
    v.validate(&future, &expect(NOW)).unwrap();
    for t in [NOW + 1, NOW + IAT_WINDOW, NOW + 2 * IAT_WINDOW] {
        assert_eq!(
            v.validate(&future, &expect(t)).unwrap_err(),
            DpopError::Replay,
            "at {t}"
        );
    }
    // After that, the proof fails the iat check on its own.
    assert_eq!(
        v.validate(&future, &expect(NOW + 2 * IAT_WINDOW + 1))
            .unwrap_err(),
        DpopError::Iat
    );

    let c = ReplayCache::new(16);
    let key = [5u8; 16];
    c.insert(key, NOW + 61, NOW).unwrap();
    assert_eq!(c.insert(key, NOW + 120, NOW + 60), Err(DpopError::Replay));
    assert_eq!(c.len(), 1);
    c.insert(key, NOW + 122, NOW + 61).unwrap();
    assert_eq!(c.len(), 1);
}

#[test]
fn expired_entries_behind_a_longer_lived_one_are_reclaimed() {
    // Expiry times are not in insertion order (iat may be up to 60 s ahead),
    // so an entry that expires late must not keep expired entries behind it
    // counted as live.
    let c = ReplayCache::new(2);
    assert_eq!(c.capacity(), 2);
    // These keys share a shard (same first byte modulo the 2 shards).
    let (k1, k2, k3) = ([0u8; 16], [16u8; 16], [32u8; 16]);
    c.insert(k1, NOW + 121, NOW).unwrap();
    c.insert(k2, NOW + 61, NOW).unwrap();
    assert_eq!(c.insert(k3, NOW + 61, NOW), Err(DpopError::ReplayCacheFull));
    assert_eq!(c.insert(k1, NOW + 123, NOW + 62), Err(DpopError::Replay));
    c.insert(k3, NOW + 123, NOW + 62).unwrap();
    assert_eq!(c.len(), 2);
}

#[test]
fn a_full_shard_does_not_refuse_while_the_whole_cache_has_room() {
    // 32 slots over 16 shards: before, each shard held 2 and refused the
    // third entry that fell in it although 30 slots were free.
    let c = ReplayCache::new(32);
    assert_eq!(c.capacity(), 32);
    // Same shard: first byte 0, 16, 32, ... (modulo 16).
    for i in 0..5u8 {
        c.insert([i * 16; 16], NOW + 61, NOW)
            .unwrap_or_else(|e| panic!("entry {i} of one shard refused with room left: {e:?}"));
    }
    // The rest of the capacity, in other shards.
    let mut n = 5;
    for first in 1..=255u8 {
        if n == 32 {
            break;
        }
        if first % 16 == 0 {
            continue;
        }
        c.insert([first; 16], NOW + 61, NOW).unwrap();
        n += 1;
    }
    assert_eq!(c.len(), 32);
    // The whole cache is full of live entries: refused, whichever shard.
    let mut other = [0u8; 16];
    other[0] = 0;
    other[1] = 1;
    assert_eq!(
        c.insert(other, NOW + 61, NOW),
        Err(DpopError::ReplayCacheFull)
    );
    other[0] = 7;
    assert_eq!(
        c.insert(other, NOW + 61, NOW),
        Err(DpopError::ReplayCacheFull)
    );
    // Positive control: once they expire there is room again, also in a
    // shard that held none of them (the other shards' expired entries are
    // reclaimed before refusing).
    let c = ReplayCache::new(32);
    for i in 0..32u8 {
        let mut k = [0u8; 16];
        (k[0], k[1]) = (1 + i % 15, i);
        c.insert(k, NOW + 61, NOW).unwrap();
    }
    assert_eq!(
        c.insert([0; 16], NOW + 61, NOW),
        Err(DpopError::ReplayCacheFull)
    );
    c.insert([0; 16], NOW + 123, NOW + 62).unwrap();
    assert_eq!(c.len(), 1);
}

#[test]
fn replay_cache_capacity_is_honoured() {
    for cap in [1, 2, 15, 16, 17, 200_000] {
        assert_eq!(ReplayCache::new(cap).capacity(), cap);
    }
    assert_eq!(ReplayCache::new(0).capacity(), 1);
    // Exactly `cap` entries fit, spread however they fall.
    let c = ReplayCache::new(17);
    for i in 0..17u8 {
        c.insert([i; 16], NOW + 61, NOW).unwrap();
    }
    assert_eq!(
        c.insert([17; 16], NOW + 61, NOW),
        Err(DpopError::ReplayCacheFull)
    );
}

/// Keys spread as the keyed hash spreads them.
fn random_keys(n: usize) -> Vec<[u8; 16]> {
    let mut keys = vec![[0u8; 16]; n];
    for k in &mut keys {
        aws_lc_rs::rand::fill(k).unwrap();
    }
    keys
}

#[test]
fn replay_cache_memory_is_fixed_by_its_byte_budget() {
    assert_eq!(REPLAY_SLOT_BYTES, 20);
    for bytes in [1024, 4096, 100_000, 1 << 20, 16 << 20] {
        let c = ReplayCache::with_bytes(bytes);
        assert!(
            c.slot_bytes() <= bytes,
            "{bytes} bytes: slots take {}",
            c.slot_bytes()
        );
        // Not wasteful either: at least 3/5 of the budget holds entries.
        assert!(
            c.capacity() * REPLAY_SLOT_BYTES * 5 >= bytes * 3,
            "{bytes} bytes: only {} entries",
            c.capacity()
        );
        assert_eq!(ReplayCache::capacity_for_bytes(bytes), c.capacity());
    }
    // A sharded cache: fill it to its capacity, with live entries, then
    // churn it through three lifetimes at that rate. The slots never
    // change size: the memory is what the budget allowed, at any rate.
    let c = ReplayCache::with_bytes(2 << 20);
    let slots_before: Vec<usize> = (0..c.shards.len()).map(|i| c.lock(i).len()).collect();
    assert_eq!(slots_before.len(), SHARDS, "a 2 MiB cache is sharded");
    let cap = c.capacity();
    let per_second = cap / MAX_JTI_LIFETIME as usize;
    let mut inserted = 0;
    for t in NOW..NOW + 3 * MAX_JTI_LIFETIME {
        for k in random_keys(per_second) {
            c.insert(k, t + MAX_JTI_LIFETIME, t)
                .unwrap_or_else(|e| panic!("refused at {inserted} of rate {per_second}/s: {e:?}"));
            inserted += 1;
        }
    }
    assert!(c.len() <= cap && c.len() >= per_second * (MAX_JTI_LIFETIME as usize - 1));
    let slots_after: Vec<usize> = (0..c.shards.len()).map(|i| c.lock(i).len()).collect();
    assert_eq!(slots_before, slots_after);
    assert_eq!(
        c.slot_bytes(),
        slots_after.iter().sum::<usize>() * REPLAY_SLOT_BYTES
    );
    // Negative: beyond the capacity it refuses (fail closed) ...
    let c = ReplayCache::with_bytes(4096);
    for k in random_keys(c.capacity()) {
        c.insert(k, NOW + 61, NOW).unwrap();
    }
    assert_eq!(
        c.insert(random_keys(1)[0], NOW + 61, NOW),
        Err(DpopError::ReplayCacheFull)
    );
    // ... and every key it holds is still found (probe runs intact).
    let keys = random_keys(c.capacity());
    let c = ReplayCache::with_bytes(4096);
    for k in &keys {
        c.insert(*k, NOW + 61, NOW).unwrap();
    }
    for k in &keys {
        assert_eq!(c.insert(*k, NOW + 61, NOW), Err(DpopError::Replay));
    }
}

#[test]
fn replay_entries_stay_found_while_others_are_swept_around_them() {
    // Backward-shift deletion: removing expired entries must not cut a
    // probe run, or a live jti would be accepted a second time.
    let c = ReplayCache::new(1000);
    let short = random_keys(600);
    let long = random_keys(300);
    for (a, b) in short.iter().zip(long.iter().chain(long.iter())) {
        c.insert(*a, NOW + 10, NOW).unwrap();
        let _ = c.insert(*b, NOW + 500, NOW);
    }
    assert_eq!(c.len(), 900);
    // Forces a sweep of the 600 expired ones (the cache is more than half
    // used), then every long-lived key is still a replay.
    c.insert(random_keys(1)[0], NOW + 500, NOW + 20).unwrap();
    assert_eq!(c.len(), 301);
    for k in &long {
        assert_eq!(c.insert(*k, NOW + 500, NOW + 20), Err(DpopError::Replay));
    }
    // Positive control: the expired ones are accepted again.
    for k in &short {
        c.insert(*k, NOW + 500, NOW + 20).unwrap();
    }
}

#[test]
fn replay_keys_are_keyed_and_separate_the_parts() {
    let a = ReplayCache::new(16);
    let b = ReplayCache::new(16);
    assert_eq!(a.key("jkt", "jti"), a.key("jkt", "jti"));
    // Another process (another key) maps the same proof elsewhere.
    assert_ne!(a.key("jkt", "jti"), b.key("jkt", "jti"));
    assert_ne!(a.key("ab", "c"), a.key("a", "bc"));
}

#[test]
fn errors_carry_no_proof_bytes() {
    let k = key();
    let v = validator();
    let proof = with_claim(&k, "htu", Some(json!("https://canary-9f2e.example/")));
    let err = v.validate(&proof, &expect(NOW)).unwrap_err();
    assert_eq!(err, DpopError::Htu);
    let text = format!("{err} {err:?}");
    assert!(
        !text.contains("canary") && !text.contains(&proof[..20]),
        "{text}"
    );
    v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
}

// ---------------------------------------------------------------- header cache

/// The header segment of a proof.
fn header_segment(proof: &str) -> &str {
    proof.split('.').next().unwrap()
}

/// Claims for `NOW` signed by `signer` under `k`'s header: a proof whose
/// header names a key that did not sign it.
fn signed_by(k: &Es256Key, signer: &Es256Key) -> String {
    sign(
        signer,
        &Value::Object(header(k)),
        &Value::Object(claims(NOW)),
    )
}

#[test]
fn a_known_header_does_not_excuse_its_signature_or_claims() {
    let (k, other) = (key(), key());
    let v = validator();
    let first = good(&k, NOW);
    v.validate(&first, &expect(NOW)).unwrap();
    assert_eq!(v.headers.len(), 1);
    // Each proof below reuses the known header byte for byte, so it is
    // judged with the kept key.
    let forged = signed_by(&k, &other);
    assert_eq!(header_segment(&forged), header_segment(&first));
    assert_eq!(
        v.validate(&forged, &expect(NOW)).unwrap_err(),
        DpopError::Jose(JoseError::Signature)
    );
    let (input, _) = first.rsplit_once('.').unwrap();
    for sig in ["AAAA", "!!"] {
        assert!(v.validate(&format!("{input}.{sig}"), &expect(NOW)).is_err());
    }
    let wrong_method = with_claim(&k, "htm", Some(json!("GET")));
    assert_eq!(header_segment(&wrong_method), header_segment(&first));
    assert_eq!(
        v.validate(&wrong_method, &expect(NOW)).unwrap_err(),
        DpopError::Htm
    );
    let bound_to_other = Expect {
        jkt: Some(other.thumbprint()),
        ..expect(NOW)
    };
    assert_eq!(
        v.validate(&good(&k, NOW), &bound_to_other).unwrap_err(),
        DpopError::KeyMismatch
    );
    // Positive control: a proof under the known header, signed by its key,
    // passes and reports that key, as the first did.
    let ok = v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
    assert_eq!(ok.jkt, k.thumbprint());
    assert_eq!(v.headers.len(), 1);
}

#[test]
fn only_a_header_whose_proof_verified_is_kept() {
    let (k, other) = (key(), key());
    let v = validator();
    assert_eq!(
        v.validate(&with_header(&k, "typ", Some(json!("jwt"))), &expect(NOW))
            .unwrap_err(),
        DpopError::Typ
    );
    assert_eq!(
        v.validate(&signed_by(&k, &other), &expect(NOW))
            .unwrap_err(),
        DpopError::Jose(JoseError::Signature)
    );
    assert_eq!(v.headers.len(), 0);
    // Still refused the second time: nothing of the refusals was kept.
    assert_eq!(
        v.validate(&signed_by(&k, &other), &expect(NOW))
            .unwrap_err(),
        DpopError::Jose(JoseError::Signature)
    );
    // Positive control: a proof signed by its header's key enters.
    v.validate(&good(&k, NOW), &expect(NOW)).unwrap();
    assert_eq!(v.headers.len(), 1);
}

#[test]
fn the_header_cache_starts_again_empty_when_full() {
    let v = Validator::new(vec![Alg::ES256], 4 * HEADER_CACHE_MAX, None);
    let keys: Vec<Es256Key> = (0..=HEADER_CACHE_MAX).map(|_| key()).collect();
    for (i, k) in keys.iter().enumerate() {
        v.validate(&good(k, NOW), &expect(NOW)).unwrap();
        assert_eq!(v.headers.len(), i % HEADER_CACHE_MAX + 1);
    }
    // The first key's proofs still pass, parsed again.
    let ok = v.validate(&good(&keys[0], NOW), &expect(NOW)).unwrap();
    assert_eq!(ok.jkt, keys[0].thumbprint());
    assert_eq!(v.headers.len(), 2);
}
