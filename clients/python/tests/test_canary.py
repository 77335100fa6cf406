"""The canary: a run through every path that holds a secret (an issued
token, the subject token, the tool key, proofs, a refusal, a tool call)
with every logger at DEBUG (httpx's and httpcore's included), and none of
the secrets appears in the log records, a repr, or an exception's text."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import QuickstartBroker, ResourceServer, start_resource_server

from credbroker_client import (
    AccessDenied,
    Broker,
    BrokerNotRunning,
    DPoPAuth,
    InvalidRequest,
    ToolKey,
)


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        extra = {
            k: v
            for k, v in record.__dict__.items()
            if k not in logging.LogRecord("", 0, "", 0, "", (), None).__dict__
        }
        self.lines.append(f"{record.name} {record.getMessage()} {extra!r}")


@pytest.fixture
def capture() -> Iterator[Capture]:
    h = Capture()
    root = logging.getLogger()
    old = root.level
    root.addHandler(h)
    root.setLevel(logging.DEBUG)
    yield h
    root.removeHandler(h)
    root.setLevel(old)


@pytest.fixture(scope="module")
def notes(broker: QuickstartBroker, tmp_module: Path) -> Iterator[ResourceServer]:
    rs = start_resource_server(broker, tmp_module)
    yield rs
    rs.proc.terminate()
    rs.proc.wait(timeout=10)


def test_no_token_key_or_proof_in_logs_reprs_or_exceptions(
    broker: QuickstartBroker, notes: ResourceServer, capture: Capture, tmp_path: Path
) -> None:
    key = ToolKey.generate()
    private_d = str(key._key.as_dict(private=True)["d"])
    subject = broker.subject_token()
    shown: list[str] = []
    proofs: list[str] = []
    with Broker(broker.socket) as c:
        issued = c.derive(subject, "summarize", "notes.read", broker.resource, key=key)
        shown += [repr(issued), str(issued), repr(c), repr(key), str(key)]
        bad: Callable[[], object]
        for bad in (
            lambda: c.derive(subject, "summarize", "notes.delete", broker.resource, key=key),
            lambda: c.derive(subject + "x", "summarize", "notes.read", broker.resource, key=key),
        ):
            try:
                bad()
            except (AccessDenied, InvalidRequest) as e:
                shown += [str(e), repr(e), repr(e.args)]
    auth = DPoPAuth(issued, key)
    shown.append(repr(auth))
    with httpx.Client(
        auth=auth, event_hooks={"request": [lambda r: proofs.append(r.headers["dpop"])]}
    ) as http:
        r = http.get(notes.url)
        assert r.status_code == 200
    try:
        with Broker(tmp_path / "none.sock") as c:
            c.derive(subject, "s", "t", "http://r", key=key)
    except BrokerNotRunning as e:
        shown += [str(e), repr(e)]
    secrets = {"token": issued.token, "subject": subject, "key d": private_d, "proof": proofs[0]}
    # Positive control: the canary can see them (the run did log and did
    # hold each secret), and it finds one that is put where it looks.
    assert capture.lines, "nothing was logged: the canary would see nothing"
    assert any("derive issued" in line for line in capture.lines)
    assert any("HTTP Request" in line for line in capture.lines)
    assert proofs[0].count(".") == 2
    planted = "\n".join([*capture.lines, *shown, f"oops {issued.token}"])
    assert [n for n, s in secrets.items() if s in planted] == ["token"]
    seen = "\n".join(capture.lines + shown)
    leaks = [name for name, s in secrets.items() if s in seen]
    assert not leaks, f"{leaks} appeared in: {seen[:4000]}"
