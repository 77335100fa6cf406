"""credbroker_client.mcp end to end: an MCPServer (tests/mcp_link_server.py) whose
tool derives for a service not yet connected (oidc-provider plays it),
called by the real `mcp` client (tests/mcp/mcp_client.py) in both protocol
versions: 2025-11-25 gets the -32042 URL elicitation error, 2026-07-28 the
input_required URL elicitation, and its retry reaches the tool again.

Then the whole flow with the link opened in Chromium
(tests/peers/mcp_open_link.mjs, playwright-core on Debian's chromium) by
the person it was made for: she signs in with her local account on the
broker's page, accepts the offer, connects at the provider (oidc-provider),
and the retry is served: the broker issues the tool's token, which the
provider's userinfo endpoint knows as her provider account. The same link
opened in another person's browser connects nothing, and the retry is
refused with a new link (the negative, before the positive control)."""

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
from conftest import (
    REPO,
    QuickstartBroker,
    browser_of,
    free_port,
    poll,
    provider_account,
    require_browser,
)

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
            str(acme.service_issuer),
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


def token_file(tmp_path: Path, b: QuickstartBroker, sub: str = "alice") -> str:
    p = tmp_path / f"{sub}.token"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b.subject_token(sub).encode())
    os.close(fd)
    return str(p)


def browser_done(link: dict[str, Any]) -> str:
    for line in link.get("open", {}).get("lines", []):
        if "done" in line:
            return str(line["done"])
    raise AssertionError(f"the browser did not finish: {link}")


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


def test_2025_11_25_link_opened_in_chromium_then_the_manual_retry_is_served(
    acme: QuickstartBroker,
    mcp_url: str,
    tmp_path: Path,
) -> None:
    require_browser()
    bob = acme.local_account("bob", tmp_path)
    mallory = acme.local_account("mallory", tmp_path)
    spec = {"url": mcp_url, "token_file": token_file(tmp_path, acme, "bob"), "mode": "legacy"}
    # Negative: Bob's link opened in Mallory's browser (she signs in as
    # herself) reaches the other-person page; Bob's retry is refused with
    # the elicitation again, and Mallory connected nothing.
    provider_account(acme, "octo-mallory")
    out = run_client(
        tmp_path,
        {
            **spec,
            "scenario": "flow",
            "open": browser_of(tmp_path, "mallory", mallory),
            "answers": ["accept", "decline"],
        },
    )
    assert out["protocol_version"] == "2025-11-25"
    assert browser_done(out["links"][0]) == "other_person", out
    assert [c["error"]["code"] for c in out["calls"]] == [-32042, -32042], out
    # Positive control: Bob opens his own link in his own browser, connects
    # his provider account, and the retry gets the tool's token.
    provider_account(acme, "octo-bob")
    out = run_client(
        tmp_path,
        {
            **spec,
            "scenario": "flow",
            "open": browser_of(tmp_path, "bob", bob),
            "answers": ["accept"],
        },
    )
    (link,) = out["links"]
    assert link["via"] == "url_elicitation_required"
    assert browser_done(link) == "completed", link
    actions = [line.get("action", "") for line in link["open"]["lines"]]
    assert "local sign-in as bob" in actions and "press connect" in actions, actions
    first, retry = out["calls"]
    assert first["error"]["code"] == -32042, out
    text = retry["result"]["content"][0]["text"]
    assert text.startswith("issued a "), retry
    assert text.endswith("the provider account is octo-bob"), retry


def test_2026_07_28_link_opened_in_chromium_then_the_automatic_retry_is_served(
    acme: QuickstartBroker,
    mcp_url: str,
    tmp_path: Path,
) -> None:
    require_browser()
    carol = acme.local_account("carol", tmp_path)
    provider_account(acme, "octo-carol")
    out = run_client(
        tmp_path,
        {
            "url": mcp_url,
            "token_file": token_file(tmp_path, acme, "carol"),
            "mode": "auto",
            "scenario": "flow",
            "open": browser_of(tmp_path, "carol", carol),
            "answers": ["accept"],
        },
    )
    assert out["protocol_version"] == "2026-07-28"
    (link,) = out["links"]
    assert link["via"] == "elicitation_callback" and link["answer"] == "accept"
    assert browser_done(link) == "completed", link
    # One call as the client's caller sees it: the client answered the
    # input_required round and retried with the sealed state by itself.
    (call,) = out["calls"]
    text = call["result"]["content"][0]["text"]
    assert text.startswith("issued a "), call
    assert text.endswith("the provider account is octo-carol"), call
