"""Request binding (docs/APPROVALS.md in the credbroker repository, "The
request, bound"): the digest of the exact request a token is approved for,
its ``req_sha256`` claim.

The digest input is six fields, each written as its length in bytes (four
bytes, big-endian) followed by its bytes: the label
``credbroker-request-v1``; the method as sent; the raw path, never decoded;
the raw query without its ``?``, never decoded or reordered (empty when
there is none); the ``Content-Type`` value as sent, parameters included
(empty when there is none); and the body: empty when there is none, the
RFC 8785 (JCS) form of an I-JSON body for a JSON media type
(``application/json``, ``*/*+json``), otherwise its bytes. ``req_sha256``
is the lower-case hex SHA-256 of that input.

The JCS serialisation is the ``rfc8785`` package's. What it cannot see once
``json.loads`` has read the text is checked while reading it: a duplicate
member name (``object_pairs_hook``), a number whose text is not the
shortest text of its IEEE 754 double or an integer beyond 2^53 - 1
(``parse_int``/``parse_float`` get the number's text), a lone surrogate, and
nesting deeper than :data:`MAX_DEPTH`. ``proto/request-binding-vectors.json``
pins all of it; the tests run every vector.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import rfc8785

from .errors import CredbrokerError

#: The digest input's first field.
LABEL = b"credbroker-request-v1"

#: The largest body a request binding takes, raw and in its canonical form
#: (bytes): the derive carries it whole over the socket and the approval
#: page shows it whole.
MAX_BOUND_BODY = 16 * 1024

#: The deepest nesting of arrays and objects a bound JSON body may have.
MAX_DEPTH = 32

# The largest integer every I-JSON reader holds exactly (2^53 - 1).
_MAX_SAFE_INTEGER = 2**53 - 1


class RequestError(CredbrokerError):
    """A request that cannot be bound. ``reason`` is the proxy's word for
    it: ``body_not_ijson`` (a JSON body that is not I-JSON, or a JSON media
    type whose charset is not UTF-8) or ``bound_body_too_large``."""

    def __init__(self, reason: str, description: str) -> None:
        super().__init__(description)
        self.reason = reason


def _not_ijson(why: str) -> NoReturn:
    raise RequestError("body_not_ijson", f"the body is not I-JSON: {why}")


@dataclass(frozen=True)
class BoundRequest:
    """A request as it is bound: what the derive carries (``request``) and
    what the proxy or a resource server receives. ``path`` and ``query``
    are raw (as on the request line, ``query`` without ``?``); ``body`` is
    the body as sent (``str`` is taken as its UTF-8 bytes)."""

    method: str
    path: str
    query: str = ""
    content_type: str = ""
    body: bytes | str = b""

    def body_bytes(self) -> bytes:
        """The body as bytes."""
        return self.body.encode("utf-8") if isinstance(self.body, str) else bytes(self.body)

    def to_json(self) -> dict[str, str]:
        """The derive's ``request`` member (the body must be UTF-8 text)."""
        try:
            body = self.body_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(
                "body_not_ijson", "a bound request's body must be UTF-8 text"
            ) from None
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "content_type": self.content_type,
            "body": body,
        }


@dataclass(frozen=True)
class Bound:
    """A bound request: the body as it is hashed (and, by the broker's
    proxy, sent) and ``req_sha256``."""

    body: bytes
    sha256: str


def json_media_type(content_type: str) -> bool | None:
    """``None`` when ``content_type`` is not a JSON media type
    (``application/json`` or a ``+json`` suffix, any case and parameters);
    else whether its charset, if any, is UTF-8."""
    essence, *params = content_type.split(";")
    essence = essence.strip().lower()
    if not (essence == "application/json" or (essence.endswith("+json") and "/" in essence)):
        return None
    for p in params:
        name, eq, value = p.partition("=")
        if eq and name.strip().lower() == "charset":
            if value.strip().strip('"').lower() != "utf-8":
                return False
    return True


_DECIMAL = re.compile(r"([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")


def _decimal_parts(text: str) -> tuple[str, int] | None:
    """A non-negative decimal text as its significant digits (no leading or
    trailing zeros) and the position of the decimal point after the first
    of them; ``None`` for zero."""
    m = _DECIMAL.fullmatch(text)
    if m is None:
        return None
    whole, frac, exp = m.group(1), m.group(2) or "", m.group(3)
    digits = whole + frac
    lead = len(digits) - len(digits.lstrip("0"))
    significant = digits[lead:].rstrip("0")
    if not significant:
        return None
    return significant, len(whole) - lead + (int(exp) if exp else 0)


def _number(text: str) -> int | float:
    """A JSON number's value, refused unless its text is exactly the
    shortest text of its double and an integer is within 2^53 - 1."""
    x = float(text)
    if not math.isfinite(x):
        _not_ijson("a number beyond the doubles")
    if x.is_integer() and abs(x) > _MAX_SAFE_INTEGER:
        _not_ijson("an integer beyond 2^53 - 1")
    written = _decimal_parts(text.lstrip("-"))
    shortest = None if x == 0 else _decimal_parts(repr(abs(x)))
    if written != shortest:
        _not_ijson("a number with more digits than its double holds")
    if x == 0:
        return 0  # -0 is 0 in JCS
    return int(x) if "." not in text and "e" not in text.lower() else x


def _constant(name: str) -> NoReturn:
    _not_ijson(f"{name} is not JSON")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            _not_ijson("an object has two members of one name")
        out[k] = v
    return out


def _check(v: Any, depth: int) -> None:
    """Lone surrogates (escaped ones: the text is valid UTF-8) and depth."""
    if isinstance(v, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            _not_ijson("a string holds a lone surrogate")
    elif isinstance(v, (list, dict)):
        if depth + 1 > MAX_DEPTH:
            _not_ijson("arrays and objects nest too deeply")
        for item in v.items() if isinstance(v, dict) else v:
            if isinstance(item, tuple):
                _check(item[0], depth + 1)
                _check(item[1], depth + 1)
            else:
                _check(item, depth + 1)


def canonicalize(text: bytes) -> bytes:
    """The RFC 8785 (JCS) form of an I-JSON text; :class:`RequestError`
    (``body_not_ijson``) for one that is not I-JSON or not UTF-8."""
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        _not_ijson("not UTF-8")
    try:
        value = json.loads(
            s,
            object_pairs_hook=_object,
            parse_int=_number,
            parse_float=_number,
            parse_constant=_constant,
        )
    except RecursionError:
        _not_ijson("arrays and objects nest too deeply")
    except ValueError:
        _not_ijson("not JSON text")
    _check(value, 0)
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError:
        _not_ijson("not canonicalisable")


def hashed_body(content_type: str, body: bytes) -> bytes:
    """The body as it is hashed: empty stays empty; a JSON body is checked
    as I-JSON and canonicalised; any other body is its bytes."""
    if len(body) > MAX_BOUND_BODY:
        raise RequestError(
            "bound_body_too_large", f"the body is over {MAX_BOUND_BODY} bytes, the bindable most"
        )
    if not body:
        return b""
    json_type = json_media_type(content_type)
    if json_type is False:
        _not_ijson("a JSON body's charset must be utf-8")
    out = canonicalize(body) if json_type else body
    if len(out) > MAX_BOUND_BODY:
        raise RequestError(
            "bound_body_too_large", f"the body is over {MAX_BOUND_BODY} bytes, the bindable most"
        )
    return out


def digest_input(r: BoundRequest, hashed: bytes) -> bytes:
    """The digest input of ``r`` whose body is already the hashed one."""
    fields = (
        LABEL,
        r.method.encode("utf-8"),
        r.path.encode("utf-8"),
        r.query.encode("utf-8"),
        r.content_type.encode("utf-8"),
        hashed,
    )
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


def bind(r: BoundRequest) -> Bound:
    """Binds ``r``: its hashed body and its ``req_sha256``; raises
    :class:`RequestError` for a request that cannot be bound."""
    body = hashed_body(r.content_type, r.body_bytes())
    return Bound(body=body, sha256=hashlib.sha256(digest_input(r, body)).hexdigest())
