//! The JCS serialiser against RFC 8785's own data (its examples and its
//! Appendix B number samples, in proto/request-binding-vectors.json,
//! checked there against ECMAScript's `Number.prototype.toString`), and
//! the I-JSON checks, each with its control.

use super::*;

fn vectors() -> serde_json::Value {
    serde_json::from_str(include_str!(
        "../../../../../proto/request-binding-vectors.json"
    ))
    .expect("the vectors parse")
}

#[test]
fn numbers_serialise_as_rfc_8785_appendix_b_says() {
    let v = vectors();
    let numbers = v["numbers"].as_array().expect("numbers");
    assert!(numbers.len() >= 26);
    for n in numbers {
        let hex = n["ieee_hex"].as_str().expect("hex");
        let bits = u64::from_str_radix(hex, 16).expect("bits");
        let got = number_to_string(f64::from_bits(bits));
        assert_eq!(got.as_deref(), n["serialized"].as_str(), "{hex}");
    }
}

#[test]
fn rfc_8785_examples_canonicalise_to_the_rfc_output() {
    let v = vectors();
    for c in v["rfc8785"].as_array().expect("rfc8785") {
        let input = c["input"].as_str().expect("input").as_bytes();
        let output = c["output"].as_str().expect("output");
        assert_eq!(
            parse_with(input, false).expect("parses").canonical(),
            output,
            "{}",
            c["name"]
        );
        // Strict I-JSON: the RFC's first example writes numbers with more
        // digits than their doubles hold, which a bound body may not.
        match c["ijson"].as_bool() {
            Some(true) => assert_eq!(canonicalize(input).as_deref(), Ok(output)),
            _ => assert_eq!(canonicalize(input), Err(IJsonError::Number)),
        }
    }
}

#[test]
fn ijson_refusals_each_with_its_control() {
    let cases: &[(&str, &str, IJsonError)] = &[
        (
            r#"{"a":1,"a":1}"#,
            r#"{"a":1,"b":1}"#,
            IJsonError::DuplicateKey,
        ),
        (
            r#"{"a":{"b":1,"b":2}}"#,
            r#"{"a":{"b":1},"b":2}"#,
            IJsonError::DuplicateKey,
        ),
        (
            r#"["\ud800"]"#,
            r#"["\ud800\udc00"]"#,
            IJsonError::LoneSurrogate,
        ),
        (
            r#"["\udc00\ud800"]"#,
            r#"["\ud83d\ude00"]"#,
            IJsonError::LoneSurrogate,
        ),
        (
            r#"["\ud800x"]"#,
            r#"["\u0800x"]"#,
            IJsonError::LoneSurrogate,
        ),
        (
            "[9007199254740993]",
            "[9007199254740991]",
            IJsonError::Number,
        ),
        (
            "[9.007199254740993e15]",
            "[9.007199254740991e15]",
            IJsonError::Number,
        ),
        (
            "[-9007199254740992]",
            "[-9007199254740991]",
            IJsonError::Number,
        ),
        ("[0.10000000000000001]", "[0.1]", IJsonError::Number),
        ("[1e400]", "[1e-300]", IJsonError::Number),
        ("[1e21]", "[1.5]", IJsonError::Number),
        ("[01]", "[0]", IJsonError::Syntax),
        ("[1.]", "[1.0]", IJsonError::Syntax),
        ("[1,]", "[1]", IJsonError::Syntax),
        (
            "{\"a\":\"\u{1}\"}",
            "{\"a\":\"\\u0001\"}",
            IJsonError::Syntax,
        ),
        ("\u{feff}{}", "{}", IJsonError::Syntax),
        ("{} x", "{} ", IJsonError::Syntax),
    ];
    for (bad, good, why) in cases {
        assert_eq!(parse(bad.as_bytes()).err(), Some(*why), "{bad}");
        assert!(parse(good.as_bytes()).is_ok(), "{good}");
    }
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert_eq!(
        parse(deep(MAX_DEPTH + 1).as_bytes()),
        Err(IJsonError::TooDeep)
    );
    assert!(parse(deep(MAX_DEPTH).as_bytes()).is_ok());
    let objs = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    assert_eq!(
        parse(objs(MAX_DEPTH + 1).as_bytes()),
        Err(IJsonError::TooDeep)
    );
    assert!(parse(objs(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(parse(b"[\"\xff\"]"), Err(IJsonError::Syntax));
}

#[test]
fn equal_values_written_differently_share_one_form() {
    let a = canonicalize(br#"{ "b" : [1.0, 1E2, -0, "\u00e9"], "a": 0.5 }"#);
    let b = canonicalize("{\"a\":5e-1,\"b\":[1,100,0,\"é\"]}".as_bytes());
    assert_eq!(a, b);
    assert_eq!(a.as_deref(), Ok("{\"a\":0.5,\"b\":[1,100,0,\"é\"]}"));
    // Control: another value is another form.
    assert_ne!(canonicalize(br#"{"a":0.5,"b":[1,100,0,"e"]}"#), b);
}
