/**
 * The relayed proofs of a derive for an `exchange` resource (the broker's
 * docs/UPSTREAM.md): the tool's DPoP proof for each upstream authorization
 * server's token endpoint, sent with the derive as `upstream_proofs`, since
 * the broker never holds the tool's key.
 *
 * Where they go comes from `GET /v1/info` (`upstreams.<name>.token_endpoint`
 * and `.dpop_nonce`, `upstream_resources`): one leg per upstream named for
 * the resource and, for an `id_jag` upstream (identity chaining), a second
 * leg at its `resource_upstream`; a refusal with reason
 * `upstream_proof_required` names the `htu` (and the server's nonce) to sign
 * instead, and the client retries once with it.
 */

/** One relayed proof to make: `htu` byte for byte, with `nonce`. */
export interface Leg {
  readonly htu: string;
  readonly nonce: string | undefined;
}

/** What `GET /v1/info` says about upstreams. */
export class UpstreamInfo {
  /** By upstream name: its token endpoint once known, its last DPoP nonce. */
  readonly upstreams: ReadonlyMap<string, { tokenEndpoint?: string; nonce?: string; resourceUpstream?: string }>;
  /** By `exchange` resource (canonical URI): its upstreams' names. */
  readonly resources: ReadonlyMap<string, readonly string[]>;

  constructor(
    upstreams = new Map<string, { tokenEndpoint?: string; nonce?: string; resourceUpstream?: string }>(),
    resources = new Map<string, string[]>(),
  ) {
    this.upstreams = upstreams;
    this.resources = resources;
  }

  /** Reads the members; anything missing or of another shape is "no upstreams" (an older broker). */
  static parse(info: Record<string, unknown>): UpstreamInfo {
    const ups = new Map<string, { tokenEndpoint?: string; nonce?: string; resourceUpstream?: string }>();
    const res = new Map<string, string[]>();
    const rawUps = info["upstreams"];
    if (typeof rawUps === "object" && rawUps !== null && !Array.isArray(rawUps)) {
      for (const [name, u] of Object.entries(rawUps as Record<string, unknown>)) {
        if (typeof u !== "object" || u === null) continue;
        const o = u as Record<string, unknown>;
        const te = o["token_endpoint"];
        const n = o["dpop_nonce"];
        const ru = o["resource_upstream"];
        const entry: { tokenEndpoint?: string; nonce?: string; resourceUpstream?: string } = {};
        if (typeof te === "string") entry.tokenEndpoint = te;
        if (typeof n === "string") entry.nonce = n;
        if (o["grant"] === "id_jag" && typeof ru === "string") entry.resourceUpstream = ru;
        ups.set(name, entry);
      }
    }
    const rawRes = info["upstream_resources"];
    if (typeof rawRes === "object" && rawRes !== null && !Array.isArray(rawRes)) {
      for (const [uri, names] of Object.entries(rawRes as Record<string, unknown>)) {
        if (typeof names === "string") res.set(uri, [names]);
        else if (Array.isArray(names))
          res.set(
            uri,
            names.filter((n): n is string => typeof n === "string"),
          );
      }
    }
    return new UpstreamInfo(ups, res);
  }

  /**
   * The legs of a derive for `resource` (one per upstream named for it and,
   * for an `id_jag` one, its `resource_upstream` too: leg 2), each whose
   * token endpoint is known, with the latest nonce known for it.
   */
  legs(resource: string, nonces: ReadonlyMap<string, string>): Map<string, Leg> {
    // The info lists canonical URIs; a trailing slash is the difference
    // callers most often make.
    const names = this.resources.get(resource) ?? this.resources.get(resource.endsWith("/") ? resource.slice(0, -1) : `${resource}/`) ?? [];
    const out = new Map<string, Leg>();
    for (const first of names) {
      const second = this.upstreams.get(first)?.resourceUpstream;
      for (const name of second === undefined ? [first] : [first, second]) {
        const u = this.upstreams.get(name);
        if (u?.tokenEndpoint !== undefined) out.set(name, { htu: u.tokenEndpoint, nonce: nonces.get(name) ?? u.nonce });
      }
    }
    return out;
  }

  /** The upstream whose token endpoint is `htu` (what a refusal names), else the first the info names for `resource`. */
  nameFor(htu: string, resource: string): string | undefined {
    for (const [name, u] of this.upstreams) if (u.tokenEndpoint === htu) return name;
    return this.resources.get(resource)?.[0];
  }
}

/** The `htu` and nonce an `upstream_proof_required` refusal names. */
export function proofRequired(status: number, body: unknown): { htu: string; nonce: string | undefined } | undefined {
  if (status !== 400 || typeof body !== "object" || body === null) return undefined;
  const b = body as Record<string, unknown>;
  if (b["reason"] !== "upstream_proof_required" || typeof b["upstream_htu"] !== "string") return undefined;
  const n = b["upstream_nonce"];
  return { htu: b["upstream_htu"], nonce: typeof n === "string" ? n : undefined };
}
