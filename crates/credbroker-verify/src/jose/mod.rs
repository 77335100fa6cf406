//! Strict JOSE building blocks shared by subject tokens, DPoP proofs, minted
//! tokens and the resource-server verifier.
//!
//! Parsing follows one order (docs/DESIGN.md section 9): size cap -> three parts -> strict
//! base64url -> header (typed; `crit` rejected) -> key -> signature -> claims.
//! Which `alg` is acceptable, and which `typ`, is decided by the caller from a
//! per-context allow-list; this module only guarantees that an `alg` is bound
//! to the type of the key that verifies it.
//!
//! ES256 runs on aws-lc-rs (constant-time, the fastest here); RSA is only for
//! verifying subject tokens of IdPs that sign with RS256/PS256.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::secret::SecretBytes;

/// Default cap on the size of any compact JWS we accept.
pub const MAX_JWS_LEN: usize = 16 * 1024;

/// Errors from parsing or verifying a JWS or a JWK. They carry no input bytes.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum JoseError {
    /// The token exceeds the size cap.
    #[error("token is larger than {0} bytes")]
    TooLarge(usize),
    /// Not exactly three dot-separated parts.
    #[error("not a compact JWS (expected three dot-separated parts)")]
    NotCompact,
    /// A part is not strict base64url without padding.
    #[error("invalid base64url in the {0}")]
    Base64(&'static str),
    /// The header or payload is not the JSON object expected.
    #[error("invalid {0}")]
    Json(&'static str),
    /// `alg` is not allowed here, or does not match the key.
    #[error("alg is not allowed")]
    Alg,
    /// `crit` is present: no extension is understood.
    #[error("crit header is not supported")]
    Crit,
    /// A key is malformed, private, of the wrong type or off the curve.
    #[error("invalid key: {0}")]
    Key(&'static str),
    /// The signature does not verify.
    #[error("signature does not verify")]
    Signature,
    /// A signing operation failed.
    #[error("signing failed")]
    Sign,
}

/// Signature algorithms this crate knows. Anything else is [`JoseError::Alg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Alg {
    /// ECDSA P-256 with SHA-256.
    ES256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RS256,
    /// RSASSA-PSS with SHA-256.
    PS256,
}

impl Alg {
    /// Parses an `alg` value byte for byte.
    pub fn parse(s: &str) -> Result<Alg, JoseError> {
        match s {
            "ES256" => Ok(Alg::ES256),
            "RS256" => Ok(Alg::RS256),
            "PS256" => Ok(Alg::PS256),
            _ => Err(JoseError::Alg),
        }
    }
    /// The registered name.
    pub fn as_str(self) -> &'static str {
        match self {
            Alg::ES256 => "ES256",
            Alg::RS256 => "RS256",
            Alg::PS256 => "PS256",
        }
    }
}

/// A JOSE header, typed. Unknown members are ignored, except `crit`, which is
/// always refused. `jku`, `x5u` and `x5c` are never read: keys come only from
/// pinned configuration (or, for DPoP, from the `jwk` member).
#[derive(Debug, Deserialize)]
pub struct Header {
    /// `alg`, checked later against an allow-list.
    pub alg: String,
    /// `typ`, compared exactly by the caller.
    #[serde(default)]
    pub typ: Option<String>,
    /// `kid`.
    #[serde(default)]
    pub kid: Option<String>,
    /// `jwk` (DPoP proofs only).
    #[serde(default)]
    pub jwk: Option<Value>,
    /// `crit`: presence alone is an error, whatever the value (even `null`,
    /// which an `Option` would read as absent).
    #[serde(default, deserialize_with = "present")]
    crit: bool,
    /// `b64` (RFC 7797): refused; we only do the base64url payload.
    #[serde(default, deserialize_with = "present")]
    b64: bool,
}

/// Records that a member is present, whatever its value.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// A parsed, not yet verified, compact JWS.
#[derive(Debug)]
pub struct Jws<'a> {
    /// The typed header.
    pub header: Header,
    /// `BASE64URL(header) || '.' || BASE64URL(payload)`.
    pub signing_input: &'a str,
    /// The decoded payload bytes.
    pub payload: Vec<u8>,
    /// The decoded signature.
    pub signature: Vec<u8>,
}

/// Strict base64url (no padding, no stray bits, URL alphabet only).
pub fn b64d(s: &str, what: &'static str) -> Result<Vec<u8>, JoseError> {
    URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| JoseError::Base64(what))
}

/// base64url without padding.
pub fn b64e(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// SHA-256 of `data`, base64url-encoded (thumbprints, `ath`, hashes in events).
pub fn sha256_b64(data: &[u8]) -> String {
    b64e(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data).as_ref())
}

/// SHA-256 of `data`, hex-encoded.
pub fn sha256_hex(data: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data);
    // A table lookup per byte into a fixed buffer (hex::encode goes
    // through a char iterator): several of these run on every proxied call.
    let mut out = [0u8; 64];
    match hex::encode_to_slice(digest.as_ref(), &mut out) {
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        Err(_) => hex::encode(digest.as_ref()),
    }
}

/// The three non-empty parts of a compact JWS (header, payload,
/// signature, still base64url), after its size check: the first two steps
/// of [`parse`].
pub fn split(token: &str, max_len: usize) -> Result<[&str; 3], JoseError> {
    if token.len() > max_len {
        return Err(JoseError::TooLarge(max_len));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JoseError::NotCompact);
    };
    if h.is_empty() || p.is_empty() || s.is_empty() {
        return Err(JoseError::NotCompact);
    }
    Ok([h, p, s])
}

/// Splits and decodes a compact JWS, in the order size -> parts -> base64url
/// -> header. The signature is not checked here.
pub fn parse(token: &str, max_len: usize) -> Result<Jws<'_>, JoseError> {
    let [h, p, s] = split(token, max_len)?;
    let header_bytes = b64d(h, "header")?;
    let payload = b64d(p, "payload")?;
    let signature = b64d(s, "signature")?;
    let header: Header =
        serde_json::from_slice(&header_bytes).map_err(|_| JoseError::Json("header"))?;
    if header.crit || header.b64 {
        return Err(JoseError::Crit);
    }
    Ok(Jws {
        header,
        signing_input: &token[..h.len() + 1 + p.len()],
        payload,
        signature,
    })
}

/// How a context compares the header's `typ`.
#[derive(Debug, Clone, Copy)]
pub enum TypRule<'a> {
    /// Present and equal byte for byte (DPoP proofs: RFC 9449 section 4.2
    /// names one exact value).
    Exact(&'a str),
    /// Present and equal ignoring ASCII case.
    IgnoreCase(&'a str),
    /// One of these media types, compared as RFC 7515 section 4.1.9 allows:
    /// ignoring ASCII case, with or without the `application/` prefix. With
    /// `absent_ok`, a header without `typ` passes too (plain JWTs such as
    /// ID tokens need not say what they are).
    MediaTypes {
        /// The acceptable types.
        allowed: &'a [&'a str],
        /// Whether a missing `typ` is acceptable.
        absent_ok: bool,
    },
}

/// What a context accepts in a JWS header, besides what [`parse`] already
/// refuses everywhere (`crit`, `b64`).
#[derive(Debug, Clone, Copy)]
pub struct HeaderRule<'a> {
    /// The `typ` comparison.
    pub typ: TypRule<'a>,
    /// The `alg` allow-list; the key later binds `alg` to its own type
    /// ([`Jwk::verify`]).
    pub algs: &'a [Alg],
}

/// Which header check failed; each caller maps it to its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// `typ` is missing or not acceptable here.
    #[error("typ is not acceptable here")]
    Typ,
    /// `alg` is unknown or not in the allow-list.
    #[error("alg is not allowed here")]
    Alg,
}

/// A media type without its optional `application/` prefix, lower-cased.
pub fn normalize_typ(t: &str) -> String {
    let t = t.to_ascii_lowercase();
    t.strip_prefix("application/")
        .map(str::to_owned)
        .unwrap_or(t)
}

/// The one header check of every JWT this crate reads: `typ` by `rule.typ`,
/// then `alg` in `rule.algs`. Returns the parsed `alg` for the key and
/// signature steps that follow.
pub fn check_header(header: &Header, rule: &HeaderRule<'_>) -> Result<Alg, HeaderError> {
    let typ = header.typ.as_deref();
    let typ_ok = match rule.typ {
        TypRule::Exact(want) => typ == Some(want),
        TypRule::IgnoreCase(want) => typ.is_some_and(|t| t.eq_ignore_ascii_case(want)),
        TypRule::MediaTypes { allowed, absent_ok } => match typ {
            None => absent_ok,
            Some(t) => {
                let t = normalize_typ(t);
                allowed.iter().any(|a| normalize_typ(a) == t)
            }
        },
    };
    if !typ_ok {
        return Err(HeaderError::Typ);
    }
    let alg = Alg::parse(&header.alg).map_err(|_| HeaderError::Alg)?;
    if !rule.algs.contains(&alg) {
        return Err(HeaderError::Alg);
    }
    Ok(alg)
}

/// A public verification key, parsed once and reused.
#[derive(Clone)]
pub enum PublicKey {
    /// P-256 point, checked on the curve when parsed, kept parsed for speed.
    P256(signature::ParsedPublicKey),
    /// RSA modulus and exponent, big-endian; at least 2048 bits.
    Rsa {
        /// Modulus.
        n: Vec<u8>,
        /// Exponent.
        e: Vec<u8>,
    },
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublicKey::P256(_) => f.write_str("PublicKey::P256"),
            PublicKey::Rsa { n, .. } => write!(f, "PublicKey::Rsa({} bits)", n.len() * 8),
        }
    }
}

impl PublicKey {
    /// Verifies `sig` over `input` with `alg`, which must fit this key's type.
    pub fn verify(&self, alg: Alg, input: &[u8], sig: &[u8]) -> Result<(), JoseError> {
        match (self, alg) {
            (PublicKey::P256(parsed), Alg::ES256) => {
                if sig.len() != 64 {
                    return Err(JoseError::Signature);
                }
                parsed
                    .verify_sig(input, sig)
                    .map_err(|_| JoseError::Signature)
            }
            (PublicKey::Rsa { n, e }, Alg::RS256 | Alg::PS256) => {
                let params = if alg == Alg::RS256 {
                    &signature::RSA_PKCS1_2048_8192_SHA256
                } else {
                    &signature::RSA_PSS_2048_8192_SHA256
                };
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, input, sig)
                    .map_err(|_| JoseError::Signature)
            }
            _ => Err(JoseError::Alg),
        }
    }

    /// The algorithms this key may verify.
    pub fn allows(&self, alg: Alg) -> bool {
        matches!(
            (self, alg),
            (PublicKey::P256(_), Alg::ES256) | (PublicKey::Rsa { .. }, Alg::RS256 | Alg::PS256)
        )
    }
}

/// A public JWK as accepted from configuration, JWKS documents and DPoP proofs.
#[derive(Debug, Clone)]
pub struct Jwk {
    /// The parsed key.
    pub key: PublicKey,
    /// `kid`, if given.
    pub kid: Option<String>,
    /// `alg`, if given; then only that algorithm may use the key.
    pub alg: Option<Alg>,
    /// RFC 7638 thumbprint (SHA-256, base64url).
    pub thumbprint: String,
}

const PRIVATE_MEMBERS: [&str; 8] = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

fn str_member<'v>(
    obj: &'v serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<&'v str>, JoseError> {
    match obj.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(JoseError::Key("member of the wrong type")),
    }
}

fn required<'v>(
    obj: &'v serde_json::Map<String, Value>,
    name: &'static str,
) -> Result<&'v str, JoseError> {
    str_member(obj, name)?.ok_or(JoseError::Key(name))
}

impl Jwk {
    /// Parses a public JWK: EC P-256 or RSA (2048 bits or more). Private
    /// members, symmetric keys, other curves and points off the curve are
    /// refused.
    pub fn from_value(v: &Value) -> Result<Jwk, JoseError> {
        let obj = v.as_object().ok_or(JoseError::Key("not an object"))?;
        if PRIVATE_MEMBERS.iter().any(|m| obj.contains_key(*m)) {
            return Err(JoseError::Key("private or symmetric key material"));
        }
        let kid = str_member(obj, "kid")?.map(str::to_owned);
        let alg = str_member(obj, "alg")?.map(Alg::parse).transpose()?;
        if let Some(u) = str_member(obj, "use")? {
            if u != "sig" {
                return Err(JoseError::Key("use is not sig"));
            }
        }
        let (key, canonical) = match required(obj, "kty")? {
            "EC" => {
                if required(obj, "crv")? != "P-256" {
                    return Err(JoseError::Key("unsupported curve"));
                }
                let (xs, ys) = (required(obj, "x")?, required(obj, "y")?);
                let x = b64d(xs, "jwk")?;
                let y = b64d(ys, "jwk")?;
                if x.len() != 32 || y.len() != 32 {
                    return Err(JoseError::Key("coordinate length"));
                }
                let mut point = [0u8; 65];
                point[0] = 4;
                point[1..33].copy_from_slice(&x);
                point[33..].copy_from_slice(&y);
                let parsed =
                    signature::ParsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                        .map_err(|_| JoseError::Key("point is not on the curve"))?;
                let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{xs}","y":"{ys}"}}"#);
                (PublicKey::P256(parsed), canonical)
            }
            "RSA" => {
                let (ns, es) = (required(obj, "n")?, required(obj, "e")?);
                let n = b64d(ns, "jwk")?;
                let e = b64d(es, "jwk")?;
                // Count bits, not bytes: a 256-byte modulus may have fewer
                // than 2048 bits. Leading zeros would also change the
                // thumbprint of the same key (RFC 7518 section 2, minimal
                // octets).
                let n_bits = match n.first() {
                    Some(&top) if top != 0 => n.len() * 8 - top.leading_zeros() as usize,
                    _ => 0,
                };
                if n_bits < 2048 || e.is_empty() || e.len() > 8 || e.first() == Some(&0) {
                    return Err(JoseError::Key("RSA key too small or malformed"));
                }
                let canonical = format!(r#"{{"e":"{es}","kty":"RSA","n":"{ns}"}}"#);
                (PublicKey::Rsa { n, e }, canonical)
            }
            _ => return Err(JoseError::Key("unsupported kty")),
        };
        if let Some(a) = alg {
            if !key.allows(a) {
                return Err(JoseError::Key("alg does not match kty"));
            }
        }
        Ok(Jwk {
            key,
            kid,
            alg,
            thumbprint: sha256_b64(canonical.as_bytes()),
        })
    }

    /// Verifies a parsed JWS with this key, refusing an `alg` the key may not
    /// use. The caller has already checked `alg` against its allow-list.
    pub fn verify(&self, alg: Alg, jws: &Jws<'_>) -> Result<(), JoseError> {
        self.verify_signature(alg, jws.signing_input.as_bytes(), &jws.signature)
    }

    /// [`Jwk::verify`] of a signature over `input` (a JWS's signing input),
    /// for a caller that decoded the JWS's parts itself.
    pub fn verify_signature(&self, alg: Alg, input: &[u8], sig: &[u8]) -> Result<(), JoseError> {
        if self.alg.is_some_and(|a| a != alg) || !self.key.allows(alg) {
            return Err(JoseError::Alg);
        }
        self.key.verify(alg, input, sig)
    }
}

/// A set of public keys (a JWKS).
#[derive(Debug, Clone, Default)]
pub struct JwkSet {
    /// The keys, in document order.
    pub keys: Vec<Jwk>,
}

impl JwkSet {
    /// Parses `{"keys":[...]}`. A key that cannot be used is skipped (a JWKS
    /// may legitimately list encryption keys or other algorithms), but a
    /// document with no usable key is an error.
    pub fn from_json(bytes: &[u8]) -> Result<JwkSet, JoseError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|_| JoseError::Json("JWKS"))?;
        let keys = v
            .get("keys")
            .and_then(Value::as_array)
            .ok_or(JoseError::Json("JWKS"))?;
        let keys: Vec<Jwk> = keys
            .iter()
            .filter_map(|k| Jwk::from_value(k).ok())
            .collect();
        if keys.is_empty() {
            return Err(JoseError::Key("JWKS has no usable signing key"));
        }
        Ok(JwkSet { keys })
    }

    /// Picks the key for a header: by `kid` when given, else the only key that
    /// may use `alg`. Ambiguity is an error, never a guess.
    pub fn select(&self, kid: Option<&str>, alg: Alg) -> Option<&Jwk> {
        let mut it = self.keys.iter().filter(|k| {
            k.key.allows(alg)
                && k.alg.is_none_or(|a| a == alg)
                && match kid {
                    Some(kid) => k.kid.as_deref() == Some(kid),
                    None => true,
                }
        });
        let first = it.next()?;
        if it.next().is_some() {
            return None;
        }
        Some(first)
    }
}

/// An ES256 signing key (aws-lc-rs), with its public JWK and `kid`.
pub struct Es256Key {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
    /// `kid` = the RFC 7638 thumbprint of the public key.
    pub kid: String,
    /// The public JWK, as published in the JWKS.
    pub public_jwk: Value,
}

impl std::fmt::Debug for Es256Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Es256Key")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl Es256Key {
    /// Generates a key; returns it and its PKCS#8 document (a secret).
    pub fn generate() -> Result<(Es256Key, SecretBytes), JoseError> {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| JoseError::Sign)?;
        let pkcs8 = SecretBytes::new(doc.as_ref().to_vec());
        let key = Es256Key::from_pkcs8(pkcs8.expose())?;
        Ok((key, pkcs8))
    }

    /// Loads a key from PKCS#8 DER.
    pub fn from_pkcs8(der: &[u8]) -> Result<Es256Key, JoseError> {
        let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, der)
            .map_err(|_| JoseError::Key("not a P-256 PKCS#8 key"))?;
        let point = pair.public_key().as_ref();
        if point.len() != 65 {
            return Err(JoseError::Key("unexpected public key encoding"));
        }
        let x = b64e(&point[1..33]);
        let y = b64e(&point[33..]);
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let kid = sha256_b64(canonical.as_bytes());
        let public_jwk = serde_json::json!({
            "kty": "EC", "crv": "P-256", "x": x, "y": y,
            "kid": kid, "alg": "ES256", "use": "sig",
        });
        Ok(Es256Key {
            pair,
            rng: SystemRandom::new(),
            kid,
            public_jwk,
        })
    }

    /// The public key as a [`Jwk`].
    pub fn jwk(&self) -> Jwk {
        // The JWK was built from a valid key pair just above.
        Jwk::from_value(&self.public_jwk).unwrap_or_else(|_| unreachable!("own key is valid"))
    }

    /// RFC 7638 thumbprint of the public key (equal to `kid`).
    pub fn thumbprint(&self) -> &str {
        &self.kid
    }

    /// Signs raw bytes (ES256, fixed-size r||s).
    pub fn sign_raw(&self, msg: &[u8]) -> Result<Vec<u8>, JoseError> {
        self.pair
            .sign(&self.rng, msg)
            .map(|s| s.as_ref().to_vec())
            .map_err(|_| JoseError::Sign)
    }

    /// Signs `header` and `claims` as a compact JWS. `alg` is set here.
    pub fn sign_jws(
        &self,
        mut header: serde_json::Map<String, Value>,
        claims: &impl Serialize,
    ) -> Result<String, JoseError> {
        header.insert("alg".into(), Value::from("ES256"));
        let h = serde_json::to_vec(&header).map_err(|_| JoseError::Sign)?;
        let p = serde_json::to_vec(claims).map_err(|_| JoseError::Sign)?;
        let mut out = String::with_capacity(h.len() * 4 / 3 + p.len() * 4 / 3 + 90);
        URL_SAFE_NO_PAD.encode_string(&h, &mut out);
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(&p, &mut out);
        let sig = self.sign_raw(out.as_bytes())?;
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(sig, &mut out);
        Ok(out)
    }
}

/// Bound on the magnitude of a NumericDate (about 31 million years), so that
/// callers can add or subtract skews and windows without overflow.
const MAX_NUMERIC_DATE: i64 = 1_000_000_000_000_000;

/// A NumericDate claim: an integer or a finite number of seconds, floored.
/// Strings, booleans, non-finite values and values of 1e15 or more in
/// magnitude are refused.
pub fn numeric_date<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let v = serde_json::Number::deserialize(d)?;
    if let Some(i) = v.as_i64() {
        if i.unsigned_abs() < MAX_NUMERIC_DATE.unsigned_abs() {
            return Ok(i);
        }
        return Err(serde::de::Error::custom("NumericDate out of range"));
    }
    match v.as_f64() {
        Some(f) if f.is_finite() && f.abs() < MAX_NUMERIC_DATE as f64 => Ok(f.floor() as i64),
        _ => Err(serde::de::Error::custom("NumericDate out of range")),
    }
}

/// An optional NumericDate claim.
pub fn opt_numeric_date<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    numeric_date(d).map(Some)
}

/// The `aud` claim: one string or an array of strings, nothing else.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Audience {
    /// A single audience.
    One(String),
    /// Several audiences.
    Many(Vec<String>),
}

impl Audience {
    /// Whether `aud` names `expected` exactly.
    pub fn contains(&self, expected: &str) -> bool {
        match self {
            Audience::One(a) => a == expected,
            Audience::Many(v) => v.iter().any(|a| a == expected),
        }
    }
}

#[cfg(test)]
mod tests;
