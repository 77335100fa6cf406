//! A replayed proxied POST reaches the provider once, whichever replica it
//! is sent to: two real replicas on one PostgreSQL database behind the
//! forwarder, `oidc-provider` as the service, the API stand-in recording
//! what arrives. On the replica that served it, the replay meets the proxy's
//! `jti` check in the shared `replay` tree; on the other, the proof's nonce,
//! bound to the replica that issued it (docs/STORE.md), refuses it first.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::Es256Key;

use crate::support::api_standin::ApiStandin;
use crate::support::oidc::CLIENT_ID;
use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::replicas::{Forwarder, Pick, ReplicaSet};
use crate::support::services::{issued, play_pages_at, refused, ProviderOpts};
use crate::support::{key, random_bytes};

const PATH: &str = "/proxy/acme/repos/o/r/pulls";

fn policy(issuer: &str) -> String {
    format!(
        r#"
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.pulls"]
resource = "{issuer}/proxy/acme"
scopes = ["repo"]
steps = ["open_pr"]
routes = ["POST /repos/{{owner}}/{{repo}}/pulls"]
"#
    )
}

/// One proxied POST with exactly these headers, through the forwarder
/// directed at replica `to`: the status, the `DPoP-Nonce` it gave, the body.
async fn post(
    set: &ReplicaSet,
    to: usize,
    token: &str,
    proof: &str,
) -> (u16, Option<String>, String) {
    set.lb.pick(Pick::To(to));
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}{PATH}", set.issuer))
        .header("authorization", format!("DPoP {token}"))
        .header("dpop", proof)
        .header("content-type", "application/json")
        .body("{\"title\":\"one pull request\"}")
        .send()
        .await
        .unwrap();
    let nonce = r
        .headers()
        .get("dpop-nonce")
        .map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), nonce, r.text().await.unwrap())
}

fn proof(set: &ReplicaSet, k: &Es256Key, token: &str, nonce: Option<&str>) -> String {
    make_proof(
        k,
        "POST",
        &format!("{}{PATH}", set.issuer),
        crate::support::now(),
        Some(token),
        nonce,
    )
    .unwrap()
}

/// A proof with the nonce of replica `to`, accepted there: the headers of
/// the served call, and its answer.
async fn served_on(
    set: &ReplicaSet,
    to: usize,
    k: &Es256Key,
    token: &str,
) -> (String, (u16, Option<String>, String)) {
    let (status, nonce, body) = post(set, to, token, &proof(set, k, token, None)).await;
    assert_eq!(status, 401, "a proof without a nonce is challenged: {body}");
    assert!(body.contains("use_dpop_nonce"), "{body}");
    let p = proof(set, k, token, nonce.as_deref());
    let answer = post(set, to, token, &p).await;
    (p, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_replayed_proxied_post_reaches_the_provider_once_whichever_replica_gets_it() {
    let Some(cluster) = cluster_or_not_shown("a proxied POST replayed across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let lb = Forwarder::start();
    let issuer = lb.url();
    let api_listener = ApiStandin::bind();
    let api_base = format!("http://{}", api_listener.local_addr().unwrap());
    let set = ReplicaSet::start(
        lb,
        database(cluster, "replicas_proxy_replay"),
        2,
        ProviderOpts {
            extra_config: format!("api_base = \"{api_base}\"\n\n[proxy]\n"),
            extra_policy: policy(&issuer),
            ..ProviderOpts::default()
        },
    );
    let peer = &set.provider.peer;
    let api = ApiStandin::start(
        api_listener,
        ApiStandin::introspection_of(&peer.issuer).await,
        CLIENT_ID.into(),
        set.provider.client_secret.clone(),
        String::new(),
    )
    .await;
    let a = &set.brokers[0];
    let proxy = format!("{issuer}/proxy/acme");
    let k = key();

    // alice connects through the forwarder (any replica's pages).
    let password = hex::encode(random_bytes(12));
    let user = serde_json::json!({"name": "alice", "password": password}).to_string();
    assert_eq!(a.admin_post("/users", &user).unwrap().0, 200);
    let subject = a.subject_token("alice");
    let r = refused(
        a.derive(&k, &subject, "open_pr", "acme.pulls", &proxy, None)
            .await,
    );
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    let browser = reqwest::Client::builder()
        .cookie_store(true)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    set.lb.pick(Pick::RoundRobin);
    play_pages_at(
        &browser,
        &set.issuer,
        peer,
        &r.connect_uri.unwrap(),
        ("alice", &password),
        "octo-alice",
    )
    .await;
    let t = issued(
        a.derive(&k, &subject, "open_pr", "acme.pulls", &proxy, None)
            .await,
    );
    let token = t.access_token.expose().clone();

    // Served on A: the stand-in saw one POST, with the provider's token.
    let (served, (status, _, body)) = served_on(&set, 0, &k, &token).await;
    assert_eq!(status, 201, "{body}");
    let posts = |api: &ApiStandin| {
        api.records()
            .into_iter()
            .filter(|r| r.method == "POST")
            .count()
    };
    assert_eq!(posts(&api), 1);

    // The same request again, on A and on B: refused, nothing upstream.
    let (status, _, body) = post(&set, 0, &token, &served).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("invalid_dpop_proof"), "replayed on A: {body}");
    let (status, _, body) = post(&set, 1, &token, &served).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("use_dpop_nonce"), "replayed on B: {body}");
    assert_eq!(posts(&api), 1, "a replay never reached the provider");

    // Positive control: a fresh proof with B's own nonce is served on B.
    let (_, (status, _, body)) = served_on(&set, 1, &k, &token).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(posts(&api), 2);
    assert!(
        !set.events(1, "proxy.request").is_empty(),
        "B wrote its own proxy.request"
    );
}
