// A broker that requires DPoP nonces and allows a burst of three derives per
// person and tool, then one a second: the nonce retry is done for the caller,
// and the rate limit rejects with RateLimited and its Retry-After. (The
// broker counts a request it answers with a nonce challenge against the
// limit too, so the burst leaves room for the challenge.)

import assert from "node:assert/strict";
import { request } from "node:http";
import { after, before, test } from "node:test";

import { Broker, RateLimited, ToolKey } from "../src/index.js";
import { QuickstartBroker, rm, startBroker, tempDir } from "./support.js";

let tmp: string;
let strict: QuickstartBroker;

before(async () => {
  tmp = tempDir();
  strict = await startBroker(tmp, {
    extraConfig: "\n[dpop]\nrequire_nonce = true\n\n[limits]\nper_person_tool_per_second = 1\nburst = 3\n",
  });
});

after(async () => {
  await strict?.stop();
  rm(tmp);
});

function rawDerive(body: object, proof: string): Promise<{ status: number; error: unknown; nonce: string | undefined }> {
  return new Promise((res, rej) => {
    const json = JSON.stringify(body);
    const req = request(
      { socketPath: strict.socket, method: "POST", path: "/v1/derive", headers: { "content-type": "application/json", dpop: proof } },
      (r) => {
        let text = "";
        r.on("data", (c: Buffer) => (text += c.toString()));
        r.on("end", () =>
          res({
            status: r.statusCode ?? 0,
            error: (JSON.parse(text) as { error?: unknown }).error,
            nonce: r.headers["dpop-nonce"] as string | undefined,
          }),
        );
      },
    );
    req.on("error", rej);
    req.end(json);
  });
}

test("a required nonce is fetched and retried for the caller", async () => {
  const key = await ToolKey.generate();
  const subjectToken = strict.subjectToken("nonce-person");
  const c = new Broker(strict.socket);
  const info = await c.info();
  assert.equal(info.dpopNonceRequired, true);
  // Negative control: a proof without a nonce is refused, with one.
  const r = await rawDerive(
    { subject_token: subjectToken, step: "summarize", tool: "notes.read", resource: strict.resource },
    await key.proof("POST", info.deriveHtu),
  );
  assert.equal(r.status, 400);
  assert.equal(r.error, "use_dpop_nonce");
  assert.ok(r.nonce);
  // The library answers the challenge by itself.
  const issued = await c.derive({ subjectToken, step: "summarize", tool: "notes.read", resource: strict.resource, key });
  assert.equal(issued.scope, "notes.read");
});

test("too many derives reject with RateLimited and its Retry-After", async () => {
  const key = await ToolKey.generate();
  const subjectToken = strict.subjectToken("busy-person");
  const c = new Broker(strict.socket);
  const req = { subjectToken, step: "summarize", tool: "notes.read", resource: strict.resource, key };
  let refused: RateLimited | undefined;
  for (let i = 0; i < 10 && refused === undefined; i++) {
    try {
      await c.derive(req);
    } catch (e) {
      if (!(e instanceof RateLimited)) throw e;
      refused = e;
    }
  }
  assert.ok(refused, "ten derives in a row were all issued");
  assert.equal(refused.status, 429);
  assert.equal(refused.error, "rate_limited");
  assert.ok(Number.isInteger(refused.retryAfter) && (refused.retryAfter ?? 0) >= 1);
  // Positive control: after Retry-After, the same derive is issued.
  await new Promise((r) => setTimeout(r, (refused?.retryAfter ?? 1) * 1000));
  assert.equal((await c.derive(req)).scope, "notes.read");
});
