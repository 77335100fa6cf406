// A derive that carries the whole request (docs/APPROVALS.md, "The request,
// bound"), against the real broker: a tool of `acme` through the proxy
// whose one route binds the request, approved for each call. The broker
// accepts the request the client sends (the call then needs Alice's link:
// her account and her approval) and refuses one its route does not allow,
// with no link.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Broker, InvalidRequest, LinkRequired, ToolKey } from "../src/index.js";
import { Acme, rm, tempDir } from "./support.js";

let tmp: string;
let acme: Acme;

before(async () => {
  tmp = tempDir();
  acme = await Acme.start(tmp, {
    apiBase: true,
    extraPolicy: `
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.pay"]
resource = "{issuer}/proxy/acme"
scopes = ["read:org"]
steps = ["triage"]
approval = "each_call"
routes = [{ route = "POST /v1/payments", bind_request = true }]
`,
  });
});

after(async () => {
  await acme?.stop();
  rm(tmp);
});

test("the broker takes the request the client sends", async () => {
  const b = acme.broker;
  const c = new Broker(b.socket);
  const key = await ToolKey.generate();
  const ask = (request: { method: string; path: string; contentType?: string; body?: string }): Promise<unknown> =>
    c.derive({ subjectToken: b.subjectToken(), step: "triage", tool: "acme.pay", resource: `${b.issuer}/proxy/acme`, key, request }).then(
      () => assert.fail("issued without approval"),
      (e: unknown) => e,
    );
  // A method the bound route does not allow: refused, no link.
  const refused = await ask({ method: "DELETE", path: "/v1/payments" });
  assert.ok(refused instanceof InvalidRequest, String(refused));
  assert.equal(refused.error, "invalid_request");
  // Control: the bound request is taken; the call needs Alice's link.
  const link = await ask({ method: "POST", path: "/v1/payments", contentType: "application/json", body: '{"to": "bob", "amount": 42}' });
  assert.ok(link instanceof LinkRequired, String(link));
  assert.ok(link.link.uri.startsWith(`${b.issuer}/connect/`), "a link of this broker");
});
