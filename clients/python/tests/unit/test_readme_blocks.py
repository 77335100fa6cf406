"""The README block reader (tests/readme_blocks.py) and its hidden parts."""

from __future__ import annotations

from pathlib import Path

import pytest
from readme_blocks import blocks


def test_the_block_reader_sees_hidden_parts(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "text\n\n<!-- readme-test: prelude\nx = 1\n-->\n<!-- readme-test: after\n"
        "assert y == 2\n-->\n```python\ny = x + 1\n```\n\n"
        "<!-- readme-test: skip: a reason -->\n```sh\nfalse\n```\n\n```python\nz = 3\n```\n"
    )
    got = blocks(md, "x.md")
    assert [(b.lang, b.code, b.prelude, b.after, b.skip) for b in got] == [
        ("python", "y = x + 1\n", "x = 1\n", "assert y == 2\n", None),
        ("sh", "false\n", "", "", "a reason"),
        ("python", "z = 3\n", "", "", None),
    ]
    md.write_text("<!-- readme-test: prelude\nx = 1\n-->\nprose\n```python\ny\n```\n")
    with pytest.raises(ValueError, match="not right before a block"):
        blocks(md, "x.md")
