//! A batch of spans written as an OTLP `ExportTraceServiceRequest` in
//! protobuf straight from the queued [`Finished`] spans, into buffers kept
//! from one batch to the next: no message tree per span (a `Vec` per id, a
//! `String` per name and attribute), no second pass to size it. The
//! fields are those `opentelemetry-proto`'s types would carry (the tests
//! decode the bytes with them); the resource and the scope, the same for
//! every batch, are encoded once with those types.
//!
//! Protobuf (<https://protobuf.dev/programming-guides/encoding/>): each
//! field is a key (its number and wire type, a varint) then a varint, 8 or
//! 4 little-endian bytes, or a length and that many bytes; proto3 leaves
//! out a field holding its default, except in a `oneof`.

use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::export::allowed;
use super::{Finished, Value};

const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;
const I32: u32 = 5;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    // 7 bits a byte; 0 takes one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn key(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The length of a `bytes`/`string` field of `n` bytes with a one-byte key.
fn bytes_len(n: usize) -> usize {
    1 + varint_len(n as u64) + n
}

/// An attribute as `KeyValue { key = 1; AnyValue value = 2 }`, with
/// `AnyValue`'s oneof: `string_value = 1`, `bool_value = 2`,
/// `int_value = 3`.
fn attribute(out: &mut Vec<u8>, k: &str, v: &Value) {
    let value_len = match v {
        Value::Str(s) => bytes_len(s.len()),
        Value::Bool(_) => 2,
        Value::Int(i) => 1 + varint_len(*i as u64),
    };
    key(out, 9, LEN);
    varint(out, (bytes_len(k.len()) + bytes_len(value_len)) as u64);
    bytes(out, 1, k.as_bytes());
    key(out, 2, LEN);
    varint(out, value_len as u64);
    match v {
        Value::Str(s) => bytes(out, 1, s.as_bytes()),
        Value::Bool(b) => {
            key(out, 2, VARINT);
            out.push(u8::from(*b));
        }
        Value::Int(i) => {
            key(out, 3, VARINT);
            // int64: two's complement, ten bytes when negative.
            varint(out, *i as u64);
        }
    }
}

/// One `Span`'s fields (its body, without its own key and length), its
/// attributes through the allowlist.
fn span(out: &mut Vec<u8>, f: &Finished) {
    bytes(out, 1, &f.ctx.trace_id);
    bytes(out, 2, &f.ctx.span_id);
    if let Some(state) = f.trace_state.as_deref().filter(|s| !s.is_empty()) {
        bytes(out, 3, state.as_bytes());
    }
    if let Some(parent) = &f.parent {
        bytes(out, 4, parent);
    }
    if f.ctx.sampled {
        // flags = 16 (fixed32).
        key(out, 16, I32);
        out.extend_from_slice(&1u32.to_le_bytes());
    }
    bytes(out, 5, f.name.as_bytes());
    key(out, 6, VARINT);
    varint(out, f.kind as u64);
    for (field, t) in [(7, f.start), (8, f.end)] {
        if t != 0 {
            key(out, field, I64);
            out.extend_from_slice(&t.to_le_bytes());
        }
    }
    let mut dropped = 0u64;
    for (k, v) in &f.attrs {
        if allowed(k, v) {
            attribute(out, k, v);
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        key(out, 10, VARINT);
        varint(out, dropped);
    }
    for l in &f.links {
        // Link { trace_id = 1; span_id = 2; flags = 6 (fixed32) }: never
        // the linked context's tracestate (the caller's text).
        let flags = if l.sampled { 5 } else { 0 };
        key(out, 13, LEN);
        varint(out, (bytes_len(16) + bytes_len(8) + flags) as u64);
        bytes(out, 1, &l.trace_id);
        bytes(out, 2, &l.span_id);
        if l.sampled {
            key(out, 6, I32);
            out.extend_from_slice(&1u32.to_le_bytes());
        }
    }
    if f.error {
        // Status { code = 3 }: ERROR (2), no message.
        key(out, 15, LEN);
        out.extend_from_slice(&[2, 3 << 3, 2]);
    }
}

/// The encoder of one exporter: the resource's and the scope's fields,
/// encoded once, and the buffers every batch reuses.
#[derive(Debug)]
pub(super) struct Encoder {
    /// `ResourceSpans.resource = 1`, key and length included.
    resource: Vec<u8>,
    /// `ScopeSpans.scope = 1`, key and length included.
    scope: Vec<u8>,
    spans: Vec<u8>,
    one: Vec<u8>,
    out: Vec<u8>,
}

impl Encoder {
    pub(super) fn new(resource: &Resource, scope: &InstrumentationScope) -> Encoder {
        let mut r = Vec::new();
        bytes(&mut r, 1, &resource.encode_to_vec());
        let mut s = Vec::new();
        bytes(&mut s, 1, &scope.encode_to_vec());
        Encoder {
            resource: r,
            scope: s,
            spans: Vec::new(),
            one: Vec::new(),
            out: Vec::new(),
        }
    }

    /// The request carrying `batch`, valid until the next call.
    pub(super) fn encode<'a>(&'a mut self, batch: &[Box<Finished>]) -> &'a [u8] {
        self.spans.clear();
        for f in batch {
            self.one.clear();
            span(&mut self.one, f);
            // ScopeSpans.spans = 2.
            bytes(&mut self.spans, 2, &self.one);
        }
        let scope_spans = self.scope.len() + self.spans.len();
        // ResourceSpans { resource = 1; scope_spans = 2 }.
        let resource_spans = self.resource.len() + bytes_len(scope_spans);
        self.out.clear();
        // ExportTraceServiceRequest.resource_spans = 1.
        key(&mut self.out, 1, LEN);
        varint(&mut self.out, resource_spans as u64);
        self.out.extend_from_slice(&self.resource);
        key(&mut self.out, 2, LEN);
        varint(&mut self.out, scope_spans as u64);
        self.out.extend_from_slice(&self.scope);
        self.out.extend_from_slice(&self.spans);
        &self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u64::MAX, -1i64 as u64] {
            let mut out = Vec::new();
            varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(prost::encoding::encoded_len_varint(v), out.len());
        }
    }
}
