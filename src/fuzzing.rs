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

use crate::base::dpop::{self, DpopError, Expect, Nonces};
use crate::base::jose::{self, Alg, Es256Key, Jwk, JwkSet};
use crate::base::oauth::{self, OAuthError};
use crate::base::secret::{SecretBytes, SecretString};
use crate::derive::policy::{self, Decision, Policy};
use crate::edge::pages::http::{self as page_http, Form};
use crate::edge::pages::oidc;
use crate::infra::seal::{SealError, Sealer};

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
pub(crate) const NONCE_KEY: [u8; 32] = [7; 32];
/// The instance name the fuzzed nonce validator issues its nonces as.
pub(crate) const NONCE_INSTANCE: &str = "fuzz/1";

/// The names of the fuzz targets, which are also the corpus directories.
pub const TARGETS: [&str; 13] = [
    "jws",
    "dpop",
    "dpop_signed",
    "policy",
    "request_json",
    "request_form",
    "config",
    "page_form",
    "page_cookie",
    "id_token",
    "token_answer",
    "provider_metadata",
    "sealed",
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
        "page_form" => page_form(data),
        "page_cookie" => page_cookie(data),
        "id_token" => id_token(data),
        "token_answer" => token_answer(data),
        "provider_metadata" => provider_metadata(data),
        "sealed" => sealed(data),
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
pub(crate) fn signing_key() -> Option<&'static Es256Key> {
    static KEY: OnceLock<Option<Es256Key>> = OnceLock::new();
    KEY.get_or_init(|| Es256Key::generate().ok().map(|(k, _)| k))
        .as_ref()
}

/// The nonce that [`dpop_signed`]'s resource-server validator accepts at
/// [`NOW`].
pub fn nonce() -> String {
    Nonces::new(&SecretBytes::new(NONCE_KEY.to_vec()), NONCE_INSTANCE).issue(NOW)
}

/// DPoP validation past the signature: `data` is taken as the claims of a
/// proof that is then signed with a valid key and header, so the fuzzer
/// reaches the claim checks (`htm`, `htu` normalisation, `iat`, `jti`,
/// `ath`, nonce) that `dpop` can only reach with a forged signature.
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
    let nonces = Nonces::new(&SecretBytes::new(NONCE_KEY.to_vec()), NONCE_INSTANCE);
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
fn check_request(r: &crate::derive::exchange::DeriveRequest) -> bool {
    let scope_ok = r
        .scope
        .as_deref()
        .is_none_or(|s| crate::base::grammar::parse_scope(s).is_ok());
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
    match crate::edge::api::parse_json(data, fuzz_proof(), 1000) {
        Ok(r) => check_request(&r),
        Err(e) => {
            let _ = crate::edge::api::error_response(&e, &[crate::base::jose::Alg::ES256]);
            false
        }
    }
}

/// `POST /token` body parsing (RFC 8693 form), then the request checks.
pub fn request_form(data: &[u8]) -> bool {
    match crate::edge::api::parse_form(data, fuzz_proof(), 1000) {
        Ok(r) => check_request(&r),
        Err(e) => {
            let _ = crate::edge::api::error_response(&e, &[crate::base::jose::Alg::ES256]);
            false
        }
    }
}

/// Config parsing (both stages). Paths are only joined, never opened.
pub fn config(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    match crate::infra::config::Config::parse(Path::new("/fuzz/credbroker.toml"), text) {
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

/// The pages' form parser (`Form::parse`, which also reads query strings),
/// then the `return_to` check on the form's `return_to` field, as the
/// sign-in pages run them. A parsed form holds every field of the input
/// with its decoded value; a `return_to` that passes is one of our own
/// relative paths, unchanged. Accepted = a form (no field twice) whose
/// `return_to` passes.
pub fn page_form(data: &[u8]) -> bool {
    // The check also runs on raw bytes: a query string is one decoding
    // away from them.
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some(r) = page_http::safe_return_to(s) {
            check_return_to(s, &r);
        }
    }
    let Ok(form) = Form::parse(data) else {
        return false;
    };
    for (k, v) in form_urlencoded::parse(data) {
        assert_eq!(form.get(&k), Some(&*v), "a parsed form lost field {k:?}");
    }
    match form.get("return_to") {
        Some(r) => match page_http::safe_return_to(r) {
            Some(safe) => {
                check_return_to(r, &safe);
                true
            }
            None => false,
        },
        None => false,
    }
}

/// What a `return_to` that passed must be: the input itself, and either
/// the account page or a connect link (`/connect/` and a code shape), so
/// never another host, a dot segment, an escape or a query.
fn check_return_to(input: &str, safe: &str) {
    assert_eq!(input, safe, "the return_to check must not rewrite");
    let code = safe.strip_prefix("/connect/");
    assert!(
        safe == "/account" || code.is_some_and(page_http::is_code_shaped),
        "return_to {safe:?} is not one of our pages"
    );
    assert!(!safe.contains(['\\', '%', '?', '#', ':', '.']) && !safe.starts_with("//"));
}

/// The pages' cookie reader on `data` as one `Cookie` header (and again as
/// the second of two, as a sibling host can plant one). Every value found
/// is non-empty, in the header, and free of the separators. Accepted = the
/// session cookie is there.
pub fn page_cookie(data: &[u8]) -> bool {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return false;
    };
    let name = crate::edge::pages::session::COOKIE_SECURE;
    let mut headers = http::HeaderMap::new();
    headers.append(http::header::COOKIE, value.clone());
    let found = page_http::cookies(&headers, name);
    let text = String::from_utf8_lossy(data);
    for v in &found {
        assert!(!v.is_empty() && !v.contains(';'), "cookie value {v:?}");
        assert!(
            text.contains(&format!("{name}={v}")),
            "{v:?} is not in the header"
        );
    }
    headers.insert(
        http::header::COOKIE,
        http::HeaderValue::from_static("other=1"),
    );
    headers.append(http::header::COOKIE, value);
    assert_eq!(page_http::cookies(&headers, name), found);
    !found.is_empty()
}

/// The issuer, client id and nonce [`id_token`] expects.
pub const ID_ISSUER: &str = "https://idp.example";
/// See [`ID_ISSUER`].
pub const ID_CLIENT: &str = "credbroker";
/// See [`ID_ISSUER`].
pub const ID_NONCE: &str = "fuzz-nonce";

/// The key set [`id_token`] validates against: [`signing_key`]'s public key.
fn id_keys() -> Option<&'static JwkSet> {
    static KEYS: OnceLock<Option<JwkSet>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let key = signing_key()?;
        let doc = serde_json::json!({ "keys": [key.public_jwk] });
        JwkSet::from_json(doc.to_string().as_bytes()).ok()
    })
    .as_ref()
}

fn id_expected(reauth: bool) -> oidc::Expected<'static> {
    oidc::Expected {
        issuer: ID_ISSUER,
        client_id: ID_CLIENT,
        algs: &[Alg::ES256],
        nonce: ID_NONCE,
        max_age_sent: reauth,
        reauth,
        now: NOW,
    }
}

/// ID-token validation (`pages::oidc::validate_id_token`): `data` as a
/// whole token (what a forged or broken one reaches), then as the claims
/// of a token signed with `signing_key` under a `JWT` header, so the
/// fuzzer reaches the claim checks. Checked as a first sign-in and as a
/// re-authentication (`max_age`), which is only ever stricter. Accepted =
/// the signed token passes as a first sign-in.
pub fn id_token(data: &[u8]) -> bool {
    let (Some(key), Some(keys)) = (signing_key(), id_keys()) else {
        return false;
    };
    if let Ok(token) = std::str::from_utf8(data) {
        // Nobody but the holder of the key can sign; a raw token that passes
        // would be a forgery.
        assert!(
            oidc::validate_id_token(token, keys, &id_expected(false)).is_err(),
            "an unsigned input passed ID-token validation"
        );
    }
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(data) else {
        return false;
    };
    let mut header = serde_json::Map::new();
    header.insert("typ".into(), "JWT".into());
    header.insert("kid".into(), key.kid.clone().into());
    let Ok(token) = key.sign_jws(header, &claims) else {
        return false;
    };
    let first = oidc::validate_id_token(&token, keys, &id_expected(false));
    let again = oidc::validate_id_token(&token, keys, &id_expected(true));
    if let Ok(id) = &again {
        assert!(
            first.is_ok(),
            "re-authentication passed where sign-in did not"
        );
        assert!(id
            .auth_time
            .is_some_and(|t| NOW - t <= oidc::MAX_AGE + oidc::SKEW));
    }
    match first {
        Ok(id) => {
            assert!(!id.sub.is_empty());
            assert!(!id.display.is_empty() && !id.display.chars().any(char::is_control));
            assert!(id.display == id.sub || id.display.len() <= 200);
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}

/// The statuses [`token_answer`] gives its body with.
const TOKEN_STATUSES: [u16; 6] = [200, 201, 302, 400, 401, 503];

/// The provider's token-endpoint answer (`oauth::parse_token_answer`),
/// with the same body under each status of `TOKEN_STATUSES`. Only a 2xx
/// answer yields tokens, with a non-empty access token, a short
/// `token_type` of token characters and a non-negative lifetime; an
/// `error` code is passed on sanitised. Accepted = the 200 answer yields
/// tokens.
pub fn token_answer(data: &[u8]) -> bool {
    let mut accepted = false;
    for status in TOKEN_STATUSES {
        match oauth::parse_token_answer(status, data) {
            Ok(t) => {
                assert!((200..300).contains(&status), "tokens from HTTP {status}");
                assert!(!t.access_token.expose().is_empty());
                assert!(!t.token_type.is_empty() && t.token_type.len() <= 32);
                assert!(t
                    .token_type
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
                assert!(t.expires_in.is_none_or(|n| n >= 0), "{:?}", t.expires_in);
                assert!(t
                    .refresh_token
                    .as_ref()
                    .is_none_or(|r| !r.expose().is_empty()));
                if let Some(scope) = &t.scope {
                    assert!(scope
                        .iter()
                        .all(|s| !s.is_empty() && !s.contains([' ', ','])));
                }
                accepted |= status == 200;
            }
            Err(OAuthError::Rejected { error }) => {
                assert!(error.len() <= 64);
                assert!(error
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')));
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    accepted
}

/// The issuer [`provider_metadata`] expects the document to name.
pub const PROVIDER_ISSUER: &str = "https://provider.example";

/// The provider's discovery document (`oauth::parse_metadata`, RFC 8414
/// or OpenID Connect discovery) for [`PROVIDER_ISSUER`]. An accepted
/// document's endpoints are all URLs, https or on loopback. Accepted = the
/// document is.
pub fn provider_metadata(data: &[u8]) -> bool {
    match oauth::parse_metadata(PROVIDER_ISSUER, data) {
        Ok(e) => {
            for u in [Some(&e.authorization), Some(&e.token)]
                .into_iter()
                .chain([
                    e.revocation.as_ref(),
                    e.userinfo.as_ref(),
                    e.jwks_uri.as_ref(),
                ])
                .flatten()
            {
                let url = url::Url::parse(u).unwrap_or_else(|_| panic!("{u:?} is not a URL"));
                // Written out again rather than calling the broker's rule, so
                // that a mistake in that rule shows here.
                let loopback = match url.host() {
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    Some(url::Host::Domain(d)) => d == "localhost",
                    None => false,
                };
                assert!(
                    url.scheme() == "https" || (url.scheme() == "http" && loopback),
                    "{u:?} is neither https nor loopback"
                );
                assert!(
                    url.username().is_empty() && url.password().is_none(),
                    "{u:?}"
                );
            }
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}

/// The current and the previous key of [`sealed`]'s sealer (fixed, public,
/// fuzz-only values).
pub const SEAL_KEYS: [[u8; 32]; 2] = [[1; 32], [2; 32]];
/// The associated data [`sealed`] opens records for.
pub const SEAL_AAD: &[u8] = b"fuzz/record";

/// [`sealed`]'s sealer: current key `SEAL_KEYS[0]`, `SEAL_KEYS[1]` still
/// opening.
pub fn sealer() -> Option<&'static Sealer> {
    static SEALER: OnceLock<Option<Sealer>> = OnceLock::new();
    SEALER
        .get_or_init(|| {
            let [current, old] = SEAL_KEYS.map(|k| SecretBytes::new(k.to_vec()));
            Sealer::new(&current, &[old]).ok()
        })
        .as_ref()
}

/// `Sealer::open` on `data` as a stored record (what a store file holds,
/// possibly tampered with). A record that opens names one of the loaded
/// keys, does not open for other associated data, and its plaintext seals
/// and opens again to itself. Accepted = the record opens.
pub fn sealed(data: &[u8]) -> bool {
    let Some(s) = sealer() else {
        return false;
    };
    match s.open(SEAL_AAD, data) {
        Ok(plain) => {
            let id = Sealer::record_key_id(data);
            assert!(
                SEAL_KEYS
                    .iter()
                    .any(|k| Sealer::new(&SecretBytes::new(k.to_vec()), &[])
                        .is_ok_and(|one| Some(one.current_key_id()) == id)),
                "opened under a key id that is not loaded: {id:?}"
            );
            assert_eq!(s.open(b"fuzz/other", data).err(), Some(SealError::Open));
            let again = s
                .seal(SEAL_AAD, plain.expose())
                .map(|r| s.open(SEAL_AAD, &r));
            assert!(matches!(again, Ok(Ok(p)) if p.expose() == plain.expose()));
            true
        }
        Err(SealError::UnknownKey(id)) => {
            assert_eq!(Sealer::record_key_id(data), Some(id));
            false
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}
