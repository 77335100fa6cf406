// A worker process for single-use.test.ts: a verifier whose single-use
// store is FileSingleUseStore over the directory the test names. It reads
// its job (the verifier's settings and the requests) on stdin, waits for the
// test's start file, verifies each request and prints the verdicts as JSON.

import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";

import { Verifier, VerifyError } from "../../src/index.js";
import type { SingleUseStore } from "../../src/index.js";

/**
 * A single-use store shared by processes through a directory: one file per
 * (iss, jti), created with O_CREAT | O_EXCL (`wx`), which the kernel makes
 * atomic, so exactly one process creates it. For the test only: expired
 * entries are never reclaimed (held until deleted), which refuses more,
 * never less.
 */
export class FileSingleUseStore implements SingleUseStore {
  readonly #dir: string;
  constructor(dir: string) {
    this.#dir = dir;
  }
  async insertIfAbsent(iss: string, jti: string, expiresAt: number): Promise<boolean> {
    const name = createHash("sha256")
      .update(JSON.stringify([iss, jti]))
      .digest("hex");
    try {
      const f = await open(join(this.#dir, name), "wx");
      await f.writeFile(String(expiresAt));
      await f.close();
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST") return false;
      throw e;
    }
  }
}

interface Job {
  issuer: string;
  audience: string;
  jwks: unknown;
  dir: string;
  go: string;
  requests: [string, string][];
}

async function main(): Promise<void> {
  const job = JSON.parse(readFileSync(0, "utf8")) as Job;
  const v = await Verifier.create(job.issuer, job.audience, job.jwks, { singleUseStore: new FileSingleUseStore(job.dir) });
  while (!existsSync(job.go)) await new Promise((r) => setTimeout(r, 1));
  const out: string[] = [];
  for (const [authorization, proof] of job.requests) {
    try {
      await v.verify({ method: "DELETE", url: job.audience, authorization, dpop: [proof] });
      out.push("ok");
    } catch (e) {
      if (!(e instanceof VerifyError)) throw e;
      out.push(e.code);
    }
  }
  process.stdout.write(JSON.stringify(out));
}

if (process.argv[2] === "--worker") await main();
