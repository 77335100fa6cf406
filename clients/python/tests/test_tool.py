"""A tool calling examples/resource_server (the Rust verifier) with a token
from the real broker and DPoPAuth; a replayed proof is refused; DPoPAuth
refuses tokens that are not bound to its key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import QuickstartBroker, ResourceServer, start_resource_server

from credbroker_client import Broker, DPoPAuth, Issued, NotSenderConstrained, ToolKey


@pytest.fixture(scope="module")
def notes(broker: QuickstartBroker, tmp_module: Path) -> Iterator[ResourceServer]:
    rs = start_resource_server(broker, tmp_module)
    yield rs
    rs.proc.terminate()
    rs.proc.wait(timeout=10)


def derive(b: QuickstartBroker, key: ToolKey) -> Issued:
    with Broker(b.socket) as c:
        return c.derive(b.subject_token(), "summarize", "notes.read", b.resource, key=key)


def test_a_tool_calls_the_resource_server_with_dpop_auth(
    broker: QuickstartBroker, notes: ResourceServer
) -> None:
    key = ToolKey.generate()
    issued = derive(broker, key)
    with httpx.Client(auth=DPoPAuth(issued, key)) as http:
        for _ in range(2):  # a fresh proof each time: the second is no replay
            r = http.get(notes.url, params={"page": "2"})
            assert r.status_code == 200, r.text
            assert r.json()["sub"] == "alice" and r.json()["tool"] == "notes.read"
    # Negative control: the same token as a bearer token is refused.
    r = httpx.get(notes.url, headers={"Authorization": f"Bearer {issued.token}"})
    assert r.status_code == 401
    assert 'error="invalid_token"' in r.headers["www-authenticate"]


def test_a_replayed_proof_is_refused(broker: QuickstartBroker, notes: ResourceServer) -> None:
    key = ToolKey.generate()
    issued = derive(broker, key)
    sent: list[httpx.Headers] = []
    with httpx.Client(
        auth=DPoPAuth(issued, key), event_hooks={"request": [lambda r: sent.append(r.headers)]}
    ) as http:
        assert http.get(notes.url).status_code == 200
    replay = {"Authorization": sent[0]["authorization"], "DPoP": sent[0]["dpop"]}
    r = httpx.get(notes.url, headers=replay)
    assert r.status_code == 401, r.text
    assert 'error="invalid_dpop_proof"' in r.headers["www-authenticate"]
    # Positive control: a fresh proof for the same token still works.
    with httpx.Client(auth=DPoPAuth(issued, key)) as http:
        assert http.get(notes.url).status_code == 200


def test_dpop_auth_refuses_tokens_not_bound_to_its_key(
    broker: QuickstartBroker, notes: ResourceServer
) -> None:
    key = ToolKey.generate()
    issued = derive(broker, key)
    bearer = Issued("opaque-provider-token", "Bearer", False, 3600, None, "repo")
    with pytest.raises(NotSenderConstrained, match="bearer"):
        DPoPAuth(bearer, key)
    with pytest.raises(NotSenderConstrained, match=r"no cnf\.jkt"):
        DPoPAuth("opaque-provider-token", key)
    thief = ToolKey.generate()
    with pytest.raises(NotSenderConstrained, match="another key"):
        DPoPAuth(issued, thief)
    # Had it signed with the thief's key, the server would refuse it too.
    proof = thief.proof("GET", notes.url, access_token=issued.token)
    r = httpx.get(notes.url, headers={"Authorization": f"DPoP {issued.token}", "DPoP": proof})
    assert r.status_code == 401
    # Positive control: the token string with its own key is accepted.
    with httpx.Client(auth=DPoPAuth(issued.token, key)) as http:
        assert http.get(notes.url).status_code == 200
