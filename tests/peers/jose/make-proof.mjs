// Makes an RFC 9449 DPoP proof with jose: typ dpop+jwt, ES256, the public key
// in the `jwk` header; `ath` when an access token is given.
// in: {private_jwk, htm, htu, access_token?, nonce?, iat?}   out: {proof}
import { SignJWT, importJWK, base64url } from 'jose';
import { createHash, randomBytes } from 'node:crypto';
import { run } from './io.mjs';

run(async ({ private_jwk, htm, htu, access_token, nonce, iat }) => {
  const key = await importJWK(private_jwk, 'ES256');
  const { kty, crv, x, y } = private_jwk; // the public half only
  const claims = { htm, htu };
  if (access_token !== undefined) {
    claims.ath = base64url.encode(createHash('sha256').update(access_token, 'ascii').digest());
  }
  if (nonce !== undefined) claims.nonce = nonce;
  const jwt = new SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', typ: 'dpop+jwt', jwk: { kty, crv, x, y } })
    .setJti(base64url.encode(randomBytes(16)));
  if (iat !== undefined) jwt.setIssuedAt(iat);
  else jwt.setIssuedAt();
  return { proof: await jwt.sign(key) };
});
