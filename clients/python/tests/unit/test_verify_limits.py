"""Verifier.from_issuer caps what it reads from the network while reading:
an issuer (a local HTTP server) whose metadata or JWKS is an endless body,
a body that declares a huge length, a redirect, and a body dripped a byte
at a time are each refused quickly with keys_unavailable, naming the URL
and the cause; the same server's well-formed issuer is the positive
control."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from joserfc.jwk import ECKey

from credbroker_client.verify import MAX_KEYS_DOCUMENT, Verifier, VerifyError

KEY = ECKey.generate_key("P-256", private=True)
JWK = {**KEY.as_dict(private=False), "kid": "k1", "alg": "ES256", "use": "sig"}


class Hostile(BaseHTTPRequestHandler):
    """Issuers under path prefixes: /ok (well-formed), /endless (endless
    metadata), /endless-jwks (endless JWKS), /declared (Content-Length of
    1 GB, then endless), /redirect (metadata moved to /ok), /drip (a byte
    every 50 ms, forever)."""

    #: Bytes written per path, and whether the writer saw the client go.
    written: dict[str, int] = {}  # noqa: RUF012 - one server per module
    gone: dict[str, bool] = {}  # noqa: RUF012

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _endless(self, chunk: bytes, pause: float = 0.0, declared: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if declared is not None:
            self.send_header("Content-Length", str(declared))
        self.end_headers()
        path = self.path
        try:
            self.wfile.write(b'{"keys": [')
            while True:
                self.wfile.write(chunk)
                self.wfile.flush()
                Hostile.written[path] = Hostile.written.get(path, 0) + len(chunk)
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            Hostile.gone[path] = True

    def do_GET(self) -> None:
        # The verifier asked for 127.0.0.1:<this port> (a test: no other client).
        host = f"http://{self.headers['Host']}"
        prefix, _, rest = self.path.lstrip("/").partition("/")
        issuer = f"{host}/{prefix}"
        meta = {"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}
        if rest == "jwks" and prefix == "endless-jwks":
            return self._endless(b" " * 16384)
        if rest == "jwks":
            return self._json({"keys": [JWK]})
        if rest != ".well-known/oauth-authorization-server":
            self.send_error(404)
            return None
        if prefix == "endless":
            return self._endless(b" " * 16384)
        if prefix == "declared":
            return self._endless(b" " * 16384, declared=1_000_000_000)
        if prefix == "drip":
            return self._endless(b" ", pause=0.05)
        if prefix == "redirect":
            self.send_response(302)
            self.send_header("Location", f"{host}/ok/.well-known/oauth-authorization-server")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self._json(meta)


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def refused(issuer: str, timeout: float = 10.0) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(VerifyError) as e:
        Verifier.from_issuer(issuer, "https://rs.example/notes", timeout=timeout)
    assert e.value.code == "keys_unavailable", e.value
    return str(e.value), time.monotonic() - start


def test_an_endless_metadata_body_is_cut_at_the_cap_while_reading(host: str) -> None:
    why, took = refused(f"{host}/endless")
    assert f"{host}/endless/.well-known/oauth-authorization-server" in why, why
    assert f"larger than {MAX_KEYS_DOCUMENT} bytes" in why, why
    assert took < 5, took
    # Positive control: the same server's well-formed issuer is read.
    v = Verifier.from_issuer(f"{host}/ok", "https://rs.example/notes")
    assert v.issuer == f"{host}/ok"


def test_an_endless_jwks_body_is_cut_at_the_cap_while_reading(host: str) -> None:
    why, took = refused(f"{host}/endless-jwks")
    assert f"{host}/endless-jwks/jwks" in why and "larger than" in why, why
    assert took < 5, took


def test_a_declared_length_over_the_cap_is_refused_before_reading(host: str) -> None:
    why, took = refused(f"{host}/declared")
    assert "larger than" in why, why
    assert took < 5, took


def test_a_redirect_is_not_followed(host: str) -> None:
    why, _ = refused(f"{host}/redirect")
    assert "HTTP 302" in why, why


def test_a_dripped_body_is_given_the_timeout_in_all(host: str) -> None:
    # A byte every 50 ms never trips a read timeout; the fetch's own
    # deadline ends it (and 64 KiB at that pace would take almost an hour).
    why, took = refused(f"{host}/drip", timeout=1.0)
    assert "not read within 1.0 s" in why, why
    assert took < 3, took
