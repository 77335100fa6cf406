//! The whole loop through the real pages: a refusal's link, opened in a
//! "browser" (an HTTP client with cookies), sign-in, the connect button,
//! the provider (oidc-provider) and its callback on the pages, then the
//! derive that now gets the provider's token. No fake on either side.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::services::{hidden, issued, location, refused, ServiceEnv};
use crate::support::*;

/// The browser: opens `path` on the pages, signing in as `name` when asked.
async fn open_signed_in(
    env: &ServiceEnv,
    c: &reqwest::Client,
    path: &str,
    name: &str,
    password: &str,
) -> String {
    crate::support::services::open_signed_in(c, &env.broker.public, path, name, password).await
}

#[tokio::test]
async fn refusal_link_through_the_pages_and_the_provider_then_the_derive_gets_the_token() {
    let env = ServiceEnv::start();
    let (status, body) = env
        .broker
        .admin_post(
            "/users",
            &serde_json::json!({"name": "alice", "password": "correct horse battery"}).to_string(),
        )
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let k = key();
    let r = refused(env.derive(&k, "alice", "acme.issues").await);
    assert_eq!(r.reason.as_deref(), Some("connect_required"));
    let uri = r.connect_uri.unwrap();
    let path = &uri[uri.find("/connect/").unwrap()..];
    // The new link is recorded once (by id, never by its code); asking
    // again hands out the same link without a new record.
    let again = refused(env.derive(&k, "alice", "acme.issues").await);
    assert_eq!(again.connect_id, r.connect_id);
    let issued_events: Vec<_> = env
        .broker
        .audit_lines()
        .into_iter()
        .filter(|e| e["event"] == "connect.link_issued")
        .collect();
    assert_eq!(issued_events.len(), 1, "{issued_events:?}");
    let ev = &issued_events[0];
    assert_eq!(ev["connect_id"], r.connect_id.clone().unwrap().as_str());
    assert_eq!(ev["person_sub"], "alice");
    assert_eq!(ev["service"], "acme");
    assert_eq!(ev["reason"], "connect_required");
    assert!(
        !ev.to_string().contains(&path["/connect/".len()..]),
        "no code in events"
    );

    let c = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let html = open_signed_in(&env, &c, path, "alice", "correct horse battery").await;
    assert!(html.contains("Acme"), "the page names the service");
    let go = c
        .post(format!("{}{path}", env.broker.public))
        .header("sec-fetch-site", "same-origin")
        .form(&[
            ("csrf", hidden(&html, "csrf").as_str()),
            ("action", "connect"),
        ])
        .send()
        .await
        .unwrap();
    assert!(go.status().is_redirection(), "{}", go.status());
    let authorize = location(&go);
    assert!(
        authorize.starts_with(&env.peer.issuer),
        "to the provider: {authorize}"
    );
    let q: std::collections::BTreeMap<String, String> = url::Url::parse(&authorize)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(q["code_challenge_method"], "S256");
    assert!(
        q["scope"].split(' ').any(|s| s == "repo"),
        "the tool's scope is asked for: {}",
        q["scope"]
    );

    // The person signs in at the provider; it redirects to the pages' callback.
    let back = env.peer.authorize(&authorize, "octo-alice").await;
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(back.iter())
        .finish();
    let done = c
        .get(format!("{}/callback/acme?{query}", env.broker.public))
        .send()
        .await
        .unwrap();
    assert!(
        done.status().is_redirection(),
        "callback: {} {}",
        done.status(),
        done.text().await.unwrap()
    );
    assert!(location(&done).starts_with("/done/"), "{}", location(&done));

    // The link is used up; the derive now gets the provider's token.
    let t = issued(env.derive(&k, "alice", "acme.issues").await);
    assert_eq!(t.token_type, "Bearer");
    assert_eq!(t.sender_constrained, Some(false));
    assert!(env
        .peer
        .issued_tokens()
        .await
        .contains(t.access_token.expose()));
    let reopened = c
        .get(format!("{}{path}", env.broker.public))
        .send()
        .await
        .unwrap();
    assert_eq!(reopened.status(), 404, "a finished link is closed");

    // The account page lists the account by its name at the provider.
    let account = c
        .get(format!("{}/account", env.broker.public))
        .send()
        .await
        .unwrap();
    assert_eq!(account.status(), 200);
    let html = account.text().await.unwrap();
    assert!(
        html.contains("octo-alice") && html.contains("repo-helper"),
        "{html}"
    );
}
