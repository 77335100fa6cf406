// Single-use tokens (an `each_call` approval's): accepted once by the
// verifier, through a store that inserts (iss, jti) if absent, fails closed
// and never evicts a live entry; the in-memory store by default, and a store
// shared by two processes accepting the token once between them: a
// directory of O_EXCL files (Node 20 has no node:sqlite), and a PostgreSQL
// database started by the test (test/postgres.ts).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { SignJWT, exportJWK, generateKeyPair } from "jose";

import { MemorySingleUseStore, SingleUseStoreFull, ToolKey, Verifier, VerifyError, bind } from "../../src/index.js";
import type { SingleUseStore } from "../../src/index.js";
import pg from "pg";

import { Postgres } from "../postgres.js";
import { FileSingleUseStore, PgSingleUseStore } from "./single-use-worker.js";

const ISSUER = "https://broker.example";
const AUDIENCE = "https://notes.example/notes";
const SKEW = 5;
const { publicKey, privateKey } = await generateKeyPair("ES256");
const JWKS = { keys: [{ ...(await exportJWK(publicKey)), kid: "k1" }] };
const TOOL = await ToolKey.generate();

async function token(opts: { singleUse?: boolean; jti?: string; extra?: Record<string, unknown> } = {}): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  const claims: Record<string, unknown> = {
    iss: ISSUER,
    sub: "alice",
    aud: AUDIENCE,
    jti: opts.jti ?? randomUUID(),
    iat: now,
    exp: now + 60,
    scope: "notes.delete",
    cnf: { jkt: TOOL.thumbprint },
    act: { sub: "agent-1", tool: "notes.delete", step: "cleanup" },
  };
  if (opts.singleUse ?? true) {
    Object.assign(claims, { single_use: true, approval_id: "apr-1", authorization_details: [{ type: "notes", identifier: "note-7" }] });
  }
  Object.assign(claims, opts.extra ?? {});
  return new SignJWT(claims).setProtectedHeader({ typ: "at+jwt", alg: "ES256", kid: "k1" }).sign(privateKey);
}

async function request(t: string): Promise<{ method: string; url: string; authorization: string; dpop: string[] }> {
  return { method: "DELETE", url: AUDIENCE, authorization: `DPoP ${t}`, dpop: [await TOOL.proof("DELETE", AUDIENCE, { accessToken: t })] };
}

/** One request with the token and a fresh proof: `ok` or the error's code. */
async function present(v: Verifier, t: string): Promise<string> {
  try {
    await v.verify(await request(t));
    return "ok";
  } catch (e) {
    if (!(e instanceof VerifyError)) throw e;
    return e.code;
  }
}

test("a single-use token is accepted once, an ordinary one again", async () => {
  const v = await Verifier.create(ISSUER, AUDIENCE, JWKS);
  const t = await token();
  const who = await v.verify(await request(t));
  assert.deepEqual([who.singleUse, who.approvalId, who.step], [true, "apr-1", "cleanup"]);
  assert.deepEqual(who.authorizationDetails, [{ type: "notes", identifier: "note-7" }]);
  await assert.rejects(v.verify(await request(t)), (e: unknown) => {
    assert.ok(e instanceof VerifyError);
    assert.deepEqual([e.code, e.status], ["invalid_token", 401]);
    assert.match(e.description, /already used/);
    return true;
  });
  // Control: a token not marked single-use serves twice (fresh proofs).
  const plain = await token({ singleUse: false });
  assert.deepEqual([await present(v, plain), await present(v, plain)], ["ok", "ok"]);
  const again = await v.verify(await request(plain));
  assert.deepEqual([again.singleUse, again.approvalId, again.authorizationDetails], [false, undefined, undefined]);
});

test("a token bound to one request (req_sha256) serves that request once", async () => {
  // Check 20 of docs/RESOURCE-SERVERS.md: refused without the body, and for
  // another request, each time without being used up; the bound request
  // (its JSON members in another order) is served once; the same claims
  // without the digest need no body (control).
  const v = await Verifier.create(ISSUER, AUDIENCE, JWKS);
  const url = `${AUDIENCE}?dry_run=0`;
  const json = "application/json";
  const body = '{"note": "note-7", "reason": "duplicate"}';
  const digest = bind({ method: "POST", path: "/notes", query: "dry_run=0", contentType: json, body }).sha256;
  const bound = await token({ extra: { req_sha256: digest } });
  const call = async (t: string, u: string, b: string | Uint8Array | undefined, ct: string | null = json, m = "POST"): Promise<string> => {
    try {
      const dpop = [await TOOL.proof(m, u, { accessToken: t })];
      const who = await v.verify({ method: m, url: u, authorization: `DPoP ${t}`, dpop, contentType: ct, body: b });
      assert.equal(who.reqSha256, t === bound ? digest : undefined);
      return "ok";
    } catch (e) {
      if (!(e instanceof VerifyError)) throw e;
      return e.code;
    }
  };
  const refused = [
    await call(bound, url, undefined), // no body handed over
    await call(bound, url, body.replace("7", "8")), // one body byte
    await call(bound, AUDIENCE, body), // no query
    await call(bound, `${url}&x=1`, body), // a query parameter added
    await call(bound, url, body, "text/plain"), // another content type
    await call(bound, url, body, null), // no content type
    await call(bound, url, body, json, "PUT"), // another method
    await call(bound, url, '{"note":"note-7","note":"x"}'), // not I-JSON
  ];
  assert.deepEqual(refused, Array<string>(refused.length).fill("invalid_token"));
  // Not used up by any of them: the bound request, reordered, once.
  const reordered = new TextEncoder().encode('{"reason":"duplicate","note":"note-7"}');
  assert.equal(await call(bound, url, reordered), "ok");
  assert.equal(await call(bound, url, body), "invalid_token");
  assert.equal(await call(await token(), url, undefined), "ok");
});

test("two concurrent verifications of one single-use token: one accepted", async () => {
  const v = await Verifier.create(ISSUER, AUDIENCE, JWKS);
  const t = await token();
  const both = await Promise.all([present(v, t), present(v, t)]);
  assert.deepEqual(both.sort(), ["invalid_token", "ok"]);
});

test("the memory store fails closed when full and never evicts early", async () => {
  const s = new MemorySingleUseStore(2);
  assert.equal(await s.insertIfAbsent(ISSUER, "a", 100, 10), true);
  assert.equal(await s.insertIfAbsent(ISSUER, "a", 100, 10), false);
  // The key is (iss, jti): another issuer's "a" is another entry.
  assert.equal(await s.insertIfAbsent("https://other.example", "a", 50, 10), true);
  await assert.rejects(s.insertIfAbsent(ISSUER, "b", 100, 10), SingleUseStoreFull);
  // Full did not evict: "a" is still held, and so refused.
  assert.equal(await s.insertIfAbsent(ISSUER, "a", 100, 49), false);
  // Once the other entry expired (at 50), its room is reused.
  assert.equal(await s.insertIfAbsent(ISSUER, "b", 100, 50), true);
  assert.equal(await s.insertIfAbsent(ISSUER, "a", 100, 99), false);
  assert.equal(s.size, 2);
});

test("a full, failing or odd store refuses the single-use token only", async () => {
  const full = await Verifier.create(ISSUER, AUDIENCE, JWKS, { singleUseStore: new MemorySingleUseStore(1) });
  assert.equal(await present(full, await token()), "ok");
  await assert.rejects(full.verify(await request(await token())), (e: unknown) => {
    assert.ok(e instanceof VerifyError);
    assert.deepEqual([e.code, e.status, e.challenge()], ["replay_store_unavailable", 503, undefined]);
    return true;
  });
  // Control: a token that is not single-use does not need the store.
  assert.equal(await present(full, await token({ singleUse: false })), "ok");
  const broken: SingleUseStore = { insertIfAbsent: () => Promise.reject(new Error("disk full")) };
  const odd = { insertIfAbsent: () => Promise.resolve(1) } as unknown as SingleUseStore;
  for (const store of [broken, odd]) {
    const v = await Verifier.create(ISSUER, AUDIENCE, JWKS, { singleUseStore: store });
    assert.equal(await present(v, await token()), "replay_store_unavailable");
    assert.equal(await present(v, await token({ singleUse: false })), "ok");
  }
});

test("the store keeps the token until its expiry and the skew", async () => {
  const seen: unknown[] = [];
  const inner = new MemorySingleUseStore();
  const store: SingleUseStore = {
    insertIfAbsent: (iss, jti, expiresAt, now) => {
      seen.push([iss, jti, expiresAt]);
      return inner.insertIfAbsent(iss, jti, expiresAt, now);
    },
  };
  const v = await Verifier.create(ISSUER, AUDIENCE, JWKS, { singleUseStore: store });
  const who = await v.verify(await request(await token({ jti: "jti-1" })));
  assert.deepEqual(seen, [[ISSUER, "jti-1", who.exp + SKEW]]);
});

function worker(job: object): Promise<string[]> {
  const p = spawn(process.execPath, [fileURLToPath(new URL("./single-use-worker.js", import.meta.url)), "--worker"], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  p.stdin.end(JSON.stringify(job));
  let out = "";
  p.stdout.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((res, rej) =>
    p.on("close", (code) => (code === 0 ? res(JSON.parse(out) as string[]) : rej(new Error(`worker exited ${code}`)))),
  );
}

test("two processes sharing a store accept the single-use token once", async () => {
  const dir = mkdtempSync(join(tmpdir(), "credbroker-single-use-"));
  try {
    const go = join(dir, "go");
    const storeDir = mkdtempSync(join(dir, "store-"));
    const shared = await token();
    const own = [await token(), await token()];
    const runs = [0, 1].map(async (i) =>
      worker({
        issuer: ISSUER,
        audience: AUDIENCE,
        jwks: JWKS,
        dir: storeDir,
        go,
        // The shared token (with this process's own proof), then a
        // single-use token only this process sees: the control.
        requests: await Promise.all(
          [shared, own[i] as string].map(async (t) => [`DPoP ${t}`, await TOOL.proof("DELETE", AUDIENCE, { accessToken: t })]),
        ),
      }),
    );
    // Time for both to start, so that they race (either order must hold).
    await new Promise((r) => setTimeout(r, 500));
    writeFileSync(go, "");
    const answers = await Promise.all(runs);
    assert.deepEqual(answers.map((a) => a[0]).sort(), ["invalid_token", "ok"], JSON.stringify(answers));
    assert.deepEqual(
      answers.map((a) => a[1]),
      ["ok", "ok"],
    );
    // A third verifier over the same store refuses the shared token too.
    const v = await Verifier.create(ISSUER, AUDIENCE, JWKS, { singleUseStore: new FileSingleUseStore(storeDir) });
    assert.equal(await present(v, shared), "invalid_token");
    assert.equal(await present(v, await token()), "ok");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("two processes sharing a PostgreSQL store accept the single-use token once", async () => {
  const db = await Postgres.start();
  const dir = mkdtempSync(join(tmpdir(), "credbroker-single-use-"));
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  try {
    await pool.query(PgSingleUseStore.TABLE);
    const go = join(dir, "go");
    const shared = await token();
    const own = [await token(), await token()];
    const runs = [0, 1].map(async (i) =>
      worker({
        issuer: ISSUER,
        audience: AUDIENCE,
        jwks: JWKS,
        postgres: db.url,
        go,
        // The shared token (with this process's own proof), then a
        // single-use token only this process sees: the control.
        requests: await Promise.all(
          [shared, own[i] as string].map(async (t) => [`DPoP ${t}`, await TOOL.proof("DELETE", AUDIENCE, { accessToken: t })]),
        ),
      }),
    );
    // Time for both to start, so that they race (either order must hold).
    await new Promise((r) => setTimeout(r, 500));
    writeFileSync(go, "");
    const answers = await Promise.all(runs);
    assert.deepEqual(answers.map((a) => a[0]).sort(), ["invalid_token", "ok"], JSON.stringify(answers));
    assert.deepEqual(
      answers.map((a) => a[1]),
      ["ok", "ok"],
    );
    // The database holds the three tokens; a third verifier over it
    // refuses the shared token and accepts a new one (control).
    assert.equal((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM credbroker_single_use")).rows[0]?.n, 3);
    const v = await Verifier.create(ISSUER, AUDIENCE, JWKS, { singleUseStore: new PgSingleUseStore(pool) });
    assert.equal(await present(v, shared), "invalid_token");
    assert.equal(await present(v, await token()), "ok");
  } finally {
    await pool.end();
    db.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
