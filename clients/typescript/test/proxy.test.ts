// dpopFetch through the broker's egress proxy (docs/PROXY.md): the service
// `acme` (the oauth-service peer) with `delivery = "proxy"`, its userinfo
// endpoint (`GET /me`, on the provider's own origin as `api_base`) the one
// route of tool `acme.proxy`, and a broker that requires DPoP nonces. The
// person connects her provider account in Chromium (the broker's pages, the
// provider's sign-in); then the tool's calls through `/proxy/acme/me` reach
// the provider with her token, which the tool never holds.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Broker, LinkRequired, ToolKey, dpopFetch } from "../src/index.js";
import type { Issued } from "../src/index.js";
import { Acme, openInBrowser, requireBrowser, rm, tempDir } from "./support.js";

let tmp: string;
let acme: Acme;
let issued: Issued;
let key: ToolKey;
let url: string;

before(async () => {
  requireBrowser();
  tmp = tempDir();
  acme = await Acme.start(tmp, {
    apiBase: true,
    extraConfig: "\n[dpop]\nrequire_nonce = true\n",
    extraPolicy: `
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.proxy"]
resource = "{issuer}/proxy/acme"
scopes = ["read:org"]
steps = ["triage"]
routes = ["GET /me"]
`,
  });
  const b = acme.broker;
  const resource = `${b.issuer}/proxy/acme`;
  url = `${resource}/me`;
  key = await ToolKey.generate();
  const c = new Broker(b.socket);
  const link = await c.derive({ subjectToken: b.subjectToken(), step: "triage", tool: "acme.proxy", resource, key }).then(
    () => assert.fail("issued before alice connected"),
    (e: unknown) => e,
  );
  assert.ok(link instanceof LinkRequired, String(link));
  await acme.providerAccount("octo-alice");
  assert.equal(openInBrowser(tmp, "alice", b.localAccount("alice", tmp), link.link.uri), "completed");
  issued = await c.derive({ subjectToken: b.subjectToken(), step: "triage", tool: "acme.proxy", resource, key });
  assert.equal(issued.tokenType, "DPoP");
  assert.ok(issued.senderConstrained);
});

after(async () => {
  await acme?.stop();
  rm(tmp);
});

/** A fetch that records what went out and what came back. */
function recording(): { base: typeof fetch; sent: Request[]; seen: Array<[number, string]> } {
  const sent: Request[] = [];
  const seen: Array<[number, string]> = [];
  const base = (async (input: string | URL | Request, init?: RequestInit) => {
    const req = new Request(input, init);
    sent.push(req.clone());
    const res = await fetch(req);
    seen.push([res.status, res.headers.get("www-authenticate") ?? ""]);
    return res;
  }) as typeof fetch;
  return { base, sent, seen };
}

test("dpopFetch calls a proxied route and answers the proxy's nonce challenge", async () => {
  const { base, seen } = recording();
  const f = dpopFetch(issued, key, base);
  const r = await f(url);
  const text = await r.text();
  assert.equal(r.status, 200, text);
  // The provider answered with alice's account: the proxy added her
  // provider token, which the tool never saw.
  assert.equal((JSON.parse(text) as { sub: string }).sub, "octo-alice");
  assert.ok(!text.includes(issued.token));
  // The first proof had no nonce: refused with a challenge, then signed
  // again with the nonce.
  assert.deepEqual(
    seen.map(([s]) => s),
    [401, 200],
  );
  assert.match(seen[0]?.[1] ?? "", /use_dpop_nonce/);
  // The nonce is kept: no second challenge.
  assert.equal((await f(url)).status, 200);
  assert.deepEqual(
    seen.map(([s]) => s),
    [401, 200, 200],
  );
  // Negative: a path outside the tool's routes (positive control above).
  const other = await f(`${acme.broker.issuer}/proxy/acme/userinfo`);
  const body = (await other.json()) as { reason?: string };
  assert.equal(other.status, 403);
  assert.equal(body.reason, "route_not_allowed");
});

test("a replayed proof is refused by the proxy", async () => {
  const { base, sent } = recording();
  const f = dpopFetch(issued, key, base);
  assert.equal((await f(url)).status, 200);
  const accepted = sent.at(-1);
  assert.ok(accepted);
  // The exact headers of the accepted call, sent again: the proof's jti
  // was used, so the proxy refuses it.
  const again = await fetch(url, {
    headers: { authorization: accepted.headers.get("authorization") ?? "", dpop: accepted.headers.get("dpop") ?? "" },
  });
  const body = (await again.json()) as { error?: string; error_description?: string };
  assert.equal(again.status, 401, JSON.stringify(body));
  assert.equal(body.error, "invalid_dpop_proof");
  assert.match(body.error_description ?? "", /jti was already used/);
  // Positive control: a fresh proof is accepted.
  const r = await f(url);
  assert.equal(r.status, 200);
  assert.equal(((await r.json()) as { sub: string }).sub, "octo-alice");
});
