// Verifies a DPoP proof made by credbroker with jose, as an independent
// RFC 9449 section 4.3 checker: jose checks the JWS with the key embedded in
// the `jwk` header (EmbeddedJWK), typ dpop+jwt and ES256; the claim
// comparisons below are the rest of the section's list.
// in: {proof, htm, htu, access_token?, max_age_s?}   out: {header, claims, jkt}
import { jwtVerify, EmbeddedJWK, calculateJwkThumbprint, base64url } from 'jose';
import { createHash } from 'node:crypto';
import { run, PeerCheckFailed } from './io.mjs';

run(async ({ proof, htm, htu, access_token, max_age_s }) => {
  const { payload, protectedHeader } = await jwtVerify(proof, EmbeddedJWK, {
    typ: 'dpop+jwt',
    algorithms: ['ES256'],
    requiredClaims: ['jti', 'htm', 'htu', 'iat'],
    maxTokenAge: max_age_s ?? 60,
  });
  const jwk = protectedHeader.jwk;
  if ('d' in jwk) throw new PeerCheckFailed('private_key_in_jwk', 'the jwk header holds a private key');
  if (payload.htm !== htm) throw new PeerCheckFailed('htm', `htm ${payload.htm} != ${htm}`);
  if (payload.htu !== htu) throw new PeerCheckFailed('htu', `htu ${payload.htu} != ${htu}`);
  if (access_token !== undefined) {
    const ath = base64url.encode(createHash('sha256').update(access_token, 'ascii').digest());
    if (payload.ath !== ath) throw new PeerCheckFailed('ath', 'ath does not match the access token');
  }
  return { header: protectedHeader, claims: payload, jkt: await calculateJwkThumbprint(jwk, 'sha256') };
});
