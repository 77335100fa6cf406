/**
 * W3C trace context from an MCP request's `_meta`, passed on to the broker.
 *
 * MCP 2026-07-28 carries the caller's trace context in a request's `_meta`
 * (`traceparent`, `tracestate`). An MCP server that derives a token for a
 * tool call passes it on, so that the derive's span joins the caller's
 * trace when the broker trusts the socket's `traceparent`
 * (`[telemetry] trust_socket_traceparent`; otherwise the broker only links
 * it):
 *
 * ```ts
 * const trace = traceFromMeta(extra._meta);
 * const issued = await broker.derive({ subjectToken, step, tool, resource, key, trace });
 * ```
 *
 * Only a well-formed `traceparent` is passed on, with its `tracestate` when
 * that is printable ASCII (the broker caps it); `baggage` never is.
 */

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;
/** The longest `tracestate` passed on (the broker keeps less). */
export const MAX_TRACESTATE = 8192;

/** A `traceparent` and its `tracestate`, as sent on the derive. */
export interface TraceContext {
  readonly traceparent: string;
  readonly tracestate?: string;
}

/**
 * The trace context in an MCP request's `_meta`; `undefined` when it has
 * no valid `traceparent`.
 */
export function traceFromMeta(meta: unknown): TraceContext | undefined {
  if (meta === null || typeof meta !== "object") return undefined;
  const m = meta as Record<string, unknown>;
  const parent = m["traceparent"];
  if (typeof parent !== "string" || !TRACEPARENT.test(parent)) return undefined;
  const state = m["tracestate"];
  const ok = typeof state === "string" && state.length > 0 && state.length <= MAX_TRACESTATE && /^[\x20-\x7e]*$/.test(state);
  return ok ? { traceparent: parent, tracestate: state } : { traceparent: parent };
}

/** The request headers that carry `t`. */
export function traceHeaders(t: TraceContext | undefined): Record<string, string> {
  if (t === undefined) return {};
  const h: Record<string, string> = { traceparent: t.traceparent };
  if (t.tracestate !== undefined) h["tracestate"] = t.tracestate;
  return h;
}
