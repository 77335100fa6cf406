// The shared verifier vectors (tests/vectors/resource-server.json, written
// and checked against credbroker::verify by tests/it/interop/vectors.rs):
// the TypeScript verifier reaches every verdict the Rust and Python ones do,
// and every sequence's verdicts and results.

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";

import { Verifier, VerifyError } from "../../src/index.js";
import type { Principal } from "../../src/index.js";
import { REPO, readJson } from "../support.js";

interface Request {
  authorization: string | null;
  dpop: string[];
  method: string;
  url: string;
  now: number;
}
interface Case extends Request {
  name: string;
  times: number;
  verdict: string;
}
interface Step extends Request {
  verdict: string;
  result?: unknown;
  /** Handed to the verifier when present (a token bound to one request). */
  body?: string;
  content_type?: string | null;
}
interface Sequence {
  name: string;
  requests: Step[];
}
interface Vectors {
  issuer: string;
  audience: string;
  jwks: unknown;
  cases: Case[];
  sequences: Sequence[];
}

const vectors = (): Vectors => readJson(join(REPO, "tests", "vectors", "resource-server.json")) as Vectors;

async function verdict(v: Vectors, c: Case): Promise<string> {
  const verifier = await Verifier.create(v.issuer, v.audience, v.jwks, { clock: () => c.now });
  let last = "";
  for (let i = 0; i < c.times; i++) {
    try {
      await verifier.verify({ method: c.method, url: c.url, authorization: c.authorization, dpop: c.dpop });
      last = "ok";
    } catch (e) {
      if (!(e instanceof VerifyError)) throw e;
      last = e.code;
    }
  }
  return last;
}

test("the TypeScript verifier agrees with the shared vectors", async () => {
  const v = vectors();
  const wrong: string[] = [];
  for (const c of v.cases) {
    const got = await verdict(v, c);
    if (got !== c.verdict) wrong.push(`${c.name}: ${got}, want ${c.verdict}`);
  }
  assert.deepEqual(wrong, []);
  // Every outcome is in the file, so the comparison could fail either way.
  assert.deepEqual(new Set(v.cases.map((c) => c.verdict)), new Set(["ok", "invalid_token", "invalid_dpop_proof"]));
  assert.ok(v.cases.length >= 30);
});

/** The file's names for what an accepted request carries of an approved call. */
const resultOf = (p: Principal): unknown => ({
  single_use: p.singleUse,
  approval_id: p.approvalId ?? null,
  authorization_details: p.authorizationDetails ?? null,
  step: p.step ?? null,
});

/** Each request sent in order to one fresh verifier: what differs from the file. */
async function sequenceErrors(v: Vectors, s: Sequence): Promise<string[]> {
  let now = 0;
  const verifier = await Verifier.create(v.issuer, v.audience, v.jwks, { clock: () => now });
  const wrong: string[] = [];
  for (const [i, r] of s.requests.entries()) {
    now = r.now;
    let got: string;
    let result: unknown = null;
    try {
      const req = { method: r.method, url: r.url, authorization: r.authorization, dpop: r.dpop };
      result = resultOf(await verifier.verify(r.body === undefined ? req : { ...req, body: r.body, contentType: r.content_type ?? null }));
      got = "ok";
    } catch (e) {
      if (!(e instanceof VerifyError)) throw e;
      got = e.code;
    }
    let same = got === r.verdict;
    if (same && got === "ok") {
      try {
        assert.deepStrictEqual(result, r.result);
      } catch {
        same = false;
      }
    }
    if (!same) wrong.push(`${s.name} request ${i}: ${got} ${JSON.stringify(result)}, want ${r.verdict}`);
  }
  return wrong;
}

test("the TypeScript verifier agrees with the shared sequences", async () => {
  const v = vectors();
  const wrong: string[] = [];
  for (const s of v.sequences) wrong.push(...(await sequenceErrors(v, s)));
  assert.deepEqual(wrong, []);
  const names = new Set(v.sequences.map((s) => s.name));
  assert.ok(names.has("single_use_token_presented_twice") && names.has("ordinary_token_presented_twice"));
  assert.ok(names.has("single_use_token_bound_to_one_request"));
  // Negative control of the comparison: the single-use token's second request
  // replaced by its first (the same proof again) differs.
  const first = v.sequences[0] as Sequence;
  assert.equal(first.name, "single_use_token_presented_twice");
  const req0 = first.requests[0] as Step;
  assert.equal((await sequenceErrors(v, { name: first.name, requests: [req0, req0] })).length, 1);
});
