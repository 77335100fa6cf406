"""For resource servers written in Python: verify a credbroker token and its
DPoP proof, with the checks of ``docs/RESOURCE-SERVERS.md`` in their order.

Signatures are checked by ``joserfc``; what a generic JOSE library does not
do (the header allow-lists, ``htm``/``htu``/``iat``/``ath``, the key binding
and the replay cache) is here. Time comes from an injectable clock::

    verifier = Verifier.from_issuer("https://broker.example", "https://notes.example/notes")
    who = verifier.verify("GET", "https://notes.example/notes?page=2",
                          request.headers.get("authorization"),
                          request.headers.getlist("dpop"))

On :class:`VerifyError`, answer ``e.status`` with ``WWW-Authenticate:
e.challenge()``.

A token marked ``single_use`` (an ``each_call`` approval's) is accepted once:
the verifier records its (``iss``, ``jti``) in a single-use store until it
expires and refuses it after (``invalid_token``). The default store is in
this process's memory, **which is wrong for a server with several worker
processes**: give them a shared one (``single_use_store=``, see
:mod:`credbroker_client.single_use`). In an asyncio server, :meth:`Verifier.from_issuer_async`
and :meth:`Verifier.verify_async` do the same without blocking the event
loop: their only network reads (the metadata, the JWKS and its refetch for
an unknown ``kid``) go through an ``httpx.AsyncClient``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import ECKey

from .errors import CredbrokerError
from .key import ath as ath_of
from .request import BoundRequest, RequestError, bind
from .single_use import AsyncSingleUseStore, MemorySingleUseStore, SingleUseStore

MAX_TOKEN = 8 * 1024
MAX_PROOF = 4 * 1024
MAX_KEYS_DOCUMENT = 64 * 1024
#: Seconds one metadata or JWKS fetch may take in all.
FETCH_TIMEOUT = 10.0
#: Clock skew allowed on the token's ``exp``/``iat``, in seconds.
SKEW = 5
#: How far a proof's ``iat`` may be from now, either way, in seconds.
PROOF_WINDOW = 60
#: The least time between two JWKS fetches caused by unknown ``kid``s.
REFRESH_INTERVAL = 60.0

_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


class VerifyError(CredbrokerError):
    """Why a request is not authenticated. ``code`` is the
    ``WWW-Authenticate`` error (``invalid_token``, ``invalid_dpop_proof``,
    ``use_dpop_nonce``), ``missing`` (no ``Authorization`` at all: the
    challenge names no error), ``keys_unavailable`` (answer 503: the
    token may be fine), or ``replay_store_unavailable`` (answer 503: the
    single-use store failed or is full, so a single-use token could not be
    recorded and is not accepted)."""

    def __init__(self, code: str, description: str) -> None:
        super().__init__(f"{code}: {description}")
        self.code = code
        self.description = description

    @property
    def status(self) -> int:
        """The HTTP status to answer with."""
        return 503 if self.code in _UNAVAILABLE else 401

    def challenge(self) -> str | None:
        """The ``WWW-Authenticate`` value (none for 503)."""
        if self.code in _UNAVAILABLE:
            return None
        if self.code == "missing":
            return 'DPoP algs="ES256"'
        return f'DPoP error="{self.code}", algs="ES256"'


_UNAVAILABLE = ("keys_unavailable", "replay_store_unavailable")


def _token(d: str) -> VerifyError:
    return VerifyError("invalid_token", d)


def _proof(d: str) -> VerifyError:
    return VerifyError("invalid_dpop_proof", d)


def _capped_get(client: httpx.Client, url: str, timeout: float) -> bytes:
    """GET ``url``: 200 only, no redirect followed, at most
    ``MAX_KEYS_DOCUMENT`` bytes read, ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    try:
        with client.stream("GET", url, follow_redirects=False) as r:
            if r.status_code != 200:
                raise VerifyError("keys_unavailable", f"{url}: HTTP {r.status_code}")
            declared = r.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_KEYS_DOCUMENT:
                raise VerifyError(
                    "keys_unavailable", f"{url}: larger than {MAX_KEYS_DOCUMENT} bytes"
                )
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_KEYS_DOCUMENT:
                    raise VerifyError(
                        "keys_unavailable", f"{url}: larger than {MAX_KEYS_DOCUMENT} bytes"
                    )
                if time.monotonic() > deadline:
                    raise VerifyError("keys_unavailable", f"{url}: not read within {timeout} s")
    except httpx.HTTPError as e:
        raise VerifyError("keys_unavailable", f"{url}: {type(e).__name__}") from None
    return bytes(body)


async def _capped_get_async(client: httpx.AsyncClient, url: str, timeout: float) -> bytes:
    """:func:`_capped_get` on an ``httpx.AsyncClient``, with the same caps."""
    deadline = time.monotonic() + timeout
    try:
        async with client.stream("GET", url, follow_redirects=False) as r:
            if r.status_code != 200:
                raise VerifyError("keys_unavailable", f"{url}: HTTP {r.status_code}")
            declared = r.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_KEYS_DOCUMENT:
                raise VerifyError(
                    "keys_unavailable", f"{url}: larger than {MAX_KEYS_DOCUMENT} bytes"
                )
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_KEYS_DOCUMENT:
                    raise VerifyError(
                        "keys_unavailable", f"{url}: larger than {MAX_KEYS_DOCUMENT} bytes"
                    )
                if time.monotonic() > deadline:
                    raise VerifyError("keys_unavailable", f"{url}: not read within {timeout} s")
    except httpx.HTTPError as e:
        raise VerifyError("keys_unavailable", f"{url}: {type(e).__name__}") from None
    return bytes(body)


def _json_object(url: str, body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise VerifyError("keys_unavailable", f"{url}: not JSON") from None
    if not isinstance(doc, dict):
        raise VerifyError("keys_unavailable", f"{url}: not a JSON object")
    return doc


def _jwks_uri(issuer: str, meta: dict[str, Any]) -> str:
    """The metadata's ``jwks_uri``, once its ``issuer`` is ``issuer`` exactly."""
    if meta.get("issuer") != issuer:
        raise VerifyError("keys_unavailable", f"the metadata names another issuer than {issuer}")
    jwks_uri = meta.get("jwks_uri")
    if not isinstance(jwks_uri, str):
        raise VerifyError("keys_unavailable", "the metadata has no jwks_uri")
    return jwks_uri


def _kid_of(authorization: str | None) -> str | None:
    """The ``kid`` a DPoP token's header names, if it can be read at all
    (the full checks come after, in their order)."""
    if authorization is None:
        return None
    token = authorization.partition(" ")[2].strip()
    if not token or len(token) > MAX_TOKEN:
        return None
    try:
        part = token.split(".")[0]
        header = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (ValueError, binascii.Error):
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else None


@dataclass(frozen=True)
class Principal:
    """Who the request is for: the person is (``subject_iss``, ``sub``);
    ``subject_iss`` is absent only from tokens of brokers that predate it."""

    subject_iss: str | None
    sub: str
    agent: str
    tool: str | None
    #: The orchestrator's step the token was derived in (``act.step``), when
    #: the broker records it.
    step: str | None
    scopes: tuple[str, ...]
    jkt: str
    exp: int
    #: The token's ``jti``.
    jti: str = ""
    #: Whether the token is single-use (an ``each_call`` approval's): this
    #: verifier accepted it for this one request and refuses it after.
    single_use: bool = False
    #: The approval the token was minted on, if any.
    approval_id: str | None = None
    #: The call's RFC 9396 ``authorization_details``, as the broker checked
    #: them and, for a tool that needs approval, as the person approved them:
    #: compare them with what the request does (``docs/RESOURCE-SERVERS.md``).
    authorization_details: Any = None
    #: The digest of the one request the token is bound to (``req_sha256``),
    #: checked against the request handed to the verifier; ``None`` for a
    #: token bound to no request.
    req_sha256: str | None = None


def _b64(part: str, err: Callable[[str], VerifyError], what: str) -> bytes:
    if not _B64URL.match(part):
        raise err(f"{what} is not base64url")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (ValueError, binascii.Error):
        raise err(f"{what} is not base64url") from None


def _split(
    compact: str, err: Callable[[str], VerifyError], what: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    parts = compact.split(".")
    if len(parts) != 3:
        raise err(f"the {what} is not a compact JWS")
    try:
        header = json.loads(_b64(parts[0], err, f"the {what} header"))
        claims = json.loads(_b64(parts[1], err, f"the {what} payload"))
    except ValueError:
        raise err(f"the {what} header or payload is not JSON") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise err(f"the {what} header or payload is not a JSON object")
    _b64(parts[2], err, f"the {what} signature")
    return header, claims


def _signed_by(compact: str, key: ECKey, err: Callable[[str], VerifyError], what: str) -> None:
    try:
        jws.deserialize_compact(compact, key, algorithms=["ES256"])
    except JoseError:
        raise err(f"the {what} signature does not verify") from None


def _normal_url(url: str) -> tuple[str, str, int | None, str]:
    p = urlsplit(url)
    scheme = p.scheme.lower()
    try:
        port = p.port
    except ValueError:
        raise _proof("htu is not a URL") from None
    if (scheme, port) in (("http", 80), ("https", 443)):
        port = None
    return scheme, (p.hostname or ""), port, p.path or "/"


class ReplayCache:
    """The (``jkt``, ``jti``) pairs seen in the proof window. Full means
    refuse: a proof is never let through unchecked."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._seen: dict[tuple[str, str], float] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def check_and_record(self, jkt: str, jti: str, now: float, keep_until: float) -> None:
        with self._lock:
            if (jkt, jti) in self._seen and self._seen[(jkt, jti)] >= now:
                raise _proof("the proof was used before (replay)")
            if len(self._seen) >= self._capacity:
                self._seen = {k: t for k, t in self._seen.items() if t >= now}
            if len(self._seen) >= self._capacity:
                raise VerifyError(
                    "keys_unavailable", "the DPoP replay cache is full; retry shortly"
                )
            self._seen[(jkt, jti)] = keep_until


class Verifier:
    """Verifies requests for one audience (your resource URI) from one
    issuer. ``clock`` returns seconds since the epoch (tests inject one)."""

    def __init__(
        self,
        issuer: str,
        audience: str,
        jwks: dict[str, Any],
        *,
        clock: Callable[[], float] = time.time,
        replay: ReplayCache | None = None,
        single_use_store: SingleUseStore | AsyncSingleUseStore | None = None,
        fetch_jwks: Callable[[], dict[str, Any]] | None = None,
        fetch_jwks_async: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self._clock = clock
        self._replay = replay or ReplayCache()
        # `is None`, not `or`: an empty store may be falsy (it has a length).
        self._single_use: SingleUseStore | AsyncSingleUseStore = (
            MemorySingleUseStore() if single_use_store is None else single_use_store
        )
        self._fetch = fetch_jwks
        self._fetch_async = fetch_jwks_async
        self._last_fetch = float("-inf")
        self._keys = self._keys_of(jwks)

    @staticmethod
    def _keys_of(jwks: dict[str, Any]) -> dict[str, ECKey]:
        keys: dict[str, ECKey] = {}
        entries = jwks.get("keys") if isinstance(jwks, dict) else None
        if not isinstance(entries, list):
            raise VerifyError("keys_unavailable", "the JWKS has no keys list")
        for k in entries:
            if not isinstance(k, dict) or k.get("kty") != "EC" or k.get("crv") != "P-256":
                continue
            if k.get("alg", "ES256") != "ES256" or "d" in k or not isinstance(k.get("kid"), str):
                continue
            try:
                keys[k["kid"]] = ECKey.import_key({n: k[n] for n in ("kty", "crv", "x", "y")})
            except (JoseError, KeyError, ValueError):
                continue
        return keys

    @classmethod
    def from_issuer(
        cls,
        issuer: str,
        audience: str,
        *,
        clock: Callable[[], float] = time.time,
        http: httpx.Client | None = None,
        timeout: float = FETCH_TIMEOUT,
        single_use_store: SingleUseStore | None = None,
    ) -> Verifier:
        """Reads the issuer's RFC 8414 metadata (its ``issuer`` must be
        ``issuer`` exactly) and the JWKS it names; unknown ``kid``s refetch
        the JWKS, at most once a minute.

        What it reads from the network is capped while it reads: each
        document at most ``MAX_KEYS_DOCUMENT`` bytes (after any content
        decoding; the read stops at the first byte over), redirects refused
        (even when ``http`` follows them), and each fetch given ``timeout``
        seconds in all (checked between chunks, so a body dripped one byte
        at a time cannot hold it longer than that plus one read timeout)."""
        client = http or httpx.Client(timeout=timeout)

        def get(url: str) -> dict[str, Any]:
            return _json_object(url, _capped_get(client, url, timeout))

        jwks_uri = _jwks_uri(issuer, get(f"{issuer}/.well-known/oauth-authorization-server"))
        return cls(
            issuer,
            audience,
            get(jwks_uri),
            clock=clock,
            single_use_store=single_use_store,
            fetch_jwks=lambda: get(jwks_uri),
        )

    @classmethod
    async def from_issuer_async(
        cls,
        issuer: str,
        audience: str,
        *,
        clock: Callable[[], float] = time.time,
        http: httpx.AsyncClient | None = None,
        timeout: float = FETCH_TIMEOUT,
        single_use_store: SingleUseStore | AsyncSingleUseStore | None = None,
    ) -> Verifier:
        """:meth:`from_issuer` for asyncio, on an ``httpx.AsyncClient`` and
        with the same caps; the verifier it returns refetches the JWKS for an
        unknown ``kid`` in :meth:`verify_async`, never blocking the loop."""
        client = http or httpx.AsyncClient(timeout=timeout)

        async def get(url: str) -> dict[str, Any]:
            return _json_object(url, await _capped_get_async(client, url, timeout))

        jwks_uri = _jwks_uri(issuer, await get(f"{issuer}/.well-known/oauth-authorization-server"))
        return cls(
            issuer,
            audience,
            await get(jwks_uri),
            clock=clock,
            single_use_store=single_use_store,
            fetch_jwks_async=lambda: get(jwks_uri),
        )

    def _refetch_due(self, kid: str) -> bool:
        """An unknown ``kid``, and no refetch in the last minute: the time to
        read the JWKS again (recorded now, whatever the fetch gives)."""
        now = self._clock()
        if kid in self._keys or now - self._last_fetch < REFRESH_INTERVAL:
            return False
        self._last_fetch = now
        return True

    def _key(self, kid: str, *, fetch: bool) -> ECKey:
        """The issuer's key ``kid``; with ``fetch``, an unknown one may make
        the blocking fetch (never in :meth:`verify_async`, which awaits its
        own before)."""
        if fetch and self._fetch is not None and self._refetch_due(kid):
            self._keys = self._keys_of(self._fetch())
        key = self._keys.get(kid)
        if key is None:
            raise _token("the token names a key the issuer does not publish")
        return key

    def verify(
        self,
        method: str,
        url: str,
        authorization: str | None,
        dpop: Sequence[str],
        *,
        nonce: Callable[[str], bool] | None = None,
        content_type: str | None = None,
        body: bytes | str | None = None,
    ) -> Principal:
        """Checks one request. ``url`` is your configured public URL plus the
        request's raw path and query (as on the request line, never
        decoded), never built from ``Host``; ``dpop`` is every ``DPoP``
        header value the request carried.

        ``body`` (the body as received, ``b""`` for none) and
        ``content_type`` (the ``Content-Type`` as received, ``None`` for
        none) hand the verifier the request: a token bound to one request
        (``req_sha256``, check 20) must be bound to this one (its method,
        the raw path and query of ``url``, the content type and the body).
        Without ``body`` such a token is refused. A refused request does not
        use a single-use token up.

        With ``nonce`` (RFC 9449 section 9), the proof must carry a ``nonce``
        for which it returns true; otherwise the error is ``use_dpop_nonce``:
        answer 401 with ``e.challenge()`` and a fresh ``DPoP-Nonce`` header.

        A single-use token is then recorded in the single-use store (a
        synchronous one: with an :class:`AsyncSingleUseStore`, use
        :meth:`verify_async`) and refused if it was there.

        A verifier from :meth:`from_issuer_async` never fetches here: use
        :meth:`verify_async` in an asyncio server."""
        who = self._verify(method, url, authorization, dpop, nonce, fetch=True)
        _check_request(who, method, url, content_type, body)
        if who.single_use:
            first = self._insert(who)
            if inspect.isawaitable(first):
                if inspect.iscoroutine(first):
                    first.close()
                raise VerifyError(
                    "replay_store_unavailable", "an async single-use store needs verify_async"
                )
            _first_use(first)
        return who

    async def verify_async(
        self,
        method: str,
        url: str,
        authorization: str | None,
        dpop: Sequence[str],
        *,
        nonce: Callable[[str], bool] | None = None,
        content_type: str | None = None,
        body: bytes | str | None = None,
    ) -> Principal:
        """:meth:`verify` for asyncio (``content_type`` and ``body`` as
        there): the JWKS refetch for an unknown ``kid`` (at most once a
        minute) is awaited on the verifier's ``httpx.AsyncClient``; the
        checks themselves read nothing from the network and run inline, and
        a single-use token is recorded in the single-use store (awaited, for
        an :class:`AsyncSingleUseStore`)."""
        kid = _kid_of(authorization)
        if kid is not None and self._fetch_async is not None and self._refetch_due(kid):
            self._keys = self._keys_of(await self._fetch_async())
        who = self._verify(method, url, authorization, dpop, nonce, fetch=False)
        _check_request(who, method, url, content_type, body)
        if who.single_use:
            first = self._insert(who)
            if inspect.isawaitable(first):
                try:
                    first = await first
                except Exception:  # noqa: BLE001 - any store failure refuses the request
                    raise _store_failed() from None
            _first_use(first)
        return who

    def _insert(self, who: Principal) -> object:
        """The store's insert for a single-use token, until its expiry plus
        the skew (while the token could still pass the time check): its
        answer, or its awaitable for an async store. A store that raises
        refuses the request."""
        try:
            return self._single_use.insert_if_absent(
                self.issuer, who.jti, who.exp + SKEW, self._clock()
            )
        except Exception:  # noqa: BLE001 - any store failure refuses the request
            raise _store_failed() from None

    def _verify(
        self,
        method: str,
        url: str,
        authorization: str | None,
        dpop: Sequence[str],
        nonce: Callable[[str], bool] | None,
        *,
        fetch: bool,
    ) -> Principal:
        now = self._clock()
        # 1, 2: the request.
        if authorization is None:
            raise VerifyError("missing", "no Authorization header")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "dpop":
            raise _token("the token is DPoP-bound; the Authorization scheme must be DPoP")
        token = token.strip()
        if not token or len(token) > MAX_TOKEN:
            raise _token("the token is empty or larger than 8 KiB")
        header, claims = _split(token, _token, "token")
        # 3: the header, against allow-lists.
        # typ compares case-insensitively (RFC 7515 section 4.1.9), as in Rust.
        typ = header.get("typ")
        if not isinstance(typ, str) or typ.lower() != "at+jwt":
            raise _token("typ is not at+jwt")
        if header.get("alg") != "ES256":
            raise _token("alg is not ES256")
        if "crit" in header:
            raise _token("unknown crit")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise _token("no kid")
        # 4, 5: key and signature.
        _signed_by(token, self._key(kid, fetch=fetch), _token, "token")
        # 6: claim types.
        iss, sub, aud = claims.get("iss"), claims.get("sub"), claims.get("aud")
        iat, exp, subject_iss = claims.get("iat"), claims.get("exp"), claims.get("subject_iss")
        cnf, act = claims.get("cnf"), claims.get("act")
        scope = claims.get("scope", "")
        jkt = cnf.get("jkt") if isinstance(cnf, dict) else None
        agent = act.get("sub") if isinstance(act, dict) else None
        tool = act.get("tool") if isinstance(act, dict) else None
        step = act.get("step") if isinstance(act, dict) else None
        token_jti = claims.get("jti")
        if not all(isinstance(v, str) for v in (iss, sub, aud, token_jti, jkt, agent, scope)):
            raise _token("iss, sub, aud, jti, cnf.jkt, act.sub or scope is missing or not a string")
        if subject_iss is not None and not isinstance(subject_iss, str):
            raise _token("subject_iss is not a string")
        if not all(type(v) is int for v in (iat, exp)):
            raise _token("iat or exp is not an integer")
        if not all(v is None or isinstance(v, str) for v in (tool, step)):
            raise _token("act.tool or act.step is not a string")
        single_use = claims.get("single_use", False)
        approval_id = claims.get("approval_id")
        if type(single_use) is not bool or not (
            approval_id is None or isinstance(approval_id, str)
        ):
            raise _token("single_use is not a boolean or approval_id not a string")
        req_sha256 = claims.get("req_sha256")
        if not (req_sha256 is None or isinstance(req_sha256, str)):
            raise _token("req_sha256 is not a string")
        assert isinstance(iat, int) and isinstance(exp, int)  # noqa: S101 - narrowed above
        assert isinstance(jkt, str) and isinstance(scope, str)  # noqa: S101 - narrowed above
        # 7, 8, 9: issuer, audience, time.
        if iss != self.issuer:
            raise _token("the token is from another issuer")
        if aud != self.audience:
            raise _token("the token is for another audience")
        if now >= exp + SKEW:
            raise _token("the token has expired")
        if iat > now + SKEW:
            raise _token("the token is issued in the future")
        # 10, 11: one proof, its header and signature.
        if len(dpop) != 1:
            raise _proof("exactly one DPoP header is needed")
        proof = dpop[0]
        if len(proof) > MAX_PROOF:
            raise _proof("the proof is larger than 4 KiB")
        ph, pc = _split(proof, _proof, "proof")
        if ph.get("typ") != "dpop+jwt" or ph.get("alg") != "ES256" or "crit" in ph:
            raise _proof("the proof header must have typ dpop+jwt, alg ES256 and no crit")
        jwk = ph.get("jwk")
        if (
            not isinstance(jwk, dict)
            or "d" in jwk
            or jwk.get("kty") != "EC"
            or jwk.get("crv") != "P-256"
        ):
            raise _proof("the proof's jwk is not a public EC P-256 key")
        try:
            pkey = ECKey.import_key({n: jwk[n] for n in ("kty", "crv", "x", "y")})
        except (JoseError, KeyError, ValueError, TypeError):
            raise _proof("the proof's jwk is not a usable key") from None
        _signed_by(proof, pkey, _proof, "proof")
        # 12-16: the proof's claims.
        jti, htm, htu, piat = pc.get("jti"), pc.get("htm"), pc.get("htu"), pc.get("iat")
        if (
            not (isinstance(jti, str) and isinstance(htm, str) and isinstance(htu, str))
            or type(piat) is not int
        ):
            raise _proof("jti, htm, htu (strings) and iat (integer) are required")
        assert isinstance(piat, int)  # noqa: S101 - narrowed above
        if htm != method:
            raise _proof("htm is not the request method")
        if _normal_url(htu) != _normal_url(url):
            raise _proof("htu is not the request URL")
        if abs(now - piat) > PROOF_WINDOW:
            raise _proof("iat is too far from now")
        if nonce is not None:
            got = pc.get("nonce")
            if not isinstance(got, str) or not nonce(got):
                raise VerifyError("use_dpop_nonce", "a fresh server nonce is required")
        want_ath = ath_of(token)
        got_ath = pc.get("ath")
        if not isinstance(got_ath, str) or not hmac.compare_digest(got_ath, want_ath):
            raise _proof("ath does not match the token")
        # 17: the key binding.
        if not hmac.compare_digest(pkey.thumbprint(), jkt):
            raise _proof("the proof is signed by another key than the token is bound to")
        # 18: replay, recorded only now (19, a single-use token, is recorded
        # by the caller, in its store).
        self._replay.check_and_record(jkt, jti, now, now + PROOF_WINDOW + SKEW)
        assert subject_iss is None or isinstance(subject_iss, str)  # noqa: S101 - narrowed above
        assert isinstance(sub, str)  # noqa: S101 - narrowed above
        assert isinstance(agent, str)  # noqa: S101 - narrowed above
        assert tool is None or isinstance(tool, str)  # noqa: S101 - narrowed above
        assert step is None or isinstance(step, str)  # noqa: S101 - narrowed above
        assert isinstance(token_jti, str)  # noqa: S101 - narrowed above
        return Principal(
            subject_iss,
            sub,
            agent,
            tool,
            step,
            tuple(scope.split()),
            jkt,
            exp,
            jti=token_jti,
            single_use=single_use,
            approval_id=approval_id,
            authorization_details=claims.get("authorization_details"),
            req_sha256=req_sha256,
        )


def _raw_path_and_query(url: str) -> tuple[str, str]:
    """The raw path and query of ``url`` (never decoded): ``/`` for an
    empty path, ``""`` for no query; the fragment is dropped."""
    url = url.split("#", 1)[0]
    i = url.find("://")
    rest = url[i + 3 :] if i >= 0 else url
    starts = [j for j in (rest.find("/"), rest.find("?")) if j >= 0]
    target = rest[min(starts) :] if starts else ""
    path, _, query = target.partition("?")
    return path or "/", query


def _check_request(
    who: Principal, method: str, url: str, content_type: str | None, body: bytes | str | None
) -> None:
    """Check 20: a token bound to one request (``req_sha256``) is refused
    unless the request handed to the verifier is that one. Made after the
    proof, before a single-use token is recorded."""
    if who.req_sha256 is None:
        return
    if body is None:
        raise _token("the token is bound to one request: verify it with the request's body")
    path, query = _raw_path_and_query(url)
    try:
        got = bind(BoundRequest(method, path, query, content_type or "", body)).sha256
    except RequestError as e:
        raise _token(f"the request cannot be bound ({e.reason})") from None
    if not hmac.compare_digest(got.encode(), who.req_sha256.encode("utf-8")):
        raise _token("the request is not the one the token is bound to")


def _store_failed() -> VerifyError:
    return VerifyError(
        "replay_store_unavailable", "the single-use store could not record the token"
    )


def _first_use(inserted: object) -> None:
    """Refuses a single-use token the store already held; anything but a
    plain ``True`` or ``False`` from the store refuses too."""
    if inserted is True:
        return
    if inserted is False:
        raise _token("the token is single-use and was already used")
    raise _store_failed()
