//! The opt-in metrics listener (`[metrics] listen`, issue 39 item 5): the
//! admin socket's exposition on TCP, `GET`/`HEAD /metrics` only, its own
//! connection cap, a busy port refused at start, stopped with the broker.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::*;

/// One request on a new connection: (status, headers and body as text).
fn request(addr: &str, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A connection closed unread may refuse the write too.
    let _ = write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    (status_of(&out), out)
}

fn broker_with_metrics() -> (TestBroker, String) {
    let addr = free_loopback_addr();
    let b = TestBroker::start_with(Opts {
        extra_config: format!("\n[metrics]\nlisten = \"{addr}\"\n"),
        ..Opts::default()
    });
    (b, addr)
}

#[tokio::test]
async fn metrics_listener_serves_only_get_and_head_metrics_from_the_one_registry() {
    let (mut b, addr) = broker_with_metrics();
    let k = key();
    b.derive_ok(&k).await;
    let issued = r#"credbroker_derives_total{outcome="issued",reason="none",tool="notes.read"} 1"#;
    let (code, got) = request(&addr, "GET", "/metrics");
    assert_eq!(code, 200, "{got}");
    assert!(
        got.contains("content-type: text/plain; version=0.0.4"),
        "{got}"
    );
    // The same registry as the admin socket's: the derive counted once, and
    // readiness as a gauge.
    assert!(got.contains(issued), "{got}");
    assert!(b.metrics().contains(issued));
    assert!(got.contains("\ncredbroker_ready 1\n"), "{got}");
    let (code, head) = request(&addr, "HEAD", "/metrics");
    assert_eq!(code, 200, "{head}");
    assert!(
        head.ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {head}"
    );
    // Nothing else: not the admin socket's other routes, not the public
    // pages, and no other method on /metrics.
    for path in [
        "/readyz",
        "/status",
        "/freeze",
        "/",
        "/.well-known/jwks.json",
    ] {
        let (code, got) = request(&addr, "GET", path);
        assert_eq!(code, 404, "GET {path}: {got}");
        assert!(!got.contains("credbroker_"), "GET {path}: {got}");
    }
    let (code, got) = request(&addr, "POST", "/freeze");
    assert_eq!(code, 404, "{got}");
    let (code, got) = request(&addr, "POST", "/metrics");
    assert_eq!(code, 405, "{got}");
    assert!(got.contains("allow: GET, HEAD"), "{got}");
    let (_, status) = b.admin_get("/status").unwrap();
    assert!(status.contains("\"frozen\":false"), "{status}");
    // Its own connection cap: with every slot held by an idle connection, a
    // new one is closed unread and counted; once they go, it answers again.
    let held: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // The accept loop takes them in order; give it a moment to hold all.
    std::thread::sleep(Duration::from_millis(300));
    let (code, got) = request(&addr, "GET", "/metrics");
    assert_eq!(code, 0, "a ninth connection was served: {got}");
    let refused = b
        .metric(r#"credbroker_connections_refused_total{reason="cap",socket="metrics"}"#)
        .unwrap_or(0.0);
    assert!(refused >= 1.0, "{}", b.metrics());
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, _) = request(&addr, "GET", "/metrics");
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slots were not given back");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Stopped with the broker: an idle keep-alive connection does not hold
    // the exit up, and the port is closed after.
    let mut idle = TcpStream::connect(&addr).unwrap();
    write!(idle, "GET /metrics HTTP/1.1\r\nhost: {addr}\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    assert!(idle.read(&mut buf).unwrap() > 0);
    let t = Instant::now();
    b.stop();
    let st = b.child.try_wait().unwrap().expect("the broker exited");
    assert!(st.success(), "{st}: {}", b.log_text());
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert!(TcpStream::connect(&addr).is_err(), "still listening");
}

#[test]
fn metrics_listener_on_a_busy_port_fails_the_start_before_any_socket_file() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let (dir, config) = prepare(&Opts {
        extra_config: format!("\n[metrics]\nlisten = \"{addr}\"\n"),
        ..Opts::default()
    });
    let (st, err) = serve_expect_exit(&config, Duration::from_secs(20));
    assert!(!st.success());
    assert!(
        err.contains("metrics.listen: cannot listen on") && err.contains(&addr),
        "{err}"
    );
    assert!(!dir.path().join("credbroker.sock").exists());
    assert!(!dir.path().join("admin.sock").exists());
    // Positive control: the same config serves once the port is free.
    drop(busy);
    let b = TestBroker::spawn(dir, config, None);
    let (code, got) = request(&addr, "GET", "/metrics");
    assert_eq!(code, 200, "{got}");
    drop(b);
}
