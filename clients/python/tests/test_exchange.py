"""An ``exchange`` resource end to end (the broker's docs/UPSTREAM.md): the
client makes the relayed proof for the organisation's authorization server
by itself, and follows that server's DPoP nonce. The server is the real
one of the Rust tests (tests/peers/org-as.mjs: oidc-provider with the
RFC 8693 grant), which checks the relayed proof and binds its token to
that key; the token is checked here with joserfc against its JWKS.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import REPO, QuickstartBroker, start_broker
from joserfc import jwt
from joserfc.jwk import KeySet

from credbroker_client import AsyncBroker, Broker, InvalidRequest, ToolKey

ORG_RESOURCE = "https://org-api.example/notes"


class OrgAs:
    """tests/peers/org-as.mjs, driven over its stdin."""

    def __init__(self, tmp: Path) -> None:
        peers = REPO / "tests" / "peers"
        if not (peers / "node_modules" / "oidc-provider").is_dir():
            pytest.fail("tests/peers/node_modules is missing: run scripts/install-test-deps")
        self.secret = "org-client-secret-py"
        cfg = tmp / "org-as.json"
        cfg.write_text(
            json.dumps(
                {
                    "client_id": "credbroker",
                    "client_secret": self.secret,
                    "audience": "repo-helper",
                    "resources": {ORG_RESOURCE: {"scope": "notes:read notes:write"}},
                }
            )
        )
        self.proc = subprocess.Popen(
            ["node", str(peers / "org-as.mjs"), str(cfg)],
            cwd=peers,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        hello = json.loads(self.proc.stdout.readline())
        self.issuer: str = hello["issuer"]
        self.token_endpoint: str = hello["token_endpoint"]

    def call(self, cmd: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def subject(self, sub: str = "alice") -> str:
        return str(self.call({"cmd": "subject", "sub": sub, "ttl": 3600})["token"])

    def exchanges(self) -> int:
        return int(self.call({"cmd": "count"})["exchanges"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def org(tmp_module: Path) -> Iterator[tuple[OrgAs, QuickstartBroker]]:
    o = OrgAs(tmp_module)
    secret = tmp_module / "org.secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, o.secret.encode())
    os.close(fd)
    config = f"""
[[trusted_issuers]]
issuer = "{o.issuer}"
jwks_uri = "{o.issuer}/jwks"
sign_in = {{ kind = "oidc", client_id = "credbroker" }}

[upstreams.org]
issuer = "{o.issuer}"
client_id = "credbroker"
client_secret_file = "{secret}"
subject_issuers = ["{o.issuer}"]
timeout = "5s"
"""
    policy = f"""
[resources."{ORG_RESOURCE}"]
source = "exchange"
upstream = "org"

[tools."org.notes"]
resource = "{ORG_RESOURCE}"
scopes = ["notes:read", "notes:write"]
steps = ["summarize"]
"""
    b = start_broker(tmp_module, extra_config=config, extra_policy=policy)
    yield o, b
    b.stop()
    o.stop()


def check(o: OrgAs, token: str, key: ToolKey) -> None:
    """The org AS's token, checked as a resource server trusting only that
    server's keys would: signature, iss, aud, and bound to ``key``."""
    keys = KeySet.import_key_set(httpx.get(f"{o.issuer}/jwks").json())
    t = jwt.decode(token, keys, algorithms=["ES256"])
    assert t.header["typ"] == "at+jwt"
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": o.issuer},
        aud={"essential": True, "value": ORG_RESOURCE},
        exp={"essential": True},
    ).validate(t.claims)
    assert t.claims["cnf"] == {"jkt": key.thumbprint}
    assert t.claims["scope"] == "notes:read"
    assert t.claims["sub"] == "alice"


def test_the_client_makes_the_relayed_proof_and_follows_the_as_nonce(
    org: tuple[OrgAs, QuickstartBroker],
) -> None:
    o, b = org
    key = ToolKey.generate()
    subject = o.subject()
    sent = o.exchanges()
    with Broker(b.socket) as broker:
        info = broker.info()
        assert info.upstream.upstreams["org"][0] == o.token_endpoint
        issued = broker.derive(
            subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key
        )
        check(o, issued.token, key)
        assert issued.token_type == "DPoP" and issued.sender_constrained
        assert o.exchanges() == sent + 1, "right the first time"

        # The control: the same derive without the relayed proof is refused,
        # and nothing reaches the AS.
        body = {
            "subject_token": subject,
            "step": "summarize",
            "tool": "org.notes",
            "resource": ORG_RESOURCE,
            "scope": "notes:read",
        }
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(b.socket))) as raw:
            r = raw.post(
                "http://credbroker/v1/derive",
                json=body,
                headers={"DPoP": key.proof("POST", info.derive_htu)},
            )
        assert r.status_code == 400 and r.json()["reason"] == "upstream_proof_required"
        assert r.json()["upstream_htu"] == o.token_endpoint
        assert o.exchanges() == sent + 1

        # An AS that requires its nonce: one retry, with the nonce the
        # refusal names; then the nonce is remembered.
        assert o.call({"cmd": "mode", "mode": "nonce"})["ok"] is True
        try:
            issued = broker.derive(
                subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key
            )
            check(o, issued.token, key)
            assert o.exchanges() == sent + 3
            broker.derive(subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key)
            assert o.exchanges() == sent + 4
        finally:
            o.call({"cmd": "mode", "mode": "ok"})

        # A refusal the retry cannot cure is raised as usual: a subject token
        # from an issuer not listed for the upstream (nothing sent).
        with pytest.raises(InvalidRequest) as e:
            broker.derive(b.subject_token("alice"), "summarize", "org.notes", ORG_RESOURCE, key=key)
        assert "not listed" in str(e.value)
        assert o.exchanges() == sent + 4


def test_the_async_client_too(org: tuple[OrgAs, QuickstartBroker]) -> None:
    o, b = org
    key = ToolKey.generate()
    subject = o.subject()

    async def main() -> str:
        async with AsyncBroker(b.socket) as broker:
            issued = await broker.derive(
                subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key
            )
        return issued.token

    check(o, anyio.run(main), key)
