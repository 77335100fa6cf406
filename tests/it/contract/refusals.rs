//! Every refusal reason the code can send, walked: the socket's answers are
//! built by the broker's own mapping (`api::error_response`) from every
//! `DeriveError` there is, the proxy's reasons are read from its source,
//! and both must be exactly the reasons `proto/refusal.schema.json` lists.
//! Then the answers outside the derive pipeline (socket, public listener,
//! proxy, admin socket) from a running broker, and the check shown to fail
//! once a reason is taken out of the schema.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use credbroker::internals::connect::LinkKind;
use credbroker::internals::dpop::DpopError;
use credbroker::internals::exchange::{ApprovalRefusal, DeriveError, InternalError, LinkRefusal};
use credbroker::internals::mint::MintError;
use credbroker::internals::policy::{DenyReason, RouteDenial};
use credbroker::internals::reserved::RESERVED_REFUSALS;
use credbroker::internals::secret::SecretString;
use credbroker::internals::subject::SubjectError;
use credbroker::internals::upstreams::UpstreamError;
use credbroker::internals::vault::VaultError;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::support::contract::{
    check_refusal, is_broker_refusal, published, refusal_schema_json, repo, Validator,
};
use crate::support::*;

/// The index of each `DeriveError` variant. No wildcard: a new variant
/// does not compile until it is walked here (and in [`every_derive_error`]).
fn variant(e: &DeriveError) -> usize {
    match e {
        DeriveError::BadRequest(_) => 0,
        DeriveError::Subject(_) => 1,
        DeriveError::Proof(..) => 2,
        DeriveError::Target(_) => 3,
        DeriveError::Denied(_) => 4,
        DeriveError::RateLimited { .. } => 5,
        DeriveError::Unavailable(_) => 6,
        DeriveError::LinkRequired(_) => 7,
        DeriveError::InvalidDetails(_) => 8,
        DeriveError::ApprovalRequired(_) => 9,
        DeriveError::ApprovalDeclined => 10,
        DeriveError::TooManyApprovals => 11,
        DeriveError::UpstreamUnavailable { .. } => 12,
        DeriveError::Vault(_) => 13,
        DeriveError::Internal(_) => 14,
        DeriveError::Upstream { .. } => 15,
        DeriveError::ClockSkew(_) => 16,
        DeriveError::PersonRevoked => 17,
        DeriveError::RevocationWatchDown => 18,
    }
}
const VARIANTS: usize = 19;

/// Each way an exchange at an upstream can be refused; no wildcard.
fn every_upstream_error() -> Vec<UpstreamError> {
    let all = vec![
        UpstreamError::NotConfigured,
        UpstreamError::SubjectIssuerNotListed,
        UpstreamError::SubjectAudience,
        UpstreamError::ProofRequired {
            htu: "https://as.example/token".into(),
            nonce: None,
        },
        UpstreamError::ProofRequired {
            htu: "https://as.example/token".into(),
            nonce: Some("n0nce".into()),
        },
        UpstreamError::ProofInvalid("was already used (jti)"),
        UpstreamError::ProofCacheFull,
        UpstreamError::SubjectRejected,
        UpstreamError::Denied("invalid_scope"),
        UpstreamError::Misconfigured,
        UpstreamError::Unavailable,
        UpstreamError::BadAnswer("it is not JSON"),
        UpstreamError::TokenRejected("token_type is not DPoP (an unbound token)"),
        UpstreamError::Withdrawn,
    ];
    for e in &all {
        match e {
            UpstreamError::NotConfigured
            | UpstreamError::SubjectIssuerNotListed
            | UpstreamError::SubjectAudience
            | UpstreamError::ProofRequired { .. }
            | UpstreamError::ProofInvalid(_)
            | UpstreamError::ProofCacheFull
            | UpstreamError::SubjectRejected
            | UpstreamError::Denied(_)
            | UpstreamError::Misconfigured
            | UpstreamError::Unavailable
            | UpstreamError::BadAnswer(_)
            | UpstreamError::TokenRejected(_)
            | UpstreamError::Withdrawn => {}
        }
    }
    all
}

/// Each deny reason; no wildcard, as above.
fn every_deny_reason() -> Vec<DenyReason> {
    let all = vec![
        DenyReason::ToolNotAllowed,
        DenyReason::StepNotAllowed,
        DenyReason::ScopeNotAllowed,
        DenyReason::ResourceMismatch,
        DenyReason::Frozen,
    ];
    for r in &all {
        match r {
            DenyReason::ToolNotAllowed
            | DenyReason::StepNotAllowed
            | DenyReason::ScopeNotAllowed
            | DenyReason::ResourceMismatch
            | DenyReason::Frozen => {}
        }
    }
    all
}

fn every_link_kind() -> Vec<LinkKind> {
    let all = vec![LinkKind::Connect, LinkKind::Allow, LinkKind::Reconnect];
    for k in &all {
        match k {
            LinkKind::Connect | LinkKind::Allow | LinkKind::Reconnect => {}
        }
    }
    all
}

fn every_route_denial() -> Vec<RouteDenial> {
    let all = vec![
        RouteDenial::Frozen,
        RouteDenial::ToolNotAllowed,
        RouteDenial::ResourceMismatch,
        RouteDenial::RouteNotAllowed,
        RouteDenial::StepNotAllowed,
        RouteDenial::DetailsMismatch,
    ];
    for d in &all {
        match d {
            RouteDenial::Frozen
            | RouteDenial::ToolNotAllowed
            | RouteDenial::ResourceMismatch
            | RouteDenial::RouteNotAllowed
            | RouteDenial::StepNotAllowed
            | RouteDenial::DetailsMismatch => {}
        }
    }
    all
}

const CODE: &str = "Y1jBQmQ4Mu4Fua_O5B9l_HI_y0hRDonNsxxz6V22Inw";

fn link(kind: LinkKind) -> DeriveError {
    DeriveError::LinkRequired(Box::new(LinkRefusal {
        kind,
        uri: SecretString::new(format!("https://broker.example.com/connect/{CODE}")),
        id: "lnk_3f9a2c".into(),
        expires_in: 1800,
        message: "The agent \"triage-bot\" asks to use your GitHub account.".into(),
    }))
}

/// Every derive error, each variant at least once, with every deny reason,
/// link kind and the proof errors that answer differently.
fn every_derive_error() -> Vec<DeriveError> {
    let mut all = vec![
        DeriveError::BadRequest("step is missing".into()),
        DeriveError::Subject(SubjectError::UntrustedIssuer),
        DeriveError::Subject(SubjectError::IntrospectionUnavailable),
        DeriveError::Proof(DpopError::Missing, None),
        DeriveError::Proof(DpopError::UseNonce, Some("n0nce".into())),
        DeriveError::Proof(DpopError::ReplayCacheFull, None),
        // The resource given twice on the form endpoint (the error type
        // is not reachable from the tests; the parser makes one).
        credbroker::internals::api::parse_form(
            b"grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange&subject_token=x&subject_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Ajwt&resource=https%3A%2F%2Fa.example&resource=https%3A%2F%2Fb.example",
            None,
            0,
        )
        .map(|_| ())
        .expect_err("two resources"),
        DeriveError::RateLimited { retry_after: 2 },
        DeriveError::Unavailable("connected services are not configured"),
        DeriveError::ClockSkew(credbroker::internals::clock::TooFar {
            offset_ms: 90_000,
            max_ms: 5_000,
        }),
        DeriveError::InvalidDetails("authorization_details must be a JSON array".into()),
        DeriveError::ApprovalRequired(Box::new(ApprovalRefusal {
            uri: SecretString::new(format!("http://127.0.0.1:8080/connect/{CODE}")),
            id: "aGVsbG8td29ybGQ".into(),
            expires_in: 600,
            message: "The agent \"triage-bot\" asks to use the tool \"payments.send\".".into(),
        })),
        DeriveError::ApprovalDeclined,
        DeriveError::PersonRevoked,
        DeriveError::RevocationWatchDown,
        DeriveError::TooManyApprovals,
        DeriveError::UpstreamUnavailable {
            service: "acme".into(),
        },
        DeriveError::Vault(VaultError::Corrupt("a record does not open".into())),
        DeriveError::Internal(InternalError::Mint(MintError::Record)),
    ];
    all.extend(every_deny_reason().into_iter().map(DeriveError::Denied));
    all.extend(every_link_kind().into_iter().map(link));
    all.extend(
        every_upstream_error()
            .into_iter()
            .map(|error| DeriveError::Upstream {
                upstream: "org".into(),
                error,
            }),
    );
    let seen: BTreeSet<usize> = all.iter().map(variant).collect();
    assert_eq!(
        seen,
        (0..VARIANTS).collect(),
        "every DeriveError variant is walked"
    );
    all
}

/// The socket's answer to `e`, from the broker's one mapping.
async fn socket_answer(e: &DeriveError) -> (u16, http::HeaderMap, Value) {
    let r =
        credbroker::internals::api::error_response(e, &[credbroker::internals::jose::Alg::ES256]);
    let status = r.status().as_u16();
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        status,
        parts.headers,
        serde_json::from_slice(&bytes).unwrap(),
    )
}

/// The reasons `proto/refusal.schema.json` lists.
fn schema_reasons(schema: &Value) -> BTreeSet<String> {
    schema["properties"]["reason"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The reasons the proxy names by a literal in its source: every
/// `Refusal::Variant("reason", ...)` and `Refusal::Variant(...) =>
/// "reason"` in the proxy's files under `src/` (its refusals and their
/// mapping, whichever file of the module they move to). `Refusal::Derive(e) => e.reason()` and
/// the route denials are walked from their types.
fn proxy_literal_reasons() -> BTreeSet<String> {
    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    rust_files(&repo("src"), &mut files);
    let mut found = BTreeSet::new();
    for f in files {
        // Only the proxy's files (`src/proxy.rs`, `src/proxy/`, wherever
        // the module moves): the policy and the reloader have a `Refusal`
        // type of their own.
        let rel = f.strip_prefix(repo("src")).unwrap();
        if !rel.iter().any(|c| c.to_string_lossy().starts_with("proxy")) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let b = text.as_bytes();
        let mut i = 0;
        while let Some(at) = text[i..].find("Refusal::") {
            let mut j = i + at + "Refusal::".len();
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            i = j;
            let skip_ws = |mut k: usize| {
                while k < b.len() && b[k].is_ascii_whitespace() {
                    k += 1;
                }
                k
            };
            let literal = |k: usize| -> Option<String> {
                (b.get(k) == Some(&b'"')).then(|| {
                    let end = text[k + 1..].find('"').unwrap();
                    text[k + 1..k + 1 + end].to_string()
                })
            };
            let mut k = j;
            if b.get(k) == Some(&b'(') {
                if let Some(l) = literal(skip_ws(k + 1)) {
                    found.insert(l);
                    continue;
                }
                // Skip the balanced arguments, then look for `=> "reason"`.
                let mut depth = 0;
                while k < b.len() {
                    match b[k] {
                        b'(' => depth += 1,
                        b')' => {
                            depth -= 1;
                            if depth == 0 {
                                k += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
            }
            let k = skip_ws(k);
            if text[k..].starts_with("=>") {
                if let Some(l) = literal(skip_ws(k + 2)) {
                    found.insert(l);
                }
            }
        }
    }
    found
}

#[tokio::test]
async fn every_socket_refusal_matches_the_schema() {
    for e in every_derive_error() {
        let (status, headers, body) = socket_answer(&e).await;
        let what = format!("{e:?}");
        // The suite's hook recognises it as the broker's refusal...
        assert!(
            is_broker_refusal(status, |n| headers.get(n).and_then(|v| v.to_str().ok())),
            "{what}: {status} {headers:?}"
        );
        // ...and the schema accepts it.
        check_refusal(&body, &what);
    }
}

#[tokio::test]
async fn every_reason_the_code_sends_is_in_the_schema_and_no_other() {
    let mut code: BTreeSet<String> = BTreeSet::new();
    // The socket: the reasons its answers carry.
    for e in every_derive_error() {
        if let Some(r) = socket_answer(&e).await.2["reason"].as_str() {
            code.insert(r.to_string());
        }
    }
    // The proxy: its own reasons, the current policy's route denials, and
    // `DeriveError::reason()` of the errors the service source returns
    // (`Broker::service_token`: a link, the provider unavailable, the
    // service unavailable, the vault, an internal failure).
    let proxy = proxy_literal_reasons();
    assert!(
        proxy.contains("echo_blocked") && proxy.contains("not_a_proxy_address"),
        "the proxy's source was found: {proxy:?}"
    );
    code.extend(proxy);
    code.extend(every_route_denial().iter().map(|d| d.as_str().to_string()));
    let mut service_errors = vec![
        DeriveError::Unavailable("x"),
        DeriveError::UpstreamUnavailable {
            service: "acme".into(),
        },
        DeriveError::Vault(VaultError::Corrupt("x".into())),
        DeriveError::Internal(InternalError::Mint(MintError::Record)),
    ];
    service_errors.extend(every_link_kind().into_iter().map(link));
    code.extend(service_errors.iter().map(|e| e.reason().to_string()));

    // The reasons reserved for features not built yet (issue 38): in the
    // schema, but sent by nothing; one that is sent leaves the list.
    let reserved: BTreeSet<String> = RESERVED_REFUSALS
        .iter()
        .map(|r| r.reason.to_string())
        .collect();
    let sent_yet_reserved: Vec<_> = code.intersection(&reserved).collect();
    assert!(
        sent_yet_reserved.is_empty(),
        "reasons the broker sends that are still listed in edge::reserved::RESERVED_REFUSALS: {sent_yet_reserved:?}"
    );
    let declared: BTreeSet<String> = code.union(&reserved).cloned().collect();

    let json = refusal_schema_json();
    let schema = schema_reasons(&json);
    let missing: Vec<_> = declared.difference(&schema).collect();
    let stale: Vec<_> = schema.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "reasons the broker sends or reserves that proto/refusal.schema.json rejects: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "reasons proto/refusal.schema.json lists that no code sends or reserves: {stale:?}"
    );
    // The schema marks exactly the reserved ones as reserved.
    // (None is left: the schema then has no $defs/reservedReason.)
    let marked: BTreeSet<String> = json["$defs"]["reservedReason"]["enum"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    assert_eq!(
        marked, reserved,
        "$defs/reservedReason against RESERVED_REFUSALS"
    );
}

/// The statuses each `error` is documented with in the schema's rules.
fn statuses(error: &str) -> &'static [u16] {
    match error {
        "invalid_request" => &[400, 404, 413],
        "invalid_dpop_proof" | "use_dpop_nonce" => &[400, 401],
        "invalid_grant" => &[400],
        "access_denied" | "insufficient_scope" => &[403],
        "invalid_token" => &[401],
        "temporarily_unavailable" => &[503],
        "bad_gateway" => &[502],
        other => panic!("{other}: give the reserved refusal's error its statuses here"),
    }
}

#[test]
fn every_reserved_refusal_is_declared_with_its_error_and_status() {
    // Issue 41 sends its seven since it landed, issue 40 its clock_skew
    // (socket and proxy) and invalid_framing, issue 43 person_revoked and
    // revocation_watch_down (socket and proxy each), issue 42 its three,
    // issue 43 introspection_unavailable: none remains, and a reserved
    // refusal added later is checked here.
    for r in RESERVED_REFUSALS {
        let what = format!("{} ({} {}, {})", r.reason, r.status, r.error, r.at);
        assert!(statuses(r.error).contains(&r.status), "{what}");
        assert!(["socket", "proxy"].contains(&r.at), "{what}");
        // The answer it will be, with the members it adds, is valid...
        let mut body = json!({
            "error": r.error,
            "error_description": "reserved",
            "reason": r.reason,
        });
        for f in r.fields {
            body[*f] = json!(match *f {
                "upstream_error" => "invalid_scope",
                _ => "https://as.example/token",
            });
        }
        published()
            .verdict(&body)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // ...under its own error only: with an error whose rule does not
        // list it, refused.
        let mut elsewhere = body.clone();
        elsewhere["error"] = json!("upstream_timeout");
        assert!(published().verdict(&elsewhere).is_err(), "{what}");
        // Its added members come with it alone.
        for f in r.fields {
            let mut stray = json!({"error": "access_denied", "reason": "tool_not_allowed"});
            stray[*f] = body[*f].clone();
            assert!(
                published().verdict(&stray).is_err(),
                "{what}: {f} on another reason"
            );
        }
    }
    // A reason the schema does not reserve is refused (the control of the
    // check above): the list is closed.
    let unknown = json!({"error": "temporarily_unavailable", "reason": "clock_drift"});
    assert!(published().verdict(&unknown).is_err());
}

/// A copy of the schema without `reason` in its list of reasons.
fn schema_without(reason: &str) -> Validator {
    let mut s = refusal_schema_json();
    let list = s["properties"]["reason"]["enum"].as_array_mut().unwrap();
    let before = list.len();
    list.retain(|v| v != reason);
    assert_eq!(list.len(), before - 1, "{reason} was in the schema");
    Validator::new(s)
}

#[tokio::test]
async fn a_reason_taken_out_of_the_schema_fails_the_check() {
    for e in every_derive_error() {
        let body = socket_answer(&e).await.2;
        let Some(reason) = body["reason"].as_str() else {
            continue;
        };
        // Without its reason the schema refuses the broker's answer...
        let err = schema_without(reason)
            .verdict(&body)
            .expect_err("a reason missing from the schema is caught");
        assert!(err.contains("/reason"), "{reason}: {err}");
        // ...and the published one accepts it (the positive control).
        published().verdict(&body).unwrap();
    }
    // A shape the schema forbids is refused too: a link reason without its
    // link, and a link on a policy denial; their controls above pass.
    for bad in [
        json!({"error": "invalid_grant", "reason": "approval_required"}),
        json!({"error": "access_denied", "reason": "tool_not_allowed",
               "connect_uri": format!("https://b.example/connect/{CODE}")}),
        json!({"error": "insufficient_scope"}),
        json!({"error": "not_found", "reason": "frozen"}),
        json!({"error": "bad_gateway", "reason": "echo_blocked", "access_token": "eyJ..."}),
    ] {
        assert!(published().verdict(&bad).is_err(), "{bad}");
    }
}

/// One raw request on the public listener.
fn public_raw(b: &TestBroker, request: &str) -> HttpAnswer {
    use std::io::{Read, Write};
    let addr = b.public.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    HttpAnswer::parse(&String::from_utf8_lossy(&out))
}

#[tokio::test]
async fn refusals_outside_the_pipeline_match_the_schema() {
    let b = TestBroker::start();
    let k = key();
    let proof = b.proof(&k);
    let alice = b.subject_token("alice");
    let body = b.good_body(&alice).to_string();
    let refusals = [
        // The socket: a browser's Origin, an unknown path, the wrong
        // method, the wrong type, a body over the cap.
        (
            "origin",
            b.http(&http_derive(
                &body,
                Some(&proof),
                "origin: https://evil.example\r\n",
            )),
            403,
        ),
        (
            "unknown path",
            b.http(b"GET /v2/nothing HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
            404,
        ),
        (
            "wrong method",
            b.http(b"GET /v1/derive HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
            405,
        ),
        (
            "wrong type",
            b.http(
                format!(
                    "POST /v1/derive HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            ),
            415,
        ),
        (
            "body over the cap",
            b.http(&http_derive(&"x".repeat(65 * 1024), Some(&proof), "")),
            413,
        ),
        // The public listener: the derive endpoints are on the socket; the
        // proxy: no service named, then a call without a token.
        (
            "public /token",
            public_raw(
                &b,
                "POST /token HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            ),
            400,
        ),
        (
            "proxy without a service",
            public_raw(&b, "GET /proxy/ HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
            404,
        ),
    ];
    for (what, a, status) in &refusals {
        // Each is one of the broker's refusals, so HttpAnswer::parse has
        // held it to the schema already; checked again here by name.
        assert_eq!(a.status, *status, "{what}: {}", a.raw);
        assert!(
            is_broker_refusal(a.status, |n| a.header(n)),
            "{what}: {}",
            a.raw
        );
        check_refusal(&a.json(), what);
    }

    // The admin socket: an unknown path, a bad body, an account that exists.
    assert_eq!(b.admin_get("/nothing").unwrap().0, 404);
    assert_eq!(b.admin_post("/freeze", "maybe").unwrap().0, 400);
    let user = json!({"name": "contract-user", "password": "a long enough password"}).to_string();
    assert_eq!(b.admin_post("/users", &user).unwrap().0, 200);
    let (status, again) = b.admin_post("/users", &user).unwrap();
    assert_eq!(status, 409, "{again}");
    check_refusal(&serde_json::from_str(&again).unwrap(), "admin 409");

    // Positive control: the same derive without the Origin is issued.
    b.post_derive(&b.good_body(&alice), Some(&b.proof(&k)))
        .assert_issued("the control");
}
