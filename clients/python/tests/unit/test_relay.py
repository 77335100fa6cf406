"""credbroker_client.relay: which relayed proofs a derive carries."""

from __future__ import annotations

from credbroker_client.relay import Leg, UpstreamInfo, proof_required

INFO = {
    "upstreams": {
        "org": {
            "issuer": "https://as.example",
            "token_endpoint": "https://as.example/token",
            "dpop_nonce": "n1",
        },
        "later": {"issuer": "https://later.example"},
    },
    "upstream_resources": {"https://api.example/notes": "org", "https://b.example/": "later"},
}


def test_legs_come_from_the_info_with_the_latest_nonce() -> None:
    u = UpstreamInfo.parse(INFO)
    assert u.legs("https://api.example/notes", {}) == {"org": Leg("https://as.example/token", "n1")}
    # A nonce learnt since wins; a trailing slash more still matches.
    assert u.legs("https://api.example/notes/", {"org": "n2"}) == {
        "org": Leg("https://as.example/token", "n2")
    }
    # An upstream whose endpoint is not known yet, a `self` resource, an
    # older broker's info: no leg.
    assert u.legs("https://b.example/", {}) == {}
    assert u.legs("https://self.example/", {}) == {}
    assert UpstreamInfo.parse({"issuer": "i"}).legs("https://api.example/notes", {}) == {}


def test_a_refusal_is_matched_by_its_htu() -> None:
    u = UpstreamInfo.parse(INFO)
    assert u.name_for("https://as.example/token", "x") == "org"
    assert u.name_for("https://new.example/token", "https://b.example/") == "later"
    assert u.name_for("https://new.example/token", "x") is None
    body = {
        "error": "invalid_dpop_proof",
        "reason": "upstream_proof_required",
        "upstream_htu": "https://as.example/token",
        "upstream_nonce": "n3",
    }
    assert proof_required(400, body) == ("https://as.example/token", "n3")
    # Only that refusal, with its htu, is retried.
    assert proof_required(400, {**body, "reason": "upstream_proof_invalid"}) is None
    assert proof_required(400, {k: v for k, v in body.items() if k != "upstream_htu"}) is None
    assert proof_required(403, body) is None


def test_an_id_jag_upstream_gets_a_second_leg_at_its_resource_upstream() -> None:
    u = UpstreamInfo.parse(
        {
            "upstreams": {
                "org": {
                    "token_endpoint": "https://idp.example/token",
                    "grant": "id_jag",
                    "resource_upstream": "crm",
                },
                "crm": {"token_endpoint": "https://crm-as.example/token", "dpop_nonce": "c1"},
                "tx": {
                    "token_endpoint": "https://tx.example/token",
                    "grant": "token_exchange",
                    "resource_upstream": "crm",
                },
            },
            "upstream_resources": {
                "https://crm.example/api": "org",
                "https://tx.example/api": "tx",
            },
        }
    )
    assert u.legs("https://crm.example/api", {"crm": "c2"}) == {
        "org": Leg("https://idp.example/token", None),
        "crm": Leg("https://crm-as.example/token", "c2"),
    }
    # A refusal naming leg 2's htu is matched to leg 2's upstream.
    assert u.name_for("https://crm-as.example/token", "https://crm.example/api") == "crm"
    # resource_upstream means nothing on a token-exchange upstream.
    assert list(u.legs("https://tx.example/api", {})) == ["tx"]
