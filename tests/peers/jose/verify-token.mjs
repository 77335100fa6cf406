// Verifies a credbroker access token with jose's jwtVerify, the way a
// resource server written in JavaScript would: keys from the issuer's JWKS
// (found through its RFC 8414 metadata unless `jwks_uri` or `jwks` is given),
// the issuer, the audience, typ at+jwt (RFC 9068) and ES256 only.
// in: {token, issuer, audience, jwks_uri?, jwks?, required_claims?}   out: {header, claims, jwks_uri}
// (`required_claims` replaces the list of a credbroker token, e.g. for the
// quick start's demo service, whose tokens are not DPoP-bound.)
import { jwtVerify, createRemoteJWKSet, createLocalJWKSet } from 'jose';
import { run, PeerCheckFailed } from './io.mjs';

run(async ({ token, issuer, audience, jwks_uri, jwks, required_claims }) => {
  let keys;
  if (jwks !== undefined) {
    keys = createLocalJWKSet(jwks);
  } else {
    if (jwks_uri === undefined) {
      const res = await fetch(new URL('/.well-known/oauth-authorization-server', issuer));
      if (!res.ok) throw new PeerCheckFailed('metadata', `metadata: HTTP ${res.status}`);
      const meta = await res.json();
      if (meta.issuer !== issuer) throw new PeerCheckFailed('metadata', 'metadata issuer mismatch');
      jwks_uri = meta.jwks_uri;
    }
    keys = createRemoteJWKSet(new URL(jwks_uri));
  }
  const { payload, protectedHeader } = await jwtVerify(token, keys, {
    issuer,
    audience,
    typ: 'at+jwt',
    algorithms: ['ES256'],
    requiredClaims: required_claims ?? ['iss', 'sub', 'aud', 'exp', 'iat', 'jti', 'cnf', 'act', 'client_id'],
  });
  return { header: protectedHeader, claims: payload, jwks_uri: jwks_uri ?? null };
});
