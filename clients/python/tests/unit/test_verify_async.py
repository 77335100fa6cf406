"""The verifier's asyncio path (Verifier.from_issuer_async, verify_async),
without a broker binary: an issuer played by an httpx.MockTransport whose
JWKS answer is slow, while a ticker shows the event loop kept running."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey

from credbroker_client import ToolKey
from credbroker_client.verify import Verifier, VerifyError

ISSUER = "https://broker.example"
AUDIENCE = "https://notes.example/notes"


def token_for(issuer_key: ECKey, kid: str, tool_key: ToolKey) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": AUDIENCE,
        "jti": str(uuid.uuid4()),
        "iat": now,
        "exp": now + 60,
        "scope": "notes.read",
        "cnf": {"jkt": tool_key.thumbprint},
        "act": {"sub": "agent-1", "tool": "notes.read"},
    }
    return jwt.encode({"typ": "at+jwt", "alg": "ES256", "kid": kid}, claims, issuer_key)


class SlowIssuer:
    """Metadata at once; the JWKS after `delay` seconds (await-ed, as a slow
    network would be), publishing the keys in `published`."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.published: dict[str, ECKey] = {}
        self.jwks_fetches = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"})
        self.jwks_fetches += 1
        await asyncio.sleep(self.delay)
        keys = [{**k.as_dict(private=False), "kid": kid} for kid, k in self.published.items()]
        return httpx.Response(200, content=json.dumps({"keys": keys}).encode())


def test_verify_async_refetches_the_jwks_without_blocking_the_loop() -> None:
    issuer = SlowIssuer(delay=0.3)
    tool = ToolKey.generate()

    async def run() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(issuer.handle))
        v = await Verifier.from_issuer_async(ISSUER, AUDIENCE, http=http)
        assert issuer.jwks_fetches == 1
        # The issuer rotates in a key after the verifier read the JWKS.
        new = ECKey.generate_key("P-256")
        issuer.published["k2"] = new
        token = token_for(new, "k2", tool)
        proof = tool.proof("GET", AUDIENCE, access_token=token)
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        who = await v.verify_async("GET", AUDIENCE, f"DPoP {token}", [proof])
        done.set()
        await t
        assert (who.sub, who.tool, who.scopes) == ("alice", "notes.read", ("notes.read",))
        assert issuer.jwks_fetches == 2
        # The loop ran on while the JWKS was read (0.3 s at 10 ms a tick).
        assert ticks >= 10, ticks
        # Another unknown key within the minute: no refetch, refused.
        other = token_for(ECKey.generate_key("P-256"), "k3", tool)
        with pytest.raises(VerifyError, match="does not publish"):
            await v.verify_async(
                "GET", AUDIENCE, f"DPoP {other}", [tool.proof("GET", AUDIENCE, access_token=other)]
            )
        assert issuer.jwks_fetches == 2
        # The sync path on this verifier never fetches (it would block):
        # the known key still verifies.
        again = tool.proof("GET", AUDIENCE, access_token=token)
        assert v.verify("GET", AUDIENCE, f"DPoP {token}", [again]).sub == "alice"
        await http.aclose()

    asyncio.run(run())


def test_from_issuer_async_keeps_the_caps() -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(200, json={"issuer": "https://other.example", "jwks_uri": "x"})
        return httpx.Response(302, headers={"location": "https://elsewhere.example/"})

    async def run(h: object) -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(h)) as http:  # type: ignore[arg-type]
            await Verifier.from_issuer_async(ISSUER, AUDIENCE, http=http)

    with pytest.raises(VerifyError, match="another issuer"):
        asyncio.run(run(handle))

    async def redirect(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"})
        return httpx.Response(302, headers={"location": "https://elsewhere.example/"})

    with pytest.raises(VerifyError, match="HTTP 302"):
        asyncio.run(run(redirect))

    async def big(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"})
        return httpx.Response(200, content=b" " * (64 * 1024 + 1))

    with pytest.raises(VerifyError, match="larger than"):
        asyncio.run(run(big))

    # Positive control: the same issuer with a JWKS in bounds.
    async def fine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"})
        return httpx.Response(200, json={"keys": []})

    asyncio.run(run(fine))
