//! Approvals where the clock must move: the pages in-process on a manual
//! clock (tests/it/support/pages.rs) with the real approval store, local
//! accounts for sign-in, and derives through the real pipeline.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::{json, Value};

use super::{DEPLOY, MAIL, POLICY};
use crate::support::key;
use crate::support::pages::{csrf_of, location, sign_in, PagesServer, Setup};
use credbroker::internals::clock::Clock;
use credbroker::internals::exchange::{DeriveError, DeriveRequest, Endpoint, Issued};
use credbroker::internals::jose::Es256Key;
use credbroker::internals::secret::SecretString;

const PW: &str = "alice's own password";

struct Local {
    s: PagesServer,
    c: reqwest::Client,
}

impl Local {
    async fn start() -> Local {
        Local::start_with(POLICY).await
    }

    async fn start_with(policy: &str) -> Local {
        let s = PagesServer::start_with(Setup {
            real_services: true,
            policy: Some(policy.to_string()),
            ..Setup::default()
        })
        .await;
        s.add_user("alice", PW);
        let c = s.client();
        Local { s, c }
    }

    fn now(&self) -> i64 {
        self.s.clock.as_ref().now()
    }

    /// A derive through the real pipeline, on the moved clock.
    async fn derive(
        &self,
        k: &Es256Key,
        tool: &str,
        step: &str,
        details: &Value,
    ) -> Result<Issued, DeriveError> {
        let b = &self.s.inst.broker;
        let proof = credbroker::internals::dpop::make_proof(
            k,
            "POST",
            b.htu(Endpoint::Derive),
            self.now(),
            None,
            None,
        )
        .unwrap();
        let subject =
            credbroker::internals::cli::dev_subject_token(self.s.dir.path(), "alice", 4 * 3600)
                .unwrap();
        b.derive(DeriveRequest {
            subject_token_type: Default::default(),
            subject_token: SecretString::new(subject),
            step: step.into(),
            tool: tool.into(),
            resource: if tool == "mail.send" { MAIL } else { DEPLOY }.into(),
            scope: None,
            dpop: Some(SecretString::new(proof)),
            authorization_details: Some(details.clone()),
            upstream_proofs: Default::default(),
            request: None,
            endpoint: Endpoint::Derive,
            peer_uid: 1000,
        })
        .await
    }

    /// The approval link of a refused derive: (path, id).
    async fn link(
        &self,
        k: &Es256Key,
        tool: &str,
        step: &str,
        details: &Value,
    ) -> (String, String) {
        match self.derive(k, tool, step, details).await {
            Err(DeriveError::ApprovalRequired(l)) => {
                let uri = l.uri.expose().clone();
                let path = uri[uri.find("/connect/").unwrap()..].to_string();
                (path, l.id.clone())
            }
            other => panic!("expected approval_required, got {other:?}"),
        }
    }

    /// Alice's browser opens `path` (signing in when asked); the page.
    async fn open(&self, path: &str) -> (u16, String) {
        let mut r = self.c.get(self.s.url(path)).send().await.unwrap();
        if r.status() == 303 && location(&r).starts_with("/signin") {
            let signed = sign_in(&self.s, &self.c, path, "alice", PW).await;
            assert_eq!(location(&signed), path, "back to the link after signing in");
            r = self.c.get(self.s.url(path)).send().await.unwrap();
        }
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    }

    /// Alice presses `action` on the page at `path`; the answer's status
    /// and `Location`.
    async fn press(&self, path: &str, csrf: &str, action: &str) -> (u16, String) {
        let r = self
            .c
            .post(self.s.url(path))
            .form(&[("csrf", csrf), ("action", action)])
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), location(&r))
    }

    async fn approve(&self, path: &str) {
        let (status, page) = self.open(path).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(
            self.press(path, &csrf_of(&page), "approve").await,
            (303, "/done/approved".to_string())
        );
    }
}

fn mail(subject: &str) -> Value {
    json!([{"type": "mail", "to": ["bob@example.com"], "subject": subject}])
}

/// An unanswered link expires after 10 minutes: GET and POST find nothing
/// and change nothing, and the agent's next ask gets a new link. A granted
/// each_call approval must be redeemed within 5 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_link_expires_unanswered_and_an_unredeemed_grant_lapses() {
    let l = Local::start().await;
    let k = key();
    let call = mail("Expiring");
    let (path, id) = l.link(&k, "mail.send", "send_reply", &call).await;
    let (status, page) = l.open(&path).await;
    assert_eq!(status, 200);
    let csrf = csrf_of(&page);
    l.s.clock.advance(10 * 60);
    assert_eq!(
        l.open(&path).await.0,
        404,
        "an expired link is the 404 page"
    );
    assert_eq!(
        l.press(&path, &csrf, "approve").await.0,
        404,
        "and cannot be approved"
    );
    assert!(l.s.events("approval.granted").is_empty());
    let (new_path, new_id) = l.link(&k, "mail.send", "send_reply", &call).await;
    assert_ne!(
        (new_path.as_str(), new_id.as_str()),
        (path.as_str(), id.as_str())
    );

    // Positive control: the new link approves; redeemed within 5 minutes.
    l.approve(&new_path).await;
    l.s.clock.advance(4 * 60 + 59);
    let t = l
        .derive(&k, "mail.send", "send_reply", &call)
        .await
        .expect("redeemed in time");
    assert!(t.expires_in.unwrap() <= 60);

    // A grant left unredeemed for 5 minutes lapses: a new approval is asked.
    let late = mail("Late");
    let (p, _) = l.link(&k, "mail.send", "send_reply", &late).await;
    l.approve(&p).await;
    l.s.clock.advance(5 * 60);
    let (p2, _) = l.link(&k, "mail.send", "send_reply", &late).await;
    assert_ne!(p2, p);
    l.s.stop().await;
}

/// per_step: covered until approval_ttl, and the token never outlives
/// the approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_step_approval_covers_the_step_until_its_ttl() {
    let l = Local::start().await;
    let k = key();
    let d = json!([{"type": "deploy", "env": "staging", "commit": "abc123"}]);
    let (p, _) = l.link(&k, "deploy.run", "release", &d).await;
    l.approve(&p).await;
    l.derive(&k, "deploy.run", "release", &d)
        .await
        .expect("covered at once");
    l.s.clock.advance(14 * 60);
    let t = l
        .derive(&k, "deploy.run", "release", &d)
        .await
        .expect("covered after 14 minutes");
    assert!(
        t.expires_in.unwrap() <= 60,
        "capped by the approval's end: {:?}",
        t.expires_in
    );
    l.s.clock.advance(60);
    let (p2, _) = l.link(&k, "deploy.run", "release", &d).await;
    assert_ne!(
        p2, p,
        "after approval_ttl the same call needs a new approval"
    );
    l.s.stop().await;
}

/// While the broker is frozen no approval is offered or granted; after the
/// freeze, the same link approves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_broker_offers_and_grants_no_approval() {
    let l = Local::start().await;
    let k = key();
    let call = mail("Frozen");
    let (p, _) = l.link(&k, "mail.send", "send_reply", &call).await;
    l.s.inst.broker.set_frozen(true).unwrap();
    let (status, page) = l.open(&p).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("frozen") && !page.contains("value=\"approve\""),
        "{page}"
    );
    let csrf = csrf_of(&page);
    assert_eq!(l.press(&p, &csrf, "approve").await.0, 503);
    assert!(l.s.events("approval.granted").is_empty());
    assert!(matches!(
        l.derive(&k, "mail.send", "send_reply", &call).await,
        Err(DeriveError::Denied(_))
    ));
    l.s.inst.broker.set_frozen(false).unwrap();
    l.approve(&p).await;
    l.derive(&k, "mail.send", "send_reply", &call)
        .await
        .expect("approved after the freeze");
    l.s.stop().await;
}

/// An each_call token is single-use at a resource server that uses
/// `credbroker::verify`: accepted once, refused after; a bad proof does not
/// use it up. A per_step token is not single-use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_token_is_accepted_once_by_verify() {
    let l = Local::start().await;
    let k = key();
    let call = mail("Once");
    let (p, id) = l.link(&k, "mail.send", "send_reply", &call).await;
    l.approve(&p).await;
    let t = l
        .derive(&k, "mail.send", "send_reply", &call)
        .await
        .unwrap();
    let jwks = l.s.inst.broker.minter.ring().jwks(l.now()).to_string();
    let clock: credbroker::verify::SharedClock = Arc::new(credbroker::verify::SystemClock);
    let v = credbroker::verify::Verifier::from_jwks(&l.s.issuer, MAIL, jwks.as_bytes())
        .unwrap()
        .with_clock(clock);
    let token = t.access_token.expose().clone();
    let auth = format!("DPoP {token}");
    let url = "https://mail.example/api/send";
    let proof = |htu: &str| {
        credbroker::internals::dpop::make_proof(
            &k,
            "POST",
            htu,
            crate::support::now(),
            Some(&token),
            None,
        )
        .unwrap()
    };
    let present = |p: &str| {
        v.verify(&credbroker::verify::Presented {
            method: "POST",
            url,
            authorization: Some(&auth),
            dpop: &[p],
        })
    };
    assert!(
        present(&proof("https://mail.example/api/other")).is_err(),
        "a proof for another URL"
    );
    let ok = present(&proof(url)).expect("first use");
    assert!(ok.single_use);
    assert_eq!(ok.approval_id.as_deref(), Some(id.as_str()));
    assert_eq!(ok.authorization_details.as_ref(), Some(&call));
    assert_eq!(
        present(&proof(url)),
        Err(credbroker::verify::VerifyError::AlreadyUsed)
    );
    l.s.stop().await;
}

/// The page shows the fields in the order the policy file declares them
/// (to, subject, body), not in the order of their names (body, subject, to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_page_shows_fields_in_the_policys_order() {
    let l = Local::start().await;
    let k = key();
    let call = json!([{
        "type": "mail",
        "body": "Hello Bob",
        "subject": "Ordered",
        "to": ["bob@example.com"]
    }]);
    let (path, _) = l.link(&k, "mail.send", "send_reply", &call).await;
    let (status, page) = l.open(&path).await;
    assert_eq!(status, 200, "{page}");
    let at = |label: &str| {
        page.find(label)
            .unwrap_or_else(|| panic!("{label} not on the page: {page}"))
    };
    assert!(
        at("Recipients") < at("Subject") && at("Subject") < at("Message"),
        "{page}"
    );
    // And each value is on the page, after its label.
    assert!(at("Message") < at("Hello Bob"));
    l.s.stop().await;
}

/// An approval is the call's only while the call's index entry names it. A
/// record still stored after that entry was cleared (discarded: the derive
/// that made it could not record it) or replaced (a newer approval of the
/// same call) does not resolve: its link is the 404 page, GET and POST,
/// and nothing is granted. The control: the entry put back, the same link
/// approves and the call is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_record_its_index_entry_no_longer_names_is_404() {
    use credbroker::internals::store::Tree;
    let l = Local::start().await;
    let k = key();
    let call = mail("Left behind");
    let (path, id) = l.link(&k, "mail.send", "send_reply", &call).await;
    let (status, page) = l.open(&path).await;
    assert_eq!(status, 200, "{page}");
    let csrf = csrf_of(&page);
    let store = l.s.inst.broker.store.as_ref();
    let index = store
        .scan_prefix(Tree::ApprovalIndex, b"")
        .unwrap()
        .into_iter()
        .find(|(_, v)| v == id.as_bytes())
        .expect("the call's index entry names the approval")
        .0;
    let approvals = l.s.inst.broker.approvals().unwrap().clone();
    for (what, entry) in [
        ("discarded", None),
        ("replaced", Some(b"QUFBQUFBQUFBQUFBQUFBQQ".as_slice())),
    ] {
        match entry {
            None => store.delete(Tree::ApprovalIndex, &index).unwrap(),
            Some(other) => store.put(Tree::ApprovalIndex, &index, other).unwrap(),
        }
        assert_eq!(
            approvals.counts().unwrap().get("pending"),
            Some(&1),
            "{what}: the record is still stored"
        );
        assert_eq!(l.open(&path).await.0, 404, "{what}");
        assert_eq!(
            l.press(&path, &csrf, "approve").await.0,
            404,
            "{what}: cannot be approved"
        );
    }
    assert!(l.s.events("approval.granted").is_empty());
    assert_eq!(approvals.counts().unwrap().get("granted"), None);

    // Positive control: the entry names it again.
    store
        .put(Tree::ApprovalIndex, &index, id.as_bytes())
        .unwrap();
    l.approve(&path).await;
    l.derive(&k, "mail.send", "send_reply", &call)
        .await
        .expect("served once approved");
    l.s.stop().await;
}

/// An answer to an approval that expired while it was pending does
/// nothing: neither a grant nor a decline is recorded, and the agent's
/// next ask gets a new link, not a token. The pages re-check the link
/// before they answer, so this is the approval store's own check, called
/// as the pages call it. The control: an answer in time grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_to_an_approval_that_expired_while_pending_does_nothing() {
    // An unanswered approval lasts 10 minutes (approve::PENDING_TTL,
    // docs/APPROVALS.md).
    const PENDING_TTL: i64 = 10 * 60;
    let l = Local::start().await;
    let k = key();
    let call = mail("Answered late");
    let (_, id) = l.link(&k, "mail.send", "send_reply", &call).await;
    let approvals = l.s.inst.broker.approvals().unwrap().clone();
    l.s.clock.advance(PENDING_TTL);
    for approve in [false, true] {
        assert!(
            approvals.answer(&id, approve, l.now()).unwrap().is_none(),
            "approve = {approve}: expired while pending"
        );
    }
    let counts = approvals.counts().unwrap();
    assert_eq!(
        (counts.get("granted"), counts.get("declined")),
        (None, None),
        "{counts:?}"
    );
    let (_, new_id) = l.link(&k, "mail.send", "send_reply", &call).await;
    assert_ne!(new_id, id, "a new link, not a token");

    // Positive control: the new one, answered in time, is granted.
    l.s.clock.advance(PENDING_TTL - 1);
    let granted = approvals
        .answer(&new_id, true, l.now())
        .unwrap()
        .expect("pending and in time");
    assert_eq!(granted.id, new_id);
    l.derive(&k, "mail.send", "send_reply", &call)
        .await
        .expect("served once granted");
    l.s.stop().await;
}

/// A per_step approval's reach is stated exactly, in the unit the policy
/// wrote `approval_ttl` in: on the page ("for 4 seconds", never "for 1
/// minutes") and in the `approval.*` events (`approval_ttl` as written);
/// and the window is that long (covered one second before its end, not at
/// it). An `each_call` page states no window (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_step_reach_is_stated_in_the_unit_it_was_written_in() {
    for (written, secs, words) in [
        ("4s", 4, "4 seconds"),
        ("90s", 90, "90 seconds"),
        ("60s", 60, "60 seconds"),
        ("5m", 300, "5 minutes"),
        ("1m", 60, "1 minute"),
    ] {
        let l = Local::start_with(&POLICY.replace(
            "approval_ttl = \"15m\"",
            &format!("approval_ttl = \"{written}\""),
        ))
        .await;
        let k = key();
        let d = json!([{"type": "deploy", "env": "staging", "commit": "abc123"}]);
        let (p, id) = l.link(&k, "deploy.run", "release", &d).await;
        let (status, page) = l.open(&p).await;
        assert_eq!(status, 200, "{page}");
        let want = format!("for {words} from your approval");
        assert!(page.contains(&want), "{written}: {want} not in {page}");
        // No other reach (a rounded one) anywhere on the page.
        assert_eq!(page.matches(" from your approval").count(), 1, "{page}");
        l.approve(&p).await;
        for kind in ["approval.requested", "approval.granted"] {
            let e = l.s.events(kind);
            assert_eq!(e.len(), 1, "{kind}");
            assert_eq!(e[0]["approval_id"], id.as_str());
            assert_eq!(e[0]["approval_ttl"], written, "{kind}");
        }
        l.s.clock.advance(secs - 1);
        l.derive(&k, "deploy.run", "release", &d)
            .await
            .expect("covered until the last second of the window");
        l.s.clock.advance(1);
        let (p2, _) = l.link(&k, "deploy.run", "release", &d).await;
        assert_ne!(p2, p, "{written}: after the window a new approval is asked");
        // The control: an each_call approval's page names no window, and
        // its events no approval_ttl.
        let (m, _) = l.link(&k, "mail.send", "send_reply", &mail("Reach")).await;
        let (_, page) = l.open(&m).await;
        assert!(page.contains("this one call only"), "{page}");
        assert!(!page.contains(" from your approval"), "{page}");
        let requested = l.s.events("approval.requested");
        let each_call = requested
            .iter()
            .find(|e| e["reason"] == "each_call")
            .unwrap();
        assert!(each_call.get("approval_ttl").is_none(), "{each_call}");
        l.s.stop().await;
    }
}
