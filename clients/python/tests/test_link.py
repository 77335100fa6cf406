"""A connected service (`acme`, played by the oidc-provider peer in
tests/peers) that the person has not connected yet: the derive raises
LinkRequired with reason `connect` and the link's fields, and the link is
the broker's real connect page."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import REPO, QuickstartBroker, free_port, start_broker

from credbroker import AccessDenied, Broker, LinkRequired, ToolKey
from credbroker.mcp import link_answer

SERVICE = "https://api.acme.example"


@pytest.fixture(scope="module")
def acme(tmp_module: Path) -> Iterator[QuickstartBroker]:
    peers = REPO / "tests" / "peers"
    if not (peers / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("tests/peers/node_modules is missing: run scripts/install-test-deps")
    secret = f"client-secret-canary-{secrets.token_hex(12)}"
    port = free_port()
    provider = subprocess.Popen(
        [
            "node",
            str(peers / "oauth-service.mjs"),
            "--client-id",
            "credbroker-test",
            "--client-secret",
            secret,
            "--redirect-uri",
            f"http://127.0.0.1:{port}/callback/acme",
        ],
        cwd=peers,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert provider.stdout is not None
    issuer = json.loads(provider.stdout.readline())["issuer"]
    secret_file = tmp_module / "acme.secret"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret.encode())
    os.close(fd)
    policy = f"""
[resources."{SERVICE}"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."acme.issues"]
resource = "{SERVICE}"
scopes = ["read:org"]
steps = ["triage"]
"""
    config = f"""
[providers.acme]
display_name = "Acme"
issuer = "{issuer}"
client_id = "credbroker-test"
client_secret_file = "{secret_file}"
scopes = ["openid", "profile", "read:org"]
"""
    b = start_broker(tmp_module, extra_config=config, extra_policy=policy, broker_port=port)
    yield b
    b.stop()
    provider.terminate()
    provider.wait(timeout=10)


def test_a_service_not_yet_connected_raises_link_required(acme: QuickstartBroker) -> None:
    key = ToolKey.generate()
    with Broker(acme.socket) as c:
        before = time.time()
        with pytest.raises(LinkRequired) as e:
            c.derive(acme.subject_token(), "triage", "acme.issues", SERVICE, key=key)
        err = e.value
        assert (err.status, err.error, err.reason) == (400, "invalid_grant", "connect")
        link = err.link
        assert link.uri.startswith(f"{acme.issuer}/connect/")
        assert link.id and link.id not in link.uri
        assert 0 < link.expires_in <= 3600
        assert before + link.expires_in - 1 <= link.expires_at <= time.time() + link.expires_in
        assert "repo-helper" in link.message and "Acme" in link.message
        # The link is the broker's own page (it asks the person to sign in).
        page = httpx.get(link.uri)
        assert page.status_code in (200, 303), page.status_code
        # The MCP answer carries it unchanged.
        answer = link_answer(err, "2026-07-28")
        params = answer.input_requests["connect"].params  # type: ignore[index]
        assert params.url == link.uri  # type: ignore[union-attr]
        # Negative control: the same tool outside its step is a policy
        # denial, not a link.
        with pytest.raises(AccessDenied):
            c.derive(acme.subject_token(), "summarize", "acme.issues", SERVICE, key=key)
