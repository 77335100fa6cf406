/**
 * What a derive can end in besides a token, as errors.
 *
 * A refusal from the broker is a {@link Refused} subclass carrying the
 * members the broker sent; a broker that cannot be reached is
 * {@link BrokerNotRunning}, apart from them (nothing was decided). No
 * error's message, `toString`, `util.inspect` or `JSON.stringify` carries a
 * token, a proof, a key or a link's URL: they end up in logs.
 */

import { inspect } from "node:util";

/** The base of every error this library throws. */
export class CredbrokerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** Nothing answers on the socket (missing, refused, or not a socket). */
export class BrokerNotRunning extends CredbrokerError {
  readonly socket: string;
  readonly code: string | undefined;
  constructor(socket: string, cause: string, code?: string) {
    super(`no credbroker answers on socket ${socket}: ${cause}`);
    this.socket = socket;
    this.code = code;
  }
}

/** The broker speaks a socket API version this library does not. */
export class IncompatibleBroker extends CredbrokerError {
  readonly socket: string;
  readonly apiVersion: string;
  constructor(socket: string, theirs: string, ours: string) {
    super(
      `the credbroker on socket ${socket} speaks socket API version "${theirs}"; ` +
        `this library speaks version "${ours}": use a library release for API "${theirs}"`,
    );
    this.socket = socket;
    this.apiVersion = theirs;
  }
}

/** The broker answered something this library cannot read. */
export class UnexpectedAnswer extends CredbrokerError {}

/** The broker refused the derive; `error` is the OAuth error code. */
export class Refused extends CredbrokerError {
  readonly status: number;
  readonly error: string;
  readonly description: string | undefined;
  readonly reason: string | undefined;
  constructor(status: number, error: string, description?: string, reason?: string) {
    let text = `credbroker refused the derive (HTTP ${status}, ${error}`;
    text += reason ? `, reason ${reason})` : ")";
    if (description) text += `: ${description}`;
    super(text);
    this.status = status;
    this.error = error;
    this.description = description;
    this.reason = reason;
  }
}

/**
 * The policy denies it (`reason`: `tool_not_allowed`, `step_not_allowed`,
 * `scope_not_allowed`, `resource_mismatch`, `frozen`).
 */
export class AccessDenied extends Refused {}

/**
 * The request was malformed: body, subject token, proof or resource
 * (`error` says which: `invalid_request`, `invalid_dpop_proof`,
 * `invalid_target`).
 */
export class InvalidRequest extends Refused {}

/** Too many derives; try again after `retryAfter` seconds. */
export class RateLimited extends Refused {
  readonly retryAfter: number | undefined;
  constructor(status: number, error: string, description: string | undefined, retryAfter: number | undefined) {
    super(status, error, description);
    this.retryAfter = retryAfter;
  }
}

/**
 * The broker could not decide now (a provider did not answer, the replay
 * cache is full, an internal error); nothing was issued.
 */
export class Unavailable extends Refused {
  readonly retryAfter: number | undefined;
  constructor(status: number, error: string, description: string | undefined, reason: string | undefined, retryAfter: number | undefined) {
    super(status, error, description, reason);
    this.retryAfter = retryAfter;
  }
}

/**
 * A link the person must open before the derive can succeed. `uri` is passed
 * on to the person unchanged (the page behind it checks who opens it); it is
 * kept out of `toString`, `util.inspect` and `JSON.stringify` all the same,
 * as it names a pending grant.
 */
export class Link {
  readonly #uri: string;
  readonly id: string;
  readonly expiresIn: number;
  /** Seconds since the epoch. */
  readonly expiresAt: number;
  readonly message: string;
  constructor(uri: string, id: string, expiresIn: number, expiresAt: number, message: string) {
    this.#uri = uri;
    this.id = id;
    this.expiresIn = expiresIn;
    this.expiresAt = expiresAt;
    this.message = message;
  }
  /** The link to give the person. */
  get uri(): string {
    return this.#uri;
  }
  toString(): string {
    return `Link(id=${this.id}, expiresIn=${this.expiresIn})`;
  }
  toJSON(): object {
    return { id: this.id, expiresIn: this.expiresIn, expiresAt: this.expiresAt, message: this.message };
  }
  [inspect.custom](): string {
    return this.toString();
  }
}

/**
 * The person must open a link first, then the derive is tried again.
 * `reason` is `connect` (no account connected yet), `allow` (a new agent or
 * scope to allow), `reconnect` (the connection no longer works) or, with
 * brokers that have approvals, `approval`.
 */
export class LinkRequired extends Refused {
  readonly link: Link;
  declare readonly reason: string;
  constructor(status: number, error: string, rawReason: string, link: Link) {
    super(status, error, link.message, rawReason.replace(/_required$/, ""));
    this.link = link;
  }
}

function str(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}

/** Maps one refusal answer to its error, in one place (as the Python client does). */
export function refusal(status: number, body: Record<string, unknown>, retryAfter: number | undefined, now: number): Refused {
  const error = body["error"];
  if (typeof error !== "string") {
    throw new UnexpectedAnswer(`the broker answered HTTP ${status} without an OAuth error code`);
  }
  const description = str(body["error_description"]);
  const reason = str(body["reason"]);
  if (error === "invalid_grant" && reason !== undefined && reason.endsWith("_required")) {
    const uri = str(body["connect_uri"]);
    const id = str(body["connect_id"]);
    const expiresIn = body["connect_expires_in"];
    if (uri === undefined || id === undefined || typeof expiresIn !== "number" || !Number.isInteger(expiresIn)) {
      throw new UnexpectedAnswer(`the broker's ${reason} refusal lacks connect_uri, connect_id or connect_expires_in`);
    }
    const message = str(body["connect_message"]) || "Open this link to continue.";
    return new LinkRequired(status, error, reason, new Link(uri, id, expiresIn, now + expiresIn, message));
  }
  if (status === 403 || error === "access_denied") return new AccessDenied(status, error, description, reason);
  if (status === 429) return new RateLimited(status, error, description, retryAfter);
  if (status >= 500) return new Unavailable(status, error, description, reason, retryAfter);
  return new InvalidRequest(status, error, description, reason);
}
