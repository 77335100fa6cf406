// An `exchange` resource end to end (the broker's docs/UPSTREAM.md): the
// client makes the relayed proof for the organisation's authorization server
// by itself and follows that server's DPoP nonce. The server is the real one
// of the Rust tests (tests/peers/org-as.mjs: oidc-provider with the RFC 8693
// grant), which checks the relayed proof and binds its token to that key;
// the token is checked here with jose against its JWKS.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface, type Interface } from "node:readline";
import { after, before, test } from "node:test";
import { createRemoteJWKSet, jwtVerify } from "jose";

import { Broker, InvalidRequest, ToolKey } from "../src/index.js";
import { QuickstartBroker, REPO, rm, startBroker, tempDir } from "./support.js";

const ORG_RESOURCE = "https://org-api.example/notes";

class OrgAs {
  readonly #lines: string[] = [];
  readonly #waiting: ((l: string) => void)[] = [];
  readonly #rl: Interface;
  issuer = "";
  tokenEndpoint = "";
  constructor(readonly proc: ChildProcess) {
    if (proc.stdout === null) throw new Error("no stdout");
    this.#rl = createInterface({ input: proc.stdout });
    this.#rl.on("line", (l) => {
      const w = this.#waiting.shift();
      if (w) w(l);
      else this.#lines.push(l);
    });
  }
  #next(): Promise<string> {
    const l = this.#lines.shift();
    return l !== undefined ? Promise.resolve(l) : new Promise((res) => this.#waiting.push(res));
  }
  static async start(tmp: string, secret: string): Promise<OrgAs> {
    const peers = join(REPO, "tests", "peers");
    if (!existsSync(join(peers, "node_modules", "oidc-provider")))
      throw new Error("tests/peers/node_modules is missing: run scripts/install-test-deps");
    const cfg = join(tmp, "org-as.json");
    writeFileSync(
      cfg,
      JSON.stringify({
        client_id: "credbroker",
        client_secret: secret,
        audience: "repo-helper",
        resources: { [ORG_RESOURCE]: { scope: "notes:read notes:write" } },
      }),
    );
    const org = new OrgAs(spawn("node", [join(peers, "org-as.mjs"), cfg], { cwd: peers, stdio: ["pipe", "pipe", "ignore"] }));
    const hello = JSON.parse(await org.#next()) as { issuer: string; token_endpoint: string };
    org.issuer = hello.issuer;
    org.tokenEndpoint = hello.token_endpoint;
    return org;
  }
  async call(cmd: Record<string, unknown>): Promise<Record<string, unknown>> {
    this.proc.stdin?.write(`${JSON.stringify(cmd)}\n`);
    return JSON.parse(await this.#next()) as Record<string, unknown>;
  }
  async subject(): Promise<string> {
    return String((await this.call({ cmd: "subject", sub: "alice", ttl: 3600 }))["token"]);
  }
  async exchanges(): Promise<number> {
    return Number((await this.call({ cmd: "count" }))["exchanges"]);
  }
  stop(): void {
    this.#rl.close();
    this.proc.stdin?.end();
    this.proc.kill();
  }
}

let tmp: string;
let org: OrgAs;
let broker: QuickstartBroker;

before(async () => {
  tmp = tempDir();
  const secret = "org-client-secret-ts";
  org = await OrgAs.start(tmp, secret);
  const secretFile = join(tmp, "org.secret");
  writeFileSync(secretFile, secret, { mode: 0o600, flag: "wx" });
  broker = await startBroker(tmp, {
    extraConfig: `
[[trusted_issuers]]
issuer = "${org.issuer}"
jwks_uri = "${org.issuer}/jwks"
sign_in = { kind = "oidc", client_id = "credbroker" }

[upstreams.org]
issuer = "${org.issuer}"
client_id = "credbroker"
client_secret_file = "${secretFile}"
subject_issuers = ["${org.issuer}"]
timeout = "5s"
`,
    extraPolicy: `
[resources."${ORG_RESOURCE}"]
source = "exchange"
upstream = "org"

[tools."org.notes"]
resource = "${ORG_RESOURCE}"
scopes = ["notes:read", "notes:write"]
steps = ["summarize"]
`,
  });
});

after(async () => {
  await broker?.stop();
  org?.stop();
  rm(tmp);
});

/** The org AS's token, checked as a resource server trusting only its keys would. */
async function check(token: string, key: ToolKey): Promise<void> {
  const { payload, protectedHeader } = await jwtVerify(token, createRemoteJWKSet(new URL(`${org.issuer}/jwks`)), {
    issuer: org.issuer,
    audience: ORG_RESOURCE,
    typ: "at+jwt",
    algorithms: ["ES256"],
  });
  assert.equal(protectedHeader.typ, "at+jwt");
  assert.deepEqual(payload["cnf"], { jkt: key.thumbprint });
  assert.equal(payload["scope"], "notes:read");
  assert.equal(payload.sub, "alice");
}

test("the client makes the relayed proof and follows the AS's nonce", async () => {
  const key = await ToolKey.generate();
  const subject = await org.subject();
  const sent = await org.exchanges();
  const b = new Broker(broker.socket);
  const info = await b.info();
  assert.equal(info.upstream.upstreams.get("org")?.tokenEndpoint, org.tokenEndpoint);
  const req = { subjectToken: subject, step: "summarize", tool: "org.notes", resource: ORG_RESOURCE, scope: "notes:read", key };
  const issued = await b.derive(req);
  await check(issued.token, key);
  assert.equal(issued.tokenType, "DPoP");
  assert.equal(await org.exchanges(), sent + 1, "right the first time");

  // An AS that requires its nonce: one retry with the nonce the refusal
  // names; then the nonce is remembered.
  assert.equal((await org.call({ cmd: "mode", mode: "nonce" }))["ok"], true);
  try {
    await check((await b.derive(req)).token, key);
    assert.equal(await org.exchanges(), sent + 3);
    await b.derive(req);
    assert.equal(await org.exchanges(), sent + 4);
  } finally {
    await org.call({ cmd: "mode", mode: "ok" });
  }

  // The control: a refusal the retry cannot cure is thrown as usual (a
  // subject token from an issuer not listed for the upstream; nothing sent).
  await assert.rejects(b.derive({ ...req, subjectToken: broker.subjectToken("alice") }), (e: unknown) => {
    assert.ok(e instanceof InvalidRequest);
    assert.match(e.message, /not listed/);
    return true;
  });
  assert.equal(await org.exchanges(), sent + 4);
});
