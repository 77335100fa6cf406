//! Standard Webhooks signatures: `v1,` is HMAC-SHA256 under a `whsec_`
//! secret, `v1a,` Ed25519 under a `whsk_` key, both over
//! `{webhook-id}.{webhook-timestamp}.{body}` and base64 (standard alphabet).
//! Several signatures go space-separated in one `webhook-signature` header
//! (a secret rotation: one per secret file).
//!
//! The keys are read from their files (mode 0600) for each batch, so a
//! rotation needs no restart; a key never appears in a message.

use aws_lc_rs::{hmac, signature::KeyPair};
use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

use crate::base::secret::{read_secret_file, SecretBytes};
use crate::infra::config::{Signing, WebhookConfig};

/// Standard base64 that accepts a secret with or without its padding.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a subscription's keys cannot be used. Names the file, never its
/// content.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    /// The file cannot be read or has a loose mode.
    #[error("{0}")]
    Read(String),
    /// The content is not a key of the right form.
    #[error("{0}: {1}")]
    Form(String, &'static str),
}

/// The keys of one subscription, read from their files.
pub(crate) struct Signer {
    hmac: Vec<hmac::Key>,
    ed25519: Option<aws_lc_rs::signature::Ed25519KeyPair>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("v1_keys", &self.hmac.len())
            .field("v1a", &self.ed25519.is_some())
            .finish_non_exhaustive()
    }
}

fn decoded(path: &std::path::Path, prefix: &str) -> Result<SecretBytes, KeyError> {
    let name = path.display().to_string();
    let raw = read_secret_file(path).map_err(|e| KeyError::Read(e.to_string()))?;
    let text = std::str::from_utf8(raw.expose())
        .map_err(|_| KeyError::Form(name.clone(), "not text"))?
        .trim();
    let b64 = text.strip_prefix(prefix).ok_or(KeyError::Form(
        name.clone(),
        "does not start with the key's prefix (whsec_ or whsk_)",
    ))?;
    let bytes = LENIENT
        .decode(b64)
        .map_err(|_| KeyError::Form(name, "is not base64 after its prefix"))?;
    Ok(SecretBytes::new(bytes))
}

impl Signer {
    /// Reads the subscription's key files.
    pub(crate) fn load(c: &WebhookConfig) -> Result<Signer, KeyError> {
        match c.signing {
            Signing::V1 => {
                let mut hmac_keys = Vec::new();
                for p in &c.secret_files {
                    let k = decoded(p, "whsec_")?;
                    if k.expose().len() < 24 {
                        return Err(KeyError::Form(
                            p.display().to_string(),
                            "holds fewer than 24 bytes of secret",
                        ));
                    }
                    hmac_keys.push(hmac::Key::new(hmac::HMAC_SHA256, k.expose()));
                }
                Ok(Signer {
                    hmac: hmac_keys,
                    ed25519: None,
                })
            }
            Signing::V1a => {
                let p = c
                    .ed25519_key_file
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""));
                Ok(Signer {
                    hmac: Vec::new(),
                    ed25519: Some(ed25519_key(p)?),
                })
            }
        }
    }

    /// The `webhook-signature` header's value.
    pub(crate) fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut input = Vec::with_capacity(id.len() + body.len() + 24);
        input.extend_from_slice(id.as_bytes());
        input.push(b'.');
        input.extend_from_slice(timestamp.to_string().as_bytes());
        input.push(b'.');
        input.extend_from_slice(body);
        let b64 = general_purpose::STANDARD;
        let mut out: Vec<String> = self
            .hmac
            .iter()
            .map(|k| format!("v1,{}", b64.encode(hmac::sign(k, &input))))
            .collect();
        if let Some(kp) = &self.ed25519 {
            out.push(format!("v1a,{}", b64.encode(kp.sign(&input))));
        }
        out.join(" ")
    }

    /// The `whpk_` public key receivers verify `v1a` with (none for `v1`).
    pub(crate) fn public_key(&self) -> Option<String> {
        self.ed25519.as_ref().map(|kp| {
            format!(
                "whpk_{}",
                general_purpose::STANDARD.encode(kp.public_key().as_ref())
            )
        })
    }
}

/// A `whsk_` key: base64 of the 32-byte seed, or of the seed and the
/// public key (64 bytes, libsodium's form, checked against each other).
fn ed25519_key(p: &std::path::Path) -> Result<aws_lc_rs::signature::Ed25519KeyPair, KeyError> {
    let name = p.display().to_string();
    let k = decoded(p, "whsk_")?;
    let bytes = k.expose();
    let pair = match bytes.len() {
        32 => aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(bytes),
        64 => aws_lc_rs::signature::Ed25519KeyPair::from_seed_and_public_key(
            &bytes[..32],
            &bytes[32..],
        ),
        _ => return Err(KeyError::Form(name, "is not a 32- or 64-byte Ed25519 key")),
    };
    pair.map_err(|_| KeyError::Form(name, "is not a valid Ed25519 key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's example: secret, id,
    /// timestamp, body and the signature it gives.
    #[test]
    fn v1_matches_the_specification_example() {
        let key = LENIENT.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let s = Signer {
            hmac: vec![hmac::Key::new(hmac::HMAC_SHA256, &key)],
            ed25519: None,
        };
        assert_eq!(
            s.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn two_secrets_give_two_signatures_and_v1a_verifies_with_its_public_key() {
        let a = hmac::Key::new(hmac::HMAC_SHA256, &[1u8; 32]);
        let b = hmac::Key::new(hmac::HMAC_SHA256, &[2u8; 32]);
        let s = Signer {
            hmac: vec![a, b],
            ed25519: None,
        };
        let h = s.sign("msg_1", 5, b"{}");
        assert_eq!(h.split(' ').count(), 2);
        assert!(h.split(' ').all(|p| p.starts_with("v1,")));
        let kp = aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(&[7u8; 32]).unwrap();
        let public = kp.public_key().as_ref().to_vec();
        let s = Signer {
            hmac: Vec::new(),
            ed25519: Some(kp),
        };
        let h = s.sign("msg_1", 5, b"{}");
        let sig = general_purpose::STANDARD
            .decode(h.strip_prefix("v1a,").unwrap())
            .unwrap();
        let pk =
            aws_lc_rs::signature::UnparsedPublicKey::new(&aws_lc_rs::signature::ED25519, &public);
        assert!(pk.verify(b"msg_1.5.{}", &sig).is_ok());
        // Positive control's negative: another body does not verify.
        assert!(pk.verify(b"msg_1.5.{ }", &sig).is_err());
        assert!(s.public_key().unwrap().starts_with("whpk_"));
    }
}
