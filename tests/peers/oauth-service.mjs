// A third-party OAuth 2.0 / OpenID Connect provider for credbroker's
// integration tests: panva's oidc-provider on a loopback port, playing the
// part of a service such as GitHub. Never for production.
//
// Usage: node oauth-service.mjs --client-id ID --client-secret SECRET --redirect-uri URI [--redirect-uri URI ...]
// Prints one JSON line {"issuer": "...", "port": N} once it listens.
//
// What it offers:
// - authorization code with PKCE (required), refresh tokens with rotation
//   (a reused refresh token revokes the grant), RFC 7009 revocation,
//   userinfo, discovery;
// - an interaction that signs in the account named by `login_hint` (or,
//   for a browser, which sends none, the account set with
//   /test/browser-account) and grants every scope asked for, so tests can
//   drive it over plain HTTP or in a browser;
// - /test/* controls: the access-token lifetime, fault modes of the token
//   endpoint (hang, 500, badjson), counters, issued token values, whether
//   an access or refresh token still works, and revoking an account's
//   grants.

import http from 'node:http';
import Provider from 'oidc-provider';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const clientId = arg('client-id', 'credbroker-test');
const clientSecret = arg('client-secret');
// --redirect-uri may be given more than once (one per service name that
// shares this client).
const redirectUris = process.argv.flatMap((a, i) =>
  a === '--redirect-uri' && process.argv[i + 1] ? [process.argv[i + 1]] : []);
const redirectUri = redirectUris[0];
if (!clientSecret || !redirectUri) {
  console.error('--client-secret and --redirect-uri are required');
  process.exit(2);
}

const server = http.createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const { port } = server.address();
const issuer = `http://127.0.0.1:${port}`;

let accessTtl = 3600;
let tokenMode = 'ok';
// The account "signed in at the provider" in a browser (set by the test).
let browserAccount = null;
const stats = { authorization_code: 0, refresh_token: 0, revocations: 0, token_requests: 0 };
const issued = { access_tokens: [], refresh_tokens: [] };
// The trace headers of each token request (grant type, traceparent,
// tracestate; null when absent), for the telemetry tests.
const tokenTrace = [];
const grantsByAccount = new Map();

const SCOPES = ['openid', 'offline_access', 'profile', 'repo', 'read:org', 'issues:read'];

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: redirectUris,
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    scope: SCOPES.join(' '),
  }],
  scopes: SCOPES,
  claims: { openid: ['sub'], profile: ['preferred_username', 'name'] },
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, preferred_username: id, name: `The ${id} account` }),
  }),
  features: {
    devInteractions: { enabled: false },
    revocation: { enabled: true },
    introspection: { enabled: true },
  },
  pkce: { required: () => true },
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  rotateRefreshToken: true,
  ttl: {
    AccessToken: () => accessTtl,
    AuthorizationCode: 60,
    RefreshToken: 24 * 3600,
    Grant: 24 * 3600,
    Interaction: 3600,
    Session: 24 * 3600,
    IdToken: 3600,
  },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  cookies: { keys: ['credbroker-test-peer-cookie-key'] },
});
provider.proxy = false;

provider.on('grant.success', (ctx) => {
  const gt = ctx.oidc.params.grant_type;
  if (gt in stats) stats[gt] += 1;
});
provider.on('access_token.saved', (t) => issued.access_tokens.push(t.jti));
provider.on('refresh_token.saved', (t) => {
  issued.refresh_tokens.push(t.jti);
  const set = grantsByAccount.get(t.accountId) ?? new Set();
  set.add(t.grantId);
  grantsByAccount.set(t.accountId, set);
});

const json = (res, status, body) => {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
};

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { params, prompt } = details;
  const accountId = params.login_hint || browserAccount || details.session?.accountId || 'octo-default';
  // Another account than the provider session's: sign that one in, with a
  // grant of its own (as a person switching accounts at the provider).
  const switching = details.session?.accountId !== undefined && details.session.accountId !== accountId;
  const grant = details.grantId && !switching
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId, clientId: params.client_id });
  grant.addOIDCScope(params.scope || 'openid');
  const grantId = await grant.save();
  const result = { consent: { grantId } };
  if (prompt.name === 'login' || switching) result.login = { accountId };
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
}

async function liveRefreshTokens(account) {
  let n = 0;
  for (const jti of issued.refresh_tokens) {
    const t = await provider.RefreshToken.find(jti);
    if (t && !t.consumed && t.accountId === account && !t.isExpired) n += 1;
  }
  return n;
}

async function control(req, res, url) {
  const q = url.searchParams;
  switch (url.pathname) {
    case '/test/ttl': {
      // A control that cannot do what it was asked says so (400), so a
      // test never runs against a provider left as it was.
      const secs = Number(q.get('seconds'));
      if (!Number.isInteger(secs) || secs < 1) return json(res, 400, { error: 'bad_seconds' });
      accessTtl = secs;
      return json(res, 200, { access_token_ttl: accessTtl });
    }
    case '/test/mode': {
      const mode = q.get('token') || 'ok';
      if (!['ok', 'hang', '500', 'badjson'].includes(mode)) return json(res, 400, { error: 'unknown_mode' });
      tokenMode = mode;
      return json(res, 200, { token: tokenMode });
    }
    case '/test/stats':
      return json(res, 200, { ...stats, access_token_ttl: accessTtl, mode: tokenMode });
    case '/test/issued':
      return json(res, 200, issued);
    case '/test/token-trace':
      return json(res, 200, { requests: tokenTrace });
    case '/test/live': {
      const account = q.get('account');
      return json(res, 200, { live_refresh_tokens: await liveRefreshTokens(account) });
    }
    case '/test/browser-account':
      browserAccount = q.get('account') || null;
      return json(res, 200, { browser_account: browserAccount });
    case '/test/access-token-live': {
      const t = await provider.AccessToken.find(q.get('token'));
      return json(res, 200, { live: Boolean(t && !t.isExpired) });
    }
    case '/test/refresh-token-live': {
      const t = await provider.RefreshToken.find(q.get('token'));
      return json(res, 200, { live: Boolean(t && !t.consumed && !t.isExpired) });
    }
    case '/test/revoke-account': {
      const account = q.get('account');
      let n = 0;
      for (const grantId of grantsByAccount.get(account) ?? []) {
        await provider.RefreshToken.revokeByGrantId(grantId);
        await provider.AccessToken.revokeByGrantId(grantId);
        const g = await provider.Grant.find(grantId);
        if (g) await g.destroy();
        n += 1;
      }
      return json(res, 200, { revoked_grants: n });
    }
    default:
      return json(res, 404, { error: 'not_found' });
  }
}

const callback = provider.callback();
const hung = [];

server.on('request', async (req, res) => {
  const url = new URL(req.url, issuer);
  try {
    if (url.pathname.startsWith('/test/')) return await control(req, res, url);
    if (url.pathname.startsWith('/interaction/')) return await interaction(req, res);
    if (url.pathname === '/token' && req.method === 'POST') {
      stats.token_requests += 1;
      tokenTrace.push({
        traceparent: req.headers.traceparent ?? null,
        tracestate: req.headers.tracestate ?? null,
      });
      if (tokenMode === 'hang') {
        hung.push(res);
        return undefined;
      }
      if (tokenMode === '500') return json(res, 500, { error: 'server_error' });
      if (tokenMode === 'badjson') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end('{"access_token": "half');
      }
    }
    if (url.pathname === '/token/revocation' && req.method === 'POST') {
      res.on('finish', () => { if (res.statusCode === 200) stats.revocations += 1; });
    }
    return callback(req, res);
  } catch (e) {
    console.error(e);
    return json(res, 500, { error: 'server_error', error_description: String(e.message) });
  }
});

process.stdout.write(`${JSON.stringify({ issuer, port })}\n`);
