// oidc-provider's token endpoint with DPoP, for the side-by-side in
// scripts/bench-socket (docs/PERFORMANCE.md, "Reproducing the figures").
// Not used by the tests.
//
//   node bench-oidc-dpop.mjs
//
// One confidential client ("bench", client_secret_post) may use the
// client_credentials grant; DPoP is on, so a token request with an ES256
// proof gets a DPoP-bound access token (token_type "DPoP"). The proofs are
// made by the caller (examples/loadgen.rs makes a fresh one per request);
// this process only answers, so its CPU time is the provider's alone.
// oidc-provider keeps each proof's jti (its replay check) in its default
// in-memory adapter, as credbroker keeps its own in memory.
//
// Prints one JSON line when listening:
//   {"token_endpoint": ..., "pid": ..., "client_id": ..., "client_secret": ...}
// and runs until it is sent SIGTERM.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const es = await jose.generateKeyPair('ES256', { extractable: true });
const keys = [{ ...(await jose.exportJWK(es.privateKey)), kid: 'es256-1', alg: 'ES256', use: 'sig' }];

const server = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => resolve(s));
});
const issuer = `http://127.0.0.1:${server.address().port}`;
const clientSecret = randomBytes(24).toString('base64url');

const provider = new Provider(issuer, {
  clients: [{
    client_id: 'bench',
    client_secret: clientSecret,
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'client_secret_post',
    id_token_signed_response_alg: 'ES256',
    // Every token this client gets is sender-constrained: a request
    // without a proof is refused rather than answered with a Bearer token.
    dpop_bound_access_tokens: true,
    scope: 'api',
  }],
  jwks: { keys },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    dPoP: { enabled: true },
    // The access token is an ES256-signed JWT (RFC 9068), as credbroker's
    // is: each side verifies one ES256 proof and signs one ES256 token per
    // request. Without a resource server the library would issue an opaque
    // token, with no signature to make.
    resourceIndicators: {
      enabled: true,
      defaultResource: () => 'urn:bench:api',
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'api',
        audience: 'urn:bench:api',
        accessTokenTTL: 600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'ES256' } },
      }),
    },
  },
  scopes: ['api'],
  enabledJWA: { dPoPSigningAlgValues: ['ES256'] },
  ttl: { ClientCredentials: 600 },
  cookies: { keys: [randomBytes(16).toString('hex')] },
});
provider.proxy = false;
server.on('request', provider.callback());

const config = await (await fetch(`${issuer}/.well-known/openid-configuration`)).json();
process.stdout.write(`${JSON.stringify({
  token_endpoint: config.token_endpoint,
  pid: process.pid,
  client_id: 'bench',
  client_secret: clientSecret,
})}\n`);
process.on('SIGTERM', () => server.close(() => process.exit(0)));
