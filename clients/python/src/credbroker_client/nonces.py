"""DPoP server nonces (RFC 9449 sections 8 and 9), kept per origin.

A server that wants nonces answers a proof without one (or with a stale
one) with a ``use_dpop_nonce`` challenge and a ``DPoP-Nonce`` header, and
may send a fresh ``DPoP-Nonce`` on any later answer. A nonce belongs to the
server that gave it: one :class:`NonceStore` keeps the last nonce of each
origin, so a nonce from one server is never put in a proof for another.
The origins a client meets: the broker's socket (``unix:`` and its path),
the broker's public origin (its egress proxy), each resource server and
each authorization server. :class:`~credbroker_client.broker.Broker` and
:class:`~credbroker_client.auth.DPoPAuth` each keep one by default; pass the
same store to several of them to share what they learn.

The TypeScript client's ``nonces.ts`` is the same design."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from urllib.parse import urlsplit

# A resource server asks with 401 (section 9), an authorization server with
# 400 (section 8); both name the error in `WWW-Authenticate: DPoP`, and an
# authorization server also in its JSON body.
_USE_NONCE = re.compile(r'(?i)\bDPoP\b.*\berror\s*=\s*"?use_dpop_nonce"?')
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str:
    """The origin of an http(s) URL: ``scheme://host:port``, lowercased, the
    port always written (so ``https://a.example`` and ``https://a.example:443``
    are one origin)."""
    u = urlsplit(url)
    scheme = u.scheme.lower()
    host = (u.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = u.port or _DEFAULT_PORTS.get(scheme)
    return f"{scheme}://{host}:{port}"


def socket_origin(path: str | os.PathLike[str]) -> str:
    """The origin of the broker's Unix socket: ``unix:`` and its absolute path."""
    return "unix:" + os.path.abspath(os.fspath(path))


def challenge(status: int, headers: Mapping[str, str], body: bytes = b"") -> str | None:
    """The nonce to retry with when an answer is a ``use_dpop_nonce``
    challenge (400 or 401, a ``DPoP-Nonce``, and the error named in
    ``WWW-Authenticate`` or, for 400, in a JSON body); otherwise None."""
    nonce = headers.get("dpop-nonce")
    if status not in (400, 401) or not nonce:
        return None
    if _USE_NONCE.search(headers.get("www-authenticate", "")):
        return nonce
    if status == 400 and body:
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if isinstance(doc, dict) and doc.get("error") == "use_dpop_nonce":
            return nonce
    return None


class NonceStore:
    """The last ``DPoP-Nonce`` each origin gave, for the next proof to that
    origin (:func:`origin_of`, :func:`socket_origin`). Safe to share between
    threads and tasks."""

    def __init__(self) -> None:
        self._nonces: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, origin: str) -> str | None:
        """The nonce to put in the next proof for ``origin``, if it gave one."""
        with self._lock:
            return self._nonces.get(origin)

    def update(self, origin: str, headers: Mapping[str, str]) -> None:
        """Keeps the ``DPoP-Nonce`` of an answer from ``origin``, if it has one."""
        nonce = headers.get("dpop-nonce")
        if nonce:
            with self._lock:
                self._nonces[origin] = nonce

    def __repr__(self) -> str:
        with self._lock:
            return f"NonceStore(origins={sorted(self._nonces)!r})"
