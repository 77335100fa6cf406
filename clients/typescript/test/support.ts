// The real broker for the tests: the `credbroker` binary (CREDBROKER_BIN,
// else target/debug/credbroker) set up by its own quick start in a temp
// directory, then served with the test's edits (a free port for the example
// resource server's audience, nonces, rate limits). One broker per test file,
// never per test: CI runs on two cores. The same fixtures as
// clients/python/tests/conftest.py.
//
// Nothing here fakes the broker; the tests fail, not skip, when the binary
// is missing (scripts/test builds it first).

import { spawn, execFileSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, closeSync } from "node:fs";
import { request } from "node:http";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root (this file is clients/typescript/build/test/support.js). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

export function binary(name: string, env: string): string {
  const p = process.env[env] || join(REPO, "target", "debug", name);
  if (!existsSync(p)) throw new Error(`${p} is missing: build it first (cargo build, or set ${env})`);
  return p;
}

export const brokerBin = (): string => binary("credbroker", "CREDBROKER_BIN");

export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => (typeof a === "object" && a ? res(a.port) : rej(new Error("no port"))));
    });
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export async function poll(what: string, ok: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await ok()) return;
    await sleep(20);
  }
  throw new Error(`${what} did not happen within ${timeoutMs / 1000} s`);
}

function socketAnswers(path: string): Promise<boolean> {
  return new Promise((res) => {
    const req = request({ socketPath: path, path: "/v1/info", timeout: 2000 }, (r) => {
      r.resume();
      res(r.statusCode === 200);
    });
    req.on("error", () => res(false));
    req.on("timeout", () => req.destroy());
    req.end();
  });
}

/** A temp directory removed at the end (pass `t.after` or call `rm`). */
export function tempDir(prefix = "credbroker-ts-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

function stop(proc: ChildProcess | undefined): Promise<void> {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((res) => {
    const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
    proc.once("exit", () => {
      clearTimeout(t);
      res();
    });
    proc.kill("SIGTERM");
  });
}

/** A served quick-start directory. */
export class QuickstartBroker {
  proc: ChildProcess | undefined;
  constructor(
    readonly dir: string,
    readonly port: number,
    readonly resource: string,
  ) {}
  get socket(): string {
    return join(this.dir, "credbroker.sock");
  }
  get issuer(): string {
    return `http://127.0.0.1:${this.port}`;
  }
  get config(): string {
    return join(this.dir, "credbroker.toml");
  }
  get log(): string {
    return join(this.dir, "broker.log");
  }
  async serve(): Promise<void> {
    const fd = openSync(this.log, "a");
    this.proc = spawn(brokerBin(), ["serve", "--config", this.config], {
      stdio: ["ignore", fd, fd],
      env: { ...process.env, RUST_LOG: "info" },
    });
    closeSync(fd);
    await poll(`the broker answering on ${this.socket}`, async () => {
      if (this.proc?.exitCode !== null) throw new Error(`the broker exited: ${readFileSync(this.log, "utf8").slice(-3000)}`);
      return socketAnswers(this.socket);
    });
  }
  stop(): Promise<void> {
    const p = stop(this.proc);
    this.proc = undefined;
    return p;
  }
  /**
   * Gives local account `name` (the person `sub` = name) a fresh random
   * password through the running broker, and returns the file (mode 0600,
   * in `dir`) that holds it, for a browser to sign in with.
   */
  localAccount(name: string, dir: string): string {
    const password = randomBytes(18).toString("base64url");
    const path = join(dir, `${name}.password`);
    writeFileSync(path, password, { mode: 0o600, flag: "wx" });
    execFileSync(brokerBin(), ["users", "add", name, "--replace", "--config", this.config, "--password-stdin"], {
      input: `${password}\n`,
      stdio: ["pipe", "ignore", "pipe"],
    });
    return path;
  }
  subjectToken(sub = "alice"): string {
    return execFileSync(brokerBin(), ["subject-token", "--dir", this.dir, "--sub", sub], { encoding: "utf8" }).trim();
  }
  logText(): string {
    return existsSync(this.log) ? readFileSync(this.log, "utf8") : "";
  }
}

/** A TOML file as its top-level part and its `[table]` sections, in order. */
function sections(text: string): string[] {
  return text.split(/^(?=\[)/m);
}

/**
 * The quick start's files without its built-in demo service, which only
 * `credbroker quickstart` runs (`serve` refuses its preset): the
 * `[providers.demo]` table, the resources with `service = "demo"` and the
 * tools on those resources. Everything else is kept as written.
 */
export function withoutDemoService(config: string, policy: string): [string, string] {
  const cfg = sections(config).filter((s) => !s.startsWith("[providers.demo]"));
  const demo = new Set<string>();
  for (const s of sections(policy)) {
    const m = /^\[resources\."([^"]+)"\]/.exec(s);
    if (m?.[1] && /^service = "demo"$/m.test(s)) demo.add(m[1]);
  }
  const pol = sections(policy).filter((s) => {
    const res = /^\[resources\."([^"]+)"\]/.exec(s)?.[1];
    if (res !== undefined) return !demo.has(res);
    const used = /^\[tools\.[^\n]*\n(?:[^\n]*\n)*?resource = "([^"]+)"/m.exec(s)?.[1];
    return used === undefined || !demo.has(used);
  });
  return [cfg.join(""), pol.join("")];
}

export interface StartOptions {
  extraConfig?: string;
  extraPolicy?: string;
  brokerPort?: number;
}

/**
 * Runs `credbroker quickstart` once to write its files (stopped as soon as
 * it answers), applies the edits, then serves them.
 */
export async function startBroker(tmp: string, opts: StartOptions = {}): Promise<QuickstartBroker> {
  const port = opts.brokerPort ?? (await freePort());
  const rport = await freePort();
  // The demo service's default port is fixed: a free one, so that parallel
  // runs do not collide (its files are dropped before serving anyway).
  const demoPort = await freePort();
  const d = join(tmp, "qs");
  const b = new QuickstartBroker(d, port, `http://127.0.0.1:${rport}/notes`);
  const fd = openSync(join(tmp, "quickstart.log"), "w");
  const qs = spawn(brokerBin(), ["quickstart", "--dir", d, "--listen", `127.0.0.1:${port}`, "--demo-listen", `127.0.0.1:${demoPort}`], {
    stdio: ["ignore", fd, fd],
  });
  closeSync(fd);
  try {
    await poll("the quick start answering", () => socketAnswers(join(d, "credbroker.sock")));
  } finally {
    await stop(qs);
  }
  const policy = join(d, "policy.toml");
  const [config, pol] = withoutDemoService(readFileSync(b.config, "utf8"), readFileSync(policy, "utf8"));
  writeFileSync(policy, pol.replaceAll("http://127.0.0.1:9090/notes", b.resource) + (opts.extraPolicy ?? ""));
  writeFileSync(b.config, config + (opts.extraConfig ?? ""));
  await b.serve();
  return b;
}

/** examples/resource_server, for the broker's notes resource. */
export class ResourceServer {
  constructor(
    readonly url: string,
    readonly proc: ChildProcess,
  ) {}
  stop(): Promise<void> {
    return stop(this.proc);
  }
}

export async function startResourceServer(b: QuickstartBroker, tmp: string): Promise<ResourceServer> {
  const exe = binary(join("examples", "resource_server"), "CREDBROKER_RESOURCE_SERVER_BIN");
  const listen = b.resource.replace("http://", "").split("/")[0] as string;
  const log = join(tmp, "resource_server.log");
  const fd = openSync(log, "w");
  const proc = spawn(exe, ["--listen", listen, "--issuer", b.issuer, "--audience", b.resource], { stdio: ["ignore", fd, fd] });
  closeSync(fd);
  const port = Number(listen.split(":")[1]);
  await poll("resource_server listening", async () => {
    if (proc.exitCode !== null) throw new Error(`resource_server exited: ${readFileSync(log, "utf8").slice(-2000)}`);
    return new Promise<boolean>((res) => {
      const req = request({ host: "127.0.0.1", port, path: "/", method: "HEAD", timeout: 1000 }, (r) => {
        r.resume();
        res(true);
      });
      req.on("error", () => res(false));
      req.end();
    });
  });
  return new ResourceServer(b.resource, proc);
}

export function rm(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

export function readJson(path: string): unknown {
  return JSON.parse(readFileSync(path, "utf8"));
}

/** The connected service of the link and MCP tests. */
export const SERVICE = "https://api.acme.example";

/**
 * A broker with the service `acme` (played by the oauth-service peer in
 * tests/peers, on loopback) and the tool `acme.issues` in step `triage`;
 * nobody has connected an account yet. The same fixture as the Python
 * tests' `acme`.
 */
export class Acme {
  constructor(
    readonly broker: QuickstartBroker,
    readonly provider: ChildProcess,
    /** The provider's issuer (its /test/* controls live there). */
    readonly providerIssuer: string,
  ) {}

  /**
   * Starts the provider and the broker. With `apiBase`, the provider's own
   * origin is the service's API too (its userinfo endpoint, `/me`, is what
   * the egress proxy's tests call); `extraConfig` comes after the
   * `[providers.acme]` table; `{issuer}` in `extraPolicy` is the broker's
   * issuer (a proxy resource is `{issuer}/proxy/acme`).
   */
  static async start(tmp: string, opts: { apiBase?: boolean; extraConfig?: string; extraPolicy?: string } = {}): Promise<Acme> {
    const peers = join(REPO, "tests", "peers");
    if (!existsSync(join(peers, "node_modules", "oidc-provider")))
      throw new Error("tests/peers/node_modules is missing: run scripts/install-test-deps");
    const secret = `client-secret-canary-${randomBytes(12).toString("hex")}`;
    const port = await freePort();
    const provider = spawn(
      "node",
      [
        join(peers, "oauth-service.mjs"),
        "--client-id",
        "credbroker-test",
        "--client-secret",
        secret,
        "--redirect-uri",
        `http://127.0.0.1:${port}/callback/acme`,
      ],
      { cwd: peers, stdio: ["ignore", "pipe", "ignore"] },
    );
    const first = await new Promise<string>((res, rej) => {
      const rl = createInterface({ input: provider.stdout });
      rl.once("line", (l) => {
        rl.close();
        res(l);
      });
      provider.once("exit", (c) => rej(new Error(`oauth-service exited ${c}`)));
    });
    const issuer = (JSON.parse(first) as { issuer: string }).issuer;
    const secretFile = join(tmp, "acme.secret");
    writeFileSync(secretFile, secret, { mode: 0o600, flag: "wx" });
    const broker = await startBroker(tmp, {
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
${(opts.extraPolicy ?? "").replaceAll("{issuer}", `http://127.0.0.1:${port}`)}`,
      extraConfig: `
[providers.acme]
display_name = "Acme"
issuer = "${issuer}"
client_id = "credbroker-test"
client_secret_file = "${secretFile}"
scopes = ["openid", "profile", "read:org"]
${opts.apiBase ? `api_base = "${issuer}"\n` : ""}${opts.extraConfig ?? ""}`,
    });
    return new Acme(broker, provider, issuer);
  }

  /** Makes the next browser sign-in at the provider be `account`. */
  async providerAccount(account: string): Promise<void> {
    const url = `${this.providerIssuer}/test/browser-account?account=${encodeURIComponent(account)}`;
    // One retry of this idempotent GET: a kept-alive connection the
    // provider (Node's http, 5 s keep-alive) closes just as fetch reuses it
    // fails with "fetch failed" (seen in CI between two tests).
    const r = await fetch(url).catch(() => fetch(url));
    const v = (await r.json()) as { browser_account?: string };
    if (r.status !== 200 || v.browser_account !== account) throw new Error(`browser-account: ${r.status} ${JSON.stringify(v)}`);
  }

  async stop(): Promise<void> {
    await this.broker.stop();
    await stop(this.provider);
  }
}

/** Fails unless Chromium and playwright-core (tests/peers) are installed. */
export function requireBrowser(): void {
  for (const [what, p] of [
    ["chromium", "/usr/bin/chromium"],
    ["playwright-core", join(REPO, "tests", "peers", "node_modules", "playwright-core")],
  ] as const) {
    if (!existsSync(p)) throw new Error(`${what} is missing (${p}): run scripts/install-test-deps`);
  }
}

/**
 * The command that opens a link in `person`'s own browser profile (under
 * `tmp`), signing in with her local account when the broker asks
 * (tests/peers/mcp_open_link.mjs; the URL is appended).
 */
export function browserOf(tmp: string, person: string, passwordFile: string): string[] {
  return ["node", join(REPO, "tests", "peers", "mcp_open_link.mjs"), join(tmp, "browsers", person), person, passwordFile];
}

/** Opens `url` in `person`'s browser; how it finished (`completed`, `other_person`...). */
export function openInBrowser(tmp: string, person: string, passwordFile: string, url: string): string {
  const [cmd, ...args] = browserOf(tmp, person, passwordFile) as [string, ...string[]];
  const out = execFileSync(cmd, [...args, url], { encoding: "utf8", timeout: 120_000 });
  for (const line of out.split("\n")) {
    if (!line.startsWith("{")) continue;
    const v = JSON.parse(line) as { done?: string };
    if (v.done) return v.done;
  }
  throw new Error(`the browser did not finish: ${out.slice(-2000)}`);
}
