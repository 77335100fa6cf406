"""An ``exchange`` resource end to end (the broker's docs/UPSTREAM.md): the
client makes the relayed proof for the organisation's authorization server
by itself, and follows that server's DPoP nonce; for an ID-JAG resource it
makes one proof per leg (the IdP's token endpoint and the resource AS's). The server is the real
one of the Rust tests (tests/peers/org-as.mjs: oidc-provider with the
RFC 8693 grant), which checks the relayed proof and binds its token to
that key; the token is checked here with joserfc against its JWKS.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import REPO, QuickstartBroker, start_broker
from joserfc import jwt
from joserfc.jwk import KeySet

from credbroker_client import AsyncBroker, Broker, InvalidRequest, ToolKey

ORG_RESOURCE = "https://org-api.example/notes"


class OrgAs:
    """tests/peers/org-as.mjs, driven over its stdin."""

    def __init__(self, tmp: Path) -> None:
        peers = REPO / "tests" / "peers"
        if not (peers / "node_modules" / "oidc-provider").is_dir():
            pytest.fail("tests/peers/node_modules is missing: run scripts/install-test-deps")
        self.secret = "org-client-secret-py"
        cfg = tmp / "org-as.json"
        cfg.write_text(
            json.dumps(
                {
                    "client_id": "credbroker",
                    "client_secret": self.secret,
                    "audience": "repo-helper",
                    "resources": {ORG_RESOURCE: {"scope": "notes:read notes:write"}},
                }
            )
        )
        self.proc = subprocess.Popen(
            ["node", str(peers / "org-as.mjs"), str(cfg)],
            cwd=peers,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        hello = json.loads(self.proc.stdout.readline())
        self.issuer: str = hello["issuer"]
        self.token_endpoint: str = hello["token_endpoint"]

    def call(self, cmd: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def subject(self, sub: str = "alice") -> str:
        return str(self.call({"cmd": "subject", "sub": sub, "ttl": 3600})["token"])

    def exchanges(self) -> int:
        return int(self.call({"cmd": "count"})["exchanges"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def org(tmp_module: Path) -> Iterator[tuple[OrgAs, QuickstartBroker]]:
    o = OrgAs(tmp_module)
    secret = tmp_module / "org.secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, o.secret.encode())
    os.close(fd)
    config = f"""
[[trusted_issuers]]
issuer = "{o.issuer}"
jwks_uri = "{o.issuer}/jwks"
sign_in = {{ kind = "oidc", client_id = "credbroker" }}

[upstreams.org]
issuer = "{o.issuer}"
client_id = "credbroker"
client_secret_file = "{secret}"
subject_issuers = ["{o.issuer}"]
timeout = "5s"
"""
    policy = f"""
[resources."{ORG_RESOURCE}"]
source = "exchange"
upstream = "org"

[tools."org.notes"]
resource = "{ORG_RESOURCE}"
scopes = ["notes:read", "notes:write"]
steps = ["summarize"]
"""
    b = start_broker(tmp_module, extra_config=config, extra_policy=policy)
    yield o, b
    b.stop()
    o.stop()


def check(o: OrgAs, token: str, key: ToolKey) -> None:
    """The org AS's token, checked as a resource server trusting only that
    server's keys would: signature, iss, aud, and bound to ``key``."""
    keys = KeySet.import_key_set(httpx.get(f"{o.issuer}/jwks").json())
    t = jwt.decode(token, keys, algorithms=["ES256"])
    assert t.header["typ"] == "at+jwt"
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": o.issuer},
        aud={"essential": True, "value": ORG_RESOURCE},
        exp={"essential": True},
    ).validate(t.claims)
    assert t.claims["cnf"] == {"jkt": key.thumbprint}
    assert t.claims["scope"] == "notes:read"
    assert t.claims["sub"] == "alice"


def test_the_client_makes_the_relayed_proof_and_follows_the_as_nonce(
    org: tuple[OrgAs, QuickstartBroker],
) -> None:
    o, b = org
    key = ToolKey.generate()
    subject = o.subject()
    sent = o.exchanges()
    with Broker(b.socket) as broker:
        info = broker.info()
        assert info.upstream.upstreams["org"][0] == o.token_endpoint
        issued = broker.derive(
            subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key
        )
        check(o, issued.token, key)
        assert issued.token_type == "DPoP" and issued.sender_constrained
        assert o.exchanges() == sent + 1, "right the first time"

        # The control: the same derive without the relayed proof is refused,
        # and nothing reaches the AS.
        body = {
            "subject_token": subject,
            "step": "summarize",
            "tool": "org.notes",
            "resource": ORG_RESOURCE,
            "scope": "notes:read",
        }
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(b.socket))) as raw:
            r = raw.post(
                "http://credbroker/v1/derive",
                json=body,
                headers={"DPoP": key.proof("POST", info.derive_htu)},
            )
        assert r.status_code == 400 and r.json()["reason"] == "upstream_proof_required"
        assert r.json()["upstream_htu"] == o.token_endpoint
        assert o.exchanges() == sent + 1

        # An AS that requires its nonce: one retry, with the nonce the
        # refusal names; then the nonce is remembered.
        assert o.call({"cmd": "mode", "mode": "nonce"})["ok"] is True
        try:
            issued = broker.derive(
                subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key
            )
            check(o, issued.token, key)
            assert o.exchanges() == sent + 3
            broker.derive(subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key)
            assert o.exchanges() == sent + 4
        finally:
            o.call({"cmd": "mode", "mode": "ok"})

        # A refusal the retry cannot cure is raised as usual: a subject token
        # from an issuer not listed for the upstream (nothing sent).
        with pytest.raises(InvalidRequest) as e:
            broker.derive(b.subject_token("alice"), "summarize", "org.notes", ORG_RESOURCE, key=key)
        assert "not listed" in str(e.value)
        assert o.exchanges() == sent + 4


def test_the_async_client_too(org: tuple[OrgAs, QuickstartBroker]) -> None:
    o, b = org
    key = ToolKey.generate()
    subject = o.subject()

    async def main() -> str:
        async with AsyncBroker(b.socket) as broker:
            issued = await broker.derive(
                subject, "summarize", "org.notes", ORG_RESOURCE, "notes:read", key=key
            )
        return issued.token

    check(o, anyio.run(main), key)


CRM = "https://crm.example/api"


class NodePeer:
    """A peer of tests/peers (``script``), its config ``cfg``, driven over its
    stdin: its first line is its hello."""

    def __init__(self, tmp: Path, script: str, cfg: dict[str, Any]) -> None:
        peers = REPO / "tests" / "peers"
        path = tmp / f"{script}.json"
        path.write_text(json.dumps(cfg))
        self.proc = subprocess.Popen(
            ["node", str(peers / script), str(path)],
            cwd=peers,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.hello: dict[str, Any] = json.loads(self.proc.stdout.readline())

    def call(self, cmd: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@dataclass
class Chain:
    """Identity chaining (ID-JAG): the org IdP (tests/peers/org-as.mjs) and
    the resource's own AS (tests/peers/resource-as.mjs), as in the Rust
    tests (tests/it/upstreams/id_jag.rs), and a broker with both."""

    idp: NodePeer
    ras: NodePeer
    broker: QuickstartBroker

    def counts(self) -> tuple[int, int]:
        """Token requests each AS received so far: (IdP, resource AS)."""
        return (
            int(self.idp.call({"cmd": "count"})["exchanges"]),
            int(self.ras.call({"cmd": "count"})["redemptions"]),
        )

    def last_proof(self, peer: NodePeer) -> dict[str, Any]:
        """The claims of the relayed proof ``peer`` last received."""
        proof = peer.call({"cmd": "last"})["dpop"]
        payload = proof.split(".")[1]
        return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


@pytest.fixture(scope="module")
def chain(tmp_module: Path) -> Iterator[Chain]:
    tmp = tmp_module / "chain"
    tmp.mkdir()
    idp_secret, ras_secret, ras_client = "org-secret-py", "crm-secret-py", "credbroker-at-crm"
    idp = NodePeer(
        tmp,
        "org-as.mjs",
        {
            "client_id": "credbroker",
            "client_secret": idp_secret,
            "audience": "repo-helper",
            "resources": {},
            "advertise_id_jag": True,
        },
    )
    iss = idp.hello["issuer"]
    ras = NodePeer(
        tmp,
        "resource-as.mjs",
        {
            "client_id": ras_client,
            "client_secret": ras_secret,
            "idp_issuer": iss,
            "idp_jwks_uri": f"{iss}/jwks",
            "resources": {CRM: {"scope": "crm:read crm:write"}},
        },
    )
    ras_iss = ras.hello["issuer"]
    assert idp.call({"cmd": "id_jag", "audience": ras_iss, "client_id": ras_client})["ok"]
    files = {}
    for name, secret in (("org", idp_secret), ("crm", ras_secret)):
        files[name] = tmp / f"{name}.secret"
        fd = os.open(files[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secret.encode())
        os.close(fd)
    config = f"""
[[trusted_issuers]]
issuer = "{iss}"
jwks_uri = "{iss}/jwks"
sign_in = {{ kind = "oidc", client_id = "credbroker" }}

[upstreams.org]
issuer = "{iss}"
client_id = "credbroker"
client_secret_file = "{files["org"]}"
subject_issuers = ["{iss}"]
grant = "id_jag"
resource_upstream = "crm"
timeout = "5s"

[upstreams.crm]
issuer = "{ras_iss}"
client_id = "{ras_client}"
client_secret_file = "{files["crm"]}"
timeout = "5s"
"""
    policy = f"""
[resources."{CRM}"]
source = "exchange"
upstream = "org"

[tools."crm.read"]
resource = "{CRM}"
scopes = ["crm:read", "crm:write"]
steps = ["summarize"]
"""
    b = start_broker(tmp, extra_config=config, extra_policy=policy)
    yield Chain(idp, ras, b)
    b.stop()
    ras.stop()
    idp.stop()


def check_chained(c: Chain, token: str, key: ToolKey) -> None:
    """The resource AS's token, checked as a resource server trusting only
    that server's keys would, and bound to ``key``."""
    iss = c.ras.hello["issuer"]
    keys = KeySet.import_key_set(httpx.get(f"{iss}/jwks").json())
    t = jwt.decode(token, keys, algorithms=["ES256"])
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": iss},
        aud={"essential": True, "value": CRM},
        exp={"essential": True},
    ).validate(t.claims)
    assert t.claims["cnf"] == {"jkt": key.thumbprint}
    assert t.claims["scope"] == "crm:read"
    assert t.claims["sub"] == "alice"


def test_the_client_makes_one_proof_per_leg_for_an_id_jag_resource(chain: Chain) -> None:
    c = chain
    key = ToolKey.generate()
    subject = str(c.idp.call({"cmd": "subject", "sub": "alice", "ttl": 3600})["token"])
    o, r = c.counts()
    with Broker(c.broker.socket) as broker:
        info = broker.info()
        # The control: with leg 1's proof only, the broker refuses naming
        # leg 2's token endpoint, and nothing is sent to either AS.
        body = {
            "subject_token": subject,
            "step": "summarize",
            "tool": "crm.read",
            "resource": CRM,
            "scope": "crm:read",
            "upstream_proofs": {"org": key.proof("POST", c.idp.hello["token_endpoint"])},
        }
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(c.broker.socket))) as raw:
            refused = raw.post(
                "http://credbroker/v1/derive",
                json=body,
                headers={"DPoP": key.proof("POST", info.derive_htu)},
            )
        assert refused.json()["reason"] == "upstream_proof_required"
        assert refused.json()["upstream_htu"] == c.ras.hello["token_endpoint"]
        assert c.counts() == (o, r)

        # Both proofs right the first time, each for its own leg's endpoint.
        issued = broker.derive(subject, "summarize", "crm.read", CRM, "crm:read", key=key)
        check_chained(c, issued.token, key)
        assert c.counts() == (o + 1, r + 1)
        assert c.last_proof(c.idp)["htu"] == c.idp.hello["token_endpoint"]
        assert c.last_proof(c.ras)["htu"] == c.ras.hello["token_endpoint"]

        # The resource AS requires its nonce: one retry with the nonce the
        # refusal names for leg 2 (leg 1 is sent again), then remembered.
        assert c.ras.call({"cmd": "mode", "mode": "nonce"})["ok"] is True
        try:
            issued = broker.derive(subject, "summarize", "crm.read", CRM, "crm:read", key=key)
            check_chained(c, issued.token, key)
            assert c.counts() == (o + 3, r + 3)
            assert isinstance(c.last_proof(c.ras).get("nonce"), str)
            issued = broker.derive(subject, "summarize", "crm.read", CRM, "crm:read", key=key)
            assert c.counts() == (o + 4, r + 4)
        finally:
            c.ras.call({"cmd": "mode", "mode": "ok"})

    async def main() -> str:
        async with AsyncBroker(c.broker.socket) as broker:
            issued = await broker.derive(subject, "summarize", "crm.read", CRM, "crm:read", key=key)
        return issued.token

    check_chained(c, anyio.run(main), key)
    assert c.counts() == (o + 5, r + 5)
