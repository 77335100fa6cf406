/**
 * The tool's side: send a DPoP-bound token with a fresh proof on every
 * request, as a `fetch` wrapper.
 */

import { timingSafeEqual } from "node:crypto";
import { inspect } from "node:util";

import { Issued } from "./broker.js";
import { CredbrokerError } from "./errors.js";
import type { ToolKey } from "./key.js";
import { NonceStore, challenge, originOf } from "./nonces.js";

/**
 * The token is not bound to this key: signing proofs for it would give it
 * away as a bearer token, or it would fail at the server.
 */
export class NotSenderConstrained extends CredbrokerError {}

function cnfJkt(token: string): string | undefined {
  // The token's own claims, read without verifying (the resource server
  // verifies): only to catch a token bound to another key, or to none.
  const parts = token.split(".");
  if (parts.length !== 3 || parts[1] === undefined) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(parts[1], "base64url").toString("utf8")) as { cnf?: { jkt?: unknown } };
    const jkt = claims?.cnf?.jkt;
    return typeof jkt === "string" ? jkt : undefined;
  } catch {
    return undefined;
  }
}

function same(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** A `fetch` that signs every request (what {@link dpopFetch} returns). */
export type DPoPFetch = typeof fetch;

/** How {@link dpopFetch} sends and what it remembers. */
export interface DPoPFetchOptions {
  /** The `fetch` underneath (default: the global one). */
  fetch?: typeof fetch;
  /** Where the servers' nonces are kept, per origin (default: a store of its own). */
  nonces?: NonceStore;
}

/**
 * A `fetch` that signs every request with `key`: `Authorization: DPoP <token>`
 * and a `DPoP` proof for the request's method and URL, with `ath`. When the
 * server answers with a `use_dpop_nonce` challenge, the request is sent once
 * more with the nonce. Nonces are kept per origin in `opts.nonces`, so each
 * server only ever sees its own. The third argument may also be the `fetch`
 * underneath alone.
 *
 * It refuses, when made, a token that is not sender-constrained: a
 * provider's bearer token (`Issued.senderConstrained` false) or a token whose
 * `cnf.jkt` is not this key's thumbprint.
 */
export function dpopFetch(token: Issued | string, key: ToolKey, opts: DPoPFetchOptions | typeof fetch = {}): DPoPFetch {
  const base = typeof opts === "function" ? opts : (opts.fetch ?? fetch);
  const nonces = (typeof opts === "function" ? undefined : opts.nonces) ?? new NonceStore();
  let value: string;
  if (token instanceof Issued) {
    if (!token.senderConstrained || token.tokenType !== "DPoP") {
      throw new NotSenderConstrained(
        "this token is a bearer token (senderConstrained false): send it as `Authorization: Bearer`, not with dpopFetch",
      );
    }
    value = token.token;
  } else {
    value = token;
  }
  const jkt = cnfJkt(value);
  if (jkt === undefined) throw new NotSenderConstrained("the token carries no cnf.jkt: it is not bound to a DPoP key");
  if (!same(jkt, key.thumbprint)) {
    throw new NotSenderConstrained(`the token is bound to another key (cnf.jkt is not ${key.thumbprint})`);
  }

  const signed = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const first = new Request(input, init);
    // A streamed body cannot be sent twice; keep a copy only when there may
    // be a second send.
    const again = first.body === null ? undefined : first.clone();
    const origin = originOf(first.url);
    const send = async (req: Request): Promise<Response> => {
      const headers = new Headers(req.headers);
      headers.set("authorization", `DPoP ${value}`);
      headers.set("dpop", await key.proof(req.method, req.url, { accessToken: value, nonce: nonces.get(origin) }));
      const res = await base(new Request(req, { headers }));
      nonces.update(origin, res.headers.get("dpop-nonce"));
      return res;
    };
    const res = await send(first);
    // An authorization server may name the error only in its JSON body
    // (RFC 9449 section 8): read the body of such a 400, and only then.
    const header = (n: string): string | null => res.headers.get(n);
    const bodyNeeded = res.status === 400 && header("dpop-nonce") !== null && challenge({ status: 400, header }) === undefined;
    const body = bodyNeeded ? await res.clone().text() : undefined;
    if (challenge({ status: res.status, header, ...(body === undefined ? {} : { body }) }) !== undefined) {
      await res.body?.cancel();
      return send(again ?? new Request(input, init));
    }
    return res;
  };
  const f = signed as DPoPFetch & { [inspect.custom]?: () => string };
  Object.defineProperty(f, inspect.custom, { value: () => `dpopFetch(key=${key.toString()}, token=[REDACTED])` });
  Object.defineProperty(f, "toString", { value: () => `dpopFetch(key=${key.toString()}, token=[REDACTED])` });
  return f;
}
