"""trace_from_meta: what of an MCP ``_meta`` is passed on."""

from __future__ import annotations

from credbroker_client import TraceContext, trace_from_meta

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_and_its_tracestate_are_kept() -> None:
    t = trace_from_meta({"traceparent": PARENT, "tracestate": "a=1,b=2", "baggage": "x=y"})
    assert t == TraceContext(PARENT, "a=1,b=2")
    assert t.headers() == {"traceparent": PARENT, "tracestate": "a=1,b=2"}


def test_anything_else_is_no_context() -> None:
    for meta in [
        None,
        {},
        {"traceparent": PARENT.upper()},
        {"traceparent": PARENT + "\r\nx: y"},
        {"traceparent": 5},
        "not a mapping",
    ]:
        assert trace_from_meta(meta) is None, meta
    # A bad tracestate is dropped, the traceparent kept.
    t = trace_from_meta({"traceparent": PARENT, "tracestate": "a=\n1"})
    assert t == TraceContext(PARENT, None)
    assert t.headers() == {"traceparent": PARENT}
