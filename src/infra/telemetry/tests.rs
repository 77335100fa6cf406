//! The allowlist and the encodings, without a collector.

use super::export::{allowed, encode, Client, ALLOWED_ATTRIBUTES};
use super::*;

fn client() -> Client {
    Client::new(
        "http://127.0.0.1:1",
        http::HeaderMap::new(),
        &Resource {
            instance: "test".into(),
        },
    )
    .unwrap()
}

fn finished(attrs: Vec<(&'static str, Value)>) -> Finished {
    Finished {
        ctx: SpanContext {
            trace_id: [7; 16],
            span_id: [8; 8],
            sampled: true,
        },
        parent: Some([9; 8]),
        name: "proxy",
        kind: Kind::Server,
        start: 1,
        end: 2,
        attrs,
        links: vec![SpanContext {
            trace_id: [1; 16],
            span_id: [2; 8],
            sampled: true,
        }],
        error: true,
        trace_state: None,
    }
}

#[test]
fn only_allowlisted_attributes_with_valid_values_leave() {
    let secret = "sk-live-CANARY";
    let span = finished(vec![
        ("http.route", "/repos/{owner}".into()),
        ("http.request.method", "GET".into()),
        ("http.response.status_code", 200u16.into()),
        ("credbroker.tool", "repo.read".into()),
        // Not on the list: dropped whatever the value.
        (
            "url.full",
            format!("https://api.example/x?token={secret}").into(),
        ),
        ("url.query", format!("token={secret}").into()),
        ("http.request.body", secret.into()),
        // On the list, but the value breaks its rule: dropped.
        ("http.route", format!("/repos/x?token={secret}").into()),
        ("http.request.method", format!("GET {secret}").into()),
        ("credbroker.tool_hmac", secret.into()),
        (
            "credbroker.reason",
            format!("upstream said {secret} here").into(),
        ),
    ]);
    let req = encode(&client(), &[span]);
    let s = &req.resource_spans[0].scope_spans[0].spans[0];
    let keys: Vec<&str> = s.attributes.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "http.route",
            "http.request.method",
            "http.response.status_code",
            "credbroker.tool"
        ]
    );
    assert_eq!(s.dropped_attributes_count, 7);
    let bytes = prost::Message::encode_to_vec(&req);
    assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
    // The positive control: the same encoder carries an allowed value.
    assert!(bytes.windows(9).any(|w| w == b"repo.read"));
    assert_eq!(s.parent_span_id, vec![9; 8]);
    assert_eq!(s.links.len(), 1);
    assert!(s.links[0].trace_state.is_empty());
    assert_eq!(s.status.as_ref().unwrap().message, "");
}

#[test]
fn every_allowlisted_name_is_unique() {
    for (i, (k, _)) in ALLOWED_ATTRIBUTES.iter().enumerate() {
        assert!(
            !ALLOWED_ATTRIBUTES[i + 1..].iter().any(|(o, _)| o == k),
            "{k}"
        );
        assert!(!allowed(k, &Value::Str(String::new())));
    }
}

#[test]
fn prometheus_histograms_map_to_per_bucket_counts() {
    let m = crate::infra::metrics::Metrics::new();
    m.latency.with_label_values(&["issued"]).observe(0.0003);
    m.latency.with_label_values(&["issued"]).observe(0.0003);
    m.latency.with_label_values(&["issued"]).observe(30.0);
    m.derives
        .with_label_values(&["issued", "none", "mail.read"])
        .inc_by(3);
    let req = super::metrics_export::encode(&client(), &m.gather(), 1, 2);
    let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
    let hist = metrics
        .iter()
        .find(|m| m.name == "credbroker_derive_duration_seconds")
        .unwrap();
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Histogram(h)) = &hist.data
    else {
        panic!("not a histogram")
    };
    let p = &h.data_points[0];
    assert_eq!(p.count, 3);
    assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
    assert_eq!(p.bucket_counts.iter().sum::<u64>(), 3);
    assert_eq!(p.bucket_counts[2], 2, "0.0003 falls in (0.00025, 0.0005]");
    assert_eq!(
        *p.bucket_counts.last().unwrap(),
        1,
        "30 s is past the last bound"
    );
    let derives = metrics
        .iter()
        .find(|m| m.name == "credbroker_derives_total")
        .unwrap();
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(s)) = &derives.data else {
        panic!("not a sum")
    };
    assert!(s.is_monotonic);
    assert_eq!(s.data_points[0].attributes.len(), 3);
}
