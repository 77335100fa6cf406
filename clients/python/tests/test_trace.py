"""An MCP request's ``_meta`` trace context passed on to the derive: with
``trust_socket_traceparent`` the broker makes it the derive span's parent,
so the derive's audit event carries that trace id; a derive without it, or
with a malformed one, is a trace of the broker's own (the controls).

The collector address is a closed loopback port: the spans are dropped, but
the trace id the audit event records is the one the span had."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import QuickstartBroker, free_port, start_broker

from credbroker_client import AsyncBroker, Broker, ToolKey, trace_from_meta

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced(tmp_module: Path) -> Iterator[QuickstartBroker]:
    b = start_broker(
        tmp_module,
        extra_config=(
            f'\n[telemetry]\notlp_endpoint = "http://127.0.0.1:{free_port()}"\n'
            "metrics = false\ntrust_socket_traceparent = true\n"
        ),
    )
    yield b
    b.stop()


def last_issued_trace(b: QuickstartBroker) -> str:
    events = [json.loads(line) for line in b.audit_text().splitlines() if line.strip()]
    issued = [e for e in events if e.get("event") == "derive.issued"]
    assert issued, "a derive.issued event"
    return str(issued[-1]["trace_id"])


def test_the_meta_traceparent_is_the_derive_spans_parent(traced: QuickstartBroker) -> None:
    key = ToolKey.generate()
    subject = traced.subject_token()
    # As an MCP server's handler gets it: the request's _meta (a mapping),
    # with keys the broker must never see (baggage).
    meta = {
        "traceparent": f"00-{TRACE}-{SPAN}-01",
        "tracestate": "vendor=abc",
        "baggage": "user=alice",
        "progressToken": 7,
    }
    with Broker(traced.socket) as c:
        c.derive(subject, "summarize", "notes.read", traced.resource, key=key)
        own = last_issued_trace(traced)
        assert len(own) == 32 and own != TRACE, "without _meta: the broker's own trace"
        bad = trace_from_meta({"traceparent": f"00-{TRACE.upper()}-{SPAN}-01"})
        assert bad is None
        c.derive(subject, "summarize", "notes.read", traced.resource, key=key, trace=bad)
        assert last_issued_trace(traced) not in (TRACE, own)
        c.derive(
            subject,
            "summarize",
            "notes.read",
            traced.resource,
            key=key,
            trace=trace_from_meta(meta),
        )
        assert last_issued_trace(traced) == TRACE

    other = "5bf92f3577b34da6a3ce929d0e0e4737"

    async def run_async() -> None:
        async with AsyncBroker(traced.socket) as c:
            await c.derive(
                subject,
                "summarize",
                "notes.read",
                traced.resource,
                key=key,
                trace=trace_from_meta({"traceparent": f"00-{other}-{SPAN}-01"}),
            )

    anyio.run(run_async)
    assert last_issued_trace(traced) == other
