"""The fenced code blocks of a README, with the hidden parts the tests add.

A block runs as printed. When it cannot run alone, HTML comments right
before it (not shown when the Markdown is rendered) say what the test adds,
as rustdoc's hidden ``#`` lines do::

    <!-- readme-test: prelude
    (code run before the block: the names it takes as given)
    -->
    <!-- readme-test: after
    (code run after it: what it must have done)
    -->
    <!-- readme-test: skip: the reason -->

clients/typescript/test/readme.ts reads the same comments."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
_COMMENT = re.compile(r"^<!-- readme-test: (prelude|after|skip)(?::\s*(.*?))?\s*(-->)?$")


@dataclass
class Block:
    """One fenced block: where it is, its language, its text and what the
    test adds to it."""

    source: str
    line: int
    lang: str
    code: str
    prelude: str = ""
    after: str = ""
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def blocks(path: Path, name: str) -> list[Block]:
    """Every fenced block of `path` (shown as `name`), in order, with its
    hidden parts."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        c = _COMMENT.match(line)
        if c:
            kind, rest, closed = c.group(1), c.group(2) or "", c.group(3)
            if kind == "skip":
                if not closed or not rest:
                    raise ValueError(f"{path}:{i + 1}: write <!-- readme-test: skip: REASON -->")
                pending["skip"] = rest
                i += 1
                continue
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "-->":
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}: the readme-test {kind} comment is not closed")
            pending[kind] = "\n".join(body) + "\n"
            i += 1
            continue
        f = _FENCE.match(line)
        if f and f.group(1):
            start = i + 1
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            found.append(
                Block(
                    name,
                    start,
                    f.group(1),
                    "\n".join(body) + "\n",
                    pending.get("prelude", ""),
                    pending.get("after", ""),
                    pending.get("skip"),
                )
            )
            pending = {}
        elif f:  # a fence without a language: a plain block, skip to its end
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            pending = {}
        elif line.strip() and pending:
            raise ValueError(f"{path}:{i + 1}: a readme-test comment is not right before a block")
        i += 1
    return found
