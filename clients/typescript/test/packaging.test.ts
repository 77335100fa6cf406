// Packaging, from a clean clone: `git clone` of this checkout's HEAD into a
// temp directory, `npm ci` there, and `npm pack`, which builds the package
// first (`prepack`); the tarball holds the compiled entry points, their
// types, the licence and the README, and nothing else. It installs into a
// fresh project (its dependency from the registry, held to the lock file's
// version), with the README's install command as printed, without the
// optional peer `@modelcontextprotocol/sdk`, where
// `credbroker-client/mcp` still loads; the README's first example
// type-checks against the shipped types with `tsc --strict` and runs there
// against the real broker and examples/resource_server.
//
// The clone is of HEAD: changes not committed yet are not in it.

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, readFileSync, readdirSync, symlinkSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { blocks } from "./readme.js";
import { QuickstartBroker, REPO, ResourceServer, rm, startBroker, startResourceServer, tempDir } from "./support.js";

const HERE = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
let tmp: string;
let broker: QuickstartBroker;
let notes: ResourceServer;

before(async () => {
  tmp = tempDir();
  broker = await startBroker(tmp);
  notes = await startResourceServer(broker, tmp);
});

after(async () => {
  await notes?.stop();
  await broker?.stop();
  rm(tmp);
});

function readmeExample(): string {
  const text = readFileSync(join(HERE, "README.md"), "utf8");
  return (text.split("```js\n", 2)[1] ?? "").split("```", 1)[0] ?? "";
}

let packed: { tarball: string; files: string[] } | undefined;

/** `npm pack` in a clean clone of HEAD (once): the tarball's path and its file list. */
function packCleanClone(): { tarball: string; files: string[] } {
  if (packed) return packed;
  const clone = join(tmp, "clone");
  execFileSync("git", ["clone", "--quiet", "--no-hardlinks", REPO, clone], { stdio: "pipe" });
  const dir = join(clone, "clients", "typescript");
  execFileSync("npm", ["ci", "--no-audit", "--no-fund", "--prefer-offline"], { cwd: dir, stdio: "pipe" });
  const dist = join(tmp, "dist");
  mkdirSync(dist);
  // prepack's build reports on stderr; stdout is the JSON.
  const out = execFileSync("npm", ["pack", "--json", "--pack-destination", dist], {
    cwd: dir,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  });
  const answer = JSON.parse(out) as { filename: string; files: { path: string }[] }[];
  const tarball = join(dist, readdirSync(dist).find((n) => n.endsWith(".tgz")) ?? "");
  packed = { tarball, files: (answer[0]?.files ?? []).map((f) => f.path).sort() };
  return packed;
}

test("npm pack in a clean clone builds first and ships the compiled entry points, their types and the licence", () => {
  const { files } = packCleanClone();
  const modules = readdirSync(join(HERE, "src"))
    .filter((n) => n.endsWith(".ts"))
    .map((n) => n.replace(/\.ts$/, ""));
  assert.ok(modules.includes("index") && modules.includes("mcp"), modules.join(", "));
  const want = ["LICENSE", "README.md", "package.json", ...modules.flatMap((m) => [`dist/${m}.js`, `dist/${m}.d.ts`])].sort();
  assert.deepEqual(files, want);
  // Every entry point of `exports` is in the tarball.
  const pkg = JSON.parse(readFileSync(join(HERE, "package.json"), "utf8")) as { exports: Record<string, Record<string, string>> };
  for (const [name, entry] of Object.entries(pkg.exports)) {
    for (const target of Object.values(entry)) assert.ok(files.includes(target.replace(/^\.\//, "")), `${name}: ${target}`);
  }
});

test("the licence shipped is the repository's", () => {
  const ours = readFileSync(join(HERE, "LICENSE"), "utf8");
  assert.match(ours, /Apache License\s+Version 2\.0, January 2004/);
  assert.equal(ours, readFileSync(join(REPO, "LICENSE"), "utf8"), "clients/typescript/LICENSE differs from /LICENSE");
  assert.equal(ours, readFileSync(join(REPO, "clients", "python", "LICENSE"), "utf8"));
});

test("the README has no links that break outside the repository (npm shows it alone)", () => {
  const text = readFileSync(join(HERE, "README.md"), "utf8");
  const links = [...text.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1] ?? "");
  assert.ok(
    links.some((l) => l.startsWith("https://")),
    "the check sees the links",
  );
  assert.deepEqual(
    links.filter((l) => !/^https:\/\//.test(l)),
    [],
  );
});

test("installed from the tarball into a fresh project: /mcp loads without the optional SDK, and the README example runs", () => {
  const { tarball } = packCleanClone();
  const lock = JSON.parse(readFileSync(join(HERE, "package-lock.json"), "utf8")) as { packages: Record<string, { version: string }> };
  const work = join(tmp, "work");
  mkdirSync(work);
  writeFileSync(
    join(work, "package.json"),
    JSON.stringify({ name: "fresh", private: true, type: "module", overrides: { jose: lock.packages["node_modules/jose"]?.version } }),
  );
  // The README's install block, as printed, with the tarball where it says.
  const install = blocks(join(HERE, "README.md"), "README.md").filter((b) => b.lang === "sh");
  assert.equal(install.length, 1);
  const named = /\.\/(credbroker-client-[0-9.]+\.tgz)/.exec(install[0]?.code ?? "")?.[1];
  assert.equal(named, basename(tarball), "the README names another tarball than npm pack makes");
  copyFileSync(tarball, join(work, basename(tarball)));
  execFileSync("bash", ["-euo", "pipefail", "-c", install[0]?.code ?? "false"], {
    cwd: work,
    stdio: "pipe",
    // The npm cache first: the versions are the lock file's anyway.
    env: { ...process.env, npm_config_prefer_offline: "true", npm_config_audit: "false", npm_config_fund: "false" },
  });
  // It ran the installed package, not this checkout.
  const where = execFileSync(process.execPath, ["--input-type=module", "-e", 'console.log(import.meta.resolve("credbroker-client"))'], {
    cwd: work,
    encoding: "utf8",
  });
  assert.ok(where.includes(join(work, "node_modules", "credbroker-client", "dist")), where);

  // The optional peer is not installed, and the /mcp entry point loads
  // anyway; only the default error class needs it, and says so.
  assert.ok(!readdirSync(join(work, "node_modules")).includes("@modelcontextprotocol"));
  const mcp = spawnSync(
    process.execPath,
    [
      "--input-type=module",
      "-e",
      `import { LinkRequired } from "credbroker-client";
       import { Link } from "credbroker-client";
       import { urlElicitationError } from "credbroker-client/mcp";
       const link = new LinkRequired(403, "access_denied", "connect_required", new Link("https://b.example/l/x", "lnk-1", 60, 0, "Connect."));
       const missing = await urlElicitationError(link).then(() => "resolved", (e) => e.constructor.name + ": " + e.message);
       console.log(missing);
       class Theirs extends Error { constructor(elicitations, message) { super(message); this.elicitations = elicitations; } }
       const e = await urlElicitationError(link, Theirs);
       console.log(e instanceof Theirs, e.elicitations[0].elicitationId, e.elicitations[0].url);`,
    ],
    { cwd: work, encoding: "utf8" },
  );
  assert.equal(mcp.status, 0, mcp.stderr);
  const [missing, theirs] = mcp.stdout.trim().split("\n");
  assert.match(missing ?? "", /^CredbrokerError: @modelcontextprotocol\/sdk could not be loaded .*install it/);
  assert.equal(theirs, "true lnk-1 https://b.example/l/x");

  // The example, as printed, with the quick start's paths where this test
  // keeps them (the resource server's port is a free one here).
  symlinkSync(broker.dir, join(work, "credbroker-quickstart"));
  const code = readmeExample().replaceAll("http://127.0.0.1:9090/notes", broker.resource);
  assert.match(code, /dpopFetch/);
  writeFileSync(join(work, "example.mjs"), code);
  writeFileSync(join(work, "example.mts"), code);
  // Types: the example type-checks strictly against the shipped .d.ts files.
  const tsc = join(HERE, "node_modules", "typescript", "bin", "tsc");
  const types = join(HERE, "node_modules", "@types");
  const check = spawnSync(
    process.execPath,
    [
      tsc,
      "--noEmit",
      "--strict",
      "--target",
      "es2022",
      "--module",
      "nodenext",
      "--moduleResolution",
      "nodenext",
      "--typeRoots",
      types,
      "--types",
      "node",
      "example.mts",
    ],
    { cwd: work, encoding: "utf8" },
  );
  assert.equal(check.status, 0, check.stdout + check.stderr);
  const token = broker.subjectToken();
  const r = spawnSync(process.execPath, ["example.mjs"], {
    cwd: work,
    env: { PATH: process.env["PATH"] ?? "", TOKEN: token },
    encoding: "utf8",
    timeout: 60_000,
  });
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stdout.trim().split("\n");
  assert.match(lines[0] ?? "", /^Issued\(tokenType=DPoP, .*scope=notes\.read\)$/);
  assert.ok(!r.stdout.includes(token));
  assert.equal(lines[1], "refused: step_not_allowed");
  assert.equal((JSON.parse(lines[2] ?? "{}") as { sub?: string }).sub, "alice");
});
