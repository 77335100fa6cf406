// A resource's own authorization server for the identity-chaining tests:
// panva's oidc-provider (discovery, client authentication, error answers)
// with the RFC 7523 jwt-bearer grant added through registerGrantType, which
// redeems ID-JAGs from the organisation's IdP (tests/peers/org-as.mjs).
// A grant added that way gets no DPoP check of its own, so the handler
// validates the DPoP proof with jose (typ, alg, embedded jwk, signature,
// htm, htu, iat, jti once, no ath), requires the ID-JAG (typ
// oauth-id-jag+jwt, verified with jose against the IdP's JWKS, iss the IdP,
// aud this issuer, client_id the authenticated client) to be bound to that
// same key (cnf.jkt), and binds the token it issues to it. Tokens are RFC
// 9068 JWTs signed with this server's current ES256 key; its JWKS (served
// here, not by oidc-provider) publishes the current key only, so after
// "rotate" the previous key is gone.
//
//   node resource-as.mjs CONFIG.json
//
// CONFIG: { "client_id": "...", "client_secret": "...", "idp_issuer": "...", "idp_jwks_uri": "...",
//           "resources": { "<uri>": { "aud": "..." | [...], "scope": "a b" } } }
// Prints {"issuer", "jwks_uri", "token_endpoint"} when listening, then reads
// JSON commands on stdin, one per line, answering one JSON line each:
//   {"cmd":"mode","mode":"ok"} -> {"ok":true}; ok, old_key (sign with the key before the last rotation),
//                                 or nonce (every proof must carry this server's current DPoP nonce:
//                                 else use_dpop_nonce with it in DPoP-Nonce, RFC 9449 section 8)
//   {"cmd":"new_nonce"}        -> {"nonce": the new current nonce}; the old one is refused from now on
//   {"cmd":"rotate"}           -> {"kid": the new key's kid}
//   {"cmd":"count"}            -> {"redemptions": n} token requests received so far
//   {"cmd":"last"}             -> the form of the last token request (assertion left out)
// Exits when stdin closes.
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import Provider, { errors } from 'oidc-provider';
import * as jose from 'jose';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const JWT_BEARER = 'urn:ietf:params:oauth:grant-type:jwt-bearer';

async function newKey(n) {
  const pair = await jose.generateKeyPair('ES256', { extractable: true });
  const kid = `rs-es256-${n}`;
  return {
    kid,
    pair,
    priv: { ...(await jose.exportJWK(pair.privateKey)), kid, alg: 'ES256', use: 'sig' },
    pub: { ...(await jose.exportJWK(pair.publicKey)), kid, alg: 'ES256', use: 'sig' },
  };
}
let generation = 1;
let current = await newKey(generation);
let previous = null;

const server = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => resolve(s));
});
const issuer = `http://127.0.0.1:${server.address().port}`;
const tokenEndpoint = `${issuer}/token`;
const idpKeys = jose.createRemoteJWKSet(new URL(cfg.idp_jwks_uri));

const provider = new Provider(issuer, {
  clients: [{
    client_id: cfg.client_id, client_secret: cfg.client_secret,
    grant_types: [JWT_BEARER], response_types: [], redirect_uris: [],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'ES256',
  }],
  jwks: { keys: [current.priv] },
  findAccount: async (_ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  features: { devInteractions: { enabled: false } },
  cookies: { keys: [randomBytes(16).toString('hex')] },
});
provider.proxy = false;

let mode = 'ok';
// With mode "nonce": every proof must carry this nonce.
let asNonce = randomBytes(12).toString('base64url');
let redemptions = 0;
let last = null;
const seenJti = new Set();

async function checkProof(ctx) {
  const proof = ctx.get('DPoP');
  if (!proof) throw new errors.InvalidDpopProof('DPoP proof missing');
  let v;
  try {
    v = await jose.jwtVerify(proof, jose.EmbeddedJWK, { typ: 'dpop+jwt', algorithms: ['ES256'] });
  } catch (e) {
    throw new errors.InvalidDpopProof(`proof does not verify: ${e.code}`);
  }
  const p = v.payload;
  const now = Math.floor(Date.now() / 1000);
  if (p.htm !== 'POST' || p.htu !== tokenEndpoint) throw new errors.InvalidDpopProof('htm/htu');
  if (typeof p.iat !== 'number' || Math.abs(p.iat - now) > 60) throw new errors.InvalidDpopProof('iat');
  if (p.ath !== undefined) throw new errors.InvalidDpopProof('ath');
  if (typeof p.jti !== 'string' || seenJti.has(p.jti)) throw new errors.InvalidDpopProof('jti');
  seenJti.add(p.jti);
  return { jkt: await jose.calculateJwkThumbprint(v.protectedHeader.jwk), nonce: p.nonce };
}

async function jwtBearer(ctx) {
  const { params } = ctx.oidc;
  let jag;
  try {
    ({ payload: jag } = await jose.jwtVerify(params.assertion, idpKeys, {
      issuer: cfg.idp_issuer, audience: issuer, typ: 'oauth-id-jag+jwt', algorithms: ['ES256'],
    }));
  } catch {
    throw new errors.InvalidGrant('the ID-JAG does not verify');
  }
  if (jag.client_id !== ctx.oidc.client.clientId) throw new errors.InvalidGrant('the ID-JAG is for another client');
  const { jkt, nonce } = await checkProof(ctx);
  if (mode === 'nonce' && nonce !== asNonce) {
    ctx.status = 400;
    ctx.set('DPoP-Nonce', asNonce);
    ctx.set('cache-control', 'no-store');
    ctx.body = { error: 'use_dpop_nonce', error_description: 'a DPoP nonce is required' };
    return;
  }
  if (jag.cnf?.jkt !== jkt) throw new errors.InvalidGrant('the ID-JAG is not bound to the proof key');
  const r = cfg.resources[jag.resource];
  if (!r) throw new errors.InvalidTarget();
  const allowed = new Set(r.scope.split(' '));
  const asked = (params.scope ?? jag.scope ?? '').split(' ').filter(Boolean);
  if (asked.some((s) => !allowed.has(s))) throw new errors.InvalidScope('scope exceeds', params.scope);
  const now = Math.floor(Date.now() / 1000);
  const exp = Math.min(now + 300, jag.exp);
  const claims = {
    iss: issuer, sub: jag.sub, aud: r.aud ?? jag.resource, client_id: ctx.oidc.client.clientId,
    scope: asked.join(' '), iat: now, exp, cnf: { jkt }, jti: randomBytes(12).toString('base64url'),
  };
  const key = mode === 'old_key' && previous ? previous : current;
  const token = await new jose.SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', kid: key.kid, typ: 'at+jwt' })
    .sign(key.pair.privateKey);
  ctx.body = { access_token: token, token_type: 'DPoP', expires_in: exp - now, scope: claims.scope };
  ctx.set('cache-control', 'no-store');
}
provider.registerGrantType(JWT_BEARER, jwtBearer, ['assertion', 'scope']);

const callback = provider.callback();
server.on('request', async (req, res) => {
  if (req.method === 'GET' && req.url === '/jwks') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ keys: [current.pub] }));
    return;
  }
  if (req.method === 'POST' && req.url === '/token') {
    redemptions += 1;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const form = new URLSearchParams(body.toString('utf8'));
    form.delete('assertion');
    last = { form: Object.fromEntries([...form.keys()].map((k) => [k, form.getAll(k)])), dpop: req.headers.dpop ?? null };
    req.body = body;
  }
  callback(req, res);
});

console.log(JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks`, token_endpoint: tokenEndpoint }));
const rl = createInterface({ input: process.stdin });
rl.on('line', async (line) => {
  try {
    const cmd = JSON.parse(line);
    if (cmd.cmd === 'mode') { mode = String(cmd.mode); console.log(JSON.stringify({ ok: true })); }
    else if (cmd.cmd === 'new_nonce') {
      asNonce = randomBytes(12).toString('base64url');
      console.log(JSON.stringify({ nonce: asNonce }));
    } else if (cmd.cmd === 'rotate') {
      generation += 1;
      previous = current;
      current = await newKey(generation);
      console.log(JSON.stringify({ kid: current.kid }));
    } else if (cmd.cmd === 'count') console.log(JSON.stringify({ redemptions }));
    else if (cmd.cmd === 'last') console.log(JSON.stringify(last));
    else console.log(JSON.stringify({ error: 'unknown command' }));
  } catch (e) {
    console.log(JSON.stringify({ error: String(e.message ?? e) }));
  }
});
rl.on('close', () => process.exit(0));
