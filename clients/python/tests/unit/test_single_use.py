"""Single-use tokens (an ``each_call`` approval's): accepted once by the
verifier, through a store that inserts (``iss``, ``jti``) if absent, fails
closed and never evicts a live entry; the in-memory store by default, an
async store for ``verify_async``, and an SQLite file shared by two processes
(each accepting the token at most once between them)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import ECKey

import credbroker_client
from credbroker_client import ToolKey
from credbroker_client.request import BoundRequest, bind
from credbroker_client.single_use import (
    MemorySingleUseStore,
    SingleUseStoreFull,
    SQLiteSingleUseStore,
)
from credbroker_client.verify import SKEW, Verifier, VerifyError

ISSUER = "https://broker.example"
AUDIENCE = "https://notes.example/notes"
ISSUER_KEY = ECKey.generate_key("P-256")
JWKS = {"keys": [{**ISSUER_KEY.as_dict(private=False), "kid": "k1"}]}
TOOL = ToolKey.generate()
#: Where the worker processes import the package from.
SRC = str(Path(credbroker_client.__file__).resolve().parents[1])


def token(*, single_use: bool = True, jti: str | None = None, exp_in: int = 60) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": AUDIENCE,
        "jti": jti or str(uuid.uuid4()),
        "iat": now,
        "exp": now + exp_in,
        "scope": "notes.delete",
        "cnf": {"jkt": TOOL.thumbprint},
        "act": {"sub": "agent-1", "tool": "notes.delete", "step": "cleanup"},
    }
    if single_use:
        claims |= {
            "single_use": True,
            "approval_id": "apr-1",
            "authorization_details": [{"type": "notes", "identifier": "note-7"}],
        }
    return jwt.encode({"typ": "at+jwt", "alg": "ES256", "kid": "k1"}, claims, ISSUER_KEY)


def present(v: Verifier, t: str) -> str:
    """One request with the token and a fresh proof: ``ok`` or the code."""
    try:
        v.verify("DELETE", AUDIENCE, f"DPoP {t}", [TOOL.proof("DELETE", AUDIENCE, t)])
        return "ok"
    except VerifyError as e:
        return e.code


def test_a_single_use_token_is_accepted_once_and_an_ordinary_one_again() -> None:
    v = Verifier(ISSUER, AUDIENCE, JWKS)
    t = token()
    who = v.verify("DELETE", AUDIENCE, f"DPoP {t}", [TOOL.proof("DELETE", AUDIENCE, t)])
    assert (who.single_use, who.approval_id, who.step) == (True, "apr-1", "cleanup")
    assert who.authorization_details == [{"type": "notes", "identifier": "note-7"}]
    with pytest.raises(VerifyError) as e:
        v.verify("DELETE", AUDIENCE, f"DPoP {t}", [TOOL.proof("DELETE", AUDIENCE, t)])
    assert (e.value.code, e.value.status) == ("invalid_token", 401)
    assert "already used" in e.value.description
    # Control: a token not marked single-use serves twice (fresh proofs).
    plain = token(single_use=False)
    assert [present(v, plain), present(v, plain)] == ["ok", "ok"]
    again = v.verify("DELETE", AUDIENCE, f"DPoP {plain}", [TOOL.proof("DELETE", AUDIENCE, plain)])
    assert (again.single_use, again.approval_id, again.authorization_details) == (
        False,
        None,
        None,
    )


def test_a_token_bound_to_one_request_serves_that_request_once() -> None:
    """Check 20 of docs/RESOURCE-SERVERS.md: a token carrying ``req_sha256``
    is refused without the request's body, and for another request, each
    time without being used up; the bound request (its JSON members in
    another order) is served once; the same token without the claim is
    accepted without a body (control)."""
    v = Verifier(ISSUER, AUDIENCE, JWKS)
    url = AUDIENCE + "?dry_run=0"
    ct = "application/json"
    body = b'{"note": "note-7", "reason": "duplicate"}'
    digest = bind(BoundRequest("POST", "/notes", "dry_run=0", ct, body)).sha256
    now = int(time.time())
    base = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": AUDIENCE,
        "jti": str(uuid.uuid4()),
        "iat": now,
        "exp": now + 60,
        "scope": "notes.delete",
        "cnf": {"jkt": TOOL.thumbprint},
        "act": {"sub": "agent-1", "tool": "notes.delete"},
        "single_use": True,
    }
    header = {"typ": "at+jwt", "alg": "ES256", "kid": "k1"}
    bound = jwt.encode(header, {**base, "req_sha256": digest}, ISSUER_KEY)

    def call(u: str, t: str, b: bytes | None, c: str | None = ct, m: str = "POST") -> str:
        try:
            who = v.verify(m, u, f"DPoP {t}", [TOOL.proof(m, u, t)], content_type=c, body=b)
            assert who.req_sha256 == (digest if t == bound else None)
            return "ok"
        except VerifyError as e:
            return e.code

    refused = [
        call(url, bound, None),  # no body handed over
        call(url, bound, body.replace(b"7", b"8")),  # one body byte
        call(AUDIENCE, bound, body),  # no query
        call(url + "&x=1", bound, body),  # a query parameter added
        call(url, bound, body, "text/plain"),  # another content type
        call(url, bound, body, None),  # no content type
        call(url, bound, body, m="PUT"),  # another method
        call(url, bound, b'{"note":"note-7","note":"x"}'),  # not I-JSON
    ]
    assert refused == ["invalid_token"] * len(refused)
    # Not used up by any of them: the bound request, reordered, once.
    reordered = b'{"reason":"duplicate","note":"note-7"}'
    assert [call(url, bound, reordered), call(url, bound, body)] == ["ok", "invalid_token"]
    # Control: without the claim no body is needed.
    assert call(url, jwt.encode(header, {**base, "jti": "other"}, ISSUER_KEY), None) == "ok"


async def _async_bound(v: Verifier, t: str, url: str, body: bytes) -> str:
    try:
        await v.verify_async(
            "POST",
            url,
            f"DPoP {t}",
            [TOOL.proof("POST", url, t)],
            content_type="application/json",
            body=body,
        )
        return "ok"
    except VerifyError as e:
        return e.code


def test_verify_async_checks_the_bound_request_too() -> None:
    v = Verifier(ISSUER, AUDIENCE, JWKS)
    body = b'{"a":1}'
    digest = bind(BoundRequest("POST", "/notes", "", "application/json", body)).sha256
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": AUDIENCE,
        "jti": str(uuid.uuid4()),
        "iat": now,
        "exp": now + 60,
        "scope": "notes.delete",
        "cnf": {"jkt": TOOL.thumbprint},
        "act": {"sub": "agent-1"},
        "single_use": True,
        "req_sha256": digest,
    }
    t = jwt.encode({"typ": "at+jwt", "alg": "ES256", "kid": "k1"}, claims, ISSUER_KEY)
    got = [
        asyncio.run(_async_bound(v, t, AUDIENCE, b'{"a":2}')),
        asyncio.run(_async_bound(v, t, AUDIENCE, b'{ "a" : 1 }')),
        asyncio.run(_async_bound(v, t, AUDIENCE, body)),
    ]
    assert got == ["invalid_token", "ok", "invalid_token"]


def test_the_memory_store_fails_closed_when_full_and_never_evicts_early() -> None:
    s = MemorySingleUseStore(capacity=2)
    assert s.insert_if_absent(ISSUER, "a", 100, now=10)
    assert not s.insert_if_absent(ISSUER, "a", 100, now=10)
    # The key is (iss, jti): another issuer's "a" is another entry.
    assert s.insert_if_absent("https://other.example", "a", 50, now=10)
    with pytest.raises(SingleUseStoreFull):
        s.insert_if_absent(ISSUER, "b", 100, now=10)
    # Full did not evict: "a" is still held, and so refused.
    assert not s.insert_if_absent(ISSUER, "a", 100, now=49)
    # Once the other entry expired (at 50), its room is reused.
    assert s.insert_if_absent(ISSUER, "b", 100, now=50)
    assert not s.insert_if_absent(ISSUER, "a", 100, now=99)
    assert len(s) == 2


def test_a_full_or_failing_store_refuses_the_single_use_token_only() -> None:
    full = MemorySingleUseStore(capacity=1)
    v = Verifier(ISSUER, AUDIENCE, JWKS, single_use_store=full)
    assert present(v, token()) == "ok"
    with pytest.raises(VerifyError) as e:
        t = token()
        v.verify("DELETE", AUDIENCE, f"DPoP {t}", [TOOL.proof("DELETE", AUDIENCE, t)])
    assert (e.value.code, e.value.status, e.value.challenge()) == (
        "replay_store_unavailable",
        503,
        None,
    )
    # Control: a token that is not single-use does not need the store.
    assert present(v, token(single_use=False)) == "ok"

    class Broken:
        def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
            raise OSError("disk full")

    class Odd:
        def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
            return 1  # type: ignore[return-value]

    for store in (Broken(), Odd()):
        v = Verifier(ISSUER, AUDIENCE, JWKS, single_use_store=store)
        assert present(v, token()) == "replay_store_unavailable"
        assert present(v, token(single_use=False)) == "ok"


def test_the_store_keeps_the_token_until_its_expiry_and_skew() -> None:
    seen: list[tuple[str, str, int]] = []

    class Recording(MemorySingleUseStore):
        def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
            seen.append((iss, jti, expires_at))
            return super().insert_if_absent(iss, jti, expires_at, now)

    v = Verifier(ISSUER, AUDIENCE, JWKS, single_use_store=Recording())
    t = token(jti="jti-1", exp_in=60)
    who = v.verify("DELETE", AUDIENCE, f"DPoP {t}", [TOOL.proof("DELETE", AUDIENCE, t)])
    assert seen == [(ISSUER, "jti-1", who.exp + SKEW)]


def test_an_async_store_in_verify_async_and_refused_by_verify() -> None:
    class AsyncStore:
        def __init__(self) -> None:
            self.inner = MemorySingleUseStore()

        async def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
            await asyncio.sleep(0)
            return self.inner.insert_if_absent(iss, jti, expires_at, now)

    v = Verifier(ISSUER, AUDIENCE, JWKS, single_use_store=AsyncStore())
    t = token()

    async def twice() -> list[str]:
        out = []
        for _ in range(2):
            try:
                await v.verify_async(
                    "DELETE", AUDIENCE, f"DPoP {t}", [TOOL.proof("DELETE", AUDIENCE, t)]
                )
                out.append("ok")
            except VerifyError as e:
                out.append(e.code)
        return out

    assert asyncio.run(twice()) == ["ok", "invalid_token"]
    # The sync verify cannot await it: refused, not accepted unrecorded.
    assert present(v, token()) == "replay_store_unavailable"
    assert present(v, token(single_use=False)) == "ok"


WORKER = """
import json, sys, time
from pathlib import Path
from credbroker_client.single_use import SQLiteSingleUseStore
from credbroker_client.verify import Verifier, VerifyError
job = json.loads(sys.stdin.read())
v = Verifier(job["issuer"], job["audience"], job["jwks"],
             single_use_store=SQLiteSingleUseStore(job["db"]))
while not Path(job["go"]).exists():
    time.sleep(0.001)
out = []
for auth, proof in job["requests"]:
    try:
        v.verify("DELETE", job["audience"], auth, [proof])
        out.append("ok")
    except VerifyError as e:
        out.append(e.code)
print(json.dumps(out))
"""


def test_two_processes_sharing_an_sqlite_store_accept_the_token_once(tmp_path: Path) -> None:
    db, go = tmp_path / "single-use.db", tmp_path / "go"
    shared = token()
    own = [token(), token()]
    procs = []
    for i in range(2):
        job = {
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "jwks": JWKS,
            "db": str(db),
            "go": str(go),
            # The shared token (with this process's own proof), then a
            # single-use token only this process sees: the control.
            "requests": [
                [f"DPoP {t}", TOOL.proof("DELETE", AUDIENCE, t)] for t in (shared, own[i])
            ],
        }
        p = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": SRC},
        )
        assert p.stdin is not None
        p.stdin.write(json.dumps(job))
        p.stdin.close()
        procs.append(p)
    time.sleep(0.5)  # time for both to start, so that they race (either order must hold)
    go.touch()
    answers = []
    for p in procs:
        assert p.stdout is not None
        out = p.stdout.read()
        assert p.wait(timeout=60) == 0, out
        answers.append(json.loads(out))
    firsts = sorted(a[0] for a in answers)
    assert firsts == ["invalid_token", "ok"], answers
    assert [a[1] for a in answers] == ["ok", "ok"], answers
    # The file holds the three tokens; a third process opening it refuses
    # the shared one too.
    v = Verifier(ISSUER, AUDIENCE, JWKS, single_use_store=SQLiteSingleUseStore(db))
    assert present(v, shared) == "invalid_token"
    assert present(v, token()) == "ok"


def _open_store_at_once(path: str, barrier: Any, errors: Any) -> None:
    barrier.wait()
    try:
        SQLiteSingleUseStore(path, timeout=5).close()
        errors.put("")
    except sqlite3.Error as e:  # reported to the test, which names it
        errors.put(repr(e))


def test_workers_starting_together_on_a_new_sqlite_file_all_open_it(tmp_path: Path) -> None:
    # Four processes opening the same new file at once: switching it to WAL
    # answered "database is locked" at once in some rounds (4 of 60 here
    # before the set-up was retried), so a worker failed to start.
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for round_ in range(60):
        path = str(tmp_path / f"round-{round_}.db")
        barrier, errors = ctx.Barrier(4), ctx.Queue()
        procs = [
            ctx.Process(target=_open_store_at_once, args=(path, barrier, errors)) for _ in range(4)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        found = [errors.get(timeout=5) for _ in procs]
        assert found == ["", "", "", ""], f"round {round_}: {found}"
    # Control: the store opened by those workers works as one.
    store = SQLiteSingleUseStore(str(tmp_path / "round-0.db"))
    assert store.insert_if_absent(ISSUER, "j", int(time.time()) + 60, time.time())
    assert not store.insert_if_absent(ISSUER, "j", int(time.time()) + 60, time.time())
    store.close()
