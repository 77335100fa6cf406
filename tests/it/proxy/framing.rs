//! RFC 9112 framing on the public listener (issue 40 item 5), over raw TCP:
//! a request with two `Host` lines, or an HTTP/1.1 request with none, is
//! refused with 400 (section 3.2) before anything is served or forwarded,
//! on the proxy, the metadata and the pages; HTTP/1.0 may omit `Host`. The
//! other framing rules are hyper's, checked here as they are: two different
//! `Content-Length`s and obsolete line folding get 400, and a request with
//! both `Transfer-Encoding` and `Content-Length` is read by
//! `Transfer-Encoding` alone and its connection closed (section 6.1).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ProxyEnv;
use crate::support::HttpAnswer;

/// Sends `head` (lines joined with CRLF, then a blank line) and `body` to
/// the public listener at `base`; returns everything that came back until
/// the server closed the connection (every request here says
/// `Connection: close`, is HTTP/1.0, or is refused).
async fn raw(base: &str, head: &[&str], body: &[u8]) -> String {
    let addr = base.strip_prefix("http://").unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut bytes = head.join("\r\n").into_bytes();
    bytes.extend_from_slice(b"\r\n\r\n");
    bytes.extend_from_slice(body);
    s.write_all(&bytes).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the server closed the connection")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// A proxied `GET /user` with `extra` lines: a fresh proof each time.
async fn proxied(p: &ProxyEnv, token: &str, first: &str, extra: &[&str]) -> HttpAnswer {
    let auth = format!("Authorization: DPoP {token}");
    let proof = format!("DPoP: {}", p.proof(token, "GET", "/proxy/acme/user"));
    let mut head = vec![first, &auth, &proof, "Connection: close"];
    head.extend_from_slice(extra);
    HttpAnswer::parse(&raw(&p.env.broker.public, &head, b"").await)
}

fn refused_for_framing(a: &HttpAnswer, what: &str) {
    assert_eq!(a.status, 400, "{what}: {}", a.raw);
    let v = a.json();
    assert_eq!(v["error"], "invalid_request", "{what}: {v}");
    assert!(
        v["error_description"]
            .as_str()
            .unwrap()
            .contains("RFC 9112 section 3.2"),
        "{what}: {v}"
    );
}

#[tokio::test]
async fn two_host_lines_or_none_in_http_1_1_get_400_and_nothing_is_forwarded() {
    let p = ProxyEnv::start("").await;
    let b = &p.env.broker;
    let host = format!("Host: {}", b.public.strip_prefix("http://").unwrap());
    let token = p.token("acme.read", "triage").await;
    let get = "GET /proxy/acme/user HTTP/1.1";

    // The proxy: two Host lines (the same twice, or two different ones),
    // or none, are refused in its first stage; nothing reaches the API.
    for (what, extra) in [
        ("the same Host twice", vec![host.as_str(), host.as_str()]),
        ("two Hosts", vec![host.as_str(), "Host: api.example"]),
        ("no Host", vec![]),
    ] {
        let a = proxied(&p, &token, get, &extra).await;
        refused_for_framing(&a, what);
        assert_eq!(a.json()["reason"], "invalid_framing", "{what}");
    }
    assert!(
        p.api.records().is_empty(),
        "a refused request went upstream"
    );
    // Positive control: one Host line is served, once.
    let a = proxied(&p, &token, get, &[&host]).await;
    assert_eq!(a.status, 200, "{}", a.raw);
    assert_eq!(p.api.records().len(), 1);
    // HTTP/1.0 may omit Host: served too.
    let a = proxied(&p, &token, "GET /proxy/acme/user HTTP/1.0", &[]).await;
    assert_eq!(a.status, 200, "{}", a.raw);
    assert_eq!(p.api.records().len(), 2);

    // The metadata and the pages, the same rule.
    for path in ["/.well-known/oauth-authorization-server", "/signin"] {
        let line = format!("GET {path} HTTP/1.1");
        for (what, extra) in [
            ("two Hosts", vec![host.as_str(), host.as_str()]),
            ("no Host", vec![]),
        ] {
            let mut head = vec![line.as_str(), "Connection: close"];
            head.extend(extra);
            let a = HttpAnswer::parse(&raw(&b.public, &head, b"").await);
            refused_for_framing(&a, &format!("{path}, {what}"));
            assert_eq!(a.json().get("reason"), None, "{path}: no reason here");
        }
        // Positive controls: one Host, and HTTP/1.0 without one.
        let one = raw(&b.public, &[&line, &host, "Connection: close"], b"").await;
        assert!(one.starts_with("HTTP/1.1 200 "), "{path}: {one}");
        let old = raw(&b.public, &[&format!("GET {path} HTTP/1.0")], b"").await;
        assert!(old.starts_with("HTTP/1.0 200 "), "{path}: {old}");
    }
}

#[tokio::test]
async fn the_other_framing_rules_are_kept_by_hyper() {
    let p = ProxyEnv::start("").await;
    let b = &p.env.broker;
    let host = format!("Host: {}", b.public.strip_prefix("http://").unwrap());
    let token = p.token("acme.read", "triage").await;
    let get = "GET /proxy/acme/user HTTP/1.1";
    // Two different Content-Lengths, a list of them, and obsolete line
    // folding (with a space or a tab): 400, and nothing upstream.
    for (what, extra) in [
        (
            "two lengths",
            vec!["Content-Length: 0", "Content-Length: 1"],
        ),
        ("a list of lengths", vec!["Content-Length: 0, 0"]),
        ("a folded line", vec!["X-A: one", " two"]),
        ("a folded line (tab)", vec!["X-A: one", "\ttwo"]),
    ] {
        let mut lines = vec![host.as_str()];
        lines.extend(extra);
        let a = proxied(&p, &token, get, &lines).await;
        assert_eq!(a.status, 400, "{what}: {}", a.raw);
    }
    assert!(
        p.api.records().is_empty(),
        "a refused request went upstream"
    );

    // Transfer-Encoding with Content-Length: read as chunked, answered,
    // and the connection closed; the request pipelined after it is not
    // read.
    let metadata = "GET /.well-known/oauth-authorization-server HTTP/1.1";
    let next = format!("{metadata}\r\n{host}\r\n\r\n");
    let mut body = b"0\r\n\r\n".to_vec();
    body.extend_from_slice(next.as_bytes());
    let out = raw(
        &b.public,
        &[
            metadata,
            &host,
            "Transfer-Encoding: chunked",
            "Content-Length: 5",
        ],
        &body,
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    assert!(out.contains("\r\nconnection: close\r\n"), "{out}");
    assert_eq!(out.matches("HTTP/1.1 ").count(), 1, "{out}");
    // Control: without Content-Length the same two requests get two
    // answers on the one connection (the first keeps it open).
    let mut body = b"0\r\n\r\n".to_vec();
    body.extend_from_slice(format!("{metadata}\r\n{host}\r\nConnection: close\r\n\r\n").as_bytes());
    let out = raw(
        &b.public,
        &[metadata, &host, "Transfer-Encoding: chunked"],
        &body,
    )
    .await;
    assert_eq!(out.matches("HTTP/1.1 200 ").count(), 2, "{out}");

    // Positive control: the proxied call with one Host line is served.
    let a = proxied(&p, &token, get, &[&host]).await;
    assert_eq!(a.status, 200, "{}", a.raw);
    assert_eq!(p.api.records().len(), 1);
}
