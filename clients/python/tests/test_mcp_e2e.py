"""credbroker.mcp end to end: an MCPServer (tests/mcp_link_server.py) whose
tool derives for a service not yet connected (oidc-provider plays it),
called by the real `mcp` client (tests/mcp/mcp_client.py) in both protocol
versions: 2025-11-25 gets the -32042 URL elicitation error, 2026-07-28 the
input_required URL elicitation, and its retry reaches the tool again."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, QuickstartBroker, free_port, poll

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def mcp_url(acme: QuickstartBroker) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "mcp_link_server.py"),
            str(port),
            str(acme.socket),
            acme.issuer,
            str(acme.dir / "dev-issuer-jwks.json"),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])},
    )

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError("the MCP server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), 1):
                return True
        except OSError:
            return False

    poll("the MCP server listening", up)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(timeout=10)


def run_client(tmp_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    r = subprocess.run(
        [sys.executable, str(REPO / "tests" / "mcp" / "mcp_client.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def token_file(tmp_path: Path, b: QuickstartBroker) -> str:
    p = tmp_path / "person.token"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b.subject_token().encode())
    os.close(fd)
    return str(p)


def test_2025_11_25_the_tool_call_fails_with_the_url_elicitation(
    acme: QuickstartBroker,
    mcp_url: str,
    tmp_path: Path,
) -> None:
    out = run_client(
        tmp_path,
        {
            "url": mcp_url,
            "token_file": token_file(tmp_path, acme),
            "mode": "legacy",
            "scenario": "call",
        },
    )
    assert out["protocol_version"] == "2025-11-25"
    assert out["tools"] == ["list_repositories"]
    (call,) = out["calls"]
    err = call["error"]
    assert err["code"] == -32042, call
    (el,) = err["data"]["elicitations"]
    assert el["mode"] == "url" and el["url"].startswith(f"{acme.issuer}/connect/")
    assert el["elicitationId"] and el["elicitationId"] not in el["url"]
    assert el["url"] in el["message"] and el["url"] in err["message"]


def test_2026_07_28_input_required_is_answered_and_the_retry_reaches_the_tool(
    acme: QuickstartBroker,
    mcp_url: str,
    tmp_path: Path,
) -> None:
    out = run_client(
        tmp_path,
        {
            "url": mcp_url,
            "token_file": token_file(tmp_path, acme),
            "mode": "auto",
            "scenario": "call",
            "answers": ["decline"],
        },
    )
    assert out["protocol_version"] == "2026-07-28"
    (seen,) = out["links"]
    assert seen["via"] == "elicitation_callback"
    assert seen["params"]["mode"] == "url"
    assert seen["params"]["url"].startswith(f"{acme.issuer}/connect/")
    (call,) = out["calls"]
    # The client retried with the person's answer and the sealed state; the
    # tool saw the answer (a decline: nothing is derived or called).
    text = call["result"]["content"][0]["text"]
    assert text == "the person answered decline; nothing was called", call
