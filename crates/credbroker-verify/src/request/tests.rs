//! The digest against proto/request-binding-vectors.json, which the Python
//! and TypeScript implementations are tested against too.

use super::*;

fn vectors() -> serde_json::Value {
    serde_json::from_str(include_str!(
        "../../../../proto/request-binding-vectors.json"
    ))
    .expect("the vectors parse")
}

fn request(r: &serde_json::Value) -> BoundRequest<'_> {
    let s = |k: &str| r[k].as_str().expect("a string member");
    BoundRequest {
        method: s("method"),
        path: s("path"),
        query: s("query"),
        content_type: s("content_type"),
        body: s("body").as_bytes(),
    }
}

#[test]
fn every_digest_vector() {
    let v = vectors();
    let cases = v["digest"].as_array().expect("digest");
    assert!(cases.len() >= 10);
    for c in cases {
        let r = request(&c["request"]);
        let bound = bind(&r).unwrap_or_else(|e| panic!("{}: {e}", c["name"]));
        assert_eq!(
            std::str::from_utf8(&bound.body).ok(),
            c["hashed_body"].as_str(),
            "{}",
            c["name"]
        );
        if let Some(hex_input) = c["digest_input_hex"].as_str() {
            assert_eq!(hex::encode(digest_input(&r, &bound.body)), hex_input);
        }
        assert_eq!(
            Some(bound.sha256.as_str()),
            c["req_sha256"].as_str(),
            "{}",
            c["name"]
        );
    }
}

#[test]
fn every_refused_vector() {
    let v = vectors();
    let cases = v["refused"].as_array().expect("refused");
    assert!(cases.len() >= 10);
    for c in cases {
        let got = bind(&request(&c["request"]));
        let reason = match got {
            Err(RequestError::TooLarge) => "bound_body_too_large",
            Err(RequestError::NotIJson(_) | RequestError::Charset) => "body_not_ijson",
            Ok(_) => "served",
        };
        assert_eq!(Some(reason), c["error"].as_str(), "{}", c["name"]);
    }
    // Control: the largest bindable body binds.
    let body = vec![b'x'; MAX_BOUND_BODY];
    let r = BoundRequest {
        method: "POST",
        path: "/",
        query: "",
        content_type: "text/plain",
        body: &body,
    };
    assert!(bind(&r).is_ok());
}

#[test]
fn json_media_types() {
    assert_eq!(json_media_type("application/json"), Some(true));
    assert_eq!(
        json_media_type("Application/JSON ; charset=\"UTF-8\""),
        Some(true)
    );
    assert_eq!(json_media_type("application/merge-patch+json"), Some(true));
    assert_eq!(
        json_media_type("application/json; charset=latin1"),
        Some(false)
    );
    assert_eq!(json_media_type("text/plain"), None);
    assert_eq!(json_media_type("application/jsonx"), None);
    assert_eq!(json_media_type(""), None);
}
