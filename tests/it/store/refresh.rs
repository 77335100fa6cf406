//! One provider refresh per account across three replicas (issue 13): the
//! real binary three times on one PostgreSQL database behind the forwarder
//! of `support/replicas.rs`, `oidc-provider` as the service `acme`. The
//! account is connected through the forwarder (the pages of any replica);
//! its access token is inside the refresh margin; 200 concurrent derives
//! spread over the three replicas' sockets then cause exactly one refresh
//! at the provider, and every derive gets the refreshed token (case S13 of
//! docs/SECURITY-CASES.md).
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::replicas::{Forwarder, ReplicaSet};
use crate::support::services::{issued, play_pages_at, refused, ProviderOpts, SERVICE};
use crate::support::{key, random_bytes};

/// Connections per replica: about a third of the derives may read the
/// store at the same moment on each.
const POOL: usize = 70;

/// A derive of `acme.issues` through `client` (a replica's socket).
async fn derive(
    client: &credbroker::client::Client,
    subject: &str,
    k: &credbroker::internals::jose::Es256Key,
) -> credbroker::client::Answer {
    client
        .derive(
            &credbroker::client::DeriveParams {
                subject_token: subject,
                step: "triage",
                tool: "acme.issues",
                resource: SERVICE,
                scope: None,
            },
            k,
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn two_hundred_derives_over_three_replicas_on_an_expiring_token_refresh_once() {
    let Some(cluster) = cluster_or_not_shown("one refresh across three replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let set = ReplicaSet::start_pooled(
        Forwarder::start(),
        database(cluster, "replicas_refresh"),
        3,
        ProviderOpts {
            // Derives queued behind the refresh in one replica wait at most
            // this long; on two loaded cores the refresh takes seconds.
            timeout: "10s",
            ..ProviderOpts::default()
        },
        POOL,
    );
    let peer = &set.provider.peer;
    let (a, b) = (&set.brokers[0], &set.brokers[1]);

    // Fill each replica's pool in waves first: a pool opens connections on
    // demand and answers "busy" when every one is taken, and opening
    // dozens at once (SCRAM) takes a debug build on two cores longer than
    // the connect timeout. bob, never connected, is refused on the
    // `service` path, which reads and writes the store.
    for wave in [8, 20, 40, POOL] {
        let tasks: Vec<_> = (0..3 * wave)
            .map(|i| {
                let b = &set.brokers[i % 3];
                let (client, subject, k) = (b.client(), b.subject_token("bob"), key());
                tokio::spawn(async move { derive(&client, &subject, &k).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }

    // alice connects through the forwarder (round robin: any replica's
    // pages) with 30 s access tokens, inside the 60 s refresh margin.
    let password = hex::encode(random_bytes(12));
    let body = serde_json::json!({"name": "alice", "password": password}).to_string();
    assert_eq!(b.admin_post("/users", &body).unwrap().0, 200);
    peer.set_access_ttl(30).await;
    let r = refused(
        a.derive(
            &key(),
            &a.subject_token("alice"),
            "triage",
            "acme.issues",
            SERVICE,
            None,
        )
        .await,
    );
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    let browser = reqwest::Client::builder()
        .cookie_store(true)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    play_pages_at(
        &browser,
        &set.issuer,
        peer,
        &r.connect_uri.unwrap(),
        ("alice", &password),
        "octo-alice",
    )
    .await;
    assert_eq!(peer.refreshes().await, 0);
    peer.set_access_ttl(3600).await;

    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let b = &set.brokers[i % 3];
            let (client, subject, k) = (b.client(), b.subject_token("alice"), key());
            tokio::spawn(async move { derive(&client, &subject, &k).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let refused_ones: Vec<_> = answers
        .iter()
        .filter_map(|a| match a {
            credbroker::client::Answer::Refused(r) => Some((
                r.status,
                r.error.clone(),
                r.reason.clone(),
                r.error_description.clone(),
            )),
            _ => None,
        })
        .collect();
    if !refused_ones.is_empty() {
        let warnings: Vec<String> = set
            .brokers
            .iter()
            .enumerate()
            .flat_map(|(i, b)| {
                std::fs::read_to_string(b.path("broker.log"))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("WARN") && !l.contains("pool is busy"))
                    .take(10)
                    .map(|l| format!("replica {i}: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        panic!(
            "{} derives refused ({:?}...); the provider saw {}; the replicas warned:\n{}",
            refused_ones.len(),
            &refused_ones[..refused_ones.len().min(5)],
            peer.stats().await,
            warnings.join("\n")
        );
    }
    let mut tokens = std::collections::BTreeSet::new();
    for t in answers {
        let t = issued(t);
        assert!(
            t.expires_in > 3000,
            "every answer carries the refreshed token"
        );
        tokens.insert(t.access_token.expose().clone());
    }
    assert_eq!(
        peer.refreshes().await,
        1,
        "exactly one refresh for 200 derives over three replicas"
    );
    assert_eq!(tokens.len(), 1, "all 200 got the one refreshed token");
    // The rotated refresh token was saved: it is the one live at the
    // provider (a second refresh with the old one would have revoked the
    // grant), and the next derive on any replica uses the stored token.
    assert_eq!(peer.live_refresh_tokens("octo-alice").await, 1);
    for x in &set.brokers {
        let t = issued(
            x.derive(
                &key(),
                &x.subject_token("alice"),
                "triage",
                "acme.issues",
                SERVICE,
                None,
            )
            .await,
        );
        assert!(tokens.contains(t.access_token.expose()));
    }
    assert_eq!(peer.refreshes().await, 1);
}
