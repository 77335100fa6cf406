// The organisation's authorization server for the exchange tests: panva's
// oidc-provider (its discovery, client authentication, JWKS and error
// answers) with the RFC 8693 token-exchange grant added through
// registerGrantType. A grant added that way gets no DPoP check of its own,
// so the handler validates the DPoP proof with jose (typ, alg, embedded
// jwk, signature, htm, htu, iat, jti once, no ath) and binds the token it
// issues to that key (cnf.jkt). Tokens are RFC 9068 JWTs signed with the
// provider's own ES256 key (the one its JWKS publishes).
//
// It is also the organisation's IdP for identity chaining: a token exchange
// with requested_token_type id-jag and audience = a resource AS it knows
// (the "id_jag" command) answers an ID-JAG (typ oauth-id-jag+jwt, aud = that
// AS, client_id = the broker's client there, cnf.jkt = the relayed proof's
// key, token_type N_A); and an ID token (subject_token_type id_token, aud =
// config.client_id) is accepted as a subject token. Its metadata advertises
// identity_chaining_requested_token_types_supported (without id-jag when
// config.advertise_id_jag is false).
//
//   node org-as.mjs CONFIG.json
//
// CONFIG: { "client_id": "...", "client_secret": "...", "audience": "repo-helper",
//           "auth_method": "client_secret_basic" (default) | "private_key_jwt",
//           "resources": { "<uri>": { "aud": "..." | [...], "scope": "a b" } } }
// With private_key_jwt the client's jwks_uri is this server's /client-jwks, which
// forwards to the URL the "client_jwks" command names (the broker's client JWKS:
// its port is known only once both run). Client assertions are checked by
// oidc-provider (signature against that JWKS, iss, sub, exp, jti once) and, in
// assertJwtClientAuthClaimsAndHeader, for the draft-ietf-oauth-rfc7523bis shape:
// typ client-authentication+jwt, aud exactly the issuer (one string), at most 60 s.
// An actor_token, when sent, is verified with jose against the same client JWKS
// (typ credbroker-actor+jwt, aud = the issuer, at most 60 s, actor_token_type jwt).
// Prints {"issuer", "jwks_uri", "token_endpoint"} when listening, then reads
// JSON commands on stdin, one per line, answering one JSON line each:
//   {"cmd":"subject","sub":"alice","ttl":3600}  -> {"token": a subject token (aud = config.audience)}
//   {"cmd":"id_token","sub":"alice","aud":"..."} -> {"token": an ID token (aud default config.client_id)}
//   {"cmd":"id_jag","audience":AS issuer,"client_id":"..."} -> {"ok":true}: ID-JAGs for that AS name that client
//   {"cmd":"release"} -> {"ok":true}: answers the exchange held by mode "hold"
//   {"cmd":"held"}    -> {"held": bool}: whether an exchange is held now
//   {"cmd":"mode","mode":"ok"}                  -> {"ok":true}; how the token endpoint behaves next:
//      ok, unbound, bearer, wider_scope, two_aud, long_life, past_subject, other_key,
//      refresh_type (issued_token_type refresh_token), with_refresh (ok plus a refresh_token),
//      opaque, error500, html, redirect, big (a 100 KiB JSON body), hang (no answer for 30 s),
//      invalid_scope, invalid_client, invalid_grant,
//      nonce (proofs must carry the server's DPoP nonce; without it: 400 use_dpop_nonce with DPoP-Nonce),
//      for ID-JAGs: unbound_jag, other_client_jag, wrong_aud_jag, hold (the answer waits for "release")
//   {"cmd":"new_nonce"} -> {"nonce": the new DPoP nonce}; the old one is refused from now on
//   {"cmd":"count"} -> {"exchanges": n} token requests received so far (any mode)
//   {"cmd":"last"}  -> the form of the last token request (subject_token left out)
//   {"cmd":"client_jwks","url":"..."} -> {"ok":true}; where /client-jwks forwards to
//   {"cmd":"client_jwks","jwks":{...}} -> {"ok":true}; /client-jwks serves that set itself
//      (a copy of a broker's client JWKS, which stays when that broker stops)
//   {"cmd":"assertions"} -> {"verified": n, "refused": [reasons], "client_errors": [...]}:
//      client assertions seen, and why clients were refused (invalid_client)
//   {"cmd":"actor"} -> {"claims": the last verified actor token's claims, or null}
//   {"cmd":"opaque","on":true} -> {"ok":true}: tokens are issued opaque (oidc-provider's own
//      AccessToken model, stored in its memory adapter, so RFC 7662 introspection at
//      /token/introspection reports them: features.introspection), with the claims the mode
//      gives (unbound, other_key, wider_scope, two_aud, long_life, past_subject apply), and
//      the answer leaves out scope and expires_in;
//      mode "opaque" stays a random string no introspection knows
//   {"cmd":"introspection","mode":"ok"} -> {"ok":true}; how /token/introspection behaves:
//      ok, error500, hang, redirect, big, other_iss (iss another issuer), bearer (token_type Bearer)
//   {"cmd":"introspections"} -> {"n": introspection requests received, "last": their last form
//      without the token, "token_hint": its token_type_hint, "authorization": whether Basic was sent}
// Exits when stdin closes.
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import Provider, { errors } from 'oidc-provider';
import * as jose from 'jose';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const TE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const AT = 'urn:ietf:params:oauth:token-type:access_token';
const RT = 'urn:ietf:params:oauth:token-type:refresh_token';
const JWT_TYPE = 'urn:ietf:params:oauth:token-type:jwt';
const pkjwt = cfg.auth_method === 'private_key_jwt';
let clientJwksTarget = null;
let clientJwksInline = null;
let assertionsVerified = 0;
const assertionsRefused = [];
const clientErrors = [];
let lastActor = null;
const IDJAG = 'urn:ietf:params:oauth:token-type:id-jag';
const IDT = 'urn:ietf:params:oauth:token-type:id_token';

const es = await jose.generateKeyPair('ES256', { extractable: true });
const priv = { ...(await jose.exportJWK(es.privateKey)), kid: 'es256-1', alg: 'ES256', use: 'sig' };
const pub = { ...(await jose.exportJWK(es.publicKey)), kid: 'es256-1', alg: 'ES256', use: 'sig' };
const localKeys = jose.createLocalJWKSet({ keys: [pub] });

const server = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => resolve(s));
});
const issuer = `http://127.0.0.1:${server.address().port}`;
const tokenEndpoint = `${issuer}/token`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: cfg.client_id,
    ...(pkjwt ? { jwks_uri: `${issuer}/client-jwks` } : { client_secret: cfg.client_secret }),
    grant_types: [TE], response_types: [], redirect_uris: [],
    token_endpoint_auth_method: cfg.auth_method ?? 'client_secret_basic',
    id_token_signed_response_alg: 'ES256',
  }],
  // Everything here is on loopback, which oidc-provider's own SSRF guard
  // refuses to fetch from: the client JWKS is fetched without it.
  fetch: (url, options) => fetch(url, { ...options, dispatcher: undefined }),
  // The rfc7523bis shape, on top of oidc-provider's own checks.
  async assertJwtClientAuthClaimsAndHeader(_ctx, claims, header) {
    const why = header.typ !== 'client-authentication+jwt' ? `typ ${header.typ}`
      : (typeof claims.aud !== 'string' || claims.aud !== issuer) ? 'aud is not exactly the issuer'
        : claims.sub !== claims.iss ? 'sub is not iss'
          : (typeof claims.iat !== 'number' || claims.exp - claims.iat > 60) ? 'lifetime over 60 s'
            : null;
    if (why) {
      assertionsRefused.push(why);
      throw new errors.InvalidClientAuth(why);
    }
    assertionsVerified += 1;
  },
  jwks: { keys: [priv] },
  findAccount: async (_ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  features: { devInteractions: { enabled: false }, introspection: {
      enabled: true,
      // A client learns only of the tokens issued to it.
      allowedPolicy: async (_ctx, client, token) => token.clientId === client.clientId,
    },
  },
  discovery: {
    identity_chaining_requested_token_types_supported: cfg.advertise_id_jag === false ? [AT] : [AT, IDJAG],
  },
  cookies: { keys: [randomBytes(16).toString('hex')] },
});
provider.proxy = false;
// Why a client was refused, for the tests' messages (never a secret: the
// description and its cause's message).
provider.on('grant.error', (_ctx, e) => {
  if (e.error === 'invalid_client') {
    const causes = [];
    for (let c = e.cause; c && causes.length < 4; c = c.cause) causes.push(c.error_description ?? c.message);
    clientErrors.push([e.error_description, ...causes].join(': '));
  }
});

let mode = 'ok';
// Tokens issued opaque (introspectable) instead of as JWTs.
let opaque = false;
let introMode = 'ok';
let introspections = 0;
let lastIntro = null;
// With mode "nonce": every proof must carry this nonce.
let asNonce = randomBytes(12).toString('base64url');
let exchanges = 0;
// ID-JAG audiences (resource AS issuers) -> the broker's client id there.
const jagClients = {};
// Mode "hold": the held exchange's release.
let release = null;
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

const clientKeys = jose.createRemoteJWKSet(new URL(`${issuer}/client-jwks`), { cooldownDuration: 0 });

async function checkActor(params) {
  if (params.actor_token === undefined) return;
  if (params.actor_token_type !== JWT_TYPE) throw new errors.InvalidRequest('actor_token_type');
  try {
    const { payload } = await jose.jwtVerify(params.actor_token, clientKeys, {
      typ: 'credbroker-actor+jwt', audience: issuer, algorithms: ['ES256'], maxTokenAge: 60,
      requiredClaims: ['iss', 'sub', 'aud', 'iat', 'exp', 'jti'],
    });
    if (typeof payload.aud !== 'string' || payload.exp - payload.iat > 60) throw new Error('shape');
    lastActor = payload;
  } catch (e) {
    throw new errors.InvalidRequest(`actor_token invalid: ${e.code ?? e.message}`);
  }
}

async function tokenExchange(ctx) {
  const { params } = ctx.oidc;
  await checkActor(params);
  if (mode === 'invalid_scope') throw new errors.InvalidScope('scope not allowed here', params.scope ?? '');
  if (mode === 'invalid_client') throw new errors.InvalidClient('client not allowed to exchange');
  if (mode === 'invalid_grant') throw new errors.InvalidGrant('the person signed out here');
  if (params.subject_token_type !== AT && params.subject_token_type !== IDT) throw new errors.InvalidRequest('subject_token_type');
  if (params.requested_token_type && params.requested_token_type !== AT && params.requested_token_type !== IDJAG) throw new errors.InvalidRequest('requested_token_type');
  let subject;
  try {
    // An ID token's audience is the client asking (the broker here).
    ({ payload: subject } = await jose.jwtVerify(params.subject_token, localKeys, params.subject_token_type === IDT
      ? { issuer, audience: ctx.oidc.client.clientId, typ: 'JWT' }
      : { issuer, audience: cfg.audience, typ: 'at+jwt' }));
  } catch {
    throw new errors.InvalidGrant('subject token invalid');
  }
  const { jkt, nonce } = await checkProof(ctx);
  if (params.requested_token_type === IDJAG) { await idJag(ctx, subject, jkt); return; }
  if (mode === 'nonce' && nonce !== asNonce) {
    // RFC 9449 section 8: the server's nonce, in DPoP-Nonce.
    ctx.status = 400;
    ctx.set('DPoP-Nonce', asNonce);
    ctx.set('cache-control', 'no-store');
    ctx.body = { error: 'use_dpop_nonce', error_description: 'a DPoP nonce is required' };
    return;
  }
  const resources = [].concat(params.resource ?? []);
  if (resources.length !== 1 || !cfg.resources[resources[0]]) throw new errors.InvalidTarget();
  const r = cfg.resources[resources[0]];
  const allowed = new Set(r.scope.split(' '));
  const asked = (params.scope ?? '').split(' ').filter(Boolean);
  if (asked.some((s) => !allowed.has(s))) throw new errors.InvalidScope('scope exceeds', params.scope);
  const now = Math.floor(Date.now() / 1000);
  let scope = asked.join(' ');
  if (mode === 'wider_scope') scope = [...allowed, 'admin'].join(' ');
  let aud = r.aud ?? resources[0];
  if (mode === 'two_aud') aud = [].concat(aud, 'https://other.example');
  let exp = Math.min(now + 300, subject.exp);
  if (mode === 'long_life') exp = now + 3600;
  if (mode === 'past_subject') exp = now + 300;
  const claims = {
    iss: issuer, sub: subject.sub, aud, client_id: ctx.oidc.client.clientId, scope,
    iat: now, exp, jti: randomBytes(12).toString('base64url'),
  };
  if (mode === 'other_key') claims.cnf = { jkt: 'x'.repeat(43) };
  else if (mode !== 'unbound') claims.cnf = { jkt };
  let token;
  if (mode === 'opaque') token = randomBytes(32).toString('base64url');
  else if (opaque) {
    // oidc-provider's own opaque access token: its introspection reports
    // these claims (aud set as is: two audiences for two_aud).
    const at = new provider.AccessToken({
      accountId: subject.sub, client: ctx.oidc.client, scope, expiresIn: exp - now,
    });
    at.aud = aud;
    if (claims.cnf) at.jkt = claims.cnf.jkt;
    token = await at.save();
  } else token = await new jose.SignJWT(claims)
      .setProtectedHeader({ alg: 'ES256', kid: 'es256-1', typ: 'at+jwt' })
      .sign(es.privateKey);
  const body = {
    access_token: token,
    issued_token_type: mode === 'refresh_type' ? RT : AT,
    token_type: mode === 'bearer' ? 'Bearer' : 'DPoP',
    expires_in: exp - now,
    scope,
  };
  // An opaque token's answer leaves out scope and expires_in (both
  // optional): only introspection tells them.
  if (opaque) { delete body.scope; delete body.expires_in; }
  if (mode === 'refresh_type' || mode === 'with_refresh') body.refresh_token = randomBytes(32).toString('base64url');
  ctx.body = body;
  ctx.set('cache-control', 'no-store');
}
// Leg 1 of identity chaining: an ID-JAG for the resource AS named by
// `audience`, for the broker's client there, bound to the proof's key.
async function idJag(ctx, subject, jkt) {
  const { params } = ctx.oidc;
  const audiences = [].concat(params.audience ?? []);
  if (audiences.length !== 1 || !jagClients[audiences[0]]) throw new errors.InvalidTarget('unknown audience');
  const resources = [].concat(params.resource ?? []);
  if (resources.length !== 1) throw new errors.InvalidTarget('one resource');
  const now = Math.floor(Date.now() / 1000);
  const claims = {
    iss: issuer, sub: subject.sub, aud: audiences[0], client_id: jagClients[audiences[0]],
    resource: resources[0], iat: now, exp: Math.min(now + 300, subject.exp),
    jti: randomBytes(12).toString('base64url'),
  };
  if (params.scope) claims.scope = params.scope;
  if (mode !== 'unbound_jag') claims.cnf = { jkt };
  if (mode === 'other_client_jag') claims.client_id = 'someone-else';
  if (mode === 'wrong_aud_jag') claims.aud = 'https://other-as.example';
  const jag = await new jose.SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', kid: 'es256-1', typ: 'oauth-id-jag+jwt' })
    .sign(es.privateKey);
  if (mode === 'hold') await new Promise((resolve) => { release = resolve; });
  ctx.body = { access_token: jag, issued_token_type: IDJAG, token_type: 'N_A', expires_in: claims.exp - now };
  ctx.set('cache-control', 'no-store');
}

provider.registerGrantType(TE, tokenExchange,
  ['subject_token', 'subject_token_type', 'requested_token_type', 'resource', 'audience', 'scope',
    'actor_token', 'actor_token_type'],
  ['resource', 'audience']);

// RFC 7662 answers altered for the introspection modes.
provider.use(async (ctx, next) => {
  await next();
  if (ctx.path !== '/token/introspection' || ctx.status !== 200 || !ctx.body?.active) return;
  if (introMode === 'other_iss') ctx.body = { ...ctx.body, iss: 'https://other-as.example' };
  if (introMode === 'bearer') ctx.body = { ...ctx.body, token_type: 'Bearer' };
});

const callback = provider.callback();
server.on('request', async (req, res) => {
  if (req.method === 'GET' && req.url === '/client-jwks') {
    if (clientJwksInline) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(clientJwksInline));
      return;
    }
    try {
      const r = await fetch(clientJwksTarget);
      res.writeHead(r.status, { 'content-type': 'application/json' });
      res.end(await r.text());
    } catch {
      res.writeHead(502); res.end();
    }
    return;
  }
  if (req.method === 'POST' && req.url === '/token') {
    exchanges += 1;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const form = new URLSearchParams(body.toString('utf8'));
    form.delete('subject_token');
    last = { form: Object.fromEntries([...form.keys()].map((k) => [k, form.getAll(k)])), dpop: req.headers.dpop ?? null };
    if (mode === 'error500') { res.writeHead(500, { 'content-type': 'application/json' }); res.end('{"error":"server_error"}'); return; }
    if (mode === 'html') { res.writeHead(200, { 'content-type': 'text/html' }); res.end('<html><body>Sign in</body></html>'); return; }
    if (mode === 'redirect') { res.writeHead(302, { location: `${issuer}/elsewhere` }); res.end(); return; }
    if (mode === 'big') { res.writeHead(200, { 'content-type': 'application/json' }); res.end(JSON.stringify({ pad: 'x'.repeat(100 * 1024) })); return; }
    if (mode === 'hang') { setTimeout(() => { res.destroy(); }, 30000); return; }
    req.body = body;
  }
  if (req.method === 'POST' && req.url === '/token/introspection') {
    introspections += 1;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const form = new URLSearchParams(body.toString('utf8'));
    const hint = form.get('token_type_hint');
    form.delete('token');
    form.delete('client_assertion');
    lastIntro = { form: Object.fromEntries([...form.keys()].map((k) => [k, form.getAll(k)])), token_hint: hint, authorization: Boolean(req.headers.authorization) };
    if (introMode === 'error500') { res.writeHead(500, { 'content-type': 'application/json' }); res.end('{"error":"server_error"}'); return; }
    if (introMode === 'redirect') { res.writeHead(302, { location: `${issuer}/elsewhere` }); res.end(); return; }
    if (introMode === 'big') { res.writeHead(200, { 'content-type': 'application/json' }); res.end(JSON.stringify({ active: true, pad: 'x'.repeat(100 * 1024) })); return; }
    if (introMode === 'hang') { setTimeout(() => { res.destroy(); }, 30000); return; }
    req.body = body;
  }
  callback(req, res);
});

console.log(JSON.stringify({
  issuer, jwks_uri: `${issuer}/jwks`, token_endpoint: tokenEndpoint, introspection_endpoint: `${issuer}/token/introspection`,
}));
const rl = createInterface({ input: process.stdin });
rl.on('line', async (line) => {
  try {
    const cmd = JSON.parse(line);
    if (cmd.cmd === 'subject') {
      const now = Math.floor(Date.now() / 1000);
      const token = await new jose.SignJWT({ sub: cmd.sub, client_id: 'orchestrator', scope: 'agent' })
        .setProtectedHeader({ alg: 'ES256', kid: 'es256-1', typ: 'at+jwt' })
        .setIssuer(issuer).setAudience(cfg.audience).setIssuedAt(now).setExpirationTime(now + (cmd.ttl ?? 3600))
        .setJti(randomBytes(12).toString('base64url'))
        .sign(es.privateKey);
      console.log(JSON.stringify({ token }));
    } else if (cmd.cmd === 'id_token') {
      const now = Math.floor(Date.now() / 1000);
      const token = await new jose.SignJWT({ sub: cmd.sub, nonce: 'n-0S6_WzA2Mj', auth_time: now })
        .setProtectedHeader({ alg: 'ES256', kid: 'es256-1', typ: 'JWT' })
        .setIssuer(issuer).setAudience(cmd.aud ?? cfg.client_id).setIssuedAt(now).setExpirationTime(now + (cmd.ttl ?? 600))
        .sign(es.privateKey);
      console.log(JSON.stringify({ token }));
    } else if (cmd.cmd === 'id_jag') { jagClients[cmd.audience] = cmd.client_id; console.log(JSON.stringify({ ok: true })); }
    else if (cmd.cmd === 'release') { const r = release; release = null; if (r) r(); console.log(JSON.stringify({ ok: Boolean(r) })); }
    else if (cmd.cmd === 'held') console.log(JSON.stringify({ held: release !== null }));
    else if (cmd.cmd === 'mode') { mode = String(cmd.mode); console.log(JSON.stringify({ ok: true })); }
    else if (cmd.cmd === 'new_nonce') { asNonce = randomBytes(12).toString('base64url'); console.log(JSON.stringify({ nonce: asNonce })); }
    else if (cmd.cmd === 'opaque') { opaque = Boolean(cmd.on); console.log(JSON.stringify({ ok: true })); }
    else if (cmd.cmd === 'introspection') { introMode = String(cmd.mode); console.log(JSON.stringify({ ok: true })); }
    else if (cmd.cmd === 'introspections') console.log(JSON.stringify({ n: introspections, ...lastIntro }));
    else if (cmd.cmd === 'count') console.log(JSON.stringify({ exchanges }));
    else if (cmd.cmd === 'last') console.log(JSON.stringify(last));
    else if (cmd.cmd === 'client_jwks') {
      clientJwksInline = cmd.jwks ?? null;
      clientJwksTarget = cmd.url === undefined ? null : String(cmd.url);
      console.log(JSON.stringify({ ok: true }));
    }
    else if (cmd.cmd === 'assertions') console.log(JSON.stringify({ verified: assertionsVerified, refused: assertionsRefused, client_errors: clientErrors }));
    else if (cmd.cmd === 'actor') console.log(JSON.stringify({ claims: lastActor }));
    else console.log(JSON.stringify({ error: 'unknown command' }));
  } catch (e) {
    console.log(JSON.stringify({ error: String(e.message ?? e) }));
  }
});
rl.on('close', () => process.exit(0));
