"""credbroker_client.mcp.link_answer builds, with the `mcp` SDK's own types, the
exact messages of proto/mcp/ for each protocol version."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import REPO
from mcp import UrlElicitationRequiredError

from credbroker_client import LinkRequired
from credbroker_client.errors import refusal
from credbroker_client.mcp import link_answer

PROTO = REPO / "proto" / "mcp"


def load(name: str) -> Any:
    return json.loads((PROTO / name).read_text(encoding="utf-8"))


def link() -> LinkRequired:
    err = refusal(400, load("refusal-connect-required.json"), None, 1795960000.0)
    assert isinstance(err, LinkRequired)
    return err


def test_the_refusal_is_read_as_a_connect_link() -> None:
    err = link()
    body = load("refusal-connect-required.json")
    assert err.reason == "connect"
    assert (err.link.uri, err.link.id, err.link.expires_in) == (
        body["connect_uri"],
        body["connect_id"],
        body["connect_expires_in"],
    )
    assert err.link.expires_at == 1795960000.0 + body["connect_expires_in"]
    assert err.link.message == body["connect_message"]
    # The link's URL stays out of the exception's text and repr.
    assert body["connect_uri"] not in str(err) and body["connect_uri"] not in repr(err.link)


def test_2025_11_25_raises_the_url_elicitation_error() -> None:
    want = load("2025-11-25-url-elicitation-required.json")["error"]
    with pytest.raises(UrlElicitationRequiredError) as e:
        link_answer(link(), "2025-11-25")
    got = e.value.error.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert got == want
    # An unknown version gets the older answer too.
    with pytest.raises(UrlElicitationRequiredError):
        link_answer(link(), None)


def test_2026_07_28_returns_input_required_with_the_link_id_as_state() -> None:
    want = load("2026-07-28-input-required.json")["result"]
    got = link_answer(link(), "2026-07-28", name="connect_github").model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    # MCPServer seals requestState before it leaves the server: before that
    # it is the link's id; the rest is exactly the file.
    assert got.pop("requestState") == "PaKS-N91rdqASYItN4agXQ"
    want.pop("requestState")
    assert got == want
    # Default key: the link's reason.
    assert set(link_answer(link(), "2026-07-28").input_requests or {}) == {"connect"}
