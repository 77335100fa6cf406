// Packaging: the tarball `npm pack` makes installs into a fresh project (its
// dependency from the registry, held to the lock file's version), its types
// are shipped and the README's first example type-checks against them with
// `tsc --strict`, and the example runs there against the real broker and
// examples/resource_server.

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync, readdirSync, symlinkSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { QuickstartBroker, ResourceServer, rm, startBroker, startResourceServer, tempDir } from "./support.js";

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

test("npm pack installs into a fresh project, with types, and the README example runs there", () => {
  const dist = join(tmp, "dist");
  mkdirSync(dist);
  // The build is the one the test run has just compiled (tsc runs first).
  const packed = JSON.parse(
    execFileSync("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", dist], { cwd: HERE, encoding: "utf8" }),
  ) as { filename: string; files: { path: string }[] }[];
  const files = (packed[0]?.files ?? []).map((f) => f.path);
  for (const f of ["build/src/index.js", "build/src/index.d.ts", "build/src/mcp.js", "build/src/verify.d.ts", "README.md", "package.json"]) {
    assert.ok(files.includes(f), `${f} is not in the tarball: ${files.join(", ")}`);
  }
  assert.deepEqual(files.filter((f) => f.startsWith("build/test") || f.startsWith("src/") || f.startsWith("test/")), []);
  const tarball = join(dist, readdirSync(dist).find((n) => n.endsWith(".tgz")) ?? "");
  const lock = JSON.parse(readFileSync(join(HERE, "package-lock.json"), "utf8")) as { packages: Record<string, { version: string }> };
  const work = join(tmp, "work");
  mkdirSync(work);
  writeFileSync(
    join(work, "package.json"),
    JSON.stringify({ name: "fresh", private: true, type: "module", overrides: { jose: lock.packages["node_modules/jose"]?.version } }),
  );
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", tarball], { cwd: work, stdio: "pipe" });
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
    [tsc, "--noEmit", "--strict", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext", "--typeRoots", types, "--types", "node", "example.mts"],
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
  // It ran the installed package, not this checkout.
  const where = execFileSync(process.execPath, ["--input-type=module", "-e", 'console.log(import.meta.resolve("credbroker-client"))'], { cwd: work, encoding: "utf8" });
  assert.ok(where.includes(join(work, "node_modules")), where);
});
