"""The shared verifier vectors (tests/vectors/resource-server.json, written
and checked against credbroker::verify by tests/it/interop/vectors.rs): the
Python verifier reaches every verdict the Rust one does, and every
sequence's verdicts and results, through ``verify`` and ``verify_async``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from conftest import REPO

from credbroker_client.verify import Principal, Verifier, VerifyError

VECTORS = REPO / "tests" / "vectors" / "resource-server.json"


def vectors() -> dict[str, Any]:
    v: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8"))
    return v


def verdict(v: dict[str, Any], case: dict[str, Any]) -> str:
    verifier = Verifier(v["issuer"], v["audience"], v["jwks"], clock=lambda: float(case["now"]))
    last = ""
    for _ in range(case["times"]):
        try:
            verifier.verify(case["method"], case["url"], case["authorization"], case["dpop"])
            last = "ok"
        except VerifyError as e:
            last = e.code
    return last


def test_the_python_verifier_agrees_with_the_shared_vectors() -> None:
    v = vectors()
    cases = v["cases"]
    wrong = [
        f"{c['name']}: {got}, want {c['verdict']}"
        for c in cases
        if (got := verdict(v, c)) != c["verdict"]
    ]
    assert not wrong, wrong
    # Both outcomes are in the file, so the comparison could fail either way.
    assert {c["verdict"] for c in cases} == {"ok", "invalid_token", "invalid_dpop_proof"}
    assert len(cases) >= 30


def result_of(p: Principal) -> dict[str, Any]:
    return {
        "single_use": p.single_use,
        "approval_id": p.approval_id,
        "authorization_details": p.authorization_details,
        "step": p.step,
    }


def sequence_errors(v: dict[str, Any], seq: dict[str, Any], *, use_async: bool) -> list[str]:
    """Each request of the sequence sent in order to one fresh verifier: what
    differs from the file (verdict, and the result of an accepted one)."""
    now = [0.0]
    verifier = Verifier(v["issuer"], v["audience"], v["jwks"], clock=lambda: now[0])
    wrong = []
    for i, r in enumerate(seq["requests"]):
        now[0] = float(r["now"])
        args = (r["method"], r["url"], r["authorization"], r["dpop"])
        # A request with a body hands it over (a token bound to one request).
        given: dict[str, Any] = {"content_type": r.get("content_type"), "body": r.get("body")}
        try:
            if use_async:
                who = asyncio.run(verifier.verify_async(*args, **given))
            else:
                who = verifier.verify(*args, **given)
            got, result = "ok", result_of(who)
        except VerifyError as e:
            got, result = e.code, None
        if got != r["verdict"] or (got == "ok" and result != r["result"]):
            wrong.append(f"{seq['name']} request {i}: {got} {result}, want {r['verdict']}")
    return wrong


def test_the_python_verifier_agrees_with_the_shared_sequences() -> None:
    v = vectors()
    seqs = v["sequences"]
    for use_async in (False, True):
        wrong = [w for s in seqs for w in sequence_errors(v, s, use_async=use_async)]
        assert not wrong, (use_async, wrong)
    names = {s["name"] for s in seqs}
    assert {
        "single_use_token_presented_twice",
        "ordinary_token_presented_twice",
        "single_use_token_bound_to_one_request",
    } <= names
    # Negative control of the comparison: the single-use token's second
    # request replaced by its first (the same proof again) differs.
    twice = dict(seqs[0])
    assert twice["name"] == "single_use_token_presented_twice"
    twice["requests"] = [twice["requests"][0], twice["requests"][0]]
    assert len(sequence_errors(v, twice, use_async=False)) == 1
