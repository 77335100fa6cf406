// A connected service (`acme`, played by the oidc-provider peer in
// tests/peers) that the person has not connected yet: the derive rejects
// with LinkRequired, reason `connect` and the link's fields, and the link is
// the broker's real connect page.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import { AccessDenied, Broker, LinkRequired, ToolKey } from "../src/index.js";
import { REPO, QuickstartBroker, freePort, rm, startBroker, tempDir } from "./support.js";

const SERVICE = "https://api.acme.example";
let tmp: string;
let acme: QuickstartBroker;
let provider: ChildProcess;

before(async () => {
  tmp = tempDir();
  const peers = join(REPO, "tests", "peers");
  if (!existsSync(join(peers, "node_modules", "oidc-provider"))) throw new Error("tests/peers/node_modules is missing: run scripts/install-test-deps");
  const secret = `client-secret-canary-${randomBytes(12).toString("hex")}`;
  const port = await freePort();
  provider = spawn(
    "node",
    [join(peers, "oauth-service.mjs"), "--client-id", "credbroker-test", "--client-secret", secret, "--redirect-uri", `http://127.0.0.1:${port}/callback/acme`],
    { cwd: peers, stdio: ["ignore", "pipe", "ignore"] },
  );
  const first = await new Promise<string>((res, rej) => {
    const rl = createInterface({ input: provider.stdout! });
    rl.once("line", (l) => {
      rl.close();
      res(l);
    });
    provider.once("exit", (c) => rej(new Error(`oauth-service exited ${c}`)));
  });
  const issuer = (JSON.parse(first) as { issuer: string }).issuer;
  const secretFile = join(tmp, "acme.secret");
  writeFileSync(secretFile, secret, { mode: 0o600, flag: "wx" });
  acme = await startBroker(tmp, {
    brokerPort: port,
    extraPolicy: `
[resources."${SERVICE}"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."acme.issues"]
resource = "${SERVICE}"
scopes = ["read:org"]
steps = ["triage"]
`,
    extraConfig: `
[providers.acme]
display_name = "Acme"
issuer = "${issuer}"
client_id = "credbroker-test"
client_secret_file = "${secretFile}"
scopes = ["openid", "profile", "read:org"]
`,
  });
});

after(async () => {
  await acme?.stop();
  provider?.kill("SIGTERM");
  rm(tmp);
});

test("a service not yet connected rejects with LinkRequired and its link", async () => {
  const key = await ToolKey.generate();
  const c = new Broker(acme.socket);
  const before = Date.now() / 1000;
  const err = await c.derive({ subjectToken: acme.subjectToken(), step: "triage", tool: "acme.issues", resource: SERVICE, key }).then(
    () => assert.fail("issued without a connection"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof LinkRequired);
  assert.deepEqual([err.status, err.error, err.reason], [400, "invalid_grant", "connect"]);
  const link = err.link;
  assert.ok(link.uri.startsWith(`${acme.issuer}/connect/`), link.uri);
  assert.ok(link.id && !link.uri.includes(link.id));
  assert.ok(link.expiresIn > 0 && link.expiresIn <= 3600);
  assert.ok(link.expiresAt >= before + link.expiresIn - 1 && link.expiresAt <= Date.now() / 1000 + link.expiresIn);
  assert.match(link.message, /repo-helper/);
  assert.match(link.message, /Acme/);
  assert.ok(!err.message.includes(link.uri));
  // The link is the broker's own page (it asks the person to sign in).
  const page = await fetch(link.uri, { redirect: "manual" });
  assert.ok([200, 303].includes(page.status), String(page.status));
  // Negative control: the same tool outside its step is a policy denial, not a link.
  await assert.rejects(c.derive({ subjectToken: acme.subjectToken(), step: "summarize", tool: "acme.issues", resource: SERVICE, key }), AccessDenied);
});
