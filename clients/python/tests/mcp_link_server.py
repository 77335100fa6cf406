"""An MCP server on the `mcp` package's MCPServer (streamable HTTP) whose one
tool derives a token for a connected service with credbroker's AsyncBroker
and answers a link refusal with credbroker_client.mcp.link_answer, for
tests/test_mcp_e2e.py.

    python mcp_link_server.py PORT SOCKET ISSUER DEV_ISSUER_JWKS [PROVIDER_ISSUER]

With PROVIDER_ISSUER (the oauth-service peer playing the service), the tool
shows that the token it was issued is real: it asks the provider's userinfo
endpoint whose token it is and answers with that account, never the token.

The person is the MCP client's verified bearer token (a quick-start subject
token, checked here against the dev issuer's JWKS); that token goes to the
broker as the subject token and nowhere else.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import uvicorn
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import InputRequiredResult
from pydantic import AnyHttpUrl

from credbroker_client import AsyncBroker, LinkRequired, ToolKey
from credbroker_client.mcp import link_answer

SERVICE = "https://api.acme.example"


def main() -> None:
    port, socket, issuer, jwks_file = sys.argv[1:5]
    provider = sys.argv[5] if len(sys.argv) > 5 else None
    keys = KeySet.import_key_set(json.loads(Path(jwks_file).read_text()))

    class DevIssuerTokens:
        async def verify_token(self, token: str) -> AccessToken | None:
            try:
                t = jwt.decode(token, keys, algorithms=["ES256"])
            except (JoseError, ValueError):
                return None
            c = t.claims
            if (
                c.get("iss") != issuer
                or not isinstance(c.get("exp"), int)
                or c["exp"] <= time.time()
            ):
                return None
            return AccessToken(
                token=token,
                client_id=str(c.get("client_id", "")),
                scopes=str(c.get("scope", "")).split(),
                expires_at=c["exp"],
                subject=str(c["sub"]),
                claims={"iss": issuer},
            )

    url = f"http://127.0.0.1:{port}/mcp"
    server = MCPServer(
        name="credbroker-python-example",
        token_verifier=DevIssuerTokens(),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(url),
            validate_token_resource=False,
        ),
    )
    broker = AsyncBroker(socket)
    key = ToolKey.generate()

    @server.tool()
    async def list_repositories(ctx: Context) -> str | InputRequiredResult:
        """The person's Acme repositories (the name tests/mcp/mcp_client.py calls)."""
        person = get_access_token()
        if person is None:
            return "not signed in"
        if ctx.input_responses:
            answer = next(iter(ctx.input_responses.values()))
            action = getattr(answer, "action", None) or (
                answer.get("action") if isinstance(answer, dict) else None
            )
            if action != "accept":
                return f"the person answered {action}; nothing was called"
        try:
            issued = await broker.derive(person.token, "triage", "acme.issues", SERVICE, key=key)
        except LinkRequired as e:
            return link_answer(e, ctx.protocol_version, name="connect_acme")
        said = f"issued a {issued.token_type} token for {issued.scope}"
        if provider is None:
            return said
        async with httpx.AsyncClient(timeout=10) as http:
            meta = (await http.get(f"{provider}/.well-known/openid-configuration")).json()
            r = await http.get(
                meta["userinfo_endpoint"], headers={"Authorization": f"Bearer {issued.token}"}
            )
        if r.status_code != 200:
            return f"{said}; the provider refused it ({r.status_code})"
        return f"{said}; the provider account is {r.json()['sub']}"

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
