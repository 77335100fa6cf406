// credbroker-client/mcp builds the messages of proto/mcp/ for each protocol
// version: the 2025-11-25 error with @modelcontextprotocol/sdk's own
// UrlElicitationRequiredError, and the 2026-07-28 input_required result
// (what @modelcontextprotocol/server's builder makes) whose requestState is
// sealed (AES-256-GCM JWE) for this server, the person, the call and a lifetime.

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { ErrorCode, UrlElicitationRequiredError } from "@modelcontextprotocol/sdk/types.js";
import {
  UrlElicitationRequiredError as ServerUrlElicitationRequiredError,
  inputRequired as serverInputRequired,
  isInputRequiredResult,
} from "@modelcontextprotocol/server";

import { LinkRequired } from "../../src/index.js";
import { refusal } from "../../src/errors.js";
import { REQUEST_STATE_REJECTED, RequestStateRejected, RequestStateSealer, linkAnswer, urlElicitationError } from "../../src/mcp.js";
import { REPO, readJson } from "../support.js";

const PROTO = join(REPO, "proto", "mcp");
const load = (name: string): Record<string, unknown> => readJson(join(PROTO, name)) as Record<string, unknown>;

function link(): LinkRequired {
  const err = refusal(400, load("refusal-connect-required.json"), undefined, 1795960000);
  assert.ok(err instanceof LinkRequired);
  return err;
}

const person = { iss: "https://idp.example.com", sub: "248289761001", client: "agent-desktop" };
const call = { name: "list_repositories", arguments: { limit: 10 } };

test("the refusal is read as a connect link, its URL kept out of text", () => {
  const err = link();
  const body = load("refusal-connect-required.json");
  assert.equal(err.reason, "connect");
  assert.equal(err.link.uri, body["connect_uri"]);
  assert.equal(err.link.id, body["connect_id"]);
  assert.equal(err.link.expiresIn, body["connect_expires_in"]);
  assert.equal(err.link.expiresAt, 1795960000 + (body["connect_expires_in"] as number));
  assert.equal(err.link.message, body["connect_message"]);
  const uri = body["connect_uri"] as string;
  for (const shown of [String(err), err.message, String(err.link), JSON.stringify(err.link), JSON.stringify(err)]) {
    assert.ok(!shown.includes(uri), shown);
  }
});

test("2025-11-25: the -32042 URL elicitation error of the SDK, as in proto/mcp", async () => {
  const want = load("2025-11-25-url-elicitation-required.json")["error"] as Record<string, unknown>;
  const e = await urlElicitationError(link());
  assert.ok(e instanceof UrlElicitationRequiredError);
  assert.equal(e.code, ErrorCode.UrlElicitationRequired);
  assert.deepEqual({ code: e.code, message: e.message.replace(/^MCP error -32042: /, ""), data: e.data }, want);
  // linkAnswer throws it for 2025-11-25 and for an unknown version.
  const sealer = new RequestStateSealer(RequestStateSealer.generateKey(), { server: "https://mcp.example.com/mcp" });
  for (const v of ["2025-11-25", undefined]) {
    await assert.rejects(linkAnswer(link(), v, { sealer, person, call }), UrlElicitationRequiredError);
  }
  // With @modelcontextprotocol/server's class, the same error as that
  // package's own (which alone it turns into -32042), same fields.
  const theirs = await urlElicitationError(link(), ServerUrlElicitationRequiredError);
  assert.ok(theirs instanceof ServerUrlElicitationRequiredError && !(theirs instanceof UrlElicitationRequiredError));
  assert.deepEqual({ code: theirs.code, data: theirs.data }, { code: want["code"], data: want["data"] });
  await assert.rejects(
    linkAnswer(link(), "2025-11-25", { sealer, person, call, errorClass: ServerUrlElicitationRequiredError }),
    ServerUrlElicitationRequiredError,
  );
});

test("2026-07-28: input_required as in proto/mcp, with a sealed requestState", async () => {
  const want = structuredClone(load("2026-07-28-input-required.json")["result"]) as Record<string, unknown>;
  let now = 1795960000;
  const sealer = new RequestStateSealer(RequestStateSealer.generateKey(), {
    server: "https://mcp.example.com/mcp",
    clock: () => now,
  });
  const got = await linkAnswer(link(), "2026-07-28", { sealer, person, call, name: "connect_github" });
  const state = got.requestState;
  delete (got as Partial<typeof got>).requestState;
  delete want["requestState"];
  assert.deepEqual(got, want);
  // The state is a JWE (five parts), and neither the link id nor the
  // person is readable in it.
  assert.equal(state.split(".").length, 5);
  const raw = state
    .split(".")
    .map((p) => Buffer.from(p, "base64url").toString("latin1"))
    .join(" ");
  assert.ok(!raw.includes("PaKS-N91rdqASYItN4agXQ") && !raw.includes("248289761001"));
  // It opens for the same server, person and call, within its lifetime.
  assert.equal((await sealer.open(state, person, call)).link, "PaKS-N91rdqASYItN4agXQ");
  // Every other binding is rejected alike.
  const other = new RequestStateSealer(RequestStateSealer.generateKey(), { server: "https://mcp.example.com/mcp", clock: () => now });
  const otherServer = new RequestStateSealer(Buffer.alloc(32, 1), { server: "https://other.example/mcp", clock: () => now });
  const tampered = state.slice(0, -3) + (state.endsWith("AAA") ? "BBB" : "AAA");
  const rejects = [
    () => sealer.open(state, { ...person, sub: "someone-else" }, call),
    () => sealer.open(state, { ...person, client: "another-client" }, call),
    () => sealer.open(state, person, { ...call, arguments: { limit: 11 } }),
    () => sealer.open(state, person, { ...call, name: "delete_repositories" }),
    () => sealer.open(tampered, person, call),
    () => sealer.open("not-a-state", person, call),
    () => other.open(state, person, call),
    () => otherServer.open(state, person, call),
  ];
  for (const r of rejects) await assert.rejects(r(), RequestStateRejected);
  assert.equal(new RequestStateRejected().message, REQUEST_STATE_REJECTED.message);
  assert.deepEqual(REQUEST_STATE_REJECTED, load("2026-07-28-request-state-rejected.json")["error"]);
  // Argument order does not matter (the call is compared canonically).
  const two = { name: "t", arguments: { a: 1, b: [1, { c: 2, d: 3 }] } };
  const s2 = await sealer.seal("id", person, two);
  assert.equal((await sealer.open(s2, person, { name: "t", arguments: { b: [1, { d: 3, c: 2 }], a: 1 } })).link, "id");
  // Expiry: valid until iat + lifetime, then rejected.
  now += 599;
  assert.equal((await sealer.open(state, person, call)).link, "PaKS-N91rdqASYItN4agXQ");
  now += 1;
  await assert.rejects(sealer.open(state, person, call), RequestStateRejected);
  // Default key: the link's reason.
  now = 1795960000;
  assert.deepEqual(Object.keys((await linkAnswer(link(), "2026-07-28", { sealer, person, call })).inputRequests), ["connect"]);
  assert.ok(String(sealer).includes("key=[REDACTED]"));
});

test("2026-07-28: the result is what @modelcontextprotocol/server's own builder makes", async () => {
  const sealer = new RequestStateSealer(RequestStateSealer.generateKey(), { server: "https://mcp.example.com/mcp" });
  const err = link();
  const ours = await linkAnswer(err, "2026-07-28", { sealer, person, call, name: "connect_github" });
  // That SDK recognises it (its type guard takes any value).
  assert.ok(isInputRequiredResult(ours));
  const theirs = serverInputRequired({
    inputRequests: { connect_github: serverInputRequired.elicitUrl({ url: err.link.uri, message: `${err.link.message} ${err.link.uri}` }) },
    requestState: ours.requestState,
  });
  assert.deepEqual(JSON.parse(JSON.stringify(ours)), JSON.parse(JSON.stringify(theirs)));
  // Negative control: the same comparison sees a changed URL.
  const other = serverInputRequired({
    inputRequests: { connect_github: serverInputRequired.elicitUrl({ url: `${err.link.uri}x`, message: "m" }) },
    requestState: ours.requestState,
  });
  assert.notDeepEqual(JSON.parse(JSON.stringify(ours)), JSON.parse(JSON.stringify(other)));
});
