// A worker process for single-use.test.ts: a verifier whose single-use
// store is FileSingleUseStore over the directory the test names, or
// PgSingleUseStore over the PostgreSQL database it names. It reads
// its job (the verifier's settings and the requests) on stdin, waits for the
// test's start file, verifies each request and prints the verdicts as JSON.

import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";

import pg from "pg";

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

/**
 * A single-use store in PostgreSQL, shared by every process that connects:
 * one statement on the primary key (iss, jti), atomic across connections;
 * an expired row of the same key is taken over in the same statement, a
 * live one leaves the insert undone (`false`). What the READMEs suggest for
 * several processes.
 */
export class PgSingleUseStore implements SingleUseStore {
  static readonly TABLE =
    "CREATE TABLE IF NOT EXISTS credbroker_single_use (iss TEXT NOT NULL, jti TEXT NOT NULL, expires_at BIGINT NOT NULL, PRIMARY KEY (iss, jti))";
  readonly #pool: pg.Pool;
  constructor(pool: pg.Pool) {
    this.#pool = pool;
  }
  async insertIfAbsent(iss: string, jti: string, expiresAt: number, now: number): Promise<boolean> {
    const r = await this.#pool.query(
      "INSERT INTO credbroker_single_use (iss, jti, expires_at) VALUES ($1, $2, $3) " +
        "ON CONFLICT (iss, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at WHERE credbroker_single_use.expires_at <= $4",
      [iss, jti, expiresAt, Math.floor(now)],
    );
    return r.rowCount === 1;
  }
}

interface Job {
  issuer: string;
  audience: string;
  jwks: unknown;
  /** A FileSingleUseStore's directory, or a PostgreSQL connection string. */
  dir?: string;
  postgres?: string;
  go: string;
  requests: [string, string][];
}

async function main(): Promise<void> {
  const job = JSON.parse(readFileSync(0, "utf8")) as Job;
  const pool = job.postgres === undefined ? undefined : new pg.Pool({ connectionString: job.postgres, max: 2 });
  const singleUseStore = pool === undefined ? new FileSingleUseStore(job.dir as string) : new PgSingleUseStore(pool);
  const v = await Verifier.create(job.issuer, job.audience, job.jwks, { singleUseStore });
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
  await pool?.end();
  process.stdout.write(JSON.stringify(out));
}

if (process.argv[2] === "--worker") await main();
