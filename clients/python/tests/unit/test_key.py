"""ToolKey: files (0600 from creation, never replaced, refused when others
may read them), the RFC 7638 thumbprint, proofs (htu, ath, nonce), and
interchange with the credbroker CLI's key files."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from joserfc import jws
from joserfc.jwk import ECKey

from credbroker_client import KeyFileError, ToolKey
from credbroker_client.key import ath


def test_save_creates_0600_from_the_start_and_never_replaces(tmp_path: Path) -> None:
    k = ToolKey.generate()
    p = tmp_path / "tool.pem"
    old = os.umask(0o000)  # a permissive umask must not widen the file
    try:
        k.save(p)
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    before = p.read_bytes()
    with pytest.raises(KeyFileError, match="exists"):
        ToolKey.generate().save(p)
    assert p.read_bytes() == before
    # A symlink at the path is not followed.
    link = tmp_path / "link.pem"
    link.symlink_to(tmp_path / "elsewhere.pem")
    with pytest.raises(KeyFileError):
        k.save(link)
    assert not (tmp_path / "elsewhere.pem").exists()
    # Positive control: the saved key loads as the same key.
    assert ToolKey.load(p).thumbprint == k.thumbprint


def test_load_refuses_a_key_file_others_may_read(tmp_path: Path) -> None:
    k = ToolKey.generate()
    p = tmp_path / "tool.pem"
    k.save(p)
    for mode in (0o640, 0o604, 0o644, 0o660):
        p.chmod(mode)
        with pytest.raises(KeyFileError, match=f"{mode:04o}") as e:
            ToolKey.load(p)
        assert str(p) in str(e.value)
    p.chmod(0o600)
    assert ToolKey.load(p).thumbprint == k.thumbprint
    with pytest.raises(KeyFileError, match="cannot open"):
        ToolKey.load(tmp_path / "missing.pem")
    bad = tmp_path / "bad.pem"
    fd = os.open(bad, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    os.close(fd)
    with pytest.raises(KeyFileError, match="not a PEM EC private key") as e:
        ToolKey.load(bad)
    assert "not a key" not in str(e.value)


def test_thumbprint_is_rfc_7638() -> None:
    k = ToolKey.generate()
    jwk = k.public_jwk
    canonical = json.dumps(
        {"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"], "y": jwk["y"]},
        separators=(",", ":"),
    ).encode()
    want = base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()).rstrip(b"=").decode()
    assert k.thumbprint == want
    # docs/RESOURCE-SERVERS.md's vector, through the same library call.
    doc = ECKey.import_key(
        {
            "kty": "EC",
            "crv": "P-256",
            "x": "_M6N6RnSJ7SRNKo2Av-dEiIZ85N-YuRKr7vB8THgCb0",
            "y": "9XL6aJ6BVxu7hDTRp75QkKPHSuhmgqUJ0TsOLvgqT20",
        }
    )
    assert doc.thumbprint() == "jLm1OcSaOJ-InSvKd-77CffEK5xlQ_UGgoA5N1R6YS4"


def test_proof_has_htu_without_query_or_fragment_ath_and_nonce() -> None:
    k = ToolKey.generate()
    p = k.proof(
        "GET", "https://Api.example:8443/notes/1?page=2#top", access_token="abc", nonce="n-1"
    )
    obj = jws.deserialize_compact(p, ECKey.import_key(dict(k.public_jwk)), algorithms=["ES256"])
    h = obj.headers()
    assert h["typ"] == "dpop+jwt" and h["alg"] == "ES256"
    assert set(h["jwk"]) == {"kty", "crv", "x", "y"}  # public only: no "d"
    c = json.loads(obj.payload)
    assert c["htm"] == "GET"
    assert c["htu"] == "https://Api.example:8443/notes/1"
    assert c["ath"] == "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0" == ath("abc")
    assert c["nonce"] == "n-1"
    assert isinstance(c["iat"], int) and isinstance(c["jti"], str)
    # Without a token or nonce, neither member is there; every jti is new.
    q = json.loads(jws.extract_compact(k.proof("POST", "http://b/v1/derive").encode()).payload)
    assert "ath" not in q and "nonce" not in q
    assert q["jti"] != c["jti"]
    with pytest.raises(ValueError, match="absolute"):
        k.proof("GET", "/relative")


def test_repr_shows_the_thumbprint_never_the_key() -> None:
    k = ToolKey.generate()
    d = k._key.as_dict(private=True)["d"]
    assert repr(k) == f"ToolKey(thumbprint={k.thumbprint!r})"
    assert str(d) not in repr(k) and str(d) not in str(k)
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(k)
