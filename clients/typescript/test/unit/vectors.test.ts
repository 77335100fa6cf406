// The shared verifier vectors (tests/vectors/resource-server.json, written
// and checked against credbroker::verify by tests/it/interop/vectors.rs):
// the TypeScript verifier reaches every verdict the Rust and Python ones do.

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";

import { Verifier, VerifyError } from "../../src/index.js";
import { REPO, readJson } from "../support.js";

interface Case {
  name: string;
  authorization: string | null;
  dpop: string[];
  method: string;
  url: string;
  now: number;
  times: number;
  verdict: string;
}
interface Vectors {
  issuer: string;
  audience: string;
  jwks: unknown;
  cases: Case[];
}

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
  const v = readJson(join(REPO, "tests", "vectors", "resource-server.json")) as Vectors;
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
