// Broker against the real broker on its quick-start defaults: info, an
// issued token (verified with jose against the broker's JWKS), each refusal
// with its fields, a broker that is not running, a broker of another API
// version.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createServer as createNetServer } from "node:net";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { createLocalJWKSet, jwtVerify } from "jose";

import {
  API_VERSION,
  AccessDenied,
  Broker,
  BrokerNotRunning,
  IncompatibleBroker,
  InvalidRequest,
  LinkRequired,
  ToolKey,
} from "../src/index.js";
import { QuickstartBroker, rm, startBroker, tempDir } from "./support.js";

let tmp: string;
let broker: QuickstartBroker;
let key: ToolKey;

before(async () => {
  tmp = tempDir();
  broker = await startBroker(tmp);
  key = await ToolKey.generate();
});

after(async () => {
  await broker?.stop();
  rm(tmp);
});

async function jwks(): Promise<{ keys: Record<string, unknown>[] }> {
  const r = await fetch(`${broker.issuer}/.well-known/jwks.json`);
  assert.equal(r.status, 200);
  return (await r.json()) as { keys: Record<string, unknown>[] };
}

test("info names the issuer, htus, algs and API version", async () => {
  const info = await new Broker(broker.socket).info();
  assert.equal(info.apiVersion, API_VERSION);
  assert.equal(API_VERSION, "1");
  assert.equal(info.issuer, broker.issuer);
  assert.equal(info.deriveHtu, `${broker.issuer}/v1/derive`);
  assert.equal(info.tokenHtu, `${broker.issuer}/token`);
  assert.deepEqual(info.dpopAlgs, ["ES256"]);
  assert.equal(info.dpopNonceRequired, false);
  assert.ok(info.brokerVersion);
});

test("derive issues a token that jose verifies, bound to the key", async () => {
  const before = Date.now() / 1000;
  const issued = await new Broker(broker.socket).derive({
    subjectToken: broker.subjectToken(),
    step: "summarize",
    tool: "notes.read",
    resource: broker.resource,
    key,
  });
  assert.equal(issued.tokenType, "DPoP");
  assert.equal(issued.senderConstrained, true);
  assert.equal(issued.scope, "notes.read");
  assert.equal(issued.expiresIn, 300);
  assert.ok(issued.expiresAt !== undefined && issued.expiresAt >= before + 299 && issued.expiresAt <= Date.now() / 1000 + 301);
  const set = await jwks();
  const { payload, protectedHeader } = await jwtVerify(issued.token, createLocalJWKSet(set as never), {
    issuer: broker.issuer,
    audience: broker.resource,
    algorithms: ["ES256"],
    typ: "at+jwt",
  });
  assert.equal(protectedHeader.typ, "at+jwt");
  assert.equal(payload.sub, "alice");
  assert.deepEqual(payload["cnf"], { jkt: key.thumbprint });
  assert.equal((payload["act"] as { tool?: string }).tool, "notes.read");
  // Negative control: a key set that lacks the broker's key (another key
  // under the same kid) fails the same verification.
  const stranger = { ...(await ToolKey.generate()).publicJwk, kid: protectedHeader.kid, alg: "ES256" };
  await assert.rejects(jwtVerify(issued.token, createLocalJWKSet({ keys: [stranger] }), { algorithms: ["ES256"] }), {
    code: "ERR_JWS_SIGNATURE_VERIFICATION_FAILED",
  });
});

test("a policy denial rejects with AccessDenied and its reason", async () => {
  const c = new Broker(broker.socket);
  const subjectToken = broker.subjectToken();
  const base = { subjectToken, step: "summarize", resource: broker.resource, key };
  const e = await c.derive({ ...base, tool: "notes.delete" }).then(
    () => assert.fail("notes.delete in summarize was issued"),
    (e: unknown) => e,
  );
  assert.ok(e instanceof AccessDenied);
  assert.equal(e.status, 403);
  assert.equal(e.error, "access_denied");
  assert.equal(e.reason, "step_not_allowed");
  assert.ok(e.description);
  await assert.rejects(
    c.derive({ ...base, tool: "no.such.tool" }),
    (e: unknown) => e instanceof AccessDenied && e.reason === "tool_not_allowed",
  );
  // In the step meant for it the policy allows the delete, and the quick
  // start makes it wait for the person's approval of the call, which says
  // what it deletes.
  await assert.rejects(
    c.derive({
      ...base,
      step: "cleanup_confirmed",
      tool: "notes.delete",
      authorizationDetails: [{ type: "notes", which: "all" }],
    }),
    (e: unknown) => e instanceof LinkRequired && e.reason === "approval" && e.link.uri.startsWith(`${broker.issuer}/connect/`),
  );
  // Positive control: a tool in its listed step is issued.
  const issued = await c.derive({ ...base, tool: "notes.read" });
  assert.equal(issued.scope, "notes.read");
});

test("a bad subject token or target rejects with InvalidRequest", async () => {
  const c = new Broker(broker.socket);
  const base = { step: "summarize", tool: "notes.read", resource: broker.resource, key };
  await assert.rejects(c.derive({ ...base, subjectToken: "not-a-jwt" }), (e: unknown) => {
    return e instanceof InvalidRequest && e.status === 400 && e.error === "invalid_request";
  });
  await assert.rejects(
    c.derive({ ...base, subjectToken: broker.subjectToken(), resource: "http://x/#frag" }),
    (e: unknown) => e instanceof InvalidRequest && e.error === "invalid_target",
  );
  // Positive control.
  await c.derive({ ...base, subjectToken: broker.subjectToken() });
});

test("authorizationDetails are sent only when given", async () => {
  // The member reaches the broker: notes.read declares no details type, so
  // the broker refuses them (RFC 9396 section 5) rather than ignoring what
  // was asked for.
  const c = new Broker(broker.socket);
  const base = { subjectToken: broker.subjectToken(), step: "summarize", tool: "notes.read", resource: broker.resource, key };
  await assert.rejects(
    c.derive({ ...base, authorizationDetails: [{ type: "notes", actions: ["delete"] }] }),
    (e: unknown) => e instanceof InvalidRequest && e.status === 400 && e.error === "invalid_authorization_details",
  );
  // Positive control: without it, the same call is issued.
  await c.derive(base);
});

test("no broker on the socket rejects with BrokerNotRunning", async () => {
  const missing = join(tmp, "nothing.sock");
  const req = { subjectToken: "t", step: "s", tool: "t", resource: "http://r", key };
  await assert.rejects(new Broker(missing).derive(req), (e: unknown) => {
    return e instanceof BrokerNotRunning && e.message.includes(missing) && e.code === "ENOENT";
  });
  // A socket file nobody listens on (a broker that died): bind, then close
  // without unlinking.
  const stale = join(tmp, "stale.sock");
  const s = createNetServer();
  await new Promise<void>((r) => s.listen(stale, r));
  // Closing a listening Unix socket in node removes its file; keep a copy by
  // hard-linking it first, so the path stays a socket with no listener.
  const { linkSync } = await import("node:fs");
  const dead = join(tmp, "dead.sock");
  linkSync(stale, dead);
  await new Promise<void>((r) => s.close(() => r()));
  await assert.rejects(
    new Broker(dead).info(),
    (e: unknown) => e instanceof BrokerNotRunning && e.code === "ECONNREFUSED" && /refused/i.test(e.message),
  );
  // Positive control: the running broker answers the same call.
  assert.equal((await new Broker(broker.socket).info()).apiVersion, "1");
});

test("a broker of another API version is refused by name", async () => {
  // A socket that answers /v1/info as a broker of API version 2 would: the
  // library must refuse it by name before it sends anything else.
  const seen: string[] = [];
  const srv = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    if (req.method !== "GET") {
      res.writeHead(500).end();
      return;
    }
    res.writeHead(200, { "content-type": "application/json" }).end(
      JSON.stringify({
        api_version: "2",
        broker_version: "9.0.0",
        issuer: "http://127.0.0.1:1",
        derive_htu: "http://127.0.0.1:1/v1/derive",
        token_htu: "http://127.0.0.1:1/token",
        dpop_signing_alg_values_supported: ["ES256"],
        dpop_nonce_required: false,
      }),
    );
  });
  const path = join(tmp, "v2.sock");
  await new Promise<void>((r) => srv.listen(path, r));
  try {
    const e = await new Broker(path).derive({ subjectToken: "t", step: "summarize", tool: "notes.read", resource: "http://r", key }).then(
      () => assert.fail("derived from an API 2 broker"),
      (e: unknown) => e,
    );
    assert.ok(e instanceof IncompatibleBroker);
    assert.equal(e.apiVersion, "2");
    assert.match(e.message, /"2"/);
    assert.match(e.message, /"1"/);
    assert.deepEqual(seen, ["GET /v1/info"]);
  } finally {
    await new Promise<void>((r) => srv.close(() => r()));
  }
  // Positive control: the real broker's version is accepted.
  assert.equal((await new Broker(broker.socket).info()).apiVersion, "1");
});
