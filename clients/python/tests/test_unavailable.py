"""A broker that cannot decide now answers 503 and issues nothing: with a
replay cache of 16 proofs, it fills within a few derives and the next one
raises Unavailable (the broker never forgets a live proof to make room)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import QuickstartBroker, start_broker

from credbroker_client import Broker, ToolKey, Unavailable


@pytest.fixture(scope="module")
def tiny_cache(tmp_module: Path) -> Iterator[QuickstartBroker]:
    b = start_broker(tmp_module, extra_config="\n[dpop]\nreplay_capacity = 16\n")
    yield b
    b.stop()


def test_a_full_replay_cache_raises_unavailable(tiny_cache: QuickstartBroker) -> None:
    key = ToolKey.generate()
    subject = tiny_cache.subject_token()
    issued = 0
    with Broker(tiny_cache.socket) as c:
        with pytest.raises(Unavailable) as e:
            for _ in range(64):
                c.derive(subject, "summarize", "notes.read", tiny_cache.resource, key=key)
                issued += 1
    # At least one was issued first (the broker works), never more than fit.
    assert 1 <= issued <= 16, issued
    assert (e.value.status, e.value.error) == (503, "temporarily_unavailable")
    assert e.value.description and "replay cache" in e.value.description
