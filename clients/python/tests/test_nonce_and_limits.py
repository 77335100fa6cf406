"""A broker that requires DPoP nonces and allows a burst of three derives
per person and tool, then one a second: the nonce retry is done for the
caller, and the rate limit is raised as RateLimited with its Retry-After.
(The broker counts a request it answers with a nonce challenge against the
limit too, so the burst leaves room for the challenge.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import QuickstartBroker, start_broker

from credbroker_client import Broker, RateLimited, ToolKey


@pytest.fixture(scope="module")
def strict(tmp_module: Path) -> Iterator[QuickstartBroker]:
    b = start_broker(
        tmp_module,
        extra_config=(
            "\n[dpop]\nrequire_nonce = true\n"
            "\n[limits]\nper_person_tool_per_second = 1\nburst = 3\n"
        ),
    )
    yield b
    b.stop()


def test_a_required_nonce_is_fetched_and_retried_for_the_caller(strict: QuickstartBroker) -> None:
    key = ToolKey.generate()
    subject = strict.subject_token("nonce-person")
    with Broker(strict.socket) as c:
        info = c.info()
        assert info.dpop_nonce_required is True
        # Negative control: a proof without a nonce is refused, with one.
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(strict.socket))) as raw:
            r = raw.post(
                "http://credbroker/v1/derive",
                json={
                    "subject_token": subject,
                    "step": "summarize",
                    "tool": "notes.read",
                    "resource": strict.resource,
                },
                headers={"DPoP": key.proof("POST", info.derive_htu)},
            )
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "use_dpop_nonce"
        assert r.headers["dpop-nonce"]
        # The library answers the challenge by itself.
        issued = c.derive(subject, "summarize", "notes.read", strict.resource, key=key)
        assert issued.scope == "notes.read"


def test_too_many_derives_raise_rate_limited_with_retry_after(strict: QuickstartBroker) -> None:
    key = ToolKey.generate()
    subject = strict.subject_token("busy-person")
    with Broker(strict.socket) as c:
        refused = None
        for _ in range(10):
            try:
                c.derive(subject, "summarize", "notes.read", strict.resource, key=key)
            except RateLimited as e:
                refused = e
                break
        assert refused is not None, "ten derives in a row were all issued"
        assert refused.status == 429 and refused.error == "rate_limited"
        assert isinstance(refused.retry_after, int) and refused.retry_after >= 1
        # Positive control: after Retry-After, the same derive is issued.
        time.sleep(refused.retry_after)
        c.derive(subject, "summarize", "notes.read", strict.resource, key=key)
