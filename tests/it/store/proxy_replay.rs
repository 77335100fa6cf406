//! A replayed proxied POST reaches the provider once, whichever replica it
//! is sent to: two real replicas on one PostgreSQL database behind the
//! forwarder, `oidc-provider` as the service, the API stand-in recording
//! what arrives. On the replica that served it, the replay meets the proxy's
//! `jti` check in the shared `replay` tree, on the other too: proxy nonces
//! are valid at every replica (docs/STORE.md), so only the shared tree
//! stands between a replay and the provider. A proxied call challenged by
//! one replica and retried at another is served; derive nonces stay each
//! replica's own, and neither domain accepts the other's nonces.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::Es256Key;

use crate::support::api_standin::ApiStandin;
use crate::support::key;
use crate::support::oidc::CLIENT_ID;
use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::replicas::{Forwarder, Pick, ReplicaSet};
use crate::support::services::{issued, play_pages_at, refused, ProviderOpts};

const PATH: &str = "/proxy/acme/repos/o/r/pulls";

/// alice's local account on the pages (a test password).
const ALICE_PW: &str = "alice's own test password on the replicas";

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

[tools."acme.once"]
resource = "{issuer}/proxy/acme"
scopes = ["repo"]
steps = ["open_pr"]
approval = "each_call"
routes = ["POST /repos/{{owner}}/{{repo}}/pulls"]
"#
    )
}

/// One proxied POST with exactly these headers, through the forwarder
/// directed at replica `to`: the status, the `DPoP-Nonce` it gave, the body.
pub(super) async fn post(
    set: &ReplicaSet,
    to: usize,
    token: &str,
    proof: &str,
) -> (u16, Option<String>, String) {
    post_picked(set, Pick::To(to), token, proof).await
}

/// [`post`], with the forwarder picking the replica as `pick` says (with
/// [`Pick::RoundRobin`], the next replica in turn: a front that chooses
/// a replica per request).
pub(super) async fn post_picked(
    set: &ReplicaSet,
    pick: Pick,
    token: &str,
    proof: &str,
) -> (u16, Option<String>, String) {
    set.lb.pick(pick);
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

pub(super) fn proof(set: &ReplicaSet, k: &Es256Key, token: &str, nonce: Option<&str>) -> String {
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

/// Two replicas behind the forwarder on database `db`, the API stand-in
/// as `acme`'s API, and alice connected: the set, the stand-in, her
/// subject token, the tool key and a proxy token for `acme.pulls`.
async fn connected(
    cluster: &'static crate::support::postgres::Cluster,
    db: &str,
) -> (ReplicaSet, ApiStandin, String, Es256Key, String) {
    connected_with(cluster, db, 2, None).await
}

/// [`connected`], with `n` replicas and their config text edited by `edit`.
pub(super) async fn connected_with(
    cluster: &'static crate::support::postgres::Cluster,
    db: &str,
    n: usize,
    edit: Option<fn(String) -> String>,
) -> (ReplicaSet, ApiStandin, String, Es256Key, String) {
    let lb = Forwarder::start();
    let issuer = lb.url();
    let api_listener = ApiStandin::bind();
    let api_base = format!("http://{}", api_listener.local_addr().unwrap());
    let set = ReplicaSet::start(
        lb,
        database(cluster, db),
        n,
        ProviderOpts {
            extra_config: format!("api_base = \"{api_base}\"\n\n[proxy]\n"),
            extra_policy: policy(&issuer),
            edit_config: edit,
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
    let user = serde_json::json!({"name": "alice", "password": ALICE_PW}).to_string();
    assert_eq!(a.admin_post("/users", &user).unwrap().0, 200);
    let subject = a.subject_token("alice");
    let r = refused(
        a.derive(&k, &subject, "open_pr", "acme.pulls", &proxy, None)
            .await,
    );
    assert_eq!(r.reason.as_deref(), Some("connect_required"), "{r:?}");
    set.lb.pick(Pick::RoundRobin);
    play_pages_at(
        &browser(),
        &set.issuer,
        peer,
        &r.connect_uri.unwrap(),
        ("alice", ALICE_PW),
        "octo-alice",
    )
    .await;
    let t = issued(
        a.derive(&k, &subject, "open_pr", "acme.pulls", &proxy, None)
            .await,
    );
    let token = t.access_token.expose().clone();
    (set, api, subject, k, token)
}

/// A cookie-keeping browser that follows no redirect (the pages' client).
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

pub(super) fn posts(api: &ApiStandin) -> usize {
    api.records()
        .into_iter()
        .filter(|r| r.method == "POST")
        .count()
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
    let (set, api, _, k, token) = connected(cluster, "replicas_proxy_replay").await;

    // Served on A: the stand-in saw one POST, with the provider's token.
    let (served, (status, _, body)) = served_on(&set, 0, &k, &token).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(posts(&api), 1);

    // The same request again, on A and on B: refused by the shared replay
    // tree (the nonce is valid at both), nothing upstream.
    for to in [0, 1] {
        let (status, _, body) = post(&set, to, &token, &served).await;
        assert_eq!(status, 401, "{body}");
        assert!(
            body.contains("invalid_dpop_proof"),
            "replayed on {to}: {body}"
        );
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_proxied_call_challenged_by_one_replica_is_served_by_another() {
    let Some(cluster) = cluster_or_not_shown("proxy nonces valid at every replica") else {
        return;
    };
    let _shared = cluster.shared();
    let (set, api, subject, k, token) = connected(cluster, "replicas_nonce_domains").await;
    let (a, b) = (&set.brokers[0], &set.brokers[1]);

    // The challenge comes from A, the retry goes to B (a front that picks
    // a replica per request): served, once.
    let (status, nonce_a, body) = post(&set, 0, &token, &proof(&set, &k, &token, None)).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("use_dpop_nonce"), "{body}");
    let nonce_a = nonce_a.expect("A's proxy nonce");
    let retry = proof(&set, &k, &token, Some(&nonce_a));
    let (status, _, body) = post(&set, 1, &token, &retry).await;
    assert_eq!(status, 201, "A's proxy nonce at B: {body}");
    assert_eq!(posts(&api), 1);
    // ... and the same proof at A now is a replay (the shared tree).
    let (status, _, body) = post(&set, 0, &token, &retry).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("invalid_dpop_proof"), "{body}");
    assert_eq!(posts(&api), 1, "the replay never reached the provider");

    // Derive nonces stay each replica's own: A's is refused at B (the
    // control that the derive domain is per instance), accepted at A.
    let derive = serde_json::json!({
        "subject_token": subject, "step": "open_pr", "tool": "acme.pulls",
        "resource": format!("{}/proxy/acme", set.issuer),
    });
    let first = a.post_derive(&derive, Some(&a.proof(&k)));
    first.assert_refused(400, "use_dpop_nonce", "A: a derive without a nonce");
    let derive_nonce_a = first
        .header("dpop-nonce")
        .expect("A's derive nonce")
        .to_owned();
    let at = |nonce: &str| {
        make_proof(
            &k,
            "POST",
            &a.htu(),
            crate::support::now(),
            None,
            Some(nonce),
        )
        .unwrap()
    };
    b.post_derive(&derive, Some(&at(&derive_nonce_a)))
        .assert_refused(400, "use_dpop_nonce", "B: A's derive nonce");

    // Neither domain takes the other's nonces: a proxy nonce on a derive,
    // a derive nonce on a proxied call, each at the replica that issued
    // both.
    a.post_derive(&derive, Some(&at(&nonce_a))).assert_refused(
        400,
        "use_dpop_nonce",
        "A: a proxy nonce on a derive",
    );
    let (status, _, body) = post(
        &set,
        0,
        &token,
        &proof(&set, &k, &token, Some(&derive_nonce_a)),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body.contains("use_dpop_nonce"),
        "a derive nonce on a proxied call: {body}"
    );
    assert_eq!(posts(&api), 1);

    // Positive controls: each nonce in its own domain.
    a.post_derive(&derive, Some(&at(&derive_nonce_a)))
        .assert_issued("A: its derive nonce on a derive");
    let (status, _, body) = post(&set, 1, &token, &proof(&set, &k, &token, Some(&nonce_a))).await;
    assert_eq!(status, 201, "A's proxy nonce at B, a new proof: {body}");
    assert_eq!(posts(&api), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_single_use_token_is_served_once_across_replicas() {
    let Some(cluster) = cluster_or_not_shown("a single-use token across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let (set, api, subject, k, _) = connected(cluster, "replicas_single_use").await;
    let a = &set.brokers[0];
    let proxy = format!("{}/proxy/acme", set.issuer);
    // alice approves two calls of acme.once through the pages: two
    // single-use tokens.
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let r = refused(
            a.derive(&k, &subject, "open_pr", "acme.once", &proxy, None)
                .await,
        );
        assert_eq!(r.reason.as_deref(), Some("approval_required"), "{r:?}");
        set.lb.pick(Pick::RoundRobin);
        play_pages_at(
            &browser(),
            &set.issuer,
            &set.provider.peer,
            &r.connect_uri.unwrap(),
            ("alice", ALICE_PW),
            "",
        )
        .await;
        let t = issued(
            a.derive(&k, &subject, "open_pr", "acme.once", &proxy, None)
                .await,
        );
        tokens.push(t.access_token.expose().clone());
    }
    let (once, other) = (&tokens[0], &tokens[1]);

    // Served on A; then on B, with a fresh proof (B's own nonce), the same
    // token is refused: the shared store spent it. Nothing more upstream.
    let (_, (status, _, body)) = served_on(&set, 0, &k, once).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(posts(&api), 1);
    let (_, (status, _, body)) = served_on(&set, 1, &k, once).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("token_already_used"), "on B: {body}");
    assert_eq!(posts(&api), 1, "the second use never reached the provider");

    // Positive control: the other approved token is served on B, once.
    let (_, (status, _, body)) = served_on(&set, 1, &k, other).await;
    assert_eq!(status, 201, "{body}");
    let (_, (status, _, body)) = served_on(&set, 0, &k, other).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("token_already_used"), "on A: {body}");
    assert_eq!(posts(&api), 2);
}
