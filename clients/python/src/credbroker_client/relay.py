"""The relayed proofs of a derive for an ``exchange`` resource (the broker's
docs/UPSTREAM.md): the tool's DPoP proof for each upstream authorization
server's token endpoint, sent with the derive as ``upstream_proofs``, since
the broker never holds the tool's key.

Where they go comes from ``GET /v1/info`` (``upstreams.<name>.token_endpoint``
and ``.dpop_nonce``, ``upstream_resources``): one leg per upstream named for the
resource and, for an ``id_jag`` upstream (identity chaining), a second leg at
its ``resource_upstream``; a refusal with reason
``upstream_proof_required`` names the ``htu`` (and the server's nonce) to sign
instead, and the client retries once with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Leg:
    """One relayed proof to make: ``htu`` byte for byte, with ``nonce``."""

    htu: str
    nonce: str | None


@dataclass(frozen=True)
class UpstreamInfo:
    """What ``GET /v1/info`` says about upstreams."""

    #: By upstream name: (token endpoint once known, last DPoP nonce).
    upstreams: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    #: By ``exchange`` resource (canonical URI): its upstreams' names.
    resources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: By ``id_jag`` upstream name: the upstream of its second leg.
    second: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def parse(info: Any) -> UpstreamInfo:
        """Reads the members; anything missing or of another shape is taken
        as "no upstreams" (an older broker)."""
        ups: dict[str, tuple[str | None, str | None]] = {}
        res: dict[str, tuple[str, ...]] = {}
        second: dict[str, str] = {}
        if not isinstance(info, dict):
            return UpstreamInfo()
        raw_ups = info.get("upstreams")
        if isinstance(raw_ups, dict):
            for name, u in raw_ups.items():
                if isinstance(u, dict):
                    te, n = u.get("token_endpoint"), u.get("dpop_nonce")
                    ups[name] = (
                        te if isinstance(te, str) else None,
                        n if isinstance(n, str) else None,
                    )
                    ru = u.get("resource_upstream")
                    if u.get("grant") == "id_jag" and isinstance(ru, str):
                        second[name] = ru
        raw_res = info.get("upstream_resources")
        if isinstance(raw_res, dict):
            for uri, names in raw_res.items():
                if isinstance(names, str):
                    res[uri] = (names,)
                elif isinstance(names, list):
                    res[uri] = tuple(n for n in names if isinstance(n, str))
        return UpstreamInfo(ups, res, second)

    def legs(self, resource: str, nonces: dict[str, str]) -> dict[str, Leg]:
        """The legs of a derive for ``resource`` (one per upstream named for it
        and, for an ``id_jag`` one, its ``resource_upstream`` too: leg 2), each
        whose token endpoint is known, with the latest nonce known for it."""
        names = self.resources.get(resource)
        if names is None:
            # The info lists canonical URIs; a trailing slash is the
            # difference callers most often make.
            alt = resource[:-1] if resource.endswith("/") else resource + "/"
            names = self.resources.get(alt, ())
        out: dict[str, Leg] = {}
        for first in names:
            for name in (first, self.second.get(first)):
                if name is None:
                    continue
                te, nonce = self.upstreams.get(name, (None, None))
                if te is not None:
                    out[name] = Leg(te, nonces.get(name, nonce))
        return out

    def name_for(self, htu: str, resource: str) -> str | None:
        """The upstream whose token endpoint is ``htu`` (what a refusal
        names), else the first the info names for ``resource``."""
        for name, (te, _) in self.upstreams.items():
            if te == htu:
                return name
        names = self.resources.get(resource, ())
        return names[0] if names else None


def proof_required(status: int, body: Any) -> tuple[str, str | None] | None:
    """The ``htu`` and nonce an ``upstream_proof_required`` refusal names."""
    if status != 400 or not isinstance(body, dict):
        return None
    if body.get("reason") != "upstream_proof_required":
        return None
    htu, nonce = body.get("upstream_htu"), body.get("upstream_nonce")
    if not isinstance(htu, str):
        return None
    return htu, nonce if isinstance(nonce, str) else None
