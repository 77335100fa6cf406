// The MCP helpers end to end: a TypeScript MCP server on credbroker-client
// (test/mcp-server.ts) on each SDK, called by the real Python `mcp` client
// (tests/mcp/mcp_client.py, from the project's .venv) in the protocol
// versions that SDK speaks; the link from the refusal is opened in Chromium
// (tests/peers/mcp_open_link.mjs) by the person it was made for, who signs
// in with her local account, accepts the offer and connects at the provider
// (oidc-provider); the retry is served: the broker issues the tool's token,
// which the provider's userinfo endpoint knows as her provider account.
//
// - @modelcontextprotocol/sdk: 2025-11-25 (-32042, manual retry), first with
//   the link opened in another person's browser (nothing connected, the
//   retry gets the elicitation again), then in the right one;
// - @modelcontextprotocol/server: 2026-07-28 (input_required with a sealed
//   requestState, automatic retry) and 2025-11-25 (its legacy fallback).

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { Acme, REPO, browserOf as browserIn, freePort, requireBrowser, rm, tempDir } from "./support.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const PYTHON = join(REPO, ".venv", "bin", "python");

let tmp: string;
let acme: Acme;
const servers: ChildProcess[] = [];
const urls: Record<string, string> = {};

async function startServer(flavor: "sdk" | "server"): Promise<string> {
  const port = await freePort();
  const b = acme.broker;
  const proc = spawn(
    "node",
    [join(HERE, "mcp-server.js"), flavor, String(port), b.socket, b.issuer, join(b.dir, "dev-issuer-jwks.json"), acme.providerIssuer],
    {
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  servers.push(proc);
  await new Promise<void>((res, rej) => {
    const rl = createInterface({ input: proc.stdout });
    rl.once("line", () => {
      rl.close();
      res();
    });
    proc.once("exit", (c) => rej(new Error(`mcp-server ${flavor} exited ${c}`)));
  });
  return `http://127.0.0.1:${port}/mcp`;
}

before(async () => {
  requireBrowser();
  if (!existsSync(PYTHON))
    throw new Error(`the project's .venv (the Python mcp client) is missing (${PYTHON}): run scripts/install-test-deps`);
  tmp = tempDir();
  acme = await Acme.start(tmp);
  urls["sdk"] = await startServer("sdk");
  urls["server"] = await startServer("server");
});

after(async () => {
  for (const s of servers) s.kill("SIGTERM");
  await acme?.stop();
  rm(tmp);
});

interface Link {
  via: string;
  answer: string;
  open?: { lines?: Array<Record<string, unknown>> };
}
interface Out {
  protocol_version: string;
  links: Link[];
  calls: Array<{ result?: { content?: Array<{ text?: string }> }; error?: { code: number } }>;
}

let n = 0;
function runClient(spec: Record<string, unknown>): Out {
  const path = join(tmp, `spec-${n++}.json`);
  writeFileSync(path, JSON.stringify(spec));
  const r = spawnSync(PYTHON, [join(REPO, "tests", "mcp", "mcp_client.py"), path], { encoding: "utf8", timeout: 180_000 });
  assert.equal(r.status, 0, r.stderr.slice(-3000));
  return JSON.parse(r.stdout.trim().split("\n").at(-1) ?? "null") as Out;
}

function tokenFile(sub: string): string {
  const p = join(tmp, `${sub}.token`);
  writeFileSync(p, acme.broker.subjectToken(sub), { mode: 0o600, flag: "wx" });
  return p;
}

const browserOf = (person: string, passwordFile: string): string[] => browserIn(tmp, person, passwordFile);

function browserDone(link: Link | undefined): string {
  const done = link?.open?.lines?.find((l) => "done" in l)?.["done"];
  if (typeof done !== "string") throw new Error(`the browser did not finish: ${JSON.stringify(link)}`);
  return done;
}

const textOf = (call: Out["calls"][number] | undefined): string => call?.result?.content?.[0]?.text ?? JSON.stringify(call);

test("@modelcontextprotocol/sdk, 2025-11-25: the link opened in Chromium by the right person, then the manual retry is served", async () => {
  const bob = acme.broker.localAccount("bob", tmp);
  const mallory = acme.broker.localAccount("mallory", tmp);
  const spec = { url: urls["sdk"], token_file: tokenFile("bob"), mode: "legacy", scenario: "flow" };
  // Negative: Bob's link in Mallory's browser reaches the other-person page;
  // the retry gets the elicitation again (nothing was connected).
  await acme.providerAccount("octo-mallory");
  let out = runClient({ ...spec, open: browserOf("mallory", mallory), answers: ["accept", "decline"] });
  assert.equal(out.protocol_version, "2025-11-25");
  assert.equal(browserDone(out.links[0]), "other_person", JSON.stringify(out));
  assert.deepEqual(
    out.calls.map((c) => c.error?.code),
    [-32042, -32042],
    JSON.stringify(out),
  );
  // Positive control: Bob opens it in his own browser.
  await acme.providerAccount("octo-bob");
  out = runClient({ ...spec, open: browserOf("bob", bob), answers: ["accept"] });
  assert.equal(out.links.length, 1, JSON.stringify(out));
  assert.equal(out.links[0]?.via, "url_elicitation_required");
  assert.equal(browserDone(out.links[0]), "completed", JSON.stringify(out.links[0]));
  const actions = (out.links[0]?.open?.lines ?? []).map((l) => l["action"]);
  assert.ok(actions.includes("local sign-in as bob") && actions.includes("press connect"), JSON.stringify(actions));
  assert.equal(out.calls.length, 2, JSON.stringify(out));
  assert.equal(out.calls[0]?.error?.code, -32042);
  assert.match(textOf(out.calls[1]), /^issued a .*; the provider account is octo-bob$/);
});

test("@modelcontextprotocol/server, 2026-07-28: input_required, the link opened in Chromium, the automatic retry is served", async () => {
  const carol = acme.broker.localAccount("carol", tmp);
  await acme.providerAccount("octo-carol");
  const out = runClient({
    url: urls["server"],
    token_file: tokenFile("carol"),
    mode: "auto",
    scenario: "flow",
    open: browserOf("carol", carol),
    answers: ["accept"],
  });
  assert.equal(out.protocol_version, "2026-07-28");
  assert.equal(out.links.length, 1, JSON.stringify(out));
  assert.equal(out.links[0]?.via, "elicitation_callback");
  assert.equal(browserDone(out.links[0]), "completed", JSON.stringify(out.links[0]));
  // One call as the caller sees it: the client answered the round and
  // retried with the sealed requestState by itself.
  assert.equal(out.calls.length, 1, JSON.stringify(out));
  assert.match(textOf(out.calls[0]), /^issued a .*; the provider account is octo-carol$/);
});

test("@modelcontextprotocol/server, 2025-11-25 (its legacy fallback): -32042, the link opened in Chromium, the manual retry is served", async () => {
  const dave = acme.broker.localAccount("dave", tmp);
  await acme.providerAccount("octo-dave");
  const out = runClient({
    url: urls["server"],
    token_file: tokenFile("dave"),
    mode: "legacy",
    scenario: "flow",
    open: browserOf("dave", dave),
    answers: ["accept"],
  });
  assert.equal(out.protocol_version, "2025-11-25");
  assert.equal(out.calls[0]?.error?.code, -32042, JSON.stringify(out));
  assert.equal(browserDone(out.links[0]), "completed", JSON.stringify(out.links[0]));
  assert.match(textOf(out.calls[1]), /^issued a .*; the provider account is octo-dave$/);
});
