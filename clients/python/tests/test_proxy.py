"""DPoPAuth through the broker's egress proxy (docs/PROXY.md): the service
`acme` (the oauth-service peer) with `delivery = "proxy"`, its userinfo
endpoint (`GET /me`, on the provider's own origin as `api_base`) the one
route of tool `acme.proxy`, and a broker that requires DPoP nonces. The
person connects her provider account in Chromium (the broker's pages, the
provider's sign-in); then the tool's calls through `/proxy/acme/me` reach
the provider with her token, which the tool never holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import (
    QuickstartBroker,
    open_in_browser,
    provider_account,
    require_browser,
    start_acme,
)

from credbroker_client import Broker, DPoPAuth, Issued, LinkRequired, ToolKey


@pytest.fixture(scope="module")
def proxied(tmp_module: Path) -> Iterator[QuickstartBroker]:
    """The `acme` broker with the proxy resource, nonces required, and
    alice's provider account `octo-alice` connected through the pages."""
    require_browser()
    # The proxy resource must be exactly `<issuer>/proxy/acme`.
    s = start_acme(
        tmp_module,
        api_base=True,
        extra_config="\n[dpop]\nrequire_nonce = true\n",
        extra_policy="""
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.proxy"]
resource = "{issuer}/proxy/acme"
scopes = ["read:org"]
steps = ["triage"]
routes = ["GET /me"]
""",
    )
    yield s.broker
    s.stop()


@pytest.fixture(scope="module")
def alice(proxied: QuickstartBroker, tmp_module: Path) -> tuple[Issued, ToolKey]:
    """A proxy token for alice's tool, after she connected in Chromium."""
    key = ToolKey.generate()
    resource = f"{proxied.issuer}/proxy/acme"
    with Broker(proxied.socket) as c:
        with pytest.raises(LinkRequired) as e:
            c.derive(proxied.subject_token(), "triage", "acme.proxy", resource, key=key)
        provider_account(proxied, "octo-alice")
        password = proxied.local_account("alice", tmp_module)
        assert open_in_browser(tmp_module, "alice", password, e.value.link.uri) == "completed"
        issued = c.derive(proxied.subject_token(), "triage", "acme.proxy", resource, key=key)
    assert issued.token_type == "DPoP" and issued.sender_constrained
    return issued, key


def test_dpop_auth_calls_a_proxied_route_and_answers_the_nonce_challenge(
    proxied: QuickstartBroker, alice: tuple[Issued, ToolKey]
) -> None:
    issued, key = alice
    seen: list[tuple[int, str]] = []

    def record(r: httpx.Response) -> None:
        seen.append((r.status_code, r.headers.get("www-authenticate", "")))

    url = f"{proxied.issuer}/proxy/acme/me"
    with httpx.Client(auth=DPoPAuth(issued, key), event_hooks={"response": [record]}) as http:
        r = http.get(url)
        assert r.status_code == 200, r.text
        # The provider answered with alice's provider account: the proxy
        # added her provider token, which the tool never saw.
        assert r.json()["sub"] == "octo-alice"
        assert issued.token not in r.text
        # The first proof had no nonce: refused with a challenge, then
        # signed again with the nonce by DPoPAuth.
        assert [s for s, _ in seen] == [401, 200], seen
        assert "use_dpop_nonce" in seen[0][1]
        # The nonce is kept: the next call needs no second challenge.
        assert http.get(url).status_code == 200
        assert [s for s, _ in seen] == [401, 200, 200], seen
        # Negative: a path outside the tool's routes is refused by the
        # proxy, with the same client (positive control just above).
        r = http.get(f"{proxied.issuer}/proxy/acme/userinfo")
        assert r.status_code == 403 and r.json()["reason"] == "route_not_allowed", r.text


def test_a_replayed_proof_is_refused_by_the_proxy(
    proxied: QuickstartBroker, alice: tuple[Issued, ToolKey]
) -> None:
    issued, key = alice
    url = f"{proxied.issuer}/proxy/acme/me"
    sent: list[httpx.Request] = []
    with httpx.Client(auth=DPoPAuth(issued, key), event_hooks={"request": [sent.append]}) as http:
        assert http.get(url).status_code == 200
        accepted = sent[-1]
        # The exact headers of the accepted call, sent again: the proof's
        # jti was used, so the proxy refuses it (the token alone is not enough).
        again = httpx.get(
            url,
            headers={
                "Authorization": accepted.headers["authorization"],
                "DPoP": accepted.headers["dpop"],
            },
        )
        assert again.status_code == 401, again.text
        assert again.json()["error"] == "invalid_dpop_proof", again.text
        assert "jti was already used" in again.json()["error_description"], again.text
        # Positive control: a fresh proof by DPoPAuth is accepted.
        r = http.get(url)
        assert r.status_code == 200 and r.json()["sub"] == "octo-alice", r.text
