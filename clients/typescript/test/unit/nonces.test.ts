// DPoP nonces, one store per origin (src/nonces.ts), without a broker
// binary: the socket, resource servers and authorization servers each get
// back only the nonce they gave. The same cases as
// clients/python/tests/unit/test_nonces.py.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Broker, NonceStore, ToolKey, dpopFetch, originOf, socketOrigin } from "../../src/index.js";
import { challenge } from "../../src/nonces.js";

/** A token bound to `jkt` (unsigned: the client does not verify what the broker issues). */
function boundToken(jkt: string): string {
  const b64 = (o: object): string => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "ES256" })}.${b64({ cnf: { jkt } })}.sig`;
}

function proofNonce(proof: string | null): string | null {
  if (!proof) return null;
  const claims = JSON.parse(Buffer.from(proof.split(".")[1] ?? "", "base64url").toString()) as { nonce?: string };
  return claims.nonce ?? null;
}

/**
 * Answers like a server that requires DPoP nonces: a proof without its
 * current nonce gets `use_dpop_nonce` (401 with `WWW-Authenticate` as a
 * resource server, or 400 with a JSON body as an authorization server), and
 * every answer carries the next nonce. Records the nonce each proof carried.
 */
class NonceServer {
  issued = 0;
  readonly seen: (string | null)[] = [];
  constructor(
    readonly name: string,
    readonly style: "resource" | "authorization" = "resource",
  ) {}
  get current(): string {
    return `${this.name}-n${this.issued}`;
  }
  answer(dpop: string | null): { status: number; headers: Record<string, string>; body: string } {
    const got = proofNonce(dpop);
    this.seen.push(got);
    const ok = this.issued > 0 && got === this.current;
    this.issued += 1;
    const headers: Record<string, string> = { "dpop-nonce": this.current };
    if (ok) return { status: 200, headers, body: '{"ok":true}' };
    if (this.style === "resource")
      return { status: 401, headers: { ...headers, "www-authenticate": 'DPoP error="use_dpop_nonce"' }, body: "" };
    return { status: 400, headers: { ...headers, "content-type": "application/json" }, body: '{"error":"use_dpop_nonce"}' };
  }
}

/** A `fetch` that routes each request to the server of its host. */
function route(servers: Record<string, NonceServer>): typeof fetch {
  return (input, init) => {
    const req = new Request(input, init);
    const server = servers[new URL(req.url).hostname];
    if (!server) throw new Error(`no server for ${req.url}`);
    const a = server.answer(req.headers.get("dpop"));
    return Promise.resolve(new Response(a.body === "" ? null : a.body, { status: a.status, headers: a.headers }));
  };
}

test("an origin is scheme, host and port", () => {
  assert.equal(originOf("https://A.example/x?y#z"), "https://a.example:443");
  assert.equal(originOf("https://a.example:443/"), originOf("https://a.example/other"));
  assert.equal(originOf("http://a.example/"), "http://a.example:80");
  assert.notEqual(originOf("https://a.example:8443/"), originOf("https://a.example/"));
  assert.equal(originOf("http://[::1]:8080/p"), "http://[::1]:8080");
  assert.match(socketOrigin("relative.sock"), /^unix:\//);
});

test("what counts as a nonce challenge", () => {
  const www: Record<string, string> = { "www-authenticate": 'DPoP error="use_dpop_nonce"', "dpop-nonce": "n" };
  const h = (headers: Record<string, string>) => (n: string) => headers[n];
  assert.equal(challenge({ status: 401, header: h(www) }), "n");
  assert.equal(challenge({ status: 400, header: h(www) }), "n");
  assert.equal(challenge({ status: 400, header: h({ "dpop-nonce": "n" }), body: '{"error":"use_dpop_nonce"}' }), "n");
  // Not a challenge: no nonce, another error, another status, a 401 body.
  assert.equal(challenge({ status: 401, header: h({ "www-authenticate": 'DPoP error="use_dpop_nonce"' }) }), undefined);
  assert.equal(challenge({ status: 401, header: h({ ...www, "www-authenticate": 'DPoP error="invalid_token"' }) }), undefined);
  assert.equal(challenge({ status: 200, header: h(www) }), undefined);
  assert.equal(challenge({ status: 401, header: h({ "dpop-nonce": "n" }), body: '{"error":"use_dpop_nonce"}' }), undefined);
  assert.equal(challenge({ status: 400, header: h({ "dpop-nonce": "n" }), body: "not json" }), undefined);
});

test("the store keeps one nonce per origin", () => {
  const s = new NonceStore();
  s.update("https://a.example:443", "a1");
  s.update("https://b.example:443", null);
  assert.equal(s.get("https://a.example:443"), "a1");
  assert.equal(s.get("https://b.example:443"), undefined);
  s.update("https://a.example:443", "a2");
  assert.equal(s.get("https://a.example:443"), "a2");
  assert.ok(!String(s).includes("a2"));
});

test("dpopFetch sends each server only its own nonce", async () => {
  const key = await ToolKey.generate();
  const rs = new NonceServer("rs");
  const as = new NonceServer("as", "authorization");
  const f = dpopFetch(boundToken(key.thumbprint), key, { fetch: route({ "rs.example": rs, "as.example": as }) });
  // Each first request is challenged once, then sent again with that
  // server's nonce; the answer is the retry's.
  assert.equal((await f("https://rs.example/notes")).status, 200);
  assert.deepEqual(rs.seen, [null, "rs-n1"]);
  assert.equal((await f("https://as.example/token", { method: "POST", body: "grant_type=x" })).status, 200);
  assert.deepEqual(as.seen, [null, "as-n1"]);
  // Later requests carry the latest nonce of their own origin only.
  assert.equal((await f("https://rs.example/notes/2")).status, 200);
  assert.equal((await f("https://as.example/token", { method: "POST", body: "grant_type=x" })).status, 200);
  assert.deepEqual(rs.seen, [null, "rs-n1", "rs-n2"]);
  assert.deepEqual(as.seen, [null, "as-n1", "as-n2"]);
});

test("a shared store carries nonces between signers", async () => {
  const key = await ToolKey.generate();
  const rs = new NonceServer("rs");
  const nonces = new NonceStore();
  const base = route({ "rs.example": rs });
  assert.equal((await dpopFetch(boundToken(key.thumbprint), key, { fetch: base, nonces })("https://rs.example/a")).status, 200);
  // Another signer on the same store starts with the nonce it holds.
  assert.equal((await dpopFetch(boundToken(key.thumbprint), key, { fetch: base, nonces })("https://rs.example/b")).status, 200);
  assert.deepEqual(rs.seen, [null, "rs-n1", "rs-n2"]);
  // Positive control for the store's keying: a signer of its own starts afresh.
  assert.equal((await dpopFetch(boundToken(key.thumbprint), key, base)("https://rs.example/c")).status, 200);
  assert.deepEqual(rs.seen.slice(-2), [null, "rs-n4"]);
});

test("the broker socket is an origin of its own", async () => {
  const key = await ToolKey.generate();
  const sock = new NonceServer("sock");
  const dir = mkdtempSync(join(tmpdir(), "credbroker-ts-unit-"));
  const path = join(dir, "b.sock");
  const info = {
    api_version: "1",
    broker_version: "0.0.0-fake",
    issuer: "http://127.0.0.1:8440",
    derive_htu: "http://127.0.0.1:8440/v1/derive",
    token_htu: "http://127.0.0.1:8440/token",
    dpop_signing_alg_values_supported: ["ES256"],
    dpop_nonce_required: true,
  };
  // The socket's challenge is a 400 with WWW-Authenticate and the error in
  // the body, as the real broker answers.
  const server = createServer((req, res) => {
    req.resume();
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(info));
      return;
    }
    const a = sock.answer(typeof req.headers["dpop"] === "string" ? req.headers["dpop"] : null);
    if (a.status === 200) {
      const token = { access_token: boundToken(key.thumbprint), token_type: "DPoP", expires_in: 60, scope: "notes.read" };
      res.writeHead(200, { ...a.headers, "content-type": "application/json" }).end(JSON.stringify(token));
    } else {
      res
        .writeHead(400, {
          "dpop-nonce": a.headers["dpop-nonce"],
          "www-authenticate": 'DPoP error="use_dpop_nonce"',
          "content-type": "application/json",
        })
        .end('{"error":"use_dpop_nonce"}');
    }
  });
  await new Promise<void>((ready) => server.listen(path, ready));
  try {
    const nonces = new NonceStore();
    // A nonce the broker's public origin gave (its proxy) is not the socket's.
    nonces.update("http://127.0.0.1:8440", "proxy-n9");
    const b = new Broker(path, { nonces });
    const derive = { subjectToken: "subject", step: "summarize", tool: "notes.read", resource: "https://n", key };
    assert.equal((await b.derive(derive)).tokenType, "DPoP");
    await b.derive(derive);
    assert.deepEqual(sock.seen, [null, "sock-n1", "sock-n2"]);
    assert.equal(nonces.get(socketOrigin(path)), "sock-n3");
    assert.equal(nonces.get("http://127.0.0.1:8440"), "proxy-n9");
    // Another broker client on the same store sends the socket's latest at once.
    await new Broker(path, { nonces }).derive(derive);
    assert.equal(sock.seen.at(-1), "sock-n3");
  } finally {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
