// A tool calling examples/resource_server (the Rust verifier) with a token
// from the real broker and dpopFetch; a replayed proof is refused; dpopFetch
// refuses tokens that are not bound to its key; a resource server on this
// library's Verifier (keys from the real broker's metadata) that requires
// nonces gets the nonce retry; and the redaction canary.

import assert from "node:assert/strict";
import { createPrivateKey } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { inspect } from "node:util";
import { after, before, test } from "node:test";

import {
  AccessDenied,
  Broker,
  BrokerNotRunning,
  InvalidRequest,
  Issued,
  NotSenderConstrained,
  ToolKey,
  Verifier,
  VerifyError,
  dpopFetch,
} from "../src/index.js";
import { QuickstartBroker, ResourceServer, rm, startBroker, startResourceServer, tempDir } from "./support.js";

let tmp: string;
let broker: QuickstartBroker;
let notes: ResourceServer;

before(async () => {
  tmp = tempDir();
  broker = await startBroker(tmp);
  notes = await startResourceServer(broker, tmp);
});

after(async () => {
  await notes?.stop();
  await broker?.stop();
  rm(tmp);
});

function derive(key: ToolKey, subjectToken = broker.subjectToken()): Promise<Issued> {
  return new Broker(broker.socket).derive({ subjectToken, step: "summarize", tool: "notes.read", resource: broker.resource, key });
}

/** A base fetch that records what was sent. */
function recording(sent: Headers[]): typeof fetch {
  return (input, init) => {
    const r = new Request(input, init);
    sent.push(new Headers(r.headers));
    return fetch(r);
  };
}

test("a tool calls the resource server with dpopFetch", async () => {
  const key = await ToolKey.generate();
  const issued = await derive(key);
  const f = dpopFetch(issued, key);
  for (let i = 0; i < 2; i++) {
    // A fresh proof each time: the second is no replay.
    const r = await f(`${notes.url}?page=2`);
    assert.equal(r.status, 200, await r.clone().text());
    const who = (await r.json()) as { sub: string; tool: string };
    assert.equal(who.sub, "alice");
    assert.equal(who.tool, "notes.read");
  }
  // Negative control: the same token as a bearer token is refused.
  const r = await fetch(notes.url, { headers: { authorization: `Bearer ${issued.token}` } });
  assert.equal(r.status, 401);
  assert.match(r.headers.get("www-authenticate") ?? "", /error="invalid_token"/);
});

test("a replayed proof is refused", async () => {
  const key = await ToolKey.generate();
  const issued = await derive(key);
  const sent: Headers[] = [];
  assert.equal((await dpopFetch(issued, key, recording(sent))(notes.url)).status, 200);
  const first = sent[0] as Headers;
  const r = await fetch(notes.url, { headers: { authorization: first.get("authorization") ?? "", dpop: first.get("dpop") ?? "" } });
  assert.equal(r.status, 401);
  assert.match(r.headers.get("www-authenticate") ?? "", /error="invalid_dpop_proof"/);
  // Positive control: a fresh proof for the same token still works.
  assert.equal((await dpopFetch(issued, key)(notes.url)).status, 200);
});

test("dpopFetch refuses tokens not bound to its key", async () => {
  const key = await ToolKey.generate();
  const issued = await derive(key);
  const bearer = new Issued("opaque-provider-token", "Bearer", false, 3600, undefined, "repo");
  assert.throws(
    () => dpopFetch(bearer, key),
    (e: unknown) => e instanceof NotSenderConstrained && /bearer/.test(e.message),
  );
  assert.throws(
    () => dpopFetch("opaque-provider-token", key),
    (e: unknown) => e instanceof NotSenderConstrained && /no cnf\.jkt/.test(e.message),
  );
  const thief = await ToolKey.generate();
  assert.throws(
    () => dpopFetch(issued, thief),
    (e: unknown) => e instanceof NotSenderConstrained && /another key/.test(e.message),
  );
  // Had it signed with the thief's key, the server would refuse it too.
  const proof = await thief.proof("GET", notes.url, { accessToken: issued.token });
  assert.equal((await fetch(notes.url, { headers: { authorization: `DPoP ${issued.token}`, dpop: proof } })).status, 401);
  // Positive control: the token string with its own key is accepted.
  assert.equal((await dpopFetch(issued.token, key)(notes.url)).status, 200);
});

test("a resource server on Verifier that requires nonces: dpopFetch retries once with the nonce", async () => {
  const key = await ToolKey.generate();
  // This server's audience is the broker's notes resource; it listens on its
  // own port, and its public URL is configured, never taken from Host.
  const nonces = new Set<string>();
  let counter = 0;
  const audience = broker.resource;
  const verifier = await Verifier.fromIssuer(broker.issuer, audience);
  const seen: { nonce: boolean; status: number }[] = [];
  const srv = createServer((req, res) => {
    const dpop = req.headersDistinct["dpop"] ?? [];
    const url = audience + (req.url ?? "/").replace(/^\/notes/, "");
    verifier.verify({ method: req.method ?? "", url, authorization: req.headers.authorization, dpop, nonce: (n) => nonces.has(n) }).then(
      (who) => {
        seen.push({ nonce: true, status: 200 });
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ sub: who.sub, tool: who.tool }));
      },
      (e: unknown) => {
        if (!(e instanceof VerifyError)) throw e;
        const n = `n-${++counter}`;
        nonces.add(n);
        seen.push({ nonce: false, status: e.status });
        const h: Record<string, string> = { "dpop-nonce": n };
        const c = e.challenge();
        if (c) h["www-authenticate"] = c;
        res.writeHead(e.status, h).end();
      },
    );
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const port = (srv.address() as AddressInfo).port;
  try {
    const issued = await derive(key);
    const at = `http://127.0.0.1:${port}/notes`;
    // Negative control: without the library's retry, the server asks for a nonce.
    const bare = await fetch(at, {
      headers: { authorization: `DPoP ${issued.token}`, dpop: await key.proof("GET", audience, { accessToken: issued.token }) },
    });
    assert.equal(bare.status, 401);
    assert.match(bare.headers.get("www-authenticate") ?? "", /use_dpop_nonce/);
    // The proofs' htu is the configured public URL, so send to the port but
    // sign for the audience: a base fetch that rewrites only the address.
    const toPort: typeof fetch = (input, init) =>
      fetch(new Request(String(new Request(input).url).replace(audience, at), new Request(input, init)));
    seen.length = 0;
    const r = await dpopFetch(issued, key, toPort)(audience);
    assert.equal(r.status, 200, await r.clone().text());
    assert.deepEqual(await r.json(), { sub: "alice", tool: "notes.read" });
    assert.deepEqual(seen, [
      { nonce: false, status: 401 },
      { nonce: true, status: 200 },
    ]);
  } finally {
    await new Promise<void>((r) => srv.close(() => r()));
  }
});

test("canary: no token, subject token, key or proof in text, inspect, JSON or console", async () => {
  const key = await ToolKey.generate();
  const subject = broker.subjectToken();
  const logged: string[] = [];
  const saved = { log: console.log, info: console.info, warn: console.warn, error: console.error, debug: console.debug };
  for (const m of ["log", "info", "warn", "error", "debug"] as const) {
    console[m] = (...a: unknown[]) => {
      logged.push(a.map((x) => (typeof x === "string" ? x : inspect(x, { depth: 10, showHidden: true }))).join(" "));
    };
  }
  const shown: string[] = [];
  const show = (x: unknown): void => {
    shown.push(String(x), inspect(x, { depth: 10, showHidden: true }), JSON.stringify(x) ?? "");
    if (x instanceof Error) shown.push(x.message, x.stack ?? "");
    console.log(x);
  };
  const proofs: string[] = [];
  let issued: Issued;
  try {
    const c = new Broker(broker.socket);
    issued = await c.derive({ subjectToken: subject, step: "summarize", tool: "notes.read", resource: broker.resource, key });
    show(issued);
    show(c);
    show(key);
    for (const bad of [
      () => c.derive({ subjectToken: subject, step: "summarize", tool: "notes.delete", resource: broker.resource, key }),
      () => c.derive({ subjectToken: subject + "x", step: "summarize", tool: "notes.read", resource: broker.resource, key }),
    ]) {
      const e = await bad().then(
        () => assert.fail("issued"),
        (e: unknown) => e,
      );
      assert.ok(e instanceof AccessDenied || e instanceof InvalidRequest);
      show(e);
    }
    const sent: Headers[] = [];
    const f = dpopFetch(issued, key, recording(sent));
    show(f);
    assert.equal((await f(notes.url)).status, 200);
    proofs.push(sent[0]?.get("dpop") ?? "");
    const e = await new Broker(join(tmp, "none.sock"))
      .derive({ subjectToken: subject, step: "s", tool: "t", resource: "http://r", key })
      .then(
        () => assert.fail("derived without a broker"),
        (e: unknown) => e,
      );
    assert.ok(e instanceof BrokerNotRunning);
    show(e);
  } finally {
    Object.assign(console, saved);
  }
  const pem = join(tmp, "canary-key.pem");
  key.save(pem);
  const d = readFileSync(pem, "utf8");
  const jwkD = String(createPrivateKey(d).export({ format: "jwk" }).d);
  const secrets: Record<string, string> = {
    token: issued.token,
    subject,
    "key d": jwkD,
    "key pem": d.split("\n")[1] ?? "",
    proof: proofs[0] ?? "",
  };
  // Positive control: the canary sees what is put where it looks.
  assert.ok(logged.length >= 6, "nothing was logged: the canary would see nothing");
  assert.equal(proofs[0]?.split(".").length, 3);
  const planted = [...logged, ...shown, `oops ${issued.token}`].join("\n");
  assert.deepEqual(
    Object.entries(secrets)
      .filter(([, s]) => planted.includes(s))
      .map(([n]) => n),
    ["token"],
  );
  const seen = [...logged, ...shown].join("\n");
  const leaks = Object.entries(secrets)
    .filter(([, s]) => seen.includes(s))
    .map(([n]) => n);
  assert.deepEqual(leaks, [], seen.slice(0, 4000));
});
