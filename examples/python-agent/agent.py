"""A tiny orchestrator over the credbroker quick start, with a scripted
"model" instead of an LLM.

The person (alice) asks two things, and the orchestrator runs one step for
each:

1. ``summarize``: the tool ``notes.read`` reads her notes from
   examples/resource_server. One note is a prompt injection, and the model
   obeys it: it asks for ``notes.delete``. The broker refuses, since the
   policy does not allow that tool in this step, and the agent says so.
2. ``cleanup_confirmed``: now alice herself asked for the cleanup. The policy
   allows ``notes.delete`` here, but only with her approval of this very
   call, which says what it deletes (``authorization_details``, shown to
   her on the approval page): the broker answers with a link, the agent shows it and retries the
   derive (with backoff, for at most ``--wait`` seconds) until she approved
   in her browser; then the tool deletes the notes. If she declines, the
   broker refuses the call and the agent stops.

Run it from the repository (see README.md beside this file).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from credbroker_client import AccessDenied, Broker, DPoPAuth, Issued, LinkRequired, ToolKey

REPO = Path(__file__).resolve().parents[2]


def say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def scripted_model(request: str, notes: list[str]) -> list[str]:
    """The tool calls a (gullible) model would make: it summarises what it
    is asked to, and also follows any instruction it reads in the notes."""
    calls = ["notes.delete"] if "delete" in request else []
    if any("delete all notes" in n for n in notes):
        calls.append("notes.delete")
    return list(dict.fromkeys(calls))  # each tool once


#: What each tool call does, as the person reads it on the approval page
#: (RFC 9396 ``authorization_details``; the quick-start policy requires
#: them for ``notes.delete``, and the example resource server's DELETE
#: removes every note).
DETAILS = {"notes.delete": [{"type": "notes", "which": "all"}]}


def credbroker_binary() -> str:
    """$CREDBROKER_BIN, else this repository's build, else `credbroker` on
    the PATH."""
    builds = [REPO / "target" / b / "credbroker" for b in ("release", "debug")]
    found = [str(p) for p in builds if p.is_file()] + [shutil.which("credbroker") or "credbroker"]
    return os.environ.get("CREDBROKER_BIN") or found[0]


def derive_with_approval(
    broker: Broker,
    subject: str,
    step: str,
    tool: str,
    resource: str,
    key: ToolKey,
    wait: float,
) -> Issued | None:
    """Derives a token for a tool that needs the person's approval: shows
    the link once, then retries with backoff until she approved, or gives
    up after ``wait`` seconds (None)."""
    deadline = time.monotonic() + wait
    delay = 0.5
    shown = False
    while True:
        try:
            # The same key and details each time: the approval is bound to
            # both.
            return broker.derive(
                subject, step, tool, resource, key=key, authorization_details=DETAILS.get(tool)
            )
        except LinkRequired as e:
            if e.reason != "approval":
                raise
            if not shown:
                say(step, f"{tool} needs the person's approval: {e.link.message}")
                say(step, f"approval link: {e.link.uri}")
                shown = True
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(delay, left))
        delay = min(delay * 2, 3.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("credbroker-quickstart"))
    ap.add_argument("--person", default="alice")
    ap.add_argument("--resource", default="http://127.0.0.1:9090/notes")
    ap.add_argument("--wait", type=float, default=300.0, help="seconds to wait for an approval")
    args = ap.parse_args()

    # The person's subject token. A real orchestrator has it from her
    # sign-in; the quick start's dev issuer makes one for a local account.
    subject = subprocess.run(  # noqa: S603 (our own binary, our own arguments)
        [
            credbroker_binary(),
            "subject-token",
            "--dir",
            str(args.dir),
            "--sub",
            args.person,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    key = ToolKey.generate()  # the tools' DPoP key, kept in memory here

    with Broker(args.dir / "credbroker.sock") as broker:
        step = "summarize"
        say(step, f"{args.person}: summarise my notes")
        read = broker.derive(subject, step, "notes.read", args.resource, key=key)
        with httpx.Client(auth=DPoPAuth(read, key)) as http:
            r = http.get(args.resource)
            r.raise_for_status()
            notes: list[str] = r.json()["notes"]
        say(step, f"read {len(notes)} notes: " + " | ".join(notes))
        for tool in scripted_model("summarise my notes", notes):
            say(step, f"the model asks for {tool} (an instruction it read in a note)")
            try:
                broker.derive(
                    subject,
                    step,
                    tool,
                    args.resource,
                    key=key,
                    authorization_details=DETAILS.get(tool),
                )
                say(step, f"UNEXPECTED: {tool} was issued in {step}")
                return 1
            except AccessDenied as e:
                say(step, f"the broker refused {tool}: {e.error} ({e.reason}); not done")

        step = "cleanup_confirmed"
        say(step, f"{args.person}: now delete my notes, please")
        for tool in scripted_model("delete my notes", notes):
            try:
                issued = derive_with_approval(
                    broker, subject, step, tool, args.resource, key, args.wait
                )
            except AccessDenied as e:  # approval_declined: she said no
                say(step, f"the broker refused {tool}: {e.error} ({e.reason}); not done")
                return 3
            if issued is None:
                say(
                    step,
                    f"no approval within {args.wait:g} s: gave up, nothing deleted",
                )
                return 2
            with httpx.Client(auth=DPoPAuth(issued, key)) as http:
                r = http.delete(args.resource)
                r.raise_for_status()
            say(step, f"approved; {tool} deleted {r.json()['deleted']} notes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
