//! Every way a proxied call is refused, each followed by its positive
//! control, on one running set of peers (a broker, the provider, the API
//! stand-in): a refused call never reaches the stand-in.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{proxy_policy, refusal, ProxyEnv, PROXY, READ_ROUTES};
use crate::support::services::ProviderOpts;
use crate::support::*;

/// Sends raw bytes to the public listener and returns the status line's
/// code (for request shapes an HTTP client would normalise).
async fn raw_status(p: &ProxyEnv, request: String) -> (u16, String) {
    let addr = p
        .env
        .broker
        .public
        .trim_start_matches("http://")
        .to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).to_string();
    (status_of(&text), text)
}

/// A raw GET of `path` with a valid token and proof for exactly that path.
async fn raw_get(p: &ProxyEnv, token: &str, path: &str, extra: &str) -> (u16, String) {
    let proof = p.proof(token, "GET", path);
    raw_status(
        p,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: DPoP {token}\r\nDPoP: {proof}\r\n{extra}Connection: close\r\n\r\n"),
    )
    .await
}

#[tokio::test]
async fn each_refusal_then_its_positive_control() {
    let mut p = ProxyEnv::start(
        "timeout = \"2s\"\nmax_request_body = 1024\nmax_concurrent_per_service = 1",
    )
    .await;
    let read = p.token("acme.read", "triage").await;
    let api = p.api.records.clone();
    let calls = move || api.lock().unwrap().len();

    // A bearer token: 401 invalid_token with a DPoP challenge.
    let proof = p.proof(&read, "GET", "/proxy/acme/user");
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("Bearer {read}"),
            &proof,
            None,
        )
        .await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("error=\"invalid_token\""));
    assert_eq!(calls(), 0);
    // The same proof is still unused: DPoP works.
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {read}"),
            &proof,
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(calls(), 1);

    // A replayed proof.
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {read}"),
            &proof,
            None,
        )
        .await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("invalid_dpop_proof"));
    // The store remembers it too: after a restart (a fresh in-memory
    // cache, as another instance sharing the store has), it is still used.
    p.env.broker.restart();
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {read}"),
            &proof,
            None,
        )
        .await;
    assert_eq!(refusal(r).await.1["reason"], "invalid_dpop_proof");
    // A proof for another URL, and for another method.
    let other_url = p.proof(&read, "GET", "/proxy/acme/repos/o/r/issues");
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {read}"),
            &other_url,
            None,
        )
        .await;
    assert_eq!(refusal(r).await.1["reason"], "invalid_dpop_proof");
    let other_method = p.proof(&read, "POST", "/proxy/acme/user");
    let r = p
        .send(
            "GET",
            "/proxy/acme/user",
            &format!("DPoP {read}"),
            &other_method,
            None,
        )
        .await;
    assert_eq!(refusal(r).await.1["reason"], "invalid_dpop_proof");
    // A token for another resource (a `self` token of the quick start).
    let notes = p.env.broker.derive_ok(&p.key).await;
    let r = p
        .call(notes.access_token.expose(), "GET", "/user", None)
        .await;
    let (status, v) = refusal(r).await;
    assert_eq!(
        (status, v["reason"].as_str()),
        (401, Some("invalid_token")),
        "{v}"
    );
    assert_eq!(calls(), 1);
    assert_eq!(p.call(&read, "GET", "/user", None).await.status(), 200);
    assert_eq!(calls(), 2);

    // A route of another tool, and the right path with the wrong method.
    let r = p
        .call(&read, "POST", "/repos/o/r/pulls", Some(b"{}".to_vec()))
        .await;
    assert_eq!(refusal(r).await, (403, refusal_body("route_not_allowed")));
    let r = p.call(&read, "DELETE", "/user", None).await;
    assert_eq!(refusal(r).await.1["reason"], "route_not_allowed");
    let r = p.call(&read, "HEAD", "/user", None).await;
    assert_eq!(r.status(), 403, "GET does not imply HEAD");
    // The writing tool outside the route's step, then in it.
    let write_triage = p.token("acme.write", "triage").await;
    let r = p
        .call(
            &write_triage,
            "POST",
            "/repos/o/r/pulls",
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(refusal(r).await.1["reason"], "step_not_allowed");
    assert_eq!(calls(), 2);
    let write = p.token("acme.write", "open_pr").await;
    let r = p
        .call(&write, "POST", "/repos/o/r/pulls", Some(b"{}".to_vec()))
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(calls(), 3);

    // Path tricks, each sent raw with a proof for exactly those bytes.
    for trick in [
        "/proxy/acme/repos/o/r%2Fx/issues",
        "/proxy/acme/repos/o/r%2fx/issues",
        "/proxy/acme/repos/o/r%5Cx/issues",
        "/proxy/acme/repos/o/%2E%2E/issues",
        "/proxy/acme/repos/o/r%00/issues",
        "/proxy/acme/repos/o/r%c3%a9/issues",
        "/proxy/acme/repos//r/issues",
        "/proxy/acme/repos/o/./r/issues",
        "/proxy/acme/repos/o/../r/issues",
        "/proxy/acme/user/",
    ] {
        let (status, text) = raw_get(&p, &read, trick, "").await;
        assert_eq!(status, 400, "{trick}: {text}");
        assert!(text.contains("invalid_path"), "{trick}: {text}");
    }
    // A service that has no provider in the config has no proxy address.
    let (status, text) = raw_get(&p, &read, "/proxy/nope/user", "").await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("not_a_proxy_address"), "{text}");
    // Absolute form, CONNECT, TRACE, Upgrade.
    let abs = format!("{}/proxy/acme/user", p.env.broker.public);
    let (status, _) = raw_get(&p, &read, &abs, "").await;
    assert_eq!(status, 400, "absolute-form");
    let (status, _) = raw_status(
        &p,
        "TRACE /proxy/acme/user HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into(),
    )
    .await;
    assert_eq!(status, 400, "TRACE");
    let (status, _) = raw_get(&p, &read, "/proxy/acme/user", "Upgrade: websocket\r\n").await;
    assert_eq!(status, 400, "Upgrade");
    assert_eq!(calls(), 3, "no trick reached the API");
    let (status, text) = raw_get(&p, &read, "/proxy/acme/repos/o/r%C3%A9/issues", "").await;
    assert_eq!(status, 200, "uppercase escapes pass: {text}");
    assert_eq!(calls(), 4);

    // Credentials in the query.
    for q in ["?access_token=abc", &format!("?q={read}")] {
        let r = p
            .call(&read, "GET", &format!("/repos/o/r/issues{q}"), None)
            .await;
        assert_eq!(refusal(r).await.1["reason"], "credentials_in_query");
    }
    assert_eq!(calls(), 4);
    let r = p
        .call(&read, "GET", "/repos/o/r/issues?state=open", None)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(calls(), 5);

    // An upstream redirect to another host: passed back, not followed.
    let r = p.call(&read, "GET", "/redirect", None).await;
    assert_eq!(r.status(), 302);
    assert!(r.headers()["location"]
        .to_str()
        .unwrap()
        .starts_with(&p.other.base));
    assert!(p.other.records().is_empty(), "the other host saw nothing");

    // Answers that echo the provider token: at the start of the body and
    // in a header, a 502 before anything is sent; later in the body, the
    // answer is cut before the token.
    for kind in ["start", "header"] {
        let r = p.call(&read, "GET", &format!("/echo/{kind}"), None).await;
        let (status, v) = refusal(r).await;
        assert_eq!(
            (status, v["reason"].as_str()),
            (502, Some("echo_blocked")),
            "{kind}"
        );
    }
    let r = p.call(&read, "GET", "/echo/split", None).await;
    assert_eq!(
        r.status(),
        200,
        "the headers went out after the first chunk"
    );
    let got = r.bytes().await;
    assert!(got.is_err(), "the answer is cut, not completed");
    let tokens = p.provider_tokens().await;
    let blocked =
        |e: &serde_json::Value| e["event"] == "proxy.completed" && e["reason"] == "echo_blocked";
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| es.iter().any(blocked))
        .await;
    assert!(audit.iter().any(blocked), "{audit:?}");
    let answers = format!("{audit:?}");
    assert!(tokens.iter().all(|t| !answers.contains(t.as_str())));
    assert_eq!(p.call(&read, "GET", "/user", None).await.status(), 200);

    // A body over proxy.max_request_body: 413, nothing sent.
    let before = calls();
    let r = p
        .call(&write, "POST", "/repos/o/r/pulls", Some(vec![b' '; 2000]))
        .await;
    assert_eq!(refusal(r).await, (413, refusal_413()));
    assert_eq!(calls(), before);
    let r = p
        .call(&write, "POST", "/repos/o/r/pulls", Some(vec![b' '; 1000]))
        .await;
    assert_eq!(r.status(), 201);

    // A hanging upstream: 504 within the 2 s timeout (plus slack); while it
    // hangs, the service's one slot (max_concurrent_per_service = 1) is
    // taken, so another call gets 503 service_busy.
    let started = Instant::now();
    let hanging = {
        let proof = p.proof(&read, "GET", "/proxy/acme/hang");
        let rb = p
            .http
            .get(format!("{}/proxy/acme/hang", p.env.broker.public))
            .header("authorization", format!("DPoP {read}"))
            .header("dpop", proof);
        tokio::spawn(rb.send())
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !p.api.records().iter().any(|r| r.path == "/hang") {
        assert!(
            Instant::now() < deadline,
            "the hanging call never went upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(refusal(r).await.1["reason"], "service_busy");
    let r = hanging.await.unwrap().unwrap();
    let took = started.elapsed();
    assert_eq!(refusal(r).await.1["reason"], "upstream_timeout");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(6),
        "{took:?}"
    );
    assert_eq!(p.call(&read, "GET", "/user", None).await.status(), 200);

    // The freeze refuses every call; lifted, calls work again.
    let (status, _) = p.env.broker.admin_post("/freeze", "on").unwrap();
    assert_eq!(status, 200);
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(refusal(r).await.1["reason"], "frozen");
    p.env.broker.admin_post("/freeze", "off").unwrap();
    assert_eq!(p.call(&read, "GET", "/user", None).await.status(), 200);

    // A reload that removes a route stops it at once, with the same token.
    let fewer = READ_ROUTES.replace("\"GET /user\", ", "");
    p.env.broker.replace_policy(proxy_policy(&fewer).as_bytes());
    p.env.broker.sighup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = p.call(&read, "GET", "/user", None).await;
        if r.status() == 403 {
            assert_eq!(refusal(r).await.1["reason"], "route_not_allowed");
            break;
        }
        assert!(Instant::now() < deadline, "the reload never took effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = p.call(&read, "GET", "/repos/o/r/issues", None).await;
    assert_eq!(r.status(), 200, "the routes left still work");

    // A revoked grant: the stand-in answers 401, one refresh is refused,
    // and the tool gets reconnect_required with its link; the account
    // page then says the account needs reconnecting.
    p.env.peer.revoke_account("octo-alice").await;
    let before = calls();
    let r = p.call(&read, "GET", "/repos/o/r/issues", None).await;
    let (status, v) = refusal(r).await;
    assert_eq!(
        (status, v["reason"].as_str()),
        (400, Some("reconnect_required")),
        "{v}"
    );
    assert!(v["connect_uri"]
        .as_str()
        .is_some_and(|u| u.contains("/connect/")));
    assert_eq!(
        calls(),
        before + 1,
        "one call, no retry with a refused token"
    );
    let mut env = p.env;
    let page = env.open_signed_in("/account", "alice").await;
    assert!(page.contains("Access stopped working"), "{page}");
    let _ = PROXY;
}

/// A token from before a reload, for a step the policy still declares but
/// the tool no longer lists, on a route with no steps of its own (so only
/// the tool's own step list can refuse it): 403 `step_not_allowed`, and
/// nothing goes upstream. The control: the same route with a token for a
/// step the tool still lists is served.
#[tokio::test]
async fn token_for_a_step_the_tool_no_longer_lists_is_step_not_allowed() {
    // The steps are declared (a closed world), and both stay declared.
    let policy = |read_steps: &str| {
        let listed =
            format!("[tools.\"acme.read\"]\nresource = \"{PROXY}\"\nscopes = [\"repo\"]\nsteps = ");
        let base = proxy_policy(READ_ROUTES);
        let tool_steps = format!("{listed}[\"triage\"]\n");
        assert!(base.contains(&tool_steps), "{base}");
        let text = base.replacen(&tool_steps, &format!("{listed}{read_steps}\n"), 1);
        format!(
            "steps = [\"answer_question\", \"summarize\", \"cleanup_confirmed\", \"triage\", \"open_pr\"]\n{text}"
        )
    };
    let p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(policy(r#"["triage", "open_pr"]"#)),
            ..ProviderOpts::default()
        },
    )
    .await;
    let before_reload = p.token("acme.read", "open_pr").await;
    let triage = p.token("acme.read", "triage").await;
    assert_eq!(
        p.call(&before_reload, "GET", "/user", None).await.status(),
        200,
        "listed: served"
    );
    assert_eq!(p.api.records().len(), 1);

    // The tool drops `open_pr`; the policy still declares it.
    let hash = p.env.broker.policy_hash();
    p.env
        .broker
        .replace_policy(policy(r#"["triage"]"#).as_bytes());
    p.env.broker.sighup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.env.broker.policy_hash() == hash {
        assert!(Instant::now() < deadline, "the reload never took effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = p.call(&before_reload, "GET", "/user", None).await;
    assert_eq!(refusal(r).await, (403, refusal_body("step_not_allowed")));
    assert_eq!(p.api.records().len(), 1, "nothing went upstream");

    // Positive control: a step the tool still lists, on the same route.
    assert_eq!(p.call(&triage, "GET", "/user", None).await.status(), 200);
    assert_eq!(p.api.records().len(), 2);
}

fn refusal_413() -> serde_json::Value {
    serde_json::json!({
        "error": "invalid_request",
        "reason": "request_too_large",
        "error_description": "the request body is larger than the proxy's cap of 1024 bytes (proxy.max_request_body); nothing was sent",
    })
}

fn refusal_body(reason: &str) -> serde_json::Value {
    serde_json::json!({
        "error": "insufficient_scope",
        "reason": reason,
        "error_description": "the current policy does not allow this call for the token's tool and step",
    })
}
