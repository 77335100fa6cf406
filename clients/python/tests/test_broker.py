"""Broker and AsyncBroker against the real broker on its quick-start
defaults: info, an issued token (verified with joserfc against the broker's
JWKS), each refusal with its fields, a broker that is not running, a broker
of another API version."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import QuickstartBroker
from joserfc import jwt
from joserfc.errors import BadSignatureError
from joserfc.jwk import KeySet

from credbroker_client import (
    API_VERSION,
    AccessDenied,
    AsyncBroker,
    Broker,
    BrokerNotRunning,
    IncompatibleBroker,
    InvalidRequest,
    LinkRequired,
    ToolKey,
)


@pytest.fixture(scope="module")
def key() -> ToolKey:
    return ToolKey.generate()


def jwks(b: QuickstartBroker) -> KeySet:
    r = httpx.get(f"{b.issuer}/.well-known/jwks.json")
    assert r.status_code == 200, r.text
    return KeySet.import_key_set(r.json())


def test_info_names_the_issuer_htus_algs_and_api_version(broker: QuickstartBroker) -> None:
    with Broker(broker.socket) as c:
        info = c.info()
    assert info.api_version == API_VERSION == "1"
    assert info.issuer == broker.issuer
    assert info.derive_htu == f"{broker.issuer}/v1/derive"
    assert info.token_htu == f"{broker.issuer}/token"
    assert info.dpop_algs == ("ES256",)
    assert info.dpop_nonce_required is False
    assert info.broker_version


def test_derive_issues_a_token_that_joserfc_verifies_bound_to_the_key(
    broker: QuickstartBroker, key: ToolKey
) -> None:
    subject = broker.subject_token()
    before = time.time()
    with Broker(broker.socket) as c:
        issued = c.derive(subject, "summarize", "notes.read", broker.resource, key=key)
    assert issued.token_type == "DPoP"
    assert issued.sender_constrained is True
    assert issued.scope == "notes.read"
    assert issued.expires_in == 300
    assert issued.expires_at is not None and before + 299 <= issued.expires_at <= time.time() + 301
    tok = jwt.decode(issued.token, jwks(broker), algorithms=["ES256"])
    assert tok.header["typ"] == "at+jwt"
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": broker.issuer},
        aud={"essential": True, "value": broker.resource},
        exp={"essential": True},
    ).validate(tok.claims)
    claims = tok.claims
    assert claims["sub"] == "alice"
    assert claims["cnf"] == {"jkt": key.thumbprint}
    assert claims["act"]["tool"] == "notes.read"
    # Negative control: the same verification fails with a key set that
    # lacks the broker's key, so the check above could have failed.
    stranger: dict[str, Any] = {**ToolKey.generate().public_jwk, "kid": tok.header["kid"]}
    other = KeySet.import_key_set({"keys": [stranger]})
    with pytest.raises(BadSignatureError):
        jwt.decode(issued.token, other, algorithms=["ES256"])


def test_async_broker_has_the_same_surface(broker: QuickstartBroker, key: ToolKey) -> None:
    subject = broker.subject_token()

    async def main() -> tuple[str, str | None]:
        async with AsyncBroker(broker.socket) as c:
            assert (await c.info()).issuer == broker.issuer
            issued = await c.derive(subject, "summarize", "notes.read", broker.resource, key=key)
            try:
                await c.derive(subject, "summarize", "notes.delete", broker.resource, key=key)
            except AccessDenied as e:
                return issued.scope, e.reason
            raise AssertionError("notes.delete in summarize was issued")

    assert anyio.run(main) == ("notes.read", "step_not_allowed")


def test_policy_denial_raises_access_denied_with_the_reason(
    broker: QuickstartBroker, key: ToolKey
) -> None:
    subject = broker.subject_token()
    with Broker(broker.socket) as c:
        with pytest.raises(AccessDenied) as e:
            c.derive(subject, "summarize", "notes.delete", broker.resource, key=key)
        assert e.value.status == 403
        assert e.value.error == "access_denied"
        assert e.value.reason == "step_not_allowed"
        assert e.value.description
        with pytest.raises(AccessDenied) as e:
            c.derive(subject, "summarize", "no.such.tool", broker.resource, key=key)
        assert e.value.reason == "tool_not_allowed"
        # In the step meant for it the policy allows the delete, and the
        # quick start makes it wait for the person's approval of the call,
        # which says what it deletes.
        with pytest.raises(LinkRequired) as link:
            c.derive(
                subject,
                "cleanup_confirmed",
                "notes.delete",
                broker.resource,
                key=key,
                authorization_details=[{"type": "notes", "which": "all"}],
            )
        assert link.value.reason == "approval"
        assert link.value.link.uri.startswith(f"{broker.issuer}/connect/")
        # Positive control: a tool in its listed step is issued.
        issued = c.derive(subject, "summarize", "notes.read", broker.resource, key=key)
        assert issued.scope == "notes.read"


def test_a_bad_subject_token_or_target_raises_invalid_request(
    broker: QuickstartBroker, key: ToolKey
) -> None:
    with Broker(broker.socket) as c:
        with pytest.raises(InvalidRequest) as e:
            c.derive("not-a-jwt", "summarize", "notes.read", broker.resource, key=key)
        assert (e.value.status, e.value.error) == (400, "invalid_request")
        with pytest.raises(InvalidRequest) as e:
            c.derive(broker.subject_token(), "summarize", "notes.read", "http://x/#frag", key=key)
        assert e.value.error == "invalid_target"
        # Positive control.
        c.derive(broker.subject_token(), "summarize", "notes.read", broker.resource, key=key)


def test_authorization_details_are_sent_only_when_given(
    broker: QuickstartBroker, key: ToolKey
) -> None:
    # The member reaches the broker: notes.read declares no details type,
    # so the broker refuses them (RFC 9396 section 5) rather than ignoring
    # what was asked for.
    details = [{"type": "notes", "actions": ["delete"]}]
    with Broker(broker.socket) as c:
        with pytest.raises(InvalidRequest) as e:
            c.derive(
                broker.subject_token(),
                "summarize",
                "notes.read",
                broker.resource,
                authorization_details=details,
                key=key,
            )
        assert (e.value.status, e.value.error) == (400, "invalid_authorization_details")
        # Positive control: without it, the same call is issued.
        c.derive(broker.subject_token(), "summarize", "notes.read", broker.resource, key=key)


def test_no_broker_on_the_socket_raises_broker_not_running(tmp_path: Path, key: ToolKey) -> None:
    missing = tmp_path / "nothing.sock"
    with Broker(missing) as c, pytest.raises(BrokerNotRunning) as e:
        c.derive("t", "s", "t", "http://r", key=key)
    assert str(missing) in str(e.value)
    assert "No such file" in str(e.value)
    # A socket file nobody listens on (a broker that died).
    import socket as so

    stale = tmp_path / "stale.sock"
    s = so.socket(so.AF_UNIX)
    s.bind(str(stale))
    s.close()
    with Broker(stale) as c, pytest.raises(BrokerNotRunning) as e:
        c.info()
    assert "refused" in str(e.value).lower()

    async def main() -> None:
        async with AsyncBroker(missing) as c:
            await c.info()

    with pytest.raises(BrokerNotRunning):
        anyio.run(main)


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def other_api_version(tmp_path: Path) -> Iterator[Path]:
    """A socket that answers /v1/info as a broker of API version 2 would:
    the library must refuse it by name before it sends anything else."""
    seen: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = json.dumps(
                {
                    "api_version": "2",
                    "broker_version": "9.0.0",
                    "issuer": "http://127.0.0.1:1",
                    "derive_htu": "http://127.0.0.1:1/v1/derive",
                    "token_htu": "http://127.0.0.1:1/token",
                    "dpop_signing_alg_values_supported": ["ES256"],
                    "dpop_nonce_required": False,
                }
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            seen.append(self.path)
            self.send_response(500)
            self.end_headers()

        def address_string(self) -> str:
            return "unix"

        def log_message(self, *a: Any) -> None:
            pass

    path = tmp_path / "v2.sock"
    srv = _UnixHTTPServer(str(path), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield path
    srv.shutdown()
    srv.server_close()
    assert seen == ["/v1/info"], seen


def test_a_broker_of_another_api_version_is_refused_by_name(
    other_api_version: Path, broker: QuickstartBroker, key: ToolKey
) -> None:
    with Broker(other_api_version) as c, pytest.raises(IncompatibleBroker) as e:
        c.derive("t", "summarize", "notes.read", "http://r", key=key)
    assert "'2'" in str(e.value) and "'1'" in str(e.value)
    assert e.value.api_version == "2"
    # Positive control: the real broker's version is accepted.
    with Broker(broker.socket) as c:
        assert c.info().api_version == "1"
