// traceFromMeta: what of an MCP `_meta` is passed on.

import assert from "node:assert/strict";
import { test } from "node:test";

import { traceFromMeta, traceHeaders } from "../../src/index.js";

const PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

test("a valid traceparent and its tracestate are kept", () => {
  const t = traceFromMeta({ traceparent: PARENT, tracestate: "a=1,b=2", baggage: "x=y" });
  assert.deepEqual(t, { traceparent: PARENT, tracestate: "a=1,b=2" });
  assert.deepEqual(traceHeaders(t), { traceparent: PARENT, tracestate: "a=1,b=2" });
});

test("anything else is no context", () => {
  for (const meta of [
    undefined,
    null,
    {},
    { traceparent: PARENT.toUpperCase() },
    { traceparent: `${PARENT}\r\nx: y` },
    { traceparent: 5 },
    "text",
  ]) {
    assert.equal(traceFromMeta(meta), undefined, JSON.stringify(meta));
  }
  // A bad tracestate is dropped, the traceparent kept.
  const t = traceFromMeta({ traceparent: PARENT, tracestate: "a=\n1" });
  assert.deepEqual(t, { traceparent: PARENT });
  assert.deepEqual(traceHeaders(t), { traceparent: PARENT });
  assert.deepEqual(traceHeaders(undefined), {});
});
