//! The provider client (`credbroker::internals::upstream`) against a real OAuth
//! provider: authorization URL with PKCE and state, code exchange, account
//! name, refresh with rotation, revocation, discovery, and failures that
//! must stay bounded.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::support::oidc::{secret_file, OidcPeer, CLIENT_ID};
use credbroker::internals::config::{AccountLookup, ClientAuth, Endpoints, ProviderConfig};
use credbroker::internals::upstream::{Provider, Revocation, UpstreamError};

const REDIRECT: &str = "http://127.0.0.1:9/connect/callback/acme";

fn config(peer: &OidcPeer, dir: &std::path::Path, timeout: Duration) -> ProviderConfig {
    ProviderConfig {
        name: "acme".into(),
        display_name: "Acme".into(),
        issuer: Some(peer.issuer.clone()),
        endpoints: None,
        client_id: CLIENT_ID.into(),
        client_secret_file: Some(secret_file(
            dir,
            "acme.secret",
            &format!("{}\n", peer.client_secret),
        )),
        client_auth: ClientAuth::Basic,
        redirect_uri: REDIRECT.into(),
        scopes: vec![],
        narrow_on_refresh: true,
        account: AccountLookup::Userinfo {
            id_claim: "sub".into(),
            name_claim: "preferred_username".into(),
        },
        timeout,
        grant_endpoint: None,
        recheck_unexpiring_token_after: Duration::from_secs(3600),
        api_base: None,
    }
}

fn scopes(s: &str) -> Vec<String> {
    s.split(' ').map(str::to_owned).collect()
}

#[tokio::test]
async fn code_flow_with_pkce_refresh_rotation_and_revocation() {
    let dir = tempfile::tempdir().unwrap();
    let peer = OidcPeer::start("client-secret-canary-0001", REDIRECT);
    let p = Provider::new(config(&peer, dir.path(), Duration::from_secs(5))).unwrap();

    // Discovery found the endpoints, including revocation.
    let ep = p.endpoints().await.unwrap();
    assert!(ep.revocation.is_some() && ep.userinfo.is_some());

    let req = p
        .authorization_request(&scopes("openid profile repo"), &[])
        .await
        .unwrap();
    let u = url::Url::parse(&req.url).unwrap();
    let q: std::collections::BTreeMap<_, _> = u.query_pairs().into_owned().collect();
    assert_eq!(q["code_challenge_method"], "S256");
    assert_eq!(
        q["code_challenge"],
        credbroker::internals::upstream::pkce_challenge(req.verifier.expose())
    );
    assert_eq!(q["state"], *req.state.expose());
    assert_eq!(q["redirect_uri"], REDIRECT);

    let back = peer.authorize(&req.url, "octo-alice").await;
    assert_eq!(
        back["state"],
        *req.state.expose(),
        "state comes back unchanged"
    );
    assert_eq!(
        back["iss"], peer.issuer,
        "RFC 9207 iss is sent by this provider"
    );
    // The RFC 9207 check the pages run on a provider's callback.
    let iss_check = |got: Option<&str>| {
        credbroker::internals::oauth::check_callback_iss(
            p.config().issuer.as_deref(),
            ep.sends_iss,
            got,
        )
    };
    assert!(
        iss_check(Some("https://other-provider.example")).is_err(),
        "mix-up: another issuer"
    );
    if ep.sends_iss {
        assert!(
            iss_check(None).is_err(),
            "iss dropped by a provider that sends it"
        );
    }
    iss_check(Some(&back["iss"])).unwrap();

    // A wrong verifier is refused (the provider enforces PKCE).
    let wrong = p
        .exchange_code(&back["code"], "x".repeat(43).as_str())
        .await
        .unwrap_err();
    assert!(matches!(wrong, UpstreamError::Rejected { .. }), "{wrong:?}");

    // The code is single-use at the provider, so a fresh flow for the positive control.
    let req = p
        .authorization_request(&scopes("openid profile repo"), &[])
        .await
        .unwrap();
    let back = peer.authorize(&req.url, "octo-alice").await;
    let t = p
        .exchange_code(&back["code"], req.verifier.expose())
        .await
        .unwrap();
    assert_eq!(t.token_type, "Bearer");
    assert_eq!(t.expires_in, Some(3600));
    let rt1 = t
        .refresh_token
        .as_ref()
        .expect("a refresh token")
        .expose()
        .clone();

    let who = p.account_info(t.access_token.expose()).await.unwrap();
    assert_eq!(who.id, "octo-alice");
    assert_eq!(who.name, "octo-alice");

    // Refresh, narrowed: a new access token with only `repo`, and a rotated refresh token.
    let r = p.refresh(&rt1, Some(&scopes("repo"))).await.unwrap();
    assert_eq!(r.scope.as_deref(), Some(&scopes("repo")[..]));
    let rt2 = r.refresh_token.as_ref().expect("rotated").expose().clone();
    assert_ne!(rt1, rt2);
    // Reusing the consumed refresh token: invalid_grant (and the provider
    // revokes the whole grant, as RFC 9700 section 4.14.2 suggests).
    let reuse = p.refresh(&rt1, None).await.unwrap_err();
    assert!(reuse.is_invalid_grant(), "{reuse:?}");
    let after = p.refresh(&rt2, None).await.unwrap_err();
    assert!(
        after.is_invalid_grant(),
        "the grant is gone after reuse: {after:?}"
    );

    // Revocation (RFC 7009) on a fresh grant.
    let req = p
        .authorization_request(&scopes("openid repo"), &[])
        .await
        .unwrap();
    let back = peer.authorize(&req.url, "octo-bob").await;
    let t = p
        .exchange_code(&back["code"], req.verifier.expose())
        .await
        .unwrap();
    let rt = t.refresh_token.unwrap();
    assert_eq!(peer.live_refresh_tokens("octo-bob").await, 1);
    assert_eq!(
        p.revoke(rt.expose(), "refresh_token").await.unwrap(),
        Revocation::Revoked
    );
    assert_eq!(peer.live_refresh_tokens("octo-bob").await, 0);
    assert!(p
        .refresh(rt.expose(), None)
        .await
        .unwrap_err()
        .is_invalid_grant());
}

/// A7: upstream slow, 5xx, bad JSON, down or TLS failure: a bounded wait,
/// then "unavailable", never a token; each followed by the positive control.
#[tokio::test]
async fn upstream_failures_are_bounded_and_typed() {
    let _serial = crate::support::serial().await;
    let dir = tempfile::tempdir().unwrap();
    let mut peer = OidcPeer::start("client-secret-canary-0002", REDIRECT);
    let timeout = Duration::from_millis(1500);
    let p = Provider::new(config(&peer, dir.path(), timeout)).unwrap();
    let req = p
        .authorization_request(&scopes("openid repo"), &[])
        .await
        .unwrap();
    let back = peer.authorize(&req.url, "octo-carol").await;
    let t = p
        .exchange_code(&back["code"], req.verifier.expose())
        .await
        .unwrap();
    let mut rt = t.refresh_token.unwrap().expose().clone();
    // The bounds below are relative to what one good refresh takes here and
    // now, not to a fixed figure a busy machine could miss.
    let started = Instant::now();
    let r = p.refresh(&rt, None).await.unwrap();
    let one_refresh = started.elapsed();
    rt = r.refresh_token.unwrap().expose().clone();
    let slack = one_refresh * 4 + Duration::from_millis(300);

    for mode in ["hang", "500", "badjson"] {
        peer.set_token_mode(mode).await;
        let started = Instant::now();
        let e = p.refresh(&rt, None).await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(e, UpstreamError::Unavailable(_)), "{mode}: {e:?}");
        if mode == "hang" {
            // Ended by the timeout, not by anything else.
            assert!(
                took >= timeout && took < timeout + slack,
                "hang: took {took:?} (timeout {timeout:?}, one refresh {one_refresh:?})"
            );
        } else {
            // An answer, however bad, is not waited on until the timeout.
            assert!(
                took < slack.min(timeout),
                "{mode}: took {took:?} (one refresh {one_refresh:?})"
            );
        }
        peer.set_token_mode("ok").await;
        // Positive control (the refresh token was never consumed above).
        let r = p.refresh(&rt, None).await.unwrap();
        rt = r.refresh_token.unwrap().expose().clone();
    }

    // TLS failure: https to a plain-HTTP port.
    let mut tls = config(&peer, dir.path(), timeout);
    tls.client_secret_file = Some(secret_file(dir.path(), "tls.secret", "x"));
    tls.issuer = None;
    let port = url::Url::parse(&peer.issuer).unwrap().port().unwrap();
    tls.endpoints = Some(Endpoints {
        authorization: format!("https://127.0.0.1:{port}/auth"),
        token: format!("https://127.0.0.1:{port}/token"),
        revocation: None,
        userinfo: None,
        sends_iss: false,
    });
    let e = Provider::new(tls)
        .unwrap()
        .refresh(&rt, None)
        .await
        .unwrap_err();
    assert!(matches!(e, UpstreamError::Unavailable(_)), "{e:?}");

    // Down: the process is gone.
    peer.kill();
    let started = Instant::now();
    let e = p.refresh(&rt, None).await.unwrap_err();
    assert!(matches!(e, UpstreamError::Unavailable(_)), "{e:?}");
    // A refused connection is known at once: no waiting for the timeout.
    assert!(
        started.elapsed() < timeout,
        "down: took {:?}",
        started.elapsed()
    );
}

#[test]
fn client_secret_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ProviderConfig {
        name: "acme".into(),
        display_name: "Acme".into(),
        issuer: Some("https://id.example".into()),
        endpoints: None,
        client_id: "c".into(),
        client_secret_file: Some(secret_file(dir.path(), "s", "client-secret-canary-0003")),
        client_auth: ClientAuth::Basic,
        redirect_uri: REDIRECT.into(),
        scopes: vec![],
        narrow_on_refresh: false,
        account: AccountLookup::Userinfo {
            id_claim: "sub".into(),
            name_claim: "name".into(),
        },
        timeout: Duration::from_secs(1),
        grant_endpoint: None,
        recheck_unexpiring_token_after: Duration::from_secs(3600),
        api_base: None,
    };
    let path = cfg.client_secret_file.clone().unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Provider::new(cfg.clone()).unwrap_err();
    assert!(e.to_string().contains("0600"), "{e}");
    assert!(!e.to_string().contains("canary"));
    assert!(!format!(
        "{:?}",
        Provider::new({
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            cfg.clone()
        })
        .unwrap()
    )
    .contains("canary"));
    cfg.client_secret_file = Some(dir.path().join("absent"));
    assert!(Provider::new(cfg).is_err());
}
