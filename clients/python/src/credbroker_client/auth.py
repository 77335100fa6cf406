"""The tool's side: send a DPoP-bound token with a fresh proof on every
request, as an ``httpx.Auth``."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import AsyncGenerator, Generator

import httpx

from .broker import Issued
from .errors import CredbrokerError
from .key import ToolKey
from .nonces import NonceStore, challenge, origin_of


class NotSenderConstrained(CredbrokerError):
    """The token is not bound to this key: signing proofs for it would give
    it away as a bearer token, or it would fail at the server."""


def _cnf_jkt(token: str) -> str | None:
    # The token's own claims, read without verifying (the resource server
    # verifies): only to catch a token bound to another key, or to none.
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    cnf = payload.get("cnf") if isinstance(payload, dict) else None
    jkt = cnf.get("jkt") if isinstance(cnf, dict) else None
    return jkt if isinstance(jkt, str) else None


class DPoPAuth(httpx.Auth):
    """Signs every request with ``key``: ``Authorization: DPoP <token>`` and a
    ``DPoP`` proof for the request's method and URL, with ``ath``. When the
    server answers with a ``use_dpop_nonce`` challenge, the request is sent
    once more with the nonce. Nonces are kept per origin in ``nonces`` (its
    own :class:`~credbroker_client.nonces.NonceStore` unless given), so each
    server only ever sees its own.

    It refuses, at construction, a token that is not sender-constrained: a
    provider's bearer token (``Issued.sender_constrained`` false) or a token
    whose ``cnf.jkt`` is not this key's thumbprint.
    """

    def __init__(
        self, token: Issued | str, key: ToolKey, *, nonces: NonceStore | None = None
    ) -> None:
        if isinstance(token, Issued):
            if not token.sender_constrained or token.token_type != "DPoP":  # noqa: S105 - a type name
                raise NotSenderConstrained(
                    "this token is a bearer token (sender_constrained false): send it as "
                    "`Authorization: Bearer`, not with DPoPAuth"
                )
            value = token.token
        else:
            value = token
        jkt = _cnf_jkt(value)
        if jkt is None:
            raise NotSenderConstrained(
                "the token carries no cnf.jkt: it is not bound to a DPoP key"
            )
        if not hmac.compare_digest(jkt, key.thumbprint):
            raise NotSenderConstrained(
                f"the token is bound to another key (cnf.jkt is not {key.thumbprint})"
            )
        self._token = value
        self._key = key
        self._nonces = nonces if nonces is not None else NonceStore()

    def _sign(self, request: httpx.Request, origin: str) -> None:
        request.headers["Authorization"] = f"DPoP {self._token}"
        request.headers["DPoP"] = self._key.proof(
            request.method,
            str(request.url),
            access_token=self._token,
            nonce=self._nonces.get(origin),
        )

    @staticmethod
    def _body_needed(response: httpx.Response) -> bool:
        # An authorization server may name the error only in its JSON body
        # (RFC 9449 section 8): read the body of such a 400, and only then.
        return (
            response.status_code == 400
            and "dpop-nonce" in response.headers
            and challenge(400, response.headers) is None
        )

    def _retry(self, origin: str, response: httpx.Response, body: bytes) -> bool:
        self._nonces.update(origin, response.headers)
        return challenge(response.status_code, response.headers, body) is not None

    def sync_auth_flow(
        self, request: httpx.Request
    ) -> Generator[httpx.Request, httpx.Response, None]:
        origin = origin_of(str(request.url))
        self._sign(request, origin)
        response = yield request
        body = response.read() if self._body_needed(response) else b""
        if self._retry(origin, response, body):
            # A body that was streamed cannot be sent again; httpx raises
            # StreamConsumed in that case rather than sending half of it.
            self._sign(request, origin)
            response = yield request
            self._nonces.update(origin, response.headers)

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        origin = origin_of(str(request.url))
        self._sign(request, origin)
        response = yield request
        body = await response.aread() if self._body_needed(response) else b""
        if self._retry(origin, response, body):
            self._sign(request, origin)
            response = yield request
            self._nonces.update(origin, response.headers)

    def __repr__(self) -> str:
        return f"DPoPAuth(key={self._key!r}, token=[REDACTED])"
