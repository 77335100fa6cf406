//! The person-level stop (docs/REVOCATION.md) across two real replicas on
//! one PostgreSQL database behind the forwarder: a stop on A refuses
//! Alice's derives on A and B within the bound, cuts her download in flight
//! through B's proxy (the API stand-in records the cut), closes her approval
//! link (404) and declines her pending approval, while Bob is served; a
//! restore lifts it; a sign-in stop written by another writer is lifted
//! only by a subject token with a later `auth_time` (revoking at the
//! providers: `tests/it/services/person_stop.rs`, and on a replica here).
//! Then, with PostgreSQL stopped beyond the bound, a replica refuses
//! (`revocation_watch_down`) or, with `watch_failure = "serve"`, serves and
//! says so; a stop acknowledged before a PostgreSQL restart is kept.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use credbroker::client::Answer;
use credbroker::internals::dpop::make_proof;
use credbroker::internals::jose::Es256Key;

use crate::support::api_standin::ApiStandin;
use crate::support::oidc::CLIENT_ID;
use crate::support::postgres::{cluster_or_not_shown, database};
use crate::support::replicas::{Forwarder, Pick, ReplicaSet};
use crate::support::services::{issued, play_pages_at, refused, ProviderOpts};
use crate::support::*;

const DEPLOY: &str = "https://deploy.example/api";
/// The stop's bound in these tests (`revocation.watch_bound`).
const BOUND: Duration = Duration::from_secs(4);

fn policy(issuer: &str) -> String {
    format!(
        r#"
[resources."{issuer}/proxy/acme"]
source = "service"
service = "acme"
delivery = "proxy"

[tools."acme.read"]
resource = "{issuer}/proxy/acme"
scopes = ["repo"]
steps = ["read"]
routes = ["GET /trickle/{{mib}}"]

[resources."{DEPLOY}"]
source = "self"

[tools."deploy.run"]
resource = "{DEPLOY}"
scopes = ["deploy"]
steps = ["release"]
approval = "each_call"
"#
    )
}

fn config(bound: &str, failure: &str) -> String {
    format!("\n[revocation]\nwatch_bound = \"{bound}\"\nwatch_failure = \"{failure}\"\nrestore_skew = \"1s\"\n")
}

/// The self derive of the quick-start policy for `sub` on `b`.
async fn derive(b: &TestBroker, k: &Es256Key, subject: &str) -> Answer {
    b.derive(k, subject, "summarize", "notes.read", RESOURCE, None)
        .await
}

fn reason(a: &Answer) -> Option<String> {
    match a {
        Answer::Refused(r) => r.reason.clone(),
        Answer::Issued(_) => None,
    }
}

/// Waits until `b` refuses `subject` with `want` (or issues, with
/// `None`), at most [`BOUND`]; returns how long it took.
async fn until(b: &TestBroker, k: &Es256Key, subject: &str, want: Option<&str>) -> Duration {
    until_within(b, k, subject, want, BOUND).await
}

async fn until_within(
    b: &TestBroker,
    k: &Es256Key,
    subject: &str,
    want: Option<&str>,
    most: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        // Judged by when the derive was sent: one sent within the bound
        // and answered after it (a loaded machine) says nothing against it.
        let sent = start.elapsed();
        let a = derive(b, k, subject).await;
        if reason(&a).as_deref() == want {
            return start.elapsed();
        }
        assert!(
            sent < most,
            "not {want:?} within {most:?}: {:?}",
            reason(&a)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two replicas with alice connected to `acme`: the set, the stand-in, her
/// subject token, the tool key and a proxy token for `acme.read`.
async fn connected(
    cluster: &'static crate::support::postgres::Cluster,
    db: &str,
) -> (ReplicaSet, ApiStandin, String, Es256Key, String) {
    let lb = Forwarder::start();
    let issuer = lb.url();
    let api_listener = ApiStandin::bind();
    let api_base = format!("http://{}", api_listener.local_addr().unwrap());
    let set = ReplicaSet::start(
        lb,
        database(cluster, db),
        2,
        ProviderOpts {
            extra_config: format!(
                "api_base = \"{api_base}\"\n\n[proxy]\n{}",
                config("4s", "refuse")
            ),
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
    let password = hex::encode(random_bytes(12));
    let user = serde_json::json!({"name": "alice", "password": password}).to_string();
    assert_eq!(a.admin_post("/users", &user).unwrap().0, 200);
    let subject = a.subject_token("alice");
    let r = refused(
        a.derive(&k, &subject, "read", "acme.read", &proxy, None)
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
        a.derive(&k, &subject, "read", "acme.read", &proxy, None)
            .await,
    );
    let token = t.access_token.expose().clone();
    (set, api, subject, k, token)
}

/// `GET /proxy/acme/trickle/{mib}` sent straight to replica `i`'s public
/// listener (the forwarder buffers whole answers), after the proxy's nonce
/// challenge there.
async fn download(
    set: &ReplicaSet,
    i: usize,
    k: &Es256Key,
    token: &str,
    mib: usize,
) -> reqwest::Response {
    let path = format!("/proxy/acme/trickle/{mib}");
    let htu = format!("{}{path}", set.issuer);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut nonce: Option<String> = None;
    for _ in 0..2 {
        let proof = make_proof(k, "GET", &htu, now(), Some(token), nonce.as_deref()).unwrap();
        let r = http
            .get(format!("{}{path}", set.brokers[i].public))
            .header("authorization", format!("DPoP {token}"))
            .header("dpop", proof)
            .send()
            .await
            .unwrap();
        if r.status() == 401 && r.headers().contains_key("dpop-nonce") {
            nonce = Some(r.headers()["dpop-nonce"].to_str().unwrap().to_string());
            continue;
        }
        return r;
    }
    panic!("the proxy kept asking for a nonce");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_stop_on_one_replica_stops_alice_everywhere_within_the_bound_and_bob_is_served() {
    let Some(cluster) = cluster_or_not_shown("a person stop across replicas") else {
        return;
    };
    let _shared = cluster.shared();
    let (set, api, alice, k, token) = connected(cluster, "person_stop").await;
    let (a, b) = (&set.brokers[0], &set.brokers[1]);
    let bob = a.subject_token("bob");
    for x in [a, b] {
        assert_eq!(reason(&derive(x, &k, &alice).await), None, "served before");
        assert_eq!(reason(&derive(x, &k, &bob).await), None);
    }
    // Her pending approval, with its link (open before the stop).
    let pending = refused(
        a.derive(&k, &alice, "release", "deploy.run", DEPLOY, None)
            .await,
    );
    assert_eq!(pending.reason.as_deref(), Some("approval_required"));
    let link = pending.connect_uri.clone().unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    set.lb.pick(Pick::To(1));
    assert_ne!(
        http.get(&link).send().await.unwrap().status(),
        404,
        "open before"
    );

    // A 10 MiB download through B's proxy, read as it comes.
    let r = download(&set, 1, &k, &token, 10).await;
    assert_eq!(r.status(), 200);
    let reader = tokio::spawn(async move {
        let mut r = r;
        let mut got = 0usize;
        loop {
            match r.chunk().await {
                Ok(Some(c)) => got += c.len(),
                Ok(None) => return (got, false),
                Err(_) => return (got, true),
            }
        }
    });
    let start = Instant::now();
    while api.trickles().first().is_none_or(|t| t.sent < 256 * 1024) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the download did not start"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The stop, on A.
    let body =
        serde_json::json!({"person_iss": set.issuer, "person_sub": "alice", "reason": "left"})
            .to_string();
    let (code, answer) = a.admin_post("/persons/revoke", &body).unwrap();
    assert_eq!(code, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["stop"]["lift"], "restore", "{answer}");
    assert_eq!(answer["ended"]["approvals_declined"], 1, "{answer}");
    let on_a = until(a, &k, &alice, Some("person_revoked")).await;
    let on_b = until(b, &k, &alice, Some("person_revoked")).await;
    eprintln!("alice refused on A after {on_a:?}, on B after {on_b:?} (bound {BOUND:?})");

    // The download was cut mid-answer: the tool's read failed, and the
    // stand-in saw its reader go away before the end.
    let (got, failed) = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("the cut download ended")
        .unwrap();
    // The stand-in learns of the cut at its next write, which may come a
    // moment after the tool's read failed: wait for it (up to 10 s).
    let waited = Instant::now();
    let mut t = api.trickles()[0].clone();
    while !t.cut && !t.done && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        t = api.trickles()[0].clone();
    }
    eprintln!("download: the tool read {got} bytes; the stand-in {t:?}");
    assert!(
        failed && got < 10 * 1024 * 1024,
        "not cut: {got} bytes, failed {failed}"
    );
    assert!(t.cut && !t.done && t.sent < 10 * 1024 * 1024, "{t:?}");
    let completed = set.events(1, "proxy.completed");
    assert_eq!(
        completed.last().unwrap()["reason"],
        "person_revoked",
        "{completed:?}"
    );
    // A new call through B's proxy is refused too, before it goes out.
    let before = api.records().len();
    let r = download(&set, 1, &k, &token, 1).await;
    assert_eq!(r.status(), 401);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["reason"], "person_revoked", "{v}");
    assert_eq!(api.records().len(), before, "nothing went upstream");

    // Her approval link is closed on B (404) and the approval declined.
    set.lb.pick(Pick::To(1));
    assert_eq!(http.get(&link).send().await.unwrap().status(), 404);
    let declined = set.events(0, "approval.declined");
    assert_eq!(declined.len(), 1, "{declined:?}");
    assert_eq!(declined[0]["reason"], "person_revoked");
    let revoked = set.events(0, "person.revoked");
    assert_eq!(revoked[0]["person_sub"], "alice");
    assert_eq!(revoked[0]["source"], "manual");
    assert_eq!(revoked[0]["reason"], "left");

    // Control: Bob is served on both.
    for x in [a, b] {
        assert_eq!(reason(&derive(x, &k, &bob).await), None, "bob served");
    }
    let (_, status) = b.admin_get("/status").unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["revocation_watch"]["up"], true, "{status}");
    assert_eq!(status["revocation_watch"]["persons_revoked"], 1, "{status}");

    // Restored on B: A serves her again within the bound.
    let who = serde_json::json!({"person_iss": set.issuer, "person_sub": "alice"}).to_string();
    assert_eq!(b.admin_post("/persons/restore", &who).unwrap().0, 200);
    until(a, &k, &alice, None).await;
    assert_eq!(set.events(1, "person.restored")[0]["source"], "manual");

    // A sign-in stop written by another writer (a row in the database):
    // refused without auth_time, with an old one, and with a refreshed
    // token (new iat, old auth_time); lifted by a later sign-in.
    let t0 = now();
    let stop = serde_json::json!({
        "person_iss": set.issuer, "person_sub": "alice", "reason": "session-revoked",
        "source": "ssf", "received_at": t0, "revocation_time": t0, "lift": "sign_in",
        "revoke_at_providers": false,
    });
    let mut key_hex = String::new();
    for part in [set.issuer.as_str(), "alice"] {
        key_hex += &format!("{:04x}{}", part.len(), hex::encode(part));
    }
    set.db.sql(&format!(
        "INSERT INTO records (tree, key, value) VALUES ('person_stops', '\\x{key_hex}'::bytea, convert_to('{stop}', 'UTF8'))"
    ));
    for x in [a, b] {
        until(x, &k, &alice, Some("person_revoked")).await;
    }
    let with_auth_time = |auth_time: i64| {
        let n = now();
        a.sign_as_dev_issuer(
            serde_json::json!({"typ": "at+jwt", "alg": "ES256"}),
            &serde_json::json!({
                "iss": set.issuer, "sub": "alice", "aud": "repo-helper", "iat": n, "exp": n + 600,
                "auth_time": auth_time, "jti": hex::encode(random_bytes(8)),
                "client_id": "quickstart-orchestrator", "scope": "agent",
            }),
        )
    };
    // Refreshed (fresh iat), signed in before the revocation: refused.
    let refreshed = with_auth_time(t0 - 60);
    // Within restore_skew (1 s) of the revocation: refused.
    let too_soon = with_auth_time(t0);
    for x in [a, b] {
        for t in [&refreshed, &too_soon] {
            assert_eq!(
                reason(&derive(x, &k, t).await).as_deref(),
                Some("person_revoked")
            );
        }
    }
    // A new sign-in after it lifts it, on B.
    let new_sign_in = with_auth_time(t0 + 5);
    assert_eq!(reason(&derive(b, &k, &new_sign_in).await), None, "lifted");
    let lifted =
        |e: &serde_json::Value| e["event"] == "person.restored" && e["source"] == "sign_in";
    let events = read_audit_until(&b.path("audit.jsonl"), |es| es.iter().any(lifted)).await;
    let restored = events
        .iter()
        .find(|e| lifted(e))
        .expect("person.restored by sign-in");
    assert_eq!(restored["revocation_time"], t0);
    // The revoked session's tokens stay refused after the lift.
    assert_eq!(
        reason(&derive(a, &k, &refreshed).await).as_deref(),
        Some("person_revoked")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn a_watch_down_beyond_the_bound_refuses_unless_set_to_serve_and_a_restart_loses_no_stop() {
    let Some(cluster) = cluster_or_not_shown("the person stop list's watch with PostgreSQL down")
    else {
        return;
    };
    let _exclusive = cluster.exclusive();
    let refuse = ReplicaSet::start(
        Forwarder::start(),
        database(cluster, "stop_watch_refuse"),
        1,
        ProviderOpts {
            extra_config: config("2s", "refuse"),
            ..ProviderOpts::default()
        },
    );
    let serve = ReplicaSet::start(
        Forwarder::start(),
        database(cluster, "stop_watch_serve"),
        1,
        ProviderOpts {
            extra_config: config("2s", "serve"),
            ..ProviderOpts::default()
        },
    );
    let (r, s) = (&refuse.brokers[0], &serve.brokers[0]);
    let k = key();
    let (alice_r, alice_s) = (r.subject_token("alice"), s.subject_token("alice"));
    // A stop acknowledged just before PostgreSQL restarts is kept.
    let body = serde_json::json!({"person_iss": refuse.issuer, "person_sub": "carol"}).to_string();
    assert_eq!(r.admin_post("/persons/revoke", &body).unwrap().0, 200);
    cluster.restart_immediate();
    let start = Instant::now();
    loop {
        let (code, list) = r.admin_get("/persons").unwrap();
        if code == 200 {
            assert!(list.contains("\"carol\""), "{list}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no answer after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Once the watch reads the list again (the restart may outlast the
    // bound), carol is refused and alice served.
    let carol = r.subject_token("carol");
    until_within(
        r,
        &k,
        &carol,
        Some("person_revoked"),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(reason(&derive(r, &k, &alice_r).await), None);
    assert_eq!(reason(&derive(s, &k, &alice_s).await), None);

    // PostgreSQL down longer than the bound.
    cluster.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let down = derive(r, &k, &alice_r).await;
    assert_eq!(
        reason(&down).as_deref(),
        Some("revocation_watch_down"),
        "refused by default"
    );
    if let Answer::Refused(x) = &down {
        assert_eq!((x.status, x.retry_after), (503, Some(5)));
    }
    assert_eq!(
        reason(&derive(s, &k, &alice_s).await),
        None,
        "served with serve"
    );
    for x in [r, s] {
        let (_, status) = x.admin_get("/status").unwrap();
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["revocation_watch"]["up"], false, "{status}");
        let (_, metrics) = x.admin_get("/metrics").unwrap();
        assert!(
            metrics.contains("credbroker_revocation_watch_up 0"),
            "{metrics}"
        );
    }
    cluster.start_again();
    until_within(r, &k, &alice_r, None, Duration::from_secs(20)).await;
    assert_eq!(
        reason(&derive(r, &k, &carol).await).as_deref(),
        Some("person_revoked")
    );
}

/// `credbroker persons revoke --revoke-at-providers` run with each
/// replica's config: the grant is revoked at the provider (RFC 7009) and
/// the account marked on the shared store, Bob untouched; `persons list`
/// on the other replica names the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is the gate between this binary's PostgreSQL tests (other test
// threads), never taken by another task of this runtime.
#[allow(clippy::await_holding_lock)]
async fn persons_revoke_at_providers_on_a_replica_revokes_the_grant() {
    let Some(cluster) = cluster_or_not_shown("persons revoke --revoke-at-providers on replicas")
    else {
        return;
    };
    let _shared = cluster.shared();
    let (set, _api, alice, k, _token) = connected(cluster, "person_stop_providers").await;
    let peer = &set.provider.peer;
    assert_eq!(peer.live_refresh_tokens("octo-alice").await, 1);
    let cli = |i: usize, args: &[&str]| {
        let out = std::process::Command::new(bin())
            .args(args)
            .arg("--config")
            .arg(&set.brokers[i].config)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // `persons revoke --revoke-at-providers` with replica `i`'s config:
    // exit 0, its JSON answer.
    let revoke = |i: usize, name: &str| {
        let (code, out, err) = cli(
            i,
            &[
                "persons",
                "revoke",
                "--person",
                &set.issuer,
                "alice",
                "--revoke-at-providers",
            ],
        );
        eprintln!("persons revoke on {name}: {code}\n{out}\n{err}");
        assert_eq!(code, 0, "{out} {err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let v = revoke(1, "B");
    assert_eq!(v["providers"][0]["revocation"], "revoked", "{v}");
    assert_eq!(peer.live_refresh_tokens("octo-alice").await, 0);
    until(&set.brokers[0], &k, &alice, Some("person_revoked")).await;
    let (code, out, err) = cli(0, &["persons", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"alice\""), "{out}");
    // Again, on A (the operator retrying on another replica): the stop
    // merges, and the provider is asked again (RFC 7009: revoking a
    // revoked token succeeds).
    let v = revoke(0, "A");
    assert_eq!(v["providers"][0]["service"], "acme", "{v}");
}
