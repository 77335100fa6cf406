// The organisation's IdP for the pages' browser test: panva's oidc-provider
// on a loopback port, with its development login and consent screens (any
// password is accepted; the login name becomes `sub`).
//
//   node pages_idp.mjs CONFIG.json
//   CONFIG: {"clients": [...oidc-provider client metadata...]}
// Prints {"issuer": ...} when listening; exits when stdin closes.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';
import Provider from 'oidc-provider';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const server = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => resolve(s));
});
const issuer = `http://127.0.0.1:${server.address().port}`;
const provider = new Provider(issuer, {
  clients: cfg.clients,
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, name: id, preferred_username: id, email: `${id}@example.test` }),
  }),
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], email: ['email'] },
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true } },
  cookies: { keys: [randomBytes(16).toString('hex')] },
});
server.on('request', provider.callback());
console.log(JSON.stringify({ issuer }));
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
