/**
 * A link refusal as the answer of an MCP server (`credbroker-client/mcp`).
 *
 * In a tool handler, when a derive rejects with {@link LinkRequired}:
 *
 * - protocol 2025-11-25 (`@modelcontextprotocol/sdk`): throw
 *   {@link urlElicitationError}, the `-32042` URL elicitation error
 *   (`elicitationId` is the link's id); the client opens the link and calls
 *   the tool again by itself;
 * - protocol 2026-07-28 (`@modelcontextprotocol/server`): return
 *   {@link inputRequired}, an `input_required` result with one URL
 *   elicitation and a `requestState` sealed here with AES-256-GCM (`jose`
 *   JWE, `dir`), bound to this server, the person, the call and a lifetime,
 *   since the SDK does not seal it; on the retry, {@link RequestStateSealer.open}
 *   checks all four before the handler derives again.
 *
 * Either way `accept` only means the person agreed to open the page: the
 * retry derives again, and the broker's next answer decides. The person is
 * whoever the MCP client's verified access token says, never a tool
 * argument. The link is passed on unchanged: it is not pre-authenticated,
 * and the page behind it checks who opens it.
 */

import { createHash, randomBytes } from "node:crypto";
import { inspect } from "node:util";
import { CompactEncrypt, compactDecrypt } from "jose";

import { CredbrokerError } from "./errors.js";
import type { LinkRequired } from "./errors.js";

/** The first protocol version that answers with `input_required`. */
export const INPUT_REQUIRED_VERSION = "2026-07-28";

/** The person's sentence and the link, as plain text (both versions carry it). */
export function linkText(err: LinkRequired): string {
  return `${err.link.message} ${err.link.uri}`;
}

/** One URL elicitation of the `-32042` error (both SDKs' shape). */
export interface UrlElicitation {
  mode: "url";
  elicitationId: string;
  url: string;
  message: string;
}

/**
 * The constructor of an SDK's `UrlElicitationRequiredError`: each SDK turns
 * only its own class into the `-32042` error, and any other thrown error
 * into a tool result with `isError` (the link would reach the client as
 * text, not as an elicitation). `@modelcontextprotocol/sdk`'s is the
 * default; a server on `@modelcontextprotocol/server` serving 2025-era
 * clients passes that package's `UrlElicitationRequiredError`.
 */
export type UrlElicitationErrorClass<E extends Error = Error> = new (elicitations: UrlElicitation[], message?: string) => E;

/**
 * `@modelcontextprotocol/sdk`'s `UrlElicitationRequiredError`, imported on
 * first use: the SDK is an optional peer, and a server built on
 * `@modelcontextprotocol/server` alone (which passes its own class) must be
 * able to load this module without it.
 */
async function sdkErrorClass(): Promise<UrlElicitationErrorClass> {
  try {
    const sdk = await import("@modelcontextprotocol/sdk/types.js");
    return sdk.UrlElicitationRequiredError;
  } catch (e) {
    throw new CredbrokerError(
      `@modelcontextprotocol/sdk could not be loaded (${e instanceof Error ? e.message : String(e)}): install it (an optional peer dependency), or pass your SDK's UrlElicitationRequiredError as errorClass`,
    );
  }
}

/**
 * The `-32042` error for protocol 2025-11-25, to throw from a tool handler
 * (`throw await urlElicitationError(e)`), as an instance of `errorClass`
 * (default: `@modelcontextprotocol/sdk`'s, imported when first needed; a
 * `CredbrokerError` if that package is not installed).
 */
export async function urlElicitationError(err: LinkRequired): Promise<Error>;
export async function urlElicitationError<E extends Error>(err: LinkRequired, errorClass: UrlElicitationErrorClass<E>): Promise<E>;
export async function urlElicitationError(err: LinkRequired, errorClass?: UrlElicitationErrorClass): Promise<Error> {
  const cls = errorClass ?? (await sdkErrorClass());
  const text = linkText(err);
  return new cls([{ mode: "url", elicitationId: err.link.id, url: err.link.uri, message: text }], text);
}

/** The person, as the MCP client's verified access token names them. */
export interface Person {
  iss: string;
  sub: string;
  /** The OAuth client the access token was issued to. */
  client?: string;
}

/** The call being answered: the tool and its arguments. */
export interface Call {
  name: string;
  arguments?: unknown;
}

/** What a retry's `requestState` opened to. */
export interface OpenedState {
  /** The link's id (`connect_id`) the state was sealed for. */
  link: string;
  iat: number;
  exp: number;
}

/**
 * A retry's `requestState` did not open: tampered, expired, sealed for
 * another server, person or call. The message is the same whatever the
 * reason (answer {@link REQUEST_STATE_REJECTED}).
 */
export class RequestStateRejected extends CredbrokerError {
  constructor() {
    super("Invalid or expired requestState");
  }
}

/** The JSON-RPC error for a rejected `requestState` (proto/mcp/2026-07-28-request-state-rejected.json). */
export const REQUEST_STATE_REJECTED = {
  code: -32602,
  message: "Invalid or expired requestState",
  data: { reason: "invalid_request_state" },
} as const;

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (typeof v === "object" && v !== null) {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .sort()
      .filter((k) => o[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(v) ?? "null";
}

/** The call's digest: SHA-256 of its canonical JSON (keys sorted). */
function callDigest(call: Call): string {
  return createHash("sha256")
    .update(canonical({ name: call.name, arguments: call.arguments ?? {} }))
    .digest("base64url");
}

/** Options of a {@link RequestStateSealer}. */
export interface SealerOptions {
  /** This MCP server's own URL (the audience the state is sealed for). */
  server: string;
  /** Seconds a sealed state stays valid; default 600. */
  lifetime?: number;
  /** Seconds since the epoch (tests inject it). */
  clock?: () => number;
}

/**
 * Seals and opens `requestState` with a 32-byte secret key (AES-256-GCM
 * through `jose`'s compact JWE, `alg` `dir`): readable by nobody but this
 * server, and useless once altered, expired, or echoed for another server,
 * person or call. Keep one key per deployment (every instance that may see a
 * retry needs it); a new key rejects the states of the old one.
 */
export class RequestStateSealer {
  readonly #key: Uint8Array;
  readonly server: string;
  readonly lifetime: number;
  readonly #clock: () => number;

  constructor(key: Uint8Array, opts: SealerOptions) {
    if (key.length !== 32) throw new TypeError("a requestState key is 32 bytes (AES-256-GCM)");
    this.#key = Uint8Array.from(key);
    this.server = opts.server;
    this.lifetime = opts.lifetime ?? 600;
    this.#clock = opts.clock ?? (() => Date.now() / 1000);
  }

  /** A fresh random key, for tests and single-instance servers. */
  static generateKey(): Uint8Array {
    return new Uint8Array(randomBytes(32));
  }

  /** Seals the link's id for this server, `person` and `call`. */
  async seal(link: string, person: Person, call: Call): Promise<string> {
    const iat = Math.floor(this.#clock());
    const body = {
      v: 1,
      aud: this.server,
      iss: person.iss,
      sub: person.sub,
      client: person.client ?? null,
      call: callDigest(call),
      link,
      iat,
      exp: iat + this.lifetime,
    };
    return new CompactEncrypt(new TextEncoder().encode(JSON.stringify(body)))
      .setProtectedHeader({ alg: "dir", enc: "A256GCM", typ: "credbroker-mcp-state" })
      .encrypt(this.#key);
  }

  /**
   * Opens a retry's `requestState`: it must have been sealed by this key, for
   * this server, `person` and `call`, and not have expired; otherwise
   * {@link RequestStateRejected}, whatever the reason.
   */
  async open(state: string, person: Person, call: Call): Promise<OpenedState> {
    let body: Record<string, unknown>;
    try {
      const { plaintext, protectedHeader } = await compactDecrypt(state, this.#key, {
        keyManagementAlgorithms: ["dir"],
        contentEncryptionAlgorithms: ["A256GCM"],
      });
      if (protectedHeader.typ !== "credbroker-mcp-state") throw new RequestStateRejected();
      body = JSON.parse(new TextDecoder().decode(plaintext)) as Record<string, unknown>;
    } catch {
      throw new RequestStateRejected();
    }
    const now = this.#clock();
    const ok =
      body["v"] === 1 &&
      body["aud"] === this.server &&
      body["iss"] === person.iss &&
      body["sub"] === person.sub &&
      body["client"] === (person.client ?? null) &&
      body["call"] === callDigest(call) &&
      typeof body["link"] === "string" &&
      typeof body["iat"] === "number" &&
      typeof body["exp"] === "number" &&
      now < body["exp"] &&
      body["iat"] <= now + 5;
    if (!ok) throw new RequestStateRejected();
    return { link: body["link"] as string, iat: body["iat"] as number, exp: body["exp"] as number };
  }

  toString(): string {
    return `RequestStateSealer(server=${this.server}, key=[REDACTED])`;
  }
  toJSON(): object {
    return { server: this.server, lifetime: this.lifetime };
  }
  [inspect.custom](): string {
    return this.toString();
  }
}

/** One URL elicitation inside an `input_required` result. */
export interface UrlInputRequest {
  method: "elicitation/create";
  params: { mode: "url"; url: string; message: string };
}

/** The 2026-07-28 `input_required` result (the shape of `@modelcontextprotocol/server`'s `InputRequiredResult`). */
export interface InputRequiredResult {
  resultType: "input_required";
  inputRequests: Record<string, UrlInputRequest>;
  requestState: string;
  [key: string]: unknown;
}

/**
 * The 2026-07-28 answer: `input_required` with one URL elicitation under the
 * key `name` (default the link's reason, e.g. `connect`) and the link's id
 * sealed as `requestState`.
 */
export async function inputRequired(
  err: LinkRequired,
  sealer: RequestStateSealer,
  person: Person,
  call: Call,
  name?: string,
): Promise<InputRequiredResult> {
  const text = linkText(err);
  return {
    resultType: "input_required",
    inputRequests: {
      [name ?? err.reason ?? "link"]: {
        method: "elicitation/create",
        params: { mode: "url", url: err.link.uri, message: text },
      },
    },
    requestState: await sealer.seal(err.link.id, person, call),
  };
}

/**
 * The answer to a tools/call whose derive needs a link, for the negotiated
 * `protocolVersion`: throws the `-32042` error for 2025-11-25 (and when the
 * version is unknown: the older answer, which every URL-capable client
 * reads); returns the `input_required` result for 2026-07-28 and later.
 * On `@modelcontextprotocol/server`, pass its `UrlElicitationRequiredError`
 * as `seal.errorClass`, or its legacy fallback answers the 2025-era
 * client with an `isError` text result instead of the `-32042` error.
 */
export async function linkAnswer(
  err: LinkRequired,
  protocolVersion: string | undefined,
  seal: { sealer: RequestStateSealer; person: Person; call: Call; name?: string; errorClass?: UrlElicitationErrorClass },
): Promise<InputRequiredResult> {
  // Protocol versions are ISO dates: string order is date order.
  if (protocolVersion === undefined || protocolVersion < INPUT_REQUIRED_VERSION) {
    throw seal.errorClass ? await urlElicitationError(err, seal.errorClass) : await urlElicitationError(err);
  }
  return inputRequired(err, seal.sealer, seal.person, seal.call, seal.name);
}
