"""A link refusal as the answer of an MCP server built on the ``mcp`` package
(the extra ``mcp``: ``pip install "./clients/python[mcp]"`` from a checkout).

In a tool handler, when a derive raises :class:`~credbroker_client.errors.LinkRequired`::

    try:
        issued = broker.derive(person_token, "triage", "github.issues", RESOURCE, key=key)
    except LinkRequired as e:
        return link_answer(e, ctx.protocol_version)

For protocol 2025-11-25 :func:`link_answer` raises the ``-32042`` URL
elicitation error (``elicitationId`` is the link's id); the client opens the
link and calls the tool again by itself. For 2026-07-28 and later it returns
an ``input_required`` result with one URL elicitation, and the link's id as
``requestState``, which ``MCPServer`` seals (bound to the person and the
call) before it leaves the server; the client retries the same call with the
answer, and the handler simply derives again: ``accept`` only means the
person agreed to open the page, and the broker's next answer decides.

The person is whoever the MCP client's verified access token says, never a
tool argument; that token goes to the broker as the subject token and
nowhere else. The link is passed on unchanged: it is not pre-authenticated,
and the page behind it checks who opens it.
"""

from __future__ import annotations

from mcp import UrlElicitationRequiredError
from mcp_types import ElicitRequest, ElicitRequestURLParams, InputRequiredResult

from .errors import LinkRequired

#: The first protocol version that answers with ``input_required``.
INPUT_REQUIRED_VERSION = "2026-07-28"


def link_text(err: LinkRequired) -> str:
    """The person's sentence and the link, as plain text (both versions
    carry it, for clients that show only text)."""
    return f"{err.link.message} {err.link.uri}"


def link_answer(
    err: LinkRequired, protocol_version: str | None, *, name: str | None = None
) -> InputRequiredResult:
    """The answer to a tools/call whose derive needs a link, for the
    negotiated ``protocol_version`` (``ctx.protocol_version``). Raises
    ``UrlElicitationRequiredError`` for 2025-11-25 (and when the version is
    unknown: the older answer, which every URL-capable client reads);
    returns the ``input_required`` result for 2026-07-28 and later, under
    the input-request key ``name`` (default ``"<reason>"``, e.g. ``connect``)."""
    text = link_text(err)
    # Protocol versions are ISO dates: string order is date order.
    if protocol_version is None or protocol_version < INPUT_REQUIRED_VERSION:
        raise UrlElicitationRequiredError(
            [
                ElicitRequestURLParams(
                    mode="url", url=err.link.uri, message=text, elicitation_id=err.link.id
                )
            ],
            message=text,
        )
    key = name or (err.reason or "link")
    return InputRequiredResult(
        input_requests={
            key: ElicitRequest(
                params=ElicitRequestURLParams(mode="url", url=err.link.uri, message=text)
            )
        },
        request_state=err.link.id,
    )
