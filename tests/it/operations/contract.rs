//! The HTTP contract of the two listeners as a client sees it: socket-only
//! endpoints named in the metadata answer JSON on the public listener, HEAD
//! is answered where GET is, one cache policy on the public documents, and
//! the socket serves the metadata too.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::broker::{HttpAnswer, TestBroker};

/// Sends `method path` to the public listener and returns everything that
/// came back (the connection is closed by the request).
fn public(b: &TestBroker, method: &str, path: &str) -> HttpAnswer {
    let addr = b.public.trim_start_matches("http://").trim_end_matches('/');
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    HttpAnswer::parse(&String::from_utf8_lossy(&out))
}

fn socket_get(b: &TestBroker, method: &str, path: &str) -> HttpAnswer {
    b.http(format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
}

#[test]
fn socket_only_endpoints_on_the_public_listener_answer_json_not_the_404_page() {
    let b = TestBroker::start();
    let meta = public(&b, "GET", "/.well-known/oauth-authorization-server").json();
    for key in ["token_endpoint", "credbroker_derive_endpoint"] {
        let url = meta[key].as_str().unwrap();
        let path = url.strip_prefix(b.issuer.as_str()).unwrap();
        for method in ["POST", "GET"] {
            let r = public(&b, method, path);
            assert_eq!(r.status, 400, "{method} {path}: {}", r.raw);
            assert!(
                r.header("content-type")
                    .unwrap()
                    .starts_with("application/json"),
                "{method} {path}: {}",
                r.raw
            );
            let j = r.json();
            assert_eq!(j["error"], "invalid_request", "{}", r.raw);
            let d = j["error_description"].as_str().unwrap();
            assert!(d.contains("Unix socket") && d.contains(path), "{d}");
        }
    }
    // Positive control: any other unknown path is still the pages' 404.
    let r = public(&b, "GET", "/tokens");
    assert_eq!(r.status, 404, "{}", r.raw);
    assert!(
        r.header("content-type").unwrap().starts_with("text/html"),
        "{}",
        r.raw
    );
}

#[test]
fn head_is_answered_where_get_is_with_the_same_headers_and_no_body() {
    let b = TestBroker::start();
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/jwks.json",
        "/healthz",
    ] {
        let get = public(&b, "GET", path);
        let head = public(&b, "HEAD", path);
        assert_eq!(get.status, 200, "{path}: {}", get.raw);
        assert_eq!(head.status, 200, "HEAD {path}: {}", head.raw);
        assert!(
            head.body.is_empty(),
            "HEAD {path} sent a body: {}",
            head.raw
        );
        for h in ["content-type", "cache-control", "content-length"] {
            assert_eq!(get.header(h), head.header(h), "{h} of {path}");
        }
        assert_eq!(
            get.header("content-length").unwrap(),
            get.body.len().to_string(),
            "{path}"
        );
    }
}

#[test]
fn public_documents_have_one_cache_policy() {
    let b = TestBroker::start();
    for (path, max_age) in [
        (
            "/.well-known/oauth-authorization-server",
            "public, max-age=300",
        ),
        ("/.well-known/jwks.json", "public, max-age=60"),
    ] {
        let r = public(&b, "GET", path);
        assert_eq!(r.status, 200, "{}", r.raw);
        let cc: Vec<_> = r
            .headers
            .iter()
            .filter(|(k, _)| k == "cache-control")
            .collect();
        assert_eq!(cc.len(), 1, "{path}: {}", r.raw);
        assert_eq!(cc[0].1, max_age, "{path}");
        assert_eq!(
            r.header("pragma"),
            None,
            "{path}: Pragma next to max-age: {}",
            r.raw
        );
    }
    // Positive control: error answers stay uncacheable, Pragma included
    // (for HTTP/1.0 caches).
    let r = public(&b, "POST", "/token");
    assert_eq!(r.header("cache-control"), Some("no-store"), "{}", r.raw);
    assert_eq!(r.header("pragma"), Some("no-cache"), "{}", r.raw);
}

#[test]
fn the_socket_serves_the_metadata_too() {
    let b = TestBroker::start();
    let on_socket = socket_get(&b, "GET", "/.well-known/oauth-authorization-server");
    assert_eq!(on_socket.status, 200, "{}", on_socket.raw);
    let public = public(&b, "GET", "/.well-known/oauth-authorization-server");
    assert_eq!(on_socket.json(), public.json());
    assert_eq!(on_socket.json()["issuer"], b.issuer.as_str());
    assert_eq!(
        on_socket.header("cache-control"),
        public.header("cache-control")
    );
    let head = socket_get(&b, "HEAD", "/.well-known/oauth-authorization-server");
    assert_eq!(head.status, 200, "{}", head.raw);
    assert!(head.body.is_empty(), "{}", head.raw);
    // Negative control: the JWKS and the pages stay off the socket.
    let r = socket_get(&b, "GET", "/.well-known/jwks.json");
    assert_eq!(r.status, 404, "{}", r.raw);
    assert_eq!(r.json()["error"], "not_found", "{}", r.raw);
}

/// The exact shape a client library relies on (the Python and TypeScript
/// libraries read it): members are only ever added, so this test lists
/// every one and fails on a missing, renamed or retyped member.
#[test]
fn the_socket_info_tells_a_client_the_api_version_issuer_htus_and_dpop_rules() {
    use crate::support::broker::Opts;
    let b = TestBroker::start();
    let r = socket_get(&b, "GET", "/v1/info");
    assert_eq!(r.status, 200, "{}", r.raw);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/json"),
        "{}",
        r.raw
    );
    let iss = b.issuer.as_str();
    assert_eq!(
        r.json(),
        serde_json::json!({
            "api_version": "1",
            "broker_version": env!("CARGO_PKG_VERSION"),
            "issuer": iss,
            "derive_htu": format!("{iss}/v1/derive"),
            "token_htu": format!("{iss}/token"),
            "dpop_signing_alg_values_supported": ["ES256"],
            "dpop_nonce_required": false,
            "upstreams": {},
            "upstream_resources": {},
        })
    );
    let head = socket_get(&b, "HEAD", "/v1/info");
    assert_eq!(head.status, 200, "{}", head.raw);
    assert!(head.body.is_empty(), "{}", head.raw);
    // Another method is refused with the methods it takes.
    let post = b.http(
        b"POST /v1/info HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(post.status, 405, "{}", post.raw);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    // A broker that requires nonces says so.
    let strict = TestBroker::start_with(Opts {
        extra_config: "\n[dpop]\nrequire_nonce = true\n".into(),
        ..Opts::default()
    });
    let r = socket_get(&strict, "GET", "/v1/info");
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.json()["dpop_nonce_required"], true, "{}", r.raw);
}
