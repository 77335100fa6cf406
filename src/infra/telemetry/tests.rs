//! The allowlist and the encodings, without a collector.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;

use super::export::{allowed, Client, ALLOWED_ATTRIBUTES};
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

/// `batch` as the exporter sends it, decoded with `opentelemetry-proto`'s
/// types.
fn exported(batch: Vec<Finished>) -> (Vec<u8>, ExportTraceServiceRequest) {
    let c = client();
    let mut encoder = super::wire::Encoder::new(&c.resource, &c.scope);
    let batch: Vec<Box<Finished>> = batch.into_iter().map(Box::new).collect();
    // Twice: the buffers kept from a batch leave nothing in the next.
    let _ = encoder.encode(&batch);
    let bytes = encoder.encode(&batch).to_vec();
    let req = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
    (bytes, req)
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
    let (bytes, req) = exported(vec![span]);
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

#[test]
fn the_batch_carries_every_field_the_types_would() {
    let mut a = finished(vec![
        ("http.response.status_code", (-3i64).into()),
        ("credbroker.subject.cached", false.into()),
        ("credbroker.bytes_down", i64::MAX.into()),
        ("credbroker.service", "x".repeat(200).into()),
    ]);
    a.trace_state = Some(Arc::from("k=v"));
    a.start = u64::MAX;
    let mut b = finished(Vec::new());
    b.parent = None;
    b.links[0].sampled = false;
    b.error = false;
    b.name = "derive.mint";
    b.kind = Kind::Internal;
    let (_, req) = exported(vec![a, b]);
    assert_eq!(req.resource_spans.len(), 1);
    let rs = &req.resource_spans[0];
    let c = client();
    assert_eq!(rs.resource.as_ref(), Some(&c.resource));
    assert_eq!(rs.scope_spans.len(), 1);
    assert_eq!(rs.scope_spans[0].scope.as_ref(), Some(&c.scope));
    let spans = &rs.scope_spans[0].spans;
    assert_eq!(spans.len(), 2);
    let (a, b) = (&spans[0], &spans[1]);
    assert_eq!(a.trace_id, vec![7; 16]);
    assert_eq!(a.span_id, vec![8; 8]);
    assert_eq!(a.parent_span_id, vec![9; 8]);
    assert_eq!(a.trace_state, "k=v");
    assert_eq!(a.flags, 1);
    assert_eq!(a.name, "proxy");
    assert_eq!(a.kind, Kind::Server as i32);
    assert_eq!(
        (a.start_time_unix_nano, a.end_time_unix_nano),
        (u64::MAX, 2)
    );
    let values: Vec<_> = a
        .attributes
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.clone().unwrap().value.unwrap()))
        .collect();
    assert_eq!(
        values,
        [
            ("http.response.status_code", any_value::Value::IntValue(-3)),
            (
                "credbroker.subject.cached",
                any_value::Value::BoolValue(false)
            ),
            (
                "credbroker.bytes_down",
                any_value::Value::IntValue(i64::MAX)
            ),
            (
                "credbroker.service",
                any_value::Value::StringValue("x".repeat(200))
            ),
        ]
    );
    assert_eq!(a.dropped_attributes_count, 0);
    assert_eq!(a.links.len(), 1);
    assert_eq!(
        (
            a.links[0].trace_id.as_slice(),
            a.links[0].span_id.as_slice()
        ),
        (&[1; 16][..], &[2; 8][..])
    );
    assert_eq!(a.links[0].flags, 1);
    let status = a.status.as_ref().unwrap();
    assert_eq!((status.code, status.message.as_str()), (2, ""));
    // The second span: no parent, an unsampled link, no status.
    assert!(b.parent_span_id.is_empty() && b.trace_state.is_empty());
    assert_eq!(
        (b.name.as_str(), b.kind),
        ("derive.mint", Kind::Internal as i32)
    );
    assert_eq!(b.links[0].flags, 0);
    assert!(b.status.is_none());
    assert!(b.attributes.is_empty());
}
