// A connected service (`acme`, played by the oidc-provider peer in
// tests/peers) that the person has not connected yet: the derive rejects
// with LinkRequired, reason `connect` and the link's fields, and the link is
// the broker's real connect page.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { AccessDenied, Broker, LinkRequired, ToolKey } from "../src/index.js";
import { Acme, SERVICE, rm, tempDir } from "./support.js";
import type { QuickstartBroker } from "./support.js";

let tmp: string;
let service: Acme;
let acme: QuickstartBroker;

before(async () => {
  tmp = tempDir();
  service = await Acme.start(tmp);
  acme = service.broker;
});

after(async () => {
  await service?.stop();
  rm(tmp);
});

test("a service not yet connected rejects with LinkRequired and its link", async () => {
  const key = await ToolKey.generate();
  const c = new Broker(acme.socket);
  const before = Date.now() / 1000;
  const err = await c.derive({ subjectToken: acme.subjectToken(), step: "triage", tool: "acme.issues", resource: SERVICE, key }).then(
    () => assert.fail("issued without a connection"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof LinkRequired);
  assert.deepEqual([err.status, err.error, err.reason], [400, "invalid_grant", "connect"]);
  const link = err.link;
  assert.ok(link.uri.startsWith(`${acme.issuer}/connect/`), link.uri);
  assert.ok(link.id && !link.uri.includes(link.id));
  assert.ok(link.expiresIn > 0 && link.expiresIn <= 3600);
  assert.ok(link.expiresAt >= before + link.expiresIn - 1 && link.expiresAt <= Date.now() / 1000 + link.expiresIn);
  assert.match(link.message, /repo-helper/);
  assert.match(link.message, /Acme/);
  assert.ok(!err.message.includes(link.uri));
  // The link is the broker's own page (it asks the person to sign in).
  const page = await fetch(link.uri, { redirect: "manual" });
  assert.ok([200, 303].includes(page.status), String(page.status));
  // Negative control: the same tool outside its step is a policy denial, not a link.
  await assert.rejects(
    c.derive({ subjectToken: acme.subjectToken(), step: "summarize", tool: "acme.issues", resource: SERVICE, key }),
    AccessDenied,
  );
});
