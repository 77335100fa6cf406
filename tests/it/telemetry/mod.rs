//! OpenTelemetry export (issue 44 items 1-3), read by a test receiver in
//! Python that decodes OTLP with the official `opentelemetry-proto`
//! package (tests/peers/otlp_receiver.py): the spans of one derive and its
//! proxied call form one trace with the right parents; a `traceparent` on
//! the socket is the parent when trusted, linked otherwise; a tool's on
//! the proxy is a link, never the parent; metrics arrive; no secret of a
//! call (its path, query, body, tokens, proofs) is in anything exported.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod pages;

use crate::proxy::{ProxyEnv, PROXY};
use crate::support::services::ProviderOpts;
use crate::support::*;

/// The receiver: a Python process on a loopback port.
pub(crate) struct Receiver {
    child: Child,
    pub base: String,
}

impl Receiver {
    pub(crate) fn start() -> Receiver {
        let py = crate::support::prereq::venv_python(
            &["opentelemetry.proto.collector.trace.v1.trace_service_pb2"],
            "import importlib.metadata as m; assert m.version('opentelemetry-proto') == '1.45.2'",
        );
        let mut child = Command::new(py)
            .arg(crate::support::prereq::repo().join("tests/peers/otlp_receiver.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let hello: Value = serde_json::from_str(&line).unwrap();
        Receiver {
            child,
            base: format!("http://127.0.0.1:{}", hello["port"]),
        }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    pub(crate) async fn spans(&self) -> Vec<Value> {
        let v: Value = self.get("/spans").await.json().await.unwrap();
        assert_eq!(v["rejected"], serde_json::json!([]), "undecodable exports");
        v["spans"].as_array().unwrap().clone()
    }

    /// Spans until `done` holds (at most 20 s).
    pub(crate) async fn spans_until(&self, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let s = self.spans().await;
            if done(&s) || start.elapsed() > Duration::from_secs(20) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every metrics export so far.
    pub(crate) async fn metric_exports(&self) -> Vec<Value> {
        let v: Value = self.get("/metrics").await.json().await.unwrap();
        assert_eq!(v["rejected"], serde_json::json!([]), "undecodable exports");
        v["exports"].as_array().unwrap().clone()
    }

    /// Every body received, concatenated.
    pub(crate) async fn raw(&self) -> Vec<u8> {
        self.get("/raw").await.bytes().await.unwrap().to_vec()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `[telemetry]` table for `receiver` (in `ProxyEnv`'s `[proxy]` keys:
/// a new table header ends that one).
fn telemetry_table(receiver: &Receiver, more: &str) -> String {
    format!(
        "\n[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval = \"1s\"\n{more}\n",
        receiver.base
    )
}

fn named<'a>(spans: &'a [Value], name: &str, trace: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["name"] == name && s["trace_id"] == trace)
        .collect()
}

fn one<'a>(spans: &'a [Value], name: &str, trace: &str) -> &'a Value {
    let found = named(spans, name, trace);
    assert_eq!(
        found.len(),
        1,
        "one {name} span in trace {trace}: {spans:#?}"
    );
    found[0]
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A raw derive for the proxy's address with extra header lines.
fn derive_with(p: &ProxyEnv, tool: &str, step: &str, headers: &str) -> String {
    let b = &p.env.broker;
    let body = serde_json::json!({
        "subject_token": b.subject_token("alice"), "step": step, "tool": tool, "resource": PROXY,
    });
    b.http(&http_derive(
        &body.to_string(),
        Some(&b.proof(&p.key)),
        headers,
    ))
    .assert_issued("a traced derive")
}

/// A tool's proxied call with extra headers.
async fn call_with(
    p: &ProxyEnv,
    token: &str,
    method: &str,
    path_and_query: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let full = format!("/proxy/acme{path_and_query}");
    let path = full.split('?').next().unwrap();
    let proof = p.proof(token, method, path);
    let mut rb = p
        .http
        .request(
            method.parse().unwrap(),
            format!("{}{full}", p.env.broker.public),
        )
        .header("authorization", format!("DPoP {token}"))
        .header("dpop", proof);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb.header("content-type", "application/json").body(b);
    }
    rb.send().await.unwrap()
}

const ORCHESTRATOR_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const ORCHESTRATOR_SPAN: &str = "00f067aa0ba902b7";
const TOOL_TRACE: &str = "11111111111111111111111111111111";
const TOOL_SPAN: &str = "2222222222222222";

#[tokio::test]
async fn a_derive_and_its_proxied_call_are_one_trace_and_a_tools_traceparent_is_only_linked() {
    let rx = Receiver::start();
    let p = ProxyEnv::start_with(
        &telemetry_table(
            &rx,
            "trust_socket_traceparent = true\npropagate_to = [\"providers\"]",
        ),
        ProviderOpts {
            log: Some("debug".into()),
            ..ProviderOpts::default()
        },
    )
    .await;
    let token = derive_with(
        &p,
        "acme.read",
        "triage",
        &format!(
            "traceparent: 00-{ORCHESTRATOR_TRACE}-{ORCHESTRATOR_SPAN}-01\r\ntracestate: vendor=abc\r\nbaggage: user=alice\r\n"
        ),
    );
    let tool_parent = format!("00-{TOOL_TRACE}-{TOOL_SPAN}-01");
    let r = call_with(
        &p,
        &token,
        "GET",
        "/repos/octo/hello/issues",
        None,
        &[
            ("traceparent", tool_parent.as_str()),
            ("tracestate", "tool=xyz"),
            ("baggage", "secret=tool-baggage"),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.unwrap();

    let t = ORCHESTRATOR_TRACE;
    let spans = rx
        .spans_until(|s| {
            !named(s, "proxy", t).is_empty() && !named(s, "proxy.answer", t).is_empty()
        })
        .await;
    // The derive: a child of the orchestrator's span (trusted), with its
    // steps as children.
    let derive = one(&spans, "derive", t);
    assert_eq!(derive["parent_span_id"], ORCHESTRATOR_SPAN);
    assert_eq!(derive["kind"], 2, "SERVER");
    assert_eq!(derive["trace_state"], "vendor=abc");
    assert_eq!(derive["attributes"]["credbroker.tool"], "acme.read");
    assert_eq!(derive["attributes"]["credbroker.outcome"], "issued");
    assert_eq!(derive["resource"]["service.name"], "credbroker");
    let derive_id = derive["span_id"].as_str().unwrap();
    for step in ["derive.subject", "derive.policy", "derive.service"] {
        assert_eq!(one(&spans, step, t)["parent_span_id"], derive_id, "{step}");
    }
    // The proxied call: in the derive's trace, a child of the derive; the
    // tool's traceparent is a link, and no span is in the tool's trace.
    let proxy = one(&spans, "proxy", t);
    assert_eq!(proxy["parent_span_id"], derive_id);
    assert_eq!(
        proxy["links"],
        serde_json::json!([{"trace_id": TOOL_TRACE, "span_id": TOOL_SPAN, "trace_state": ""}])
    );
    assert!(
        spans.iter().all(|s| s["trace_id"] != TOOL_TRACE),
        "a tool chose no trace id"
    );
    assert_eq!(
        proxy["attributes"]["http.route"],
        "/proxy/acme/repos/{owner}/{repo}/issues"
    );
    assert_eq!(proxy["attributes"]["http.response.status_code"], 200);
    assert_eq!(proxy["attributes"]["credbroker.outcome"], "completed");
    let proxy_id = proxy["span_id"].as_str().unwrap();
    for step in ["proxy.checks", "proxy.upstream", "proxy.answer"] {
        assert_eq!(one(&spans, step, t)["parent_span_id"], proxy_id, "{step}");
    }
    let upstream = one(&spans, "proxy.upstream", t);
    assert_eq!(upstream["kind"], 3, "CLIENT");

    // The provider got the broker's traceparent (propagate_to = providers),
    // never the tool's, and no baggage.
    let rec = p.api.records().into_iter().last().unwrap();
    let header = |n: &str| {
        rec.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        header("traceparent"),
        vec![format!(
            "00-{t}-{}-01",
            upstream["span_id"].as_str().unwrap()
        )]
    );
    // The trusted tracestate of the derive goes with it (capped), never
    // the tool's, and nobody's baggage.
    assert_eq!(header("tracestate"), vec!["vendor=abc".to_string()]);
    assert_eq!(proxy["trace_state"], "vendor=abc");
    assert!(header("baggage").is_empty());

    // The audit events and the log lines of both requests carry the id.
    let audit = p.env.broker.audit_lines();
    for kind in ["derive.issued", "proxy.request", "proxy.completed"] {
        let e = audit
            .iter()
            .rev()
            .find(|e| e["event"] == kind)
            .unwrap_or_else(|| panic!("{kind}"));
        assert_eq!(e["trace_id"], t, "{kind}: {e}");
    }
    let log = p.env.broker.log_text();
    assert!(log.contains(&format!("trace_id={t}")), "{log}");

    // Metrics arrive, mapped from the Prometheus registry.
    let start = Instant::now();
    let exports = loop {
        let e = rx.metric_exports().await;
        let has = |e: &[Value]| {
            e.iter().flat_map(|x| x.as_array().unwrap()).any(|m| {
                m["name"] == "credbroker_proxy_requests_total"
                    && m["points"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["attributes"]["outcome"] == "completed")
            })
        };
        if has(&e) || start.elapsed() > Duration::from_secs(15) {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let last = exports
        .last()
        .expect("a metrics export")
        .as_array()
        .unwrap();
    let metric = |name: &str| {
        last.iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {last:#?}"))
    };
    let derives = metric("credbroker_derives_total");
    assert_eq!(derives["type"], "sum");
    assert_eq!(derives["monotonic"], true);
    assert!(derives["points"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["attributes"]["tool"] == "acme.read" && p["value"].as_f64() >= Some(1.0)));
    assert_eq!(
        metric("credbroker_derive_duration_seconds")["type"],
        "histogram"
    );
    assert_eq!(
        metric("credbroker_otel_spans_dropped_total")["points"][0]["value"],
        0.0
    );
    assert_eq!(metric("credbroker_ready")["type"], "gauge");
}

#[tokio::test]
async fn an_untrusted_socket_traceparent_is_linked_not_the_parent() {
    let rx = Receiver::start();
    let p = ProxyEnv::start_with(&telemetry_table(&rx, ""), ProviderOpts::default()).await;
    let parent = format!("00-{ORCHESTRATOR_TRACE}-{ORCHESTRATOR_SPAN}-01");
    let token = derive_with(
        &p,
        "acme.read",
        "triage",
        &format!("traceparent: {parent}\r\n"),
    );
    let spans = rx
        .spans_until(|s| {
            s.iter()
                .any(|x| x["name"] == "derive" && !x["links"].as_array().unwrap().is_empty())
        })
        .await;
    let derive = spans
        .iter()
        .find(|s| s["name"] == "derive" && !s["links"].as_array().unwrap().is_empty())
        .expect("the traced derive");
    assert_ne!(derive["trace_id"], ORCHESTRATOR_TRACE);
    assert_eq!(derive["parent_span_id"], "");
    assert_eq!(derive["links"][0]["trace_id"], ORCHESTRATOR_TRACE);
    assert_eq!(derive["links"][0]["span_id"], ORCHESTRATOR_SPAN);
    // Positive control: the proxied call continues the derive's own trace,
    // and nothing was propagated to the provider (propagate_to unset).
    let r = call_with(&p, &token, "GET", "/user", None, &[]).await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.unwrap();
    let t = derive["trace_id"].as_str().unwrap().to_string();
    let spans = rx.spans_until(|s| !named(s, "proxy", &t).is_empty()).await;
    assert_eq!(
        one(&spans, "proxy", &t)["parent_span_id"],
        derive["span_id"]
    );
    let rec = p.api.records().into_iter().last().unwrap();
    assert!(
        !rec.headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("traceparent")),
        "{:?}",
        rec.headers
    );
}

/// The allowlist and the canary: a proxied call with a secret in its path,
/// query and body, and every token, proof and provider secret of the run,
/// are in nothing exported (spans and metrics); the broker's own names
/// are (positive control).
#[tokio::test]
async fn no_secret_of_a_call_is_exported() {
    let rx = Receiver::start();
    let p = ProxyEnv::start_with(&telemetry_table(&rx, ""), ProviderOpts::default()).await;
    let path_secret = "pathsecret0c4n4ry";
    let query_secret = "querysecret0c4n4ry";
    let body_secret = "bodysecret0c4n4ry";
    let write = p.token("acme.write", "open_pr").await;
    let r = call_with(
        &p,
        &write,
        "POST",
        &format!("/repos/{path_secret}/hello/pulls?title={query_secret}"),
        Some(format!("{{\"body\":\"{body_secret}\"}}").into_bytes()),
        &[("x-note", body_secret)],
    )
    .await;
    let status = r.status();
    let _ = r.bytes().await.unwrap();
    let rec = p.api.records().into_iter().last().unwrap();
    assert!(
        rec.path.contains(path_secret),
        "positive control: the call went upstream ({status})"
    );
    // An unknown tool and step, declared nowhere: their values leave as
    // HMACs only.
    let b = &p.env.broker;
    let undeclared_tool = "undeclaredtool0c4n4ry";
    let _ = b.post_derive(
        &serde_json::json!({
            "subject_token": b.subject_token("alice"), "step": "triage",
            "tool": undeclared_tool, "resource": PROXY,
        }),
        Some(&b.proof(&p.key)),
    );
    let spans = rx
        .spans_until(|s| {
            s.iter().any(|x| x["name"] == "proxy.answer")
                && s.iter().any(|x| {
                    x["name"] == "derive" && x["attributes"]["credbroker.tool_hmac"].is_string()
                })
        })
        .await;
    assert!(spans.iter().any(|x| x["name"] == "proxy.answer"));
    // Metrics too.
    let start = Instant::now();
    while rx.metric_exports().await.len() < 2 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(rx.metric_exports().await.len() >= 2, "metrics exported");
    let raw = rx.raw().await;
    let mut secrets: Vec<String> = p.provider_tokens().await;
    assert!(!secrets.is_empty());
    secrets.extend([
        write.clone(),
        b.subject_token("alice"),
        p.env.client_secret.clone(),
        path_secret.into(),
        query_secret.into(),
        body_secret.into(),
        undeclared_tool.into(),
    ]);
    for s in &secrets {
        assert!(!contains(&raw, s.as_bytes()), "a secret is exported");
    }
    // The JWT parts of our token alone, too (a signature, a payload).
    for part in write.split('.') {
        assert!(!contains(&raw, part.as_bytes()));
    }
    // Positive control: the scan reads what was exported.
    for want in [
        "proxy.checks",
        "acme.write",
        "/proxy/acme/repos/{owner}/{repo}/pulls",
        "credbroker_derives_total",
    ] {
        assert!(contains(&raw, want.as_bytes()), "{want} exported");
    }
}

/// The Rust client passes an MCP request's `_meta` trace context on
/// (`Client::with_trace`): with `trust_socket_traceparent` the derive's
/// trace is the caller's, which its audit event names; without it, or with
/// a malformed one, the derive is a trace of the broker's own.
#[tokio::test]
async fn the_rust_clients_meta_trace_context_is_the_derive_spans_parent() {
    use credbroker::client::mcp::trace_from_meta;
    use credbroker::client::{Answer, DeriveParams};
    let rx = Receiver::start();
    let b = TestBroker::start_with(Opts {
        extra_config: telemetry_table(&rx, "trust_socket_traceparent = true\nmetrics = false"),
        ..Opts::default()
    });
    let k = key();
    let subject = b.subject_token("alice");
    let params = DeriveParams {
        subject_token: &subject,
        step: "summarize",
        tool: "notes.read",
        resource: RESOURCE,
        scope: None,
    };
    let last_trace = || {
        b.audit_lines()
            .iter()
            .rev()
            .find(|e| e["event"] == "derive.issued")
            .unwrap()["trace_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let meta = serde_json::json!({
        "traceparent": format!("00-{ORCHESTRATOR_TRACE}-{ORCHESTRATOR_SPAN}-01"),
        "tracestate": "vendor=abc", "baggage": "user=alice", "progressToken": 7,
    });
    let bad = serde_json::json!({
        "traceparent": format!("00-{}-{ORCHESTRATOR_SPAN}-01", ORCHESTRATOR_TRACE.to_uppercase()),
    });
    let client = b.client();
    for (c, own) in [
        (client.clone(), true),
        (client.with_trace(trace_from_meta(&bad)), true),
        (client.with_trace(trace_from_meta(&meta)), false),
    ] {
        let a = c.derive(&params, &k).await.unwrap();
        assert!(matches!(a, Answer::Issued(_)));
        assert_eq!(last_trace() != ORCHESTRATOR_TRACE, own);
    }
    let spans = rx
        .spans_until(|s| !named(s, "derive", ORCHESTRATOR_TRACE).is_empty())
        .await;
    let derive = one(&spans, "derive", ORCHESTRATOR_TRACE);
    assert_eq!(derive["parent_span_id"], ORCHESTRATOR_SPAN);
    assert_eq!(derive["trace_state"], "vendor=abc");
}
