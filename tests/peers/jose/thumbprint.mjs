// The RFC 7638 SHA-256 thumbprint of a JWK, as jose computes it.
// in: {jwk}   out: {jkt}
import { calculateJwkThumbprint } from 'jose';
import { run } from './io.mjs';

run(async ({ jwk }) => ({ jkt: await calculateJwkThumbprint(jwk, 'sha256') }));
