"""The orchestrator's side: derive a token for one tool call over the
broker's Unix socket.

:class:`Broker` (sync) and :class:`AsyncBroker` (asyncio, anyio) have the
same surface. Both learn what they need from ``GET /v1/info`` on the socket
(issuer, the ``htu`` of proofs, the DPoP algorithms, whether nonces are
required, the API version, the upstream token endpoints), make the proof,
retry once when the broker asks for a nonce, and turn every refusal into
its exception (:mod:`.errors`). For an ``exchange`` resource they also make
the relayed proof for the upstream's token endpoint (:mod:`.relay`) and
retry once on ``upstream_proof_required`` with the ``htu`` and nonce it names.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .errors import BrokerNotRunning, IncompatibleBroker, UnexpectedAnswer, refusal
from .key import ToolKey
from .nonces import NonceStore, challenge, socket_origin
from .relay import Leg, UpstreamInfo, proof_required
from .request import BoundRequest, bind
from .trace import TraceContext

#: The socket API version this library speaks (``api_version`` of ``GET /v1/info``).
API_VERSION = "1"

log = logging.getLogger("credbroker_client")

# The socket has no host name; httpx needs one for the request line.
_BASE = "http://credbroker"


@dataclass(frozen=True)
class Info:
    """What ``GET /v1/info`` says about the broker."""

    api_version: str
    broker_version: str
    issuer: str
    derive_htu: str
    token_htu: str
    dpop_algs: tuple[str, ...]
    dpop_nonce_required: bool
    #: The upstream authorization servers and the ``exchange`` resources
    #: (where the relayed proofs go; :mod:`credbroker_client.relay`).
    upstream: UpstreamInfo = field(default_factory=UpstreamInfo)


@dataclass(frozen=True)
class Issued:
    """A token for one tool call. ``token`` is kept out of ``repr``.

    ``sender_constrained`` is false only for a service's provider token
    (a bearer token, not bound to the tool's key). ``expires_in`` is ``None``
    when a provider gave no lifetime.
    """

    token: str = field(repr=False)
    token_type: str
    sender_constrained: bool
    expires_in: int | None
    expires_at: float | None
    scope: str


def _info_of(socket: str, status: int, body: bytes) -> Info:
    if status != 200:
        raise UnexpectedAnswer(
            f"GET /v1/info on socket {socket} answered HTTP {status}; "
            "a broker older than socket API version 1 has no /v1/info"
        )
    try:
        j = json.loads(body)
        info = Info(
            api_version=str(j["api_version"]),
            broker_version=str(j["broker_version"]),
            issuer=str(j["issuer"]),
            derive_htu=str(j["derive_htu"]),
            token_htu=str(j["token_htu"]),
            dpop_algs=tuple(str(a) for a in j["dpop_signing_alg_values_supported"]),
            dpop_nonce_required=bool(j["dpop_nonce_required"]),
            upstream=UpstreamInfo.parse(j),
        )
    except (ValueError, KeyError, TypeError):
        raise UnexpectedAnswer(f"GET /v1/info on socket {socket}: not the info document") from None
    if info.api_version != API_VERSION:
        raise IncompatibleBroker(socket, info.api_version, API_VERSION)
    if "ES256" not in info.dpop_algs:
        raise UnexpectedAnswer(
            f"the broker on socket {socket} accepts DPoP algorithms {list(info.dpop_algs)}; "
            "this library signs ES256 only"
        )
    return info


def _body(
    subject_token: str,
    step: str,
    tool: str,
    resource: str,
    scope: str | None,
    authorization_details: list[dict[str, Any]] | None,
    request: BoundRequest | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "subject_token": subject_token,
        "step": step,
        "tool": tool,
        "resource": resource,
    }
    if scope is not None:
        body["scope"] = scope
    # Only sent when given: a broker without approvals refuses the member
    # (InvalidRequest) rather than ignoring what the caller asked for.
    if authorization_details is not None:
        body["authorization_details"] = authorization_details
    # The whole request, never only its digest: the broker computes the
    # digest itself from what its page shows. It is checked here first, so
    # a body that cannot be bound is refused before anything is sent.
    if request is not None:
        bind(request)
        body["request"] = request.to_json()
    return body


def _headers(proof: str, trace: TraceContext | None) -> dict[str, str]:
    return {"DPoP": proof, **(trace.headers() if trace is not None else {})}


def _with_relayed(
    body: dict[str, Any], key: ToolKey, legs: dict[str, Leg], now: float
) -> dict[str, Any]:
    """``body`` with a fresh relayed proof per leg (``upstream_proofs``):
    by the tool's key, htm POST, htu the upstream's token endpoint."""
    if not legs:
        return body
    proofs = {n: key.proof("POST", leg.htu, nonce=leg.nonce, now=now) for n, leg in legs.items()}
    return {**body, "upstream_proofs": proofs}


def _upstream_retry(r: httpx.Response) -> tuple[str, str | None] | None:
    """The htu and nonce of an ``upstream_proof_required`` refusal."""
    try:
        doc = r.json() if r.status_code == 400 else None
    except ValueError:
        return None
    return proof_required(r.status_code, doc)


def _retry_leg(
    info: Info,
    need: tuple[str, str | None],
    resource: str,
    legs: dict[str, Leg],
    nonces: dict[str, str],
) -> bool:
    """Adds the leg a refusal named to ``legs``; False when no upstream in
    the (fresh) info matches it."""
    name = info.upstream.name_for(need[0], resource)
    if name is None:
        return False
    if need[1] is not None:
        nonces[name] = need[1]
    legs[name] = Leg(need[0], need[1])
    return True


def _answer(r: httpx.Response, now: float, step: str, tool: str) -> Issued:
    try:
        body = r.json()
    except ValueError:
        raise UnexpectedAnswer(
            f"the broker answered HTTP {r.status_code} that is not JSON"
        ) from None
    if not isinstance(body, dict):
        raise UnexpectedAnswer(
            f"the broker answered HTTP {r.status_code} that is not a JSON object"
        )
    if r.status_code == 200:
        token, token_type = body.get("access_token"), body.get("token_type")
        if not isinstance(token, str) or not isinstance(token_type, str):
            raise UnexpectedAnswer("the broker's token answer lacks access_token or token_type")
        expires_in = body.get("expires_in")
        expires_in = expires_in if isinstance(expires_in, int) else None
        issued = Issued(
            token=token,
            token_type=token_type,
            sender_constrained=body.get("sender_constrained", True) is not False,
            expires_in=expires_in,
            expires_at=None if expires_in is None else now + expires_in,
            scope=str(body.get("scope", "")),
        )
        log.info("derive issued", extra={"step": step, "tool": tool, "expires_in": expires_in})
        return issued
    retry_after = r.headers.get("retry-after")
    err = refusal(
        r.status_code,
        body,
        int(retry_after) if retry_after and retry_after.isdigit() else None,
        now,
    )
    log.info(
        "derive refused",
        extra={"step": step, "tool": tool, "error": err.error, "reason": err.reason},
    )
    raise err


class Broker:
    """A client of one broker socket (sync). Use it as a context manager or
    call :meth:`close`; one instance is safe to share between threads."""

    def __init__(
        self,
        socket: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        nonces: NonceStore | None = None,
    ) -> None:
        self.socket = os.fspath(socket)
        self._clock = clock
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=self.socket),
            base_url=_BASE,
            timeout=timeout,
        )
        self._info: Info | None = None
        # The socket is an origin of its own (see .nonces).
        self._nonces = nonces if nonces is not None else NonceStore()
        self._origin = socket_origin(self.socket)
        # Upstream authorization servers' nonces learnt from refusals, by name.
        self._upstream_nonces: dict[str, str] = {}

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
            raise BrokerNotRunning(self.socket, _cause(e)) from None

    def info(self) -> Info:
        """The broker's info (fetched once, then kept)."""
        if self._info is None:
            r = self._send("GET", "/v1/info")
            self._info = _info_of(self.socket, r.status_code, r.content)
        return self._info

    def derive(
        self,
        subject_token: str,
        step: str,
        tool: str,
        resource: str,
        scope: str | None = None,
        authorization_details: list[dict[str, Any]] | None = None,
        *,
        key: ToolKey,
        trace: TraceContext | None = None,
        request: BoundRequest | None = None,
    ) -> Issued:
        """A token for one call of ``tool`` on ``resource`` in ``step``,
        bound to ``key``; raises a :class:`~credbroker_client.errors.Refused`
        subclass when refused, :class:`~credbroker_client.errors.BrokerNotRunning`
        when nothing answers. ``trace`` (an MCP request's trace context:
        :func:`~credbroker_client.trace.trace_from_meta`) is sent as the
        derive's ``traceparent`` and ``tracestate``.

        ``request`` is the whole request the token is for, on a route that
        binds it (``bind_request``): the token then serves that one request
        (its ``req_sha256``). A body that cannot be bound raises
        :class:`~credbroker_client.request.RequestError` before anything is
        sent."""
        body = _body(subject_token, step, tool, resource, scope, authorization_details, request)
        info = self.info()
        legs = info.upstream.legs(resource, self._upstream_nonces)
        nonce_retry = upstream_retry = True
        while True:
            nonce = self._nonces.get(self._origin)
            now = self._clock()
            proof = key.proof("POST", info.derive_htu, nonce=nonce, now=now)
            sent = _with_relayed(body, key, legs, now)
            r = self._send("POST", "/v1/derive", json=sent, headers=_headers(proof, trace))
            self._nonces.update(self._origin, r.headers)
            if nonce_retry and challenge(r.status_code, r.headers, r.content) is not None:
                nonce_retry = False
                continue
            need = _upstream_retry(r) if upstream_retry else None
            if need is not None:
                upstream_retry = False
                self._info = None  # the policy may have changed: read it again
                info = self.info()
                if _retry_leg(info, need, resource, legs, self._upstream_nonces):
                    continue
            return _answer(r, self._clock(), step, tool)

    def close(self) -> None:
        """Closes the connection to the socket."""
        self._http.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Broker(socket={self.socket!r})"


class AsyncBroker:
    """The same as :class:`Broker`, for asyncio (``await`` every call)."""

    def __init__(
        self,
        socket: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        nonces: NonceStore | None = None,
    ) -> None:
        self.socket = os.fspath(socket)
        self._clock = clock
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=self.socket),
            base_url=_BASE,
            timeout=timeout,
        )
        self._info: Info | None = None
        # The socket is an origin of its own (see .nonces).
        self._nonces = nonces if nonces is not None else NonceStore()
        self._origin = socket_origin(self.socket)
        # Upstream authorization servers' nonces learnt from refusals, by name.
        self._upstream_nonces: dict[str, str] = {}

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
            raise BrokerNotRunning(self.socket, _cause(e)) from None

    async def info(self) -> Info:
        """The broker's info (fetched once, then kept)."""
        if self._info is None:
            r = await self._send("GET", "/v1/info")
            self._info = _info_of(self.socket, r.status_code, r.content)
        return self._info

    async def derive(
        self,
        subject_token: str,
        step: str,
        tool: str,
        resource: str,
        scope: str | None = None,
        authorization_details: list[dict[str, Any]] | None = None,
        *,
        key: ToolKey,
        trace: TraceContext | None = None,
        request: BoundRequest | None = None,
    ) -> Issued:
        """See :meth:`Broker.derive`."""
        body = _body(subject_token, step, tool, resource, scope, authorization_details, request)
        info = await self.info()
        legs = info.upstream.legs(resource, self._upstream_nonces)
        nonce_retry = upstream_retry = True
        while True:
            nonce = self._nonces.get(self._origin)
            now = self._clock()
            proof = key.proof("POST", info.derive_htu, nonce=nonce, now=now)
            sent = _with_relayed(body, key, legs, now)
            r = await self._send("POST", "/v1/derive", json=sent, headers=_headers(proof, trace))
            self._nonces.update(self._origin, r.headers)
            if nonce_retry and challenge(r.status_code, r.headers, r.content) is not None:
                nonce_retry = False
                continue
            need = _upstream_retry(r) if upstream_retry else None
            if need is not None:
                upstream_retry = False
                self._info = None  # the policy may have changed: read it again
                info = await self.info()
                if _retry_leg(info, need, resource, legs, self._upstream_nonces):
                    continue
            return _answer(r, self._clock(), step, tool)

    async def aclose(self) -> None:
        """Closes the connection to the socket."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncBroker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncBroker(socket={self.socket!r})"


def _cause(e: Exception) -> str:
    # httpx wraps the OS error; name it without the request (no secrets in
    # it, but its text is long and says nothing more).
    ctx = e.__context__ or e.__cause__
    while ctx is not None and not isinstance(ctx, OSError):
        ctx = ctx.__context__ or ctx.__cause__
    if isinstance(ctx, OSError) and ctx.strerror:
        return ctx.strerror
    return str(e) or type(e).__name__
