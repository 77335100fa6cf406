// The tests' own Shared Signals transmitter (no SSF transmitter is
// installable from the registries), kept apart from the receiver's code:
// it builds Security Event Tokens from the SSF 1.0, CAEP 1.0 and RISC 1.0
// specifications' examples and signs them with jose (RS256, the algorithm
// SSF 1.0 requires every receiver to support). It serves what a
// transmitter serves: its SSF metadata, its JWKS, the stream management
// endpoints (Bearer management token) and an RFC 8936 poll endpoint.
//
//   node ssf-transmitter.mjs CONFIG.json
//
// CONFIG: { "management_token": "...", "audience": "<the broker's issuer>" }
// Prints {"issuer", "jwks_uri"} when listening, then reads JSON commands on
// stdin, one per line, answering one JSON line each:
//   {"cmd":"set", "type":"session-revoked", "subject":{...}, ...options} -> {"set": "<compact JWS>", "jti"}
//      type: a CAEP/RISC/SSF short name (session-revoked, credential-change, token-claims-change,
//            account-disabled, account-purged, credential-compromise, identifier-changed,
//            identifier-recycled, verification) or a full event type URI
//      options: "key" ("main" | "other": a key not in the JWKS | "none": unsigned),
//               "typ" (default "secevent+jwt"), "aud", "iss", "iat_offset" (seconds, default 0),
//               "jti" (default random), "pad" (bytes of padding claim), "event" (members merged
//               into the event), "subject_in_event" (the drafts' place for the subject),
//               "event_time_offset" (CAEP event_timestamp, seconds from now)
//   {"cmd":"queue", "set": "<SET>", "jti": "..."}  -> {"ok":true}: offered to the poll endpoint
//   {"cmd":"polls"}   -> {"polls": n, "acked": [jti...], "errs": {jti: {...}}, "pending": n}
//   {"cmd":"streams"} -> {"streams": [stream configs], "verifications": n, "statuses": {id: {...}}}
//   {"cmd":"status", "stream_id", "status", "reason"} -> {"ok":true}: the transmitter changes it
// A stream's status (SSF 1.0 section 8.1.2) is read with GET /ssf/status?stream_id=
// and set with POST /ssf/status {stream_id, status, reason}; it starts "enabled".
// Exits when stdin closes.
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import * as jose from 'jose';

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const CAEP = 'https://schemas.openid.net/secevent/caep/event-type/';
const RISC = 'https://schemas.openid.net/secevent/risc/event-type/';
const SSF = 'https://schemas.openid.net/secevent/ssf/event-type/';
const TYPES = {
  'session-revoked': CAEP, 'credential-change': CAEP, 'token-claims-change': CAEP,
  'account-disabled': RISC, 'account-purged': RISC, 'credential-compromise': RISC,
  'identifier-changed': RISC, 'identifier-recycled': RISC, 'verification': SSF,
};
// Each event's members as its specification's example gives them.
const EXAMPLES = {
  'session-revoked': { initiating_entity: 'policy', reason_admin: { en: 'Landspeed Policy Violation: C076E82F' } },
  'credential-change': { credential_type: 'password', change_type: 'update' },
  'token-claims-change': { claims: { role: 'ro-admin' } },
  'account-disabled': { reason: 'hijacking' },
  'account-purged': {},
  'credential-compromise': { credential_type: 'password' },
  'identifier-changed': { 'new-value': 'john.roe@example.com' },
  'identifier-recycled': {},
  'verification': { state: 'VGhpcyBpcyBhbiBleGFtcGxlIHN0YXRlIHZhbHVlLgo=' },
};

const main = await jose.generateKeyPair('RS256', { extractable: true });
const other = await jose.generateKeyPair('RS256', { extractable: true });
const pub = { ...(await jose.exportJWK(main.publicKey)), kid: 'tx-1', alg: 'RS256', use: 'sig' };

const server = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => resolve(s));
});
const issuer = `http://127.0.0.1:${server.address().port}`;
const streams = [];
const statuses = {};
let verifications = 0;
const queue = new Map(); // jti -> SET, until acknowledged
let polls = 0;
const acked = [];
const errs = {};

async function build(c) {
  const now = Math.floor(Date.now() / 1000);
  const type = c.type.startsWith('https://') ? c.type : `${TYPES[c.type]}${c.type}`;
  const short = Object.keys(TYPES).find((t) => `${TYPES[t]}${t}` === type);
  const event = { ...(EXAMPLES[short] ?? {}), ...(c.event ?? {}) };
  if (c.event_time_offset !== undefined) event.event_timestamp = now + c.event_time_offset;
  const jti = c.jti ?? randomBytes(16).toString('hex');
  const claims = { iss: c.iss ?? issuer, jti, iat: now + (c.iat_offset ?? 0), aud: c.aud ?? cfg.audience, txn: 8675309 };
  if (c.subject_in_event) event.subject = c.subject; else claims.sub_id = c.subject;
  claims.events = { [type]: event };
  if (c.pad) claims.padding = 'x'.repeat(c.pad);
  const header = { alg: 'RS256', typ: c.typ ?? 'secevent+jwt', kid: 'tx-1' };
  if (c.key === 'none') {
    const enc = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
    return { set: `${enc({ alg: 'none', typ: header.typ })}.${enc(claims)}.`, jti };
  }
  const key = c.key === 'other' ? other.privateKey : main.privateKey;
  const set = await new jose.CompactSign(new TextEncoder().encode(JSON.stringify(claims)))
    .setProtectedHeader(header).sign(key);
  return { set, jti };
}

function readBody(req) {
  return new Promise((resolve) => {
    let b = '';
    req.on('data', (d) => { b += d; });
    req.on('end', () => resolve(b));
  });
}

function json(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(body === undefined ? '' : JSON.stringify(body));
}

server.on('request', async (req, res) => {
  const url = new URL(req.url, issuer);
  const authorized = req.headers.authorization === `Bearer ${cfg.management_token}`;
  const body = await readBody(req);
  if (req.method === 'GET' && url.pathname === '/.well-known/ssf-configuration') {
    return json(res, 200, {
      spec_version: '1_0', issuer, jwks_uri: `${issuer}/jwks`,
      delivery_methods_supported: ['urn:ietf:rfc:8935', 'urn:ietf:rfc:8936'],
      configuration_endpoint: `${issuer}/ssf/stream`, verification_endpoint: `${issuer}/ssf/verify`,
      status_endpoint: `${issuer}/ssf/status`,
    });
  }
  if (req.method === 'GET' && url.pathname === '/jwks') return json(res, 200, { keys: [pub] });
  if (url.pathname.startsWith('/ssf/') && !authorized) return json(res, 401, { err: 'authentication_failed' });
  if (req.method === 'POST' && url.pathname === '/ssf/stream') {
    const asked = JSON.parse(body);
    const stream = {
      stream_id: randomBytes(8).toString('hex'), iss: issuer, aud: cfg.audience,
      events_supported: Object.keys(TYPES).map((t) => `${TYPES[t]}${t}`),
      events_requested: asked.events_requested, events_delivered: asked.events_requested,
      delivery: asked.delivery.method === 'urn:ietf:rfc:8936'
        ? { method: asked.delivery.method, endpoint_url: `${issuer}/ssf/poll` }
        : asked.delivery,
    };
    streams.push(stream);
    statuses[stream.stream_id] = { stream_id: stream.stream_id, status: 'enabled' };
    return json(res, 201, stream);
  }
  if (req.method === 'GET' && url.pathname === '/ssf/stream') {
    const s = streams.find((x) => x.stream_id === url.searchParams.get('stream_id'));
    return s ? json(res, 200, s) : json(res, 404, {});
  }
  if (req.method === 'GET' && url.pathname === '/ssf/status') {
    const s = statuses[url.searchParams.get('stream_id')];
    return s ? json(res, 200, s) : json(res, 404, {});
  }
  if (req.method === 'POST' && url.pathname === '/ssf/status') {
    const r = JSON.parse(body || '{}');
    if (!statuses[r.stream_id]) return json(res, 404, {});
    if (!['enabled', 'paused', 'disabled'].includes(r.status)) return json(res, 400, {});
    statuses[r.stream_id] = { stream_id: r.stream_id, status: r.status, ...(r.reason ? { reason: r.reason } : {}) };
    return json(res, 200, statuses[r.stream_id]);
  }
  if (req.method === 'POST' && url.pathname === '/ssf/verify') {
    verifications += 1;
    return json(res, 204);
  }
  if (req.method === 'POST' && url.pathname === '/ssf/poll') {
    polls += 1;
    const r = JSON.parse(body || '{}');
    for (const j of r.ack ?? []) { queue.delete(j); acked.push(j); }
    for (const [j, e] of Object.entries(r.setErrs ?? {})) { queue.delete(j); errs[j] = e; }
    const sets = {};
    for (const [j, s] of [...queue.entries()].slice(0, r.maxEvents ?? 100)) sets[j] = s;
    return json(res, 200, { sets, moreAvailable: false });
  }
  return json(res, 404, {});
});

console.log(JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }));
const rl = createInterface({ input: process.stdin });
rl.on('line', async (line) => {
  const c = JSON.parse(line);
  let out;
  if (c.cmd === 'set') out = await build(c);
  else if (c.cmd === 'queue') { queue.set(c.jti, c.set); out = { ok: true }; }
  else if (c.cmd === 'polls') out = { polls, acked, errs, pending: queue.size };
  else if (c.cmd === 'streams') out = { streams, verifications, statuses };
  else if (c.cmd === 'status') {
    statuses[c.stream_id] = { stream_id: c.stream_id, status: c.status, ...(c.reason ? { reason: c.reason } : {}) };
    out = { ok: true };
  }
  else out = { error: 'unknown command' };
  console.log(JSON.stringify(out));
});
rl.on('close', () => process.exit(0));
