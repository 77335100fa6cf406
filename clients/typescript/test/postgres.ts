// A PostgreSQL server for a test, as the Rust tests make theirs
// (tests/it/support/postgres.rs): Debian's `initdb` and `pg_ctl` in a temp
// directory, on a loopback port, password (SCRAM) authentication, no Unix
// socket; as root (CI) the server runs as `nobody` through `setpriv`, since
// PostgreSQL refuses to run as root. Missing binaries fail the test.

import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { appendFileSync, chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { freePort } from "./support.js";

function binDir(): string {
  const root = "/usr/lib/postgresql";
  const versions = existsSync(root) ? readdirSync(root).sort() : [];
  for (const v of versions.reverse()) {
    const bin = join(root, v, "bin");
    if (existsSync(join(bin, "initdb")) && existsSync(join(bin, "pg_ctl"))) return bin;
  }
  throw new Error("PostgreSQL's initdb and pg_ctl are missing (Debian's postgresql package): run scripts/install-test-deps");
}

export class Postgres {
  private constructor(
    readonly root: string,
    readonly port: number,
    readonly password: string,
    private readonly bin: string,
    private readonly asNobody: boolean,
  ) {}

  /** The connection string of the admin user. */
  get url(): string {
    return `postgres://credbroker_test:${this.password}@127.0.0.1:${this.port}/postgres`;
  }

  private run(tool: string, args: string[]): void {
    const [cmd, all] = this.asNobody
      ? ["setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "--", join(this.bin, tool), ...args]]
      : [join(this.bin, tool), args];
    execFileSync(cmd, all, { cwd: this.root, stdio: "pipe", env: { ...process.env, PGDATA: "" } });
  }

  static async start(): Promise<Postgres> {
    const bin = binDir();
    const root = mkdtempSync(join(tmpdir(), "credbroker-ts-pg-"));
    const password = randomBytes(16).toString("hex");
    const asNobody = process.getuid?.() === 0;
    const pg = new Postgres(root, await freePort(), password, bin, asNobody);
    const pwfile = join(root, "password");
    writeFileSync(pwfile, `${password}\n`, { mode: 0o600 });
    if (asNobody) for (const p of [root, pwfile]) chownSync(p, 65534, 65534);
    const data = join(root, "data");
    pg.run("initdb", [
      "-D",
      data,
      "-U",
      "credbroker_test",
      "--pwfile",
      pwfile,
      "--auth=scram-sha-256",
      "--encoding=UTF8",
      "--locale=C",
      "--no-sync",
    ]);
    appendFileSync(join(data, "postgresql.conf"), `listen_addresses = '127.0.0.1'\nunix_socket_directories = ''\nport = ${pg.port}\n`);
    try {
      pg.run("pg_ctl", ["-D", data, "-l", join(root, "server.log"), "start", "-w", "-t", "60"]);
    } catch (e) {
      const log = existsSync(join(root, "server.log")) ? readFileSync(join(root, "server.log"), "utf8") : "";
      throw new Error(`the test PostgreSQL did not start: ${String(e)}\n${log}`, { cause: e });
    }
    return pg;
  }

  stop(): void {
    try {
      this.run("pg_ctl", ["-D", join(this.root, "data"), "stop", "-m", "immediate", "-w"]);
    } finally {
      rmSync(this.root, { recursive: true, force: true });
    }
  }
}
