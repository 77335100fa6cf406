/**
 * The orchestrator's side: derive a token for one tool call over the
 * broker's Unix socket.
 *
 * {@link Broker} learns what it needs from `GET /v1/info` on the socket
 * (issuer, the `htu` of proofs, the DPoP algorithms, whether nonces are
 * required, the API version, the upstream token endpoints), makes the proof,
 * retries once when the broker asks for a nonce, and turns every refusal into
 * its error (`errors.ts`). For an `exchange` resource it also makes the
 * relayed proof for the upstream's token endpoint (`relay.ts`) and retries
 * once on `upstream_proof_required` with the `htu` and nonce it names.
 */

import { request } from "node:http";
import { inspect } from "node:util";

import { BrokerNotRunning, IncompatibleBroker, UnexpectedAnswer, refusal } from "./errors.js";
import type { ToolKey } from "./key.js";
import { NonceStore, challenge, socketOrigin } from "./nonces.js";
import { type Leg, UpstreamInfo, proofRequired } from "./relay.js";
import { type TraceContext, traceHeaders } from "./trace.js";
import { bind, requestJson } from "./request.js";
import type { BoundRequest } from "./request.js";

/** The socket API version this library speaks (`api_version` of `GET /v1/info`). */
export const API_VERSION = "1";

/** What `GET /v1/info` says about the broker. */
export interface Info {
  readonly apiVersion: string;
  readonly brokerVersion: string;
  readonly issuer: string;
  readonly deriveHtu: string;
  readonly tokenHtu: string;
  readonly dpopAlgs: readonly string[];
  readonly dpopNonceRequired: boolean;
  /** The upstream authorization servers and the `exchange` resources (where the relayed proofs go). */
  readonly upstream: UpstreamInfo;
}

/**
 * A token for one tool call. `token` is kept out of `toString`,
 * `util.inspect` and `JSON.stringify`.
 *
 * `senderConstrained` is false only for a service's provider token (a bearer
 * token, not bound to the tool's key). `expiresIn` is undefined when a
 * provider gave no lifetime.
 */
export class Issued {
  readonly #token: string;
  readonly tokenType: string;
  readonly senderConstrained: boolean;
  readonly expiresIn: number | undefined;
  /** Seconds since the epoch. */
  readonly expiresAt: number | undefined;
  readonly scope: string;
  constructor(
    token: string,
    tokenType: string,
    senderConstrained: boolean,
    expiresIn: number | undefined,
    expiresAt: number | undefined,
    scope: string,
  ) {
    this.#token = token;
    this.tokenType = tokenType;
    this.senderConstrained = senderConstrained;
    this.expiresIn = expiresIn;
    this.expiresAt = expiresAt;
    this.scope = scope;
  }
  /** The token itself, to send. */
  get token(): string {
    return this.#token;
  }
  toString(): string {
    return (
      `Issued(tokenType=${this.tokenType}, senderConstrained=${this.senderConstrained}, ` +
      `expiresIn=${this.expiresIn}, scope=${this.scope})`
    );
  }
  toJSON(): object {
    return {
      tokenType: this.tokenType,
      senderConstrained: this.senderConstrained,
      expiresIn: this.expiresIn,
      expiresAt: this.expiresAt,
      scope: this.scope,
    };
  }
  [inspect.custom](): string {
    return this.toString();
  }
}

/** What a derive asks for. */
export interface DeriveRequest {
  /** The person's own access token. */
  subjectToken: string;
  /** The step the orchestrator's code is in (the model does not choose it). */
  step: string;
  tool: string;
  resource: string;
  scope?: string;
  /** RFC 9396; sent only when given. */
  authorizationDetails?: unknown[];
  /**
   * The whole request the token is for, on a route that binds it
   * (`bind_request`): the token then serves that one request (its
   * `req_sha256`). Sent whole, never only its digest; a body that cannot be
   * bound rejects with {@link RequestError} before anything is sent.
   */
  request?: BoundRequest;
  /** The tool's key: the token is bound to it. */
  key: ToolKey;
  /**
   * An MCP request's trace context ({@link traceFromMeta}), sent as the
   * derive's `traceparent` and `tracestate`.
   */
  trace?: TraceContext;
}

/** Options of a {@link Broker}. */
export interface BrokerOptions {
  /** Milliseconds per request; default 10 000. */
  timeoutMs?: number;
  /** Seconds since the epoch (tests inject it). */
  clock?: () => number;
  /** Where the socket's nonce is kept (default: a store of its own; the socket is an origin of its own). */
  nonces?: NonceStore;
}

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

const MAX_ANSWER = 1024 * 1024;

function header(a: Answer, name: string): string | undefined {
  const v = a.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function infoOf(socket: string, a: Answer): Info {
  if (a.status !== 200) {
    throw new UnexpectedAnswer(
      `GET /v1/info on socket ${socket} answered HTTP ${a.status}; ` + "a broker older than socket API version 1 has no /v1/info",
    );
  }
  let info: Info;
  try {
    const j = JSON.parse(a.body.toString("utf8")) as Record<string, unknown>;
    const algs = j["dpop_signing_alg_values_supported"];
    const need = ["api_version", "broker_version", "issuer", "derive_htu", "token_htu"];
    if (need.some((k) => typeof j[k] !== "string") || !Array.isArray(algs) || typeof j["dpop_nonce_required"] !== "boolean") {
      throw new TypeError("members");
    }
    info = {
      apiVersion: String(j["api_version"]),
      brokerVersion: String(j["broker_version"]),
      issuer: String(j["issuer"]),
      deriveHtu: String(j["derive_htu"]),
      tokenHtu: String(j["token_htu"]),
      dpopAlgs: algs.map(String),
      dpopNonceRequired: j["dpop_nonce_required"] === true,
      upstream: UpstreamInfo.parse(j),
    };
  } catch {
    throw new UnexpectedAnswer(`GET /v1/info on socket ${socket}: not the info document`);
  }
  if (info.apiVersion !== API_VERSION) throw new IncompatibleBroker(socket, info.apiVersion, API_VERSION);
  if (!info.dpopAlgs.includes("ES256")) {
    throw new UnexpectedAnswer(
      `the broker on socket ${socket} accepts DPoP algorithms ${JSON.stringify(info.dpopAlgs)}; ` + "this library signs ES256 only",
    );
  }
  return info;
}

function parseOrUndefined(b: Buffer): unknown {
  try {
    return JSON.parse(b.toString("utf8"));
  } catch {
    return undefined;
  }
}

/** A client of one broker socket. */
export class Broker {
  /** The socket's path. */
  readonly socket: string;
  readonly #timeoutMs: number;
  readonly #clock: () => number;
  #info: Info | undefined;
  readonly #nonces: NonceStore;
  readonly #origin: string;
  /** Upstream authorization servers' nonces learnt from refusals, by name. */
  readonly #upstreamNonces = new Map<string, string>();

  constructor(socket: string, opts: BrokerOptions = {}) {
    this.socket = socket;
    this.#timeoutMs = opts.timeoutMs ?? 10_000;
    this.#clock = opts.clock ?? (() => Date.now() / 1000);
    this.#nonces = opts.nonces ?? new NonceStore();
    this.#origin = socketOrigin(socket);
  }

  #send(method: string, path: string, headers: Record<string, string>, body?: string): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const req = request(
        { socketPath: this.socket, method, path, headers: { host: "credbroker", ...headers }, timeout: this.#timeoutMs },
        (res) => {
          const chunks: Buffer[] = [];
          let size = 0;
          res.on("data", (c: Buffer) => {
            size += c.length;
            if (size > MAX_ANSWER) {
              req.destroy();
              reject(new UnexpectedAnswer(`the broker's answer to ${method} ${path} is larger than 1 MiB`));
              return;
            }
            chunks.push(c);
          });
          res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
          res.on("error", (e: NodeJS.ErrnoException) => reject(new BrokerNotRunning(this.socket, e.code ?? e.message, e.code)));
        },
      );
      req.on("timeout", () => req.destroy(Object.assign(new Error("timed out"), { code: "ETIMEDOUT" })));
      // The OS error only (its code names the cause); the request, which
      // holds the subject token and proof, is never part of it.
      req.on("error", (e: NodeJS.ErrnoException) => {
        const cause =
          e.code === "ENOENT"
            ? "no such file (ENOENT)"
            : e.code === "ECONNREFUSED"
              ? "connection refused (ECONNREFUSED)"
              : (e.code ?? "connection failed");
        reject(new BrokerNotRunning(this.socket, cause, e.code));
      });
      if (body !== undefined) req.end(body);
      else req.end();
    });
  }

  /** The broker's info (fetched once, then kept). */
  async info(): Promise<Info> {
    if (this.#info === undefined) {
      this.#info = infoOf(this.socket, await this.#send("GET", "/v1/info", {}));
    }
    return this.#info;
  }

  /**
   * A token for one call of `tool` on `resource` in `step`, bound to `key`;
   * rejects with a {@link Refused} subclass when refused, with
   * {@link BrokerNotRunning} when nothing answers.
   */
  async derive(r: DeriveRequest): Promise<Issued> {
    const body: Record<string, unknown> = {
      subject_token: r.subjectToken,
      step: r.step,
      tool: r.tool,
      resource: r.resource,
    };
    if (r.scope !== undefined) body["scope"] = r.scope;
    // Only sent when given: a broker without approvals refuses the member
    // (InvalidRequest) rather than ignoring what the caller asked for.
    if (r.authorizationDetails !== undefined) body["authorization_details"] = r.authorizationDetails;
    // Checked here first, so a body that cannot be bound is refused before
    // anything is sent; the broker computes the digest itself.
    if (r.request !== undefined) {
      bind(r.request);
      body["request"] = requestJson(r.request);
    }
    const info = await this.info();
    let info2 = info;
    const legs: Map<string, Leg> = info.upstream.legs(r.resource, this.#upstreamNonces);
    let nonceRetry = true;
    let upstreamRetry = true;
    for (;;) {
      const now = this.#clock();
      const proof = await r.key.proof("POST", info2.deriveHtu, { nonce: this.#nonces.get(this.#origin), now });
      const sent: Record<string, unknown> = { ...body };
      if (legs.size > 0) {
        const proofs: Record<string, string> = {};
        for (const [name, leg] of legs) proofs[name] = await r.key.proof("POST", leg.htu, { nonce: leg.nonce, now });
        sent["upstream_proofs"] = proofs;
      }
      const json = JSON.stringify(sent);
      const a = await this.#send(
        "POST",
        "/v1/derive",
        {
          "content-type": "application/json",
          "content-length": String(Buffer.byteLength(json)),
          dpop: proof,
          ...traceHeaders(r.trace),
        },
        json,
      );
      this.#nonces.update(this.#origin, header(a, "dpop-nonce"));
      if (nonceRetry && challenge({ status: a.status, header: (n) => header(a, n), body: a.body.toString("utf8") }) !== undefined) {
        nonceRetry = false;
        continue;
      }
      const need = upstreamRetry ? proofRequired(a.status, parseOrUndefined(a.body)) : undefined;
      if (need !== undefined) {
        upstreamRetry = false;
        // The policy may have changed: read the info again.
        this.#info = undefined;
        info2 = await this.info();
        const name = info2.upstream.nameFor(need.htu, r.resource);
        if (name !== undefined) {
          if (need.nonce !== undefined) this.#upstreamNonces.set(name, need.nonce);
          legs.set(name, { htu: need.htu, nonce: need.nonce });
          continue;
        }
      }
      return this.#answer(a);
    }
  }

  #answer(a: Answer): Issued {
    const now = this.#clock();
    let body: unknown;
    try {
      body = JSON.parse(a.body.toString("utf8"));
    } catch {
      throw new UnexpectedAnswer(`the broker answered HTTP ${a.status} that is not JSON`);
    }
    if (typeof body !== "object" || body === null || Array.isArray(body)) {
      throw new UnexpectedAnswer(`the broker answered HTTP ${a.status} that is not a JSON object`);
    }
    const b = body as Record<string, unknown>;
    if (a.status === 200) {
      const token = b["access_token"];
      const tokenType = b["token_type"];
      if (typeof token !== "string" || typeof tokenType !== "string") {
        throw new UnexpectedAnswer("the broker's token answer lacks access_token or token_type");
      }
      const e = b["expires_in"];
      const expiresIn = typeof e === "number" && Number.isInteger(e) ? e : undefined;
      return new Issued(
        token,
        tokenType,
        b["sender_constrained"] !== false,
        expiresIn,
        expiresIn === undefined ? undefined : now + expiresIn,
        typeof b["scope"] === "string" ? b["scope"] : "",
      );
    }
    const ra = header(a, "retry-after");
    throw refusal(a.status, b, ra && /^\d+$/.test(ra) ? Number(ra) : undefined, now);
  }

  toString(): string {
    return `Broker(socket=${this.socket})`;
  }

  [inspect.custom](): string {
    return this.toString();
  }
}
