//! The surface the fuzz targets in `fuzz/` drive, one function per target
//! (rustls does the same): each takes arbitrary bytes, runs one parser the
//! way the broker runs it, and checks the invariants that must hold whatever
//! the input. A broken invariant is a panic, which is what a fuzzer reports.
//!
//! `tests/it/fuzz/corpus.rs` replays every committed corpus file through these
//! same functions in `cargo test`. Each returns whether the input was
//! accepted, so that test can also check that the seeds named `ok-*` get
//! past every check (a surface that refused everything early would fuzz
//! nothing) and those named `bad-*` do not.
//!
//! Not a stable API: hidden from the docs and free to change.

use std::path::Path;
use std::sync::OnceLock;

use crate::dpop::{self, DpopError, Expect, Nonces};
use crate::jose::{self, Alg, Es256Key, Jwk, JwkSet};
use crate::policy::{self, Decision, Policy};
use crate::secret::{SecretBytes, SecretString};

/// The fixed "now" every time-dependent check runs at, so that a committed
/// proof stays valid (and a run is reproducible).
pub const NOW: i64 = 1_750_000_000;
/// The `htu` the DPoP targets expect (the broker's derive endpoint).
pub const HTU: &str = "https://broker.example/v1/derive";
/// The access token the resource-server side of [`dpop_signed`] expects
/// proofs to be bound to (`ath`).
pub const ACCESS_TOKEN: &str = "fuzz-access-token";
/// The key under which [`dpop_signed`]'s resource-server validator makes
/// and checks nonces (a fixed, public, fuzz-only value).
pub const NONCE_KEY: [u8; 32] = [7; 32];

/// The names of the fuzz targets, which are also the corpus directories.
pub const TARGETS: [&str; 7] = [
    "jws",
    "dpop",
    "dpop_signed",
    "policy",
    "request_json",
    "request_form",
    "config",
];

/// Runs the function of target `name` on `data`. `None` for an unknown name.
pub fn run(name: &str, data: &[u8]) -> Option<bool> {
    Some(match name {
        "jws" => jws(data),
        "dpop" => dpop(data),
        "dpop_signed" => dpop_signed(data),
        "policy" => policy(data),
        "request_json" => request_json(data),
        "request_form" => request_form(data),
        "config" => config(data),
        _ => return None,
    })
}

/// JWS/JWT parsing: the compact parser with the default size cap, then the
/// header's `jwk` as a DPoP proof carries it; and the same bytes as a JWKS
/// document. Accepted = a compact JWS whose header has a usable `jwk`.
pub fn jws(data: &[u8]) -> bool {
    // A JWKS document is bytes, not a token: parse it whatever they are.
    let _ = JwkSet::from_json(data);
    let Ok(token) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(parsed) = jose::parse(token, jose::MAX_JWS_LEN) else {
        return false;
    };
    // The signing input is the first two parts, byte for byte.
    assert!(token.starts_with(parsed.signing_input));
    assert_eq!(parsed.signing_input.matches('.').count(), 1);
    let Some(v) = parsed.header.jwk.as_ref() else {
        return false;
    };
    match Jwk::from_value(v) {
        Ok(jwk) => {
            // A thumbprint is a base64url SHA-256: 43 characters.
            assert_eq!(jwk.thumbprint.len(), 43);
            let _ = Alg::parse(&parsed.header.alg).map(|alg| jwk.verify(alg, &parsed));
            true
        }
        Err(_) => false,
    }
}

fn broker_expect() -> Expect<'static> {
    Expect {
        method: "POST",
        htu: HTU,
        access_token: None,
        jkt: None,
        now: NOW,
    }
}

/// DPoP validation of an arbitrary proof string, as the broker runs it (no
/// access token, no nonce), at [`NOW`] for [`HTU`]. A proof accepted once
/// must be refused as a replay the second time.
pub fn dpop(data: &[u8]) -> bool {
    let Ok(proof) = std::str::from_utf8(data) else {
        return false;
    };
    let v = dpop::Validator::new(vec![Alg::ES256], 64, None);
    match v.validate(proof, &broker_expect()) {
        Ok(valid) => {
            assert_eq!(valid.jkt.len(), 43);
            assert!((valid.iat - NOW).abs() <= dpop::IAT_WINDOW);
            assert_eq!(
                v.validate(proof, &broker_expect()).err(),
                Some(DpopError::Replay),
                "an accepted proof must not be accepted twice"
            );
            true
        }
        Err(_) => false,
    }
}

/// The key [`dpop_signed`] signs with; made once per process.
pub fn signing_key() -> Option<&'static Es256Key> {
    static KEY: OnceLock<Option<Es256Key>> = OnceLock::new();
    KEY.get_or_init(|| Es256Key::generate().ok().map(|(k, _)| k))
        .as_ref()
}

/// The nonce that [`dpop_signed`]'s resource-server validator accepts at
/// [`NOW`].
pub fn nonce() -> String {
    Nonces::new(&SecretBytes::new(NONCE_KEY.to_vec())).issue(NOW)
}

/// DPoP validation past the signature: `data` is taken as the claims of a
/// proof that is then signed with a valid key and header, so the fuzzer
/// reaches the claim checks (`htm`, `htu` normalisation, `iat`, `jti`,
/// `ath`, nonce) that [`dpop`] can only reach with a forged signature.
/// Checked twice: as the broker checks it, and as a resource server does
/// (with `ath` over [`ACCESS_TOKEN`], `cnf.jkt` and a nonce). Accepted =
/// either accepts it.
pub fn dpop_signed(data: &[u8]) -> bool {
    let Some(key) = signing_key() else {
        return false;
    };
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(data) else {
        return false;
    };
    let mut header = serde_json::Map::new();
    header.insert("typ".into(), "dpop+jwt".into());
    let mut jwk = key.public_jwk.clone();
    if let Some(o) = jwk.as_object_mut() {
        o.remove("kid");
    }
    header.insert("jwk".into(), jwk);
    let Ok(proof) = key.sign_jws(header, &claims) else {
        return false;
    };
    let broker = dpop::Validator::new(vec![Alg::ES256], 64, None);
    let accepted: bool = match broker.validate(&proof, &broker_expect()) {
        Ok(valid) => {
            assert_eq!(valid.jkt, key.thumbprint());
            assert_eq!(
                broker.validate(&proof, &broker_expect()).err(),
                Some(DpopError::Replay)
            );
            true
        }
        Err(_) => false,
    };
    let nonces = Nonces::new(&SecretBytes::new(NONCE_KEY.to_vec()));
    let rs = dpop::Validator::new(vec![Alg::ES256], 64, Some(nonces));
    let rs_expect = Expect {
        method: "GET",
        htu: "https://api.example/notes",
        access_token: Some(ACCESS_TOKEN),
        jkt: Some(key.thumbprint()),
        now: NOW,
    };
    let rs_accepted = match rs.validate(&proof, &rs_expect) {
        Ok(valid) => {
            assert_eq!(valid.jkt, key.thumbprint());
            true
        }
        Err(_) => false,
    };
    accepted || rs_accepted
}

/// Policy parsing. Whatever the loader accepts must decide: every tool, in
/// each of its steps, on its own resource, is allowed (unless the file
/// freezes everything), within the 300 s cap and with exactly its scopes.
pub fn policy(data: &[u8]) -> bool {
    match Policy::parse(Path::new("fuzz/policy.toml"), data) {
        Ok(p) => {
            for tool in p.tools.values() {
                for step in &tool.steps {
                    let d = p.decide(&policy::Request {
                        step,
                        tool: &tool.name,
                        resource: &tool.resource,
                        scope: None,
                    });
                    match d {
                        Decision::Allow(g) => {
                            assert!(!p.frozen);
                            assert!(g.ttl <= policy::MAX_TTL && !g.ttl.is_zero());
                            assert!(g.scopes.iter().eq(tool.scopes.iter()));
                            assert_eq!(g.resource.canonical, tool.resource);
                        }
                        Decision::Deny(r) => {
                            assert!(p.frozen && r == policy::DenyReason::Frozen, "{r:?}");
                        }
                    }
                }
            }
            true
        }
        Err(e) => {
            // The message is built from positions in the text: render it.
            let _ = e.to_string();
            false
        }
    }
}

/// The checks the pipeline runs on a parsed request before it looks at the
/// subject: scope syntax and the canonical resource, which must be a fixed
/// point (canonicalising it again changes nothing).
fn check_request(r: &crate::exchange::DeriveRequest) -> bool {
    let scope_ok = r
        .scope
        .as_deref()
        .is_none_or(|s| crate::grammar::parse_scope(s).is_ok());
    match policy::canonical_resource(&r.resource) {
        Ok(c) => {
            assert_eq!(
                policy::canonical_resource(&c).as_deref(),
                Ok(c.as_str()),
                "a canonical resource must canonicalise to itself"
            );
            scope_ok
        }
        Err(_) => false,
    }
}

fn fuzz_proof() -> Option<SecretString> {
    Some(SecretString::new("proof".to_owned()))
}

/// `POST /v1/derive` body parsing (JSON), then the request checks.
pub fn request_json(data: &[u8]) -> bool {
    match crate::api::parse_json(data, fuzz_proof(), 1000) {
        Ok(r) => check_request(&r),
        Err(e) => {
            let _ = crate::api::error_response(&e);
            false
        }
    }
}

/// `POST /token` body parsing (RFC 8693 form), then the request checks.
pub fn request_form(data: &[u8]) -> bool {
    match crate::api::parse_form(data, fuzz_proof(), 1000) {
        Ok(r) => check_request(&r),
        Err(e) => {
            let _ = crate::api::error_response(&e);
            false
        }
    }
}

/// Config parsing (both stages). Paths are only joined, never opened.
pub fn config(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    match crate::config::Config::parse(Path::new("/fuzz/credbroker.toml"), text) {
        Ok(c) => {
            assert!(!c.trusted_issuers.is_empty());
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}
