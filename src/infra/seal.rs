//! Encryption at rest: AES-256-GCM (aws-lc-rs) with a per-record random
//! nonce, associated data bound to the record's own key, and a key id in
//! every record so that keys can rotate.
//!
//! Record layout: `version(1) || key_id(8) || nonce(12) || ciphertext+tag`.

use std::collections::HashMap;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

use crate::base::secret::SecretBytes;

const VERSION: u8 = 1;

/// Errors sealing or opening a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// A key file is not exactly 32 bytes.
    #[error("an encryption key must be exactly 32 bytes")]
    KeyLength,
    /// The record names a key we do not have.
    #[error("the record was sealed with key {0}, which is not loaded")]
    UnknownKey(String),
    /// The record is malformed, tampered with, or belongs to another key.
    #[error("the record does not decrypt (tampered, truncated or moved)")]
    Open,
    /// Encryption failed.
    #[error("encryption failed")]
    Seal,
}

/// A set of AEAD keys: one current key for sealing, all for opening.
pub struct Sealer {
    keys: HashMap<[u8; 8], LessSafeKey>,
    current: [u8; 8],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("current", &hex::encode(self.current))
            .finish_non_exhaustive()
    }
}

/// The id of a key: the first 8 bytes of SHA-256 over a label and the key.
fn key_id(key: &[u8]) -> [u8; 8] {
    let mut h = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    h.update(b"credbroker key id\0");
    h.update(key);
    let mut id = [0u8; 8];
    id.copy_from_slice(&h.finish().as_ref()[..8]);
    id
}

impl Sealer {
    /// A sealer whose current key is `current`; `others` can still open.
    pub fn new(current: &SecretBytes, others: &[SecretBytes]) -> Result<Sealer, SealError> {
        let mut keys = HashMap::new();
        for k in std::iter::once(current).chain(others) {
            let unbound =
                UnboundKey::new(&AES_256_GCM, k.expose()).map_err(|_| SealError::KeyLength)?;
            keys.insert(key_id(k.expose()), LessSafeKey::new(unbound));
        }
        Ok(Sealer {
            keys,
            current: key_id(current.expose()),
        })
    }

    /// Hex id of the current key.
    pub fn current_key_id(&self) -> String {
        hex::encode(self.current)
    }

    /// Hex id of the key that sealed `record`, if it parses.
    pub fn record_key_id(record: &[u8]) -> Option<String> {
        (record.len() > 9 && record[0] == VERSION).then(|| hex::encode(&record[1..9]))
    }

    /// Encrypts `plaintext`, bound to `aad` (the record's own key).
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let key = self.keys.get(&self.current).ok_or(SealError::Seal)?;
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| SealError::Seal)?;
        let mut buf = plaintext.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        )
        .map_err(|_| SealError::Seal)?;
        let mut out = Vec::with_capacity(1 + 8 + NONCE_LEN + buf.len());
        out.push(VERSION);
        out.extend_from_slice(&self.current);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        zeroize::Zeroize::zeroize(&mut buf);
        Ok(out)
    }

    /// Decrypts a record sealed for `aad`.
    pub fn open(&self, aad: &[u8], record: &[u8]) -> Result<SecretBytes, SealError> {
        if record.len() < 1 + 8 + NONCE_LEN + 16 || record[0] != VERSION {
            return Err(SealError::Open);
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&record[1..9]);
        let key = self
            .keys
            .get(&id)
            .ok_or_else(|| SealError::UnknownKey(hex::encode(id)))?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&record[9..9 + NONCE_LEN]);
        let mut buf = record[9 + NONCE_LEN..].to_vec();
        let len = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf,
            )
            .map_err(|_| SealError::Open)?
            .len();
        buf.truncate(len);
        Ok(SecretBytes::new(buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SecretBytes {
        SecretBytes::new(vec![b; 32])
    }

    #[test]
    fn round_trip_and_binding() {
        let s = Sealer::new(&key(1), &[]).unwrap();
        let rec = s.seal(b"keys/a", b"secret").unwrap();
        assert_eq!(s.open(b"keys/a", &rec).unwrap().expose(), b"secret");
        // Moved to another record: fails.
        assert_eq!(s.open(b"keys/b", &rec).unwrap_err(), SealError::Open);
        // A flipped bit: fails.
        let mut flipped = rec.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(s.open(b"keys/a", &flipped).unwrap_err(), SealError::Open);
        // Positive control after the failures.
        assert!(s.open(b"keys/a", &rec).is_ok());
    }

    #[test]
    fn rotation_keeps_old_records_readable() {
        let old = Sealer::new(&key(1), &[]).unwrap();
        let rec = old.seal(b"k", b"v").unwrap();
        let new = Sealer::new(&key(2), &[key(1)]).unwrap();
        assert_eq!(new.open(b"k", &rec).unwrap().expose(), b"v");
        let only_new = Sealer::new(&key(2), &[]).unwrap();
        assert!(matches!(
            only_new.open(b"k", &rec),
            Err(SealError::UnknownKey(_))
        ));
        assert_eq!(
            Sealer::new(&SecretBytes::new(vec![0; 16]), &[]).unwrap_err(),
            SealError::KeyLength
        );
    }
}
