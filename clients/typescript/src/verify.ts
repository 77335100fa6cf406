/**
 * For resource servers written in TypeScript: verify a credbroker token and
 * its DPoP proof, with the checks of `docs/RESOURCE-SERVERS.md` in their
 * order (the same order and verdicts as the Python and Rust verifiers; the
 * shared vectors in `tests/vectors/resource-server.json` hold all three to it).
 *
 * Signatures are checked by `jose`; what a generic JOSE library does not do
 * (the header allow-lists, `htm`/`htu`/`iat`/`ath`, the key binding and the
 * replay cache) is here. Time comes from an injectable clock.
 *
 * A token marked `single_use` (an `each_call` approval's) is accepted once:
 * the verifier records its (`iss`, `jti`) in a {@link SingleUseStore} until it
 * expires and refuses it after. The default store is in this process's
 * memory, which is wrong for a server of several processes (see
 * `single-use.ts`).
 */

import { timingSafeEqual } from "node:crypto";
import { calculateJwkThumbprint, compactVerify, importJWK } from "jose";
import type { JWK } from "jose";

import { CredbrokerError } from "./errors.js";
import { ath as athOf } from "./key.js";
import { RequestError, bind } from "./request.js";
import { MemorySingleUseStore } from "./single-use.js";
import type { SingleUseStore } from "./single-use.js";

export const MAX_TOKEN = 8 * 1024;
export const MAX_PROOF = 4 * 1024;
export const MAX_KEYS_DOCUMENT = 64 * 1024;
/** Milliseconds one metadata or JWKS fetch may take in all. */
export const FETCH_TIMEOUT_MS = 10_000;

/**
 * GET `url`: 200 only, no redirect followed, at most
 * {@link MAX_KEYS_DOCUMENT} bytes read (the body is read chunk by chunk and
 * the read cancelled at the first chunk over), `timeoutMs` in all.
 */
async function cappedGet(url: string, timeoutMs: number): Promise<string> {
  const signal = AbortSignal.timeout(timeoutMs);
  const failed = (e: unknown): VerifyError =>
    e instanceof VerifyError
      ? e
      : new VerifyError("keys_unavailable", signal.aborted ? `${url}: not read within ${timeoutMs} ms` : `${url}: ${(e as Error).name}`);
  let r: Response;
  try {
    r = await fetch(url, { redirect: "manual", signal });
  } catch (e) {
    throw failed(e);
  }
  const tooLarge = new VerifyError("keys_unavailable", `${url}: larger than ${MAX_KEYS_DOCUMENT} bytes`);
  if (r.status !== 200) {
    await r.body?.cancel().catch(() => undefined);
    throw new VerifyError("keys_unavailable", `${url}: HTTP ${r.status}`);
  }
  const declared = Number(r.headers.get("content-length") ?? "");
  if (Number.isFinite(declared) && declared > MAX_KEYS_DOCUMENT) {
    await r.body?.cancel().catch(() => undefined);
    throw tooLarge;
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = r.body?.getReader();
  try {
    for (;;) {
      if (reader === undefined) break;
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > MAX_KEYS_DOCUMENT) {
        await reader.cancel().catch(() => undefined);
        throw tooLarge;
      }
      chunks.push(value);
    }
  } catch (e) {
    await reader?.cancel().catch(() => undefined);
    throw failed(e);
  }
  return Buffer.concat(chunks).toString("utf8");
}
/** Clock skew allowed on the token's `exp`/`iat`, in seconds. */
export const SKEW = 5;
/** How far a proof's `iat` may be from now, either way, in seconds. */
export const PROOF_WINDOW = 60;
/** The least time between two JWKS fetches caused by unknown `kid`s, in seconds. */
export const REFRESH_INTERVAL = 60;

const B64URL = /^[A-Za-z0-9_-]*$/;

/**
 * Why a request is not authenticated. `code` is the `WWW-Authenticate` error
 * (`invalid_token`, `invalid_dpop_proof`, `use_dpop_nonce`), `missing` (no
 * `Authorization` at all: the challenge names no error), `keys_unavailable`
 * (answer 503: the token may be fine), or `replay_store_unavailable` (answer
 * 503: the single-use store failed or is full, so a single-use token could
 * not be recorded and is not accepted).
 */
export class VerifyError extends CredbrokerError {
  readonly code: string;
  readonly description: string;
  constructor(code: string, description: string) {
    super(`${code}: ${description}`);
    this.code = code;
    this.description = description;
  }
  /** The HTTP status to answer with. */
  get status(): number {
    return UNAVAILABLE.includes(this.code) ? 503 : 401;
  }
  /** The `WWW-Authenticate` value (none for 503). */
  challenge(): string | undefined {
    if (UNAVAILABLE.includes(this.code)) return undefined;
    if (this.code === "missing") return 'DPoP algs="ES256"';
    return `DPoP error="${this.code}", algs="ES256"`;
  }
}

const UNAVAILABLE = ["keys_unavailable", "replay_store_unavailable"];

type Err = (d: string) => VerifyError;
const tokenErr: Err = (d) => new VerifyError("invalid_token", d);
const proofErr: Err = (d) => new VerifyError("invalid_dpop_proof", d);

/**
 * Who the request is for: the person is (`subjectIss`, `sub`); `subjectIss`
 * is absent only from tokens of brokers that predate it.
 */
export interface Principal {
  readonly subjectIss: string | undefined;
  readonly sub: string;
  readonly agent: string;
  readonly tool: string | undefined;
  /** The orchestrator's step the token was derived in (`act.step`), when the broker records it. */
  readonly step: string | undefined;
  readonly scopes: readonly string[];
  readonly jkt: string;
  readonly exp: number;
  /** The token's `jti`. */
  readonly jti: string;
  /**
   * Whether the token is single-use (`single_use`, an `each_call`
   * approval's): this verifier accepted it for this one request and refuses
   * it after.
   */
  readonly singleUse: boolean;
  /** The approval the token was minted on (`approval_id`), if any. */
  readonly approvalId: string | undefined;
  /**
   * The call's RFC 9396 `authorization_details`, as the broker checked them
   * and, for a tool that needs approval, as the person approved them:
   * compare them with what the request does (`docs/RESOURCE-SERVERS.md`).
   */
  readonly authorizationDetails: unknown;
  /**
   * The digest of the one request the token is bound to (`req_sha256`),
   * checked against the request's `body` and `contentType`; `undefined` for
   * a token bound to no request.
   */
  readonly reqSha256: string | undefined;
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function b64(part: string, err: Err, what: string): Buffer {
  if (!B64URL.test(part) || part.length % 4 === 1) throw err(`${what} is not base64url`);
  return Buffer.from(part, "base64url");
}

function split(compact: string, err: Err, what: string): [Obj, Obj] {
  const parts = compact.split(".");
  if (parts.length !== 3) throw err(`the ${what} is not a compact JWS`);
  const [h, c, s] = parts as [string, string, string];
  let header: unknown;
  let claims: unknown;
  const hb = b64(h, err, `the ${what} header`);
  const cb = b64(c, err, `the ${what} payload`);
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(hb));
    claims = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(cb));
  } catch {
    throw err(`the ${what} header or payload is not JSON`);
  }
  if (!isObj(header) || !isObj(claims)) throw err(`the ${what} header or payload is not a JSON object`);
  b64(s, err, `the ${what} signature`);
  return [header, claims];
}

async function signedBy(compact: string, key: CryptoKey | Uint8Array, err: Err, what: string): Promise<void> {
  try {
    await compactVerify(compact, key, { algorithms: ["ES256"] });
  } catch {
    throw err(`the ${what} signature does not verify`);
  }
}

function normalUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw proofErr("htu is not a URL");
  }
  // WHATWG URL lower-cases scheme and host and drops a default port.
  return JSON.stringify([u.protocol, u.hostname, u.port, u.pathname || "/"]);
}

function same(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);

/**
 * The (`jkt`, `jti`) pairs seen in the proof window. Full means refuse: a
 * proof is never let through unchecked.
 */
export class ReplayCache {
  #seen = new Map<string, number>();
  readonly #capacity: number;
  constructor(capacity = 100_000) {
    this.#capacity = capacity;
  }
  checkAndRecord(jkt: string, jti: string, now: number, keepUntil: number): void {
    const k = JSON.stringify([jkt, jti]);
    const t = this.#seen.get(k);
    if (t !== undefined && t >= now) throw proofErr("the proof was used before (replay)");
    if (this.#seen.size >= this.#capacity) {
      for (const [key, until] of this.#seen) if (until < now) this.#seen.delete(key);
    }
    if (this.#seen.size >= this.#capacity) {
      throw new VerifyError("keys_unavailable", "the DPoP replay cache is full; retry shortly");
    }
    this.#seen.set(k, keepUntil);
  }
}

/** A JWKS document. */
export interface Jwks {
  keys: unknown[];
}

/** Options of a {@link Verifier}. */
export interface VerifierOptions {
  /** Seconds since the epoch (tests inject one). */
  clock?: () => number;
  replay?: ReplayCache;
  /**
   * Where single-use tokens are recorded (default: a
   * {@link MemorySingleUseStore}, wrong for several processes).
   */
  singleUseStore?: SingleUseStore;
  /** Refetches the JWKS for an unknown `kid` (at most once a minute). */
  fetchJwks?: () => Promise<unknown>;
}

/** One request to check. */
export interface VerifyRequest {
  method: string;
  /**
   * Your configured public URL plus the request's raw path and query (as on
   * the request line, never decoded), never built from `Host`.
   */
  url: string;
  /** The `Authorization` header, if any. */
  authorization: string | undefined | null;
  /** Every `DPoP` header value the request carried. */
  dpop: readonly string[];
  /**
   * RFC 9449 section 9: with it, the proof must carry a `nonce` for which it
   * returns true; otherwise the error is `use_dpop_nonce` (answer 401 with
   * `e.challenge()` and a fresh `DPoP-Nonce` header).
   */
  nonce?: (nonce: string) => boolean;
  /**
   * The body as received (empty for none): with it, a token bound to one
   * request (`req_sha256`, check 20) must be bound to this one (the method,
   * the raw path and query of `url`, `contentType` and the body). Without
   * it such a token is refused. A refused request does not use a
   * single-use token up.
   */
  body?: string | Uint8Array;
  /** The `Content-Type` as received (absent or null for none). */
  contentType?: string | null;
}

/** The raw path and query of `url` (never decoded): `/` for an empty path, `""` for no query. */
function rawPathAndQuery(url: string): [string, string] {
  const u = url.split("#", 1)[0] ?? "";
  const i = u.indexOf("://");
  const rest = i >= 0 ? u.slice(i + 3) : u;
  const starts = [rest.indexOf("/"), rest.indexOf("?")].filter((j) => j >= 0);
  const target = starts.length > 0 ? rest.slice(Math.min(...starts)) : "";
  const q = target.indexOf("?");
  const path = q >= 0 ? target.slice(0, q) : target;
  return [path === "" ? "/" : path, q >= 0 ? target.slice(q + 1) : ""];
}

/**
 * Check 20: a token bound to one request (`req_sha256`) is refused unless
 * the request handed to the verifier is that one. Made after the proof,
 * before a single-use token is recorded.
 */
function checkRequest(who: Principal, req: VerifyRequest): void {
  if (who.reqSha256 === undefined) return;
  if (req.body === undefined) throw tokenErr("the token is bound to one request: verify it with the request's body");
  const [path, query] = rawPathAndQuery(req.url);
  let got: string;
  try {
    got = bind({ method: req.method, path, query, contentType: req.contentType ?? "", body: req.body }).sha256;
  } catch (e) {
    if (e instanceof RequestError) throw tokenErr(`the request cannot be bound (${e.reason})`);
    throw e;
  }
  if (!same(got, who.reqSha256)) throw tokenErr("the request is not the one the token is bound to");
}

async function keysOf(jwks: unknown): Promise<Map<string, CryptoKey | Uint8Array>> {
  const keys = new Map<string, CryptoKey | Uint8Array>();
  const entries = isObj(jwks) ? jwks["keys"] : undefined;
  if (!Array.isArray(entries)) throw new VerifyError("keys_unavailable", "the JWKS has no keys list");
  for (const k of entries) {
    if (!isObj(k) || k["kty"] !== "EC" || k["crv"] !== "P-256") continue;
    if ((k["alg"] ?? "ES256") !== "ES256" || "d" in k || typeof k["kid"] !== "string") continue;
    try {
      const jwk: JWK = { kty: "EC", crv: "P-256", x: k["x"] as string, y: k["y"] as string };
      keys.set(k["kid"], await importJWK(jwk, "ES256"));
    } catch {
      continue;
    }
  }
  return keys;
}

/**
 * Verifies requests for one audience (your resource URI) from one issuer.
 * Make one with {@link Verifier.create} (keys given) or
 * {@link Verifier.fromIssuer} (keys read from the issuer's metadata).
 */
export class Verifier {
  readonly issuer: string;
  readonly audience: string;
  readonly #clock: () => number;
  readonly #replay: ReplayCache;
  readonly #singleUse: SingleUseStore;
  readonly #fetch: (() => Promise<unknown>) | undefined;
  #lastFetch = -Infinity;
  #keys: Map<string, CryptoKey | Uint8Array>;

  private constructor(issuer: string, audience: string, keys: Map<string, CryptoKey | Uint8Array>, opts: VerifierOptions) {
    this.issuer = issuer;
    this.audience = audience;
    this.#keys = keys;
    this.#clock = opts.clock ?? (() => Date.now() / 1000);
    this.#replay = opts.replay ?? new ReplayCache();
    this.#singleUse = opts.singleUseStore ?? new MemorySingleUseStore();
    this.#fetch = opts.fetchJwks;
  }

  /** A verifier with the issuer's keys `jwks`. */
  static async create(issuer: string, audience: string, jwks: unknown, opts: VerifierOptions = {}): Promise<Verifier> {
    return new Verifier(issuer, audience, await keysOf(jwks), opts);
  }

  /**
   * Reads the issuer's RFC 8414 metadata (its `issuer` must be `issuer`
   * exactly) and the JWKS it names; unknown `kid`s refetch the JWKS, at most
   * once a minute.
   *
   * What it reads from the network is capped while it reads: each document
   * at most {@link MAX_KEYS_DOCUMENT} bytes (after any content decoding; the
   * read stops at the first chunk over), redirects refused, and each fetch
   * given `opts.timeoutMs` (default {@link FETCH_TIMEOUT_MS}) in all,
   * headers and body.
   */
  static async fromIssuer(
    issuer: string,
    audience: string,
    opts: Omit<VerifierOptions, "fetchJwks"> & { timeoutMs?: number } = {},
  ): Promise<Verifier> {
    const timeoutMs = opts.timeoutMs ?? FETCH_TIMEOUT_MS;
    const get = async (url: string): Promise<Obj> => {
      const text = await cappedGet(url, timeoutMs);
      let doc: unknown;
      try {
        doc = JSON.parse(text);
      } catch {
        throw new VerifyError("keys_unavailable", `${url}: not JSON`);
      }
      if (!isObj(doc)) throw new VerifyError("keys_unavailable", `${url}: not a JSON object`);
      return doc;
    };
    const meta = await get(`${issuer}/.well-known/oauth-authorization-server`);
    if (meta["issuer"] !== issuer) throw new VerifyError("keys_unavailable", `the metadata names another issuer than ${issuer}`);
    const jwksUri = meta["jwks_uri"];
    if (typeof jwksUri !== "string") throw new VerifyError("keys_unavailable", "the metadata has no jwks_uri");
    return Verifier.create(issuer, audience, await get(jwksUri), { ...opts, fetchJwks: () => get(jwksUri) });
  }

  async #key(kid: string): Promise<CryptoKey | Uint8Array> {
    let key = this.#keys.get(kid);
    const now = this.#clock();
    if (key === undefined && this.#fetch !== undefined && now - this.#lastFetch >= REFRESH_INTERVAL) {
      this.#lastFetch = now;
      this.#keys = await keysOf(await this.#fetch());
      key = this.#keys.get(kid);
    }
    if (key === undefined) throw tokenErr("the token names a key the issuer does not publish");
    return key;
  }

  /**
   * Checks one request; rejects with a {@link VerifyError}. A token bound
   * to one request (`req_sha256`) is then compared with `req.body` and
   * `req.contentType` (refused without them). A single-use token is then
   * recorded in the single-use store, and refused if it was there.
   */
  async verify(req: VerifyRequest): Promise<Principal> {
    const who = await this.#check(req);
    checkRequest(who, req);
    if (!who.singleUse) return who;
    let first: unknown;
    try {
      // Until the token's expiry plus the skew: while it could still pass.
      first = await this.#singleUse.insertIfAbsent(this.issuer, who.jti, who.exp + SKEW, this.#clock());
    } catch {
      first = undefined;
    }
    if (first === false) throw tokenErr("the token is single-use and was already used");
    if (first !== true) throw new VerifyError("replay_store_unavailable", "the single-use store could not record the token");
    return who;
  }

  async #check(req: VerifyRequest): Promise<Principal> {
    const now = this.#clock();
    // 1, 2: the request.
    if (req.authorization === undefined || req.authorization === null) throw new VerifyError("missing", "no Authorization header");
    const sp = req.authorization.indexOf(" ");
    const scheme = sp < 0 ? req.authorization : req.authorization.slice(0, sp);
    if (scheme.toLowerCase() !== "dpop") throw tokenErr("the token is DPoP-bound; the Authorization scheme must be DPoP");
    const token = (sp < 0 ? "" : req.authorization.slice(sp + 1)).trim();
    if (!token || token.length > MAX_TOKEN) throw tokenErr("the token is empty or larger than 8 KiB");
    const [header, claims] = split(token, tokenErr, "token");
    // 3: the header, against allow-lists. typ compares case-insensitively
    // (RFC 7515 section 4.1.9), as in Rust.
    const typ = header["typ"];
    if (typeof typ !== "string" || typ.toLowerCase() !== "at+jwt") throw tokenErr("typ is not at+jwt");
    if (header["alg"] !== "ES256") throw tokenErr("alg is not ES256");
    if ("crit" in header) throw tokenErr("unknown crit");
    const kid = header["kid"];
    if (typeof kid !== "string") throw tokenErr("no kid");
    // 4, 5: key and signature.
    await signedBy(token, await this.#key(kid), tokenErr, "token");
    // 6: claim types.
    const { iss, sub, aud, iat, exp, jti: tokenJti } = claims;
    const subjectIss = claims["subject_iss"];
    const cnf = claims["cnf"];
    const act = claims["act"];
    const scope = "scope" in claims ? claims["scope"] : "";
    const jkt = isObj(cnf) ? cnf["jkt"] : undefined;
    const agent = isObj(act) ? act["sub"] : undefined;
    // null as absent, as serde's Option does in the Rust verifier.
    const tool = isObj(act) ? (act["tool"] ?? undefined) : undefined;
    const step = isObj(act) ? (act["step"] ?? undefined) : undefined;
    const singleUse = claims["single_use"] ?? false;
    const approvalId = claims["approval_id"] ?? undefined;
    if (![iss, sub, aud, tokenJti, jkt, agent, scope].every((v) => typeof v === "string")) {
      throw tokenErr("iss, sub, aud, jti, cnf.jkt, act.sub or scope is missing or not a string");
    }
    if (subjectIss !== undefined && typeof subjectIss !== "string") throw tokenErr("subject_iss is not a string");
    if (!isInt(iat) || !isInt(exp)) throw tokenErr("iat or exp is not an integer");
    if (![tool, step].every((v) => v === undefined || typeof v === "string")) throw tokenErr("act.tool or act.step is not a string");
    if (typeof singleUse !== "boolean" || !(approvalId === undefined || typeof approvalId === "string")) {
      throw tokenErr("single_use is not a boolean or approval_id not a string");
    }
    const reqSha256 = claims["req_sha256"] ?? undefined;
    if (!(reqSha256 === undefined || typeof reqSha256 === "string")) throw tokenErr("req_sha256 is not a string");
    // 7, 8, 9: issuer, audience, time.
    if (iss !== this.issuer) throw tokenErr("the token is from another issuer");
    if (aud !== this.audience) throw tokenErr("the token is for another audience");
    if (now >= exp + SKEW) throw tokenErr("the token has expired");
    if (iat > now + SKEW) throw tokenErr("the token is issued in the future");
    // 10, 11: one proof, its header and signature.
    if (req.dpop.length !== 1) throw proofErr("exactly one DPoP header is needed");
    const proof = req.dpop[0] as string;
    if (proof.length > MAX_PROOF) throw proofErr("the proof is larger than 4 KiB");
    const [ph, pc] = split(proof, proofErr, "proof");
    if (ph["typ"] !== "dpop+jwt" || ph["alg"] !== "ES256" || "crit" in ph) {
      throw proofErr("the proof header must have typ dpop+jwt, alg ES256 and no crit");
    }
    const jwk = ph["jwk"];
    if (!isObj(jwk) || "d" in jwk || jwk["kty"] !== "EC" || jwk["crv"] !== "P-256") {
      throw proofErr("the proof's jwk is not a public EC P-256 key");
    }
    if (typeof jwk["x"] !== "string" || typeof jwk["y"] !== "string") throw proofErr("the proof's jwk is not a usable key");
    const pub: JWK = { kty: "EC", crv: "P-256", x: jwk["x"], y: jwk["y"] };
    let pkey: CryptoKey | Uint8Array;
    try {
      pkey = await importJWK(pub, "ES256");
    } catch {
      throw proofErr("the proof's jwk is not a usable key");
    }
    await signedBy(proof, pkey, proofErr, "proof");
    // 12-16: the proof's claims.
    const { jti, htm, htu, iat: piat } = pc;
    if (typeof jti !== "string" || typeof htm !== "string" || typeof htu !== "string" || !isInt(piat)) {
      throw proofErr("jti, htm, htu (strings) and iat (integer) are required");
    }
    if (htm !== req.method) throw proofErr("htm is not the request method");
    if (normalUrl(htu) !== normalUrl(req.url)) throw proofErr("htu is not the request URL");
    if (Math.abs(now - piat) > PROOF_WINDOW) throw proofErr("iat is too far from now");
    if (req.nonce !== undefined) {
      const got = pc["nonce"];
      if (typeof got !== "string" || !req.nonce(got)) throw new VerifyError("use_dpop_nonce", "a fresh server nonce is required");
    }
    const gotAth = pc["ath"];
    if (typeof gotAth !== "string" || !same(gotAth, athOf(token))) throw proofErr("ath does not match the token");
    // 17: the key binding.
    const bound = jkt as string;
    if (!same(await calculateJwkThumbprint(pub, "sha256"), bound)) {
      throw proofErr("the proof is signed by another key than the token is bound to");
    }
    // 18: replay, recorded only now (19, a single-use token, is recorded by
    // verify, in its store).
    this.#replay.checkAndRecord(bound, jti, now, now + PROOF_WINDOW + SKEW);
    return {
      subjectIss: subjectIss,
      sub: sub as string,
      agent: agent as string,
      tool: tool as string | undefined,
      step: step as string | undefined,
      scopes: (scope as string).split(/\s+/).filter((s) => s !== ""),
      jkt: bound,
      exp,
      jti: tokenJti as string,
      singleUse,
      approvalId,
      authorizationDetails: claims["authorization_details"] ?? undefined,
      reqSha256,
    };
  }
}
