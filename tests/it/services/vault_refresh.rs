//! The vault's refresh against a real provider, in-process, with a store
//! whose writes can fail: S2 (crash after the provider rotated the refresh
//! token, before it was saved) and S3 (full disk while saving).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::oidc::{secret_file, OidcPeer, CLIENT_ID};
use credbroker::internals::clock::SystemClock;
use credbroker::internals::config::{AccountLookup, ClientAuth, ProviderConfig};
use credbroker::internals::store::{Hooked, SledStore, Store, StoreError, Tree};
use credbroker::internals::subject::Person;
use credbroker::internals::upstream::Provider;
use credbroker::internals::vault::{AccountStatus, TokenOutcome, TokenRequest, Vault, VaultError};

pub(crate) const REDIRECT: &str = "http://127.0.0.1:9/connect/callback/acme";

/// A store whose writes fail while `fail` is set (a full disk, a read-only
/// file system, or the moment of a crash). The refresh lease's writes
/// pass: the fault under test is the save of the account's tokens after
/// the provider answered (the crash point of S2, the full disk of S3),
/// which comes after the lease was taken.
fn failing(inner: Arc<dyn Store>) -> (Arc<Hooked>, Arc<AtomicBool>) {
    let fail = Arc::new(AtomicBool::new(false));
    let on = fail.clone();
    let store = Hooked::new(inner, move |t| {
        if on.load(Ordering::SeqCst) && t != Tree::Leases {
            Err(StoreError::Backend(
                "No space left on device (os error 28)".into(),
            ))
        } else {
            Ok(())
        }
    });
    (Arc::new(store), fail)
}

fn provider(peer: &OidcPeer, dir: &std::path::Path) -> Provider {
    provider_at(
        &peer.issuer,
        &peer.client_secret,
        dir,
        Duration::from_secs(3),
    )
}

/// The provider "acme" at `issuer` (an [`OidcPeer`]), with its client
/// secret written to a file in `dir`, every call bounded by `timeout`.
pub(crate) fn provider_at(
    issuer: &str,
    client_secret: &str,
    dir: &std::path::Path,
    timeout: Duration,
) -> Provider {
    Provider::new(ProviderConfig {
        name: "acme".into(),
        display_name: "Acme".into(),
        issuer: Some(issuer.to_string()),
        endpoints: None,
        client_id: CLIENT_ID.into(),
        client_secret_file: Some(secret_file(dir, "acme.secret", client_secret)),
        client_auth: ClientAuth::Basic,
        redirect_uri: REDIRECT.into(),
        scopes: vec![],
        narrow_on_refresh: false,
        account: AccountLookup::Userinfo {
            id_claim: "sub".into(),
            name_claim: "preferred_username".into(),
        },
        timeout,
        grant_endpoint: None,
        recheck_unexpiring_token_after: Duration::from_secs(3600),
        api_base: None,
    })
    .unwrap()
}

pub(crate) fn alice() -> Person {
    Person {
        iss: "https://idp.example".into(),
        sub: "alice".into(),
    }
}

/// Connects alice's account at acme (user `octo-alice`) in `vault`.
pub(crate) async fn connect(peer: &OidcPeer, p: &Provider, vault: &Vault) {
    let scopes = vec!["openid".to_string(), "repo".to_string()];
    let req = p.authorization_request(&scopes, &[]).await.unwrap();
    let back = peer.authorize(&req.url, "octo-alice").await;
    let t = p
        .exchange_code(&back["code"], req.verifier.expose())
        .await
        .unwrap();
    let who = p.account_info(t.access_token.expose()).await.unwrap();
    vault
        .connect_account(
            &alice(),
            "acme",
            &p.id(),
            &who,
            &t,
            &scopes,
            crate::support::now(),
        )
        .unwrap();
}

pub(crate) fn repo() -> Vec<String> {
    vec!["repo".to_string()]
}

#[tokio::test]
async fn rotated_refresh_token_not_saved_becomes_reconnect_required_without_a_retry_loop() {
    let dir = tempfile::tempdir().unwrap();
    let peer = OidcPeer::start("client-secret-canary-s2", REDIRECT);
    let p = provider(&peer, dir.path());
    let sled: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("data")).unwrap());
    let (failing, fail) = failing(sled.clone());
    let key_dir = dir.path().join("keys/vault");
    let vault = Vault::open(failing.clone(), crate::support::test_master(), &key_dir).unwrap();
    peer.set_access_ttl(30).await;
    connect(&peer, &p, &vault).await;
    peer.set_access_ttl(3600).await;
    let person = alice();
    let scopes = repo();
    let req = TokenRequest {
        person: &person,
        service: "acme",
        scopes: &scopes,
    };

    // The provider rotates the refresh token, then the write fails (the
    // crash point): no access token is handed out.
    fail.store(true, Ordering::SeqCst);
    let err = vault
        .provider_token(&p, &req, &SystemClock)
        .await
        .unwrap_err();
    assert!(matches!(err, VaultError::Store(_)), "{err:?}");
    assert_eq!(peer.refreshes().await, 1, "the provider did rotate");
    drop(vault);

    // "Restart" on the store as the crash left it: the old refresh token
    // was consumed, so the provider refuses it: a typed reconnect.
    let vault = Vault::open(sled.clone(), crate::support::test_master(), &key_dir).unwrap();
    let out = vault.provider_token(&p, &req, &SystemClock).await.unwrap();
    assert!(matches!(out, TokenOutcome::Reconnect), "{out:?}");
    assert_eq!(
        vault.account(&person, "acme").unwrap().unwrap().status,
        AccountStatus::ReconnectRequired
    );
    let requests = peer.stats().await["token_requests"].as_u64().unwrap();
    for _ in 0..3 {
        assert!(matches!(
            vault.provider_token(&p, &req, &SystemClock).await.unwrap(),
            TokenOutcome::Reconnect
        ));
    }
    assert_eq!(
        peer.stats().await["token_requests"].as_u64().unwrap(),
        requests,
        "no retry loop against the provider"
    );

    // Positive control: connecting again makes tokens flow.
    connect(&peer, &p, &vault).await;
    assert!(matches!(
        vault.provider_token(&p, &req, &SystemClock).await.unwrap(),
        TokenOutcome::Token(_)
    ));
}

#[tokio::test]
async fn rotated_refresh_token_is_saved_before_the_access_token_is_returned() {
    let dir = tempfile::tempdir().unwrap();
    let peer = OidcPeer::start("client-secret-canary-s2b", REDIRECT);
    let p = provider(&peer, dir.path());
    let sled: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("data")).unwrap());
    let key_dir = dir.path().join("keys/vault");
    let vault = Vault::open(sled.clone(), crate::support::test_master(), &key_dir).unwrap();
    peer.set_access_ttl(30).await;
    connect(&peer, &p, &vault).await;
    let person = alice();
    let scopes = repo();
    let req = TokenRequest {
        person: &person,
        service: "acme",
        scopes: &scopes,
    };
    // Each call refreshes (30 s tokens) and rotates; each must find the
    // refresh token saved by the previous one, or the provider would
    // answer invalid_grant (reuse) and revoke the grant.
    for i in 1..=3 {
        let out = vault.provider_token(&p, &req, &SystemClock).await.unwrap();
        let TokenOutcome::Token(t) = out else {
            panic!("{out:?}")
        };
        assert!(t.refreshed);
        assert_eq!(peer.refreshes().await, i);
        // What a crash right after the return would leave: a new process
        // reading the store sees the rotated token.
        let fresh = Vault::open(sled.clone(), crate::support::test_master(), &key_dir).unwrap();
        let refresh_token = fresh
            .tokens_to_revoke(&person, "acme")
            .unwrap()
            .into_iter()
            .find(|(_, hint)| *hint == "refresh_token")
            .unwrap()
            .0;
        assert!(
            peer.refresh_token_live(refresh_token.expose()).await,
            "the stored refresh token is the live one"
        );
        assert_eq!(peer.live_refresh_tokens("octo-alice").await, 1);
    }
}
