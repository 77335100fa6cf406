//! Every refusal of the verifier, each asserted by its `VerifyError` variant
//! and followed by its positive control: the same construction with only the
//! tested thing put right is accepted. Tokens come from the production
//! [`Minter`]; forged ones are the minted token taken apart and reassembled,
//! so the forgery differs from the good token only where the test says.

use std::sync::Arc;

use super::*;

use aws_lc_rs::hmac;
use serde_json::{json, Map, Value};

use crate::base::clock::{Clock, ManualClock};
use crate::base::dpop::{make_proof, IAT_WINDOW};
use crate::base::jose::{b64d, b64e, Es256Key};
use crate::derive::mint::{Claims, KeyRing, Minter};

const ISS: &str = "https://broker.example";
const AUD: &str = "https://api.example/notes";
/// Where the request was sent (the query is not part of `htu`).
const URL: &str = "https://api.example/notes/items?page=2";
const HTU: &str = "https://api.example/notes/items";
const NOW: i64 = 1_800_000_000;

/// A broker signing key, the tool's DPoP key, and a resource server that
/// trusts the broker's JWKS, on a clock the test moves.
struct Rs {
    signer: Arc<Es256Key>,
    tool: Es256Key,
    ring_jwks: Vec<u8>,
    verifier: Verifier,
    clock: Arc<ManualClock>,
}

fn key() -> Es256Key {
    Es256Key::generate().unwrap().0
}

fn setup() -> Rs {
    let signer = Arc::new(key());
    let ring = KeyRing {
        active: signer.clone(),
        next: None,
        published: vec![(signer.public_jwk.clone(), None)],
        generation: 0,
    };
    // The JWKS document exactly as the broker publishes it.
    let ring_jwks = serde_json::to_vec(&ring.jwks(NOW)).unwrap();
    let clock = ManualClock::new(NOW);
    let verifier = Verifier::from_jwks(ISS, AUD, &ring_jwks)
        .unwrap()
        .with_clock(clock.clone());
    Rs {
        signer,
        tool: key(),
        ring_jwks,
        verifier,
        clock,
    }
}

/// The claims the broker puts in a token for alice's `notes.read` call.
fn claims<'a>(rs: &'a Rs, scopes: &'a [String]) -> Claims<'a> {
    Claims {
        sub: "alice",
        subject_iss: "https://idp.example",
        aud: AUD,
        scopes,
        tool: "notes.read",
        step: Some("triage"),
        jkt: rs.tool.thumbprint(),
        iat: NOW,
        exp: NOW + 300,
        authorization_details: None,
        approval_id: None,
        single_use: false,
        req_sha256: None,
    }
}

fn scopes() -> Vec<String> {
    vec!["notes:read".to_owned()]
}

/// A token minted by the production minter, as `issuer`, with `edit`
/// applied to the claims first.
fn mint_as(rs: &Rs, issuer: &str, edit: impl FnOnce(&mut Claims<'_>)) -> String {
    let ring = KeyRing {
        active: rs.signer.clone(),
        next: None,
        published: vec![(rs.signer.public_jwk.clone(), None)],
        generation: 0,
    };
    let minter = Minter::new(issuer.to_owned(), "repo-helper".to_owned(), ring);
    let s = scopes();
    let mut c = claims(rs, &s);
    edit(&mut c);
    minter.mint(&c).unwrap().token.expose().clone()
}

fn mint(rs: &Rs) -> String {
    mint_as(rs, ISS, |_| {})
}

/// The decoded header and claims of a compact JWS.
fn parts(token: &str) -> (Map<String, Value>, Map<String, Value>) {
    let mut it = token.split('.');
    let mut next = || -> Map<String, Value> {
        serde_json::from_slice(&b64d(it.next().unwrap(), "test").unwrap()).unwrap()
    };
    (next(), next())
}

/// `header.claims.sign(signing input)`, with the header exactly as given
/// (`alg` included): the attacker's assembly.
fn assemble(
    header: &Map<String, Value>,
    claims: &Map<String, Value>,
    sign: impl FnOnce(&[u8]) -> Vec<u8>,
) -> String {
    let input = format!(
        "{}.{}",
        b64e(&serde_json::to_vec(header).unwrap()),
        b64e(&serde_json::to_vec(claims).unwrap())
    );
    let sig = sign(input.as_bytes());
    format!("{input}.{}", b64e(&sig))
}

impl Rs {
    /// Re-signs with the broker's own key (so only the edited member is
    /// wrong, never the signature).
    fn resign(&self, header: &Map<String, Value>, claims: &Map<String, Value>) -> String {
        assemble(header, claims, |m| self.signer.sign_raw(m).unwrap())
    }

    /// A correct proof from the tool's key for `token`, at the clock's time.
    fn proof(&self, token: &str) -> String {
        make_proof(&self.tool, "GET", HTU, self.clock.now(), Some(token), None).unwrap()
    }

    fn present(&self, token: &str, proof: &str) -> Result<Verified, VerifyError> {
        let auth = format!("DPoP {token}");
        self.verifier.verify(&Presented {
            method: "GET",
            url: URL,
            authorization: Some(&auth),
            dpop: &[proof],
        })
    }

    /// `token` with a correct proof of its own.
    fn check(&self, token: &str) -> Result<Verified, VerifyError> {
        self.present(token, &self.proof(token))
    }

    /// The positive control: `token` with a correct proof is accepted and
    /// says who is calling.
    fn accepts(&self, token: &str, what: &str) -> Verified {
        let who = self
            .check(token)
            .unwrap_or_else(|e| panic!("{what}: refused with {e:?}"));
        assert_eq!(
            (who.sub.as_str(), who.agent.as_str(), who.tool.as_str()),
            ("alice", "repo-helper", "notes.read"),
            "{what}"
        );
        assert_eq!(who.subject_iss.as_deref(), Some("https://idp.example"));
        assert_eq!(who.scopes, scopes(), "{what}");
        assert_eq!(who.jkt, self.tool.thumbprint(), "{what}");
        assert_eq!(who.step.as_deref(), Some("triage"), "{what}");
        who
    }
}

/// `r` is exactly `want`, and its challenge names the right error code.
#[track_caller]
fn refused(r: Result<Verified, VerifyError>, want: VerifyError, what: &str) {
    assert_eq!(r, Err(want.clone()), "{what}");
    let code = match want {
        VerifyError::NoToken => None,
        VerifyError::Proof(_) => Some("invalid_dpop_proof"),
        _ => Some("invalid_token"),
    };
    let challenge = want.challenge();
    match code {
        Some(code) => assert_eq!(
            challenge,
            format!("DPoP error=\"{code}\", algs=\"ES256\""),
            "{what}"
        ),
        None => assert_eq!(challenge, "DPoP algs=\"ES256\"", "{what}"),
    }
}

#[test]
fn token_after_exp_is_expired_and_one_second_before_is_not() {
    let rs = setup();
    let token = mint(&rs); // exp = NOW + 300; 5 s of skew are allowed.
    rs.clock.set(NOW + 300 + SKEW);
    refused(rs.check(&token), VerifyError::Expired, "exp + skew");
    rs.clock.set(NOW + 3600);
    refused(rs.check(&token), VerifyError::Expired, "an hour later");
    // Positive control: the same token a second earlier.
    rs.clock.set(NOW + 300 + SKEW - 1);
    rs.accepts(&token, "just within exp + skew");
}

#[test]
fn token_issued_in_the_future_is_not_yet_valid() {
    let rs = setup();
    let ahead = mint_as(&rs, ISS, |c| {
        c.iat = NOW + SKEW + 1;
        c.exp = NOW + SKEW + 301;
    });
    refused(rs.check(&ahead), VerifyError::Expired, "iat now + 6 s");
    let far = mint_as(&rs, ISS, |c| {
        c.iat = NOW + 3600;
        c.exp = NOW + 3900;
    });
    refused(rs.check(&far), VerifyError::Expired, "iat an hour ahead");
    // Positive control: iat within the skew.
    let within = mint_as(&rs, ISS, |c| {
        c.iat = NOW + SKEW;
        c.exp = NOW + SKEW + 300;
    });
    rs.accepts(&within, "iat now + 5 s");
}

#[test]
fn token_from_another_issuer() {
    let rs = setup();
    // Signed with the trusted key: only `iss` differs.
    for iss in [
        "https://other.example",
        "https://broker.example/",
        "https://BROKER.example",
        "http://broker.example",
        "",
    ] {
        refused(
            rs.check(&mint_as(&rs, iss, |_| {})),
            VerifyError::Issuer,
            iss,
        );
    }
    rs.accepts(&mint_as(&rs, ISS, |_| {}), "the configured issuer");
}

/// `header.payload.sign(signing input)` with the payload's JSON text
/// exactly as given.
fn assemble_text(header: &Map<String, Value>, payload: &str, key: &Es256Key) -> String {
    let input = format!(
        "{}.{}",
        b64e(&serde_json::to_vec(header).unwrap()),
        b64e(payload.as_bytes())
    );
    let sig = key.sign_raw(input.as_bytes()).unwrap();
    format!("{input}.{}", b64e(&sig))
}

/// The JSON text of `claims` with every `/` written `\/` and the first
/// character of `member`'s string value written as a `\u` escape: the
/// same values, in the form a parser can no longer borrow.
fn escaped_json(claims: &Map<String, Value>, member: &str) -> String {
    let text = serde_json::to_string(claims).unwrap().replace('/', "\\/");
    let open = format!("\"{member}\":\"");
    let at = text.find(&open).unwrap() + open.len();
    let first = text[at..].chars().next().unwrap();
    format!(
        "{}\\u{:04x}{}",
        &text[..at],
        u32::from(first),
        &text[at + first.len_utf8()..]
    )
}

#[test]
fn claims_written_with_json_escapes_are_read_as_their_values() {
    // `iss`, `aud` and `cnf.jkt` of the token, `htm` and `htu` of the
    // proof are borrowed from the payload unless the JSON escapes a
    // character: an escaped form compares as its value.
    let rs = setup();
    let (h, c) = parts(&mint(&rs));
    let payload = escaped_json(&c, "jkt");
    assert!(
        payload.contains(r#""iss":"https:\/\/broker.example""#),
        "{payload}"
    );
    assert!(payload.contains(r#""jkt":"\u00"#), "{payload}");
    let token = assemble_text(&h, &payload, &rs.signer);
    let (ph, pc) = parts(&rs.proof(&token));
    let proof_payload = escaped_json(&pc, "htm");
    assert!(
        proof_payload.contains(r#""htm":"\u0047ET""#),
        "{proof_payload}"
    );
    assert!(
        proof_payload.contains(r#""htu":"https:\/\/"#),
        "{proof_payload}"
    );
    let proof = assemble_text(&ph, &proof_payload, &rs.tool);
    let who = rs
        .present(&token, &proof)
        .unwrap_or_else(|e| panic!("escaped claims refused: {e:?}"));
    assert_eq!(
        (who.sub.as_str(), who.jkt.as_str()),
        ("alice", rs.tool.thumbprint())
    );

    // The escapes are read, not skipped: an escaped issuer that is another
    // one, and an escaped method that is another one, are refused.
    let mut other = c.clone();
    other.insert("iss".into(), json!("https://broker.example.evil"));
    let token = assemble_text(&h, &escaped_json(&other, "iss"), &rs.signer);
    refused(
        rs.check(&token),
        VerifyError::Issuer,
        "escaped other issuer",
    );
    let token = mint(&rs);
    let (ph, mut pc) = parts(&rs.proof(&token));
    pc.insert("htm".into(), json!("POST"));
    let proof = assemble_text(&ph, &escaped_json(&pc, "htm"), &rs.tool);
    refused(
        rs.present(&token, &proof),
        VerifyError::Proof(DpopError::Htm),
        "escaped other method",
    );
}

#[test]
fn token_for_another_audience() {
    let rs = setup();
    for aud in [
        "https://api.example/other",
        "https://api.example/notes/",
        "https://api.example/notes/items",
        "https://api.example",
        "https://API.example/notes",
    ] {
        refused(
            rs.check(&mint_as(&rs, ISS, |c| c.aud = aud)),
            VerifyError::Audience,
            aud,
        );
    }
    // An array naming this resource is not a single audience (RFC 9068
    // tokens from this broker always carry a string).
    let (h, mut c) = parts(&mint(&rs));
    c.insert("aud".into(), json!([AUD]));
    refused(
        rs.check(&rs.resign(&h, &c)),
        VerifyError::Claims,
        "aud array",
    );
    rs.accepts(&mint_as(&rs, ISS, |c| c.aud = AUD), "this resource");
}

#[test]
fn token_with_alg_none() {
    let rs = setup();
    let good = mint(&rs);
    let (mut h, c) = parts(&good);
    // Only `alg` differs: `typ` at+jwt and the `kid` are kept.
    assert_eq!(
        (h["typ"].as_str(), h["kid"].as_str()),
        (Some("at+jwt"), Some(rs.signer.kid.as_str()))
    );
    h.insert("alg".into(), json!("none"));
    // Unsigned (RFC 7519 section 6): the empty third part is refused
    // before the header is read.
    refused(
        rs.check(&assemble(&h, &c, |_| Vec::new())),
        VerifyError::Token(JoseError::NotCompact),
        "alg none, empty signature",
    );
    refused(
        rs.check(&assemble(&h, &c, |_| b"sig".to_vec())),
        VerifyError::Header,
        "alg none, some bytes as signature",
    );
    // With a valid ES256 signature over the `none` header.
    refused(
        rs.check(&rs.resign(&h, &c)),
        VerifyError::Header,
        "alg none, ES256 signature",
    );
    for alg in ["None", "NONE", "es256", ""] {
        h.insert("alg".into(), json!(alg));
        refused(rs.check(&rs.resign(&h, &c)), VerifyError::Header, alg);
    }
    // Positive control: the same assembly with alg ES256.
    h.insert("alg".into(), json!("ES256"));
    rs.accepts(&rs.resign(&h, &c), "alg ES256");
    rs.accepts(&good, "the minted token");
}

#[test]
fn token_with_hs256_keyed_with_the_public_key() {
    // Key confusion: a verifier that let the header pick the algorithm
    // would check an HMAC keyed with the public key it has, which the
    // attacker has too. The MACs below are real ones, so only the
    // verifier's refusal of `alg` stops them.
    let rs = setup();
    let (mut h, c) = parts(&mint(&rs));
    h.insert("alg".into(), json!("HS256"));
    let jwk = &rs.signer.public_jwk;
    let x = b64d(jwk["x"].as_str().unwrap(), "x").unwrap();
    let y = b64d(jwk["y"].as_str().unwrap(), "y").unwrap();
    let point = [&[4u8][..], &x, &y].concat();
    let published = serde_json::to_vec(&json!({"keys": [jwk]})).unwrap();
    for (what, secret) in [
        ("the JWK as published", serde_json::to_vec(jwk).unwrap()),
        ("the JWKS document", rs.ring_jwks.clone()),
        ("the JWKS re-serialised", published),
        ("the SEC1 public point", point),
    ] {
        let mac = |m: &[u8]| {
            hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &secret), m)
                .as_ref()
                .to_vec()
        };
        let forged = assemble(&h, &c, mac);
        // The forgery is a correct HS256 JWS for that secret.
        let (input, sig) = forged.rsplit_once('.').unwrap();
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, &secret),
            input.as_bytes(),
            &b64d(sig, "sig").unwrap(),
        )
        .unwrap();
        refused(rs.check(&forged), VerifyError::Header, what);
    }
    // Positive control: the same assembly, ES256 and the broker's key.
    h.insert("alg".into(), json!("ES256"));
    rs.accepts(&rs.resign(&h, &c), "alg ES256");
}

#[test]
fn token_with_typ_of_another_kind() {
    let rs = setup();
    let (mut h, c) = parts(&mint(&rs));
    for typ in [
        json!("JWT"),
        json!("jwt"),
        json!("dpop+jwt"),
        json!("application/jwt"),
        json!("at+jwt "),
        json!(1),
    ] {
        h.insert("typ".into(), typ.clone());
        let r = rs.check(&rs.resign(&h, &c));
        if typ.is_string() {
            refused(r, VerifyError::Header, &typ.to_string());
        } else {
            // A `typ` that is not a string fails the typed header.
            refused(
                r,
                VerifyError::Token(JoseError::Json("header")),
                "typ a number",
            );
        }
    }
    h.remove("typ");
    refused(rs.check(&rs.resign(&h, &c)), VerifyError::Header, "no typ");
    // Positive control: the same assembly with typ at+jwt.
    h.insert("typ".into(), json!("at+jwt"));
    rs.accepts(&rs.resign(&h, &c), "typ at+jwt");
}

#[test]
fn token_with_a_changed_claim_keeps_a_signature_that_no_longer_verifies() {
    let rs = setup();
    let good = mint(&rs);
    let (h, c) = parts(&good);
    let sig = good.rsplit_once('.').unwrap().1;
    for (claim, value) in [
        ("sub", json!("mallory")),
        ("scope", json!("notes:read notes:write")),
        ("aud", json!("https://api.example/admin")),
        ("exp", json!(NOW + 86_400)),
        ("cnf", json!({"jkt": key().thumbprint()})),
        ("act", json!({"sub": "repo-helper", "tool": "notes.delete"})),
    ] {
        let mut changed = c.clone();
        changed.insert(claim.into(), value);
        let input = format!(
            "{}.{}",
            b64e(&serde_json::to_vec(&h).unwrap()),
            b64e(&serde_json::to_vec(&changed).unwrap())
        );
        refused(
            rs.check(&format!("{input}.{sig}")),
            VerifyError::Token(JoseError::Signature),
            claim,
        );
    }
    // Positive control: the header and claims reassembled unchanged with
    // the same signature.
    let same = format!(
        "{}.{}.{sig}",
        good.split('.').next().unwrap(),
        good.split('.').nth(1).unwrap()
    );
    rs.accepts(&same, "unchanged");
}

#[test]
fn token_with_a_changed_signature() {
    let rs = setup();
    let good = mint(&rs);
    let (input, sig) = good.rsplit_once('.').unwrap();
    let sig = b64d(sig, "sig").unwrap();
    assert_eq!(sig.len(), 64, "R || S");
    for i in [0, 31, 32, 63] {
        let mut bad = sig.clone();
        bad[i] ^= 1;
        refused(
            rs.check(&format!("{input}.{}", b64e(&bad))),
            VerifyError::Token(JoseError::Signature),
            &format!("bit flipped in byte {i}"),
        );
    }
    refused(
        rs.check(&format!("{input}.{}", b64e(&sig[..63]))),
        VerifyError::Token(JoseError::Signature),
        "63 bytes",
    );
    // Signed by another key under the trusted key's kid.
    let (h, c) = parts(&good);
    let thief = key();
    refused(
        rs.check(&assemble(&h, &c, |m| thief.sign_raw(m).unwrap())),
        VerifyError::Token(JoseError::Signature),
        "another key, the trusted kid",
    );
    // Positive control: the signature as made.
    rs.accepts(&format!("{input}.{}", b64e(&sig)), "the signature as made");
}

#[test]
fn token_naming_an_unknown_kid() {
    let rs = setup();
    let (mut h, c) = parts(&mint(&rs));
    // The trusted key's signature, under a kid the JWKS does not have.
    h.insert("kid".into(), json!("no-such-key"));
    refused(
        rs.check(&rs.resign(&h, &c)),
        VerifyError::UnknownKey,
        "made-up kid",
    );
    // Another key, with its own kid.
    let other = key();
    h.insert("kid".into(), json!(other.kid));
    refused(
        rs.check(&assemble(&h, &c, |m| other.sign_raw(m).unwrap())),
        VerifyError::UnknownKey,
        "another key's kid",
    );
    // Positive control: the trusted kid.
    h.insert("kid".into(), json!(rs.signer.kid));
    rs.accepts(&rs.resign(&h, &c), "the trusted kid");
}

#[test]
fn token_missing_a_claim_or_with_one_of_the_wrong_type() {
    let rs = setup();
    let (h, c) = parts(&mint(&rs));
    for claim in ["iss", "sub", "aud", "act", "cnf", "iat", "exp", "jti"] {
        let mut m = c.clone();
        assert!(m.remove(claim).is_some(), "{claim} is in a minted token");
        refused(
            rs.check(&rs.resign(&h, &m)),
            VerifyError::Claims,
            &format!("no {claim}"),
        );
    }
    for (claim, value, what) in [
        ("act", json!({"tool": "notes.read"}), "act without sub"),
        ("cnf", json!({}), "cnf without jkt"),
        ("cnf", json!("jkt"), "cnf a string"),
        ("exp", json!((NOW + 300).to_string()), "exp a string"),
        ("iat", json!(true), "iat a boolean"),
        ("sub", json!(5), "sub a number"),
    ] {
        let mut m = c.clone();
        m.insert(claim.into(), value);
        refused(rs.check(&rs.resign(&h, &m)), VerifyError::Claims, what);
    }
    // Positive control: the same assembly, nothing removed.
    rs.accepts(&rs.resign(&h, &c), "every claim");
}

#[test]
fn proof_for_another_method_host_or_path() {
    let rs = setup();
    let token = mint(&rs);
    for (method, htu, want, what) in [
        ("POST", HTU, DpopError::Htm, "POST on a GET"),
        (
            "get",
            HTU,
            DpopError::Htm,
            "get (methods are case-sensitive)",
        ),
        (
            "GET",
            "https://evil.example/notes/items",
            DpopError::Htu,
            "another host",
        ),
        (
            "GET",
            "https://api.example:8443/notes/items",
            DpopError::Htu,
            "another port",
        ),
        (
            "GET",
            "https://api.example/notes/other",
            DpopError::Htu,
            "another path",
        ),
        (
            "GET",
            "http://api.example/notes/items",
            DpopError::Htu,
            "another scheme",
        ),
    ] {
        let p = make_proof(&rs.tool, method, htu, NOW, Some(&token), None).unwrap();
        refused(rs.present(&token, &p), VerifyError::Proof(want), what);
    }
    // Positive control: normalisation (upper-case host, default port, a
    // query) still names this URL.
    let p = make_proof(
        &rs.tool,
        "GET",
        "https://API.example:443/notes/items?x=1",
        NOW,
        Some(&token),
        None,
    )
    .unwrap();
    rs.present(&token, &p).expect("the same URL, normalised");
    rs.accepts(&token, "a proof for this request");
}

#[test]
fn proof_without_ath_or_with_ath_of_another_token() {
    let rs = setup();
    let token = mint(&rs);
    let other = mint(&rs);
    let p = make_proof(&rs.tool, "GET", HTU, NOW, None, None).unwrap();
    refused(
        rs.present(&token, &p),
        VerifyError::Proof(DpopError::Ath),
        "no ath",
    );
    let p = make_proof(&rs.tool, "GET", HTU, NOW, Some(&other), None).unwrap();
    refused(
        rs.present(&token, &p),
        VerifyError::Proof(DpopError::Ath),
        "ath of another token",
    );
    rs.accepts(&token, "ath of this token");
}

#[test]
fn proof_iat_61_s_off_either_way() {
    let rs = setup();
    let token = mint(&rs);
    let at = |iat: i64| make_proof(&rs.tool, "GET", HTU, iat, Some(&token), None).unwrap();
    for off in [-(IAT_WINDOW + 1), IAT_WINDOW + 1] {
        refused(
            rs.present(&token, &at(NOW + off)),
            VerifyError::Proof(DpopError::Iat),
            &format!("iat now{off:+}"),
        );
    }
    // Positive controls: the edges of the window.
    for off in [-IAT_WINDOW, IAT_WINDOW] {
        rs.present(&token, &at(NOW + off))
            .unwrap_or_else(|e| panic!("iat now{off:+}: {e:?}"));
    }
}

#[test]
fn proof_from_another_key_or_replayed() {
    let rs = setup();
    let token = mint(&rs);
    let thief = key();
    let p = make_proof(&thief, "GET", HTU, NOW, Some(&token), None).unwrap();
    refused(
        rs.present(&token, &p),
        VerifyError::Proof(DpopError::KeyMismatch),
        "the thief's key",
    );
    let p = rs.proof(&token);
    rs.present(&token, &p).expect("first use");
    refused(
        rs.present(&token, &p),
        VerifyError::Proof(DpopError::Replay),
        "the same proof twice",
    );
    rs.accepts(&token, "a fresh proof");
}

#[test]
fn request_without_token_with_bearer_or_without_one_proof() {
    let rs = setup();
    let token = mint(&rs);
    let proof = rs.proof(&token);
    let with = |auth: Option<&str>, dpop: &[&str]| {
        rs.verifier.verify(&Presented {
            method: "GET",
            url: URL,
            authorization: auth,
            dpop,
        })
    };
    refused(with(None, &[&proof]), VerifyError::NoToken, "no token");
    let bearer = format!("Bearer {token}");
    refused(
        with(Some(&bearer), &[&proof]),
        VerifyError::WrongScheme,
        "Bearer",
    );
    refused(
        with(Some(&token), &[&proof]),
        VerifyError::WrongScheme,
        "no scheme",
    );
    let auth = format!("DPoP {token}");
    refused(
        with(Some(&auth), &[]),
        VerifyError::Proof(DpopError::Missing),
        "no proof",
    );
    refused(
        with(Some(&auth), &[&proof, &proof]),
        VerifyError::Proof(DpopError::Missing),
        "two proofs",
    );
    // Positive control: none of the refusals consumed the proof.
    with(Some(&auth), &[&proof]).expect("DPoP scheme and one proof");
    let lower = format!("dpop {}", mint(&rs));
    let t = lower.split_once(' ').unwrap().1;
    with(Some(&lower), &[&rs.proof(t)]).expect("the scheme is case-insensitive");
}

#[test]
fn token_too_large_not_compact_or_with_crit() {
    let rs = setup();
    let good = mint(&rs);
    let big = format!("{good}{}", "A".repeat(MAX_TOKEN_LEN));
    refused(
        rs.check(&big),
        VerifyError::Token(JoseError::TooLarge(MAX_TOKEN_LEN)),
        "over 8 KiB",
    );
    refused(
        rs.check(&format!("{good}.AAAA")),
        VerifyError::Token(JoseError::NotCompact),
        "four parts",
    );
    let (mut h, c) = parts(&good);
    h.insert("crit".into(), json!(["exp"]));
    refused(
        rs.check(&rs.resign(&h, &c)),
        VerifyError::Token(JoseError::Crit),
        "crit",
    );
    rs.accepts(&good, "the minted token");
}

#[test]
fn keys_document_that_cannot_be_used() {
    for doc in [
        &b"not json"[..],
        br#"{"keys": []}"#,
        br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#,
    ] {
        assert_eq!(
            Verifier::from_jwks(ISS, AUD, doc).err(),
            Some(VerifyError::Keys),
            "{}",
            String::from_utf8_lossy(doc)
        );
    }
    // Positive control: the broker's own document.
    let rs = setup();
    let v = Verifier::from_jwks(ISS, AUD, &rs.ring_jwks).unwrap();
    assert_eq!(v.set_jwks(b"{}"), Err(VerifyError::Keys));
    v.set_jwks(&rs.ring_jwks).unwrap();
}

/// A token bound to one request (`req_sha256`): refused by `verify`
/// without the body, refused with another request, and accepted with its
/// own (members reordered: the JSON body is compared canonically); a
/// single-use one is not spent by a refused request.
#[test]
fn a_token_bound_to_a_request_serves_that_request_only() {
    let rs = setup();
    let body = br#"{"to":"bob@example.com","amount":42}"#;
    let bound = request::bind(&request::BoundRequest {
        method: "GET",
        path: "/notes/items",
        query: "page=2",
        content_type: "application/json",
        body,
    })
    .unwrap();
    // The minter's claims, with the digest the derive would put in.
    let (header, mut claims) = parts(&mint_as(&rs, ISS, |c| c.single_use = true));
    claims.insert("req_sha256".into(), json!(bound.sha256));
    let token = rs.resign(&header, &claims);
    let with = |ct: &str, body: &[u8], url: &str| {
        let auth = format!("DPoP {token}");
        rs.verifier.verify_request(
            &Presented {
                method: "GET",
                url,
                authorization: Some(&auth),
                dpop: &[&rs.proof(&token)],
            },
            ct,
            body,
        )
    };
    refused(rs.check(&token), VerifyError::RequestRequired, "no body");
    for (ct, b, url, what) in [
        (
            "application/json",
            &br#"{"to":"mallory@example.com","amount":42}"#[..],
            URL,
            "another body",
        ),
        ("text/plain", &body[..], URL, "another content type"),
        (
            "application/json",
            &body[..],
            "https://api.example/notes/items?page=3",
            "another query",
        ),
        (
            "application/json",
            &body[..],
            "https://api.example/notes/items?page=2&x=1",
            "a query added",
        ),
    ] {
        refused(with(ct, b, url), VerifyError::RequestMismatch, what);
    }
    assert!(matches!(
        with("application/json", br#"{"to":"a","to":"b"}"#, URL),
        Err(VerifyError::RequestUnbindable(_))
    ));
    // The control: the request itself, members reordered.
    let who = with(
        "application/json",
        br#"{ "amount": 42, "to": "bob@example.com" }"#,
        URL,
    )
    .unwrap();
    assert_eq!(who.req_sha256.as_deref(), Some(bound.sha256.as_str()));
    // Single use: once only.
    refused(
        with("application/json", body, URL),
        VerifyError::AlreadyUsed,
        "second use",
    );
    // A token bound to no request passes verify_request as verify.
    let plain = mint(&rs);
    let auth = format!("DPoP {plain}");
    let who = rs
        .verifier
        .verify_request(
            &Presented {
                method: "GET",
                url: URL,
                authorization: Some(&auth),
                dpop: &[&rs.proof(&plain)],
            },
            "",
            b"",
        )
        .unwrap();
    assert_eq!(who.req_sha256, None);
}
