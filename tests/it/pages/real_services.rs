//! C4, C5 and C7 with the real connected-services side instead of the
//! in-memory fake of `http.rs`: an instance run in-process (so its clock
//! can be moved) with the link store, vault and provider client that
//! `server::build` makes, links made by real refusals on the socket, and
//! oidc-provider (tests/peers/oauth-service.mjs, which requires PKCE) as
//! the service. The pages are driven over HTTP.
//!
//! - every kind of dead code (unknown, expired, declined, replaced, used,
//!   one character off, malformed) gets the same bytes as a random code,
//!   and the link store holds a link under SHA-256 of its code, never the
//!   code;
//! - an authorization code of one flow sent back with the `state` of
//!   another flow of the same person (code injection) is exchanged with
//!   the other flow's verifier, and the provider's PKCE check refuses it;
//!   nothing is connected; the same code with its own `state` connects.
//! - a callback whose flow, bound to the person's session, names another
//!   person's link is the 404 page and stores nothing;
//! - a link record its index entry no longer names (cleared or replaced)
//!   does not resolve.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::collections::BTreeMap;

use credbroker::client::{Answer, DeriveParams};
use credbroker::internals::clock::Clock;
use credbroker::internals::store::Tree;

use crate::support::pages::{real_services_world as world, RealServices};
use crate::support::services::{hidden, location, open_signed_in, refused, SERVICE};
use crate::support::*;

const PW: &str = "a long local test password";

impl RealServices {
    /// A derive by `sub`'s agent for `tool`, at the instance's (moved) time.
    async fn derive(&self, sub: &str, tool: &str) -> Answer {
        let now = self.s.clock.now();
        let proof = credbroker::internals::dpop::make_proof(
            &key(),
            "POST",
            &format!("{}/v1/derive", self.s.issuer),
            now,
            None,
            None,
        )
        .unwrap();
        let subject =
            credbroker::internals::cli::dev_subject_token(self.s.dir.path(), sub, 4 * 3600)
                .unwrap();
        credbroker::client::Client::new(&self.s.inst.broker.config.socket.path, &self.s.issuer)
            .derive_with_proof(
                &DeriveParams {
                    subject_token: &subject,
                    step: "triage",
                    tool,
                    resource: SERVICE,
                    scope: None,
                },
                &proof,
            )
            .await
            .unwrap()
    }

    /// The code of the link a refusal hands out.
    async fn link_code(&self, sub: &str, tool: &str) -> String {
        let r = refused(self.derive(sub, tool).await);
        let uri = r.connect_uri.unwrap();
        uri.rsplit('/').next().unwrap().to_string()
    }

    fn browser(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// `sub`'s browser, signed in with a new local account, on the link
    /// page; returns the page.
    async fn open(&self, c: &reqwest::Client, code: &str, sub: &str) -> String {
        self.s.add_user(sub, PW);
        open_signed_in(c, &self.base, &format!("/connect/{code}"), sub, PW).await
    }

    /// Presses the link page's connect button: the provider's
    /// authorization URL the pages redirect to.
    async fn press_connect(&self, c: &reqwest::Client, code: &str, html: &str) -> String {
        let go = c
            .post(format!("{}/connect/{code}", self.base))
            .header("sec-fetch-site", "same-origin")
            .form(&[
                ("csrf", hidden(html, "csrf").as_str()),
                ("action", "connect"),
            ])
            .send()
            .await
            .unwrap();
        assert!(go.status().is_redirection(), "{}", go.status());
        let to = location(&go);
        assert!(to.starts_with(&self.peer.issuer), "{to}");
        to
    }

    async fn callback(
        &self,
        c: &reqwest::Client,
        q: &BTreeMap<String, String>,
    ) -> reqwest::Response {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(q.iter())
            .finish();
        c.get(format!("{}/callback/acme?{query}", self.base))
            .send()
            .await
            .unwrap()
    }

    fn accounts(&self, sub: &str) -> usize {
        self.s
            .inst
            .pages
            .services()
            .vault
            .accounts(&self.s.person(sub))
            .unwrap()
            .len()
    }
}

/// Status and body of `GET /connect/{code}` for a browser without a session.
async fn get(w: &RealServices, code: &str) -> (u16, bytes::Bytes) {
    let r = w
        .browser()
        .get(format!("{}/connect/{code}", w.base))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_codes_of_every_kind_get_the_same_404_from_the_real_link_store() {
    let w = world().await;
    let (st, reference) = get(&w, &credbroker::internals::jose::b64e(&random_bytes(32))).await;
    assert_eq!(st, 404);

    // Expired: carol's link, 31 minutes later.
    let expired = w.link_code("carol", "acme.issues").await;
    w.s.clock.advance(31 * 60);
    // Replaced: alice's link for `repo`, replaced when her agent also asks
    // for `read:org` (a link for both).
    let replaced = w.link_code("alice", "acme.issues").await;
    let used = w.link_code("alice", "acme.org").await;
    assert_ne!(replaced, used);
    // Declined: bob declines his.
    let declined = w.link_code("bob", "acme.issues").await;
    let bob = w.browser();
    let html = w.open(&bob, &declined, "bob").await;
    let r = bob
        .post(format!("{}/connect/{declined}", w.base))
        .header("sec-fetch-site", "same-origin")
        .form(&[
            ("csrf", hidden(&html, "csrf").as_str()),
            ("action", "decline"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/done/declined");
    // Used: alice finishes hers.
    let alice = w.browser();
    let html = w.open(&alice, &used, "alice").await;
    let to = w.press_connect(&alice, &used, &html).await;
    let back = w.peer.authorize(&to, "octo-alice").await;
    let done = w.callback(&alice, &back).await;
    assert!(
        location(&done).starts_with("/done/connected/"),
        "{}",
        location(&done)
    );
    // Open: dave's, for the positive control and a code one character off.
    let open = w.link_code("dave", "acme.issues").await;
    let mut one_off = open.clone().into_bytes();
    one_off[42] = if one_off[42] == b'A' { b'B' } else { b'A' };
    let one_off = String::from_utf8(one_off).unwrap();

    for (what, code) in [
        ("expired", expired.as_str()),
        ("declined", declined.as_str()),
        ("replaced by a link for more scope", replaced.as_str()),
        ("used", used.as_str()),
        ("one character off an open code", one_off.as_str()),
        ("malformed", "not-a-code"),
        ("too long", &format!("{open}A")),
    ] {
        let (st, body) = get(&w, code).await;
        assert_eq!(st, 404, "{what}");
        assert_eq!(body, reference, "{what}: byte-identical");
    }
    // 200 random codes: the same bytes.
    for i in 0..200 {
        let (st, body) = get(&w, &credbroker::internals::jose::b64e(&random_bytes(32))).await;
        assert_eq!((st, &body), (404, &reference), "random code {i}");
    }
    // Positive control: the open code is not a 404 (no session: sign in).
    let r = w
        .browser()
        .get(format!("{}/connect/{open}", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(location(&r).starts_with("/signin"), "{}", location(&r));

    // Look-up by hash: the record of the open link is stored under SHA-256
    // of its code; neither the code nor its bytes are anywhere in the
    // link records.
    let code_bytes = credbroker::internals::jose::b64d(&open, "code").unwrap();
    let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &code_bytes);
    let records = credbroker::internals::store::Store::scan_prefix(
        w.s.inst.broker.store.as_ref(),
        Tree::Links,
        b"",
    )
    .unwrap();
    assert!(
        records.iter().any(|(k, _)| k.as_slice() == hash.as_ref()),
        "the open link is stored under SHA-256 of its code"
    );
    let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|x| x == needle);
    for (k, v) in &records {
        for hay in [k, v] {
            assert!(!contains(hay, open.as_bytes()) && !contains(hay, &code_bytes));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_of_another_flow_fails_the_providers_pkce_check_and_connects_nothing() {
    let w = world().await;
    let code = w.link_code("alice", "acme.issues").await;
    let alice = w.browser();
    let html = w.open(&alice, &code, "alice").await;
    // Two flows from the same link in the same session: two states, two
    // verifiers.
    let first = w.press_connect(&alice, &code, &html).await;
    let second = w.press_connect(&alice, &code, &html).await;
    let q = |u: &str| -> BTreeMap<String, String> {
        url::Url::parse(u)
            .unwrap()
            .query_pairs()
            .into_owned()
            .collect()
    };
    assert_ne!(q(&first)["state"], q(&second)["state"]);
    assert_ne!(q(&first)["code_challenge"], q(&second)["code_challenge"]);
    let back_first = w.peer.authorize(&first, "octo-alice").await;
    let back_second = w.peer.authorize(&second, "octo-alice").await;
    let stats = w.peer.stats().await;

    // The first flow's code with the second flow's state: the pages send
    // the second flow's verifier, and the provider refuses it.
    let mut injected = back_first.clone();
    injected.insert("state".into(), back_second["state"].clone());
    let r = w.callback(&alice, &injected).await;
    assert_eq!(r.status(), 502, "{}", r.text().await.unwrap());
    let after = w.peer.stats().await;
    assert_eq!(
        after["token_requests"].as_u64().unwrap(),
        stats["token_requests"].as_u64().unwrap() + 1,
        "the code was sent to the provider"
    );
    assert_eq!(
        after["authorization_code"], stats["authorization_code"],
        "the provider granted nothing"
    );
    assert_eq!(w.accounts("alice"), 0, "nothing connected");

    // Positive control: the same code with its own state (its own
    // verifier) connects.
    let r = w.callback(&alice, &back_first).await;
    assert!(
        location(&r).starts_with("/done/connected/"),
        "{}",
        location(&r)
    );
    assert_eq!(w.accounts("alice"), 1);
    let after = w.peer.stats().await;
    assert_eq!(
        after["authorization_code"].as_u64().unwrap(),
        stats["authorization_code"].as_u64().unwrap() + 1
    );
}

/// The flow's link belongs to alice's session only because the flow
/// record says so: a flow bound to her session that names bob's link (a
/// record rewritten in the store, as a writer of the shared store could)
/// is refused at the callback with the 404 page after the provider
/// answered, and nothing is stored: no account for alice or bob, and bob's
/// link stays open. The control: a flow of her own link connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callback_of_her_flow_naming_another_persons_link_is_404_and_stores_nothing() {
    use credbroker::internals::secret::SecretString;
    let w = world().await;
    let links = w.s.inst.pages.services().links.clone();
    let now = || w.s.clock.now();
    let bobs = w.link_code("bob", "acme.issues").await;
    let bob_link = links
        .resolve(&SecretString::new(bobs.clone()), now())
        .unwrap()
        .expect("bob's link is open");
    let code = w.link_code("alice", "acme.issues").await;
    let alice_link = links
        .resolve(&SecretString::new(code.clone()), now())
        .unwrap()
        .expect("alice's link is open");
    assert_eq!(
        (bob_link.service.as_str(), bob_link.kind),
        (alice_link.service.as_str(), alice_link.kind),
        "only the person differs"
    );
    let alice = w.browser();
    let html = w.open(&alice, &code, "alice").await;
    let to = w.press_connect(&alice, &code, &html).await;

    // Her flow record (sealed under its key, bound to her session) now
    // names bob's link.
    let state = url::Url::parse(&to)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .unwrap()
        .1
        .into_owned();
    let mut key = b"state/".to_vec();
    key.extend_from_slice(
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, state.as_bytes()).as_ref(),
    );
    let store = w.s.inst.broker.store.as_ref();
    let sealer = &w.s.inst.sealer;
    let sealed = store.get(Tree::PageFlows, &key).unwrap().expect("her flow");
    let mut flow: serde_json::Value =
        serde_json::from_slice(sealer.open(&key, &sealed).unwrap().expose()).unwrap();
    assert_eq!(flow["flow"]["link_id"], alice_link.id.as_str(), "{flow}");
    flow["flow"]["link_id"] = bob_link.id.clone().into();
    let forged = sealer
        .seal(&key, &serde_json::to_vec(&flow).unwrap())
        .unwrap();
    store.put(Tree::PageFlows, &key, &forged).unwrap();

    let back = w.peer.authorize(&to, "octo-alice").await;
    let r = w.callback(&alice, &back).await;
    assert_eq!(r.status(), 404, "{}", location(&r));
    assert_eq!(w.accounts("alice"), 0, "nothing stored for alice");
    assert_eq!(w.accounts("bob"), 0, "nor for bob");
    assert!(
        links
            .resolve(&SecretString::new(bobs), now())
            .unwrap()
            .is_some(),
        "bob's link is still open"
    );
    assert!(w.s.events("connect.completed").is_empty());

    // Positive control: a flow of her own link, in the same session.
    let to = w.press_connect(&alice, &code, &html).await;
    let back = w.peer.authorize(&to, "octo-alice").await;
    let r = w.callback(&alice, &back).await;
    assert!(
        location(&r).starts_with("/done/connected/"),
        "{}",
        location(&r)
    );
    assert_eq!(w.accounts("alice"), 1);
    assert_eq!(w.accounts("bob"), 0);
}

/// A link is open only while its (person, agent, service) index entry
/// names it. A record still stored after that entry was cleared (a crash
/// between the two writes of a close, or a sweep on a replica whose clock
/// runs ahead) or replaced (another link for the same person, agent and
/// service) does not resolve: the 404 page, the same bytes as a random
/// code. The control: the entry put back, the code opens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_record_its_index_entry_no_longer_names_is_404() {
    let w = world().await;
    let (_, reference) = get(&w, &credbroker::internals::jose::b64e(&random_bytes(32))).await;
    let code = w.link_code("carol", "acme.issues").await;
    let (st, _) = get(&w, &code).await;
    assert_eq!(st, 303, "open: sign in first");
    let store = w.s.inst.broker.store.as_ref();
    let record = aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        &credbroker::internals::jose::b64d(&code, "code").unwrap(),
    );
    let stored = store.get(Tree::Links, record.as_ref()).unwrap();
    let id = serde_json::from_slice::<serde_json::Value>(&stored.expect("the record")).unwrap()
        ["id"]
        .as_str()
        .unwrap()
        .to_string();
    let entries = store.scan_prefix(Tree::LinkIndex, b"").unwrap();
    let index = entries
        .into_iter()
        .find(|(_, v)| v == id.as_bytes())
        .expect("the index entry names the link")
        .0;

    for (what, entry) in [
        ("cleared", None),
        ("replaced", Some(b"QUFBQUFBQUFBQUFBQUFBQQ".as_slice())),
    ] {
        match entry {
            None => store.delete(Tree::LinkIndex, &index).unwrap(),
            Some(other) => store.put(Tree::LinkIndex, &index, other).unwrap(),
        }
        assert!(
            store.get(Tree::Links, record.as_ref()).unwrap().is_some(),
            "{what}: the record is still stored"
        );
        let (st, body) = get(&w, &code).await;
        assert_eq!(st, 404, "{what}");
        assert_eq!(body, reference, "{what}: byte-identical");
    }

    // Positive control: the entry names it again.
    store.put(Tree::LinkIndex, &index, id.as_bytes()).unwrap();
    let (st, _) = get(&w, &code).await;
    assert_eq!(st, 303);
}
