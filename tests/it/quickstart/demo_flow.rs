//! The quick start's demo connect flow end to end, in Chromium, against the
//! real `credbroker quickstart` binary and its built-in demo service: the
//! demo tool is refused with a connect link; Bob opening Alice's link
//! changes nothing; Alice connects her demo account; the retry is issued;
//! the token verifies in npm `jose` and the demo API takes it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use credbroker::client::{Answer, Client, DeriveParams};
use credbroker::internals::jose::Es256Key;
use serde_json::json;

use crate::support::browser::Browsers;
use crate::support::quickstart::{alice_connects_steps, bob_opens_steps, Quickstart};
use crate::support::*;

async fn derive_demo(q: &Quickstart, key: &Es256Key, sub: &str) -> Answer {
    Client::new(q.socket(), &q.issuer)
        .derive(
            &DeriveParams {
                subject_token: &q.subject_token(sub),
                step: "summarize",
                tool: "demo.notes",
                resource: &q.demo_api(),
                scope: None,
            },
            key,
        )
        .await
        .unwrap()
}

/// The accounts the running quick start lists for `person` (through its
/// admin socket, as an operator would).
fn accounts_of(q: &Quickstart, person: &str) -> serde_json::Value {
    let config = q.config();
    let (code, out, err) = q.cli(&[
        "accounts",
        "list",
        "--config",
        config.to_str().unwrap(),
        "--person",
        person,
    ]);
    assert_eq!(code, 0, "accounts list: {out}{err}");
    serde_json::from_str(&out).unwrap_or_else(|_| panic!("accounts list printed {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_demo_connect_link_in_chromium() {
    let q = Quickstart::start().await;
    let (alice_pw, bob_pw) = (q.password("alice"), q.password("bob"));
    let banner = q.printed();
    assert!(banner.contains("Demo service") || banner.contains("demo service"));
    // The passwords are printed once, on the banner, never in a log line.
    for line in banner
        .lines()
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN "))
    {
        assert!(
            !line.contains(&alice_pw) && !line.contains(&bob_pw),
            "{line}"
        );
    }
    let key = key();

    // 1. Alice's agent asks for the demo tool: she has no demo account
    //    connected, so the answer is a connect link.
    let Answer::Refused(r) = derive_demo(&q, &key, "alice").await else {
        panic!("the demo tool was issued before any account was connected");
    };
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    let link = r.connect_uri.clone().unwrap();
    assert!(
        link.starts_with(&format!("{}/connect/", q.issuer)),
        "{link}"
    );

    let mut b = Browsers::start().await;
    // 2. Bob opens Alice's forwarded link: the page says it is not his,
    //    names nobody, and nothing is joined to either of them.
    let mut steps = bob_opens_steps(&q, &link, &bob_pw);
    steps.push(json!({"screenshot": "quickstart-bob-opens-alices-link"}));
    b.steps("bob", json!(steps)).await;
    assert_eq!(accounts_of(&q, "bob")["accounts"], json!([]));
    assert_eq!(accounts_of(&q, "alice")["accounts"], json!([]));
    assert_eq!(q.events("connect.opened_by_other_person").len(), 1);
    // Still refused with a link, since nothing changed.
    let Answer::Refused(again) = derive_demo(&q, &key, "alice").await else {
        panic!("issued after Bob opened the link");
    };
    assert_eq!(again.reason.as_deref(), Some("connect_required"));

    // 3. Alice opens it, connects at the demo service (its own page, marked
    //    as a demo, with its two accounts), picks hers and allows.
    let mut steps = alice_connects_steps(&q, &link, &alice_pw);
    steps.extend([
        json!({"goto": format!("{}/account", q.issuer)}),
        json!({"expect_text": "alice.demo"}),
    ]);
    b.steps("alice", json!(steps)).await;
    b.finish().await;
    let listed = accounts_of(&q, "alice");
    assert_eq!(listed["accounts"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(accounts_of(&q, "bob")["accounts"], json!([]));

    // 4. The retry is issued: the demo service's own token, which jose
    //    verifies against the demo's JWKS and the demo API accepts.
    let Answer::Issued(t) = derive_demo(&q, &key, "alice").await else {
        panic!("the retry after connecting was refused");
    };
    assert_eq!(t.scope, "notes:read");
    let v = jose(
        "verify-token",
        json!({
            "token": t.access_token.expose(), "issuer": q.demo, "audience": q.demo_api(),
            "jwks_uri": format!("{}/jwks", q.demo),
            "required_claims": ["iss", "sub", "aud", "exp", "iat", "jti", "client_id", "scope"],
        }),
    )
    .await
    .unwrap_or_else(|e| panic!("jose refused the demo token: {e}"));
    assert_eq!(v["claims"]["sub"], "1001", "Alice's demo account");
    assert_eq!(v["claims"]["client_id"], "credbroker-quickstart");
    let http = reqwest::Client::new();
    let notes = http
        .get(format!("{}/notes", q.demo_api()))
        .bearer_auth(t.access_token.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(notes.status(), 200);
    let notes: serde_json::Value = notes.json().await.unwrap();
    assert_eq!(notes["account"], "alice.demo");
    // Negative, then its control above: the demo API takes only its own
    // tokens, so a token the broker minted for another resource is refused.
    let own = Client::new(q.socket(), &q.issuer)
        .derive(
            &DeriveParams {
                subject_token: &q.subject_token("alice"),
                step: "summarize",
                tool: "notes.read",
                resource: RESOURCE,
                scope: None,
            },
            &key,
        )
        .await
        .unwrap();
    let Answer::Issued(minted) = own else {
        panic!("notes.read refused")
    };
    let refused = http
        .get(format!("{}/notes", q.demo_api()))
        .bearer_auth(minted.access_token.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Bob's own agent still gets a link for Bob: Alice's account is hers.
    let Answer::Refused(for_bob) = derive_demo(&q, &key, "bob").await else {
        panic!("Bob was issued a token of Alice's account");
    };
    assert_eq!(for_bob.reason.as_deref(), Some("connect_required"));
}
