// ToolKey: the thumbprint agrees with jose's RFC 7638 computation, proofs
// verify with jose and carry the htu without query or fragment, save makes
// a 0600 file with O_EXCL, load refuses a file its group or others may read.

import assert from "node:assert/strict";
import { chmodSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";
import { calculateJwkThumbprint, decodeProtectedHeader, importJWK, jwtVerify } from "jose";

import { KeyFileError, ToolKey } from "../../src/index.js";
import { ath } from "../../src/key.js";
import { rm, tempDir } from "../support.js";

const tmp = tempDir();
after(() => rm(tmp));

test("the thumbprint is RFC 7638's and a proof verifies with its jwk", async () => {
  const key = await ToolKey.generate();
  assert.equal(key.thumbprint, await calculateJwkThumbprint(key.publicJwk, "sha256"));
  const proof = await key.proof("GET", "https://notes.example/notes?page=2#top", { accessToken: "tok", nonce: "n-1", now: 1795960000 });
  const h = decodeProtectedHeader(proof);
  assert.equal(h.typ, "dpop+jwt");
  assert.equal(h.alg, "ES256");
  assert.deepEqual(h.jwk, key.publicJwk);
  const { payload } = await jwtVerify(proof, await importJWK(key.publicJwk, "ES256"), {
    currentDate: new Date(1795960000 * 1000),
  });
  assert.equal(payload["htu"], "https://notes.example/notes");
  assert.equal(payload["htm"], "GET");
  assert.equal(payload["iat"], 1795960000);
  assert.equal(payload["nonce"], "n-1");
  assert.equal(payload["ath"], ath("tok"));
  assert.ok(typeof payload["jti"] === "string" && payload["jti"].length >= 16);
  // Two proofs never share a jti.
  const again = await key.proof("GET", "https://notes.example/notes");
  assert.notEqual(
    (JSON.parse(Buffer.from(again.split(".")[1] as string, "base64url").toString()) as { jti?: unknown }).jti,
    payload["jti"],
  );
  // Negative control: another key's jwk does not verify it.
  const other = await ToolKey.generate();
  await assert.rejects(jwtVerify(proof, await importJWK(other.publicJwk, "ES256"), { currentDate: new Date(1795960000 * 1000) }));
});

test("save creates a 0600 file with O_EXCL, load reads it back", async () => {
  const key = await ToolKey.generate();
  const path = join(tmp, "tool-key.pem");
  key.save(path);
  assert.equal(statSync(path).mode & 0o777, 0o600);
  assert.match(readFileSync(path, "utf8"), /^-----BEGIN PRIVATE KEY-----/);
  assert.equal((await ToolKey.load(path)).thumbprint, key.thumbprint);
  // An existing file is not replaced.
  assert.throws(
    () => key.save(path),
    (e: unknown) => e instanceof KeyFileError && e.message.includes(path) && /exists/.test(e.message),
  );
});

test("load refuses a key file its group or others may read", async () => {
  const key = await ToolKey.generate();
  const path = join(tmp, "shared-key.pem");
  key.save(path);
  chmodSync(path, 0o640);
  await assert.rejects(ToolKey.load(path), (e: unknown) => {
    return e instanceof KeyFileError && e.message.includes(path) && e.message.includes("0640") && e.message.includes("0600");
  });
  // Positive control: the same file at 0600 loads.
  chmodSync(path, 0o600);
  assert.equal((await ToolKey.load(path)).thumbprint, key.thumbprint);
});

test("load names the file and the cause for a missing or malformed key", async () => {
  await assert.rejects(
    ToolKey.load(join(tmp, "none.pem")),
    (e: unknown) => e instanceof KeyFileError && /none\.pem: cannot open it: ENOENT/.test(e.message),
  );
  const junk = join(tmp, "junk.pem");
  writeFileSync(junk, "-----BEGIN PRIVATE KEY-----\nsecret-looking-junk\n-----END PRIVATE KEY-----\n", { mode: 0o600 });
  await assert.rejects(ToolKey.load(junk), (e: unknown) => {
    return e instanceof KeyFileError && e.message.includes("not a PEM EC private key") && !e.message.includes("secret-looking-junk");
  });
});
