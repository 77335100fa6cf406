"""The person's MCP client, driven by tests/it/mcp/server.rs: the real Python
`mcp` SDK (PyPI `mcp`, installed into .venv by scripts/install-test-deps)
against examples/mcp_repo_server.rs.

    python mcp_client.py SPEC.json

SPEC: {
  "url": "http://127.0.0.1:PORT/mcp",
  "token_file": "...",            # the person's access token (a file, never argv)
  "mode": "legacy" | "auto",      # 2025-11-25 via initialize | 2026-07-28 via server/discover
  "scenario": "call" | "flow" | "tamper",
  "tool": "list_repositories",    # the tool to call (optional; that one by default)
  "arguments": {...},             # tool arguments (optional)
  "elicitation": true,            # set an elicitation_callback (URL capability); default true
  "open": ["cmd", "arg", ...],    # run with the URL appended when a link must be opened
  "answers": ["accept", "decline"] # the callback's answer per round (auto mode)
}

Prints one JSON line with what happened: the negotiated protocol version, the
links seen (and what the opener printed), and the outcome of every call, as
plain JSON the Rust test asserts on.
"""

from __future__ import annotations

import json
import time
import subprocess
import sys
from typing import Any

import anyio
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.shared._httpx_utils import create_mcp_http_client

import mcp_types as types

TOOL = "list_repositories"


def dump_result(r: Any) -> dict[str, Any]:
    """A CallToolResult or InputRequiredResult as wire JSON."""
    return r.model_dump(by_alias=True, exclude_none=True, mode="json")


def dump_error(e: MCPError) -> dict[str, Any]:
    return {"code": e.code, "message": e.message, "data": e.data}


def open_link(spec: dict[str, Any], url: str) -> dict[str, Any]:
    """Opens the link the way a client must: outside the client, in a browser
    where the person is signed in (the test's opener drives Chromium)."""
    cmd = spec.get("open")
    if not cmd:
        return {"opened": False}
    p = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip().startswith("{")]
    return {"opened": True, "exit": p.returncode, "lines": lines, "stderr": p.stderr[-2000:]}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    token = open(spec["token_file"], encoding="utf-8").read().strip()
    out: dict[str, Any] = {"links": [], "calls": []}
    answers = list(spec.get("answers", ["accept"]))

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult | types.ErrorData:
        p = params.model_dump(by_alias=True, exclude_none=True, mode="json")
        seen = {"via": "elicitation_callback", "params": p}
        action = answers.pop(0) if answers else "cancel"
        if p.get("mode") == "url" and action == "accept":
            seen["open"] = open_link(spec, p["url"])
        seen["answer"] = action
        out["links"].append(seen)
        return types.ElicitResult(action=action)

    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    if spec.get("wire_log"):
        # Record the JSON-RPC bodies on the wire (requests, and responses
        # sent as application/json), so the test can check exact shapes.
        log = open(spec["wire_log"], "a", encoding="utf-8")

        async def on_request(req: Any) -> None:
            if req.method == "POST":
                log.write(json.dumps({"request": json.loads(req.content or b"null"), "headers": {
                    k: v for k, v in req.headers.items() if k.lower().startswith("mcp-")}}) + "\n")

        async def on_response(resp: Any) -> None:
            if resp.headers.get("content-type", "").startswith("application/json"):
                await resp.aread()
                log.write(json.dumps({"status": resp.status_code, "response": json.loads(resp.content or b"null")}) + "\n")
            log.flush()

        http_client.event_hooks = {"request": [on_request], "response": [on_response]}
    kwargs: dict[str, Any] = {"mode": spec["mode"]}
    if spec.get("elicitation", True):
        kwargs["elicitation_callback"] = on_elicit
    async with http_client:
        transport = streamable_http_client(spec["url"], http_client=http_client)
        async with Client(transport, **kwargs) as client:
            out["protocol_version"] = client.protocol_version
            tools = await client.list_tools()
            out["tools"] = [t.name for t in tools.tools]
            args = spec.get("arguments")
            tool = spec.get("tool", TOOL)
            scenario = spec["scenario"]
            if scenario == "call":
                try:
                    r = await client.call_tool(tool, args)
                    out["calls"].append({"result": dump_result(r)})
                except MCPError as e:
                    out["calls"].append({"error": dump_error(e)})
            elif scenario == "flow" and spec["mode"] == "legacy":
                # 2025-11-25: -32042 arrives as an error; no automatic retry.
                # The handler opens each URL, then retries by hand, as long as
                # the server keeps asking and the answers say to go on.
                for _ in range(4):
                    try:
                        r = await client.call_tool(tool, args)
                        out["calls"].append({"result": dump_result(r)})
                        break
                    except MCPError as e:
                        out["calls"].append({"error": dump_error(e)})
                        if e.code != types.URL_ELICITATION_REQUIRED:
                            break
                        parsed = UrlElicitationRequiredError.from_error(e.error)
                        action = answers.pop(0) if answers else "cancel"
                        for el in parsed.elicitations:
                            p = el.model_dump(by_alias=True, exclude_none=True, mode="json")
                            seen: dict[str, Any] = {"via": "url_elicitation_required", "params": p, "answer": action}
                            if action == "accept":
                                seen["open"] = open_link(spec, el.url)
                            out["links"].append(seen)
                        if action != "accept":
                            break
            elif scenario == "flow":
                # 2026-07-28: input_required goes to the callback, and the
                # client retries by itself with the echoed requestState.
                try:
                    r = await client.call_tool(tool, args)
                    out["calls"].append({"result": dump_result(r)})
                except MCPError as e:
                    out["calls"].append({"error": dump_error(e)})
            elif scenario == "tamper":
                # Drive the rounds by hand to alter what the client echoes.
                s = client.session
                first = await s.call_tool(tool, args, allow_input_required=True)
                out["calls"].append({"result": dump_result(first)})
                state = getattr(first, "request_state", None)
                if not state or not first.input_requests:
                    # Nothing to tamper with: fail loudly, so the test cannot
                    # pass on zero attempts.
                    raise SystemExit(f"tamper: the first answer has no requestState or input requests: {json.dumps(out)}")
                key = next(iter(first.input_requests))
                responses = {key: {"action": "accept"}}
                body, _, tag = state.partition(".")
                flipped = body[:-1] + ("A" if body[-1] != "A" else "B")
                attempts = {"genuine": state} if spec.get("only_genuine") else {
                    "tampered_body": f"{flipped}.{tag}",
                    "tampered_tag": f"{body}.{tag[:-1] + ('A' if tag[-1] != 'A' else 'B')}",
                    "no_tag": body,
                    "other_arguments": state,
                    "genuine": state,
                }
                async def attempt(name: str, sess: Any, st: str, a: Any) -> None:
                    try:
                        r = await sess.call_tool(tool, a, input_responses=responses, request_state=st, allow_input_required=True)
                        out["calls"].append({"attempt": name, "result": dump_result(r)})
                    except MCPError as e:
                        out["calls"].append({"attempt": name, "error": dump_error(e)})

                if spec.get("sleep"):
                    # Let the state expire first.
                    await anyio.sleep(float(spec["sleep"]))
                if spec.get("poll_expiry"):
                    # Retry the genuine state until it is refused (its
                    # lifetime ran out), within the given bound in seconds;
                    # each attempt is recorded with the time since the state
                    # was issued.
                    issued = time.monotonic()
                    while True:
                        n = len(out["calls"])
                        await attempt("genuine", s, state, args)
                        out["calls"][n]["elapsed"] = time.monotonic() - issued
                        if "error" in out["calls"][n]:
                            return out
                        if time.monotonic() - issued > float(spec["poll_expiry"]):
                            raise SystemExit(f"poll_expiry: the state was never refused: {json.dumps(out)}")
                        await anyio.sleep(0.2)
                if spec.get("other_token_file"):
                    # Another person replays this person's state with their own token.
                    other = open(spec["other_token_file"], encoding="utf-8").read().strip()
                    oc = create_mcp_http_client(headers={"Authorization": f"Bearer {other}"})
                    async with oc:
                        t2 = streamable_http_client(spec["url"], http_client=oc)
                        async with Client(t2, **kwargs) as c2:
                            await c2.list_tools()
                            await attempt("other_person", c2.session, state, args)
                for name, st in attempts.items():
                    await attempt(name, s, st, {"limit": 99} if name == "other_arguments" else args)
            else:
                raise SystemExit(f"unknown scenario {scenario}")
    return out


def main() -> None:
    spec = json.load(open(sys.argv[1], encoding="utf-8"))
    out = anyio.run(run, spec)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
