//! The provider refuses its own token (an access token it revoked before
//! its expiry): an idempotent call is refreshed once and retried, a POST
//! never is.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::ProxyEnv;

#[tokio::test]
async fn upstream_401_refreshes_and_retries_a_get_once_and_never_a_post() {
    let p = ProxyEnv::start("").await;
    let read = p.token("acme.read", "triage").await;
    let write = p.token("acme.write", "open_pr").await;
    let refreshes = p.env.peer.refreshes().await;

    // A POST whose token the provider refuses: the 401 goes back to the
    // tool as it is, the stand-in saw one POST, and nothing was refreshed.
    p.api.refuse_next_token();
    let r = p
        .call(&write, "POST", "/repos/o/r/pulls", Some(b"{}".to_vec()))
        .await;
    assert_eq!(r.status(), 401);
    let records = p.api.records();
    let posts: Vec<_> = records.iter().filter(|r| r.method == "POST").collect();
    assert_eq!(posts.len(), 1, "a POST is never retried: {records:?}");
    assert!(!posts[0].authorized);
    assert_eq!(p.env.peer.refreshes().await, refreshes, "no refresh for it");

    // A GET with the same refused token: one refresh, one retry, served.
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["login"].is_string(), "{v}");
    let records = p.api.records();
    let gets: Vec<_> = records.iter().filter(|r| r.method == "GET").collect();
    assert_eq!(gets.len(), 2, "one call and one retry: {records:?}");
    assert!(!gets[0].authorized && gets[1].authorized, "{gets:?}");
    assert_eq!(
        gets[0].header("authorization"),
        posts[0].header("authorization"),
        "the first try carried the refused token"
    );
    assert_ne!(
        gets[1].header("authorization"),
        gets[0].header("authorization"),
        "the retry carried a fresh one"
    );
    assert_eq!(p.env.peer.refreshes().await, refreshes + 1);
    // The POST's completion and the GET's (written after its last byte).
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| {
            es.iter()
                .filter(|e| e["event"] == "proxy.completed")
                .count()
                >= 2
        })
        .await;
    let done = audit
        .iter()
        .rfind(|e| e["event"] == "proxy.completed")
        .unwrap();
    assert_eq!(done["proxy"]["upstream_status"], 200, "{done}");

    // Positive control for the POST: with the refreshed token it is served,
    // once.
    let r = p
        .call(&write, "POST", "/repos/o/r/pulls", Some(b"{}".to_vec()))
        .await;
    assert_eq!(r.status(), 201);
    let posts = p
        .api
        .records()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 2);
    assert_eq!(p.env.peer.refreshes().await, refreshes + 1);

    // The echo guard looks for the token a retry replaced as well: the
    // provider refuses the current token, the retry with a fresh one is
    // answered with the refused one in the body, and the tool gets 502.
    p.api.refuse_next_token();
    let r = p.call(&read, "GET", "/echo/refused", None).await;
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["reason"], "echo_blocked", "{v}");
    let gets: Vec<_> = p
        .api
        .records()
        .into_iter()
        .filter(|r| r.path == "/echo/refused")
        .collect();
    assert_eq!(gets.len(), 2, "one call and one retry: {gets:?}");
    assert!(!gets[0].authorized && gets[1].authorized, "{gets:?}");
    assert_eq!(p.env.peer.refreshes().await, refreshes + 2);
    // Positive control: the same route when nothing was refused since
    // answers with the token refused before, which is not one the broker
    // holds any more, and is served.
    let r = p.call(&read, "GET", "/echo/refused", None).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().starts_with("you were refused "));
}

#[tokio::test]
async fn a_refresh_the_provider_cannot_give_is_503_with_retry_after_and_no_retry() {
    let p = ProxyEnv::start("").await;
    let read = p.token("acme.read", "triage").await;
    // The provider refuses its token and its token endpoint fails: the
    // refresh gives nothing, so the call is not retried and the tool is
    // told when to come back, as a derive would tell it.
    p.env.peer.set_token_mode("500").await;
    p.api.refuse_next_token();
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers().get("retry-after").map(|v| v.to_str().unwrap()),
        Some("5")
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "temporarily_unavailable", "{v}");
    assert_eq!(v["reason"], "upstream_unavailable", "{v}");
    let gets = p
        .api
        .records()
        .into_iter()
        .filter(|r| r.path == "/user")
        .count();
    assert_eq!(gets, 1, "the refused call only, no retry");
    // Positive control: the provider answering again, the same call is
    // refreshed and served.
    p.env.peer.set_token_mode("ok").await;
    p.api.refuse_next_token();
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 200);
}
