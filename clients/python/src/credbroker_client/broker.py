"""The orchestrator's side: derive a token for one tool call over the
broker's Unix socket.

:class:`Broker` (sync) and :class:`AsyncBroker` (asyncio, anyio) have the
same surface. Both learn what they need from ``GET /v1/info`` on the socket
(issuer, the ``htu`` of proofs, the DPoP algorithms, whether nonces are
required, the API version), make the proof, retry once when the broker asks
for a nonce, and turn every refusal into its exception (:mod:`.errors`).
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
    return body


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
    ) -> Issued:
        """A token for one call of ``tool`` on ``resource`` in ``step``,
        bound to ``key``; raises a :class:`~credbroker_client.errors.Refused`
        subclass when refused, :class:`~credbroker_client.errors.BrokerNotRunning`
        when nothing answers."""
        info = self.info()
        body = _body(subject_token, step, tool, resource, scope, authorization_details)
        for attempt in range(2):
            nonce = self._nonces.get(self._origin)
            proof = key.proof("POST", info.derive_htu, nonce=nonce, now=self._clock())
            r = self._send("POST", "/v1/derive", json=body, headers={"DPoP": proof})
            self._nonces.update(self._origin, r.headers)
            if attempt == 0 and challenge(r.status_code, r.headers, r.content) is not None:
                continue
            return _answer(r, self._clock(), step, tool)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

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
    ) -> Issued:
        """See :meth:`Broker.derive`."""
        info = await self.info()
        body = _body(subject_token, step, tool, resource, scope, authorization_details)
        for attempt in range(2):
            nonce = self._nonces.get(self._origin)
            proof = key.proof("POST", info.derive_htu, nonce=nonce, now=self._clock())
            r = await self._send("POST", "/v1/derive", json=body, headers={"DPoP": proof})
            self._nonces.update(self._origin, r.headers)
            if attempt == 0 and challenge(r.status_code, r.headers, r.content) is not None:
                continue
            return _answer(r, self._clock(), step, tool)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

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
