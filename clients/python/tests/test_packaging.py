"""Packaging, from a clean clone: `git clone` of this checkout's HEAD into a
temp directory and `python -m build` there (the sdist, then the wheel built
from the sdist). The wheel holds every module, the type marker and the
licence, and its long description has no links that break outside the
repository; it installs into a fresh virtual environment (its dependencies
from the index, held to the pinned versions), and the README's first
example runs there against the real broker and examples/resource_server.
The README's install commands run as printed, from the top of the clone,
into another fresh virtual environment.

The clone is of HEAD: changes not committed yet are not in it."""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, QuickstartBroker, ResourceServer, start_resource_server
from readme_blocks import blocks

HERE = Path(__file__).resolve().parents[1]
MODULES = sorted(p.name for p in (HERE / "src" / "credbroker_client").glob("*.py"))


@pytest.fixture(scope="module")
def notes(broker: QuickstartBroker, tmp_module: Path) -> Iterator[ResourceServer]:
    rs = start_resource_server(broker, tmp_module)
    yield rs
    rs.proc.terminate()
    rs.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def clone(tmp_module: Path) -> Path:
    """A clean clone of this checkout's HEAD."""
    path = tmp_module / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(path)],
        check=True,
        capture_output=True,
    )
    return path


@pytest.fixture(scope="module")
def dist(clone: Path, tmp_module: Path) -> Path:
    """The sdist and the wheel `python -m build` makes in a clean clone."""
    out = tmp_module / "dist"
    # --no-isolation: the backend is the pinned hatchling of requirements-dev.txt.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)],
        cwd=clone / "clients" / "python",
        check=True,
        capture_output=True,
    )
    return out


def fresh_venv(path: Path) -> Path:
    """A new virtual environment at `path`; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def test_the_readme_install_commands_install_the_package_and_its_extra(
    clone: Path, tmp_path: Path
) -> None:
    """The README's install block, run as printed from the top of a clean
    clone with a fresh venv's pip first on PATH; the versions it resolves
    are held to this test environment's (pip's constraints)."""
    (block,) = [b for b in blocks(HERE / "README.md", "README.md") if b.lang == "sh"]
    assert "pip install ./clients/python" in block.code
    venv = tmp_path / "venv"
    py = fresh_venv(venv)
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{line}\n" for line in frozen.splitlines() if "==" in line))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{venv / 'bin'}:{env['PATH']}", "PIP_CONSTRAINT": str(constraints)}
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # The package and its MCP helper import there, from the venv.
    where = subprocess.run(
        [str(py), "-I", "-c", "import credbroker_client.mcp as m; print(m.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv)), where.stdout


def readme_example() -> str:
    text = (HERE / "README.md").read_text(encoding="utf-8")
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def relative_links(markdown: str) -> list[str]:
    """The targets of Markdown links that are not absolute https URLs."""
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", markdown) if not t.startswith("https://")]


def test_the_link_check_sees_relative_links() -> None:
    text = "[a](../../README.md), [b](https://example.com/x), [c](docs/X.md#y)"
    assert relative_links(text) == ["../../README.md", "docs/X.md#y"]
    assert relative_links("[b](https://example.com/x)") == []


def test_a_clean_clone_builds_a_complete_wheel_and_sdist(dist: Path) -> None:
    (wheel,) = dist.glob("credbroker_client-*.whl")
    (sdist,) = dist.glob("credbroker_client-*.tar.gz")
    assert "__init__.py" in MODULES and "verify.py" in MODULES
    names = zipfile.ZipFile(wheel).namelist()
    package = sorted(n for n in names if n.startswith("credbroker_client/"))
    assert package == sorted(
        [f"credbroker_client/{m}" for m in MODULES] + ["credbroker_client/py.typed"]
    )
    info = wheel.name.split("-py3")[0] + ".dist-info"
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if not n.startswith(("credbroker_client/", info + "/"))]
    licence = zipfile.ZipFile(wheel).read(f"{info}/licenses/LICENSE").decode()
    assert licence == (HERE / "LICENSE").read_text(encoding="utf-8")
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(f"{info}/METADATA"))
    assert meta["Name"] == "credbroker-client"
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("Provides-Extra") == ["mcp"]
    # The long description is the README, shown on its own by an index.
    description = meta.get_payload()
    assert isinstance(description, str) and "credbroker_client" in description
    assert relative_links(description) == []
    # The sdist rebuilds the same: sources, licence, README, pyproject.
    with tarfile.open(sdist) as t:
        top = sdist.name.removesuffix(".tar.gz")
        members = set(t.getnames())
    for f in ["LICENSE", "README.md", "pyproject.toml", "src/credbroker_client/py.typed"]:
        assert f"{top}/{f}" in members
    for m in MODULES:
        assert f"{top}/src/credbroker_client/{m}" in members


def test_the_licence_is_the_repositorys() -> None:
    ours = (HERE / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in ours
    assert ours == (REPO / "clients" / "typescript" / "LICENSE").read_text(encoding="utf-8")
    assert ours == (REPO / "LICENSE").read_text(encoding="utf-8")


def test_the_wheel_installs_into_a_fresh_venv_and_the_readme_example_runs(
    broker: QuickstartBroker, notes: ResourceServer, dist: Path, tmp_path: Path
) -> None:
    (wheel,) = dist.glob("credbroker_client-*.whl")
    venv = tmp_path / "venv"
    py = fresh_venv(venv)
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(HERE / "requirements-dev.txt"),
            str(wheel),
        ],
        check=True,
    )
    # The example as printed, with the quick start's paths where this test
    # keeps them (the resource server's port is a free one here).
    work = tmp_path / "work"
    work.mkdir()
    (work / "credbroker-quickstart").symlink_to(broker.dir)
    code = readme_example().replace("http://127.0.0.1:9090/notes", broker.resource)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TOKEN"] = broker.subject_token()
    r = subprocess.run(
        [str(py), "-I", "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Issued(token_type='DPoP'") and "scope='notes.read'" in lines[0]
    assert env["TOKEN"] not in r.stdout
    assert lines[1] == "refused: step_not_allowed"
    assert '"sub": "alice"' in lines[2].replace("'", '"')
    # It ran the installed wheel, not this checkout.
    where = subprocess.run(
        [str(py), "-I", "-c", "import credbroker_client; print(credbroker_client.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where
