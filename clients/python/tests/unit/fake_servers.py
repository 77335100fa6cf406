"""Small in-process servers for the unit tests (no broker binary): a
broker's socket that asks for DPoP nonces, and the answers of servers that
ask for them over HTTP, as an ``httpx.MockTransport``."""

from __future__ import annotations

import base64
import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
from joserfc import jws

INFO = {
    "api_version": "1",
    "broker_version": "0.0.0-fake",
    "issuer": "http://127.0.0.1:8440",
    "derive_htu": "http://127.0.0.1:8440/v1/derive",
    "token_htu": "http://127.0.0.1:8440/token",
    "dpop_signing_alg_values_supported": ["ES256"],
    "dpop_nonce_required": True,
}


def proof_nonce(proof: str) -> str | None:
    """The ``nonce`` claim of a DPoP proof (its signature is not this
    helper's concern: the end-to-end tests have the real broker check it)."""
    claims = json.loads(jws.extract_compact(proof.encode()).payload)
    nonce = claims.get("nonce")
    return nonce if isinstance(nonce, str) else None


@dataclass
class NonceServer:
    """Answers like a server that requires DPoP nonces: a proof without its
    current nonce gets ``use_dpop_nonce`` (401 with ``WWW-Authenticate`` as a
    resource server, or 400 with a JSON body as an authorization server),
    and every answer carries the next nonce. Records the nonce each proof
    carried."""

    name: str
    style: str = "resource"  # or "authorization"
    issued: int = 0
    seen: list[str | None] = field(default_factory=list)

    def _next(self) -> str:
        self.issued += 1
        return f"{self.name}-n{self.issued}"

    @property
    def current(self) -> str:
        return f"{self.name}-n{self.issued}"

    def answer(self, dpop: str | None) -> tuple[int, dict[str, str], bytes]:
        got = proof_nonce(dpop) if dpop else None
        self.seen.append(got)
        ok = self.issued > 0 and got == self.current
        headers = {"dpop-nonce": self._next()}
        if ok:
            return 200, headers, b'{"ok": true}'
        if self.style == "resource":
            headers["www-authenticate"] = 'DPoP error="use_dpop_nonce"'
            return 401, headers, b""
        headers["content-type"] = "application/json"
        return 400, headers, b'{"error": "use_dpop_nonce"}'


def transport(servers: dict[str, NonceServer]) -> httpx.MockTransport:
    """Routes each request to the server of its host."""

    def handle(request: httpx.Request) -> httpx.Response:
        status, headers, body = servers[request.url.host].answer(request.headers.get("dpop"))
        return httpx.Response(status, headers=headers, content=body)

    return httpx.MockTransport(handle)


def token_answer(jkt: str) -> dict[str, Any]:
    """A derive answer whose token is bound to ``jkt`` (unsigned: the client
    does not verify what the broker issues)."""

    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    token = f"{b64({'alg': 'ES256'})}.{b64({'cnf': {'jkt': jkt}})}.sig"
    return {
        "access_token": token,
        "token_type": "DPoP",
        "expires_in": 60,
        "scope": "notes.read",
    }


class _Unix(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextmanager
def fake_broker(path: Path, nonces: NonceServer, jkt: str) -> Iterator[None]:
    """A broker on the Unix socket ``path``: ``/v1/info``, and ``/v1/derive``
    answering as ``nonces`` says (a token bound to ``jkt`` once the proof
    carries the current nonce). The socket's challenge is a 400 with
    ``WWW-Authenticate``, as the real broker answers."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def address_string(self) -> str:
            return "unix"

        def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(200, {"content-type": "application/json"}, json.dumps(INFO).encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            status, headers, _ = nonces.answer(self.headers.get("dpop"))
            if status == 200:
                body = json.dumps(token_answer(jkt)).encode()
            else:
                status, body = 400, b'{"error": "use_dpop_nonce"}'
                headers["www-authenticate"] = 'DPoP error="use_dpop_nonce"'
            self._send(status, {**headers, "content-type": "application/json"}, body)

    server = _Unix(str(path), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
