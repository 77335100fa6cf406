"""Request binding against proto/request-binding-vectors.json (the file the
Rust implementation is tested against): every digest vector's hashed body,
digest input and req_sha256; every refused body with the proxy's reason;
RFC 8785's examples and Appendix B's numbers."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from conftest import REPO

from credbroker_client import Broker, BrokerNotRunning, ToolKey
from credbroker_client.request import (
    BoundRequest,
    RequestError,
    bind,
    canonicalize,
    digest_input,
    hashed_body,
)

VECTORS: dict[str, Any] = json.loads(
    (REPO / "proto" / "request-binding-vectors.json").read_text(encoding="utf-8")
)


def request_of(r: dict[str, str]) -> BoundRequest:
    return BoundRequest(r["method"], r["path"], r["query"], r["content_type"], r["body"])


@pytest.mark.parametrize("v", VECTORS["digest"], ids=lambda v: v["name"])
def test_every_digest_vector(v: dict[str, Any]) -> None:
    r = request_of(v["request"])
    hashed = hashed_body(r.content_type, r.body_bytes())
    assert hashed == v["hashed_body"].encode("utf-8")
    assert digest_input(r, hashed).hex() == v["digest_input_hex"]
    b = bind(r)
    assert (b.body, b.sha256) == (hashed, v["req_sha256"])


@pytest.mark.parametrize("v", VECTORS["refused"], ids=lambda v: v["name"])
def test_every_refused_body(v: dict[str, Any]) -> None:
    with pytest.raises(RequestError) as e:
        bind(request_of(v["request"]))
    assert e.value.reason == v["error"]


def test_the_refusals_have_their_controls() -> None:
    # The refused file holds each kind of refusal; their controls (the
    # same request made bindable) pass, so the refusals are about the body.
    assert len(VECTORS["refused"]) >= 14
    ok = BoundRequest("POST", "/v1/payments", "", "application/json", '{"to":"bob@example.com"}')
    assert bind(ok).body == b'{"to":"bob@example.com"}'
    ok_deep = "[" * 32 + "]" * 32
    assert canonicalize(ok_deep.encode()) == ok_deep.encode()
    assert canonicalize(b"9007199254740991") == b"9007199254740991"
    assert canonicalize(b'"\\ud83d\\ude00"') == '"\U0001f600"'.encode()


@pytest.mark.parametrize("v", VECTORS["rfc8785"], ids=lambda v: v["name"])
def test_rfc8785_examples(v: dict[str, Any]) -> None:
    # The serialisation alone (the RFC's numbers have more digits than
    # their doubles hold), then the I-JSON check's verdict on the input.
    assert rfc8785.dumps(json.loads(v["input"])) == v["output"].encode("utf-8")
    if v["ijson"]:
        assert canonicalize(v["input"].encode("utf-8")) == v["output"].encode("utf-8")
    else:
        with pytest.raises(RequestError):
            canonicalize(v["input"].encode("utf-8"))


@pytest.mark.parametrize("v", VECTORS["numbers"], ids=lambda v: v["ieee_hex"])
def test_rfc8785_appendix_b_numbers(v: dict[str, Any]) -> None:
    (x,) = struct.unpack(">d", bytes.fromhex(v["ieee_hex"]))
    if v["serialized"] is None:
        assert not math.isfinite(x)
        with pytest.raises(rfc8785.CanonicalizationError):
            rfc8785.dumps(x)
        return
    assert rfc8785.dumps(x) == v["serialized"].encode()
    # ECMAScript's text of a double is the shortest: the I-JSON check takes
    # it back unless it is an integer beyond 2^53 - 1.
    text = v["serialized"].encode()
    if x.is_integer() and abs(x) > 2**53 - 1:
        with pytest.raises(RequestError):
            canonicalize(text)
    else:
        assert canonicalize(text) == text


def test_a_derive_refuses_an_unbindable_request_before_sending_anything(tmp_path: Path) -> None:
    """Nothing answers on this socket: an unbindable request is refused
    before the client tries it (RequestError); a bindable one gets as far
    as the socket (BrokerNotRunning), its control."""
    key = ToolKey.generate()
    bad = BoundRequest("POST", "/v1/payments", "", "application/json", '{"to":"a","to":"b"}')
    good = BoundRequest("POST", "/v1/payments", "", "application/json", '{"to":"a"}')
    with Broker(tmp_path / "none.sock") as c:
        with pytest.raises(RequestError) as e:
            c.derive("subject", "triage", "acme.pay", "https://x.example", key=key, request=bad)
        assert e.value.reason == "body_not_ijson"
        with pytest.raises(BrokerNotRunning):
            c.derive("subject", "triage", "acme.pay", "https://x.example", key=key, request=good)
    # The member sent is the whole request, the body as text.
    assert good.to_json() == {
        "method": "POST",
        "path": "/v1/payments",
        "query": "",
        "content_type": "application/json",
        "body": '{"to":"a"}',
    }
