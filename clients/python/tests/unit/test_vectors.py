"""The shared verifier vectors (tests/vectors/resource-server.json, written
and checked against credbroker::verify by tests/it/interop/vectors.rs): the
Python verifier reaches every verdict the Rust one does."""

from __future__ import annotations

import json
from typing import Any

from conftest import REPO

from credbroker_client.verify import Verifier, VerifyError

VECTORS = REPO / "tests" / "vectors" / "resource-server.json"


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
    v = json.loads(VECTORS.read_text(encoding="utf-8"))
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
