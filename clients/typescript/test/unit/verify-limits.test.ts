// Verifier.fromIssuer caps what it reads from the network while reading: an
// issuer (a local HTTP server) whose metadata or JWKS is an endless body, a
// body that declares a huge length, a redirect, and a body dripped a byte at
// a time are each refused quickly with keys_unavailable, naming the URL and
// the cause; the same server's well-formed issuer is the positive control.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { exportJWK, generateKeyPair } from "jose";

import { MAX_KEYS_DOCUMENT, Verifier, VerifyError } from "../../src/index.js";

let server: Server;
let host: string;
let jwk: Record<string, unknown>;

function endless(res: ServerResponse, chunk: Buffer, pauseMs = 0, declared?: number): void {
  res.writeHead(200, { "content-type": "application/json", ...(declared ? { "content-length": String(declared) } : {}) });
  res.write('{"keys": [');
  const more = (): void => {
    if (res.destroyed) return;
    if (pauseMs) {
      res.write(chunk);
      setTimeout(more, pauseMs);
    } else if (res.write(chunk)) {
      setImmediate(more);
    } else {
      res.once("drain", more);
    }
  };
  more();
}

before(async () => {
  const { publicKey } = await generateKeyPair("ES256");
  jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256", use: "sig" };
  server = createServer((req, res) => {
    const [prefix = "", ...restParts] = (req.url ?? "/").slice(1).split("/");
    const rest = restParts.join("/");
    const issuer = `${host}/${prefix}`;
    res.on("error", () => undefined);
    if (rest === "jwks" && prefix === "endless-jwks") return endless(res, Buffer.alloc(16384, 32));
    if (rest === "jwks") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ keys: [jwk] }));
    if (rest !== ".well-known/oauth-authorization-server") return void res.writeHead(404).end();
    if (prefix === "endless") return endless(res, Buffer.alloc(16384, 32));
    if (prefix === "declared") return endless(res, Buffer.alloc(16384, 32), 0, 1_000_000_000);
    if (prefix === "drip") return endless(res, Buffer.from(" "), 50);
    if (prefix === "redirect") return void res.writeHead(302, { location: `${host}/ok/.well-known/oauth-authorization-server` }).end();
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  host = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => {
  server.closeAllConnections();
  server.close();
});

async function refused(issuer: string, timeoutMs?: number): Promise<[string, number]> {
  const start = Date.now();
  const e = await Verifier.fromIssuer(issuer, "https://rs.example/notes", timeoutMs ? { timeoutMs } : {}).then(
    () => assert.fail("a verifier was made"),
    (e: unknown) => e,
  );
  assert.ok(e instanceof VerifyError, String(e));
  assert.equal(e.code, "keys_unavailable", e.message);
  return [e.message, Date.now() - start];
}

test("an endless metadata body is cut at the cap while reading", async () => {
  const [why, took] = await refused(`${host}/endless`);
  assert.ok(why.includes(`${host}/endless/.well-known/oauth-authorization-server`), why);
  assert.ok(why.includes(`larger than ${MAX_KEYS_DOCUMENT} bytes`), why);
  assert.ok(took < 5000, String(took));
  // Positive control: the same server's well-formed issuer is read.
  const v = await Verifier.fromIssuer(`${host}/ok`, "https://rs.example/notes");
  assert.equal(v.issuer, `${host}/ok`);
});

test("an endless JWKS body is cut at the cap while reading", async () => {
  const [why, took] = await refused(`${host}/endless-jwks`);
  assert.ok(why.includes(`${host}/endless-jwks/jwks`) && why.includes("larger than"), why);
  assert.ok(took < 5000, String(took));
});

test("a declared length over the cap is refused before reading", async () => {
  const [why, took] = await refused(`${host}/declared`);
  assert.ok(why.includes("larger than"), why);
  assert.ok(took < 5000, String(took));
});

test("a redirect is not followed", async () => {
  const [why] = await refused(`${host}/redirect`);
  assert.match(why, /HTTP 302/);
});

test("a dripped body is given the timeout in all", async () => {
  const [why, took] = await refused(`${host}/drip`, 1000);
  assert.ok(why.includes("not read within 1000 ms"), why);
  assert.ok(took < 3000, String(took));
});
