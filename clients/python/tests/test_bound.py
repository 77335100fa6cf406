"""A derive that carries the whole request (docs/APPROVALS.md, "The
request, bound"), against the real broker: a tool of `acme` through the
proxy whose one route binds the request, approved for each call. The
broker accepts the request the client sends (the call then needs Alice's
link: her account and her approval) and refuses one its route does not
allow, with no link."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import QuickstartBroker, start_acme

from credbroker_client import BoundRequest, Broker, InvalidRequest, LinkRequired, ToolKey


@pytest.fixture(scope="module")
def bound(tmp_module: Path) -> Iterator[QuickstartBroker]:
    s = start_acme(
        tmp_module,
        api_base=True,
        extra_policy="""
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.pay"]
resource = "{issuer}/proxy/acme"
scopes = ["read:org"]
steps = ["triage"]
approval = "each_call"
routes = [{ route = "POST /v1/payments", bind_request = true }]
""",
    )
    yield s.broker
    s.stop()


def test_the_broker_takes_the_request_the_client_sends(bound: QuickstartBroker) -> None:
    key = ToolKey.generate()
    resource = f"{bound.issuer}/proxy/acme"
    token = bound.subject_token()
    payment = BoundRequest(
        "POST", "/v1/payments", "", "application/json", '{"to": "bob", "amount": 42}'
    )
    with Broker(bound.socket) as c:
        # A method the bound route does not allow: refused, no link.
        with pytest.raises(InvalidRequest) as refused:
            c.derive(
                token,
                "triage",
                "acme.pay",
                resource,
                key=key,
                request=BoundRequest("DELETE", "/v1/payments"),
            )
        assert refused.value.error == "invalid_request"
        # Control: the bound request is taken; the call needs Alice's link.
        with pytest.raises(LinkRequired) as link:
            c.derive(token, "triage", "acme.pay", resource, key=key, request=payment)
        assert link.value.link.uri.startswith(f"{bound.issuer}/connect/")
