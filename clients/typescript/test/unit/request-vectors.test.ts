// Request binding against proto/request-binding-vectors.json (the file the
// Rust and Python implementations are tested against): every digest
// vector's hashed body, digest input and req_sha256; every refused body
// with the proxy's reason; RFC 8785's examples and Appendix B's numbers.

import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import canonicalizeJson from "canonicalize";

import { Broker, BrokerNotRunning, RequestError, ToolKey, bind } from "../../src/index.js";
import { canonicalize, digestInput, hashedBody } from "../../src/request.js";
import type { BoundRequest } from "../../src/index.js";
import { REPO, readJson } from "../support.js";

interface Req {
  method: string;
  path: string;
  query: string;
  content_type: string;
  body: string;
}
interface Vectors {
  digest: { name: string; request: Req; hashed_body: string; digest_input_hex: string; req_sha256: string }[];
  refused: { name: string; request: Req; error: string }[];
  rfc8785: { name: string; input: string; output: string; ijson: boolean }[];
  numbers: { ieee_hex: string; serialized: string | null }[];
}

const V = readJson(join(REPO, "proto", "request-binding-vectors.json")) as Vectors;
const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
const requestOf = (r: Req): BoundRequest => ({ method: r.method, path: r.path, query: r.query, contentType: r.content_type, body: r.body });

function reasonOf(f: () => unknown): string {
  try {
    f();
    return "bound";
  } catch (e) {
    if (!(e instanceof RequestError)) throw e;
    return e.reason;
  }
}

test("every digest vector", () => {
  assert.ok(V.digest.length >= 13);
  for (const v of V.digest) {
    const r = requestOf(v.request);
    const hashed = hashedBody(v.request.content_type, enc(v.request.body));
    assert.deepEqual(Buffer.from(hashed).toString("utf8"), v.hashed_body, v.name);
    assert.equal(digestInput(r, hashed).toString("hex"), v.digest_input_hex, v.name);
    assert.equal(bind(r).sha256, v.req_sha256, v.name);
  }
});

test("every refused body, with the proxy's reason, and controls", () => {
  assert.ok(V.refused.length >= 14);
  for (const v of V.refused)
    assert.equal(
      reasonOf(() => bind(requestOf(v.request))),
      v.error,
      v.name,
    );
  // Controls: what each kind of refusal is next to.
  const ok = (s: string): string => Buffer.from(canonicalize(enc(s))).toString("utf8");
  assert.equal(ok('{"to":"bob@example.com","cc":"x"}'), '{"cc":"x","to":"bob@example.com"}');
  assert.equal(ok("[".repeat(32) + "]".repeat(32)), "[".repeat(32) + "]".repeat(32));
  assert.equal(ok("9007199254740991"), "9007199254740991");
  assert.equal(ok('"\\ud83d\\ude00"'), '"\u{1f600}"');
  assert.equal(ok("0.1"), "0.1");
});

test("RFC 8785's examples", () => {
  for (const v of V.rfc8785) {
    // The serialisation alone (the RFC's numbers have more digits than
    // their doubles hold), then the I-JSON check's verdict on the input.
    assert.equal(canonicalizeJson(JSON.parse(v.input)), v.output, v.name);
    if (v.ijson) assert.equal(Buffer.from(canonicalize(enc(v.input))).toString("utf8"), v.output, v.name);
    else
      assert.equal(
        reasonOf(() => canonicalize(enc(v.input))),
        "body_not_ijson",
        v.name,
      );
  }
});

test("RFC 8785 appendix B's numbers", () => {
  assert.ok(V.numbers.length >= 28);
  for (const v of V.numbers) {
    const x = Buffer.from(v.ieee_hex, "hex").readDoubleBE(0);
    if (v.serialized === null) {
      assert.ok(!Number.isFinite(x), v.ieee_hex);
      assert.throws(() => canonicalizeJson(x));
      continue;
    }
    assert.equal(canonicalizeJson(x), v.serialized, v.ieee_hex);
    // ECMAScript's text of a double is the shortest: the I-JSON check takes
    // it back unless it is an integer beyond 2^53 - 1.
    const beyond = Number.isInteger(x) && Math.abs(x) > Number.MAX_SAFE_INTEGER;
    assert.equal(
      reasonOf(() => canonicalize(enc(v.serialized as string))),
      beyond ? "body_not_ijson" : "bound",
      v.ieee_hex,
    );
  }
});

test("a derive refuses an unbindable request before sending anything", async () => {
  // Nothing answers on this socket: an unbindable request is refused before
  // the client tries it; a bindable one gets as far as the socket (control).
  const broker = new Broker(join(tmpdir(), `credbroker-none-${process.pid}.sock`));
  const key = await ToolKey.generate();
  const ask = (body: string): Promise<unknown> =>
    broker.derive({
      subjectToken: "subject",
      step: "triage",
      tool: "acme.pay",
      resource: "https://x.example",
      key,
      request: { method: "POST", path: "/v1/payments", contentType: "application/json", body },
    });
  await assert.rejects(ask('{"to":"a","to":"b"}'), (e) => e instanceof RequestError && e.reason === "body_not_ijson");
  await assert.rejects(ask('{"to":"a"}'), BrokerNotRunning);
});
