"""Packaging: the wheel `python -m build` makes installs into a fresh
virtual environment (its dependencies from the index, held to the pinned
versions), and the README's first example runs there against the real
broker and examples/resource_server."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import QuickstartBroker, ResourceServer, start_resource_server

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def notes(broker: QuickstartBroker, tmp_module: Path) -> Iterator[ResourceServer]:
    rs = start_resource_server(broker, tmp_module)
    yield rs
    rs.proc.terminate()
    rs.proc.wait(timeout=10)


def readme_example() -> str:
    text = (HERE / "README.md").read_text(encoding="utf-8")
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_wheel_installs_into_a_fresh_venv_and_the_readme_example_runs(
    broker: QuickstartBroker, notes: ResourceServer, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(HERE),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("credbroker_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "credbroker_client/py.typed" in names and "credbroker_client/verify.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
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
