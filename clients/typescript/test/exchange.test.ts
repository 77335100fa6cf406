// An `exchange` resource end to end (the broker's docs/UPSTREAM.md): the
// client makes the relayed proof for the organisation's authorization server
// by itself and follows that server's DPoP nonce. The server is the real one
// of the Rust tests (tests/peers/org-as.mjs: oidc-provider with the RFC 8693
// grant), which checks the relayed proof and binds its token to that key;
// the token is checked here with jose against its JWKS. For an ID-JAG
// resource it makes one proof per leg (the IdP's token endpoint and the
// resource AS's: tests/peers/resource-as.mjs).

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { request } from "node:http";
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
    return OrgAs.peer(tmp, "org-as.mjs", {
      client_id: "credbroker",
      client_secret: secret,
      audience: "repo-helper",
      resources: { [ORG_RESOURCE]: { scope: "notes:read notes:write" } },
    });
  }
  /** A peer of tests/peers (`script`) with its config `cfg`; its first line is its hello. */
  static async peer(tmp: string, script: string, cfg: Record<string, unknown>): Promise<OrgAs> {
    const peers = join(REPO, "tests", "peers");
    if (!existsSync(join(peers, "node_modules", "oidc-provider")))
      throw new Error("tests/peers/node_modules is missing: run scripts/install-test-deps");
    const path = join(tmp, `${script}.json`);
    writeFileSync(path, JSON.stringify(cfg));
    const org = new OrgAs(spawn("node", [join(peers, script), path], { cwd: peers, stdio: ["pipe", "pipe", "ignore"] }));
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

const CRM = "https://crm.example/api";

/** `POST /v1/derive` with `body` as it is, answered as JSON. */
function rawDerive(socket: string, body: Record<string, unknown>, dpop: string): Promise<Record<string, unknown>> {
  const json = JSON.stringify(body);
  return new Promise((res, rej) => {
    const req = request(
      {
        socketPath: socket,
        method: "POST",
        path: "/v1/derive",
        headers: { host: "credbroker", "content-type": "application/json", "content-length": Buffer.byteLength(json), dpop },
      },
      (r) => {
        const chunks: Buffer[] = [];
        r.on("data", (c: Buffer) => chunks.push(c));
        r.on("end", () => res(JSON.parse(Buffer.concat(chunks).toString()) as Record<string, unknown>));
      },
    );
    req.on("error", rej);
    req.end(json);
  });
}

/** The `htu` and `nonce` of the relayed proof `peer` last received. */
async function lastProof(peer: OrgAs): Promise<Record<string, unknown>> {
  const dpop = String((await peer.call({ cmd: "last" }))["dpop"]);
  return JSON.parse(Buffer.from(dpop.split(".")[1] ?? "", "base64url").toString()) as Record<string, unknown>;
}

test("the client makes one proof per leg for an ID-JAG resource", async () => {
  // Identity chaining as in the Rust tests (tests/it/upstreams/id_jag.rs):
  // the org IdP and the resource's own AS, and a broker with both.
  const dir = tempDir();
  const [idpSecret, rasSecret, rasClient] = ["org-secret-ts", "crm-secret-ts", "credbroker-at-crm"];
  const idp = await OrgAs.peer(dir, "org-as.mjs", {
    client_id: "credbroker",
    client_secret: idpSecret,
    audience: "repo-helper",
    resources: {},
    advertise_id_jag: true,
  });
  let ras: OrgAs | undefined;
  let b: QuickstartBroker | undefined;
  try {
    ras = await OrgAs.peer(dir, "resource-as.mjs", {
      client_id: rasClient,
      client_secret: rasSecret,
      idp_issuer: idp.issuer,
      idp_jwks_uri: `${idp.issuer}/jwks`,
      resources: { [CRM]: { scope: "crm:read crm:write" } },
    });
    assert.equal((await idp.call({ cmd: "id_jag", audience: ras.issuer, client_id: rasClient }))["ok"], true);
    writeFileSync(join(dir, "org.secret"), idpSecret, { mode: 0o600, flag: "wx" });
    writeFileSync(join(dir, "crm.secret"), rasSecret, { mode: 0o600, flag: "wx" });
    b = await startBroker(dir, {
      extraConfig: `
[[trusted_issuers]]
issuer = "${idp.issuer}"
jwks_uri = "${idp.issuer}/jwks"
sign_in = { kind = "oidc", client_id = "credbroker" }

[upstreams.org]
issuer = "${idp.issuer}"
client_id = "credbroker"
client_secret_file = "${join(dir, "org.secret")}"
subject_issuers = ["${idp.issuer}"]
grant = "id_jag"
resource_upstream = "crm"
timeout = "5s"

[upstreams.crm]
issuer = "${ras.issuer}"
client_id = "${rasClient}"
client_secret_file = "${join(dir, "crm.secret")}"
timeout = "5s"
`,
      extraPolicy: `
[resources."${CRM}"]
source = "exchange"
upstream = "org"

[tools."crm.read"]
resource = "${CRM}"
scopes = ["crm:read", "crm:write"]
steps = ["summarize"]
`,
    });
    const r = ras;
    const counts = async (): Promise<[number, number]> => [
      Number((await idp.call({ cmd: "count" }))["exchanges"]),
      Number((await r.call({ cmd: "count" }))["redemptions"]),
    ];
    const check = async (token: string, key: ToolKey): Promise<void> => {
      // As a resource server trusting only the resource AS's keys.
      const { payload } = await jwtVerify(token, createRemoteJWKSet(new URL(`${r.issuer}/jwks`)), {
        issuer: r.issuer,
        audience: CRM,
        typ: "at+jwt",
        algorithms: ["ES256"],
      });
      assert.deepEqual(payload["cnf"], { jkt: key.thumbprint });
      assert.equal(payload["scope"], "crm:read");
      assert.equal(payload.sub, "alice");
    };
    const key = await ToolKey.generate();
    const subject = String((await idp.call({ cmd: "subject", sub: "alice", ttl: 3600 }))["token"]);
    const [o, n] = await counts();
    const client = new Broker(b.socket);
    const req = { subjectToken: subject, step: "summarize", tool: "crm.read", resource: CRM, scope: "crm:read", key };

    // The control: with leg 1's proof only, the broker refuses naming leg
    // 2's token endpoint, and nothing is sent to either AS.
    const info = await client.info();
    const refused = await rawDerive(
      b.socket,
      {
        subject_token: subject,
        step: "summarize",
        tool: "crm.read",
        resource: CRM,
        scope: "crm:read",
        upstream_proofs: { org: await key.proof("POST", idp.tokenEndpoint) },
      },
      await key.proof("POST", info.deriveHtu),
    );
    assert.equal(refused["reason"], "upstream_proof_required");
    assert.equal(refused["upstream_htu"], r.tokenEndpoint);
    assert.deepEqual(await counts(), [o, n]);

    // Both proofs right the first time, each for its own leg's endpoint.
    await check((await client.derive(req)).token, key);
    assert.deepEqual(await counts(), [o + 1, n + 1]);
    assert.equal((await lastProof(idp))["htu"], idp.tokenEndpoint);
    assert.equal((await lastProof(r))["htu"], r.tokenEndpoint);

    // The resource AS requires its nonce: one retry with the nonce the
    // refusal names for leg 2 (leg 1 is sent again), then remembered.
    assert.equal((await r.call({ cmd: "mode", mode: "nonce" }))["ok"], true);
    await check((await client.derive(req)).token, key);
    assert.deepEqual(await counts(), [o + 3, n + 3]);
    assert.equal(typeof (await lastProof(r))["nonce"], "string");
    await check((await client.derive(req)).token, key);
    assert.deepEqual(await counts(), [o + 4, n + 4]);
  } finally {
    await b?.stop();
    ras?.stop();
    idp.stop();
    rm(dir);
  }
});
