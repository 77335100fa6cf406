//! The quick start's demo connect flow end to end, in Chromium, against the
//! real `credbroker quickstart` binary and its built-in demo service: the
//! demo tool is refused with a connect link; Bob opening Alice's link
//! changes nothing; Alice connects her demo account; the retry is issued
//! a credbroker token for the broker's proxy (it verifies in npm `jose`),
//! and the tool's call through the proxy is served the demo notes, while
//! the demo service's own token appears in no answer, log or event; then
//! disconnecting revokes the grant at the demo service.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use credbroker::client::{Answer, Client, DeriveParams};
use credbroker::internals::jose::Es256Key;
use serde_json::json;

use crate::support::browser::Browsers;
use crate::support::quickstart::{
    alice_connects_steps, bob_opens_steps, sign_in_steps, Quickstart,
};
use crate::support::*;

async fn derive_demo(q: &Quickstart, key: &Es256Key, sub: &str) -> Answer {
    Client::new(q.socket(), &q.issuer)
        .derive(
            &DeriveParams {
                subject_token: &q.subject_token(sub),
                step: "summarize",
                tool: "demo.notes",
                resource: &q.demo_proxy(),
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
    accounts(q, &["list", "--person", person]).1
}

/// `credbroker accounts ARGS` on the quick start's config, which must
/// succeed: what it printed, as text and as JSON.
fn accounts(q: &Quickstart, args: &[&str]) -> (String, serde_json::Value) {
    let config = q.config();
    let mut all = vec!["accounts", args[0], "--config", config.to_str().unwrap()];
    all.extend_from_slice(&args[1..]);
    let (code, out, err) = q.cli(&all);
    assert_eq!(code, 0, "accounts {args:?}: {out}{err}");
    let json = serde_json::from_str(&out).unwrap_or_else(|_| panic!("accounts printed {out}"));
    (out, json)
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
    // The page tells whoever meant another account to sign out and open
    // the link again: signing out there offers that way back.
    steps.extend([
        json!({"click": "form[action='/signout'] button[type=submit]"}),
        json!({"expect_text": "You are signed out"}),
        json!({"expect_text": "Sign in and open the link again"}),
    ]);
    b.steps("bob", json!(steps)).await;
    assert_eq!(accounts_of(&q, "bob")["accounts"], json!([]));
    assert_eq!(accounts_of(&q, "alice")["accounts"], json!([]));
    assert_eq!(q.events("connect.opened_by_other_person").len(), 1);
    // Still refused with a link, since nothing changed.
    let Answer::Refused(again) = derive_demo(&q, &key, "alice").await else {
        panic!("issued after Bob opened the link");
    };
    assert_eq!(again.reason.as_deref(), Some("connect_required"));

    // 3. Alice opens it and signs in, then signs out on the link's page
    //    (issue 39: the signed-out page offered no way back): the page
    //    leads back through the sign-in to the link. She signs in again,
    //    connects at the demo service (its own page, marked as a demo, with
    //    its two accounts), picks hers and allows; the end page names the
    //    service, her account there and the agent.
    let connect = alice_connects_steps(&q, &link, &alice_pw);
    assert_eq!(connect[0], json!({"goto": link}));
    let mut steps = vec![json!({"goto": link})];
    steps.extend(sign_in_steps("alice", &alice_pw));
    steps.extend([
        json!({"expect_url": link}),
        json!({"click": "form[action='/signout'] button[type=submit]"}),
        json!({"expect_text": "You are signed out"}),
        json!({"screenshot": "quickstart-signed-out-way-back"}),
        json!({"click": "a:has-text('Sign in and open the link again')"}),
        json!({"expect_url": format!("{}/signin?return_to=%2Fconnect%2F", q.issuer)}),
    ]);
    // From the sign-in on, as the README's walkthrough goes.
    steps.extend(connect.into_iter().skip(1));
    steps.extend([
        json!({"expect_text": "Your Demo service account alice.demo is connected, and repo-helper may use it."}),
        json!({"screenshot": "quickstart-connected-names-what"}),
        json!({"goto": format!("{}/account", q.issuer)}),
        json!({"expect_text": "alice.demo"}),
    ]);
    b.steps("alice", json!(steps)).await;
    b.finish().await;
    let listed = accounts_of(&q, "alice");
    assert_eq!(listed["accounts"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(accounts_of(&q, "bob")["accounts"], json!([]));

    // 4. The retry is issued: not the demo service's token but a
    //    credbroker token for the proxy, bound to the tool's key, which
    //    jose verifies against the broker's keys.
    let Answer::Issued(t) = derive_demo(&q, &key, "alice").await else {
        panic!("the retry after connecting was refused");
    };
    assert_eq!(t.scope, "notes:read");
    assert_eq!(t.token_type, "DPoP");
    assert_eq!(t.sender_constrained, None, "a DPoP-bound token");
    let at = t.access_token.expose().to_string();
    let v = jose(
        "verify-token",
        json!({"token": at, "issuer": q.issuer, "audience": q.demo_proxy()}),
    )
    .await
    .unwrap_or_else(|e| panic!("jose refused the proxy token: {e}"));
    assert_eq!(v["claims"]["act"]["tool"], "demo.notes");
    assert_eq!(v["claims"]["act"]["step"], "summarize");
    assert_eq!(v["claims"]["cnf"]["jkt"], key.thumbprint());
    q.assert_no_demo_token(&at, "the derive answer's token");

    // 5. The tool's call through the proxy, with a fresh proof for exactly
    //    this method and URL: served the notes of Alice's demo account.
    let http = reqwest::Client::new();
    let url = format!("{}/api/notes", q.demo_proxy());
    let call = |proof: String, scheme: &'static str| {
        http.get(&url)
            .header("authorization", format!("{scheme} {at}"))
            .header("dpop", proof)
            .send()
    };
    let proof = || credbroker::client::proof(&key, "GET", &url, Some(&at)).unwrap();
    let served = call(proof(), "DPoP").await.unwrap();
    assert_eq!(served.status(), 200);
    let headers = format!("{:?}", served.headers());
    let body = served.text().await.unwrap();
    let notes: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(notes["account"], "alice.demo", "{body}");
    q.assert_no_demo_token(&headers, "the proxied answer's headers");
    q.assert_no_demo_token(&body, "the proxied answer's body");

    // Negatives, each with its control after: the same token as a bearer
    // token is refused by the proxy; another call than the tool's route is
    // refused; the token is useless at the demo API itself, which takes
    // only its own tokens.
    let bearer = http.get(&url).bearer_auth(&at).send().await.unwrap();
    assert_eq!(bearer.status(), 401);
    let me = format!("{}/api/me", q.demo_proxy());
    let other = http
        .get(&me)
        .header("authorization", format!("DPoP {at}"))
        .header(
            "dpop",
            credbroker::client::proof(&key, "GET", &me, Some(&at)).unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 403);
    let other: serde_json::Value = other.json().await.unwrap();
    assert_eq!(other["reason"], "route_not_allowed", "{other}");
    let direct = http
        .get(format!("{}/notes", q.demo_api()))
        .bearer_auth(&at)
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 401);
    assert_eq!(call(proof(), "DPoP").await.unwrap().status(), 200);

    // The whole answer as the CLI prints it, the quick start's log and its
    // audit log: no demo token anywhere. The detector's own control: a JWT
    // with the demo's issuer is found.
    let (code, out, err) = q.cli(&[
        "derive",
        "--socket",
        q.socket().to_str().unwrap(),
        "--issuer",
        &q.issuer,
        "--subject-token",
        &q.subject_token("alice"),
        "--step",
        "summarize",
        "--tool",
        "demo.notes",
        "--resource",
        &q.demo_proxy(),
        "--dpop-key",
        "tool-key.pem",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("access_token"), "{out}");
    q.assert_no_demo_token(&out, "the CLI's derive answer");
    q.assert_no_demo_token(&q.printed(), "the quick start's log");
    let audit = std::fs::read_to_string(q.dir.join("data/audit.jsonl")).unwrap();
    q.assert_no_demo_token(&audit, "the audit log");
    let forged = key
        .sign_jws(
            serde_json::Map::new(),
            &json!({"iss": q.demo, "sub": "1001"}),
        )
        .unwrap();
    assert_eq!(
        crate::support::quickstart::jwts_issued_by(&format!("x {forged} y"), &q.demo),
        1
    );
    let served: Vec<_> = q
        .events("proxy.request")
        .into_iter()
        .filter(|e| e["tool"] == "demo.notes")
        .collect();
    assert_eq!(served.len(), 2, "the two allowed calls: {served:?}");

    // Bob's own agent still gets a link for Bob: Alice's account is hers.
    let Answer::Refused(for_bob) = derive_demo(&q, &key, "bob").await else {
        panic!("Bob was issued a token of Alice's account");
    };
    assert_eq!(for_bob.reason.as_deref(), Some("connect_required"));

    // Disconnecting revokes at the demo service (RFC 7009), which keeps
    // the revoked grant in the quick start's directory; then the tool is
    // back to a connect link.
    let revoked_file = q.dir.join("data/demo-revoked-grants");
    assert!(!revoked_file.exists(), "nothing revoked before");
    let (out, report) = accounts(
        &q,
        &["disconnect", "--person", "alice", "--service", "demo"],
    );
    assert_eq!(report["revocation"], "revoked", "{report}");
    assert_eq!(report["deleted"], true, "{report}");
    let grants = std::fs::read_to_string(&revoked_file).unwrap();
    assert_eq!(grants.lines().count(), 1, "{grants}");
    q.assert_no_demo_token(&out, "the disconnect report");
    let Answer::Refused(after) = derive_demo(&q, &key, "alice").await else {
        panic!("issued after the account was disconnected");
    };
    assert_eq!(after.reason.as_deref(), Some("connect_required"));
}
