//! An unreachable API, an API whose TLS handshake never ends, and the
//! per-person-and-tool rate limit: each a clear answer within its bound,
//! nothing half-sent, then served again.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use super::{refusal, ProxyEnv};

/// Restarts the broker with the service's `api_base` moved to `base`;
/// returns the config as it was.
fn move_api_base(p: &mut ProxyEnv, base: &str) -> String {
    let config = std::fs::read_to_string(&p.env.broker.config).unwrap();
    let served = format!("api_base = \"{}\"", p.api.base);
    assert!(config.contains(&served), "{config}");
    let moved = config.replacen(&served, &format!("api_base = \"{base}\""), 1);
    std::fs::write(&p.env.broker.config, &moved).unwrap();
    p.env.broker.restart();
    config
}

/// The positive control after [`move_api_base`]: the API back in the
/// config, the same token is served, the stand-in's first call.
async fn served_again(p: &mut ProxyEnv, config: &str, read: &str) {
    std::fs::write(&p.env.broker.config, config).unwrap();
    p.env.broker.restart();
    assert_eq!(p.call(read, "GET", "/user", None).await.status(), 200);
    assert_eq!(p.api.records().len(), 1);
}

#[tokio::test]
async fn unreachable_api_is_502_with_its_reason_at_once() {
    let mut p = ProxyEnv::start("").await;
    let read = p.token("acme.read", "triage").await;
    // A loopback port nobody listens on: checked free, outside the range
    // the kernel hands out, so no peer of another test takes it meanwhile.
    let closed = crate::support::free_loopback_addr();
    let config = move_api_base(&mut p, &format!("http://{closed}"));

    let started = Instant::now();
    let r = p.call(&read, "GET", "/user", None).await;
    let (status, v) = refusal(r).await;
    assert_eq!(
        (status, v["reason"].as_str()),
        (502, Some("upstream_unreachable")),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "refused quickly, not after a timeout: {:?}",
        started.elapsed()
    );
    assert!(p.api.records().is_empty());
    let unreachable = |e: &serde_json::Value| {
        e["event"] == "proxy.completed" && e["reason"] == "upstream_unreachable"
    };
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| es.iter().any(unreachable))
        .await;
    assert!(audit.iter().any(unreachable), "{audit:?}");

    served_again(&mut p, &config, &read).await;
}

/// One call a second per person and tool, with a burst of `burst`.
fn person_tool_limit(burst: u32) -> String {
    format!("\n[limits]\nper_peer_per_second = 10000\nper_person_tool_per_second = 1\nburst = {burst}\n")
}

#[tokio::test]
async fn per_person_and_tool_rate_limit_is_429_with_retry_after() {
    let p = ProxyEnv::start(&person_tool_limit(3)).await;
    let read = p.token("acme.read", "triage").await;
    let write = p.token("acme.write", "open_pr").await;

    // Calls until refused: the derives and calls of alice with acme.read
    // share one budget.
    let mut served = 0;
    let limited = loop {
        let r = p.call(&read, "GET", "/user", None).await;
        if r.status() == 429 {
            break r;
        }
        assert_eq!(r.status(), 200);
        served += 1;
        assert!(served < 10, "never limited");
    };
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&wait), "Retry-After: {wait}");
    assert_eq!(refusal(limited).await.1["reason"], "rate_limited");
    assert_eq!(
        p.api.records().len(),
        served,
        "the refused call went nowhere"
    );

    // Another tool of the same person has its own budget.
    let r = p
        .call(&write, "POST", "/repos/o/r/pulls", Some(b"{}".to_vec()))
        .await;
    assert_eq!(r.status(), 201);

    // Positive control: after Retry-After, acme.read is served again.
    let deadline = Instant::now() + Duration::from_secs(wait + 3);
    tokio::time::sleep(Duration::from_secs(wait)).await;
    loop {
        let r = p.call(&read, "GET", "/user", None).await;
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 429);
        assert!(Instant::now() < deadline, "still limited after Retry-After");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The call a tool without a current nonce makes twice: `GET /user`
/// without a nonce, then again with the one its 401 handed out. The
/// first answer's status, and the second answer.
async fn without_then_with_a_nonce(p: &ProxyEnv, token: &str) -> (u16, reqwest::Response) {
    let first = p.call(token, "GET", "/user", None).await;
    let status = first.status().as_u16();
    let nonce = first.headers()["dpop-nonce"].to_str().unwrap();
    let htu = format!("{}/proxy/acme/user", p.env.broker.issuer);
    let proof = credbroker::internals::dpop::make_proof(
        &p.key,
        "GET",
        &htu,
        crate::support::now(),
        Some(token),
        Some(nonce),
    )
    .unwrap();
    let second = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {token}"),
            &proof,
            None,
        )
        .await;
    (status, second)
}

#[tokio::test]
async fn following_use_dpop_nonce_on_the_proxy_costs_no_rate_token() {
    let p = ProxyEnv::start(&format!(
        "\n[dpop]\nrequire_nonce = true{}",
        person_tool_limit(4)
    ))
    .await;
    // Two of the four tokens go to derives: the set-up's (the connect
    // link, before alice connected) and this token's; their own nonce
    // challenges take none. Two are left for the pairs below.
    let read = p.token("acme.read", "triage").await;
    // Only the second call of each pair may take a token.
    for pair in 1..=2 {
        let (first, second) = without_then_with_a_nonce(&p, &read).await;
        assert_eq!(first, 401, "pair {pair}, no nonce");
        assert_eq!(second.status(), 200, "pair {pair}, with the nonce");
    }
    assert_eq!(p.api.records().len(), 2);
    // Positive control: the limit is there, and soon refuses a call with a
    // good nonce (a token comes back each second).
    let mut limited = false;
    for _ in 0..4 {
        if without_then_with_a_nonce(&p, &read).await.1.status() == 429 {
            limited = true;
            break;
        }
    }
    assert!(limited, "four more calls with a nonce were all served");
}

#[tokio::test]
async fn an_api_that_never_finishes_its_tls_handshake_is_504_after_connect_timeout() {
    let mut p = ProxyEnv::start("connect_timeout = \"300ms\"").await;
    let read = p.token("acme.read", "triage").await;
    // It accepts connections and never says a word of TLS.
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = stalled.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = stalled.accept().await {
            held.push(s);
        }
    });
    let config = move_api_base(&mut p, &format!("https://{addr}"));

    let started = Instant::now();
    let r = p.call(&read, "GET", "/user", None).await;
    let (status, v) = refusal(r).await;
    assert_eq!(
        (status, v["reason"].as_str()),
        (504, Some("upstream_timeout")),
        "{v}"
    );
    assert!(
        v.to_string().contains("proxy.connect_timeout"),
        "the answer names the bound that ran out: {v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused after connect_timeout, not proxy.timeout: {:?}",
        started.elapsed()
    );
    holder.abort();

    served_again(&mut p, &config, &read).await;
}
