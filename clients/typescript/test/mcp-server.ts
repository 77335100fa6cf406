// An MCP server written the way a TypeScript author would, on
// credbroker-client and its MCP helpers, for test/mcp-e2e.test.ts. Its one
// tool derives a token for the connected service `acme` and answers a link
// refusal with the helpers; once issued, it asks the provider's userinfo
// endpoint whose token it got and answers with that account (never the
// token), which shows the token is real.
//
//   node mcp-server.js sdk|server PORT SOCKET ISSUER DEV_ISSUER_JWKS PROVIDER_ISSUER
//
// - `sdk`: @modelcontextprotocol/sdk (protocol 2025-11-25), a stateless
//   streamable HTTP transport per request; a link is the -32042 error.
// - `server`: @modelcontextprotocol/server (2026-07-28, and 2025-era
//   traffic through its stateless legacy fallback): a link is
//   `input_required` with a requestState sealed by RequestStateSealer for
//   the modern era, the -32042 error for the legacy one.
//
// The person is the MCP client's bearer token, verified here against the
// dev issuer's JWKS; that token goes to the broker as the subject token and
// nowhere else. Prints {"listening": PORT} once it listens.

import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import { Readable } from "node:stream";
import { createLocalJWKSet, jwtVerify } from "jose";
import type { JSONWebKeySet } from "jose";
import { McpServer as SdkServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { McpServer, UrlElicitationRequiredError, createMcpHandler } from "@modelcontextprotocol/server";
import type { InputRequiredResult as ServerInputRequiredResult } from "@modelcontextprotocol/server";

import { Broker, LinkRequired, ToolKey } from "../src/index.js";
import { RequestStateRejected, RequestStateSealer, linkAnswer, urlElicitationError } from "../src/mcp.js";
import type { Person } from "../src/mcp.js";

const SERVICE = "https://api.acme.example";
const TOOL = "list_repositories";
// The tool takes no arguments: the call the state is bound to.
const CALL = { name: TOOL, arguments: {} };

const [flavor, port, socket, issuer, jwksFile, provider] = process.argv.slice(2) as [string, string, string, string, string, string];
const jwks = createLocalJWKSet(JSON.parse(readFileSync(jwksFile, "utf8")) as JSONWebKeySet);
const broker = new Broker(socket);
const key = await ToolKey.generate();
const url = `http://127.0.0.1:${port}/mcp`;
const sealer = new RequestStateSealer(RequestStateSealer.generateKey(), { server: url });

interface Verified {
  token: string;
  person: Person;
}

async function verify(req: IncomingMessage): Promise<Verified | undefined> {
  const h = req.headers.authorization ?? "";
  if (!h.startsWith("Bearer ")) return undefined;
  const token = h.slice("Bearer ".length);
  try {
    const { payload } = await jwtVerify(token, jwks, { issuer, algorithms: ["ES256"] });
    if (typeof payload.sub !== "string") return undefined;
    return { token, person: { iss: issuer, sub: payload.sub } };
  } catch {
    return undefined;
  }
}

const text = (t: string) => ({ content: [{ type: "text" as const, text: t }] });

/** What the tool says once the broker issued: the provider account. */
async function served(token: string, tokenType: string, scope: string | undefined): Promise<string> {
  const said = `issued a ${tokenType} token for ${scope ?? ""}`;
  const meta = (await (await fetch(`${provider}/.well-known/openid-configuration`)).json()) as { userinfo_endpoint: string };
  const r = await fetch(meta.userinfo_endpoint, { headers: { authorization: `Bearer ${token}` } });
  if (r.status !== 200) return `${said}; the provider refused it (${r.status})`;
  return `${said}; the provider account is ${((await r.json()) as { sub: string }).sub}`;
}

/** The tool's work: the text it answers with, or the link refusal. */
async function derive(who: Verified): Promise<string | LinkRequired> {
  try {
    const issued = await broker.derive({ subjectToken: who.token, step: "triage", tool: "acme.issues", resource: SERVICE, key });
    return await served(issued.token, issued.tokenType, issued.scope);
  } catch (e) {
    if (e instanceof LinkRequired) return e;
    throw e;
  }
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

async function sdkRequest(req: IncomingMessage, res: ServerResponse, who: Verified | undefined): Promise<void> {
  const server = new SdkServer({ name: "credbroker-typescript-sdk-example", version: "0.1.0" });
  server.registerTool(TOOL, { description: "The person's Acme repositories" }, async () => {
    if (!who) return text("not signed in");
    const r = await derive(who);
    if (r instanceof LinkRequired) throw await urlElicitationError(r);
    return text(r);
  });
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
  res.on("close", () => {
    void transport.close();
    void server.close();
  });
  await server.connect(transport);
  const body = req.method === "POST" ? (JSON.parse((await readBody(req)).toString("utf8")) as unknown) : undefined;
  const authed = req as IncomingMessage & { auth?: { token: string; clientId: string; scopes: string[] } };
  if (who) authed.auth = { token: who.token, clientId: "", scopes: [] };
  await transport.handleRequest(authed, res, body);
}

const handler = createMcpHandler(({ era }) => {
  const server = new McpServer({ name: "credbroker-typescript-server-example", version: "0.1.0" });
  server.registerTool(TOOL, { description: "The person's Acme repositories" }, async (ctx) => {
    const who = ctx.http?.authInfo?.extra?.["verified"] as Verified | undefined;
    if (era === "modern" && ctx.mcpReq.inputResponses) {
      // The retry of an input_required answer: the state must open for
      // this server, person and call before anything else happens.
      const state = ctx.mcpReq.requestState<string>();
      if (!who || typeof state !== "string") throw new RequestStateRejected();
      await sealer.open(state, who.person, CALL);
      const answer = Object.values(ctx.mcpReq.inputResponses)[0] as { action?: string } | undefined;
      if (answer?.action !== "accept") return text(`the person answered ${answer?.action}; nothing was called`);
    }
    if (!who) return text("not signed in");
    const r = await derive(who);
    if (!(r instanceof LinkRequired)) return text(r);
    const answer = await linkAnswer(r, era === "modern" ? "2026-07-28" : "2025-11-25", {
      sealer,
      person: who.person,
      call: CALL,
      name: "connect_acme",
      // This SDK's own class, so that its legacy fallback answers -32042.
      errorClass: UrlElicitationRequiredError,
    });
    // The SDK's InputRequest type still asks for the 2025-era
    // elicitationId, which the 2026-07-28 shape (and the SDK's own
    // elicitUrl builder) leaves out: hence the cast (test/unit/mcp.test.ts
    // checks that the SDK recognises the result).
    return answer as unknown as ServerInputRequiredResult;
  });
  return server;
});

async function serverRequest(req: IncomingMessage, res: ServerResponse, who: Verified | undefined): Promise<void> {
  const headers = new Headers();
  for (const [k, v] of Object.entries(req.headers)) {
    if (typeof v === "string") headers.set(k, v);
    else if (Array.isArray(v)) for (const x of v) headers.append(k, x);
  }
  const body = req.method === "GET" || req.method === "HEAD" ? undefined : new Uint8Array(await readBody(req));
  const request = new Request(`http://${req.headers.host ?? "127.0.0.1"}${req.url ?? "/"}`, { method: req.method ?? "GET", headers, body });
  const authInfo = who ? { token: who.token, clientId: "", scopes: [], extra: { verified: who } } : undefined;
  const response = await handler.fetch(request, authInfo ? { authInfo } : {});
  const out: Record<string, string> = {};
  response.headers.forEach((v, k) => {
    out[k] = v;
  });
  res.writeHead(response.status, out);
  if (response.body) Readable.fromWeb(response.body as import("node:stream/web").ReadableStream).pipe(res);
  else res.end();
}

const http = createServer((req, res) => {
  void (async () => {
    const who = await verify(req);
    if (!who) {
      res.writeHead(401, { "www-authenticate": 'Bearer error="invalid_token"' }).end();
      return;
    }
    await (flavor === "sdk" ? sdkRequest(req, res, who) : serverRequest(req, res, who));
  })().catch((e: unknown) => {
    process.stderr.write(`mcp-server: ${e instanceof Error ? e.name : "error"}\n`);
    if (!res.headersSent) res.writeHead(500).end();
  });
});
http.listen(Number(port), "127.0.0.1", () => process.stdout.write(`${JSON.stringify({ listening: Number(port) })}\n`));
