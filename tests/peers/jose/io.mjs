// Shared plumbing for the jose peer scripts: each script reads one JSON
// object on stdin and writes one JSON object on stdout. A refusal by jose is
// `{"error": code, "message": ...}` with exit status 2, so the Rust tests can
// tell "jose said no" (an expected answer in negative tests) from "node broke"
// (any other status).
import { readFileSync } from 'node:fs';

export function input() {
  return JSON.parse(readFileSync(0, 'utf8'));
}

export async function run(main) {
  try {
    const out = await main(input());
    process.stdout.write(JSON.stringify(out) + '\n');
  } catch (err) {
    if (err && typeof err.code === 'string' && err.code.startsWith('ERR_J')) {
      process.stdout.write(JSON.stringify({ error: err.code, message: err.message }) + '\n');
      process.exit(2);
    }
    if (err instanceof PeerCheckFailed) {
      process.stdout.write(JSON.stringify({ error: err.code, message: err.message }) + '\n');
      process.exit(2);
    }
    console.error(err);
    process.exit(1);
  }
}

// A check this peer makes itself (jose verifies the JWS; RFC 9449 claim
// comparisons are the caller's job, so they are written out here).
export class PeerCheckFailed extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}
