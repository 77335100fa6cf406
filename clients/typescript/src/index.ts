/**
 * credbroker's TypeScript client.
 *
 * - {@link Broker}: derive a token for one tool call over the broker's Unix
 *   socket (`GET /v1/info` tells it the rest);
 * - {@link ToolKey}: the tool's DPoP key and its proofs;
 * - {@link dpopFetch}: a `fetch` that sends the token with a fresh proof on
 *   every request;
 * - the refusals, typed ({@link Refused} and its subclasses);
 * - {@link NonceStore}: DPoP server nonces, kept per origin;
 * - {@link Verifier}: for resource servers, the token and proof checks, with
 *   a {@link SingleUseStore} for single-use tokens;
 * - {@link bind}: a request's digest (`req_sha256`), for tokens bound to one
 *   request ({@link BoundRequest}, {@link RequestError});
 * - `credbroker-client/mcp`: a link refusal as an MCP answer;
 * - {@link traceFromMeta}: an MCP request's `_meta` trace context, passed on
 *   to the derive (`trace`).
 *
 * It speaks the broker's socket API version {@link API_VERSION}.
 */

export { API_VERSION, Broker, Issued } from "./broker.js";
export type { BrokerOptions, DeriveRequest, Info } from "./broker.js";
export type { Leg, UpstreamInfo } from "./relay.js";
export {
  AccessDenied,
  BrokerNotRunning,
  CredbrokerError,
  IncompatibleBroker,
  InvalidRequest,
  Link,
  LinkRequired,
  RateLimited,
  Refused,
  Unavailable,
  UnexpectedAnswer,
} from "./errors.js";
export { KeyFileError, ToolKey } from "./key.js";
export { MAX_TRACESTATE, traceFromMeta, traceHeaders } from "./trace.js";
export type { TraceContext } from "./trace.js";
export type { ProofOptions, PublicJwk } from "./key.js";
export { NotSenderConstrained, dpopFetch } from "./fetch.js";
export type { DPoPFetch, DPoPFetchOptions } from "./fetch.js";
export { NonceStore, originOf, socketOrigin } from "./nonces.js";
export { FETCH_TIMEOUT_MS, MAX_KEYS_DOCUMENT, ReplayCache, Verifier, VerifyError } from "./verify.js";
export { MAX_BOUND_BODY, RequestError, bind } from "./request.js";
export type { Bound, BoundRequest } from "./request.js";
export { MemorySingleUseStore, SingleUseStoreFull } from "./single-use.js";
export type { SingleUseStore } from "./single-use.js";
export type { Jwks, Principal, VerifierOptions, VerifyRequest } from "./verify.js";
