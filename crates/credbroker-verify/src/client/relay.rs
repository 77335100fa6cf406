//! The relayed proofs of a derive for an `exchange` resource (the broker's
//! docs/UPSTREAM.md): the tool's DPoP proof for each upstream
//! authorization server's token endpoint, sent with the derive as
//! `upstream_proofs`, because the broker never holds the tool's key.
//!
//! Where they go comes from `GET /v1/info` (`upstreams.<name>.token_endpoint`
//! and `.dpop_nonce`, `upstream_resources`), read once per client: one leg
//! per upstream named for the resource and, for an `id_jag` upstream (identity
//! chaining), a second leg at its `resource_upstream`; an
//! `upstream_proof_required` refusal names the `htu` (and the AS's nonce) to
//! sign instead, and the client retries once with it (reading the info
//! again, since the policy may have changed).

use std::collections::BTreeMap;

use serde_json::Value;

/// One leg: the upstream's name, the `htu` to sign byte for byte, and the
/// AS's nonce when it uses one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Leg {
    pub(super) htu: String,
    pub(super) nonce: Option<String>,
}

/// What `GET /v1/info` says about one upstream.
#[derive(Debug, Clone, Default)]
struct Upstream {
    /// Its token endpoint, once the broker knows it.
    token_endpoint: Option<String>,
    /// Its last DPoP nonce.
    nonce: Option<String>,
    /// For an `id_jag` upstream: the upstream of its second leg.
    resource_upstream: Option<String>,
}

/// What `GET /v1/info` says about upstreams.
#[derive(Debug, Clone, Default)]
pub(super) struct UpstreamInfo {
    /// By upstream name.
    upstreams: BTreeMap<String, Upstream>,
    /// By `exchange` resource (canonical URI): its upstreams' names.
    resources: BTreeMap<String, Vec<String>>,
}

impl UpstreamInfo {
    /// Reads the members of an info document; anything missing or of
    /// another shape is taken as "no upstreams" (an older broker).
    pub(super) fn parse(info: &Value) -> UpstreamInfo {
        let mut out = UpstreamInfo::default();
        if let Some(ups) = info.get("upstreams").and_then(Value::as_object) {
            for (name, u) in ups {
                let s = |k: &str| u.get(k).and_then(Value::as_str).map(str::to_owned);
                let resource_upstream = match s("grant").as_deref() {
                    Some("id_jag") => s("resource_upstream"),
                    _ => None,
                };
                out.upstreams.insert(
                    name.clone(),
                    Upstream {
                        token_endpoint: s("token_endpoint"),
                        nonce: s("dpop_nonce"),
                        resource_upstream,
                    },
                );
            }
        }
        if let Some(res) = info.get("upstream_resources").and_then(Value::as_object) {
            for (uri, names) in res {
                let names = match names {
                    Value::String(n) => vec![n.clone()],
                    Value::Array(a) => a
                        .iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect(),
                    _ => continue,
                };
                out.resources.insert(uri.clone(), names);
            }
        }
        out
    }

    /// The legs of a derive for `resource`: one per upstream the info
    /// names for it, and for an `id_jag` one its `resource_upstream` too
    /// (leg 2), each whose token endpoint is known.
    pub(super) fn legs(&self, resource: &str) -> BTreeMap<String, Leg> {
        let names = self.resources.get(resource).or_else(|| {
            // The info lists canonical URIs; a trailing slash is the
            // difference callers most often make.
            let alt = match resource.strip_suffix('/') {
                Some(r) => r.to_owned(),
                None => format!("{resource}/"),
            };
            self.resources.get(&alt)
        });
        let mut out = BTreeMap::new();
        for name in names.into_iter().flatten() {
            let second = self
                .upstreams
                .get(name)
                .and_then(|u| u.resource_upstream.as_ref());
            for name in std::iter::once(name).chain(second) {
                if let Some(Upstream {
                    token_endpoint: Some(htu),
                    nonce,
                    ..
                }) = self.upstreams.get(name)
                {
                    out.insert(
                        name.clone(),
                        Leg {
                            htu: htu.clone(),
                            nonce: nonce.clone(),
                        },
                    );
                }
            }
        }
        out
    }

    /// The upstream whose token endpoint is `htu` (what a refusal names),
    /// else the first the info names for `resource`.
    pub(super) fn name_for(&self, htu: &str, resource: &str) -> Option<String> {
        self.upstreams
            .iter()
            .find(|(_, u)| u.token_endpoint.as_deref() == Some(htu))
            .map(|(n, _)| n.clone())
            .or_else(|| {
                self.resources
                    .get(resource)
                    .and_then(|n| n.first().cloned())
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic
    use super::*;

    #[test]
    fn legs_come_from_the_info_and_a_refusal_is_matched_by_its_htu() {
        let info = serde_json::json!({
            "upstreams": {
                "org": {"issuer": "https://as.example", "token_endpoint": "https://as.example/token", "dpop_nonce": "n1"},
                "later": {"issuer": "https://later.example"}
            },
            "upstream_resources": {"https://api.example/notes": "org", "https://b.example/": "later"}
        });
        let u = UpstreamInfo::parse(&info);
        let legs = u.legs("https://api.example/notes");
        assert_eq!(
            legs["org"],
            Leg {
                htu: "https://as.example/token".into(),
                nonce: Some("n1".into())
            }
        );
        // A trailing slash more; then an upstream whose endpoint is not
        // known yet, and a `self` resource: no leg.
        assert_eq!(u.legs("https://api.example/notes/").len(), 1);
        assert!(u.legs("https://b.example/").is_empty());
        assert!(u.legs("https://self.example/").is_empty());
        assert_eq!(
            u.name_for("https://as.example/token", "x").as_deref(),
            Some("org")
        );
        assert_eq!(
            u.name_for("https://new.example/token", "https://b.example/")
                .as_deref(),
            Some("later")
        );
        assert_eq!(u.name_for("https://new.example/token", "x"), None);
        // An `id_jag` upstream: a leg at its resource AS too, with its own
        // htu and nonce; a refusal naming leg 2's htu is matched to it.
        let info = serde_json::json!({
            "upstreams": {
                "org": {"token_endpoint": "https://idp.example/token", "grant": "id_jag", "resource_upstream": "crm"},
                "crm": {"token_endpoint": "https://crm-as.example/token", "dpop_nonce": "c1", "grant": "token_exchange"},
                "tx": {"token_endpoint": "https://tx.example/token", "grant": "token_exchange", "resource_upstream": "crm"}
            },
            "upstream_resources": {"https://crm.example/api": "org", "https://tx.example/api": "tx"}
        });
        let u = UpstreamInfo::parse(&info);
        let legs = u.legs("https://crm.example/api");
        assert_eq!(legs.len(), 2);
        assert_eq!(legs["org"].htu, "https://idp.example/token");
        assert_eq!(
            legs["crm"],
            Leg {
                htu: "https://crm-as.example/token".into(),
                nonce: Some("c1".into())
            }
        );
        assert_eq!(
            u.name_for("https://crm-as.example/token", "https://crm.example/api")
                .as_deref(),
            Some("crm")
        );
        // resource_upstream on a token-exchange upstream means nothing.
        assert_eq!(u.legs("https://tx.example/api").len(), 1);
        // An older broker's info: nothing.
        assert!(UpstreamInfo::parse(&serde_json::json!({"issuer": "i"}))
            .legs("https://api.example/notes")
            .is_empty());
    }
}
