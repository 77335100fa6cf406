//! Approvals end to end, "How it is checked" of issue 12: the real binary,
//! the organisation's IdP (`oidc-provider`), chromium (`playwright-core`),
//! tokens verified by npm `jose`. Every negative is followed by its
//! positive control. Screenshots go to `$CREDBROKER_SCREENSHOTS` when set
//! (docs/screenshots/approval.png was made so), else to a temp dir.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};

use super::{DEPLOY, MAIL, POLICY};
use crate::support::browser::{idp_sign_in, Browsers};
use crate::support::oidc::OrgIdp;
use crate::support::{
    claims_of, free_loopback_addr, jose, key, now, require_peers, HttpAnswer, Opts, TestBroker,
};
use credbroker::internals::jose::Es256Key;

const ALICE_PW: &str = "alice's own password";
const MALLORY_PW: &str = "mallory's own password";

struct World {
    broker: TestBroker,
    idp: OrgIdp,
    base: String,
}

impl World {
    fn start() -> World {
        let addr = free_loopback_addr();
        let base = format!("http://{addr}");
        let idp = OrgIdp::start(&base, &[("alice", ALICE_PW), ("mallory", MALLORY_PW)]);
        let broker = TestBroker::start_with(Opts {
            policy: Some(POLICY.to_string()),
            extra_config: idp.config.clone(),
            public_listen: Some(addr),
            ..Opts::default()
        });
        World { broker, idp, base }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `/v1/derive` as `who`'s agent, signed by `k`.
    fn derive(
        &self,
        k: &Es256Key,
        who: &str,
        tool: &str,
        step: &str,
        details: Option<&Value>,
    ) -> HttpAnswer {
        let resource = if tool == "mail.send" { MAIL } else { DEPLOY };
        let mut body = json!({
            "subject_token": self.idp.tokens[who], "step": step, "tool": tool, "resource": resource,
        });
        if let Some(d) = details {
            body["authorization_details"] = d.clone();
        }
        self.broker.post_derive(&body, Some(&self.broker.proof(k)))
    }

    /// `/token` (RFC 8693 form) with the details JSON-encoded (RFC 9396
    /// section 6).
    fn token(
        &self,
        k: &Es256Key,
        who: &str,
        tool: &str,
        step: &str,
        details: &Value,
    ) -> HttpAnswer {
        let proof = credbroker::internals::dpop::make_proof(
            k,
            "POST",
            &format!("{}/token", self.broker.issuer),
            now(),
            None,
            None,
        )
        .unwrap();
        let details = details.to_string();
        self.broker.post_token(
            &[
                (
                    "grant_type",
                    "urn:ietf:params:oauth:grant-type:token-exchange",
                ),
                ("subject_token", &self.idp.tokens[who]),
                (
                    "subject_token_type",
                    "urn:ietf:params:oauth:token-type:access_token",
                ),
                ("resource", DEPLOY),
                ("step", step),
                ("tool", tool),
                ("authorization_details", &details),
            ],
            Some(&proof),
        )
    }

    fn events(&self, name: &str) -> Vec<Value> {
        self.broker
            .audit_lines()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }

    fn events_of(&self, name: &str, id: &str) -> Vec<Value> {
        self.events(name)
            .into_iter()
            .filter(|e| e["approval_id"] == id)
            .collect()
    }
}

/// The link of an `approval_required` refusal: (connect_uri, connect_id).
#[track_caller]
fn approval_link(a: &HttpAnswer) -> (String, String) {
    a.assert_refused(400, "invalid_grant", "approval needed");
    let j = a.json();
    assert_eq!(j["reason"], "approval_required", "{}", a.raw);
    assert!(j["connect_expires_in"].as_i64().unwrap() > 500, "{j}");
    assert!(
        j["connect_message"].as_str().unwrap().contains("mail.send")
            || j["connect_message"]
                .as_str()
                .unwrap()
                .contains("deploy.run")
    );
    (
        j["connect_uri"].as_str().unwrap().to_string(),
        j["connect_id"].as_str().unwrap().to_string(),
    )
}

fn mail(to: &[&str], subject: &str) -> Value {
    json!([{"type": "mail", "to": to, "subject": subject}])
}

fn cat(parts: &[Vec<Value>]) -> Value {
    Value::Array(parts.concat())
}

/// Everything but the clock-bound cases (`clock.rs`), in one world.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_in_chromium_with_the_org_idp() {
    require_peers();
    let mut w = World::start();
    let mut b = Browsers::start().await;
    let idp = w.idp.issuer.clone();
    let (ka, km) = (key(), key());

    // An undeclared field (a hidden bcc) is refused before any link is
    // made, on both endpoints; nothing is recorded as requested.
    let bcc = json!([{"type": "mail", "to": ["bob@example.com"], "subject": "Hi", "bcc": ["eve@evil.example"]}]);
    let r = w.derive(&ka, "alice", "mail.send", "send_reply", Some(&bcc));
    r.assert_refused(400, "invalid_authorization_details", "undeclared bcc");
    assert!(r.json().get("connect_uri").is_none(), "{}", r.raw);
    assert!(
        !r.body.contains("eve@evil.example"),
        "the refusal echoes no value"
    );
    let r = w.derive(&ka, "alice", "mail.send", "send_reply", None);
    r.assert_refused(
        400,
        "invalid_authorization_details",
        "required details missing",
    );
    let r = w.token(
        &ka,
        "alice",
        "deploy.run",
        "release",
        &json!([{"type": "deploy", "env": "prod", "commit": "c0ffee", "force": true}]),
    );
    r.assert_refused(
        400,
        "invalid_authorization_details",
        "undeclared field on /token",
    );
    assert!(w.events("approval.requested").is_empty());

    // (Mallory's link opened by Alice) Mallory's agent asks; Alice, signed
    // in as herself, opens the link: the 403 page, nothing changes.
    let m_call = mail(&["boss@example.com"], "Raise");
    let (m_uri, m_id) =
        approval_link(&w.derive(&km, "mallory", "mail.send", "send_reply", Some(&m_call)));
    assert!(m_uri.starts_with(&w.url("/connect/")), "{m_uri}");
    b.steps(
        "alice",
        cat(&[
            vec![
                json!({"goto": m_uri}),
                json!({"expect_url": w.url("/signin?return_to=")}),
            ],
            idp_sign_in(&idp, "alice", ALICE_PW),
            vec![
                json!({"expect_status": 403}),
                json!({"expect_text": "This link was made for another account"}),
                json!({"expect_text": "You are signed in as alice"}),
                json!({"expect_no_text": "mallory"}),
                json!({"expect_no_text": "Approve this call"}),
            ],
        ]),
    )
    .await;
    let ev = w.events_of("approval.opened_by_other_person", &m_id);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (ev[0]["person_sub"].as_str(), ev[0]["opener_sub"].as_str()),
        (Some("mallory"), Some("alice"))
    );
    assert!(w.events("approval.granted").is_empty());
    // Nothing changed: Mallory's call still waits, on the same link.
    assert_eq!(
        approval_link(&w.derive(&km, "mallory", "mail.send", "send_reply", Some(&m_call))).1,
        m_id
    );

    // Alice's own call, with hostile details: HTML, script, a right-to-left
    // override, a zero-width space and a 10 KB value.
    let long = "A".repeat(10 * 1024);
    let hostile = json!([{
        "type": "mail",
        "to": ["bob@example.com", "<script>alert(1)</script>@evil.example"],
        "subject": "Invoice \u{202E}fdp.exe\u{202C} <b>paid</b>\u{200B}",
        "body": long,
    }]);
    let (a_uri, a_id) =
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&hostile)));
    // The same call gets the same link, recorded once.
    let (again_uri, again_id) =
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&hostile)));
    assert_eq!(
        (again_uri.as_str(), again_id.as_str()),
        (a_uri.as_str(), a_id.as_str())
    );
    let requested = w.events_of("approval.requested", &a_id);
    assert_eq!(requested.len(), 1);
    // Details by hash; only the subject (log_in_clear) in clear.
    assert_eq!(requested[0]["details_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(
        requested[0]["details_in_clear"]["0.mail.subject"],
        hostile[0]["subject"]
    );
    let audit = std::fs::read_to_string(w.broker.path("data/audit.jsonl")).unwrap();
    assert!(
        !audit.contains("evil.example") && !audit.contains(&long[..64]),
        "recipients and body stay out of the audit log"
    );

    let page = b
        .steps(
            "alice",
            json!([
                {"goto": a_uri},
                {"expect_status": 200},
                {"expect_text": "Approve this call by repo-helper?"},
                {"expect_text": "mail.send"},
                {"expect_text": MAIL},
                {"expect_text": "Recipients"},
                {"expect_text": "Subject"},
                {"expect_text": "Message"},
                {"expect_text": "(10240 characters, shown in full)"},
                {"expect_text": "this one call only"},
                {"dom": ".detail .value"},
                {"dom": "script"},
                {"screenshot": "approval"},
                {"dom": ".footnote-named"},
                {"dom": ".footnote-marked"},
                {"dom": "mark.confusable"},
            ]),
        )
        .await;
    // Named code points, nothing that can be misread: only their footnote.
    let count = |i: usize| page[i]["dom"].as_array().unwrap().len();
    assert_eq!((count(13), count(14), count(15)), (1, 0, 0));
    let values = page[10]["dom"].as_array().unwrap().clone();
    assert_eq!(values.len(), 4, "{values:?}");
    assert!(
        values.iter().all(|v| v["tag"] == "bdi"),
        "each value is isolated in <bdi>"
    );
    let texts: Vec<&str> = values.iter().map(|v| v["text"].as_str().unwrap()).collect();
    // Escaped: the markup is text in the DOM, not elements.
    assert!(
        texts.contains(&"<script>alert(1)</script>@evil.example"),
        "{texts:?}"
    );
    assert_eq!(
        page[11]["dom"].as_array().unwrap().len(),
        0,
        "no script element on the page"
    );
    let script = values
        .iter()
        .find(|v| v["text"].as_str().unwrap().contains("alert"))
        .unwrap();
    assert!(
        script["html"].as_str().unwrap().contains("&lt;script&gt;"),
        "{script}"
    );
    // The override and the zero-width space are shown by name, not applied.
    let subject = texts.iter().find(|t| t.contains("Invoice")).unwrap();
    assert_eq!(*subject, "Invoice U+202Efdp.exeU+202C <b>paid</b>U+200B");
    assert!(!texts
        .iter()
        .any(|t| t.contains('\u{202E}') || t.contains('\u{200B}')));
    // The 10 KB value is all there, folded inside its box.
    let body = values
        .iter()
        .find(|v| v["text"].as_str().unwrap().starts_with("AAAA"))
        .unwrap();
    assert_eq!(body["text"].as_str().unwrap(), long, "never cut");
    assert!(
        body["overflow"].as_i64().unwrap() <= 1,
        "folded: {}",
        body["overflow"]
    );
    assert!(
        body["page_overflow"].as_i64().unwrap() <= 0,
        "the page does not scroll sideways"
    );

    // Text that can be misread is marked with each character's script: a
    // Cyrillic letter in a Latin address (mixed script), a Cyrillic word
    // that reads as Latin "paypa" (whole-script confusable), a combining
    // accent (NFD); an address in plain ASCII (the control) is not.
    let confusable = json!([{
        "type": "mail",
        "to": ["bob@p\u{430}ypal.com", "alice@example.com"],
        "subject": "\u{440}\u{430}\u{443}\u{440}\u{430}",
        "body": "Caf\u{e9} or cafe\u{301}",
    }]);
    let (c_uri, c_id) =
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&confusable)));
    let seen = b
        .steps(
            "alice",
            json!([
                {"goto": c_uri},
                {"expect_status": 200},
                {"dom": ".detail .value"},
                {"dom": ".detail .value mark.confusable"},
                {"dom": ".footnote-marked"},
                {"dom": ".footnote-named"},
                {"screenshot": "approval-confusable"},
                {"click": "button[value=decline]"},
                {"expect_url": w.url("/done/approval-declined")},
            ]),
        )
        .await;
    let dom = |i: usize| seen[i]["dom"].as_array().unwrap().clone();
    let texts = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|e| e["text"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        texts(&dom(2)),
        [
            "bob@p\u{430}Cyrillicypal.com",
            "alice@example.com",
            "\u{440}\u{430}\u{443}\u{440}\u{430}Cyrillic",
            "Caf\u{e9} or cafeU+0301combining",
        ]
    );
    let plain = &dom(2)[1];
    assert!(
        !plain["html"].as_str().unwrap().contains("<mark"),
        "the plain address is not marked: {plain}"
    );
    let marks = dom(3);
    assert_eq!(
        texts(&marks),
        [
            "\u{430}Cyrillic",
            "\u{440}\u{430}\u{443}\u{440}\u{430}Cyrillic",
            "U+0301combining"
        ]
    );
    assert!(marks
        .iter()
        .all(|m| m["tag"] == "mark" && m["html"].as_str().unwrap().contains("class=\"script\"")));
    assert_eq!(
        (dom(4).len(), dom(5).len()),
        (1, 0),
        "only the marks' footnote"
    );
    assert_eq!(w.events_of("approval.declined", &c_id).len(), 1);

    // The approval cannot be completed from another origin (here the IdP's,
    // same site, so the browser sends the cookie) or without the CSRF token.
    b.steps(
        "alice",
        json!([
            {"post_from": format!("{idp}/.well-known/openid-configuration"), "action": a_uri,
             "fields": {"action": "approve", "csrf": "guessed"}},
            {"expect_status": 403},
            {"expect_text": "sent from another site"},
            {"goto": a_uri},
            {"set_value": "form.actions input[name=csrf]", "value": ""},
            {"click": "button[value=approve]"},
            {"expect_status": 400},
            {"expect_text": "This form has expired"},
        ]),
    )
    .await;
    assert!(w.events("approval.granted").is_empty());
    assert_eq!(
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&hostile))).1,
        a_id
    );

    // Positive control: Alice approves on her own page.
    b.steps(
        "alice",
        json!([
            {"goto": a_uri},
            {"click": "button[value=approve]"},
            {"expect_url": w.url("/done/approved")},
            {"expect_text": "only that call"},
            {"goto": a_uri},
            {"expect_status": 404},
        ]),
    )
    .await;
    assert_eq!(w.events_of("approval.granted", &a_id).len(), 1);

    // A call with other details, or signed by another key, is not covered.
    let (changed, changed_id) = approval_link(&w.derive(
        &ka,
        "alice",
        "mail.send",
        "send_reply",
        Some(&mail(&["bob@example.com"], "Invoice")),
    ));
    assert_ne!(changed, a_uri);
    let (other_key, _) =
        approval_link(&w.derive(&key(), "alice", "mail.send", "send_reply", Some(&hostile)));
    assert_ne!(other_key, a_uri);

    // The retry of the approved call gets the token, with the details.
    let t = w.derive(&ka, "alice", "mail.send", "send_reply", Some(&hostile));
    let token = t.assert_issued("the approved call");
    let answer = t.json();
    assert_eq!(
        answer["authorization_details"], hostile,
        "RFC 9396 section 7"
    );
    assert!(answer["expires_in"].as_i64().unwrap() <= 60);
    let v = jose(
        "verify-token",
        json!({"token": token, "issuer": w.broker.issuer, "audience": MAIL}),
    )
    .await
    .unwrap_or_else(|e| panic!("jose refused the approved token: {e}"));
    let c = &v["claims"];
    assert_eq!(c["authorization_details"], hostile, "what the page showed");
    assert_eq!(c["approval_id"], a_id.as_str());
    assert_eq!(c["single_use"], true);
    assert!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap() <= 60);
    assert_eq!(w.events_of("approval.redeemed", &a_id).len(), 1);
    let issued: Vec<Value> = w
        .events("derive.issued")
        .into_iter()
        .filter(|e| e["approval_id"] == a_id.as_str())
        .collect();
    assert_eq!(issued.len(), 1);
    // jose's check is not vacuous: another audience is refused.
    assert_eq!(
        jose(
            "verify-token",
            json!({"token": token, "issuer": w.broker.issuer, "audience": DEPLOY})
        )
        .await
        .unwrap_err(),
        "ERR_JWT_CLAIM_VALIDATION_FAILED"
    );

    // A second redemption of the each_call approval is refused: a new link.
    let (second, second_id) =
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&hostile)));
    assert_ne!(
        (second.as_str(), second_id.as_str()),
        (a_uri.as_str(), a_id.as_str())
    );
    assert_eq!(w.events_of("approval.redeemed", &a_id).len(), 1);

    // Decline: the link closes and the retry is refused, until the call is
    // asked with other details.
    let d_call = mail(&["everyone@example.com"], "Reorg");
    let (d_uri, d_id) =
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&d_call)));
    b.steps(
        "alice",
        json!([
            {"goto": d_uri},
            {"click": "button[value=decline]"},
            {"expect_url": w.url("/done/approval-declined")},
            {"goto": d_uri},
            {"expect_status": 404},
        ]),
    )
    .await;
    assert_eq!(w.events_of("approval.declined", &d_id).len(), 1);
    let r = w.derive(&ka, "alice", "mail.send", "send_reply", Some(&d_call));
    r.assert_refused(403, "access_denied", "declined call");
    assert_eq!(r.json()["reason"], "approval_declined");
    approval_link(&w.derive(
        &ka,
        "alice",
        "mail.send",
        "send_reply",
        Some(&mail(&["team@example.com"], "Reorg")),
    ));

    // per_step: one approval covers repeated identical calls in the step
    // (on /token too), and nothing in another step.
    let deploy = json!([{"type": "deploy", "env": "prod", "commit": "c0ffee"}]);
    let (p_uri, p_id) = approval_link(&w.token(&ka, "alice", "deploy.run", "release", &deploy));
    let p_page = b
        .steps(
            "alice",
            json!([
                {"goto": p_uri},
                {"expect_text": "for 15 minutes from your approval"},
                {"dom": "mark.confusable"},
                {"dom": ".footnote-named"},
                {"dom": ".footnote-marked"},
                {"click": "button[value=approve]"},
                {"expect_url": w.url("/done/approved")},
            ]),
        )
        .await;
    // Plain values: no mark and no footnote.
    let none: Vec<usize> = (2..5)
        .map(|i| p_page[i]["dom"].as_array().unwrap().len())
        .collect();
    assert_eq!(none, [0, 0, 0]);
    // The event states the reach as the policy wrote it.
    let granted = w.events_of("approval.granted", &p_id);
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0]["approval_ttl"], "15m");
    let mut jtis = Vec::new();
    for _ in 0..3 {
        let t = w.token(&ka, "alice", "deploy.run", "release", &deploy);
        let token = t.assert_issued("per_step, same call in the step");
        assert_eq!(t.json()["authorization_details"], deploy);
        let c = claims_of(&token);
        assert_eq!(c["approval_id"], p_id.as_str());
        assert!(c.get("single_use").is_none(), "{c}");
        jtis.push(c["jti"].as_str().unwrap().to_string());
    }
    jtis.dedup();
    assert_eq!(jtis.len(), 3);
    assert!(
        w.events_of("approval.redeemed", &p_id).is_empty(),
        "per_step approvals are not used up"
    );
    let (v_uri, _) = approval_link(&w.token(&ka, "alice", "deploy.run", "verify", &deploy));
    assert_ne!(v_uri, p_uri);
    w.token(&ka, "alice", "deploy.run", "release", &deploy)
        .assert_issued("still covered in its step");

    // Five approvals wait for Alice now: the agent cannot flood her with a
    // sixth until she answers one.
    let s_call = mail(&["bob@example.com"], "Late");
    let r = w.derive(&ka, "alice", "mail.send", "send_reply", Some(&s_call));
    r.assert_refused(429, "rate_limited", "a sixth open approval");
    assert_eq!(r.json()["reason"], "too_many_open_approvals");
    b.steps(
        "alice",
        json!([{"goto": changed}, {"click": "button[value=decline]"}, {"expect_url": w.url("/done/approval-declined")}]),
    )
    .await;
    assert_eq!(w.events_of("approval.declined", &changed_id).len(), 1);

    // A stale sign-in (the IdP says 16 minutes ago) must sign in again
    // before the approval is offered.
    let (s_uri, s_id) =
        approval_link(&w.derive(&ka, "alice", "mail.send", "send_reply", Some(&s_call)));
    let aged = w
        .idp
        .peer
        .call(&json!({"cmd": "age_next_login", "user": "alice", "seconds": 16 * 60}));
    assert_eq!(aged["ok"], true);
    b.steps(
        "alice-later",
        cat(&[
            vec![json!({"goto": s_uri}), json!({"expect_url": w.url("/signin?return_to=")})],
            idp_sign_in(&idp, "alice", ALICE_PW),
            vec![
                json!({"expect_url": w.url("/signin?return_to=")}),
                json!({"expect_text": "Sign in again"}),
                json!({"expect_text": "approving a call needs a sign-in within the last 15 minutes"}),
                json!({"expect_no_text": "Approve this call"}),
            ],
            idp_sign_in(&idp, "alice", ALICE_PW),
            vec![
                json!({"expect_url": s_uri}),
                json!({"expect_text": "Approve this call by repo-helper?"}),
                json!({"click": "button[value=approve]"}),
                json!({"expect_url": w.url("/done/approved")}),
            ],
        ]),
    )
    .await;
    assert_eq!(w.events_of("approval.granted", &s_id).len(), 1);
    w.derive(&ka, "alice", "mail.send", "send_reply", Some(&s_call))
        .assert_issued("after a fresh sign-in");

    // Mallory's own link still works for Mallory.
    b.steps(
        "mallory",
        cat(&[
            vec![
                json!({"goto": m_uri}),
                json!({"expect_url": w.url("/signin?return_to=")}),
            ],
            idp_sign_in(&idp, "mallory", MALLORY_PW),
            vec![
                json!({"expect_url": m_uri}),
                json!({"click": "button[value=approve]"}),
                json!({"expect_url": w.url("/done/approved")}),
            ],
        ]),
    )
    .await;
    w.derive(&km, "mallory", "mail.send", "send_reply", Some(&m_call))
        .assert_issued("Mallory's own approval");
    b.finish().await;
}
