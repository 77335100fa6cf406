//! The DPoP `WWW-Authenticate` challenge (RFC 9449 section 7.1) names the
//! algorithms the config accepts (`dpop.algs`), written once
//! (`edge::answer::dpop_challenge`), on each surface that sends one: the
//! orchestrator socket's `use_dpop_nonce` answer, and the proxy's 401s (no
//! token, a bad token, a proof without the required nonce). The admin
//! socket sends none. Before, three places wrote `algs="ES256"` whatever
//! the config said.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::ProxyEnv;
use crate::support::*;

/// The `algs` of a challenge.
fn algs_of(challenge: &str) -> String {
    let rest = challenge
        .split("algs=\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no algs in {challenge:?}"));
    rest.split('"').next().unwrap().to_string()
}

fn challenge_of(r: &reqwest::Response) -> String {
    r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string()
}

/// Every challenge the socket and the proxy send, by what was asked.
async fn challenges(dpop: &str) -> Vec<(&'static str, String)> {
    let p = ProxyEnv::start(&format!("\n[dpop]\nrequire_nonce = true\n{dpop}")).await;
    let b = &p.env.broker;
    let mut seen = Vec::new();

    // The socket: a derive proof without the required nonce.
    let k = key();
    let r = b.post_derive(&b.good_body(&b.subject_token("alice")), Some(&b.proof(&k)));
    r.assert_refused(400, "use_dpop_nonce", "the socket, no nonce");
    let c = r
        .header("www-authenticate")
        .expect("a challenge")
        .to_owned();
    assert!(
        c.starts_with("DPoP error=\"use_dpop_nonce\", algs=\""),
        "{c}"
    );
    seen.push(("socket: use_dpop_nonce", c));

    // The proxy: no token at all (a challenge without an error code)...
    let url = format!("{}/proxy/acme/user", b.public);
    let r = p.http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let c = challenge_of(&r);
    assert!(c.starts_with("DPoP algs=\""), "{c}");
    seen.push(("proxy: no token", c));
    // ...a token that is none...
    let r = p
        .send("GET", "/proxy/acme/user", "DPoP not-a-token", "x", None)
        .await;
    assert_eq!(r.status(), 401);
    let c = challenge_of(&r);
    assert!(
        c.starts_with("DPoP error=\"invalid_token\", algs=\""),
        "{c}"
    );
    seen.push(("proxy: invalid_token", c));
    // ...and a good token whose proof lacks the required nonce.
    let read = p.token("acme.read", "triage").await;
    let r = p.call(&read, "GET", "/user", None).await;
    assert_eq!(r.status(), 401);
    let c = challenge_of(&r);
    assert!(
        c.starts_with("DPoP error=\"use_dpop_nonce\", algs=\""),
        "{c}"
    );
    seen.push(("proxy: use_dpop_nonce", c));
    assert!(p.api.records().is_empty(), "nothing went upstream");
    seen
}

#[tokio::test]
async fn the_dpop_challenge_names_exactly_the_configured_algorithms_on_each_surface() {
    for (dpop, want) in [
        ("algs = [\"ES256\", \"PS256\"]", "ES256 PS256"),
        (
            "algs = [\"PS256\", \"ES256\", \"RS256\"]",
            "PS256 ES256 RS256",
        ),
        // Control: the default list is ES256 alone.
        ("", "ES256"),
    ] {
        let seen = challenges(dpop).await;
        assert_eq!(seen.len(), 4);
        for (what, challenge) in seen {
            assert_eq!(
                algs_of(&challenge),
                want,
                "{what}: {challenge} with {dpop:?}"
            );
        }
    }
}
