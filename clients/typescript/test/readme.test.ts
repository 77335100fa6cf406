// Every TypeScript and JavaScript block of the top-level README and of this
// package's README, run: each with its hidden prelude and after-part
// (test/readme.ts), type-checked together with `tsc --strict` against this
// package's built types (which catches an undefined name), compiled, and
// executed with node against a quick-start broker and
// examples/resource_server, from a directory where `credbroker-quickstart`
// is that broker's and `credbroker-client` this package (its `dist`, built
// by scripts/test-typescript). The addresses the READMEs use
// (127.0.0.1:8440, :9090) become the test's. A block marked skip is counted
// and its reason printed; a block in another language is not this test's.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { blocks, where } from "./readme.js";
import type { Block } from "./readme.js";
import { QuickstartBroker, REPO, ResourceServer, rm, startBroker, startResourceServer, tempDir } from "./support.js";

const HERE = join(REPO, "clients", "typescript");
const READMES: Record<string, string> = { "README.md": join(REPO, "README.md"), "clients/typescript/README.md": join(HERE, "README.md") };
const LANGS = new Set(["ts", "js", "typescript", "javascript"]);

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

test("the block reader sees the hidden parts, and refuses a stray comment", () => {
  const md = join(tmp, "x.md");
  writeFileSync(
    md,
    "text\n\n<!-- readme-test: prelude\nconst x = 1;\n-->\n<!-- readme-test: after\nif (y !== 2) throw 0;\n-->\n```ts\nconst y = x + 1;\n```\n\n" +
      "<!-- readme-test: skip: a reason -->\n```sh\nfalse\n```\n\n```ts\nconst z = 3;\n```\n",
  );
  assert.deepEqual(
    blocks(md, "x.md").map((b) => [b.lang, b.code, b.prelude, b.after, b.skip]),
    [
      ["ts", "const y = x + 1;\n", "const x = 1;\n", "if (y !== 2) throw 0;\n", undefined],
      ["sh", "false\n", "", "", "a reason"],
      ["ts", "const z = 3;\n", "", "", undefined],
    ],
  );
  writeFileSync(md, "<!-- readme-test: prelude\nx\n-->\nprose\n```ts\ny\n```\n");
  assert.throws(() => blocks(md, "x.md"), /not right before a block/);
});

/** The block with its hidden parts, on the test's addresses. */
function program(b: Block): string {
  const origin = broker.resource.replace(/\/notes$/, "");
  return `// ${where(b)}\n${b.prelude}\n${b.code}\n${b.after}`
    .replaceAll("http://127.0.0.1:8440", broker.issuer)
    .replaceAll("http://127.0.0.1:9090", origin);
}

test("every TypeScript block of the READMEs type-checks strictly and runs", (t) => {
  assert.ok(existsSync(join(HERE, "dist", "index.d.ts")), "dist/ is missing: npm run build (scripts/test-typescript does)");
  const found = Object.entries(READMES).flatMap(([name, path]) => blocks(path, name).filter((b) => LANGS.has(b.lang)));
  // The READMEs' blocks this test must see (a reader that finds none passes nothing).
  assert.deepEqual(new Set(found.map((b) => b.source)), new Set(Object.keys(READMES)));
  const run = found.filter((b) => b.skip === undefined);
  const skipped = found.filter((b) => b.skip !== undefined);
  const work = join(tmp, "work");
  mkdirSync(join(work, "node_modules"), { recursive: true });
  symlinkSync(HERE, join(work, "node_modules", "credbroker-client"));
  symlinkSync(broker.dir, join(work, "credbroker-quickstart"));
  const files = run.map((b, i) => {
    const f = `readme_block_${i}.mts`;
    writeFileSync(join(work, f), program(b));
    return f;
  });
  const tsc = spawnSync(
    process.execPath,
    [
      join(HERE, "node_modules", "typescript", "bin", "tsc"),
      ...["--strict", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext"],
      ...["--typeRoots", join(HERE, "node_modules", "@types"), "--types", "node", "--outDir", "out", "--rootDir", "."],
      ...files,
    ],
    { cwd: work, encoding: "utf8" },
  );
  assert.equal(tsc.status, 0, tsc.stdout + tsc.stderr);
  const env = { PATH: process.env["PATH"] ?? "", TOKEN: broker.subjectToken() };
  run.forEach((b, i) => {
    const r = spawnSync(process.execPath, [join("out", `readme_block_${i}.mjs`)], { cwd: work, env, encoding: "utf8", timeout: 60_000 });
    assert.equal(r.status, 0, `${where(b)}: ${r.stderr}`);
  });
  const others = blocks(READMES["clients/typescript/README.md"] ?? "", "clients/typescript/README.md").filter((b) => !LANGS.has(b.lang));
  skipped.push(...others.filter((o) => o.skip !== undefined));
  // The install block runs in test/packaging.test.ts, in a fresh project.
  const installs = others.filter((b) => b.skip === undefined && b.lang === "sh");
  const lines = [
    `README blocks: ${run.length} TypeScript blocks run here, ${installs.length} sh blocks in packaging.test.ts, ${skipped.length} blocks skipped`,
  ];
  for (const b of skipped) lines.push(`  skipped ${where(b)} (${b.lang}): ${b.skip ?? ""}`);
  for (const l of lines) t.diagnostic(l);
  // This package's README has no block that nothing runs.
  assert.deepEqual(others.filter((b) => b.skip === undefined && b.lang !== "sh").map(where), []);
});
