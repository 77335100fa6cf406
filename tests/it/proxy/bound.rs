//! Request binding on the proxy (issue 42 item 1; docs/APPROVALS.md, "The
//! request, bound"): Alice approves one `POST` with a JSON body through
//! the real pages; the stand-in API records every request's bytes. The
//! approved request is served once, and the API receives exactly its
//! canonical bytes; every other request is refused with nothing upstream.
//! The same flow runs once more in Chromium: Alice reads the request on the
//! page (its DOM) and presses the button herself; screenshots go to
//! `$CREDBROKER_SCREENSHOTS` when set, else to a temp dir.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::client::DeriveParams;
use credbroker::verify::request::{self, BoundRequest};

use super::{proxy_policy, refusal, ProxyEnv, PROXY, READ_ROUTES};
use crate::support::browser::{local_sign_in, Browsers};
use crate::support::services::ProviderOpts;
use crate::support::*;

const PATH: &str = "/repos/octo/hello/pulls";
const QUERY: &str = "draft=1&notify=team";
const JSON: &str = "application/json";
/// What the tool means to send, as it writes it.
const BODY: &str = r#"{ "title": "Fix the build", "base": "main",
  "head": "fix-1", "amount": 9007199254740991, "memo": "p\u0430y" }"#;
/// The same members in another order and spacing.
const REORDERED: &str = r#"{"memo":"pаy","head":"fix-1","amount":9007199254740991,"base":"main","title":"Fix the build"}"#;
/// Its RFC 8785 form: what the API must receive.
const CANONICAL: &str = r#"{"amount":9007199254740991,"base":"main","head":"fix-1","memo":"pаy","title":"Fix the build"}"#;

/// A refused call: what it changes, its path and query, content type,
/// body, and the status and reason it gets.
type Case = (
    &'static str,
    String,
    Option<&'static str>,
    Vec<u8>,
    u16,
    &'static str,
);

fn policy() -> String {
    format!(
        r#"{}
[tools."acme.pr"]
resource = "{PROXY}"
scopes = ["repo"]
steps = ["triage"]
approval = "each_call"
routes = [
  {{ route = "POST /repos/{{owner}}/{{repo}}/pulls", bind_request = true }},
  {{ route = "PUT /repos/{{owner}}/{{repo}}/pulls", bind_request = true }},
]

[tools."acme.pr".authorization_details.pull]
title = {{ kind = "string", label = "Title" }}
base = {{ kind = "string", label = "Into branch" }}
"#,
        proxy_policy(READ_ROUTES)
    )
}

fn approved_request() -> BoundRequest<'static> {
    BoundRequest {
        method: "POST",
        path: PATH,
        query: QUERY,
        content_type: JSON,
        body: BODY.as_bytes(),
    }
}

async fn derive(p: &ProxyEnv, r: &BoundRequest<'_>) -> credbroker::client::Answer {
    let b = &p.env.broker;
    let proof = credbroker::client::proof(&p.key, "POST", &format!("{}/v1/derive", b.issuer), None)
        .unwrap();
    let subject = b.subject_token("alice");
    b.client()
        .derive_with_request(
            &DeriveParams {
                subject_token: &subject,
                step: "triage",
                tool: "acme.pr",
                resource: PROXY,
                scope: None,
            },
            None,
            r,
            &proof,
        )
        .await
        .unwrap()
}

/// A call through the proxy with the headers and body given.
async fn send(
    p: &ProxyEnv,
    token: &str,
    method: &str,
    path_and_query: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> reqwest::Response {
    let full = format!("/proxy/acme{path_and_query}");
    let proof = p.proof(token, method, full.split('?').next().unwrap());
    let mut rb = p
        .http
        .request(
            method.parse().unwrap(),
            format!("{}{full}", p.env.broker.public),
        )
        .header("authorization", format!("DPoP {token}"))
        .header("dpop", proof)
        // What a tool may add: never sent on.
        .header("content-digest", "sha-256=:AAAA:")
        .body(body.to_vec());
    if let Some(ct) = content_type {
        rb = rb.header("content-type", ct);
    }
    rb.send().await.unwrap()
}

#[tokio::test]
async fn the_approved_request_is_sent_once_as_canonical_bytes_and_no_other() {
    let mut p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(policy()),
            ..ProviderOpts::default()
        },
    )
    .await;
    let expected = request::bind(&approved_request()).unwrap();
    assert_eq!(expected.body, CANONICAL.as_bytes());

    // The derive refuses a body that is not I-JSON before any link exists
    // (the socket names no reason); control: the approved body asks for
    // approval.
    let mut dup = approved_request();
    let dup_body = r#"{"title":"a","title":"b"}"#;
    dup.body = dup_body.as_bytes();
    let r = services::refused(derive(&p, &dup).await);
    assert_eq!(
        (r.error.as_str(), r.reason.as_deref()),
        ("invalid_request", None),
        "{r:?}"
    );
    let r = services::refused(derive(&p, &approved_request()).await);
    assert_eq!(r.reason.as_deref(), Some("approval_required"), "{r:?}");
    let uri = r.connect_uri.unwrap();

    // The page shows where it goes, the method and every body field.
    let path = &uri[uri.find("/connect/").unwrap()..];
    let html = p.env.open_signed_in(path, "alice").await;
    let api_base = p.api.base.clone();
    for shown in [
        format!("{api_base}{PATH}?draft=1&#38;notify=team"),
        "<code class=\"method\">POST</code>".into(),
        "<dt>Title</dt>".into(),
        "Fix the build".into(),
        "<dt>Into branch</dt>".into(),
        "<h3>Other fields</h3>".into(),
        "<dt>amount</dt>".into(),
        "9007199254740991".into(),
        "fix-1".into(),
        // The Cyrillic letter in "pаy" is marked with its script.
        "Cyrillic".into(),
    ] {
        assert!(html.contains(&shown), "the page lacks {shown}:\n{html}");
    }
    p.env.play_pages(&uri, "alice", "").await;
    let t = services::issued(derive(&p, &approved_request()).await);
    let token = t.access_token.expose().clone();
    let claims = claims_of(&token);
    assert_eq!(claims["req_sha256"], expected.sha256.as_str());
    assert_eq!(claims["single_use"], true);

    // Each refused with nothing upstream; the token stays unspent.
    let pq = format!("{PATH}?{QUERY}");
    let changed = BODY.replace("fix-1", "fix-2");
    let cases: Vec<Case> = vec![
        (
            "one body byte changed",
            pq.clone(),
            Some(JSON),
            changed.into_bytes(),
            403,
            "request_mismatch",
        ),
        (
            "a duplicate key",
            pq.clone(),
            Some(JSON),
            BODY.replace(
                "\"base\": \"main\"",
                "\"base\": \"main\", \"base\": \"evil\"",
            )
            .into_bytes(),
            400,
            "body_not_ijson",
        ),
        (
            "2^53 + 1",
            pq.clone(),
            Some(JSON),
            BODY.replace("9007199254740991", "9007199254740993")
                .into_bytes(),
            400,
            "body_not_ijson",
        ),
        (
            "2^53 + 1 written with an exponent",
            pq.clone(),
            Some(JSON),
            BODY.replace("9007199254740991", "9.007199254740993e15")
                .into_bytes(),
            400,
            "body_not_ijson",
        ),
        (
            "a lone surrogate",
            pq.clone(),
            Some(JSON),
            BODY.replace("p\\u0430y", "p\\ud800y").into_bytes(),
            400,
            "body_not_ijson",
        ),
        (
            "an added query parameter",
            format!("{pq}&bcc=mallory"),
            Some(JSON),
            BODY.into(),
            403,
            "request_mismatch",
        ),
        (
            "the query reordered",
            format!("{PATH}?notify=team&draft=1"),
            Some(JSON),
            BODY.into(),
            403,
            "request_mismatch",
        ),
        (
            "no query",
            PATH.to_string(),
            Some(JSON),
            BODY.into(),
            403,
            "request_mismatch",
        ),
        (
            "another content type",
            pq.clone(),
            Some("text/plain"),
            BODY.into(),
            403,
            "request_mismatch",
        ),
        (
            "a charset added",
            pq.clone(),
            Some("application/json; charset=utf-8"),
            BODY.into(),
            403,
            "request_mismatch",
        ),
        (
            "no content type",
            pq.clone(),
            None,
            BODY.into(),
            403,
            "request_mismatch",
        ),
        (
            "a body over 16 KiB",
            pq.clone(),
            Some(JSON),
            format!("{{\"memo\":\"{}\"}}", "x".repeat(request::MAX_BOUND_BODY)).into_bytes(),
            413,
            "bound_body_too_large",
        ),
    ];
    for (what, pq, ct, body, status, reason) in &cases {
        let (s, b) = refusal(send(&p, &token, "POST", pq, *ct, body).await).await;
        assert_eq!(
            (s, b["reason"].as_str()),
            (*status, Some(*reason)),
            "{what}: {b}"
        );
    }
    // Another method, on a route that binds too.
    let (s, b) = refusal(send(&p, &token, "PUT", &pq, Some(JSON), BODY.as_bytes()).await).await;
    assert_eq!(
        (s, b["reason"].as_str()),
        (403, Some("request_mismatch")),
        "PUT: {b}"
    );
    assert!(p.api.records().is_empty(), "nothing went upstream");

    // Positive control: the approved request, its members reordered and
    // spaced otherwise, is served once, as its canonical bytes.
    let r = send(&p, &token, "POST", &pq, Some(JSON), REORDERED.as_bytes()).await;
    assert_eq!(r.status(), 201);
    let records = p.api.records();
    assert_eq!(records.len(), 1);
    let sent = &records[0];
    assert_eq!(
        sent.body,
        CANONICAL.as_bytes(),
        "the API got the canonical bytes"
    );
    assert_eq!(
        sent.header("content-length"),
        Some(CANONICAL.len().to_string().as_str())
    );
    assert_eq!(sent.header("content-type"), Some(JSON));
    assert_eq!(
        sent.header("content-digest"),
        None,
        "the tool's Content-Digest is not sent"
    );
    assert_eq!(
        (sent.path.as_str(), sent.query.as_deref()),
        (PATH, Some(QUERY))
    );

    // Once only.
    let (s, b) = refusal(send(&p, &token, "POST", &pq, Some(JSON), BODY.as_bytes()).await).await;
    assert_eq!(
        (s, b["reason"].as_str()),
        (401, Some("token_already_used")),
        "{b}"
    );
    assert_eq!(p.api.records().len(), 1);

    // The audit: the approval and the call carry the digest.
    let audit = p
        .env
        .broker
        .audit_lines_until(|es| {
            es.iter()
                .any(|e| e["event"] == "proxy.completed" && e["proxy"]["upstream_status"] == 201)
        })
        .await;
    let granted = audit
        .iter()
        .find(|e| e["event"] == "approval.granted")
        .unwrap();
    assert_eq!(granted["request_sha256"], expected.sha256.as_str());
    let issued = audit
        .iter()
        .find(|e| e["event"] == "derive.issued" && e["tool"] == "acme.pr")
        .unwrap();
    assert_eq!(issued["request_sha256"], expected.sha256.as_str());
    let sent = audit
        .iter()
        .find(|e| e["event"] == "proxy.request")
        .unwrap();
    assert_eq!(sent["proxy"]["request_sha256"], expected.sha256.as_str());
    let mismatch = audit
        .iter()
        .filter(|e| e["reason"] == "request_mismatch")
        .count();
    assert!(mismatch >= 8, "each refusal is recorded: {mismatch}");
}

/// The DOM texts of step `i`'s `dom` answer.
fn dom_texts(page: &[serde_json::Value], i: usize) -> Vec<String> {
    page[i]["dom"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_approves_the_bound_post_in_chromium_and_only_it_is_sent() {
    let mut p = ProxyEnv::start_with(
        "",
        ProviderOpts {
            policy: Some(policy()),
            ..ProviderOpts::default()
        },
    )
    .await;
    let mut b = Browsers::start().await;
    let password = p.env.local_user("alice");
    let expected = request::bind(&approved_request()).unwrap();
    let r = services::refused(derive(&p, &approved_request()).await);
    assert_eq!(r.reason.as_deref(), Some("approval_required"), "{r:?}");
    let uri = r.connect_uri.unwrap();

    // Alice opens the link, signs in, reads what will be sent, approves.
    let upstream = format!("{}{PATH}?{QUERY}", p.api.base);
    // The issuer's address has port 0 here: the pages are at `public`.
    let public = p.env.broker.public.clone();
    let link = format!("{public}{}", &uri[uri.find("/connect/").unwrap()..]);
    let mut steps = vec![serde_json::json!({"goto": link})];
    steps.extend(local_sign_in("alice", &password));
    steps.extend([
        serde_json::json!({"expect_status": 200}),
        serde_json::json!({"expect_text": "What will be sent, exactly"}),
        serde_json::json!({"dom": "section.request code.method"}),
        serde_json::json!({"dom": "section.request dd.url bdi.value"}),
        serde_json::json!({"dom": "section.request dl.facts dt"}),
        serde_json::json!({"dom": "section.request ul.values bdi.value"}),
        serde_json::json!({"screenshot": "approval-bound-request"}),
        serde_json::json!({"click": "button[value=approve]"}),
        serde_json::json!({"expect_url": format!("{public}/done/approved")}),
    ]);
    let page = b.steps("alice", serde_json::Value::Array(steps)).await;
    let at = page.len() - 7;
    assert_eq!(dom_texts(&page, at), ["POST"]);
    assert_eq!(dom_texts(&page, at + 1), [upstream]);
    let labels = dom_texts(&page, at + 2);
    for label in [
        "Method",
        "To",
        "Content type",
        "Title",
        "Into branch",
        "amount",
        "head",
        "memo",
    ] {
        assert!(labels.iter().any(|l| l == label), "{label} in {labels:?}");
    }
    let values = dom_texts(&page, at + 3);
    for v in ["Fix the build", "main", "9007199254740991", "fix-1"] {
        assert!(values.iter().any(|t| t == v), "{v} in {values:?}");
    }
    // The Cyrillic letter of "pаy" is marked with its script in the DOM.
    assert!(
        values
            .iter()
            .any(|t| t.starts_with('p') && t.contains("Cyrillic")),
        "{values:?}"
    );
    assert!(b.shots.join("approval-bound-request.png").is_file());
    b.finish().await;

    let t = services::issued(derive(&p, &approved_request()).await);
    let token = t.access_token.expose().clone();
    assert_eq!(claims_of(&token)["req_sha256"], expected.sha256.as_str());

    // A changed body: refused, nothing upstream, the token not spent.
    let pq = format!("{PATH}?{QUERY}");
    let changed = BODY.replace("Fix the build", "Fix the build and push to main");
    let (s, body) =
        refusal(send(&p, &token, "POST", &pq, Some(JSON), changed.as_bytes()).await).await;
    assert_eq!(
        (s, body["reason"].as_str()),
        (403, Some("request_mismatch")),
        "{body}"
    );
    assert!(p.api.records().is_empty(), "nothing went upstream");

    // Control: the approved request is served, once, as its canonical bytes.
    let r = send(&p, &token, "POST", &pq, Some(JSON), BODY.as_bytes()).await;
    assert_eq!(r.status(), 201);
    let records = p.api.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body, CANONICAL.as_bytes());
    let (s, body) = refusal(send(&p, &token, "POST", &pq, Some(JSON), BODY.as_bytes()).await).await;
    assert_eq!(
        (s, body["reason"].as_str()),
        (401, Some("token_already_used")),
        "{body}"
    );
    assert_eq!(p.api.records().len(), 1);
}
