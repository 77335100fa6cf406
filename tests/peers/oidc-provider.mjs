// A real OAuth 2.0 / OpenID Connect provider for the tests: panva's
// oidc-provider, configured from a JSON file, on a loopback port.
//
// Plays the organisation's IdP: it issues RFC 9068 JWT access tokens whose
// audience is the agent (the subject tokens) and signs people in to the
// pages (OpenID Connect). The third-party service is oauth-service.mjs.
// Its login and consent screens are the library's own dev interactions, which
// a browser or the `login` command below can drive.
//
//   node oidc-provider.mjs CONFIG.json
//
// CONFIG: { "port": 0, "clients": [...oidc-provider client metadata...],
//           "resources": { "<resource indicator>": { "audience": "...", "scope": "..." } },
//           "access_token_ttl": 3600,
//           "introspection": false,
//           "users": { "alice": "her password", ... } }
// A resource's "format" is "jwt" (default) or "opaque" (stored by the
// provider, so its RFC 7662 introspection, enabled by "introspection": true,
// knows them, and its revocation endpoint revokes them).
// Without "users" the dev login accepts any name with any password. With
// it, only those names, each with its own password: a wrong one gets the
// login form again with an error, so a browser test can show that nobody
// signs in as someone else.
// Prints one JSON line {"issuer": ..., "jwks_uri": ...} when listening, then
// reads JSON commands on stdin, one per line, answering one JSON line each:
//   {"cmd":"login", "user":"alice", "password":"...", "client_id":..., "client_secret":...,
//    "redirect_uri":..., "scope":"openid offline_access ...", "resource":"..."}
//      -> {"code":..., "tokens": {...token endpoint response...}}
//   {"cmd":"authorize", "url":..., "redirect_uri":..., "user":"alice", "password":"...", "browser":"b1"}
//      -> {"location": ...the redirect back to redirect_uri (code, state, iss)...}
//      follows an authorization URL that a relying party (the pages) made,
//      through the login and consent forms, keeping the IdP's cookies per
//      "browser" (a second request from the same browser reuses its IdP
//      session, as a real browser's would).
//   {"cmd":"jwks"} -> the provider's public JWKS
//   {"cmd":"age_next_login", "user":"alice", "seconds":960} -> {"ok":true}
//      the next time `user` signs in, the IdP records the sign-in as made
//      `seconds` ago (the ID token's auth_time): an IdP session that is
//      older than the pages accept, without waiting for it to age.
//   {"cmd":"revoke", "token":..., "client_id":..., "client_secret":...} -> {"status": n}
//      RFC 7009 at /token/revocation, as that client (a client revokes its own tokens)
//   {"cmd":"introspection", "fail": true} -> {"ok":true}: /token/introspection answers 500 (or, false, as usual)
//   {"cmd":"introspections"} -> {"n": introspection requests received so far}
// Exits when stdin closes.
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { createHash, randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));

// Two signing keys, so that both ES256 and RS256 paths are exercised.
const es = await jose.generateKeyPair('ES256', { extractable: true });
const rs = await jose.generateKeyPair('RS256', { extractable: true, modulusLength: 2048 });
const keys = [
  { ...(await jose.exportJWK(rs.privateKey)), kid: 'rs256-1', alg: 'RS256', use: 'sig' },
  { ...(await jose.exportJWK(es.privateKey)), kid: 'es256-1', alg: 'ES256', use: 'sig' },
];
const publicJwks = {
  keys: await Promise.all([rs.publicKey, es.publicKey].map(async (k, i) => ({
    ...(await jose.exportJWK(k)), kid: keys[i].kid, alg: keys[i].alg, use: 'sig',
  }))),
};

const server = await new Promise((resolve) => {
  const s = createServer();
  s.listen(cfg.port ?? 0, '127.0.0.1', () => resolve(s));
});
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: cfg.clients,
  jwks: { keys },
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, name: id, preferred_username: id, email: `${id}@example.test` }),
  }),
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], email: ['email'] },
  scopes: ['openid', 'offline_access', ...new Set(Object.values(cfg.resources ?? {}).flatMap((r) => (r.scope ?? '').split(' ').filter(Boolean)))],
  pkce: { required: () => true },
  rotateRefreshToken: true,
  ttl: {
    AccessToken: cfg.access_token_ttl ?? 3600,
    IdToken: 3600,
    RefreshToken: 86400,
    Grant: 86400,
    Session: 86400,
    Interaction: 600,
  },
  features: {
    devInteractions: { enabled: true },
    revocation: {
      enabled: true,
      // A client revokes only its own tokens.
      allowedPolicy: async (_ctx, client, token) => token.clientId === client.clientId,
    },
    introspection: {
      enabled: cfg.introspection === true,
      // An authenticated client (a resource server) may ask about any token.
      allowedPolicy: async (_ctx, client) => client.clientAuthMethod !== 'none',
    },
    resourceIndicators: {
      enabled: true,
      defaultResource: (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => {
        const r = (cfg.resources ?? {})[resource];
        if (!r) throw new Provider.errors.InvalidTarget();
        return {
          scope: r.scope ?? '',
          audience: r.audience ?? resource,
          accessTokenTTL: cfg.access_token_ttl ?? 3600,
          accessTokenFormat: r.format ?? 'jwt',
          jwt: { sign: { alg: r.alg ?? 'ES256' } },
        };
      },
    },
  },
  cookies: { keys: [randomBytes(16).toString('hex')] },
});
provider.proxy = false;

// Sign-ins to record as older than they are (see `age_next_login`).
const aged = new Map();
const finish = provider.interactionFinished.bind(provider);
provider.interactionFinished = async (req, res, result, opts) => {
  const id = result?.login?.accountId;
  if (id !== undefined && aged.has(id)) {
    result.login.ts = Math.floor(Date.now() / 1000) - aged.get(id);
    aged.delete(id);
  }
  return finish(req, res, result, opts);
};

const users = cfg.users ?? null;
const escapeHtml = (v) => String(v).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const callback = provider.callback();
let introspections = 0;
let failIntrospection = false;
server.on('request', async (req, res) => {
  if (req.method === 'POST' && req.url === '/token/introspection') {
    introspections += 1;
    if (failIntrospection) { res.writeHead(500, { 'content-type': 'application/json' }); res.end('{"error":"server_error"}'); return; }
  }
  // With "users", the dev login form checks the password before the
  // library sees the submission (the library's dev login takes any).
  if (users && req.method === 'POST' && req.url.startsWith('/interaction/')) {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const form = new URLSearchParams(body.toString('utf8'));
    if (form.get('prompt') === 'login') {
      const login = form.get('login') ?? '';
      if (!Object.hasOwn(users, login) || users[login] !== form.get('password')) {
        res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
        res.end(`<!DOCTYPE html><html><head><title>Sign-in</title></head><body>
<h1>Sign-in</h1><p class="red" role="alert">Invalid login or password.</p>
<form autocomplete="off" action="${escapeHtml(req.url)}" method="post">
<input type="hidden" name="prompt" value="login"/>
<input required type="text" name="login" value="${escapeHtml(login)}">
<input required type="password" name="password" autofocus>
<button type="submit" class="login login-submit">Sign-in</button></form></body></html>`);
        return;
      }
    }
    // The body was read here; the library takes an already read body from
    // req.body.
    req.body = body;
  }
  callback(req, res);
});

function cookieJar() {
  const jar = new Map();
  return {
    take(res) {
      for (const c of res.headers.getSetCookie()) {
        const [pair] = c.split(';');
        const i = pair.indexOf('=');
        jar.set(pair.slice(0, i), pair.slice(i + 1));
      }
    },
    header() {
      return [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
    },
  };
}

// Follows an authorization request through the dev login and consent
// forms, as a browser would; returns the redirect back to `redirect_uri`.
async function drive(start, jar, user, password, redirect_uri) {
  let url = start;
  for (let i = 0; i < 12; i++) {
    const res = await fetch(url, { redirect: 'manual', headers: { cookie: jar.header() } });
    jar.take(res);
    if (res.status >= 300 && res.status < 400) {
      const next = new URL(res.headers.get('location'), url);
      if (next.toString().startsWith(redirect_uri)) return next;
      url = next.toString();
      continue;
    }
    const html = await res.text();
    const m = html.match(/action="([^"]+)"/);
    if (!m) {
      const text = html.replace(/<style[\s\S]*?<\/style>/g, ' ').replace(/<[^>]+>/g, ' ').replace(/\s+/g, ' ');
      throw new Error(`unexpected page at ${url}: ${res.status}: ${text.slice(0, 400)}`);
    }
    const prompt = html.includes('name="login"') ? 'login' : 'consent';
    const form = new URLSearchParams({ prompt });
    if (prompt === 'login') { form.set('login', user); form.set('password', password ?? 'any'); }
    const post = await fetch(new URL(m[1], url), {
      method: 'POST', redirect: 'manual', body: form,
      headers: { cookie: jar.header(), 'content-type': 'application/x-www-form-urlencoded' },
    });
    jar.take(post);
    url = new URL(post.headers.get('location'), url).toString();
  }
  throw new Error(`no redirect to ${redirect_uri} after 12 steps`);
}

// Browsers, one cookie jar each (the IdP's session), by name.
const browsers = new Map();

// Drives authorization code + PKCE through the dev login and consent forms.
async function login({ user, password, client_id, client_secret, redirect_uri, scope, resource }) {
  const verifier = randomBytes(32).toString('base64url');
  const challenge = createHash('sha256').update(verifier).digest('base64url');
  const state = randomBytes(8).toString('hex');
  const jar = cookieJar();
  const auth = new URL(`${issuer}/auth`);
  for (const [k, v] of Object.entries({
    client_id, response_type: 'code', redirect_uri, scope, state,
    code_challenge: challenge, code_challenge_method: 'S256', prompt: 'consent',
  })) auth.searchParams.set(k, v);
  if (resource) auth.searchParams.set('resource', resource);
  const back = await drive(auth.toString(), jar, user, password, redirect_uri);
  if (back.searchParams.get('state') !== state) throw new Error('state mismatch');
  const code = back.searchParams.get('code');
  if (!code) throw new Error(`authorization failed: ${back.search}`);
  const body = new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri, code_verifier: verifier });
  if (resource) body.set('resource', resource);
  const headers = { 'content-type': 'application/x-www-form-urlencoded' };
  if (client_secret) headers.authorization = `Basic ${Buffer.from(`${encodeURIComponent(client_id)}:${encodeURIComponent(client_secret)}`).toString('base64')}`;
  else body.set('client_id', client_id);
  const tok = await fetch(`${issuer}/token`, { method: 'POST', headers, body });
  const tokens = await tok.json();
  if (!tok.ok) throw new Error(`token endpoint: ${JSON.stringify(tokens)}`);
  return { code, tokens };
}

console.log(JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }));
const rl = createInterface({ input: process.stdin });
rl.on('line', async (line) => {
  try {
    const cmd = JSON.parse(line);
    if (cmd.cmd === 'login') console.log(JSON.stringify(await login(cmd)));
    else if (cmd.cmd === 'authorize') {
      const b = String(cmd.browser ?? 'default');
      if (!browsers.has(b)) browsers.set(b, cookieJar());
      const back = await drive(cmd.url, browsers.get(b), cmd.user, cmd.password, cmd.redirect_uri);
      console.log(JSON.stringify({ location: back.toString() }));
    }
    else if (cmd.cmd === 'jwks') console.log(JSON.stringify(publicJwks));
    else if (cmd.cmd === 'revoke') {
      const r = await fetch(`${issuer}/token/revocation`, {
        method: 'POST',
        headers: {
          'content-type': 'application/x-www-form-urlencoded',
          authorization: `Basic ${Buffer.from(`${encodeURIComponent(cmd.client_id)}:${encodeURIComponent(cmd.client_secret)}`).toString('base64')}`,
        },
        body: new URLSearchParams({ token: cmd.token, token_type_hint: 'access_token' }),
      });
      console.log(JSON.stringify({ status: r.status }));
    }
    else if (cmd.cmd === 'introspection') { failIntrospection = Boolean(cmd.fail); console.log(JSON.stringify({ ok: true })); }
    else if (cmd.cmd === 'introspections') console.log(JSON.stringify({ n: introspections }));
    else if (cmd.cmd === 'age_next_login') {
      aged.set(String(cmd.user), Number(cmd.seconds));
      console.log(JSON.stringify({ ok: true }));
    }
    else console.log(JSON.stringify({ error: 'unknown command' }));
  } catch (e) {
    console.log(JSON.stringify({ error: String(e.message ?? e) }));
  }
});
rl.on('close', () => process.exit(0));
