"""A connected service (`acme`, played by the oidc-provider peer in
tests/peers) that the person has not connected yet: the derive raises
LinkRequired with reason `connect` and the link's fields, and the link is
the broker's real connect page."""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import SERVICE, QuickstartBroker

from credbroker_client import AccessDenied, Broker, LinkRequired, ToolKey
from credbroker_client.mcp import link_answer


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
