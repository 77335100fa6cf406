use super::*;

use serde_json::json;
use std::collections::BTreeMap;

/// RFC 7638 section 3.1: the example RSA key and its published thumbprint.
const RFC7638_N: &str = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";
const RFC7638_THUMBPRINT: &str = "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs";

/// RFC 9449 figures 2 and 9: the example DPoP key and its published `jkt`.
const RFC9449_X: &str = "l8tFrhx-34tV3hRICRDY9zCkDlpBhF42UQUfWVAWBFs";
const RFC9449_Y: &str = "9VE4jf_Ok_o64zbTTlcuNJajHmt6v9TDVrU0CdvGRDA";
const RFC9449_JKT: &str = "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I";

fn seg(v: &Value) -> String {
    b64e(&serde_json::to_vec(v).unwrap())
}

/// A compact JWS with the given header and payload and a signature that is
/// well-formed base64url (not a valid signature).
fn unsigned(header: &Value, payload: &Value) -> String {
    format!("{}.{}.{}", seg(header), seg(payload), b64e(&[7u8; 64]))
}

/// The error of a token that must be refused (without dumping the token).
fn parse_err(token: &str, max_len: usize) -> JoseError {
    match parse(token, max_len) {
        Ok(_) => panic!("accepted a token of {} bytes", token.len()),
        Err(e) => e,
    }
}

fn rsa_jwk() -> Value {
    json!({"kty": "RSA", "n": RFC7638_N, "e": "AQAB"})
}

fn ec_jwk() -> Value {
    json!({"kty": "EC", "crv": "P-256", "x": RFC9449_X, "y": RFC9449_Y})
}

fn key() -> Es256Key {
    Es256Key::generate().unwrap().0
}

// ------------------------------------------------------------ compact JWS

#[test]
fn oversized_token_is_refused_before_any_parsing() {
    let good = unsigned(&json!({"alg": "ES256"}), &json!({}));
    assert!(parse(&good, good.len()).is_ok());
    // One byte over the cap: refused as too large, not as malformed.
    assert_eq!(
        parse_err(&good, good.len() - 1),
        JoseError::TooLarge(good.len() - 1)
    );
    // A 1 MB token of garbage is refused by size, before splitting or decoding.
    let huge = "!".repeat(1 << 20);
    assert_eq!(
        parse_err(&huge, MAX_JWS_LEN),
        JoseError::TooLarge(MAX_JWS_LEN)
    );
    let huge_dots = ".".repeat(MAX_JWS_LEN + 1);
    assert_eq!(
        parse_err(&huge_dots, MAX_JWS_LEN),
        JoseError::TooLarge(MAX_JWS_LEN)
    );
    assert!(parse(&good, MAX_JWS_LEN).is_ok());
}

#[test]
fn deeply_nested_header_is_refused_without_stack_overflow() {
    // J4: 50k levels of nesting, with a cap large enough to reach the JSON parser.
    let nested = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    let token = format!("{}.e30.{}", b64e(nested.as_bytes()), b64e(&[1u8; 64]));
    assert_eq!(parse_err(&token, 1 << 20), JoseError::Json("header"));
    // Nested inside `jwk`, which is kept as a JSON value: refused by the
    // parser's depth limit.
    let nested_jwk = format!(
        "{{\"alg\":\"ES256\",\"jwk\":{}1{}}}",
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let token = format!("{}.e30.{}", b64e(nested_jwk.as_bytes()), b64e(&[1u8; 64]));
    assert_eq!(parse_err(&token, 1 << 20), JoseError::Json("header"));
    // Nested inside an unknown member, which is skipped without recursion:
    // accepted, and no stack overflow either way.
    let nested_unknown = nested_jwk.replace("\"jwk\"", "\"x\"");
    let token = format!(
        "{}.e30.{}",
        b64e(nested_unknown.as_bytes()),
        b64e(&[1u8; 64])
    );
    assert!(parse(&token, 1 << 20).is_ok_and(|j| j.header.jwk.is_none()));
    assert!(parse(&unsigned(&json!({"alg": "ES256"}), &json!({})), 1 << 20).is_ok());
}

#[test]
fn token_without_exactly_three_parts_is_refused() {
    let good = unsigned(&json!({"alg": "ES256"}), &json!({"a": 1}));
    let parts: Vec<&str> = good.split('.').collect();
    let (h, p, s) = (parts[0], parts[1], parts[2]);
    let jwe = "eyJhbGciOiJSU0EtT0FFUCIsImVuYyI6IkEyNTZHQ00ifQ.OKOawDo13gRp2ojaHV7LFpZcgV7T6DVZKTyKOMTYUmKoTCVJRgckCL9kiMT03JGeipsEdY3mx_etLbbWSrFr05kLzcSr4qKAq7YN7e9jwQRb23nfa6c9d-StnImGyFDbSv04uVuxIp5Zms1gNxKKK2Da14B8S4rzVRltdYwam_lDp5XnZAYpQdb76FdIKLaVmqgfwX7XWRxv2322i-vDxRfqNzo_tETKzpVLzfiwQyeyPGLBIO56YJ7eObdv0je81860ppamavo35UgoRdbYaBcoh9QcfylQr66oc6vFWXRcZ_ZT2LawVCWTIy3brGPi6UklfCpIMfIjf7iGdXKHzg.48V1_ALb6US04U3b.5eym8TW_c8SuK0ltJ3rpYIzOeDQz7TALvtu6UG9oMo4vpzs9tX_EFShS8iB7j6jiSdiwkIr3ajwQzaBtQD_A.XFBoMYUZodetZdvTiFvSkQ";
    for bad in [
        String::new(),
        "a".to_string(),
        format!("{h}.{p}"),
        format!("{h}.{p}.{s}.{s}"),
        format!("{h}.{p}.{s}."),
        format!(".{h}.{p}.{s}"),
        "..".to_string(),
        format!("{h}..{s}"),
        format!("{h}.{p}."),
        format!(".{p}.{s}"),
        // Two proofs in one string, as a proxy might join repeated headers.
        format!("{good},{good}"),
        jwe.to_string(),
    ] {
        assert_eq!(parse_err(&bad, MAX_JWS_LEN), JoseError::NotCompact, "{bad}");
    }
    let jws = parse(&good, MAX_JWS_LEN).unwrap();
    assert_eq!(jws.signing_input, format!("{h}.{p}"));
    assert_eq!(jws.payload, br#"{"a":1}"#);
    assert_eq!(jws.signature, vec![7u8; 64]);
}

#[test]
fn non_canonical_base64url_is_refused_in_every_part() {
    // 0xfb 0xff encodes as "-_8" in base64url and "+/8" in standard base64.
    assert_eq!(b64e(&[0xfb, 0xff]), "-_8");
    assert_eq!(b64d("-_8", "x").unwrap(), vec![0xfb, 0xff]);
    for bad in [
        "+/8", "-_8=", "e30=", "e30==", "e3 0", "e30\n", "AB", "AAB", "A", "e3é",
    ] {
        assert!(b64d(bad, "x").is_err(), "{bad:?}");
    }
    // "AA" is the only canonical encoding of one zero byte; "AB" carries a
    // stray bit and "AAA" would be two bytes.
    assert_eq!(b64d("AA", "x").unwrap(), vec![0]);

    let h = seg(&json!({"alg": "ES256"}));
    let p = b64e(&[0xfb, 0xff]);
    let s = b64e(&[1u8; 64]);
    let good = format!("{h}.{p}.{s}");
    assert!(parse(&good, MAX_JWS_LEN).is_ok());
    let cases = [
        (format!("{h}=.{p}.{s}"), "header"),
        (format!("{}.{p}.{s}", h.replace('J', "+")), "header"),
        (format!("{h}.+/8.{s}"), "payload"),
        (format!("{h}.{p}=.{s}"), "payload"),
        (format!("{h}.AB.{s}"), "payload"),
        (format!("{h}.{p}.{}", s.replace('E', "/")), "signature"),
        (format!("{h}.{p}.{s}="), "signature"),
        // Last character with stray low bits set (64 bytes end in "Q" + "==").
        (format!("{h}.{p}.{}R", &s[..s.len() - 1]), "signature"),
    ];
    for (bad, what) in cases {
        assert_eq!(
            parse_err(&bad, MAX_JWS_LEN),
            JoseError::Base64(what),
            "{bad}"
        );
    }
    assert_eq!(parse(&good, MAX_JWS_LEN).unwrap().payload, vec![0xfb, 0xff]);
}

#[test]
fn header_members_are_typed() {
    for header in [
        json!({}),
        json!({"alg": 1}),
        json!({"alg": true}),
        json!({"alg": null}),
        json!({"alg": ["ES256"]}),
        json!({"alg": "ES256", "typ": 5}),
        json!({"alg": "ES256", "kid": {}}),
        json!([]),
        json!("ES256"),
    ] {
        assert_eq!(
            parse_err(&unsigned(&header, &json!({})), MAX_JWS_LEN),
            JoseError::Json("header"),
            "{header}"
        );
    }
    // Not JSON at all, and a duplicated `alg` (which one would win?).
    for raw in [&b"not json"[..], br#"{"alg":"ES256","alg":"none"}"#] {
        let token = format!("{}.e30.{}", b64e(raw), b64e(&[1; 64]));
        assert_eq!(parse_err(&token, MAX_JWS_LEN), JoseError::Json("header"));
    }
    let token = unsigned(
        &json!({"alg": "ES256", "typ": "dpop+jwt", "kid": "k1", "jwk": {"a": 1}}),
        &json!({}),
    );
    let jws = parse(&token, MAX_JWS_LEN).unwrap();
    assert_eq!(jws.header.alg, "ES256");
    assert_eq!(jws.header.typ.as_deref(), Some("dpop+jwt"));
    assert_eq!(jws.header.kid.as_deref(), Some("k1"));
    assert_eq!(jws.header.jwk, Some(json!({"a": 1})));
}

#[test]
fn crit_header_in_any_form_is_refused() {
    // J5: no extension is understood, so `crit` in any form (even empty, even
    // null) and RFC 7797 `b64` are refused.
    for crit in [
        json!(["exp"]),
        json!(["b64"]),
        json!([]),
        json!("b64"),
        json!({}),
        json!(null),
        json!(0),
    ] {
        let h = json!({"alg": "ES256", "crit": crit});
        assert_eq!(
            parse_err(&unsigned(&h, &json!({})), MAX_JWS_LEN),
            JoseError::Crit,
            "{h}"
        );
    }
    for b64 in [json!(false), json!(true), json!(null)] {
        let h = json!({"alg": "ES256", "crit": ["b64"], "b64": b64});
        assert_eq!(
            parse_err(&unsigned(&h, &json!({})), MAX_JWS_LEN),
            JoseError::Crit
        );
        let h = json!({"alg": "ES256", "b64": b64});
        assert_eq!(
            parse_err(&unsigned(&h, &json!({})), MAX_JWS_LEN),
            JoseError::Crit,
            "{h}"
        );
    }
    assert!(parse(&unsigned(&json!({"alg": "ES256"}), &json!({})), MAX_JWS_LEN).is_ok());
}

#[test]
fn alg_names_are_matched_byte_for_byte() {
    for bad in [
        "none", "None", "HS256", "es256", "ES256 ", "ES384", "EdDSA", "",
    ] {
        assert_eq!(Alg::parse(bad), Err(JoseError::Alg), "{bad}");
    }
    for a in [Alg::ES256, Alg::RS256, Alg::PS256] {
        assert_eq!(Alg::parse(a.as_str()), Ok(a));
    }
}

// ------------------------------------------------------------------- JWK

#[test]
fn private_or_symmetric_jwk_is_refused() {
    let d = b64e(&[9u8; 32]);
    for member in PRIVATE_MEMBERS {
        let mut ec = ec_jwk();
        ec[member] = json!(d);
        assert_eq!(
            Jwk::from_value(&ec).unwrap_err(),
            JoseError::Key("private or symmetric key material"),
            "{member}"
        );
    }
    let mut rsa = rsa_jwk();
    rsa["d"] = json!(d);
    assert!(Jwk::from_value(&rsa).is_err());
    let oct = json!({"kty": "oct", "k": d});
    assert!(Jwk::from_value(&oct).is_err());
    let oct_without_k = json!({"kty": "oct"});
    assert_eq!(
        Jwk::from_value(&oct_without_k).unwrap_err(),
        JoseError::Key("unsupported kty")
    );
    assert!(Jwk::from_value(&ec_jwk()).is_ok());
    assert!(Jwk::from_value(&rsa_jwk()).is_ok());
}

#[test]
fn jwk_that_is_not_an_object_is_refused() {
    for v in [
        json!("EC"),
        json!([ec_jwk()]),
        json!(5),
        json!(null),
        json!(true),
    ] {
        assert_eq!(
            Jwk::from_value(&v).unwrap_err(),
            JoseError::Key("not an object")
        );
    }
    assert!(Jwk::from_value(&ec_jwk()).is_ok());
}

#[test]
fn jwk_members_of_the_wrong_type_are_refused() {
    for (member, value) in [
        ("kty", json!(1)),
        ("crv", json!(["P-256"])),
        ("x", json!(5)),
        ("y", json!(null)),
        ("kid", json!(7)),
        ("alg", json!(true)),
        ("use", json!({})),
    ] {
        let mut ec = ec_jwk();
        ec[member] = value;
        assert_eq!(
            Jwk::from_value(&ec).unwrap_err(),
            JoseError::Key("member of the wrong type"),
            "{member}"
        );
    }
    for (member, value) in [("n", json!(1)), ("e", json!(65537))] {
        let mut rsa = rsa_jwk();
        rsa[member] = value;
        assert_eq!(
            Jwk::from_value(&rsa).unwrap_err(),
            JoseError::Key("member of the wrong type"),
            "{member}"
        );
    }
    for missing in ["kty", "crv", "x", "y"] {
        let mut ec = ec_jwk();
        ec.as_object_mut().unwrap().remove(missing);
        assert!(Jwk::from_value(&ec).is_err(), "{missing}");
    }
    let mut ec = ec_jwk();
    ec["use"] = json!("enc");
    assert_eq!(
        Jwk::from_value(&ec).unwrap_err(),
        JoseError::Key("use is not sig")
    );
    let mut ec = ec_jwk();
    ec["use"] = json!("sig");
    ec["kid"] = json!("k");
    let jwk = Jwk::from_value(&ec).unwrap();
    assert_eq!(jwk.kid.as_deref(), Some("k"));
}

#[test]
fn ec_point_off_the_curve_is_refused() {
    // RFC 8725 section 3.4 (invalid-curve attacks): change y by one bit.
    let mut y = b64d(RFC9449_Y, "y").unwrap();
    y[31] ^= 1;
    let mut off = ec_jwk();
    off["y"] = json!(b64e(&y));
    assert_eq!(
        Jwk::from_value(&off).unwrap_err(),
        JoseError::Key("point is not on the curve")
    );
    // The point at "infinity" encoded as zeros, and coordinates >= p.
    let mut zero = ec_jwk();
    zero["x"] = json!(b64e(&[0; 32]));
    zero["y"] = json!(b64e(&[0; 32]));
    assert!(Jwk::from_value(&zero).is_err());
    let mut big = ec_jwk();
    big["x"] = json!(b64e(&[0xff; 32]));
    assert!(Jwk::from_value(&big).is_err());
    assert!(Jwk::from_value(&ec_jwk()).is_ok());
}

#[test]
fn ec_coordinate_of_the_wrong_length_is_refused() {
    let x = b64d(RFC9449_X, "x").unwrap();
    // Leading zero stripped (31 bytes), an extra zero (33 bytes), empty.
    for bad_x in [
        b64e(&x[1..]),
        b64e(&[&[0u8][..], &x].concat()),
        String::new(),
    ] {
        let mut ec = ec_jwk();
        ec["x"] = json!(bad_x);
        assert!(Jwk::from_value(&ec).is_err(), "{bad_x}");
    }
    let mut ec = ec_jwk();
    ec["y"] = json!(b64e(&[1u8; 31]));
    assert_eq!(
        Jwk::from_value(&ec).unwrap_err(),
        JoseError::Key("coordinate length")
    );
    // Padded base64 in a coordinate is not base64url.
    let mut ec = ec_jwk();
    ec["x"] = json!(format!("{RFC9449_X}="));
    assert!(Jwk::from_value(&ec).is_err());
    assert!(Jwk::from_value(&ec_jwk()).is_ok());
}

#[test]
fn other_curves_and_key_types_are_refused() {
    let mut p384 = ec_jwk();
    p384["crv"] = json!("P-384");
    assert_eq!(
        Jwk::from_value(&p384).unwrap_err(),
        JoseError::Key("unsupported curve")
    );
    let okp = json!({"kty": "OKP", "crv": "Ed25519", "x": RFC9449_X});
    assert_eq!(
        Jwk::from_value(&okp).unwrap_err(),
        JoseError::Key("unsupported kty")
    );
    let mut lower = ec_jwk();
    lower["kty"] = json!("ec");
    assert!(Jwk::from_value(&lower).is_err());
    assert!(Jwk::from_value(&ec_jwk()).is_ok());
}

#[test]
fn jwk_alg_that_does_not_fit_the_key_type_is_refused() {
    for (mut jwk, alg) in [
        (ec_jwk(), "RS256"),
        (ec_jwk(), "PS256"),
        (rsa_jwk(), "ES256"),
    ] {
        jwk["alg"] = json!(alg);
        assert_eq!(
            Jwk::from_value(&jwk).unwrap_err(),
            JoseError::Key("alg does not match kty"),
            "{alg}"
        );
    }
    for alg in ["none", "HS256", "ES384"] {
        let mut ec = ec_jwk();
        ec["alg"] = json!(alg);
        assert_eq!(Jwk::from_value(&ec).unwrap_err(), JoseError::Alg, "{alg}");
    }
    let mut ec = ec_jwk();
    ec["alg"] = json!("ES256");
    assert_eq!(Jwk::from_value(&ec).unwrap().alg, Some(Alg::ES256));
    let mut rsa = rsa_jwk();
    rsa["alg"] = json!("PS256");
    assert_eq!(Jwk::from_value(&rsa).unwrap().alg, Some(Alg::PS256));
}

#[test]
fn rsa_key_below_2048_bits_is_refused() {
    let n = b64d(RFC7638_N, "n").unwrap();
    assert_eq!(n.len(), 256);
    assert!(n[0] & 0x80 != 0, "the RFC key is a full 2048-bit modulus");
    let mut small = n.clone();
    small[0] = 0x01; // 256 bytes but only 2041 bits
    let too_small = [
        n[1..].to_vec(), // 2040 bits
        small,
        vec![0xc5; 128],           // 1024 bits
        [&[0u8][..], &n].concat(), // leading zero: not the minimal encoding
    ];
    for bad in too_small {
        let jwk = json!({"kty": "RSA", "n": b64e(&bad), "e": "AQAB"});
        assert!(Jwk::from_value(&jwk).is_err(), "{} bytes", bad.len());
    }
    for bad_e in ["", "AAEAAQ", &b64e(&[1; 9])] {
        let jwk = json!({"kty": "RSA", "n": RFC7638_N, "e": bad_e});
        assert!(Jwk::from_value(&jwk).is_err(), "e = {bad_e:?}");
    }
    let ok = Jwk::from_value(&rsa_jwk()).unwrap();
    assert_eq!(format!("{:?}", ok.key), "PublicKey::Rsa(2048 bits)");
}

// ------------------------------------------------------------ thumbprints

#[test]
fn rsa_thumbprint_matches_rfc7638_example() {
    let jwk = Jwk::from_value(&json!({
        "kty": "RSA", "n": RFC7638_N, "e": "AQAB", "alg": "RS256", "kid": "2011-04-29"
    }))
    .unwrap();
    assert_eq!(jwk.thumbprint, RFC7638_THUMBPRINT);
    // Member order and optional members do not change it.
    let reordered: Value = serde_json::from_str(&format!(
        r#"{{"e":"AQAB","use":"sig","n":"{RFC7638_N}","kty":"RSA"}}"#
    ))
    .unwrap();
    assert_eq!(
        Jwk::from_value(&reordered).unwrap().thumbprint,
        RFC7638_THUMBPRINT
    );
}

#[test]
fn ec_thumbprint_matches_rfc9449_example() {
    let jwk = Jwk::from_value(&ec_jwk()).unwrap();
    assert_eq!(jwk.thumbprint, RFC9449_JKT);
}

/// RFC 7638 computed independently: required members, sorted by a BTreeMap,
/// serialised without whitespace, hashed with the `sha2` crate.
fn independent_ec_thumbprint(x: &str, y: &str) -> String {
    use sha2::Digest;
    let mut m = BTreeMap::new();
    m.insert("y", y);
    m.insert("x", x);
    m.insert("kty", "EC");
    m.insert("crv", "P-256");
    let canonical = serde_json::to_string(&m).unwrap();
    assert!(!canonical.contains(' '));
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(canonical.as_bytes()))
}

#[test]
fn ec_thumbprint_matches_an_independent_computation() {
    assert_eq!(independent_ec_thumbprint(RFC9449_X, RFC9449_Y), RFC9449_JKT);
    for _ in 0..4 {
        let k = key();
        let x = k.public_jwk["x"].as_str().unwrap();
        let y = k.public_jwk["y"].as_str().unwrap();
        let want = independent_ec_thumbprint(x, y);
        assert_eq!(k.thumbprint(), want);
        assert_eq!(k.kid, want);
        assert_eq!(k.jwk().thumbprint, want);
        // The JWK as it arrives in a DPoP header (no kid/alg/use) agrees.
        let bare = json!({"kty": "EC", "crv": "P-256", "x": x, "y": y});
        assert_eq!(Jwk::from_value(&bare).unwrap().thumbprint, want);
    }
}

// -------------------------------------------------------------------- JWKS

fn jwk_with(k: &Es256Key, kid: &str) -> Value {
    let mut v = k.public_jwk.clone();
    v["kid"] = json!(kid);
    v
}

#[test]
fn jwks_select_picks_by_kid_and_never_guesses() {
    let (a, b) = (key(), key());
    let doc = json!({"keys": [jwk_with(&a, "a"), jwk_with(&b, "b")]});
    let set = JwkSet::from_json(doc.to_string().as_bytes()).unwrap();
    assert_eq!(set.keys.len(), 2);
    assert_eq!(set.select(Some("a"), Alg::ES256).unwrap().thumbprint, a.kid);
    assert_eq!(set.select(Some("b"), Alg::ES256).unwrap().thumbprint, b.kid);
    // No kid and two candidates: ambiguous, so no key.
    assert!(set.select(None, Alg::ES256).is_none());
    assert!(set.select(Some("c"), Alg::ES256).is_none());
    assert!(set.select(Some("A"), Alg::ES256).is_none());
    // kid matches but the alg does not fit the key.
    assert!(set.select(Some("a"), Alg::RS256).is_none());

    // Two keys sharing a kid: ambiguous too.
    let dup = json!({"keys": [jwk_with(&a, "same"), jwk_with(&b, "same")]});
    let set = JwkSet::from_json(dup.to_string().as_bytes()).unwrap();
    assert!(set.select(Some("same"), Alg::ES256).is_none());

    // One EC and one RSA key: without a kid, the alg decides.
    let mixed = json!({"keys": [jwk_with(&a, "a"), rsa_jwk()]});
    let set = JwkSet::from_json(mixed.to_string().as_bytes()).unwrap();
    assert_eq!(set.select(None, Alg::ES256).unwrap().thumbprint, a.kid);
    assert_eq!(
        set.select(None, Alg::RS256).unwrap().thumbprint,
        RFC7638_THUMBPRINT
    );

    // A key pinned to RS256 is not selected for PS256.
    let mut pinned = rsa_jwk();
    pinned["alg"] = json!("RS256");
    let set = JwkSet::from_json(json!({"keys": [pinned]}).to_string().as_bytes()).unwrap();
    assert!(set.select(None, Alg::PS256).is_none());
    assert!(set.select(None, Alg::RS256).is_some());
}

#[test]
fn jwks_skips_unusable_keys_but_needs_one() {
    let a = key();
    let doc = json!({"keys": [
        {"kty": "oct", "k": "AAAA"},
        {"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"},
        jwk_with(&a, "a"),
    ]});
    let set = JwkSet::from_json(doc.to_string().as_bytes()).unwrap();
    assert_eq!(set.keys.len(), 1);
    assert_eq!(set.select(None, Alg::ES256).unwrap().thumbprint, a.kid);

    let none_usable = json!({"keys": [{"kty": "oct", "k": "AAAA"}]});
    assert!(JwkSet::from_json(none_usable.to_string().as_bytes()).is_err());
    for bad in [
        &b"{}"[..],
        b"[]",
        b"not json",
        br#"{"keys": {}}"#,
        br#"{"keys": []}"#,
    ] {
        assert!(JwkSet::from_json(bad).is_err());
    }
    let ok = json!({"keys": [jwk_with(&a, "a")]});
    assert_eq!(
        JwkSet::from_json(ok.to_string().as_bytes())
            .unwrap()
            .keys
            .len(),
        1
    );
}

// ------------------------------------------------------- sign and verify

fn claims() -> Value {
    json!({"sub": "alice", "n": 1})
}

#[test]
fn es256_round_trip_and_tampering() {
    let k = key();
    let token = k.sign_jws(serde_json::Map::new(), &claims()).unwrap();
    let jws = parse(&token, MAX_JWS_LEN).unwrap();
    assert_eq!(jws.header.alg, "ES256");
    assert_eq!(jws.signature.len(), 64);
    k.jwk().verify(Alg::ES256, &jws).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&jws.payload).unwrap(),
        claims()
    );

    let parts: Vec<&str> = token.split('.').collect();
    let mut tampered = Vec::new();
    // Another payload under the same signature.
    tampered.push(format!(
        "{}.{}.{}",
        parts[0],
        seg(&json!({"sub": "mallory", "n": 1})),
        parts[2]
    ));
    // Another header under the same signature.
    tampered.push(format!(
        "{}.{}.{}",
        seg(&json!({"alg": "ES256", "x": 1})),
        parts[1],
        parts[2]
    ));
    // A flipped bit in the signature, a truncated and an extended one.
    let mut sig = jws.signature.clone();
    sig[10] ^= 0x01;
    tampered.push(format!("{}.{}.{}", parts[0], parts[1], b64e(&sig)));
    tampered.push(format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        b64e(&jws.signature[..63])
    ));
    tampered.push(format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        b64e(&[&jws.signature[..], &[0]].concat())
    ));
    // r and s swapped.
    let swapped = [&jws.signature[32..], &jws.signature[..32]].concat();
    tampered.push(format!("{}.{}.{}", parts[0], parts[1], b64e(&swapped)));
    for t in &tampered {
        let j = parse(t, MAX_JWS_LEN).unwrap();
        assert_eq!(
            k.jwk().verify(Alg::ES256, &j),
            Err(JoseError::Signature),
            "{t}"
        );
    }
    // The right signature under another key.
    assert_eq!(
        key().jwk().verify(Alg::ES256, &jws),
        Err(JoseError::Signature)
    );
    // Positive control: the untouched token still verifies.
    k.jwk()
        .verify(Alg::ES256, &parse(&token, MAX_JWS_LEN).unwrap())
        .unwrap();
}

#[test]
fn sign_raw_signatures_verify_with_the_public_key() {
    let k = key();
    let sig = k.sign_raw(b"message").unwrap();
    assert_eq!(sig.len(), 64);
    let pk = k.jwk().key;
    pk.verify(Alg::ES256, b"message", &sig).unwrap();
    assert_eq!(
        pk.verify(Alg::ES256, b"messagf", &sig),
        Err(JoseError::Signature)
    );
    pk.verify(Alg::ES256, b"message", &k.sign_raw(b"message").unwrap())
        .unwrap();
}

#[test]
fn alg_is_bound_to_the_key_type() {
    // J1: an ES256 signature presented to an RSA key, and RS256/PS256
    // presented to an EC key, are refused as alg errors before any crypto.
    let k = key();
    let token = k.sign_jws(serde_json::Map::new(), &claims()).unwrap();
    let jws = parse(&token, MAX_JWS_LEN).unwrap();
    let rsa = Jwk::from_value(&rsa_jwk()).unwrap();
    assert_eq!(rsa.verify(Alg::ES256, &jws), Err(JoseError::Alg));
    assert_eq!(
        rsa.key
            .verify(Alg::ES256, jws.signing_input.as_bytes(), &jws.signature),
        Err(JoseError::Alg)
    );
    assert!(!rsa.key.allows(Alg::ES256));
    let ec = k.jwk();
    for alg in [Alg::RS256, Alg::PS256] {
        assert_eq!(ec.verify(alg, &jws), Err(JoseError::Alg));
        assert_eq!(
            ec.key
                .verify(alg, jws.signing_input.as_bytes(), &jws.signature),
            Err(JoseError::Alg)
        );
        assert!(!ec.key.allows(alg));
    }
    // An RSA key pinned to RS256 refuses PS256 even though both are RSA.
    let mut pinned = rsa_jwk();
    pinned["alg"] = json!("RS256");
    let pinned = Jwk::from_value(&pinned).unwrap();
    assert_eq!(pinned.verify(Alg::PS256, &jws), Err(JoseError::Alg));
    // An RSA key with a (bogus) RS256 signature gets to the crypto and fails there.
    assert_eq!(pinned.verify(Alg::RS256, &jws), Err(JoseError::Signature));
    // Positive control.
    ec.verify(Alg::ES256, &jws).unwrap();
}

#[test]
fn es256_key_round_trips_through_pkcs8_and_hides_secrets_in_debug() {
    let (k, pkcs8) = Es256Key::generate().unwrap();
    let again = Es256Key::from_pkcs8(pkcs8.expose()).unwrap();
    assert_eq!(k.kid, again.kid);
    let token = again.sign_jws(serde_json::Map::new(), &claims()).unwrap();
    k.jwk()
        .verify(Alg::ES256, &parse(&token, MAX_JWS_LEN).unwrap())
        .unwrap();
    let dbg = format!("{k:?}");
    assert!(dbg.contains(&k.kid) && dbg.contains(".."), "{dbg}");
    // The published JWK is public: no private member.
    for m in PRIVATE_MEMBERS {
        assert!(k.public_jwk.get(m).is_none());
    }
    assert!(Es256Key::from_pkcs8(b"not a key").is_err());
    assert!(Es256Key::from_pkcs8(pkcs8.expose()).is_ok());
}

// ----------------------------------------------------------------- claims

#[derive(Debug, Deserialize)]
struct Dated {
    #[serde(deserialize_with = "numeric_date")]
    t: i64,
    #[serde(default, deserialize_with = "opt_numeric_date")]
    o: Option<i64>,
}

fn date(json: &str) -> Result<Dated, serde_json::Error> {
    serde_json::from_str(json)
}

#[test]
fn numeric_date_accepts_only_finite_numbers_in_range() {
    for bad in [
        r#"{"t": "1700000000"}"#,
        r#"{"t": true}"#,
        r#"{"t": null}"#,
        r#"{"t": [1]}"#,
        r#"{"t": {}}"#,
        r#"{"t": 1e400}"#,
        r#"{"t": -1e400}"#,
        r#"{"t": 1e15}"#,
        r#"{"t": 1e300}"#,
        r#"{"t": 18446744073709551615}"#,
        // Integers at the edge of i64 would overflow `exp + skew` or
        // `iat - now` in the callers.
        r#"{"t": 9223372036854775807}"#,
        r#"{"t": -9223372036854775808}"#,
        r#"{"t": 1000000000000000}"#,
        r#"{"t": 1, "o": "2"}"#,
        r#"{"t": 1, "o": null}"#,
    ] {
        assert!(date(bad).is_err(), "{bad}");
    }
    let d = date(r#"{"t": 1700000000}"#).unwrap();
    assert_eq!((d.t, d.o), (1_700_000_000, None));
    assert_eq!(date(r#"{"t": 1700000000.9}"#).unwrap().t, 1_700_000_000);
    assert_eq!(date(r#"{"t": -1.5}"#).unwrap().t, -2);
    assert_eq!(date(r#"{"t": 0}"#).unwrap().t, 0);
    assert_eq!(date(r#"{"t": 1.7e9}"#).unwrap().t, 1_700_000_000);
    assert_eq!(
        date(r#"{"t": 999999999999999}"#).unwrap().t,
        999_999_999_999_999
    );
    assert_eq!(date(r#"{"t": 1, "o": 5.5}"#).unwrap().o, Some(5));
}

#[test]
fn audience_is_a_string_or_an_array_of_strings() {
    let one: Audience = serde_json::from_str(r#""https://api.example""#).unwrap();
    assert_eq!(one, Audience::One("https://api.example".into()));
    assert!(one.contains("https://api.example"));
    for other in [
        "https://api.example/",
        "https://API.example",
        "https://api.exampl",
        "",
    ] {
        assert!(!one.contains(other), "{other}");
    }
    let many: Audience = serde_json::from_str(r#"["a", "https://api.example"]"#).unwrap();
    assert!(many.contains("a") && many.contains("https://api.example"));
    assert!(!many.contains("b") && !many.contains("A"));
    let empty: Audience = serde_json::from_str("[]").unwrap();
    assert!(!empty.contains(""));
    for bad in [
        r#"{"aud": "a"}"#,
        "5",
        "null",
        "true",
        r#"["a", 1]"#,
        "[[\"a\"]]",
    ] {
        assert!(serde_json::from_str::<Audience>(bad).is_err(), "{bad}");
    }
    let ok: Audience = serde_json::from_str(r#"["https://api.example"]"#).unwrap();
    assert!(ok.contains("https://api.example"));
}

#[test]
fn one_header_check_for_every_context() {
    let header = |typ: Option<&str>, alg: &str| -> Header {
        let mut v = serde_json::json!({ "alg": alg });
        if let Some(t) = typ {
            v["typ"] = t.into();
        }
        serde_json::from_value(v).unwrap()
    };
    let dpop = HeaderRule {
        typ: TypRule::Exact("dpop+jwt"),
        algs: &[Alg::ES256],
    };
    assert_eq!(
        check_header(&header(Some("DPoP+JWT"), "ES256"), &dpop),
        Err(HeaderError::Typ)
    );
    assert_eq!(
        check_header(&header(Some("dpop+jwt"), "RS256"), &dpop),
        Err(HeaderError::Alg)
    );
    assert_eq!(
        check_header(&header(Some("dpop+jwt"), "none"), &dpop),
        Err(HeaderError::Alg)
    );
    let id = HeaderRule {
        typ: TypRule::MediaTypes {
            allowed: &["JWT"],
            absent_ok: true,
        },
        algs: &[Alg::ES256, Alg::RS256],
    };
    assert_eq!(
        check_header(&header(Some("at+jwt"), "ES256"), &id),
        Err(HeaderError::Typ)
    );
    assert_eq!(
        check_header(&header(Some("application/JWT"), "RS256"), &id),
        Ok(Alg::RS256)
    );
    assert_eq!(check_header(&header(None, "ES256"), &id), Ok(Alg::ES256));
    let at = HeaderRule {
        typ: TypRule::MediaTypes {
            allowed: &["at+jwt"],
            absent_ok: false,
        },
        algs: &[Alg::ES256],
    };
    assert_eq!(
        check_header(&header(None, "ES256"), &at),
        Err(HeaderError::Typ)
    );
    // Positive controls.
    assert_eq!(
        check_header(&header(Some("application/at+jwt"), "ES256"), &at),
        Ok(Alg::ES256)
    );
    assert_eq!(
        check_header(&header(Some("dpop+jwt"), "ES256"), &dpop),
        Ok(Alg::ES256)
    );
}

#[test]
fn sha256_hex_is_the_lowercase_hex_of_the_digest() {
    // FIPS 180-2, appendix B.1 and B.2's one-block and two-block messages.
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    assert_eq!(
        sha256_hex(b""),
        hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b""))
    );
}
