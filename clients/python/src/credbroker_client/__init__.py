"""credbroker's Python client.

- :class:`Broker` / :class:`AsyncBroker`: derive a token for one tool call
  over the broker's Unix socket (``GET /v1/info`` tells them the rest);
- :class:`ToolKey`: the tool's DPoP key and its proofs;
- :class:`DPoPAuth`: an ``httpx.Auth`` that sends the token with a fresh
  proof on every request;
- :class:`NonceStore`: DPoP server nonces, kept per origin
  (:mod:`credbroker_client.nonces`);
- :mod:`credbroker_client.errors`: the refusals, typed;
- :mod:`credbroker_client.verify`: for resource servers, the token and proof checks;
- :mod:`credbroker_client.single_use`: where the verifier records single-use tokens;
- :mod:`credbroker_client.request`: a request's digest (``req_sha256``), for
  tokens bound to one request (:class:`BoundRequest`, :class:`RequestError`);
- :mod:`credbroker_client.mcp`: a link refusal as an MCP answer (extra ``mcp``);
- :mod:`credbroker_client.trace`: an MCP request's ``_meta`` trace context,
  passed on to the derive (``trace=``).

It speaks the broker's socket API version :data:`API_VERSION`.
"""

from .auth import DPoPAuth, NotSenderConstrained
from .broker import API_VERSION, AsyncBroker, Broker, Info, Issued
from .errors import (
    AccessDenied,
    BrokerNotRunning,
    CredbrokerError,
    IncompatibleBroker,
    InvalidRequest,
    Link,
    LinkRequired,
    RateLimited,
    Refused,
    Unavailable,
    UnexpectedAnswer,
)
from .key import KeyFileError, ToolKey
from .nonces import NonceStore
from .request import BoundRequest, RequestError
from .trace import TraceContext, trace_from_meta

__all__ = [
    "API_VERSION",
    "AccessDenied",
    "AsyncBroker",
    "BoundRequest",
    "Broker",
    "BrokerNotRunning",
    "CredbrokerError",
    "DPoPAuth",
    "IncompatibleBroker",
    "Info",
    "InvalidRequest",
    "Issued",
    "KeyFileError",
    "Link",
    "LinkRequired",
    "NonceStore",
    "NotSenderConstrained",
    "RateLimited",
    "Refused",
    "RequestError",
    "ToolKey",
    "TraceContext",
    "Unavailable",
    "UnexpectedAnswer",
    "trace_from_meta",
]
