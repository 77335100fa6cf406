//! Keys, JWS and DPoP proofs made by hand, for forged and near-valid tokens:
//! any header, any claims, RSA and HMAC signers, an independent thumbprint.
#![allow(dead_code, missing_docs, clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::jose::Es256Key;

pub(crate) fn key() -> Es256Key {
    Es256Key::generate().unwrap().0
}

/// A compact JWS from any header and claims, signed by `sign` over the
/// signing input: for forged `alg`s, keys and shapes.
pub(crate) fn jws_with(
    header: &serde_json::Value,
    claims: &serde_json::Value,
    sign: impl FnOnce(&[u8]) -> Vec<u8>,
) -> String {
    use credbroker::internals::jose::b64e;
    let input = format!(
        "{}.{}",
        b64e(header.to_string().as_bytes()),
        b64e(claims.to_string().as_bytes())
    );
    let sig = sign(input.as_bytes());
    format!("{input}.{}", b64e(&sig))
}

/// A compact JWS whose header and payload are given as raw bytes (for JSON
/// that serde_json cannot produce: duplicate keys, huge numbers, deep nesting).
pub(crate) fn jws_raw(header: &[u8], payload: &[u8], key: &Es256Key) -> String {
    use credbroker::internals::jose::b64e;
    let input = format!("{}.{}", b64e(header), b64e(payload));
    let sig = key.sign_raw(input.as_bytes()).unwrap();
    format!("{input}.{}", b64e(&sig))
}

/// The public JWK of `key` as a DPoP proof carries it.
pub(crate) fn proof_jwk(key: &Es256Key) -> serde_json::Value {
    let mut jwk = key.public_jwk.clone();
    let o = jwk.as_object_mut().unwrap();
    o.remove("kid");
    o.remove("use");
    o.remove("alg");
    jwk
}

/// A DPoP proof signed (ES256) by `key` with the standard header
/// (`typ` `dpop+jwt`, `jwk`) patched by `header_patch` (a `null` member
/// removes it) and the given claims.
pub(crate) fn proof_with(
    key: &Es256Key,
    header_patch: serde_json::Value,
    claims: &serde_json::Value,
) -> String {
    let mut h = serde_json::json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": proof_jwk(key)});
    patch(&mut h, &header_patch);
    jws_with(&h, claims, |input| key.sign_raw(input).unwrap())
}

/// Sets members of `target` from `patch`; a `null` in `patch` removes it.
pub(crate) fn patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    if let (Some(t), Some(p)) = (target.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The decoded payload of a compact JWS.
pub(crate) fn claims_of(token: &str) -> serde_json::Value {
    let p = token.split('.').nth(1).expect("payload");
    serde_json::from_slice(&credbroker::internals::jose::b64d(p, "payload").unwrap()).unwrap()
}

/// The decoded header of a compact JWS.
pub(crate) fn header_of(token: &str) -> serde_json::Value {
    let h = token.split('.').next().expect("header");
    serde_json::from_slice(&credbroker::internals::jose::b64d(h, "header").unwrap()).unwrap()
}

/// An RSA-2048 key (aws-lc-rs) for issuers that sign with RS256/PS256 and
/// for forged-key cases.
pub(crate) struct RsaKey {
    pair: aws_lc_rs::rsa::KeyPair,
    pub kid: String,
}

impl RsaKey {
    pub(crate) fn generate(kid: &str) -> RsaKey {
        RsaKey {
            pair: aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap(),
            kid: kid.to_string(),
        }
    }

    /// The public JWK (with `kid`, without `alg`).
    pub(crate) fn public_jwk(&self) -> serde_json::Value {
        use aws_lc_rs::signature::KeyPair;
        let c = aws_lc_rs::rsa::PublicKeyComponents::<Vec<u8>>::from(self.pair.public_key());
        serde_json::json!({
            "kty": "RSA", "kid": self.kid, "use": "sig",
            "n": credbroker::internals::jose::b64e(&c.n), "e": credbroker::internals::jose::b64e(&c.e),
        })
    }

    /// The SubjectPublicKeyInfo DER of the public key.
    pub(crate) fn public_der(&self) -> Vec<u8> {
        use aws_lc_rs::encoding::AsDer;
        use aws_lc_rs::signature::KeyPair;
        self.pair.public_key().as_der().unwrap().as_ref().to_vec()
    }

    pub(crate) fn sign_rs256(&self, msg: &[u8]) -> Vec<u8> {
        self.sign(&aws_lc_rs::signature::RSA_PKCS1_SHA256, msg)
    }

    pub(crate) fn sign_ps256(&self, msg: &[u8]) -> Vec<u8> {
        self.sign(&aws_lc_rs::signature::RSA_PSS_SHA256, msg)
    }

    fn sign(&self, alg: &'static dyn aws_lc_rs::signature::RsaEncoding, msg: &[u8]) -> Vec<u8> {
        let mut sig = vec![0u8; self.pair.public_modulus_len()];
        self.pair
            .sign(alg, &aws_lc_rs::rand::SystemRandom::new(), msg, &mut sig)
            .unwrap();
        sig
    }
}

/// HMAC-SHA256 of `msg` under `key` (for `HS256` forgeries).
pub(crate) fn hs256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    aws_lc_rs::hmac::sign(&k, msg).as_ref().to_vec()
}

/// The RFC 7638 thumbprint of an EC P-256 JWK, computed here independently
/// of the crate (sha2, canonical member order).
pub(crate) fn ec_thumbprint(jwk: &serde_json::Value) -> String {
    use sha2::Digest;
    let canonical = format!(
        r#"{{"crv":"{}","kty":"EC","x":"{}","y":"{}"}}"#,
        jwk["crv"].as_str().unwrap(),
        jwk["x"].as_str().unwrap(),
        jwk["y"].as_str().unwrap()
    );
    credbroker::internals::jose::b64e(&sha2::Sha256::digest(canonical.as_bytes()))
}

/// Fails the test (never skips it) when the peers are not installed.
pub(crate) fn require_peers() {
    super::prereq::node_peers();
}
