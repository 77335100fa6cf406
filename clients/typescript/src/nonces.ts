/**
 * DPoP server nonces (RFC 9449 sections 8 and 9), kept per origin.
 *
 * A server that wants nonces answers a proof without one (or with a stale
 * one) with a `use_dpop_nonce` challenge and a `DPoP-Nonce` header, and may
 * send a fresh `DPoP-Nonce` on any later answer. A nonce belongs to the
 * server that gave it: one {@link NonceStore} keeps the last nonce of each
 * origin, so a nonce from one server is never put in a proof for another.
 * The origins a client meets: the broker's socket (`unix:` and its path),
 * the broker's public origin (its egress proxy), each resource server and
 * each authorization server. {@link Broker} and {@link dpopFetch} each keep
 * one by default; pass the same store to several of them to share what they
 * learn.
 *
 * The Python client's `nonces.py` is the same design.
 */

import { resolve } from "node:path";

// A resource server asks with 401 (section 9), an authorization server with
// 400 (section 8); both name the error in `WWW-Authenticate: DPoP`, and an
// authorization server also in its JSON body.
const USE_NONCE = /\bDPoP\b.*\berror\s*=\s*"?use_dpop_nonce"?/i;
const DEFAULT_PORTS: Record<string, string> = { "http:": "80", "https:": "443" };

/**
 * The origin of an http(s) URL: `scheme://host:port`, lowercased, the port
 * always written (so `https://a.example` and `https://a.example:443` are one
 * origin).
 */
export function originOf(url: string | URL): string {
  const u = new URL(url);
  return `${u.protocol}//${u.hostname}:${u.port || DEFAULT_PORTS[u.protocol] || ""}`;
}

/** The origin of the broker's Unix socket: `unix:` and its absolute path. */
export function socketOrigin(path: string): string {
  return `unix:${resolve(path)}`;
}

/** What {@link challenge} reads of an answer. */
export interface NonceAnswer {
  status: number;
  header(name: string): string | null | undefined;
  /** The body, when it was read (only a 400's is ever needed). */
  body?: string;
}

/**
 * The nonce to retry with when an answer is a `use_dpop_nonce` challenge
 * (400 or 401, a `DPoP-Nonce`, and the error named in `WWW-Authenticate` or,
 * for 400, in a JSON body); otherwise undefined.
 */
export function challenge(a: NonceAnswer): string | undefined {
  const nonce = a.header("dpop-nonce");
  if ((a.status !== 400 && a.status !== 401) || !nonce) return undefined;
  if (USE_NONCE.test(a.header("www-authenticate") ?? "")) return nonce;
  if (a.status === 400 && a.body) {
    try {
      if ((JSON.parse(a.body) as { error?: unknown } | null)?.error === "use_dpop_nonce") return nonce;
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/**
 * The last `DPoP-Nonce` each origin gave, for the next proof to that origin
 * ({@link originOf}, {@link socketOrigin}).
 */
export class NonceStore {
  readonly #nonces = new Map<string, string>();

  /** The nonce to put in the next proof for `origin`, if it gave one. */
  get(origin: string): string | undefined {
    return this.#nonces.get(origin);
  }

  /** Keeps the `DPoP-Nonce` of an answer from `origin`, if it has one. */
  update(origin: string, nonce: string | null | undefined): void {
    if (nonce) this.#nonces.set(origin, nonce);
  }

  toString(): string {
    return `NonceStore(origins=${JSON.stringify([...this.#nonces.keys()].sort())})`;
  }
}
