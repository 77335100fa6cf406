"""The tool's side: send a DPoP-bound token with a fresh proof on every
request, as an ``httpx.Auth``."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Generator

import httpx

from .broker import Issued
from .errors import CredbrokerError
from .key import ToolKey

# RFC 9449 section 9: a resource server asks for a nonce with 401 and
# `WWW-Authenticate: DPoP error="use_dpop_nonce"`; an authorization server
# (section 8) with 400 and the same error. Either carries `DPoP-Nonce`.
_USE_NONCE = re.compile(r'(?i)\bDPoP\b.*\berror\s*=\s*"?use_dpop_nonce"?')


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
    once more with the nonce (and the nonce is kept for later requests).

    It refuses, at construction, a token that is not sender-constrained: a
    provider's bearer token (``Issued.sender_constrained`` false) or a token
    whose ``cnf.jkt`` is not this key's thumbprint.
    """

    def __init__(self, token: Issued | str, key: ToolKey) -> None:
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
        self._nonce: str | None = None

    def _sign(self, request: httpx.Request) -> None:
        request.headers["Authorization"] = f"DPoP {self._token}"
        request.headers["DPoP"] = self._key.proof(
            request.method, str(request.url), access_token=self._token, nonce=self._nonce
        )

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self._sign(request)
        response = yield request
        nonce = response.headers.get("dpop-nonce")
        challenged = response.status_code in (400, 401) and _USE_NONCE.search(
            response.headers.get("www-authenticate", "")
        )
        if nonce:
            self._nonce = nonce
        if challenged and nonce:
            # A body that was streamed cannot be sent again; httpx raises
            # StreamConsumed in that case rather than sending half of it.
            self._sign(request)
            yield request

    def __repr__(self) -> str:
        return f"DPoPAuth(key={self._key!r}, token=[REDACTED])"
