// An MCP request's `_meta` trace context passed on to the derive: with
// `trust_socket_traceparent` the broker makes it the derive span's parent,
// so the derive's audit event carries that trace id; a derive without it,
// or with a malformed one, is a trace of the broker's own (the controls).
// The collector address is a closed loopback port: the spans are dropped,
// but the trace id the audit event records is the one the span had.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Broker, ToolKey, traceFromMeta } from "../src/index.js";
import { QuickstartBroker, freePort, rm, startBroker, tempDir } from "./support.js";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN = "00f067aa0ba902b7";

let tmp: string;
let broker: QuickstartBroker;

before(async () => {
  tmp = tempDir();
  const port = await freePort();
  broker = await startBroker(tmp, {
    extraConfig: `\n[telemetry]\notlp_endpoint = "http://127.0.0.1:${port}"\nmetrics = false\ntrust_socket_traceparent = true\n`,
  });
});

after(async () => {
  await broker?.stop();
  rm(tmp);
});

function lastIssuedTrace(): string {
  const events = readFileSync(join(broker.dir, "data", "audit.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((e) => e["event"] === "derive.issued");
  assert.ok(events.length > 0, "a derive.issued event");
  return String(events[events.length - 1]?.["trace_id"]);
}

test("the _meta traceparent is the derive span's parent", async () => {
  const key = await ToolKey.generate();
  const c = new Broker(broker.socket);
  const req = { subjectToken: broker.subjectToken(), step: "summarize", tool: "notes.read", resource: broker.resource, key };
  await c.derive(req);
  const own = lastIssuedTrace();
  assert.equal(own.length, 32);
  assert.notEqual(own, TRACE, "without _meta: the broker's own trace");
  const bad = traceFromMeta({ traceparent: `00-${TRACE.toUpperCase()}-${SPAN}-01` });
  assert.equal(bad, undefined);
  await c.derive({ ...req, trace: bad });
  assert.ok(![TRACE, own].includes(lastIssuedTrace()));
  // As an MCP server's handler gets it: the request's _meta, with keys the
  // broker must never see (baggage).
  const meta = { traceparent: `00-${TRACE}-${SPAN}-01`, tracestate: "vendor=abc", baggage: "user=alice", progressToken: 7 };
  await c.derive({ ...req, trace: traceFromMeta(meta) });
  assert.equal(lastIssuedTrace(), TRACE);
});
