//! Spans of a page flow and of the store, and the trace context of a
//! provider refresh: one connect flow played through the real pages is one
//! trace (the link's first page the root, every later page of the link,
//! the sign-in and the provider's callback included, its child), with the
//! flow's store operations as children of its pages; a refresh carries the
//! broker's `traceparent` and the trusted `tracestate` (`propagate_to =
//! ["providers"]`); a `self` derive has no store span, while a service
//! derive does.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

use super::{
    contains, named, one, telemetry_table, Receiver, ORCHESTRATOR_SPAN, ORCHESTRATOR_TRACE,
};
use crate::support::services::{refused, ProviderOpts, ServiceEnv, SERVICE};
use crate::support::*;
use credbroker::internals::jose::Es256Key;

fn page_spans(spans: &[Value], trace: &str) -> Vec<Value> {
    spans
        .iter()
        .filter(|s| s["trace_id"] == trace && s["name"].as_str().unwrap().starts_with("page"))
        .cloned()
        .collect()
}

/// A derive on the socket with a trusted `traceparent` of `trace`.
fn traced_derive(env: &ServiceEnv, key: &Es256Key, body: Value, trace: &str) -> String {
    let b = &env.broker;
    b.http(&http_derive(
        &body.to_string(),
        Some(&b.proof(key)),
        &format!("traceparent: 00-{trace}-{ORCHESTRATOR_SPAN}-01\r\ntracestate: vendor=abc\r\n"),
    ))
    .assert_issued("a traced derive")
}

#[tokio::test]
async fn a_page_flow_is_one_trace_a_refresh_carries_the_traceparent_and_a_self_derive_has_no_store_span(
) {
    let rx = Receiver::start();
    let mut env = ServiceEnv::start_with(ProviderOpts {
        extra_config: telemetry_table(
            &rx,
            "trust_socket_traceparent = true\npropagate_to = [\"providers\"]",
        ),
        ..ProviderOpts::default()
    });
    let k = key();
    // Alice connects through the pages, with tokens that expire at once.
    env.peer.set_access_ttl(30).await;
    let link = refused(env.derive(&k, "alice", "acme.issues").await);
    let uri = link.connect_uri.clone().unwrap();
    let code = uri.rsplit('/').next().unwrap().to_string();
    env.play_pages(&uri, "alice", "octo-alice").await;

    let spans = rx
        .spans_until(|s| {
            s.iter()
                .any(|x| x["attributes"]["credbroker.page"] == "provider_callback")
        })
        .await;
    let callback = spans
        .iter()
        .find(|x| x["attributes"]["credbroker.page"] == "provider_callback")
        .expect("the provider callback's span");
    let flow = callback["trace_id"].as_str().unwrap().to_string();
    let pages = page_spans(&spans, &flow);
    // The root: the link's first opening (not signed in yet: a redirect).
    let roots: Vec<&Value> = pages.iter().filter(|s| s["parent_span_id"] == "").collect();
    assert_eq!(roots.len(), 1, "one root in the flow: {pages:#?}");
    let root = roots[0];
    assert_eq!(root["name"], "page.link");
    assert_eq!(root["kind"], 2, "SERVER");
    assert_eq!(root["attributes"]["http.route"], "/connect/{code}");
    assert_eq!(root["attributes"]["credbroker.page"], "link_opened");
    let root_id = root["span_id"].as_str().unwrap();
    // Every other page of the flow is its child: the sign-in (its page and
    // its form), the link again, the connect button, the callback.
    for s in pages.iter().filter(|s| s["parent_span_id"] != "") {
        assert_eq!(s["parent_span_id"], root_id, "{s}");
    }
    let steps: Vec<&str> = pages
        .iter()
        .map(|s| s["attributes"]["credbroker.page"].as_str().unwrap())
        .collect();
    for want in ["link_opened", "signin", "connect", "provider_callback"] {
        assert!(steps.contains(&want), "{want} in {steps:?}");
    }
    assert_eq!(
        named(&spans, "page.signin", &flow).len(),
        2,
        "the sign-in page and its form"
    );
    let connect = pages
        .iter()
        .find(|s| s["attributes"]["credbroker.page"] == "connect")
        .unwrap();
    assert_eq!(connect["name"], "page.connect");
    assert_eq!(connect["attributes"]["http.route"], "/connect/{code}");
    assert_eq!(callback["attributes"]["http.route"], "/callback/{service}");
    // Store operations of the pages, each a child of a page of the flow.
    let page_ids: Vec<&str> = pages
        .iter()
        .map(|s| s["span_id"].as_str().unwrap())
        .collect();
    let stores = named(&spans, "store", &flow);
    assert!(!stores.is_empty(), "the flow's store operations");
    for s in &stores {
        assert!(
            page_ids.contains(&s["parent_span_id"].as_str().unwrap()),
            "{s}"
        );
        assert!(s["attributes"]["credbroker.store.operation"].is_string());
        assert!(s["attributes"]["credbroker.store.tree"].is_string());
    }

    // A derive now refreshes the token: the refresh request carries the
    // broker's traceparent (its own span's) and the trusted tracestate.
    env.peer.set_access_ttl(3600).await;
    let before = env.peer.token_trace().await;
    assert!(
        before.iter().all(|(p, _)| p.is_none()),
        "the code exchange sent no trace context: {before:?}"
    );
    traced_derive(
        &env,
        &k,
        serde_json::json!({
            "subject_token": env.broker.subject_token("alice"), "step": "triage",
            "tool": "acme.issues", "resource": SERVICE,
        }),
        ORCHESTRATOR_TRACE,
    );
    assert_eq!(env.peer.refreshes().await, 1);
    let t = ORCHESTRATOR_TRACE;
    let spans = rx
        .spans_until(|s| !named(s, "provider.refresh", t).is_empty())
        .await;
    let refresh = one(&spans, "provider.refresh", t);
    assert_eq!(refresh["kind"], 3, "CLIENT");
    assert_eq!(refresh["attributes"]["credbroker.service"], "acme");
    let service = one(&spans, "derive.service", t);
    let derive = one(&spans, "derive", t);
    assert_eq!(service["parent_span_id"], derive["span_id"]);
    let after = env.peer.token_trace().await;
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(
        after.last().unwrap(),
        &(
            Some(format!(
                "00-{t}-{}-01",
                refresh["span_id"].as_str().unwrap()
            )),
            Some("vendor=abc".to_string())
        )
    );
    // The service derive's store operations are spans of its trace.
    assert!(
        !named(&spans, "store", t).is_empty(),
        "positive control: a service derive's store spans"
    );

    // A `self` derive makes no store call, so its trace has no store span.
    let self_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    traced_derive(
        &env,
        &k,
        serde_json::json!({
            "subject_token": env.broker.subject_token("alice"), "step": "summarize",
            "tool": "notes.read", "resource": RESOURCE,
        }),
        self_trace,
    );
    let spans = rx
        .spans_until(|s| !named(s, "derive", self_trace).is_empty())
        .await;
    let d = one(&spans, "derive", self_trace);
    assert_eq!(d["attributes"]["credbroker.outcome"], "issued");
    assert_eq!(
        one(&spans, "derive.mint", self_trace)["parent_span_id"],
        d["span_id"]
    );
    assert!(
        named(&spans, "store", self_trace).is_empty(),
        "a self derive made a store call"
    );

    // The link's code is in nothing exported; the templates are.
    let raw = rx.raw().await;
    assert!(!contains(&raw, code.as_bytes()), "a link code is exported");
    assert!(contains(&raw, b"/connect/{code}"));
}
