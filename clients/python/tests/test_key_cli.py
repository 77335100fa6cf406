"""ToolKey's key files are the credbroker CLI's: a key saved here signs
proofs with `credbroker proof --key` (the real binary), and the CLI refuses
the same loose file modes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import broker_bin
from joserfc import jws

from credbroker_client import ToolKey


def test_key_files_are_shared_with_the_cli(tmp_path: Path) -> None:
    # A key saved here signs proofs with `credbroker proof --key`.
    k = ToolKey.generate()
    p = tmp_path / "py.pem"
    k.save(p)
    out = subprocess.run(
        [str(broker_bin()), "proof", "--key", str(p), "--method", "GET", "--url", "http://r/x"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    h = jws.extract_compact(out.encode()).headers()
    assert h["jwk"]["x"] == k.public_jwk["x"]
    # Negative control: the CLI refuses the same file once others may read it.
    p.chmod(0o644)
    r = subprocess.run(
        [str(broker_bin()), "proof", "--key", str(p), "--method", "GET", "--url", "http://r/x"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
