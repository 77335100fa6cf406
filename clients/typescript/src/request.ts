/**
 * Request binding (docs/APPROVALS.md in the credbroker repository, "The
 * request, bound"): the digest of the exact request a token is approved
 * for, its `req_sha256` claim.
 *
 * The digest input is six fields, each written as its length in bytes (four
 * bytes, big-endian) followed by its bytes: the label
 * `credbroker-request-v1`; the method as sent; the raw path, never decoded;
 * the raw query without its `?`, never decoded or reordered (empty when
 * there is none); the `Content-Type` value as sent, parameters included
 * (empty when there is none); and the body: empty when there is none, the
 * RFC 8785 (JCS) form of an I-JSON body for a JSON media type
 * (`application/json`, `*\/*+json`), otherwise its bytes. `req_sha256` is
 * the lower-case hex SHA-256 of that input.
 *
 * The JCS serialisation is the `canonicalize` package's. What `JSON.parse`
 * hides (a duplicate member name, a number's text, an escaped lone
 * surrogate, the depth) is checked first by {@link checkIJson}, a scanner
 * of the JSON grammar that builds nothing. `proto/request-binding-vectors.json`
 * pins all of it; the tests run every vector.
 */

import { createHash } from "node:crypto";
import canonicalizeJson from "canonicalize";
import { CredbrokerError } from "./errors.js";

/** The digest input's first field. */
export const LABEL = "credbroker-request-v1";
/**
 * The largest body a request binding takes, raw and in its canonical form
 * (bytes): the derive carries it whole over the socket and the approval
 * page shows it whole.
 */
export const MAX_BOUND_BODY = 16 * 1024;
/** The deepest nesting of arrays and objects a bound JSON body may have. */
export const MAX_DEPTH = 32;

/**
 * A request that cannot be bound. `reason` is the proxy's word for it:
 * `body_not_ijson` (a JSON body that is not I-JSON, or a JSON media type
 * whose charset is not UTF-8) or `bound_body_too_large`.
 */
export class RequestError extends CredbrokerError {
  readonly reason: "body_not_ijson" | "bound_body_too_large";
  constructor(reason: "body_not_ijson" | "bound_body_too_large", description: string) {
    super(description);
    this.name = "RequestError";
    this.reason = reason;
  }
}

function notIJson(why: string): never {
  throw new RequestError("body_not_ijson", `the body is not I-JSON: ${why}`);
}

function tooLarge(): never {
  throw new RequestError("bound_body_too_large", `the body is over ${MAX_BOUND_BODY} bytes, the bindable most`);
}

/**
 * A request as it is bound: what the derive carries (`request`) and what
 * the proxy or a resource server receives. `path` and `query` are raw (as
 * on the request line, `query` without `?`); `body` is the body as sent (a
 * string is taken as its UTF-8 bytes).
 */
export interface BoundRequest {
  method: string;
  path: string;
  query?: string;
  contentType?: string;
  body?: string | Uint8Array;
}

/** A bound request: the body as it is hashed (and, by the broker's proxy, sent) and `req_sha256`. */
export interface Bound {
  readonly body: Uint8Array;
  readonly sha256: string;
}

function bytesOf(body: string | Uint8Array | undefined): Uint8Array {
  if (body === undefined) return new Uint8Array();
  return typeof body === "string" ? new TextEncoder().encode(body) : body;
}

/** The derive's `request` member (the body must be UTF-8 text). */
export function requestJson(r: BoundRequest): Record<string, string> {
  let body: string;
  try {
    body = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytesOf(r.body));
  } catch {
    throw new RequestError("body_not_ijson", "a bound request's body must be UTF-8 text");
  }
  return { method: r.method, path: r.path, query: r.query ?? "", content_type: r.contentType ?? "", body };
}

/**
 * `undefined` when `contentType` is not a JSON media type (`application/json`
 * or a `+json` suffix, any case and parameters); else whether its charset,
 * if any, is UTF-8.
 */
export function jsonMediaType(contentType: string): boolean | undefined {
  const [first, ...params] = contentType.split(";");
  const essence = (first ?? "").trim().toLowerCase();
  if (!(essence === "application/json" || (essence.endsWith("+json") && essence.includes("/")))) return undefined;
  for (const p of params) {
    const eq = p.indexOf("=");
    if (eq < 0 || p.slice(0, eq).trim().toLowerCase() !== "charset") continue;
    if (
      p
        .slice(eq + 1)
        .trim()
        .replace(/^"+|"+$/g, "")
        .toLowerCase() !== "utf-8"
    )
      return false;
  }
  return true;
}

/**
 * A non-negative decimal text as its significant digits (no leading or
 * trailing zeros) and the position of the decimal point after the first of
 * them; `undefined` for zero.
 */
function decimalParts(text: string): [string, number] | undefined {
  const m = /^([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?$/.exec(text);
  if (m === null) return undefined;
  const whole = m[1] ?? "";
  const digits = whole + (m[2] ?? "");
  const lead = digits.length - digits.replace(/^0+/, "").length;
  const significant = digits.slice(lead).replace(/0+$/, "");
  if (significant === "") return undefined;
  return [significant, whole.length - lead + (m[3] === undefined ? 0 : Number(m[3]))];
}

/** Refuses a number whose text is not its double's shortest text, or an integer beyond 2^53 - 1. */
function checkNumber(text: string): void {
  const x = Number(text);
  if (!Number.isFinite(x)) notIJson("a number beyond the doubles");
  if (Number.isInteger(x) && Math.abs(x) > Number.MAX_SAFE_INTEGER) notIJson("an integer beyond 2^53 - 1");
  const written = decimalParts(text.replace(/^-/, ""));
  const shortest = x === 0 ? undefined : decimalParts(String(Math.abs(x)));
  if (written?.[0] !== shortest?.[0] || written?.[1] !== shortest?.[1]) {
    notIJson("a number with more digits than its double holds");
  }
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const WS = /[ \t\n\r]*/y;

/**
 * Scans `text` as JSON (RFC 8259) and refuses what `JSON.parse` would hide
 * but I-JSON forbids: a duplicate member name, a lone surrogate in an
 * escape, a number that is not exactly its double's shortest text or an
 * integer beyond 2^53 - 1, nesting deeper than {@link MAX_DEPTH}. Builds
 * nothing: `JSON.parse` then reads the same text.
 */
export function checkIJson(text: string): void {
  let i = 0;
  const ws = (): void => {
    WS.lastIndex = i;
    WS.exec(text);
    i = WS.lastIndex;
  };
  const string = (): string => {
    // At the opening quote: the decoded string (JSON.parse's, for the
    // names), after checking its escaped surrogates pair up.
    const start = i;
    i++;
    for (;;) {
      const c = text.charCodeAt(i);
      if (Number.isNaN(c) || c < 0x20) notIJson("not JSON text");
      if (c === 0x22) break;
      if (c === 0x5c) {
        const e = text[i + 1];
        if (e === "u") {
          const u = parseInt(text.slice(i + 2, i + 6), 16);
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) notIJson("not JSON text");
          if (u >= 0xdc00 && u <= 0xdfff) notIJson("a string holds a lone surrogate");
          if (u >= 0xd800 && u <= 0xdbff) {
            const low = text.slice(i + 6, i + 12);
            const l = parseInt(low.slice(2), 16);
            if (!/^\\u[0-9a-fA-F]{4}$/.test(low) || l < 0xdc00 || l > 0xdfff) notIJson("a string holds a lone surrogate");
            i += 12;
          } else {
            i += 6;
          }
          continue;
        }
        if (e === undefined || !'"\\/bfnrt'.includes(e)) notIJson("not JSON text");
        i += 2;
        continue;
      }
      i++;
    }
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  const value = (depth: number): void => {
    ws();
    const c = text[i];
    if (c === "{" || c === "[") {
      if (depth + 1 > MAX_DEPTH) notIJson("arrays and objects nest too deeply");
      i++;
      ws();
      const close = c === "{" ? "}" : "]";
      const names = new Set<string>();
      if (text[i] === close) {
        i++;
        return;
      }
      for (;;) {
        if (c === "{") {
          ws();
          if (text[i] !== '"') notIJson("not JSON text");
          const name = string();
          if (names.has(name)) notIJson("an object has two members of one name");
          names.add(name);
          ws();
          if (text[i] !== ":") notIJson("not JSON text");
          i++;
        }
        value(depth + 1);
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] !== close) notIJson("not JSON text");
        i++;
        return;
      }
    }
    if (c === '"') {
      string();
      return;
    }
    for (const lit of ["true", "false", "null"]) {
      if (text.startsWith(lit, i)) {
        i += lit.length;
        return;
      }
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m === null) notIJson("not JSON text");
    checkNumber(m[0]);
    i = NUMBER.lastIndex;
  };
  value(0);
  ws();
  if (i !== text.length) notIJson("not JSON text");
}

/**
 * The RFC 8785 (JCS) form of an I-JSON text; {@link RequestError}
 * (`body_not_ijson`) for one that is not I-JSON or not UTF-8.
 */
export function canonicalize(body: Uint8Array): Uint8Array {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(body);
  } catch {
    notIJson("not UTF-8");
  }
  checkIJson(text);
  const out = canonicalizeJson(JSON.parse(text));
  if (out === undefined) notIJson("not canonicalisable");
  return new TextEncoder().encode(out);
}

/**
 * The body as it is hashed: empty stays empty; a JSON body is checked as
 * I-JSON and canonicalised; any other body is its bytes.
 */
export function hashedBody(contentType: string, body: Uint8Array): Uint8Array {
  if (body.length > MAX_BOUND_BODY) tooLarge();
  if (body.length === 0) return new Uint8Array();
  const json = jsonMediaType(contentType);
  if (json === false) notIJson("a JSON body's charset must be utf-8");
  const out = json === true ? canonicalize(body) : body;
  if (out.length > MAX_BOUND_BODY) tooLarge();
  return out;
}

/** The digest input of `r` whose body is already the hashed one. */
export function digestInput(r: BoundRequest, hashed: Uint8Array): Buffer {
  const fields = [LABEL, r.method, r.path, r.query ?? "", r.contentType ?? ""].map((f) => Buffer.from(f, "utf8"));
  fields.push(Buffer.from(hashed));
  return Buffer.concat(
    fields.flatMap((f) => {
      const len = Buffer.alloc(4);
      len.writeUInt32BE(f.length);
      return [len, f];
    }),
  );
}

/** Binds `r`: its hashed body and its `req_sha256`; throws {@link RequestError} for a request that cannot be bound. */
export function bind(r: BoundRequest): Bound {
  const body = hashedBody(r.contentType ?? "", bytesOf(r.body));
  return { body, sha256: createHash("sha256").update(digestInput(r, body)).digest("hex") };
}
