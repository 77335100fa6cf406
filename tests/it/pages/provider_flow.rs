//! The provider flow and the account page over HTTP, with local accounts,
//! against an instance running in this process (fake connected-services
//! side, movable clock): the callback's checks, the allow link, disconnect
//! and revoke, an answer for another account.
//!
//! Security cases: C4, C6, C6b, C7, C8 (docs/SECURITY-CASES.md).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use super::http::{signed_in, PW};
use crate::support::pages::*;
use credbroker::internals::pages::links::LinkKind;

/// The provider flow: C7 (state missing, foreign, reused; verifier
/// mismatch), C8 (mix-up: wrong redirect URI, wrong `iss`), then the
/// positive control end to end, and C4 (the used code is the 404 page).
#[tokio::test]
async fn provider_flow_refuses_bad_state_and_mix_up_then_connects() {
    let s = PagesServer::start().await;
    s.add_user("alice", PW);
    s.add_user("bob", PW);
    let alice = s.person("alice");
    let (code, id) = s
        .fake
        .issue(&alice, "github", LinkKind::Connect, &["repo"], now());
    let link = format!("/connect/{code}");
    let c = s.client();
    sign_in(&s, &c, &link, "alice", PW).await;

    // Starts a provider flow; returns (state, redirect_uri).
    async fn start(s: &PagesServer, c: &reqwest::Client, link: &str) -> (String, String) {
        let html = c
            .get(s.url(link))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let csrf = csrf_of(&html);
        let r = c
            .post(s.url(link))
            .form(&[("csrf", csrf.as_str()), ("action", "connect")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303);
        let to = url::Url::parse(&location(&r)).unwrap();
        assert!(to.as_str().starts_with(&s.fake.provider_base), "{to}");
        let q: std::collections::HashMap<String, String> = to.query_pairs().into_owned().collect();
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["code_challenge"].len(), 43);
        (q["state"].clone(), q["redirect_uri"].clone())
    }
    let cb = |service: &str, params: &[(&str, &str)]| {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        s.url(&format!("/callback/{service}?{q}"))
    };
    let iss = format!("{}/github", s.fake.provider_base);

    let (state, redirect_uri) = start(&s, &c, &link).await;
    assert_eq!(
        redirect_uri,
        s.url("/callback/github"),
        "one redirect URI per provider"
    );
    let pcode = s.fake.approve(&state).unwrap();
    // Missing state; unknown state.
    for params in [
        vec![("code", pcode.as_str()), ("iss", iss.as_str())],
        vec![
            ("code", pcode.as_str()),
            ("state", "A".repeat(43).leak()),
            ("iss", iss.as_str()),
        ],
    ] {
        let r = c.get(cb("github", &params)).send().await.unwrap();
        assert_eq!(r.status(), 400);
    }
    // Foreign state: Bob's browser presents Alice's state (a stolen
    // callback URL). The state is spent; nothing is connected.
    let bob = signed_in(&s, "bob").await;
    let r = bob
        .get(cb(
            "github",
            &[("code", &pcode), ("state", &state), ("iss", &iss)],
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .get(cb(
            "github",
            &[("code", &pcode), ("state", &state), ("iss", &iss)],
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "reused state");
    assert_eq!(s.fake.exchanges(), 0, "no exchange for a bad state");

    // Each row: a fresh GitHub flow, approved at the provider, answered on
    // `service`'s callback with `iss` (or none); each is refused before the
    // code is exchanged.
    for (what, service, iss) in [
        (
            "mix-up: a GitHub flow on GitLab's redirect URI",
            "gitlab",
            None,
        ),
        (
            "RFC 9207: iss of another issuer",
            "github",
            Some("https://evil.example"),
        ),
        (
            "RFC 9207: no iss from a provider that always sends it",
            "github",
            None,
        ),
    ] {
        let (state, _) = start(&s, &c, &link).await;
        let pcode = s.fake.approve(&state).unwrap();
        let mut params = vec![("code", pcode.as_str()), ("state", state.as_str())];
        params.extend(iss.map(|i| ("iss", i)));
        let r = c.get(cb(service, &params)).send().await.unwrap();
        assert_eq!(r.status(), 400, "{what}");
    }
    assert_eq!(s.fake.exchanges(), 0);

    // Verifier mismatch: a code issued for flow A presented with the state of
    // flow B (whose verifier does not match A's challenge).
    let (state_a, _) = start(&s, &c, &link).await;
    let (state_b, _) = start(&s, &c, &link).await;
    let code_a = s.fake.approve(&state_a).unwrap();
    let r = c
        .get(cb(
            "github",
            &[("code", &code_a), ("state", &state_b), ("iss", &iss)],
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(s.fake.exchanges(), 1);
    assert!(
        s.fake.accounts_of(&alice).is_empty(),
        "nothing connected so far"
    );
    assert_eq!(s.fake.link_state(&id), LinkState::Open);

    // The person says no at the provider: nothing connected, link open.
    let (state, _) = start(&s, &c, &link).await;
    let r = c
        .get(cb(
            "github",
            &[("error", "access_denied"), ("state", &state), ("iss", &iss)],
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.fake.link_state(&id), LinkState::Open);

    // Positive control: the whole flow.
    s.fake.set_next_account("583231", "octo-alice");
    let (state, _) = start(&s, &c, &link).await;
    let pcode = s.fake.approve(&state).unwrap();
    let r = c
        .get(cb(
            "github",
            &[("code", &pcode), ("state", &state), ("iss", &iss)],
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        location(&r),
        "/done/connected/github",
        "the code leaves the address bar"
    );
    let accts = s.fake.accounts_of(&alice);
    assert_eq!(accts.len(), 1);
    assert_eq!(accts[0].display_name, "octo-alice");
    assert_eq!(accts[0].allowances[0].agent, AGENT);
    assert_eq!(accts[0].allowances[0].scopes, ["repo"]);
    assert_eq!(s.fake.link_state(&id), LinkState::Closed);
    let done = c
        .get(s.url("/done/connected/github"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Issue 39: the end page names the service, the account and the agent.
    assert!(done.contains("Go back to your agent"), "{done}");
    assert!(
        done.contains(&format!(
            "Your GitHub account octo-alice is connected, and {AGENT} may use it."
        )),
        "{done}"
    );
    // From the person's own records only: the same address in a browser
    // without her session names no account.
    let anonymous = s
        .client()
        .get(s.url("/done/connected/github"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!anonymous.contains("octo-alice"), "{anonymous}");
    assert!(anonymous.contains("Go back to your agent"), "{anonymous}");
    let ev = s.events("connect.completed");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["connect_id"], id.as_str());
    // C4: the used code is now the 404 page.
    assert_eq!(c.get(s.url(&link)).send().await.unwrap().status(), 404);
    // The account page lists it by its name at the provider.
    let html = c
        .get(s.url("/account"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("GitHub: octo-alice"), "{html}");
    // Nothing secret in events.
    let audit = std::fs::read_to_string(s.dir.path().join("data/audit.jsonl")).unwrap();
    for canary in [
        "gho_canary_access",
        "ghr_canary_refresh",
        pcode.as_str(),
        code.as_str(),
        state.as_str(),
        PW,
    ] {
        assert!(!audit.contains(canary), "audit leaks a secret");
    }
}

#[tokio::test]
async fn allow_link_offers_only_the_persons_own_accounts() {
    let s = PagesServer::start().await;
    s.add_user("alice", PW);
    let alice = s.person("alice");
    let bob = s.person("bob");
    s.fake
        .add_account(&alice, "github", "1001", "octo-alice", &[]);
    s.fake
        .add_account(&alice, "github", "1002", "alice-work", &[]);
    s.fake.add_account(&bob, "github", "2001", "octo-bob", &[]);
    let (code, id) = s
        .fake
        .issue(&alice, "github", LinkKind::Allow, &["repo"], now());
    let link = format!("/connect/{code}");
    let c = s.client();
    sign_in(&s, &c, &link, "alice", PW).await;
    let html = c
        .get(s.url(&link))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("octo-alice") && html.contains("alice-work"));
    assert!(!html.contains("octo-bob"));
    let csrf = csrf_of(&html);
    // Bob's account id in the form: refused, nothing allowed.
    let r = c
        .post(s.url(&link))
        .form(&[
            ("csrf", csrf.as_str()),
            ("action", "allow"),
            ("account", "2001"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(s.fake.accounts_of(&bob)[0].allowances.is_empty());
    // An action the kind does not offer.
    let r = c
        .post(s.url(&link))
        .form(&[("csrf", csrf.as_str()), ("action", "reconnect")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(s.fake.link_state(&id), LinkState::Open);
    // Positive control.
    let r = c
        .post(s.url(&link))
        .form(&[
            ("csrf", csrf.as_str()),
            ("action", "allow"),
            ("account", "1002"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/done/allowed/github");
    let a = s.fake.accounts_of(&alice);
    assert!(
        a.iter()
            .find(|x| x.account_id == "1002")
            .unwrap()
            .allowances[0]
            .agent
            == AGENT
    );
    assert!(a
        .iter()
        .find(|x| x.account_id == "1001")
        .unwrap()
        .allowances
        .is_empty());
    assert_eq!(s.fake.link_state(&id), LinkState::Closed);
}

#[tokio::test]
async fn account_page_lists_accounts_and_disconnects_and_revokes() {
    let s = PagesServer::start().await;
    s.add_user("alice", PW);
    let alice = s.person("alice");
    s.fake.add_account(
        &alice,
        "github",
        "1001",
        "octo-alice",
        &[(AGENT, &["repo", "read:user"]), ("triage-bot", &["issues"])],
    );
    s.fake
        .add_account(&alice, "gitlab", "77", "alice@gitlab", &[(AGENT, &[])]);
    s.fake.add_account(
        &s.person("bob"),
        "github",
        "2001",
        "octo-bob",
        &[(AGENT, &["repo"])],
    );
    // A name at the provider is not ours to trust: it is escaped.
    s.fake
        .add_account(&alice, "github", "1003", "<script>alert(1)</script>", &[]);
    let c = signed_in(&s, "alice").await;
    let html = c
        .get(s.url("/account"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "GitHub: octo-alice",
        "GitLab: alice@gitlab",
        "repo-helper",
        "triage-bot",
        "<code>read:user</code>",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    assert!(!html.contains("octo-bob"), "only her own accounts");
    assert!(!html.contains("<script"), "escaped");
    assert!(html.contains("&#60;script&#62;alert(1)&#60;/script&#62;"));
    let csrf = csrf_of(&html);
    // Someone else's account: refused.
    let r = c
        .post(s.url("/account/disconnect"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("service", "github"),
            ("account", "2001"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(s.fake.accounts_of(&s.person("bob")).len(), 1);
    // Revoke one agent.
    let r = c
        .post(s.url("/account/revoke"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("service", "github"),
            ("account", "1001"),
            ("agent", "triage-bot"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/account");
    let gh = s
        .fake
        .accounts_of(&alice)
        .into_iter()
        .find(|a| a.service == "github")
        .unwrap();
    assert_eq!(gh.allowances.len(), 1);
    assert_eq!(gh.allowances[0].agent, AGENT);
    assert_eq!(s.events("allowance.revoked")[0]["agent"], "triage-bot");
    // Disconnect asks first: nothing changes on one click.
    let r = c
        .post(s.url("/account/disconnect"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("service", "github"),
            ("account", "1001"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(html.contains("Disconnect GitHub: octo-alice?"), "{html}");
    assert!(html.contains("name=\"confirm\" value=\"1\""));
    assert!(s.fake.revoked_at_provider().is_empty(), "not yet");
    assert!(s.events("account.disconnected").is_empty());
    assert!(s
        .fake
        .accounts_of(&alice)
        .iter()
        .any(|a| a.account_id == "1001"));
    // Confirmed: revoked at the provider, and the page says so.
    let r = c
        .post(s.url("/account/disconnect"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("service", "github"),
            ("account", "1001"),
            ("confirm", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("Disconnected, and revoked at GitHub"),
        "{html}"
    );
    assert!(
        html.contains("GitHub revoked credbroker&#39;s access to octo-alice")
            || html.contains("GitHub revoked credbroker&#x27;s access to octo-alice")
            || html.contains("GitHub revoked credbroker's access to octo-alice"),
        "{html}"
    );
    assert_eq!(s.fake.revoked_at_provider(), ["1001"]);
    assert!(s
        .fake
        .accounts_of(&alice)
        .iter()
        .all(|a| a.account_id != "1001"));
    // A provider that cannot revoke: the page says to remove it there too.
    let r = c
        .post(s.url("/account/disconnect"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("service", "gitlab"),
            ("account", "77"),
            ("confirm", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("also remove the access in your GitLab settings"));
    let reasons: Vec<_> = s
        .events("account.disconnected")
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(reasons, ["revoked_at_provider", "deleted_not_revoked"]);
    assert!(s
        .fake
        .accounts_of(&alice)
        .iter()
        .all(|a| a.account_id != "77"));
    let r = c
        .post(s.url("/account/disconnect"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("service", "github"),
            ("account", "1003"),
            ("confirm", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = c
        .get(s.url("/account"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("You have no connected accounts"));
}

/// A connect link finishes after an account was connected meanwhile (from
/// another link, another agent): the provider's answer is for another
/// account, so nothing replaces the connected one. The grant that came
/// back is revoked, the link stays open, and the page names the connected
/// account. Then the same account comes back and is accepted.
#[tokio::test]
async fn provider_answer_for_another_account_does_not_replace_the_connected_one() {
    let s = PagesServer::start().await;
    s.add_user("alice", PW);
    let alice = s.person("alice");
    let (code, id) = s
        .fake
        .issue(&alice, "github", LinkKind::Connect, &["repo"], now());
    let link = format!("/connect/{code}");
    let c = s.client();
    sign_in(&s, &c, &link, "alice", PW).await;
    s.fake.add_account(
        &alice,
        "github",
        "1001",
        "octo-alice",
        &[("other-agent", &["repo"])],
    );
    let iss = format!("{}/github", s.fake.provider_base);
    let finish = |account: (&'static str, &'static str)| {
        let c = c.clone();
        let s = &s;
        let link = link.clone();
        let iss = iss.clone();
        async move {
            s.fake.set_next_account(account.0, account.1);
            let html = c
                .get(s.url(&link))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let r = c
                .post(s.url(&link))
                .form(&[("csrf", csrf_of(&html).as_str()), ("action", "connect")])
                .send()
                .await
                .unwrap();
            let to = url::Url::parse(&location(&r)).unwrap();
            let q: std::collections::HashMap<String, String> =
                to.query_pairs().into_owned().collect();
            let pcode = s.fake.approve(&q["state"]).unwrap();
            let back = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs([
                    ("code", pcode.as_str()),
                    ("state", &q["state"]),
                    ("iss", &iss),
                ])
                .finish();
            c.get(s.url(&format!("/callback/github?{back}")))
                .send()
                .await
                .unwrap()
        }
    };
    let r = finish(("2002", "octo-other")).await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        location(&r),
        "/done/other-account/github",
        "the code leaves the address bar"
    );
    let page = c
        .get(s.url("/done/other-account/github"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 409);
    let html = page.text().await.unwrap();
    assert!(
        html.contains("This is not your connected GitHub account"),
        "{html}"
    );
    assert!(
        html.contains("Your connected GitHub account is octo-alice."),
        "{html}"
    );
    let accts = s.fake.accounts_of(&alice);
    assert_eq!(accts.len(), 1);
    assert_eq!(
        accts[0].account_id, "1001",
        "the connected account is untouched"
    );
    assert_eq!(accts[0].allowances.len(), 1);
    assert_eq!(accts[0].allowances[0].agent, "other-agent");
    assert_eq!(
        s.fake.revoked_at_provider(),
        ["2002"],
        "the refused grant is revoked"
    );
    assert_eq!(s.fake.link_state(&id), LinkState::Open);
    let ev = s.events("connect.different_account");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["connect_id"], id.as_str());
    assert_eq!(ev[0]["reason"], "connect");
    // The page names nothing from the address: another service's page
    // is the 404 page, and without a session no account is named.
    assert_eq!(
        c.get(s.url("/done/other-account/nope"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let anonymous = s
        .client()
        .get(s.url("/done/other-account/github"))
        .send()
        .await
        .unwrap();
    assert!(!anonymous.text().await.unwrap().contains("octo-alice"));

    // Positive control: the connected account comes back; it is kept, and
    // this agent is allowed too.
    let r = finish(("1001", "octo-alice")).await;
    assert_eq!(location(&r), "/done/connected/github");
    let accts = s.fake.accounts_of(&alice);
    assert_eq!(accts.len(), 1);
    assert_eq!(accts[0].account_id, "1001");
    assert_eq!(s.fake.link_state(&id), LinkState::Closed);
}
