//! One provider refresh per account across instances sharing a PostgreSQL
//! database, with `oidc-provider` as the provider (it rotates refresh
//! tokens and counts refreshes): many concurrent refreshes on three vaults
//! cause one refresh; a lease holder killed with SIGKILL while it holds the
//! lease leaves a lease that lapses, and another instance then refreshes
//! once. (The fence itself, a lapsed holder's late save refused, is a
//! property of `store::contract`, run on both backends.)
//!
//! Until the vault's keys live in the store, the vaults here share one key
//! directory, as replicas must today.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use credbroker::internals::clock::SystemClock;
use credbroker::internals::store::{tuple_key, PgStore, Store, Tree};
use credbroker::internals::vault::{TokenOutcome, TokenRequest, Vault};

use super::vault_refresh::{alice, connect, provider_at, repo, REDIRECT};
use crate::support::oidc::OidcPeer;
use crate::support::postgres::{cluster_or_not_shown, database};

/// Concurrent calls per instance in the race.
const PER_INSTANCE: usize = 12;

fn alice_at_acme() -> Vec<u8> {
    let a = alice();
    tuple_key(&[&a.iss, &a.sub, "acme"])
}

async fn token(vault: &Vault, p: &credbroker::internals::upstream::Provider) -> TokenOutcome {
    let (person, scopes) = (alice(), repo());
    let req = TokenRequest {
        person: &person,
        service: "acme",
        scopes: &scopes,
    };
    vault.provider_token(p, &req, &SystemClock).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn concurrent_refreshes_on_three_instances_refresh_once_at_the_provider() {
    let Some(cluster) = cluster_or_not_shown("one refresh across instances") else {
        return;
    };
    let _shared = cluster.shared();
    let db = database(cluster, "refresh_once");
    let dir = tempfile::tempdir().unwrap();
    let peer = OidcPeer::start("client-secret-canary-lease", REDIRECT);
    let p = Arc::new(provider_at(
        &peer.issuer,
        &peer.client_secret,
        dir.path(),
        Duration::from_secs(3),
    ));
    let key_dir = dir.path().join("keys/vault");
    // Each instance's calls may all read the account at once: its pool
    // covers them (a smaller one answers some "busy", 503, as it must),
    // and is filled before the race, since opening a connection (SCRAM)
    // is slow in a debug build on a loaded machine.
    let mut settings = db.settings();
    settings.pool_size = PER_INSTANCE;
    settings.connect_timeout = Duration::from_secs(10);
    settings.statement_timeout = Duration::from_secs(10);
    let vaults: Vec<Arc<Vault>> = (0..3)
        .map(|_| {
            let store: Arc<dyn Store> = Arc::new(PgStore::open(&settings).unwrap());
            std::thread::scope(|sc| {
                for _ in 0..PER_INSTANCE {
                    sc.spawn(|| store.get(Tree::Accounts, b"warm-up").unwrap());
                }
            });
            Arc::new(Vault::open(store, crate::support::test_master(), &key_dir).unwrap())
        })
        .collect();
    // Connected with a token that is already inside the refresh margin;
    // the refreshed one lasts an hour.
    peer.set_access_ttl(30).await;
    connect(&peer, &p, &vaults[0]).await;
    peer.set_access_ttl(3600).await;

    let calls: Vec<_> = (0..3 * PER_INSTANCE)
        .map(|i| {
            let (v, p) = (vaults[i % 3].clone(), p.clone());
            tokio::spawn(async move { token(&v, &p).await })
        })
        .collect();
    let mut tokens = std::collections::BTreeSet::new();
    let mut refreshed = 0;
    for c in calls {
        match c.await.unwrap() {
            TokenOutcome::Token(t) => {
                refreshed += usize::from(t.refreshed);
                tokens.insert(t.access_token.expose().clone());
            }
            other => panic!("a derive got no token: {other:?}"),
        }
    }
    assert_eq!(peer.refreshes().await, 1, "one refresh at the provider");
    assert_eq!(
        refreshed, 1,
        "one call refreshed, the others used its token"
    );
    assert_eq!(tokens.len(), 1, "every call got the refreshed token");
    // The token the provider rotated to is the one stored, and the only
    // live one (a second refresh with the old one would have revoked it).
    let stored = vaults[2]
        .tokens_to_revoke(&alice(), "acme")
        .unwrap()
        .into_iter()
        .find(|(_, hint)| *hint == "refresh_token")
        .unwrap()
        .0;
    assert!(peer.refresh_token_live(stored.expose()).await);
    assert_eq!(peer.live_refresh_tokens("octo-alice").await, 1);
    // No lease is left behind.
    let store = vaults[1].store();
    assert_eq!(
        store.get_expiring(Tree::Leases, &alice_at_acme()).unwrap(),
        None
    );
}

// The pause point exists only with the `failpoints` feature (CI's tests
// build with it).
#[cfg(feature = "failpoints")]
mod killed {
    use std::io::{BufRead, BufReader};
    use std::time::Instant;

    use credbroker::internals::vault::lease_lifetime;

    use super::*;
    use crate::support::postgres::settings_from_env;

    /// The provider timeout of the kill test: its lease lasts twice that.
    const SHORT_TIMEOUT: Duration = Duration::from_secs(1);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::await_holding_lock)]
    async fn a_lease_holder_killed_mid_refresh_leaves_a_lease_that_lapses_and_another_instance_refreshes_once(
    ) {
        let Some(cluster) = cluster_or_not_shown("a killed refresh lease holder") else {
            return;
        };
        let _shared = cluster.shared();
        let db = database(cluster, "refresh_killed");
        let dir = tempfile::tempdir().unwrap();
        let peer = OidcPeer::start("client-secret-canary-killed", REDIRECT);
        let p = provider_at(&peer.issuer, &peer.client_secret, dir.path(), SHORT_TIMEOUT);
        let key_dir = dir.path().join("keys/vault");
        let store: Arc<dyn Store> = Arc::new(PgStore::open(&db.settings()).unwrap());
        let vault = Vault::open(store.clone(), crate::support::test_master(), &key_dir).unwrap();
        peer.set_access_ttl(30).await;
        connect(&peer, &p, &vault).await;
        peer.set_access_ttl(3600).await;

        // Another instance (a process of its own) starts the refresh and stops
        // right after taking the lease.
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "services::refresh_replicas::killed::refresh_until_the_lease_failpoint",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CREDBROKER_FAILPOINT", "pause:vault.refresh.lease_taken")
        .env("CREDBROKER_TEST_ISSUER", &peer.issuer)
        .env("CREDBROKER_TEST_CLIENT_SECRET", &peer.client_secret)
        .env("CREDBROKER_TEST_KEY_DIR", &key_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
        db.pass_to(&mut cmd);
        let mut holder = cmd.spawn().unwrap();
        let stderr = holder.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("failpoint vault.refresh.lease_taken: paused") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = holder.kill();
            panic!("the other instance never reached the lease failpoint");
        }
        let lease = store
            .get_expiring(Tree::Leases, &alice_at_acme())
            .unwrap()
            .expect("the paused instance holds the lease");
        let lease = String::from_utf8(lease).unwrap();
        assert!(
            lease.contains(&format!("/{} ", holder.id())),
            "the lease names the holder's process: {lease}"
        );
        // kill -9 while it holds the lease, before it reached the provider.
        holder.kill().unwrap();
        let killed_at = Instant::now();
        holder.wait().unwrap();
        assert_eq!(
            peer.refreshes().await,
            0,
            "the killed holder never refreshed"
        );

        // This instance waits for the lease to lapse (no refresh while it is
        // held), then takes it and refreshes once.
        let out = token(&vault, &p).await;
        let waited = killed_at.elapsed();
        let TokenOutcome::Token(t) = out else {
            panic!("no token after the holder died: {out:?}")
        };
        assert!(t.refreshed, "this instance refreshed");
        assert_eq!(peer.refreshes().await, 1, "one refresh in all");
        let lifetime = lease_lifetime(SHORT_TIMEOUT);
        assert!(
            waited < lifetime + Duration::from_secs(2),
            "waited {waited:?}, more than the lease ({lifetime:?})"
        );
        eprintln!("refreshed {waited:?} after the holder was killed (lease {lifetime:?})");
        assert_eq!(
            store.get_expiring(Tree::Leases, &alice_at_acme()).unwrap(),
            None,
            "released after the refresh"
        );
        // And the next call uses that token without asking the provider.
        let TokenOutcome::Token(again) = token(&vault, &p).await else {
            panic!("no token")
        };
        assert!(!again.refreshed);
        assert_eq!(again.access_token.expose(), t.access_token.expose());
        assert_eq!(peer.refreshes().await, 1);
    }

    /// The instance that dies holding the lease (run only by the test above,
    /// with the failpoint armed).
    #[test]
    #[ignore = "run by a_lease_holder_killed_mid_refresh_leaves_a_lease_that_lapses_and_another_instance_refreshes_once"]
    fn refresh_until_the_lease_failpoint() {
        let var = |k: &str| std::env::var(k).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let p = provider_at(
                &var("CREDBROKER_TEST_ISSUER"),
                &var("CREDBROKER_TEST_CLIENT_SECRET"),
                dir.path(),
                SHORT_TIMEOUT,
            );
            let store: Arc<dyn Store> = Arc::new(PgStore::open(&settings_from_env()).unwrap());
            // The vault's keys are the store's record, sealed under the
            // same (test) master key as the parent's.
            let vault = Vault::open(
                store,
                crate::support::test_master(),
                std::path::Path::new(&var("CREDBROKER_TEST_KEY_DIR")),
            )
            .unwrap();
            let out = token(&vault, &p).await;
            panic!("the failpoint did not stop the refresh: {out:?}");
        });
    }
}
