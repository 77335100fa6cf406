"""W3C trace context from an MCP request's ``_meta``, passed on to the broker.

MCP 2026-07-28 carries the caller's trace context in a request's ``_meta``
(``traceparent``, ``tracestate``). An MCP server that derives a token for a
tool call passes it on, so that the derive's span joins the caller's trace
when the broker trusts the socket's ``traceparent``
(``[telemetry] trust_socket_traceparent``; otherwise the broker only links
it)::

    trace = trace_from_meta(ctx.request_context.meta)
    issued = broker.derive(person_token, "triage", "github.issues", RESOURCE,
                           key=key, trace=trace)

Only a well-formed ``traceparent`` is passed on, with its ``tracestate``
when that is printable ASCII (the broker caps it); ``baggage`` never is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
#: The longest ``tracestate`` passed on (the broker keeps less).
MAX_TRACESTATE = 8192


@dataclass(frozen=True)
class TraceContext:
    """A ``traceparent`` and its ``tracestate``, as sent on the derive."""

    traceparent: str
    tracestate: str | None = None

    def headers(self) -> dict[str, str]:
        """The request headers that carry it."""
        h = {"traceparent": self.traceparent}
        if self.tracestate:
            h["tracestate"] = self.tracestate
        return h


def _as_mapping(meta: Any) -> Mapping[str, Any] | None:
    if meta is None:
        return None
    if isinstance(meta, Mapping):
        return meta
    dump = getattr(meta, "model_dump", None)  # the mcp package's pydantic models
    if callable(dump):
        d = dump(by_alias=True)
        return d if isinstance(d, Mapping) else None
    return None


def trace_from_meta(meta: Any) -> TraceContext | None:
    """The trace context in an MCP request's ``_meta`` (a mapping, or the
    ``mcp`` package's ``RequestParams.Meta``); ``None`` when it has no valid
    ``traceparent``."""
    m = _as_mapping(meta)
    if m is None:
        return None
    parent = m.get("traceparent")
    if not isinstance(parent, str) or not _TRACEPARENT.fullmatch(parent):
        return None
    state = m.get("tracestate")
    ok = (
        isinstance(state, str)
        and 0 < len(state) <= MAX_TRACESTATE
        and all(0x20 <= ord(c) <= 0x7E for c in state)
    )
    return TraceContext(parent, state if ok else None)
