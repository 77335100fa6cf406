//! Issue 6, "How it is checked", end to end in a real browser: Debian's
//! chromium driven by npm `playwright-core` (one fresh profile per person),
//! panva's `oidc-provider` started twice (tests/peers/oidc-provider.mjs as
//! the organisation's IdP, whose access tokens are the agent's subject
//! tokens and whose sign-in the pages pair with that issuer;
//! tests/peers/oauth-service.mjs as the third-party service "Acme"), and
//! the broker, all on loopback.
//!
//! - the organisation's IdP, real binary: (c) Alice's link in Mallory's
//!   browser, (a) Alice connects, (b) Mallory's link forwarded to Alice;
//!   then (f) the account page and disconnect, (e) a replaced link, and
//!   (d) an IdP sign-in older than 15 minutes (the IdP records the sign-in
//!   as made 16 minutes ago: `age_next_login` in oidc-provider.mjs, so the
//!   real binary runs on the real clock and the ID token's `auth_time` is
//!   what is old, as it is when a person's IdP session is old);
//! - local accounts, the quick-start files served by the real binary: (c),
//!   (a), (b), (f), (e);
//! - local accounts in-process (tests/it/support/pages.rs with the real
//!   connected-services side), where the pages' clock can be moved: (d) a
//!   local sign-in older than 15 minutes, (e) an expired code, and a
//!   reconnect that comes back with another account at the provider.
//!
//! Every negative is followed by its positive control. Needs chromium and
//! the npm peers (`scripts/install-test-deps`); without them these tests
//! fail, they are not skipped. Screenshots go to `$CREDBROKER_SCREENSHOTS`
//! when set (docs/screenshots were made so), else to a temp dir.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::browser::{idp_sign_in, local_sign_in, Browsers};
use crate::support::oidc::OrgIdp;
use crate::support::services::{issued, refused, ProviderOpts, ServiceEnv, SERVICE};
use crate::support::{free_loopback_addr, key};
use credbroker::client::{Answer, DeriveParams, Refusal};
use credbroker::internals::jose::Es256Key;
use serde_json::{json, Value};

const ALICE_PW: &str = "alice's own password";
const MALLORY_PW: &str = "mallory's own password";

// ---------------------------------------------------------------- helpers

fn link_of(r: &Refusal, reason: &str) -> (String, String) {
    assert_eq!(r.reason.as_deref(), Some(reason), "{r:?}");
    (
        r.connect_uri.clone().unwrap(),
        r.connect_id.clone().unwrap(),
    )
}

fn events(env: &ServiceEnv, name: &str) -> Vec<Value> {
    env.broker
        .audit_lines()
        .into_iter()
        .filter(|e| e["event"] == name)
        .collect()
}

/// A code of the right shape that no link has.
fn unknown_code() -> String {
    credbroker::internals::jose::b64e(&crate::support::random_bytes(32))
}

fn cat(parts: &[Vec<Value>]) -> Value {
    Value::Array(parts.concat())
}

/// The organisation's IdP plus the service and the broker, which trusts
/// the IdP's access tokens and signs people in there.
struct OrgWorld {
    env: ServiceEnv,
    idp: OrgIdp,
    issuer: String,
    base: String,
    tokens: std::collections::HashMap<String, String>,
}

impl OrgWorld {
    fn start() -> OrgWorld {
        let addr = free_loopback_addr();
        let base = format!("http://{addr}");
        let org = OrgIdp::start(&base, &[("alice", ALICE_PW), ("mallory", MALLORY_PW)]);
        let env = ServiceEnv::start_with(ProviderOpts {
            public_listen: Some(addr),
            extra_config: org.config.clone(),
            ..ProviderOpts::default()
        });
        OrgWorld {
            env,
            issuer: org.issuer.clone(),
            tokens: org.tokens.clone(),
            idp: org,
            base,
        }
    }

    /// The agent of `who` asks for the Acme tool.
    async fn derive(&self, k: &Es256Key, who: &str) -> Answer {
        self.env
            .broker
            .derive(k, &self.tokens[who], "triage", "acme.issues", SERVICE, None)
            .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

fn assert_opened_by_other(env: &ServiceEnv, id: &str, person: &str, opener: &str) {
    let ev: Vec<Value> = events(env, "connect.opened_by_other_person")
        .into_iter()
        .filter(|e| e["connect_id"] == id)
        .collect();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["person_sub"], person);
    assert_eq!(ev[0]["opener_sub"], opener);
    assert_eq!(ev[0]["service"], "acme");
}

// ------------------------------------------------ the organisation's IdP

/// (c), (a), (b) with sign-in at the organisation's IdP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_idp_forwarded_links_change_nothing_then_each_person_connects() {
    let w = OrgWorld::start();
    let mut b = Browsers::start().await;
    let k = key();
    let idp = w.issuer.clone();

    // Alice's agent asks; no account yet: a link, recorded once.
    let (alice_link, alice_id) = link_of(&refused(w.derive(&k, "alice").await), "connect_required");
    let issued_ev = events(&w.env, "connect.link_issued");
    assert_eq!(issued_ev.len(), 1);
    assert_eq!(issued_ev[0]["connect_id"], alice_id.as_str());
    assert_eq!(issued_ev[0]["person_iss"], idp.as_str());
    assert_eq!(issued_ev[0]["person_sub"], "alice");

    // (c) Alice's link opened in Mallory's browser: she cannot sign in as
    // Alice at the IdP; signed in as herself she gets the refusal page.
    let mut c = vec![
        json!({"goto": alice_link}),
        json!({"expect_url": w.url("/signin?return_to=")}),
    ];
    c.extend([
        json!({"click": "a.button[href^='/signin/oidc']"}),
        json!({"expect_url": format!("{idp}/interaction/")}),
        json!({"fill": "input[name=login]", "value": "alice"}),
        json!({"fill": "input[name=password]", "value": "a guess at alice's password"}),
        json!({"click": "button[type=submit]"}),
        json!({"expect_url": format!("{idp}/interaction/")}),
        json!({"expect_text": "Invalid login or password"}),
        json!({"fill": "input[name=login]", "value": "mallory"}),
        json!({"fill": "input[name=password]", "value": MALLORY_PW}),
        json!({"click": "button[type=submit]"}),
        json!({"click_if": "input[name=prompt][value=consent] ~ button[type=submit]"}),
        json!({"expect_status": 403}),
        json!({"expect_text": "This link was made for another account"}),
        json!({"expect_text": "You are signed in as mallory"}),
        json!({"expect_no_text": "alice"}),
    ]);
    b.steps("mallory", Value::Array(c)).await;
    assert_opened_by_other(&w.env, &alice_id, "alice", "mallory");
    // Nothing connected: the same link, still open; the provider never
    // gave out a code.
    let again = refused(w.derive(&k, "alice").await);
    assert_eq!(link_of(&again, "connect_required").1, alice_id);
    assert_eq!(w.env.peer.stats().await["authorization_code"], 0);
    // The only sign-in was Mallory's own, at the IdP.
    let sign_ins = events(&w.env, "signin.succeeded");
    assert_eq!(sign_ins.len(), 1, "{sign_ins:?}");
    assert_eq!(sign_ins[0]["person_sub"], "mallory");
    assert_eq!(sign_ins[0]["person_iss"], idp.as_str());

    // (a) Positive control: Alice opens her link, signed in as herself.
    w.env.peer.set_browser_account("octo-alice").await;
    let a = cat(&[
        vec![
            json!({"goto": alice_link}),
            json!({"expect_url": w.url("/signin?return_to=")}),
        ],
        idp_sign_in(&idp, "alice", ALICE_PW),
        vec![
            // A fresh sign-in goes straight to the page (check 4 passes).
            json!({"expect_url": alice_link}),
            json!({"expect_text": "Connect Acme for repo-helper"}),
            json!({"expect_text": "The agent repo-helper asks to use your Acme account"}),
            json!({"expect_text": "alice"}),
            json!({"screenshot": "e2e-org-connect"}),
            json!({"click": "button[value=connect]"}),
            json!({"expect_url": w.url("/done/connected")}),
            json!({"expect_text": "Go back to your agent"}),
            json!({"screenshot": "e2e-org-done"}),
            // Single use: the code is closed.
            json!({"goto": alice_link}),
            json!({"expect_status": 404}),
        ],
    ]);
    b.steps("alice", a).await;
    let alice_token = issued(w.derive(&k, "alice").await);
    assert_eq!(alice_token.token_type.to_lowercase(), "bearer");
    assert_eq!(alice_token.sender_constrained, Some(false));
    assert!(
        w.env
            .peer
            .access_token_live(alice_token.access_token.expose())
            .await,
        "the agent got a live Acme token"
    );
    let done: Vec<Value> = events(&w.env, "connect.completed");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["connect_id"], alice_id.as_str());

    // (b) Mallory's link forwarded to Alice, who is signed in.
    let (mallory_link, mallory_id) =
        link_of(&refused(w.derive(&k, "mallory").await), "connect_required");
    b.steps(
        "alice",
        json!([
            {"goto": mallory_link},
            {"expect_status": 403},
            {"expect_text": "This link was made for another account"},
            {"expect_text": "You are signed in as alice"},
            {"expect_no_text": "mallory"},
            {"screenshot": "e2e-org-other-person"},
        ]),
    )
    .await;
    assert_opened_by_other(&w.env, &mallory_id, "mallory", "alice");
    let still = refused(w.derive(&k, "mallory").await);
    assert_eq!(link_of(&still, "connect_required").1, mallory_id);
    assert_eq!(
        w.env.peer.stats().await["authorization_code"],
        1,
        "only Alice's"
    );

    // Afterwards the link still works for Mallory (signed in since (c)).
    w.env.peer.set_browser_account("octo-mallory").await;
    b.steps(
        "mallory",
        json!([
            {"goto": mallory_link},
            {"expect_url": mallory_link},
            {"expect_text": "Connect Acme for repo-helper"},
            {"click": "button[value=connect]"},
            {"expect_url": w.url("/done/connected")},
        ]),
    )
    .await;
    let mallory_token = issued(w.derive(&k, "mallory").await);
    assert_ne!(
        mallory_token.access_token.expose(),
        alice_token.access_token.expose()
    );
    let (status, body) = w.env.broker.admin_get("/accounts").unwrap();
    assert_eq!(status, 200);
    let accounts: Value = serde_json::from_str(&body).unwrap();
    let mut pairs: Vec<(String, String)> = accounts
        .as_array()
        .or_else(|| accounts["accounts"].as_array())
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["person_sub"].as_str().unwrap().to_string(),
                a["account_name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        [
            ("alice".to_string(), "octo-alice".to_string()),
            ("mallory".to_string(), "octo-mallory".to_string())
        ]
    );
    // Alice's agent still gets her own token.
    issued(w.derive(&k, "alice").await);
    b.finish().await;
}

/// (f), (e) and (d) with sign-in at the organisation's IdP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_idp_account_page_disconnect_replaced_link_and_stale_idp_sign_in() {
    let mut w = OrgWorld::start();
    let mut b = Browsers::start().await;
    let k = key();
    let idp = w.issuer.clone();
    w.env.peer.set_browser_account("octo-alice").await;
    let (link, _) = link_of(&refused(w.derive(&k, "alice").await), "connect_required");
    b.steps(
        "alice",
        cat(&[
            vec![json!({"goto": link})],
            idp_sign_in(&idp, "alice", ALICE_PW),
            vec![
                json!({"expect_url": link}),
                json!({"click": "button[value=connect]"}),
                json!({"expect_url": w.url("/done/connected")}),
            ],
        ]),
    )
    .await;
    let token = issued(w.derive(&k, "alice").await);

    // (f) The account page names the account as Acme knows it, and the
    // agent allowed to use it. Revoking the agent: the next derive asks
    // for an allowance.
    b.steps(
        "alice",
        json!([
            {"goto": w.url("/account")},
            {"expect_text": "Acme: octo-alice"},
            {"expect_text": "repo-helper"},
            {"screenshot": "e2e-org-account"},
            {"click": "form[action='/account/revoke'] button"},
            {"expect_url": w.url("/account")},
            {"expect_text": "No agent may use this account"},
        ]),
    )
    .await;
    let (allow_link, allow_id) = link_of(&refused(w.derive(&k, "alice").await), "allow_required");
    // Disconnect: revoked at Acme (checked at Acme), then deleted.
    assert!(
        w.env
            .peer
            .access_token_live(token.access_token.expose())
            .await
    );
    assert!(w.env.peer.live_refresh_tokens("octo-alice").await >= 1);
    b.steps(
        "alice",
        json!([
            {"click": "form[action='/account/disconnect'] button"},
            // The page asks first, then says what was done.
            {"expect_text": "Disconnect Acme"},
            {"click": "form[action='/account/disconnect'] button.danger"},
            {"expect_text": "Disconnected, and revoked at"},
            {"click": "a.button[href='/account']"},
            {"expect_url": w.url("/account")},
            {"expect_text": "You have no connected accounts"},
        ]),
    )
    .await;
    assert!(
        !w.env
            .peer
            .access_token_live(token.access_token.expose())
            .await,
        "the agent's Acme token was revoked at Acme"
    );
    assert_eq!(w.env.peer.live_refresh_tokens("octo-alice").await, 0);
    let gone = events(&w.env, "account.disconnected");
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0]["reason"], "revoked_at_provider");
    let (connect_link, connect_id) =
        link_of(&refused(w.derive(&k, "alice").await), "connect_required");
    assert_ne!(connect_id, allow_id);

    // (e) The allow link was replaced by the connect link: its code gets
    // the 404 page, byte for byte the page of a code that never existed
    // and of a string that is not even shaped like a code.
    let r = b
        .steps(
            "alice",
            json!([
                {"goto": allow_link},
                {"expect_status": 404},
                {"expect_text": "This link is not valid"},
                {"goto": w.url(&format!("/connect/{}", unknown_code()))},
                {"expect_status": 404},
                {"goto": w.url("/connect/not-a-code")},
                {"expect_status": 404},
                // Positive control: the link that replaced it works.
                {"goto": connect_link},
                {"expect_status": 200},
                {"expect_text": "Connect Acme for repo-helper"},
            ]),
        )
        .await;
    assert_eq!(r[0]["sha256"], r[3]["sha256"]);
    assert_eq!(r[0]["sha256"], r[5]["sha256"]);
    assert!(r[0]["sha256"].is_string());

    // (d) Alice, in a browser without a session, signs in at the IdP,
    // which says she signed in 16 minutes ago (her IdP session is old):
    // sent to sign in again first (max_age=900, prompt=login).
    let answer = w
        .idp
        .peer
        .call(&json!({"cmd": "age_next_login", "user": "alice", "seconds": 16 * 60}));
    assert_eq!(answer["ok"], true);
    let before = events(&w.env, "signin.succeeded").len();
    b.steps(
        "alice-later",
        cat(&[
            vec![
                json!({"goto": connect_link}),
                json!({"expect_url": w.url("/signin?return_to=")}),
            ],
            idp_sign_in(&idp, "alice", ALICE_PW),
            vec![
                json!({"expect_url": w.url("/signin?return_to=")}),
                json!({"expect_text": "Sign in again"}),
                json!({"expect_text": "connecting an account or approving a call needs a sign-in within the last 15 minutes"}),
                json!({"expect_no_text": "Connect Acme"}),
                json!({"screenshot": "e2e-org-signin-again"}),
                // Positive control: a fresh sign-in at the IdP, and the page.
                json!({"click": "a.button[href^='/signin/oidc']"}),
                json!({"expect_url": format!("{idp}/interaction/")}),
                json!({"fill": "input[name=login]", "value": "alice"}),
                json!({"fill": "input[name=password]", "value": ALICE_PW}),
                json!({"click": "button[type=submit]"}),
                json!({"click_if": "input[name=prompt][value=consent] ~ button[type=submit]"}),
                json!({"expect_url": connect_link}),
                json!({"expect_text": "Connect Acme for repo-helper"}),
                json!({"click": "button[value=connect]"}),
                json!({"expect_url": w.url("/done/connected")}),
            ],
        ]),
    )
    .await;
    let sign_ins = events(&w.env, "signin.succeeded");
    assert_eq!(sign_ins.len(), before + 2, "signed in twice");
    issued(w.derive(&k, "alice").await);
    drop(w.idp);
    b.finish().await;
}

// ------------------------------------------- the quick start, local accounts

struct QuickStart {
    env: ServiceEnv,
    base: String,
}

impl QuickStart {
    /// The quick-start files served by the real binary, with Acme, and the
    /// local accounts alice and mallory (added through the admin socket,
    /// as `credbroker users add` does while it runs).
    fn start() -> QuickStart {
        let addr = free_loopback_addr();
        let env = ServiceEnv::start_with(ProviderOpts {
            public_listen: Some(addr.clone()),
            ..ProviderOpts::default()
        });
        for (name, pw) in [("alice", ALICE_PW), ("mallory", MALLORY_PW)] {
            let (status, body) = env
                .broker
                .admin_post("/users", &json!({"name": name, "password": pw}).to_string())
                .unwrap();
            assert_eq!(status, 200, "{body}");
        }
        QuickStart {
            env,
            base: format!("http://{addr}"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// The same flows with local accounts in the quick start: (c), (a), (b),
/// then (f) and (e).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_local_accounts_forwarded_links_connect_account_page_and_replaced_link() {
    let q = QuickStart::start();
    let env = &q.env;
    let mut b = Browsers::start().await;
    let k = key();
    let (alice_link, alice_id) = link_of(
        &refused(env.derive(&k, "alice", "acme.issues").await),
        "connect_required",
    );

    // (c) Alice's link in Mallory's browser: Alice's name with a guessed
    // password does not sign in; as herself, Mallory gets the refusal.
    let c = cat(&[
        vec![
            json!({"goto": alice_link}),
            json!({"expect_url": q.url("/signin?return_to=")}),
        ],
        local_sign_in("alice", "a guess at alice's password"),
        vec![
            json!({"expect_status": 403}),
            json!({"expect_text": "The user name or password is not right"}),
        ],
        local_sign_in("mallory", MALLORY_PW),
        vec![
            json!({"expect_status": 403}),
            json!({"expect_text": "This link was made for another account"}),
            json!({"expect_no_text": "alice"}),
        ],
    ]);
    b.steps("mallory", c).await;
    assert_opened_by_other(env, &alice_id, "alice", "mallory");
    let failed = events(env, "signin.failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let again = refused(env.derive(&k, "alice", "acme.issues").await);
    assert_eq!(link_of(&again, "connect_required").1, alice_id);
    assert_eq!(env.peer.stats().await["authorization_code"], 0);

    // (a) Alice, signed in as herself, connects.
    env.peer.set_browser_account("octo-alice").await;
    b.steps(
        "alice",
        cat(&[
            vec![json!({"goto": alice_link})],
            local_sign_in("alice", ALICE_PW),
            vec![
                json!({"expect_url": alice_link}),
                json!({"expect_text": "Connect Acme for repo-helper"}),
                json!({"screenshot": "e2e-qs-connect"}),
                json!({"click": "button[value=connect]"}),
                json!({"expect_url": q.url("/done/connected")}),
                json!({"expect_text": "Go back to your agent"}),
                json!({"screenshot": "e2e-qs-done"}),
            ],
        ]),
    )
    .await;
    let alice_token = issued(env.derive(&k, "alice", "acme.issues").await);
    assert!(
        env.peer
            .access_token_live(alice_token.access_token.expose())
            .await
    );

    // (b) Mallory's link forwarded to Alice, signed in.
    let (mallory_link, mallory_id) = link_of(
        &refused(env.derive(&k, "mallory", "acme.issues").await),
        "connect_required",
    );
    b.steps(
        "alice",
        json!([
            {"goto": mallory_link},
            {"expect_status": 403},
            {"expect_text": "This link was made for another account"},
            {"expect_text": "You are signed in as alice"},
            {"expect_no_text": "mallory"},
            {"screenshot": "e2e-qs-other-person"},
        ]),
    )
    .await;
    assert_opened_by_other(env, &mallory_id, "mallory", "alice");
    let still = refused(env.derive(&k, "mallory", "acme.issues").await);
    assert_eq!(link_of(&still, "connect_required").1, mallory_id);
    assert_eq!(env.peer.stats().await["authorization_code"], 1);
    // The link still works for Mallory.
    env.peer.set_browser_account("octo-mallory").await;
    b.steps(
        "mallory",
        json!([
            {"goto": mallory_link},
            {"expect_text": "Connect Acme for repo-helper"},
            {"click": "button[value=connect]"},
            {"expect_url": q.url("/done/connected")},
        ]),
    )
    .await;
    let mallory_token = issued(env.derive(&k, "mallory", "acme.issues").await);
    assert_ne!(
        mallory_token.access_token.expose(),
        alice_token.access_token.expose()
    );

    // (f) Alice's account page; revoke the agent; an allow link, whose
    // page names the connected account.
    b.steps(
        "alice",
        json!([
            {"goto": q.url("/account")},
            {"expect_text": "Acme: octo-alice"},
            {"expect_text": "repo-helper"},
            {"expect_no_text": "octo-mallory"},
            {"screenshot": "e2e-qs-account"},
            {"click": "form[action='/account/revoke'] button"},
            {"expect_text": "No agent may use this account"},
        ]),
    )
    .await;
    let (allow_link, _) = link_of(
        &refused(env.derive(&k, "alice", "acme.issues").await),
        "allow_required",
    );
    b.steps(
        "alice",
        json!([
            {"goto": allow_link},
            {"expect_text": "Allow repo-helper to use Acme"},
            {"expect_text": "octo-alice"},
            {"screenshot": "e2e-qs-allow"},
            // Disconnect: revoked at Acme.
            {"goto": q.url("/account")},
            {"click": "form[action='/account/disconnect'] button"},
            {"click": "form[action='/account/disconnect'] button.danger"},
            {"expect_text": "Disconnected, and revoked at Acme"},
            {"click": "a.button[href='/account']"},
            {"expect_text": "You have no connected accounts"},
        ]),
    )
    .await;
    assert!(
        !env.peer
            .access_token_live(alice_token.access_token.expose())
            .await
    );
    assert_eq!(env.peer.live_refresh_tokens("octo-alice").await, 0);
    // Mallory's account is untouched.
    assert!(
        env.peer
            .access_token_live(mallory_token.access_token.expose())
            .await
    );
    let (connect_link, _) = link_of(
        &refused(env.derive(&k, "alice", "acme.issues").await),
        "connect_required",
    );

    // (e) The allow link's kind changed (now a connect link): the old
    // code gets the same 404 page as an unknown code.
    let r = b
        .steps(
            "alice",
            json!([
                {"goto": allow_link},
                {"expect_status": 404},
                {"goto": q.url(&format!("/connect/{}", unknown_code()))},
                {"expect_status": 404},
                {"goto": connect_link},
                {"expect_status": 200},
                {"expect_text": "Connect Acme for repo-helper"},
            ]),
        )
        .await;
    assert_eq!(r[0]["sha256"], r[2]["sha256"]);
    assert!(r[0]["sha256"].is_string());
    b.finish().await;
}

// ------------------------------ local accounts in-process: moving the clock

/// (d) a local sign-in older than 15 minutes, a reconnect that comes back
/// with another account at the provider, and (e) an expired code; the
/// pages and the connected-services side are the real ones, run in this
/// process so that the broker's clock can be moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_stale_sign_in_reconnect_as_another_account_and_expired_code() {
    let crate::support::pages::RealServices {
        s,
        peer,
        base,
        _secrets,
    } = crate::support::pages::real_services_world().await;
    s.add_user("alice", ALICE_PW);
    let alice = s.person("alice");
    let client = credbroker::client::Client::new(&s.inst.broker.config.socket.path, &s.issuer);
    let k = key();
    // Proofs carry the broker's (moved) time.
    let derive = || {
        let proof = credbroker::internals::dpop::make_proof(
            &k,
            "POST",
            &format!("{}/v1/derive", s.issuer),
            credbroker::internals::clock::Clock::now(s.clock.as_ref()),
            None,
            None,
        )
        .unwrap();
        let subject =
            credbroker::internals::cli::dev_subject_token(s.dir.path(), "alice", 4 * 3600).unwrap();
        let client = &client;
        async move {
            client
                .derive_with_proof(
                    &DeriveParams {
                        subject_token: &subject,
                        step: "triage",
                        tool: "acme.issues",
                        resource: SERVICE,
                        scope: None,
                    },
                    &proof,
                )
                .await
                .unwrap()
        }
    };
    let account = || {
        s.inst
            .pages
            .services()
            .vault
            .accounts(&alice)
            .unwrap()
            .into_iter()
            .find(|a| a.service == "acme")
    };
    let mut b = Browsers::start().await;

    // (d) Alice signs in; sixteen minutes later the link sends her to sign
    // in again before it offers anything.
    let (link, _) = link_of(&refused(derive().await), "connect_required");
    b.steps(
        "alice",
        cat(&[
            vec![json!({"goto": link})],
            local_sign_in("alice", ALICE_PW),
            vec![
                json!({"expect_url": link}),
                json!({"expect_text": "Connect Acme for repo-helper"}),
            ],
        ]),
    )
    .await;
    s.clock.advance(16 * 60);
    peer.set_browser_account("octo-alice").await;
    b.steps(
        "alice",
        json!([
            {"goto": link},
            {"expect_url": format!("{base}/signin?return_to=")},
            {"expect_text": "Sign in again"},
            {"expect_no_text": "Connect Acme"},
            {"expect_focus": "#password"},
            {"screenshot": "e2e-local-signin-again"},
            {"fill": "#password", "value": ALICE_PW},
            {"press": "Enter", "nav": true},
            {"expect_url": link},
            {"expect_text": "Connect Acme for repo-helper"},
            {"click": "button[value=connect]"},
            {"expect_url": format!("{base}/done/connected")},
        ]),
    )
    .await;
    issued(derive().await);
    assert_eq!(account().unwrap().display_name, "octo-alice");

    // The grant is revoked at Acme and the token expires: the refresh is
    // refused, so the agent gets a reconnect link.
    peer.revoke_account("octo-alice").await;
    s.clock.advance(61 * 60);
    let (reconnect, reconnect_id) = link_of(&refused(derive().await), "reconnect_required");
    // At Acme, Alice is signed in as another account of hers: the pages
    // refuse to put it in place of the connected one.
    peer.set_browser_account("octo-alice-work").await;
    b.steps(
        "alice",
        cat(&[
            vec![json!({"goto": reconnect})],
            // The session went idle for an hour: sign in again.
            local_sign_in("alice", ALICE_PW),
            vec![
                json!({"expect_url": reconnect}),
                json!({"expect_text": "Reconnect Acme for repo-helper"}),
                json!({"click": "button[value=reconnect]"}),
                // The code is out of the address bar.
                json!({"expect_url": format!("{base}/done/other-account/acme")}),
                json!({"expect_status": 409}),
                json!({"expect_text": "This is not your connected Acme account"}),
                json!({"expect_text": "At Acme you signed in with another account than the one connected for you. Nothing was changed"}),
                json!({"expect_text": "Your connected Acme account is octo-alice."}),
                json!({"screenshot": "e2e-local-different-account"}),
            ],
        ]),
    )
    .await;
    // Nothing changed: the same account, still to be reconnected, the
    // same link; the other account's new grant was revoked at Acme.
    let a = account().unwrap();
    assert_eq!(a.account_id, "octo-alice");
    assert_eq!(
        a.status,
        credbroker::internals::vault::AccountStatus::ReconnectRequired
    );
    assert_eq!(
        link_of(&refused(derive().await), "reconnect_required").1,
        reconnect_id
    );
    assert_eq!(peer.live_refresh_tokens("octo-alice-work").await, 0);
    assert_eq!(
        peer.stats().await["revocations"],
        2,
        "its refresh and access tokens were revoked at Acme"
    );
    let ev = s.events("connect.different_account");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["connect_id"], reconnect_id.as_str());
    // Positive control: signed in at Acme as the connected account.
    peer.set_browser_account("octo-alice").await;
    b.steps(
        "alice",
        json!([
            {"goto": reconnect},
            {"click": "button[value=reconnect]"},
            {"expect_url": format!("{base}/done/reconnected")},
        ]),
    )
    .await;
    let t = issued(derive().await);
    assert!(peer.access_token_live(t.access_token.expose()).await);
    assert_eq!(
        account().unwrap().status,
        credbroker::internals::vault::AccountStatus::Active
    );

    // (e) An allow link left for 31 minutes has expired: the same 404
    // page as a code that never existed.
    b.steps(
        "alice",
        json!([
            {"goto": format!("{base}/account")},
            {"click": "form[action='/account/revoke'] button"},
            {"expect_text": "No agent may use this account"},
        ]),
    )
    .await;
    let (allow, allow_id) = link_of(&refused(derive().await), "allow_required");
    b.steps(
        "alice",
        json!([{"goto": allow}, {"expect_status": 200}, {"expect_text": "octo-alice"}]),
    )
    .await;
    s.clock.advance(31 * 60);
    let r = b
        .steps(
            "alice",
            json!([
                {"goto": allow},
                {"expect_status": 404},
                {"goto": format!("{base}/connect/{}", unknown_code())},
                {"expect_status": 404},
            ]),
        )
        .await;
    assert_eq!(r[0]["sha256"], r[2]["sha256"]);
    // Two bodies were hashed (not two missing hashes compared).
    assert_eq!(r[0]["sha256"].as_str().map(str::len), Some(64), "{r:?}");
    // Positive control: the agent asks again and gets a new link, which
    // works.
    let (allow2, allow2_id) = link_of(&refused(derive().await), "allow_required");
    assert_ne!(allow2_id, allow_id);
    b.steps(
        "alice",
        cat(&[
            vec![json!({"goto": allow2})],
            local_sign_in("alice", ALICE_PW),
            vec![
                json!({"expect_url": allow2}),
                json!({"expect_text": "Allow repo-helper to use Acme"}),
                json!({"click": "button[value=allow]"}),
                json!({"expect_url": format!("{base}/done/allowed")}),
            ],
        ]),
    )
    .await;
    issued(derive().await);
    b.finish().await;
    s.stop().await;
}
