/**
 * The tool's DPoP key (RFC 9449): ES256 on P-256, and the proofs it signs.
 *
 * The private key never leaves a {@link ToolKey} except through
 * {@link ToolKey.save}, which writes it to a new file readable by its owner
 * only. Its `toString`, `util.inspect` and `JSON.stringify` show the RFC 7638
 * thumbprint (the token's `cnf.jkt`), never the key.
 */

import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes } from "node:crypto";
import type { KeyObject } from "node:crypto";
import { closeSync, constants, fstatSync, openSync, readSync, writeSync, fsyncSync } from "node:fs";
import { inspect } from "node:util";
import { SignJWT, calculateJwkThumbprint } from "jose";

import { CredbrokerError } from "./errors.js";

/** A key file could not be used; the message names the file and the cause. */
export class KeyFileError extends CredbrokerError {}

/** The public half of a tool key as a JWK. */
export interface PublicJwk {
  kty: "EC";
  crv: "P-256";
  x: string;
  y: string;
}

/** The proof's `ath`: base64url(SHA-256(token)), no padding. */
export function ath(accessToken: string): string {
  return createHash("sha256").update(accessToken, "ascii").digest("base64url");
}

/**
 * The `htu` of a request to `url`: the URL without query and fragment
 * (RFC 9449 section 4.2).
 */
export function htuOf(url: string | URL): string {
  let u: URL;
  try {
    u = new URL(String(url));
  } catch {
    throw new TypeError("a DPoP proof needs an absolute URL (scheme and host)");
  }
  if (!u.host) throw new TypeError("a DPoP proof needs an absolute URL (scheme and host)");
  u.search = "";
  u.hash = "";
  return u.href;
}

/** What {@link ToolKey.proof} may add to a proof. */
export interface ProofOptions {
  /** The access token the request carries: adds `ath`. */
  accessToken?: string;
  /** The server's nonce (`DPoP-Nonce`). */
  nonce?: string;
  /** Seconds since the epoch (tests inject it); default now. */
  now?: number;
}

const MAX_KEY_FILE = 64 * 1024;

function osCause(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  return err.code ? `${err.code}` : "unknown error";
}

/** An ES256 key that signs a tool's DPoP proofs. */
export class ToolKey {
  readonly #key: KeyObject;
  readonly #public: PublicJwk;
  readonly #thumbprint: string;

  private constructor(key: KeyObject, publicJwk: PublicJwk, thumbprint: string) {
    this.#key = key;
    this.#public = publicJwk;
    this.#thumbprint = thumbprint;
  }

  static async #of(key: KeyObject): Promise<ToolKey> {
    if (key.type !== "private" || key.asymmetricKeyType !== "ec" || key.asymmetricKeyDetails?.namedCurve !== "prime256v1") {
      throw new TypeError("a tool key is a private EC P-256 key");
    }
    const jwk = createPublicKey(key).export({ format: "jwk" });
    const pub: PublicJwk = { kty: "EC", crv: "P-256", x: String(jwk.x), y: String(jwk.y) };
    return new ToolKey(key, pub, await calculateJwkThumbprint(pub, "sha256"));
  }

  /** A fresh key. */
  static async generate(): Promise<ToolKey> {
    const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
    return ToolKey.#of(privateKey);
  }

  /**
   * Reads a PEM (PKCS #8) key file, the format `credbroker derive --dpop-key`
   * writes. A file that its group or others may read or write is refused:
   * the key might have been copied.
   */
  static async load(path: string): Promise<ToolKey> {
    let fd: number;
    try {
      fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW);
    } catch (e) {
      throw new KeyFileError(`tool key ${path}: cannot open it: ${osCause(e)}`);
    }
    let pem: string;
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) throw new KeyFileError(`tool key ${path}: not a regular file`);
      if ((st.mode & 0o077) !== 0) {
        const mode = (st.mode & 0o7777).toString(8).padStart(4, "0");
        throw new KeyFileError(
          `tool key ${path}: mode ${mode} lets its group or others read it; it must be 0600 ` +
            "(make a new key: this one may have been copied)",
        );
      }
      const buf = Buffer.alloc(MAX_KEY_FILE);
      let n = 0;
      for (;;) {
        const got = readSync(fd, buf, n, buf.length - n, null);
        if (got === 0 || n + got >= buf.length) {
          n += got;
          break;
        }
        n += got;
      }
      pem = buf.subarray(0, n).toString("utf8");
      buf.fill(0);
    } finally {
      closeSync(fd);
    }
    let key: KeyObject;
    try {
      key = createPrivateKey(pem);
    } catch {
      // The cause would quote the file.
      throw new KeyFileError(`tool key ${path}: not a PEM EC private key`);
    }
    try {
      return await ToolKey.#of(key);
    } catch {
      throw new KeyFileError(`tool key ${path}: not a P-256 private key`);
    }
  }

  /**
   * Writes the key to a new file, created with mode 0600 (`O_EXCL`, never
   * widened or chmod-ed afterwards); an existing file is not replaced.
   */
  save(path: string): void {
    const pem = String(this.#key.export({ type: "pkcs8", format: "pem" }));
    let fd: number;
    try {
      fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST") {
        throw new KeyFileError(`tool key ${path}: the file exists; not replacing it`);
      }
      throw new KeyFileError(`tool key ${path}: cannot create it: ${osCause(e)}`);
    }
    try {
      writeSync(fd, pem);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }

  /** The RFC 7638 SHA-256 thumbprint: the `cnf.jkt` of tokens bound to this key. */
  get thumbprint(): string {
    return this.#thumbprint;
  }

  /** The public key as a JWK (`kty`, `crv`, `x`, `y`). */
  get publicJwk(): PublicJwk {
    return { ...this.#public };
  }

  /**
   * A DPoP proof for one request: `htm` is `method`, `htu` is `url` without
   * query or fragment, a fresh `jti`; `ath` when the request carries an
   * access token, `nonce` when the server gave one.
   */
  async proof(method: string, url: string | URL, opts: ProofOptions = {}): Promise<string> {
    const claims: Record<string, unknown> = {
      jti: randomBytes(16).toString("base64url"),
      htm: method,
      htu: htuOf(url),
      iat: Math.floor(opts.now ?? Date.now() / 1000),
    };
    if (opts.accessToken !== undefined) claims["ath"] = ath(opts.accessToken);
    if (opts.nonce !== undefined) claims["nonce"] = opts.nonce;
    return new SignJWT(claims).setProtectedHeader({ typ: "dpop+jwt", alg: "ES256", jwk: { ...this.#public } }).sign(this.#key);
  }

  toString(): string {
    return `ToolKey(thumbprint=${this.#thumbprint})`;
  }

  toJSON(): object {
    return { thumbprint: this.#thumbprint };
  }

  [inspect.custom](): string {
    return this.toString();
  }
}
