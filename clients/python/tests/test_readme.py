"""Every Python block of the top-level README and of this package's README,
run: each with its hidden prelude and after-part (tests/readme_blocks.py),
first checked for undefined names (ruff's pyflakes rules) and types (mypy,
which knows httpx, Starlette and mcp), then executed against a quick-start
broker and examples/resource_server, from a directory where
`credbroker-quickstart` is that broker's. The addresses the READMEs use
(127.0.0.1:8440, :9090) become the test's. A block marked skip is counted
and its reason printed; a block in another language is not this test's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, QuickstartBroker, ResourceServer, start_resource_server
from readme_blocks import Block, blocks

HERE = Path(__file__).resolve().parents[1]
READMES = {"README.md": REPO / "README.md", "clients/python/README.md": HERE / "README.md"}


def python_blocks() -> list[Block]:
    return [b for name, p in READMES.items() for b in blocks(p, name) if b.lang == "python"]


@pytest.fixture(scope="module")
def notes(broker: QuickstartBroker, tmp_module: Path) -> Iterator[ResourceServer]:
    rs = start_resource_server(broker, tmp_module)
    yield rs
    rs.proc.terminate()
    rs.proc.wait(timeout=10)


def program(b: Block, broker: QuickstartBroker) -> str:
    """The block with its hidden parts, on the test's addresses."""
    origin = broker.resource.removesuffix("/notes")
    text = f"{b.prelude}\n{b.code}\n{b.after}"
    return text.replace("http://127.0.0.1:8440", broker.issuer).replace(
        "http://127.0.0.1:9090", origin
    )


def test_every_python_block_of_the_readmes_runs(
    broker: QuickstartBroker,
    notes: ResourceServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = python_blocks()
    # The READMEs' blocks this test must see (a reader that finds none passes nothing).
    assert {b.source for b in found} == set(READMES), [b.where for b in found]
    run = [b for b in found if b.skip is None]
    skipped = [b for b in found if b.skip is not None]
    work = tmp_path / "work"
    work.mkdir()
    (work / "credbroker-quickstart").symlink_to(broker.dir)
    files = []
    for i, b in enumerate(run):
        f = work / f"readme_block_{i}.py"
        f.write_text(f"# {b.where}\n" + program(b, broker))
        files.append(f)
    # Undefined names and unused imports (pyflakes; a fragment may leave a
    # variable unused), then types, in function bodies too.
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated"]
        + ["--select", "F", "--ignore", "F841"]
        + [str(f) for f in files],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\ncheck_untyped_defs = True\n")
    types = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config)]
        + ["--cache-dir", str(tmp_path / "mypy")]
        + ["--follow-imports", "silent", "--scripts-are-modules"]
        + [str(f) for f in files],
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(HERE / "src")},
    )
    assert types.returncode == 0, types.stdout + types.stderr
    env = {**os.environ, "PYTHONPATH": str(HERE / "src"), "TOKEN": broker.subject_token()}
    for b, f in zip(run, files, strict=True):
        r = subprocess.run(
            [sys.executable, str(f)], cwd=work, env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, f"{b.where}: {r.stderr}"
    others = [
        b for b in blocks(HERE / "README.md", "clients/python/README.md") if b.lang != "python"
    ]
    skipped += [b for b in others if b.skip is not None]
    # The install block runs in tests/test_packaging.py, in a clean clone.
    installs = [b for b in others if b.skip is None and b.lang == "sh"]
    with capsys.disabled():
        print(
            f"\nREADME blocks: {len(run)} Python blocks run here, {len(installs)} sh blocks"
            f" in test_packaging.py, {len(skipped)} blocks skipped"
        )
        for b in skipped:
            print(f"  skipped {b.where} ({b.lang}): {b.skip}")
    # This package's README has no block that nothing runs.
    assert [b.where for b in others if b.skip is None and b.lang != "sh"] == []
