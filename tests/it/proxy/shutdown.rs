//! SIGTERM while a proxied download is streaming (what a rolling update
//! does): the answer in flight is finished whole, a new connection is
//! refused while it drains, and the broker exits 0 once the answer is out.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use super::ProxyEnv;
use crate::support::api_standin::pattern;

const MIB: usize = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_a_download_in_flight_then_exits_zero() {
    let mut p = ProxyEnv::start("").await;
    let read = p.token("acme.read", "triage").await;
    // 32 MiB: far more than the loopback socket buffers hold, so most of
    // it is still to be sent when the signal lands.
    let mut r = p.call(&read, "GET", "/download/32", None).await;
    assert_eq!(r.status(), 200);
    let mut got = r.chunk().await.unwrap().expect("a first chunk").to_vec();
    assert!(got.len() < 32 * MIB);

    let pid = p.env.broker.child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    // The download is not read until new connections are refused: the
    // broker's shutdown goes on with the answer blocked on flow control,
    // as with a slow client. The listener is closed when the drain
    // begins, so a new call cannot connect (and a client or load balancer
    // goes elsewhere) rather than waiting in the backlog until the broker
    // exits. Polled, not slept on: how soon the signal is handled depends
    // on the machine's load. A call that still connects meanwhile is
    // served, or cut if the drain begins under it; either way it is tried
    // again, until the deadline.
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    // Well within the broker's 10 s drain budget, after which it exits
    // whatever is in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let late = fresh
            .get(format!("{}/.well-known/jwks.json", p.env.broker.public))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        match late {
            Err(e) if e.is_connect() => break,
            _ if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("a connection 5 s after SIGTERM was not refused: {other:?}"),
        }
    }
    // Refused, and the broker has not exited: the download is in flight.
    assert!(
        p.env.broker.child.try_wait().unwrap().is_none(),
        "the broker exited with a download still in flight"
    );

    // Positive control: the answer that was in flight arrives whole.
    while let Some(c) = r.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert_eq!(got.len(), 32 * MIB);
    assert!(got == pattern(32 * MIB), "the download arrived intact");

    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = p.env.broker.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the broker is still running 15 s after its last answer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    // And the audit log says the call completed, all of it sent.
    let events = p.env.broker.audit_lines();
    let done = events
        .iter()
        .find(|e| e["event"] == "proxy.completed" && e["proxy"]["route"] == "GET /download/{mib}")
        .unwrap_or_else(|| panic!("no proxy.completed for the download: {events:?}"));
    assert_eq!(done["proxy"]["bytes_down"], 32 * MIB);
}
