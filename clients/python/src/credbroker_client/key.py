"""The tool's DPoP key (RFC 9449): ES256 on P-256, and the proofs it signs.

The private key never leaves this object except through :meth:`ToolKey.save`,
which writes it to a new file readable by its owner only. Its ``repr`` shows
the RFC 7638 thumbprint (the token's ``cnf.jkt``), never the key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from joserfc import jws
from joserfc.jwk import ECKey

from .errors import CredbrokerError


class KeyFileError(CredbrokerError):
    """A key file could not be used; the text names the file and the cause."""


def ath(access_token: str) -> str:
    """The proof's ``ath``: base64url(SHA-256(token)), no padding."""
    digest = hashlib.sha256(access_token.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def htu_of(url: str) -> str:
    """The ``htu`` of a request to ``url``: the URL without query and
    fragment (RFC 9449 section 4.2)."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise ValueError("a DPoP proof needs an absolute URL (scheme and host)")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


class ToolKey:
    """An ES256 key that signs a tool's DPoP proofs."""

    __slots__ = ("_key", "_public", "_thumbprint")

    def __init__(self, key: ECKey) -> None:
        if not key.is_private or key.curve_name != "P-256":
            raise ValueError("a tool key is a private EC P-256 key")
        self._key = key
        public = {
            k: v for k, v in key.as_dict(private=False).items() if k in ("kty", "crv", "x", "y")
        }
        self._public: dict[str, str] = {k: str(v) for k, v in public.items()}
        self._thumbprint = key.thumbprint()

    @classmethod
    def generate(cls) -> ToolKey:
        """A fresh key."""
        return cls(ECKey.generate_key("P-256", private=True))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ToolKey:
        """Reads a PEM (PKCS #8) key file, the format ``credbroker derive
        --dpop-key`` writes. A file that its group or others may read or
        write is refused: the key might have been copied."""
        p = Path(path)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise KeyFileError(f"tool key {p}: cannot open it: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise KeyFileError(f"tool key {p}: not a regular file")
            if st.st_mode & 0o077:
                raise KeyFileError(
                    f"tool key {p}: mode {stat.S_IMODE(st.st_mode):04o} lets its group or others "
                    "read or write it; it must be 0600 "
                    "(make a new key: this one may have been copied)"
                )
            with os.fdopen(fd, "rb", closefd=False) as f:
                pem = f.read(64 * 1024)
        finally:
            os.close(fd)
        try:
            key = ECKey.import_key(pem)
        except Exception:  # noqa: BLE001 - the cause would quote the file
            raise KeyFileError(f"tool key {p}: not a PEM EC private key") from None
        if not key.is_private or key.curve_name != "P-256":
            raise KeyFileError(f"tool key {p}: not a P-256 private key")
        return cls(key)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the key to a new file, created with mode 0600 (and never
        widened or chmod-ed afterwards); an existing file is not replaced."""
        p = Path(path)
        pem = self._key.as_pem(private=True)
        try:
            fd = os.open(
                p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except FileExistsError:
            raise KeyFileError(f"tool key {p}: the file exists; not replacing it") from None
        except OSError as e:
            raise KeyFileError(f"tool key {p}: cannot create it: {e.strerror}") from None
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(pem)
                f.flush()
                os.fsync(fd)
        finally:
            os.close(fd)

    @property
    def thumbprint(self) -> str:
        """The RFC 7638 SHA-256 thumbprint: the ``cnf.jkt`` of tokens bound to this key."""
        return self._thumbprint

    @property
    def public_jwk(self) -> dict[str, str]:
        """The public key as a JWK (``kty``, ``crv``, ``x``, ``y``)."""
        return dict(self._public)

    def proof(
        self,
        method: str,
        url: str,
        access_token: str | None = None,
        nonce: str | None = None,
        *,
        now: float | None = None,
    ) -> str:
        """A DPoP proof for one request: ``htm`` is ``method``, ``htu`` is
        ``url`` without query or fragment, a fresh ``jti``; ``ath`` when the
        request carries ``access_token``, ``nonce`` when the server gave one."""
        claims: dict[str, object] = {
            "jti": secrets.token_urlsafe(16),
            "htm": method,
            "htu": htu_of(url),
            "iat": int(time.time() if now is None else now),
        }
        if access_token is not None:
            claims["ath"] = ath(access_token)
        if nonce is not None:
            claims["nonce"] = nonce
        header = {"typ": "dpop+jwt", "alg": "ES256", "jwk": self._public}
        payload = json.dumps(claims, separators=(",", ":"))
        return jws.serialize_compact(header, payload, self._key, algorithms=["ES256"])

    def __repr__(self) -> str:
        return f"ToolKey(thumbprint={self._thumbprint!r})"

    def __reduce__(self) -> str | tuple[object, ...]:
        raise TypeError("a ToolKey is not pickled: save it with ToolKey.save")
