"""credbroker_client.verify on tokens from the real broker: every check of
docs/RESOURCE-SERVERS.md section 5 refused, each followed by a correct
request that still passes; and a Python resource server built on it that
requires nonces, called by a tool with DPoPAuth (the nonce retry)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import QuickstartBroker, free_port, start_broker
from joserfc import jws

from credbroker_client import Broker, DPoPAuth, Issued, ToolKey
from credbroker_client.verify import Principal, Verifier, VerifyError

PY_PORT = free_port()
PY_RESOURCE = f"http://127.0.0.1:{PY_PORT}/notes"


@pytest.fixture(scope="module")
def b(tmp_module: Path) -> Iterator[QuickstartBroker]:
    extra = f"""
[resources."{PY_RESOURCE}"]
source = "self"
ttl = "300s"

[tools."py.read"]
resource = "{PY_RESOURCE}"
scopes = ["notes.read"]
steps = ["summarize"]
"""
    broker = start_broker(tmp_module, extra_policy=extra)
    yield broker
    broker.stop()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def b64(v: bytes) -> str:
    return base64.urlsafe_b64encode(v).rstrip(b"=").decode()


def parts(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    h, p, s = token.split(".")

    def pad(x: str) -> str:
        return x + "=" * (-len(x) % 4)

    return (
        json.loads(base64.urlsafe_b64decode(pad(h))),
        json.loads(base64.urlsafe_b64decode(pad(p))),
        s,
    )


def reencode(
    token: str, header: dict[str, Any] | None = None, claims: dict[str, Any] | None = None
) -> str:
    h, c, s = parts(token)
    h2 = b64(json.dumps(header if header is not None else h).encode())
    c2 = b64(json.dumps(claims if claims is not None else c).encode())
    return f"{h2}.{c2}.{s}"


@pytest.fixture(scope="module")
def setup(b: QuickstartBroker) -> tuple[Verifier, Clock, ToolKey, Issued]:
    key = ToolKey.generate()
    with Broker(b.socket) as c:
        issued = c.derive(b.subject_token(), "summarize", "py.read", PY_RESOURCE, key=key)
    iat = parts(issued.token)[1]["iat"]
    clock = Clock(float(iat))
    return Verifier.from_issuer(b.issuer, PY_RESOURCE, clock=clock), clock, key, issued


def call(
    v: Verifier,
    token: str,
    proof: str | list[str] | None,
    *,
    method: str = "GET",
    url: str = PY_RESOURCE,
    scheme: str = "DPoP",
) -> Principal:
    dpop = [] if proof is None else [proof] if isinstance(proof, str) else proof
    return v.verify(method, url, f"{scheme} {token}", dpop)


def refused(code: str, f: Any) -> VerifyError:
    with pytest.raises(VerifyError) as e:
        f()
    assert e.value.code == code, e.value
    return e.value


def test_every_hostile_request_is_refused_and_a_good_one_still_passes(
    setup: tuple[Verifier, Clock, ToolKey, Issued],
) -> None:
    v, clock, key, issued = setup
    tok = issued.token
    now = clock()

    def good() -> str:
        return key.proof("GET", PY_RESOURCE, access_token=tok, now=now)

    def ok() -> Principal:
        who = call(v, tok, good())
        assert (who.sub, who.agent, who.tool, who.scopes) == (
            "alice",
            "repo-helper",
            "py.read",
            ("notes.read",),
        )
        assert who.step == "summarize"  # act.step, the step the token was derived in
        return who

    ok()
    # The request: Bearer (with and without a proof), no Authorization, no or two proofs.
    refused("invalid_token", lambda: call(v, tok, good(), scheme="Bearer"))
    refused("invalid_token", lambda: call(v, tok, None, scheme="Bearer"))
    e = refused("missing", lambda: v.verify("GET", PY_RESOURCE, None, [good()]))
    assert e.challenge() == 'DPoP algs="ES256"' and e.status == 401
    refused("invalid_dpop_proof", lambda: call(v, tok, None))
    refused("invalid_dpop_proof", lambda: call(v, tok, [good(), good()]))
    ok()
    # The same proof twice.
    p = good()
    call(v, tok, p)
    refused("invalid_dpop_proof", lambda: call(v, tok, p))
    ok()
    # A valid proof from another key (a stolen token with the thief's key).
    thief = ToolKey.generate()
    refused(
        "invalid_dpop_proof", lambda: call(v, tok, thief.proof("GET", PY_RESOURCE, tok, now=now))
    )
    ok()
    # Another method, path, host, port, scheme; `get` is not GET.
    for m, u in [
        ("POST", PY_RESOURCE),
        ("get", PY_RESOURCE),
        ("GET", PY_RESOURCE + "/other"),
        ("GET", PY_RESOURCE.replace("127.0.0.1", "localhost")),
        ("GET", PY_RESOURCE.replace(str(PY_PORT), str(PY_PORT + 1))),
        ("GET", PY_RESOURCE.replace("http:", "https:")),
    ]:
        refused("invalid_dpop_proof", lambda m=m, u=u: call(v, tok, key.proof(m, u, tok, now=now)))
    # ... while the query is ignored and the host's case and default port normalised.
    call(
        v, tok, key.proof("GET", PY_RESOURCE + "?page=3", tok, now=now), url=PY_RESOURCE + "?page=2"
    )
    # ath over another token, or none.
    refused(
        "invalid_dpop_proof", lambda: call(v, tok, key.proof("GET", PY_RESOURCE, "other", now=now))
    )
    refused("invalid_dpop_proof", lambda: call(v, tok, key.proof("GET", PY_RESOURCE, now=now)))
    # iat 61 s off either way (60 s is accepted).
    for off in (-61, 61):
        refused(
            "invalid_dpop_proof",
            lambda off=off: call(v, tok, key.proof("GET", PY_RESOURCE, tok, now=now + off)),
        )
    for off in (-60, 60):
        call(v, tok, key.proof("GET", PY_RESOURCE, tok, now=now + off))
    ok()
    # A proof whose jwk is private, or whose header says typ JWT.
    h, c, _ = parts(good())
    priv = dict(h, jwk=key._key.as_dict(private=True))
    forged = jws.serialize_compact(priv, json.dumps(c), key._key, algorithms=["ES256"])
    refused("invalid_dpop_proof", lambda: call(v, tok, forged))
    as_jwt = jws.serialize_compact(
        dict(h, typ="JWT"), json.dumps(c), key._key, algorithms=["ES256"]
    )
    refused("invalid_dpop_proof", lambda: call(v, tok, as_jwt))
    ok()


def test_hostile_tokens_are_refused(
    setup: tuple[Verifier, Clock, ToolKey, Issued], b: QuickstartBroker
) -> None:
    v, clock, key, issued = setup
    tok = issued.token
    now = clock()

    def with_proof(t: str) -> Principal:
        return call(v, t, key.proof("GET", PY_RESOURCE, t, now=now))

    h, c, sig = parts(tok)
    # alg none, HS256 keyed with the public JWK, typ JWT / dpop+jwt, unknown crit.
    none = reencode(tok, header=dict(h, alg="none")).rsplit(".", 1)[0] + "."
    refused("invalid_token", lambda: with_proof(none))
    jwks = httpx.get(f"{b.issuer}/.well-known/jwks.json").json()
    head = b64(json.dumps(dict(h, alg="HS256")).encode()) + "." + tok.split(".")[1]
    mac = hmac.new(json.dumps(jwks["keys"][0]).encode(), head.encode(), hashlib.sha256).digest()
    refused("invalid_token", lambda: with_proof(head + "." + b64(mac)))
    for typ in ("JWT", "dpop+jwt"):
        refused("invalid_token", lambda typ=typ: with_proof(reencode(tok, header=dict(h, typ=typ))))
    refused("invalid_token", lambda: with_proof(reencode(tok, header=dict(h, crit=["x"]))))
    # An unknown kid (refetched once, still unknown), a changed signature or claim.
    refused("invalid_token", lambda: with_proof(reencode(tok, header=dict(h, kid="nope"))))
    flipped = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BA")
    refused("invalid_token", lambda: with_proof(tok.rsplit(".", 1)[0] + "." + flipped))
    refused(
        "invalid_token",
        lambda: with_proof(reencode(tok, claims=dict(c, scope="notes.read notes.delete"))),
    )
    # Another audience or issuer (a verifier configured for them refuses it too).
    other_aud = Verifier(b.issuer, "http://127.0.0.1:1/notes", jwks, clock=clock)
    refused(
        "invalid_token",
        lambda: other_aud.verify(
            "GET", PY_RESOURCE, f"DPoP {tok}", [key.proof("GET", PY_RESOURCE, tok, now=now)]
        ),
    )
    other_iss = Verifier("http://127.0.0.1:1", PY_RESOURCE, jwks, clock=clock)
    refused(
        "invalid_token",
        lambda: other_iss.verify(
            "GET", PY_RESOURCE, f"DPoP {tok}", [key.proof("GET", PY_RESOURCE, tok, now=now)]
        ),
    )
    # After exp (with the skew), and one second before it.
    clock.t = c["exp"] + 5
    refused("invalid_token", lambda: call(v, tok, key.proof("GET", PY_RESOURCE, tok, now=clock.t)))
    clock.t = c["exp"] + 4
    call(v, tok, key.proof("GET", PY_RESOURCE, tok, now=clock.t))
    # Issued in the future.
    clock.t = c["iat"] - 6
    refused("invalid_token", lambda: call(v, tok, key.proof("GET", PY_RESOURCE, tok, now=clock.t)))
    clock.t = now
    # Positive control.
    with_proof(tok)


class NonceServer:
    """A Python resource server on credbroker_client.verify that requires a server
    nonce (RFC 9449 section 9), one use each."""

    def __init__(self, verifier: Verifier) -> None:
        self.nonces: set[str] = set()
        self.challenges = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    who = verifier.verify(
                        "GET",
                        f"http://127.0.0.1:{PY_PORT}{self.path}",
                        self.headers.get("authorization"),
                        self.headers.get_all("dpop") or [],
                        nonce=outer.use,
                    )
                except VerifyError as e:
                    if e.code == "use_dpop_nonce":
                        outer.challenges += 1
                    self.answer(e.status, {"error": e.code}, e.challenge(), fresh=True)
                    return
                self.answer(200, {"sub": who.sub, "tool": who.tool}, None, fresh=False)

            def answer(
                self, status: int, body: dict[str, Any], challenge: str | None, fresh: bool
            ) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                if challenge:
                    self.send_header("WWW-Authenticate", challenge)
                if fresh:
                    self.send_header("DPoP-Nonce", outer.mint())
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", PY_PORT), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def mint(self) -> str:
        n = secrets.token_urlsafe(16)
        self.nonces.add(n)
        return n

    def use(self, n: str) -> bool:
        if n in self.nonces:
            self.nonces.discard(n)
            return True
        return False


def test_dpop_auth_answers_a_resource_servers_nonce_challenge(b: QuickstartBroker) -> None:
    key = ToolKey.generate()
    with Broker(b.socket) as c:
        issued = c.derive(b.subject_token(), "summarize", "py.read", PY_RESOURCE, key=key)
    srv = NonceServer(Verifier.from_issuer(b.issuer, PY_RESOURCE))
    try:
        # Negative control: a proof without a nonce is challenged, with a nonce.
        r = httpx.get(
            PY_RESOURCE,
            headers={
                "Authorization": f"DPoP {issued.token}",
                "DPoP": key.proof("GET", PY_RESOURCE, issued.token),
            },
        )
        assert r.status_code == 401 and 'error="use_dpop_nonce"' in r.headers["www-authenticate"]
        assert r.headers["dpop-nonce"]
        before = srv.challenges
        with httpx.Client(auth=DPoPAuth(issued, key)) as http:
            r = http.get(PY_RESOURCE)
            assert r.status_code == 200, r.text
            assert r.json() == {"sub": "alice", "tool": "py.read"}
            assert srv.challenges == before + 1
            # Nonces here are single-use: each call is challenged and retried once.
            assert http.get(PY_RESOURCE).status_code == 200
            assert srv.challenges == before + 2
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
