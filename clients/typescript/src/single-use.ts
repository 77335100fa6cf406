/**
 * Where a verifier remembers the single-use tokens it accepted.
 *
 * A token of an `each_call` approval carries `"single_use": true`: a resource
 * server accepts it for one request. The verifier records the token's
 * (`iss`, `jti`) in a store with one atomic operation, insert if absent,
 * until the token's expiry (plus the clock skew); a key already there means
 * the token was used, and the request is refused (`invalid_token`).
 *
 * A store fails closed: a rejection, or a store full of live entries, refuses
 * the request (503, code `replay_store_unavailable`). It never evicts an
 * entry before its expiry, since that would let the token be used again.
 *
 * {@link MemorySingleUseStore}, the default, keeps them in this process's
 * memory. **It is wrong for a server of several processes** (Node's
 * `cluster`, several replicas): each has its own memory, so each would accept
 * the token once. Give them a {@link SingleUseStore} over a store they share
 * (PostgreSQL's `INSERT ... ON CONFLICT DO NOTHING`, Redis's
 * `SET key 1 NX EXAT expiresAt`).
 */

import { CredbrokerError } from "./errors.js";

/** The store holds as many live entries as it may: the request is refused. */
export class SingleUseStoreFull extends CredbrokerError {}

/** A store a verifier records single-use tokens in. */
export interface SingleUseStore {
  /**
   * Records (`iss`, `jti`) until `expiresAt` (Unix seconds), in one atomic
   * step: `true` if it was absent (the token's first use), `false` if a live
   * entry holds it. `now` is the verifier's clock, for telling live entries
   * from expired ones. Rejects when it cannot answer (the request is then
   * refused).
   */
  insertIfAbsent(iss: string, jti: string, expiresAt: number, now: number): Promise<boolean>;
}

/**
 * Single-use tokens in this process's memory, at most `capacity` live
 * entries. Expired entries are removed when the store is full; if it is
 * still full, the insert rejects with {@link SingleUseStoreFull}. Wrong for
 * several processes (see above).
 */
export class MemorySingleUseStore implements SingleUseStore {
  #until = new Map<string, number>();
  readonly #capacity: number;
  constructor(capacity = 100_000) {
    this.#capacity = Math.max(1, capacity);
  }
  /** Live and expired-but-not-yet-removed entries. */
  get size(): number {
    return this.#until.size;
  }
  insertIfAbsent(iss: string, jti: string, expiresAt: number, now: number): Promise<boolean> {
    // Synchronous inside: nothing runs between the look and the set, so two
    // concurrent verifications of one token cannot both insert.
    const key = JSON.stringify([iss, jti]);
    const held = this.#until.get(key);
    if (held !== undefined && held > now) return Promise.resolve(false);
    if (held === undefined && this.#until.size >= this.#capacity) {
      for (const [k, t] of this.#until) if (t <= now) this.#until.delete(k);
      if (this.#until.size >= this.#capacity) {
        return Promise.reject(new SingleUseStoreFull("the single-use store is full of live tokens"));
      }
    }
    this.#until.set(key, expiresAt);
    return Promise.resolve(true);
  }
}
