//! The relayed proof: the tool's DPoP proof for the upstream's token
//! endpoint (the broker never holds the tool's key), checked before
//! anything is sent. The AS checks it again; these checks make sure the
//! broker only ever relays a proof that binds the token to the same key as
//! the derive, for that endpoint, once.

use serde::Deserialize;

use super::UpstreamError;
use crate::base::dpop::{self, DpopError};
use crate::base::jose;

/// The claims read before the signature is checked, only to refuse (never
/// to grant): `htu` compared byte for byte, and `ath` that a proof for a
/// token request never carries.
#[derive(Deserialize)]
struct Peek {
    htu: Option<serde_json::Value>,
    ath: Option<serde_json::Value>,
    nonce: Option<serde_json::Value>,
}

/// Whether `proof` carries a `nonce` other than `current`, the AS's
/// current nonce as this instance knows it (or none). Read before the
/// signature is checked, only to refuse; a proof that cannot be read is
/// left to [`check`], which refuses it as invalid.
pub(super) fn stale_nonce(proof: &str, current: &str) -> bool {
    let Ok([_, payload, _]) = jose::split(proof, dpop::MAX_PROOF_LEN) else {
        return false;
    };
    match jose::b64d(payload, "payload")
        .ok()
        .and_then(|p| serde_json::from_slice::<Peek>(&p).ok())
    {
        Some(peek) => peek.nonce.as_ref().and_then(|n| n.as_str()) != Some(current),
        None => false,
    }
}

/// Checks `proof` for `token_endpoint` (`htu`: its normalised form) signed
/// by the key whose thumbprint is `jkt`, and records its `jti`.
pub(super) fn check(
    validator: &dpop::Validator,
    proof: &str,
    token_endpoint: &str,
    htu: &str,
    jkt: &str,
    now: i64,
) -> Result<(), UpstreamError> {
    let [_, payload, _] = jose::split(proof, dpop::MAX_PROOF_LEN)
        .map_err(|_| UpstreamError::ProofInvalid("is not a compact JWS"))?;
    let peek: Peek = jose::b64d(payload, "payload")
        .ok()
        .and_then(|p| serde_json::from_slice(&p).ok())
        .ok_or(UpstreamError::ProofInvalid("has malformed claims"))?;
    if peek.htu.as_ref().and_then(|h| h.as_str()) != Some(token_endpoint) {
        return Err(UpstreamError::ProofInvalid(
            "is not for the upstream's token endpoint (htu must be byte-equal to it)",
        ));
    }
    if peek.ath.is_some() {
        return Err(UpstreamError::ProofInvalid(
            "carries ath: a proof for a token request has none",
        ));
    }
    let expect = dpop::Expect {
        method: "POST",
        htu,
        access_token: None,
        jkt: Some(jkt),
        now,
    };
    validator
        .validate(proof, &expect)
        .map(|_| ())
        .map_err(|e| match e {
            DpopError::KeyMismatch => {
                UpstreamError::ProofInvalid("is signed by another key than the derive's proof")
            }
            DpopError::Htm => UpstreamError::ProofInvalid("has an htm other than POST"),
            DpopError::Htu => UpstreamError::ProofInvalid(
                "is not for the upstream's token endpoint (htu must be byte-equal to it)",
            ),
            DpopError::Iat => UpstreamError::ProofInvalid("has an iat outside the accepted window"),
            DpopError::Replay => UpstreamError::ProofInvalid("was already used (jti)"),
            DpopError::ReplayCacheFull => UpstreamError::ProofCacheFull,
            DpopError::Typ | DpopError::Alg | DpopError::Jwk => {
                UpstreamError::ProofInvalid("has an unacceptable header (typ, alg or jwk)")
            }
            _ => UpstreamError::ProofInvalid("does not verify"),
        })
}
