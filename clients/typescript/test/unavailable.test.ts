// A broker that cannot decide now answers 503 and issues nothing: with a
// replay cache of 16 proofs, it fills within a few derives and the next one
// rejects with Unavailable (the broker never forgets a live proof to make room).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Broker, ToolKey, Unavailable } from "../src/index.js";
import { QuickstartBroker, rm, startBroker, tempDir } from "./support.js";

let tmp: string;
let tiny: QuickstartBroker;

before(async () => {
  tmp = tempDir();
  tiny = await startBroker(tmp, { extraConfig: "\n[dpop]\nreplay_capacity = 16\n" });
});

after(async () => {
  await tiny?.stop();
  rm(tmp);
});

test("a full replay cache rejects with Unavailable", async () => {
  const key = await ToolKey.generate();
  const subjectToken = tiny.subjectToken();
  const c = new Broker(tiny.socket);
  let issued = 0;
  let refused: Unavailable | undefined;
  for (let i = 0; i < 64 && refused === undefined; i++) {
    try {
      await c.derive({ subjectToken, step: "summarize", tool: "notes.read", resource: tiny.resource, key });
      issued++;
    } catch (e) {
      if (!(e instanceof Unavailable)) throw e;
      refused = e;
    }
  }
  // At least one was issued first (the broker works), never more than fit.
  assert.ok(issued >= 1 && issued <= 16, String(issued));
  assert.ok(refused);
  assert.equal(refused.status, 503);
  assert.equal(refused.error, "temporarily_unavailable");
  assert.match(refused.description ?? "", /replay cache/);
});
