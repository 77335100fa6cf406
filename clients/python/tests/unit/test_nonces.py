"""DPoP nonces, one store per origin (credbroker_client.nonces), without a
broker binary: the socket, resource servers and authorization servers each
get back only the nonce they gave."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import httpx

from credbroker_client import AsyncBroker, Broker, DPoPAuth, NonceStore, ToolKey
from credbroker_client.nonces import challenge, origin_of, socket_origin

from .fake_servers import NonceServer, fake_broker, token_answer, transport


def bound_token(key: ToolKey) -> str:
    return str(token_answer(key.thumbprint)["access_token"])


def test_an_origin_is_scheme_host_and_port() -> None:
    assert origin_of("https://A.example/x?y#z") == "https://a.example:443"
    assert origin_of("https://a.example:443/") == origin_of("https://a.example/other")
    assert origin_of("http://a.example/") == "http://a.example:80"
    assert origin_of("https://a.example:8443/") != origin_of("https://a.example/")
    assert origin_of("http://[::1]:8080/p") == "http://[::1]:8080"
    assert socket_origin("relative.sock").startswith("unix:/")


def test_what_counts_as_a_nonce_challenge() -> None:
    www = {"www-authenticate": 'DPoP error="use_dpop_nonce"', "dpop-nonce": "n"}
    assert challenge(401, www) == "n"
    assert challenge(400, www) == "n"
    assert challenge(400, {"dpop-nonce": "n"}, b'{"error": "use_dpop_nonce"}') == "n"
    # Not a challenge: no nonce, another error, another status, a 401 body.
    assert challenge(401, {"www-authenticate": www["www-authenticate"]}) is None
    assert challenge(401, {**www, "www-authenticate": 'DPoP error="invalid_token"'}) is None
    assert challenge(200, www) is None
    assert challenge(401, {"dpop-nonce": "n"}, b'{"error": "use_dpop_nonce"}') is None
    assert challenge(400, {"dpop-nonce": "n"}, b"not json") is None


def test_the_store_keeps_one_nonce_per_origin() -> None:
    s = NonceStore()
    s.update("https://a.example:443", {"dpop-nonce": "a1"})
    s.update("https://b.example:443", {"other": "x"})
    assert s.get("https://a.example:443") == "a1"
    assert s.get("https://b.example:443") is None
    s.update("https://a.example:443", {"dpop-nonce": "a2"})
    assert s.get("https://a.example:443") == "a2"
    assert "a2" not in repr(s)


def test_dpop_auth_sends_each_server_only_its_own_nonce() -> None:
    key = ToolKey.generate()
    rs = NonceServer("rs")
    az = NonceServer("as", style="authorization")
    with httpx.Client(transport=transport({"rs.example": rs, "as.example": az})) as http:
        auth = DPoPAuth(bound_token(key), key)
        # Each first request is challenged once, then sent again with that
        # server's nonce; the answer is the retry's.
        assert http.get("https://rs.example/notes", auth=auth).status_code == 200
        assert rs.seen == [None, "rs-n1"]
        assert http.post("https://as.example/token", auth=auth).status_code == 200
        assert az.seen == [None, "as-n1"]
        # Later requests carry the latest nonce of their own origin only.
        assert http.get("https://rs.example/notes/2", auth=auth).status_code == 200
        assert http.post("https://as.example/token", auth=auth).status_code == 200
        assert rs.seen == [None, "rs-n1", "rs-n2"]
        assert az.seen == [None, "as-n1", "as-n2"]


def test_a_shared_store_carries_nonces_between_signers_and_async_clients() -> None:
    key = ToolKey.generate()
    rs = NonceServer("rs")
    store = NonceStore()

    async def run() -> None:
        async with httpx.AsyncClient(transport=transport({"rs.example": rs})) as http:
            first = DPoPAuth(bound_token(key), key, nonces=store)
            assert (await http.get("https://rs.example/a", auth=first)).status_code == 200
            # Another signer on the same store starts with the nonce it holds.
            second = DPoPAuth(bound_token(key), key, nonces=store)
            assert (await http.get("https://rs.example/b", auth=second)).status_code == 200

    asyncio.run(run())
    assert rs.seen == [None, "rs-n1", "rs-n2"]
    # Positive control for the store's keying: a signer of its own starts afresh.
    with httpx.Client(transport=transport({"rs.example": rs})) as http:
        assert http.get("https://rs.example/c", auth=DPoPAuth(bound_token(key), key)).status_code
    assert rs.seen[-2:] == [None, "rs-n4"]


def test_the_broker_socket_is_an_origin_of_its_own() -> None:
    key = ToolKey.generate()
    sock_nonces = NonceServer("sock")
    store = NonceStore()
    # A nonce the broker's public origin gave (its proxy) is not the socket's.
    store.update("http://127.0.0.1:8440", {"dpop-nonce": "proxy-n9"})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "b.sock"
        with fake_broker(path, sock_nonces, key.thumbprint):
            with Broker(path, nonces=store) as b:
                issued = b.derive("subject", "summarize", "notes.read", "https://n", key=key)
                assert issued.token_type == "DPoP"
                b.derive("subject", "summarize", "notes.read", "https://n", key=key)
            assert sock_nonces.seen == [None, "sock-n1", "sock-n2"]
            assert store.get(socket_origin(path)) == "sock-n3"
            assert store.get("http://127.0.0.1:8440") == "proxy-n9"

            async def run() -> None:
                ab = AsyncBroker(path, nonces=store)
                try:
                    await ab.derive("subject", "summarize", "notes.read", "https://n", key=key)
                finally:
                    await ab.aclose()

            # The async broker on the same store sends the socket's latest at once.
            asyncio.run(run())
            assert sock_nonces.seen[-1] == "sock-n3"
